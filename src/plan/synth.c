/* Synthetic KV (see kvrelay/synth.h): splitmix64 streams keyed by
 * (seed, layer, role, position, token id). Not cryptographic; it only has to
 * be a pure function that differs for every input. */
#include "kvrelay/synth.h"

#include <math.h>
#include <string.h>

#include "base_internal.h"
#include "layout_math.h"

static uint64_t mix(uint64_t x)
{
    x += 0x9e3779b97f4a7c15ull;
    x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
    x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
    return x ^ (x >> 31);
}

static uint64_t stream_key(uint64_t seed, uint32_t layer, uint32_t role,
                           uint64_t pos, uint32_t token_id)
{
    uint64_t k = mix(seed ^ ((uint64_t)layer << 32 | role));
    k = mix(k ^ pos);
    return mix(k ^ token_id);
}

static void fill_stream(uint64_t key, uint8_t *out, size_t n)
{
    for (size_t i = 0; i < n; i += 8) {
        uint64_t v = mix(key + i);
        kvr__put_le(out + i, v, n - i < 8 ? n - i : 8);
    }
}

void kvr_synth_latent(uint64_t seed, uint32_t layer, uint64_t pos,
                      uint32_t token_id, uint8_t *out, size_t token_bytes)
{
    fill_stream(stream_key(seed, layer, KVR_ROLE_MLA, pos, token_id), out,
                token_bytes);
}

void kvr_synth_index_key(uint64_t seed, uint32_t layer, uint64_t pos,
                         uint32_t token_id, uint8_t *key, uint32_t index_dim)
{
    fill_stream(stream_key(seed, layer, KVR_ROLE_INDEX, pos, token_id), key,
                index_dim);
}

void kvr_synth_dense(uint64_t seed, uint32_t layer, uint32_t plane,
                     uint32_t head, uint64_t pos, uint32_t token_id,
                     uint8_t *out, size_t bytes)
{
    uint32_t role = KVR_ROLE_DENSE | plane << 8 | head << 12;
    fill_stream(stream_key(seed, layer, role, pos, token_id), out, bytes);
}

/* A power of two like the ue8m0 scales real writers use, from the keys. */
float kvr_synth_index_scale(const uint8_t *key, uint32_t index_dim)
{
    uint32_t acc = 0;
    for (uint32_t d = 0; d < index_dim; d++)
        acc = acc * 31u + key[d];
    return ldexpf(1.0f, (int)(acc % 64) - 32);
}

static void write_index_token(const kvr_layout_t *lay, uint8_t *page,
                              uint64_t P, uint64_t t, const uint8_t *key,
                              uint32_t D)
{
    for (uint32_t d = 0; d < D; d++)
        page[kvr__index_key_off(t, d, D, lay->preshuffle)] = key[d];
    float s = kvr_synth_index_scale(key, D);
    memcpy(page + kvr__index_scale_off(t, P, D), &s, sizeof(s));
}

kvr_status_t
kvr_synth_fill_source(const kvr_layout_t *lay, const kvr_region_desc_t *src,
                      uint64_t seed, const uint32_t *src_blocks,
                      size_t num_src_blocks, const uint32_t *token_ids,
                      uint64_t num_tokens, void *base, kvr_error_t *err)
{
    kvr_status_t st = kvr_region_check(lay, src, false, err);
    if (st != KVR_OK)
        return st;
    if (kvr__ceil_div(num_tokens, lay->block_size) > num_src_blocks)
        return kvr_error_set(err, KVR_ERR_SRC_TABLE_SHORT,
                             "%llu tokens need more than %zu source blocks",
                             (unsigned long long)num_tokens, num_src_blocks);
    uint8_t *mem = base, key[1024];
    uint64_t bs = lay->block_size;
    if (src->role == KVR_ROLE_INDEX && src->index_dim > sizeof(key))
        return kvr_error_set(err, KVR_ERR_INVALID, "index dim %u > %zu",
                             src->index_dim, sizeof(key));
    for (uint64_t g = 0; g < num_tokens; g++) {
        if (src_blocks[g / bs] >= src->num_blocks)
            return kvr_error_set(
                err, KVR_ERR_BLOCK_RANGE, "source block id %u >= %llu",
                src_blocks[g / bs], (unsigned long long)src->num_blocks);
        uint8_t *page = mem + (uint64_t)src_blocks[g / bs] * src->page_bytes;
        if (src->role == KVR_ROLE_INDEX) {
            kvr_synth_index_key(seed, src->layer, g, token_ids[g], key,
                                src->index_dim);
            write_index_token(lay, page, bs, g % bs, key, src->index_dim);
        } else {
            uint64_t tb = kvr_region_token_bytes(lay, src);
            kvr_synth_latent(seed, src->layer, g, token_ids[g],
                             page + (g % bs) * tb, tb);
        }
    }
    return KVR_OK;
}

