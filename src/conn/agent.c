/* The agent's call side: creation, regions, the public calls (validate, copy,
 * queue a command), the event queue, the status snapshot and the progress
 * thread. Everything here that touches shared state holds `lock`; the
 * request state lives in the loop (agent_loop.c). */
#include <errno.h>
#include <poll.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/eventfd.h>
#include <unistd.h>

#include <sodium.h>

#include "agent_internal.h"

static _Thread_local char tls_error[KVR_ERROR_MSG_MAX];

static void unplace(kvr_agent_t *a, kvr__aregion_t *r);

static kvr_status_t fail(kvr_status_t st, const char *fmt, ...)
#if defined(__GNUC__)
    __attribute__((format(printf, 2, 3)))
#endif
    ;

static kvr_status_t fail(kvr_status_t st, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(tls_error, sizeof(tls_error), fmt, ap);
    va_end(ap);
    return st;
}

const char *kvr_agent_last_error(const kvr_agent_t *agent)
{
    (void)agent;
    return tls_error;
}

void kvr__agent_log(kvr_agent_t *a, const char *fmt, ...)
{
    if (!a->debug) /* formatted only to be printed: several a request */
        return;
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(a->log, sizeof(a->log), fmt, ap);
    va_end(ap);
    fprintf(stderr, "kvr agent %.*s pp %u tp %u dcp %u %.6f: %s\n",
            (int)a->instance.len, a->instance.bytes, a->p.topo.pp_rank,
            a->p.topo.tp_rank, a->p.topo.dcp_rank,
            (double)(kvr_now_ns() % 100000000000ull) / 1e9, a->log);
}

/* ---- creation ---- */

static kvr_status_t copy_spec(char *dst, const char *src, const char *what,
                              kvr_error_t *err)
{
    dst[0] = '\0';
    if (src == NULL)
        return KVR_OK;
    size_t n = strlen(src);
    if (n == 0 || n >= KVR_AGENT_ADDR_MAX || strrchr(src, ':') == NULL)
        return kvr_error_set(err, KVR_ERR_INVALID,
                             "%s address '%s' is not host:port", what, src);
    memcpy(dst, src, n + 1);
    return KVR_OK;
}

static kvr_status_t check_ms(uint32_t v, uint32_t lo, const char *what,
                             kvr_error_t *err)
{
    if (v < lo || v > KVR_WIRE_DEADLINE_MAX_MS)
        return kvr_error_set(err, KVR_ERR_INVALID, "%s %u ms not in [%u, %u]",
                             what, v, lo, KVR_WIRE_DEADLINE_MAX_MS);
    return KVR_OK;
}

static kvr_status_t check_times(const kvr_agent_params_t *p, kvr_error_t *err)
{
    kvr_status_t st = check_ms(p->deadline_ms, 1, "deadline", err);
    if (st == KVR_OK)
        st = check_ms(p->grace_ms, 0, "grace", err);
    if (st == KVR_OK)
        st = check_ms(p->lease_ms, 1, "lease", err);
    if (st == KVR_OK)
        st = check_ms(p->unknown_wait_ms, 0, "unknown-request wait", err);
    if (st == KVR_OK)
        st = check_ms(p->idle_close_ms, 1, "idle link close", err);
    if (st == KVR_OK)
        st = check_ms(p->connect_timeout_ms, 1, "connect timeout", err);
    if (st == KVR_OK)
        st = check_ms(p->handshake_timeout_ms, 1, "handshake timeout", err);
    if (st == KVR_OK && p->max_unauth_links == 0)
        st = kvr_error_set(err, KVR_ERR_INVALID,
                           "max_unauth_links is 0 "
                           "(no peer could connect)");
    return st;
}

static kvr_status_t check_topo(const kvr_agent_params_t *p, kvr_error_t *err)
{
    const kvr_wire_topo_t *t = &p->topo;
    if (t->pp_rank >= t->pp_size || t->tp_rank >= t->tp_size ||
        t->dp_rank >= t->dp_size)
        return kvr_error_set(err, KVR_ERR_RANK_RANGE,
                             "topo ranks pp %u/%u tp %u/%u dp %u/%u out of "
                             "range",
                             t->pp_rank, t->pp_size, t->tp_rank, t->tp_size,
                             t->dp_rank, t->dp_size);
    if (t->layer_start >= t->layer_end)
        return kvr_error_set(err, KVR_ERR_INVALID,
                             "layer range [%u, %u) is empty", t->layer_start,
                             t->layer_end);
    if (t->pp_size > KVR_AGENT_MAX_STAGES)
        return kvr_error_set(err, KVR_ERR_INVALID, "pp size %u > %u",
                             t->pp_size, KVR_AGENT_MAX_STAGES);
    bool consumer = p->role & KVR_AGENT_CONSUMER;
    if (consumer && t->dcp_rank >= p->layout.dcp_size)
        return kvr_error_set(err, KVR_ERR_RANK_RANGE,
                             "DCP rank %u out of range [0, %u)", t->dcp_rank,
                             p->layout.dcp_size);
    if (consumer && t->tp_size != p->layout.tp)
        return kvr_error_set(err, KVR_ERR_INVALID,
                             "consumer tp size %u, the layout says %u",
                             t->tp_size, p->layout.tp);
    if ((p->role & KVR_AGENT_PRODUCER) && t->tp_size != p->layout.producer_tp)
        return kvr_error_set(err, KVR_ERR_INVALID,
                             "producer tp size %u, the layout says %u",
                             t->tp_size, p->layout.producer_tp);
    return kvr__sources_check_topo(p, err);
}

/* KV in CUDA memory moves gpu-direct (one host), gpu-staged or by direct
 * puts (a UCX built with CUDA). */
static kvr_status_t check_cuda(const kvr_agent_params_t *p, kvr_error_t *err)
{
    int n = kvr__gpu_device_count();
    if (n == 0)
        return kvr_error_set(err, KVR_ERR_UNSUPPORTED,
                             "CUDA device %d: no CUDA device here, or kvrelay "
                             "was built without CUDA",
                             p->cuda_device);
    if (p->cuda_device >= n)
        return kvr_error_set(err, KVR_ERR_INVALID,
                             "CUDA device %d out of range [0, %d)",
                             p->cuda_device, n);
    if (p->executor < KVR_AGENT_EXEC_AUTO ||
        p->executor > KVR_AGENT_EXEC_GPU_DIRECT)
        return kvr_error_set(err, KVR_ERR_INVALID, "executor %d unknown",
                             (int)p->executor);
    return KVR_OK;
}

static kvr_status_t check_params(const kvr_agent_params_t *p, kvr_error_t *err)
{
    if (p->instance_id == NULL || p->instance_id_len == 0 ||
        p->instance_id_len > KVR_AGENT_INSTANCE_MAX)
        return kvr_error_set(
            err, KVR_ERR_INVALID, "instance id of %zu bytes (1..%u)",
            p->instance_id ? p->instance_id_len : 0, KVR_AGENT_INSTANCE_MAX);
    if (p->role < KVR_AGENT_PRODUCER || p->role > KVR_AGENT_BOTH)
        return kvr_error_set(err, KVR_ERR_INVALID, "role %d", (int)p->role);
    kvr_status_t st = kvr_layout_check(&p->layout, err);
    if (st == KVR_OK)
        st = check_topo(p, err);
    if (st == KVR_OK)
        st = check_times(p, err);
    if (st != KVR_OK)
        return st;
    if ((p->role & KVR_AGENT_PRODUCER) && p->listen == NULL)
        return kvr_error_set(err, KVR_ERR_INVALID,
                             "a producer must listen (params.listen)");
    bool head = p->topo.pp_rank == 0 && p->topo.tp_rank == 0;
    if ((p->role & KVR_AGENT_PRODUCER) && !head && p->bootstrap == NULL)
        return kvr_error_set(err, KVR_ERR_INVALID,
                             "producer stage pp %u tp %u needs the bootstrap "
                             "address of its PP head",
                             p->topo.pp_rank, p->topo.tp_rank);
    if (p->max_requests < 1 || p->max_requests > 65536)
        return kvr_error_set(err, KVR_ERR_INVALID, "max requests %u",
                             p->max_requests);
    if (p->cuda_device >= 0)
        return check_cuda(p, err);
    if (p->executor == KVR_AGENT_EXEC_GPU_DIRECT)
        return kvr_error_set(err, KVR_ERR_INVALID,
                             "executor GPU_DIRECT needs KV in CUDA memory "
                             "(params.cuda_device)");
    if (p->executor != KVR_AGENT_EXEC_AUTO &&
        p->executor != KVR_AGENT_EXEC_DIRECT &&
        p->executor != KVR_AGENT_EXEC_STAGED)
        return kvr_error_set(err, KVR_ERR_INVALID, "executor %d unknown",
                             (int)p->executor);
    return KVR_OK;
}

