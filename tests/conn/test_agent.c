/* The agent in one process: producer instances of PP stages and decode
 * groups of DCP ranks over the loopback data transport, bytes verified
 * against the plan, every request ending in exactly one terminal event
 * (and on the consumer exactly one RELEASED after it). */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "agent_harness.h"

#define WAIT_MS 20000

typedef struct world {
    ah_model_t m;
    kvr_transport_t *hub;
    ah_agent_t prod[2][4]; /* [instance][pp stage] */
    uint32_t pp[2];
    ah_agent_t cons[2];    /* one decode group, dcp ranks 0 and 1 */
} world_t;

static void start_instance(world_t *w, uint32_t k, const char *name,
                           uint32_t pp, void (*tweak)(kvr_agent_params_t *))
{
    w->pp[k] = pp;
    for (uint32_t s = 0; s < pp; s++) {
        kvr_agent_params_t p = ah_producer_params(&w->m, w->hub, name, s, pp);
        if (s > 0)
            p.bootstrap = kvr_agent_address(w->prod[k][0].agent);
        if (tweak)
            tweak(&p);
        ah_start(&w->m, &p, 0, false, &w->prod[k][s]);
    }
}

static void start_group(world_t *w, uint32_t extra, bool flag)
{
    for (uint32_t r = 0; r < 2; r++) {
        kvr_agent_params_t p = ah_consumer_params(&w->m, w->hub, "decode", r);
        ah_start(&w->m, &p, extra, flag, &w->cons[r]);
    }
}

static world_t *world_new(void)
{
    world_t *w = calloc(1, sizeof(*w));
    w->m = ah_model();
    w->hub = ah_hub();
    return w;
}

static void world_free(world_t *w)
{
    for (uint32_t r = 0; r < 2; r++)
        if (w->cons[r].agent)
            ah_stop(&w->cons[r]);
    for (uint32_t k = 0; k < 2; k++)
        for (uint32_t s = 0; s < w->pp[k]; s++)
            ah_stop(&w->prod[k][s]);
    kvr_transport_destroy(w->hub);
    free(w);
}

static const char *head_addr(world_t *w, uint32_t k)
{
    return kvr_agent_address(w->prod[k][0].agent);
}

static ah_agent_t *const *stages_of(world_t *w, uint32_t k)
{
    static ah_agent_t *s[4];
    for (uint32_t i = 0; i < w->pp[k]; i++)
        s[i] = &w->prod[k][i];
    return s;
}

/* Both ranks LOADED then RELEASED exactly once; the bytes verified. */
static void expect_loaded(world_t *w, uint32_t k, const ah_req_t *r)
{
    for (uint32_t c = 0; c < 2; c++) {
        const kvr_agent_event_t *e = ah_wait(&w->cons[c], r->id,
                                             KVR_AGENT_RELEASED, WAIT_MS);
        assert_int_equal(e->status, KVR_OK);
        assert_int_equal(ah_count(&w->cons[c], r->id, KVR_AGENT_LOADED), 1);
        assert_int_equal(ah_count(&w->cons[c], r->id, KVR_AGENT_LOAD_FAILED), 0);
        ah_verify(&w->m, stages_of(w, k), w->pp[k], &w->cons[c], r);
    }
    for (uint32_t s = 0; s < w->pp[k]; s++)
        assert_int_equal(ah_wait(&w->prod[k][s], r->id, KVR_AGENT_SENT,
                                 WAIT_MS)->status, KVR_OK);
}

static void test_pp2_to_dcp2(void **state)
{
    (void)state;
    world_t *w = world_new();
    start_instance(w, 0, "prefill-a", 2, NULL);
    start_group(w, 0, false);
    ah_req_t r[3];
    for (uint32_t i = 0; i < 3; i++) {
        ah_req(&w->m, i, 100 + 77 * i, &r[i]);
        for (uint32_t s = 0; s < 2; s++) {
            ah_fill(&w->m, &w->prod[0][s], &r[i]);
            ah_open(&w->prod[0][s], &r[i], 0, 1, true);
        }
        for (uint32_t c = 0; c < 2; c++)
            ah_recv(&w->cons[c], "prefill-a", head_addr(w, 0), &r[i], 0);
    }
    for (uint32_t i = 0; i < 3; i++)
        expect_loaded(w, 0, &r[i]);
    /* the key is free again once its last event was polled */
    kvr_agent_req_status_t st;
    assert_int_equal(kvr_agent_status(w->cons[0].agent, "prefill-a", 9, "req-0",
                                      5, &st), KVR_ERR_NOT_FOUND);
    world_free(w);
}

