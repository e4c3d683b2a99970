/* Internals shared by the plan layer's files. */
#ifndef KVRELAY_PLAN_INTERNAL_H
#define KVRELAY_PLAN_INTERNAL_H

#include "kvrelay/plan.h"

struct kvr_plan {
    kvr_run_t *runs;
    size_t num_runs;
    size_t cap;
    size_t uncoalesced;
    uint64_t bytes;
    uint64_t src_end; /* max src + len over runs */
    uint64_t dst_end; /* max dst + len over runs */
};

/* How a region pair is planned. */
typedef enum {
    KVR__KIND_TOKEN,       /* sharded by owner, per I-token chunk (MLA) */
    KVR__KIND_INDEX_SHARD, /* whole index planes to the block's owner */
    KVR__KIND_INDEX_REPL,  /* index planes into W-times-wider pages */
    KVR__KIND_PAGE,        /* identity whole pages (W == 1) */
    KVR__KIND_INDEX_PAIR,  /* pair plans: index planes between any two page
                              geometries (docs/design.md §18) */
    KVR__KIND_DENSE,       /* pair plans: head-sharded dense K/V */
} kvr__kind_t;

/* Request facts derived once per request by kvr__check_request. */
typedef struct {
    uint64_t V;
    uint64_t first_src; /* k * W */
    uint64_t end_src;   /* ceil(N / bs) */
    uint64_t first_dst; /* k */
    uint64_t end_dst;   /* ceil(N / V) */
    uint32_t max_src_id;
    uint32_t max_dst_id;
} kvr__req_info_t;

kvr_status_t kvr__check_request(const kvr_layout_t *lay, uint32_t rank,
                                const kvr_request_t *req, kvr__req_info_t *info,
                                kvr_error_t *err);
kvr_status_t kvr__check_pair(const kvr_layout_t *lay,
                             const kvr_region_pair_t *pair,
                             const kvr_request_t *req,
                             const kvr__req_info_t *info, kvr__kind_t *kind,
                             kvr_error_t *err);
/* Pieces of the checks, shared with the pair planner: a destination id
 * used twice in [first_dst, end_dst), the largest id of a table range, and
 * the error naming the first id of a range outside its region. */
kvr_status_t kvr__check_duplicates(const kvr_request_t *req,
                                   const kvr__req_info_t *info,
                                   kvr_error_t *err);
uint32_t kvr__max_id(const uint32_t *ids, uint64_t from, uint64_t to);
kvr_status_t kvr__block_range_error(const uint32_t *ids, uint64_t from,
                                    uint64_t to, const kvr_region_desc_t *r,
                                    const char *side, kvr_error_t *err);
/* Both regions of a pair are there and of one role. */
kvr_status_t kvr__check_roles(const kvr_region_pair_t *pair, kvr_error_t *err);
/* A planner's result handed out: its status (no memory), then the bounds
 * check; the plan is destroyed on any failure. */
kvr_status_t kvr__plan_deliver(kvr_status_t st, kvr_plan_t *plan,
                               const kvr_region_pair_t *pair, kvr_plan_t **out,
                               kvr_error_t *err);
kvr_status_t kvr__check_plan_bounds(const kvr_plan_t *plan,
                                    const kvr_region_pair_t *pair,
                                    kvr_error_t *err);

kvr_plan_t *kvr__plan_new(size_t cap);
kvr_status_t kvr__plan_push(kvr_plan_t *plan, uint64_t src, uint64_t dst,
                            uint64_t len);
/* Sorts by destination, coalesces, sums bytes and extents. */
void kvr__plan_finish(kvr_plan_t *plan);
/* Token-space plan for a token-addressable role on `rank`. */
kvr_status_t kvr__plan_tokens(const kvr_layout_t *lay, uint32_t rank,
                              const kvr_request_t *req, kvr_plan_t **out);
/* Token units to bytes, in place. */
void kvr__plan_scale(kvr_plan_t *plan, uint64_t unit);
kvr_status_t kvr__plan_scaled(const kvr_plan_t *tokens, uint64_t unit,
                              kvr_plan_t **out);
