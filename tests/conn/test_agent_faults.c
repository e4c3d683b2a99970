/* The agent under faults: aborts in every state, lost and duplicated
 * control frames, failing and slow puts, lost peers and restarted peers.
 * Every request ends in exactly one terminal event; on the consumer
 * RELEASED follows only once no source can still write. */
#include <poll.h>
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

static const char *A = "prefill-a";

static void one_stage_world(world_t **out, ah_tweak_t ptweak, ah_tweak_t ctweak,
                            uint32_t pp)
{
    world_t *w = world_new();
    start_instance(w, 0, A, pp, ptweak);
    start_group_tweaked(w, 0, false, ctweak);
    *out = w;
}

static uint32_t terminal_sends(const ah_agent_t *p, const char *id)
{
    return ah_count(p, id, KVR_AGENT_SENT) +
           ah_count(p, id, KVR_AGENT_SEND_EXPIRED) +
           ah_count(p, id, KVR_AGENT_SEND_FAILED);
}

/* Abort while dialling (the producer never answers) and while queued. */
static void test_abort_dialing_and_queued(void **state)
{
    (void)state;
    world_t *w = world_new();
    start_group(w, 0, false);
    char addr[64];
    int fd = ah_silent_listener(addr, sizeof(addr));
    ah_req_t r;
    ah_req(&w->m, 1, 64, &r);
    ah_recv(&w->cons[0], A, addr, &r, 0);
    ah_agent_t *all[] = {&w->cons[0]};
    ah_settle(all, 1, 200);
    kvr_agent_req_status_t st;
    assert_int_equal(kvr_agent_status(w->cons[0].agent, A, strlen(A), r.id,
                                      strlen(r.id), &st),
                     KVR_OK);
    assert_int_equal(st.recv, KVR_RECV_DIALING);
    assert_int_equal(kvr_agent_recv_abort(w->cons[0].agent, A, strlen(A), r.id,
                                          strlen(r.id)),
                     KVR_OK);
    expect_failed(&w->cons[0], r.id, KVR_ERR_CANCELED);
    /* queued: recv and abort back to back */
    ah_req(&w->m, 2, 64, &r);
    ah_recv(&w->cons[1], A, addr, &r, 0);
    assert_int_equal(kvr_agent_recv_abort(w->cons[1].agent, A, strlen(A), r.id,
                                          strlen(r.id)),
                     KVR_OK);
    expect_failed(&w->cons[1], r.id, KVR_ERR_CANCELED);
    /* after its outcome, an abort is a no-op; an unknown key is refused */
    assert_int_equal(kvr_agent_recv_abort(w->cons[1].agent, A, strlen(A), r.id,
                                          strlen(r.id)),
                     KVR_ERR_NOT_FOUND);
    close(fd);
    world_free(w);
}

/* Both ranks abort while still dialling (stage 1 of a PP2 instance is
 * gone, so no pull went out), with a link to the head already up: the
 * head hears of it (RELEASE with nonce 0) and its request fails at once,
 * not at its lease (120 s, far past the wait). */
static void test_abort_before_pull_tells_producer(void **state)
{
    (void)state;
    world_t *w;
    one_stage_world(&w, NULL, NULL, 2);
    ah_stop(&w->prod[0][1]);
    ah_req_t r;
    ah_req(&w->m, 6, 64, &r);
    ah_open(&w->prod[0][0], &r, 120000, 1, true);
    for (uint32_t c = 0; c < 2; c++)
        ah_recv(&w->cons[c], A, head_addr(w, 0), &r, 0);
    ah_agent_t *all[] = {&w->cons[0], &w->cons[1]};
    ah_settle(all, 2, 500);
    for (uint32_t c = 0; c < 2; c++) {
        kvr_agent_req_status_t st;
        assert_int_equal(kvr_agent_status(w->cons[c].agent, A, strlen(A), r.id,
                                          strlen(r.id), &st),
                         KVR_OK);
        assert_int_equal(st.recv, KVR_RECV_DIALING);
        assert_int_equal(kvr_agent_recv_abort(w->cons[c].agent, A, strlen(A),
                                              r.id, strlen(r.id)),
                         KVR_OK);
        expect_failed(&w->cons[c], r.id, KVR_ERR_CANCELED);
    }
    const kvr_agent_event_t *e = ah_wait(&w->prod[0][0], r.id,
                                         KVR_AGENT_SEND_FAILED, AH_WAIT_MS);
    assert_int_equal(e->status, KVR_ERR_CANCELED);
    assert_int_equal(terminal_sends(&w->prod[0][0], r.id), 1);
    world_free(w);
}

