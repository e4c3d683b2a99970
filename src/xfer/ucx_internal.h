/* UCX backend internals shared by ucx.c (context, worker, progress) and
 * ucx_ep.c (endpoints, memory, puts, messages). */
#ifndef KVRELAY_UCX_INTERNAL_H
#define KVRELAY_UCX_INTERNAL_H

#include <ucp/api/ucp.h>

#include "xfer_internal.h"

/* Active message id of kvrelay control messages. */
#define KVR__UCX_AM_ID 0x6b76u
/* AM header: sender id (8), type (4), reserved (4), little-endian. */
#define KVR__UCX_AM_HDR 16u

typedef struct ucx_tr {
    kvr_transport_t base;
    kvr_ucx_params_t p;
    ucp_context_h ctx;
    ucp_worker_h worker;
    ucp_address_t *addr;
    size_t addr_len;
    int efd;     /* the worker's event fd */
    int wake_fd; /* eventfd: kicks the progress thread */
    pthread_t thread;
    bool thread_started;
    _Atomic bool stop;
    _Atomic bool sleeping;        /* the progress thread sits in poll() */
    _Atomic uint64_t outstanding; /* posted requests not yet completed */
    uint64_t last_event_ns;       /* last time progress did something */
    struct ucx_ep *graveyard;     /* endpoints whose close timed out: freed
                                     once the worker is gone (no callback
                                     can name them after that) */
    pthread_mutex_t cuda_lock;    /* guards cuda_mems */
    struct ucx_mem *cuda_mems;    /* registered CUDA memory: puts from it
                                     name their memory type */
} ucx_tr_t;

typedef struct ucx_ep {
    kvr_ep_t base;
    ucp_ep_h uep;
    _Atomic uint32_t inflight;     /* puts */
    _Atomic uint32_t msgs_pending; /* control messages not yet sent */
    _Atomic uint64_t flushes_done;
    uint64_t flushes_posted;
    struct ucx_ep *next_dead; /* in the transport's graveyard */
} ucx_ep_t;

typedef struct ucx_mem {
    kvr_mem_t base;
    ucp_mem_h memh;
    bool cuda;
    struct ucx_mem *next_cuda; /* in the transport's cuda_mems */
} ucx_mem_t;

typedef struct ucx_rmem {
    kvr_rmem_t base;
    ucp_rkey_h rkey;
} ucx_rmem_t;

/* Frees endpoints whose close timed out; call after ucp_worker_destroy. */
void kvr__ucx_free_graveyard(ucx_tr_t *tr);

static inline ucx_tr_t *kvr__ucx_tr(kvr_transport_t *t)
{
    return (ucx_tr_t *)t;
}

/* The one place a ucs_status_t becomes a kvr_status_t (with detail on t). */
kvr_status_t kvr__ucx_status(kvr_transport_t *t, ucs_status_t s,
                             const char *what);
/* Around every posted request: _posted before posting (keeps the progress
 * engine spinning while work is outstanding), _completed once it is done
 * (wakes sleepers). */
void kvr__ucx_posted(ucx_tr_t *tr);
void kvr__ucx_completed(ucx_tr_t *tr);

kvr_status_t kvr__ucx_ep_create(kvr_transport_t *t, const void *addr,
                                size_t len, kvr_ep_t **out);
void kvr__ucx_ep_destroy(kvr_ep_t *ep);
kvr_status_t kvr__ucx_reg(kvr_transport_t *t, void *addr, size_t len,
                          bool allocate, kvr_mem_t **out);
kvr_status_t kvr__ucx_reg_cuda(kvr_transport_t *t, void *addr, size_t len,
                               kvr_mem_t **out);
void kvr__ucx_dereg(kvr_mem_t *mem);
kvr_status_t kvr__ucx_pack_rkey(const kvr_mem_t *mem, kvr_remote_region_t *out);
kvr_status_t kvr__ucx_rmem_open(kvr_ep_t *ep, const kvr_remote_region_t *desc,
                                kvr_rmem_t **out);
void kvr__ucx_rmem_close(kvr_rmem_t *rmem);
kvr_status_t kvr__ucx_rmem_ptr(kvr_rmem_t *rmem, uint64_t off, void **out);
kvr_status_t kvr__ucx_put(kvr_ep_t *ep, const void *src, uint64_t len,
                          kvr_rmem_t *dst, uint64_t off, uint64_t deadline_ns);
kvr_status_t kvr__ucx_flush(kvr_ep_t *ep, uint64_t deadline_ns);
kvr_status_t kvr__ucx_drain(kvr_ep_t *ep, uint64_t deadline_ns);
kvr_status_t kvr__ucx_send_msg(kvr_ep_t *ep, uint32_t type, const void *data,
                               size_t len, uint64_t deadline_ns);
ucs_status_t kvr__ucx_am_recv(void *arg, const void *header, size_t hlen,
                              void *data, size_t len,
                              const ucp_am_recv_param_t *param);

#endif
