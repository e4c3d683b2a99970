/* send_ready's CUDA events (docs/agent.md, CUDA events). The engine's
 * event is never waited on where copies run: a copy queued behind it would
 * hold every later copy on the agent's stream (other requests' too), and a
 * request's layer groups, announced while the engine runs ahead of its GPU,
 * would all queue behind the last group's event and move as one. Instead
 * send_ready arms a gate on the agent's gate stream, on the calling thread:
 * a wait for the engine's event as recorded then, an event of the agent's
 * recorded after it, and a host function that wakes the loop. The loop
 * makes the layers ready once the gate completed, and the pulls move them
 * as if send_ready had been called then, group by group. Gates complete in
 * the order they were armed (one stream), so each turn looks at the oldest
 * ones only. */
#include <stdlib.h>

#include "agent_internal.h"

void kvr__gate_drop(kvr__gate_t *g)
{
    if (g == NULL)
        return;
    kvr__gpu_gate_destroy(g->event);
    free(g);
}

static kvr__gate_t *take_free(kvr_agent_t *a, kvr_error_t *err)
{
    kvr__gate_t *g = a->gate_free;
    if (g != NULL) {
        a->gate_free = g->next;
        return g;
    }
    g = calloc(1, sizeof(*g));
    if (g == NULL) {
        kvr_error_set(err, KVR_ERR_NO_MEMORY, "no memory for a gate");
        return NULL;
    }
    if (kvr__gpu_gate_create(a->p.cuda_device, &g->event, err) != KVR_OK) {
        free(g);
        return NULL;
    }
    return g;
}

/* Under gate_lock. */
static void release(kvr_agent_t *a, kvr__gate_t *g)
{
    if (g->holds > 0 && --g->holds > 0)
        return;
    g->next = a->gate_free;
    a->gate_free = g;
}

void kvr__gate_recycle(kvr_agent_t *a, kvr__gate_t *g)
{
    pthread_mutex_lock(&a->gate_lock);
    release(a, g);
    pthread_mutex_unlock(&a->gate_lock);
}

kvr_status_t kvr__gate_arm(kvr_agent_t *a, void *engine_event,
                           kvr__gate_t **out, kvr_error_t *err)
{
    *out = NULL;
    /* one lock for the pool and the stream: two callers' wait, record and
     * host function never interleave (and kvr_agent_start sets gstream
     * under it) */
    pthread_mutex_lock(&a->gate_lock);
    if (a->gstream == NULL) {
        pthread_mutex_unlock(&a->gate_lock);
        return kvr_error_set(err, KVR_ERR_INVALID,
                             "a CUDA event before kvr_agent_start");
    }
    kvr__gate_t *g = take_free(a, err);
    int fd = a->gate_watch ? -1 : a->wake_fd;
    kvr_status_t st = g != NULL ? kvr__gpu_gate_arm(a->gstream, engine_event,
                                                    g->event, fd, err)
                                : err->code;
    if (st != KVR_OK && g != NULL) {
        g->holds = 0;
        release(a, g);
        g = NULL;
    }
    if (g != NULL)
        g->holds = a->gate_watch ? 2 : 1;
    if (g != NULL && a->gate_watch) { /* the watcher's, in arming order */
        g->watch_next = NULL;
        if (a->watch_tail != NULL)
            a->watch_tail->watch_next = g;
        else
            a->watch_head = g;
        a->watch_tail = g;
        pthread_cond_signal(&a->watch_cond);
    }
    pthread_mutex_unlock(&a->gate_lock);
    *out = g;
    return st;
}

void kvr__gate_hold(kvr_agent_t *a, kvr__gate_t *g, const kvr__preq_t *r,
                    uint32_t begin, uint32_t end)
{
    g->next = NULL;
    g->serial = r != NULL ? r->serial : 0; /* serials start at 1 */
    if (r != NULL)
        g->request = r->id;
    g->begin = begin;
    g->end = end;
    if (a->gate_tail != NULL)
        a->gate_tail->next = g;
    else
        a->gate_head = g;
    a->gate_tail = g;
}

void kvr__gates_poll(kvr_agent_t *a)
{
    while (a->gate_head != NULL) {
        kvr__gate_t *g = a->gate_head;
        kvr_error_t e = {0};
        bool done = false;
        kvr_status_t st = kvr__gpu_gate_done(g->event, &done, &e);
        if (!done)
            break;
        a->gate_head = g->next;
        if (a->gate_head == NULL)
            a->gate_tail = NULL;
        if (g->serial != 0)
            kvr__send_gate_opened(a, g, st, e.msg);
        kvr__gate_recycle(a, g);
    }
}

/* The watcher (KVR_AGENT_GATE_WATCH=spin): each armed gate in turn,
 * waited for on this thread (cudaEventSynchronize, which polls), then the
 * loop woken. CUDA's host functions took about 80 µs longer to wake the
 * loop on an H200 under MPS (docs/performance.md, run 2026-12-02p); the
 * price is a core busy while any gate is armed. It holds each gate until
 * it waited for it (kvr__gate_recycle says why); the loop looks at every
 * gate itself, so a wake from here is never needed for correctness. */
static void *watch_main(void *arg)
{
    kvr_agent_t *a = arg;
    kvr__gpu_use(a->p.cuda_device, NULL);
    pthread_mutex_lock(&a->gate_lock);
    for (;;) {
        while (a->watch_head == NULL && !a->watch_stop)
            pthread_cond_wait(&a->watch_cond, &a->gate_lock);
        if (a->watch_stop)
            break;
        kvr__gate_t *g = a->watch_head;
        a->watch_head = g->watch_next;
        if (a->watch_head == NULL)
            a->watch_tail = NULL;
        pthread_mutex_unlock(&a->gate_lock);
        kvr__gpu_gate_sync(g->event, NULL);
        kvr__agent_wake(a);
        pthread_mutex_lock(&a->gate_lock);
        release(a, g);
    }
    /* stopped: the gates not waited for lose the watcher's hold */
    while (a->watch_head != NULL) {
        kvr__gate_t *g = a->watch_head;
        a->watch_head = g->watch_next;
        release(a, g);
    }
    a->watch_tail = NULL;
    pthread_mutex_unlock(&a->gate_lock);
    return NULL;
}

kvr_status_t kvr__gates_watch_start(kvr_agent_t *a, kvr_error_t *err)
{
    if (!a->gate_watch)
        return KVR_OK;
    if (pthread_create(&a->watch_thread, NULL, watch_main, a) != 0)
        return kvr_error_set(err, KVR_ERR_NO_MEMORY,
                             "cannot start the gate watcher");
    a->watch_running = true;
    return KVR_OK;
}

void kvr__gates_watch_stop(kvr_agent_t *a)
{
    if (!a->watch_running)
        return;
    pthread_mutex_lock(&a->gate_lock);
    a->watch_stop = true;
    pthread_cond_signal(&a->watch_cond);
    pthread_mutex_unlock(&a->gate_lock);
    pthread_join(a->watch_thread, NULL);
    a->watch_running = false;
}

static void drop_list(kvr__gate_t *g)
{
    while (g != NULL) {
        kvr__gate_t *n = g->next;
        kvr__gate_drop(g);
        g = n;
    }
}

void kvr__gates_free(kvr_agent_t *a)
{
    drop_list(a->gate_head);
    drop_list(a->gate_free);
    a->gate_head = a->gate_tail = a->gate_free = NULL;
}
