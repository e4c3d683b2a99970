/* Relayout descriptions: the planner's checks, the request's tables and the
 * destination blocks in consumer order, shared by the host reference and the
 * CUDA executors. Plain C, no CUDA. */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "gpu_internal.h"
#include "layout_internal.h"

typedef unsigned long long ull;

static kvr_status_t role_kind(const kvr_layout_t *lay,
                              const kvr_region_desc_t *src,
                              const kvr_region_desc_t *dst, uint32_t *kind,
                              kvr_error_t *err)
{
    uint32_t W = lay->dcp_size;
    if (src->role != dst->role)
        return kvr_error_set(err, KVR_ERR_ROLE_MISMATCH,
                             "producer region layer %u is %s, consumer region "
                             "layer %u is %s",
                             src->layer, kvr_role_name(src->role), dst->layer,
                             kvr_role_name(dst->role));
    *kind = KVR__RL_SEG;
    switch (src->role) {
    case KVR_ROLE_MLA:
        *kind = KVR__RL_MLA;
        return KVR_OK;
    case KVR_ROLE_INDEX:
        if (lay->replicate_index)
            *kind = KVR__RL_REPL;
        else if (W > 1 && lay->interleave < lay->block_size)
            return kvr_error_set(err, KVR_ERR_SHARDED_INDEX_INTERLEAVE,
                                 "sharded index layer %u under W=%u needs "
                                 "I == bs (I=%u, bs=%u)",
                                 src->layer, W, lay->interleave,
                                 lay->block_size);
        return KVR_OK;
    case KVR_ROLE_DENSE:
        if (W > 1 || lay->tp != lay->producer_tp)
            return kvr_error_set(err, KVR_ERR_NOT_IMPLEMENTED,
                                 "dense region layer %u: no relayout for W=%u, "
                                 "tp %u -> %u",
                                 src->layer, W, lay->producer_tp, lay->tp);
        return KVR_OK;
    case KVR_ROLE_STATE:
    case KVR_ROLE_OTHER:
        if (W > 1)
            return kvr_error_set(err, KVR_ERR_NO_RELAYOUT,
                                 "%s region layer %u: no relayout under W=%u",
                                 kvr_role_name(src->role), src->layer, W);
        return KVR_OK;
    case KVR_ROLE_STAGING:
        return kvr_error_set(err, KVR_ERR_NO_RELAYOUT,
                             "staging region layer %u is not KV", src->layer);
    }
    return kvr_error_set(err, KVR_ERR_INVALID, "region layer %u: role %d",
                         src->layer, (int)src->role);
}

/* Both regions valid for their side, and twins where bytes must match. */
static kvr_status_t check_regions(const kvr_layout_t *lay,
                                  const kvr_region_desc_t *src,
                                  const kvr_region_desc_t *dst,
                                  kvr_error_t *err)
{
    kvr_status_t st = kvr_region_check(lay, src, false, err);
    if (st == KVR_OK)
        st = kvr_region_check(lay, dst, true, err);
    if (st != KVR_OK)
        return st;
    if (src->role == KVR_ROLE_INDEX) {
        if (src->index_dim != dst->index_dim)
            return kvr_error_set(err, KVR_ERR_PAGE_GEOMETRY,
                                 "index layer %u: producer D=%u, consumer D=%u",
                                 src->layer, src->index_dim, dst->index_dim);
        return KVR_OK;
    }
    if (src->page_bytes != dst->page_bytes)
        return kvr_error_set(err, KVR_ERR_PAGE_GEOMETRY,
                             "%s layer %u: producer page bytes %llu, consumer "
                             "page bytes %llu",
                             kvr_role_name(src->role), src->layer,
                             (ull)src->page_bytes, (ull)dst->page_bytes);
    return KVR_OK;
}