kvr_status_t kvr_synth_check_index_token(const kvr_layout_t *lay,
                                         const uint8_t *page,
                                         uint64_t page_tokens, uint64_t t,
                                         uint32_t index_dim, uint64_t g,
                                         kvr_error_t *err)
{
    uint8_t key[1024];
    if (index_dim > sizeof(key))
        return kvr_error_set(err, KVR_ERR_INVALID, "index dim %u too large",
                             index_dim);
    for (uint32_t d = 0; d < index_dim; d++)
        key[d] = page[kvr__index_key_off(t, d, index_dim, lay->preshuffle)];
    float want = kvr_synth_index_scale(key, index_dim), got;
    memcpy(&got, page + kvr__index_scale_off(t, page_tokens, index_dim),
           sizeof(got));
    if (memcmp(&want, &got, sizeof(got)) != 0)
        return kvr_error_set(err, KVR_ERR_VERIFY,
                             "token %llu: scale %g does not match its keys "
                             "(expected %g)",
                             (unsigned long long)g, (double)got, (double)want);
    return KVR_OK;
}

/* ---- one rank of a sharded producer (docs/design.md §18) ---- */

typedef unsigned long long ull;

/* Byte offset in a dense page of head j (local) of slot s, plane k. */
static uint64_t dense_at(const kvr_region_desc_t *r, uint64_t page,
                         uint64_t bs, uint64_t Hl, uint64_t s, uint64_t j,
                         uint32_t k)
{
    uint64_t planes = r->kv_planes ? r->kv_planes : 2;
    uint64_t DE = (uint64_t)r->head_dim * r->elem_bytes;
    return k * (page / planes) + kvr__dense_off(s, j, bs, Hl, DE, r->hnd);
}

static kvr_status_t page_of(const uint32_t *blocks, size_t n, uint64_t b,
                            const kvr_region_desc_t *r, const char *side,
                            uint64_t *off, kvr_error_t *err)
{
    if (b >= n)
        return kvr_error_set(err, KVR_ERR_SRC_TABLE_SHORT,
                             "%s table of %zu blocks, block %llu needed", side,
                             n, (ull)b);
    if (blocks[b] >= r->num_blocks)
        return kvr_error_set(err, KVR_ERR_BLOCK_RANGE,
                             "%s block id %u >= %llu", side, blocks[b],
                             (ull)r->num_blocks);
    *off = (uint64_t)blocks[b] * r->page_bytes;
    return KVR_OK;
}

static kvr_status_t fill_dense_rank(const kvr_layout_t *lay,
                                    const kvr_region_desc_t *src,
                                    uint32_t rank, uint64_t seed,
                                    const uint32_t *blocks, size_t n,
                                    const uint32_t *ids, uint64_t N,
                                    uint8_t *base, kvr_error_t *err)
{
    uint64_t bs = kvr_producer_block_size(lay), H = src->heads;
    uint64_t Hl = kvr__heads_local(H, lay->producer_tp);
    uint64_t h0 = kvr__head_first(rank, H, lay->producer_tp);
    uint64_t DE = (uint64_t)src->head_dim * src->elem_bytes;
    uint32_t planes = src->kv_planes ? src->kv_planes : 2;
    uint8_t buf[4096];
    if (rank >= lay->producer_tp || DE > sizeof(buf))
        return kvr_error_set(err, KVR_ERR_INVALID,
                             "tp rank %u of %u, or %llu bytes per head", rank,
                             lay->producer_tp, (ull)DE);
    for (uint64_t g = 0; g < N; g++) {
        uint64_t off = 0;
        kvr_status_t st = page_of(blocks, n, g / bs, src, "source", &off, err);
        if (st != KVR_OK)
            return st;
        for (uint32_t k = 0; k < planes; k++)
            for (uint64_t j = 0; j < Hl; j++) {
                kvr_synth_dense(seed, src->layer, k, (uint32_t)(h0 + j), g,
                                ids[g], buf, DE);
                memcpy(base + off +
                           dense_at(src, src->page_bytes, bs, Hl, g % bs, j, k),
                       buf, DE);
            }
    }
    return KVR_OK;
}

