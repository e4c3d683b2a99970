/* Send/save pairing on the producer's PP head (docs/design.md §8): both arrival
 * orders, operation ids, duplicates, caps, poll and forget. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>

#include <cmocka.h>

#include "kvrelay/completion.h"

#define ID(s) kvr_completion_req((s), strlen(s))
#define OP(s, g) kvr_completion_op((s), strlen(s), (g))

static kvr_pairing_t *make(size_t reqs, size_t events, size_t tombs)
{
    kvr_pairing_params_t prm = KVR_PAIRING_PARAMS_INIT;
    prm.max_requests = reqs;
    prm.max_events = events;
    prm.tombstones = tombs;
    kvr_pairing_t *p = NULL;
    assert_int_equal(kvr_pairing_create(&prm, &p, NULL), KVR_OK);
    return p;
}

static kvr_pairing_t *make_default(void)
{
    return make(64, 64, 64);
}

static void expect_save(kvr_pairing_t *p, kvr_completion_id_t id)
{
    kvr_error_t err = {0};
    assert_int_equal(kvr_pairing_expect_save(p, &id, &err), KVR_OK);
}

static void send(kvr_pairing_t *p, kvr_completion_id_t id, kvr_status_t st,
                 kvr_pair_outcome_t want)
{
    kvr_pair_outcome_t got = 99;
    assert_int_equal(kvr_pairing_send_done(p, &id, st, &got, NULL), KVR_OK);
    assert_int_equal(got, want);
}

static void save(kvr_pairing_t *p, kvr_completion_id_t id, kvr_status_t st,
                 kvr_pair_outcome_t want)
{
    kvr_pair_outcome_t got = 99;
    assert_int_equal(kvr_pairing_save_done(p, &id, st, &got, NULL), KVR_OK);
    assert_int_equal(got, want);
}

/* Polls and checks the released events: "S:name" sends, "V:name#g" saves
 * ("V:name" for a bare save id). */
static void expect_events(kvr_pairing_t *p, const char *const *want, size_t n)
{
    kvr_release_t ev[8];
    size_t got = 99;
    assert_int_equal(kvr_pairing_poll(p, ev, 8, &got, NULL), KVR_OK);
    assert_int_equal(got, n);
    for (size_t i = 0; i < n; i++) {
        char text[300];
        int len = snprintf(text, sizeof(text), "%c:%.*s",
                           ev[i].kind == KVR_RELEASE_SEND ? 'S' : 'V',
                           (int)ev[i].req_id_len, (const char *)ev[i].req_id);
        if (ev[i].is_op)
            snprintf(text + len, sizeof(text) - (size_t)len, "#%lld",
                     (long long)ev[i].generation);
        assert_string_equal(text, want[i]);
    }
}

#define EVENTS(p, ...)                                                         \
    do {                                                                       \
        const char *const w_[] = {__VA_ARGS__};                                \
        expect_events(p, w_, sizeof(w_) / sizeof(w_[0]));                      \
    } while (0)

static void expect_none(kvr_pairing_t *p)
{
    expect_events(p, NULL, 0);
}

static void test_send_then_save(void **state)
{
    (void)state;
    kvr_pairing_t *p = make_default();
    expect_save(p, OP("r", 0));
    send(p, ID("r"), KVR_OK, KVR_PAIR_HELD);
    expect_none(p);
    assert_int_equal(kvr_pairing_num_requests(p), 1);
    save(p, OP("r", 0), KVR_OK, KVR_PAIR_RELEASED);
    EVENTS(p, "V:r#0", "S:r");
    assert_int_equal(kvr_pairing_num_requests(p), 0);
    kvr_pairing_destroy(p);
    kvr_pairing_destroy(NULL);
}

static void test_save_then_send(void **state)
{
    (void)state;
    kvr_pairing_t *p = make_default();
    expect_save(p, OP("r", 3));
    save(p, OP("r", 3), KVR_OK, KVR_PAIR_RELEASED);
    EVENTS(p, "V:r#3");
    assert_int_equal(kvr_pairing_num_requests(p), 0);
    send(p, ID("r"), KVR_OK, KVR_PAIR_RELEASED);
    EVENTS(p, "S:r");
    kvr_pairing_destroy(p);
}

/* The save arrives before anyone declared it: the send is not held, and a
 * late declaration of that same save matches it instead of blocking. */