static kvr_status_t check_tables(const kvr_layout_t *lay,
                                 const kvr_gpu_request_t *req,
                                 uint64_t *end_src, uint64_t *end_dst,
                                 kvr_error_t *err)
{
    uint64_t N = req->num_tokens, k = req->num_computed_blocks;
    uint64_t V = kvr_virtual_block(lay);
    *end_src = kvr_num_src_blocks(lay, N);
    *end_dst = kvr_num_dst_blocks(lay, N);
    if ((req->num_src_blocks && req->src_blocks == NULL) ||
        (req->num_dst_blocks && req->dst_blocks == NULL))
        return kvr_error_set(err, KVR_ERR_INVALID, "block table is NULL");
    if (*end_src > req->num_src_blocks)
        return kvr_error_set(err, KVR_ERR_SRC_TABLE_SHORT,
                             "%llu tokens need %llu source blocks, the table "
                             "has %zu",
                             (ull)N, (ull)*end_src, req->num_src_blocks);
    if (*end_dst > req->num_dst_blocks)
        return kvr_error_set(err, KVR_ERR_DST_TABLE_SHORT,
                             "%llu tokens need %llu destination blocks of "
                             "%llu tokens, the table has %zu",
                             (ull)N, (ull)*end_dst, (ull)V,
                             req->num_dst_blocks);
    if (k != 0 && !(k * V < N && k < req->num_dst_blocks &&
                    k * lay->dcp_size < req->num_src_blocks))
        return kvr_error_set(err, KVR_ERR_INCREMENTAL,
                             "num_computed_blocks %llu invalid for %llu tokens "
                             "(V=%llu, %zu destination, %zu source blocks)",
                             (ull)k, (ull)N, (ull)V, req->num_dst_blocks,
                             req->num_src_blocks);
    if (N > INT32_MAX)
        return kvr_error_set(err, KVR_ERR_UNSUPPORTED,
                             "%llu tokens: the GPU path needs fewer than 2^31",
                             (ull)N);
    return KVR_OK;
}

/* Block ids used by the request inside the region, and its pages inside the
 * registered bytes. */
static kvr_status_t check_ids(const uint32_t *ids, uint64_t from, uint64_t to,
                              const kvr_region_desc_t *r, const char *side,
                              kvr_error_t *err)
{
    uint32_t top = 0;
    for (uint64_t i = from; i < to; i++) /* branch-free: vectorised */
        top = ids[i] > top ? ids[i] : top;
    for (uint64_t i = from; top >= r->num_blocks && i < to; i++)
        if (ids[i] >= r->num_blocks)
            return kvr_error_set(err, KVR_ERR_BLOCK_RANGE,
                                 "%s block id %u at table index %llu is "
                                 "outside %s layer %u's %llu blocks",
                                 side, ids[i], (ull)i, kvr_role_name(r->role),
                                 r->layer, (ull)r->num_blocks);
    if (to > from && (top + 1ull) * r->page_bytes > kvr_region_bytes(r))
        return kvr_error_set(err, KVR_ERR_RUN_OUT_OF_BOUNDS,
                             "%s %s layer %u: page of block %u ends at %llu, "
                             "past the region's %llu bytes",
                             side, kvr_role_name(r->role), r->layer, top,
                             (top + 1ull) * r->page_bytes,
                             (ull)kvr_region_bytes(r));
    return KVR_OK;
}

static kvr_status_t duplicate(uint32_t id, kvr_error_t *err)
{
    return kvr_error_set(err, KVR_ERR_DUPLICATE_BLOCK,
                         "destination block id %u appears twice in the table",
                         id);
}

/* sort_blocks where the region's ids are few beside the table (ids are
 * checked below num_blocks): each id's table index in a slot of its own,
 * then the slots read in id order; no comparison, O(num_blocks + count).
 * 4096 random ids: kvr_gpu_relayout_create 61 -> 15 us on the build
 * machine (docs/gpu.md). */
static kvr_status_t place_blocks(const uint32_t *ids, uint32_t first,
                                 uint32_t count, uint64_t num_blocks,
                                 uint32_t *order, uint32_t *s_last,
                                 kvr_error_t *err)
{
    uint32_t *slot = malloc(num_blocks * sizeof(*slot));
    if (slot == NULL)
        return kvr_error_set(err, KVR_ERR_NO_MEMORY, "no memory for %llu ids",
                             (ull)num_blocks);
    memset(slot, 0xff, num_blocks * sizeof(*slot));
    kvr_status_t st = KVR_OK;
    for (uint32_t i = first; i < first + count && st == KVR_OK; i++) {
        if (slot[ids[i]] != UINT32_MAX)
            st = duplicate(ids[i], err);
        slot[ids[i]] = i;
    }
    for (uint64_t id = 0, s = 0; id < num_blocks && st == KVR_OK; id++) {
        if (slot[id] == UINT32_MAX)
            continue;
        if (slot[id] == first + count - 1)
            *s_last = (uint32_t)s;
        order[s++] = slot[id];
    }
    free(slot);
    return st;
}

