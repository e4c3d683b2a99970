/* Pair plan validation (docs/design.md §18): which (producer, consumer)
 * combinations are planned, every other one refused with its own status
 * before a byte moves; the ranks, tables and ids a pair plan reads; and the
 * producer ranks a consumer rank pulls from. */
#include <stdlib.h>
#include <string.h>

#include "layout_math.h"
#include "plan_internal.h"

typedef unsigned long long ull;

/* A W == 1 side owns every token; its chunks are taken as whole blocks so
 * pieces never split inside a block for no reason (the slots are the same
 * for any I when W == 1). */
void kvr__sides(const kvr_layout_t *lay, kvr__side_t *ps, kvr__side_t *cs)
{
    ps->bs = kvr_producer_block_size(lay);
    ps->W = kvr_producer_dcp(lay);
    ps->I = ps->W == 1 ? ps->bs : kvr_producer_interleave(lay);
    ps->V = ps->bs * ps->W;
    cs->bs = lay->block_size;
    cs->W = lay->dcp_size;
    cs->I = cs->W == 1 ? cs->bs : lay->interleave;
    cs->V = cs->bs * cs->W;
}

kvr_axis_t kvr_region_axis(const kvr_region_desc_t *r)
{
    return r != NULL && r->role == KVR_ROLE_DENSE && r->heads != 0
               ? KVR_AXIS_TP
               : KVR_AXIS_DCP;
}

uint32_t kvr_axis_ranks(const kvr_layout_t *lay, kvr_axis_t axis, bool consumer)
{
    if (axis == KVR_AXIS_TP)
        return consumer ? lay->tp : lay->producer_tp;
    return consumer ? lay->dcp_size : kvr_producer_dcp(lay);
}

/* At W == 1 a sharded and a replicated index are the same pages. */
int kvr__consumer_index_repl(const kvr_layout_t *lay)
{
    return lay->replicate_index || lay->dcp_size == 1;
}

/* Index pages hold contiguous runs of global tokens on both sides, so an
 * index pair plan is the token pair plan of two "page views": a replicated
 * side is one rank (W = 1) whose blocks are its wide pages (V tokens); a
 * sharded one (I == bs) is itself, its chunks whole pages. A replicated
 * producer serves consumer rank c from its rank c % W_p only (every rank
 * holds everything; this spreads the consumers); 0 when p is not it. */
int kvr__index_view(const kvr__pair_t *x, kvr__pair_t *v)
{
    *v = *x;
    if (x->ps.W > 1 && x->lay->producer_replicate_index) {
        if (x->p != x->c % x->ps.W)
            return 0;
        v->ps = (kvr__side_t){x->ps.V, 1, x->ps.V, x->ps.V};
        v->p = 0;
    }
    if (kvr__consumer_index_repl(x->lay)) {
        v->cs = (kvr__side_t){x->cs.V, 1, x->cs.V, x->cs.V};
        v->c = 0;
    }
    return 1;
}

/* The consumer's table and offset are checked as for kvr_plan_create; the
 * producer's table depends on the region kind, so kvr__pair_check does it.
 * k < ceil(N / V) is k * V < N without the overflow. */
