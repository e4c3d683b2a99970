/* The public transport API: argument and bounds checks in front of the
 * backend ops, the control message queue and deadline-bounded waiting. */
#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "xfer_internal.h"

struct kvr__queued_msg {
    kvr__queued_msg_t *next;
    uint64_t ready_ns;
    kvr_xfer_msg_t msg; /* flexible tail: keep last */
};

/* Longest a single sleep lasts, so a lost wake-up costs at most this. */
#define KVR__MAX_SLEEP_NS (50u * 1000u * 1000u)

static uint64_t min_u64(uint64_t a, uint64_t b)
{
    return a < b ? a : b;
}

kvr_status_t kvr__fail(kvr_transport_t *t, kvr_status_t code, const char *fmt,
                       ...)
{
    if (t == NULL)
        return code;
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(t->last_error, sizeof(t->last_error), fmt, ap);
    va_end(ap);
    return code;
}

kvr_status_t kvr__transport_init(kvr_transport_t *t, const kvr__xfer_ops_t *ops,
                                 uint64_t id, uint32_t max_inflight,
                                 uint32_t queue_max)
{
    pthread_condattr_t attr;
    t->ops = ops;
    t->name = ops->name;
    t->id = id;
    t->max_inflight = max_inflight ? max_inflight : 1;
    t->queue_max = queue_max ? queue_max : 1;
    if (pthread_mutex_init(&t->lock, NULL) != 0)
        return KVR_ERR_NO_MEMORY;
    if (pthread_condattr_init(&attr) != 0)
        goto destroy_lock;
    pthread_condattr_setclock(&attr, CLOCK_MONOTONIC);
    int rc = pthread_cond_init(&t->cond, &attr);
    pthread_condattr_destroy(&attr);
    if (rc != 0)
        goto destroy_lock;
    return KVR_OK;
destroy_lock:
    pthread_mutex_destroy(&t->lock);
    return KVR_ERR_NO_MEMORY;
}

void kvr__transport_fini(kvr_transport_t *t)
{
    kvr__queued_msg_t *q = t->head;
    while (q != NULL) {
        kvr__queued_msg_t *next = q->next;
        free(q);
        q = next;
    }
    t->head = t->tail = NULL;
    pthread_cond_destroy(&t->cond);
    pthread_mutex_destroy(&t->lock);
}

void kvr__wake(kvr_transport_t *t)
{
    pthread_mutex_lock(&t->lock);
    pthread_cond_broadcast(&t->cond);
    pthread_mutex_unlock(&t->lock);
}

kvr_status_t kvr__ep_set_failed(kvr_ep_t *ep, kvr_status_t st)
{
    int expected = KVR_OK;
    atomic_compare_exchange_strong(&ep->failed, &expected, (int)st);
    kvr__wake(ep->t);
    return (kvr_status_t)atomic_load(&ep->failed);
}

kvr_status_t kvr__ep_failed(const kvr_ep_t *ep)
{
    return (kvr_status_t)atomic_load(&ep->failed);
}

void kvr__msg_deliver(kvr_transport_t *t, uint64_t sender, uint32_t type,
                      const void *data, size_t len, uint64_t ready_ns)
{
    kvr__queued_msg_t *q = NULL;
    if (len <= KVR_XFER_MSG_MAX)
        q = malloc(sizeof(*q) + len);
    pthread_mutex_lock(&t->lock);
    if (q == NULL || t->queued >= t->queue_max) {
        t->overflow = true; /* surfaces as ERR_NO_SPACE on the next receive */
        free(q);
    } else {
        q->next = NULL;
        q->ready_ns = ready_ns;
        q->msg.sender = sender;
        q->msg.type = type;
        q->msg.len = (uint32_t)len;
        if (len)
            memcpy(q->msg.data, data, len);
        if (t->tail)
            t->tail->next = q;
        else
            t->head = q;
        t->tail = q;
        t->queued++;
    }
    pthread_cond_broadcast(&t->cond);
    pthread_mutex_unlock(&t->lock);
}

/* With t->lock held: unlinks the first ready match; *next_ready is the
 * earliest delivery time of a matching message not ready yet. */
static kvr__queued_msg_t *take_match(kvr_transport_t *t,
                                     kvr_xfer_msg_match_fn match, void *ctx,
                                     uint64_t now, uint64_t *next_ready)
{
    kvr__queued_msg_t *prev = NULL;
    for (kvr__queued_msg_t *q = t->head; q != NULL; prev = q, q = q->next) {
        if (match != NULL && !match(ctx, &q->msg))
            continue;
        if (q->ready_ns > now) {
            *next_ready = min_u64(*next_ready, q->ready_ns);
            continue;
        }
        if (prev)
            prev->next = q->next;
        else
            t->head = q->next;
        if (t->tail == q)
            t->tail = prev;
        t->queued--;
        return q;
    }
    return NULL;
}

static void timed_wait(kvr_transport_t *t, uint64_t until_ns)
{
    struct timespec ts = {.tv_sec = (time_t)(until_ns / 1000000000u),
                          .tv_nsec = (long)(until_ns % 1000000000u)};
    pthread_cond_timedwait(&t->cond, &t->lock, &ts);
}

kvr_status_t kvr_xfer_recv_msg(kvr_transport_t *t, kvr_xfer_msg_match_fn match,
                               void *ctx, kvr_xfer_msg_t **out,
                               uint64_t deadline_ns)
{
    if (t == NULL || out == NULL)
        return KVR_ERR_INVALID;
    for (;;) {
        uint64_t now = kvr_now_ns();
        uint64_t until = min_u64(deadline_ns, now + KVR__MAX_SLEEP_NS);
        pthread_mutex_lock(&t->lock);
        kvr__queued_msg_t *q = take_match(t, match, ctx, now, &until);
        bool overflow = t->overflow;
        if (q == NULL && !overflow && now < deadline_ns && t->threaded)
            timed_wait(t, until);
        pthread_mutex_unlock(&t->lock);
        if (q != NULL) {
            *out = &q->msg;
            return KVR_OK;
        }
        if (overflow)
            return kvr__fail(t, KVR_ERR_NO_SPACE,
                             "control message queue overflowed (max %u)",
                             t->queue_max);
        if (now >= deadline_ns)
            return kvr__fail(t, KVR_ERR_TIMEOUT,
                             "no matching control message before the deadline");
        if (!t->threaded) {
            kvr_status_t st = t->ops->progress(t, until);
            if (st != KVR_OK)
                return st;
        }
    }
}

void kvr_xfer_msg_free(kvr_xfer_msg_t *msg)
{
    if (msg != NULL)
        free((char *)msg - offsetof(kvr__queued_msg_t, msg));
}

kvr_status_t kvr__wait(kvr_transport_t *t, kvr__done_fn done, void *ctx,
                       uint64_t deadline_ns)
{
    for (;;) {
        if (done(ctx))
            return KVR_OK;
        uint64_t now = kvr_now_ns();
        if (now >= deadline_ns)
            return KVR_ERR_TIMEOUT;
        uint64_t until = min_u64(deadline_ns, now + KVR__MAX_SLEEP_NS);
        if (t->threaded) {
            pthread_mutex_lock(&t->lock);
            if (!done(ctx))
                timed_wait(t, until);
            pthread_mutex_unlock(&t->lock);
            continue;
        }
        kvr_status_t st = t->ops->progress(t, until);
        if (st != KVR_OK)
            return st;
    }
}