/* The consumer aborts while its pulls are held (layers not ready): the
 * stages answer WRITE_FAILED (canceled), the consumer's RELEASED follows,
 * the producer's request fails (a group failed). */
static void test_abort_pulling(void **state)
{
    (void)state;
    world_t *w;
    one_stage_world(&w, NULL, NULL, 2);
    ah_req_t r;
    ah_req(&w->m, 3, 200, &r);
    fill_all(w, 0, &r);
    open_all(w, 0, &r, 0, false);
    recv_all(w, 0, A, &r, 0);
    ah_agent_t *all[] = {&w->cons[0], &w->cons[1]};
    ah_settle(all, 2, 300);
    for (uint32_t c = 0; c < 2; c++)
        assert_int_equal(kvr_agent_recv_abort(w->cons[c].agent, A, strlen(A),
                                              r.id, strlen(r.id)),
                         KVR_OK);
    for (uint32_t c = 0; c < 2; c++)
        expect_failed(&w->cons[c], r.id, KVR_ERR_CANCELED);
    for (uint32_t s = 0; s < 2; s++) {
        const kvr_agent_event_t *e = ah_wait(&w->prod[0][s], r.id,
                                             KVR_AGENT_SEND_FAILED, AH_WAIT_MS);
        assert_int_equal(e->status, KVR_ERR_CANCELED);
        assert_int_equal(terminal_sends(&w->prod[0][s], r.id), 1);
    }
    world_free(w);
}

/* A stage driven by the test that holds unknown requests' pulls for a
 * minute: the open below comes within the wait however slow the run. */
static void no_thread_patient(kvr_agent_params_t *p)
{
    p->progress_thread = false;
    p->unknown_wait_ms = 60000;
}

typedef bool (*world_cond_t)(world_t *w, const char *id);

/* Turns of stage 0 (no progress thread) until cond holds; false if it did
 * not within the wait. Events of it and both ranks are collected. */
static bool turn_until(world_t *w, const char *id, world_cond_t cond)
{
    ah_agent_t *p = &w->prod[0][0];
    uint64_t end = ah_now_ms() + AH_WAIT_MS;
    while (!cond(w, id)) {
        if (ah_now_ms() > end)
            return false;
        struct pollfd fd = {.fd = kvr_agent_fd(p->agent), .events = POLLIN};
        poll(&fd, 1, 20);
        assert_int_equal(kvr_agent_progress(p->agent, 0), KVR_OK);
        ah_collect(p);
        ah_collect(&w->cons[0]);
        ah_collect(&w->cons[1]);
    }
    return true;
}

/* (the loop of stage 0 is the test's thread between progress calls) */
static bool pull_held(world_t *w, const char *id)
{
    (void)id;
    return w->prod[0][0].agent->orphans != NULL;
}

static bool rank0_released(world_t *w, const char *id)
{
    return ah_count(&w->cons[0], id, KVR_AGENT_RELEASED) == 1;
}

static bool both_ended(world_t *w, const char *id)
{
    return ah_count(&w->cons[1], id, KVR_AGENT_RELEASED) == 1 &&
           terminal_sends(&w->prod[0][0], id) == 1;
}

/* Rank 0 pulls before the stage opened the request and aborts while its
 * pull is held there: the stage answers, and once opened counts rank 0 as
 * released, so its request fails when rank 1 released rather than when
 * rank 1's deadline (60 s) plus grace gives up on rank 0. */
