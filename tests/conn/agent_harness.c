#include "agent_harness.h"

#include <netinet/in.h>
#include <poll.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>

#include <cmocka.h>

#include "kvrelay/synth.h"

/* ThreadSanitizer: the cost probe's scratch (a consumer's last staging
 * slot) is written by every producer stage that probes it, concurrently
 * when the stages share this process; nothing reads it as data. The probe
 * runs in steps (kvr_cost_start faults the slot in, kvr_cost_step puts
 * and packs into it). */
const char *__tsan_default_suppressions(void);
const char *__tsan_default_suppressions(void)
{
    return "race:kvr_cost_start\nrace:kvr_cost_step\n";
}

uint64_t ah_now_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000u + (uint64_t)ts.tv_nsec / 1000000u;
}

int ah_silent_listener(char *addr, size_t cap)
{
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    struct sockaddr_in in = {.sin_family = AF_INET,
                             .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
    socklen_t len = sizeof(in);
    assert_int_equal(bind(fd, (struct sockaddr *)&in, sizeof(in)), 0);
    assert_int_equal(listen(fd, 4), 0);
    getsockname(fd, (struct sockaddr *)&in, &len);
    snprintf(addr, cap, "127.0.0.1:%u", ntohs(in.sin_port));
    return fd;
}

ah_model_t ah_model(void)
{
    ah_model_t m = {.lay = KVR_LAYOUT_INIT,
                    .layers = 4,
                    .index_dim = 64,
                    .token_bytes = 96,
                    .src_pool = 256,
                    .dst_pool = 160};
    m.lay.block_size = 16;
    m.lay.dcp_size = 2;
    m.lay.interleave = 1;
    m.lay.tp = 2;
    m.lay.producer_tp = 1;
    m.lay.replicate_index = true;
    m.lay.preshuffle = true;
    return m;
}

kvr_transport_t *ah_hub(void)
{
    kvr_transport_t *t = NULL;
    kvr_loopback_params_t p = KVR_LOOPBACK_PARAMS_INIT;
    assert_int_equal(kvr_transport_loopback_create(NULL, &p, &t, NULL), KVR_OK);
    return t;
}

static kvr_agent_params_t base_params(const ah_model_t *m, kvr_transport_t *hub,
                                      const char *instance)
{
    kvr_agent_params_t p = KVR_AGENT_PARAMS_INIT;
    p.instance_id = instance;
    p.instance_id_len = strlen(instance);
    p.layout = m->lay;
    p.loopback_hub = hub;
    p.deadline_ms = 20000;
    p.grace_ms = 2000;
#ifdef AH_GPU_EMUL
    p.cuda_device = 0; /* KV in "CUDA memory" of gpu_path_emul.c */
#endif
    return p;
}

kvr_agent_params_t ah_producer_params(const ah_model_t *m, kvr_transport_t *hub,
                                      const char *instance, uint32_t pp,
                                      uint32_t pp_size)
{
    kvr_agent_params_t p = base_params(m, hub, instance);
    p.role = KVR_AGENT_PRODUCER;
    p.listen = "127.0.0.1:0";
    p.topo = (kvr_wire_topo_t){.pp_rank = pp,
                               .pp_size = pp_size,
                               .tp_rank = 0,
                               .tp_size = m->lay.producer_tp,
                               .dp_rank = 0,
                               .dp_size = 1,
                               .layer_start = pp * m->layers / pp_size,
                               .layer_end = (pp + 1) * m->layers / pp_size};
    return p;
}

kvr_agent_params_t ah_consumer_params(const ah_model_t *m, kvr_transport_t *hub,
                                      const char *instance, uint32_t rank)
{
    kvr_agent_params_t p = base_params(m, hub, instance);
    p.role = KVR_AGENT_CONSUMER;
    p.topo = (kvr_wire_topo_t){.pp_rank = 0,
                               .pp_size = 1,
                               .tp_rank = rank,
                               .tp_size = m->lay.tp,
                               .dp_rank = 0,
                               .dp_size = 1,
                               .layer_start = 0,
                               .layer_end = m->layers,
                               .dcp_rank = rank};
    return p;
}

static kvr_region_desc_t region(const ah_model_t *m, kvr_role_t role,
                                uint32_t layer, bool consumer)
{
    kvr_region_desc_t d = {.role = role,
                           .layer = layer,
                           .num_blocks = consumer ? m->dst_pool : m->src_pool};
    if (role == KVR_ROLE_MLA) {
        d.page_bytes = (uint64_t)m->lay.block_size * m->token_bytes;
    } else {
        d.index_dim = d.quant_block = m->index_dim;
        d.page_bytes = kvr_index_page_tokens(&m->lay, consumer) *
                       kvr_index_stride(m->index_dim);
    }
    return d;
}

static void add(ah_agent_t *x, const kvr_region_desc_t *d, bool only)
{
    assert_true(x->n < AH_MAX_REGIONS);
    x->desc[x->n] = *d;
    x->consumer_only[x->n] = only;
    assert_int_equal(kvr_agent_alloc_region(
                         x->agent, d, only ? KVR_AGENT_REGION_CONSUMER_ONLY : 0,
                         &x->base[x->n]),
                     KVR_OK);
    memset(x->base[x->n], 0, kvr_region_bytes(d));
    x->n++;
}

void ah_start(const ah_model_t *m, const kvr_agent_params_t *p, uint32_t extra,
              bool flag_extra, ah_agent_t *out)
{
    kvr_error_t err = {0};
    memset(out, 0, sizeof(*out));
    out->log = calloc(AH_MAX_EVENTS, sizeof(*out->log));
    out->consumer = p->role == KVR_AGENT_CONSUMER;
    out->rank = out->consumer ? p->topo.dcp_rank : p->topo.pp_rank;
    kvr_status_t st = kvr_agent_create(p, &out->agent, &err);
    if (st != KVR_OK)
        fail_msg("kvr_agent_create: %s", err.msg);
    for (uint32_t l = p->topo.layer_start; l < p->topo.layer_end; l++) {
        kvr_region_desc_t d = region(m, KVR_ROLE_MLA, l, out->consumer);
        add(out, &d, false);
        if (l % 2 == 0) {
            d = region(m, KVR_ROLE_INDEX, l, out->consumer);
            add(out, &d, false);
        }
    }
    for (uint32_t e = 0; e < extra; e++) {
        kvr_region_desc_t d = region(m, KVR_ROLE_MLA, m->layers + e, true);
        add(out, &d, flag_extra);
    }
    if (out->consumer && m->staging_slots > 0) {
        kvr_region_desc_t d = {.role = KVR_ROLE_STAGING,
                               .num_blocks = m->staging_slots,
                               .page_bytes = m->slot_bytes};
        add(out, &d, false);
    }
    if (kvr_agent_start(out->agent) != KVR_OK)
        fail_msg("kvr_agent_start: %s", kvr_agent_last_error(out->agent));
}

void ah_stop(ah_agent_t *x)
{
    kvr_agent_destroy(x->agent);
    free(x->log);
    memset(x, 0, sizeof(*x));
}

void ah_req(const ah_model_t *m, uint32_t i, uint64_t tokens, ah_req_t *r)
{
    memset(r, 0, sizeof(*r));
    snprintf(r->id, sizeof(r->id), "req-%u", i);
    r->seq = i;
    r->tokens = tokens;
    r->nsrc = (uint32_t)kvr_num_src_blocks(&m->lay, tokens);
    r->ndst = (uint32_t)kvr_num_dst_blocks(&m->lay, tokens);
    assert_true(r->nsrc <= AH_MAX_BLOCKS && r->ndst <= AH_MAX_BLOCKS);
    /* requests i and j (i != j mod slots) use disjoint blocks; tables are
     * permuted to defeat coalescing */
    uint32_t sslot = m->src_pool / 8, dslot = m->dst_pool / 10;
    assert_true(r->nsrc <= sslot && r->ndst <= dslot);
    uint32_t s0 = (i % 8) * sslot, d0 = (i % 10) * dslot;
    for (uint32_t k = 0; k < r->nsrc; k++)
        r->src[k] = s0 + r->nsrc - 1 - k;
    for (uint32_t k = 0; k < r->ndst; k++)
        r->dst[k] = d0 + (k % 2 ? r->ndst - 1 - k / 2 : k / 2);
}

void ah_fill(const ah_model_t *m, ah_agent_t *prod, const ah_req_t *r)
{
    uint32_t *ids = malloc((r->tokens + 1) * sizeof(*ids));
    for (uint64_t g = 0; g < r->tokens; g++)
        ids[g] = r->seq * 100000u + (uint32_t)g;
    for (uint32_t i = 0; i < prod->n; i++) {
        kvr_error_t err = {0};
        kvr_status_t st = kvr_synth_fill_source(
            &m->lay, &prod->desc[i], 1234 + r->seq, r->src, r->nsrc, ids,
            r->tokens, prod->base[i], &err);
        if (st != KVR_OK)
            fail_msg("fill: %s", err.msg);
    }
    free(ids);
}

void ah_open(ah_agent_t *prod, const ah_req_t *r, uint32_t lease_ms,
             uint32_t groups, bool ready)
{
    kvr_agent_send_t s = {r->id,     strlen(r->id), r->src, r->nsrc,
                          r->tokens, lease_ms,      groups};
    assert_int_equal(kvr_agent_send_open(prod->agent, &s), KVR_OK);
    if (ready)
        assert_int_equal(kvr_agent_send_ready(prod->agent, r->id, strlen(r->id),
                                              0, 1u << 30, NULL),
                         KVR_OK);
}

void ah_recv(ah_agent_t *cons, const char *producer, const char *address,
             const ah_req_t *r, uint32_t deadline_ms)
{
    ah_recv_stream(cons, producer, address, r, deadline_ms, false);
}

void ah_recv_stream(ah_agent_t *cons, const char *producer, const char *address,
                    const ah_req_t *r, uint32_t deadline_ms, bool stream)
{
    kvr_agent_recv_t q = {producer,      strlen(producer), address, r->id,
                          strlen(r->id), r->dst,           r->ndst, r->tokens,
                          r->computed,   deadline_ms,      stream};
    kvr_status_t st = kvr_agent_recv(cons->agent, &q);
    if (st != KVR_OK)
        fail_msg("recv: %s", kvr_agent_last_error(cons->agent));
}

void ah_collect(ah_agent_t *x)
{
    kvr_agent_event_t ev;
    while (kvr_agent_poll(x->agent, &ev)) {
        assert_true(x->nlog < AH_MAX_EVENTS);
        x->log[x->nlog++] = ev;
    }
}

static bool is(const kvr_agent_event_t *e, const char *id,
               kvr_agent_event_kind_t kind)
{
    return e->kind == kind && e->request.len == strlen(id) &&
           memcmp(e->request.bytes, id, e->request.len) == 0;
}

uint32_t ah_count(const ah_agent_t *x, const char *id,
                  kvr_agent_event_kind_t kind)
{
    uint32_t n = 0;
    for (uint32_t i = 0; i < x->nlog; i++)
        n += is(&x->log[i], id, kind);
    return n;
}

const kvr_agent_event_t *ah_wait(ah_agent_t *x, const char *id,
                                 kvr_agent_event_kind_t kind, uint32_t ms)
{
    uint64_t end = ah_now_ms() + ms;
    for (;;) {
        ah_collect(x);
        for (uint32_t i = 0; i < x->nlog; i++)
            if (is(&x->log[i], id, kind))
                return &x->log[i];
        if (ah_now_ms() > end)
            break;
        struct pollfd p = {.fd = kvr_agent_event_fd(x->agent),
                           .events = POLLIN};
        poll(&p, 1, 20);
    }
    for (uint32_t i = 0; i < x->nlog; i++)
        print_message("  had %s '%.*s' %s: %s\n",
                      kvr_agent_event_name(x->log[i].kind),
                      (int)x->log[i].request.len, x->log[i].request.bytes,
                      kvr_status_name(x->log[i].status), x->log[i].message);
    fail_msg("no %s for '%s' within %u ms", kvr_agent_event_name(kind), id, ms);
    return NULL;
}

void ah_settle(ah_agent_t *const *xs, uint32_t n, uint32_t ms)
{
    uint64_t end = ah_now_ms() + ms;
    while (ah_now_ms() < end) {
        for (uint32_t i = 0; i < n; i++)
            ah_collect(xs[i]);
        struct timespec ts = {0, 10 * 1000000};
        nanosleep(&ts, NULL);
    }
    for (uint32_t i = 0; i < n; i++)
        ah_collect(xs[i]);
}

void ah_verify(const ah_model_t *m, ah_agent_t *const *stages,
               uint32_t num_stages, const ah_agent_t *cons, const ah_req_t *r)
{
    kvr_request_t req = {r->src,  r->nsrc,   r->dst,
                         r->ndst, r->tokens, r->computed};
    uint32_t checked = 0;
    for (uint32_t i = 0; i < cons->n; i++) {
        if (cons->consumer_only[i])
            continue;
        const kvr_region_desc_t *d = &cons->desc[i];
        for (uint32_t s = 0; s < num_stages; s++)
            for (uint32_t j = 0; j < stages[s]->n; j++) {
                const kvr_region_desc_t *e = &stages[s]->desc[j];
                if (e->role != d->role || e->layer != d->layer)
                    continue;
                kvr_region_pair_t pair = {*e, *d};
                kvr_error_t err = {0};
                kvr_status_t st = kvr_verify_region(&m->lay, cons->rank, &pair,
                                                    &req, stages[s]->base[j],
                                                    cons->base[i], &err);
                if (st != KVR_OK)
                    fail_msg("'%s' rank %u %s layer %u: %s", r->id, cons->rank,
                             kvr_role_name(d->role), d->layer, err.msg);
                checked++;
            }
    }
    assert_true(checked > 0);
}

/* ---- worlds ---- */

void start_instance(world_t *w, uint32_t k, const char *name, uint32_t pp,
                    ah_tweak_t tweak)
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

void start_group_tweaked(world_t *w, uint32_t extra, bool flag,
                         ah_tweak_t tweak)
{
    for (uint32_t r = 0; r < 2; r++) {
        kvr_agent_params_t p = ah_consumer_params(&w->m, w->hub, "decode", r);
        if (tweak)
            tweak(&p);
        ah_start(&w->m, &p, extra, flag, &w->cons[r]);
    }
}

void start_group(world_t *w, uint32_t extra, bool flag)
{
    start_group_tweaked(w, extra, flag, NULL);
}

world_t *world_new(void)
{
    world_t *w = calloc(1, sizeof(*w));
    w->m = ah_model();
    w->hub = ah_hub();
    return w;
}

void world_free(world_t *w)
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

const char *head_addr(world_t *w, uint32_t k)
{
    return kvr_agent_address(w->prod[k][0].agent);
}

ah_agent_t *const *stages_of(world_t *w, uint32_t k)
{
    static _Thread_local ah_agent_t *s[4];
    for (uint32_t i = 0; i < w->pp[k]; i++)
        s[i] = &w->prod[k][i];
    return s;
}

/* Both ranks LOADED then RELEASED exactly once; the bytes verified. */
void expect_loaded(world_t *w, uint32_t k, const ah_req_t *r)
{
    for (uint32_t c = 0; c < 2; c++) {
        const kvr_agent_event_t *e = ah_wait(&w->cons[c], r->id,
                                             KVR_AGENT_RELEASED, AH_WAIT_MS);
        assert_int_equal(e->status, KVR_OK);
        assert_int_equal(ah_count(&w->cons[c], r->id, KVR_AGENT_LOADED), 1);
        assert_int_equal(ah_count(&w->cons[c], r->id, KVR_AGENT_LOAD_FAILED),
                         0);
        ah_verify(&w->m, stages_of(w, k), w->pp[k], &w->cons[c], r);
    }
    for (uint32_t s = 0; s < w->pp[k]; s++)
        assert_int_equal(
            ah_wait(&w->prod[k][s], r->id, KVR_AGENT_SENT, AH_WAIT_MS)->status,
            KVR_OK);
}

/* A consumer request that ended: exactly one LOAD_FAILED with st, then
 * exactly one RELEASED, and no LOADED. */
const kvr_agent_event_t *expect_failed(ah_agent_t *c, const char *id,
                                       kvr_status_t st)
{
    const kvr_agent_event_t *e = ah_wait(c, id, KVR_AGENT_LOAD_FAILED,
                                         AH_WAIT_MS);
    if (e->status != st)
        fail_msg("'%s': %s (%s), expected %s", id, kvr_status_name(e->status),
                 e->message, kvr_status_name(st));
    ah_wait(c, id, KVR_AGENT_RELEASED, AH_WAIT_MS);
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

void fill_all(world_t *w, uint32_t k, const ah_req_t *r)
{
    for (uint32_t s = 0; s < w->pp[k]; s++)
        ah_fill(&w->m, &w->prod[k][s], r);
}

void open_all(world_t *w, uint32_t k, const ah_req_t *r, uint32_t lease_ms,
              bool ready)
{
    for (uint32_t s = 0; s < w->pp[k]; s++)
        ah_open(&w->prod[k][s], r, lease_ms, 1, ready);
}

world_t *two_instances_loaded(ah_tweak_t tweak)
{
    world_t *w = world_new();
    start_instance(w, 0, "prefill-a", 2, tweak);
    start_instance(w, 1, "prefill-b", 1, tweak);
    start_group_tweaked(w, 0, false, tweak);
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
    return w;
}

uint32_t one_rank_failed(world_t *w, const ah_req_t *r)
{
    uint32_t loaded = 0, failed = 0, rank = 0;
    for (uint32_t c = 0; c < 2; c++) {
        ah_wait(&w->cons[c], r->id, KVR_AGENT_RELEASED, AH_WAIT_MS);
        loaded += ah_count(&w->cons[c], r->id, KVR_AGENT_LOADED);
        if (ah_count(&w->cons[c], r->id, KVR_AGENT_LOAD_FAILED)) {
            failed++;
            rank = c;
        }
    }
    if (loaded != 1 || failed != 1)
        fail_msg("'%s': %u ranks loaded and %u failed, expected 1 and 1", r->id,
                 loaded, failed);
    return rank;
}

void recv_all(world_t *w, uint32_t k, const char *name, const ah_req_t *r,
              uint32_t deadline_ms)
{
    for (uint32_t c = 0; c < 2; c++)
        ah_recv(&w->cons[c], name, head_addr(w, k), r, deadline_ms);
}
