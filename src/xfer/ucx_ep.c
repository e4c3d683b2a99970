/* UCX endpoints, memory, remote keys, puts, flushes and control messages.
 * Every completion callback frees its request and counts down; nothing
 * waits on stack state that a late callback could touch. */
#include <stdlib.h>
#include <string.h>

#include "ucx_internal.h"

typedef unsigned long long ull;

static ucx_tr_t *tr_of_ep(kvr_ep_t *ep)
{
    return kvr__ucx_tr(ep->t);
}

/* The peer died or the link broke: UCX calls this once per endpoint. */
static void ep_error_cb(void *arg, ucp_ep_h uep, ucs_status_t s)
{
    (void)uep;
    kvr_ep_t *ep = arg;
    kvr_status_t st = kvr__ucx_status(ep->t, s, "endpoint error");
    kvr__ep_set_failed(ep, st == KVR_ERR_TRANSPORT ? KVR_ERR_PEER_DEAD : st);
}

kvr_status_t kvr__ucx_ep_create(kvr_transport_t *t, const void *addr,
                                size_t len, kvr_ep_t **out)
{
    (void)len; /* UCX addresses are self-describing; trusted peers only */
    ucx_ep_t *ep = calloc(1, sizeof(*ep));
    if (ep == NULL)
        return KVR_ERR_NO_MEMORY;
    ep->base.t = t;
    ucp_ep_params_t ep_params = {
        .field_mask = UCP_EP_PARAM_FIELD_REMOTE_ADDRESS |
                      UCP_EP_PARAM_FIELD_ERR_HANDLING_MODE |
                      UCP_EP_PARAM_FIELD_ERR_HANDLER,
        .address = addr,
        .err_mode = UCP_ERR_HANDLING_MODE_PEER,
        .err_handler = {.cb = ep_error_cb, .arg = ep},
    };
    ucs_status_t s = ucp_ep_create(kvr__ucx_tr(t)->worker, &ep_params,
                                   &ep->uep);
    if (s != UCS_OK) {
        free(ep);
        return kvr__ucx_status(t, s, "ucp_ep_create");
    }
    *out = &ep->base;
    return KVR_OK;
}

typedef struct {
    ucx_ep_t *ep;
    void *req;
} close_wait_t;

static int ep_idle(void *ctx)
{
    close_wait_t *w = ctx;
    if (w->req != NULL && ucp_request_check_status(w->req) == UCS_INPROGRESS)
        return 0;
    return atomic_load(&w->ep->inflight) == 0 &&
           atomic_load(&w->ep->msgs_pending) == 0 &&
           atomic_load(&w->ep->flushes_done) == w->ep->flushes_posted;
}

/* Flush-mode close for a healthy ep whose flush succeeded; force otherwise
 * (never a flush after the error callback). The struct is freed only once
 * UCX gave back every request that points at it. */
void kvr__ucx_ep_destroy(kvr_ep_t *ep)
{
    ucx_ep_t *uep = (ucx_ep_t *)ep;
    ucx_tr_t *tr = tr_of_ep(ep);
    uint64_t deadline = kvr_deadline_ns(tr->p.close_timeout_ms);
    bool force = kvr__ep_failed(ep) != KVR_OK ||
                 kvr__ucx_flush(
                     ep, kvr_deadline_ns(tr->p.close_timeout_ms / 2)) != KVR_OK;
    ucp_request_param_t prm = {.op_attr_mask = UCP_OP_ATTR_FIELD_FLAGS,
                               .flags = force ? UCP_EP_CLOSE_FLAG_FORCE : 0};
    close_wait_t w = {.ep = uep, .req = ucp_ep_close_nbx(uep->uep, &prm)};
    if (UCS_PTR_IS_ERR(w.req))
        w.req = NULL;
    kvr_status_t st = kvr__wait(ep->t, ep_idle, &w, deadline);
    if (w.req != NULL)
        ucp_request_free(w.req);
    if (st == KVR_OK) {
        free(uep);
        return;
    }
    /* A late callback may still name uep: keep it until the worker is
     * destroyed (kvr__ucx_free_graveyard), which reclaims the UCX side. */
    uep->next_dead = tr->graveyard;
    tr->graveyard = uep;
}

