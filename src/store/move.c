/* Save and load through the planner (docs/store.md). A chunk's canonical
 * form is what a plain producer with the store's bs and an identity block
 * table would hold for each region: MLA token-major, INDEX pages of bs
 * tokens with the key plane (unshuffled) then the scales and no padding. A
 * save plans producer -> canonical (W = 1), a load canonical -> consumer
 * rank (any W, I, replication); the runs are applied here, shuffling or
 * unshuffling index key planes in 16-token tiles when the layout
 * preshuffles them.
 *
 * Payload: u32 region count, u32 0, then per region {u32 role, u32 layer,
 * u64 bytes}, then each region's bytes in that order. */
#include <stdlib.h>
#include <string.h>

#include "base_internal.h"
#include "store_internal.h"

#define TABLE_ENTRY 16u

typedef struct side_region {
    kvr_role_t role;
    uint32_t D;     /* INDEX key bytes per token */
    uint64_t width; /* canonical bytes per token */
} canon_t;

static kvr_status_t canon_of(const kvr_layout_t *lay,
                             const kvr_store_region_t *r, bool consumer,
                             canon_t *out, kvr_error_t *err)
{
    out->role = r->desc.role;
    out->D = r->desc.index_dim;
    if (r->desc.role == KVR_ROLE_MLA) {
        out->width = kvr_region_token_bytes_side(lay, &r->desc, consumer);
        return KVR_OK;
    }
    if (r->desc.role == KVR_ROLE_INDEX) {
        out->width = r->desc.index_dim + 4ull;
        return KVR_OK;
    }
    return kvr_error_set(err, KVR_ERR_NO_RELAYOUT,
                         "store: region layer %u "
                         "role %s has no canonical form (MLA and INDEX "
                         "only)",
                         r->desc.layer, kvr_role_name(r->desc.role));
}

/* The canonical region of one region for a request of `tokens` tokens. */
static kvr_region_desc_t canon_desc(const kvr_region_desc_t *r,
                                    const canon_t *c, uint32_t bs,
                                    uint64_t tokens)
{
    kvr_region_desc_t d = {.role = r->role,
                           .layer = r->layer,
                           .num_blocks = tokens / bs,
                           .page_bytes = bs * c->width,
                           .index_dim = r->index_dim,
                           .quant_block = r->quant_block};
    return d;
}

/* Moves one 16-token group of D key bytes between the plain order t*D+d
 * and the preshuffled tiles (docs/design.md §3), in 16-byte pieces. */
static inline __attribute__((always_inline)) void
tile_group_of(uint8_t *dst, const uint8_t *src, uint32_t D, bool to_tiles)
{
    for (uint32_t t = 0; t < 16; t++)
        for (uint32_t d = 0; d < D; d += 16) {
            uint64_t plain = (uint64_t)t * D + d;
            uint64_t tile = (uint64_t)(d / 16) * 256 + t * 16u;
            if (to_tiles)
                memcpy(dst + tile, src + plain, 16);
            else
                memcpy(dst + plain, src + tile, 16);
        }
}

/* The headline index width (D = 128) gets its own copy, unrolled by the
 * compiler: the loop's index arithmetic cost more than its moves. */
static void tile_group(uint8_t *dst, const uint8_t *src, uint32_t D,
                       bool to_tiles)
{
    if (D == 128 && to_tiles)
        tile_group_of(dst, src, 128, true);
    else if (D == 128)
        tile_group_of(dst, src, 128, false);
    else
        tile_group_of(dst, src, D, to_tiles);
}

#define TILE_STAGE (8u << 10)

/* Copies n key bytes (whole 16-token groups of D bytes) between the plain
 * order and the tiles, through two buffers on the stack that stay in L1:
 * the source is copied in with one sequential memcpy, shuffled from one
 * buffer into the other, and copied out with another, so that memory is
 * only read and written in order. Shuffling straight between the regions
 * stalled on the strided reads (a save) or writes (a load): about 2.4
 * times the time per byte of a plain copy, which made the index planes
 * (7 % of a headline chunk's bytes) 13-15 % of a host save or load. */
