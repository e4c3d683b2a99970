/* Fan-in (docs/agent.md Fan-in): a sharded producer (W_p 4, TP_p 4, one PP
 * stage) into a W 2 decode group over loopback. Consumer rank 0 owns the
 * even tokens and pulls from producer DCP ranks 0 and 2 only (its
 * replicated index from rank 0); rank 1 from 1 and 3. Its quorum counts
 * exactly those: a missing source fails the load, a stage it does not
 * need is never waited for. A combination the planner refuses fails
 * kvr_agent_start on both sides with the planner's status. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "agent_harness.h"
#include "kvrelay/synth.h"

#define WP 4u

static ah_model_t fanin_model(void)
{
    ah_model_t m = ah_model(); /* bs 16, W 2, I 1, tp 2, replicated index */
    m.lay.producer_dcp = WP;
    m.lay.producer_interleave = 1;
    m.lay.producer_tp = WP;
    m.lay.producer_replicate_index = true;
    return m;
}

typedef struct {
    ah_model_t m;
    kvr_transport_t *hub;
    ah_agent_t prod[WP];
    bool up[WP];
    ah_agent_t cons[2];
} fanin_t;

/* The producer tp ranks in `which` (bit t: rank t, DCP rank t); rank 0,
 * the PP head, always. */
static fanin_t *start(uint32_t which)
{
    fanin_t *f = calloc(1, sizeof(*f));
    f->m = fanin_model();
    f->hub = ah_hub();
    for (uint32_t t = 0; t < WP; t++) {
        if (t > 0 && !(which >> t & 1))
            continue;
        kvr_agent_params_t p = ah_producer_params(&f->m, f->hub, "prefill", 0,
                                                  1);
        p.topo.tp_rank = t;
        p.topo.dcp_rank = t;
        if (t > 0)
            p.bootstrap = kvr_agent_address(f->prod[0].agent);
        ah_start(&f->m, &p, 0, false, &f->prod[t]);
        f->up[t] = true;
    }
    for (uint32_t c = 0; c < 2; c++) {
        kvr_agent_params_t p = ah_consumer_params(&f->m, f->hub, "decode", c);
        ah_start(&f->m, &p, 0, false, &f->cons[c]);
    }
    return f;
}

static void stop(fanin_t *f)
{
    for (uint32_t c = 0; c < 2; c++)
        ah_stop(&f->cons[c]);
    for (uint32_t t = WP; t-- > 0;)
        if (f->up[t])
            ah_stop(&f->prod[t]);
    kvr_transport_destroy(f->hub);
    free(f);
}

/* Each started rank's own share of r, opened and ready. */
static void fill_open(fanin_t *f, const ah_req_t *r)
{
    uint32_t *ids = malloc((r->tokens + 1) * sizeof(*ids));
    for (uint64_t g = 0; g < r->tokens; g++)
        ids[g] = r->seq * 100000u + (uint32_t)g;
    for (uint32_t t = 0; t < WP; t++)
        for (uint32_t i = 0; f->up[t] && i < f->prod[t].n; i++) {
            kvr_error_t err = {0};
            if (kvr_synth_fill_source_rank(&f->m.lay, &f->prod[t].desc[i], t,
                                           1234 + r->seq, r->src, r->nsrc, ids,
                                           r->tokens, f->prod[t].base[i],
                                           &err) != KVR_OK)
                fail_msg("fill rank %u: %s", t, err.msg);
        }
    for (uint32_t t = 0; t < WP; t++)
        if (f->up[t])
            ah_open(&f->prod[t], r, 0, 1, true);
    free(ids);
}

/* Every byte consumer c holds, against every producer rank's source. */
static void verify(fanin_t *f, uint32_t c, const ah_req_t *r)
{
    kvr_request_t req = {r->src,  r->nsrc,   r->dst,
                         r->ndst, r->tokens, r->computed};
    const ah_agent_t *x = &f->cons[c];
    for (uint32_t i = 0; i < x->n; i++)
        for (uint32_t t = 0; t < WP; t++) {
            kvr_region_pair_t pair = {f->prod[t].desc[i], x->desc[i]};
            kvr_error_t err = {0};
            if (!f->up[t])
                continue;
            if (kvr_verify_region_pair(&f->m.lay, t, c, &pair, &req,
                                       f->prod[t].base[i], x->base[i],
                                       &err) != KVR_OK)
                fail_msg("rank %u from producer %u, %s layer %u: %s", c, t,
                         kvr_role_name(x->desc[i].role), x->desc[i].layer,
                         err.msg);
        }
}

