/* Internals of the agent (include/kvrelay/agent.h, docs/agent.md).
 *
 * Two halves that share one struct:
 * - the call side (agent.c): validates, copies, queues commands under
 *   `lock`, reads events and the status snapshot under `lock`;
 * - the loop side (agent_loop.c, agent_link.c, agent_send.c, agent_recv.c):
 *   everything else, touched only by the thread that holds `turn_lock`
 *   (the progress thread, or a caller of kvr_agent_progress). */
#ifndef KVRELAY_AGENT_INTERNAL_H
#define KVRELAY_AGENT_INTERNAL_H

#include <pthread.h>
#include <stdbool.h>
#include <stdint.h>

#include "kvrelay/agent.h"
#include "kvrelay/base.h"

#include "agent_phases.h"
#include "data.h"
#include "gpu_arena.h"
#include "gpu_path.h"
#include "link.h"
#include "plan_cache.h"

#define KVR_AGENT_MAX_REGIONS 1024u
#define KVR_AGENT_MAX_LINKS 1024u
#define KVR_AGENT_MAX_STAGES 64u /* pp stages of one producer instance */
#define KVR_AGENT_MAX_GROUPS 64u /* consumer groups per producer request */
#define KVR_AGENT_MAX_TP 64u     /* TP ranks of either side (bit masks) */
#define KVR_AGENT_ADDR_MAX 256u
#define KVR_AGENT_SLICE_BYTES (1u << 20)  /* puts posted per pull per slice */
#define KVR_AGENT_TURN_WORK_NS 2000000ull /* slices per turn, at most */
/* Pulls whose kernels run are woken by their host function (the wake
 * eventfd); this only bounds how late a device fault that kept it from
 * running is seen. */
#define KVR_AGENT_GPU_BACKSTOP_NS 50000000ull
/* kvr__agpu_spin: how long after a launch the loop polls its kernels
 * rather than sleeping, and for how many jobs at most */
#define KVR_AGENT_GPU_SPIN_NS 300000ull
#define KVR_AGENT_GPU_SPIN_JOBS 8u
/* gpu-direct pulls launch at once while fewer than two jobs are queued
 * on the agent's stream or their kernels move fewer bytes than this;
 * later ones wait for a completion, then the ranks that pulled one
 * request share one launch (KVR_AGENT_GPU_QUEUE_MB overrides it; 0:
 * always at once) */
#define KVR_AGENT_GPU_QUEUE_BYTES (64ull << 20)
/* A waiting caller's look for input before it sleeps, loads in flight
 * (kvr__loop_wait_turns); environment KVR_AGENT_WAIT_SPIN_US, 0: none */
#define KVR_AGENT_WAIT_SPIN_NS 120000ull
#define KVR_AGENT_CUT_FLUSH_MS                                                 \
    200u                                  /* a pull cut past its deadline: its
                                       flush, at most */
#define KVR_AGENT_TURN_BYTES (8ull << 20) /* and at most these bytes */
#define KVR_AGENT_MAX_SLOTS 16u           /* staging slots granted per stage */
/* While pulls move, a cost probe makes a step at most this often (it
 * yields to them: the default model prices them meanwhile). */
#define KVR_AGENT_PROBE_BUSY_NS 100000000ull

/* ---- small byte-keyed hash map (agent_table.c) ---- */

typedef struct kvr__mapent {
    struct kvr__mapent *next;
    uint64_t hash;
    void *val;
    uint16_t klen;
    uint8_t key[];
} kvr__mapent_t;

typedef struct kvr__map {
    kvr__mapent_t **buckets;
    size_t nbuckets, count;
} kvr__map_t;

kvr_status_t kvr__map_init(kvr__map_t *m, size_t nbuckets);
void kvr__map_free(kvr__map_t *m, void (*free_val)(void *));
void *kvr__map_get(const kvr__map_t *m, const void *key, size_t klen);
kvr_status_t kvr__map_put(kvr__map_t *m, const void *key, size_t klen,
                          void *val);
void *kvr__map_del(kvr__map_t *m, const void *key, size_t klen);

/* A request key: side, producer instance id, request id, flattened. */
#define KVR__SIDE_SEND 1u
#define KVR__SIDE_RECV 2u
typedef struct kvr__key {
    uint16_t len;
    uint8_t b[4 + KVR_WIRE_INSTANCE_MAX + KVR_WIRE_REQ_ID_MAX];
} kvr__key_t;

void kvr__key_make(kvr__key_t *k, uint8_t side, const kvr_wire_id_t *producer,
                   const kvr_wire_id_t *request);

/* ---- regions ---- */

typedef struct kvr__aregion {
    kvr_region_desc_t desc;
    void *base;
    kvr__dmem_t *mem; /* host memory: its registration */
    bool device;      /* CUDA memory (params.cuda_device) */
    bool owned;       /* device memory of kvr_agent_alloc_region: carved
                         from the agent's arena (gpu_arena.h) */
    bool consumer_only;
} kvr__aregion_t;

/* A consumer's region as mapped on a producer: on its data peer (host), or
 * through CUDA IPC (device: gpu-direct). */
typedef struct kvr__amap {
    kvr_region_desc_t desc;
    uint32_t mapping;
    void *dev; /* the IPC mapping, or NULL */
    bool net;  /* CUDA region mapped on the data peer too (`mapping`) */
    uint8_t rkey[KVR_GPU_RKEY_BYTES];
    uint32_t rkey_len;
} kvr__amap_t;

/* ---- links ---- */

typedef enum kvr__alink_kind {
    KVR__LINK_STAGE = 1,  /* consumer -> a producer stage (or its head) */
    KVR__LINK_JOIN = 2,   /* non-head stage -> its PP head */
    KVR__LINK_ACCEPT = 3, /* accepted by our listener */
    KVR__LINK_NOTIFY = 4, /* dialled to send notifications */
} kvr__alink_kind_t;

typedef enum kvr__alink_state {
    KVR__LINK_CONNECTING = 1,
    KVR__LINK_HANDSHAKE = 2,
    KVR__LINK_READY = 3,
    KVR__LINK_CLOSED = 4,
} kvr__alink_state_t;

struct kvr__pdir;

/* A notification waiting for its link to be ready (agent_notify.c). */
typedef struct kvr__pnotify {
    struct kvr__pnotify *next;
    kvr_wire_id_t peer;
    size_t len;
    uint8_t payload[];
} kvr__pnotify_t;

typedef struct {
    uint32_t layer, role, index;
} kvr__twin_t;