/* A consumer request that ended: exactly one LOAD_FAILED with st, then
 * exactly one RELEASED, and no LOADED. */
static const kvr_agent_event_t *expect_failed(ah_agent_t *c, const char *id,
                                              kvr_status_t st)
{
    const kvr_agent_event_t *e = ah_wait(c, id, KVR_AGENT_LOAD_FAILED, WAIT_MS);
    if (e->status != st)
        fail_msg("'%s': %s (%s), expected %s", id, kvr_status_name(e->status),
                 e->message, kvr_status_name(st));
    ah_wait(c, id, KVR_AGENT_RELEASED, WAIT_MS);
    assert_int_equal(ah_count(c, id, KVR_AGENT_LOAD_FAILED), 1);
    assert_int_equal(ah_count(c, id, KVR_AGENT_RELEASED), 1);
    assert_int_equal(ah_count(c, id, KVR_AGENT_LOADED), 0);
    /* RELEASED comes after LOAD_FAILED */
    uint32_t failed_at = 0, released_at = 0;
    for (uint32_t i = 0; i < c->nlog; i++) {
        if (strlen(id) != c->log[i].request.len ||
            memcmp(id, c->log[i].request.bytes, c->log[i].request.len))
            continue;
        if (c->log[i].kind == KVR_AGENT_LOAD_FAILED)
            failed_at = i + 1;
        if (c->log[i].kind == KVR_AGENT_RELEASED)
            released_at = i + 1;
    }
    assert_true(failed_at < released_at);
    return e;
}

static void fill_all(world_t *w, uint32_t k, const ah_req_t *r)
{
    for (uint32_t s = 0; s < w->pp[k]; s++)
        ah_fill(&w->m, &w->prod[k][s], r);
}

static void open_all(world_t *w, uint32_t k, const ah_req_t *r,
                     uint32_t lease_ms, bool ready)
{
    for (uint32_t s = 0; s < w->pp[k]; s++)
        ah_open(&w->prod[k][s], r, lease_ms, 1, ready);
}

static void recv_all(world_t *w, uint32_t k, const char *name,
                     const ah_req_t *r, uint32_t deadline_ms)
{
    for (uint32_t c = 0; c < 2; c++)
        ah_recv(&w->cons[c], name, head_addr(w, k), r, deadline_ms);
}

/* Pulls that arrive before send_open and before send_ready are held, then
 * served. */
static void test_pull_before_open_and_ready(void **state)
{
    (void)state;
    world_t *w = world_new();
    start_instance(w, 0, "prefill-a", 2, NULL);
    start_group(w, 0, false);
    ah_req_t r;
    ah_req(&w->m, 1, 300, &r);
    fill_all(w, 0, &r);
    recv_all(w, 0, "prefill-a", &r, 0);
    ah_agent_t *all[] = {&w->cons[0], &w->cons[1]};
    ah_settle(all, 2, 300); /* the pulls reach the stages, unknown there */
    open_all(w, 0, &r, 0, false);
    ah_settle(all, 2, 300);
    for (uint32_t c = 0; c < 2; c++)
        assert_int_equal(ah_count(&w->cons[c], r.id, KVR_AGENT_LOADED), 0);
    kvr_agent_req_status_t st;
    assert_int_equal(kvr_agent_status(w->prod[0][1].agent, "prefill-a", 9,
                                      r.id, strlen(r.id), &st), KVR_OK);
    assert_int_equal(st.send, KVR_SEND_OPEN);
    assert_int_equal(kvr_agent_status(w->cons[0].agent, "prefill-a", 9, r.id,
                                      strlen(r.id), &st), KVR_OK);
    assert_int_equal(st.recv, KVR_RECV_PULLING);
    for (uint32_t s = 0; s < 2; s++) /* each stage its own layers */
        assert_int_equal(kvr_agent_send_ready(w->prod[0][s].agent, r.id,
                                              strlen(r.id), 2 * s, 2 * s + 2,
                                              NULL), KVR_OK);
    expect_loaded(w, 0, &r);
    world_free(w);
}

static void short_unknown_wait(kvr_agent_params_t *p)
{
    p->unknown_wait_ms = 300;
}

/* A pull for a request the producer never opened is refused, not served
 * from whatever the consumer's tables say. */
static void test_never_opened(void **state)
{
    (void)state;
    world_t *w = world_new();
    start_instance(w, 0, "prefill-a", 2, short_unknown_wait);
    start_group(w, 0, false);
    ah_req_t r;
    ah_req(&w->m, 2, 200, &r);
    recv_all(w, 0, "prefill-a", &r, 0);
    for (uint32_t c = 0; c < 2; c++) {
        const kvr_agent_event_t *e = expect_failed(&w->cons[c], r.id,
                                                   KVR_ERR_NOT_FOUND);
        assert_non_null(strstr(e->message, "never opened"));
    }
    world_free(w);
}