void kvr__ucx_free_graveyard(ucx_tr_t *tr)
{
    while (tr->graveyard != NULL) {
        ucx_ep_t *ep = tr->graveyard;
        tr->graveyard = ep->next_dead;
        free(ep);
    }
}

static kvr_status_t map(kvr_transport_t *t, ucp_mem_map_params_t *mp,
                        const char *what, kvr_mem_t **out)
{
    ucx_tr_t *tr = kvr__ucx_tr(t);
    ucx_mem_t *m = calloc(1, sizeof(*m));
    if (m == NULL)
        return KVR_ERR_NO_MEMORY;
    ucs_status_t s = ucp_mem_map(tr->ctx, mp, &m->memh);
    ucp_mem_attr_t attr = {.field_mask = UCP_MEM_ATTR_FIELD_ADDRESS |
                                         UCP_MEM_ATTR_FIELD_LENGTH};
    if (s == UCS_OK && (s = ucp_mem_query(m->memh, &attr)) != UCS_OK)
        ucp_mem_unmap(tr->ctx, m->memh);
    if (s != UCS_OK) {
        free(m);
        return kvr__ucx_status(t, s, what);
    }
    bool allocated = (mp->flags & UCP_MEM_MAP_ALLOCATE) != 0;
    m->base = (kvr_mem_t){.t = t,
                          .addr = allocated ? attr.address : mp->address,
                          .len = mp->length};
    *out = &m->base;
    return KVR_OK;
}

kvr_status_t kvr__ucx_reg(kvr_transport_t *t, void *addr, size_t len,
                          bool allocate, kvr_mem_t **out)
{
    ucp_mem_map_params_t mp = {
        .field_mask = UCP_MEM_MAP_PARAM_FIELD_LENGTH |
                      UCP_MEM_MAP_PARAM_FIELD_FLAGS |
                      (allocate ? 0 : UCP_MEM_MAP_PARAM_FIELD_ADDRESS),
        .address = addr,
        .length = len,
        .flags = allocate ? UCP_MEM_MAP_ALLOCATE : 0,
    };
    return map(t, &mp,
               allocate ? "ucp_mem_map(allocate)" : "ucp_mem_map(register)",
               out);
}

/* CUDA memory is named as such: UCX would otherwise have to detect it
 * (its memory-type cache, which misses allocations of a statically linked
 * CUDA runtime, as kvrelay's are, and then treats device pointers as host
 * memory), and registers it with its CUDA domains (cuda_copy; cuda_ipc
 * exports it to a peer on the same host). Puts from it name its type too
 * (cuda_type). */
kvr_status_t kvr__ucx_reg_cuda(kvr_transport_t *t, void *addr, size_t len,
                               kvr_mem_t **out)
{
    ucp_mem_map_params_t mp = {
        .field_mask = UCP_MEM_MAP_PARAM_FIELD_LENGTH |
                      UCP_MEM_MAP_PARAM_FIELD_ADDRESS |
                      UCP_MEM_MAP_PARAM_FIELD_MEMORY_TYPE,
        .address = addr,
        .length = len,
        .memory_type = UCS_MEMORY_TYPE_CUDA,
    };
    kvr_status_t st = map(t, &mp, "ucp_mem_map(CUDA)", out);
    if (st != KVR_OK)
        return st;
    ucx_tr_t *tr = kvr__ucx_tr(t);
    ucx_mem_t *m = (ucx_mem_t *)*out;
    m->cuda = true;
    pthread_mutex_lock(&tr->cuda_lock);
    m->next_cuda = tr->cuda_mems;
    tr->cuda_mems = m;
    pthread_mutex_unlock(&tr->cuda_lock);
    return KVR_OK;
}

/* Whether [src, src + len) lies in registered CUDA memory. */
static bool cuda_source(ucx_tr_t *tr, const void *src, uint64_t len)
{
    uintptr_t a = (uintptr_t)src;
    bool found = false;
    pthread_mutex_lock(&tr->cuda_lock);
    for (const ucx_mem_t *m = tr->cuda_mems; m != NULL && !found;
         m = m->next_cuda) {
        uintptr_t b = (uintptr_t)m->base.addr;
        found = a >= b && a - b <= m->base.len && len <= m->base.len - (a - b);
    }
    pthread_mutex_unlock(&tr->cuda_lock);
    return found;
}