typedef struct kvr__alink {
    struct kvr__alink *next, *prev;
    uint32_t serial; /* for logs */
    kvr__alink_kind_t kind;
    kvr__alink_state_t state;
    int fd;                           /* while connecting; then link->fd */
    kvr__link_t *link;                /* framing and auth, once connected */
    char address[KVR_AGENT_ADDR_MAX]; /* dialled address, or the peer's */
    uint64_t deadline_ns;             /* connect plus handshake */
    uint64_t last_used_ns;
    uint32_t users; /* requests and pulls holding it */
    bool epoll_out; /* EPOLLOUT registered */
    bool refused;   /* closed by a refusal (not a loss) */
    bool ever_ready;
    bool unauth;       /* accepted, handshake not done: counted
                                    in num_unauth, not in the link table */
    bool regions_sent; /* consumer: REGIONS went out on it */
    bool need_known;   /* consumer: need holds, for the peer's topology */
    uint64_t need;     /* consumer: kvr__sources_mask of the peer's layers */
    kvr_status_t close_status;
    char close_why[KVR_ERROR_MSG_MAX];
    /* the peer, from its HELLO (its LAYOUT, with a key) */
    kvr_wire_id_t peer_instance;
    uint64_t peer_incarnation;
    kvr_wire_id_t claimed; /* the instance its full HELLO named, even
                                    if refused (empty: never identified) */
    bool kv;               /* both sides have KV regions: layouts
                                    compared, KV messages allowed */
    bool joined;           /* head: a stage's JOIN came on it */
    char peer_address[KVR_AGENT_ADDR_MAX]; /* its listener, from NOTIFY */
    /* notifications: the instance a NOTIFY link was dialled for, and
     * those waiting for the link to be ready */
    kvr_wire_id_t want;
    kvr__pnotify_t *pending, *pending_tail;
    /* producer side of a consumer link: its regions on our data peer */
    kvr__dpeer_t *data;
    kvr__amap_t *maps;
    uint32_t num_maps;
    kvr__twin_t *twins; /* maps by (layer, role, index), sorted: looked
                           up per region of every pull (kvr__twin_index) */
    int staging; /* index in maps of its STAGING region,
                                    or -1 */
    /* CUDA KV (agent_gpu.c): gpu-staged pack buffers (2 slots of CUDA
     * memory, registered) and the link's GPU figures */
    void *gpack;
    kvr__dmem_t *gpack_mem;
    kvr__dgpu_t gfig;
    bool gdirect; /* a priced pull chose gpu-direct through CUDA IPC: later
                     ones take it unpriced, without pair plans */
    uint64_t probe_ns; /* when its cost probe started (agent_staged.c) */
    bool regions_ready;
    /* consumer side: the producer instance it belongs to */
    struct kvr__pdir *dir;
} kvr__alink_t;

/* Consumer: what we know of one producer instance. */
typedef struct kvr__pdir {
    struct kvr__pdir *next;
    kvr_wire_id_t instance;
    char bootstrap[KVR_AGENT_ADDR_MAX];
    kvr__alink_t *head;
    bool have_stages;
    uint32_t pp_size, tp_size;
    kvr_wire_stage_t *stages; /* from the last STAGES */
    uint32_t num_stages;
    /* per (pp, tp) stage, pp * tp_size + tp: our link to it when it is one
     * of our sources (kvr__sources_start), else NULL */
    kvr__alink_t **serving;
    uint32_t num_serving;
    kvr_status_t error;    /* the last fatal failure: the head
                                    unreachable, or a refusal */
    uint64_t error_ns;     /* when: requests older than it fail */
    uint64_t next_dial_ns; /* a stage dial failed: retry after */
    char error_msg[KVR_ERROR_MSG_MAX];
} kvr__pdir_t;

/* ---- commands (call side -> loop) ---- */

typedef enum kvr__cmd_kind {
    KVR__CMD_SEND_OPEN = 1,
    KVR__CMD_SEND_READY,
    KVR__CMD_SEND_ABORT,
    KVR__CMD_RECV,
    KVR__CMD_RECV_ABORT,
    KVR__CMD_NOTIFY,
} kvr__cmd_kind_t;

/* A CUDA event of the engine's handed to send_ready, as the loop sees it
 * (agent_gates.c): an event of the agent's armed on its gate stream behind
 * the engine's, and the layers of request `request` (its `serial`) that
 * become ready when it completes. */
typedef struct kvr__gate {
    struct kvr__gate *next;
    struct kvr__gate *watch_next; /* in the watcher's queue */
    uint32_t holds; /* under gate_lock: the loop's, and the watcher's; it
                       is free (and may be armed again) at none */
    void *event;
    kvr_wire_id_t request;
    uint64_t serial;
    uint32_t begin, end;
} kvr__gate_t;

typedef struct kvr__cmd {
    struct kvr__cmd *next;
    kvr__cmd_kind_t kind;
    kvr_wire_id_t producer, request;
    uint32_t *blocks;
    size_t num_blocks;
    uint64_t num_tokens, num_computed;
    uint32_t ms; /* lease or deadline */
    uint32_t groups;
    uint32_t layer_begin, layer_end;
    kvr__gate_t *gate; /* SEND_READY with a CUDA event: armed, the loop's */
    bool stream; /* RECV: layer-wise */
    char address[KVR_AGENT_ADDR_MAX];
    uint8_t *payload; /* NOTIFY */
    size_t payload_len;
} kvr__cmd_t;

/* ---- producer requests (agent_send.c) ---- */

typedef enum kvr__pull_state {
    KVR__PULL_HELD = 1, /* request unknown or its layers not ready */
    KVR__PULL_MOVING,   /* puts going out in slices */
    KVR__PULL_ANSWERED, /* WRITE_DONE or WRITE_FAILED sent */
    KVR__PULL_RELEASED, /* the consumer released it (or was lost) */
} kvr__pull_state_t;