static void test_abort_held_before_open(void **state)
{
    (void)state;
    world_t *w;
    one_stage_world(&w, no_thread_patient, NULL, 1);
    ah_req_t r;
    ah_req(&w->m, 3, 150, &r);
    fill_all(w, 0, &r);
    ah_recv(&w->cons[0], A, head_addr(w, 0), &r, 60000);
    assert_true(turn_until(w, r.id, pull_held));
    assert_int_equal(kvr_agent_recv_abort(w->cons[0].agent, A, strlen(A), r.id,
                                          strlen(r.id)),
                     KVR_OK);
    assert_true(turn_until(w, r.id, rank0_released));
    expect_failed(&w->cons[0], r.id, KVR_ERR_CANCELED);
    ah_open(&w->prod[0][0], &r, 0, 1, true);
    ah_recv(&w->cons[1], A, head_addr(w, 0), &r, 60000);
    assert_true(turn_until(w, r.id, both_ended));
    assert_int_equal(ah_count(&w->cons[1], r.id, KVR_AGENT_LOADED), 1);
    ah_verify(&w->m, stages_of(w, 0), 1, &w->cons[1], &r);
    const kvr_agent_event_t *e = ah_wait(&w->prod[0][0], r.id,
                                         KVR_AGENT_SEND_FAILED, 0);
    assert_int_equal(e->status, KVR_ERR_CANCELED);
    world_free(w);
}

/* The producer aborts with pulls held, and before any pull came. */
static void test_producer_abort(void **state)
{
    (void)state;
    world_t *w;
    one_stage_world(&w, NULL, NULL, 1);
    ah_req_t r;
    ah_req(&w->m, 4, 120, &r);
    fill_all(w, 0, &r);
    open_all(w, 0, &r, 0, false);
    recv_all(w, 0, A, &r, 0);
    ah_agent_t *all[] = {&w->cons[0], &w->cons[1]};
    ah_settle(all, 2, 300);
    kvr_agent_send_abort(w->prod[0][0].agent, r.id, strlen(r.id));
    for (uint32_t c = 0; c < 2; c++)
        expect_failed(&w->cons[c], r.id, KVR_ERR_CANCELED);
    assert_int_equal(
        ah_wait(&w->prod[0][0], r.id, KVR_AGENT_SEND_FAILED, AH_WAIT_MS)
            ->status,
        KVR_ERR_CANCELED);
    /* open, abort at once: SEND_FAILED, once */
    ah_req(&w->m, 5, 120, &r);
    open_all(w, 0, &r, 0, true);
    kvr_agent_send_abort(w->prod[0][0].agent, r.id, strlen(r.id));
    ah_wait(&w->prod[0][0], r.id, KVR_AGENT_SEND_FAILED, AH_WAIT_MS);
    ah_agent_t *p[] = {&w->prod[0][0]};
    ah_settle(p, 1, 200);
    assert_int_equal(terminal_sends(&w->prod[0][0], r.id), 1);
    world_free(w);
}

static void dup_done(kvr_agent_params_t *p)
{
    (void)p;
}

/* A WRITE_DONE sent twice is ignored: one LOADED, one RELEASED. */
static void test_duplicate_write_done(void **state)
{
    (void)state;
    world_t *w;
    one_stage_world(&w, dup_done, NULL, 2);
    for (uint32_t s = 0; s < 2; s++) /* before traffic: set once */
        kvr__agent_set_frame_fault(w->prod[0][s].agent, KVR_MSG_WRITE_DONE, 1,
                                   KVR__FAULT_DUPLICATE);
    ah_req_t r;
    ah_req(&w->m, 6, 256, &r);
    fill_all(w, 0, &r);
    open_all(w, 0, &r, 0, true);
    recv_all(w, 0, A, &r, 0);
    expect_loaded(w, 0, &r);
    ah_agent_t *all[] = {&w->cons[0], &w->cons[1]};
    ah_settle(all, 2, 200);
    for (uint32_t c = 0; c < 2; c++) {
        assert_int_equal(ah_count(&w->cons[c], r.id, KVR_AGENT_LOADED), 1);
        assert_int_equal(ah_count(&w->cons[c], r.id, KVR_AGENT_RELEASED), 1);
    }
    world_free(w);
}

