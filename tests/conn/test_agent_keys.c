/* The agent with a pre-shared key: blank HELLOs, AUTH, LAYOUT and the
 * session MAC on every link (docs/PROTOCOL.md). Keyed instances load byte
 * for byte; a wrong key, or a key on one side only, is refused on both
 * sides with the reason; a frame altered on the wire closes its link and
 * fails exactly the requests on it. */
#include <arpa/inet.h>
#include <errno.h>
#include <netinet/in.h>
#include <poll.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cmocka.h>

#include "agent_harness.h"
#include "agent_internal.h"

static const uint8_t KEY_A[KVR_WIRE_KEY_BYTES] =
    "kvrelay agent test key A.......";
static const uint8_t KEY_B[KVR_WIRE_KEY_BYTES] =
    "kvrelay agent test key B.......";

static void key_a(kvr_agent_params_t *p)
{
    p->key = KEY_A;
}

static void key_b(kvr_agent_params_t *p)
{
    p->key = KEY_B;
}

/* Every agent keyed: a PP2 and a PP1 instance (the non-head stage joins
 * its head over a keyed link) feed one DCP2 group. */
static void test_keyed_instances(void **state)
{
    (void)state;
    world_t *w = two_instances_loaded(key_a);
    kvr_status_t st;
    char why[KVR_ERROR_MSG_MAX];
    for (uint32_t c = 0; c < 2; c++)
        assert_int_equal(
            kvr__agent_refusals(w->cons[c].agent, &st, why, sizeof(why)), 0);
    world_free(w);
}

/* The producer stage's side of a refused link: closed with st, reason
 * containing what. */
static void expect_refused(ah_agent_t *x, kvr_status_t want, const char *what)
{
    kvr_status_t st = KVR_OK;
    char why[KVR_ERROR_MSG_MAX] = "";
    uint64_t end = ah_now_ms() + AH_WAIT_MS;
    while (kvr__agent_refusals(x->agent, &st, why, sizeof(why)) == 0 &&
           ah_now_ms() < end)
        ah_settle(&x, 1, 20);
    if (st != want || strstr(why, what) == NULL)
        fail_msg("refusal %s '%s', expected %s with '%s'", kvr_status_name(st),
                 why, kvr_status_name(want), what);
}

/* A consumer with another key: its load fails with ERR_AUTH naming the
 * failed AUTH, and the producer refused the link for the same reason. */
static void test_wrong_key(void **state)
{
    (void)state;
    world_t *w = world_new();
    start_instance(w, 0, "prefill-a", 1, key_a);
    start_group_tweaked(w, 0, false, key_b);
    ah_req_t r;
    ah_req(&w->m, 3, 100, &r);
    fill_all(w, 0, &r);
    open_all(w, 0, &r, 0, true);
    ah_recv(&w->cons[0], "prefill-a", head_addr(w, 0), &r, 0);
    const kvr_agent_event_t *e = expect_failed(&w->cons[0], r.id, KVR_ERR_AUTH);
    assert_non_null(strstr(e->message, "AUTH"));
    assert_non_null(strstr(e->message, head_addr(w, 0)));
    expect_refused(&w->prod[0][0], KVR_ERR_AUTH, "AUTH");
    kvr_agent_send_abort(w->prod[0][0].agent, r.id, strlen(r.id));
    world_free(w);
}

/* A key on the consumer only: refused at HELLO on both sides, naming the
 * missing key; no layout was sent either way. */
static void test_key_on_one_side(void **state)
{
    (void)state;
    world_t *w = world_new();
    start_instance(w, 0, "prefill-a", 1, NULL);
    start_group_tweaked(w, 0, false, key_a);
    ah_req_t r;
    ah_req(&w->m, 4, 100, &r);
    ah_recv(&w->cons[0], "prefill-a", head_addr(w, 0), &r, 0);
    const kvr_agent_event_t *e = expect_failed(&w->cons[0], r.id, KVR_ERR_AUTH);
    assert_non_null(strstr(e->message, "pre-shared key"));
    expect_refused(&w->prod[0][0], KVR_ERR_AUTH, "pre-shared key");
    world_free(w);
}

/* Stage 1's first WRITE_DONE is altered after its tag was made: the
 * consumer rank that gets it closes the link (ERR_AUTH naming the frame),
 * its load fails and is released, and with that group failed both
 * stages' requests fail; the other rank (another link) loads. The next request dials again and loads. */