kvr_status_t kvr_synth_fill_source_rank(
    const kvr_layout_t *lay, const kvr_region_desc_t *src, uint32_t rank,
    uint64_t seed, const uint32_t *src_blocks, size_t num_src_blocks,
    const uint32_t *token_ids, uint64_t num_tokens, void *base,
    kvr_error_t *err)
{
    kvr_status_t st = kvr_region_check(lay, src, false, err);
    if (st != KVR_OK)
        return st;
    if (src->role == KVR_ROLE_DENSE && src->heads != 0)
        return fill_dense_rank(lay, src, rank, seed, src_blocks,
                               num_src_blocks, token_ids, num_tokens, base,
                               err);
    uint64_t Wp = kvr_producer_dcp(lay), Ip = kvr_producer_interleave(lay);
    uint64_t bsp = kvr_producer_block_size(lay);
    bool index = src->role == KVR_ROLE_INDEX;
    bool repl = index && Wp > 1 && lay->producer_replicate_index;
    uint8_t *mem = base, key[1024];
    if (rank >= Wp || (index && src->index_dim > sizeof(key)))
        return kvr_error_set(err, KVR_ERR_INVALID,
                             "DCP rank %u of %llu, or index dim %u", rank,
                             (ull)Wp, src->index_dim);
    for (uint64_t g = 0; g < num_tokens; g++) {
        if (!repl && kvr__owner(g, Ip, Wp) != rank)
            continue;
        uint64_t P = repl ? bsp * Wp : bsp;
        uint64_t j = repl ? g : kvr__local(g, Ip, Wp), off = 0;
        st = page_of(src_blocks, num_src_blocks, j / P, src, "source", &off,
                     err);
        if (st != KVR_OK)
            return st;
        if (index) {
            kvr_synth_index_key(seed, src->layer, g, token_ids[g], key,
                                src->index_dim);
            write_index_token(lay, mem + off, P, j % P, key, src->index_dim);
        } else {
            uint64_t tb = src->page_bytes / bsp;
            kvr_synth_latent(seed, src->layer, g, token_ids[g],
                             mem + off + (j % P) * tb, tb);
        }
    }
    return KVR_OK;
}

kvr_status_t kvr_synth_check_dense(const kvr_layout_t *lay,
                                   const kvr_region_desc_t *dst, uint32_t rank,
                                   uint64_t seed, const uint32_t *dst_blocks,
                                   size_t num_dst_blocks,
                                   const uint32_t *token_ids, uint64_t from,
                                   uint64_t num_tokens, const void *base,
                                   kvr_error_t *err)
{
    uint64_t bs = lay->block_size, H = dst->heads, TP = lay->tp;
    uint64_t Hl = kvr__heads_local(H, TP), h0 = kvr__head_first(rank, H, TP);
    uint64_t DE = (uint64_t)dst->head_dim * dst->elem_bytes;
    uint32_t planes = dst->kv_planes ? dst->kv_planes : 2;
    const uint8_t *mem = base;
    uint8_t want[4096];
    if (H == 0 || lay->dcp_size != 1 || rank >= TP || DE > sizeof(want))
        return kvr_error_set(err, KVR_ERR_INVALID,
                             "dense check: %llu heads, W %u, tp rank %u of "
                             "%llu, %llu bytes per head",
                             (ull)H, lay->dcp_size, rank, (ull)TP, (ull)DE);
    for (uint64_t g = from; g < num_tokens; g++) {
        uint64_t off = 0;
        kvr_status_t st = page_of(dst_blocks, num_dst_blocks, g / bs, dst,
                                  "destination", &off, err);
        for (uint32_t k = 0; st == KVR_OK && k < planes; k++)
            for (uint64_t j = 0; j < Hl; j++) {
                uint64_t at = off + dense_at(dst, dst->page_bytes, bs, Hl,
                                             g % bs, j, k);
                kvr_synth_dense(seed, dst->layer, k, (uint32_t)(h0 + j), g,
                                token_ids[g], want, DE);
                if (memcmp(want, mem + at, DE) == 0)
                    continue;
                uint64_t i = 0;
                while (want[i] == mem[at + i])
                    i++;
                return kvr_error_set(
                    err, KVR_ERR_VERIFY,
                    "dense layer %u tp rank %u: token %llu head %llu %s byte "
                    "%llu at dst offset %llu: expected 0x%02x found 0x%02x",
                    dst->layer, rank, (ull)g, (ull)(h0 + j), k ? "V" : "K",
                    (ull)i, (ull)(at + i), want[i], mem[at + i]);
            }
        if (st != KVR_OK)
            return st;
    }
    return KVR_OK;
}
