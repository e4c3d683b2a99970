/* The agent's staged executor over the loopback transport: chunks through
 * the consumer's staging slots (few slots, so pulls wait for acks and
 * stages wait for slots), the cost model's choice under AUTO, put
 * failures, slow puts and an abort while chunks move. Bytes verified;
 * every request ends in exactly one terminal event, RELEASED last. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "agent_harness.h"
#include "agent_internal.h"

static const char *A = "prefill-a";

static void exec_staged(kvr_agent_params_t *p)
{
    p->executor = KVR_AGENT_EXEC_STAGED;
}

static void exec_direct(kvr_agent_params_t *p)
{
    p->executor = KVR_AGENT_EXEC_DIRECT;
}

/* Producers that put chunks (no mapping of the consumer's staging, as
 * over UCX tcp), with a third put failing or every put slow. */
static void unmapped_staged(kvr_agent_params_t *p)
{
    p->loopback.no_map = true;
    p->executor = KVR_AGENT_EXEC_STAGED;
}

static void unmapped_failing(kvr_agent_params_t *p)
{
    p->loopback.no_map = true;
    p->loopback.fail_put_at = 3;
}

static void unmapped_failing_staged(kvr_agent_params_t *p)
{
    unmapped_failing(p);
    p->executor = KVR_AGENT_EXEC_STAGED;
}

static void unmapped_slow(kvr_agent_params_t *p)
{
    p->loopback.no_map = true;
    p->loopback.delay_ms = 20;
}

/* Consumers with `slots` staging slots of 4 KiB (one is the probe's). */
static world_t *staged_world(uint32_t pp, ah_tweak_t prod, uint32_t slots,
                             ah_tweak_t cons)
{
    world_t *w = world_new();
    w->m.staging_slots = slots;
    w->m.slot_bytes = 4096;
    start_instance(w, 0, A, pp, prod);
    start_group_tweaked(w, 0, false, cons);
    return w;
}

/* Until the stage has a cost probe under way (want) or none. */
static void wait_probing(ah_agent_t *x, bool want)
{
    uint64_t end = ah_now_ms() + AH_WAIT_MS;
    while ((kvr__agent_probing(x->agent) > 0) != want) {
        if (ah_now_ms() >= end)
            fail_msg("the stage's cost probes: still %s after %u ms",
                     want ? "none" : "some", AH_WAIT_MS);
        ah_settle((ah_agent_t *[]){x}, 1, 10);
    }
}

static void load_n(world_t *w, uint32_t n, uint32_t first)
{
    ah_req_t r[8];
    for (uint32_t i = 0; i < n; i++) {
        ah_req(&w->m, first + i, 150 + 61 * i, &r[i]);
        fill_all(w, 0, &r[i]);
        open_all(w, 0, &r[i], 0, true);
        recv_all(w, 0, A, &r[i], 0);
    }
    for (uint32_t i = 0; i < n; i++)
        expect_loaded(w, 0, &r[i]);
}

/* Consumers ask for STAGED: every byte comes as chunks through 7 slots
 * (a few per stage, so the producer waits for acks), unpacked before
 * LOADED; the producers' AUTO honours the ask. */
static void test_staged(void **state)
{
    (void)state;
    world_t *w = staged_world(2, NULL, 8, exec_staged);
    load_n(w, 3, 0);
    for (uint32_t c = 0; c < 2; c++)
        assert_true(kvr__agent_chunks(w->cons[c].agent) > 3 * 2);
    assert_true(kvr__agent_chunks(w->prod[0][0].agent) > 0);
    world_free(w);
}

/* Two usable slots for four concurrent requests from two stages: stages
 * wait for slots (back-pressure) and every request still loads. */
static void test_staged_backpressure(void **state)
{
    (void)state;
    world_t *w = staged_world(2, NULL, 3, exec_staged);
    load_n(w, 4, 10);
    world_free(w);
}

/* AUTO on both sides: the producer probes the cost model at REGIONS and
 * picks per pull; the bytes are right either way. A producer forced to
 * STAGED stages when the consumer grants slots; a consumer that asks for
 * DIRECT gets no chunks. */