static void test_save_arrives_first_undeclared(void **state)
{
    (void)state;
    kvr_pairing_t *p = make_default();
    save(p, OP("r", 0), KVR_OK, KVR_PAIR_RELEASED);
    EVENTS(p, "V:r#0");
    expect_save(p, OP("r", 0));
    assert_int_equal(kvr_pairing_num_requests(p), 0);
    send(p, ID("r"), KVR_OK, KVR_PAIR_RELEASED);
    EVENTS(p, "S:r");

    save(p, OP("q", 1), KVR_OK, KVR_PAIR_RELEASED);
    send(p, ID("q"), KVR_OK, KVR_PAIR_RELEASED);
    EVENTS(p, "V:q#1", "S:q");
    assert_int_equal(kvr_pairing_num_requests(p), 0);
    /* declaring a save after the send went out is refused */
    kvr_error_t err = {0};
    kvr_completion_id_t late = OP("q", 2);
    assert_int_equal(kvr_pairing_expect_save(p, &late, &err), KVR_ERR_EXISTS);
    assert_non_null(strstr(err.msg, "request \"q\""));
    kvr_pairing_destroy(p);
}

static void test_send_only_not_held(void **state)
{
    (void)state;
    kvr_pairing_t *p = make_default();
    send(p, ID("a"), KVR_OK, KVR_PAIR_RELEASED);
    send(p, ID("b"), KVR_ERR_TIMEOUT, KVR_PAIR_RELEASED);
    kvr_release_t ev[4];
    size_t n = 0;
    assert_int_equal(kvr_pairing_poll(p, ev, 4, &n, NULL), KVR_OK);
    assert_int_equal(n, 2);
    assert_int_equal(ev[1].kind, KVR_RELEASE_SEND);
    assert_int_equal(ev[1].status, KVR_ERR_TIMEOUT);
    kvr_completion_id_t id = kvr_release_id(&ev[0]);
    assert_int_equal(id.req_id_len, 1);
    assert_memory_equal(id.req_id, "a", 1);
    assert_false(id.is_op);
    assert_int_equal(kvr_pairing_num_requests(p), 0);
    kvr_pairing_destroy(p);
}

/* Pairing keys on completion_req_key: an operation-id send pairs with a
 * bare-id save of the same request, and the other way round. */
static void test_keys_on_request(void **state)
{
    (void)state;
    kvr_pairing_t *p = make_default();
    expect_save(p, ID("r"));
    send(p, OP("r", 7), KVR_OK, KVR_PAIR_HELD);
    save(p, ID("r"), KVR_OK, KVR_PAIR_RELEASED);
    EVENTS(p, "V:r", "S:r#7");
    kvr_pairing_destroy(p);
}

static void test_two_saves(void **state)
{
    (void)state;
    kvr_pairing_t *p = make_default();
    expect_save(p, OP("r", 0));
    expect_save(p, OP("r", 1));
    expect_save(p, OP("r", 1)); /* idempotent */
    send(p, ID("r"), KVR_OK, KVR_PAIR_HELD);
    save(p, OP("r", 1), KVR_OK, KVR_PAIR_RELEASED);
    EVENTS(p, "V:r#1");
    /* an undeclared save of the request does not release the send */
    save(p, OP("r", 5), KVR_OK, KVR_PAIR_RELEASED);
    EVENTS(p, "V:r#5");
    save(p, OP("r", 0), KVR_ERR_IO, KVR_PAIR_RELEASED);
    kvr_release_t ev[4];
    size_t n = 0;
    assert_int_equal(kvr_pairing_poll(p, ev, 4, &n, NULL), KVR_OK);
    assert_int_equal(n, 2);
    assert_int_equal(ev[0].kind, KVR_RELEASE_SAVE);
    assert_int_equal(ev[0].status, KVR_ERR_IO); /* a failed save still ends */
    assert_int_equal(ev[1].kind, KVR_RELEASE_SEND);
    assert_int_equal(ev[1].status, KVR_OK);
    assert_int_equal(kvr_pairing_num_requests(p), 0);
    kvr_pairing_destroy(p);
}

