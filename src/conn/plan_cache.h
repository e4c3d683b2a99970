/* The agent's plan cache (docs/performance.md, docs/design.md §15): plans
 * keyed by what they depend on (the producer and consumer rank of the pair
 * plan, docs/design.md §18; the distinct region-pair
 * geometries, the block tables, token and computed-block counts), never by
 * which layer a region holds. Regions of one class in one request share a
 * plan; a request planned again with the same key (the consumer plans each
 * PP stage's part with the same tables: every stage's MLA layers are one
 * class) gets the same plan back instead of a new one. Entries are counted
 * references; the last few unreferenced ones are kept for reuse. Used by
 * the progress loop only (no lock). */
#ifndef KVR_CONN_PLAN_CACHE_H
#define KVR_CONN_PLAN_CACHE_H

#include <stddef.h>
#include <stdint.h>

#include "kvrelay/plan.h"

typedef struct kvr__pcache kvr__pcache_t;
typedef struct kvr__pentry kvr__pentry_t;

/* keep: unreferenced entries kept for reuse (least recently used go
 * first). NULL when out of memory. */
kvr__pcache_t *kvr__pcache_create(const kvr_layout_t *lay, size_t keep);
/* Frees every entry, referenced or not: call after the last release. */
void kvr__pcache_destroy(kvr__pcache_t *c);

/* Pair-plans (kvr_plan_set_create_pair) n region pairs for producer rank
 * prank and consumer rank crank and `req`: plans[i] is pair i's
 * plan (shared by the pairs of its class); *bytes their total over the n
 * pairs. The plans live until kvr__pcache_release(*entry). Errors are the
 * planner's, naming the first pair of the offending class. */
kvr_status_t kvr__pcache_plan(kvr__pcache_t *c, uint32_t prank,
                              uint32_t crank, const kvr_region_pair_t *pairs,
                              size_t n,
                              const kvr_request_t *req,
                              const kvr_plan_t **plans, uint64_t *bytes,
                              kvr__pentry_t **entry, kvr_error_t *err);
/* Drops one reference (NULL is a no-op). */
void kvr__pcache_release(kvr__pentry_t *e);

typedef struct kvr__pcache_stats {
    uint64_t hits, misses;
    size_t entries, idle;
} kvr__pcache_stats_t;
kvr__pcache_stats_t kvr__pcache_stats(const kvr__pcache_t *c);

#endif
