/* The connector's GPU path: regions in CUDA device memory, shared with the
 * producer through CUDA IPC, filled by the gpu layer's scatter kernel
 * (docs/design.md §5 gpu-direct). Two implementations: gpu_path_cuda.c when the
 * gpu layer was built with CUDA, gpu_path_none.c (ERR_UNSUPPORTED) else.
 * gpu_tables.c holds the bookkeeping the CUDA path shares with the tests'
 * emulation, gpu_refused.c the calls the refusing path and it both refuse. */
#ifndef KVRELAY_CONN_GPU_PATH_H
#define KVRELAY_CONN_GPU_PATH_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "kvrelay/plan.h"
#include "kvrelay/status.h"
#include "kvrelay/xfer.h"

struct kvr_gpu_pool; /* kvrelay/gpu.h, with CUDA */

/* Bytes of the IPC description of a region carried in REGIONS' rkey. */
#define KVR_GPU_RKEY_BYTES 72u

/* Usable CUDA devices; 0 without CUDA. */
int kvr__gpu_device_count(void);
kvr_status_t kvr__gpu_alloc(int device, uint64_t len, void **ptr,
                            kvr_error_t *err);
void kvr__gpu_free(void *ptr);
/* How the agent's region arena (gpu_arena.h) carves device memory: chunks
 * of *chunk bytes, regions starting *align bytes apart. */
void kvr__gpu_chunking(uint64_t *chunk, uint64_t *align);
/* cudaMemcpy of any direction (host and device pointers), synchronous. */
kvr_status_t kvr__gpu_copy(void *dst, const void *src, uint64_t len,
                           kvr_error_t *err);
kvr_status_t kvr__gpu_export(const void *ptr, uint8_t *rkey, uint32_t *len,
                             kvr_error_t *err);
kvr_status_t kvr__gpu_open(int device, const uint8_t *rkey, uint32_t len,
                           void **ptr, kvr_error_t *err);
void kvr__gpu_close(const uint8_t *rkey, uint32_t len, void *ptr);
/* A request's relayout tables, one per region class (role and widths):
 * checked, sorted and uploaded once on `stream` (into blocks of pool when
 * it is not NULL), then given to every kvr__gpu_job_start of the request's
 * layer groups. The agent makes them when a gpu-direct pull arrives,
 * before its layers are ready. Freed by the last of its holders (one
 * more: share), and only after the kernels that read them completed
 * (small tables are read in place from mapped host memory, which the
 * next request writes at once: kvr_gpu_relayout_upload_mapped). */
typedef struct kvr__gpu_tables kvr__gpu_tables_t;

kvr_status_t kvr__gpu_tables_make(int device, void *stream,
                                  struct kvr_gpu_pool *pool,
                                  const kvr_layout_t *lay,
                                  const kvr_region_pair_t *pairs, size_t n,
                                  const kvr_request_t *req,
                                  kvr__gpu_tables_t **out, kvr_error_t *err);
void kvr__gpu_tables_share(kvr__gpu_tables_t *t);
/* The bytes rank's share of pair moves, from the tables of pair's class
 * (KVR_ERR_NOT_FOUND: t has none). */
kvr_status_t kvr__gpu_tables_bytes(const kvr__gpu_tables_t *t,
                                   const kvr_region_pair_t *pair,
                                   uint32_t rank, uint64_t *bytes,
                                   kvr_error_t *err);
void kvr__gpu_tables_free(kvr__gpu_tables_t *t);

/* Producer: rank's share of every region pair, device to device (dst are
 * the consumer's regions as mapped here), waited for: the agent's launch
 * (kvr__gpu_job_start on `stream`, tables from `pool`) done synchronously,
 * for benchmarks; stream and pool may be NULL (default stream, tables
 * allocated per call). tables: made beforehand (kvr__gpu_tables_make), or
 * NULL to make them inside. stamps (NULL or 8 entries): kvr_now_ns at the
 * start, tables ready, job set up (set_device), (no event: the same
 * again), kernels launched, (no record: the same again), kernels done
 * (the stream synchronised), all freed. */
kvr_status_t kvr__gpu_send(int device, void *stream, struct kvr_gpu_pool *pool,
                           const kvr_layout_t *lay, uint32_t rank,
                           const kvr_region_pair_t *pairs,
                           const void *const *src, void *const *dst, size_t n,
                           const kvr_request_t *req,
                           const kvr__gpu_tables_t *tables, uint64_t *bytes,
                           uint64_t *stamps, kvr_error_t *err);