static void short_deadline(kvr_agent_params_t *p)
{
    p->deadline_ms = 1500;
    p->grace_ms = 1500;
}

/* A lost WRITE_DONE: that rank fails at its deadline; its RELEASE makes
 * the stage repeat the answer, so RELEASED comes before deadline + grace
 * would force it. The other rank loads. */
static void test_lost_write_done(void **state)
{
    (void)state;
    world_t *w;
    one_stage_world(&w, short_deadline, short_deadline, 2);
    kvr__agent_set_frame_fault(w->prod[0][1].agent, KVR_MSG_WRITE_DONE, 1,
                               KVR__FAULT_DROP);
    ah_req_t r;
    ah_req(&w->m, 7, 256, &r);
    fill_all(w, 0, &r);
    open_all(w, 0, &r, 0, true);
    recv_all(w, 0, A, &r, 0);
    expect_failed(&w->cons[one_rank_failed(w, &r)], r.id, KVR_ERR_TIMEOUT);
    for (uint32_t s = 0; s < 2; s++) {
        ah_agent_t *p[] = {&w->prod[0][s]};
        ah_settle(p, 1, 100);
        ah_wait(&w->prod[0][s], r.id, KVR_AGENT_SEND_FAILED, AH_WAIT_MS);
        assert_int_equal(terminal_sends(&w->prod[0][s], r.id), 1);
    }
    world_free(w);
}

static void fail_third_put(kvr_agent_params_t *p)
{
    p->loopback.fail_put_at = 3;
}

/* A put fails: WRITE_FAILED (transport), the load fails, the blocks are
 * released; the stage's request fails. */
static void test_put_failure(void **state)
{
    (void)state;
    world_t *w;
    one_stage_world(&w, fail_third_put, NULL, 1);
    ah_req_t r;
    ah_req(&w->m, 0, 400, &r);
    fill_all(w, 0, &r);
    open_all(w, 0, &r, 0, true);
    ah_recv(&w->cons[0], A, head_addr(w, 0), &r, 0);
    expect_failed(&w->cons[0], r.id, KVR_ERR_TRANSPORT);
    kvr_agent_send_abort(w->prod[0][0].agent, r.id, strlen(r.id));
    ah_wait(&w->prod[0][0], r.id, KVR_AGENT_SEND_FAILED, AH_WAIT_MS);
    world_free(w);
}

static void slow_puts(kvr_agent_params_t *p)
{
    p->loopback.delay_ms = 30;
}

static void test_slow_puts(void **state)
{
    (void)state;
    world_t *w;
    one_stage_world(&w, slow_puts, NULL, 2);
    ah_req_t r;
    ah_req(&w->m, 1, 500, &r);
    fill_all(w, 0, &r);
    open_all(w, 0, &r, 0, true);
    recv_all(w, 0, A, &r, 0);
    expect_loaded(w, 0, &r);
    world_free(w);
}

#define STALL_DEADLINE_MS 1500u
#define STALL_GRACE_MS 1000u
#define STALL_MARGIN_MS 3000u /* a loaded 2-core machine under ASan */
#define STALLED 4u

/* Puts complete (and flushes return) far past every deadline: a stopped
 * or partitioned peer, in one process. */
static void stalled_puts(kvr_agent_params_t *p)
{
    p->loopback.delay_ms = 60000;
    p->grace_ms = STALL_GRACE_MS;
}

static void short_grace(kvr_agent_params_t *p)
{
    p->grace_ms = STALL_GRACE_MS;
}

/* Each rank's outcome for r came by deadline plus grace (plus a margin)
 * after t0 (ms). */