typedef struct kvr__pull {
    struct kvr__pull *next;      /* in its request, or the orphan list */
    struct kvr__pull *work_next; /* in the active list while MOVING */
    kvr__pull_state_t state;
    kvr__alink_t *link;
    kvr_wire_id_t request;
    uint64_t nonce;
    uint32_t consumer_tp, dcp_rank;
    uint32_t group; /* index into the request's groups */
    uint32_t *dst;
    size_t ndst;
    uint64_t num_tokens, num_computed;
    uint64_t arrived_ns, deadline_ns, release_by_ns;
    kvr__pentry_t *plans; /* from the agent's plan cache */
    kvr__dseg_t *segs;
    size_t nsegs;
    kvr__dcursor_t cur;
    uint64_t bytes;
    /* staged executor (agent_staged.c) */
    kvr_wire_exec_t executor; /* what the consumer asked */
    uint32_t *slots;          /* granted staging slots */
    uint32_t nslots;
    bool staged;            /* chosen: chunks through the slots */
    bool waiting_ack;       /* every slot holds an unacked chunk */
    uint64_t sent_off;      /* stream bytes sent as chunks */
    uint32_t chunks, acked; /* chunks sent; acked in order */
    /* gpu-direct (agent_gpu.c) */
    bool gpu;              /* chosen: scatter kernels via CUDA IPC */
    kvr__gpu_job_t *job;   /* launched, not yet seen complete */
    kvr__gpu_tables_t *tables; /* its relayout tables, made as it starts */
    bool job_done;         /* its event fired: to answer this turn */
    uint64_t ph_launch_ns; /* KVR_AGENT_PHASES: its job launched (lead) */
    uint64_t job_bytes;    /* leading a job: the bytes it launched */
    bool planless;         /* gpu-direct without pair plans: its segs'
                              bytes come from its relayout tables */
    kvr__gpu_runs_t *runs; /* its plan's run table (pair plans; gpu-staged) */
    bool gstaged;          /* staged with GPU packing (CUDA KV) */
    uint64_t packed_off;   /* gpu-staged: stream bytes packed (launched) */
    uint32_t synced_group; /* CUDA direct puts: group_end whose engine
                              events were waited for */
    /* layer-wise streaming (agent_stream.c): the layers served and the
     * group moving now; a pull that is not streamed moves one group, all
     * of it, once every layer is ready */
    bool stream;                     /* STREAM_REQUEST: LAYERS_DONE per group */
    bool wait_layers;                /* its next group is not ready: off the
                                        active list until send_ready */
    uint32_t layer_lo, layer_hi;     /* the layers it serves */
    uint32_t group_begin, group_end; /* the group moving now */
    size_t group_seg0, group_segs;   /* the group's segs */
    uint64_t group_off0, group_off;  /* its stream bytes */
    uint32_t group_chunk0;           /* chunks sent before it */
    bool ok;                         /* answered WRITE_DONE */
    kvr_status_t status;             /* the answer, to repeat it */
    char text[KVR_WIRE_TEXT_MAX + 1];
} kvr__pull_t;

typedef struct kvr__group {
    kvr_wire_id_t instance;
    uint64_t released;   /* consumer tp ranks that released */
    uint64_t give_up_ns; /* its pulls' latest deadline plus grace: ranks
                            that never pulled by then are not coming */
    bool done, failed;
} kvr__group_t;

typedef struct kvr__preq {
    struct kvr__preq *next, *prev;
    kvr_agent_send_state_t state;
    kvr_wire_id_t id;
    uint32_t *src;
    size_t nsrc;
    uint64_t num_tokens;
    uint64_t lease_end_ns;
    bool lease_seen; /* a tick saw the lease over */
    uint32_t groups_expected;
    kvr__group_t groups[KVR_AGENT_MAX_GROUPS];
    uint32_t num_groups;
    uint64_t serial;      /* a->preq_serial at open: gates tell reuses of
                             its id apart */
    uint8_t *layer_ready; /* per layer of this stage's range */
    uint32_t layers_missing;
    kvr__pull_t *pulls;
    uint64_t bytes;
    kvr_status_t status;
    char message[KVR_ERROR_MSG_MAX];
} kvr__preq_t;

/* Inputs of the producer request state machine. */
typedef enum kvr__send_in {
    KVR__SIN_OPEN = 1, /* send_open processed */
    KVR__SIN_READY,    /* send_ready covered more layers */
    KVR__SIN_PULL,     /* a pull attached (WRITE_REQUEST) */
    KVR__SIN_ANSWERED, /* a pull was answered (done or failed) */
    KVR__SIN_RELEASE,  /* a pull was released (RELEASE, loss, timeout) */
    KVR__SIN_ABORT,    /* send_abort (st OK), or a gate failed (st, the
                          request's message) */
    KVR__SIN_TICK,     /* timers: lease, pull deadlines */
} kvr__send_in_t;

/* ---- consumer requests (agent_recv.c) ---- */

typedef struct kvr__cstage {
    kvr__alink_t *link;
    uint32_t pp_rank, tp_rank;
    bool sent, answered, done, released;
    uint64_t expect_bytes;
    /* this stage's part of our regions, planned as the producer plans it:
     * byte counts, and the stream order staged chunks unpack in */
    kvr__pentry_t *plans; /* from the agent's plan cache */
    kvr__dseg_t *segs;
    size_t nsegs;
    uint64_t unpacked;      /* staged stream bytes unpacked */
    kvr__gpu_runs_t *gruns; /* CUDA KV: the unpack table (gpu-staged) */
    uint32_t slots[KVR_AGENT_MAX_SLOTS]; /* staging slots granted */
    uint32_t nslots;
    bool waiting_slots; /* STAGED: not sent until slots free up */
    /* layer-wise streaming (agent_stream.c) */
    bool stream;                 /* asked with STREAM_REQUEST (3.1 stage) */
    uint32_t layer_lo, layer_hi; /* the layers asked of it (planned) */
    uint32_t layer_next;         /* layers below it are counted */
    uint64_t counted;            /* bytes of the groups counted */
} kvr__cstage_t;

typedef struct kvr__creq {
    struct kvr__creq *next, *prev;
    kvr_agent_recv_state_t state;
    kvr_wire_id_t producer, id;
    kvr__pdir_t *dir;
    uint32_t *dst;
    size_t ndst;
    uint64_t num_tokens, num_computed;
    uint64_t nonce;
    bool stream; /* recv asked layer-wise: LAYERS_LOADED events */
    uint64_t started_ns, deadline_ns, hard_ns;
    bool cut_done; /* silent stages were cut at hard_ns */
    kvr__cstage_t stages[KVR_AGENT_MAX_STAGES];
    uint32_t num_stages;
    uint64_t bytes;
    kvr_status_t status;
    char message[KVR_ERROR_MSG_MAX];
} kvr__creq_t;

typedef enum kvr__recv_in {
    KVR__RIN_START = 1, /* recv processed */
    KVR__RIN_DIR,       /* the producer's links or directory changed */
    KVR__RIN_DONE,      /* a stage's WRITE_DONE (with its bytes) */
    KVR__RIN_FAILED,    /* a stage's WRITE_FAILED */
    KVR__RIN_LOST,      /* a stage's link closed */
    KVR__RIN_ABORT,     /* recv_abort */
    KVR__RIN_TICK,      /* deadline, deadline plus grace */
    KVR__RIN_CHUNK,     /* a stage's CHUNK_DONE (staged executor) */
    KVR__RIN_SLOTS,     /* staging slots were freed */
    KVR__RIN_LAYERS,    /* a stage's LAYERS_DONE (streaming) */
} kvr__recv_in_t;

