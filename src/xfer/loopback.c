/* Loopback transport: transports of one process joined on a hub; puts are
 * memcpy, control messages go straight to the peer's queue. Faults are
 * injected by counting this transport's puts and messages. */
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "xfer_internal.h"

#define LB_MAGIC 0x4b564c42u /* "KVLB" */

typedef unsigned long long ull;

typedef struct lb_hub {
    pthread_mutex_t lock; /* guards everything reachable from the hub */
    uint64_t nonce;       /* tells this hub's addresses from another's */
    struct lb_tr **slots; /* by index; NULL once closed, never reused */
    uint32_t num_slots, cap;
    uint32_t refs;
    uint32_t next_mem_id;
} lb_hub_t;

typedef struct lb_mem {
    kvr_mem_t base;
    struct lb_mem *next;
    uint32_t id;
    bool owned;
} lb_mem_t;

typedef struct lb_tr {
    kvr_transport_t base;
    lb_hub_t *hub;
    uint32_t index;
    kvr_loopback_params_t p;
    uint64_t puts, msgs, mem_used;
    lb_mem_t *mems;
    uint32_t addr[4]; /* magic, index, nonce lo, nonce hi */
} lb_tr_t;

typedef struct lb_ep {
    kvr_ep_t base;
    uint32_t peer;
    uint64_t busy_until_ns; /* with delay_ms: when the last put completes */
} lb_ep_t;

typedef struct lb_rmem {
    kvr_rmem_t base;
    uint32_t peer, mem_id;
    uint64_t skew; /* desc base minus the target memory's address */
} lb_rmem_t;

typedef struct lb_rkey {
    uint32_t magic, peer, mem_id, pad;
    uint64_t nonce;
} lb_rkey_t;

static const kvr__xfer_ops_t lb_ops;

static lb_tr_t *tr_of(kvr_transport_t *t)
{
    return (lb_tr_t *)t;
}

/* With the hub lock held: the live transport at index, or NULL. */
static lb_tr_t *peer_at(lb_hub_t *hub, uint32_t index)
{
    return index < hub->num_slots ? hub->slots[index] : NULL;
}

static lb_mem_t *mem_by_id(lb_tr_t *tr, uint32_t id)
{
    for (lb_mem_t *m = tr ? tr->mems : NULL; m != NULL; m = m->next)
        if (m->id == id)
            return m;
    return NULL;
}

static void sleep_until(uint64_t until_ns)
{
    uint64_t now = kvr_now_ns();
    if (until_ns <= now)
        return;
    uint64_t d = until_ns - now;
    struct timespec ts = {.tv_sec = (time_t)(d / 1000000000u),
                          .tv_nsec = (long)(d % 1000000000u)};
    nanosleep(&ts, NULL);
}

static kvr_status_t lb_address(kvr_transport_t *t, const void **addr,
                               size_t *len)
{
    *addr = tr_of(t)->addr;
    *len = sizeof(tr_of(t)->addr);
    return KVR_OK;
}

static kvr_status_t lb_event_fd(kvr_transport_t *t, int *fd)
{
    (void)fd;
    return kvr__fail(t, KVR_ERR_UNSUPPORTED, "loopback has no event fd");
}

static kvr_status_t lb_progress(kvr_transport_t *t, uint64_t wait_until_ns)
{
    (void)t;
    sleep_until(wait_until_ns);
    return KVR_OK;
}

static kvr_status_t lb_ep_create(kvr_transport_t *t, const void *addr,
                                 size_t len, kvr_ep_t **out)
{
    lb_tr_t *tr = tr_of(t);
    uint32_t a[4];
    if (len != sizeof(a))
        return kvr__fail(t, KVR_ERR_INVALID, "loopback address of %zu bytes",
                         len);
    memcpy(a, addr, sizeof(a));
    uint64_t nonce = a[2] | (uint64_t)a[3] << 32;
    pthread_mutex_lock(&tr->hub->lock);
    bool known = a[0] == LB_MAGIC && nonce == tr->hub->nonce &&
                 peer_at(tr->hub, a[1]) != NULL;
    pthread_mutex_unlock(&tr->hub->lock);
    if (!known)
        return kvr__fail(
            t, KVR_ERR_PEER_DEAD,
            "loopback address names no live transport of this hub");
    lb_ep_t *ep = calloc(1, sizeof(*ep));
    if (ep == NULL)
        return KVR_ERR_NO_MEMORY;
    ep->base.t = t;
    ep->peer = a[1];
    *out = &ep->base;
    return KVR_OK;
}