static void ended_by(world_t *w, const ah_req_t *r, uint64_t t0)
{
    for (uint32_t c = 0; c < 2; c++) {
        ah_wait(&w->cons[c], r->id, KVR_AGENT_RELEASED,
                STALL_DEADLINE_MS + STALL_GRACE_MS + STALL_MARGIN_MS);
        assert_int_equal(ah_count(&w->cons[c], r->id, KVR_AGENT_LOADED), 0);
    }
    ah_wait(&w->prod[0][0], r->id, KVR_AGENT_SEND_FAILED,
            STALL_DEADLINE_MS + STALL_GRACE_MS + STALL_MARGIN_MS);
    uint64_t took = ah_now_ms() - t0;
    if (took > STALL_DEADLINE_MS + STALL_GRACE_MS + STALL_MARGIN_MS)
        fail_msg("the stalled request ended %llu ms after the ask",
                 (unsigned long long)took);
}

/* A stalled stage (its puts never complete within the deadline): its
 * STALLED requests fail on both sides by deadline plus grace (cutting one
 * pull does not wait a grace on the silent peer before the next), while
 * another instance's request into the same group loads; every agent is
 * then destroyed promptly (no wait on the stalled endpoint). */
static void test_stalled_stage(void **state)
{
    (void)state;
    world_t *w = world_new();
    start_instance(w, 0, A, 1, stalled_puts);
    start_instance(w, 1, "prefill-b", 1, short_grace);
    start_group_tweaked(w, 0, false, short_grace);
    ah_req_t r[STALLED], q;
    ah_req(&w->m, STALLED, 300, &q);
    fill_all(w, 1, &q);
    open_all(w, 1, &q, 0, true);
    for (uint32_t i = 0; i < STALLED; i++) {
        ah_req(&w->m, i, 100, &r[i]);
        open_all(w, 0, &r[i], 0, true);
    }
    uint64_t t0 = ah_now_ms();
    for (uint32_t i = 0; i < STALLED; i++)
        recv_all(w, 0, A, &r[i], STALL_DEADLINE_MS);
    recv_all(w, 1, "prefill-b", &q, 0);
    expect_loaded(w, 1, &q);
    for (uint32_t i = 0; i < STALLED; i++)
        ended_by(w, &r[i], t0);
    uint64_t t1 = ah_now_ms();
    world_free(w);
    if (ah_now_ms() - t1 > STALL_MARGIN_MS)
        fail_msg("destroying the agents took %llu ms",
                 (unsigned long long)(ah_now_ms() - t1));
}

/* Rank 0 of the decode group is stopped: no put into its memory completes
 * within any deadline (a SIGSTOPped process, in one process). */
static void rank0_stopped(kvr_agent_params_t *p)
{
    p->grace_ms = STALL_GRACE_MS;
    if (p->topo.dcp_rank == 0)
        p->loopback.delay_ms = 60000;
}

/* A healthy second decode group, "decode-b", on the world's hub. */
static void start_group_b(world_t *w, ah_agent_t g[2])
{
    for (uint32_t c = 0; c < 2; c++) {
        kvr_agent_params_t p = ah_consumer_params(&w->m, w->hub, "decode-b", c);
        short_grace(&p);
        ah_start(&w->m, &p, 0, false, &g[c]);
    }
}

static void expect_group_loaded(world_t *w, ah_agent_t g[2], const ah_req_t *r)
{
    for (uint32_t c = 0; c < 2; c++) {
        assert_int_equal(
            ah_wait(&g[c], r->id, KVR_AGENT_RELEASED, AH_WAIT_MS)->status,
            KVR_OK);
        assert_int_equal(ah_count(&g[c], r->id, KVR_AGENT_LOADED), 1);
        assert_int_equal(ah_count(&g[c], r->id, KVR_AGENT_LOAD_FAILED), 0);
        ah_verify(&w->m, stages_of(w, 0), w->pp[0], &g[c], r);
    }
}

/* A stalled consumer rank fails only the requests it touches: r goes to
 * the stalled group and to a healthy one at once; the stalled rank's load
 * fails by deadline plus grace and the stage's send fails (a group
 * failed), while the healthy group loads r byte for byte; the next
 * request into the healthy group loads over the same stage (the stall
 * closed no healthy link). */
