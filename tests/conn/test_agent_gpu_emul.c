/* The agent's gpu-direct control path without a device: agents with
 * cuda_device 0 over the emulated GPU path (gpu_path_emul.c: host memory,
 * a worker thread per stream). A PP2 instance serves a W 2 group: many
 * requests of different sizes in flight at once (each pull's completion
 * announced by the host notification queued after its "kernels"), every
 * byte verified; a streamed load, layer group by layer group; both ranks'
 * pulls of one request in one launch; a load
 * aborted while its kernels run; producer stages
 * destroyed while theirs run (their stream is drained before anything
 * goes); pulls after a link's first served without pair plans; pulls
 * held while the stream's queue is full, then launched a request's ranks
 * at once; with KVR_AGENT_GPU_MERGE, waiting pulls of several requests in
 * one launch, and one of them aborted while it runs; layers handed over
 * with an engine's CUDA events ahead of its "GPU", group by group, woken
 * by host functions or by the agent's watcher thread, which keeps a gate
 * until it waited for it. The
 * kernels and the table pool are tested on a device (tests/gpu). */
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
#include "kvrelay/synth.h"

void kvr__emul_kernel_us(unsigned us);
unsigned kvr__emul_notifies(void);
unsigned kvr__emul_jobs(void);
unsigned kvr__emul_tables_used(void);
unsigned kvr__emul_pairs(void);
unsigned kvr__emul_merged(void);
void *kvr__emul_event_new(void);
void kvr__emul_event_free(void *event);
kvr_status_t kvr__emul_record(void *event, void *stream);
kvr_status_t kvr__emul_run_on(void *stream, void (*fn)(void *), void *arg);
bool kvr__emul_event_done(void *event);
void kvr__emul_hold_syncs(bool hold);
unsigned kvr__emul_syncs_done(void);

static world_t *gpu_world(void)
{
    world_t *w = world_new();
    /* every agent's KV in "CUDA memory": the harness is built so */
    start_instance(w, 0, "prefill", 2, NULL);
    start_group(w, 0, false);
    return w;
}

/* Request i of 1 to 500 tokens, filled, opened and ready on both stages. */
static void offer(world_t *w, uint32_t i, ah_req_t *r)
{
    ah_req(&w->m, i, 1 + (i * 131u) % 500u, r);
    fill_all(w, 0, r);
    open_all(w, 0, r, 0, true);
}

static bool pulling(ah_agent_t *c, const char *id)
{
    kvr_agent_req_status_t st;
    return kvr_agent_status(c->agent, "prefill", 7, id, strlen(id), &st) ==
               KVR_OK &&
           st.recv == KVR_RECV_PULLING;
}

/* Until both ranks sent every WRITE_REQUEST of id and each stage launched
 * (a job per stage at least, since `before`), then a little longer for any
 * rank's pull launched on its own: the "kernels" run long past this. */
static void wait_launched(world_t *w, const char *id, unsigned before)
{
    ah_agent_t *all[] = {&w->cons[0], &w->cons[1], &w->prod[0][0],
                         &w->prod[0][1]};
    uint64_t end = ah_now_ms() + AH_WAIT_MS;
    while (!(kvr__emul_jobs() - before >= 2 && pulling(&w->cons[0], id) &&
             pulling(&w->cons[1], id)) &&
           ah_now_ms() < end)
        ah_settle(all, 4, 5);
    if (kvr__emul_jobs() - before < 2)
        fail_msg("'%s': %u launches", id, kvr__emul_jobs() - before);
    ah_settle(all, 4, 50);
}

/* kvr_agent_alloc_region's device regions are carved from the agent's
 * arena (gpu_arena.h; the emulation's chunks are 1 MiB, regions 256
 * bytes apart): each starts aligned, after the one before it in the same
 * chunk, and none overlaps another (docs/agent.md, where device regions
 * live). */