typedef struct kvr__recv_input {
    kvr__recv_in_t kind;
    kvr__cstage_t *stage;                /* DONE, FAILED, LOST, CHUNK */
    uint64_t bytes;                      /* DONE */
    uint32_t chunks;                     /* DONE */
    kvr_status_t status;                 /* FAILED, LOST */
    const char *text;                    /* FAILED, LOST */
    const kvr_msg_chunk_done_t *chunk;   /* CHUNK */
    const kvr_msg_layers_done_t *layers; /* LAYERS */
} kvr__recv_input_t;

/* ---- the agent ---- */

/* Status snapshot entry (call side reads, loop writes; under lock). */
typedef struct kvr__snap {
    int state;
    bool final_queued;
    kvr_status_t status;
    char message[KVR_ERROR_MSG_MAX];
} kvr__snap_t;

/* A received notification, queued for kvr_agent_poll_notify. */
typedef struct kvr__notify_node {
    struct kvr__notify_node *next;
    kvr_wire_id_t sender;
    kvr_wire_topo_t topo;
    kvr_wire_side_t side;
    uint64_t incarnation;
    char address[KVR_AGENT_ADDR_MAX];
    uint32_t dropped; /* dropped (queue full) before this one */
    size_t len;
    uint8_t payload[];
} kvr__notify_node_t;

#define KVR_AGENT_NOTIFY_QUEUE 4096u             /* notifications queued */
#define KVR_AGENT_NOTIFY_QUEUE_BYTES (64u << 20) /* and their bytes */

typedef struct kvr__event_node {
    struct kvr__event_node *next;
    kvr_agent_event_t ev;
    bool final;
    kvr__key_t key;
} kvr__event_node_t;

/* Control-frame fault injection for tests: the nth frame of `type` this
 * agent sends is dropped, sent twice or altered after its tag was made
 * (0: off). */
typedef enum kvr__fault_mode {
    KVR__FAULT_DROP = 0,
    KVR__FAULT_DUPLICATE = 1,
    KVR__FAULT_TAMPER = 2,
} kvr__fault_mode_t;

typedef struct kvr__frame_fault {
    kvr_msg_type_t type;
    uint32_t nth;
    kvr__fault_mode_t mode;
    uint32_t seen;
} kvr__frame_fault_t;

struct kvr_agent {
    kvr_agent_params_t p;
    kvr__pcache_t *pcache; /* plans by key (plan_cache.h), made on first use */
    kvr_wire_id_t instance;
    uint64_t incarnation;
    uint64_t nonces[32]; /* random write nonces drawn 32 at a time (one
                            getrandom), used under the turn lock */
    uint32_t nonces_left;
    uint8_t key[KVR_WIRE_KEY_BYTES];
    bool has_key, started;
    char listen_spec[KVR_AGENT_ADDR_MAX];
    char advertise_spec[KVR_AGENT_ADDR_MAX];
    char bootstrap_spec[KVR_AGENT_ADDR_MAX];
    char address[KVR_AGENT_ADDR_MAX];
    char settings[KVR_WIRE_TEXT_MAX + 1]; /* sent in every HELLO */

    /* call side, under lock */
    pthread_mutex_t lock;
    kvr__cmd_t *inbox_head, *inbox_tail;
    kvr__event_node_t *ev_head, *ev_tail;
    kvr__notify_node_t *nt_head, *nt_tail;
    uint64_t signal_owed; /* event_fd writes made or coming, not yet read */
    uint32_t nt_count, nt_dropped;
    size_t nt_bytes;
    kvr__map_t snap;
    uint32_t live[3]; /* by side: snapshot entries */
    int wake_fd;      /* eventfd: commands or work pending */
    int event_fd;     /* eventfd: readable while events queued */

