/* Internals of the conn layer shared by its files. */
#ifndef KVRELAY_CONN_INTERNAL_H
#define KVRELAY_CONN_INTERNAL_H

#include "kvrelay/conn.h"

#include "base_internal.h"
#include "data.h"
#include "gpu_path.h"
#include "link.h"

#define KVR_CONN_MAX_LINKS 256u
#define KVR_CONN_MAX_STAGES 64u
#define KVR_CONN_MAX_REGIONS 1024u
#define KVR_CONN_MAX_SLOTS_PER_WRITE 8u
#define KVR_CONN_EVENTS_MAX 65536u
#define KVR_CONN_BACKLOG_MAX 4096u

typedef struct kvr__region {
    kvr_region_desc_t desc;
    void *base;
    kvr__dmem_t *mem;    /* host memory registered with the transport */
    bool device;         /* CUDA device memory (shared by IPC, no transport) */
    bool owned;          /* device memory kvrelay allocated */
} kvr__region_t;

/* A peer's region as announced in REGIONS, mapped on our data peer. */
typedef struct kvr__rregion {
    kvr_region_desc_t desc;
    uint32_t mapping;      /* host: the transport mapping */
    void *dev_ptr;         /* CUDA: the IPC mapping on our device */
    uint8_t rkey[72];      /* CUDA: the IPC handle, to close the mapping */
    uint32_t rkey_len;
} kvr__rregion_t;

/* Per-link state of the side that owns it. */
typedef struct kvr__peer {
    kvr__link_t *link;
    kvr__dpeer_t *data;         /* producer: endpoint to the consumer */
    kvr__rregion_t *regions;    /* producer: the consumer's regions */
    uint32_t num_regions;
    int staging;                /* producer: index in regions, or -1 */
    uint32_t probe_mapping;
    bool regions_ready;
    bool pinned;                /* kvr_conn_connect still looks at it */
    kvr_msg_t *backlog;         /* frames read while a transfer waited */
    uint32_t backlog_len;
} kvr__peer_t;

/* Consumer: one producer stage's part of a request. */
typedef struct kvr__cstage {
    uint32_t pp_rank;
    kvr__peer_t *peer;
    bool sent, answered, done;
    uint64_t expect_bytes;
    uint64_t unpacked;      /* staged: stream bytes unpacked */
    uint32_t slots[KVR_CONN_MAX_SLOTS_PER_WRITE];
    uint32_t num_slots;
    kvr_plan_set_t *plans;  /* this stage's layers on this rank */
    kvr__dseg_t *segs;
    size_t num_segs;
} kvr__cstage_t;

typedef enum { CREQ_FREE = 0, CREQ_ACTIVE, CREQ_QUARANTINE } kvr__creq_phase_t;

typedef struct kvr__creq {
    kvr__creq_phase_t phase;
    bool waiting;           /* loaded before every stage connected */
    kvr_wire_id_t id;
    uint64_t transfer_id, nonce, num_tokens, num_computed;
    uint32_t *src, *dst;
    size_t nsrc, ndst;
    uint64_t deadline_ns, hard_deadline_ns;
    uint64_t started_ns;
    uint32_t num_stages;
    kvr__cstage_t stages[KVR_CONN_MAX_STAGES];
    kvr_status_t status;
    char message[KVR_ERROR_MSG_MAX];
    uint64_t bytes;
} kvr__creq_t;

/* Producer: one request's source blocks, held until every rank released. */
typedef struct kvr__preq {
    bool used;
    kvr_wire_id_t id;
    uint64_t transfer_id;
    uint64_t deadline_ns;
    uint64_t released;     /* bitmask of consumer ranks */
    uint64_t served_ok;    /* bitmask of ranks sent WRITE_DONE */
    uint64_t done_nonce[64];
    uint64_t done_bytes[64];
    uint32_t done_chunks[64];
    bool failed;
    kvr_status_t status;
    char message[KVR_ERROR_MSG_MAX];
} kvr__preq_t;

/* Leader: one request of the decode group. */
typedef struct kvr__lreq {
    bool used;
    kvr_wire_id_t id;
    uint64_t transfer_id;
    uint32_t *dst;
    size_t ndst;
    uint64_t num_tokens, num_computed;
    uint32_t *prompt;
    size_t num_prompt;
    uint64_t released;
    bool failed;
} kvr__lreq_t;

typedef struct kvr__leader kvr__leader_t;

