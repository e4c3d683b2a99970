/* Layer-wise streaming through the agent (docs/agent.md Streaming): a PP2
 * instance (layers 0-1 and 2-3) into a DCP2 group that receives with
 * recv.stream. Every layer group is verified byte for byte as its
 * LAYERS_LOADED arrives, and the layers not yet ready are checked still
 * untouched; groups made ready out of order, late, or all before the pull;
 * a stage's last layer made ready while its previous group is in flight;
 * staged chunks; a stage that speaks protocol 3.0; a fault between groups
 * (a stage lost, a producer abort, the deadline) fails the request with no
 * LOADED; without stream nothing changes. Over the loopback data plane,
 * and over UCX shared memory when the build has UCX. */
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
#include "kvrelay/synth.h"

#define LAYERS 4u /* ah_model(): stage 0 holds 0-1, stage 1 holds 2-3 */

/* ---- checks ---- */

/* LAYERS_LOADED events of r on c covering layer l. */
static uint32_t covered(const ah_agent_t *c, const ah_req_t *r, uint32_t l)
{
    uint32_t n = 0;
    for (uint32_t i = 0; i < c->nlog; i++) {
        const kvr_agent_event_t *e = &c->log[i];
        n += e->kind == KVR_AGENT_LAYERS_LOADED &&
             e->request.len == strlen(r->id) &&
             !memcmp(e->request.bytes, r->id, e->request.len) &&
             l >= e->layer_begin && l < e->layer_end;
    }
    return n;
}

static void wait_covered(ah_agent_t *c, const ah_req_t *r, uint32_t l)
{
    uint64_t end = ah_now_ms() + AH_WAIT_MS;
    while (covered(c, r, l) == 0 && ah_now_ms() < end) {
        ah_agent_t *one[] = {c};
        ah_settle(one, 1, 10);
    }
    if (covered(c, r, l) == 0)
        fail_msg("rank %u: no LAYERS_LOADED for layer %u of '%s'", c->rank, l,
                 r->id);
}

/* The LAYERS_LOADED event of r on c that starts at layer b. */
static const kvr_agent_event_t *group_at(const ah_agent_t *c, const ah_req_t *r,
                                         uint32_t b)
{
    for (uint32_t i = 0; i < c->nlog; i++) {
        const kvr_agent_event_t *e = &c->log[i];
        if (e->kind == KVR_AGENT_LAYERS_LOADED && e->layer_begin == b &&
            e->request.len == strlen(r->id) &&
            !memcmp(e->request.bytes, r->id, e->request.len))
            return e;
    }
    fail_msg("rank %u: no LAYERS_LOADED from layer %u", c->rank, b);
    return NULL;
}

/* Every byte of layer l that rank c should hold, from the stage owning it. */
static void verify_layer(world_t *w, const ah_agent_t *c, const ah_req_t *r,
                         uint32_t l)
{
    kvr_request_t req = {r->src,  r->nsrc,   r->dst,
                         r->ndst, r->tokens, r->computed};
    const ah_agent_t *s = &w->prod[0][l / 2];
    uint32_t checked = 0;
    for (uint32_t i = 0; i < c->n; i++)
        for (uint32_t j = 0; j < s->n && c->desc[i].layer == l; j++) {
            if (s->desc[j].role != c->desc[i].role || s->desc[j].layer != l)
                continue;
            kvr_region_pair_t pair = {s->desc[j], c->desc[i]};
            kvr_error_t err = {0};
            if (kvr_verify_region(&w->m.lay, c->rank, &pair, &req, s->base[j],
                                  c->base[i], &err) != KVR_OK)
                fail_msg("rank %u layer %u %s: %s", c->rank, l,
                         kvr_role_name(c->desc[i].role), err.msg);
            checked++;
        }
    assert_true(checked > 0);
}

/* The first byte of layer l that has landed on rank c (regions start
 * zeroed), or UINT64_MAX. It polls pages the agent's thread may be writing
 * at that moment (the loopback copies at the put): the test's only way to
 * see a group in flight before its flush. Deliberately unsynchronised, so
 * ThreadSanitizer does not instrument it; every check of the bytes
 * themselves happens after LAYERS_LOADED or LOADED, which the event queue
 * orders. */