static void regions_from_chunks(void **state)
{
    (void)state;
    world_t *w = gpu_world();
    ah_agent_t *all[] = {&w->cons[0], &w->prod[0][0]};
    uint32_t shared = 0;
    for (int k = 0; k < 2; k++) {
        const ah_agent_t *x = all[k];
        assert_true(x->n >= 2);
        for (uint32_t i = 0; i < x->n; i++) {
            const unsigned char *b = x->base[i];
            uint64_t len = kvr_region_bytes(&x->desc[i]);
            assert_int_equal((uintptr_t)b % 256, 0);
            for (uint32_t j = 0; j < i; j++) {
                const unsigned char *c = x->base[j];
                assert_true(b >= c + kvr_region_bytes(&x->desc[j]) ||
                            c >= b + len);
            }
            uint64_t prev = i > 0 ? kvr_region_bytes(&x->desc[i - 1]) : 0;
            if (i > 0 && b == (const unsigned char *)x->base[i - 1] +
                                  (prev + 255) / 256 * 256)
                shared++; /* right after the one before, in its chunk */
        }
    }
    assert_true(shared > 0);
    world_free(w);
}

/* Two waves of 8 requests (disjoint blocks within a wave), each wave's
 * loads asked at once: 32 pulls in flight per wave. */
static void many_in_flight(void **state)
{
    (void)state;
    kvr__emul_kernel_us(2000);
    world_t *w = gpu_world();
    unsigned before = kvr__emul_notifies(), jobs0 = kvr__emul_jobs();
    ah_req_t r[16];
    for (uint32_t wave = 0; wave < 2; wave++) {
        for (uint32_t i = wave * 8; i < wave * 8 + 8; i++) {
            offer(w, i, &r[i]);
            recv_all(w, 0, "prefill", &r[i], 0);
        }
        for (uint32_t i = wave * 8; i < wave * 8 + 8; i++)
            expect_loaded(w, 0, &r[i]);
    }
    /* every launch (at most one per pull: 2 stages x 2 ranks x 16; pulls
     * of one request by both ranks may share one) queued the notification
     * that wakes its loop once its kernels are done */
    unsigned queued = kvr__emul_notifies() - before;
    unsigned jobs = kvr__emul_jobs() - jobs0;
    if (queued != jobs || jobs == 0 || jobs > 2 * 2 * 16)
        fail_msg("%u host notifications queued for %u launches of 64 pulls",
                 queued, jobs);
    world_free(w);
}

/* Both ranks abort while the stages' kernels run: the pulls are cut (the
 * kernels end first), the load fails as canceled, and the next request
 * loads. */
static void abort_while_running(void **state)
{
    (void)state;
    kvr__emul_kernel_us(500000);
    world_t *w = gpu_world();
    ah_req_t a, b;
    unsigned before = kvr__emul_jobs();
    offer(w, 1, &a);
    recv_all(w, 0, "prefill", &a, 0);
    wait_launched(w, a.id, before);
    for (uint32_t c = 0; c < 2; c++)
        assert_int_equal(kvr_agent_recv_abort(w->cons[c].agent, "prefill", 7,
                                              a.id, strlen(a.id)),
                         KVR_OK);
    for (uint32_t c = 0; c < 2; c++)
        expect_failed(&w->cons[c], a.id, KVR_ERR_CANCELED);
    for (uint32_t s = 0; s < 2; s++)
        ah_wait(&w->prod[0][s], a.id, KVR_AGENT_SEND_FAILED, AH_WAIT_MS);
    kvr__emul_kernel_us(0);
    offer(w, 2, &b);
    recv_all(w, 0, "prefill", &b, 0);
    expect_loaded(w, 0, &b);
    world_free(w);
}

/* Streamed: each stage readies its layers one at a time while the ranks
 * wait; each layer group is its own launch, the next one launched when
 * the previous one's notification answered it, every one from the
 * relayout tables its pull made when it arrived (none made per launch). */
