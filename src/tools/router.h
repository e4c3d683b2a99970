/* The demo's decode router, built on agent notifications (docs/agent.md
 * Notifications): one per decode group, hosted by the group's rank 0. It
 * owns the group's destination block pool and prefix cache, turns the
 * OFFERs of prefill heads into ASSIGNs for every rank of the group, and
 * frees (or caches) a request's blocks once every rank reported it
 * RELEASED. Not part of the library: an engine's router does this job.
 *
 * Router messages travel as notification payloads in a small encoding of
 * their own (rt_encode / rt_decode); agent links are already
 * authenticated, so nothing here is. */
#ifndef CLI_TOOLS_ROUTER_H
#define CLI_TOOLS_ROUTER_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "kvrelay/agent.h"
#include "kvrelay/completion.h"

/* ---- messages ---- */

typedef enum rt_type {
    RT_JOIN = 1,     /* rank > 0 -> router: "I am rank r, at my listener" */
    RT_OFFER = 2,    /* prefill head -> router: a request to place */
    RT_ASSIGN = 3,   /* router -> rank: load it into these blocks (a part
                        of the table: [offset, offset + count) of total) */
    RT_RELEASED = 4, /* rank -> router: its RELEASED came, with the outcome */
    RT_STOP = 5,     /* router -> rank: the run cannot complete (text) */
    RT_REFUSE = 6,   /* router -> prefill head and every rank: the offer
                        cannot be placed (status, text) */
    RT_FAILED = 7,   /* router -> prefill head (-> its stages): the group
                        failed the request (status, text); a stage some
                        rank never pulled from stops holding it */
} rt_type_t;

#define RT_ID_MAX 256u
#define RT_IDS_MAX 3000u /* destination ids per ASSIGN part */
#define RT_HASH_MAX 400u /* prefix block hashes per OFFER */

typedef struct rt_msg {
    rt_type_t type;
    char request[RT_ID_MAX + 1];
    char producer[KVR_AGENT_INSTANCE_MAX + 1]; /* prefill instance id */
    char address[256];                         /* its PP head's listener */
    char text[256];
    uint64_t tokens, computed; /* computed: virtual blocks already held */
    uint32_t status;           /* RELEASED, REFUSE: a kvr_status_t */
    bool abort;                /* ASSIGN: the ranks abort it in flight */
    uint32_t total, offset, count;
    uint32_t ids[RT_IDS_MAX];
    uint32_t num_hashes;
    kvr_block_hash_t hashes[RT_HASH_MAX];
} rt_msg_t;

/* Encodes m into buf (KVR_AGENT_NOTIFY_MAX bytes); returns the length. */
size_t rt_encode(const rt_msg_t *m, uint8_t *buf);
/* Decodes a payload; false if it is not a well-formed router message. */
bool rt_decode(const uint8_t *buf, size_t len, rt_msg_t *m);

/* ---- the router ---- */

typedef struct router router_t;

/* How the router reaches others: a rank of its group (rank 0 may be
 * itself), and the prefill head that offered a request. */
typedef struct router_ops {
    void *ctx;
    void (*to_rank)(void *ctx, uint32_t rank, const rt_msg_t *m);
    void (*to_producer)(void *ctx, const char *producer, const char *address,
                        const rt_msg_t *m);
    /* Whether the ranks abort this request (the demo's --abort). */
    bool (*aborts)(void *ctx, const char *request);
} router_ops_t;

/* A pool of num_blocks destination blocks shared by `ranks` ranks; a rank
 * silent past timeout_ms after an ASSIGN counts as failed, and until it
 * answers again every new OFFER is refused (a load needs every rank). */
router_t *router_create(const kvr_layout_t *lay, uint32_t ranks,
                        uint32_t num_blocks, uint32_t timeout_ms,
                        const router_ops_t *ops);
void router_destroy(router_t *r);
void router_join(router_t *r, uint32_t rank);
/* The group expects `request` from prefill instance `producer`: once an
 * OFFER from that instance came, this one is due within timeout_ms of it
 * (a head offers in one burst); past that it counts as lost, and the
 * producer and every rank are told (REFUSE, ERR_TIMEOUT). */
void router_expect(router_t *r, const char *request, const char *producer);
/* Expected `request` reuses the prefix of expected `source`: its OFFER
 * is placed only once source's was placed or ended here (it then finds
 * the prefix in flight or cached), or timeout_ms after it came (then
 * without, saying "reuse-missed"). OFFERs of different producers arrive
 * in any order. */
void router_reuses(router_t *r, const char *request, const char *source);
void router_offer(router_t *r, const rt_msg_t *offer);
void router_released(router_t *r, uint32_t rank, const rt_msg_t *m);
/* Timeouts and queued offers. */
void router_tick(router_t *r);
/* Requests that ended (every rank released, or failed). */
uint32_t router_done(const router_t *r);
/* Of those, the ones that did not load on every rank. */
uint32_t router_failed(const router_t *r);
/* Blocks some live request still holds. */
uint32_t router_blocks_in_use(const router_t *r);

#endif
