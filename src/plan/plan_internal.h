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
} kvr__kind_t;

/* Request facts derived once per request by kvr__check_request. */
typedef struct {
    uint64_t V;
    uint64_t first_src;  /* k * W */
    uint64_t end_src;    /* ceil(N / bs) */
    uint64_t first_dst;  /* k */
    uint64_t end_dst;    /* ceil(N / V) */
    uint32_t max_src_id;
    uint32_t max_dst_id;
} kvr__req_info_t;

kvr_status_t kvr__check_request(const kvr_layout_t *lay, uint32_t rank,
                                const kvr_request_t *req,
                                kvr__req_info_t *info, kvr_error_t *err);
kvr_status_t kvr__check_pair(const kvr_layout_t *lay,
                             const kvr_region_pair_t *pair,
                             const kvr_request_t *req,
                             const kvr__req_info_t *info, kvr__kind_t *kind,
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
 * part is "latent", "key", "scale" or "page". fn returns non-zero to stop. */
typedef int (*kvr__expect_fn)(void *ctx, uint64_t g, const char *part,
                              uint64_t src_off, uint64_t dst_off,
                              uint64_t len);
void kvr__expect_foreach(const kvr_layout_t *lay, uint32_t rank,
                         const kvr_region_pair_t *pair,
                         const kvr_request_t *req, kvr__kind_t kind,
                         kvr__expect_fn fn, void *ctx);

#endif