/* A measuring knob from the environment, in units of `unit`, or the
 * default (docs/agent.md names them). */
static uint64_t env_u64(const char *name, uint64_t unit, uint64_t dflt)
{
    const char *v = getenv(name);
    return v ? strtoull(v, NULL, 10) * unit : dflt;
}

static kvr_status_t init_shared(kvr_agent_t *a, kvr_error_t *err)
{
    if (pthread_mutex_init(&a->lock, NULL) != 0 ||
        pthread_mutex_init(&a->turn_lock, NULL) != 0 ||
        pthread_mutex_init(&a->gate_lock, NULL) != 0 ||
        pthread_cond_init(&a->watch_cond, NULL) != 0)
        return kvr_error_set(err, KVR_ERR_NO_MEMORY, "mutex init failed");
    a->debug = getenv("KVR_AGENT_DEBUG") != NULL;
    a->ph.on = getenv("KVR_AGENT_PHASES") != NULL;
    a->gpu_queue_cap = env_u64("KVR_AGENT_GPU_QUEUE_MB", 1ull << 20,
                               KVR_AGENT_GPU_QUEUE_BYTES);
    a->wait_spin_ns =
        env_u64("KVR_AGENT_WAIT_SPIN_US", 1000u, KVR_AGENT_WAIT_SPIN_NS);
    /* KVR_AGENT_GPU_CHUNK_MB: the region arena's chunks (0: one
     * allocation a region, its size still rounded up to the alignment,
     * unlike before the arena), for measuring both side by side
     * (docs/agent.md, where device regions live) */
    kvr__gpu_arena_init(&a->arena);
    a->arena.chunk =
        env_u64("KVR_AGENT_GPU_CHUNK_MB", 1ull << 20, a->arena.chunk);
    /* KVR_AGENT_GPU_MERGE: a launch carries the waiting pulls of up to
     * this many requests (1: one request's, as without it) */
    a->gpu_merge = (uint32_t)env_u64("KVR_AGENT_GPU_MERGE", 1, 1);
    /* KVR_AGENT_GATE_WATCH=spin: a thread of the agent polls the gates of
     * send_ready's CUDA events instead of a host function each, a core
     * for a shorter hand-over (docs/agent.md, CUDA events) */
    const char *watch = getenv("KVR_AGENT_GATE_WATCH");
    a->gate_watch = watch != NULL && strcmp(watch, "spin") == 0;
    if (watch != NULL && watch[0] != '\0' && !a->gate_watch)
        return kvr_error_set(err, KVR_ERR_INVALID,
                             "KVR_AGENT_GATE_WATCH: '%s' is not spin (or "
                             "empty)",
                             watch);
    a->wake_fd = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
    a->event_fd = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
    if (a->wake_fd < 0 || a->event_fd < 0)
        return kvr_error_set(err, KVR_ERR_IO, "eventfd: %s", strerror(errno));
    size_t buckets = (size_t)a->p.max_requests * 2;
    if (kvr__map_init(&a->snap, buckets) != KVR_OK ||
        kvr__map_init(&a->preq_map, buckets) != KVR_OK ||
        kvr__map_init(&a->creq_map, buckets) != KVR_OK)
        return kvr_error_set(err, KVR_ERR_NO_MEMORY, "no memory for tables");
    return KVR_OK;
}

static kvr_status_t make_data(kvr_agent_t *a, kvr_error_t *err)
{
    if (a->p.loopback_hub != NULL)
        return kvr__data_create_loopback(a->p.loopback_hub, &a->p.loopback,
                                         &a->data, err);
    /* a consumer's engine-registered memory is the target of emulated puts,
     * which need its own progress */
    bool consumer = (a->p.role & KVR_AGENT_CONSUMER) != 0;
    bool cuda = a->p.cuda_device >= 0;
    kvr_status_t st =
        kvr__data_create((int)a->p.tl, consumer, cuda, &a->data, err);
    /* gpu-direct moves nothing over the data transport: without UCX, CUDA
     * KV still moves through CUDA IPC on one host (not when the network
     * path is forced) */
    if (st != KVR_OK && cuda && a->p.tl != KVR_AGENT_TL_TCP)
        st = kvr__data_create_loopback(NULL, &a->p.loopback, &a->data, err);
    return st;
}

kvr_status_t kvr_agent_create(const kvr_agent_params_t *params,
                              kvr_agent_t **out, kvr_error_t *err)
{
    if (params == NULL || out == NULL)
        return kvr_error_set(err, KVR_ERR_INVALID, "params or out is NULL");
    if (sodium_init() < 0)
        return kvr_error_set(err, KVR_ERR_INVALID, "libsodium init failed");
    kvr_status_t st = check_params(params, err);
    if (st != KVR_OK)
        return st;
    kvr_agent_t *a = calloc(1, sizeof(*a));
    if (a == NULL)
        return kvr_error_set(err, KVR_ERR_NO_MEMORY, "no memory");
    a->p = *params;
    a->wake_fd = a->event_fd = a->epoll_fd = a->timer_fd = a->listen_fd = -1;
    a->local_fd = -1;
    a->staging = -1;
    kvr_wire_id_set(&a->instance, params->instance_id, params->instance_id_len,
                    NULL);
    a->incarnation = kvr_wire_random_nonce();
    if (params->key != NULL) {
        memcpy(a->key, params->key, sizeof(a->key));
        a->has_key = true;
    }
    a->p.key = NULL;
    a->p.instance_id = NULL;
    st = copy_spec(a->listen_spec, params->listen, "listen", err);
    if (st == KVR_OK)
        st = copy_spec(a->advertise_spec, params->advertise, "advertise", err);
    if (st == KVR_OK)
        st = copy_spec(a->bootstrap_spec, params->bootstrap, "bootstrap", err);
    a->p.listen = a->p.advertise = a->p.bootstrap = NULL;
    if (st == KVR_OK)
        st = init_shared(a, err);
    if (st == KVR_OK)
        st = make_data(a, err);
    if (st == KVR_OK)
        st = kvr__loop_init(a, err);
    if (st != KVR_OK) {
        kvr_agent_destroy(a);
        return st;
    }
    *out = a;
    return KVR_OK;
}

static void free_snap(void *v)
{
    free(v);
}