static void test_stalled_rank(void **state)
{
    (void)state;
    world_t *w = world_new();
    start_instance(w, 0, A, 1, short_grace);
    start_group_tweaked(w, 0, false, rank0_stopped);
    ah_agent_t g[2];
    start_group_b(w, g);
    ah_req_t r, q;
    ah_req(&w->m, 1, 300, &r);
    fill_all(w, 0, &r);
    ah_open(&w->prod[0][0], &r, 0, 2, true);
    uint64_t t0 = ah_now_ms();
    recv_all(w, 0, A, &r, STALL_DEADLINE_MS);
    for (uint32_t c = 0; c < 2; c++)
        ah_recv(&g[c], A, head_addr(w, 0), &r, STALL_DEADLINE_MS);
    expect_group_loaded(w, g, &r);
    uint32_t limit = STALL_DEADLINE_MS + STALL_GRACE_MS + STALL_MARGIN_MS;
    assert_int_not_equal(
        ah_wait(&w->cons[0], r.id, KVR_AGENT_LOAD_FAILED, limit)->status,
        KVR_OK);
    ah_wait(&w->cons[0], r.id, KVR_AGENT_RELEASED, limit);
    ah_wait(&w->cons[1], r.id, KVR_AGENT_RELEASED, limit);
    ah_wait(&w->prod[0][0], r.id, KVR_AGENT_SEND_FAILED, limit);
    if (ah_now_ms() - t0 > limit)
        fail_msg("the stalled rank's request ended %llu ms after the ask",
                 (unsigned long long)(ah_now_ms() - t0));
    assert_int_equal(terminal_sends(&w->prod[0][0], r.id), 1);
    /* the stall touched r only: the next request into the healthy group
     * loads over the same stage */
    ah_req(&w->m, 2, 200, &q);
    fill_all(w, 0, &q);
    ah_open(&w->prod[0][0], &q, 0, 1, true);
    for (uint32_t c = 0; c < 2; c++)
        ah_recv(&g[c], A, head_addr(w, 0), &q, 0);
    expect_group_loaded(w, g, &q);
    assert_int_equal(
        ah_wait(&w->prod[0][0], q.id, KVR_AGENT_SENT, AH_WAIT_MS)->status,
        KVR_OK);
    for (uint32_t c = 0; c < 2; c++)
        ah_stop(&g[c]);
    world_free(w);
}

/* A lost RELEASE: the stage counts the release at deadline plus grace. */
static void test_lost_release(void **state)
{
    (void)state;
    world_t *w;
    one_stage_world(&w, short_deadline, short_deadline, 1);
    kvr__agent_set_frame_fault(w->cons[0].agent, KVR_MSG_RELEASE, 1,
                               KVR__FAULT_DROP);
    ah_req_t r;
    ah_req(&w->m, 2, 100, &r);
    fill_all(w, 0, &r);
    open_all(w, 0, &r, 0, true);
    recv_all(w, 0, A, &r, 0);
    expect_loaded(w, 0, &r);
    assert_int_equal(terminal_sends(&w->prod[0][0], r.id), 1);
    world_free(w);
}

/* Waits until both ranks' pulls of id went out (PULLING). */
static void wait_pulling(world_t *w, const char *id)
{
    ah_agent_t *all[] = {&w->cons[0], &w->cons[1]};
    uint64_t end = ah_now_ms() + AH_WAIT_MS;
    for (uint32_t c = 0; c < 2; c++) {
        kvr_agent_req_status_t st = {0};
        while (kvr_agent_status(w->cons[c].agent, A, strlen(A), id, strlen(id),
                                &st) == KVR_OK &&
               st.recv < KVR_RECV_PULLING && ah_now_ms() < end)
            ah_settle(all, 2, 10);
        if (st.recv != KVR_RECV_PULLING)
            fail_msg("rank %u: '%s' is %s, not pulling", c, id,
                     kvr_agent_recv_state_name(st.recv));
    }
}

/* A stage dies with pulls held: the loads fail at once (peer dead), well
 * before their deadline, and are released. The stage is stopped only once
 * both ranks' pulls went out (a fixed pause was not enough on a loaded
 * machine: the stage had sometimes not even joined its head yet, and the
 * ranks then pulled from its successor, which never opened the request). */