/* The agent's asynchronous form: the scatters of one pull launched on
 * `stream` (after whatever is queued there, e.g. waits on the engine's
 * events), their tables kept until the job is freed; in blocks of `pool`
 * (the stream's, see kvr_gpu_pool_t) when it is not NULL, else allocated
 * stream-ordered. Slot i moves rank ranks[i]'s share of pairs[i] for
 * request reqs[req[i]] (req NULL: every slot request 0): pairs of one
 * class for any ranks (one request's pulls by several ranks) go in one
 * launch, and with several requests (KVR_AGENT_GPU_MERGE, docs/agent.md)
 * the class's slots of them all in one kvr_gpu_scatter_requests call;
 * *bytes is the total. A class found in tables[q] (tables NULL, or an
 * entry NULL: none) uses them, which must outlive the job; others are
 * made here from reqs[q], kept by the job. */
typedef struct kvr__gpu_job kvr__gpu_job_t;

typedef struct kvr__gpu_launch {
    const kvr__gpu_tables_t *const *tables; /* per request */
    const kvr_request_t *reqs;
    size_t nreq;
    const uint32_t *req; /* per slot: its request's index */
    const uint32_t *ranks;
    const kvr_region_pair_t *pairs;
    const void *const *src;
    void *const *dst;
    size_t n;
} kvr__gpu_launch_t;

kvr_status_t kvr__gpu_job_launch(int device, void *stream,
                                 struct kvr_gpu_pool *pool,
                                 const kvr_layout_t *lay,
                                 const kvr__gpu_launch_t *l,
                                 kvr__gpu_job_t **out, uint64_t *bytes,
                                 kvr_error_t *err);

/* kvr__gpu_job_launch of one request's slots. */
static inline kvr_status_t
kvr__gpu_job_start(int device, void *stream, struct kvr_gpu_pool *pool,
                   const kvr_layout_t *lay, const kvr__gpu_tables_t *tables,
                   const uint32_t *ranks,
                   const kvr_region_pair_t *pairs, const void *const *src,
                   void *const *dst, size_t n, const kvr_request_t *req,
                   kvr__gpu_job_t **out, uint64_t *bytes, kvr_error_t *err)
{
    kvr__gpu_launch_t l = {&tables, req, 1, NULL, ranks, pairs, src, dst, n};
    return kvr__gpu_job_launch(device, stream, pool, lay, &l, out, bytes,
                               err);
}
/* fd (the agent's wake eventfd) is written once the job's kernels
 * completed, by a host function on `side`, a stream of its own that waits
 * for the job's event: the job's stream never waits for the host
 * function (a host function on the work stream held every later launch
 * there for a callback's round trip to the host). */
kvr_status_t kvr__gpu_job_notify(kvr__gpu_job_t *job, void *side, int fd,
                                 kvr_error_t *err);
/* Non-blocking: whether every kernel of the job completed (or failed). */
kvr_status_t kvr__gpu_job_done(kvr__gpu_job_t *job, bool *done,
                               kvr_error_t *err);
/* Waits for the job's kernels (if still running), then drops a reference
 * (the last one frees it). NULL is fine. */
void kvr__gpu_job_free(kvr__gpu_job_t *job);
/* One more reference: a job shared by the pulls it serves. */
void kvr__gpu_job_share(kvr__gpu_job_t *job);

/* Run copies over plans (docs/gpu.md, Run copies): plans[i]'s runs from
 * src[i] + run.src to dst[i] + run.dst, in plan order, one stream (the
 * staged byte order). src or dst NULL: that side is a staging buffer
 * given to each copy. Works for every layout the planner plans (sharded
 * producers, TP reshards). Uploaded on `stream` (into a block of pool, the
 * stream's, when it is not NULL), freed stream-ordered. */
typedef struct kvr__gpu_runs kvr__gpu_runs_t;

kvr_status_t kvr__gpu_runs_make(int device, void *stream,
                                struct kvr_gpu_pool *pool,
                                const kvr_plan_t *const *plans,
                                const void *const *src, void *const *dst,
                                size_t n, kvr__gpu_runs_t **out,
                                kvr_error_t *err);
/* Stream bytes [pos, pos + len) on stream: from src_buf (unpack), into
 * dst_buf (pack), or (both NULL) from the sources to the destinations. */
kvr_status_t kvr__gpu_runs_copy(const kvr__gpu_runs_t *rt, uint64_t pos,
                                uint64_t len, const void *src_buf,
                                void *dst_buf, void *stream, kvr_error_t *err);