void kvr_agent_destroy(kvr_agent_t *a)
{
    if (a == NULL)
        return;
    if (a->thread_running) {
        __atomic_store_n(&a->stop, 1, __ATOMIC_RELEASE);
        kvr__agent_wake(a);
        pthread_join(a->thread, NULL);
    }
    kvr__ph_print(a);
    kvr__send_free_all(a);
    kvr__recv_free_all(a);
    kvr__pcache_destroy(a->pcache);
    kvr__alink_free_all(a);
    kvr__pdir_free_all(a);
    kvr__loop_fini(a);
    for (uint32_t i = 0; i < a->num_regions; i++)
        unplace(a, &a->regions[i]);
    /* no host function may write wake_fd after it closes, nor a kernel
     * read a pooled table after the pool goes */
    if (a->stream != NULL)
        kvr__gpu_stream_sync(a->stream, NULL);
    if (a->nstream != NULL)
        kvr__gpu_stream_sync(a->nstream, NULL);
    if (a->gstream != NULL)
        kvr__gpu_stream_sync(a->gstream, NULL);
    kvr__gates_watch_stop(a); /* its last wait is over: gstream is idle */
    kvr__gates_free(a);
    kvr__gpu_pool_destroy(a->gpool);
    kvr__gpu_arena_free(&a->arena); /* after the streams: nothing writes */
    kvr__gpu_stream_destroy(a->stream);
    kvr__gpu_stream_destroy(a->nstream);
    kvr__gpu_stream_destroy(a->gstream);
    kvr__agpu_free(a);
    kvr__data_destroy(a->data);
    for (kvr__cmd_t *c = a->inbox_head, *n; c != NULL; c = n) {
        n = c->next;
        kvr__gate_drop(c->gate); /* armed, its stream idle since */
        kvr__cmd_free(c);
    }
    for (kvr__event_node_t *e = a->ev_head, *n; e != NULL; e = n) {
        n = e->next;
        free(e);
    }
    for (kvr__notify_node_t *e = a->nt_head, *n; e != NULL; e = n) {
        n = e->next;
        free(e);
    }
    free(a->slot_busy);
    kvr__map_free(&a->snap, free_snap);
    kvr__map_free(&a->preq_map, NULL);
    kvr__map_free(&a->creq_map, NULL);
    if (a->wake_fd >= 0)
        close(a->wake_fd);
    if (a->event_fd >= 0)
        close(a->event_fd);
    pthread_mutex_destroy(&a->lock);
    pthread_mutex_destroy(&a->turn_lock);
    pthread_mutex_destroy(&a->gate_lock);
    pthread_cond_destroy(&a->watch_cond);
    sodium_memzero(a->key, sizeof(a->key));
    free(a);
}

uint64_t kvr_agent_incarnation(const kvr_agent_t *agent)
{
    return agent ? agent->incarnation : 0;
}

const char *kvr_agent_address(const kvr_agent_t *agent)
{
    return agent && agent->started ? agent->address : "";
}

/* ---- regions ---- */

kvr_status_t kvr_agent_set_settings(kvr_agent_t *a, const char *text)
{
    if (a == NULL || text == NULL)
        return fail(KVR_ERR_INVALID, "agent or settings is NULL");
    if (strlen(text) > KVR_WIRE_TEXT_MAX)
        return fail(KVR_ERR_INVALID, "settings of %zu bytes (at most %u)",
                    strlen(text), KVR_WIRE_TEXT_MAX);
    pthread_mutex_lock(&a->turn_lock);
    bool started = a->started;
    if (!started)
        snprintf(a->settings, sizeof(a->settings), "%s", text);
    pthread_mutex_unlock(&a->turn_lock);
    return started ? fail(KVR_ERR_INVALID, "settings after kvr_agent_start")
                   : KVR_OK;
}

int kvr_agent_cuda_devices(void)
{
    return kvr__gpu_device_count();
}

kvr_status_t kvr_agent_copy(kvr_agent_t *a, void *dst, const void *src,
                            size_t len)
{
    kvr_error_t err = {0};
    if (a == NULL || (len > 0 && (dst == NULL || src == NULL)))
        return fail(KVR_ERR_INVALID, "agent, dst or src is NULL");
    if (a->p.cuda_device < 0) {
        if (len > 0)
            memcpy(dst, src, len);
        return KVR_OK;
    }
    kvr_status_t st = kvr__gpu_use(a->p.cuda_device, &err);
    if (st == KVR_OK)
        st = kvr__gpu_copy(dst, src, len, &err);
    return st == KVR_OK ? KVR_OK : fail(st, "%s", err.msg);
}

static kvr_status_t check_region(const kvr_agent_t *a,
                                 const kvr_region_desc_t *d, uint32_t flags)
{
    kvr_error_t err = {0};
    if (a->started)
        return fail(KVR_ERR_INVALID,
                    "regions are fixed once the agent started");
    if (a->num_regions == KVR_AGENT_MAX_REGIONS)
        return fail(KVR_ERR_NO_SPACE, "more than %u regions",
                    KVR_AGENT_MAX_REGIONS);
    if (flags & ~KVR_AGENT_REGION_CONSUMER_ONLY)
        return fail(KVR_ERR_INVALID, "region flags 0x%x unknown", flags);
    bool consumer = a->p.role == KVR_AGENT_CONSUMER;
    if ((flags & KVR_AGENT_REGION_CONSUMER_ONLY) && !consumer)
        return fail(KVR_ERR_INVALID, "a consumer-only region on a %s agent",
                    a->p.role == KVR_AGENT_PRODUCER ? "producer" : "dual-role");
    bool staging = d->role == KVR_ROLE_STAGING;
    if (staging && (!(a->p.role & KVR_AGENT_CONSUMER) || flags))
        return fail(KVR_ERR_INVALID,
                    "a STAGING region belongs to a consumer "
                    "agent, unflagged (staged chunks land in the consumer's "
                    "slots)");
    if (staging && a->staging >= 0)
        return fail(KVR_ERR_EXISTS, "a second STAGING region");
    if (staging && d->num_blocks < 2)
        return fail(KVR_ERR_INVALID,
                    "STAGING region of %llu slot(s): one "
                    "usable slot and the cost probe's scratch need 2",
                    (unsigned long long)d->num_blocks);
    kvr_status_t st = staging
                          ? KVR_OK
                          : kvr_region_check(&a->p.layout, d, consumer, &err);
    if (st != KVR_OK)
        return fail(st, "region %s layer %u: %s", kvr_role_name(d->role),
                    d->layer, err.msg);
    if (d->num_blocks == 0 || d->page_bytes > UINT64_MAX / d->num_blocks)
        return fail(KVR_ERR_INVALID,
                    "region layer %u: %llu blocks of %llu "
                    "bytes",
                    d->layer, (unsigned long long)d->num_blocks,
                    (unsigned long long)d->page_bytes);
    for (uint32_t i = 0; i < a->num_regions; i++)
        if (a->regions[i].desc.role == d->role &&
            a->regions[i].desc.layer == d->layer)
            return fail(KVR_ERR_EXISTS, "region %s layer %u registered twice",
                        kvr_role_name(d->role), d->layer);
    return KVR_OK;
}

/* Device memory is registered with the data transport as CUDA memory when
 * it moves CUDA memory, and must be when the network path is forced or it
 * is staging (gpu-staged puts into it): a transport that cannot refuses,
 * naming its UCX. Else it is shared by CUDA IPC only. */
static kvr_status_t place_cuda(kvr_agent_t *a, kvr__aregion_t *r,
                               uint64_t len, bool staging, kvr_error_t *err)
{
    bool must = staging || a->p.tl == KVR_AGENT_TL_TCP;
    if (!must && !kvr__data_has_cuda(a->data))
        return KVR_OK;
    return kvr__dmem_register_cuda(a->data, r->base, len, &r->mem, err);
}

/* Memory for region r: allocated (alloc) or the engine's (*base); host
 * memory is registered with the data transport, device memory as
 * place_cuda says. */
static kvr_status_t place(kvr_agent_t *a, kvr__aregion_t *r, uint64_t len,
                          bool alloc, bool staging, void **base,
                          kvr_error_t *err)
{
    kvr_status_t st = KVR_OK;
    r->device = a->p.cuda_device >= 0;
    if (r->device && alloc) {
        st = kvr__gpu_arena_alloc(&a->arena, a->p.cuda_device, len, base, err);
        r->owned = st == KVR_OK;
    } else if (alloc) {
        st = kvr__dmem_alloc(a->data, len, base, &r->mem, err);
    } else if (!r->device) {
        st = kvr__dmem_register(a->data, *base, len, &r->mem, err);
    }
    r->base = *base;
    if (st == KVR_OK && r->device)
        st = place_cuda(a, r, len, staging, err);
    return st;
}