static void test_duplicates(void **state)
{
    (void)state;
    kvr_pairing_t *p = make_default();
    expect_save(p, OP("r", 0));
    send(p, ID("r"), KVR_OK, KVR_PAIR_HELD);
    send(p, ID("r"), KVR_OK, KVR_PAIR_DUPLICATE);
    save(p, OP("r", 0), KVR_OK, KVR_PAIR_RELEASED);
    send(p, ID("r"), KVR_OK, KVR_PAIR_DUPLICATE);
    EVENTS(p, "V:r#0", "S:r");
    /* an early save reported twice is released once */
    save(p, OP("e", 0), KVR_OK, KVR_PAIR_RELEASED);
    save(p, OP("e", 0), KVR_OK, KVR_PAIR_DUPLICATE);
    EVENTS(p, "V:e#0");
    kvr_pairing_destroy(p);
}

static void test_poll_order_and_partial(void **state)
{
    (void)state;
    kvr_pairing_t *p = make(64, 64, 64);
    char name[8];
    for (int i = 0; i < 40; i++) { /* wraps the ring and grows it */
        snprintf(name, sizeof(name), "r%d", i);
        send(p, ID(name), KVR_OK, KVR_PAIR_RELEASED);
        if (i % 3 == 2) {
            kvr_release_t ev[2];
            size_t n = 0;
            assert_int_equal(kvr_pairing_poll(p, ev, 2, &n, NULL), KVR_OK);
            assert_int_equal(n, 2);
        }
    }
    assert_int_equal(kvr_pairing_num_events(p), 40 - 2 * 13);
    kvr_release_t ev[64];
    size_t n = 0;
    assert_int_equal(kvr_pairing_poll(p, ev, 64, &n, NULL), KVR_OK);
    assert_int_equal(n, 14);
    for (size_t i = 0; i < n; i++) {
        snprintf(name, sizeof(name), "r%zu", 26 + i);
        assert_int_equal(ev[i].req_id_len, strlen(name));
        assert_memory_equal(ev[i].req_id, name, strlen(name));
    }
    assert_int_equal(kvr_pairing_poll(p, NULL, 0, &n, NULL), KVR_OK);
    assert_int_equal(n, 0);
    kvr_pairing_destroy(p);
}

/* Unpolled events are capped; a refused call changes nothing and succeeds
 * once the caller polled. */
static void test_event_cap(void **state)
{
    (void)state;
    kvr_pairing_t *p = make(64, 2, 64);
    kvr_error_t err = {0};
    expect_save(p, OP("r", 0));
    send(p, ID("r"), KVR_OK, KVR_PAIR_HELD);
    send(p, ID("a"), KVR_OK, KVR_PAIR_RELEASED);
    kvr_completion_id_t sv = OP("r", 0);
    kvr_pair_outcome_t out = 99;
    assert_int_equal(kvr_pairing_save_done(p, &sv, KVR_OK, &out, &err),
                     KVR_ERR_TABLE_FULL);
    assert_non_null(strstr(err.msg, "max_events unpolled 2"));
    assert_int_equal(out, 99);
    assert_int_equal(kvr_pairing_num_requests(p), 1);
    EVENTS(p, "S:a");
    save(p, OP("r", 0), KVR_OK, KVR_PAIR_RELEASED);
    EVENTS(p, "V:r#0", "S:r");
    send(p, ID("b"), KVR_OK, KVR_PAIR_RELEASED);
    send(p, ID("c"), KVR_OK, KVR_PAIR_RELEASED);
    kvr_completion_id_t d = ID("d");
    assert_int_equal(kvr_pairing_send_done(p, &d, KVR_OK, NULL, &err),
                     KVR_ERR_TABLE_FULL);
    EVENTS(p, "S:b", "S:c");
    send(p, ID("d"), KVR_OK, KVR_PAIR_RELEASED); /* not tombstoned before */
    kvr_pairing_destroy(p);
}