static void test_auto_and_forced(void **state)
{
    (void)state;
    world_t *w = staged_world(2, NULL, 8, NULL);
    load_n(w, 2, 20);
    for (uint32_t s = 0; s < 2; s++) /* each stage's probes ended */
        wait_probing(&w->prod[0][s], false);
    world_free(w);

    w = staged_world(1, exec_staged, 8, NULL);
    load_n(w, 2, 22);
    assert_true(kvr__agent_chunks(w->cons[0].agent) > 0);
    world_free(w);

    w = staged_world(1, exec_staged, 8, exec_direct);
    load_n(w, 2, 24);
    assert_int_equal(kvr__agent_chunks(w->cons[0].agent), 0);
    assert_int_equal(kvr__agent_chunks(w->cons[1].agent), 0);
    world_free(w);
}

/* Chunks put into staging that the producer cannot map (as over UCX
 * tcp) rather than packed in place. */
static void test_staged_unmapped(void **state)
{
    (void)state;
    world_t *w = staged_world(2, unmapped_staged, 8, exec_staged);
    load_n(w, 2, 28);
    assert_true(kvr__agent_chunks(w->prod[0][1].agent) > 2);
    world_free(w);
}

/* Rank 0 loads request id from a world whose third put fails: the load
 * fails once with the transport's error and is released; rank 1 never
 * pulls, so the stage's request ends at its abort. */
static void load_meets_failure(ah_tweak_t prod, ah_tweak_t cons, uint32_t id)
{
    world_t *w = staged_world(1, prod, 8, cons);
    ah_req_t r;
    ah_req(&w->m, id, 400, &r);
    fill_all(w, 0, &r);
    open_all(w, 0, &r, 0, true);
    ah_recv(&w->cons[0], A, head_addr(w, 0), &r, 0);
    expect_failed(&w->cons[0], r.id, KVR_ERR_TRANSPORT);
    kvr_agent_send_abort(w->prod[0][0].agent, r.id, strlen(r.id));
    ah_wait(&w->prod[0][0], r.id, KVR_AGENT_SEND_FAILED, AH_WAIT_MS);
    world_free(w);
}

/* A chunk's put fails (staged, forced on both sides). */
static void test_staged_put_failure(void **state)
{
    (void)state;
    load_meets_failure(unmapped_failing_staged, exec_staged, 31);
}

/* AUTO on both sides: whether the cost probe or a transfer meets the
 * failing put, the outcome is the same. */
static void test_auto_put_failure(void **state)
{
    (void)state;
    load_meets_failure(unmapped_failing, NULL, 32);
}

static void slow_staged(kvr_agent_params_t *p)
{
    unmapped_slow(p);
    p->executor = KVR_AGENT_EXEC_STAGED;
}

static void slower_staged(kvr_agent_params_t *p)
{
    slow_staged(p);
    p->loopback.delay_ms = 40;
}

/* Slow puts, staged (forced) and AUTO (the probe too is slow): loaded. */
static void test_slow_puts(void **state)
{
    (void)state;
    world_t *w = staged_world(2, slow_staged, 8, exec_staged);
    load_n(w, 1, 40);
    world_free(w);
    w = staged_world(1, unmapped_slow, 8, NULL);
    load_n(w, 1, 41);
    world_free(w);
}

/* The cost probe runs in steps between the stage's turns. Every unit of
 * it made 150 ms late (failpoint slow-probe: some 15 s a probe, which, run
 * at once on the stage's loop, timed out the handshake of a rank dialling
 * meanwhile), rank 1 dials while rank 0's link is probed and both load
 * (priced by the default model while unmeasured). Disarmed, the probes
 * then end. */