kvr_status_t kvr__pair_begin(const kvr_layout_t *lay, uint32_t producer,
                             uint32_t consumer, const kvr_request_t *req,
                             kvr__pair_t *x, kvr_error_t *err)
{
    memset(x, 0, sizeof(*x));
    kvr_status_t st = kvr_layout_check(lay, err);
    if (st != KVR_OK)
        return st;
    if (req == NULL || (req->num_src_blocks && req->src_blocks == NULL) ||
        (req->num_dst_blocks && req->dst_blocks == NULL))
        return kvr_error_set(err, KVR_ERR_INVALID,
                             "request or its block tables are NULL");
    x->lay = lay;
    x->p = producer;
    x->c = consumer;
    x->req = req;
    kvr__sides(lay, &x->ps, &x->cs);
    x->N = req->num_tokens;
    x->k0 = req->num_computed_blocks;
    x->end_dst = kvr__ceil_div(x->N, x->cs.V);
    if (x->end_dst > req->num_dst_blocks)
        return kvr_error_set(err, KVR_ERR_DST_TABLE_SHORT,
                             "%llu tokens need %llu destination blocks of %llu "
                             "virtual tokens, the table has %zu",
                             (ull)x->N, (ull)x->end_dst, (ull)x->cs.V,
                             req->num_dst_blocks);
    uint64_t span;
    if (__builtin_mul_overflow(x->end_dst, x->cs.V, &span))
        return kvr_error_set(err, KVR_ERR_INVALID,
                             "num_tokens %llu exceeds the largest plannable "
                             "count: %llu blocks of %llu virtual tokens pass "
                             "2^64",
                             (ull)x->N, (ull)x->end_dst, (ull)x->cs.V);
    if (x->k0 != 0 && !(x->k0 < x->end_dst))
        return kvr_error_set(err, KVR_ERR_INCREMENTAL,
                             "num_computed_blocks %llu invalid: needs %llu * "
                             "V=%llu < %llu tokens",
                             (ull)x->k0, (ull)x->k0, (ull)x->cs.V, (ull)x->N);
    x->g0 = x->k0 * x->cs.V;
    kvr__req_info_t info = {.first_dst = x->k0, .end_dst = x->end_dst};
    st = kvr__check_duplicates(req, &info, err);
    if (st == KVR_OK)
        x->max_dst_id = kvr__max_id(req->dst_blocks, x->k0, x->end_dst);
    return st;
}

/* The index rules of docs/design.md §18: a sharded consumer index needs
 * I == bs (as today); a sharded producer index needs I_p == bs_p, and a
 * producer with W_p > 1 needs a replicated consumer index. */
static kvr_status_t index_rule(const kvr_layout_t *lay, uint32_t layer,
                               kvr_error_t *err)
{
    uint32_t Wp = kvr_producer_dcp(lay), Ip = kvr_producer_interleave(lay);
    uint32_t bsp = kvr_producer_block_size(lay);
    if (!kvr__consumer_index_repl(lay) && lay->interleave < lay->block_size)
        return kvr_error_set(err, KVR_ERR_SHARDED_INDEX_INTERLEAVE,
                             "sharded index layer %u under W=%u needs "
                             "I == bs (I=%u, bs=%u); replicate it instead",
                             layer, lay->dcp_size, lay->interleave,
                             lay->block_size);
    if (Wp > 1 && !lay->producer_replicate_index && Ip < bsp)
        return kvr_error_set(err, KVR_ERR_PRODUCER_INDEX_INTERLEAVE,
                             "sharded producer index layer %u under W_p=%u "
                             "needs I_p == bs_p (I_p=%u, bs_p=%u); replicate "
                             "it on the producer instead",
                             layer, Wp, Ip, bsp);
    if (Wp > 1 && !kvr__consumer_index_repl(lay))
        return kvr_error_set(err, KVR_ERR_INDEX_NEEDS_REPLICATED,
                             "index layer %u: producer W_p=%u into consumer "
                             "W=%u needs a replicated consumer index",
                             layer, Wp, lay->dcp_size);
    return KVR_OK;
}

/* Dense KV is head-sharded over TP only: under DCP on either side it is
 * refused (§18 plans no token sharding of it). Without its head geometry a
 * dense page is opaque, so it moves only as an identity page. */
static kvr_status_t dense_rule(const kvr_layout_t *lay,
                               const kvr_region_desc_t *r, kvr__kind_t *kind,
                               kvr_error_t *err)
{
    uint32_t Wp = kvr_producer_dcp(lay), bsp = kvr_producer_block_size(lay);
    if (Wp > 1 || lay->dcp_size > 1)
        return kvr_error_set(err, KVR_ERR_NOT_IMPLEMENTED,
                             "dense region layer %u: no relayout for W_p=%u, "
                             "W=%u (dense KV is head-sharded over TP only)",
                             r->layer, Wp, lay->dcp_size);
    int same = lay->tp == lay->producer_tp && bsp == lay->block_size;
    /* equal TP and bs: tp rank t holds the same heads on both sides, so
     * its pages move whole to tp rank t, as kvr_plan_create moves them */
    *kind = r->heads && !same ? KVR__KIND_DENSE : KVR__KIND_PAGE;
    if (r->heads == 0 && !same)
        return kvr_error_set(err, KVR_ERR_DENSE_NO_HEADS,
                             "dense region layer %u has no head geometry: tp "
                             "%u -> %u, bs %u -> %u needs heads, head dim and "
                             "element bytes",
                             r->layer, lay->producer_tp, lay->tp, bsp,
                             lay->block_size);
    return KVR_OK;
}

