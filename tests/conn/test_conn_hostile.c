/* An authenticated but hostile producer against two real decode ranks in
 * this process (W = 2, a pre-shared key, UCX underneath). The producer is
 * hand-made on the connector's control links: it does the real keyed
 * handshake (session MACs included), then sends
 * OFFERs with num_tokens near 2^64 and answers every WRITE_REQUEST with
 * WRITE_DONE of 0 bytes. No rank may report such a request loaded, none may
 * crash, and every refusal reaches the producer as a failed RELEASE. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <poll.h>
#include <pthread.h>
#include <time.h>
#include <unistd.h>

#include <cmocka.h>

#include "kvrelay/conn.h"
#include "link_peer.h"

#define W 2u
#define BS 16u
#define TOKEN_BYTES 64u
#define MAX_EVENTS 256u

static const uint8_t KEY[KVR_WIRE_KEY_BYTES] = {
    1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16,
    17, 18, 19, 20, 21, 22, 23, 24, 25, 26, 27, 28, 29, 30, 31, 32};

static uint64_t now_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000u + (uint64_t)ts.tv_nsec / 1000000u;
}

static kvr_layout_t layout(void)
{
    kvr_layout_t lay = KVR_LAYOUT_INIT;
    lay.block_size = BS;
    lay.dcp_size = W;
    lay.tp = W;
    lay.producer_tp = 1;
    return lay;
}

static kvr_region_desc_t mla_region(void)
{
    return (kvr_region_desc_t){.role = KVR_ROLE_MLA, .layer = 0,
                               .num_blocks = 16, .page_bytes = BS * TOKEN_BYTES};
}

/* ---- a decode rank, driven by its own thread ---- */

typedef struct {
    kvr_conn_t *c;
    pthread_t thread;
    pthread_mutex_t lock;
    int stop;
    kvr_conn_event_t events[MAX_EVENTS];
    uint32_t num_events;
    uint64_t turns; /* event-loop turns finished */
} rank_t;

static void *drive(void *arg)
{
    rank_t *r = arg;
    for (;;) {
        pthread_mutex_lock(&r->lock);
        int stop = r->stop;
        pthread_mutex_unlock(&r->lock);
        if (stop)
            return NULL;
        kvr_conn_progress(r->c, 10);
        kvr_conn_event_t e;
        pthread_mutex_lock(&r->lock);
        while (kvr_conn_poll_event(r->c, &e))
            if (r->num_events < MAX_EVENTS)
                r->events[r->num_events++] = e;
        r->turns++;
        pthread_mutex_unlock(&r->lock);
    }
}

static void rank_start(rank_t *r)
{
    r->stop = 0;
    assert_int_equal(pthread_create(&r->thread, NULL, drive, r), 0);
}

static void rank_stop(rank_t *r)
{
    pthread_mutex_lock(&r->lock);
    r->stop = 1;
    pthread_mutex_unlock(&r->lock);
    pthread_join(r->thread, NULL);
}

/* Creates rank `dcp` listening on 127.0.0.1; false when UCX is absent. */
static bool rank_create(rank_t *r, uint32_t dcp, uint16_t *port)
{
    memset(r, 0, sizeof(*r));
    pthread_mutex_init(&r->lock, NULL);
    kvr_conn_params_t p = KVR_CONN_PARAMS_INIT;
    p.layout = layout();
    p.topo = (kvr_wire_topo_t){.pp_rank = 0, .pp_size = 1, .tp_rank = dcp,
                               .tp_size = W, .dp_size = 1, .layer_end = 1,
                               .dcp_rank = dcp};
    p.key = KEY;
    p.deadline_ms = 20000;
    p.leader_blocks = dcp == 0 ? 16 : 0;
    kvr_error_t err = {0};
    kvr_status_t st = kvr_conn_create(&p, &r->c, &err);
    if (st == KVR_ERR_UNSUPPORTED || st == KVR_ERR_TRANSPORT)
        return false;
    assert_int_equal(st, KVR_OK);
    kvr_region_desc_t d = mla_region();
    void *base = NULL;
    assert_int_equal(kvr_conn_alloc_region(r->c, &d, &base), KVR_OK);
    assert_int_equal(kvr_conn_listen(r->c, "127.0.0.1", 0, port), KVR_OK);
    return true;
}

/* Waits until every event of a frame the rank already sent is polled: two
 * more turns of its loop (the one that sent it may still be running). */
static void rank_sync(rank_t *r)
{
    pthread_mutex_lock(&r->lock);
    uint64_t want = r->turns + 2;
    pthread_mutex_unlock(&r->lock);
    for (uint64_t end = now_ms() + 20000; now_ms() < end;) {
        pthread_mutex_lock(&r->lock);
        bool done = r->turns >= want;
        pthread_mutex_unlock(&r->lock);
        if (done)
            return;
        usleep(1000);
    }
    fail_msg("a rank's event loop is stuck");
}