__attribute__((no_sanitize("thread"))) static uint64_t
first_landed(const ah_agent_t *c, uint32_t l)
{
    for (uint32_t i = 0; i < c->n; i++) {
        if (c->desc[i].layer != l || c->desc[i].role == KVR_ROLE_STAGING)
            continue;
        const uint8_t *b = c->base[i];
        uint64_t n = kvr_region_bytes(&c->desc[i]);
        for (uint64_t k = 0; k < n; k++)
            if (b[k] != 0)
                return k;
    }
    return UINT64_MAX;
}

/* No byte of layer l has landed on rank c. */
static void untouched(const ah_agent_t *c, uint32_t l)
{
    uint64_t k = first_landed(c, l);
    if (k != UINT64_MAX)
        fail_msg("rank %u layer %u: byte %llu written before the layer was "
                 "ready",
                 c->rank, l, (unsigned long long)k);
}

/* The stream's bookkeeping once r loaded on c: every layer reported by
 * exactly one LAYERS_LOADED, each before LOADED, with the group's bytes
 * adding up to LOADED's. */
static void expect_every_layer_once(const ah_agent_t *c, const ah_req_t *r)
{
    uint64_t bytes = 0, loaded = 0;
    bool after_loaded = false;
    for (uint32_t l = 0; l < LAYERS; l++)
        if (covered(c, r, l) != 1)
            fail_msg("rank %u layer %u reported %u times", c->rank, l,
                     covered(c, r, l));
    for (uint32_t i = 0; i < c->nlog; i++) {
        const kvr_agent_event_t *e = &c->log[i];
        if (e->request.len != strlen(r->id) ||
            memcmp(e->request.bytes, r->id, e->request.len))
            continue;
        if (e->kind == KVR_AGENT_LOADED) {
            after_loaded = true;
            loaded = e->bytes;
        }
        if (e->kind == KVR_AGENT_LAYERS_LOADED) {
            assert_false(after_loaded);
            bytes += e->bytes;
        }
    }
    assert_true(after_loaded);
    assert_int_equal(bytes, loaded);
}

static void ready(world_t *w, const ah_req_t *r, uint32_t l)
{
    assert_int_equal(kvr_agent_send_ready(w->prod[0][l / 2].agent, r->id,
                                          strlen(r->id), l, l + 1, NULL),
                     KVR_OK);
}

static ah_agent_t *const *group(world_t *w)
{
    static _Thread_local ah_agent_t *g[2];
    g[0] = &w->cons[0];
    g[1] = &w->cons[1];
    return g;
}

/* A PP2 instance and the DCP2 group (each tweaked), request r filled and
 * opened with nothing ready, pulled with stream as asked. */
static world_t *streaming(ah_req_t *r, ah_tweak_t prod, ah_tweak_t cons,
                          uint32_t staging_slots, bool stream,
                          uint32_t deadline_ms)
{
    world_t *w = world_new();
    w->m.staging_slots = staging_slots;
    w->m.slot_bytes = 4096; /* the smallest the cost probe takes */
    start_instance(w, 0, "prefill-a", 2, prod);
    start_group_tweaked(w, 0, false, cons);
    ah_req(&w->m, 1, 300, r);
    fill_all(w, 0, r);
    open_all(w, 0, r, 0, false);
    for (uint32_t c = 0; c < 2; c++)
        ah_recv_stream(&w->cons[c], "prefill-a", head_addr(w, 0), r,
                       deadline_ms, stream);
    return w;
}

/* Layers made ready one at a time in `order`: after each, both ranks
 * report it, hold its bytes, and hold nothing of the layers not ready. */