void kvr__gpu_runs_free(kvr__gpu_runs_t *rt);
/* A job of one copy (see kvr__gpu_job_t): stream bytes [pos, pos + len)
 * of rt, which must outlive the job. */
kvr_status_t kvr__gpu_job_runs(int device, void *stream,
                               const kvr__gpu_runs_t *rt, uint64_t pos,
                               uint64_t len, const void *src_buf,
                               void *dst_buf, kvr__gpu_job_t **out,
                               kvr_error_t *err);
/* Seconds one copy of rt's stream bytes [0, len) takes on stream (launch
 * to completion, timed on the host after a warm-up): the cost model's
 * pack and gpu-direct rates. */
kvr_status_t kvr__gpu_runs_time(const kvr__gpu_runs_t *rt, uint64_t len,
                                const void *src_buf, void *dst_buf,
                                void *stream, double *secs, kvr_error_t *err);

/* Makes device current on the calling thread (the agent's loop thread
 * touches CUDA only through these calls). */
kvr_status_t kvr__gpu_use(int device, kvr_error_t *err);
kvr_status_t kvr__gpu_stream_create(int device, void **stream,
                                    kvr_error_t *err);
void kvr__gpu_stream_destroy(void *stream);
/* The agent's table pool on its stream (kvr_gpu_pool_t): relayout and
 * run tables reuse its blocks instead of allocating per pull. */
kvr_status_t kvr__gpu_pool_create(int device, void *stream,
                                  struct kvr_gpu_pool **pool, kvr_error_t *err);
void kvr__gpu_pool_destroy(struct kvr_gpu_pool *pool);
/* The copy kernels loaded and CUDA's host-function thread started, with
 * empty work on stream (kvr_gpu_warm). */
kvr_status_t kvr__gpu_warm(int device, void *stream, kvr_error_t *err);
/* Waits for everything queued on stream. */
kvr_status_t kvr__gpu_stream_sync(void *stream, kvr_error_t *err);
/* Gates: how send_ready's CUDA events reach the loop (docs/agent.md,
 * CUDA events). A gate is an event of the agent's; arming it on `stream`
 * (the agent's gate stream, where nothing else runs) queues there a wait
 * for the engine's event (cudaEvent_t, as recorded at this call), the
 * gate's record after it and a host function writing fd (the agent's wake
 * eventfd): the loop learns the engine's work is done without waiting on
 * it, and no copy kernel is ever queued behind an engine's event. Gates on
 * one stream complete in the order they were armed. fd < 0: no host
 * function; a watcher thread waits for the gate instead
 * (kvr__gpu_gate_sync, which polls). */
kvr_status_t kvr__gpu_gate_create(int device, void **gate, kvr_error_t *err);
void kvr__gpu_gate_destroy(void *gate);
kvr_status_t kvr__gpu_gate_arm(void *stream, void *engine_event, void *gate,
                               int fd, kvr_error_t *err);
kvr_status_t kvr__gpu_gate_sync(void *gate, kvr_error_t *err);
/* Non-blocking: whether the armed gate's wait is over (*done true with an
 * error status: it failed). */
kvr_status_t kvr__gpu_gate_done(void *gate, bool *done, kvr_error_t *err);

/* gpu-staged's packer (docs/transport.md, gpu-staged): the rank's share
 * of each region pair, in pair order, is the transfer's stream; pack and
 * unpack are the gpu layer's run-based relayout kernels (kvr_gpu_pack /
 * kvr_gpu_unpack) on the packer's own stream, each pack buffer with an
 * event recorded after its kernels. src: the producer's regions (NULL on
 * the consumer), dst: the consumer's (NULL on the producer). */
typedef struct kvr__gpu_packer kvr__gpu_packer_t;

kvr_status_t kvr__gpu_packer_create(int device, const kvr_layout_t *lay,
                                    uint32_t rank,
                                    const kvr_region_pair_t *pairs,
                                    const void *const *src, void *const *dst,
                                    size_t n, const kvr_request_t *req,
                                    uint32_t depth, kvr__gpu_packer_t **out,
                                    kvr_error_t *err);
/* The xfer packer (ops and ctx); valid while the packer lives. */
const kvr_exec_packer_t *kvr__gpu_packer_ops(const kvr__gpu_packer_t *pk);
/* Stream bytes: the rank's bytes over all pairs. */
uint64_t kvr__gpu_packer_bytes(const kvr__gpu_packer_t *pk);
void kvr__gpu_packer_destroy(kvr__gpu_packer_t *pk);

#endif
