/* Internals shared by the xfer layer: the transport ops table every backend
 * fills, the common parts of its objects and the control message queue. */
#ifndef KVRELAY_XFER_INTERNAL_H
#define KVRELAY_XFER_INTERNAL_H

#include <pthread.h>
#include <stdatomic.h>

#include "kvrelay/xfer.h"

#include "base_internal.h"

typedef struct kvr__queued_msg kvr__queued_msg_t;

/* Backend operations. The public functions check arguments and bounds,
 * then call these; a backend sets detail with kvr__fail. */
typedef struct kvr__xfer_ops {
    const char *name;
    kvr_status_t (*address)(kvr_transport_t *t, const void **addr, size_t *len);
    kvr_status_t (*event_fd)(kvr_transport_t *t, int *fd);
    /* Makes progress; when wait_until_ns is in the future and nothing
     * happened, sleeps until an event or that time. */
    kvr_status_t (*progress)(kvr_transport_t *t, uint64_t wait_until_ns);
    kvr_status_t (*ep_create)(kvr_transport_t *t, const void *addr, size_t len,
                              kvr_ep_t **out);
    void (*ep_destroy)(kvr_ep_t *ep);
    kvr_status_t (*reg)(kvr_transport_t *t, void *addr, size_t len,
                        bool allocate, kvr_mem_t **out);
    /* Registers CUDA device memory; NULL: the backend has none. */
    kvr_status_t (*reg_cuda)(kvr_transport_t *t, void *addr, size_t len,
                             kvr_mem_t **out);
    void (*dereg)(kvr_mem_t *mem);
    kvr_status_t (*pack_rkey)(const kvr_mem_t *mem, kvr_remote_region_t *out);
    kvr_status_t (*rmem_open)(kvr_ep_t *ep, const kvr_remote_region_t *desc,
                              kvr_rmem_t **out);
    void (*rmem_close)(kvr_rmem_t *rmem);
    kvr_status_t (*rmem_ptr)(kvr_rmem_t *rmem, uint64_t off, void **out);
    kvr_status_t (*put)(kvr_ep_t *ep, const void *src, uint64_t len,
                        kvr_rmem_t *dst, uint64_t off, uint64_t deadline_ns);
    kvr_status_t (*flush)(kvr_ep_t *ep, uint64_t deadline_ns);
    kvr_status_t (*drain)(kvr_ep_t *ep, uint64_t deadline_ns);
    kvr_status_t (*send_msg)(kvr_ep_t *ep, uint32_t type, const void *data,
                             size_t len, uint64_t deadline_ns);
    void (*close)(kvr_transport_t *t);
} kvr__xfer_ops_t;

struct kvr_transport {
    const kvr__xfer_ops_t *ops;
    const char *name;
    uint64_t id;
    uint32_t max_inflight;
    bool threaded; /* messages arrive from another thread: sleep on cond */
    bool has_cuda; /* reg_cuda works (UCX with CUDA memory support) */
    bool map_stores; /* kvr_rmem_map may hand out rmem_ptr's pointers */
    pthread_mutex_t lock; /* guards the queue and wakes waiters */
    pthread_cond_t cond;
    kvr__queued_msg_t *head, *tail;
    uint32_t queued, queue_max;
    bool overflow; /* a message was lost to a full queue */
    char last_error[KVR_ERROR_MSG_MAX];
};

struct kvr_ep {
    kvr_transport_t *t;
    _Atomic int failed; /* kvr_status_t; set once, by whoever saw it first */
};

struct kvr_mem {
    kvr_transport_t *t;
    void *addr;
    size_t len;
    kvr_mem_kind_t kind;
};

struct kvr_rmem {
    kvr_ep_t *ep;
    uint64_t base;
    uint64_t len;
};

/* Base setup and teardown, called by each backend's create and close. */
kvr_status_t kvr__transport_init(kvr_transport_t *t, const kvr__xfer_ops_t *ops,
                                 uint64_t id, uint32_t max_inflight,
                                 uint32_t queue_max);
void kvr__transport_fini(kvr_transport_t *t);

/* Records detail on t and returns code. */
kvr_status_t kvr__fail(kvr_transport_t *t, kvr_status_t code, const char *fmt,
                       ...)
#if defined(__GNUC__)
    __attribute__((format(printf, 3, 4)))
#endif
    ;

/* Marks ep dead with the first status seen; returns the stored status. */
kvr_status_t kvr__ep_set_failed(kvr_ep_t *ep, kvr_status_t st);
kvr_status_t kvr__ep_failed(const kvr_ep_t *ep);

/* Queues a copy of a message for t (any thread); ready_ns delays delivery
 * (0: now). Wakes waiters. */
void kvr__msg_deliver(kvr_transport_t *t, uint64_t sender, uint32_t type,
                      const void *data, size_t len, uint64_t ready_ns);
/* Wakes threads sleeping in kvr__wait (call after changing waited state). */
void kvr__wake(kvr_transport_t *t);

/* Waits until done(ctx) returns non-zero or the deadline passes, progressing
 * the transport (caller mode) or sleeping on its condition (threaded). */
typedef int (*kvr__done_fn)(void *ctx);
kvr_status_t kvr__wait(kvr_transport_t *t, kvr__done_fn done, void *ctx,
                       uint64_t deadline_ns);

/* Executor control messages (little-endian, fixed size, checked on decode). */
enum {
    KVR__MSG_CHUNK = KVR_XFER_MSG_RESERVED + 1, /* producer: chunk is in slot */
    KVR__MSG_ACK = KVR_XFER_MSG_RESERVED + 2,   /* consumer: chunk unpacked */
    KVR__MSG_DONE = KVR_XFER_MSG_RESERVED + 3,  /* producer: all data flushed */
    KVR__MSG_ABORT = KVR_XFER_MSG_RESERVED + 4, /* producer: failed, status */
};

typedef struct kvr__exec_msg {
    uint64_t transfer_id;
    uint64_t chunk; /* CHUNK, ACK; DONE: number of chunks */
    uint64_t bytes; /* CHUNK: chunk bytes; DONE: total bytes */
    uint32_t slot;  /* CHUNK; ABORT: status code */
} kvr__exec_msg_t;

#define KVR__EXEC_MSG_BYTES 28u

void kvr__exec_msg_encode(const kvr__exec_msg_t *m,
                          unsigned char out[KVR__EXEC_MSG_BYTES]);
kvr_status_t kvr__exec_msg_decode(const kvr_xfer_msg_t *msg,
                                  kvr__exec_msg_t *out);

#endif