    /* the loop */
    pthread_mutex_t turn_lock;
    pthread_t thread;
    bool thread_running;
    volatile int stop;
    int epoll_fd, timer_fd, listen_fd;
    int local_fd; /* listen_fd's same-host twin (kvr__local_listen) or -1 */
    uint64_t timer_at; /* timer_fd is set to this (when timer_armed) */
    uint64_t thread_wake; /* the progress thread's wait ends by then: its
                             own timers are its wait's timeout, not
                             timer_fd (set under turn_lock) */
    bool corking; /* in kvr__send_work: answers wait for its end */
    bool corked;  /* a link holds such answers (kvr__alink_uncork_all) */
    bool timer_armed;
    kvr__data_t *data;
    kvr__aregion_t regions[KVR_AGENT_MAX_REGIONS];
    uint32_t num_regions;
    /* the regions that move, by (layer, role): the order both sides plan
     * and stream in; set at start */
    uint32_t order[KVR_AGENT_MAX_REGIONS];
    uint32_t num_order;
    int staging;        /* consumer: its STAGING region, or -1 */
    void *stream;       /* cuda_device >= 0: the agent's stream */
    void *nstream;      /* and its host functions' (kvr__gpu_job_notify) */
    void *gstream;      /* gates on the engine's events (agent_gates.c) */
    pthread_mutex_t gate_lock;  /* the free gates and arming on gstream */
    kvr__gate_t *gate_free;     /* under gate_lock */
    kvr__gate_t *gate_head, *gate_tail; /* armed, waiting: the loop's */
    /* KVR_AGENT_GATE_WATCH=spin (docs/agent.md, CUDA events): a thread
     * polls the armed gates in turn and wakes the loop, instead of a host
     * function each */
    bool gate_watch;
    pthread_t watch_thread;
    bool watch_running, watch_stop;      /* under gate_lock */
    pthread_cond_t watch_cond;
    kvr__gate_t *watch_head, *watch_tail; /* armed, not yet waited for */
    uint64_t preq_serial;
    struct kvr_gpu_pool *gpool; /* its relayout and run tables' memory */
    kvr__gpu_arena_t arena; /* kvr_agent_alloc_region's device memory */
    /* agent_gpu.c: a launch's (and a pull's tables') region pairs and
     * slots, grown as needed and reused by every pull */
    struct {
        kvr_region_pair_t *pairs;
        const void **src;
        void **dst;
        uint32_t *ranks;
        uint32_t *req; /* a slot's request in the launch */
        size_t cap;
    } gslots;
    uint64_t gpu_spin_until; /* kvr__agpu_spin watches kernels till then */
    kvr__phases_t ph;        /* KVR_AGENT_PHASES: time per phase */
    uint64_t gpu_queue_cap;  /* KVR_AGENT_GPU_QUEUE_BYTES, or the env's */
    uint32_t gpu_merge;      /* requests a launch may carry (the env's) */
    uint64_t wait_spin_ns;   /* KVR_AGENT_WAIT_SPIN_NS, or the env's */
    uint8_t *slot_busy; /* its slots granted to a stage */
    bool slots_freed;   /* waiting stages may be sent now */
    kvr__alink_t *links;
    uint32_t num_links, next_serial;
    uint32_t num_unauth; /* links with unauth set (closed or not) */
    kvr__pdir_t *dirs;
    kvr__map_t preq_map, creq_map;
    kvr__preq_t *preqs;
    /* oldest first: staging slots go to requests in the order they were
     * asked for (docs/agent.md Executors) */
    kvr__creq_t *creqs, *creqs_tail;
    kvr__pull_t *orphans;
    kvr__pull_t *active;           /* MOVING pulls, round robin */
    kvr_wire_stage_t *stage_table; /* head: pp_size * tp_size entries */
    /* fan-in (agent_sources.c), fixed at start */
    kvr_axis_t axis;        /* the ranks our regions are sharded over */
    uint64_t sources;       /* consumer: producer tp ranks we pull from */
    uint64_t serves;        /* producer: consumer tp ranks we serve */
    uint32_t served;        /* producer: how many */
    uint64_t join_retry_ns; /* non-head stage: next dial of the head */
    kvr__alink_t *join_link;
    kvr__frame_fault_t fault;
    bool speaks_3_0;             /* tests: HELLO says protocol 3.0 and stream
                        messages are refused, as by a peer from before
                        streaming */
    uint64_t moved_turn_max;     /* tests: most bytes put in one turn */
    uint64_t moving_turns;       /* tests: turns that put bytes */
    uint64_t planless_pulls;     /* tests: gpu-direct pulls served without
                                    pair plans (kvr__agpu_planless) */
    uint64_t chunks_moved;       /* tests: staged chunks sent (producer)
                                     or unpacked (consumer) */
    /* consumer links whose cost probe is under way, as the last
     * kvr__probe_work counted, and when one last made a step
     * (agent_staged.c) */
    uint32_t probing;
    uint64_t probe_step_ns;
    char log[KVR_ERROR_MSG_MAX]; /* the loop's last line, when debug */
    bool debug;                  /* KVR_AGENT_DEBUG set: lines to stderr */
    uint64_t inline_turns; /* recvs started by callers (atomic, run_inline) */
    uint32_t refusals;           /* tests: links closed by a refusal */
    kvr_status_t refusal_status; /* the last one's status and reason */
    char refusal_why[KVR_ERROR_MSG_MAX];
};

/* agent.c: the loop's side of the shared state */
void kvr__agent_event(kvr_agent_t *a, kvr_agent_event_kind_t kind,
                      const kvr_wire_id_t *producer,
                      const kvr_wire_id_t *request, kvr_status_t st,
                      const char *msg, uint64_t bytes);
/* LAYERS_LOADED for layers [begin, end) of a streamed load. */
void kvr__agent_layers_loaded(kvr_agent_t *a, const kvr_wire_id_t *producer,
                              const kvr_wire_id_t *request, uint32_t begin,
                              uint32_t end, uint64_t bytes);
/* PEER_REFUSED: a link refused before it was ready (either side). */
void kvr__agent_peer_refused(kvr_agent_t *a, const kvr_wire_id_t *peer,
                             bool known, kvr_status_t st, const char *msg);
void kvr__agent_notify_failed(kvr_agent_t *a, const kvr_wire_id_t *peer,
                              kvr_status_t st, const char *msg, size_t len);
/* Queues a received notification (node allocated by the caller, handed
 * over; dropped and counted when the queue is full). */
void kvr__agent_notify_in(kvr_agent_t *a, kvr__notify_node_t *n);
void kvr__agent_snap(kvr_agent_t *a, uint8_t side,
                     const kvr_wire_id_t *producer,
                     const kvr_wire_id_t *request, int state, kvr_status_t st,
                     const char *msg);
void kvr__agent_wake(kvr_agent_t *a);
kvr__cmd_t *kvr__agent_take_commands(kvr_agent_t *a);
void kvr__cmd_free(kvr__cmd_t *c);
void kvr__agent_log(kvr_agent_t *a, const char *fmt, ...)
#if defined(__GNUC__)
    __attribute__((format(printf, 2, 3)))
#endif
    ;

/* agent_loop.c */
kvr_status_t kvr__loop_init(kvr_agent_t *a, kvr_error_t *err);
/* Binds the listener; the head's stage table. */
kvr_status_t kvr__loop_start(kvr_agent_t *a, kvr_error_t *err);
void kvr__loop_fini(kvr_agent_t *a);
void kvr__loop_turn(kvr_agent_t *a, uint32_t timeout_ms);
/* The progress thread's turn: it waits without turn_lock (a consumer's
 * recv may start its request meanwhile: run_inline in agent.c), then takes
 * it for the turn; what woke it is used unless such a call ran meanwhile. */
void kvr__loop_thread_turn(kvr_agent_t *a);
/* kvr_agent_wait's turns on the calling thread (no progress thread), under
 * turn_lock, until has_event(a) or `until` (ns). */
void kvr__loop_wait_turns(kvr_agent_t *a, uint64_t until,
                          bool (*has_event)(kvr_agent_t *));
/* After a command run on a caller's thread (agent.c, run_inline): links
 * with bytes queued are watched for room, and the timer fires by
 * timer_by_ns at the latest (the next turn sets it exactly). */
void kvr__loop_after_inline(kvr_agent_t *a, uint64_t timer_by_ns);
kvr_status_t kvr__loop_watch(kvr_agent_t *a, int fd, void *tag, bool out);
void kvr__loop_unwatch(kvr_agent_t *a, int fd);

/* agent_link.c */
kvr_status_t kvr__alink_dial(kvr_agent_t *a, const char *address,
                             kvr__alink_kind_t kind, kvr__alink_t **out,
                             kvr_error_t *err);
void kvr__alink_accept(kvr_agent_t *a, int listen_fd);
void kvr__alink_on_io(kvr_agent_t *a, kvr__alink_t *l, uint32_t events);
/* Tests and fuzzing: m handled as if it had arrived on the agent's first
 * ready link of this kind; false when there is none. Only for an agent
 * without a progress thread, between kvr_agent_progress calls. */
bool kvr__alink_inject(kvr_agent_t *a, kvr__alink_kind_t kind,
                       const kvr_msg_t *m);