static void test_stage_lost(void **state)
{
    (void)state;
    world_t *w;
    one_stage_world(&w, NULL, NULL, 2);
    ah_req_t r;
    ah_req(&w->m, 3, 100, &r);
    open_all(w, 0, &r, 0, false);
    recv_all(w, 0, A, &r, 0);
    wait_pulling(w, r.id);
    uint64_t t0 = ah_now_ms();
    ah_stop(&w->prod[0][1]);
    kvr_agent_params_t p = ah_producer_params(&w->m, w->hub, A, 1, 2);
    p.bootstrap = head_addr(w, 0);
    ah_start(&w->m, &p, 0, false, &w->prod[0][1]); /* for world_free */
    for (uint32_t c = 0; c < 2; c++) {
        const kvr_agent_event_t *e = expect_failed(&w->cons[c], r.id,
                                                   KVR_ERR_PEER_DEAD);
        assert_non_null(strstr(e->message, "stage 1"));
    }
    assert_true(ah_now_ms() - t0 < 10000);
    kvr_agent_send_abort(w->prod[0][0].agent, r.id, strlen(r.id));
    /* the restarted stage rejoined (new address, new incarnation): the
     * consumers find it through the head and the next load works */
    ah_req_t q;
    ah_req(&w->m, 4, 300, &q);
    fill_all(w, 0, &q);
    open_all(w, 0, &q, 0, true);
    recv_all(w, 0, A, &q, 0);
    for (uint32_t c = 0; c < 2; c++)
        if (ah_count(&w->cons[c], q.id, KVR_AGENT_LOAD_FAILED) == 0)
            ah_wait(&w->cons[c], q.id, KVR_AGENT_RELEASED, AH_WAIT_MS);
    expect_loaded(w, 0, &q);
    world_free(w);
}

/* A consumer rank restarts (same instance and rank, new incarnation)
 * while its old process still holds a link: the stage drops the old link
 * and the old process's request fails at once (peer dead). */
static void test_consumer_restart(void **state)
{
    (void)state;
    world_t *w;
    one_stage_world(&w, NULL, NULL, 1);
    ah_req_t r, q;
    ah_req(&w->m, 4, 100, &r);
    ah_recv(&w->cons[0], A, head_addr(w, 0), &r, 0); /* never opened */
    ah_agent_t *all[] = {&w->cons[0]};
    ah_settle(all, 1, 200);
    ah_agent_t again;
    kvr_agent_params_t p = ah_consumer_params(&w->m, w->hub, "decode", 0);
    ah_start(&w->m, &p, 0, false, &again);
    ah_req(&w->m, 5, 100, &q);
    fill_all(w, 0, &q);
    open_all(w, 0, &q, 0, true);
    uint64_t t0 = ah_now_ms();
    ah_recv(&again, A, head_addr(w, 0), &q, 0);
    const kvr_agent_event_t *e = expect_failed(&w->cons[0], r.id,
                                               KVR_ERR_PEER_DEAD);
    assert_true(ah_now_ms() - t0 < 5000);
    (void)e;
    ah_wait(&again, q.id, KVR_AGENT_LOADED, AH_WAIT_MS);
    ah_verify(&w->m, stages_of(w, 0), 1, &again, &q);
    ah_stop(&again);
    world_free(w);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_abort_dialing_and_queued),
        cmocka_unit_test(test_abort_pulling),
        cmocka_unit_test(test_abort_before_pull_tells_producer),
        cmocka_unit_test(test_abort_held_before_open),
        cmocka_unit_test(test_producer_abort),
        cmocka_unit_test(test_duplicate_write_done),
        cmocka_unit_test(test_lost_write_done),
        cmocka_unit_test(test_put_failure),
        cmocka_unit_test(test_slow_puts),
        cmocka_unit_test(test_stalled_stage),
        cmocka_unit_test(test_stalled_rank),
        cmocka_unit_test(test_lost_release),
        cmocka_unit_test(test_stage_lost),
        cmocka_unit_test(test_consumer_restart),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
