/* kvrelay conn layer: the producer (one PP stage) and consumer (one DCP
 * rank) state machines of docs/design.md §7-8, over a TCP control channel that
 * carries wire frames and a transport (UCX) for the bytes.
 *
 * One kvr_conn_t is one side. It is driven by kvr_conn_progress() from one
 * thread; completions come out of kvr_conn_poll_event(). Nothing waits
 * without a deadline: every request carries one (relative ms on the wire). */
#ifndef KVRELAY_CONN_H
#define KVRELAY_CONN_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "kvrelay/completion.h"
#include "kvrelay/layout.h"
#include "kvrelay/plan.h"
#include "kvrelay/status.h"
#include "kvrelay/wire.h"

#ifdef __cplusplus
extern "C" {
#endif
KVR_API_BEGIN

typedef enum kvr_conn_tl {
    KVR_CONN_TL_AUTO = 0,
    KVR_CONN_TL_SHM = 1,
    KVR_CONN_TL_TCP = 2,
} kvr_conn_tl_t;

typedef enum kvr_conn_exec {
    KVR_CONN_EXEC_AUTO = 0,   /* the producer's cost model picks */
    KVR_CONN_EXEC_DIRECT = 1, /* one put per coalesced run */
    KVR_CONN_EXEC_STAGED = 2, /* packed chunks through consumer staging */
} kvr_conn_exec_t;

typedef struct kvr_conn_params {
    kvr_wire_side_t side;
    kvr_layout_t layout;
    kvr_wire_topo_t topo;     /* this side's ranks and layer range */
    uint32_t producer_stages; /* consumer: PP stages that must answer */
    uint32_t consumer_ranks;  /* producer: DCP ranks that must release */
    const uint8_t *key;       /* 32-byte pre-shared key, or NULL */
    bool insecure;            /* without a key, accept non-loopback peers */
    kvr_conn_tl_t tl;
    kvr_conn_exec_t executor; /* consumer's wish sent in WRITE_REQUEST */
    uint32_t deadline_ms;     /* per request (default 30 s) */
    uint32_t release_grace_ms;  /* frees sources (producer) or quarantined
                                   blocks (consumer) at deadline + grace */
    uint32_t max_requests;      /* live requests; beyond, ERR_NO_SPACE */
    uint32_t leader_blocks;     /* decode leader: destination pool size */
    int cuda_device;            /* >= 0: KV regions live on this CUDA device
                                   and move with the gpu-direct executor */
} kvr_conn_params_t;

#define KVR_CONN_PARAMS_INIT                                                   \
    {.side = KVR_WIRE_CONSUMER, .layout = KVR_LAYOUT_INIT,                     \
     .topo = {0, 1, 0, 1, 0, 1, 0, 0, 0}, .producer_stages = 1,                \
     .consumer_ranks = 1, .key = NULL, .insecure = false,                      \
     .tl = KVR_CONN_TL_AUTO, .executor = KVR_CONN_EXEC_AUTO,                   \
     .deadline_ms = 30000, .release_grace_ms = 5000,                           \
     .max_requests = 1024, .leader_blocks = 0, .cuda_device = -1}

typedef struct kvr_conn kvr_conn_t;

kvr_status_t kvr_conn_create(const kvr_conn_params_t *params,
                             kvr_conn_t **out, kvr_error_t *err);
/* Closes every link; accepts NULL. */
void kvr_conn_destroy(kvr_conn_t *conn);
/* Detail of the last failure ("" if none). */
const char *kvr_conn_last_error(const kvr_conn_t *conn);

/* Regions, before any listen/connect. add registers engine memory (base,
 * num_blocks * page_bytes; with cuda_device >= 0 a device pointer on that
 * device, STAGING excepted); alloc has kvrelay allocate it (host: true
 * one-sided puts on shared memory; device: cudaMalloc) and returns the base. */
kvr_status_t kvr_conn_add_region(kvr_conn_t *conn,
                                 const kvr_region_desc_t *desc, void *base);
kvr_status_t kvr_conn_alloc_region(kvr_conn_t *conn,
                                   const kvr_region_desc_t *desc,
                                   void **base);

/* Copies between host memory and this side's region memory (host or, with
 * cuda_device >= 0, device); synchronous. For filling and checking pages. */
kvr_status_t kvr_conn_copy(kvr_conn_t *conn, void *dst, const void *src,
                           size_t len);

/* Usable CUDA devices (0 when kvrelay was built without CUDA). */
int kvr_conn_cuda_devices(void);

/* Consumer: accept producers (and on rank 0, the other decode ranks). */
kvr_status_t kvr_conn_listen(kvr_conn_t *conn, const char *host,
                             uint16_t port, uint16_t *bound);
/* Producer -> every consumer rank; consumer rank > 0 -> the leader. Returns
 * once the handshake finished (or failed) within timeout_ms. */
kvr_status_t kvr_conn_connect(kvr_conn_t *conn, const char *host,
                              uint16_t port, uint32_t timeout_ms);
/* Links whose handshake completed (and, producer, whose REGIONS arrived). */
uint32_t kvr_conn_num_ready(const kvr_conn_t *conn);

/* One turn of the event loop: waits up to timeout_ms for input. */
kvr_status_t kvr_conn_progress(kvr_conn_t *conn, uint32_t timeout_ms);

/* Producer PP head: a finished prefill for the decode leader. */
typedef struct kvr_conn_offer {
    const void *request_id;
    size_t request_id_len;
    uint64_t transfer_id;
    uint64_t num_tokens;
    const uint32_t *src_blocks;
    size_t num_src_blocks;
    const uint32_t *prompt;
    size_t num_prompt;
} kvr_conn_offer_t;

kvr_status_t kvr_conn_offer(kvr_conn_t *conn, const kvr_conn_offer_t *offer);

/* Consumer: load a request whose tables an engine's router computed
 * (the OFFER/ASSIGN path does the same from messages). */
typedef struct kvr_conn_load {
    const void *request_id;
    size_t request_id_len;
    uint64_t transfer_id;
    const uint32_t *src_blocks;
    size_t num_src_blocks;
    const uint32_t *dst_blocks;
    size_t num_dst_blocks;
    uint64_t num_tokens;
    uint64_t num_computed_blocks; /* virtual blocks */
    uint32_t deadline_ms;         /* 0: the params' default */
} kvr_conn_load_t;

kvr_status_t kvr_conn_load(kvr_conn_t *conn, const kvr_conn_load_t *load);

typedef enum kvr_conn_event_kind {
    KVR_EVENT_LOADED = 1,      /* consumer: every planned byte is in place */
    KVR_EVENT_LOAD_FAILED = 2, /* consumer: refused, failed or deadline */
    KVR_EVENT_SENT = 3,        /* producer: every rank released; sources free */
    KVR_EVENT_SEND_FAILED = 4, /* producer: a transfer failed or timed out */
    KVR_EVENT_GROUP_DONE = 5,  /* leader: every rank released the request */
    KVR_EVENT_PEER_LOST = 6,   /* a link closed (status says why) */
} kvr_conn_event_kind_t;

/* Arrays point into the conn and stay valid until the next poll. */
typedef struct kvr_conn_event {
    kvr_conn_event_kind_t kind;
    kvr_wire_id_t request_id;
    uint64_t transfer_id;
    kvr_status_t status;
    char message[KVR_ERROR_MSG_MAX];
    uint64_t bytes;
    uint64_t num_tokens;
    uint64_t num_computed_blocks;
    const uint32_t *src_blocks;
    size_t num_src_blocks;
    const uint32_t *dst_blocks;
    size_t num_dst_blocks;
    uint32_t peer_rank; /* PEER_LOST: the peer's pp (producer) or dcp rank */
    uint64_t started_ns; /* LOADED: when the WRITE_REQUESTs went out
                            (CLOCK_MONOTONIC), to time the transfer itself */
} kvr_conn_event_t;

/* true and *out filled when an event was queued. */
bool kvr_conn_poll_event(kvr_conn_t *conn, kvr_conn_event_t *out);

/* Requests still in flight on this side (quarantined ones included). */
uint32_t kvr_conn_num_live(const kvr_conn_t *conn);

KVR_API_END
#ifdef __cplusplus
}
#endif
#endif
