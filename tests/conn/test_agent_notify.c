/* Notifications between agents (kvr_agent_notify, kvr_agent_poll_notify):
 * to an address or over an existing link, a router agent with a listener
 * and no KV regions, order, size bounds, keys, and NOTIFY_FAILED for an
 * unreachable, refusing or wrong peer within the connect timeout. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
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

/* A router: consumer role, a listener, no KV regions. */
static kvr_agent_t *router(world_t *w, const char *name, const uint8_t *key,
                           uint32_t connect_ms)
{
    kvr_agent_params_t p = ah_consumer_params(&w->m, w->hub, name, 0);
    p.listen = "127.0.0.1:0";
    p.key = key;
    if (connect_ms)
        p.connect_timeout_ms = connect_ms;
    kvr_agent_t *a = NULL;
    kvr_error_t err = {0};
    if (kvr_agent_create(&p, &a, &err) != KVR_OK)
        fail_msg("create: %s", err.msg);
    assert_int_equal(kvr_agent_start(a), KVR_OK);
    return a;
}

static kvr_agent_notify_t *take(kvr_agent_t *a)
{
    static _Thread_local kvr_agent_notify_t n;
    uint64_t end = ah_now_ms() + AH_WAIT_MS;
    while (!kvr_agent_poll_notify(a, &n)) {
        if (ah_now_ms() > end)
            fail_msg("no notification within %u ms", AH_WAIT_MS);
        usleep(2000);
    }
    return &n;
}

static void expect_text(const kvr_agent_notify_t *n, const char *sender,
                        const char *text)
{
    assert_int_equal(n->sender.len, strlen(sender));
    assert_memory_equal(n->sender.bytes, sender, n->sender.len);
    assert_int_equal(n->len, strlen(text));
    assert_memory_equal(n->payload, text, n->len);
}

static void send_text(kvr_agent_t *a, const char *peer, const char *address,
                      const char *text)
{
    kvr_status_t st = kvr_agent_notify(a, peer, strlen(peer), address, text,
                                       strlen(text));
    if (st != KVR_OK)
        fail_msg("notify: %s", kvr_agent_last_error(a));
}

/* Waits for the one NOTIFY_FAILED event of agent a (a refused link's
 * PEER_REFUSED may come first). */
static kvr_agent_event_t wait_failed(kvr_agent_t *a, uint32_t ms)
{
    kvr_agent_event_t ev;
    uint64_t end = ah_now_ms() + ms;
    while (!kvr_agent_poll(a, &ev) || ev.kind == KVR_AGENT_PEER_REFUSED) {
        if (ah_now_ms() > end)
            fail_msg("no NOTIFY_FAILED within %u ms", ms);
        usleep(2000);
    }
    assert_int_equal(ev.kind, KVR_AGENT_NOTIFY_FAILED);
    return ev;
}

/* A consumer rank (no listener) notifies a producer stage at its address;
 * the stage answers over the link it accepted (no address). Each sees the
 * other's instance, ranks and side from the link. */
static void test_notify_and_answer(void **state)
{
    (void)state;
    world_t *w = world_new();
    start_instance(w, 0, "prefill-a", 2, NULL);
    start_group(w, 0, false);
    kvr_agent_t *stage1 = w->prod[0][1].agent, *rank1 = w->cons[1].agent;
    const char *at = kvr_agent_address(stage1);
    send_text(rank1, "prefill-a", at, "hello stage 1");
    kvr_agent_notify_t *n = take(stage1);
    expect_text(n, "decode", "hello stage 1");
    assert_int_equal(n->sender_side, KVR_WIRE_CONSUMER);
    assert_int_equal(n->sender_topo.tp_rank, 1);
    assert_int_equal(n->sender_topo.dcp_rank, 1);
    assert_string_equal(n->sender_address, "");
    assert_int_equal(n->dropped, 0);
    send_text(stage1, "decode", NULL, "hello rank 1");
    n = take(rank1);
    expect_text(n, "prefill-a", "hello rank 1");
    assert_int_equal(n->sender_side, KVR_WIRE_PRODUCER);
    assert_int_equal(n->sender_topo.pp_rank, 1);
    assert_int_equal(n->sender_topo.pp_size, 2);
    assert_string_equal(n->sender_address, at);
    /* the answer went over the accepted link, not a new one */
    kvr_agent_event_t ev;
    assert_false(kvr_agent_poll(stage1, &ev));
    world_free(w);
}