/* A region's registration, and its device memory when it was the arena's
 * last carve (a region that failed to come up); the arena keeps the rest
 * until the agent goes. */
static void unplace(kvr_agent_t *a, kvr__aregion_t *r)
{
    kvr__dmem_destroy(r->mem);
    if (r->owned)
        kvr__gpu_arena_undo(&a->arena, r->base, kvr_region_bytes(&r->desc));
    memset(r, 0, sizeof(*r));
}

static kvr_status_t claim_staging(kvr_agent_t *a, const kvr_region_desc_t *d)
{
    a->slot_busy = calloc(d->num_blocks, 1);
    if (a->slot_busy == NULL)
        return fail(KVR_ERR_NO_MEMORY, "no memory");
    a->staging = (int)a->num_regions;
    return KVR_OK;
}

static kvr_status_t add_region(kvr_agent_t *a, const kvr_region_desc_t *desc,
                               void *base, uint32_t flags, void **base_out)
{
    kvr_error_t err = {0};
    if (a == NULL || desc == NULL || (base == NULL && base_out == NULL))
        return fail(KVR_ERR_INVALID, "NULL argument");
    pthread_mutex_lock(&a->turn_lock);
    kvr_status_t st = check_region(a, desc, flags);
    kvr__aregion_t *r = st == KVR_OK ? &a->regions[a->num_regions] : NULL;
    if (r != NULL) {
        memset(r, 0, sizeof(*r));
        st = place(a, r, kvr_region_bytes(desc), base_out != NULL,
                   desc->role == KVR_ROLE_STAGING, &base, &err);
    }
    if (r != NULL && st == KVR_OK && desc->role == KVR_ROLE_STAGING)
        st = claim_staging(a, desc);
    if (r != NULL && st != KVR_OK) {
        r->desc = *desc; /* its length, for the arena */
        unplace(a, r);
        if (err.msg[0])
            fail(st, "%s", err.msg);
    } else if (r != NULL) {
        r->desc = *desc;
        r->consumer_only = flags & KVR_AGENT_REGION_CONSUMER_ONLY;
        a->num_regions++;
        if (base_out != NULL)
            *base_out = base;
    }
    pthread_mutex_unlock(&a->turn_lock);
    return st;
}

kvr_status_t kvr_agent_add_region(kvr_agent_t *agent,
                                  const kvr_region_desc_t *desc, void *base,
                                  uint32_t flags)
{
    return add_region(agent, desc, base, flags, NULL);
}

kvr_status_t kvr_agent_alloc_region(kvr_agent_t *agent,
                                    const kvr_region_desc_t *desc,
                                    uint32_t flags, void **base)
{
    if (base == NULL)
        return fail(KVR_ERR_INVALID, "base is NULL");
    return add_region(agent, desc, NULL, flags, base);
}

bool kvr__region_moves(const kvr__aregion_t *r)
{
    return !r->consumer_only && r->desc.role != KVR_ROLE_STAGING;
}

static int by_layer_role(const void *x, const void *y, void *regions)
{
    const kvr__aregion_t *g = regions;
    const kvr_region_desc_t *p = &g[*(const uint32_t *)x].desc;
    const kvr_region_desc_t *q = &g[*(const uint32_t *)y].desc;
    if (p->layer != q->layer)
        return p->layer < q->layer ? -1 : 1;
    return (p->role > q->role) - (p->role < q->role);
}

/* The regions that move, by (layer, role): producer and consumer plan and
 * stream in this order whatever order they were registered in. */
static void order_regions(kvr_agent_t *a)
{
    a->num_order = 0;
    for (uint32_t i = 0; i < a->num_regions; i++)
        if (kvr__region_moves(&a->regions[i]))
            a->order[a->num_order++] = i;
    qsort_r(a->order, a->num_order, sizeof(a->order[0]), by_layer_role,
            a->regions);
}

/* ---- start and the thread ---- */

static void *thread_main(void *arg)
{
    kvr_agent_t *a = arg;
    while (!__atomic_load_n(&a->stop, __ATOMIC_ACQUIRE))
        kvr__loop_thread_turn(a);
    return NULL;
}

/* The agent's stream and table pool, and the copy kernels loaded with an
 * empty launch each: no request pays module loading or a first table
 * allocation of a size seen before (docs/agent.md, gpu-direct). */
static kvr_status_t gpu_start(kvr_agent_t *a, kvr_error_t *err)
{
    kvr_status_t st = kvr__gpu_stream_create(a->p.cuda_device, &a->stream, err);
    if (st == KVR_OK)
        st = kvr__gpu_pool_create(a->p.cuda_device, a->stream, &a->gpool, err);
    if (st == KVR_OK)
        st = kvr__gpu_warm(a->p.cuda_device, a->stream, err);
    if (st == KVR_OK)
        st = kvr__gpu_stream_create(a->p.cuda_device, &a->nstream, err);
    if (st == KVR_OK)
        st = kvr__gpu_warm(a->p.cuda_device, a->nstream, err);
    void *gs = NULL;
    if (st == KVR_OK)
        st = kvr__gpu_stream_create(a->p.cuda_device, &gs, err);
    if (st == KVR_OK)
        st = kvr__gpu_warm(a->p.cuda_device, gs, err);
    pthread_mutex_lock(&a->gate_lock); /* send_ready reads it, any thread */
    a->gstream = gs;
    pthread_mutex_unlock(&a->gate_lock);
    if (st == KVR_OK)
        st = kvr__gates_watch_start(a, err);
    return st;
}

kvr_status_t kvr_agent_start(kvr_agent_t *a)
{
    kvr_error_t err = {0};
    if (a == NULL)
        return fail(KVR_ERR_INVALID, "agent is NULL");
    pthread_mutex_lock(&a->turn_lock);
    bool staged_consumer = (a->p.role & KVR_AGENT_CONSUMER) &&
                           a->p.executor == KVR_AGENT_EXEC_STAGED;
    kvr_status_t st = KVR_OK;
    if (a->started)
        st = kvr_error_set(&err, KVR_ERR_INVALID, "already started");
    else if (staged_consumer && a->staging < 0)
        st = kvr_error_set(&err, KVR_ERR_INVALID,
                           "executor STAGED: the "
                           "consumer registered no STAGING region");
    order_regions(a);
    if (st == KVR_OK) /* refused combinations fail here, before any link */
        st = kvr__sources_start(a, &err);
    if (st == KVR_OK && a->p.cuda_device >= 0)
        st = gpu_start(a, &err);
    if (st == KVR_OK)
        st = kvr__loop_start(a, &err);
    if (st == KVR_OK)
        a->started = true;
    pthread_mutex_unlock(&a->turn_lock);
    if (st == KVR_OK && a->p.progress_thread) {
        if (pthread_create(&a->thread, NULL, thread_main, a) != 0)
            st = kvr_error_set(&err, KVR_ERR_NO_MEMORY,
                               "cannot start the progress thread");
        else
            a->thread_running = true;
    }
    return st == KVR_OK ? KVR_OK : fail(st, "%s", err.msg);
}

kvr_status_t kvr_agent_progress(kvr_agent_t *a, uint32_t timeout_ms)
{
    if (a == NULL || a->p.progress_thread || !a->started)
        return fail(KVR_ERR_INVALID, "progress needs a started agent created "
                                     "with progress_thread = false");
    if (pthread_mutex_trylock(&a->turn_lock) != 0)
        return fail(KVR_ERR_INVALID, "another thread is in kvr_agent_progress");
    kvr__loop_turn(a, timeout_ms);
    pthread_mutex_unlock(&a->turn_lock);
    return KVR_OK;
}

int kvr_agent_fd(const kvr_agent_t *agent)
{
    return agent ? agent->epoll_fd : -1;
}

int kvr_agent_event_fd(const kvr_agent_t *agent)
{
    return agent ? agent->event_fd : -1;
}

