/* The agent's threading rules: several engine threads call send_open,
 * recv, abort, status and poll at once on shared agents; and agents
 * without a progress thread, driven by kvr_agent_progress from one loop,
 * move a large transfer in bounded turns, and kvr_agent_wait runs such a
 * loop on the thread that waits. Part of the ThreadSanitizer run
 * (make test-tsan). */
#include <poll.h>
#include <pthread.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include <cmocka.h>

#include "agent_harness.h"
#include "agent_internal.h"

#define THREADS 4
#define PER_THREAD 6

static const char *A = "prefill-a";

/* ---- many engine threads ---- */

typedef struct shared {
    world_t *w;
    pthread_mutex_t lock;
    kvr_agent_event_t *log; /* every event polled by any thread */
    uint32_t nlog;
    uint32_t polling; /* threads between an agent poll and its log entry */
    uint32_t aborted, loaded;
    uint32_t failed; /* checks that failed on a worker (named on stderr) */
} shared_t;

typedef struct worker {
    shared_t *sh;
    uint32_t t;
} worker_t;

static ah_agent_t *agent_at(world_t *w, uint32_t i)
{
    return i < 2 ? &w->prod[0][i] : &w->cons[i - 2];
}

/* Any thread polls every agent; events go to the shared log tagged by the
 * agent that produced them (in the event's layer_begin, unused here).
 * Taking an event and logging it are two steps, so a thread that took a
 * rank's LOADED can log it after another thread took and logged the
 * RELEASED queued behind it: `polling` counts the threads between the
 * steps, and a request's log is complete only while it is zero. */
static bool poll_one(shared_t *sh, uint32_t i)
{
    kvr_agent_event_t ev;
    pthread_mutex_lock(&sh->lock);
    sh->polling++;
    pthread_mutex_unlock(&sh->lock);
    bool got = kvr_agent_poll(agent_at(sh->w, i)->agent, &ev);
    ev.layer_begin = i;
    pthread_mutex_lock(&sh->lock);
    if (got && sh->nlog < AH_MAX_EVENTS)
        sh->log[sh->nlog++] = ev;
    else if (got) { /* the counts would go wrong */
        fprintf(stderr, "the event log of %u entries is full\n", sh->nlog);
        sh->failed++;
    }
    sh->polling--;
    pthread_mutex_unlock(&sh->lock);
    return got;
}

static void poll_all(shared_t *sh)
{
    for (uint32_t i = 0; i < 4; i++)
        while (poll_one(sh, i))
            ;
}

/* Events of `kind` for request id from agent `agent`; under sh->lock. */
static uint32_t count_locked(const shared_t *sh, uint32_t agent,
                             const char *id, kvr_agent_event_kind_t kind)
{
    uint32_t n = 0;
    for (uint32_t i = 0; i < sh->nlog; i++) {
        const kvr_agent_event_t *e = &sh->log[i];
        n += e->layer_begin == agent && e->kind == kind &&
             e->request.len == strlen(id) &&
             memcmp(e->request.bytes, id, e->request.len) == 0;
    }
    return n;
}

static uint32_t count(shared_t *sh, uint32_t agent, const char *id,
                      kvr_agent_event_kind_t kind)
{
    pthread_mutex_lock(&sh->lock);
    uint32_t n = count_locked(sh, agent, id, kind);
    pthread_mutex_unlock(&sh->lock);
    return n;
}

/* The last events of request id: one per producer stage, one per rank. */
static uint32_t finals_locked(const shared_t *sh, const char *id)
{
    static const kvr_agent_event_kind_t send_end[] = {
        KVR_AGENT_SENT, KVR_AGENT_SEND_FAILED, KVR_AGENT_SEND_EXPIRED};
    uint32_t n = count_locked(sh, 2, id, KVR_AGENT_RELEASED) +
                 count_locked(sh, 3, id, KVR_AGENT_RELEASED);
    for (uint32_t k = 0; k < 3; k++)
        n += count_locked(sh, 0, id, send_end[k]) +
             count_locked(sh, 1, id, send_end[k]);
    return n;
}

static uint32_t finals(shared_t *sh, const char *id)
{
    pthread_mutex_lock(&sh->lock);
    uint32_t n = finals_locked(sh, id);
    pthread_mutex_unlock(&sh->lock);
    return n;
}

