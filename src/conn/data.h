/* The conn layer's view of the transport: the only file that includes
 * kvrelay/xfer.h. Keeps the connector independent of transport details. */
#ifndef KVRELAY_CONN_DATA_H
#define KVRELAY_CONN_DATA_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "kvrelay/plan.h"
#include "kvrelay/status.h"

typedef struct kvr__data kvr__data_t;   /* one transport */
typedef struct kvr__dmem kvr__dmem_t;   /* a local registered region */
typedef struct kvr__dpeer kvr__dpeer_t; /* an endpoint and its remote regions */

#define KVR_DATA_RKEY_MAX 1024u

/* tl: 0 auto, 1 shm, 2 tcp. progress_thread for targets of emulated puts.
 * cuda: CUDA memory too (cuda_copy, and cuda_ipc unless tcp). */
kvr_status_t kvr__data_create(int tl, bool progress_thread, bool cuda,
                              kvr__data_t **out, kvr_error_t *err);
/* The UCX library in use ("1.13.1"), or "none". */
const char *kvr__data_ucx_version(void);
/* Whether the transport moves CUDA memory (a UCX built with CUDA). */
bool kvr__data_has_cuda(const kvr__data_t *d);
void kvr__data_destroy(kvr__data_t *d);
kvr_status_t kvr__data_address(kvr__data_t *d, const void **addr, size_t *len);

/* Registers engine memory, or allocates (base returned through *base). */
kvr_status_t kvr__dmem_register(kvr__data_t *d, void *base, uint64_t len,
                                kvr__dmem_t **out, kvr_error_t *err);
kvr_status_t kvr__dmem_alloc(kvr__data_t *d, uint64_t len, void **base,
                             kvr__dmem_t **out, kvr_error_t *err);
/* Registers CUDA memory as such (ERR_UNSUPPORTED, naming the UCX
 * version, when the transport cannot move CUDA memory). */
kvr_status_t kvr__dmem_register_cuda(kvr__data_t *d, void *base, uint64_t len,
                                     kvr__dmem_t **out, kvr_error_t *err);
void kvr__dmem_destroy(kvr__dmem_t *m);
/* Packed remote key of a region (for REGIONS). */
kvr_status_t kvr__dmem_rkey(kvr__dmem_t *m, uint8_t *rkey, uint32_t *len);

kvr_status_t kvr__dpeer_open(kvr__data_t *d, const void *addr, size_t len,
                             kvr__dpeer_t **out, kvr_error_t *err);
void kvr__dpeer_close(kvr__dpeer_t *p);
/* The peer went silent past a deadline: its endpoint is declared dead, so
 * nothing waits on it any more and closing it is a forced close. */
void kvr__dpeer_fail(kvr__dpeer_t *p, kvr_status_t st);
/* Opens [base, base+len) of a peer region (sub-ranges of one registration
 * share its rkey); returns its index for later puts. */
kvr_status_t kvr__dpeer_map(kvr__dpeer_t *p, uint64_t base, uint64_t len,
                            const uint8_t *rkey, uint32_t rkey_len,
                            uint32_t *index, kvr_error_t *err);

/* Direct sends into mapping `index` become stores when the transport can
 * map it for good (kvr_rmem_map: same host, memory the peer allocated);
 * false leaves them puts. Host memory only. */
bool kvr__dpeer_map_stores(kvr__dpeer_t *p, uint32_t index);
/* Adds the bytes direct sends stored into mapped memory and put. */
void kvr__dpeer_counts(const kvr__dpeer_t *p, uint64_t *stored, uint64_t *put);

/* One region's part of a transfer. */
typedef struct kvr__dseg {
    const kvr_plan_t *plan;
    const void *src; /* producer: local source base */
    uint32_t remote; /* producer: index of the destination mapping */
    void *dst_local; /* consumer: local destination base */
    uint32_t layer;  /* the region's model layer (layer-wise streaming) */
    uint64_t bytes;  /* plan NULL (gpu-direct without pair plans): its bytes */
} kvr__dseg_t;

uint64_t kvr__dseg_bytes(const kvr__dseg_t *segs, size_t n);

/* Producer, direct: one put per run, then a flush. */
kvr_status_t kvr__data_send_direct(kvr__dpeer_t *p, const kvr__dseg_t *segs,
                                   size_t n, uint64_t deadline_ns,
                                   kvr_error_t *err);
/* Producer, staged: pack stream bytes [off, off+len) into the peer's
 * mapping `staging` at staging_off, put and flush. */
