/* UCX transport: one context and one worker per transport, configured
 * through ucp_config_modify (never setenv, docs/transport.md), progress
 * driven by the caller or by a sleeping progress thread. */
#include <errno.h>
#include <poll.h>
#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/eventfd.h>
#include <unistd.h>

#include "ucx_internal.h"

/* After an event, keep polling this long before sleeping on the fd: a
 * stream of puts arrives faster than a wake-up. */
#define LINGER_NS 2000000u
/* With requests outstanding and no event for this long the peer is slow
 * or stopped: sleep in short polls instead of yielding. */
#define STALL_NS 2000000u
#define STALL_POLL_MS 1

kvr_status_t kvr__ucx_status(kvr_transport_t *t, ucs_status_t s,
                             const char *what)
{
    kvr_status_t code;
    switch (s) {
    case UCS_OK:
        return KVR_OK;
    case UCS_ERR_NO_MEMORY:
        code = KVR_ERR_NO_MEMORY;
        break;
    case UCS_ERR_ENDPOINT_TIMEOUT:
    case UCS_ERR_CONNECTION_RESET:
    case UCS_ERR_NOT_CONNECTED:
    case UCS_ERR_REJECTED:
        code = KVR_ERR_PEER_DEAD;
        break;
    case UCS_ERR_TIMED_OUT:
        code = KVR_ERR_TIMEOUT;
        break;
    case UCS_ERR_CANCELED:
        code = KVR_ERR_CANCELED;
        break;
    case UCS_ERR_UNSUPPORTED:
        code = KVR_ERR_UNSUPPORTED;
        break;
    case UCS_ERR_INVALID_PARAM:
        code = KVR_ERR_INVALID;
        break;
    default:
        code = KVR_ERR_TRANSPORT;
        break;
    }
    return kvr__fail(t, code, "%s: %s (ucs %d)", what, ucs_status_string(s),
                     (int)s);
}

static void kick(ucx_tr_t *tr)
{
    uint64_t one = 1;
    if (tr->wake_fd >= 0 && write(tr->wake_fd, &one, sizeof(one)) < 0) {
        /* a full eventfd is already a pending kick */
    }
}

void kvr__ucx_posted(ucx_tr_t *tr)
{
    atomic_fetch_add(&tr->outstanding, 1);
    if (atomic_load(&tr->sleeping))
        kick(tr);
}

void kvr__ucx_completed(ucx_tr_t *tr)
{
    atomic_fetch_sub(&tr->outstanding, 1);
    if (tr->base.threaded)
        kvr__wake(&tr->base);
}

/* Sleeps on the worker's fd (and the kick fd) until an event or until_ns. */
static kvr_status_t sleep_on_fd(ucx_tr_t *tr, uint64_t until_ns, int max_ms)
{
    ucs_status_t s = ucp_worker_arm(tr->worker);
    if (s == UCS_ERR_BUSY)
        return KVR_OK; /* events arrived meanwhile */
    if (s != UCS_OK)
        return kvr__ucx_status(&tr->base, s, "ucp_worker_arm");
    uint64_t now = kvr_now_ns();
    int ms = until_ns > now ? (int)((until_ns - now + 999999u) / 1000000u) : 0;
    if (max_ms >= 0 && ms > max_ms)
        ms = max_ms;
    struct pollfd fds[2] = {{.fd = tr->efd, .events = POLLIN},
                            {.fd = tr->wake_fd, .events = POLLIN}};
    atomic_store(&tr->sleeping, true);
    /* Re-read after announcing the sleep: a request posted since the idle
     * check either sees `sleeping` and kicks, or is seen here. */
    bool posted = max_ms < 0 && atomic_load(&tr->outstanding) != 0;
    if (!posted)
        poll(fds, tr->wake_fd >= 0 ? 2 : 1, ms);
    atomic_store(&tr->sleeping, false);
    if (fds[1].revents & POLLIN) {
        uint64_t v;
        if (read(tr->wake_fd, &v, sizeof(v)) < 0) {
            /* drained by a concurrent reader: nothing to do */
        }
    }
    return KVR_OK;
}