void kvr__agent_wake(kvr_agent_t *a)
{
    uint64_t one = 1;
    ssize_t n = write(a->wake_fd, &one, sizeof(one));
    (void)n; /* EAGAIN: the counter is already non-zero, it is awake */
}

/* ---- commands ---- */

void kvr__cmd_free(kvr__cmd_t *c)
{
    if (c != NULL) {
        free(c->blocks);
        free(c->payload);
    }
    free(c);
}

kvr__cmd_t *kvr__agent_take_commands(kvr_agent_t *a)
{
    pthread_mutex_lock(&a->lock);
    kvr__cmd_t *c = a->inbox_head;
    a->inbox_head = a->inbox_tail = NULL;
    pthread_mutex_unlock(&a->lock);
    return c;
}

static kvr_status_t ids_of(kvr__cmd_t *c, const void *prod, size_t plen,
                           const void *req, size_t rlen)
{
    kvr_error_t err = {0};
    if (prod != NULL && (plen == 0 || plen > KVR_AGENT_INSTANCE_MAX))
        return fail(KVR_ERR_INVALID, "producer id of %zu bytes (1..%u)", plen,
                    KVR_AGENT_INSTANCE_MAX);
    if (prod != NULL)
        kvr_wire_id_set(&c->producer, prod, plen, NULL);
    kvr_status_t st = kvr_wire_id_set(&c->request, req, rlen, &err);
    return st == KVR_OK ? KVR_OK : fail(st, "request id: %s", err.msg);
}

static kvr_status_t copy_blocks(kvr__cmd_t *c, const uint32_t *b, size_t n)
{
    if (n > KVR_WIRE_MAX_BLOCKS)
        return fail(KVR_ERR_WIRE_LIMIT, "%zu blocks > %u", n,
                    KVR_WIRE_MAX_BLOCKS);
    if (n && b == NULL)
        return fail(KVR_ERR_INVALID, "block table NULL with %zu blocks", n);
    c->blocks = malloc((n + 1) * sizeof(*b));
    if (c->blocks == NULL)
        return fail(KVR_ERR_NO_MEMORY, "no memory for %zu blocks", n);
    if (n)
        memcpy(c->blocks, b, n * sizeof(*b));
    c->num_blocks = n;
    return KVR_OK;
}

static kvr__snap_t *snap_find(kvr_agent_t *a, const kvr__key_t *k)
{
    return kvr__map_get(&a->snap, k->b, k->len);
}

/* The inbox's one command when it is a recv whose producer's links are
 * all up (nothing to dial or resolve), else NULL and the inbox stays. */
static kvr__cmd_t *take_ready_recv(kvr_agent_t *a)
{
    pthread_mutex_lock(&a->lock);
    kvr__cmd_t *c = a->inbox_head;
    if (c != NULL && c->next == NULL && c->kind == KVR__CMD_RECV &&
        kvr__pdir_ready_for(a, &c->producer))
        a->inbox_head = a->inbox_tail = NULL;
    else
        c = NULL;
    pthread_mutex_unlock(&a->lock);
    return c;
}

/* A recv started on the calling thread while no thread is in the loop
 * (the progress thread sleeps; without one, no kvr_agent_progress or
 * kvr_agent_wait runs): planned, and its WRITE_REQUESTs written to links
 * already up (never a dial, a lookup or a wait), without waiting for the
 * loop to wake (on a loaded host 10-400 us; the caller waits for LOADED
 * anyway). Not with CUDA memory (its context is the loop's thread's), nor
 * while a turn runs. False: the loop must wake for the command. */
static bool run_inline(kvr_agent_t *a)
{
    if (a->p.cuda_device >= 0 || pthread_mutex_trylock(&a->turn_lock) != 0)
        return false;
    kvr__cmd_t *c = a->started ? take_ready_recv(a) : NULL;
    if (c != NULL) {
        uint64_t deadline = kvr_now_ns() + (uint64_t)c->ms * 1000000ull;
        kvr__recv_command(a, c);
        kvr__cmd_free(c);
        kvr__loop_after_inline(a, deadline);
        /* after its changes: a wait that overlapped them polls again */
        __atomic_add_fetch(&a->inline_turns, 1, __ATOMIC_RELEASE);
    }
    pthread_mutex_unlock(&a->turn_lock);
    return c != NULL;
}

/* Queues c. Opening commands (new = true) claim the key in the snapshot,
 * so that a second open of a live key fails here; others need the key. */
static kvr_status_t enqueue(kvr_agent_t *a, kvr__cmd_t *c, uint8_t side,
                            bool open, int queued_state)
{
    kvr__key_t k;
    kvr__key_make(&k, side,
                  side == KVR__SIDE_SEND ? &a->instance : &c->producer,
                  &c->request);
    kvr_status_t st = KVR_OK;
    pthread_mutex_lock(&a->lock);
    kvr__snap_t *s = snap_find(a, &k);
    if (open && s != NULL)
        st = fail(KVR_ERR_EXISTS,
                  "request '%.*s' is live (its last event "
                  "not yet polled)",
                  (int)c->request.len, c->request.bytes);
    else if (!open && s == NULL)
        st = fail(KVR_ERR_NOT_FOUND, "no request '%.*s'", (int)c->request.len,
                  c->request.bytes);
    else if (open && a->live[side] >= a->p.max_requests)
        st = fail(KVR_ERR_NO_SPACE, "%u requests live", a->live[side]);
    if (st == KVR_OK && open) {
        s = calloc(1, sizeof(*s));
        st = s ? kvr__map_put(&a->snap, k.b, k.len, s) : KVR_ERR_NO_MEMORY;
        if (st == KVR_OK) {
            s->state = queued_state;
            a->live[side]++;
        } else {
            free(s);
            fail(st, "no memory");
        }
    }
    if (st == KVR_OK) {
        if (a->inbox_tail)
            a->inbox_tail->next = c;
        else
            a->inbox_head = c;
        a->inbox_tail = c;
    }
    pthread_mutex_unlock(&a->lock);
    if (st != KVR_OK) {
        if (c->gate != NULL)
            kvr__gate_recycle(a, c->gate);
        kvr__cmd_free(c);
        return st;
    }
    if (side != KVR__SIDE_RECV || !run_inline(a))
        kvr__agent_wake(a);
    return KVR_OK;
}

static kvr_status_t new_cmd(kvr_agent_t *a, kvr_agent_role_t role,
                            kvr__cmd_kind_t kind, kvr__cmd_t **out)
{
    if (a == NULL)
        return fail(KVR_ERR_INVALID, "agent is NULL");
    if (role != KVR_AGENT_BOTH && !(a->p.role & role))
        return fail(KVR_ERR_INVALID, "a %s call on an agent that is not a %s",
                    role == KVR_AGENT_PRODUCER ? "producer" : "consumer",
                    role == KVR_AGENT_PRODUCER ? "producer" : "consumer");
    if (!a->started)
        return fail(KVR_ERR_INVALID, "the agent is not started");
    *out = calloc(1, sizeof(**out));
    if (*out == NULL)
        return fail(KVR_ERR_NO_MEMORY, "no memory");
    (*out)->kind = kind;
    return KVR_OK;
}

kvr_status_t kvr_agent_send_open(kvr_agent_t *a, const kvr_agent_send_t *s)
{
    kvr__cmd_t *c = NULL;
    if (s == NULL)
        return fail(KVR_ERR_INVALID, "send is NULL");
    kvr_status_t st = new_cmd(a, KVR_AGENT_PRODUCER, KVR__CMD_SEND_OPEN, &c);
    if (st != KVR_OK)
        return st;
    st = ids_of(c, NULL, 0, s->request_id, s->request_id_len);
    if (st == KVR_OK)
        st = copy_blocks(c, s->src_blocks, s->num_src_blocks);
    if (st == KVR_OK && s->groups > KVR_AGENT_MAX_GROUPS)
        st = fail(KVR_ERR_INVALID, "groups %u > %u", s->groups,
                  KVR_AGENT_MAX_GROUPS);
    if (st == KVR_OK && s->lease_ms > KVR_WIRE_DEADLINE_MAX_MS)
        st = fail(KVR_ERR_INVALID, "lease %u ms > %u", s->lease_ms,
                  KVR_WIRE_DEADLINE_MAX_MS);
    if (st != KVR_OK) {
        kvr__cmd_free(c);
        return st;
    }
    c->num_tokens = s->num_tokens;
    c->ms = s->lease_ms ? s->lease_ms : a->p.lease_ms;
    c->groups = s->groups ? s->groups : 1;
    return enqueue(a, c, KVR__SIDE_SEND, true, KVR_SEND_QUEUED);
}

