/* Pair plans (docs/design.md §18): what one consumer rank takes from one
 * producer rank when both sides shard by DCP, each with its own W, I and bs.
 *
 * The tokens both ranks own form a pattern that repeats every
 * lcm(I_p*W_p, I_c*W_c) global tokens: the pieces where one chunk of the
 * producer rank meets one chunk of the consumer rank. A chunk never leaves
 * its block (I divides bs) on either side, so each piece is one contiguous
 * run in both slot spaces. The pattern is computed once per pair; the plan
 * walks consumer entries in ascending block-id order (so runs come out
 * sorted, as in plan.c) and emits the pieces of each entry, finding the
 * first by binary search, with the local indexes advanced per period
 * instead of divided out per token. */
#include <stdbool.h>
#include <stdlib.h>
#include <string.h>

#include "layout_math.h"
#include "plan_internal.h"

static uint64_t gcd_u64(uint64_t a, uint64_t b)
{
    while (b != 0) {
        uint64_t t = a % b;
        a = b;
        b = t;
    }
    return a;
}

/* lcm(a, b), or UINT64_MAX when it does not fit (then nothing repeats
 * within a request). */
static uint64_t lcm_or_max(uint64_t a, uint64_t b)
{
    uint64_t q = a / gcd_u64(a, b);
    return q > UINT64_MAX / b ? UINT64_MAX : q * b;
}

static uint64_t min_u64(uint64_t a, uint64_t b)
{
    return a < b ? a : b;
}

static uint64_t max_u64(uint64_t a, uint64_t b)
{
    return a > b ? a : b;
}

void kvr__pattern_free(kvr__pattern_t *pt)
{
    free(pt->v);
    memset(pt, 0, sizeof(*pt));
}

static kvr_status_t piece_push(kvr__pattern_t *pt, kvr__piece_t piece)
{
    if (pt->n == pt->cap) {
        size_t cap = pt->cap ? 2 * pt->cap : 16;
        kvr__piece_t *v = realloc(pt->v, cap * sizeof(*v));
        if (v == NULL)
            return KVR_ERR_NO_MEMORY;
        pt->v = v;
        pt->cap = cap;
    }
    pt->v[pt->n++] = piece;
    return KVR_OK;
}

/* First chunk of rank r (chunks of I every a = I*W tokens, the first at
 * r*I) that ends after `from`. */
static uint64_t first_chunk(uint64_t r, uint64_t I, uint64_t a, uint64_t from)
{
    uint64_t s = r * I;
    if (from < s + I)
        return s;
    return s + ((from - s - I) / a + 1) * a;
}

/* Two-pointer walk over the chunks of both ranks in [0, span): a piece
 * where they overlap, then the chunk that ends first moves on. */
kvr_status_t kvr__pattern_build(const kvr__side_t *ps, uint64_t p,
                                const kvr__side_t *cs, uint64_t c,
                                uint64_t limit, kvr__pattern_t *pt)
{
    memset(pt, 0, sizeof(*pt));
    uint64_t a = ps->I * ps->W, b = cs->I * cs->W;
    pt->period = lcm_or_max(a, b);
    pt->span = min_u64(pt->period, limit);
    pt->lp_per = pt->period / ps->W;
    pt->lc_per = pt->period / cs->W;
    uint64_t x = p * ps->I, y = c * cs->I;
    while (x < pt->span && y < pt->span) {
        uint64_t xe = x + ps->I, ye = y + cs->I;
        uint64_t lo = max_u64(x, y), hi = min_u64(min_u64(xe, ye), pt->span);
        if (lo < hi &&
            piece_push(
                pt, (kvr__piece_t){lo, hi - lo, kvr__local(lo, ps->I, ps->W),
                                   kvr__local(lo, cs->I, cs->W)}) != KVR_OK) {
            kvr__pattern_free(pt);
            return KVR_ERR_NO_MEMORY;
        }
        if (xe <= ye)
            x += a;
        else
            y += b;
    }
    return KVR_OK;
}