void kvr__alink_close(kvr_agent_t *a, kvr__alink_t *l, kvr_status_t why,
                      const char *fmt, ...)
#if defined(__GNUC__)
    __attribute__((format(printf, 4, 5)))
#endif
    ;
kvr_status_t kvr__alink_send(kvr_agent_t *a, kvr__alink_t *l,
                             const kvr_msg_t *msg);
/* As kvr__alink_send, but the frame waits in the link's buffer until
 * kvr__alink_uncork_all (the end of kvr__send_work) writes every such link. */
kvr_status_t kvr__alink_send_corked(kvr_agent_t *a, kvr__alink_t *l,
                                    const kvr_msg_t *msg);
void kvr__alink_uncork_all(kvr_agent_t *a);
void kvr__alink_tick(kvr_agent_t *a, uint64_t now, uint64_t *next);
void kvr__alink_reap(kvr_agent_t *a);
void kvr__alink_free_all(kvr_agent_t *a);
/* Consumer: the directory entry of a producer instance (made on demand),
 * and asking it to dial whatever the waiting requests still need. */
kvr__pdir_t *kvr__pdir_get(kvr_agent_t *a, const kvr_wire_id_t *instance,
                           const char *bootstrap);
void kvr__pdir_kick(kvr_agent_t *a, kvr__pdir_t *d);
bool kvr__pdir_ready(const kvr_agent_t *a, const kvr__pdir_t *d);
/* A directory for instance exists and kvr__pdir_ready holds. */
bool kvr__pdir_ready_for(const kvr_agent_t *a, const kvr_wire_id_t *instance);
void kvr__pdir_free_all(kvr_agent_t *a);
/* Head: our stage table changed or a consumer link became ready. */
void kvr__stages_send(kvr_agent_t *a, kvr__alink_t *only);
void kvr__join_tick(kvr_agent_t *a, uint64_t now, uint64_t *next);
/* agent_dir.c: what a link does once it is up, and when it is gone */
void kvr__link_ready_stage(kvr_agent_t *a, kvr__alink_t *l);
void kvr__link_ready_accept(kvr_agent_t *a, kvr__alink_t *l);
void kvr__link_ready_join(kvr_agent_t *a, kvr__alink_t *l);
void kvr__link_on_regions(kvr_agent_t *a, kvr__alink_t *l,
                          const kvr_msg_regions_t *m);
/* Producer: refuses a consumer's REGIONS (now, or when its cost probe
 * failed): BYE with st and why, then the link closes. */
void kvr__regions_refuse(kvr_agent_t *a, kvr__alink_t *l, kvr_status_t st,
                         const char *why);
void kvr__link_on_join(kvr_agent_t *a, kvr__alink_t *l,
                       const kvr_msg_join_t *m);
void kvr__link_on_stages(kvr_agent_t *a, kvr__alink_t *l,
                         const kvr_msg_stages_t *m);
void kvr__link_lost_dir(kvr_agent_t *a, kvr__alink_t *l);
void kvr__link_lost_stage(kvr_agent_t *a, kvr__alink_t *l);
/* Index of l's consumer region twinned with d (role, layer), or -1. */
int kvr__twin_index(const kvr__alink_t *l, const kvr_region_desc_t *d);

/* agent_sources.c: fan-in (docs/agent.md Fan-in) */
/* The region of the other side (to the consumer's, or the producer's). */
kvr_region_desc_t kvr__twin_desc(const kvr_layout_t *lay,
                                 const kvr_region_desc_t *d, bool to_consumer);
/* Producer tp ranks consumer tp rank c pulls our moving regions of layers
 * [lo, hi) from (a bit mask). */
kvr_status_t kvr__sources_mask(const kvr_agent_t *a, uint32_t lo, uint32_t hi,
                               uint32_t consumer_tp, uint64_t *mask,
                               kvr_error_t *err);
/* At start: one axis, the combination planned, sources / serves set. */
kvr_status_t kvr__sources_start(kvr_agent_t *a, kvr_error_t *err);
/* At create: DCP rank == tp rank % W (consumer) or % W_p (producer). */
kvr_status_t kvr__sources_check_topo(const kvr_agent_params_t *p,
                                     kvr_error_t *err);

/* agent_gates.c (docs/agent.md, CUDA events). Any thread: an armed gate
 * (from the free list, or made) behind engine_event. */
kvr_status_t kvr__gate_arm(kvr_agent_t *a, void *engine_event,
                           kvr__gate_t **out, kvr_error_t *err);
/* The loop: g waits for r's layers [begin, end) (r NULL: the request
 * ended; g only waits to be reused). */
void kvr__gate_hold(kvr_agent_t *a, kvr__gate_t *g, const kvr__preq_t *r,
                    uint32_t begin, uint32_t end);
/* The loop, each turn: gates that completed make their layers ready. */
void kvr__gates_poll(kvr_agent_t *a);
/* Any thread: the loop's hold of g dropped; at the last hold it goes back
 * to the free list (armed or not: its next arming records after this one
 * on the same stream). The watcher holds a gate until it waited for it:
 * armed again sooner, its wait would last until the next arming's work
 * completed, and every later gate's wake with it. */
void kvr__gate_recycle(kvr_agent_t *a, kvr__gate_t *g);
/* At start (KVR_AGENT_GATE_WATCH) and at destroy, before gates_free. */
kvr_status_t kvr__gates_watch_start(kvr_agent_t *a, kvr_error_t *err);
void kvr__gates_watch_stop(kvr_agent_t *a);
/* At destroy, once gstream is idle: every gate's event freed. */
void kvr__gates_free(kvr_agent_t *a);
void kvr__gate_drop(kvr__gate_t *g);

/* agent_send.c */
void kvr__send_command(kvr_agent_t *a, const kvr__cmd_t *c);
/* Gate g of a live request opened: its layers are ready; st != KVR_OK:
 * waiting failed (msg), and so does the request. */
void kvr__send_gate_opened(kvr_agent_t *a, const kvr__gate_t *g,
                           kvr_status_t st, const char *msg);
void kvr__send_msg(kvr_agent_t *a, kvr__alink_t *l, const kvr_msg_t *m);
void kvr__send_link_lost(kvr_agent_t *a, kvr__alink_t *l);
void kvr__send_tick(kvr_agent_t *a, uint64_t now, uint64_t *next);
/* Moves one slice of every MOVING pull, round robin, until end_ns. */
void kvr__send_work(kvr_agent_t *a, uint64_t end_ns);
void kvr__send_free_all(kvr_agent_t *a);