void kvr__ucx_dereg(kvr_mem_t *mem)
{
    ucx_mem_t *m = (ucx_mem_t *)mem;
    ucx_tr_t *tr = kvr__ucx_tr(mem->t);
    if (m->cuda) {
        pthread_mutex_lock(&tr->cuda_lock);
        ucx_mem_t **p = &tr->cuda_mems;
        while (*p != NULL && *p != m)
            p = &(*p)->next_cuda;
        if (*p == m)
            *p = m->next_cuda;
        pthread_mutex_unlock(&tr->cuda_lock);
    }
    ucp_mem_unmap(kvr__ucx_tr(mem->t)->ctx, m->memh);
    free(m);
}

kvr_status_t kvr__ucx_pack_rkey(const kvr_mem_t *mem, kvr_remote_region_t *out)
{
    const ucx_mem_t *m = (const ucx_mem_t *)mem;
    void *buf = NULL;
    size_t size = 0;
    ucs_status_t s = ucp_rkey_pack(kvr__ucx_tr(mem->t)->ctx, m->memh, &buf,
                                   &size);
    if (s != UCS_OK)
        return kvr__ucx_status(mem->t, s, "ucp_rkey_pack");
    kvr_status_t st = KVR_OK;
    if (size > KVR_XFER_RKEY_MAX)
        st = kvr__fail(mem->t, KVR_ERR_UNSUPPORTED,
                       "packed rkey of %zu bytes > KVR_XFER_RKEY_MAX %u", size,
                       KVR_XFER_RKEY_MAX);
    else {
        memcpy(out->rkey, buf, size);
        out->rkey_len = (uint32_t)size;
    }
    ucp_rkey_buffer_release(buf);
    return st;
}

kvr_status_t kvr__ucx_rmem_open(kvr_ep_t *ep, const kvr_remote_region_t *desc,
                                kvr_rmem_t **out)
{
    ucx_rmem_t *r = calloc(1, sizeof(*r));
    if (r == NULL)
        return KVR_ERR_NO_MEMORY;
    ucs_status_t s = ucp_ep_rkey_unpack(((ucx_ep_t *)ep)->uep, desc->rkey,
                                        &r->rkey);
    if (s != UCS_OK) {
        free(r);
        return kvr__ucx_status(ep->t, s, "ucp_ep_rkey_unpack");
    }
    r->base = (kvr_rmem_t){.ep = ep, .base = desc->base, .len = desc->length};
    *out = &r->base;
    return KVR_OK;
}

void kvr__ucx_rmem_close(kvr_rmem_t *rmem)
{
    ucp_rkey_destroy(((ucx_rmem_t *)rmem)->rkey);
    free(rmem);
}

kvr_status_t kvr__ucx_rmem_ptr(kvr_rmem_t *rmem, uint64_t off, void **out)
{
    void *p = NULL;
    ucs_status_t s = ucp_rkey_ptr(((ucx_rmem_t *)rmem)->rkey, rmem->base + off,
                                  &p);
    if (s != UCS_OK)
        return kvr__fail(rmem->ep->t, KVR_ERR_UNSUPPORTED,
                         "region not mapped into this process: %s",
                         ucs_status_string(s));
    *out = p;
    return KVR_OK;
}

static void put_done(void *req, ucs_status_t s, void *user)
{
    ucx_ep_t *ep = user;
    if (s != UCS_OK)
        kvr__ep_set_failed(&ep->base, kvr__ucx_status(ep->base.t, s, "put"));
    atomic_fetch_sub(&ep->inflight, 1);
    ucp_request_free(req);
    kvr__ucx_completed(tr_of_ep(&ep->base));
}

static int below_limit(void *ctx)
{
    ucx_ep_t *ep = ctx;
    return atomic_load(&ep->inflight) < ep->base.t->max_inflight ||
           kvr__ep_failed(&ep->base) != KVR_OK;
}