static void streamed_groups(void **state)
{
    (void)state;
    kvr__emul_kernel_us(3000);
    world_t *w = gpu_world();
    unsigned used0 = kvr__emul_tables_used(), pairs0 = kvr__emul_pairs();
    ah_req_t a;
    ah_req(&w->m, 4, 300, &a);
    fill_all(w, 0, &a);
    open_all(w, 0, &a, 0, false);
    for (uint32_t c = 0; c < 2; c++)
        ah_recv_stream(&w->cons[c], "prefill", head_addr(w, 0), &a, 0, true);
    ah_agent_t *all[] = {&w->cons[0], &w->cons[1], &w->prod[0][0],
                         &w->prod[0][1]};
    for (uint32_t layer = 0; layer < w->m.layers; layer++) {
        ah_settle(all, 4, 10);
        ah_agent_t *st = &w->prod[0][layer * 2 / w->m.layers];
        assert_int_equal(kvr_agent_send_ready(st->agent, a.id, strlen(a.id),
                                              layer, layer + 1, NULL),
                         KVR_OK);
    }
    expect_loaded(w, 0, &a);
    for (uint32_t c = 0; c < 2; c++)
        assert_true(ah_count(&w->cons[c], a.id, KVR_AGENT_LAYERS_LOADED) >= 2);
    unsigned pairs = kvr__emul_pairs() - pairs0;
    unsigned used = kvr__emul_tables_used() - used0;
    if (pairs == 0 || used != pairs)
        fail_msg("%u of %u launched regions from the pulls' tables", used,
                 pairs);
    world_free(w);
}

/* Both ranks pull before the stages are ready: on send_ready each
 * stage's two pulls move at once and share one launch (issue 17: one
 * launch for every rank that pulled the request), every byte right. */
static void ranks_share_a_launch(void **state)
{
    (void)state;
    kvr__emul_kernel_us(1000);
    world_t *w = gpu_world();
    ah_req_t a;
    ah_req(&w->m, 5, 200, &a);
    fill_all(w, 0, &a);
    open_all(w, 0, &a, 0, false);
    recv_all(w, 0, "prefill", &a, 0);
    ah_agent_t *all[] = {&w->cons[0], &w->cons[1], &w->prod[0][0],
                         &w->prod[0][1]};
    ah_settle(all, 4, 300); /* both WRITE_REQUESTs held on each stage */
    unsigned jobs0 = kvr__emul_jobs();
    for (uint32_t s = 0; s < 2; s++)
        assert_int_equal(kvr_agent_send_ready(w->prod[0][s].agent, a.id,
                                              strlen(a.id), 0, 1u << 30, NULL),
                         KVR_OK);
    expect_loaded(w, 0, &a);
    unsigned jobs = kvr__emul_jobs() - jobs0;
    if (jobs >= 4)
        fail_msg("%u launches for 2 stages x 2 ranks: none shared", jobs);
    world_free(w);
}

/* Four requests asked at once, kernels of 300 ms: each stage launches
 * every request's pulls while the first ones' kernels still run (the
 * stream queues them), not one request after another's completion. */
static void launches_overlap(void **state)
{
    (void)state;
    kvr__emul_kernel_us(300000);
    world_t *w = gpu_world();
    ah_req_t r[4];
    unsigned jobs0 = kvr__emul_jobs();
    for (uint32_t i = 0; i < 4; i++) {
        offer(w, 20 + i, &r[i]);
        recv_all(w, 0, "prefill", &r[i], 0);
    }
    ah_agent_t *all[] = {&w->cons[0], &w->cons[1], &w->prod[0][0],
                         &w->prod[0][1]};
    uint64_t end = ah_now_ms() + 250; /* the first kernels still run */
    while (kvr__emul_jobs() - jobs0 < 8 && ah_now_ms() < end)
        ah_settle(all, 4, 5);
    unsigned jobs = kvr__emul_jobs() - jobs0;
    if (jobs < 8)
        fail_msg("%u launches of 4 requests on 2 stages while the first "
                 "kernels ran", jobs);
    kvr__emul_kernel_us(0);
    for (uint32_t i = 0; i < 4; i++)
        expect_loaded(w, 0, &r[i]);
    world_free(w);
}

/* The stages go while their kernels run: destroy drains the stream before
 * it frees a job or closes the fd the host notification writes. */