static kvr_status_t send_cmd(kvr_agent_t *a, kvr__cmd_kind_t kind,
                             const void *req, size_t rlen, kvr__cmd_t **out)
{
    kvr_status_t st = new_cmd(a, KVR_AGENT_PRODUCER, kind, out);
    if (st == KVR_OK && (st = ids_of(*out, NULL, 0, req, rlen)) != KVR_OK)
        kvr__cmd_free(*out);
    return st;
}

kvr_status_t kvr_agent_send_ready(kvr_agent_t *a, const void *req, size_t rlen,
                                  uint32_t layer_begin, uint32_t layer_end,
                                  void *cuda_event)
{
    kvr_error_t err = {0};
    if (layer_begin >= layer_end)
        return fail(KVR_ERR_INVALID, "layer range [%u, %u) is empty",
                    layer_begin, layer_end);
    kvr__cmd_t *c = NULL;
    kvr_status_t st = send_cmd(a, KVR__CMD_SEND_READY, req, rlen, &c);
    if (st != KVR_OK)
        return st;
    if (cuda_event != NULL && a->p.cuda_device < 0)
        st = fail(KVR_ERR_UNSUPPORTED, "a CUDA event, but this agent's KV is "
                                       "in host memory");
    /* now, on the calling thread: the gate waits for the work the event
     * recorded as of this call, on the gate stream, and the layers are
     * ready once it completed (agent_gates.c; no host synchronisation) */
    else if (cuda_event != NULL &&
             kvr__gate_arm(a, cuda_event, &c->gate, &err) != KVR_OK)
        st = fail(err.code, "%s", err.msg);
    if (st != KVR_OK) {
        kvr__cmd_free(c);
        return st;
    }
    c->layer_begin = layer_begin;
    c->layer_end = layer_end;
    return enqueue(a, c, KVR__SIDE_SEND, false, 0);
}

kvr_status_t kvr_agent_send_abort(kvr_agent_t *a, const void *req, size_t rlen)
{
    kvr__cmd_t *c = NULL;
    kvr_status_t st = send_cmd(a, KVR__CMD_SEND_ABORT, req, rlen, &c);
    return st == KVR_OK ? enqueue(a, c, KVR__SIDE_SEND, false, 0) : st;
}

kvr_status_t kvr_agent_recv(kvr_agent_t *a, const kvr_agent_recv_t *r)
{
    kvr__cmd_t *c = NULL;
    kvr_error_t err = {0};
    if (r == NULL || r->producer_id == NULL)
        return fail(KVR_ERR_INVALID, "recv or its producer id is NULL");
    kvr_status_t st = new_cmd(a, KVR_AGENT_CONSUMER, KVR__CMD_RECV, &c);
    if (st != KVR_OK)
        return st;
    st = ids_of(c, r->producer_id, r->producer_id_len, r->request_id,
                r->request_id_len);
    if (st == KVR_OK)
        st = copy_spec(c->address, r->producer_address, "producer", &err);
    if (st == KVR_OK && c->address[0] == '\0')
        st = kvr_error_set(&err, KVR_ERR_INVALID, "producer address is NULL");
    if (st != KVR_OK && err.msg[0])
        fail(st, "%s", err.msg);
    if (st == KVR_OK)
        st = copy_blocks(c, r->dst_blocks, r->num_dst_blocks);
    if (st == KVR_OK && r->deadline_ms > KVR_WIRE_DEADLINE_MAX_MS)
        st = fail(KVR_ERR_INVALID, "deadline %u ms > %u", r->deadline_ms,
                  KVR_WIRE_DEADLINE_MAX_MS);
    if (st != KVR_OK) {
        kvr__cmd_free(c);
        return st;
    }
    c->num_tokens = r->num_tokens;
    c->num_computed = r->num_computed_blocks;
    c->ms = r->deadline_ms ? r->deadline_ms : a->p.deadline_ms;
    c->stream = r->stream;
    return enqueue(a, c, KVR__SIDE_RECV, true, KVR_RECV_QUEUED);
}

kvr_status_t kvr_agent_recv_abort(kvr_agent_t *a, const void *prod, size_t plen,
                                  const void *req, size_t rlen)
{
    kvr__cmd_t *c = NULL;
    if (prod == NULL)
        return fail(KVR_ERR_INVALID, "producer id is NULL");
    kvr_status_t st = new_cmd(a, KVR_AGENT_CONSUMER, KVR__CMD_RECV_ABORT, &c);
    if (st == KVR_OK && (st = ids_of(c, prod, plen, req, rlen)) != KVR_OK)
        kvr__cmd_free(c);
    return st == KVR_OK ? enqueue(a, c, KVR__SIDE_RECV, false, 0) : st;
}

/* Queued like a request command, but no key is claimed: notifications
 * are not requests. */
static void enqueue_plain(kvr_agent_t *a, kvr__cmd_t *c)
{
    pthread_mutex_lock(&a->lock);
    if (a->inbox_tail)
        a->inbox_tail->next = c;
    else
        a->inbox_head = c;
    a->inbox_tail = c;
    pthread_mutex_unlock(&a->lock);
    kvr__agent_wake(a);
}

kvr_status_t kvr_agent_notify(kvr_agent_t *a, const void *peer, size_t plen,
                              const char *address, const void *payload,
                              size_t len)
{
    kvr__cmd_t *c = NULL;
    kvr_error_t err = {0};
    if (peer == NULL || plen == 0 || plen > KVR_AGENT_INSTANCE_MAX)
        return fail(KVR_ERR_INVALID, "peer instance id of %zu bytes (1..%u)",
                    peer ? plen : 0, KVR_AGENT_INSTANCE_MAX);
    if (len > KVR_AGENT_NOTIFY_MAX || (payload == NULL && len > 0))
        return fail(KVR_ERR_INVALID,
                    "notification payload of %zu bytes%s "
                    "(0..%u)",
                    len, payload ? "" : " at NULL", KVR_AGENT_NOTIFY_MAX);
    kvr_status_t st = new_cmd(a, KVR_AGENT_BOTH, KVR__CMD_NOTIFY, &c);
    if (st != KVR_OK)
        return st;
    st = copy_spec(c->address, address, "peer", &err);
    c->payload = st == KVR_OK ? malloc(len + 1) : NULL;
    if (st == KVR_OK && c->payload == NULL)
        st = kvr_error_set(&err, KVR_ERR_NO_MEMORY, "no memory for %zu bytes",
                           len);
    if (st != KVR_OK) {
        kvr__cmd_free(c);
        return fail(st, "%s", err.msg);
    }
    kvr_wire_id_set(&c->producer, peer, plen, NULL);
    if (len)
        memcpy(c->payload, payload, len);
    c->payload_len = len;
    enqueue_plain(a, c);
    return KVR_OK;
}

/* ---- events and the snapshot (the loop's side) ---- */

static bool is_final(kvr_agent_event_kind_t k)
{
    return k == KVR_AGENT_SENT || k == KVR_AGENT_SEND_EXPIRED ||
           k == KVR_AGENT_SEND_FAILED || k == KVR_AGENT_RELEASED;
}

static uint8_t side_of(kvr_agent_event_kind_t k)
{
    return k <= KVR_AGENT_SEND_FAILED ? KVR__SIDE_SEND : KVR__SIDE_RECV;
}

