/* kvrelay agent: the one object an inference engine worker embeds to move
 * KV cache between prefill (producer) and decode (consumer) instances, any
 * number of each (docs/agent.md, docs/design.md §14).
 *
 * One agent per engine worker (one GPU or one CPU worker). It owns the
 * worker's registered KV regions, one listening socket (producers), the
 * control links it dialled or accepted and the state of every request it
 * takes part in. Requests are keyed by (producer instance id, request id).
 *
 * Threading rules
 * ---------------
 * - Every public function is safe to call from any thread at any time
 *   (kvr_agent_destroy excepted: no other call may run on the agent during
 *   or after it).
 * - No public function does network I/O or waits on a peer. Calls validate
 *   their arguments, copy what they need and queue a command for the
 *   agent's progress loop (a mutex-protected inbox plus an eventfd that wakes
 *   it); they return at once. Errors found later (an unreachable producer, a
 *   refused pull) arrive as events.
 * - The request state machines run only in the progress loop: the agent's
 *   own thread (params.progress_thread, the default), or, without one,
 *   whichever thread calls kvr_agent_progress() (one caller at a time: a
 *   second concurrent caller gets KVR_ERR_INVALID at once).
 * - Events leave through a mutex-protected queue read by kvr_agent_poll()
 *   from any thread (one reader at a time is enough; several are safe).
 *   kvr_agent_event_fd() is readable while events are queued.
 * - kvr_agent_status() reads a small mutex-protected snapshot that the
 *   progress loop keeps current.
 * - No callback ever runs, so none runs under an internal lock.
 *
 * Every request ends in exactly one terminal event: on the consumer LOADED
 * or LOAD_FAILED, always followed by exactly one RELEASED (the destination
 * blocks are reusable: every source confirmed it stopped writing into them
 * or was cut off); on the producer SENT, SEND_EXPIRED or SEND_FAILED. A
 * request's key may be reused once its last event was polled. */
#ifndef KVRELAY_AGENT_H
#define KVRELAY_AGENT_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "kvrelay/layout.h"
#include "kvrelay/status.h"
#include "kvrelay/wire.h"
#include "kvrelay/xfer.h"