static void layer_by_layer(world_t *w, const ah_req_t *r, const uint32_t *order)
{
    bool done[LAYERS] = {false};
    for (uint32_t i = 0; i < LAYERS; i++) {
        uint32_t l = order[i];
        ready(w, r, l);
        done[l] = true;
        for (uint32_t c = 0; c < 2; c++) {
            wait_covered(&w->cons[c], r, l);
            const kvr_agent_event_t *e = group_at(&w->cons[c], r, l);
            assert_int_equal(e->layer_end, l + 1);
            assert_int_equal(e->status, KVR_OK);
            verify_layer(w, &w->cons[c], r, l);
            for (uint32_t k = 0; k < LAYERS; k++)
                if (!done[k])
                    untouched(&w->cons[c], k);
            if (i + 1 < LAYERS)
                assert_int_equal(ah_count(&w->cons[c], r->id, KVR_AGENT_LOADED),
                                 0);
        }
    }
    expect_loaded(w, 0, r);
    for (uint32_t c = 0; c < 2; c++)
        expect_every_layer_once(&w->cons[c], r);
}

/* ---- tests ---- */

static void test_layer_by_layer(void **state)
{
    (void)state;
    ah_req_t r;
    world_t *w = streaming(&r, NULL, NULL, 0, true, 0);
    static const uint32_t order[LAYERS] = {0, 2, 1, 3}; /* stages alternate */
    layer_by_layer(w, &r, order);
    world_free(w);
}

/* Layers ready out of order: a stage serves in layer order, so layer 1
 * (stage 0) and layer 3 (stage 1) wait for 0 and 2, then move with them
 * as one group. */
static void test_out_of_order(void **state)
{
    (void)state;
    ah_req_t r;
    world_t *w = streaming(&r, NULL, NULL, 0, true, 0);
    ready(w, &r, 3);
    ready(w, &r, 1);
    ah_settle(group(w), 2, 300);
    for (uint32_t c = 0; c < 2; c++)
        for (uint32_t l = 0; l < LAYERS; l++) {
            assert_int_equal(covered(&w->cons[c], &r, l), 0);
            untouched(&w->cons[c], l);
        }
    ready(w, &r, 0);
    for (uint32_t c = 0; c < 2; c++) {
        wait_covered(&w->cons[c], &r, 0);
        assert_int_equal(group_at(&w->cons[c], &r, 0)->layer_end, 2);
        verify_layer(w, &w->cons[c], &r, 0);
        verify_layer(w, &w->cons[c], &r, 1);
        untouched(&w->cons[c], 2);
        untouched(&w->cons[c], 3);
    }
    ready(w, &r, 2);
    expect_loaded(w, 0, &r);
    for (uint32_t c = 0; c < 2; c++) {
        assert_int_equal(group_at(&w->cons[c], &r, 2)->layer_end, 4);
        expect_every_layer_once(&w->cons[c], &r);
    }
    world_free(w);
}

/* Everything ready before the pull: each stage moves its range as one
 * group (one flush, one LAYERS_DONE). */
static void test_ready_before_pull(void **state)
{
    (void)state;
    world_t *w = world_new();
    start_instance(w, 0, "prefill-a", 2, NULL);
    start_group(w, 0, false);
    ah_req_t r;
    ah_req(&w->m, 2, 257, &r);
    fill_all(w, 0, &r);
    open_all(w, 0, &r, 0, true);
    for (uint32_t c = 0; c < 2; c++)
        ah_recv_stream(&w->cons[c], "prefill-a", head_addr(w, 0), &r, 0, true);
    expect_loaded(w, 0, &r);
    for (uint32_t c = 0; c < 2; c++) {
        assert_int_equal(group_at(&w->cons[c], &r, 0)->layer_end, 2);
        assert_int_equal(group_at(&w->cons[c], &r, 2)->layer_end, 4);
        expect_every_layer_once(&w->cons[c], &r);
    }
    world_free(w);
}

static void staged(kvr_agent_params_t *p)
{
    p->executor = KVR_AGENT_EXEC_STAGED;
}

/* Staged chunks: a chunk never spans two groups, and a group counts only
 * once every chunk of it was unpacked. The stages are AUTO: they probe
 * each consumer link's cost model meanwhile. */
static void test_staged(void **state)
{
    (void)state;
    ah_req_t r;
    world_t *w = streaming(&r, NULL, staged, 4, true, 0);
    static const uint32_t order[LAYERS] = {2, 0, 3, 1};
    layer_by_layer(w, &r, order);
    /* several chunks per layer and rank went through the slots */
    assert_true(kvr__agent_chunks(w->prod[0][0].agent) > 2 * 2);
    world_free(w);
}

