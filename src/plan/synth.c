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