/* The owner sets repeat every lcm, so one period past `from` decides. */
int kvr__tokens_meet(const kvr__side_t *ps, uint64_t p, const kvr__side_t *cs,
                     uint64_t c, uint64_t from, uint64_t to)
{
    uint64_t a = ps->I * ps->W, b = cs->I * cs->W, L = lcm_or_max(a, b);
    if (to > from && to - from > L)
        to = from + L;
    uint64_t x = first_chunk(p, ps->I, a, from);
    uint64_t y = first_chunk(c, cs->I, b, from);
    while (x < to && y < to) {
        uint64_t xe = x + ps->I, ye = y + cs->I;
        uint64_t lo = max_u64(max_u64(x, y), from);
        if (lo < min_u64(min_u64(xe, ye), to))
            return 1;
        if (xe <= ye)
            x += a;
        else
            y += b;
    }
    return 0;
}

/* First piece starting at or after offset o of a period. */
static size_t first_piece(const kvr__pattern_t *pt, uint64_t o)
{
    size_t lo = 0, hi = pt->n;
    while (lo < hi) {
        size_t mid = lo + (hi - lo) / 2;
        if (pt->v[mid].off < o)
            lo = mid + 1;
        else
            hi = mid;
    }
    return lo;
}

/* Entry k holds global tokens [k*V_c, (k+1)*V_c); a piece never straddles
 * their ends (they are chunk ends of the consumer), so the pieces of entry
 * k are those starting in it. In period P the local indexes are the
 * piece's plus P times the tokens a rank gets per period. The consumer row
 * is lc - k*bs_c because local / bs == g / V (docs/design.md §2); the
 * producer block advances with lp, divided out only when it jumps. */
kvr_status_t kvr__pattern_entry(const kvr__pair_t *x, const kvr__pattern_t *pt,
                                uint64_t k, uint64_t end, kvr_plan_t *out)
{
    const kvr__side_t *ps = &x->ps, *cs = &x->cs;
    uint64_t lo = k * cs->V, hi = min_u64(lo + cs->V, end);
    if (pt->n == 0 || lo >= hi)
        return KVR_OK;
    int once = pt->span < pt->period;
    uint64_t P = once ? 0 : lo / pt->period;
    size_t i = first_piece(pt, lo - P * pt->period);
    const uint32_t *src = x->req->src_blocks;
    uint64_t dst = (uint64_t)x->req->dst_blocks[k] * cs->bs, kb = k * cs->bs;
    uint64_t blk = UINT64_MAX, blk_lo = 0;
    for (;; i++) {
        if (i == pt->n) {
            if (once)
                break;
            P++;
            i = 0;
        }
        const kvr__piece_t *pc = &pt->v[i];
        uint64_t g = P * pt->period + pc->off;
        if (g >= hi)
            break;
        uint64_t lp = P * pt->lp_per + pc->lp;
        uint64_t lc = P * pt->lc_per + pc->lc;
        if (blk == UINT64_MAX || lp - blk_lo >= ps->bs) {
            blk = lp / ps->bs;
            blk_lo = blk * ps->bs;
        }
        if (kvr__plan_push(out, (uint64_t)src[blk] * ps->bs + (lp - blk_lo),
                           dst + (lc - kb), min_u64(pc->len, hi - g)) != KVR_OK)
            return KVR_ERR_NO_MEMORY;
    }
    return KVR_OK;
}

/* Runs the pieces of a pattern will make for [g0, end): an estimate that
 * sizes the plan once (capped: past it the plan grows as it fills). */
static size_t pieces_estimate(const kvr__pattern_t *pt, uint64_t g0,
                              uint64_t end, size_t runs_per_piece)
{
    const uint64_t cap = 1u << 22;
    uint64_t n = pt->n + 1, per = runs_per_piece ? runs_per_piece : 1;
    if (pt->span == pt->period && end > g0 &&
        __builtin_mul_overflow(pt->n, (end - g0) / pt->period + 2, &n))
        n = cap;
    return n > cap / per ? cap : n * per;
}

/* Walks the consumer entries in ascending block-id order. `each` (NULL for
 * plain token runs) expands the token pieces of one entry, pushed into
 * scratch, into byte runs of out. */