/* Puts complete (flush) this late, long past the few turns it takes the
 * loop to take in another send_ready. */
static void slow_flush(kvr_agent_params_t *p)
{
    p->loopback.delay_ms = 1500;
}

/* Wait until bytes of layer l landed on both ranks (the loopback copies at
 * the put; the flush completes later). */
static void wait_landed(world_t *w, uint32_t l)
{
    uint64_t end = ah_now_ms() + AH_WAIT_MS;
    for (uint32_t c = 0; c < 2; c++)
        while (first_landed(&w->cons[c], l) == UINT64_MAX) {
            if (ah_now_ms() >= end)
                fail_msg("rank %u: no byte of layer %u landed", c, l);
            ah_settle(group(w), 2, 10);
        }
}

/* The last layer of a stage made ready while its previous group is still
 * in flight (put, flush pending): that group ends as it started ([0, 1)),
 * and the last layer still moves as a group of its own before WRITE_DONE,
 * rather than the stage answering once the group cursor reached the end. */
static void test_last_layer_ready_mid_group(void **state)
{
    (void)state;
    ah_req_t r;
    world_t *w = streaming(&r, slow_flush, NULL, 0, true, 0);
    ready(w, &r, 0);
    wait_landed(w, 0); /* both pulls moving group [0, 1) */
    for (uint32_t c = 0; c < 2; c++)
        assert_int_equal(covered(&w->cons[c], &r, 0), 0); /* not flushed */
    ready(w, &r, 1);
    ready(w, &r, 2);
    wait_landed(w, 2);
    ready(w, &r, 3);
    expect_loaded(w, 0, &r);
    for (uint32_t c = 0; c < 2; c++) {
        assert_int_equal(group_at(&w->cons[c], &r, 0)->layer_end, 1);
        assert_int_equal(group_at(&w->cons[c], &r, 1)->layer_end, 2);
        assert_int_equal(group_at(&w->cons[c], &r, 2)->layer_end, 3);
        assert_int_equal(group_at(&w->cons[c], &r, 3)->layer_end, 4);
        for (uint32_t l = 0; l < LAYERS; l++)
            verify_layer(w, &w->cons[c], &r, l);
        expect_every_layer_once(&w->cons[c], &r);
    }
    world_free(w);
}

static void old_stage(world_t *w)
{
    kvr__agent_speak_3_0(w->prod[0][1].agent);
}

/* A stage that speaks 3.0 (it refuses STREAM_REQUEST) is asked with
 * WRITE_REQUEST: it serves its range whole once ready, reported as one
 * group; the 3.1 stage beside it streams. */
static void test_stage_without_streaming(void **state)
{
    (void)state;
    world_t *w = world_new();
    start_instance(w, 0, "prefill-a", 2, NULL);
    old_stage(w); /* before any consumer dials it */
    start_group(w, 0, false);
    ah_req_t r;
    ah_req(&w->m, 3, 300, &r);
    fill_all(w, 0, &r);
    open_all(w, 0, &r, 0, false);
    for (uint32_t c = 0; c < 2; c++)
        ah_recv_stream(&w->cons[c], "prefill-a", head_addr(w, 0), &r, 0, true);
    ready(w, &r, 0);
    ready(w, &r, 2);
    for (uint32_t c = 0; c < 2; c++) {
        wait_covered(&w->cons[c], &r, 0);
        assert_int_equal(group_at(&w->cons[c], &r, 0)->layer_end, 1);
    }
    ah_settle(group(w), 2, 200);
    for (uint32_t c = 0; c < 2; c++) {
        assert_int_equal(covered(&w->cons[c], &r, 2), 0); /* held whole */
        untouched(&w->cons[c], 2);
    }
    ready(w, &r, 1);
    ready(w, &r, 3);
    expect_loaded(w, 0, &r);
    for (uint32_t c = 0; c < 2; c++) {
        assert_int_equal(group_at(&w->cons[c], &r, 2)->layer_end, 4);
        expect_every_layer_once(&w->cons[c], &r);
    }
    world_free(w);
}

/* After the first group landed, no LOADED and exactly one LOAD_FAILED with
 * st on both ranks, then RELEASED; no layer beyond the first reported. */