static void tile_copy(uint8_t *dst, const uint8_t *src, uint64_t n, uint32_t D,
                      bool to_tiles)
{
    uint8_t in[TILE_STAGE] __attribute__((aligned(64)));
    uint8_t out[TILE_STAGE] __attribute__((aligned(64)));
    uint64_t group = 16ull * D;
    uint64_t step = group <= TILE_STAGE ? TILE_STAGE / group * group : 0;
    for (uint64_t g = 0; g < n;) {
        if (step == 0) { /* a group larger than a buffer (D > 512) */
            tile_group(dst + g, src + g, D, to_tiles);
            g += group;
            continue;
        }
        uint64_t len = n - g < step ? n - g : step;
        memcpy(in, src + g, len);
        for (uint64_t k = 0; k < len; k += group)
            tile_group(out + k, in + k, D, to_tiles);
        memcpy(dst + g, out, len);
        g += len;
    }
}

typedef struct apply {
    const uint8_t *src;
    uint8_t *dst;
    uint64_t src_off0, dst_off0; /* subtracted from run offsets */
    bool canon_is_src;
    bool shuffle; /* INDEX under a preshuffling layout */
    uint32_t D, bs;
} apply_t;

/* One run, split at the canonical side's plane boundaries: key planes are
 * (un)shuffled, scale planes copied. */
static kvr_status_t apply_index_run(const apply_t *a, uint64_t s, uint64_t d,
                                    uint64_t len, kvr_error_t *err)
{
    uint64_t page = (uint64_t)a->bs * (a->D + 4), keys = (uint64_t)a->bs * a->D;
    while (len > 0) {
        uint64_t c = a->canon_is_src ? s : d, pos = c % page;
        bool key = pos < keys;
        uint64_t n = (key ? keys : page) - pos;
        n = n < len ? n : len;
        if (key && (pos % (16ull * a->D) != 0 || n % (16ull * a->D) != 0))
            return kvr_error_set(err, KVR_ERR_PRESHUFFLE_BS,
                                 "store: index "
                                 "key run at %llu (+%llu) is not whole "
                                 "16-token groups",
                                 (unsigned long long)pos,
                                 (unsigned long long)n);
        if (key)
            tile_copy(a->dst + d, a->src + s, n, a->D, a->canon_is_src);
        else
            memcpy(a->dst + d, a->src + s, n);
        s += n;
        d += n;
        len -= n;
    }
    return KVR_OK;
}

/* A save asks for the first bytes of the next run's source while this run
 * is copied: each run starts on other pages of the producer (another
 * block, another region) and stalled until the hardware prefetcher caught
 * up with it (about 6 points of memcpy's rate on a 256-token save). A
 * load's source is the chunk, one sequential stream; prefetching its
 * destination for write gained nothing measurable. */
#define PREFETCH_BYTES 4096u

static void prefetch_run(const apply_t *a, const kvr_run_t *run)
{
    if (a->canon_is_src)
        return;
    const uint8_t *p = a->src + (run->src - a->src_off0);
    uint64_t n = run->len < PREFETCH_BYTES ? run->len : PREFETCH_BYTES;
    for (uint64_t o = 0; o < n; o += 64)
        __builtin_prefetch(p + o);
}

/* Applies plan's runs with a; next (NULL after the last region) is the
 * next region's plan and its apply, whose first run is prefetched during
 * the last run of this one. */
static kvr_status_t apply_plan(const kvr_plan_t *plan, const apply_t *a,
                               const kvr_plan_t *next, const apply_t *next_a,
                               kvr_error_t *err)
{
    size_t n, nn = 0;
    const kvr_run_t *runs = kvr_plan_runs(plan, &n);
    const kvr_run_t *after = next != NULL ? kvr_plan_runs(next, &nn) : NULL;
    for (size_t i = 0; i < n; i++) {
        uint64_t s = runs[i].src - a->src_off0, d = runs[i].dst - a->dst_off0;
        if (i + 1 < n)
            prefetch_run(a, &runs[i + 1]);
        else if (nn > 0)
            prefetch_run(next_a, &after[0]);
        if (!a->shuffle) {
            memcpy(a->dst + d, a->src + s, runs[i].len);
            continue;
        }
        kvr_status_t st = apply_index_run(a, s, d, runs[i].len, err);
        if (st != KVR_OK)
            return st;
    }
    return KVR_OK;
}

/* One chunk's side of a save's gather or a load's scatter: region i's
 * canonical bytes are at chunk + off[i]. */
typedef struct chunk_side {
    const kvr_store_io_t *io;
    const canon_t *canon;
    const uint64_t *off;
    uint8_t *chunk; /* only read from when load */
    uint64_t start; /* the chunk's first token */
    bool preshuffle;
    bool load; /* the chunk is the source (a load), else the destination */
} chunk_side_t;