static void lb_ep_destroy(kvr_ep_t *ep)
{
    free(ep);
}

static kvr_status_t lb_reg(kvr_transport_t *t, void *addr, size_t len,
                           bool allocate, kvr_mem_t **out)
{
    lb_tr_t *tr = tr_of(t);
    if (tr->p.mem_limit && len > tr->p.mem_limit - tr->mem_used)
        return kvr__fail(t, KVR_ERR_NO_SPACE,
                         "registering %zu bytes: %llu of %llu already used",
                         len, (ull)tr->mem_used, (ull)tr->p.mem_limit);
    lb_mem_t *m = calloc(1, sizeof(*m));
    if (m == NULL)
        return KVR_ERR_NO_MEMORY;
    if (allocate && (addr = calloc(1, len)) == NULL) {
        free(m);
        return kvr__fail(t, KVR_ERR_NO_MEMORY, "allocating %zu bytes", len);
    }
    m->base = (kvr_mem_t){.t = t, .addr = addr, .len = len};
    m->owned = allocate;
    pthread_mutex_lock(&tr->hub->lock);
    m->id = ++tr->hub->next_mem_id;
    m->next = tr->mems;
    tr->mems = m;
    tr->mem_used += len;
    pthread_mutex_unlock(&tr->hub->lock);
    *out = &m->base;
    return KVR_OK;
}

static void lb_dereg(kvr_mem_t *mem)
{
    lb_tr_t *tr = tr_of(mem->t);
    lb_mem_t *m = (lb_mem_t *)mem;
    pthread_mutex_lock(&tr->hub->lock);
    for (lb_mem_t **pp = &tr->mems; *pp != NULL; pp = &(*pp)->next)
        if (*pp == m) {
            *pp = m->next;
            break;
        }
    tr->mem_used -= m->base.len;
    pthread_mutex_unlock(&tr->hub->lock);
    if (m->owned)
        free(m->base.addr);
    free(m);
}

static kvr_status_t lb_pack_rkey(const kvr_mem_t *mem, kvr_remote_region_t *out)
{
    lb_tr_t *tr = tr_of(mem->t);
    lb_rkey_t k = {.magic = LB_MAGIC,
                   .peer = tr->index,
                   .mem_id = ((const lb_mem_t *)mem)->id,
                   .nonce = tr->hub->nonce};
    memcpy(out->rkey, &k, sizeof(k));
    out->rkey_len = sizeof(k);
    return KVR_OK;
}

/* A key is accepted only if it names live memory that contains the whole
 * announced range: loopback never dereferences what a peer made up. */
static kvr_status_t lb_rmem_open(kvr_ep_t *ep, const kvr_remote_region_t *desc,
                                 kvr_rmem_t **out)
{
    lb_tr_t *tr = tr_of(ep->t);
    lb_rkey_t k;
    if (desc->rkey_len != sizeof(k))
        return kvr__fail(ep->t, KVR_ERR_INVALID, "loopback rkey of %u bytes",
                         desc->rkey_len);
    memcpy(&k, desc->rkey, sizeof(k));
    pthread_mutex_lock(&tr->hub->lock);
    lb_mem_t *m = k.magic == LB_MAGIC && k.nonce == tr->hub->nonce
                      ? mem_by_id(peer_at(tr->hub, k.peer), k.mem_id)
                      : NULL;
    uint64_t lo = m ? (uint64_t)(uintptr_t)m->base.addr : 0;
    bool inside = m && desc->base >= lo &&
                  desc->base + desc->length <= lo + m->base.len;
    pthread_mutex_unlock(&tr->hub->lock);
    if (!inside)
        return kvr__fail(ep->t, KVR_ERR_INVALID,
                         "rkey names no live region holding 0x%llx+%llu",
                         (ull)desc->base, (ull)desc->length);
    lb_rmem_t *r = calloc(1, sizeof(*r));
    if (r == NULL)
        return KVR_ERR_NO_MEMORY;
    r->base = (kvr_rmem_t){.ep = ep, .base = desc->base, .len = desc->length};
    r->peer = k.peer;
    r->mem_id = k.mem_id;
    r->skew = desc->base - lo;
    *out = &r->base;
    return KVR_OK;
}

static void lb_rmem_close(kvr_rmem_t *rmem)
{
    free(rmem);
}

/* With the hub lock held: the target address of off, or NULL if the peer
 * or its region is gone. */