static void destroy_while_running(void **state)
{
    (void)state;
    kvr__emul_kernel_us(500000);
    world_t *w = gpu_world();
    ah_req_t a;
    unsigned before = kvr__emul_jobs();
    offer(w, 3, &a);
    recv_all(w, 0, "prefill", &a, 0);
    wait_launched(w, a.id, before);
    for (uint32_t s = 0; s < 2; s++)
        ah_stop(&w->prod[0][s]);
    for (uint32_t c = 0; c < 2; c++) {
        ah_wait(&w->cons[c], a.id, KVR_AGENT_RELEASED, AH_WAIT_MS);
        assert_int_equal(ah_count(&w->cons[c], a.id, KVR_AGENT_LOADED), 0);
        assert_int_equal(ah_count(&w->cons[c], a.id, KVR_AGENT_LOAD_FAILED), 1);
    }
    kvr__emul_kernel_us(0);
    world_free(w);
}

static uint64_t planless(world_t *w)
{
    uint64_t n = 0;
    for (uint32_t s = 0; s < 2; s++) {
        kvr_agent_t *a = w->prod[0][s].agent;
        pthread_mutex_lock(&a->turn_lock);
        n += a->planless_pulls;
        pthread_mutex_unlock(&a->turn_lock);
    }
    return n;
}

/* The first request on each link is planned and priced; gpu-direct won,
 * so the next requests' pulls go without pair plans (their bytes from the
 * relayout tables), and every byte still lands where the consumer's own
 * plan says (expect_loaded verifies it, and the consumer checks each
 * WRITE_DONE's bytes against its plan). */
static void planless_after_first(void **state)
{
    (void)state;
    kvr__emul_kernel_us(0);
    world_t *w = gpu_world();
    ah_req_t r[4];
    offer(w, 30, &r[0]);
    recv_all(w, 0, "prefill", &r[0], 0);
    expect_loaded(w, 0, &r[0]);
    if (planless(w) != 0)
        fail_msg("%llu pulls planless before any was priced",
                 (unsigned long long)planless(w));
    for (uint32_t i = 1; i < 4; i++) {
        offer(w, 30 + i, &r[i]);
        recv_all(w, 0, "prefill", &r[i], 0);
        expect_loaded(w, 0, &r[i]);
    }
    /* 3 requests x 2 stages x 2 ranks */
    if (planless(w) != 12)
        fail_msg("%llu of 12 later pulls planless",
                 (unsigned long long)planless(w));
    world_free(w);
}

static void queue_cap(world_t *w, uint64_t bytes)
{
    for (uint32_t s = 0; s < 2; s++) {
        kvr_agent_t *a = w->prod[0][s].agent;
        pthread_mutex_lock(&a->turn_lock);
        a->gpu_queue_cap = bytes;
        pthread_mutex_unlock(&a->turn_lock);
    }
}

/* A queue of one byte: two jobs run on each stage's stream, later pulls
 * wait for a completion and then go a request at a time, both ranks in
 * one launch; six requests asked at once all load, every byte right,
 * with fewer launches than pulls. */
static void held_then_shared(void **state)
{
    (void)state;
    kvr__emul_kernel_us(20000);
    world_t *w = gpu_world();
    queue_cap(w, 1);
    ah_req_t r[6];
    unsigned jobs0 = kvr__emul_jobs();
    for (uint32_t i = 0; i < 6; i++) {
        offer(w, 40 + i, &r[i]);
        recv_all(w, 0, "prefill", &r[i], 0);
    }
    for (uint32_t i = 0; i < 6; i++)
        expect_loaded(w, 0, &r[i]);
    unsigned jobs = kvr__emul_jobs() - jobs0;
    /* 24 pulls: 2 launched alone per stage before the queue filled, the
     * rest shared by a request's two ranks (about 16 launches; 24 when
     * every pull launches on its own) */
    if (jobs == 0 || jobs > 20)
        fail_msg("%u launches for 24 pulls of 6 requests", jobs);
    kvr__emul_kernel_us(0);
    world_free(w);
}

/* A gpu world whose stages carry up to four requests a launch
 * (KVR_AGENT_GPU_MERGE, read as each agent starts; unset again for the
 * other tests) with a queue of one byte: once two jobs run on a stage,
 * its later pulls wait for a completion, then go together. */