/* One round: progress; if idle, yield briefly or sleep on the event fd. */
static kvr_status_t ucx_progress(kvr_transport_t *t, uint64_t wait_until_ns)
{
    ucx_tr_t *tr = kvr__ucx_tr(t);
    unsigned n = 0;
    while (ucp_worker_progress(tr->worker) != 0)
        n++;
    uint64_t now = kvr_now_ns();
    if (n != 0) {
        tr->last_event_ns = now;
        return KVR_OK;
    }
    if (wait_until_ns <= now)
        return KVR_OK;
    uint64_t idle = now - tr->last_event_ns;
    bool busy = atomic_load(&tr->outstanding) != 0;
    if (idle < LINGER_NS || (busy && idle < STALL_NS)) {
        sched_yield(); /* 2 cores: let the peer drain what we sent */
        return KVR_OK;
    }
    return sleep_on_fd(tr, wait_until_ns, busy ? STALL_POLL_MS : -1);
}

static void *progress_main(void *arg)
{
    ucx_tr_t *tr = arg;
    while (!atomic_load(&tr->stop))
        ucx_progress(&tr->base, kvr_now_ns() + 100000000u);
    return NULL;
}

static kvr_status_t ucx_address(kvr_transport_t *t, const void **addr,
                                size_t *len)
{
    *addr = kvr__ucx_tr(t)->addr;
    *len = kvr__ucx_tr(t)->addr_len;
    return KVR_OK;
}

static kvr_status_t ucx_event_fd(kvr_transport_t *t, int *fd)
{
    if (t->threaded)
        return kvr__fail(t, KVR_ERR_UNSUPPORTED,
                         "the progress thread owns the event fd");
    *fd = kvr__ucx_tr(t)->efd;
    return KVR_OK;
}

static void ucx_close(kvr_transport_t *t)
{
    ucx_tr_t *tr = kvr__ucx_tr(t);
    if (tr->thread_started) {
        atomic_store(&tr->stop, true);
        kick(tr);
        pthread_join(tr->thread, NULL);
    }
    if (tr->addr != NULL)
        ucp_worker_release_address(tr->worker, tr->addr);
    if (tr->worker != NULL)
        ucp_worker_destroy(tr->worker);
    kvr__ucx_free_graveyard(tr);
    if (tr->ctx != NULL)
        ucp_cleanup(tr->ctx);
    if (tr->wake_fd >= 0)
        close(tr->wake_fd);
    kvr__transport_fini(t);
    pthread_mutex_destroy(&tr->cuda_lock);
    free(tr);
}

static const kvr__xfer_ops_t ucx_ops = {
    .name = "ucx",
    .address = ucx_address,
    .event_fd = ucx_event_fd,
    .progress = ucx_progress,
    .ep_create = kvr__ucx_ep_create,
    .ep_destroy = kvr__ucx_ep_destroy,
    .reg = kvr__ucx_reg,
    .reg_cuda = kvr__ucx_reg_cuda,
    .dereg = kvr__ucx_dereg,
    .pack_rkey = kvr__ucx_pack_rkey,
    .rmem_open = kvr__ucx_rmem_open,
    .rmem_close = kvr__ucx_rmem_close,
    .rmem_ptr = kvr__ucx_rmem_ptr,
    .put = kvr__ucx_put,
    .flush = kvr__ucx_flush,
    .drain = kvr__ucx_drain,
    .send_msg = kvr__ucx_send_msg,
    .close = ucx_close,
};

static kvr_status_t set_opt(ucx_tr_t *tr, ucp_config_t *cfg, const char *key,
                            const char *value)
{
    ucs_status_t s = ucp_config_modify(cfg, key, value);
    if (s == UCS_OK)
        return KVR_OK;
    char what[96];
    snprintf(what, sizeof(what), "ucp_config_modify(%s=%s)", key, value);
    return kvr__ucx_status(&tr->base, s, what);
}

/* A transport key under either of its names: UCX 1.13 takes the field name
 * below the transport's prefix ("TX_SEG_SIZE"; the whole name is accepted
 * there but warned about and ignored at worker creation), UCX 1.22 only
 * the whole name ("TCP_TX_SEG_SIZE"). */