/* Events of one kind for request id; the last one goes to *last. */
static uint32_t count_events(rank_t *r, kvr_conn_event_kind_t kind,
                             const char *id, kvr_conn_event_t *last)
{
    uint32_t n = 0;
    pthread_mutex_lock(&r->lock);
    for (uint32_t i = 0; i < r->num_events; i++) {
        const kvr_conn_event_t *e = &r->events[i];
        if (e->kind == kind && e->request_id.len == strlen(id) &&
            memcmp(e->request_id.bytes, id, e->request_id.len) == 0) {
            n++;
            if (last != NULL)
                *last = *e;
        }
    }
    pthread_mutex_unlock(&r->lock);
    return n;
}

/* ---- the hostile producer: its own control links (src/conn/link.h) ---- */

/* The next request-level frame a link received; handshake frames on the way
 * are handled. false when no complete frame is left. */
static bool next_msg(kvr__link_t *l, kvr_msg_t *m)
{
    kvr_error_t err = {0};
    for (;;) {
        bool have = false;
        if (kvr__link_next(l, m, &have, &err) != KVR_OK)
            fail_msg("link: %s", err.msg);
        if (!have)
            return false;
        if (m->type == KVR_MSG_BYE)
            fail_msg("refused: %s", m->u.bye.text);
        if (m->type >= KVR_MSG_REGIONS)
            return true;
        kvr_status_t st = link_peer_handshake(l, m, &err);
        kvr_msg_free(m);
        if (st != KVR_OK)
            fail_msg("handshake: %s", err.msg);
    }
}

/* Waits up to ms for the links, writes what they queued, reads what came. */
static void wait_links(kvr__link_t *const *links, uint32_t n, int ms)
{
    struct pollfd p[W];
    for (uint32_t i = 0; i < n; i++) {
        if (links[i]->closed)
            fail_msg("a link closed: %s", links[i]->close_why);
        p[i] = (struct pollfd){.fd = links[i]->fd, .events = POLLIN};
        p[i].events |= kvr__link_wants_write(links[i]) ? POLLOUT : 0;
    }
    poll(p, n, ms);
    for (uint32_t i = 0; i < n; i++) {
        kvr__link_flush(links[i]);
        kvr__link_read(links[i]);
    }
}

/* Dials a rank and authenticates as PP stage 0 with the real key. */
static kvr__link_t *hostile_dial(uint16_t port)
{
    int fd = -1;
    kvr__link_t *l = NULL;
    kvr_error_t err = {0};
    assert_int_equal(kvr__tcp_connect("127.0.0.1", port, 20000, &fd, &err), KVR_OK);
    assert_int_equal(kvr__link_create(fd, true, KEY, &l, &err), KVR_OK);
    kvr_wire_topo_t topo = {.pp_size = 1, .tp_size = 1, .dp_size = 1, .layer_end = 1};
    kvr_layout_t lay = layout();
    kvr_region_desc_t d = mla_region();
    assert_int_equal(kvr_wire_hello_init(&l->ours, KVR_WIRE_PRODUCER, &topo, &lay,
                                         &d, 1, &err), KVR_OK);
    l->ours.has_key = true;
    assert_int_equal(kvr__link_send_hello(l, KVR_MSG_HELLO), KVR_OK);
    for (uint64_t end = now_ms() + 20000; !l->ready;) {
        if (now_ms() > end)
            fail_msg("handshake with port %u did not finish", port);
        wait_links(&l, 1, 100);
        kvr_msg_t m;
        while (next_msg(l, &m))
            kvr_msg_free(&m);
    }
    return l;
}

static void send_offer(kvr__link_t *l, const char *id, uint64_t transfer,
                       uint64_t tokens)
{
    static const uint32_t src[2] = {0, 1};
    kvr_msg_t m;
    kvr_msg_init(&m, KVR_MSG_OFFER);
    assert_int_equal(kvr_wire_id_set(&m.u.offer.request_id, id, strlen(id), NULL),
                     KVR_OK);
    m.u.offer.transfer_id = transfer;
    m.u.offer.num_tokens = tokens;
    m.u.offer.src_blocks = src;
    m.u.offer.num_src_blocks = 2;
    assert_int_equal(kvr__link_send(l, &m), KVR_OK);
}

/* A producer that claims every write done with 0 bytes moved. */
static void answer_done(kvr__link_t *l, const kvr_msg_write_request_t *w)
{
    kvr_msg_t m;
    kvr_msg_init(&m, KVR_MSG_WRITE_DONE);
    m.u.write_done.request_id = w->request_id;
    m.u.write_done.transfer_id = w->transfer_id;
    m.u.write_done.write_nonce = w->write_nonce;
    assert_int_equal(kvr__link_send(l, &m), KVR_OK);
}