static unsigned char *target_of(lb_tr_t *tr, const lb_rmem_t *r, uint64_t off)
{
    lb_mem_t *m = mem_by_id(peer_at(tr->hub, r->peer), r->mem_id);
    return m ? (unsigned char *)m->base.addr + r->skew + off : NULL;
}

static kvr_status_t lb_rmem_ptr(kvr_rmem_t *rmem, uint64_t off, void **out)
{
    lb_tr_t *tr = tr_of(rmem->ep->t);
    if (tr->p.no_map)
        return kvr__fail(&tr->base, KVR_ERR_UNSUPPORTED,
                         "mapping disabled on this loopback transport");
    pthread_mutex_lock(&tr->hub->lock);
    unsigned char *p = target_of(tr, (const lb_rmem_t *)rmem, off);
    pthread_mutex_unlock(&tr->hub->lock);
    if (p == NULL)
        return kvr__fail(&tr->base, KVR_ERR_PEER_DEAD, "peer region is gone");
    *out = p;
    return KVR_OK;
}

/* A put is as late as the slower of its two ends: a delayed receiver
 * models a stopped process whose memory no put reaches in time. Called
 * with the hub locked. */
static uint32_t put_delay_ms(const lb_tr_t *tr, const lb_ep_t *lep)
{
    const lb_tr_t *peer = peer_at(tr->hub, lep->peer);
    uint32_t theirs = peer != NULL ? peer->p.delay_ms : 0;
    return tr->p.delay_ms > theirs ? tr->p.delay_ms : theirs;
}

static kvr_status_t lb_put(kvr_ep_t *ep, const void *src, uint64_t len,
                           kvr_rmem_t *dst, uint64_t off, uint64_t deadline_ns)
{
    (void)deadline_ns;
    lb_tr_t *tr = tr_of(ep->t);
    lb_ep_t *lep = (lb_ep_t *)ep;
    pthread_mutex_lock(&tr->hub->lock);
    uint64_t k = ++tr->puts;
    unsigned char *p = target_of(tr, (const lb_rmem_t *)dst, off);
    uint32_t delay = put_delay_ms(tr, lep);
    if (p != NULL && k != tr->p.fail_put_at) {
        memcpy(p, src, len);
        if (k == tr->p.corrupt_put_at)
            p[0] ^= 0xff;
    }
    pthread_mutex_unlock(&tr->hub->lock);
    if (p == NULL)
        return kvr__ep_set_failed(ep, kvr__fail(ep->t, KVR_ERR_PEER_DEAD,
                                                "put: peer region is gone"));
    if (k == tr->p.fail_put_at)
        return kvr__ep_set_failed(ep, kvr__fail(ep->t, KVR_ERR_TRANSPORT,
                                                "injected failure of put %llu",
                                                (ull)k));
    if (delay)
        lep->busy_until_ns = kvr_now_ns() + delay * 1000000ull;
    return KVR_OK;
}

static kvr_status_t lb_flush(kvr_ep_t *ep, uint64_t deadline_ns)
{
    lb_ep_t *lep = (lb_ep_t *)ep;
    if (lep->busy_until_ns > deadline_ns) {
        sleep_until(deadline_ns);
        return kvr__fail(ep->t, KVR_ERR_TIMEOUT,
                         "flush: puts still in flight at the deadline");
    }
    sleep_until(lep->busy_until_ns);
    return KVR_OK;
}

static kvr_status_t lb_drain(kvr_ep_t *ep, uint64_t deadline_ns)
{
    (void)ep;
    (void)deadline_ns;
    return KVR_OK; /* messages are delivered inside send */
}

static kvr_status_t lb_send_msg(kvr_ep_t *ep, uint32_t type, const void *data,
                                size_t len, uint64_t deadline_ns)
{
    (void)deadline_ns;
    lb_tr_t *tr = tr_of(ep->t);
    uint64_t ready = tr->p.delay_ms ? kvr_now_ns() + tr->p.delay_ms * 1000000ull
                                    : 0;
    pthread_mutex_lock(&tr->hub->lock);
    uint64_t k = ++tr->msgs;
    lb_tr_t *peer = peer_at(tr->hub, ((lb_ep_t *)ep)->peer);
    int copies = k == tr->p.drop_msg_at ? 0 : k == tr->p.dup_msg_at ? 2 : 1;
    for (int i = 0; peer != NULL && i < copies; i++)
        kvr__msg_deliver(&peer->base, tr->base.id, type, data, len, ready);
    pthread_mutex_unlock(&tr->hub->lock);
    if (peer == NULL)
        return kvr__ep_set_failed(ep, kvr__fail(ep->t, KVR_ERR_PEER_DEAD,
                                                "send: peer transport closed"));
    return KVR_OK;
}