static world_t *merge_world(void)
{
    setenv("KVR_AGENT_GPU_MERGE", "4", 1);
    world_t *w = gpu_world();
    unsetenv("KVR_AGENT_GPU_MERGE");
    queue_cap(w, 1);
    return w;
}

/* Eight requests of different lengths asked at once, kernels of 300 ms;
 * returns the launches made after each stage's first two (which fill its
 * queue at once). */
static unsigned offer_eight(world_t *w, uint32_t base, ah_req_t *r)
{
    unsigned jobs0 = kvr__emul_jobs();
    kvr__emul_kernel_us(300000);
    for (uint32_t i = 0; i < 8; i++) {
        ah_req(&w->m, base + i, 20 + 61u * i, &r[i]);
        fill_all(w, 0, &r[i]);
        open_all(w, 0, &r[i], 0, true);
        recv_all(w, 0, "prefill", &r[i], 0);
    }
    ah_agent_t *all[] = {&w->cons[0], &w->cons[1], &w->prod[0][0],
                         &w->prod[0][1]};
    uint64_t end = ah_now_ms() + AH_WAIT_MS;
    while (kvr__emul_jobs() - jobs0 < 4 && ah_now_ms() < end)
        ah_settle(all, 4, 5);
    if (kvr__emul_jobs() - jobs0 < 4)
        fail_msg("%u launches, 2 per stage expected at once",
                 kvr__emul_jobs() - jobs0);
    return kvr__emul_jobs();
}

/* The waiting pulls of the eight requests (by both ranks) go four
 * requests to a launch: fewer launches than requests, some carrying
 * several, every byte where the consumer's plan says. */
static void merged_requests(void **state)
{
    (void)state;
    world_t *w = merge_world();
    ah_req_t r[8];
    unsigned merged0 = kvr__emul_merged();
    unsigned jobs1 = offer_eight(w, 50, r);
    for (uint32_t i = 0; i < 8; i++)
        expect_loaded(w, 0, &r[i]);
    unsigned jobs = kvr__emul_jobs() - jobs1;
    unsigned merged = kvr__emul_merged() - merged0;
    /* one request a launch: 12 or more (6 to 8 requests a stage) */
    if (jobs >= 8 || merged < 2)
        fail_msg("%u launches (%u of several requests) after the first "
                 "four, for 8 requests on 2 stages",
                 jobs, merged);
    kvr__emul_kernel_us(0);
    world_free(w);
}

static bool same_id(const kvr__pull_t *p, const kvr__pull_t *q)
{
    return q->request.len == p->request.len &&
           memcmp(q->request.bytes, p->request.bytes, p->request.len) == 0;
}

/* Whether p's job carries both ranks' pulls of p's request (so neither
 * rank has it loaded yet) and a pull of another request. */
static bool rides_merged(const kvr_agent_t *a, const kvr__pull_t *p)
{
    uint32_t mine = 0, others = 0;
    for (const kvr__pull_t *q = a->active; q != NULL; q = q->work_next)
        if (p->job != NULL && q->job == p->job) {
            mine += same_id(p, q);
            others += !same_id(p, q);
        }
    return mine == 2 && others > 0;
}

/* The request of a pull on stage s that rides_merged (NULL: none yet). */
static const ah_req_t *merged_victim(world_t *w, uint32_t s,
                                     const ah_req_t *r, uint32_t n)
{
    kvr_agent_t *a = w->prod[0][s].agent;
    const ah_req_t *found = NULL;
    pthread_mutex_lock(&a->turn_lock);
    for (const kvr__pull_t *p = a->active; p && !found; p = p->work_next)
        for (uint32_t i = 0; i < n && !found && rides_merged(a, p); i++)
            if (strlen(r[i].id) == p->request.len &&
                memcmp(r[i].id, p->request.bytes, p->request.len) == 0)
                found = &r[i];
    pthread_mutex_unlock(&a->turn_lock);
    return found;
}

/* One request of a launch that carries several is aborted while its
 * kernels run: only it fails (canceled), the others load, every byte
 * right. */