static kvr_status_t pair_rule(const kvr_layout_t *lay,
                              const kvr_region_desc_t *r, kvr__kind_t *kind,
                              kvr_error_t *err)
{
    uint32_t Wp = kvr_producer_dcp(lay), bsp = kvr_producer_block_size(lay);
    *kind = KVR__KIND_PAGE;
    switch (r->role) {
    case KVR_ROLE_MLA:
        *kind = KVR__KIND_TOKEN;
        return KVR_OK;
    case KVR_ROLE_INDEX:
        *kind = KVR__KIND_INDEX_PAIR;
        return index_rule(lay, r->layer, err);
    case KVR_ROLE_DENSE:
        return dense_rule(lay, r, kind, err);
    case KVR_ROLE_STATE:
    case KVR_ROLE_OTHER:
        if (Wp > 1 || lay->dcp_size > 1 || bsp != lay->block_size)
            return kvr_error_set(err, KVR_ERR_NO_RELAYOUT,
                                 "%s region layer %u: no relayout exists under "
                                 "W_p=%u, W=%u, bs %u -> %u",
                                 kvr_role_name(r->role), r->layer, Wp,
                                 lay->dcp_size, bsp, lay->block_size);
        return KVR_OK;
    case KVR_ROLE_STAGING:
        return kvr_error_set(err, KVR_ERR_NO_RELAYOUT,
                             "staging region layer %u is not KV", r->layer);
    }
    return kvr_error_set(err, KVR_ERR_INVALID, "region layer %u: role %d",
                         r->layer, (int)r->role);
}

static int same_heads(const kvr_region_desc_t *s, const kvr_region_desc_t *d)
{
    uint32_t sp = s->kv_planes ? s->kv_planes : 2;
    uint32_t dp = d->kv_planes ? d->kv_planes : 2;
    return s->heads == d->heads && s->head_dim == d->head_dim &&
           s->elem_bytes == d->elem_bytes && sp == dp && s->hnd == d->hnd;
}

/* Both regions of a pair hold the same bytes per token: MLA compares token
 * bytes (each side's page over its own bs), the index D and Q, dense its
 * whole head geometry, identity pages their size. */
static kvr_status_t pair_twins(const kvr_layout_t *lay,
                               const kvr_region_pair_t *pair, kvr__kind_t kind,
                               kvr_error_t *err)
{
    const kvr_region_desc_t *s = &pair->src, *d = &pair->dst;
    uint32_t sq = s->quant_block ? s->quant_block : s->index_dim;
    uint32_t dq = d->quant_block ? d->quant_block : d->index_dim;
    uint64_t st = kvr_region_token_bytes_side(lay, s, false);
    uint64_t dt = kvr_region_token_bytes_side(lay, d, true);
    if (kind == KVR__KIND_INDEX_PAIR &&
        (s->index_dim != d->index_dim || sq != dq))
        return kvr_error_set(err, KVR_ERR_PAGE_GEOMETRY,
                             "index layer %u: producer D=%u Q=%u, consumer "
                             "D=%u Q=%u",
                             s->layer, s->index_dim, sq, d->index_dim, dq);
    if (kind == KVR__KIND_TOKEN && st != dt)
        return kvr_error_set(err, KVR_ERR_PAGE_GEOMETRY,
                             "mla layer %u: producer token bytes %llu, "
                             "consumer token bytes %llu",
                             s->layer, (ull)st, (ull)dt);
    if (s->role == KVR_ROLE_DENSE && !same_heads(s, d))
        return kvr_error_set(err, KVR_ERR_PAGE_GEOMETRY,
                             "dense layer %u: producer %u heads x %u x %u B, "
                             "consumer %u heads x %u x %u B (or planes, "
                             "order differ)",
                             s->layer, s->heads, s->head_dim, s->elem_bytes,
                             d->heads, d->head_dim, d->elem_bytes);
    if (kind == KVR__KIND_PAGE && s->page_bytes != d->page_bytes)
        return kvr_error_set(err, KVR_ERR_PAGE_GEOMETRY,
                             "%s layer %u: producer page bytes %llu, consumer "
                             "page bytes %llu",
                             kvr_role_name(s->role), s->layer,
                             (ull)s->page_bytes, (ull)d->page_bytes);
    return KVR_OK;
}