/* Settles the counts taken before posting when no callback will come:
 * NULL means done already, an error pointer means never started. */
static kvr_status_t posted(ucx_ep_t *ep, void *req, const char *what,
                           _Atomic uint32_t *count)
{
    if (req != NULL && !UCS_PTR_IS_ERR(req))
        return KVR_OK;
    if (count != NULL)
        atomic_fetch_sub(count, 1);
    kvr__ucx_completed(tr_of_ep(&ep->base));
    if (req == NULL)
        return KVR_OK;
    return kvr__ep_set_failed(
        &ep->base, kvr__ucx_status(ep->base.t, UCS_PTR_STATUS(req), what));
}

kvr_status_t kvr__ucx_put(kvr_ep_t *ep, const void *src, uint64_t len,
                          kvr_rmem_t *dst, uint64_t off, uint64_t deadline_ns)
{
    ucx_ep_t *uep = (ucx_ep_t *)ep;
    kvr_status_t st = kvr__wait(ep->t, below_limit, uep, deadline_ns);
    if (st == KVR_OK)
        st = kvr__ep_failed(ep);
    if (st != KVR_OK)
        return st == KVR_ERR_TIMEOUT
                   ? kvr__fail(ep->t, st, "put: %u puts still in flight",
                               atomic_load(&uep->inflight))
                   : st;
    ucp_request_param_t prm = {
        .op_attr_mask = UCP_OP_ATTR_FIELD_CALLBACK |
                        UCP_OP_ATTR_FIELD_USER_DATA,
        .cb.send = put_done,
        .user_data = uep,
    };
    /* a put from CUDA memory says so (see kvr__ucx_reg_cuda) */
    if (cuda_source(tr_of_ep(ep), src, len)) {
        prm.op_attr_mask |= UCP_OP_ATTR_FIELD_MEMORY_TYPE;
        prm.memory_type = UCS_MEMORY_TYPE_CUDA;
    }
    atomic_fetch_add(&uep->inflight, 1);
    kvr__ucx_posted(tr_of_ep(ep));
    void *req = ucp_put_nbx(uep->uep, src, len, dst->base + off,
                            ((ucx_rmem_t *)dst)->rkey, &prm);
    return posted(uep, req, "ucp_put_nbx", &uep->inflight);
}

static void flush_done(void *req, ucs_status_t s, void *user)
{
    ucx_ep_t *ep = user;
    if (s != UCS_OK)
        kvr__ep_set_failed(&ep->base, kvr__ucx_status(ep->base.t, s, "flush"));
    atomic_fetch_add(&ep->flushes_done, 1);
    ucp_request_free(req);
    kvr__ucx_completed(tr_of_ep(&ep->base));
}

typedef struct {
    ucx_ep_t *ep;
    uint64_t ticket;
} flush_wait_t;

static int flushed(void *ctx)
{
    flush_wait_t *w = ctx;
    return atomic_load(&w->ep->flushes_done) >= w->ticket ||
           kvr__ep_failed(&w->ep->base) != KVR_OK;
}

kvr_status_t kvr__ucx_flush(kvr_ep_t *ep, uint64_t deadline_ns)
{
    ucx_ep_t *uep = (ucx_ep_t *)ep;
    if (kvr__ep_failed(ep) != KVR_OK)
        return kvr__ep_failed(ep);
    ucp_request_param_t prm = {
        .op_attr_mask = UCP_OP_ATTR_FIELD_CALLBACK |
                        UCP_OP_ATTR_FIELD_USER_DATA,
        .cb.send = flush_done,
        .user_data = uep,
    };
    flush_wait_t w = {.ep = uep, .ticket = ++uep->flushes_posted};
    kvr__ucx_posted(tr_of_ep(ep));
    void *req = ucp_ep_flush_nbx(uep->uep, &prm);
    if (req == NULL || UCS_PTR_IS_ERR(req)) {
        uep->flushes_posted--;
        return posted(uep, req, "ucp_ep_flush_nbx", NULL);
    }
    kvr_status_t st = kvr__wait(ep->t, flushed, &w, deadline_ns);
    if (st == KVR_ERR_TIMEOUT)
        return kvr__fail(ep->t, st,
                         "flush not complete at the deadline "
                         "(%u puts in flight)",
                         atomic_load(&uep->inflight));
    return st != KVR_OK ? st : kvr__ep_failed(ep);
}