static void test_probe_in_steps(void **state)
{
    (void)state;
    world_t *w = staged_world(1, NULL, 8, NULL);
    assert_int_equal(kvr_failpoint_arm("slow-probe", "", NULL), KVR_OK);
    ah_req_t r;
    ah_req(&w->m, 45, 150, &r);
    fill_all(w, 0, &r);
    open_all(w, 0, &r, 0, true);
    ah_recv(&w->cons[0], A, head_addr(w, 0), &r, 0);
    wait_probing(&w->prod[0][0], true);
    ah_recv(&w->cons[1], A, head_addr(w, 0), &r, 0);
    expect_loaded(w, 0, &r);
    kvr_failpoint_disarm_all();
    wait_probing(&w->prod[0][0], false);
    world_free(w);
}

static void first_put_fails(kvr_agent_params_t *p)
{
    p->loopback.no_map = true;
    p->loopback.fail_put_at = 1;
}

/* The probe's own put fails (the stage holds the pull: its request is
 * open with no layer ready, so the probe makes the first put): the link
 * is refused and the load fails with the transport's error, as when the
 * probe ran whole at REGIONS. */
static void test_probe_failure(void **state)
{
    (void)state;
    world_t *w = staged_world(1, first_put_fails, 8, NULL);
    ah_req_t r;
    ah_req(&w->m, 46, 150, &r);
    fill_all(w, 0, &r);
    open_all(w, 0, &r, 0, false);
    ah_recv(&w->cons[0], A, head_addr(w, 0), &r, 0);
    expect_failed(&w->cons[0], r.id, KVR_ERR_TRANSPORT);
    ah_wait(&w->cons[0], r.id, KVR_AGENT_RELEASED, AH_WAIT_MS);
    assert_int_equal(kvr__agent_probing(w->prod[0][0].agent), 0);
    kvr_agent_send_abort(w->prod[0][0].agent, r.id, strlen(r.id));
    ah_wait(&w->prod[0][0], r.id, KVR_AGENT_SEND_FAILED, AH_WAIT_MS);
    world_free(w);
}

static int disarm(void **state)
{
    (void)state;
    kvr_failpoint_disarm_all();
    return 0;
}

/* The consumer aborts while chunks are moving (slow puts): one
 * LOAD_FAILED, RELEASED after the stage stopped; no chunk is unpacked
 * after it; the producer's request fails once the group's other rank
 * pulled too. */
static void test_abort_while_staging(void **state)
{
    (void)state;
    world_t *w = staged_world(1, slower_staged, 3, exec_staged);
    ah_req_t r;
    ah_req(&w->m, 42, 500, &r);
    fill_all(w, 0, &r);
    open_all(w, 0, &r, 0, true);
    ah_recv(&w->cons[0], A, head_addr(w, 0), &r, 0);
    uint64_t end = ah_now_ms() + AH_WAIT_MS;
    while (kvr__agent_chunks(w->cons[0].agent) < 2 && ah_now_ms() < end)
        ah_settle((ah_agent_t *[]){&w->cons[0]}, 1, 5);
    assert_int_equal(kvr_agent_recv_abort(w->cons[0].agent, A, strlen(A), r.id,
                                          strlen(r.id)),
                     KVR_OK);
    expect_failed(&w->cons[0], r.id, KVR_ERR_CANCELED);
    uint64_t after = kvr__agent_chunks(w->cons[0].agent);
    ah_settle((ah_agent_t *[]){&w->cons[0]}, 1, 200);
    assert_int_equal(kvr__agent_chunks(w->cons[0].agent), after);
    /* its group failed (rank 0's release said so); rank 1 then pulls and
     * the request ends as failed */
    ah_recv(&w->cons[1], A, head_addr(w, 0), &r, 0);
    ah_wait(&w->cons[1], r.id, KVR_AGENT_RELEASED, AH_WAIT_MS);
    assert_int_equal(
        ah_wait(&w->prod[0][0], r.id, KVR_AGENT_SEND_FAILED, AH_WAIT_MS)
            ->status,
        KVR_ERR_CANCELED);
    world_free(w);
}