kvr_status_t kvr__pair_classify(const kvr_layout_t *lay,
                                const kvr_region_pair_t *pair,
                                kvr__kind_t *kind, kvr_error_t *err)
{
    kvr_status_t st = kvr__check_roles(pair, err);
    if (st == KVR_OK)
        st = pair_rule(lay, &pair->src, kind, err);
    if (st == KVR_OK)
        st = kvr_region_check(lay, &pair->src, false, err);
    if (st == KVR_OK)
        st = kvr_region_check(lay, &pair->dst, true, err);
    if (st == KVR_OK)
        st = pair_twins(lay, pair, *kind, err);
    return st;
}

/* The producer entries a plan reads are the local blocks holding the
 * producer rank's tokens in [g0, N): local_len counts them (a page view for
 * the index; nothing when the rank does not serve this consumer). */
void kvr__pair_src_range(const kvr__pair_t *x, kvr__kind_t kind, uint64_t *lo,
                         uint64_t *hi)
{
    kvr__pair_t v;
    const kvr__pair_t *y = x;
    *lo = *hi = 0;
    if (kind == KVR__KIND_INDEX_PAIR) {
        if (!kvr__index_view(x, &v))
            return;
        y = &v;
    }
    if (kind == KVR__KIND_PAGE && x->p != x->c)
        return;
    const kvr__side_t *ps = &y->ps;
    uint64_t a = kvr__local_len(y->g0, kind == KVR__KIND_PAGE ? 0 : y->p, ps->I,
                                ps->W);
    uint64_t b = kvr__local_len(y->N, kind == KVR__KIND_PAGE ? 0 : y->p, ps->I,
                                ps->W);
    *lo = a / ps->bs;
    *hi = b > a ? kvr__ceil_div(b, ps->bs) : *lo;
}

static const char *axis_name(kvr_axis_t axis)
{
    return axis == KVR_AXIS_TP ? "TP" : "DCP";
}

static kvr_status_t check_ranks(kvr__pair_t *x, const kvr_region_desc_t *r,
                                kvr_error_t *err)
{
    kvr_axis_t axis = kvr_region_axis(r);
    if (x->axis_set && axis != x->axis)
        return kvr_error_set(err, KVR_ERR_INVALID,
                             "region layer %u is planned over %s ranks, the "
                             "set's others over %s: make one set per axis",
                             r->layer, axis_name(axis), axis_name(x->axis));
    x->axis = axis;
    x->axis_set = 1;
    uint32_t np = kvr_axis_ranks(x->lay, axis, false);
    uint32_t nc = kvr_axis_ranks(x->lay, axis, true);
    if (x->p >= np || x->c >= nc)
        return kvr_error_set(
            err, KVR_ERR_RANK_RANGE, "%s %s rank %u out of range [0, %u)",
            x->p >= np ? "producer" : "consumer", axis_name(axis),
            x->p >= np ? x->p : x->c, x->p >= np ? np : nc);
    return KVR_OK;
}

/* The largest id of the producer range, cached: the pairs of a plan set
 * mostly read the same range. */
static uint32_t src_max(kvr__pair_t *x, uint64_t lo, uint64_t hi)
{
    if (!x->src_cached || x->src_lo != lo || x->src_hi != hi) {
        x->src_max = kvr__max_id(x->req->src_blocks, lo, hi);
        x->src_lo = lo;
        x->src_hi = hi;
        x->src_cached = 1;
    }
    return x->src_max;
}

static kvr_status_t check_tables(kvr__pair_t *x, const kvr_region_pair_t *pair,
                                 kvr__kind_t kind, kvr_error_t *err)
{
    const kvr_request_t *req = x->req;
    uint64_t lo, hi;
    kvr__pair_src_range(x, kind, &lo, &hi);
    if (hi > lo && hi > req->num_src_blocks)
        return kvr_error_set(err, KVR_ERR_SRC_TABLE_SHORT,
                             "%llu tokens need %llu source blocks of producer "
                             "rank %u, the table has %zu",
                             (ull)x->N, (ull)hi, x->p, req->num_src_blocks);
    if (hi > lo && src_max(x, lo, hi) >= pair->src.num_blocks)
        return kvr__block_range_error(req->src_blocks, lo, hi, &pair->src,
                                      "source", err);
    if (x->end_dst > x->k0 && x->max_dst_id >= pair->dst.num_blocks)
        return kvr__block_range_error(req->dst_blocks, x->k0, x->end_dst,
                                      &pair->dst, "destination", err);
    return KVR_OK;
}