static apply_t side_apply(const chunk_side_t *c, size_t i)
{
    const canon_t *cn = &c->canon[i];
    uint8_t *canon = c->chunk + c->off[i], *region = c->io->regions[i].base;
    uint64_t canon0 = c->start * cn->width;
    apply_t a = {.src = c->load ? canon : region,
                 .dst = c->load ? region : canon,
                 .src_off0 = c->load ? canon0 : 0,
                 .dst_off0 = c->load ? 0 : canon0,
                 .canon_is_src = c->load,
                 .shuffle = cn->role == KVR_ROLE_INDEX && c->preshuffle,
                 .D = cn->D,
                 .bs = c->io->block_size};
    return a;
}

/* Applies every region's plan of set between the regions and chunk side
 * c, each prefetching the next one's first run. */
static kvr_status_t apply_set(const kvr_plan_set_t *set, const chunk_side_t *c,
                              kvr_error_t *err)
{
    kvr_status_t s = KVR_OK;
    size_t regions = c->io->num_regions;
    apply_t a = regions > 0 ? side_apply(c, 0) : (apply_t){0};
    for (size_t i = 0; s == KVR_OK && i < regions; i++) {
        bool last = i + 1 == regions;
        apply_t next = last ? a : side_apply(c, i + 1);
        s = apply_plan(kvr_plan_set_plan_of(set, i), &a,
                       last ? NULL : kvr_plan_set_plan_of(set, i + 1), &next,
                       err);
        a = next;
    }
    return s;
}

static uint32_t *identity(uint64_t n)
{
    uint32_t *t = malloc((n ? n : 1) * sizeof *t);
    for (uint64_t i = 0; t != NULL && i < n; i++)
        t[i] = (uint32_t)i;
    return t;
}

static kvr_status_t check_io(const kvr_store_t *st, const kvr_store_io_t *io,
                             kvr_error_t *err)
{
    if (st == NULL || io == NULL || io->ns == NULL || io->lay == NULL ||
        (io->num_chains && io->chains == NULL) ||
        (io->num_regions && io->regions == NULL) ||
        (io->num_blocks && io->blocks == NULL))
        return kvr_error_set(err, KVR_ERR_INVALID, "store io: NULL argument");
    uint64_t v = (uint64_t)io->block_size * io->lay->dcp_size;
    if (io->block_size == 0 || io->chunk == 0 || io->chunk % v != 0)
        return kvr_error_set(err, KVR_ERR_CHUNK_SIZE,
                             "store chunk %llu is "
                             "not a positive multiple of bs * W = %u * %u",
                             (unsigned long long)io->chunk, io->block_size,
                             io->lay->dcp_size);
    if (io->num_chains > UINT32_MAX / io->chunk)
        return kvr_error_set(err, KVR_ERR_INVALID,
                             "store io: %zu chunks of "
                             "%llu tokens exceed 2^32 tokens",
                             io->num_chains, (unsigned long long)io->chunk);
    return KVR_OK;
}

static kvr_chunk_key_t key_of(const kvr_store_io_t *io, size_t c)
{
    kvr_chunk_key_t k;
    memset(&k, 0, sizeof k);
    memcpy(k.ns, io->ns, KVR_STORE_NS_BYTES);
    k.chain = io->chains[c];
    k.part = io->part;
    return k;
}

/* ---- save ---------------------------------------------------------------- */

typedef struct save_ctx {
    kvr_layout_t lay; /* producer -> canonical (W = 1) */
    kvr_region_pair_t *pairs;
    canon_t *canon;
    uint32_t *ident;
    uint64_t *off; /* per region: its bytes' offset in a chunk buffer */
    uint64_t table_bytes, data_bytes;
} save_ctx_t;

