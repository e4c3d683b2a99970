/* kvrelay xfer layer: transports (loopback, UCX), host pack/unpack, the
 * direct and staged executors and the cost model that picks between them
 * (docs/design.md §5-6). No UCX header is included here. */
#ifndef KVRELAY_XFER_H
#define KVRELAY_XFER_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "kvrelay/plan.h"
#include "kvrelay/status.h"

#ifdef __cplusplus
extern "C" {
#endif
KVR_API_BEGIN

/* Deadlines are absolute CLOCK_MONOTONIC nanoseconds: kvr_now_ns() and
 * kvr_deadline_ns() of kvrelay/base.h. */

/* ---- transport ------------------------------------------------------- */

typedef struct kvr_transport kvr_transport_t;
typedef struct kvr_ep kvr_ep_t;     /* a connection to one peer */
typedef struct kvr_mem kvr_mem_t;   /* a local region, registered once */
typedef struct kvr_rmem kvr_rmem_t; /* a peer's region, as seen through an ep */

/* Packed remote key bytes must fit here (UCX shm+tcp keys are ~100 B). */
#define KVR_XFER_RKEY_MAX 1024
/* Longest control message payload; longer sends are refused. */
#define KVR_XFER_MSG_MAX 65536u
/* Control message types from this value up belong to the executors. */
#define KVR_XFER_MSG_RESERVED 0xff00u

/* A region as a peer announces it (the connector carries it in REGIONS).
 * Unpack rkeys only from an authenticated peer: UCX trusts them blindly. */
typedef struct kvr_remote_region {
    uint64_t base;   /* the owner's virtual address of byte 0 */
    uint64_t length; /* every put is checked against it before it is posted */
    uint32_t rkey_len;
    uint8_t rkey[KVR_XFER_RKEY_MAX];
} kvr_remote_region_t;

typedef enum kvr_xfer_tl {
    KVR_XFER_TL_AUTO = 0, /* UCX picks; shm on one host, tcp across hosts */
    KVR_XFER_TL_SHM = 1,  /* posix/sysv/cma only */
    KVR_XFER_TL_TCP = 2,  /* tcp only (needed between network namespaces) */
} kvr_xfer_tl_t;

typedef enum kvr_xfer_progress_mode {
    KVR_XFER_PROGRESS_CALLER = 0, /* progress inside kvrelay calls and
                                     kvr_xfer_progress(); see event_fd */
    KVR_XFER_PROGRESS_THREAD = 1, /* a sleeping progress thread (needed by a
                                     target of emulated puts that is busy) */
} kvr_xfer_progress_mode_t;

typedef struct kvr_ucx_params {
    kvr_xfer_tl_t tl;
    kvr_xfer_progress_mode_t progress;
    uint64_t id;           /* carried as `sender` on every control message */
    uint32_t keepalive_ms; /* UCX_KEEPALIVE_INTERVAL; a killed peer is found
                                within a few intervals */
    uint32_t close_timeout_ms; /* bound on ep and transport teardown */
    uint32_t max_inflight;  /* puts in flight per endpoint before a put waits */
    uint32_t msg_queue_max; /* queued control messages; beyond, ERR_NO_SPACE */
    uint32_t tcp_tx_seg;    /* UCX_TCP_TX_SEG_SIZE, bytes (0: UCX default) */
    uint32_t tcp_rx_seg;    /* UCX_TCP_RX_SEG_SIZE, bytes (0: UCX default) */
    const char *net_devices; /* UCX_NET_DEVICES, NULL: all */
    bool cuda; /* CUDA memory too: adds cuda_copy to tcp's transports and
                  cuda_copy,cuda_ipc to shm's (auto: UCX's default list
                  has them). Needs a UCX built with CUDA
                  (kvr_xfer_has_cuda); docs/transport.md, CUDA memory */
} kvr_ucx_params_t;

#define KVR_UCX_PARAMS_INIT                                                    \
    {                                                                          \
        .tl = KVR_XFER_TL_AUTO, .progress = KVR_XFER_PROGRESS_CALLER, .id = 0, \
        .keepalive_ms = 1000, .close_timeout_ms = 2000, .max_inflight = 1024,  \
        .msg_queue_max = 65536, .tcp_tx_seg = 256 * 1024,                      \
        .tcp_rx_seg = 1024 * 1024, .net_devices = NULL                         \
    }

/* Loopback: transports of one process joined on one hub; puts are memcpy.
 * Fault counters count this transport's operations from 1; 0 is off. */
typedef struct kvr_loopback_params {
    uint64_t id;
    uint32_t max_inflight;
    uint32_t msg_queue_max;
    uint64_t fail_put_at; /* the k-th put fails (ERR_TRANSPORT), ep dies */
    uint64_t
        corrupt_put_at;   /* the k-th put lands with its first byte flipped */
    uint64_t drop_msg_at; /* the k-th control message sent is lost */
    uint64_t dup_msg_at;  /* the k-th control message arrives twice */
    uint32_t delay_ms;    /* puts complete and messages arrive this late;
                                puts into this transport too (a stopped
                                receiver) */
    uint64_t mem_limit;   /* bytes this transport may register (0: any);
                                beyond it registration fails ERR_NO_SPACE */
    bool no_map;          /* refuse kvr_rmem_ptr (as UCX over tcp does) */
    bool map_stores;      /* kvr_rmem_map works (as UCX shm on memory the
                                peer allocated does); the test keeps every
                                peer's memory alive while mapped, since
                                loopback memory is freed with its owner */
} kvr_loopback_params_t;

#define KVR_LOOPBACK_PARAMS_INIT                                               \
    {                                                                          \
        .max_inflight = 1024, .msg_queue_max = 65536                           \
    }

/* ERR_UNSUPPORTED when kvrelay was built without UCX. err may be NULL. */
kvr_status_t kvr_transport_ucx_create(const kvr_ucx_params_t *params,
                                      kvr_transport_t **out, kvr_error_t *err);
/* join: NULL starts a new hub; else the new transport joins join's hub. */
kvr_status_t kvr_transport_loopback_create(kvr_transport_t *join,
                                           const kvr_loopback_params_t *params,
                                           kvr_transport_t **out,
                                           kvr_error_t *err);
/* Destroy t's endpoints, remote regions and memory first; accepts NULL. */
void kvr_transport_destroy(kvr_transport_t *t);
/* "loopback", "ucx-shm", "ucx-tcp" or "ucx-auto". */
const char *kvr_transport_name(const kvr_transport_t *t);
/* Detail of the last failure on this transport ("" if none). */
const char *kvr_xfer_last_error(const kvr_transport_t *t);

/* The blob a peer needs to connect; valid while t lives. */
kvr_status_t kvr_xfer_address(kvr_transport_t *t, const void **addr,
                              size_t *len);
/* Caller-driven progress: poll this fd for readability, then call
 * kvr_xfer_progress (which re-arms it). ERR_UNSUPPORTED on loopback. */
kvr_status_t kvr_xfer_event_fd(kvr_transport_t *t, int *fd);
kvr_status_t kvr_xfer_progress(kvr_transport_t *t);

kvr_status_t kvr_ep_create(kvr_transport_t *t, const void *addr, size_t len,
                           kvr_ep_t **out);
/* Flushes (bounded by close_timeout_ms) unless the ep failed, then closes. */
void kvr_ep_destroy(kvr_ep_t *ep);
/* KVR_OK while healthy; the error that killed it otherwise. */
kvr_status_t kvr_ep_status(const kvr_ep_t *ep);
/* Declares ep dead with st (not KVR_OK), e.g. KVR_ERR_TIMEOUT when its
 * peer stayed silent past a deadline: waits on it end, later operations
 * fail with st, and kvr_ep_destroy force-closes it (UCX: no flush,
 * outstanding operations cancelled) instead of waiting on the peer. A
 * failed ep keeps its first error. */
kvr_status_t kvr_ep_fail(kvr_ep_t *ep, kvr_status_t st);

/* Registers existing memory (UCX: puts into it are emulated and need the
 * owner to progress). */
kvr_status_t kvr_mem_register(kvr_transport_t *t, void *addr, size_t len,
                              kvr_mem_t **out);

/* Where a registered region lives. */
typedef enum kvr_mem_kind {
    KVR_MEM_HOST = 0,
    KVR_MEM_CUDA = 1, /* CUDA device memory (cudaMalloc) */
} kvr_mem_kind_t;

/* Whether this transport can register and move CUDA memory: a UCX built
 * with CUDA (cuda_copy; cuda_ipc on one host), asked through its context's
 * memory types. Loopback and a UCX without CUDA: false. */
bool kvr_xfer_has_cuda(const kvr_transport_t *t);
/* The UCX library in use ("1.13.1"), or "none" without UCX. */
const char *kvr_xfer_ucx_version(void);
/* kvr_mem_register for memory of `kind`: CUDA memory is registered with
 * UCX as CUDA memory (UCP_MEM_MAP_PARAM_FIELD_MEMORY_TYPE), so that puts
 * from and into it go through UCX's CUDA transports. A transport without
 * CUDA refuses CUDA memory with ERR_UNSUPPORTED and a message naming the
 * UCX version. err may be NULL. */
kvr_status_t kvr_mem_register_kind(kvr_transport_t *t, void *addr, size_t len,
                                   kvr_mem_kind_t kind, kvr_mem_t **out,
                                   kvr_error_t *err);
kvr_mem_kind_t kvr_mem_kind(const kvr_mem_t *mem);
/* Allocates and registers (UCX: UCP_MEM_MAP_ALLOCATE, true one-sided puts
 * on shared memory, and kvr_rmem_ptr works). Contents are undefined. */
kvr_status_t kvr_mem_alloc(kvr_transport_t *t, size_t len, kvr_mem_t **out);
void kvr_mem_destroy(kvr_mem_t *mem);
void *kvr_mem_addr(const kvr_mem_t *mem);
size_t kvr_mem_len(const kvr_mem_t *mem);
/* Describes the whole region for a peer (base, length, packed rkey). */
kvr_status_t kvr_mem_pack(const kvr_mem_t *mem, kvr_remote_region_t *out);

kvr_status_t kvr_rmem_open(kvr_ep_t *ep, const kvr_remote_region_t *desc,
                           kvr_rmem_t **out);
void kvr_rmem_close(kvr_rmem_t *rmem);
uint64_t kvr_rmem_len(const kvr_rmem_t *rmem);
/* A local pointer to [off, off+len) of the peer's region when it is mapped
 * into this process (UCX shm, kvrelay-allocated); ERR_UNSUPPORTED otherwise.
 * Stores through it are ordered before later control messages. */
kvr_status_t kvr_rmem_ptr(kvr_rmem_t *rmem, uint64_t off, uint64_t len,
                          void **out);
/* The whole peer region as a local pointer that stays valid until
 * kvr_rmem_close, so that stores may take the place of puts (same host,
 * memory the peer allocated with kvr_mem_alloc: UCX keeps its shared
 * segment attached while the rkey lives, even past the peer's death).
 * ERR_UNSUPPORTED otherwise (UCX over tcp, memory the peer registered,
 * loopback without params.map_stores). Stores are ordered before later
 * control messages; nothing checks their bounds: the caller does. */
kvr_status_t kvr_rmem_map(kvr_rmem_t *rmem, void **base);

/* Posts a put of [src, src+len) to dst at dst_off. Checked against the
 * region's length first (ERR_RUN_OUT_OF_BOUNDS). Waits, up to the deadline,
 * only while max_inflight puts are outstanding. src must stay untouched
 * until a flush returned. */
kvr_status_t kvr_xfer_put(kvr_ep_t *ep, const void *src, uint64_t len,
                          kvr_rmem_t *dst, uint64_t dst_off,
                          uint64_t deadline_ns);
/* Returns when every put posted on ep is complete at the target. Never
 * posted on a failed ep. */
kvr_status_t kvr_xfer_flush(kvr_ep_t *ep, uint64_t deadline_ns);

/* Returns once every message posted on ep has left this process (local
 * completion). Unlike a flush it needs no progress from the peer: call it
 * before a side stops progressing after its last message. */
kvr_status_t kvr_xfer_drain(kvr_ep_t *ep, uint64_t deadline_ns);

/* A control message as received. */
typedef struct kvr_xfer_msg {
    uint64_t sender; /* the sending transport's id (informational) */
    uint32_t type;
    uint32_t len;
    unsigned char data[]; /* len bytes */
} kvr_xfer_msg_t;

/* Sends len <= KVR_XFER_MSG_MAX bytes; returns once data may be reused. */
kvr_status_t kvr_xfer_send_msg(kvr_ep_t *ep, uint32_t type, const void *data,
                               size_t len, uint64_t deadline_ns);
/* Returns non-zero to take a message. */
typedef int (*kvr_xfer_msg_match_fn)(void *ctx, const kvr_xfer_msg_t *msg);
/* Takes the oldest queued message that match accepts (NULL: any), waiting
 * and progressing up to the deadline (ERR_TIMEOUT). Others stay queued. */
kvr_status_t kvr_xfer_recv_msg(kvr_transport_t *t, kvr_xfer_msg_match_fn match,
                               void *ctx, kvr_xfer_msg_t **out,
                               uint64_t deadline_ns);
void kvr_xfer_msg_free(kvr_xfer_msg_t *msg);

/* ---- host pack / unpack ---------------------------------------------- */

/* One region's part of a transfer. The byte stream of a transfer is the
 * concatenation, in segment order, of each plan's runs in plan order (which
 * is destination order): the consumer's order. */
typedef struct kvr_xfer_seg {
    const kvr_plan_t *plan;
    const void *src; /* producer: local source region base */
    kvr_rmem_t *dst; /* producer, direct: the consumer's region */
    void *dst_local; /* consumer, staged: local destination region base */
} kvr_xfer_seg_t;

/* Position in a stream; start with {0}. Seeking forward is cheap. */
typedef struct kvr_xfer_cursor {
    size_t seg;
    size_t run;
    uint64_t in_run; /* bytes of the run before the position */
    uint64_t pos;    /* stream offset */
} kvr_xfer_cursor_t;

uint64_t kvr_xfer_stream_bytes(const kvr_xfer_seg_t *segs, size_t n);
/* Copies stream bytes [pos, pos+len) from the segments' src into buf. */
void kvr_xfer_pack(const kvr_xfer_seg_t *segs, size_t n, kvr_xfer_cursor_t *cur,
                   uint64_t pos, void *buf, uint64_t len);
/* Copies buf into stream bytes [pos, pos+len) at the segments' dst_local. */
void kvr_xfer_unpack(const kvr_xfer_seg_t *segs, size_t n,
                     kvr_xfer_cursor_t *cur, uint64_t pos, const void *buf,
                     uint64_t len);

/* ---- staging pool (consumer side) ------------------------------------ */

typedef struct kvr_staging_pool kvr_staging_pool_t;

/* num_slots fixed-size slots carved from a region of num_slots * slot_bytes. */
kvr_status_t kvr_staging_pool_create(uint32_t num_slots, uint64_t slot_bytes,
                                     kvr_staging_pool_t **out);
void kvr_staging_pool_destroy(kvr_staging_pool_t *pool);
/* Grants between min and max slots (as many as are free, at least min),
 * waiting on the pool's condition variable until the deadline; then
 * ERR_NO_SPACE. Thread-safe. */
kvr_status_t kvr_staging_acquire(kvr_staging_pool_t *pool, uint32_t min,
                                 uint32_t max, uint64_t deadline_ns,
                                 uint32_t *slots, uint32_t *num_granted);
void kvr_staging_release(kvr_staging_pool_t *pool, const uint32_t *slots,
                         uint32_t n);
uint32_t kvr_staging_free_slots(kvr_staging_pool_t *pool);

/* ---- executors ------------------------------------------------------- */

typedef enum kvr_exec_kind {
    KVR_EXEC_AUTO = 0,
    KVR_EXEC_DIRECT = 1, /* one put per coalesced run */
    KVR_EXEC_STAGED = 2, /* pack in consumer order, one put per chunk */
    KVR_EXEC_GPU_STAGED = 3, /* the staged protocol with the caller's packer
                                (CUDA pack/unpack kernels) and registered
                                GPU staging; packing runs ahead of the puts */
    KVR_EXEC_GPU_DIRECT = 4, /* the caller's kernel writes straight into the
                                peer's pages (CUDA IPC, one host): named by
                                the cost model, run outside this layer */
} kvr_exec_kind_t;

/* How the gpu-staged executor moves stream bytes (docs/transport.md,
 * gpu-staged). The stream is the segments' runs in plan order, as for
 * staged; the packer must produce exactly those bytes. Producer: `pack`
 * starts packing stream bytes [pos, pos + len) into dst (pack buffer
 * `buf`, 0 <= buf < depth) and may return before they are there
 * (a kernel on a stream, an event recorded after it); `pack_wait(buf)`
 * returns once buffer buf holds them. Consumer: `unpack` copies len bytes
 * at src (its staging slot) into stream bytes [pos, pos + len) of its
 * regions and returns once they are in place. Errors go to err. */
typedef struct kvr_exec_packer {
    void *ctx;
    uint32_t depth; /* producer pack buffers: chunks packed ahead (>= 1) */
    kvr_status_t (*pack)(void *ctx, uint64_t pos, uint64_t len, void *dst,
                         uint32_t buf, kvr_error_t *err);
    kvr_status_t (*pack_wait)(void *ctx, uint32_t buf, kvr_error_t *err);
    kvr_status_t (*unpack)(void *ctx, uint64_t pos, uint64_t len,
                           const void *src, kvr_error_t *err);
} kvr_exec_packer_t;

const char *kvr_exec_name(kvr_exec_kind_t kind);

typedef struct kvr_exec_params {
    uint64_t transfer_id; /* both sides; tags every executor message */
    uint64_t deadline_ns; /* the whole transfer */
    /* staged: the consumer's granted slots of its staging region */
    uint64_t slot_bytes;
    const uint32_t *slots;
    uint32_t num_slots;
    kvr_rmem_t *staging;       /* producer: the consumer's staging region */
    kvr_mem_t *pack_buf;       /* producer: >= slot_bytes of registered local
                                  memory; NULL: pack through kvr_rmem_ptr
                                  when mapped, else a private buffer */
    const void *staging_local; /* consumer: base of its staging region */
    /* gpu-staged, both sides: the packer; the producer's pack_buf (any
     * registered memory, CUDA for the GPU path) holds packer->depth
     * buffers of slot_bytes, buffer i at i * slot_bytes */
    const kvr_exec_packer_t *packer;
} kvr_exec_params_t;

#define KVR_EXEC_PARAMS_INIT                                                   \
    {                                                                          \
        .slot_bytes = 4u << 20                                                 \
    }

typedef struct kvr_exec_stats {
    uint64_t bytes;
    uint64_t puts;
    uint64_t chunks;
    uint64_t msgs;
    bool mapped; /* staged packing went straight into the peer's memory */
} kvr_exec_stats_t;

/* Producer side. Both flush before their completion message; both return
 * once the consumer was told (direct) or acknowledged every chunk (staged).
 * On failure the consumer is sent an abort carrying the status. */
kvr_status_t kvr_exec_send(kvr_ep_t *ep, kvr_exec_kind_t kind,
                           const kvr_xfer_seg_t *segs, size_t n,
                           const kvr_exec_params_t *params,
                           kvr_exec_stats_t *stats, kvr_error_t *err);
/* Consumer side: returns KVR_OK only when every planned byte is in place
 * (staged: every chunk unpacked) and the producer's byte count matches. */
kvr_status_t kvr_exec_recv(kvr_ep_t *ep, kvr_exec_kind_t kind,
                           const kvr_xfer_seg_t *segs, size_t n,
                           const kvr_exec_params_t *params,
                           kvr_exec_stats_t *stats, kvr_error_t *err);

/* ---- cost model ------------------------------------------------------ */

/* Up to this many measured sizes per curve. */
#define KVR_COST_POINTS 16

/* With measured curves (points != 0), per segment of `runs` runs and
 * `bytes` bytes, evaluated at its mean run length L = bytes / runs:
 *   t(direct) = sum runs * put(L) + rtt_s
 *   pack      = sum runs * copy(L),  unpack = sum runs * unpack(L)
 *   t(staged) = max(pack, unpack) (the producer packs chunk c + 1 while
 *               the consumer unpacks chunk c) + chunks * chunk_s
 *               + unpack * last / bytes (the last chunk's unpack, alone)
 *               + sum over chunks of stage(chunk bytes) (none when mapped:
 *               the pack is the copy into the target) + rtt_s
 * put, copy, unpack and stage interpolate linearly between measured sizes
 * (below the first: put flat, the others proportional; above the last:
 * the last point's rate). Without curves (points == 0, e.g. a model filled
 * in by hand) put(L) = put_s + L / put_Bps, copy(L) = unpack(L) =
 * L / copy_Bps and stage(b) = b / stage_Bps; an all-zero unpack curve
 * means unpack(L) = copy(L). */
typedef struct kvr_cost_model {
    double put_s;     /* fixed cost of one put into destination memory */
    double put_Bps;   /* large-put rate into destination memory (at most
                         what a copy of that size does) */
    double chunk_s;   /* per staged chunk: its control message and ack,
                         plus (unless mapped) its flush's round trip */
    double stage_Bps; /* large-put rate into staging memory (unless mapped) */
    double copy_Bps;  /* host copy rate of small pieces (first copy point) */
    bool mapped;      /* staging is reachable through kvr_rmem_ptr */
    double rtt_s;     /* one small put and its flush (end of either kind) */
    uint32_t points;  /* measured sizes in the curves below (0: none) */
    double point_bytes[KVR_COST_POINTS]; /* ascending */
    double put_at[KVR_COST_POINTS];      /* seconds per put of point_bytes[i] in
                                        a stream of such puts */
    double copy_at[KVR_COST_POINTS];     /* seconds per piece of that size
                                        gathered from cold memory (pack)
                                        into the mapped staging memory when
                                        mapped, else a local buffer */
    double unpack_at[KVR_COST_POINTS];   /* seconds per piece scattered from
                                          staging into cold memory */
    double stage_at[KVR_COST_POINTS];    /* one put of that size alone into
                                         staging memory, less the flush's
                                         round trip (unused when mapped) */
} kvr_cost_model_t;

typedef struct kvr_cost_probe {
    kvr_rmem_t *scratch;       /* memory like the destination, >= large_bytes,
                                  whose contents may be overwritten */
    kvr_rmem_t *stage_scratch; /* staging memory (NULL: scratch) */
    uint64_t small_bytes;      /* smallest size measured, e.g. one token */
    uint32_t small_count;      /* most puts in one timed batch, e.g. 512 */
    uint64_t large_bytes;      /* largest size measured, e.g. 4 MiB */
    uint64_t deadline_ns;
    const kvr_mem_t *put_src; /* puts read from this registered memory
                                 (e.g. CUDA, >= large_bytes), as transfers
                                 out of it do; NULL: a host buffer */
    bool lean; /* puts only, a linear model (points 0): per round a round
                  trip, a batch of small_count small puts, one large put
                  into scratch and one into staging memory; no host copies
                  (copy_Bps 0: host staging is then no candidate) and no
                  mapping. For CUDA regions, whose packing is a kernel
                  priced by kvr_cost_gpu_t: ~1-30 ms instead of ~0.3 s */
} kvr_cost_probe_t;

/* A short measurement over ep (~0.1-0.2 s; the target must progress).
 * Sizes small_bytes * 2^k up to large_bytes, and large_bytes (coarser
 * steps when that would be more than KVR_COST_POINTS); each is timed once
 * per round and the model takes the median of 5 rounds. Per size:
 * - put: a batch of puts into scratch plus one flush, less one round
 *   trip, divided by the batch; each batch starts with the target awake
 *   (an untimed small put and flush first);
 * - stage (unless mapped): one put into staging memory and its flush,
 *   less the round trip;
 * - copy / unpack: pieces gathered through kvr_xfer_pack from a local
 *   buffer twice the last-level cache (16-128 MiB, allocated for the
 *   probe) into the mapped staging memory or a local pack buffer, and
 *   scattered back through kvr_xfer_unpack.
 * No put counts faster than a copy of its bytes. */
kvr_status_t kvr_cost_measure(kvr_ep_t *ep, const kvr_cost_probe_t *probe,
                              kvr_cost_model_t *out, kvr_error_t *err);

/* The same probe in steps, for a caller that must keep serving other work
 * meanwhile (the agent's loop). kvr_cost_start checks and copies probe
 * (its deadline_ns unused) and allocates the probe's memory; no put yet.
 * kvr_cost_step runs units of the probe until until_ns (at least one: a
 * stretch of the source faulted in, the warm-up, or one timed batch, each
 * timed alone, so other work between steps does not enter a sample), its
 * puts and flushes bounded by deadline_ns; *done once the model is made.
 * kvr_cost_result gives it (false until then). After a failed step, free
 * it. The endpoint and the probe's memories must outlive the run; nothing
 * else may use the endpoint while a step runs (steps run on the caller's
 * thread, as every other use of a UCX worker does). */
typedef struct kvr_cost_run kvr_cost_run_t;
kvr_status_t kvr_cost_start(kvr_ep_t *ep, const kvr_cost_probe_t *probe,
                            kvr_cost_run_t **out, kvr_error_t *err);
kvr_status_t kvr_cost_step(kvr_cost_run_t *run, uint64_t until_ns,
                           uint64_t deadline_ns, bool *done, kvr_error_t *err);
bool kvr_cost_result(const kvr_cost_run_t *run, kvr_cost_model_t *out);
void kvr_cost_free(kvr_cost_run_t *run);
/* Picks the cheaper executor; force != AUTO wins. Predicted seconds go to
 * t_direct / t_staged when non-NULL. */
kvr_exec_kind_t kvr_cost_choose(const kvr_cost_model_t *model,
                                kvr_exec_kind_t force,
                                const kvr_xfer_seg_t *segs, size_t n,
                                uint64_t slot_bytes, double *t_direct,
                                double *t_staged);

/* Executor kinds the model prices: index by kvr_exec_kind_t. */
#define KVR_COST_KINDS 5

/* The GPU figures of a link, measured at set-up by whoever owns the
 * kernels (the connector; bench/gpu/bench_gpu_net.c), beside a
 * kvr_cost_model_t whose put and stage curves were measured with CUDA
 * memory (kvr_cost_probe_t.put_src and CUDA scratch) when cuda is set. */
typedef struct kvr_cost_gpu {
    bool cuda;         /* the regions are CUDA memory */
    double pack_Bps;   /* pack and unpack kernels over the plan's runs
                          (0: no gpu-staged) */
    double launch_s;   /* per chunk: a kernel launch and its event */
    double direct_Bps; /* gpu-direct into the peer's pages (CUDA IPC, one
                          host); 0: no such path to this peer */
} kvr_cost_gpu_t;

/* Prices every executor that fits the memory and picks the cheapest;
 * force != AUTO wins. Host regions (gpu NULL or !gpu->cuda): direct and
 * staged, as kvr_cost_choose. CUDA regions: direct puts (the model's put
 * curve), gpu-staged (when pack_Bps > 0)
 *   t = max(bytes / pack_Bps, sum over chunks of stage + chunk_s)
 *       + first pack and last unpack alone + chunks * launch_s + rtt_s
 * and gpu-direct (when direct_Bps > 0): bytes / direct_Bps + launch_s +
 * rtt_s. Predicted seconds per kind go to t (0: not a candidate). */
kvr_exec_kind_t kvr_cost_choose_gpu(const kvr_cost_model_t *model,
                                    const kvr_cost_gpu_t *gpu,
                                    kvr_exec_kind_t force,
                                    const kvr_xfer_seg_t *segs, size_t n,
                                    uint64_t slot_bytes,
                                    double t[KVR_COST_KINDS]);

KVR_API_END
#ifdef __cplusplus
}
#endif
#endif