static void expect_failed_after_first(world_t *w, const ah_req_t *r,
                                      kvr_status_t st)
{
    for (uint32_t c = 0; c < 2; c++) {
        expect_failed(&w->cons[c], r->id, st);
        assert_int_equal(covered(&w->cons[c], r, 0), 1);
        for (uint32_t l = 1; l < LAYERS; l++)
            assert_int_equal(covered(&w->cons[c], r, l), 0);
    }
}

static void first_group(world_t *w, const ah_req_t *r)
{
    ready(w, r, 0);
    for (uint32_t c = 0; c < 2; c++) {
        wait_covered(&w->cons[c], r, 0);
        verify_layer(w, &w->cons[c], r, 0);
    }
}

/* A stage lost between groups fails the load. */
static void test_stage_lost_between_groups(void **state)
{
    (void)state;
    ah_req_t r;
    world_t *w = streaming(&r, NULL, NULL, 0, true, 0);
    first_group(w, &r);
    ah_stop(&w->prod[0][1]);
    expect_failed_after_first(w, &r, KVR_ERR_PEER_DEAD);
    world_free(w);
}

/* A producer abort between groups: WRITE_FAILED, the load fails. */
static void test_abort_between_groups(void **state)
{
    (void)state;
    ah_req_t r;
    world_t *w = streaming(&r, NULL, NULL, 0, true, 0);
    first_group(w, &r);
    assert_int_equal(
        kvr_agent_send_abort(w->prod[0][0].agent, r.id, strlen(r.id)), KVR_OK);
    expect_failed_after_first(w, &r, KVR_ERR_CANCELED);
    world_free(w);
}

/* The deadline passes with a group still not ready: the load fails (the
 * stage holding the pull is bounded by the same deadline). */
static void test_deadline_between_groups(void **state)
{
    (void)state;
    ah_req_t r;
    world_t *w = streaming(&r, NULL, NULL, 0, true, 3000);
    first_group(w, &r);
    expect_failed_after_first(w, &r, KVR_ERR_TIMEOUT);
    world_free(w);
}

/* Without stream nothing changes: layers ready one at a time are served
 * once the stage's range is whole, no LAYERS_LOADED. */
static void test_without_stream(void **state)
{
    (void)state;
    ah_req_t r;
    world_t *w = streaming(&r, NULL, NULL, 0, false, 0);
    ready(w, &r, 0);
    ready(w, &r, 2);
    ah_settle(group(w), 2, 200);
    for (uint32_t c = 0; c < 2; c++)
        for (uint32_t l = 0; l < LAYERS; l++)
            untouched(&w->cons[c], l);
    ready(w, &r, 1);
    ready(w, &r, 3);
    expect_loaded(w, 0, &r);
    for (uint32_t c = 0; c < 2; c++)
        assert_int_equal(ah_count(&w->cons[c], r.id, KVR_AGENT_LAYERS_LOADED),
                         0);
    world_free(w);
}

#ifdef KVR_TEST_UCX
static void over_ucx(kvr_agent_params_t *p)
{
    p->loopback_hub = NULL;
    p->tl = KVR_AGENT_TL_SHM;
}

/* The same over UCX shared memory (host memory, direct puts). */
static void test_ucx(void **state)
{
    (void)state;
    ah_req_t r;
    world_t *w = streaming(&r, over_ucx, over_ucx, 0, true, 0);
    static const uint32_t order[LAYERS] = {0, 2, 1, 3};
    layer_by_layer(w, &r, order);
    world_free(w);
}
#endif

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_layer_by_layer),
        cmocka_unit_test(test_out_of_order),
        cmocka_unit_test(test_ready_before_pull),
        cmocka_unit_test(test_staged),
        cmocka_unit_test(test_last_layer_ready_mid_group),
        cmocka_unit_test(test_stage_without_streaming),
        cmocka_unit_test(test_stage_lost_between_groups),
        cmocka_unit_test(test_abort_between_groups),
        cmocka_unit_test(test_deadline_between_groups),
        cmocka_unit_test(test_without_stream),
#ifdef KVR_TEST_UCX
        cmocka_unit_test(test_ucx),
#endif
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