kvr_status_t kvr__data_send_chunk(kvr__dpeer_t *p, const kvr__dseg_t *segs,
                                  size_t n, uint64_t off, uint64_t len,
                                  uint32_t staging, uint64_t staging_off,
                                  uint64_t deadline_ns, kvr_error_t *err);
/* Producer, gpu-staged: put [buf, buf+len) (registered memory, CUDA
 * included) into the peer's mapping `staging` at staging_off, and flush. */
kvr_status_t kvr__data_put_flush(kvr__dpeer_t *p, const void *buf,
                                 uint64_t len, uint32_t staging,
                                 uint64_t staging_off, uint64_t deadline_ns,
                                 kvr_error_t *err);
/* Consumer, staged: unpack stream bytes [off, off+len) from buf. */
void kvr__data_unpack(const kvr__dseg_t *segs, size_t n, uint64_t off,
                      const void *buf, uint64_t len);

/* Executor choice from the cost model; force 1 direct, 2 staged. */
int kvr__data_choose(kvr__dpeer_t *p, int force, const kvr__dseg_t *segs,
                     size_t n, uint64_t slot_bytes);
/* Starts measuring the cost model with a scratch mapping of the peer; puts
 * read from put_src (registered, >= scratch_len, kept until the probe
 * ends; CUDA memory for CUDA regions: then the lean probe, puts only) or,
 * NULL, a host buffer. Until it is measured the peer keeps the default
 * model. */
kvr_status_t kvr__data_probe_start(kvr__dpeer_t *p, uint32_t scratch,
                                   uint64_t scratch_len,
                                   const kvr__dmem_t *put_src,
                                   kvr_error_t *err);
/* Runs the probe until until_ns (at least one timed batch of it, each put
 * and flush bounded by 5 s); *done once it ended: the model is measured,
 * or, on an error, the default stays. */
kvr_status_t kvr__data_probe_step(kvr__dpeer_t *p, uint64_t until_ns,
                                  bool *done, kvr_error_t *err);
/* A probe was started and has not ended. */
bool kvr__data_probing(const kvr__dpeer_t *p);
/* The probe's figures in a line for the log: a put of the smallest size
 * (a lean probe's: a put's fixed cost) and the largest put's rate, a
 * staging put's rate, the round trip, a chunk's fixed cost. */
void kvr__data_model_describe(const kvr__dpeer_t *p, char *buf, size_t len);
/* The GPU figures of a link (kvr_cost_gpu_t): pack/unpack kernel rate (0:
 * no gpu-staged), per-chunk launch, gpu-direct rate (0: no CUDA IPC). */
typedef struct kvr__dgpu {
    double pack_Bps, launch_s, direct_Bps;
} kvr__dgpu_t;
/* Executor for CUDA regions: 1 direct puts, 2 gpu-staged, 4 gpu-direct;
 * force (the same values, 0 auto) wins. p NULL: no network path. The
 * predicted seconds of direct puts, gpu-staged and gpu-direct go to pred
 * when not NULL (0: not a candidate). */
int kvr__data_choose_gpu(kvr__dpeer_t *p, int force, const kvr__dgpu_t *g,
                         const kvr__dseg_t *segs, size_t n,
                         uint64_t slot_bytes, double pred[3]);

/* The agent's additions: an in-process loopback data plane for tests, and
 * direct sends in bounded slices (the caller keeps the cursor). */
struct kvr_transport;
struct kvr_loopback_params;
kvr_status_t kvr__data_create_loopback(struct kvr_transport *hub,
                                       const struct kvr_loopback_params *p,
                                       kvr__data_t **out, kvr_error_t *err);

typedef struct kvr__dcursor {
    size_t seg, run;
} kvr__dcursor_t;

/* Posts puts from the cursor on until about max_bytes were posted or every
 * run was; *done says the latter, *moved grows by the bytes posted.
 * Nothing is flushed. */
kvr_status_t kvr__data_put_some(kvr__dpeer_t *p, const kvr__dseg_t *segs,
                                size_t n, kvr__dcursor_t *cur,
                                uint64_t max_bytes, uint64_t deadline_ns,
                                bool *done, uint64_t *moved, kvr_error_t *err);
/* Waits (up to the deadline) until every put posted on p completed;
 * at once when put_some only stored. */
kvr_status_t kvr__data_flush(kvr__dpeer_t *p, uint64_t deadline_ns,
                             kvr_error_t *err);

#endif