kvr_status_t kvr__plan_kind(const kvr_layout_t *lay, uint32_t rank,
                            const kvr_region_pair_t *pair,
                            const kvr_request_t *req, kvr__kind_t kind,
                            kvr_plan_t **out);

/* Expected placement of every byte a rank must hold, one segment at a time:
 * part is "latent", "key", "scale", "page", or "K"/"V" (dense); producer is
 * the producer rank the bytes come from (0 with one producer). fn returns
 * non-zero to stop. */
typedef int (*kvr__expect_fn)(void *ctx, uint64_t g, const char *part,
                              uint32_t producer, uint64_t src_off,
                              uint64_t dst_off, uint64_t len);
void kvr__expect_foreach(const kvr_layout_t *lay, uint32_t rank,
                         const kvr_region_pair_t *pair,
                         const kvr_request_t *req, kvr__kind_t kind,
                         kvr__expect_fn fn, void *ctx);

/* The same for a pair plan's consumer rank (pair_verify.c): reqs holds one
 * request per producer rank, or, when only names one producer, just its
 * request, and only that producer's segments are walked. */
#define KVR__ALL_PRODUCERS UINT32_MAX
void kvr__expect_pair_foreach(const kvr_layout_t *lay, uint32_t consumer,
                              const kvr_region_pair_t *pair,
                              const kvr_request_t *reqs, uint32_t only,
                              kvr__kind_t kind, kvr__expect_fn fn, void *ctx);

/* ---- planner interface of plan sets (plan_set.c) ---- */

/* What a plan set needs from a planner: the check and kind of one pair,
 * the token-space plan shared by every token class (in token units), and
 * the plan of any other class. ctx is the planner's own state. */
typedef struct kvr__planner {
    const kvr_layout_t *lay;
    void *ctx;
    kvr_status_t (*check)(void *ctx, const kvr_region_pair_t *pair,
                          kvr__kind_t *kind, kvr_error_t *err);
    kvr_status_t (*tokens)(void *ctx, kvr_plan_t **out);
    kvr_status_t (*plan)(void *ctx, const kvr_region_pair_t *pair,
                         kvr__kind_t kind, kvr_plan_t **out);
} kvr__planner_t;

kvr_status_t kvr__plan_set_build(const kvr__planner_t *pl,
                                 const kvr_region_pair_t *pairs,
                                 size_t num_pairs, kvr_plan_set_t **out,
                                 kvr_error_t *err);

/* ---- pair plans (docs/design.md §18) ---- */

/* One side's DCP geometry with the defaults resolved. A side with W == 1
 * owns every token, so its chunks are taken as whole blocks (I = bs): the
 * slots are the same for any I, and pieces come out longer. */
typedef struct {
    uint64_t bs, W, I, V;
} kvr__side_t;

/* A pair plan's context: both sides, the two ranks on the pair's axis, the
 * request and the facts derived from it once. */
typedef struct {
    const kvr_layout_t *lay;
    kvr__side_t ps, cs;
    uint32_t p, c;
    const kvr_request_t *req;
    uint64_t N, k0, g0, end_dst; /* g0 = k0 * V_c: first token to move */
    uint32_t max_dst_id;
    /* the last producer-table range scanned for its largest id */
    uint64_t src_lo, src_hi;
    uint32_t src_max;
    int src_cached;
    int axis_set;
    kvr_axis_t axis; /* of a plan set's pairs: all must agree */
} kvr__pair_t;

void kvr__sides(const kvr_layout_t *lay, kvr__side_t *ps, kvr__side_t *cs);
/* Validates the layout and the request's consumer side for a pair plan. */
kvr_status_t kvr__pair_begin(const kvr_layout_t *lay, uint32_t producer,
                             uint32_t consumer, const kvr_request_t *req,
                             kvr__pair_t *x, kvr_error_t *err);
/* Role rule, both regions' geometry, twins: no ranks, no request. */
kvr_status_t kvr__pair_classify(const kvr_layout_t *lay,
                                const kvr_region_pair_t *pair,
                                kvr__kind_t *kind, kvr_error_t *err);
/* Everything for one region pair: classify, ranks, table lengths, ids. */
kvr_status_t kvr__pair_check(kvr__pair_t *x, const kvr_region_pair_t *pair,
                             kvr__kind_t *kind, kvr_error_t *err);