static void test_fanin_loads(void **state)
{
    (void)state;
    fanin_t *f = start(0xf);
    ah_req_t r;
    ah_req(&f->m, 1, 300, &r);
    fill_open(f, &r);
    for (uint32_t c = 0; c < 2; c++)
        ah_recv(&f->cons[c], "prefill", kvr_agent_address(f->prod[0].agent),
                &r, 0);
    for (uint32_t c = 0; c < 2; c++) {
        ah_wait(&f->cons[c], r.id, KVR_AGENT_LOADED, AH_WAIT_MS);
        verify(f, c, &r);
    }
    /* each stage served exactly its consumer rank, which released it */
    for (uint32_t t = 0; t < WP; t++)
        ah_wait(&f->prod[t], r.id, KVR_AGENT_SENT, AH_WAIT_MS);
    stop(f);
}

/* Ranks 1 and 3 never start: rank 0's sources are all there and it loads
 * without waiting for them; rank 1 misses both of its own and fails. */
static void test_quorum_counts_exactly_its_sources(void **state)
{
    (void)state;
    fanin_t *f = start(1u << 2);
    ah_req_t r;
    ah_req(&f->m, 2, 250, &r);
    fill_open(f, &r);
    ah_recv(&f->cons[0], "prefill", kvr_agent_address(f->prod[0].agent), &r,
            0);
    ah_recv(&f->cons[1], "prefill", kvr_agent_address(f->prod[0].agent), &r,
            1500);
    ah_wait(&f->cons[0], r.id, KVR_AGENT_LOADED, AH_WAIT_MS);
    verify(f, 0, &r);
    const kvr_agent_event_t *e = ah_wait(&f->cons[1], r.id,
                                         KVR_AGENT_LOAD_FAILED, AH_WAIT_MS);
    assert_int_equal(e->status, KVR_ERR_TIMEOUT);
    ah_wait(&f->cons[1], r.id, KVR_AGENT_RELEASED, AH_WAIT_MS);
    assert_int_equal(ah_count(&f->cons[0], r.id, KVR_AGENT_LOAD_FAILED), 0);
    /* producer ranks 0 and 2 serve consumer rank 0 only: done with it */
    ah_wait(&f->prod[0], r.id, KVR_AGENT_SENT, AH_WAIT_MS);
    ah_wait(&f->prod[2], r.id, KVR_AGENT_SENT, AH_WAIT_MS);
    stop(f);
}

/* kvr_agent_start of an agent with one MLA and one index region. */
static kvr_status_t start_one(const ah_model_t *m, kvr_transport_t *hub,
                              bool consumer, char *why, size_t cap)
{
    kvr_agent_params_t p = consumer
                               ? ah_consumer_params(m, hub, "decode", 0)
                               : ah_producer_params(m, hub, "prefill", 0, 1);
    kvr_agent_t *a = NULL;
    kvr_error_t err = {0};
    assert_int_equal(kvr_agent_create(&p, &a, &err), KVR_OK);
    uint32_t bs = consumer ? m->lay.block_size
                           : kvr_producer_block_size(&m->lay);
    kvr_region_desc_t mla = {.role = KVR_ROLE_MLA,
                             .layer = 0,
                             .num_blocks = 8,
                             .page_bytes = (uint64_t)bs * m->token_bytes};
    kvr_region_desc_t idx = {.role = KVR_ROLE_INDEX,
                             .layer = 0,
                             .num_blocks = 8,
                             .index_dim = m->index_dim,
                             .quant_block = m->index_dim};
    idx.page_bytes = kvr_index_page_tokens(&m->lay, consumer) *
                     kvr_index_stride(m->index_dim);
    void *base = NULL;
    assert_int_equal(kvr_agent_alloc_region(a, &mla, 0, &base), KVR_OK);
    assert_int_equal(kvr_agent_alloc_region(a, &idx, 0, &base), KVR_OK);
    uint64_t t0 = ah_now_ms();
    kvr_status_t st = kvr_agent_start(a);
    assert_true(ah_now_ms() - t0 < 5000); /* no link was tried */
    snprintf(why, cap, "%s", kvr_agent_last_error(a));
    kvr_agent_destroy(a);
    return st;
}

static void test_refused_up_front(void **state)
{
    (void)state;
    kvr_transport_t *hub = ah_hub();
    char why[KVR_ERROR_MSG_MAX];
    ah_model_t m = fanin_model();
    m.lay.producer_replicate_index = false; /* sharded at I_p 1 < bs_p */
    for (int consumer = 0; consumer < 2; consumer++) {
        assert_int_equal(start_one(&m, hub, consumer, why, sizeof(why)),
                         KVR_ERR_PRODUCER_INDEX_INTERLEAVE);
        assert_non_null(strstr(why, "I_p"));
    }
    m = fanin_model();
    m.lay.replicate_index = false; /* W_p > 1 into a sharded index */
    m.lay.interleave = m.lay.block_size;
    for (int consumer = 0; consumer < 2; consumer++)
        assert_int_equal(start_one(&m, hub, consumer, why, sizeof(why)),
                         KVR_ERR_INDEX_NEEDS_REPLICATED);
    kvr_transport_destroy(hub);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_fanin_loads),
        cmocka_unit_test(test_quorum_counts_exactly_its_sources),
        cmocka_unit_test(test_refused_up_front),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
