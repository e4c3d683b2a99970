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

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_pp2_to_dcp2),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