static void hub_unref(lb_hub_t *hub)
{
    pthread_mutex_lock(&hub->lock);
    bool last = --hub->refs == 0;
    pthread_mutex_unlock(&hub->lock);
    if (!last)
        return;
    pthread_mutex_destroy(&hub->lock);
    free(hub->slots);
    free(hub);
}

static void lb_close(kvr_transport_t *t)
{
    lb_tr_t *tr = tr_of(t);
    pthread_mutex_lock(&tr->hub->lock);
    tr->hub->slots[tr->index] = NULL;
    pthread_mutex_unlock(&tr->hub->lock);
    while (tr->mems != NULL)
        lb_dereg(&tr->mems->base);
    hub_unref(tr->hub);
    kvr__transport_fini(t);
    free(tr);
}

static lb_hub_t *hub_new(void)
{
    lb_hub_t *hub = calloc(1, sizeof(*hub));
    if (hub == NULL)
        return NULL;
    if (pthread_mutex_init(&hub->lock, NULL) != 0) {
        free(hub);
        return NULL;
    }
    hub->nonce = kvr_now_ns() ^ (uint64_t)(uintptr_t)hub;
    return hub;
}

/* Adds tr to hub (taking a reference); false when out of memory. */
static bool hub_join(lb_hub_t *hub, lb_tr_t *tr)
{
    pthread_mutex_lock(&hub->lock);
    bool ok = hub->num_slots < hub->cap;
    if (!ok) {
        uint32_t cap = hub->cap ? 2 * hub->cap : 4;
        lb_tr_t **slots = realloc(hub->slots, cap * sizeof(*slots));
        if (slots != NULL) {
            hub->slots = slots;
            hub->cap = cap;
            ok = true;
        }
    }
    if (ok) {
        tr->index = hub->num_slots;
        hub->slots[hub->num_slots++] = tr;
        hub->refs++;
        tr->hub = hub;
    }
    pthread_mutex_unlock(&hub->lock);
    return ok;
}

kvr_status_t kvr_transport_loopback_create(kvr_transport_t *join,
                                           const kvr_loopback_params_t *params,
                                           kvr_transport_t **out,
                                           kvr_error_t *err)
{
    kvr_loopback_params_t defaults = KVR_LOOPBACK_PARAMS_INIT;
    if (out == NULL || (join != NULL && join->ops != &lb_ops))
        return kvr_error_set(err, KVR_ERR_INVALID,
                             "out is NULL or join is not a loopback transport");
    lb_tr_t *tr = calloc(1, sizeof(*tr));
    lb_hub_t *hub = join ? tr_of(join)->hub : hub_new();
    if (tr == NULL || hub == NULL)
        goto no_memory;
    tr->p = params ? *params : defaults;
    if (kvr__transport_init(&tr->base, &lb_ops, tr->p.id, tr->p.max_inflight,
                            tr->p.msg_queue_max) != KVR_OK)
        goto no_memory;
    tr->base.threaded = true; /* peers deliver from their own threads */
    tr->base.map_stores = tr->p.map_stores && !tr->p.no_map;
    if (!hub_join(hub, tr)) {
        kvr__transport_fini(&tr->base);
        goto no_memory;
    }
    tr->addr[0] = LB_MAGIC;
    tr->addr[1] = tr->index;
    tr->addr[2] = (uint32_t)hub->nonce;
    tr->addr[3] = (uint32_t)(hub->nonce >> 32);
    *out = &tr->base;
    return KVR_OK;
no_memory:
    if (join == NULL && hub != NULL) {
        pthread_mutex_destroy(&hub->lock);
        free(hub);
    }
    free(tr);
    return kvr_error_set(err, KVR_ERR_NO_MEMORY, "no memory for a transport");
}

static const kvr__xfer_ops_t lb_ops = {
    .name = "loopback",
    .address = lb_address,
    .event_fd = lb_event_fd,
    .progress = lb_progress,
    .ep_create = lb_ep_create,
    .ep_destroy = lb_ep_destroy,
    .reg = lb_reg,
    .dereg = lb_dereg,
    .pack_rkey = lb_pack_rkey,
    .rmem_open = lb_rmem_open,
    .rmem_close = lb_rmem_close,
    .rmem_ptr = lb_rmem_ptr,
    .put = lb_put,
    .flush = lb_flush,
    .drain = lb_drain,
    .send_msg = lb_send_msg,
    .close = lb_close,
};
