/* The agent in one process: producer instances of PP stages and decode
 * groups of DCP ranks over the loopback data transport, bytes verified
 * against the plan, every request ending in exactly one terminal event
 * (and on the consumer exactly one RELEASED after it). */
#include <pthread.h>
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
    assert_int_equal(
        kvr_agent_status(w->cons[0].agent, "prefill-a", 9, "req-0", 5, &st),
        KVR_ERR_NOT_FOUND);
    world_free(w);
}

/* Until no turn runs on x's agent (its progress thread sleeps), at most
 * about a second: after a load the thread has nothing left to do, but on
 * a loaded machine (a clean CI run) it was still in its last turn at each
 * of the five recvs below. */
static void until_idle(const ah_agent_t *x)
{
    for (int k = 0; k < 1000; k++) {
        if (pthread_mutex_trylock(&x->agent->turn_lock) == 0) {
            pthread_mutex_unlock(&x->agent->turn_lock);
            return;
        }
        usleep(1000);
    }
}

/* A recv whose producer's links are all up starts on the caller's thread
 * while the progress thread sleeps; the first one, which must dial, never
 * does (the caller does no network I/O that can wait). Both load whole. */
static void test_recv_started_by_caller(void **state)
{
    (void)state;
    world_t *w = world_new();
    start_instance(w, 0, "prefill-a", 2, NULL);
    start_group(w, 0, false);
    ah_req_t r[6];
    for (uint32_t i = 0; i < 6; i++) {
        ah_req(&w->m, i, 64 + 50 * i, &r[i]);
        fill_all(w, 0, &r[i]);
        open_all(w, 0, &r[i], 0, true);
        for (uint32_t c = 0; i > 0 && c < 2; c++)
            until_idle(&w->cons[c]);
        recv_all(w, 0, "prefill-a", &r[i], 0);
        if (i == 0)
            for (uint32_t c = 0; c < 2; c++)
                assert_int_equal(kvr__agent_inline_recvs(w->cons[c].agent), 0);
        expect_loaded(w, 0, &r[i]); /* the thread is idle after it */
    }
    /* five chances each: only a turn started since until_idle passes one */
    for (uint32_t c = 0; c < 2; c++)
        assert_true(kvr__agent_inline_recvs(w->cons[c].agent) >= 1);
    world_free(w);
}

static void direct(kvr_agent_params_t *p)
{
    p->executor = KVR_AGENT_EXEC_DIRECT;
}

/* The consumer's memory can be mapped for good (as UCX shm maps memory
 * the peer allocated through kvrelay). */
static void direct_mapped(kvr_agent_params_t *p)
{
    direct(p);
    p->loopback.map_stores = true;
}

/* Mapping is allowed but every kvr_rmem_ptr fails (as ucp_rkey_ptr does
 * on memory the peer registered rather than allocated). */
static void direct_map_refused(kvr_agent_params_t *p)
{
    direct_mapped(p);
    p->loopback.no_map = true;
}

/* Each stage of both instances moved bytes, all of them by stores into
 * mapped memory (stores) or all by puts. */
static void expect_direct_bytes(world_t *w, bool stores)
{
    for (uint32_t k = 0; k < 2; k++)
        for (uint32_t s = 0; s < w->pp[k]; s++) {
            uint64_t stored, put;
            kvr__agent_direct_bytes(w->prod[k][s].agent, &stored, &put);
            assert_true((stores ? stored : put) > 0);
            assert_int_equal(stores ? put : stored, 0);
        }
}

/* Direct sends store straight into the consumer's mapped pages when the
 * transport can map them, and put otherwise; every byte is verified in
 * both (two_instances_loaded checks each rank). */
