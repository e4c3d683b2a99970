/* Planner input validation (docs/design.md §4): every check its own status code,
 * every message naming the values. */
#include <stdbool.h>
#include <stdlib.h>
#include <string.h>

#include "layout_math.h"
#include "plan_internal.h"

typedef unsigned long long ull;

/* k = 0, or k*V < N, k < len(dst) and k*W < len(src) (docs/design.md §4);
 * products that wrap are invalid, never compared. */
static bool incremental_ok(const kvr_layout_t *lay, const kvr_request_t *req,
                           uint64_t V)
{
    uint64_t k = req->num_computed_blocks, kV, kW;
    if (k == 0)
        return true;
    if (__builtin_mul_overflow(k, V, &kV) ||
        __builtin_mul_overflow(k, (uint64_t)lay->dcp_size, &kW))
        return false;
    return kV < req->num_tokens && k < req->num_dst_blocks &&
           kW < req->num_src_blocks;
}

/* Tables are the request's full tables (never pre-sliced): N tokens need
 * ceil(N / bs) source blocks and ceil(N / V) destination entries.
 * Incremental: k virtual blocks already cached are k*V tokens, i.e. k*W
 * source blocks and k destination entries, so the plan starts there. k must
 * leave something to move (k*V < N) and stay inside both tables. An offset at
 * or past the end is nearly always one counted in the wrong unit (physical
 * blocks are W times more than virtual ones), so it is refused rather than
 * planned as empty. k == 0 is always valid, even for N == 0. */
static kvr_status_t check_tables(const kvr_layout_t *lay,
                                 const kvr_request_t *req,
                                 kvr__req_info_t *info, kvr_error_t *err)
{
    uint64_t N = req->num_tokens, k = req->num_computed_blocks;
    info->V = kvr_virtual_block(lay);
    info->end_src = kvr__ceil_div(N, lay->block_size);
    info->end_dst = kvr__ceil_div(N, info->V);
    if (info->end_src > req->num_src_blocks)
        return kvr_error_set(err, KVR_ERR_SRC_TABLE_SHORT,
                             "%llu tokens need %llu source blocks of %u, the "
                             "table has %zu",
                             (ull)N, (ull)info->end_src, lay->block_size,
                             req->num_src_blocks);
    if (info->end_dst > req->num_dst_blocks)
        return kvr_error_set(err, KVR_ERR_DST_TABLE_SHORT,
                             "%llu tokens need %llu destination blocks of %llu "
                             "virtual tokens, the table has %zu",
                             (ull)N, (ull)info->end_dst, (ull)info->V,
                             req->num_dst_blocks);
    uint64_t span;
    if (__builtin_mul_overflow(info->end_dst, info->V, &span))
        return kvr_error_set(err, KVR_ERR_INVALID,
                             "num_tokens %llu exceeds the largest plannable "
                             "count: %llu blocks of %llu virtual tokens pass "
                             "2^64",
                             (ull)N, (ull)info->end_dst, (ull)info->V);
    if (!incremental_ok(lay, req, info->V))
        return kvr_error_set(err, KVR_ERR_INCREMENTAL,
                             "num_computed_blocks %llu invalid: needs k * "
                             "V=%llu < %llu tokens, k < %zu destination and "
                             "k * W=%u < %zu source blocks",
                             (ull)k, (ull)info->V, (ull)N, req->num_dst_blocks,
                             lay->dcp_size, req->num_src_blocks);
    info->first_src = k * lay->dcp_size;
    info->first_dst = k;
    return KVR_OK;
}

static int cmp_u32(const void *a, const void *b)
{
    uint32_t x = *(const uint32_t *)a, y = *(const uint32_t *)b;
    return (x > y) - (x < y);
}

/* Two entries naming one block id would put two virtual blocks on one page,
 * the second overwriting the first. Only the entries this plan writes
 * ([k, ceil(N / V))) are checked. */
kvr_status_t kvr__check_duplicates(const kvr_request_t *req,
                                   const kvr__req_info_t *info,
                                   kvr_error_t *err)
{
    size_t n = (size_t)(info->end_dst - info->first_dst);
    if (n < 2)
        return KVR_OK;
    uint32_t *ids = malloc(n * sizeof(*ids));
    if (ids == NULL)
        return kvr_error_set(err, KVR_ERR_NO_MEMORY, "no memory for %zu ids",
                             n);
    memcpy(ids, req->dst_blocks + info->first_dst, n * sizeof(*ids));
    qsort(ids, n, sizeof(*ids), cmp_u32);
    kvr_status_t st = KVR_OK;
    for (size_t i = 1; i < n && st == KVR_OK; i++)
        if (ids[i] == ids[i - 1])
            st = kvr_error_set(err, KVR_ERR_DUPLICATE_BLOCK,
                               "destination block id %u appears twice in the "
                               "table",
                               ids[i]);
    free(ids);
    return st;
}

