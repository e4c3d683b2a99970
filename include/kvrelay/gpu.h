/* kvrelay gpu layer: relayout kernels and decode-side DCP ops behind a C
 * interface (docs/design.md §5 gpu-direct and staged, §10 decode ops).
 *
 * No CUDA header here: a stream is a `void *` holding a cudaStream_t (NULL is
 * the legacy default stream), device buffers are plain pointers.
 *
 * Two libraries implement this header:
 *  - kvr_gpu_ref, always built, plain C: relayout descriptions, host reference
 *    executors and the reference decode ops;
 *  - kvr_gpu, built only when CUDA is found: everything marked (CUDA), on the
 *    current device (cudaSetDevice), asynchronous on the given stream.
 *
 * Every precondition is checked on the host and returned as a status with
 * detail in *err (may be NULL). Data that only the device sees (positions in a
 * top-k list, sequence lengths) is checked by the kernels: a bad value is
 * dropped from the output and recorded, and kvr_gpu_decode_check() returns it
 * as an error. */
#ifndef KVRELAY_GPU_H
#define KVRELAY_GPU_H

#include <stddef.h>
#include <stdint.h>

#include "kvrelay/layout.h"
#include "kvrelay/status.h"

#ifdef __cplusplus
extern "C" {
#endif
KVR_API_BEGIN

/* ------------------------------------------------------------------------
 * Relayout (docs/design.md §2-5)
 *
 * A relayout describes one region pair of one request: the producer region
 * `src`, the consumer region `dst` (each DCP rank has its own copy of it, at
 * its own address) and the request's full block tables. It moves exactly the
 * bytes kvr_plan_create() plans, for every rank:
 *  - MLA: each I-token chunk to its owner's slot, clipped at num_tokens;
 *  - INDEX replicated: each source page's key and scale planes into sub-page
 *    j % W of destination page dst[j / W], on every rank;
 *  - INDEX sharded (I == bs, or W == 1): the owner of source page j gets its
 *    planes as one segment of bs * (D + 4) bytes in page dst[j / W];
 *  - other roles at W == 1: whole pages src[j] -> dst[j].
 * Incremental requests cover tokens [k*V, N), source blocks from k*W and
 * destination blocks from k (k = num_computed_blocks).
 *
 * Staging byte order (pack/unpack): rank r's share is one byte stream, the
 * concatenation of rank r's plan runs in plan order, i.e. sorted by
 * destination offset (destination blocks by ascending block id; inside a
 * page, MLA tokens by local slot, replicated index: the key sub-planes by
 * sub-page, then the scale sub-planes). This is the order kvr_plan_create()
 * returns for that rank, so a staging buffer written by any executor that
 * follows the plan can be unpacked here, and the other way round.
 * ------------------------------------------------------------------------ */

/* A request's tables as the planner takes them (kvr_request_t in plan.h,
 * which this lower layer cannot include): full tables, never pre-sliced. */
typedef struct kvr_gpu_request {
    const uint32_t *src_blocks;
    size_t num_src_blocks;
    const uint32_t *dst_blocks;
    size_t num_dst_blocks;
    uint64_t num_tokens;
    uint64_t num_computed_blocks; /* virtual blocks already on the consumer */
} kvr_gpu_request_t;

typedef struct kvr_gpu_relayout kvr_gpu_relayout_t;

/* Validates layout, regions and tables with the planner's checks (each its
 * own status code, message naming the values) and copies the tables. Pages
 * must lie wholly inside each region's registered bytes. The GPU path needs
 * num_tokens < 2^31. Host only; no device is touched. */
kvr_status_t kvr_gpu_relayout_create(const kvr_layout_t *lay,
                                     const kvr_region_desc_t *src,
                                     const kvr_region_desc_t *dst,
                                     const kvr_gpu_request_t *req,
                                     kvr_gpu_relayout_t **out,
                                     kvr_error_t *err);
/* Frees host and device copies; NULL is fine. */
void kvr_gpu_relayout_destroy(kvr_gpu_relayout_t *rl);

/* Bytes rank `rank` receives: its plan's bytes and its staging stream's
 * length. 0 for a rank out of range. */
uint64_t kvr_gpu_relayout_bytes(const kvr_gpu_relayout_t *rl, uint32_t rank);

/* Host reference executors, on host memory. scatter: rank's share from the
 * producer region at src_base into that rank's region at dst_base. pack:
 * bytes [offset, offset + len) of rank's stream into staging[0, len).
 * unpack: staging[0, len), holding stream bytes [offset, offset + len), into
 * rank's region at dst_base. */
kvr_status_t kvr_gpu_ref_scatter(const kvr_gpu_relayout_t *rl, uint32_t rank,
                                 const void *src_base, void *dst_base,
                                 kvr_error_t *err);
kvr_status_t kvr_gpu_ref_pack(const kvr_gpu_relayout_t *rl, uint32_t rank,
                              const void *src_base, uint64_t offset,
                              uint64_t len, void *staging, kvr_error_t *err);
kvr_status_t kvr_gpu_ref_unpack(const kvr_gpu_relayout_t *rl, uint32_t rank,
                                const void *staging, uint64_t offset,
                                uint64_t len, void *dst_base, kvr_error_t *err);

/* (CUDA) Copies the tables to the current device; needed once per device
 * before the calls below run there. Synchronous. */
kvr_status_t kvr_gpu_relayout_upload(kvr_gpu_relayout_t *rl, kvr_error_t *err);
/* (CUDA) The same, stream-ordered: allocated and copied on `stream`
 * (cudaMallocAsync), and freed there by kvr_gpu_relayout_destroy after the
 * launches queued on it (cudaFreeAsync). No host synchronisation, and no
 * device-wide wait of cudaFree: for callers that must not wait on other
 * streams' work (the agent). Launch with this relayout on that stream. */
kvr_status_t kvr_gpu_relayout_upload_async(kvr_gpu_relayout_t *rl, void *stream,
                                           kvr_error_t *err);

/* (CUDA) A table pool: device memory for relayout and run tables, kept and
 * reused instead of allocated per request. It belongs to one stream: a
 * table uploaded into it is copied on that stream, and its block goes
 * back to the pool when the table is destroyed, to be written again by a
 * later upload on the same stream, so only after every launch queued
 * before that (the readers of its last owner). So every launch with a
 * pooled table must be on the pool's stream. Blocks are powers of two,
 * allocated once (cudaMalloc) and kept until the pool goes. Not thread
 * safe: one thread (the agent's loop) uses a pool. */
typedef struct kvr_gpu_pool kvr_gpu_pool_t;

kvr_status_t kvr_gpu_pool_create(int device, void *stream, kvr_gpu_pool_t **out,
                                 kvr_error_t *err);
/* Waits for the stream, then frees every block; each table uploaded into
 * the pool must have been destroyed first. NULL is fine. */
void kvr_gpu_pool_destroy(kvr_gpu_pool_t *pool);
/* Device bytes the pool holds, in use or free. */
uint64_t kvr_gpu_pool_bytes(const kvr_gpu_pool_t *pool);
/* (CUDA) kvr_gpu_relayout_upload into a block of pool, on its stream. */
kvr_status_t kvr_gpu_relayout_upload_pool(kvr_gpu_relayout_t *rl,
                                          kvr_gpu_pool_t *pool,
                                          kvr_error_t *err);

/* (CUDA) Tables of at most 128 bytes (a request of a few blocks) into a
 * slot of the pool's mapped pinned host memory, read there by the
 * kernels: no copy, no CUDA call. Larger tables, or every slot taken: as
 * kvr_gpu_relayout_upload_pool. The slot is written again by the next
 * upload as soon as it is given back, so destroy such a relayout only
 * after every launch that read it completed (event or stream
 * synchronised), not stream-ordered. */
kvr_status_t kvr_gpu_relayout_upload_mapped(kvr_gpu_relayout_t *rl,
                                            kvr_gpu_pool_t *pool,
                                            kvr_error_t *err);

/* (CUDA) Direct scatter into every rank at once: dst_bases[r] is rank r's
 * region base, any pointer the current device can write (its own memory, a
 * peer's with peer access enabled, a CUDA IPC mapping). W <= 64. */
kvr_status_t kvr_gpu_scatter(const kvr_gpu_relayout_t *rl, const void *src_base,
                             void *const *dst_bases, void *stream,
                             kvr_error_t *err);
/* (CUDA) The same for one rank. */
kvr_status_t kvr_gpu_scatter_rank(const kvr_gpu_relayout_t *rl, uint32_t rank,
                                  const void *src_base, void *dst_base,
                                  void *stream, kvr_error_t *err);
/* (CUDA) n slots at once, each a region of rl's class (the same
 * descriptions at other bases: the layers of one role) for one rank: slot
 * k is rank ranks[k]'s share from src_bases[k] into dst_bases[k] (every
 * rank of a request and every layer in one launch), one launch per 128
 * slots. */
kvr_status_t kvr_gpu_scatter_regions(const kvr_gpu_relayout_t *rl,
                                     const uint32_t *ranks,
                                     const void *const *src_bases,
                                     void *const *dst_bases, size_t n,
                                     void *stream, kvr_error_t *err);
/* One slot of kvr_gpu_scatter_requests: rank `rank`'s share of relayout
 * rls[relayout], from the producer region at src_base into that rank's
 * region at dst_base. */
typedef struct kvr_gpu_scatter_slot {
    uint32_t relayout; /* index into rls */
    uint32_t rank;
    const void *src_base;
    void *dst_base;
} kvr_gpu_scatter_slot_t;
/* (CUDA) kvr_gpu_scatter_regions for several requests at once: nrl
 * relayouts of one class (the same kind, block size, W, interleave, unit,
 * page sizes and preshuffle; KVR_ERR_INVALID names the first field that
 * differs), each uploaded on the current device (else KVR_ERR_INVALID,
 * before any launch), and n slots over them. The slots run region-major
 * whatever their order here: sorted (stable) by source base, then
 * destination base, so that every request's slots of one layer region are
 * adjacent and the items in flight at once span few regions, as one long
 * request's do (docs/gpu.md, Several requests a launch). A launch holds at
 * most 8 relayouts and 128 slots: with more than 8 relayouts the slots go
 * in groups of 8 (by relayout index), each group region-major. */
kvr_status_t kvr_gpu_scatter_requests(const kvr_gpu_relayout_t *const *rls,
                                      size_t nrl,
                                      const kvr_gpu_scatter_slot_t *slots,
                                      size_t n, void *stream,
                                      kvr_error_t *err);
/* (CUDA) Device pack/unpack with the semantics of the reference ones. Any
 * byte range works; 16-byte accesses are used when sizes, offsets and
 * pointers are 16-aligned, narrower ones otherwise. */
kvr_status_t kvr_gpu_pack(const kvr_gpu_relayout_t *rl, uint32_t rank,
                          const void *src_base, uint64_t offset, uint64_t len,
                          void *staging, void *stream, kvr_error_t *err);
kvr_status_t kvr_gpu_unpack(const kvr_gpu_relayout_t *rl, uint32_t rank,
                            const void *staging, uint64_t offset, uint64_t len,
                            void *dst_base, void *stream, kvr_error_t *err);

/* ------------------------------------------------------------------------
 * Run copies (docs/gpu.md, Run copies)
 *
 * Any plan the planner makes, sharded producer or TP reshard included: a
 * list of runs, each `len` bytes from address `src` to address `dst`. The
 * runs in array order are one byte stream (for the planner's runs: the
 * consumer's order, as staged moves it). One kernel moves stream bytes
 * [pos, pos + len): from each run's source, or from `src_buf` (unpack:
 * stream byte pos at src_buf[0]); to each run's destination, or into
 * `dst_buf` (pack). With neither buffer it is a scatter (gpu-direct). An
 * address a copy does not use may be 0 (a pack table has no
 * destinations, an unpack table no sources).
 * ------------------------------------------------------------------------ */

typedef struct kvr_gpu_run {
    uint64_t src, dst, len;
} kvr_gpu_run_t;

typedef struct kvr_gpu_runs kvr_gpu_runs_t;

/* Copies the runs (zero-length ones dropped, long ones cut into pieces the
 * kernel spreads over warps). */
kvr_status_t kvr_gpu_runs_create(const kvr_gpu_run_t *runs, size_t n,
                                 kvr_gpu_runs_t **out, kvr_error_t *err);
void kvr_gpu_runs_destroy(kvr_gpu_runs_t *rt);
/* Stream bytes: the runs' total. */
uint64_t kvr_gpu_runs_bytes(const kvr_gpu_runs_t *rt);
/* The copy on the host (addresses are host pointers): the reference. */
kvr_status_t kvr_gpu_runs_copy_ref(const kvr_gpu_runs_t *rt, uint64_t pos,
                                   uint64_t len, const void *src_buf,
                                   void *dst_buf, kvr_error_t *err);
/* (CUDA) The table onto the current device, stream-ordered on `stream`
 * (NULL: synchronous); once per table. */
kvr_status_t kvr_gpu_runs_upload(kvr_gpu_runs_t *rt, void *stream,
                                 kvr_error_t *err);
/* (CUDA) The same into a block of pool (see kvr_gpu_pool_t), on its
 * stream: copies with the table must run there. */
kvr_status_t kvr_gpu_runs_upload_pool(kvr_gpu_runs_t *rt, kvr_gpu_pool_t *pool,
                                      kvr_error_t *err);
/* (CUDA) The copy on `stream`, after kvr_gpu_runs_upload. */
kvr_status_t kvr_gpu_runs_copy(const kvr_gpu_runs_t *rt, uint64_t pos,
                               uint64_t len, const void *src_buf,
                               void *dst_buf, void *stream, kvr_error_t *err);

/* ------------------------------------------------------------------------
 * Devices, peer access and CUDA IPC (CUDA)
 * ------------------------------------------------------------------------ */

/* Number of usable devices; 0 (and KVR_OK) when there is no driver or no
 * device. */
kvr_status_t kvr_gpu_device_count(int *count, kvr_error_t *err);
/* Lets `device` access `peer`'s memory (already enabled is fine);
 * KVR_ERR_UNSUPPORTED when the pair has no peer path. */
kvr_status_t kvr_gpu_enable_peer(int device, int peer, kvr_error_t *err);

/* Makes `device` current (checked against the device count). */
kvr_status_t kvr_gpu_set_device(int device, kvr_error_t *err);
/* cudaMalloc on `device` (which stays current); kvr_gpu_free accepts NULL. */
kvr_status_t kvr_gpu_malloc(int device, size_t len, void **ptr,
                            kvr_error_t *err);
void kvr_gpu_free(void *ptr);
/* Synchronous copy between any host and device pointers. */
kvr_status_t kvr_gpu_memcpy(void *dst, const void *src, size_t len,
                            kvr_error_t *err);
/* Waits for everything queued on `stream` (NULL: the legacy stream). */
kvr_status_t kvr_gpu_sync(void *stream, kvr_error_t *err);

/* Streams and events for callers without CUDA headers (the agent): a
 * non-blocking stream on `device`; an event without timing. */
kvr_status_t kvr_gpu_stream_create(int device, void **stream, kvr_error_t *err);
void kvr_gpu_stream_destroy(void *stream);
kvr_status_t kvr_gpu_event_create(int device, void **event, kvr_error_t *err);
void kvr_gpu_event_destroy(void *event);
kvr_status_t kvr_gpu_event_record(void *event, void *stream, kvr_error_t *err);
/* Work queued on `stream` from now on waits for `event`'s latest record
 * (cudaStreamWaitEvent): no host synchronisation. */
kvr_status_t kvr_gpu_stream_wait(void *stream, void *event, kvr_error_t *err);
/* Non-blocking: *done is whether the event's work completed. */
kvr_status_t kvr_gpu_event_done(void *event, int *done, kvr_error_t *err);
/* Blocks until the event's work completed. */
kvr_status_t kvr_gpu_event_sync(void *event, kvr_error_t *err);
/* An event that keeps time, for profiling (kvr_gpu_event_create's do
 * not): *ms is how long after `from`'s completion `to` completed; both
 * timed, recorded and complete. */
kvr_status_t kvr_gpu_event_create_timed(int device, void **event,
                                        kvr_error_t *err);
kvr_status_t kvr_gpu_event_elapsed(void *from, void *to, float *ms,
                                   kvr_error_t *err);
/* (CUDA) Once the work queued on `stream` so far is done, writes the
 * 8-byte value 1 to fd (an eventfd or a pipe) from CUDA's host-function
 * thread (cudaLaunchHostFunc; only write(2) runs there): a poll loop
 * learns of completion without polling the device. fd must stay open
 * until the stream reached that point (synchronise it before closing). */
kvr_status_t kvr_gpu_stream_notify(void *stream, int fd, kvr_error_t *err);
/* (CUDA) One empty launch of each copy kernel (relayout and run copy) and
 * one host function on stream, then waits for it: the kernels' code is
 * loaded and CUDA's host-function thread started, so that the first real
 * copy pays neither (lazy module loading would otherwise load a kernel at
 * its first launch). */
kvr_status_t kvr_gpu_warm(void *stream, kvr_error_t *err);
/* (CUDA) A kernel of one thread that keeps `stream` busy for `ns`
 * nanoseconds of the device's clock (%globaltimer) and nothing else: a
 * simulated compute step, for benchmarks (`kvrelay bench serving
 * --prefill gpu`). Takes no memory and almost none of the device. */
kvr_status_t kvr_gpu_spin(void *stream, uint64_t ns, kvr_error_t *err);

/* Names device memory for another process: the allocation's IPC handle plus
 * the pointer's offset inside it. Plain bytes; send it as is. */
typedef struct kvr_gpu_ipc_handle {
    unsigned char handle[64];
    uint64_t offset;
} kvr_gpu_ipc_handle_t;

kvr_status_t kvr_gpu_ipc_export(const void *ptr, kvr_gpu_ipc_handle_t *out,
                                kvr_error_t *err);
/* Maps the memory on the current device; *ptr points at the exported byte. */
kvr_status_t kvr_gpu_ipc_open(const kvr_gpu_ipc_handle_t *h, void **ptr,
                              kvr_error_t *err);
/* Unmaps what kvr_gpu_ipc_open returned; NULL is fine. */
void kvr_gpu_ipc_close(const kvr_gpu_ipc_handle_t *h, void *ptr);

/* ------------------------------------------------------------------------
 * Decode-side DCP ops (docs/design.md §10). Reference (host) and (CUDA) versions
 * take the same arguments; the CUDA ones take device pointers.
 * ------------------------------------------------------------------------ */

/* Top-k filter/convert. Row t is a query token of request token_to_seq[t];
 * its K candidates are global positions (-1 empty). Output per row: the
 * physical slots (block_table[req][g / V] * bs + local(g) % bs) of the
 * positions this rank owns, in candidate order, compacted: row t's slots are
 * out_slots[out_indptr[t] .. out_indptr[t + 1]), owned_counts[t] of them.
 * Faults: token_to_seq outside [0, num_reqs) (the row is left empty); a
 * position < -1 or at or past max_blocks * V (dropped); a negative
 * block-table entry or a slot past INT32_MAX under an owned position (on the
 * GPU its slot is written as -1). The reference stops at the first fault. */
typedef struct kvr_gpu_topk_args {
    const int32_t *token_indices; /* [num_rows, topk] */
    const int32_t *token_to_seq;  /* [num_rows] */
    const int32_t *block_table;   /* [num_reqs, max_blocks], virtual blocks */
    uint32_t num_rows;
    uint32_t topk; /* K >= 1; num_rows * K <= INT32_MAX */
    uint32_t num_reqs;
    uint32_t max_blocks;
    uint32_t rank;
    uint32_t dcp_size;     /* W */
    uint32_t block_size;   /* bs */
    uint32_t interleave;   /* I */
    int32_t *out_slots;    /* out_capacity entries */
    uint64_t out_capacity; /* >= num_rows * K */
    int32_t *out_indptr;   /* [num_rows + 1] */
    int32_t *owned_counts; /* [num_rows] */
} kvr_gpu_topk_args_t;

/* Which request each query-token row belongs to, per step kind:
 *  DECODE: one row per request, q_len == 1: row i -> i;
 *  VERIFY: q_len rows per request: row t -> t / q_len;
 *  DRAFT: identity over the running batch, padded rows included:
 *         padded_rows >= num_reqs rows, row i -> i, q_len == 1. */
typedef enum kvr_gpu_step {
    KVR_GPU_STEP_DECODE = 1,
    KVR_GPU_STEP_VERIFY = 2,
    KVR_GPU_STEP_DRAFT = 3,
} kvr_gpu_step_t;

typedef struct kvr_gpu_rows_args {
    kvr_gpu_step_t step;
    uint32_t num_reqs;
    uint32_t q_len;
    uint32_t padded_rows; /* DRAFT only */
    int32_t *out;         /* out_capacity entries */
    uint32_t out_capacity;
} kvr_gpu_rows_args_t;

/* Rows a step has (checks the arguments, ignores out). */
kvr_status_t kvr_gpu_rows_count(const kvr_gpu_rows_args_t *a, uint32_t *rows,
                                kvr_error_t *err);

/* Index slot mapping for a replicated index cache (pages of V = bs * W
 * tokens): request i gets q_len slots, for positions [seq_len - q_len,
 * seq_len): block_table[i][t / V] * V + t % V, at out_slots[i * q_len + k].
 * A request with seq_len 0 is padding: its slots are -1. Faults (slots -1):
 * seq_len < 0, 0 < seq_len < q_len, seq_len past max_blocks * V, a negative
 * block-table entry. */
typedef struct kvr_gpu_slots_args {
    const int32_t *seq_lens;    /* [num_reqs] */
    const int32_t *block_table; /* [num_reqs, max_blocks] */
    uint32_t num_reqs;
    uint32_t max_blocks;
    uint32_t q_len; /* >= 1 */
    uint32_t block_size;
    uint32_t dcp_size;
    int64_t *out_slots; /* [num_reqs * q_len] */
} kvr_gpu_slots_args_t;

/* LSE merge of W ranks' partial attention: per (b, h), lse_i sanitised
 * (NaN, +inf -> -inf), G = log(sum exp(lse_i - m)) + m with m the largest
 * finite lse (0 if none), out = sum over ranks with exp(lse_i - G) > 0 of
 * exp(lse_i - G) * out_i; an empty rank contributes exactly zero (its NaN
 * output too); all empty: out 0, lse -inf. Contiguous fp32 tensors. */
typedef struct kvr_gpu_lse_args {
    const float *outs; /* [W, B, H, D] */
    const float *lses; /* [W, B, H] */
    uint32_t ranks;    /* W >= 1 */
    uint32_t batch;
    uint32_t heads;
    uint32_t head_dim;
    float *out; /* [B, H, D] */
    float *lse; /* [B, H]; NULL to skip */
} kvr_gpu_lse_args_t;

kvr_status_t kvr_gpu_topk_filter_ref(const kvr_gpu_topk_args_t *a,
                                     kvr_error_t *err);
kvr_status_t kvr_gpu_rows_ref(const kvr_gpu_rows_args_t *a, kvr_error_t *err);
kvr_status_t kvr_gpu_index_slots_ref(const kvr_gpu_slots_args_t *a,
                                     kvr_error_t *err);
kvr_status_t kvr_gpu_lse_merge_ref(const kvr_gpu_lse_args_t *a,
                                   kvr_error_t *err);

/* (CUDA) Device state for the decode ops on one device: the top-k filter's
 * cross-row scan state and a fault record. Reusable across launches and
 * streams one at a time; safe to capture in a CUDA graph. max_rows bounds
 * num_rows of each top-k launch. */
typedef struct kvr_gpu_decode kvr_gpu_decode_t;

kvr_status_t kvr_gpu_decode_create(uint32_t max_rows, kvr_gpu_decode_t **out,
                                   kvr_error_t *err);
void kvr_gpu_decode_destroy(kvr_gpu_decode_t *dec);
/* Synchronizes `stream`, then returns the first data fault recorded since the
 * last check (and clears it), KVR_OK if none. */
kvr_status_t kvr_gpu_decode_check(kvr_gpu_decode_t *dec, void *stream,
                                  kvr_error_t *err);

/* (CUDA) Asynchronous; argument checks on the host, data faults through
 * kvr_gpu_decode_check(). */
kvr_status_t kvr_gpu_topk_filter(kvr_gpu_decode_t *dec,
                                 const kvr_gpu_topk_args_t *a, void *stream,
                                 kvr_error_t *err);
kvr_status_t kvr_gpu_rows(const kvr_gpu_rows_args_t *a, void *stream,
                          kvr_error_t *err);
kvr_status_t kvr_gpu_index_slots(kvr_gpu_decode_t *dec,
                                 const kvr_gpu_slots_args_t *a, void *stream,
                                 kvr_error_t *err);
kvr_status_t kvr_gpu_lse_merge(const kvr_gpu_lse_args_t *a, void *stream,
                               kvr_error_t *err);

KVR_API_END
#ifdef __cplusplus
}
#endif
#endif