static void test_direct_stores_or_puts(void **state)
{
    (void)state;
    world_t *w = two_instances_loaded(direct_mapped);
    expect_direct_bytes(w, true);
    world_free(w);
    w = two_instances_loaded(direct);
    expect_direct_bytes(w, false);
    world_free(w);
    w = two_instances_loaded(direct_map_refused);
    expect_direct_bytes(w, false);
    world_free(w);
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
    assert_int_equal(kvr_agent_status(w->prod[0][1].agent, "prefill-a", 9, r.id,
                                      strlen(r.id), &st),
                     KVR_OK);
    assert_int_equal(st.send, KVR_SEND_OPEN);
    assert_int_equal(kvr_agent_status(w->cons[0].agent, "prefill-a", 9, r.id,
                                      strlen(r.id), &st),
                     KVR_OK);
    assert_int_equal(st.recv, KVR_RECV_PULLING);
    for (uint32_t s = 0; s < 2; s++) /* each stage its own layers */
        assert_int_equal(kvr_agent_send_ready(w->prod[0][s].agent, r.id,
                                              strlen(r.id), 2 * s, 2 * s + 2,
                                              NULL),
                         KVR_OK);
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
                                         KVR_AGENT_LOAD_FAILED, AH_WAIT_MS);
    assert_non_null(strstr(e->message, "127.0.0.1:1"));
    assert_true(ah_now_ms() - t0 < 3000 + 2000);
    ah_wait(&w->cons[0], r.id, KVR_AGENT_RELEASED, AH_WAIT_MS);
    /* and a name that does not resolve */
    ah_req(&w->m, 4, 50, &r);
    ah_recv(&w->cons[1], "nobody", "no-such-host.invalid:7000", &r, 3000);
    e = ah_wait(&w->cons[1], r.id, KVR_AGENT_LOAD_FAILED, AH_WAIT_MS);
    assert_non_null(strstr(e->message, "no-such-host.invalid:7000"));
    world_free(w);
}

/* xPyD: one decode group loads A from instance 1 and B from instance 2 at
 * the same time; a PP2 and a PP1 instance. */
static void test_two_instances(void **state)
{
    (void)state;
    world_free(two_instances_loaded(NULL));
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
                                         KVR_AGENT_SEND_EXPIRED, AH_WAIT_MS);
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
                const kvr_agent_event_t *e = expect_failed(
                    &w->cons[c], r.id, KVR_ERR_LAYOUT_MISMATCH);
                assert_non_null(strstr(e->message, "layer 4"));
            }
            for (uint32_t s = 0; s < 2; s++)
                kvr_agent_send_abort(w->prod[0][s].agent, r.id, strlen(r.id));
        }
        world_free(w);
    }
}

/* Where no GPU is (or kvrelay has no CUDA), an agent with KV in CUDA
 * memory is refused at create; a host agent refuses a CUDA event. */
static void test_cuda_refusals(void **state)
{
    (void)state;
    world_t *w = world_new();
    kvr_agent_params_t p = ah_producer_params(&w->m, w->hub, "prefill-a", 0, 1);
    kvr_agent_t *a = NULL;
    kvr_error_t err = {0};
    p.cuda_device = 0;
    if (kvr__gpu_device_count() == 0) {
        assert_int_equal(kvr_agent_create(&p, &a, &err), KVR_ERR_UNSUPPORTED);
        assert_non_null(strstr(err.msg, "CUDA device 0"));
    }
    start_instance(w, 0, "prefill-a", 1, NULL);
    ah_req_t r;
    ah_req(&w->m, 9, 64, &r);
    ah_open(&w->prod[0][0], &r, 0, 1, false);
    int fake_event;
    assert_int_equal(kvr_agent_send_ready(w->prod[0][0].agent, r.id,
                                          strlen(r.id), 0, 4, &fake_event),
                     KVR_ERR_UNSUPPORTED);
    assert_non_null(
        strstr(kvr_agent_last_error(w->prod[0][0].agent), "host memory"));
    world_free(w);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_pp2_to_dcp2),
        cmocka_unit_test(test_recv_started_by_caller),
        cmocka_unit_test(test_pull_before_open_and_ready),
        cmocka_unit_test(test_never_opened),
        cmocka_unit_test(test_unknown_producer),
        cmocka_unit_test(test_two_instances),
        cmocka_unit_test(test_direct_stores_or_puts),
        cmocka_unit_test(test_lease_expiry),
        cmocka_unit_test(test_consumer_only_layer),
        cmocka_unit_test(test_cuda_refusals),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