/* The largest id is computed once per request and compared with each
 * region's num_blocks; the per-entry scan runs only to name a bad entry. */
uint32_t kvr__max_id(const uint32_t *ids, uint64_t from, uint64_t to)
{
    uint32_t m = 0;
    for (uint64_t i = from; i < to; i++)
        m = ids[i] > m ? ids[i] : m;
    return m;
}

kvr_status_t kvr__check_request(const kvr_layout_t *lay, uint32_t rank,
                                const kvr_request_t *req, kvr__req_info_t *info,
                                kvr_error_t *err)
{
    kvr_status_t st = kvr_layout_check_rank(lay, rank, err);
    if (st != KVR_OK)
        return st;
    if (!kvr_layout_producer_plain(lay))
        return kvr_error_set(err, KVR_ERR_PAIR_REQUIRED,
                             "producer W_p=%u, bs_p=%u (consumer bs=%u): "
                             "plan each (producer, consumer) rank pair",
                             kvr_producer_dcp(lay),
                             kvr_producer_block_size(lay), lay->block_size);
    if (req == NULL || (req->num_src_blocks && req->src_blocks == NULL) ||
        (req->num_dst_blocks && req->dst_blocks == NULL))
        return kvr_error_set(err, KVR_ERR_INVALID,
                             "request or its block tables are NULL");
    st = check_tables(lay, req, info, err);
    if (st != KVR_OK)
        return st;
    st = kvr__check_duplicates(req, info, err);
    if (st != KVR_OK)
        return st;
    info->max_src_id = kvr__max_id(req->src_blocks, info->first_src,
                                   info->end_src);
    info->max_dst_id = kvr__max_id(req->dst_blocks, info->first_dst,
                                   info->end_dst);
    return KVR_OK;
}

/* The role rules (docs/design.md §3): MLA is sharded per token; the index
 * moves by planes, replicated or (W > 1 only at I == bs, where a source page
 * has one owner) sharded; everything else only as identity pages, which needs
 * W == 1 and, for DENSE, equal TP (a head reshard is a pair plan, §18). */
static kvr_status_t role_rule(const kvr_layout_t *lay,
                              const kvr_region_pair_t *pair, kvr__kind_t *kind,
                              kvr_error_t *err)
{
    kvr_role_t role = pair->src.role;
    uint32_t W = lay->dcp_size;
    if (role == KVR_ROLE_MLA) {
        *kind = KVR__KIND_TOKEN;
        return KVR_OK;
    }
    if (role == KVR_ROLE_INDEX) {
        *kind = lay->replicate_index ? KVR__KIND_INDEX_REPL
                                     : KVR__KIND_INDEX_SHARD;
        if (!lay->replicate_index && W > 1 && lay->interleave < lay->block_size)
            return kvr_error_set(err, KVR_ERR_SHARDED_INDEX_INTERLEAVE,
                                 "sharded index layer %u under W=%u needs "
                                 "I == bs (I=%u, bs=%u); replicate it instead",
                                 pair->src.layer, W, lay->interleave,
                                 lay->block_size);
        return KVR_OK;
    }
    *kind = KVR__KIND_PAGE;
    if (role == KVR_ROLE_DENSE && W > 1)
        return kvr_error_set(err, KVR_ERR_NOT_IMPLEMENTED,
                             "dense region layer %u: no relayout for W=%u "
                             "(dense KV is head-sharded over TP only)",
                             pair->src.layer, W);
    if (role == KVR_ROLE_DENSE && lay->tp != lay->producer_tp)
        return kvr_error_set(
            err,
            pair->src.heads ? KVR_ERR_PAIR_REQUIRED : KVR_ERR_DENSE_NO_HEADS,
            "dense region layer %u: tp %u -> %u needs %s", pair->src.layer,
            lay->producer_tp, lay->tp,
            pair->src.heads ? "a plan per tp rank pair" : "its head geometry");
    if ((role == KVR_ROLE_STATE || role == KVR_ROLE_OTHER) && W > 1)
        return kvr_error_set(err, KVR_ERR_NO_RELAYOUT,
                             "%s region layer %u: no relayout exists under "
                             "W=%u",
                             kvr_role_name(role), pair->src.layer, W);
    if (role == KVR_ROLE_STAGING)
        return kvr_error_set(err, KVR_ERR_NO_RELAYOUT,
                             "staging region layer %u is not KV",
                             pair->src.layer);
    return KVR_OK;
}

/* Producer and consumer regions of a pair must hold the same bytes per
 * token. Index pages may differ in size (a replicated page is W times wider),
 * so they compare D and Q; every other kind copies tokens or pages byte for
 * byte, so their page bytes must be equal. */