/* order[s] = table index of the s-th destination block by id (ids below
 * num_blocks, checked). */
static kvr_status_t sort_blocks(const uint32_t *ids, uint32_t first,
                                uint32_t count, uint64_t num_blocks,
                                uint32_t *order, uint32_t *s_last,
                                kvr_error_t *err)
{
    if (count == 0)
        return KVR_OK;
    if (num_blocks <= 8ull * count + 4096)
        return place_blocks(ids, first, count, num_blocks, order, s_last, err);
    kvr__id_index_t *v = malloc(count * sizeof(*v));
    if (v == NULL)
        return kvr_error_set(err, KVR_ERR_NO_MEMORY, "no memory for %u ids",
                             count);
    kvr__sort_ids(ids, first, count, v);
    kvr_status_t st = KVR_OK;
    for (uint32_t s = 0; s < count && st == KVR_OK; s++) {
        if (s > 0 && v[s].id == v[s - 1].id)
            st = duplicate(v[s].id, err);
        order[s] = v[s].index;
        if (v[s].index == first + count - 1)
            *s_last = s;
    }
    free(v);
    return st;
}

static void fill_geom(const kvr_layout_t *lay, const kvr_region_desc_t *src,
                      const kvr_region_desc_t *dst, uint32_t kind,
                      const kvr_gpu_request_t *req, kvr__rl_geom_t *g)
{
    uint64_t bs = lay->block_size, D = src->index_dim;
    g->num_tokens = req->num_tokens;
    g->kind = kind;
    g->bs = lay->block_size;
    g->W = lay->dcp_size;
    g->I = lay->interleave;
    g->preshuffle = lay->preshuffle;
    g->src_page = src->page_bytes;
    g->dst_page = dst->page_bytes;
    if (kind == KVR__RL_MLA)
        g->unit = src->page_bytes / bs;
    else if (kind == KVR__RL_REPL)
        g->unit = D;
    else
        g->unit = src->role == KVR_ROLE_INDEX ? bs * (D + 4) : src->page_bytes;
}

static kvr_status_t
validate(const kvr_layout_t *lay, const kvr_region_desc_t *src,
         const kvr_region_desc_t *dst, const kvr_gpu_request_t *req,
         uint32_t *kind, uint64_t *end_src, uint64_t *end_dst, kvr_error_t *err)
{
    if (lay == NULL || src == NULL || dst == NULL || req == NULL)
        return kvr_error_set(err, KVR_ERR_INVALID,
                             "layout, region or request is NULL");
    kvr_status_t st = kvr_layout_check(lay, err);
    if (st == KVR_OK)
        st = role_kind(lay, src, dst, kind, err);
    if (st == KVR_OK)
        st = check_regions(lay, src, dst, err);
    if (st == KVR_OK)
        st = check_tables(lay, req, end_src, end_dst, err);
    uint64_t k = req->num_computed_blocks;
    if (st == KVR_OK)
        st = check_ids(req->src_blocks, k * lay->dcp_size, *end_src, src,
                       "source", err);
    if (st == KVR_OK)
        st = check_ids(req->dst_blocks, k, *end_dst, dst, "destination", err);
    return st;
}