/* A producer address nobody listens on fails within the deadline, naming
 * the address. */
static void test_unknown_producer(void **state)
{
    (void)state;
    world_t *w = world_new();
    start_group(w, 0, false);
    ah_req_t r;
    ah_req(&w->m, 3, 50, &r);
    uint64_t t0 = ah_now_ms();
    ah_recv(&w->cons[0], "nobody", "127.0.0.1:1", &r, 3000);
    const kvr_agent_event_t *e = ah_wait(&w->cons[0], r.id,
                                         KVR_AGENT_LOAD_FAILED, WAIT_MS);
    assert_non_null(strstr(e->message, "127.0.0.1:1"));
    assert_true(ah_now_ms() - t0 < 3000 + 2000);
    ah_wait(&w->cons[0], r.id, KVR_AGENT_RELEASED, WAIT_MS);
    /* and a name that does not resolve */
    ah_req(&w->m, 4, 50, &r);
    ah_recv(&w->cons[1], "nobody", "no-such-host.invalid:7000", &r, 3000);
    e = ah_wait(&w->cons[1], r.id, KVR_AGENT_LOAD_FAILED, WAIT_MS);
    assert_non_null(strstr(e->message, "no-such-host.invalid:7000"));
    world_free(w);
}

/* xPyD: one decode group loads A from instance 1 and B from instance 2 at
 * the same time; a PP2 and a PP1 instance. */
static void test_two_instances(void **state)
{
    (void)state;
    world_t *w = world_new();
    start_instance(w, 0, "prefill-a", 2, NULL);
    start_instance(w, 1, "prefill-b", 1, NULL);
    start_group(w, 0, false);
    ah_req_t a, b;
    ah_req(&w->m, 5, 333, &a);
    ah_req(&w->m, 6, 250, &b);
    fill_all(w, 0, &a);
    fill_all(w, 1, &b);
    open_all(w, 0, &a, 0, true);
    open_all(w, 1, &b, 0, true);
    recv_all(w, 0, "prefill-a", &a, 0);
    recv_all(w, 1, "prefill-b", &b, 0);
    expect_loaded(w, 0, &a);
    expect_loaded(w, 1, &b);
    world_free(w);
}

/* Nobody pulls: the lease ends, SEND_EXPIRED, the key is free again. */
static void test_lease_expiry(void **state)
{
    (void)state;
    world_t *w = world_new();
    start_instance(w, 0, "prefill-a", 1, NULL);
    ah_req_t r;
    ah_req(&w->m, 7, 100, &r);
    ah_open(&w->prod[0][0], &r, 300, 1, true);
    const kvr_agent_event_t *e = ah_wait(&w->prod[0][0], r.id,
                                         KVR_AGENT_SEND_EXPIRED, WAIT_MS);
    assert_int_equal(e->status, KVR_ERR_TIMEOUT);
    assert_non_null(strstr(e->message, "lease"));
    ah_open(&w->prod[0][0], &r, 0, 1, true); /* reusable */
    world_free(w);
}

/* An extra consumer layer (an MTP draft layer) fails the load unless it is
 * declared consumer-only. */
static void test_consumer_only_layer(void **state)
{
    (void)state;
    for (int flag = 0; flag < 2; flag++) {
        world_t *w = world_new();
        start_instance(w, 0, "prefill-a", 2, NULL);
        start_group(w, 1, flag);
        ah_req_t r;
        ah_req(&w->m, 8, 180, &r);
        fill_all(w, 0, &r);
        open_all(w, 0, &r, 0, true);
        recv_all(w, 0, "prefill-a", &r, 0);
        if (flag) {
            expect_loaded(w, 0, &r);
        } else {
            for (uint32_t c = 0; c < 2; c++) {
                const kvr_agent_event_t *e =
                    expect_failed(&w->cons[c], r.id, KVR_ERR_LAYOUT_MISMATCH);
                assert_non_null(strstr(e->message, "layer 4"));
            }
            for (uint32_t s = 0; s < 2; s++)
                kvr_agent_send_abort(w->prod[0][s].agent, r.id, strlen(r.id));
        }
        world_free(w);
    }
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_pp2_to_dcp2),
        cmocka_unit_test(test_pull_before_open_and_ready),
        cmocka_unit_test(test_never_opened),
        cmocka_unit_test(test_unknown_producer),
        cmocka_unit_test(test_two_instances),
        cmocka_unit_test(test_lease_expiry),
        cmocka_unit_test(test_consumer_only_layer),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