/* Every event of request id is in the log: its final events are, and no
 * thread holds one it took before them (see poll_all). */
static bool settled(shared_t *sh, const char *id)
{
    pthread_mutex_lock(&sh->lock);
    bool done = sh->polling == 0 && finals_locked(sh, id) >= 4;
    pthread_mutex_unlock(&sh->lock);
    return done;
}

/* A request that did not settle: its logged events and where each agent
 * says it stands, for the failure message. */
static void dump(shared_t *sh, const char *id, uint64_t started)
{
    pthread_mutex_lock(&sh->lock);
    fprintf(stderr, "%s after %llu ms, %u threads polling:\n", id,
            (unsigned long long)(ah_now_ms() - started), sh->polling);
    for (uint32_t i = 0; i < sh->nlog; i++) {
        const kvr_agent_event_t *e = &sh->log[i];
        if (e->request.len == strlen(id) &&
            memcmp(e->request.bytes, id, e->request.len) == 0)
            fprintf(stderr, "  agent %u: %s %s %s\n", e->layer_begin,
                    kvr_agent_event_name(e->kind), kvr_status_str(e->status),
                    e->message);
    }
    pthread_mutex_unlock(&sh->lock);
    for (uint32_t i = 0; i < 4; i++) {
        kvr_agent_req_status_t st;
        memset(&st, 0, sizeof(st));
        kvr_status_t rc = kvr_agent_status(agent_at(sh->w, i)->agent, A,
                                           strlen(A), id, strlen(id), &st);
        fprintf(stderr, "  agent %u: %s send %s recv %s: %s\n", i,
                kvr_status_str(rc), kvr_agent_send_state_name(st.send),
                kvr_agent_recv_state_name(st.recv),
                rc == KVR_OK ? st.message : "");
    }
}

/* A check on a worker thread: cmocka's assertions may only fail on the
 * test's own thread, so a worker names the failure and counts it, and the
 * test asserts the count after joining. */