static void test_request_caps(void **state)
{
    (void)state;
    kvr_pairing_t *p = make(2, 64, 64);
    kvr_error_t err = {0};
    expect_save(p, OP("a", 0));
    save(p, OP("b", 0), KVR_OK, KVR_PAIR_RELEASED); /* early: tracked */
    kvr_completion_id_t c = OP("c", 0);
    assert_int_equal(kvr_pairing_expect_save(p, &c, &err), KVR_ERR_TABLE_FULL);
    assert_non_null(strstr(err.msg, "\"c\": table full (max_requests 2"));
    assert_int_equal(kvr_pairing_save_done(p, &c, KVR_OK, NULL, &err),
                     KVR_ERR_TABLE_FULL);
    EVENTS(p, "V:b#0"); /* the refused save queued nothing */
    /* a request with no record needs none to release its send */
    send(p, ID("c"), KVR_OK, KVR_PAIR_RELEASED);
    EVENTS(p, "S:c");
    /* outstanding saves per request are capped too */
    for (int g = 1; g < (int)KVR_PAIRING_MAX_SAVES; g++)
        expect_save(p, OP("a", g));
    kvr_completion_id_t a = OP("a", 99);
    assert_int_equal(kvr_pairing_expect_save(p, &a, &err), KVR_ERR_TABLE_FULL);
    assert_non_null(strstr(err.msg, "saves per request 16"));
    assert_int_equal(kvr_pairing_num_requests(p), 2);
    kvr_pairing_destroy(p);
}

static void test_forget(void **state)
{
    (void)state;
    kvr_pairing_t *p = make_default();
    expect_save(p, OP("r", 0));
    send(p, ID("r"), KVR_OK, KVR_PAIR_HELD);
    kvr_completion_id_t r = ID("r");
    assert_int_equal(kvr_pairing_forget(p, &r, NULL), KVR_OK);
    assert_int_equal(kvr_pairing_num_requests(p), 0);
    expect_none(p); /* the held send was dropped, not released */
    send(p, ID("s"), KVR_OK, KVR_PAIR_RELEASED);
    kvr_completion_id_t s = OP("s", 4); /* any id of the request */
    assert_int_equal(kvr_pairing_forget(p, &s, NULL), KVR_OK);
    send(p, ID("s"), KVR_OK, KVR_PAIR_RELEASED); /* a re-issued id */
    EVENTS(p, "S:s", "S:s");
    assert_int_equal(kvr_pairing_forget(p, &s, NULL), KVR_OK);
    assert_int_equal(kvr_pairing_forget(p, &s, NULL), KVR_OK); /* unknown */
    kvr_pairing_destroy(p);
}

/* Released requests are remembered FIFO up to the tombstone capacity. */
static void test_release_tombstones(void **state)
{
    (void)state;
    kvr_pairing_t *p = make(8, 64, 2);
    send(p, ID("a"), KVR_OK, KVR_PAIR_RELEASED);
    send(p, ID("b"), KVR_OK, KVR_PAIR_RELEASED);
    send(p, ID("c"), KVR_OK, KVR_PAIR_RELEASED);
    send(p, ID("b"), KVR_OK, KVR_PAIR_DUPLICATE);
    send(p, ID("a"), KVR_OK, KVR_PAIR_RELEASED); /* evicted */
    /* a save of a released request is passed on and tracks nothing */
    save(p, OP("a", 0), KVR_OK, KVR_PAIR_RELEASED);
    assert_int_equal(kvr_pairing_num_requests(p), 0);
    EVENTS(p, "S:a", "S:b", "S:c", "S:a", "V:a#0");
    kvr_pairing_destroy(p);
}

static void test_errors(void **state)
{
    (void)state;
    kvr_error_t err = {0};
    kvr_pairing_params_t prm = KVR_PAIRING_PARAMS_INIT;
    kvr_pairing_t *p = NULL;
    prm.max_events = 1;
    assert_int_equal(kvr_pairing_create(&prm, &p, &err), KVR_ERR_INVALID);
    assert_non_null(strstr(err.msg, "max_events 1 < 2"));
    prm = (kvr_pairing_params_t)KVR_PAIRING_PARAMS_INIT;
    prm.max_requests = 0;
    assert_int_equal(kvr_pairing_create(&prm, &p, &err), KVR_ERR_INVALID);
    assert_non_null(strstr(err.msg, "max_requests 0"));
    prm.max_requests = 4;
    prm.tombstones = 0;
    assert_int_equal(kvr_pairing_create(&prm, &p, &err), KVR_ERR_INVALID);
    assert_non_null(strstr(err.msg, "tombstones 0"));
    assert_null(p);
    assert_int_equal(kvr_pairing_create(NULL, &p, &err), KVR_ERR_INVALID);
    p = make_default();
    kvr_completion_id_t bad = OP("r", -1);
    assert_int_equal(kvr_pairing_expect_save(p, &bad, &err), KVR_ERR_INVALID);
    assert_non_null(strstr(err.msg, "generation -1"));
    assert_int_equal(kvr_pairing_send_done(p, &bad, KVR_OK, NULL, &err),
                     KVR_ERR_INVALID);
    assert_int_equal(kvr_pairing_save_done(p, NULL, KVR_OK, NULL, &err),
                     KVR_ERR_INVALID);
    kvr_completion_id_t ok = ID("r");
    assert_int_equal(kvr_pairing_send_done(NULL, &ok, KVR_OK, NULL, &err),
                     KVR_ERR_INVALID);
    size_t n = 7;
    assert_int_equal(kvr_pairing_poll(p, NULL, 3, &n, &err), KVR_ERR_INVALID);
    assert_int_equal(n, 7);
    assert_int_equal(kvr_pairing_num_requests(p), 0);
    assert_int_equal(kvr_pairing_num_events(NULL), 0);
    kvr_pairing_destroy(p);
}