/* Serves both links until `want` RELEASEs of transfer arrived; returns how
 * many did, every outcome in outcomes. */
static uint32_t pump(kvr__link_t *const *links, uint64_t transfer, uint32_t want,
                     kvr_status_t *outcomes)
{
    uint32_t got = 0;
    for (uint64_t end = now_ms() + 30000; got < want && now_ms() < end;) {
        wait_links(links, W, 100);
        for (uint32_t i = 0; i < W; i++) {
            kvr_msg_t m;
            while (next_msg(links[i], &m)) {
                if (m.type == KVR_MSG_WRITE_REQUEST)
                    answer_done(links[i], &m.u.write_request);
                if (m.type == KVR_MSG_RELEASE && m.u.release.transfer_id == transfer &&
                    got < want)
                    outcomes[got++] = m.u.release.outcome;
                kvr_msg_free(&m);
            }
        }
    }
    return got;
}

typedef struct {
    rank_t ranks[W];
    kvr__link_t *links[W];
} group_t;

static int setup(void **state)
{
    group_t *g = calloc(1, sizeof(*g));
    uint16_t ports[W];
    for (uint32_t r = 0; r < W; r++)
        if (!rank_create(&g->ranks[r], r, &ports[r])) {
            fprintf(stderr, "no UCX transport: skipped\n");
            exit(77);
        }
    rank_start(&g->ranks[0]);
    assert_int_equal(kvr_conn_connect(g->ranks[1].c, "127.0.0.1", ports[0], 20000),
                     KVR_OK);
    rank_start(&g->ranks[1]);
    for (uint32_t r = 0; r < W; r++)
        g->links[r] = hostile_dial(ports[r]);
    *state = g;
    return 0;
}

static int teardown(void **state)
{
    group_t *g = *state;
    for (uint32_t r = 0; r < W; r++)
        rank_stop(&g->ranks[r]);
    for (uint32_t r = 0; r < W; r++) {
        kvr__link_destroy(g->links[r]);
        kvr_conn_destroy(g->ranks[r].c);
        pthread_mutex_destroy(&g->ranks[r].lock);
    }
    free(g);
    return 0;
}

/* OFFERs whose block counts wrapped to 0 under ceil(N / bs) = (N + bs - 1)
 * / bs: the leader refuses each with a failed RELEASE per rank and a
 * LOAD_FAILED naming the count; no rank reports anything loaded. */
static void test_huge_offer_refused(void **state)
{
    group_t *g = *state;
    const uint64_t huge[] = {UINT64_MAX, UINT64_MAX - 14, UINT64_MAX - 255,
                             1ull << 63};
    for (uint32_t i = 0; i < sizeof(huge) / sizeof(huge[0]); i++) {
        char id[32], num[32];
        snprintf(id, sizeof(id), "evil-%u", i);
        snprintf(num, sizeof(num), "%llu", (unsigned long long)huge[i]);
        send_offer(g->links[0], id, 100 + i, huge[i]);
        kvr_status_t out[W] = {0};
        assert_int_equal(pump(g->links, 100 + i, W, out), W);
        for (uint32_t r = 0; r < W; r++) {
            rank_sync(&g->ranks[r]);
            assert_int_equal(out[r], KVR_ERR_SRC_TABLE_SHORT);
            assert_int_equal(count_events(&g->ranks[r], KVR_EVENT_LOADED, id, NULL), 0);
        }
        kvr_conn_event_t e;
        assert_int_equal(count_events(&g->ranks[0], KVR_EVENT_LOAD_FAILED, id, &e), 1);
        assert_int_equal(e.status, KVR_ERR_SRC_TABLE_SHORT);
        if (strstr(e.message, num) == NULL)
            fail_msg("the refusal \"%s\" does not name %s", e.message, num);
    }
}

/* A plannable OFFER answered "done, 0 bytes": every rank fails it (the plan
 * has bytes), none reports it loaded, and the producer hears why. */
static void test_short_done_fails(void **state)
{
    group_t *g = *state;
    send_offer(g->links[0], "short", 7, 20);
    kvr_status_t out[W] = {0};
    assert_int_equal(pump(g->links, 7, W, out), W);
    for (uint32_t r = 0; r < W; r++) {
        kvr_conn_event_t e;
        rank_sync(&g->ranks[r]);
        assert_int_equal(out[r], KVR_ERR_VERIFY);
        assert_int_equal(count_events(&g->ranks[r], KVR_EVENT_LOADED, "short", NULL), 0);
        assert_int_equal(count_events(&g->ranks[r], KVR_EVENT_LOAD_FAILED, "short",
                                      &e), 1);
        assert_int_equal(e.status, KVR_ERR_VERIFY);
    }
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_huge_offer_refused),
        cmocka_unit_test(test_short_done_fails),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