static void merged_one_aborted(void **state)
{
    (void)state;
    world_t *w = merge_world();
    ah_req_t r[8];
    offer_eight(w, 60, r);
    ah_agent_t *all[] = {&w->cons[0], &w->cons[1], &w->prod[0][0],
                         &w->prod[0][1]};
    const ah_req_t *v = NULL;
    uint64_t end = ah_now_ms() + AH_WAIT_MS;
    while ((v = merged_victim(w, 0, r, 8)) == NULL && ah_now_ms() < end)
        ah_settle(all, 4, 5);
    if (v == NULL)
        fail_msg("no launch of several requests on stage 0");
    for (uint32_t c = 0; c < 2; c++)
        assert_int_equal(kvr_agent_recv_abort(w->cons[c].agent, "prefill", 7,
                                              v->id, strlen(v->id)),
                         KVR_OK);
    for (uint32_t c = 0; c < 2; c++)
        expect_failed(&w->cons[c], v->id, KVR_ERR_CANCELED);
    for (uint32_t s = 0; s < 2; s++)
        ah_wait(&w->prod[0][s], v->id, KVR_AGENT_SEND_FAILED, AH_WAIT_MS);
    kvr__emul_kernel_us(0);
    for (uint32_t i = 0; i < 8; i++)
        if (&r[i] != v)
            expect_loaded(w, 0, &r[i]);
    world_free(w);
}

/* ---- send_ready with an engine's CUDA events (docs/agent.md) ---- */

/* What the emulated engine stream runs: request r's source KV of one
 * layer written into stage st's regions, or a wait until the test opens
 * the latch. */
typedef struct engine_step {
    const ah_model_t *m;
    ah_agent_t *st;
    const ah_req_t *r;
    uint32_t layer;
    _Atomic bool *latch;
} engine_step_t;

static void compute_layer(void *arg)
{
    const engine_step_t *e = arg;
    uint32_t *ids = malloc((e->r->tokens + 1) * sizeof(*ids));
    for (uint64_t g = 0; g < e->r->tokens; g++)
        ids[g] = e->r->seq * 100000u + (uint32_t)g; /* as ah_fill's */
    for (uint32_t i = 0; i < e->st->n; i++)
        if (e->st->desc[i].layer == e->layer)
            kvr_synth_fill_source(&e->m->lay, &e->st->desc[i],
                                  1234 + e->r->seq, e->r->src, e->r->nsrc,
                                  ids, e->r->tokens, e->st->base[i], NULL);
    free(ids);
}

static void hold_until_open(void *arg)
{
    const engine_step_t *e = arg;
    while (!*e->latch)
        usleep(200);
}

/* A LAYERS_LOADED of request id covers layer. */
static bool layer_reported(ah_agent_t *c, const char *id, uint32_t layer)
{
    ah_collect(c);
    for (uint32_t i = 0; i < c->nlog; i++) {
        const kvr_agent_event_t *e = &c->log[i];
        if (e->kind == KVR_AGENT_LAYERS_LOADED && e->request.len == strlen(id) &&
            memcmp(e->request.bytes, id, e->request.len) == 0 &&
            e->layer_begin <= layer && layer < e->layer_end)
            return true;
    }
    return false;
}

/* The last stage's engine runs ahead of its "GPU": send_ready for layer 2
 * and for layer 3 at once, each with the event recorded after that
 * layer's compute, and layer 3's compute held back. Layer 2 must move and
 * be reported loaded while layer 3 is not computed yet (a wait for the
 * engine's events queued where the copies run would hold layer 2 behind
 * layer 3's event), another request must load meanwhile (nor hold the
 * copies of others), nothing may be LOADED early, and once layer 3 is
 * computed every byte must be right (no copy ran before its event). A
 * request aborted while its gate waits ends SEND_FAILED, and its gate
 * completing later touches nothing. */
/* Request a opened on both stages (not ready), the first stage's layers
 * ready, both ranks streaming it; the last stage's engine stream. */
static void *stream_from_first(world_t *w, const ah_req_t *a)
{
    open_all(w, 0, a, 0, false);
    assert_int_equal(kvr_agent_send_ready(w->prod[0][0].agent, a->id,
                                          strlen(a->id), 0, 2, NULL),
                     KVR_OK);
    for (uint32_t k = 0; k < 2; k++)
        ah_recv_stream(&w->cons[k], "prefill", head_addr(w, 0), a, 0, true);
    void *engine = NULL;
    assert_int_equal(kvr__gpu_stream_create(0, &engine, NULL), KVR_OK);
    return engine;
}