/* A router with a listener and no KV regions talks to a producer and a
 * decode rank while a request loads over their links: everything in
 * order, empty and largest payloads, the load unharmed. */
static void test_router(void **state)
{
    (void)state;
    world_t *w = world_new();
    start_instance(w, 0, "prefill-a", 1, NULL);
    start_group(w, 0, false);
    kvr_agent_t *r = router(w, "router", NULL, 0);
    const char *rat = kvr_agent_address(r);
    ah_req_t q;
    ah_req(&w->m, 1, 300, &q);
    fill_all(w, 0, &q);
    open_all(w, 0, &q, 0, true);
    recv_all(w, 0, "prefill-a", &q, 0);
    for (int i = 0; i < 50; i++) {
        char text[32];
        snprintf(text, sizeof(text), "offer %d", i);
        send_text(w->prod[0][0].agent, "router", rat, text);
    }
    for (int i = 0; i < 50; i++) {
        char text[32];
        snprintf(text, sizeof(text), "offer %d", i);
        kvr_agent_notify_t *n = take(r);
        expect_text(n, "prefill-a", text);
        assert_string_equal(n->sender_address,
                            kvr_agent_address(w->prod[0][0].agent));
    }
    /* the router answers both the stage (its listener) and a rank (over
     * the link the rank dialled) */
    send_text(w->cons[0].agent, "router", rat, "rank 0 here");
    expect_text(take(r), "decode", "rank 0 here");
    send_text(r, "decode", NULL, "assign");
    expect_text(take(w->cons[0].agent), "router", "assign");
    static uint8_t big[KVR_AGENT_NOTIFY_MAX];
    for (size_t i = 0; i < sizeof(big); i++)
        big[i] = (uint8_t)(i * 7);
    assert_int_equal(kvr_agent_notify(r, "prefill-a", 9,
                                      kvr_agent_address(w->prod[0][0].agent),
                                      big, sizeof(big)),
                     KVR_OK);
    assert_int_equal(kvr_agent_notify(r, "prefill-a", 9, NULL, NULL, 0),
                     KVR_OK);
    kvr_agent_notify_t *n = take(w->prod[0][0].agent);
    assert_int_equal(n->len, sizeof(big));
    assert_memory_equal(n->payload, big, sizeof(big));
    assert_int_equal(take(w->prod[0][0].agent)->len, 0);
    expect_loaded(w, 0, &q);
    kvr_agent_destroy(r);
    world_free(w);
}

/* Bad arguments are refused at the call, naming the value. */
static void test_notify_arguments(void **state)
{
    (void)state;
    world_t *w = world_new();
    start_group(w, 0, false);
    kvr_agent_t *a = w->cons[0].agent;
    static uint8_t big[KVR_AGENT_NOTIFY_MAX + 1];
    assert_int_equal(
        kvr_agent_notify(a, "x", 1, "127.0.0.1:9", big, sizeof(big)),
        KVR_ERR_INVALID);
    assert_non_null(strstr(kvr_agent_last_error(a), "16385"));
    assert_int_equal(kvr_agent_notify(a, "x", 1, "127.0.0.1:9", NULL, 3),
                     KVR_ERR_INVALID);
    assert_int_equal(kvr_agent_notify(a, "x", 0, "127.0.0.1:9", "y", 1),
                     KVR_ERR_INVALID);
    assert_int_equal(kvr_agent_notify(a, "x", 1, "no-port", "y", 1),
                     KVR_ERR_INVALID);
    assert_non_null(strstr(kvr_agent_last_error(a), "no-port"));
    world_free(w);
}

/* Each way a notification cannot go out ends in one NOTIFY_FAILED naming
 * the peer and address: refused connection, a silent peer (within the
 * connect timeout), no link and no address, another instance there, a
 * wrong key. */