/* agent_recv.c */
void kvr__recv_command(kvr_agent_t *a, kvr__cmd_t *c);
void kvr__recv_msg(kvr_agent_t *a, kvr__alink_t *l, const kvr_msg_t *m);
void kvr__recv_link_lost(kvr_agent_t *a, kvr__alink_t *l);
void kvr__recv_dir_changed(kvr_agent_t *a, kvr__pdir_t *d);
void kvr__recv_tick(kvr_agent_t *a, uint64_t now, uint64_t *next);
void kvr__recv_free_all(kvr_agent_t *a);

/* agent_notify.c */
void kvr__notify_command(kvr_agent_t *a, kvr__cmd_t *c);
void kvr__notify_msg(kvr_agent_t *a, kvr__alink_t *l,
                     const kvr_msg_notify_t *m);
/* A link became ready: a NOTIFY link checks its peer, then every link
 * sends what waited for it. */
void kvr__notify_link_ready(kvr_agent_t *a, kvr__alink_t *l);
/* A link closed: what still waited on it fails (NOTIFY_FAILED). */
void kvr__notify_link_lost(kvr_agent_t *a, kvr__alink_t *l);
/* Whom a link is expected to reach before its handshake says (the
 * directory's instance, a NOTIFY link's), or NULL. */
const kvr_wire_id_t *kvr__alink_expected(const kvr_agent_t *a,
                                         const kvr__alink_t *l);

/* agent_staged.c: the staged executor (docs/agent.md Executors) */
/* Consumer: grants slots to stage s of r (up to its share), or none. */
void kvr__staged_grant(kvr_agent_t *a, const kvr__creq_t *r, kvr__cstage_t *s);
void kvr__staged_free(kvr_agent_t *a, kvr__cstage_t *s);
/* Consumer: checks a CHUNK_DONE against stage s, unpacks it from the slot
 * into our pages and acks it; an error names what was wrong. */
kvr_status_t kvr__staged_unpack(kvr_agent_t *a, kvr__cstage_t *s,
                                const kvr_msg_chunk_done_t *m,
                                kvr_error_t *err);
/* Producer: a consumer's REGIONS named a STAGING region: map its probe
 * slot and, with the AUTO executor, measure the cost model. */
kvr_status_t kvr__staged_link(kvr_agent_t *a, kvr__alink_t *l,
                              const kvr_wire_region_t *staging,
                              kvr_error_t *err);
/* Producer: starts link l's cost probe into the mapping `scratch` (one
 * slot of slot_bytes; puts from put_src, or NULL: a host buffer). The
 * loop runs it in steps between turns (kvr__probe_work); until it is
 * measured, pulls on l are priced with the default model. */
kvr_status_t kvr__probe_start(kvr_agent_t *a, kvr__alink_t *l, uint32_t scratch,
                              uint64_t slot_bytes, const kvr__dmem_t *put_src,
                              kvr_error_t *err);
/* The loop, once a turn: a step (until until_ns, at least one unit) of
 * the oldest cost probe under way whose link has no pull moving, when no
 * pull moves or none made a step for KVR_AGENT_PROBE_BUSY_NS; a failed
 * probe refuses its link. true while such a probe is left and no pull
 * moves (the loop then turns again at once). */
bool kvr__probe_work(kvr_agent_t *a, uint64_t until_ns);
/* Producer: direct or staged for pull p (its plan made). */
kvr_status_t kvr__staged_choose(kvr_agent_t *a, kvr__pull_t *p,
                                kvr_error_t *err);
/* Producer: chunks of a staged pull while its window allows; *done once
 * the last chunk went out. */
/* Producer: CHUNK_DONE for the pull's current chunk (host or GPU staging):
 * `len` bytes at the pull's sent offset are in consumer slot `slot`. */
kvr_status_t kvr__staged_chunk_done(kvr_agent_t *a, kvr__pull_t *p,
                                    uint32_t slot, uint64_t len);
kvr_status_t kvr__staged_slice(kvr_agent_t *a, kvr__pull_t *p, uint64_t *moved,
                               bool *done, kvr_error_t *err);
/* Is the region one that moves (neither STAGING nor consumer-only)? */
bool kvr__region_moves(const kvr__aregion_t *r);

/* agent_gpu.c: gpu-direct, for agents whose KV is in CUDA memory on one
 * host (docs/agent.md gpu-direct) */
/* Consumer: the region's IPC description for REGIONS, then its transport
 * key when it is registered with one. */
kvr_status_t kvr__agpu_export(const kvr_agent_t *a, const kvr__aregion_t *g,
                              kvr_wire_region_t *r, uint8_t *key,
                              kvr_error_t *err);
/* Producer: maps a consumer's CUDA region (the memory must match ours):
 * through CUDA IPC (unless the network path is forced) and on the link's
 * data peer when the consumer sent a transport key; one of them must
 * work. */
kvr_status_t kvr__agpu_map(kvr_agent_t *a, kvr__alink_t *l,
                           const kvr_wire_region_t *r, kvr__amap_t *m,
                           kvr_error_t *err);
/* Producer: the consumer's CUDA STAGING region (mapped as sm): pack
 * buffers and, with the AUTO executor, the link's measured figures. */
kvr_status_t kvr__agpu_link(kvr_agent_t *a, kvr__alink_t *l,
                            const kvr_wire_region_t *staging,
                            const kvr__amap_t *sm, kvr_error_t *err);
void kvr__agpu_link_free(kvr_agent_t *a, kvr__alink_t *l);
/* Producer: gpu-direct, gpu-staged or direct puts for a CUDA pull. */
kvr_status_t kvr__agpu_choose(kvr_agent_t *a, kvr__pull_t *p, kvr_error_t *err);
/* Producer: whether pull p (its segs not yet planned) goes gpu-direct
 * without pair plans or pricing: the relayout kernels place tokens from
 * its tables alone, CUDA IPC reaches every twin, and gpu-direct was asked
 * or an earlier pull's pricing on the link chose it (docs/gpu.md). */
bool kvr__agpu_planless(const kvr_agent_t *a, const kvr__pull_t *p);
/* Producer, gpu-staged (kvr__staged_slice's GPU form): the pull's runs
 * ready on the device before a slice's chunks, then one chunk (packed,
 * put, CHUNK_DONE; *len its bytes). */
kvr_status_t kvr__agpu_staged_begin(kvr_agent_t *a, kvr__pull_t *p,
                                    kvr_error_t *err);
kvr_status_t kvr__agpu_staged_chunk(kvr_agent_t *a, kvr__pull_t *p,
                                    uint64_t *len, kvr_error_t *err);