static kvr_status_t walk_entries(const kvr__pair_t *x, const kvr__pattern_t *pt,
                                 uint64_t end, kvr__expand_fn each,
                                 const void *arg, kvr_plan_t *out)
{
    uint32_t *order = kvr__dst_order(x->req->dst_blocks, x->k0, x->end_dst);
    kvr_plan_t *scratch = each ? kvr__plan_new(64) : NULL;
    kvr_status_t st = order && (scratch || !each) ? KVR_OK : KVR_ERR_NO_MEMORY;
    for (uint64_t i = 0; st == KVR_OK && i + x->k0 < x->end_dst; i++) {
        if (each == NULL) {
            st = kvr__pattern_entry(x, pt, order[i], end, out);
            continue;
        }
        scratch->num_runs = 0;
        st = kvr__pattern_entry(x, pt, order[i], end, scratch);
        if (st == KVR_OK)
            st = each(arg, scratch, out);
    }
    free(order);
    kvr_plan_destroy(scratch);
    return st;
}

kvr_status_t kvr__pair_walk(const kvr__pair_t *x, uint64_t end,
                            kvr__expand_fn each, const void *arg,
                            size_t runs_per_piece, kvr_plan_t **out)
{
    kvr__pattern_t pt;
    if (kvr__pattern_build(&x->ps, x->p, &x->cs, x->c, end, &pt) != KVR_OK)
        return KVR_ERR_NO_MEMORY;
    kvr_plan_t *plan = kvr__plan_new(
        pieces_estimate(&pt, x->g0, end, runs_per_piece));
    kvr_status_t st = plan ? KVR_OK : KVR_ERR_NO_MEMORY;
    if (st == KVR_OK && end > x->g0)
        st = walk_entries(x, &pt, end, each, arg, plan);
    kvr__pattern_free(&pt);
    if (st != KVR_OK) {
        kvr_plan_destroy(plan);
        return st;
    }
    kvr__plan_finish(plan);
    *out = plan;
    return KVR_OK;
}

kvr_status_t kvr__pair_tokens(const kvr__pair_t *x, kvr_plan_t **out)
{
    return kvr__pair_walk(x, x->N, NULL, NULL, 1, out);
}

/* ---- index ---- */

typedef struct {
    uint64_t Pp, Pc;         /* page tokens of the two views */
    uint64_t page_p, page_c; /* page bytes */
    uint64_t D;
} index_geo_t;

/* A piece of rows [r, r + n) of one page on each side moves as its key
 * bytes [r*D, (r+n)*D) (with preshuffled keys too: every piece starts and
 * ends on a multiple of 16 rows, docs/design.md §4) and its scales
 * [P*D + 4r, P*D + 4(r+n)). All key pieces of the entry come first, as in
 * plan.c, so the runs stay sorted by destination. */
static kvr_status_t index_expand(const void *arg, const kvr_plan_t *pieces,
                                 kvr_plan_t *out)
{
    const index_geo_t *g = arg;
    for (int plane = 0; plane < 2; plane++)
        for (size_t i = 0; i < pieces->num_runs; i++) {
            const kvr_run_t *r = &pieces->runs[i];
            uint64_t sp = r->src / g->Pp * g->page_p, rs = r->src % g->Pp;
            uint64_t dp = r->dst / g->Pc * g->page_c, rd = r->dst % g->Pc;
            kvr_status_t st = plane == 0
                                  ? kvr__plan_push(out, sp + rs * g->D,
                                                   dp + rd * g->D,
                                                   r->len * g->D)
                                  : kvr__plan_push(
                                        out, sp + g->Pp * g->D + 4 * rs,
                                        dp + g->Pc * g->D + 4 * rd, 4 * r->len);
            if (st != KVR_OK)
                return st;
        }
    return KVR_OK;
}

/* Index planes move whole even past num_tokens (the request's own slack,
 * as in plan.c): the walk ends at N rounded up to the end of the last
 * page, the earlier of the two sides' page ends. */