static kvr_status_t check_twins(const kvr_layout_t *lay,
                                const kvr_region_pair_t *pair, kvr__kind_t kind,
                                kvr_error_t *err)
{
    const kvr_region_desc_t *s = &pair->src, *d = &pair->dst;
    uint32_t sq = s->quant_block ? s->quant_block : s->index_dim;
    uint32_t dq = d->quant_block ? d->quant_block : d->index_dim;
    if (kind == KVR__KIND_INDEX_SHARD || kind == KVR__KIND_INDEX_REPL) {
        if (s->index_dim != d->index_dim || sq != dq)
            return kvr_error_set(err, KVR_ERR_PAGE_GEOMETRY,
                                 "index layer %u: producer D=%u Q=%u, "
                                 "consumer D=%u Q=%u",
                                 s->layer, s->index_dim, sq, d->index_dim, dq);
        return KVR_OK;
    }
    (void)lay;
    if (s->page_bytes != d->page_bytes)
        return kvr_error_set(err, KVR_ERR_PAGE_GEOMETRY,
                             "%s layer %u: producer page bytes %llu, consumer "
                             "page bytes %llu",
                             kvr_role_name(s->role), s->layer,
                             (ull)s->page_bytes, (ull)d->page_bytes);
    return KVR_OK;
}

kvr_status_t kvr__block_range_error(const uint32_t *ids, uint64_t from,
                                    uint64_t to, const kvr_region_desc_t *r,
                                    const char *side, kvr_error_t *err)
{
    for (uint64_t i = from; i < to; i++)
        if (ids[i] >= r->num_blocks)
            return kvr_error_set(err, KVR_ERR_BLOCK_RANGE,
                                 "%s block id %u at table index %llu is "
                                 "outside %s layer %u's %llu blocks",
                                 side, ids[i], (ull)i, kvr_role_name(r->role),
                                 r->layer, (ull)r->num_blocks);
    return KVR_ERR_BLOCK_RANGE;
}

kvr_status_t kvr__check_roles(const kvr_region_pair_t *pair, kvr_error_t *err)
{
    if (pair == NULL)
        return kvr_error_set(err, KVR_ERR_INVALID, "region pair is NULL");
    if (pair->src.role != pair->dst.role)
        return kvr_error_set(err, KVR_ERR_ROLE_MISMATCH,
                             "producer region layer %u is %s, consumer region "
                             "layer %u is %s",
                             pair->src.layer, kvr_role_name(pair->src.role),
                             pair->dst.layer, kvr_role_name(pair->dst.role));
    return KVR_OK;
}

kvr_status_t kvr__check_pair(const kvr_layout_t *lay,
                             const kvr_region_pair_t *pair,
                             const kvr_request_t *req,
                             const kvr__req_info_t *info, kvr__kind_t *kind,
                             kvr_error_t *err)
{
    kvr_status_t st = kvr__check_roles(pair, err);
    if (st != KVR_OK)
        return st;
    st = role_rule(lay, pair, kind, err);
    if (st == KVR_OK)
        st = kvr_region_check(lay, &pair->src, false, err);
    if (st == KVR_OK)
        st = kvr_region_check(lay, &pair->dst, true, err);
    if (st == KVR_OK)
        st = check_twins(lay, pair, *kind, err);
    if (st != KVR_OK)
        return st;
    if (info->end_src > info->first_src &&
        info->max_src_id >= pair->src.num_blocks)
        return kvr__block_range_error(req->src_blocks, info->first_src,
                                      info->end_src, &pair->src, "source", err);
    if (info->end_dst > info->first_dst &&
        info->max_dst_id >= pair->dst.num_blocks)
        return kvr__block_range_error(req->dst_blocks, info->first_dst,
                                      info->end_dst, &pair->dst, "destination",
                                      err);
    return KVR_OK;
}

/* The last guard before bytes move: UCX does not bounds-check puts, so a
 * run past a registered length would overwrite a neighbour's memory. The
 * extents make the common case one comparison; the scan names the run. */
kvr_status_t kvr__check_plan_bounds(const kvr_plan_t *plan,
                                    const kvr_region_pair_t *pair,
                                    kvr_error_t *err)
{
    uint64_t src_bytes = kvr_region_bytes(&pair->src);
    uint64_t dst_bytes = kvr_region_bytes(&pair->dst);
    if (plan->dst_end <= dst_bytes && plan->src_end <= src_bytes)
        return KVR_OK;
    for (size_t i = 0; i < plan->num_runs; i++) {
        const kvr_run_t *r = &plan->runs[i];
        if (r->len > dst_bytes || r->dst > dst_bytes - r->len ||
            r->len > src_bytes || r->src > src_bytes - r->len)
            return kvr_error_set(err, KVR_ERR_RUN_OUT_OF_BOUNDS,
                                 "%s layer %u: run %zu (src %llu, dst %llu, "
                                 "len %llu) leaves the regions (src %llu "
                                 "bytes, dst %llu bytes)",
                                 kvr_role_name(pair->src.role), pair->dst.layer,
                                 i, (ull)r->src, (ull)r->dst, (ull)r->len,
                                 (ull)src_bytes, (ull)dst_bytes);
    }
    return KVR_OK;
}