static kvr_status_t set_tl_opt(ucx_tr_t *tr, ucp_config_t *cfg,
                               const char *prefix, const char *key,
                               const char *value)
{
    char whole[64];
    if (ucp_config_modify(cfg, key, value) == UCS_OK)
        return KVR_OK;
    snprintf(whole, sizeof(whole), "%s%s", prefix, key);
    return set_opt(tr, cfg, whole, value);
}

/* The settings docs/transport.md explains: peer error handling that works on
 * shared memory, a short keepalive, large TCP segments. */
static kvr_status_t configure(ucx_tr_t *tr, ucp_config_t *cfg)
{
    const kvr_ucx_params_t *p = &tr->p;
    static const char *const tls[2][3] = {
        {NULL, "sm", "tcp"}, {NULL, "sm,cuda_copy,cuda_ipc", "tcp,cuda_copy"}};
    char num[32];
    kvr_status_t st = KVR_OK;
    if (tls[p->cuda][p->tl] != NULL)
        st = set_opt(tr, cfg, "TLS", tls[p->cuda][p->tl]);
    /* ucp_config_modify matches transport keys by field name below the
     * transport's own prefix: "MM_ERROR_HANDLING" (a sub-table of sysv and
     * posix), but "TX_SEG_SIZE" for UCX_TCP_TX_SEG_SIZE. A key no transport
     * uses draws a UCX warning, so only the selected ones are set. */
    bool tcp = p->tl != KVR_XFER_TL_SHM;
    if (st == KVR_OK && p->tl != KVR_XFER_TL_TCP)
        st = set_opt(tr, cfg, "MM_ERROR_HANDLING", "y");
    /* UCX's own warning about a CUDA transport it lacks is harmless: the
     * context's memory types say what it can do (has_cuda below). */
    snprintf(num, sizeof(num), "%ums",
             p->keepalive_ms ? p->keepalive_ms : 1000);
    if (st == KVR_OK)
        st = set_opt(tr, cfg, "KEEPALIVE_INTERVAL", num);
    snprintf(num, sizeof(num), "%u", p->tcp_tx_seg);
    if (st == KVR_OK && tcp && p->tcp_tx_seg)
        st = set_tl_opt(tr, cfg, "TCP_", "TX_SEG_SIZE", num);
    snprintf(num, sizeof(num), "%u", p->tcp_rx_seg);
    if (st == KVR_OK && tcp && p->tcp_rx_seg)
        st = set_tl_opt(tr, cfg, "TCP_", "RX_SEG_SIZE", num);
    if (st == KVR_OK && p->net_devices != NULL)
        st = set_opt(tr, cfg, "NET_DEVICES", p->net_devices);
    return st;
}

static kvr_status_t init_context(ucx_tr_t *tr)
{
    ucp_config_t *cfg = NULL;
    ucs_status_t s = ucp_config_read(NULL, NULL, &cfg);
    if (s != UCS_OK)
        return kvr__ucx_status(&tr->base, s, "ucp_config_read");
    kvr_status_t st = configure(tr, cfg);
    ucp_params_t params = {
        .field_mask = UCP_PARAM_FIELD_FEATURES | UCP_PARAM_FIELD_NAME,
        .features = UCP_FEATURE_RMA | UCP_FEATURE_AM | UCP_FEATURE_WAKEUP,
        .name = "kvrelay",
    };
    if (st == KVR_OK) {
        s = ucp_init(&params, cfg, &tr->ctx);
        if (s != UCS_OK)
            st = kvr__ucx_status(&tr->base, s, "ucp_init");
    }
    ucp_config_release(cfg);
    /* CUDA memory needs a UCX built with CUDA: its memory types say so */
    ucp_context_attr_t attr = {.field_mask = UCP_ATTR_FIELD_MEMORY_TYPES};
    if (st == KVR_OK && ucp_context_query(tr->ctx, &attr) == UCS_OK)
        tr->base.has_cuda =
            (attr.memory_types & UCS_BIT(UCS_MEMORY_TYPE_CUDA)) != 0;
    return st;
}