static kvr_status_t save_begin(const kvr_store_io_t *io, save_ctx_t *x,
                               kvr_error_t *err)
{
    const kvr_layout_t *p = io->lay;
    if (kvr_producer_dcp(p) != 1)
        return kvr_error_set(err, KVR_ERR_NOT_IMPLEMENTED,
                             "store save: "
                             "producer W_p=%u (only W_p = 1 saves)",
                             kvr_producer_dcp(p));
    kvr_layout_t l = KVR_LAYOUT_INIT;
    l.block_size = io->block_size;
    l.preshuffle = p->preshuffle;
    l.producer_block_size = kvr_producer_block_size(p);
    l.producer_tp = 1;
    x->lay = l;
    x->pairs = calloc(io->num_regions + 1, sizeof *x->pairs);
    x->canon = calloc(io->num_regions + 1, sizeof *x->canon);
    x->ident = identity(io->num_chains * io->chunk / io->block_size);
    x->off = calloc(io->num_regions + 1, sizeof *x->off);
    if (!x->pairs || !x->canon || !x->ident || !x->off)
        return kvr_error_set(err, KVR_ERR_NO_MEMORY, "store save");
    x->table_bytes = 8 + TABLE_ENTRY * io->num_regions;
    x->data_bytes = 0;
    for (size_t i = 0; i < io->num_regions; i++) {
        kvr_status_t s = canon_of(&l, &io->regions[i], false, &x->canon[i],
                                  err);
        if (s != KVR_OK)
            return s;
        x->pairs[i].src = io->regions[i].desc;
        x->pairs[i].dst = canon_desc(&io->regions[i].desc, &x->canon[i],
                                     io->block_size,
                                     io->num_chains * io->chunk);
        x->off[i] = x->table_bytes + x->data_bytes;
        x->data_bytes += x->canon[i].width * io->chunk;
    }
    return KVR_OK;
}

static void save_end(save_ctx_t *x)
{
    free(x->off);
    free(x->pairs);
    free(x->canon);
    free(x->ident);
}

static void write_table(const kvr_store_io_t *io, const save_ctx_t *x,
                        uint8_t *buf)
{
    kvr__put_le(buf, io->num_regions, 4);
    kvr__put_le(buf + 4, 0, 4);
    for (size_t i = 0; i < io->num_regions; i++) {
        uint8_t *e = buf + 8 + TABLE_ENTRY * i;
        kvr__put_le(e, io->regions[i].desc.role, 4);
        kvr__put_le(e + 4, io->regions[i].desc.layer, 4);
        kvr__put_le(e + 8, x->canon[i].width * io->chunk, 8);
    }
}

static kvr_status_t plan_set(const kvr_layout_t *lay, uint32_t rank,
                             const kvr_region_pair_t *pairs, size_t n,
                             const kvr_request_t *req, kvr_plan_set_t **out,
                             kvr_error_t *err)
{
    if (kvr_layout_producer_plain(lay))
        return kvr_plan_set_create(lay, rank, pairs, n, req, out, err);
    return kvr_plan_set_create_pair(lay, 0, rank, pairs, n, req, out, err);
}

/* Gathers chunk c of every region into buf (table already written). */
static kvr_status_t gather(const kvr_store_io_t *io, const save_ctx_t *x,
                           size_t c, uint8_t *buf, kvr_error_t *err)
{
    uint64_t start = c * io->chunk, end = start + io->chunk;
    kvr_request_t req = {.src_blocks = io->blocks,
                         .num_src_blocks = io->num_blocks,
                         .dst_blocks = x->ident,
                         .num_dst_blocks = end / io->block_size,
                         .num_tokens = end,
                         .num_computed_blocks = start / io->block_size};
    kvr_plan_set_t *set = NULL;
    kvr_status_t s = plan_set(&x->lay, 0, x->pairs, io->num_regions, &req, &set,
                              err);
    chunk_side_t side = {.io = io,
                         .canon = x->canon,
                         .off = x->off,
                         .chunk = buf,
                         .start = start,
                         .preshuffle = x->lay.preshuffle};
    if (s == KVR_OK)
        s = apply_set(set, &side, err);
    kvr_plan_set_destroy(set);
    return s;
}

kvr_status_t kvr_store_save(kvr_store_t *st, const kvr_store_io_t *io,
                            size_t *saved, kvr_error_t *err)
{
    kvr_status_t s = check_io(st, io, err);
    if (saved)
        *saved = 0;
    if (s != KVR_OK)
        return s;
    save_ctx_t x = {0};
    s = save_begin(io, &x, err);
    /* chunk c is gathered while chunks c - 1 and c - 2 are written on
     * threads (c - 2 fsynced and renamed while c - 1 is written and
     * hashed); a failed write stops the save: c is not started, and no
     * chunk after the failed one becomes visible */
    for (size_t c = 0; s == KVR_OK && c < io->num_chains; c++) {
        kvr_chunk_key_t key = key_of(io, c);
        if (kvr_store_contains(st, &key))
            continue;
        uint64_t len = x.table_bytes + x.data_bytes;
        uint8_t *buf = kvr__store_alloc(st, len);
        if (buf == NULL) {
            s = kvr_error_set(err, KVR_ERR_NO_MEMORY,
                              "store save: chunk of "
                              "%llu bytes",
                              (unsigned long long)len);
            break;
        }
        write_table(io, &x, buf);
        s = gather(io, &x, c, buf, err);
        if (s == KVR_OK)
            s = kvr__store_put_join(st, KVR__BEHIND - 1, saved, err);
        if (s != KVR_OK) {
            free(buf);
            break;
        }
        bool now = false;
        s = kvr__store_put_start(st, &key, buf, len, &now, err);
        if (s == KVR_OK && now && saved != NULL)
            (*saved)++;
    }
    kvr_status_t last = kvr__store_put_join(st, 0, saved,
                                            s == KVR_OK ? err : NULL);
    save_end(&x);
    return s == KVR_OK ? last : s;
}