static void test_tampered_frame(void **state)
{
    (void)state;
    world_t *w = world_new();
    start_instance(w, 0, "prefill-a", 2, key_a);
    start_group_tweaked(w, 0, false, key_a);
    kvr__agent_set_frame_fault(w->prod[0][1].agent, KVR_MSG_WRITE_DONE, 1,
                               KVR__FAULT_TAMPER);
    ah_req_t r;
    ah_req(&w->m, 5, 256, &r);
    fill_all(w, 0, &r);
    open_all(w, 0, &r, 0, true);
    recv_all(w, 0, "prefill-a", &r, 0);
    uint32_t bad = one_rank_failed(w, &r);
    ah_verify(&w->m, stages_of(w, 0), 2, &w->cons[1 - bad], &r);
    const kvr_agent_event_t *e = expect_failed(&w->cons[bad], r.id,
                                               KVR_ERR_AUTH);
    assert_non_null(strstr(e->message, "stage 1"));
    assert_non_null(strstr(e->message, "WRITE_DONE"));
    for (uint32_t s = 0; s < 2; s++) { /* a group failed on both stages */
        assert_int_not_equal(
            ah_wait(&w->prod[0][s], r.id, KVR_AGENT_SEND_FAILED, AH_WAIT_MS)
                ->status,
            KVR_OK);
        assert_int_equal(ah_count(&w->prod[0][s], r.id, KVR_AGENT_SENT), 0);
    }
    ah_req_t q;
    ah_req(&w->m, 6, 300, &q);
    fill_all(w, 0, &q);
    open_all(w, 0, &q, 0, true);
    recv_all(w, 0, "prefill-a", &q, 0);
    expect_loaded(w, 0, &q);
    world_free(w);
}

/* More idle connections than the link table has seats
 * (KVR_AGENT_MAX_LINKS), so without a budget of their own they would
 * lock the keyed peers out. */
#define IDLE_CONNS 1200u
#define HANDSHAKE_MS 1500u

static void key_a_short_handshake(kvr_agent_params_t *p)
{
    p->key = KEY_A;
    p->handshake_timeout_ms = HANDSHAKE_MS;
    p->connect_timeout_ms = 60000; /* not what closes the idle ones */
}

/* Room for the idle sockets, both ends, in this one process. */
static bool raise_fd_limit(rlim_t need)
{
    struct rlimit r;
    if (getrlimit(RLIMIT_NOFILE, &r) != 0)
        return false;
    if (r.rlim_cur >= need)
        return true;
    if (r.rlim_max != RLIM_INFINITY && r.rlim_max < need)
        return false;
    r.rlim_cur = need;
    return setrlimit(RLIMIT_NOFILE, &r) == 0;
}

static int dial_idle(const char *addr)
{
    const char *colon = strrchr(addr, ':');
    struct sockaddr_in in = {.sin_family = AF_INET,
                             .sin_addr.s_addr = htonl(INADDR_LOOPBACK),
                             .sin_port = htons((uint16_t)atoi(colon + 1))};
    int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    assert_true(fd >= 0);
    if (connect(fd, (struct sockaddr *)&in, sizeof(in)) != 0)
        fail_msg("idle connection to %s: %s", addr, strerror(errno));
    return fd;
}

/* The agent closed fd: EOF or a reset, by end. */
static bool closed_by(int fd, uint64_t end)
{
    for (;;) {
        uint64_t now = ah_now_ms();
        struct pollfd p = {.fd = fd, .events = POLLIN};
        if (now >= end || poll(&p, 1, (int)(end - now)) <= 0)
            return false;
        char c;
        ssize_t n = recv(fd, &c, 1, MSG_DONTWAIT);
        if (n == 0 || (n < 0 && errno != EAGAIN && errno != EWOULDBLOCK))
            return true;
    }
}

/* IDLE_CONNS connections that never send a byte are held open to a keyed
 * producer; a keyed decode group still completes its handshakes and
 * loads byte for byte, and every idle connection is closed: the oldest
 * for room, the rest at the handshake limit. */
static void test_idle_flood(void **state)
{
    (void)state;
    if (!raise_fd_limit(IDLE_CONNS * 2 + 512))
        skip(); /* cannot hold both ends of the idle sockets */
    world_t *w = world_new();
    start_instance(w, 0, "prefill-a", 1, key_a_short_handshake);
    static int idle[IDLE_CONNS];
    for (uint32_t i = 0; i < IDLE_CONNS; i++)
        idle[i] = dial_idle(head_addr(w, 0));
    uint64_t dialled = ah_now_ms();
    start_group_tweaked(w, 0, false, key_a);
    ah_req_t r;
    ah_req(&w->m, 3, 200, &r);
    fill_all(w, 0, &r);
    open_all(w, 0, &r, 0, true);
    recv_all(w, 0, "prefill-a", &r, 0);
    expect_loaded(w, 0, &r);
    uint64_t end = dialled + HANDSHAKE_MS + AH_WAIT_MS;
    for (uint32_t i = 0; i < IDLE_CONNS; i++) {
        if (!closed_by(idle[i], end))
            fail_msg("idle connection %u still open %llu ms after the last "
                     "was made",
                     i, (unsigned long long)(ah_now_ms() - dialled));
        close(idle[i]);
    }
    world_free(w);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_keyed_instances),
        cmocka_unit_test(test_wrong_key),
        cmocka_unit_test(test_key_on_one_side),
        cmocka_unit_test(test_tampered_frame),
        cmocka_unit_test(test_idle_flood),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