/* A control message owns a copy of its bytes until UCX is done with it. */
typedef struct {
    ucx_ep_t *ep;
    unsigned char hdr[KVR__UCX_AM_HDR];
    unsigned char data[];
} am_buf_t;

static void am_done(void *req, ucs_status_t s, void *user)
{
    am_buf_t *b = user;
    if (s != UCS_OK)
        kvr__ep_set_failed(&b->ep->base,
                           kvr__ucx_status(b->ep->base.t, s, "send message"));
    atomic_fetch_sub(&b->ep->msgs_pending, 1);
    ucp_request_free(req);
    kvr__ucx_completed(tr_of_ep(&b->ep->base));
    free(b);
}

static int msgs_left(void *ctx)
{
    ucx_ep_t *ep = ctx;
    return atomic_load(&ep->msgs_pending) == 0 ||
           kvr__ep_failed(&ep->base) != KVR_OK;
}

kvr_status_t kvr__ucx_drain(kvr_ep_t *ep, uint64_t deadline_ns)
{
    kvr_status_t st = kvr__wait(ep->t, msgs_left, ep, deadline_ns);
    if (st == KVR_ERR_TIMEOUT)
        return kvr__fail(ep->t, st, "%u control messages still unsent",
                         atomic_load(&((ucx_ep_t *)ep)->msgs_pending));
    return st != KVR_OK ? st : kvr__ep_failed(ep);
}

kvr_status_t kvr__ucx_send_msg(kvr_ep_t *ep, uint32_t type, const void *data,
                               size_t len, uint64_t deadline_ns)
{
    (void)deadline_ns; /* nothing waits: the copy outlives the call */
    am_buf_t *b = malloc(sizeof(*b) + len);
    if (b == NULL)
        return kvr__fail(ep->t, KVR_ERR_NO_MEMORY, "message of %zu bytes", len);
    b->ep = (ucx_ep_t *)ep;
    kvr__put_le(b->hdr, ep->t->id, 8);
    kvr__put_le(b->hdr + 8, type, 4);
    kvr__put_le(b->hdr + 12, 0, 4);
    if (len)
        memcpy(b->data, data, len);
    ucp_request_param_t prm = {
        .op_attr_mask = UCP_OP_ATTR_FIELD_CALLBACK |
                        UCP_OP_ATTR_FIELD_USER_DATA | UCP_OP_ATTR_FIELD_FLAGS,
        .cb.send = am_done,
        .user_data = b,
        .flags = UCP_AM_SEND_FLAG_EAGER, /* never rendezvous: no recv step */
    };
    kvr__ucx_posted(tr_of_ep(ep));
    atomic_fetch_add(&b->ep->msgs_pending, 1);
    void *req = ucp_am_send_nbx(b->ep->uep, KVR__UCX_AM_ID, b->hdr,
                                sizeof(b->hdr), b->data, len, &prm);
    kvr_status_t st = posted(b->ep, req, "ucp_am_send_nbx",
                             &b->ep->msgs_pending);
    if (req == NULL || UCS_PTR_IS_ERR(req))
        free(b);
    return st;
}

ucs_status_t kvr__ucx_am_recv(void *arg, const void *header, size_t hlen,
                              void *data, size_t len,
                              const ucp_am_recv_param_t *param)
{
    ucx_tr_t *tr = arg;
    if (hlen != KVR__UCX_AM_HDR || len > KVR_XFER_MSG_MAX ||
        (param->recv_attr & UCP_AM_RECV_ATTR_FLAG_RNDV)) {
        kvr__fail(&tr->base, KVR_ERR_PROTO,
                  "dropped a control message: header %zu bytes, data %zu", hlen,
                  len);
        return UCS_OK;
    }
    const unsigned char *h = header;
    kvr__msg_deliver(&tr->base, kvr__get_le(h, 8),
                     (uint32_t)kvr__get_le(h + 8, 4), data, len, 0);
    return UCS_OK;
}