static kvr_status_t pair_index(const kvr__pair_t *x,
                               const kvr_region_pair_t *pair, kvr_plan_t **out)
{
    kvr__pair_t v;
    if (!kvr__index_view(x, &v)) /* not this consumer's source */
        return kvr__pair_walk(x, 0, NULL, NULL, 1, out);
    index_geo_t g = {v.ps.bs, v.cs.bs, pair->src.page_bytes,
                     pair->dst.page_bytes, pair->src.index_dim};
    /* the consumer's page end cannot wrap (kvr__pair_begin checked
     * ceil(N / V) * V, and Pc divides V); the producer's may */
    uint64_t end = kvr__ceil_div(v.N, g.Pc) * g.Pc, end_p;
    if (!__builtin_mul_overflow(kvr__ceil_div(v.N, g.Pp), g.Pp, &end_p))
        end = min_u64(end, end_p);
    return kvr__pair_walk(&v, end, index_expand, &g, 2, out);
}

kvr_status_t kvr__pair_plan(const kvr__pair_t *x, const kvr_region_pair_t *pair,
                            kvr__kind_t kind, kvr_plan_t **out)
{
    kvr_status_t st;
    switch (kind) {
    case KVR__KIND_TOKEN:
        st = kvr__pair_tokens(x, out);
        if (st == KVR_OK)
            kvr__plan_scale(*out, kvr_region_token_bytes(x->lay, &pair->dst));
        return st;
    case KVR__KIND_INDEX_PAIR:
        return pair_index(x, pair, out);
    case KVR__KIND_DENSE:
        return kvr__pair_dense(x, pair, out);
    default: /* identity pages (one bs, W == 1): rank p to rank p only */
        if (x->p != x->c)
            return kvr__pair_walk(x, 0, NULL, NULL, 1, out);
        return kvr__plan_kind(x->lay, 0, pair, x->req, KVR__KIND_PAGE, out);
    }
}

kvr_status_t kvr_plan_create_pair(const kvr_layout_t *lay,
                                  uint32_t producer_rank,
                                  uint32_t consumer_rank,
                                  const kvr_region_pair_t *pair,
                                  const kvr_request_t *req, kvr_plan_t **out,
                                  kvr_error_t *err)
{
    kvr__pair_t x;
    kvr__kind_t kind;
    if (out == NULL)
        return kvr_error_set(err, KVR_ERR_INVALID, "out is NULL");
    kvr_status_t st = kvr__pair_prepare(lay, producer_rank, consumer_rank, req,
                                        pair, &x, &kind, err);
    if (st != KVR_OK)
        return st;
    kvr_plan_t *plan = NULL;
    st = kvr__pair_plan(&x, pair, kind, &plan);
    return kvr__plan_deliver(st, plan, pair, out, err);
}

/* ---- plan sets ---- */

static kvr_status_t set_check(void *ctx, const kvr_region_pair_t *pair,
                              kvr__kind_t *kind, kvr_error_t *err)
{
    return kvr__pair_check(ctx, pair, kind, err);
}

static kvr_status_t set_tokens(void *ctx, kvr_plan_t **out)
{
    return kvr__pair_tokens(ctx, out);
}

static kvr_status_t set_plan(void *ctx, const kvr_region_pair_t *pair,
                             kvr__kind_t kind, kvr_plan_t **out)
{
    return kvr__pair_plan(ctx, pair, kind, out);
}

kvr_status_t
kvr_plan_set_create_pair(const kvr_layout_t *lay, uint32_t producer_rank,
                         uint32_t consumer_rank, const kvr_region_pair_t *pairs,
                         size_t num_pairs, const kvr_request_t *req,
                         kvr_plan_set_t **out, kvr_error_t *err)
{
    kvr__pair_t x;
    if (out == NULL || (num_pairs && pairs == NULL))
        return kvr_error_set(err, KVR_ERR_INVALID, "pairs or out is NULL");
    kvr_status_t st = kvr__pair_begin(lay, producer_rank, consumer_rank, req,
                                      &x, err);
    if (st != KVR_OK)
        return st;
    kvr__planner_t pl = {lay, &x, set_check, set_tokens, set_plan};
    return kvr__plan_set_build(&pl, pairs, num_pairs, out, err);
}