/* ---- load ---------------------------------------------------------------- */

/* Finds region (role, layer) in a chunk's table: its data offset. */
static kvr_status_t find_region(const uint8_t *data, uint64_t len,
                                const kvr_region_desc_t *r, uint64_t want,
                                uint64_t *off, kvr_error_t *err)
{
    if (len < 8)
        return kvr_error_set(err, KVR_ERR_VERIFY,
                             "store chunk: payload of "
                             "%llu bytes has no table",
                             (unsigned long long)len);
    uint64_t n = kvr__get_le(data, 4), at = 8 + TABLE_ENTRY * n;
    if (n > (len - 8) / TABLE_ENTRY)
        return kvr_error_set(err, KVR_ERR_VERIFY,
                             "store chunk: table of %llu "
                             "regions exceeds the payload",
                             (unsigned long long)n);
    for (uint64_t i = 0; i < n; i++) {
        const uint8_t *e = data + 8 + TABLE_ENTRY * i;
        uint64_t bytes = kvr__get_le(e + 8, 8);
        if (kvr__get_le(e, 4) == (uint64_t)r->role &&
            kvr__get_le(e + 4, 4) == r->layer) {
            if (bytes != want || at > len || len - at < bytes)
                return kvr_error_set(err, KVR_ERR_LAYOUT_MISMATCH,
                                     "store "
                                     "chunk: layer %u holds %llu bytes, "
                                     "expected %llu",
                                     r->layer, (unsigned long long)bytes,
                                     (unsigned long long)want);
            *off = at;
            return KVR_OK;
        }
        if (bytes > len - at)
            break;
        at += bytes;
    }
    return kvr_error_set(err, KVR_ERR_LAYOUT_MISMATCH,
                         "store chunk: no %s "
                         "region for layer %u",
                         kvr_role_name(r->role), r->layer);
}

/* Per load: the canonical source of each consumer region, and where its
 * bytes sit in a chunk (the same in every chunk of one namespace). */
typedef struct load_ctx {
    kvr_layout_t lay; /* canonical producer -> consumer rank */
    kvr_region_pair_t *pairs;
    canon_t *canon;
    uint64_t *off;
    uint32_t *ident;
    /* the table (and payload length) of the chunk off was found in: a
     * chunk with the same one has its regions at the same offsets, so
     * they are not searched again (a search per region per chunk cost
     * about 1 % of a 256-token host load) */
    uint8_t *table;
    uint64_t table_len, len;
} load_ctx_t;

static kvr_status_t load_begin(const kvr_store_io_t *io, load_ctx_t *x,
                               kvr_error_t *err)
{
    x->lay = *io->lay;
    x->lay.producer_block_size = io->block_size;
    x->lay.producer_dcp = 1;
    x->lay.producer_interleave = 1;
    size_t n = io->num_regions + 1;
    x->pairs = calloc(n, sizeof *x->pairs);
    x->canon = calloc(n, sizeof *x->canon);
    x->off = calloc(n, sizeof *x->off);
    x->ident = identity(io->num_chains * io->chunk / io->block_size);
    if (!x->pairs || !x->canon || !x->off || !x->ident)
        return kvr_error_set(err, KVR_ERR_NO_MEMORY, "store load");
    uint64_t end = io->num_chains * io->chunk;
    for (size_t i = 0; i < io->num_regions; i++) {
        const kvr_store_region_t *r = &io->regions[i];
        kvr_status_t s = canon_of(io->lay, r, true, &x->canon[i], err);
        if (s != KVR_OK)
            return s;
        x->pairs[i].src = canon_desc(&r->desc, &x->canon[i], io->block_size,
                                     end);
        x->pairs[i].dst = r->desc;
    }
    return KVR_OK;
}

static void load_end(load_ctx_t *x)
{
    free(x->table);
    free(x->pairs);
    free(x->canon);
    free(x->off);
    free(x->ident);
}