/* The PP head's wiring: sends aggregated over 2 TP workers, saves over 4
 * PP stages, then paired; late duplicates stop at the quorums. */
static void flow(kvr_quorum_t *sends, kvr_quorum_t *saves, kvr_pairing_t *p,
                 bool is_send, kvr_completion_id_t id, uint32_t member)
{
    kvr_quorum_result_t res;
    kvr_quorum_t *q = is_send ? sends : saves;
    assert_int_equal(kvr_quorum_report(q, &id, member, KVR_OK, &res, NULL),
                     KVR_OK);
    if (res.outcome != KVR_QUORUM_DONE)
        return;
    kvr_status_t s = is_send
                         ? kvr_pairing_send_done(p, &id, res.status, NULL, NULL)
                         : kvr_pairing_save_done(p, &id, res.status, NULL,
                                                 NULL);
    assert_int_equal(s, KVR_OK);
}

static void test_head_flow(void **state)
{
    (void)state;
    kvr_quorum_params_t tp = KVR_QUORUM_PARAMS_INIT, pp = tp;
    tp.members = 2;
    pp.members = 4;
    kvr_quorum_t *sends, *saves;
    assert_int_equal(kvr_quorum_create(&tp, &sends, NULL), KVR_OK);
    assert_int_equal(kvr_quorum_create(&pp, &saves, NULL), KVR_OK);
    kvr_pairing_t *p = make_default();
    expect_save(p, OP("a", 0));
    expect_save(p, OP("b", 0));
    /* a: both sends first, then the stages' saves */
    flow(sends, saves, p, true, ID("a"), 0);
    flow(sends, saves, p, true, ID("a"), 1);
    flow(sends, saves, p, true, ID("a"), 1); /* late duplicate */
    for (uint32_t st = 0; st < 3; st++)
        flow(sends, saves, p, false, OP("a", 0), st);
    /* b: interleaved, its saves complete before its sends */
    flow(sends, saves, p, true, ID("b"), 1);
    for (uint32_t st = 0; st < 4; st++)
        flow(sends, saves, p, false, OP("b", 0), st);
    EVENTS(p, "V:b#0"); /* a is still held: its last stage is missing */
    flow(sends, saves, p, false, OP("a", 0), 3);
    EVENTS(p, "V:a#0", "S:a");
    flow(sends, saves, p, true, ID("b"), 0);
    flow(sends, saves, p, false, OP("b", 0), 2); /* late duplicate */
    EVENTS(p, "S:b");
    assert_int_equal(kvr_pairing_num_requests(p), 0);
    kvr_pairing_destroy(p);
    kvr_quorum_destroy(sends);
    kvr_quorum_destroy(saves);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_send_then_save),
        cmocka_unit_test(test_save_then_send),
        cmocka_unit_test(test_save_arrives_first_undeclared),
        cmocka_unit_test(test_send_only_not_held),
        cmocka_unit_test(test_keys_on_request),
        cmocka_unit_test(test_two_saves),
        cmocka_unit_test(test_duplicates),
        cmocka_unit_test(test_poll_order_and_partial),
        cmocka_unit_test(test_event_cap),
        cmocka_unit_test(test_request_caps),
        cmocka_unit_test(test_forget),
        cmocka_unit_test(test_release_tombstones),
        cmocka_unit_test(test_errors),
        cmocka_unit_test(test_head_flow),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