/* kvr__pair_begin, then kvr__pair_check. */
kvr_status_t kvr__pair_prepare(const kvr_layout_t *lay, uint32_t producer,
                               uint32_t consumer, const kvr_request_t *req,
                               const kvr_region_pair_t *pair, kvr__pair_t *x,
                               kvr__kind_t *kind, kvr_error_t *err);
/* Producer-table entries [lo, hi) the pair plan of this kind reads. */
void kvr__pair_src_range(const kvr__pair_t *x, kvr__kind_t kind, uint64_t *lo,
                         uint64_t *hi);
int kvr__consumer_index_repl(const kvr_layout_t *lay);
/* The pair as page views of an index (pair_check.c); 0 when the producer
 * rank does not serve this consumer rank. */
int kvr__index_view(const kvr__pair_t *x, kvr__pair_t *v);

/* Token pieces owned by both ranks, repeating with a period (pair.c). */
typedef struct {
    uint64_t off, len; /* global position in the period, tokens */
    uint64_t lp, lc;   /* local index of off on the producer and consumer */
} kvr__piece_t;

typedef struct {
    uint64_t period; /* lcm(I_p*W_p, I_c*W_c); pieces repeat with it */
    uint64_t span;   /* pieces cover [0, span): span < period means once */
    uint64_t lp_per, lc_per; /* local tokens per period on each side */
    kvr__piece_t *v;
    size_t n, cap;
} kvr__pattern_t;

kvr_status_t kvr__pattern_build(const kvr__side_t *ps, uint64_t p,
                                const kvr__side_t *cs, uint64_t c,
                                uint64_t limit, kvr__pattern_t *pt);
void kvr__pattern_free(kvr__pattern_t *pt);
/* Pushes, in token units, the pieces of consumer entry k in [g0, end):
 * (producer slot, consumer slot, tokens), ascending. */
kvr_status_t kvr__pattern_entry(const kvr__pair_t *x, const kvr__pattern_t *pt,
                                uint64_t k, uint64_t end, kvr_plan_t *out);
/* Whether the two ranks own a common token in [from, to). */
int kvr__tokens_meet(const kvr__side_t *ps, uint64_t p, const kvr__side_t *cs,
                     uint64_t c, uint64_t from, uint64_t to);
/* Consumer entries [k0, end_dst) in ascending block-id order. */
uint32_t *kvr__dst_order(const uint32_t *table, uint64_t first, uint64_t end);

/* Expands the token pieces of one consumer entry (runs in token slots)
 * into byte runs. */
typedef kvr_status_t (*kvr__expand_fn)(const void *arg,
                                       const kvr_plan_t *pieces,
                                       kvr_plan_t *out);
/* The pattern of the pair walked over [g0, end), entries in ascending
 * block-id order, into a finished plan: token runs when each is NULL, else
 * what each makes of every entry's pieces (about runs_per_piece each). */
kvr_status_t kvr__pair_walk(const kvr__pair_t *x, uint64_t end,
                            kvr__expand_fn each, const void *arg,
                            size_t runs_per_piece, kvr_plan_t **out);
kvr_status_t kvr__pair_tokens(const kvr__pair_t *x, kvr_plan_t **out);
kvr_status_t kvr__pair_plan(const kvr__pair_t *x, const kvr_region_pair_t *pair,
                            kvr__kind_t kind, kvr_plan_t **out);

/* Head-sharded dense (dense.c): the heads of the pair's producer tp rank p
 * that consumer tp rank c takes, and where they sit on each side. */
typedef struct {
    uint64_t nh;     /* heads moved; 0: none */
    uint64_t js, jd; /* local index of the first on the producer, consumer */
    uint64_t Hp, Hc; /* local heads per page on each side */
    uint64_t DE;     /* bytes per head per token: D * E */
    uint64_t planes;
    int hnd;
} kvr__dense_map_t;

void kvr__dense_map(const kvr_layout_t *lay, const kvr_region_desc_t *r,
                    uint32_t p, uint32_t c, kvr__dense_map_t *m);
kvr_status_t kvr__pair_dense(const kvr__pair_t *x,
                             const kvr_region_pair_t *pair, kvr_plan_t **out);

#endif