#ifdef __cplusplus
extern "C" {
#endif
KVR_API_BEGIN

/* Longest instance id (bytes; the engine's own, e.g. a vLLM engine id). */
#define KVR_AGENT_INSTANCE_MAX 64u

typedef enum kvr_agent_role {
    KVR_AGENT_PRODUCER = 1, /* prefill: serves pulls of its own KV */
    KVR_AGENT_CONSUMER = 2, /* decode: pulls KV into its blocks */
    KVR_AGENT_BOTH = 3,
} kvr_agent_role_t;

typedef enum kvr_agent_tl {
    KVR_AGENT_TL_AUTO = 0, /* UCX picks (shm on one host, tcp across) */
    KVR_AGENT_TL_SHM = 1,
    KVR_AGENT_TL_TCP = 2,
} kvr_agent_tl_t;

/* How a pull's bytes move (docs/agent.md Executors). A consumer asks for
 * one in each WRITE_REQUEST (AUTO: the producer decides); a producer's
 * setting decides what a consumer left to it. */
typedef enum kvr_agent_exec {
    KVR_AGENT_EXEC_AUTO = 0,   /* the cost model picks per pull (staged
                                  needs the consumer's STAGING region) */
    KVR_AGENT_EXEC_DIRECT = 1, /* one put per coalesced run */
    KVR_AGENT_EXEC_STAGED = 2, /* packed chunks through the consumer's
                                  STAGING slots (a consumer needs one);
                                  KV in CUDA memory: gpu-staged (packed
                                  by kernels, CUDA STAGING) */
    KVR_AGENT_EXEC_GPU_DIRECT = 3, /* KV in CUDA memory: kernels write into
                                      the consumer's pages via CUDA IPC */
} kvr_agent_exec_t;

/* Creation parameters. Append-only: new fields go at the end, and
 * KVR_AGENT_PARAMS_INIT gives every field its default. */
typedef struct kvr_agent_params {
    const void *instance_id; /* 1..KVR_AGENT_INSTANCE_MAX bytes, copied */
    size_t instance_id_len;
    kvr_agent_role_t role;
    kvr_layout_t layout;   /* the model's full layout (both sides agree) */
    kvr_wire_topo_t topo;  /* this worker: pp/tp/dcp ranks and sizes,
                                 half-open model layer range */
    const char *listen;    /* "host:port" ("127.0.0.1:0" picks a port);
                                 producers must listen, consumers may (to
                                 receive notifications) */
    const char *advertise; /* "host:port" peers should dial; NULL: the
                                 bound address */
    const char *bootstrap; /* non-head producer stages: the address of
                                 the instance's PP head (pp 0, tp 0) */
    const uint8_t *key;    /* 32-byte pre-shared key, or NULL */
    bool insecure;         /* without a key, talk to non-loopback peers */
    kvr_agent_tl_t tl;
    kvr_transport_t *loopback_hub;  /* non-NULL: the data plane is an
                                      in-process loopback transport joined to
                                      this one's hub (tests); tl is ignored */
    kvr_loopback_params_t loopback; /* its fault injection, with the hub */
    kvr_agent_exec_t executor;
    bool progress_thread;     /* false: the engine calls kvr_agent_progress */
    uint32_t deadline_ms;     /* consumer: default per-request deadline */
    uint32_t grace_ms;        /* past the deadline: quarantine bound */
    uint32_t lease_ms;        /* producer: default lease of send_open */
    uint32_t unknown_wait_ms; /* producer: how long a pull for a request not
                                 yet opened is held before it is refused */
    uint32_t idle_close_ms;   /* a link unused this long is closed */
    uint32_t connect_timeout_ms; /* dial plus handshake */
    uint32_t max_requests;       /* live requests per side; beyond, NO_SPACE */
    int cuda_device;             /* -1: KV in host memory. >= 0: KV in CUDA
                                 memory on this device, moved gpu-direct
                                 (CUDA IPC, one host), gpu-staged or by
                                 direct puts (a UCX built with CUDA;
                                 docs/agent.md GPU executors) */
    uint32_t handshake_timeout_ms; /* an accepted link not through its
                                      handshake (AUTH, with a key) by then
                                      is closed */
    uint32_t max_unauth_links;     /* accepted links still in their handshake;
                                  beyond, the oldest is closed (they never
                                  take the seats of handshaken links) */
} kvr_agent_params_t;

#define KVR_AGENT_PARAMS_INIT                                                  \
    {                                                                          \
        .instance_id = NULL, .instance_id_len = 0, .role = KVR_AGENT_CONSUMER, \
        .layout = KVR_LAYOUT_INIT, .topo = {0, 1, 0, 1, 0, 1, 0, 1, 0},        \
        .listen = NULL, .advertise = NULL, .bootstrap = NULL, .key = NULL,     \
        .insecure = false, .tl = KVR_AGENT_TL_AUTO, .loopback_hub = NULL,      \
        .loopback = KVR_LOOPBACK_PARAMS_INIT, .executor = KVR_AGENT_EXEC_AUTO, \
        .progress_thread = true, .deadline_ms = 30000, .grace_ms = 5000,       \
        .lease_ms = 60000, .unknown_wait_ms = 1000, .idle_close_ms = 60000,    \
        .connect_timeout_ms = 5000, .max_requests = 1024, .cuda_device = -1,   \
        .handshake_timeout_ms = 3000, .max_unauth_links = 64                   \
    }

typedef struct kvr_agent kvr_agent_t;

/* Validates params (err names the bad value) and creates the agent with a
 * fresh random 64-bit incarnation. No socket or thread yet. */
kvr_status_t kvr_agent_create(const kvr_agent_params_t *params,
                              kvr_agent_t **out, kvr_error_t *err);
/* Stops the progress thread, closes every link (peers see their requests
 * fail), frees everything. Accepts NULL; cannot fail. */
void kvr_agent_destroy(kvr_agent_t *agent);
/* Detail of the last call that failed on the calling thread ("" if
 * none): thread-local, so threads never see each other's errors. */
const char *kvr_agent_last_error(const kvr_agent_t *agent);

/* Settings both sides must share beyond the layout, defined by the
 * application (space-separated key=value pairs, at most 255 bytes; "" by
 * default): sent in every HELLO and compared on links where both agents
 * hold KV regions, so a mismatch is refused at the handshake naming the
 * first pair that differs (docs/PROTOCOL.md). Before kvr_agent_start. */
kvr_status_t kvr_agent_set_settings(kvr_agent_t *agent, const char *text);

/* Usable CUDA devices (0 without CUDA). */
int kvr_agent_cuda_devices(void);
/* Copies len bytes between host memory and the agent's region memory
 * (CUDA memory of params.cuda_device: cudaMemcpy, synchronous; host
 * memory: memcpy). For filling and checking regions. */
kvr_status_t kvr_agent_copy(kvr_agent_t *agent, void *dst, const void *src,
                            size_t len);

/* ---- regions: before kvr_agent_start, fixed after it ---- */

/* The region is expected from no producer (e.g. an MTP draft layer the
 * prefill model lacks): never announced, planned or waited for. */
#define KVR_AGENT_REGION_CONSUMER_ONLY 0x1u

/* Registers engine memory [base, base + bytes): host memory, or device
 * memory of params.cuda_device when it is >= 0. Size every device
 * allocation that holds regions in multiples of 2 MiB (64 KiB at least):
 * on an H200 scattered pages written through the CUDA IPC mapping of an
 * allocation whose size was not a multiple of 64 KiB ran at 0.69 of the
 * rate (docs/agent.md, where device regions live). */
kvr_status_t kvr_agent_add_region(kvr_agent_t *agent,
                                  const kvr_region_desc_t *desc, void *base,
                                  uint32_t flags);
/* kvrelay allocates and registers the region; its base comes back. Device
 * regions are carved from 2 GiB allocations (a larger region gets its
 * own), 2 MiB apart, and freed when the agent is destroyed. */
kvr_status_t kvr_agent_alloc_region(kvr_agent_t *agent,
                                    const kvr_region_desc_t *desc,
                                    uint32_t flags, void **base);

/* Binds the listening socket (if any), non-head producer stages start
 * joining their head, and the progress thread starts (if asked). */
kvr_status_t kvr_agent_start(kvr_agent_t *agent);
/* The bound (or advertised) "host:port"; "" before start or without a
 * listener. Constant after start. */
const char *kvr_agent_address(const kvr_agent_t *agent);
/* This agent's incarnation (random, drawn at create). */
uint64_t kvr_agent_incarnation(const kvr_agent_t *agent);

/* ---- producer ---- */

typedef struct kvr_agent_send {
    const void *request_id; /* 1..256 bytes */
    size_t request_id_len;
    const uint32_t *src_blocks; /* this stage's full block table, copied */
    size_t num_src_blocks;
    uint64_t num_tokens;
    uint32_t lease_ms; /* 0: params.lease_ms */
    uint32_t groups;   /* consumer groups that will pull (0: 1) */
} kvr_agent_send_t;

/* The request's KV exists on this stage (or will: see send_ready) and may be
 * pulled until the lease ends. Pulls are served from these tables, never
 * from tables a consumer sends. KVR_ERR_EXISTS while the key is live. */
kvr_status_t kvr_agent_send_open(kvr_agent_t *agent,
                                 const kvr_agent_send_t *send);
/* Prefill wrote layers [layer_begin, layer_end). A pull is served once the
 * stage's whole layer range is ready, or, when the consumer streams
 * (kvr_agent_recv_t.stream), one ready layer group at a time in layer
 * order, each as soon as calls like this one covered it. cuda_event (a cudaEvent_t, agents
 * with a CUDA device only, after kvr_agent_start; else KVR_ERR_UNSUPPORTED
 * or KVR_ERR_INVALID): the layers count as ready once the work it
 * recorded as of this call completed, which the agent learns from a gate
 * armed here, on the calling thread, on a stream of its own (no host
 * synchronisation; no copy of any request is queued behind the event).
 * The event may be re-recorded or destroyed after the call
 * (docs/agent.md, CUDA events). */
kvr_status_t kvr_agent_send_ready(kvr_agent_t *agent, const void *request_id,
                                  size_t request_id_len, uint32_t layer_begin,
                                  uint32_t layer_end, void *cuda_event);
/* Stops serving: pulls in progress are cut (their consumers get
 * WRITE_FAILED, ERR_CANCELED) and the request ends in SEND_FAILED. A no-op
 * once its outcome was queued. */
kvr_status_t kvr_agent_send_abort(kvr_agent_t *agent, const void *request_id,
                                  size_t request_id_len);

/* ---- fan-in (docs/agent.md Fan-in) ---- */

/* The producer tp ranks a consumer tp rank pulls from, as a bit mask (bit
 * t: producer tp rank t, which is DCP rank t % W_p), over any request: for
 * each region, the producer ranks kvr_plan_sources names (DCP ranks for
 * token-sharded regions, taken from replica p + W_p * (c % (TP_p / W_p)),
 * tp ranks for head-sharded ones). regions are on the consumer's side
 * (consumer true) or the producer's (then each stands for its consumer
 * twin); STAGING is skipped. A combination docs/design.md §18 does not plan
 * fails with the planner's status; TP sizes above 64 are KVR_ERR_UNSUPPORTED.
 * The agent uses it at start, both sides: a consumer rank waits for exactly
 * these sources, a producer stage for exactly the consumer ranks naming it. */
kvr_status_t kvr_agent_sources(const kvr_layout_t *lay,
                               const kvr_region_desc_t *regions, size_t n,
                               bool consumer, uint32_t consumer_tp,
                               uint64_t *mask, kvr_error_t *err);

/* ---- consumer ---- */

typedef struct kvr_agent_recv {
    const void *producer_id; /* the producer instance's id */
    size_t producer_id_len;
    const char *producer_address; /* "host:port" of its PP head stage */
    const void *request_id;       /* 1..256 bytes */
    size_t request_id_len;
    const uint32_t *dst_blocks; /* destination block table, copied */
    size_t num_dst_blocks;
    uint64_t num_tokens;
    uint64_t num_computed_blocks; /* virtual blocks already here */
    uint32_t deadline_ms;         /* 0: params.deadline_ms */
    bool stream; /* layer-wise: each stage serves its layers one ready
                    group at a time and LAYERS_LOADED reports each group
                    as it lands (LOADED still means every byte); a stage
                    older than protocol 3.1 serves its range whole */
} kvr_agent_recv_t;

/* Loads a request from the producer instance's stages that serve this rank
 * (every pp stage's tp ranks kvr_agent_sources names, those holding any of
 * the stage's layers for us).
 * Links are dialled once per (instance, stage) and reused. */
kvr_status_t kvr_agent_recv(kvr_agent_t *agent, const kvr_agent_recv_t *recv);
/* Fails the load (LOAD_FAILED, ERR_CANCELED) unless its outcome was already
 * queued; RELEASED follows once no source can still write. */
kvr_status_t kvr_agent_recv_abort(kvr_agent_t *agent, const void *producer_id,
                                  size_t producer_id_len,
                                  const void *request_id,
                                  size_t request_id_len);

/* ---- events ---- */

typedef enum kvr_agent_event_kind {
    KVR_AGENT_SENT = 1,          /* producer: every group released it */
    KVR_AGENT_SEND_EXPIRED = 2,  /* producer: lease over, not every group
                                    pulled; sources are free */
    KVR_AGENT_SEND_FAILED = 3,   /* producer: aborted, or a group failed */
    KVR_AGENT_LOADED = 4,        /* consumer: every planned byte from every
                                    expected source is in place */
    KVR_AGENT_LOAD_FAILED = 5,   /* consumer: status and message say why */
    KVR_AGENT_RELEASED = 6,      /* consumer: destination blocks reusable */
    KVR_AGENT_LAYERS_LOADED = 7, /* consumer, recv with stream: layers
                                    [layer_begin, layer_end) are in place
                                    and counted from every source that
                                    serves them (bytes: theirs); each
                                    layer once, before LOADED, never
                                    after LOAD_FAILED */
    KVR_AGENT_NOTIFY_FAILED = 8, /* a kvr_agent_notify could not be sent:
                                    peer and message say to whom and why */
    KVR_AGENT_PEER_REFUSED = 9,  /* a link was refused at its handshake, by
                                    either side: status and message (the
                                    address first) say why; peer is the
                                    instance the peer named in its full
                                    HELLO (LAYOUT, after AUTH, with a key),
                                    empty when it never got that far; bytes
                                    is 1 when the peer is one this agent
                                    talks to at all (without a key: its
                                    HELLO came; with one: its AUTH
                                    verified), 0 for anyone else */
} kvr_agent_event_kind_t;

/* A copy: nothing points into the agent. */
typedef struct kvr_agent_event {
    kvr_agent_event_kind_t kind;
    kvr_wire_id_t producer; /* producer instance id */
    kvr_wire_id_t request;
    kvr_status_t status; /* KVR_OK for SENT, LOADED, RELEASED after
                                 LOADED; else why */
    char message[KVR_ERROR_MSG_MAX];
    uint64_t bytes; /* LOADED: bytes received; SENT: bytes sent;
                                 LAYERS_LOADED: the group's bytes;
                                 NOTIFY_FAILED: the payload's length;
                                 PEER_REFUSED: 1 for a known peer */
    uint32_t layer_begin, layer_end; /* LAYERS_LOADED: half-open */
    kvr_wire_id_t peer;              /* NOTIFY_FAILED: the instance notified;
                                 PEER_REFUSED: the refused peer's */
} kvr_agent_event_t;

const char *kvr_agent_event_name(kvr_agent_event_kind_t kind);

/* Non-blocking: true with *out filled when an event was queued. */
bool kvr_agent_poll(kvr_agent_t *agent, kvr_agent_event_t *out);
/* Readable while events or notifications are queued; never read or close
 * it. */
int kvr_agent_event_fd(const kvr_agent_t *agent);
/* Blocks until an event or notification is queued (KVR_OK) or timeout_us
 * passes (KVR_ERR_TIMEOUT); it takes none (kvr_agent_poll does). Without a
 * progress thread it runs the loop on the calling thread meanwhile, as
 * kvr_agent_progress would, so the answer that completes a load is handled
 * on the thread that waits for it, with no thread to wake in between
 * (while another thread is in kvr_agent_progress it waits on the event fd
 * instead); with one, it waits on kvr_agent_event_fd. While its loads are
 * in flight a driving wait looks for input for up to 120 us, yielding the
 * core between looks, before it sleeps (environment KVR_AGENT_WAIT_SPIN_US,
 * 0 for none). */
kvr_status_t kvr_agent_wait(kvr_agent_t *agent, uint32_t timeout_us);

/* ---- notifications: small messages between agents (routers) ---- */

/* Largest notification payload, bytes. */
#define KVR_AGENT_NOTIFY_MAX 16384u

/* Sends payload (0..KVR_AGENT_NOTIFY_MAX bytes, copied) to the agent of
 * instance peer_id at peer_address ("host:port", its listener), or with
 * peer_address NULL over a link this agent already has to that instance
 * (dialled or accepted: e.g. to answer a notification; with several agents
 * of that instance linked, one of them). Queued like every call: the link
 * is dialled and authenticated if needed, and frames on one link keep
 * their order. KVR_AGENT_NOTIFY_FAILED follows when it cannot be sent: no
 * link to the instance (NULL address), the address unreachable, refused or
 * silent past connect_timeout_ms, or another instance there. Once written
 * to a link, delivery is that of the link (no receipt). */
kvr_status_t kvr_agent_notify(kvr_agent_t *agent, const void *peer_id,
                              size_t peer_id_len, const char *peer_address,
                              const void *payload, size_t len);

/* A notification received: who sent it (the link's authenticated
 * identity) and a copy of its payload. */
typedef struct kvr_agent_notify {
    kvr_wire_id_t sender;        /* the sender's instance id */
    kvr_wire_topo_t sender_topo; /* its pp/tp/dcp ranks and sizes */
    kvr_wire_side_t sender_side; /* producer or consumer, as it said */
    uint64_t sender_incarnation;
    char sender_address[256]; /* the sender's listener, "" if none:
                                     kvr_agent_notify answers it there */
    uint32_t dropped;         /* notifications dropped before this one
                                     because the queue was full */
    size_t len;
    uint8_t payload[KVR_AGENT_NOTIFY_MAX];
} kvr_agent_notify_t;

/* Non-blocking: true with *out filled when a notification was queued.
 * Notifications keep their order per sending agent. The queue holds at
 * most 4096 notifications (or 64 MiB); beyond, new ones are dropped and
 * counted in the next one's `dropped`. */
bool kvr_agent_poll_notify(kvr_agent_t *agent, kvr_agent_notify_t *out);

/* ---- status ---- */

typedef enum kvr_agent_send_state {
    KVR_SEND_NONE = 0,
    KVR_SEND_QUEUED = 1,  /* send_open queued for the progress loop */
    KVR_SEND_OPEN = 2,    /* opened; the stage's layers not all ready */
    KVR_SEND_READY = 3,   /* serving pulls */
    KVR_SEND_SENT = 4,    /* terminal */
    KVR_SEND_EXPIRED = 5, /* terminal */
    KVR_SEND_FAILED = 6,  /* terminal */
} kvr_agent_send_state_t;

typedef enum kvr_agent_recv_state {
    KVR_RECV_NONE = 0,
    KVR_RECV_QUEUED = 1,     /* recv queued for the progress loop */
    KVR_RECV_DIALING = 2,    /* waiting for the serving stages' links */
    KVR_RECV_PULLING = 3,    /* WRITE_REQUESTs out, answers awaited */
    KVR_RECV_QUARANTINE = 4, /* failed; sources may still write */
    KVR_RECV_LOADED = 5,     /* terminal (loaded and released) */
    KVR_RECV_FAILED = 6,     /* terminal (failed and released) */
} kvr_agent_recv_state_t;

const char *kvr_agent_send_state_name(kvr_agent_send_state_t state);
const char *kvr_agent_recv_state_name(kvr_agent_recv_state_t state);

typedef struct kvr_agent_req_status {
    kvr_agent_send_state_t send; /* this agent serving (producer = us) */
    kvr_agent_recv_state_t recv; /* this agent loading from `producer` */
    kvr_status_t status;         /* outcome once terminal */
    char message[KVR_ERROR_MSG_MAX];
} kvr_agent_req_status_t;

/* A request's state as of the progress loop's last step: KVR_ERR_NOT_FOUND
 * when this agent knows no request (producer, request), live or with its
 * last event unpolled. For requests this agent serves, producer is its own
 * instance id. */
kvr_status_t kvr_agent_status(kvr_agent_t *agent, const void *producer_id,
                              size_t producer_id_len, const void *request_id,
                              size_t request_id_len,
                              kvr_agent_req_status_t *out);

/* ---- driving the agent without a progress thread ---- */

/* One turn of the progress loop: handles commands, links and timers and
 * moves at most one bounded slice of data per active pull, returning within
 * about timeout_ms (it waits for input only when there is nothing to do).
 * KVR_ERR_INVALID with a progress thread, or while another thread is in it. */
kvr_status_t kvr_agent_progress(kvr_agent_t *agent, uint32_t timeout_ms);
/* Readable when kvr_agent_progress has work (input, a timer, a command, a
 * pending slice). Poll it, then call progress. Never read or close it. */
int kvr_agent_fd(const kvr_agent_t *agent);

KVR_API_END
#ifdef __cplusplus
}
#endif
#endif