kvr_status_t kvr_gpu_relayout_create(const kvr_layout_t *lay,
                                     const kvr_region_desc_t *src,
                                     const kvr_region_desc_t *dst,
                                     const kvr_gpu_request_t *req,
                                     kvr_gpu_relayout_t **out, kvr_error_t *err)
{
    uint32_t kind = 0;
    uint64_t end_src = 0, end_dst = 0;
    if (out == NULL)
        return kvr_error_set(err, KVR_ERR_INVALID, "out is NULL");
    kvr_status_t st = validate(lay, src, dst, req, &kind, &end_src, &end_dst,
                               err);
    if (st != KVR_OK)
        return st;
    uint32_t first = end_dst ? (uint32_t)req->num_computed_blocks : 0;
    uint32_t count = (uint32_t)end_dst - first;
    kvr_gpu_relayout_t *rl = calloc(1, sizeof(*rl));
    size_t words = end_src + end_dst + count + 1;
    uint32_t *t = rl ? malloc(words * sizeof(*t)) : NULL;
    if (t == NULL) {
        free(rl);
        return kvr_error_set(err, KVR_ERR_NO_MEMORY,
                             "no memory for %zu table words", words);
    }
    memcpy(t, req->src_blocks, end_src * sizeof(*t));
    memcpy(t + end_src, req->dst_blocks, end_dst * sizeof(*t));
    kvr__rl_geom_t *g = &rl->geom;
    st = sort_blocks(t + end_src, first, count, dst->num_blocks,
                     t + end_src + end_dst, &g->s_last, err);
    if (st != KVR_OK) {
        free(t);
        free(rl);
        return st;
    }
    fill_geom(lay, src, dst, kind, req, g);
    g->first_dst = first;
    g->num_blocks = count;
    g->end_src = (uint32_t)end_src;
    g->src_blocks = t;
    g->dst_blocks = t + end_src;
    g->order = t + end_src + end_dst;
    rl->tables = t;
    rl->table_words = words;
    *out = rl;
    return KVR_OK;
}

void kvr_gpu_relayout_destroy(kvr_gpu_relayout_t *rl)
{
    if (rl == NULL)
        return;
    for (int d = 0; d < KVR__GPU_MAX_DEVICES; d++)
        if (rl->device[d] != NULL && rl->free_device != NULL)
            rl->free_device(rl->device[d], rl->table_words * sizeof(uint32_t),
                            rl->device_owner[d]);
    free(rl->tables);
    free(rl);
}

uint64_t kvr_gpu_relayout_bytes(const kvr_gpu_relayout_t *rl, uint32_t rank)
{
    if (rl == NULL || rank >= rl->geom.W)
        return 0;
    return kvr__rl_rank_bytes(&rl->geom, rank);
}

kvr_status_t kvr__rl_check_range(const kvr_gpu_relayout_t *rl, uint32_t rank,
                                 uint64_t offset, uint64_t len,
                                 kvr_error_t *err)
{
    if (rl == NULL)
        return kvr_error_set(err, KVR_ERR_INVALID, "relayout is NULL");
    if (rank >= rl->geom.W)
        return kvr_error_set(err, KVR_ERR_RANK_RANGE,
                             "DCP rank %u out of range [0, %u)", rank,
                             rl->geom.W);
    uint64_t total = kvr__rl_rank_bytes(&rl->geom, rank);
    if (offset > total || len > total - offset)
        return kvr_error_set(err, KVR_ERR_INVALID,
                             "staging range [%llu, %llu + %llu) outside rank "
                             "%u's %llu bytes",
                             (ull)offset, (ull)offset, (ull)len, rank,
                             (ull)total);
    return KVR_OK;
}

/* Inverse of kvr__rl_block_stream: every block before the last one in
 * sorted order is full, the last one holds `last` bytes. */
static uint32_t block_at(const kvr__rl_geom_t *g, uint64_t pos, uint64_t last)
{
    uint64_t full = kvr__rl_full_bytes(g);
    uint64_t at = (uint64_t)g->s_last * full;
    if (pos < at)
        return (uint32_t)(pos / full);
    if (pos < at + last)
        return g->s_last;
    return g->s_last + 1 + (uint32_t)((pos - at - last) / full);
}

void kvr__rl_block_span(const kvr__rl_geom_t *g, uint32_t rank, uint64_t offset,
                        uint64_t len, uint32_t *s0, uint32_t *s1)
{
    uint64_t last = kvr__rl_last_bytes(g, rank);
    *s0 = block_at(g, offset, last);
    *s1 = block_at(g, offset + len - 1, last) + 1;
}