static void test_notify_failures(void **state)
{
    (void)state;
    world_t *w = world_new();
    start_instance(w, 0, "prefill-a", 1, key_a);
    kvr_agent_t *r = router(w, "router", KEY_A, 800);
    char silent[64];
    int fd = ah_silent_listener(silent, sizeof(silent));

    send_text(r, "nobody", "127.0.0.1:1", "x");
    kvr_agent_event_t ev = wait_failed(r, AH_WAIT_MS);
    assert_int_equal(ev.status, KVR_ERR_PEER_DEAD);
    assert_non_null(strstr(ev.message, "127.0.0.1:1"));
    assert_int_equal(ev.peer.len, 6);
    assert_memory_equal(ev.peer.bytes, "nobody", 6);
    assert_int_equal(ev.bytes, 1);

    uint64_t t0 = ah_now_ms();
    send_text(r, "silent", silent, "x");
    ev = wait_failed(r, AH_WAIT_MS);
    assert_int_equal(ev.status, KVR_ERR_TIMEOUT);
    assert_non_null(strstr(ev.message, silent));
    assert_true(ah_now_ms() - t0 < 800 + 2000);

    send_text(r, "prefill-a", NULL, "x");
    ev = wait_failed(r, AH_WAIT_MS);
    assert_int_equal(ev.status, KVR_ERR_NOT_FOUND);
    assert_non_null(strstr(ev.message, "no link"));

    send_text(r, "prefill-z", head_addr(w, 0), "x");
    ev = wait_failed(r, AH_WAIT_MS);
    assert_int_equal(ev.status, KVR_ERR_PEER_ROLE);
    assert_non_null(strstr(ev.message, "prefill-a"));

    kvr_agent_t *wrong = router(w, "router-b", KEY_B, 0);
    send_text(wrong, "prefill-a", head_addr(w, 0), "x");
    ev = wait_failed(wrong, AH_WAIT_MS);
    assert_int_equal(ev.status, KVR_ERR_AUTH);
    assert_non_null(strstr(ev.message, head_addr(w, 0)));
    kvr_agent_notify_t n;
    assert_false(kvr_agent_poll_notify(w->prod[0][0].agent, &n));

    /* with the right key it goes through, authenticated */
    send_text(r, "prefill-a", head_addr(w, 0), "keyed");
    expect_text(take(w->prod[0][0].agent), "router", "keyed");
    kvr_agent_destroy(wrong);
    kvr_agent_destroy(r);
    close(fd);
    world_free(w);
}

static uint32_t queued(kvr_agent_t *a, uint32_t *dropped)
{
    pthread_mutex_lock(&a->lock);
    uint32_t n = a->nt_count;
    *dropped = a->nt_dropped;
    pthread_mutex_unlock(&a->lock);
    return n;
}

/* A receiver that does not poll: the queue stops at its bound, the excess
 * is counted in the next notification that fits. */
static void test_queue_bound(void **state)
{
    (void)state;
    world_t *w = world_new();
    start_group(w, 0, false);
    kvr_agent_t *r = router(w, "router", NULL, 0);
    const char *rat = kvr_agent_address(r);
    for (uint32_t i = 0; i < KVR_AGENT_NOTIFY_QUEUE + 5; i++)
        send_text(w->cons[0].agent, "router", rat, "n");
    uint32_t dropped = 0;
    uint64_t end = ah_now_ms() + AH_WAIT_MS;
    while (queued(r, &dropped) < KVR_AGENT_NOTIFY_QUEUE || dropped < 5) {
        if (ah_now_ms() > end)
            fail_msg("queue %u, dropped %u", queued(r, &dropped), dropped);
        usleep(5000);
    }
    assert_int_equal(dropped, 5);
    for (uint32_t i = 0; i < KVR_AGENT_NOTIFY_QUEUE; i++)
        assert_int_equal(take(r)->dropped, 0);
    send_text(w->cons[0].agent, "router", rat, "after");
    kvr_agent_notify_t *n = take(r);
    expect_text(n, "decode", "after");
    assert_int_equal(n->dropped, 5);
    kvr_agent_destroy(r);
    world_free(w);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_notify_and_answer),
        cmocka_unit_test(test_router),
        cmocka_unit_test(test_notify_arguments),
        cmocka_unit_test(test_notify_failures),
        cmocka_unit_test(test_queue_bound),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