/* event_fd is readable while either queue holds something: it is written
 * when the first entry arrives and drained (under lock) when a poll finds
 * or leaves both empty. The write comes after the lock is let go: an
 * engine thread it wakes on this core would otherwise run only to block
 * on the lock the loop still holds. A poll between the two finds the
 * entry; the write then wakes once for nothing, and the next poll drains. */
static bool was_idle(const kvr_agent_t *a)
{
    return a->ev_head == NULL && a->nt_head == NULL;
}

/* Under lock, before an entry is queued: true when it is the first, whose
 * signal_events is then owed. */
static bool first_entry(kvr_agent_t *a)
{
    bool first = was_idle(a);
    a->signal_owed += first;
    return first;
}

static void signal_events(kvr_agent_t *a, bool first)
{
    if (first) {
        uint64_t one = 1;
        ssize_t n = write(a->event_fd, &one, sizeof(one));
        (void)n;
    }
}

/* A read only while a write is owed: the poll that empties the queues
 * reads it, the ones after do not (a syscall less each). The counter read
 * is the writes that landed; those still to come stay owed, so a write
 * that lands after the queue emptied is read by the next poll. */
static void drain_if_idle(kvr_agent_t *a)
{
    uint64_t v = 0;
    if (a->signal_owed > 0 && was_idle(a) &&
        read(a->event_fd, &v, sizeof(v)) == (ssize_t)sizeof(v))
        a->signal_owed -= v < a->signal_owed ? v : a->signal_owed;
}

/* Under lock; true when the queues were empty (signal_events after it). */
static bool push_event(kvr_agent_t *a, kvr__event_node_t *e)
{
    bool first = first_entry(a);
    if (a->ev_tail)
        a->ev_tail->next = e;
    else
        a->ev_head = e;
    a->ev_tail = e;
    return first;
}

static void request_event(kvr_agent_t *a, kvr_agent_event_kind_t kind,
                          const kvr_wire_id_t *producer,
                          const kvr_wire_id_t *request, kvr_status_t st,
                          const char *msg, uint64_t bytes, uint32_t begin,
                          uint32_t end)
{
    kvr__event_node_t *e = calloc(1, sizeof(*e));
    if (e == NULL)
        abort(); /* an outcome that cannot be reported breaks the contract */
    e->ev.kind = kind;
    e->ev.producer = *producer;
    e->ev.request = *request;
    e->ev.status = st;
    e->ev.bytes = bytes;
    e->ev.layer_begin = begin;
    e->ev.layer_end = end;
    snprintf(e->ev.message, sizeof(e->ev.message), "%s", msg ? msg : "");
    e->final = is_final(kind);
    kvr__key_make(&e->key, side_of(kind), producer, request);
    pthread_mutex_lock(&a->lock);
    kvr__snap_t *s = snap_find(a, &e->key);
    if (s != NULL && e->final)
        s->final_queued = true;
    bool first = push_event(a, e);
    pthread_mutex_unlock(&a->lock);
    signal_events(a, first);
}

void kvr__agent_event(kvr_agent_t *a, kvr_agent_event_kind_t kind,
                      const kvr_wire_id_t *producer,
                      const kvr_wire_id_t *request, kvr_status_t st,
                      const char *msg, uint64_t bytes)
{
    request_event(a, kind, producer, request, st, msg, bytes, 0, 0);
}

void kvr__agent_layers_loaded(kvr_agent_t *a, const kvr_wire_id_t *producer,
                              const kvr_wire_id_t *request, uint32_t begin,
                              uint32_t end, uint64_t bytes)
{
    request_event(a, KVR_AGENT_LAYERS_LOADED, producer, request, KVR_OK, "",
                  bytes, begin, end);
}

static void peer_event(kvr_agent_t *a, kvr_agent_event_kind_t kind,
                       const kvr_wire_id_t *peer, kvr_status_t st,
                       const char *msg, size_t len)
{
    kvr__event_node_t *e = calloc(1, sizeof(*e));
    if (e == NULL)
        abort(); /* as kvr__agent_event */
    e->ev.kind = kind;
    e->ev.peer = *peer;
    e->ev.status = st;
    e->ev.bytes = len;
    snprintf(e->ev.message, sizeof(e->ev.message), "%s", msg);
    pthread_mutex_lock(&a->lock);
    bool first = push_event(a, e);
    pthread_mutex_unlock(&a->lock);
    signal_events(a, first);
}

void kvr__agent_notify_failed(kvr_agent_t *a, const kvr_wire_id_t *peer,
                              kvr_status_t st, const char *msg, size_t len)
{
    peer_event(a, KVR_AGENT_NOTIFY_FAILED, peer, st, msg, len);
}

void kvr__agent_peer_refused(kvr_agent_t *a, const kvr_wire_id_t *peer,
                             bool known, kvr_status_t st, const char *msg)
{
    peer_event(a, KVR_AGENT_PEER_REFUSED, peer, st, msg, known);
}

void kvr__agent_notify_in(kvr_agent_t *a, kvr__notify_node_t *n)
{
    pthread_mutex_lock(&a->lock);
    bool full = a->nt_count >= KVR_AGENT_NOTIFY_QUEUE ||
                a->nt_bytes + n->len > KVR_AGENT_NOTIFY_QUEUE_BYTES;
    bool first = !full && first_entry(a);
    if (full) {
        a->nt_dropped++;
    } else {
        n->dropped = a->nt_dropped;
        a->nt_dropped = 0;
        a->nt_count++;
        a->nt_bytes += n->len;
        if (a->nt_tail)
            a->nt_tail->next = n;
        else
            a->nt_head = n;
        a->nt_tail = n;
    }
    pthread_mutex_unlock(&a->lock);
    signal_events(a, first);
    if (full)
        free(n);
}

void kvr__agent_snap(kvr_agent_t *a, uint8_t side,
                     const kvr_wire_id_t *producer,
                     const kvr_wire_id_t *request, int state, kvr_status_t st,
                     const char *msg)
{
    kvr__key_t k;
    kvr__key_make(&k, side, producer, request);
    pthread_mutex_lock(&a->lock);
    kvr__snap_t *s = snap_find(a, &k);
    if (s != NULL) {
        s->state = state;
        s->status = st;
        snprintf(s->message, sizeof(s->message), "%s", msg ? msg : "");
    }
    pthread_mutex_unlock(&a->lock);
}

bool kvr_agent_poll(kvr_agent_t *a, kvr_agent_event_t *out)
{
    if (a == NULL || out == NULL)
        return false;
    pthread_mutex_lock(&a->lock);
    kvr__event_node_t *e = a->ev_head;
    if (e != NULL) {
        a->ev_head = e->next;
        if (a->ev_head == NULL)
            a->ev_tail = NULL;
    }
    drain_if_idle(a); /* also a signal that came after its entry left */
    if (e != NULL) {
        /* the last event of a request frees its key */
        if (e->final && kvr__map_get(&a->snap, e->key.b, e->key.len)) {
            free(kvr__map_del(&a->snap, e->key.b, e->key.len));
            a->live[e->key.b[0]]--;
        }
    }
    pthread_mutex_unlock(&a->lock);
    if (e == NULL)
        return false;
    *out = e->ev;
    free(e);
    return true;
}

/* True when an event or notification is queued. */
static bool has_event(kvr_agent_t *a)
{
    pthread_mutex_lock(&a->lock);
    bool any = !was_idle(a);
    pthread_mutex_unlock(&a->lock);
    return any;
}

/* Without a progress thread the caller's wait runs the loop itself while
 * no other thread is in it: the answer that completes a load is handled
 * on the thread that waits for it (docs/agent.md, Threading rules). */
static bool wait_driving(kvr_agent_t *a, uint64_t until)
{
    if (a->p.progress_thread || pthread_mutex_trylock(&a->turn_lock) != 0)
        return false;
    kvr__loop_wait_turns(a, until, has_event);
    pthread_mutex_unlock(&a->turn_lock);
    return true;
}