const char *kvr_xfer_ucx_version(void)
{
    return ucp_get_version_string();
}

static kvr_status_t init_worker(ucx_tr_t *tr)
{
    ucp_worker_params_t wp = {
        .field_mask = UCP_WORKER_PARAM_FIELD_THREAD_MODE,
        .thread_mode = tr->base.threaded ? UCS_THREAD_MODE_MULTI
                                         : UCS_THREAD_MODE_SINGLE,
    };
    ucs_status_t s = ucp_worker_create(tr->ctx, &wp, &tr->worker);
    if (s != UCS_OK)
        return kvr__ucx_status(&tr->base, s, "ucp_worker_create");
    s = ucp_worker_get_efd(tr->worker, &tr->efd);
    if (s == UCS_OK)
        s = ucp_worker_get_address(tr->worker, &tr->addr, &tr->addr_len);
    ucp_am_handler_param_t am = {
        .field_mask = UCP_AM_HANDLER_PARAM_FIELD_ID |
                      UCP_AM_HANDLER_PARAM_FIELD_CB |
                      UCP_AM_HANDLER_PARAM_FIELD_ARG |
                      UCP_AM_HANDLER_PARAM_FIELD_FLAGS,
        .id = KVR__UCX_AM_ID,
        .flags = UCP_AM_FLAG_WHOLE_MSG,
        .cb = kvr__ucx_am_recv,
        .arg = tr,
    };
    if (s == UCS_OK)
        s = ucp_worker_set_am_recv_handler(tr->worker, &am);
    return kvr__ucx_status(&tr->base, s, "worker setup");
}

static kvr_status_t start_thread(ucx_tr_t *tr)
{
    tr->wake_fd = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
    if (tr->wake_fd < 0)
        return kvr__fail(&tr->base, KVR_ERR_TRANSPORT, "eventfd: %s",
                         strerror(errno));
    int rc = pthread_create(&tr->thread, NULL, progress_main, tr);
    if (rc != 0)
        return kvr__fail(&tr->base, KVR_ERR_TRANSPORT, "pthread_create: %s",
                         strerror(rc));
    tr->thread_started = true;
    return KVR_OK;
}

kvr_status_t kvr_transport_ucx_create(const kvr_ucx_params_t *params,
                                      kvr_transport_t **out, kvr_error_t *err)
{
    static const char *const names[] = {"ucx-auto", "ucx-shm", "ucx-tcp"};
    kvr_ucx_params_t defaults = KVR_UCX_PARAMS_INIT;
    const kvr_ucx_params_t *p = params ? params : &defaults;
    if (out == NULL || (unsigned)p->tl > KVR_XFER_TL_TCP ||
        (unsigned)p->progress > KVR_XFER_PROGRESS_THREAD)
        return kvr_error_set(err, KVR_ERR_INVALID, "bad UCX parameters");
    ucx_tr_t *tr = calloc(1, sizeof(*tr));
    if (tr == NULL)
        return kvr_error_set(err, KVR_ERR_NO_MEMORY, "no memory");
    tr->p = *p;
    tr->wake_fd = -1;
    pthread_mutex_init(&tr->cuda_lock, NULL);
    kvr_status_t st = kvr__transport_init(&tr->base, &ucx_ops, p->id,
                                          p->max_inflight, p->msg_queue_max);
    if (st != KVR_OK) {
        free(tr);
        return kvr_error_set(err, st, "no memory");
    }
    tr->base.name = names[p->tl];
    tr->base.threaded = p->progress == KVR_XFER_PROGRESS_THREAD;
    /* ucp_rkey_ptr succeeds only for a segment the unpacked rkey attached
     * (sysv/posix, UCX-allocated), which stays attached while it lives */
    tr->base.map_stores = true;
    st = init_context(tr);
    if (st == KVR_OK)
        st = init_worker(tr);
    if (st == KVR_OK && tr->base.threaded)
        st = start_thread(tr);
    if (st != KVR_OK) {
        kvr_error_set(err, st, "UCX transport: %s", tr->base.last_error);
        ucx_close(&tr->base);
        return st;
    }
    *out = &tr->base;
    return KVR_OK;
}