#define CHECK_EQ(sh, got, want, id)                                            \
    do {                                                                       \
        long long g_ = (long long)(got), w_ = (long long)(want);               \
        if (g_ != w_) {                                                        \
            fprintf(stderr, "%s:%d: %s: %s is %lld, expected %lld\n",          \
                    __FILE__, __LINE__, (id), #got, g_, w_);                   \
            pthread_mutex_lock(&(sh)->lock);                                   \
            (sh)->failed++;                                                    \
            pthread_mutex_unlock(&(sh)->lock);                                 \
            return;                                                            \
        }                                                                      \
    } while (0)

static void run_one(shared_t *sh, uint32_t t, uint32_t k, unsigned *seed)
{
    world_t *w = sh->w;
    ah_req_t r;
    uint64_t started = ah_now_ms();
    ah_req(&w->m, t, 64 + (uint64_t)(rand_r(seed) % 400), &r);
    snprintf(r.id, sizeof(r.id), "t%u-r%u", t, k);
    fill_all(w, 0, &r);
    bool abort_it = rand_r(seed) % 3 == 0;
    bool consumer_first = rand_r(seed) % 2;
    if (!consumer_first)
        open_all(w, 0, &r, 0, true);
    recv_all(w, 0, A, &r, 0);
    if (consumer_first)
        open_all(w, 0, &r, 0, true);
    /* abort once the pulls are out: a rank that never pulled leaves the
     * producer to its lease */
    kvr_agent_req_status_t now;
    uint64_t end = ah_now_ms() + AH_WAIT_MS;
    while (abort_it && ah_now_ms() < end &&
           kvr_agent_status(w->cons[0].agent, A, strlen(A), r.id, strlen(r.id),
                            &now) == KVR_OK &&
           now.recv < KVR_RECV_PULLING) {
        poll_all(sh);
        poll(NULL, 0, 1);
    }
    if (abort_it)
        kvr_agent_recv_abort(w->cons[0].agent, A, strlen(A), r.id,
                             strlen(r.id));
    kvr_agent_req_status_t st;
    kvr_agent_status(w->cons[1].agent, A, strlen(A), r.id, strlen(r.id), &st);
    end = ah_now_ms() + AH_WAIT_MS;
    while (!settled(sh, r.id) && ah_now_ms() < end) {
        poll_all(sh);
        struct pollfd p = {.fd = kvr_agent_event_fd(w->cons[t % 2].agent),
                           .events = POLLIN};
        poll(&p, 1, 5);
    }
    if (!settled(sh, r.id))
        dump(sh, r.id, started);
    CHECK_EQ(sh, finals(sh, r.id), 4, r.id);
    for (uint32_t c = 0; c < 2; c++) {
        uint32_t ok = count(sh, 2 + c, r.id, KVR_AGENT_LOADED);
        uint32_t bad = count(sh, 2 + c, r.id, KVR_AGENT_LOAD_FAILED);
        CHECK_EQ(sh, ok + bad, 1, r.id);
        CHECK_EQ(sh, count(sh, 2 + c, r.id, KVR_AGENT_RELEASED), 1, r.id);
        if (ok)
            ah_verify(&w->m, stages_of(w, 0), 2, &w->cons[c], &r);
        if (c == 1) /* rank 1 was never aborted */
            CHECK_EQ(sh, ok, 1, r.id);
    }
    pthread_mutex_lock(&sh->lock);
    sh->aborted += abort_it;
    sh->loaded++;
    pthread_mutex_unlock(&sh->lock);
}

static void *worker_main(void *arg)
{
    worker_t *wk = arg;
    unsigned seed = 77u + wk->t;
    for (uint32_t k = 0; k < PER_THREAD; k++)
        run_one(wk->sh, wk->t, k, &seed);
    return NULL;
}

static void test_engine_threads(void **state)
{
    (void)state;
    shared_t sh = {.w = world_new()};
    pthread_mutex_init(&sh.lock, NULL);
    sh.log = calloc(AH_MAX_EVENTS, sizeof(*sh.log));
    start_instance(sh.w, 0, A, 2, NULL);
    start_group(sh.w, 0, false);
    pthread_t th[THREADS];
    worker_t wk[THREADS];
    for (uint32_t t = 0; t < THREADS; t++) {
        wk[t] = (worker_t){&sh, t};
        assert_int_equal(pthread_create(&th[t], NULL, worker_main, &wk[t]), 0);
    }
    for (uint32_t t = 0; t < THREADS; t++)
        pthread_join(th[t], NULL);
    assert_int_equal(sh.failed, 0);
    assert_int_equal(sh.loaded, THREADS * PER_THREAD);
    print_message("  %u requests, %u aborted on rank 0\n", sh.loaded,
                  sh.aborted);
    world_free(sh.w);
    free(sh.log);
    pthread_mutex_destroy(&sh.lock);
}

/* ---- no progress thread ---- */

static void no_thread(kvr_agent_params_t *p)
{
    p->progress_thread = false;
}

static bool drive(world_t *w, ah_agent_t *const *xs, uint32_t n, const char *id,
                  uint32_t ms)
{
    uint64_t end = ah_now_ms() + ms;
    while (ah_now_ms() < end) {
        struct pollfd p[8];
        for (uint32_t i = 0; i < n; i++)
            p[i] = (struct pollfd){.fd = kvr_agent_fd(xs[i]->agent),
                                   .events = POLLIN};
        poll(p, n, 50);
        for (uint32_t i = 0; i < n; i++) {
            assert_int_equal(kvr_agent_progress(xs[i]->agent, 0), KVR_OK);
            ah_collect(xs[i]);
        }
        if (ah_count(&w->cons[0], id, KVR_AGENT_RELEASED) &&
            ah_count(&w->cons[1], id, KVR_AGENT_RELEASED) &&
            ah_count(&w->prod[0][0], id, KVR_AGENT_SENT))
            return true;
    }
    return false;
}

/* Large latents (64 KiB per token and layer): 8 MiB per rank, more than
 * one turn may put, so the transfer spans several progress calls. */
static void test_no_thread_bounded_turns(void **state)
{
    (void)state;
    world_t *w = world_new();
    w->m.layers = 2;
    w->m.token_bytes = 65536;
    w->m.src_pool = 8;
    w->m.dst_pool = 4;
    start_instance(w, 0, A, 1, no_thread);
    start_group_tweaked(w, 0, false, no_thread);
    /* a second thread may not drive the loop meanwhile; with a progress
     * thread there is no progress() */
    ah_req_t r = {.id = "big", .nsrc = 8, .ndst = 4, .tokens = 128};
    for (uint32_t i = 0; i < 8; i++)
        r.src[i] = 7 - i;
    for (uint32_t i = 0; i < 4; i++)
        r.dst[i] = (i + 1) % 4;
    fill_all(w, 0, &r);
    open_all(w, 0, &r, 0, true);
    recv_all(w, 0, A, &r, 0);
    ah_agent_t *xs[] = {&w->prod[0][0], &w->cons[0], &w->cons[1]};
    assert_true(drive(w, xs, 3, r.id, AH_WAIT_MS));
    expect_loaded(w, 0, &r);
    kvr_agent_t *p = w->prod[0][0].agent;
    assert_true(p->moved_turn_max <=
                KVR_AGENT_TURN_BYTES + KVR_AGENT_SLICE_BYTES);
    assert_true(p->moving_turns >= 2);
    world_free(w);
}

static void test_progress_refused_with_thread(void **state)
{
    (void)state;
    world_t *w = world_new();
    start_group(w, 0, false);
    assert_int_equal(kvr_agent_progress(w->cons[0].agent, 0), KVR_ERR_INVALID);
    world_free(w);
}

/* ---- kvr_agent_wait ---- */

static uint64_t mono_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

/* Each rank in turn waits (up to 2 ms a call) until both released id. */
static bool wait_released(world_t *w, const char *id, uint32_t ms)
{
    uint64_t end = ah_now_ms() + ms;
    while (ah_now_ms() < end) {
        uint32_t done = 0;
        for (uint32_t c = 0; c < 2; c++) {
            kvr_status_t st = kvr_agent_wait(w->cons[c].agent, 2000);
            assert_true(st == KVR_OK || st == KVR_ERR_TIMEOUT);
            ah_collect(&w->cons[c]);
            done += ah_count(&w->cons[c], id, KVR_AGENT_RELEASED);
        }
        if (done == 2)
            return true;
    }
    return false;
}

/* Request i (40 tokens) from instance 0 to both ranks, asked for. */
static void start_load(world_t *w, uint32_t i, ah_req_t *r)
{
    ah_req(&w->m, i, 40, r);
    fill_all(w, 0, r);
    open_all(w, 0, r, 0, true);
    recv_all(w, 0, A, r, 0);
}

/* start_load, then waited for by kvr_agent_wait alone, and verified. */
static void load_by_waits(world_t *w, uint32_t i)
{
    ah_req_t r;
    start_load(w, i, &r);
    assert_true(wait_released(w, r.id, AH_WAIT_MS));
    expect_loaded(w, 0, &r);
}

static bool readable(int fd)
{
    struct pollfd p = {.fd = fd, .events = POLLIN};
    return poll(&p, 1, 0) == 1;
}

/* Ranks without a progress thread load through kvr_agent_wait alone (it
 * runs their loops: dial, handshake, WRITE_REQUEST, the answers); it
 * returns when an event is queued and leaves it to kvr_agent_poll, and
 * times out when none comes. */
static void test_wait_drives_without_thread(void **state)
{
    (void)state;
    world_t *w = world_new();
    start_instance(w, 0, A, 2, NULL);
    start_group_tweaked(w, 0, false, no_thread);
    kvr_agent_t *c0 = w->cons[0].agent;
    uint64_t t0 = mono_ns();
    assert_int_equal(kvr_agent_wait(c0, 3000), KVR_ERR_TIMEOUT);
    assert_true(mono_ns() - t0 >= 3000000ull); /* it waited its time */
    load_by_waits(w, 0);
    /* every event polled: no wait returns, and no stale signal is left */
    for (uint32_t c = 0; c < 2; c++) {
        assert_int_equal(kvr_agent_wait(w->cons[c].agent, 0), KVR_ERR_TIMEOUT);
        assert_false(readable(kvr_agent_event_fd(w->cons[c].agent)));
    }
    /* a second request: the wait returns with its events still queued */
    ah_req_t r2;
    start_load(w, 1, &r2);
    uint64_t end = ah_now_ms() + AH_WAIT_MS;
    while (kvr_agent_wait(c0, 2000) != KVR_OK && ah_now_ms() < end)
        ;
    assert_int_equal(kvr_agent_wait(c0, 0), KVR_OK);
    assert_true(readable(kvr_agent_event_fd(c0)));
    uint32_t had = w->cons[0].nlog;
    ah_collect(&w->cons[0]);
    assert_true(w->cons[0].nlog > had);
    assert_true(wait_released(w, r2.id, AH_WAIT_MS));
    expect_loaded(w, 0, &r2);
    world_free(w);
}

/* With a progress thread the wait sleeps on the event fd. */
static void test_wait_with_thread(void **state)
{
    (void)state;
    world_t *w = world_new();
    start_instance(w, 0, A, 1, NULL);
    start_group(w, 0, false);
    assert_int_equal(kvr_agent_wait(w->cons[0].agent, 1000), KVR_ERR_TIMEOUT);
    load_by_waits(w, 2);
    world_free(w);
}

typedef struct spinner {
    kvr_agent_t *agent;
    int stop; /* atomic */
    uint32_t turns;
} spinner_t;

static void *progress_loop(void *arg)
{
    spinner_t *s = arg;
    while (!__atomic_load_n(&s->stop, __ATOMIC_ACQUIRE)) {
        kvr_status_t st = kvr_agent_progress(s->agent, 5);
        if (st == KVR_OK)
            __atomic_add_fetch(&s->turns, 1, __ATOMIC_RELEASE);
    }
    return NULL;
}

/* Until the spinner has driven the loop once (it must be driving before
 * the load starts, or the load may run entirely on the waiting thread). */
static bool spinner_started(spinner_t *s)
{
    uint64_t end = kvr_now_ns() + (uint64_t)AH_WAIT_MS * 1000000ull;
    while (__atomic_load_n(&s->turns, __ATOMIC_ACQUIRE) == 0 &&
           kvr_now_ns() < end)
        usleep(100);
    return __atomic_load_n(&s->turns, __ATOMIC_ACQUIRE) > 0;
}

/* Another thread drives rank 0 with kvr_agent_progress meanwhile: rank
 * 0's waits (which then sleep on the event fd) still return with its
 * events, and each loop has one driver at a time. */
static void test_wait_while_progress_elsewhere(void **state)
{
    (void)state;
    world_t *w = world_new();
    start_instance(w, 0, A, 1, NULL);
    start_group_tweaked(w, 0, false, no_thread);
    spinner_t s = {.agent = w->cons[0].agent};
    pthread_t t;
    assert_int_equal(pthread_create(&t, NULL, progress_loop, &s), 0);
    bool driving = spinner_started(&s);
    ah_req_t r;
    start_load(w, 3, &r);
    bool ok = wait_released(w, r.id, AH_WAIT_MS);
    __atomic_store_n(&s.stop, 1, __ATOMIC_RELEASE);
    pthread_join(t, NULL);
    assert_true(driving);
    assert_true(ok);
    expect_loaded(w, 0, &r);
    world_free(w);
}

static void test_wait_refused(void **state)
{
    (void)state;
    assert_int_equal(kvr_agent_wait(NULL, 0), KVR_ERR_INVALID);
    ah_model_t m = ah_model();
    kvr_agent_params_t p = ah_consumer_params(&m, ah_hub(), "unstarted", 0);
    kvr_agent_t *a = NULL;
    kvr_error_t err = {0};
    assert_int_equal(kvr_agent_create(&p, &a, &err), KVR_OK);
    assert_int_equal(kvr_agent_wait(a, 0), KVR_ERR_INVALID);
    assert_non_null(strstr(kvr_agent_last_error(a), "started"));
    kvr_agent_destroy(a);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_engine_threads),
        cmocka_unit_test(test_no_thread_bounded_turns),
        cmocka_unit_test(test_progress_refused_with_thread),
        cmocka_unit_test(test_wait_drives_without_thread),
        cmocka_unit_test(test_wait_with_thread),
        cmocka_unit_test(test_wait_while_progress_elsewhere),
        cmocka_unit_test(test_wait_refused),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