/* Until both ranks reported layer `layer` of id loaded (why: what it
 * means that they did not). */
static void expect_layer(world_t *w, const char *id, uint32_t layer,
                         const char *why)
{
    ah_agent_t *all[] = {&w->cons[0], &w->cons[1], &w->prod[0][0],
                         &w->prod[0][1]};
    uint64_t end = ah_now_ms() + AH_WAIT_MS;
    while (!(layer_reported(&w->cons[0], id, layer) &&
             layer_reported(&w->cons[1], id, layer)) &&
           ah_now_ms() < end)
        ah_settle(all, 4, 10);
    for (uint32_t k = 0; k < 2; k++)
        if (!layer_reported(&w->cons[k], id, layer))
            fail_msg("rank %u: layer %u of '%s' not loaded %s", k, layer, id,
                     why);
}

static void gate_groups(void)
{
    kvr__emul_kernel_us(500);
    world_t *w = gpu_world();
    ah_agent_t *last = &w->prod[0][1];
    ah_req_t a, b, c;
    ah_req(&w->m, 20, 200, &a);
    ah_req(&w->m, 21, 120, &b);
    ah_req(&w->m, 22, 40, &c);
    ah_fill(&w->m, &w->prod[0][0], &a); /* the last stage computes its own */
    void *engine = stream_from_first(w, &a), *ev2 = kvr__emul_event_new(),
         *ev3 = kvr__emul_event_new();
    _Atomic bool latch = false;
    engine_step_t l2 = {&w->m, last, &a, 2, &latch}, l3 = l2;
    l3.layer = 3;
    assert_int_equal(kvr__emul_run_on(engine, compute_layer, &l2), KVR_OK);
    assert_int_equal(kvr__emul_record(ev2, engine), KVR_OK);
    assert_int_equal(kvr__emul_run_on(engine, hold_until_open, &l3), KVR_OK);
    assert_int_equal(kvr__emul_run_on(engine, compute_layer, &l3), KVR_OK);
    assert_int_equal(kvr__emul_record(ev3, engine), KVR_OK);
    assert_int_equal(kvr_agent_send_ready(last->agent, a.id, strlen(a.id), 2,
                                          3, ev2),
                     KVR_OK);
    assert_int_equal(kvr_agent_send_ready(last->agent, a.id, strlen(a.id), 3,
                                          4, ev3),
                     KVR_OK);
    /* c: a gate behind the held compute, then aborted */
    ah_open(last, &c, 0, 1, false);
    assert_int_equal(kvr_agent_send_ready(last->agent, c.id, strlen(c.id), 2,
                                          4, ev3),
                     KVR_OK);
    assert_int_equal(kvr_agent_send_abort(last->agent, c.id, strlen(c.id)),
                     KVR_OK);
    assert_int_equal(
        ah_wait(last, c.id, KVR_AGENT_SEND_FAILED, AH_WAIT_MS)->status,
        KVR_ERR_CANCELED);
    expect_layer(w, a.id, 2, "while layer 3's event waits");
    /* b, ready without events, loads while a's last gate waits */
    fill_all(w, 0, &b);
    open_all(w, 0, &b, 0, true);
    recv_all(w, 0, "prefill", &b, 0);
    expect_loaded(w, 0, &b);
    for (uint32_t k = 0; k < 2; k++) {
        assert_int_equal(ah_count(&w->cons[k], a.id, KVR_AGENT_LOADED), 0);
        assert_false(layer_reported(&w->cons[k], a.id, 3));
    }
    assert_false(kvr__emul_event_done(ev3));
    latch = true;
    expect_loaded(w, 0, &a);
    kvr__gpu_stream_sync(engine, NULL);
    kvr__gpu_stream_destroy(engine);
    world_free(w);
    kvr__emul_event_free(ev2);
    kvr__emul_event_free(ev3);
}