struct kvr_conn {
    kvr_conn_params_t p;
    uint8_t key[KVR_WIRE_KEY_BYTES];
    bool has_key;
    kvr__data_t *data;
    kvr__region_t regions[KVR_CONN_MAX_REGIONS];
    uint32_t num_regions;
    int listen_fd;
    kvr__peer_t *peers[KVR_CONN_MAX_LINKS];
    uint32_t num_peers;
    kvr__peer_t *leader_link; /* consumer rank > 0: link to rank 0 */
    kvr__creq_t *creqs;
    kvr__preq_t *preqs;
    kvr__leader_t *leader;
    int staging_idx;          /* consumer: our STAGING region, or -1 */
    uint8_t *slot_busy;       /* consumer: per staging slot */
    struct kvr__pending_offer *offers; /* rank: OFFERs awaiting ASSIGN */
    kvr_conn_event_t *events;
    uint32_t ev_head, ev_count, ev_cap;
    kvr_conn_event_t polled;
    char last_error[KVR_ERROR_MSG_MAX];
};

/* conn.c */
void kvr__conn_fail(kvr_conn_t *c, kvr_status_t st, const char *fmt, ...)
#if defined(__GNUC__)
    __attribute__((format(printf, 3, 4)))
#endif
    ;
/* A region's geometry, ours or one a consumer announced in REGIONS: the
 * role's checks, at least one block, num_blocks * page_bytes within 2^64. */
kvr_status_t kvr__region_valid(const kvr_conn_t *c, const kvr_region_desc_t *d,
                               bool consumer, kvr_error_t *err);
kvr_conn_event_t *kvr__event_push(kvr_conn_t *c, kvr_conn_event_kind_t kind,
                                  const kvr_wire_id_t *id, uint64_t transfer,
                                  kvr_status_t st, const char *msg);
void kvr__event_attach(kvr_conn_event_t *e, const uint32_t *src, size_t nsrc,
                       const uint32_t *dst, size_t ndst);
kvr_status_t kvr__peer_send(kvr__peer_t *peer, const kvr_msg_t *msg);
/* Regions of ours in [layer_start, layer_end) paired with the given
 * counterpart list by (role, layer). */

/* handshake.c */
kvr_status_t kvr__handshake_start(kvr_conn_t *c, kvr__peer_t *peer);
/* Handles HELLO/HELLO_ACK/AUTH/BYE/REGIONS; *handled false for others. */
kvr_status_t kvr__handshake_msg(kvr_conn_t *c, kvr__peer_t *peer,
                                const kvr_msg_t *msg, bool *handled);
bool kvr__peer_ready(const kvr_conn_t *c, const kvr__peer_t *peer);
/* Consumer: a producer link serves this rank when its tp rank is
 * (our tp rank) % (producer tp size) (docs/design.md §7); other producer tp ranks
 * of the same stage serve other ranks. */
bool kvr__serves_us(const kvr_conn_t *c, const kvr__peer_t *peer);
/* Index of the peer's region with d's (role, layer), or -1. */
int kvr__twin_of(const kvr__peer_t *peer, const kvr_region_desc_t *d);

/* consumer.c */
void kvr__creq_free(kvr__creq_t *r);
kvr_status_t kvr__consumer_msg(kvr_conn_t *c, kvr__peer_t *peer,
                               const kvr_msg_t *msg);
void kvr__consumer_tick(kvr_conn_t *c);
void kvr__consumer_peer_lost(kvr_conn_t *c, kvr__peer_t *peer);
kvr_status_t kvr__consumer_load(kvr_conn_t *c, const kvr_conn_load_t *load,
                                kvr_error_t *err);

/* producer.c */
kvr_status_t kvr__producer_msg(kvr_conn_t *c, kvr__peer_t *peer,
                               const kvr_msg_t *msg);
void kvr__producer_tick(kvr_conn_t *c);
void kvr__producer_peer_lost(kvr_conn_t *c, kvr__peer_t *peer);

/* leader.c */
kvr_status_t kvr__leader_create(kvr_conn_t *c, kvr_error_t *err);
void kvr__leader_destroy(kvr__leader_t *l);
kvr_status_t kvr__leader_offer(kvr_conn_t *c, kvr__peer_t *from,
                               const kvr_msg_offer_t *offer);
void kvr__leader_rank_lost(kvr_conn_t *c, uint32_t rank);
void kvr__leader_release(kvr_conn_t *c, const kvr_msg_release_t *rel,
                         uint32_t rank);
/* Rank side: the leader forwarded an OFFER or sent an ASSIGN. */
void kvr__rank_offers_free(kvr_conn_t *c);
kvr_status_t kvr__rank_offer(kvr_conn_t *c, const kvr_msg_offer_t *offer);
kvr_status_t kvr__rank_assign(kvr_conn_t *c, const kvr_msg_assign_t *assign);
/* Rank side: report a finished request to the leader (or self). */
void kvr__rank_release(kvr_conn_t *c, const kvr__creq_t *r);

#endif