/* Producer, direct puts of CUDA KV: waits (once per layer group) for the
 * engine's events send_ready queued on the agent's stream. */
kvr_status_t kvr__agpu_direct_ready(kvr_agent_t *a, kvr__pull_t *p,
                                    kvr_error_t *err);
/* Consumer: a gpu-staged chunk from its CUDA staging slot into our pages. */
kvr_status_t kvr__agpu_unpack(kvr_agent_t *a, kvr__cstage_t *s, uint64_t off,
                              const void *buf, uint64_t len, kvr_error_t *err);
void kvr__agpu_unmap(kvr__amap_t *m);
/* Producer: the live request a pull serves (NULL: gone). */
kvr__preq_t *kvr__pull_owner(kvr_agent_t *a, const kvr__pull_t *p);
/* Producer: one step of a gpu-direct pull: the first launches its scatters
 * on the agent's stream, later ones look whether they completed. */
kvr_status_t kvr__agpu_slice(kvr_agent_t *a, const kvr__preq_t *r,
                             kvr__pull_t *p, bool *done, kvr_error_t *err);
/* Producer: a gpu-direct pull's relayout tables, made (checked, sorted,
 * uploaded) as it starts, before its layers are ready, for every launch of
 * its layer groups. */
kvr_status_t kvr__agpu_prepare(kvr_agent_t *a, const kvr__preq_t *r,
                               kvr__pull_t *p, kvr_error_t *err);
/* The sources (ours) and destinations (the consumer's IPC mappings, NULL
 * where not mapped) of the pull's segs, in seg order. */
kvr_status_t kvr__agpu_seg_ends(const kvr_agent_t *a, const kvr__pull_t *p,
                                const void **src, void **dst);
/* The pull's run table, made once on the agent's stream: with our regions
 * as sources (src) and the IPC mappings as destinations (dst). */
kvr_status_t kvr__agpu_runs(kvr_agent_t *a, kvr__pull_t *p, bool src, bool dst,
                            kvr_error_t *err);
/* Is any active pull one the loop must work on (not only waiting for its
 * kernels)? */
bool kvr__agpu_cpu_work(const kvr_agent_t *a);
/* Producer: a gpu-direct pull that arrived ready is launched at once
 * (with the pulls of its request that wait), not after the turn's other
 * messages: a stage handling a burst of WRITE_REQUESTs left the GPU idle
 * until the burst ended. Pulls that become ready together (send_ready)
 * still share one launch in the turn's work. A failed launch is tried
 * again, and answered, by the pull's next slice. */
void kvr__agpu_launch_now(kvr_agent_t *a, const kvr__preq_t *r,
                          kvr__pull_t *p);
/* The progress thread's wait while kernels launched moments ago run
 * (a short gpu-direct pull): polls the loop's fds and the kernels'
 * events for up to KVR_AGENT_GPU_SPIN_NS after the launch instead of
 * sleeping until the host function's wake, which came tens of
 * microseconds after the kernels on the H200. Returns the fds' events
 * (0: a pull's kernels completed, -1: nothing to watch, or another
 * thread holds the turn: sleep as usual). */
struct epoll_event;
int kvr__agpu_spin(kvr_agent_t *a, struct epoll_event *ev, int cap);
void kvr__agpu_free(kvr_agent_t *a);

/* agent_stream.c: layer-wise streaming (docs/agent.md Streaming) */
/* Producer: the pull's next layer group from the layers ready now (all of
 * them for a pull that is not streamed): true with p->group_* set, false
 * when its first layer is not ready yet. */
bool kvr__stream_next(const kvr_agent_t *a, const kvr__preq_t *r,
                      kvr__pull_t *p);
/* Producer: LAYERS_DONE for the group of p just written. */
kvr_status_t kvr__stream_group_done(kvr_agent_t *a, kvr__pull_t *p);
/* Consumer: a WRITE_REQUEST for stage s of r becomes a STREAM_REQUEST when
 * r streams and the stage speaks 3.1. */
void kvr__stream_ask(const kvr__creq_t *r, kvr__cstage_t *s, kvr_msg_t *m);
/* Consumer: checks and counts a LAYERS_DONE of stage s, then reports the
 * layers every source has now delivered (LAYERS_LOADED). */
kvr_status_t kvr__stream_count(kvr_agent_t *a, kvr__creq_t *r, kvr__cstage_t *s,
                               const kvr_msg_layers_done_t *g,
                               kvr_error_t *err);
/* Consumer: stage s answered WRITE_DONE: every group of a streamed stage
 * must have been counted; a stage that was not streamed counts its whole
 * range now (LAYERS_LOADED when r streams). */
kvr_status_t kvr__stream_stage_done(kvr_agent_t *a, kvr__creq_t *r,
                                    kvr__cstage_t *s, kvr_error_t *err);
/* Tests: this agent's HELLO says 3.0 and it refuses STREAM_REQUEST and
 * LAYERS_DONE like a peer from before streaming. */
void kvr__agent_speak_3_0(kvr_agent_t *a);

/* Tests: control-frame faults (see kvr__frame_fault_t). */
void kvr__agent_set_frame_fault(kvr_agent_t *a, kvr_msg_type_t type,
                                uint32_t nth, kvr__fault_mode_t mode);
/* Tests: staged chunks this agent sent or unpacked so far. */
uint64_t kvr__agent_chunks(kvr_agent_t *a);
/* Tests: consumer links whose cost probe is under way. */
uint32_t kvr__agent_probing(kvr_agent_t *a);
/* Tests: recvs started on the caller's thread (run_inline in agent.c). */
uint64_t kvr__agent_inline_recvs(kvr_agent_t *a);
/* Tests: bytes direct sends on the live links stored into mapped consumer
 * memory and put through the transport. */
void kvr__agent_direct_bytes(kvr_agent_t *a, uint64_t *stored, uint64_t *put);
/* Tests: how many links this agent closed by a refusal (its own or the
 * peer's BYE), with the last one's status and reason. */
uint32_t kvr__agent_refusals(kvr_agent_t *a, kvr_status_t *status, char *why,
                             size_t cap);

/* Pair-plans pairs[0..n) for producer rank prank, consumer rank crank and
 * req into segs[i].plan through the agent's plan cache (made on first
 * use); *ref keeps them alive. */
kvr_status_t kvr__agent_plan(kvr_agent_t *a, uint32_t prank, uint32_t crank,
                             const kvr_region_pair_t *pairs, size_t n,
                             const kvr_request_t *req, kvr__dseg_t *segs,
                             uint64_t *bytes, kvr__pentry_t **ref,
                             kvr_error_t *err);

#endif
