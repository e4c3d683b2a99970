/* kvrelay plan layer: byte runs per region class, digest, host reference
 * executor, verifier and coverage proof (docs/design.md §4). No UCX, no CUDA. */
#ifndef KVRELAY_PLAN_H
#define KVRELAY_PLAN_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "kvrelay/layout.h"
#include "kvrelay/status.h"

#ifdef __cplusplus
extern "C" {
#endif
KVR_API_BEGIN

/* One copy, in bytes, relative to each side's region base. */
typedef struct kvr_run {
    uint64_t src;
    uint64_t dst;
    uint64_t len;
} kvr_run_t;

/* A request as the planner sees it: full block tables (never pre-sliced);
 * counts come from the array lengths.
 *
 * For a pair plan (kvr_plan_create_pair) src_blocks is the table of the one
 * producer rank the plan reads, indexed by that rank's local block (its
 * local token index / bs_p). A producer with DCP shares one table over its
 * W_p ranks, one entry per V_p = bs_p * W_p global tokens, and by
 * docs/design.md §2 (local / bs == g / V) that shared table is exactly each
 * rank's own; it needs ceil(local tokens / bs_p) entries (ceil(N / V_p)
 * covers every rank). dst_blocks is the consumer's table, shared by its W
 * ranks; num_computed_blocks counts consumer virtual blocks as before. */
typedef struct kvr_request {
    const uint32_t *src_blocks;
    size_t num_src_blocks;
    const uint32_t *dst_blocks;
    size_t num_dst_blocks;
    uint64_t num_tokens;
    uint64_t num_computed_blocks; /* virtual blocks already on the consumer */
} kvr_request_t;

/* A producer region and the consumer region it maps to. */
typedef struct kvr_region_pair {
    kvr_region_desc_t src;
    kvr_region_desc_t dst;
} kvr_region_pair_t;

typedef struct kvr_plan kvr_plan_t;

/* Plans one region pair for DCP rank `rank`. Every check of §4 is its own
 * status code; err (may be NULL) names the offending values. */
kvr_status_t kvr_plan_create(const kvr_layout_t *lay, uint32_t rank,
                             const kvr_region_pair_t *pair,
                             const kvr_request_t *req, kvr_plan_t **out,
                             kvr_error_t *err);
void kvr_plan_destroy(kvr_plan_t *plan);

/* Coalesced runs, sorted by destination; valid while the plan lives. */
const kvr_run_t *kvr_plan_runs(const kvr_plan_t *plan, size_t *num_runs);
size_t kvr_plan_num_runs(const kvr_plan_t *plan);
size_t kvr_plan_runs_uncoalesced(const kvr_plan_t *plan);
uint64_t kvr_plan_bytes(const kvr_plan_t *plan);

/* Plans for many region pairs: computed once per region class (token-space
 * for token-addressable roles, then scaled by token bytes) and shared by
 * every region of the class. */
typedef struct kvr_plan_set kvr_plan_set_t;

kvr_status_t kvr_plan_set_create(const kvr_layout_t *lay, uint32_t rank,
                                 const kvr_region_pair_t *pairs,
                                 size_t num_pairs, const kvr_request_t *req,
                                 kvr_plan_set_t **out, kvr_error_t *err);
void kvr_plan_set_destroy(kvr_plan_set_t *set);
size_t kvr_plan_set_num_classes(const kvr_plan_set_t *set);
const kvr_plan_t *kvr_plan_set_class(const kvr_plan_set_t *set, size_t cls);
/* Class index of region pair i, and the pairs' total bytes and runs. */
size_t kvr_plan_set_class_of(const kvr_plan_set_t *set, size_t pair);
const kvr_plan_t *kvr_plan_set_plan_of(const kvr_plan_set_t *set, size_t pair);
uint64_t kvr_plan_set_total_bytes(const kvr_plan_set_t *set);
uint64_t kvr_plan_set_total_runs(const kvr_plan_set_t *set);

/* 64-bit layout digest (§4): first 8 bytes of a 16-byte BLAKE2b over the
 * layout and the sorted set of region classes, read little-endian. The
 * regions' ranks, counts, layers and sizes are excluded. The producer
 * fields of docs/design.md §18 and the TP sizes of head-sharded dense
 * classes are hashed only when present (not defaults), so older digests
 * are unchanged. kvr_layout_digest reads token widths with the consumer's
 * block size; a producer with a block size of its own passes its regions
 * to kvr_layout_digest_side(..., false, ...), which gives the same digest. */
kvr_status_t kvr_layout_digest(const kvr_layout_t *lay,
                               const kvr_region_desc_t *regions,
                               size_t num_regions, uint64_t *out,
                               kvr_error_t *err);
kvr_status_t kvr_layout_digest_side(const kvr_layout_t *lay,
                                    const kvr_region_desc_t *regions,
                                    size_t num_regions, bool consumer,
                                    uint64_t *out, kvr_error_t *err);
/* 16 lowercase hex digits of the digest's 8 bytes in order, NUL-terminated. */
void kvr_digest_hex(uint64_t digest, char out[17]);

/* Host reference executor: memcpy every run from src_base to dst_base. */
void kvr_plan_apply_host(const kvr_plan_t *plan, const void *src_base,
                         void *dst_base);

/* Verifier: checks that every token the rank must hold sits where §2-3 put
 * it in dst_base (a copy of the consumer region), against src_base (the
 * producer region). MLA: the token's bytes at slot(g). INDEX: every key byte
 * at its (preshuffled) position and its scale. Returns KVR_ERR_VERIFY with
 * the first wrong token, byte, expected and found values. */
kvr_status_t kvr_verify_region(const kvr_layout_t *lay, uint32_t rank,
                               const kvr_region_pair_t *pair,
                               const kvr_request_t *req, const void *src_base,
                               const void *dst_base, kvr_error_t *err);

/* Coverage proof (test mode): given the W ranks' plans for one region pair,
 * checks that together they write every token exactly once (replicated: on
 * every rank), each from the right source byte, never twice to the same
 * destination byte, and nothing outside the request's destination pages
 * (index slack past num_tokens inside a touched page is allowed). */
kvr_status_t kvr_plan_check_coverage(const kvr_layout_t *lay,
                                     const kvr_region_pair_t *pair,
                                     const kvr_request_t *req,
                                     const kvr_plan_t *const *rank_plans,
                                     kvr_error_t *err);

/* ---- any-to-any: (producer rank, consumer rank) pairs (docs/design.md
 * §18) ----
 *
 * With a sharded producer (W_p > 1), a producer block size of its own or a
 * TP head reshard, one consumer rank pulls from several producer ranks and
 * each (producer rank, consumer rank) pair has its own plan. Which ranks a
 * pair names depends on the region: DCP ranks for token-sharded regions
 * (MLA, INDEX, and the identity pages of STATE, OTHER and DENSE without
 * heads), TP ranks for head-sharded DENSE regions (heads > 0). */
typedef enum kvr_axis {
    KVR_AXIS_DCP = 0,
    KVR_AXIS_TP = 1,
} kvr_axis_t;

kvr_axis_t kvr_region_axis(const kvr_region_desc_t *r);
/* Ranks on an axis for one side: W or TP of the consumer or the producer. */
uint32_t kvr_axis_ranks(const kvr_layout_t *lay, kvr_axis_t axis,
                        bool consumer);

/* Plans what consumer rank `consumer_rank` takes from producer rank
 * `producer_rank` (both on the region's axis); an empty plan when the two
 * share nothing. req->src_blocks is that producer rank's table. Every check
 * of kvr_plan_create applies, plus the combinations docs/design.md §18 does
 * not plan, each refused with its own status. When W_p == 1, bs_p == bs and
 * TP_p == TP, pair (0, r) equals kvr_plan_create's plan for rank r. */
kvr_status_t kvr_plan_create_pair(const kvr_layout_t *lay,
                                  uint32_t producer_rank,
                                  uint32_t consumer_rank,
                                  const kvr_region_pair_t *pair,
                                  const kvr_request_t *req, kvr_plan_t **out,
                                  kvr_error_t *err);

/* A plan set for one (producer rank, consumer rank) pair. All pairs must be
 * on one axis (KVR_ERR_INVALID otherwise: make one set per axis). */
kvr_status_t
kvr_plan_set_create_pair(const kvr_layout_t *lay, uint32_t producer_rank,
                         uint32_t consumer_rank, const kvr_region_pair_t *pairs,
                         size_t num_pairs, const kvr_request_t *req,
                         kvr_plan_set_t **out, kvr_error_t *err);

/* The producer ranks consumer rank `consumer_rank` pulls a region from,
 * ascending. With req NULL: every rank it may ever pull from; with a
 * request (only num_tokens and num_computed_blocks are read): exactly the
 * ranks whose pair plan for it is not empty. Writes up to cap ranks and the
 * count to *num; KVR_ERR_BUFFER_SMALL when cap is less than the count. */
kvr_status_t kvr_plan_sources(const kvr_layout_t *lay,
                              const kvr_region_pair_t *pair,
                              uint32_t consumer_rank, const kvr_request_t *req,
                              uint32_t *ranks, size_t cap, size_t *num,
                              kvr_error_t *err);

/* Verifier of one pair: every byte consumer rank `consumer_rank` takes from
 * producer rank `producer_rank` sits where docs/design.md §2-3 and §18 put
 * it in dst_base, against src_base (that producer rank's region). */
kvr_status_t
kvr_verify_region_pair(const kvr_layout_t *lay, uint32_t producer_rank,
                       uint32_t consumer_rank, const kvr_region_pair_t *pair,
                       const kvr_request_t *req, const void *src_base,
                       const void *dst_base, kvr_error_t *err);

/* Coverage proof over every pair (test mode). reqs has one request per
 * producer rank (its own source table; the same consumer table, tokens and
 * offset in all); plans[p * C + c] is pair (p, c)'s plan, P and C the
 * producer and consumer ranks on the region's axis. Checks that every
 * token (every head of it, for dense) reaches every consumer rank that owns
 * it exactly once, from the right producer rank's right byte, and that
 * nothing else is written (index slack past num_tokens aside). */
kvr_status_t kvr_plan_check_coverage_pair(const kvr_layout_t *lay,
                                          const kvr_region_pair_t *pair,
                                          const kvr_request_t *reqs,
                                          const kvr_plan_t *const *plans,
                                          kvr_error_t *err);

/* Plan from an explicit run list (for tests, tools and replay); runs are
 * copied, not validated, except that KVR_ERR_INVALID refuses a run whose
 * end, or a total, passes 2^64. */
kvr_status_t kvr_plan_from_runs(const kvr_run_t *runs, size_t num_runs,
                                kvr_plan_t **out);

KVR_API_END
#ifdef __cplusplus
}
#endif
#endif