/* Each region's offset in the chunk (x->off), unless the chunk's table
 * and length are those of the chunk they were found in. */
static kvr_status_t find_regions(const kvr_store_io_t *io, load_ctx_t *x,
                                 const uint8_t *data, uint64_t len,
                                 kvr_error_t *err)
{
    if (io->num_regions == 0)
        return KVR_OK;
    if (x->table != NULL && len == x->len && len >= x->table_len &&
        memcmp(data, x->table, x->table_len) == 0)
        return KVR_OK;
    free(x->table);
    x->table = NULL;
    for (size_t i = 0; i < io->num_regions; i++) {
        kvr_status_t s = find_region(data, len, &io->regions[i].desc,
                                     x->canon[i].width * io->chunk,
                                     &x->off[i], err);
        if (s != KVR_OK)
            return s;
    }
    uint64_t tlen = 8 + TABLE_ENTRY * kvr__get_le(data, 4); /* checked */
    x->table = malloc(tlen);
    if (x->table != NULL) {
        memcpy(x->table, data, tlen);
        x->table_len = tlen;
        x->len = len;
    }
    return KVR_OK;
}

static kvr_status_t scatter(const kvr_store_io_t *io, load_ctx_t *x, size_t c,
                            const uint8_t *data, uint64_t len, kvr_error_t *err)
{
    uint64_t start = c * io->chunk, end = start + io->chunk;
    kvr_status_t s = find_regions(io, x, data, len, err);
    if (s != KVR_OK)
        return s;
    kvr_request_t req = {.src_blocks = x->ident,
                         .num_src_blocks = end / io->block_size,
                         .dst_blocks = io->blocks,
                         .num_dst_blocks = io->num_blocks,
                         .num_tokens = end,
                         .num_computed_blocks = start /
                                                kvr_virtual_block(io->lay)};
    kvr_plan_set_t *set = NULL;
    s = kvr_plan_set_create(&x->lay, io->rank, x->pairs, io->num_regions, &req,
                            &set, err);
    chunk_side_t side = {.io = io,
                         .canon = x->canon,
                         .off = x->off,
                         .chunk = (uint8_t *)data, /* read only */
                         .start = start,
                         .preshuffle = x->lay.preshuffle,
                         .load = true};
    if (s == KVR_OK)
        s = apply_set(set, &side, err);
    kvr_plan_set_destroy(set);
    return s;
}

/* Chunk c and c + 1 .. c + depth are queued for the store's reader, so
 * that chunks after c are read (and hashed) while c is checked and
 * scattered; small chunks further ahead (store_internal.h). */
static void read_ahead(kvr_store_t *st, const kvr_store_io_t *io, size_t c)
{
    size_t depth = st->last_len > 0 && st->last_len <= KVR__AHEAD_SMALL
                       ? KVR__AHEAD
                       : 2;
    for (size_t k = c; k <= c + depth && k < io->num_chains; k++) {
        kvr_chunk_key_t next = key_of(io, k);
        kvr__store_read_ahead(st, &next);
    }
}

kvr_status_t kvr_store_load(kvr_store_t *st, const kvr_store_io_t *io,
                            uint64_t *tokens, kvr_error_t *err)
{
    if (tokens == NULL)
        return kvr_error_set(err, KVR_ERR_INVALID, "store load: tokens NULL");
    *tokens = 0;
    kvr_status_t s = check_io(st, io, err);
    if (s != KVR_OK)
        return s;
    if (io->block_size != io->lay->block_size)
        return kvr_error_set(err, KVR_ERR_LAYOUT_MISMATCH,
                             "store load: "
                             "consumer bs %u, store bs %u",
                             io->lay->block_size, io->block_size);
    load_ctx_t x = {0};
    s = load_begin(io, &x, err);
    for (size_t c = 0; s == KVR_OK && c < io->num_chains; c++) {
        kvr_chunk_key_t key = key_of(io, c);
        const uint8_t *data;
        uint64_t len;
        kvr_error_t miss;
        read_ahead(st, io, c);
        if (kvr__store_ref(st, &key, &data, &len, &miss) != KVR_OK)
            break; /* a miss or a corrupt chunk ends the hit */
        s = scatter(io, &x, c, data, len, err);
        if (s == KVR_OK) {
            *tokens = (c + 1) * io->chunk;
            st->stats.loaded_bytes += len;
        }
    }
    load_end(&x);
    kvr__store_ahead_drop(st); /* past a miss: reads nobody will take */
    return s;
}