/* Over UCX tcp (no loopback hub): the shape of test_gpu_agent
 * --tcp-staged with host memory. The producer's AUTO probes the cost
 * model into the last staging slot when the link is set up; the consumers
 * force STAGED with 16 KiB slots (several chunks a pull, so the producer
 * waits for acks); both requests are pulled at once, so the second waits
 * for slots; the pulls are held until send_ready. Skipped without UCX. */
static void ucx_tcp(kvr_agent_params_t *p)
{
    p->loopback_hub = NULL;
    p->tl = KVR_AGENT_TL_TCP;
}

static void ucx_tcp_staged(kvr_agent_params_t *p)
{
    ucx_tcp(p);
    p->executor = KVR_AGENT_EXEC_STAGED;
}

static void test_ucx_tcp_held_pulls(void **state)
{
    (void)state;
    if (strcmp(kvr__data_ucx_version(), "none") == 0)
        skip();
    world_t *w = world_new();
    w->m.staging_slots = 5; /* 4 usable: one request's worth */
    w->m.slot_bytes = 16u << 10;
    start_instance(w, 0, A, 1, ucx_tcp);
    start_group_tweaked(w, 0, false, ucx_tcp_staged);
    ah_req_t r[2];
    for (uint32_t i = 0; i < 2; i++) {
        ah_req(&w->m, 50 + i, i ? 173 : 300, &r[i]);
        fill_all(w, 0, &r[i]);
        open_all(w, 0, &r[i], 0, false);
        recv_all(w, 0, A, &r[i], 0);
    }
    ah_settle((ah_agent_t *[]){&w->cons[0], &w->cons[1]}, 2, 300);
    for (uint32_t i = 0; i < 2; i++) {
        assert_int_equal(kvr_agent_send_ready(w->prod[0][0].agent, r[i].id,
                                              strlen(r[i].id), 0, 1u << 30,
                                              NULL),
                         KVR_OK);
        expect_loaded(w, 0, &r[i]);
    }
    for (uint32_t c = 0; c < 2; c++)
        assert_true(kvr__agent_chunks(w->cons[c].agent) > 2 * 2);
    world_free(w);
}

/* Staging belongs to consumers; STAGED needs it. */
static void test_staging_rules(void **state)
{
    (void)state;
    world_t *w = world_new();
    kvr_error_t err = {0};
    kvr_agent_params_t p = ah_producer_params(&w->m, w->hub, A, 0, 1);
    kvr_agent_t *a = NULL;
    assert_int_equal(kvr_agent_create(&p, &a, &err), KVR_OK);
    kvr_region_desc_t d = {
        .role = KVR_ROLE_STAGING, .num_blocks = 4, .page_bytes = 4096};
    void *base = NULL;
    assert_int_equal(kvr_agent_alloc_region(a, &d, 0, &base), KVR_ERR_INVALID);
    assert_non_null(strstr(kvr_agent_last_error(a), "STAGING"));
    kvr_agent_destroy(a);
    p = ah_consumer_params(&w->m, w->hub, "decode", 0);
    p.executor = KVR_AGENT_EXEC_STAGED;
    assert_int_equal(kvr_agent_create(&p, &a, &err), KVR_OK);
    d.num_blocks = 1;
    assert_int_equal(kvr_agent_alloc_region(a, &d, 0, &base), KVR_ERR_INVALID);
    assert_int_equal(kvr_agent_start(a), KVR_ERR_INVALID);
    assert_non_null(strstr(kvr_agent_last_error(a), "STAGING"));
    kvr_agent_destroy(a);
    world_free(w);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_staged),
        cmocka_unit_test(test_staged_backpressure),
        cmocka_unit_test(test_auto_and_forced),
        cmocka_unit_test(test_staged_unmapped),
        cmocka_unit_test(test_staged_put_failure),
        cmocka_unit_test(test_auto_put_failure),
        cmocka_unit_test_teardown(test_probe_in_steps, disarm),
        cmocka_unit_test(test_probe_failure),
        cmocka_unit_test(test_slow_puts),
        cmocka_unit_test(test_abort_while_staging),
        cmocka_unit_test(test_ucx_tcp_held_pulls),
        cmocka_unit_test(test_staging_rules),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