#define WAIT_RETRY_NS 1000000ull /* without a thread: drive again by then */

/* Until the event fd is readable or `until`; without a progress thread
 * (another thread was in the loop) for a millisecond at most, then the
 * caller tries to drive again. A signal left with nothing queued is read
 * here, or the wait would spin on it. */
static void wait_event_fd(kvr_agent_t *a, uint64_t until)
{
    struct pollfd p = {a->event_fd, POLLIN, 0};
    uint64_t now = kvr_now_ns();
    if (!a->p.progress_thread && until > now + WAIT_RETRY_NS)
        until = now + WAIT_RETRY_NS;
    uint64_t ns = until > now ? until - now : 0;
    struct timespec ts = {(time_t)(ns / 1000000000u), (long)(ns % 1000000000u)};
    if (ppoll(&p, 1, &ts, NULL) == 1) {
        pthread_mutex_lock(&a->lock);
        drain_if_idle(a);
        pthread_mutex_unlock(&a->lock);
    }
}

kvr_status_t kvr_agent_wait(kvr_agent_t *a, uint32_t timeout_us)
{
    if (a == NULL || !a->started)
        return fail(KVR_ERR_INVALID, "wait needs a started agent");
    uint64_t until = kvr_now_ns() + (uint64_t)timeout_us * 1000u;
    while (!has_event(a)) {
        if (kvr_now_ns() >= until)
            return fail(KVR_ERR_TIMEOUT, "no event within %u us", timeout_us);
        if (!wait_driving(a, until))
            wait_event_fd(a, until);
    }
    return KVR_OK;
}

bool kvr_agent_poll_notify(kvr_agent_t *a, kvr_agent_notify_t *out)
{
    if (a == NULL || out == NULL)
        return false;
    pthread_mutex_lock(&a->lock);
    kvr__notify_node_t *n = a->nt_head;
    if (n != NULL) {
        a->nt_head = n->next;
        if (a->nt_head == NULL)
            a->nt_tail = NULL;
        a->nt_count--;
        a->nt_bytes -= n->len;
    }
    drain_if_idle(a); /* also a signal that came after its entry left */
    pthread_mutex_unlock(&a->lock);
    if (n == NULL)
        return false;
    out->sender = n->sender;
    out->sender_topo = n->topo;
    out->sender_side = n->side;
    out->sender_incarnation = n->incarnation;
    snprintf(out->sender_address, sizeof(out->sender_address), "%s",
             n->address);
    out->dropped = n->dropped;
    out->len = n->len;
    memcpy(out->payload, n->payload, n->len);
    free(n);
    return true;
}

kvr_status_t kvr_agent_status(kvr_agent_t *a, const void *prod, size_t plen,
                              const void *req, size_t rlen,
                              kvr_agent_req_status_t *out)
{
    kvr__cmd_t c;
    memset(&c, 0, sizeof(c));
    if (a == NULL || out == NULL || prod == NULL)
        return fail(KVR_ERR_INVALID, "NULL argument");
    kvr_status_t st = ids_of(&c, prod, plen, req, rlen);
    if (st != KVR_OK)
        return st;
    kvr_agent_req_status_t r;
    memset(&r, 0, sizeof(r));
    kvr__key_t ks, kr;
    kvr__key_make(&ks, KVR__SIDE_SEND, &c.producer, &c.request);
    kvr__key_make(&kr, KVR__SIDE_RECV, &c.producer, &c.request);
    bool mine = kvr_wire_id_equal(&c.producer, &a->instance);
    pthread_mutex_lock(&a->lock);
    const kvr__snap_t *s = mine ? snap_find(a, &ks) : NULL;
    const kvr__snap_t *q = snap_find(a, &kr);
    if (s != NULL)
        r.send = (kvr_agent_send_state_t)s->state;
    if (q != NULL)
        r.recv = (kvr_agent_recv_state_t)q->state;
    const kvr__snap_t *w = q ? q : s;
    if (w != NULL) {
        r.status = w->status;
        memcpy(r.message, w->message, sizeof(r.message));
    }
    pthread_mutex_unlock(&a->lock);
    if (w == NULL)
        return fail(KVR_ERR_NOT_FOUND, "no request '%.*s' of '%.*s'",
                    (int)c.request.len, c.request.bytes, (int)c.producer.len,
                    c.producer.bytes);
    *out = r;
    return KVR_OK;
}

/* ---- names ---- */

const char *kvr_agent_event_name(kvr_agent_event_kind_t kind)
{
    static const char *const names[] = {
        [KVR_AGENT_SENT] = "SENT",
        [KVR_AGENT_SEND_EXPIRED] = "SEND_EXPIRED",
        [KVR_AGENT_SEND_FAILED] = "SEND_FAILED",
        [KVR_AGENT_LOADED] = "LOADED",
        [KVR_AGENT_LOAD_FAILED] = "LOAD_FAILED",
        [KVR_AGENT_RELEASED] = "RELEASED",
        [KVR_AGENT_LAYERS_LOADED] = "LAYERS_LOADED",
        [KVR_AGENT_NOTIFY_FAILED] = "NOTIFY_FAILED",
        [KVR_AGENT_PEER_REFUSED] = "PEER_REFUSED",
    };
    unsigned k = (unsigned)kind;
    return k < sizeof(names) / sizeof(names[0]) && names[k] ? names[k] : "?";
}

const char *kvr_agent_send_state_name(kvr_agent_send_state_t state)
{
    static const char *const names[] = {"NONE", "QUEUED",  "OPEN",  "READY",
                                        "SENT", "EXPIRED", "FAILED"};
    unsigned s = (unsigned)state;
    return s < sizeof(names) / sizeof(names[0]) ? names[s] : "?";
}

const char *kvr_agent_recv_state_name(kvr_agent_recv_state_t state)
{
    static const char *const names[] = {"NONE",    "QUEUED",     "DIALING",
                                        "PULLING", "QUARANTINE", "LOADED",
                                        "FAILED"};
    unsigned s = (unsigned)state;
    return s < sizeof(names) / sizeof(names[0]) ? names[s] : "?";
}

void kvr__agent_set_frame_fault(kvr_agent_t *a, kvr_msg_type_t type,
                                uint32_t nth, kvr__fault_mode_t mode)
{
    pthread_mutex_lock(&a->turn_lock); /* the loop reads it in its turns */
    a->fault = (kvr__frame_fault_t){type, nth, mode, 0};
    pthread_mutex_unlock(&a->turn_lock);
}

uint64_t kvr__agent_chunks(kvr_agent_t *a)
{
    pthread_mutex_lock(&a->turn_lock); /* the loop writes it */
    uint64_t n = a->chunks_moved;
    pthread_mutex_unlock(&a->turn_lock);
    return n;
}

uint32_t kvr__agent_probing(kvr_agent_t *a)
{
    pthread_mutex_lock(&a->turn_lock); /* the loop writes it */
    uint32_t n = a->probing;
    pthread_mutex_unlock(&a->turn_lock);
    return n;
}

uint64_t kvr__agent_inline_recvs(kvr_agent_t *a)
{
    return __atomic_load_n(&a->inline_turns, __ATOMIC_ACQUIRE);
}

void kvr__agent_direct_bytes(kvr_agent_t *a, uint64_t *stored, uint64_t *put)
{
    *stored = *put = 0;
    pthread_mutex_lock(&a->turn_lock); /* the loop writes them */
    for (kvr__alink_t *l = a->links; l != NULL; l = l->next)
        kvr__dpeer_counts(l->data, stored, put);
    pthread_mutex_unlock(&a->turn_lock);
}

uint32_t kvr__agent_refusals(kvr_agent_t *a, kvr_status_t *status, char *why,
                             size_t cap)
{
    pthread_mutex_lock(&a->turn_lock); /* the loop writes them */
    uint32_t n = a->refusals;
    *status = a->refusal_status;
    snprintf(why, cap, "%s", a->refusal_why);
    pthread_mutex_unlock(&a->turn_lock);
    return n;
}