/* The watcher keeps its gate: the loop opens a gate (its backstop looks)
 * while the watcher is slow to wait for it, and the next send_ready, whose
 * compute is held back, arms a gate. Were the opened gate free by then,
 * that arming would take it, and the watcher, once it waits, would wait
 * for the held compute and wake nothing else meanwhile. It must finish
 * its wait while the compute is still held. */
static void watcher_keeps_its_gate(void **state)
{
    (void)state;
    setenv("KVR_AGENT_GATE_WATCH", "spin", 1);
    kvr__emul_kernel_us(200);
    world_t *w = gpu_world();
    ah_agent_t *all[] = {&w->cons[0], &w->cons[1], &w->prod[0][0],
                         &w->prod[0][1]};
    ah_agent_t *last = &w->prod[0][1];
    ah_req_t a;
    ah_req(&w->m, 30, 100, &a);
    fill_all(w, 0, &a);
    void *engine = stream_from_first(w, &a), *done = kvr__emul_event_new(),
         *held = kvr__emul_event_new();
    _Atomic bool latch = false;
    engine_step_t hold = {&w->m, last, &a, 3, &latch};
    assert_int_equal(kvr__emul_record(done, engine), KVR_OK);
    assert_int_equal(kvr__emul_run_on(engine, hold_until_open, &hold), KVR_OK);
    assert_int_equal(kvr__emul_record(held, engine), KVR_OK);
    kvr__emul_hold_syncs(true);
    unsigned syncs = kvr__emul_syncs_done();
    assert_int_equal(kvr_agent_send_ready(last->agent, a.id, strlen(a.id), 2,
                                          3, done),
                     KVR_OK);
    expect_layer(w, a.id, 2, "from a gate the loop opens itself");
    assert_int_equal(kvr_agent_send_ready(last->agent, a.id, strlen(a.id), 3,
                                          4, held),
                     KVR_OK);
    kvr__emul_hold_syncs(false);
    uint64_t end = ah_now_ms() + AH_WAIT_MS;
    while (kvr__emul_syncs_done() == syncs && ah_now_ms() < end)
        ah_settle(all, 4, 10);
    if (kvr__emul_syncs_done() == syncs)
        fail_msg("the watcher waits for the held compute");
    latch = true;
    expect_loaded(w, 0, &a);
    kvr__gpu_stream_sync(engine, NULL);
    kvr__gpu_stream_destroy(engine);
    world_free(w);
    kvr__emul_event_free(done);
    kvr__emul_event_free(held);
    unsetenv("KVR_AGENT_GATE_WATCH");
}

static void events_gate_groups(void **state)
{
    (void)state;
    gate_groups();
}

/* The same with KVR_AGENT_GATE_WATCH=spin: a thread of each agent waits
 * for the gates instead of a host function each. Any other value is
 * refused at create, naming it. */
static void events_gate_groups_watched(void **state)
{
    (void)state;
    setenv("KVR_AGENT_GATE_WATCH", "spin", 1);
    gate_groups();
    setenv("KVR_AGENT_GATE_WATCH", "block", 1);
    ah_model_t m = ah_model();
    kvr_agent_params_t p = ah_producer_params(&m, NULL, "p", 0, 1);
    kvr_agent_t *a = NULL;
    kvr_error_t err = {0};
    assert_int_equal(kvr_agent_create(&p, &a, &err), KVR_ERR_INVALID);
    assert_non_null(strstr(err.msg, "'block'"));
    unsetenv("KVR_AGENT_GATE_WATCH");
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(regions_from_chunks),
        cmocka_unit_test(many_in_flight),
        cmocka_unit_test(abort_while_running),
        cmocka_unit_test(streamed_groups),
        cmocka_unit_test(ranks_share_a_launch),
        cmocka_unit_test(destroy_while_running),
        cmocka_unit_test(launches_overlap),
        cmocka_unit_test(planless_after_first),
        cmocka_unit_test(held_then_shared),
        cmocka_unit_test(merged_requests),
        cmocka_unit_test(merged_one_aborted),
        cmocka_unit_test(events_gate_groups),
        cmocka_unit_test(events_gate_groups_watched),
        cmocka_unit_test(watcher_keeps_its_gate),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