kvr_status_t kvr__pair_check(kvr__pair_t *x, const kvr_region_pair_t *pair,
                             kvr__kind_t *kind, kvr_error_t *err)
{
    kvr_status_t st = kvr__pair_classify(x->lay, pair, kind, err);
    if (st == KVR_OK)
        st = check_ranks(x, &pair->src, err);
    if (st == KVR_OK)
        st = check_tables(x, pair, *kind, err);
    return st;
}

kvr_status_t kvr__pair_prepare(const kvr_layout_t *lay, uint32_t producer,
                               uint32_t consumer, const kvr_request_t *req,
                               const kvr_region_pair_t *pair, kvr__pair_t *x,
                               kvr__kind_t *kind, kvr_error_t *err)
{
    kvr_status_t st = kvr__pair_begin(lay, producer, consumer, req, x, err);
    return st == KVR_OK ? kvr__pair_check(x, pair, kind, err) : st;
}

/* ---- sources ---- */

/* Whether pair (x->p, x->c) of this kind moves anything of [from, to). */
static int contributes(const kvr__pair_t *x, const kvr_region_pair_t *pair,
                       kvr__kind_t kind, uint64_t from, uint64_t to)
{
    kvr__pair_t v;
    kvr__dense_map_t m;
    if (from >= to)
        return 0;
    switch (kind) {
    case KVR__KIND_TOKEN:
        return kvr__tokens_meet(&x->ps, x->p, &x->cs, x->c, from, to);
    case KVR__KIND_INDEX_PAIR:
        return kvr__index_view(x, &v) &&
               kvr__tokens_meet(&v.ps, v.p, &v.cs, v.c, from, to);
    case KVR__KIND_DENSE:
        kvr__dense_map(x->lay, &pair->src, x->p, x->c, &m);
        return m.nh > 0;
    default: /* identity pages: rank p to rank p */
        return x->p == x->c;
    }
}

kvr_status_t kvr_plan_sources(const kvr_layout_t *lay,
                              const kvr_region_pair_t *pair,
                              uint32_t consumer_rank, const kvr_request_t *req,
                              uint32_t *ranks, size_t cap, size_t *num,
                              kvr_error_t *err)
{
    kvr__kind_t kind;
    kvr__pair_t x = {0};
    if (num == NULL || (cap && ranks == NULL))
        return kvr_error_set(err, KVR_ERR_INVALID, "ranks or num is NULL");
    kvr_status_t st = kvr_layout_check(lay, err);
    if (st == KVR_OK)
        st = kvr__pair_classify(lay, pair, &kind, err);
    if (st != KVR_OK)
        return st;
    kvr_axis_t axis = kvr_region_axis(&pair->src);
    uint32_t np = kvr_axis_ranks(lay, axis, false);
    if (consumer_rank >= kvr_axis_ranks(lay, axis, true))
        return kvr_error_set(
            err, KVR_ERR_RANK_RANGE, "consumer %s rank %u out of range [0, %u)",
            axis_name(axis), consumer_rank, kvr_axis_ranks(lay, axis, true));
    x.lay = lay;
    x.c = consumer_rank;
    kvr__sides(lay, &x.ps, &x.cs);
    uint64_t from = 0, to = UINT64_MAX; /* any request */
    if (req != NULL && /* an offset past 2^64 tokens leaves nothing */
        __builtin_mul_overflow(req->num_computed_blocks, x.cs.V, &from))
        from = UINT64_MAX;
    if (req != NULL)
        to = req->num_tokens;
    size_t n = 0;
    for (uint32_t p = 0; p < np; p++) {
        x.p = p;
        if (!contributes(&x, pair, kind, from, to))
            continue;
        if (n < cap)
            ranks[n] = p;
        n++;
    }
    *num = n;
    if (n > cap)
        return kvr_error_set(err, KVR_ERR_BUFFER_SMALL,
                             "%zu sources, room for %zu", n, cap);
    return KVR_OK;
}
