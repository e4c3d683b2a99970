/* The connector's data path over the xfer layer (see data.h). */
#include "data.h"

#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kvrelay/xfer.h"

#define MAX_MAPPINGS 4096u

struct kvr__data {
    kvr_transport_t *t;
    int tl;
};

struct kvr__dmem {
    kvr_mem_t *mem;
};

struct kvr__dpeer {
    kvr__data_t *d;
    kvr_ep_t *ep;
    kvr_rmem_t *maps[MAX_MAPPINGS];
    uint8_t *stores[MAX_MAPPINGS]; /* mapped peer memory, or NULL: puts */
    uint32_t num_maps;
    bool unflushed;        /* put_some posted puts no flush waited for */
    uint64_t stored_bytes; /* moved by stores into mapped memory */
    uint64_t put_bytes;    /* moved by put_some's puts */
    kvr_mem_t *pack;       /* registered bounce buffer for staged chunks */
    kvr_cost_model_t model;
    kvr_cost_run_t *probe; /* measuring the model, or NULL */
};

kvr_status_t kvr__data_create(int tl, bool progress_thread, bool cuda,
                              kvr__data_t **out, kvr_error_t *err)
{
    kvr__data_t *d = calloc(1, sizeof(*d));
    if (d == NULL)
        return kvr_error_set(err, KVR_ERR_NO_MEMORY, "no memory");
    kvr_ucx_params_t p = KVR_UCX_PARAMS_INIT;
    p.tl = (kvr_xfer_tl_t)tl;
    p.progress = progress_thread ? KVR_XFER_PROGRESS_THREAD
                                 : KVR_XFER_PROGRESS_CALLER;
    p.cuda = cuda;
    kvr_status_t st = kvr_transport_ucx_create(&p, &d->t, err);
    if (st != KVR_OK) {
        free(d);
        return st;
    }
    d->tl = tl;
    *out = d;
    return KVR_OK;
}

kvr_status_t kvr__data_create_loopback(struct kvr_transport *hub,
                                       const struct kvr_loopback_params *p,
                                       kvr__data_t **out, kvr_error_t *err)
{
    kvr__data_t *d = calloc(1, sizeof(*d));
    if (d == NULL)
        return kvr_error_set(err, KVR_ERR_NO_MEMORY, "no memory");
    kvr_status_t st = kvr_transport_loopback_create(hub, p, &d->t, err);
    if (st != KVR_OK) {
        free(d);
        return st;
    }
    *out = d;
    return KVR_OK;
}

const char *kvr__data_ucx_version(void)
{
    return kvr_xfer_ucx_version();
}

bool kvr__data_has_cuda(const kvr__data_t *d)
{
    return d != NULL && kvr_xfer_has_cuda(d->t);
}

void kvr__data_destroy(kvr__data_t *d)
{
    if (d == NULL)
        return;
    kvr_transport_destroy(d->t);
    free(d);
}

kvr_status_t kvr__data_address(kvr__data_t *d, const void **addr, size_t *len)
{
    return kvr_xfer_address(d->t, addr, len);
}

static kvr_status_t wrap_mem(kvr_status_t st, kvr_mem_t *mem, kvr__dmem_t **out,
                             kvr_error_t *err, const char *what, uint64_t len)
{
    if (st != KVR_OK)
        return kvr_error_set(err, st, "%s %llu bytes: %s", what,
                             (unsigned long long)len, kvr_status_str(st));
    kvr__dmem_t *m = calloc(1, sizeof(*m));
    if (m == NULL) {
        kvr_mem_destroy(mem);
        return kvr_error_set(err, KVR_ERR_NO_MEMORY, "no memory");
    }
    m->mem = mem;
    *out = m;
    return KVR_OK;
}

kvr_status_t kvr__dmem_register(kvr__data_t *d, void *base, uint64_t len,
                                kvr__dmem_t **out, kvr_error_t *err)
{
    kvr_mem_t *mem = NULL;
    kvr_status_t st = kvr_mem_register(d->t, base, len, &mem);
    return wrap_mem(st, mem, out, err, "registering", len);
}

kvr_status_t kvr__dmem_register_cuda(kvr__data_t *d, void *base, uint64_t len,
                                     kvr__dmem_t **out, kvr_error_t *err)
{
    kvr_mem_t *mem = NULL;
    kvr_status_t st =
        kvr_mem_register_kind(d->t, base, len, KVR_MEM_CUDA, &mem, err);
    if (st != KVR_OK)
        return st; /* err names the UCX */
    return wrap_mem(st, mem, out, err, "registering", len);
}

kvr_status_t kvr__dmem_alloc(kvr__data_t *d, uint64_t len, void **base,
                             kvr__dmem_t **out, kvr_error_t *err)
{
    kvr_mem_t *mem = NULL;
    kvr_status_t st = kvr_mem_alloc(d->t, len, &mem);
    st = wrap_mem(st, mem, out, err, "allocating", len);
    if (st == KVR_OK)
        *base = kvr_mem_addr(mem);
    return st;
}

void kvr__dmem_destroy(kvr__dmem_t *m)
{
    if (m == NULL)
        return;
    kvr_mem_destroy(m->mem);
    free(m);
}

kvr_status_t kvr__dmem_rkey(kvr__dmem_t *m, uint8_t *rkey, uint32_t *len)
{
    kvr_remote_region_t r;
    kvr_status_t st = kvr_mem_pack(m->mem, &r);
    if (st != KVR_OK)
        return st;
    if (r.rkey_len > KVR_DATA_RKEY_MAX)
        return KVR_ERR_NO_SPACE;
    memcpy(rkey, r.rkey, r.rkey_len);
    *len = r.rkey_len;
    return KVR_OK;
}

/* Until probed: per-put cost and bandwidth measured on UCX 1.13
 * (docs/transport.md, "Measured UCX 1.13 behaviour"). */
static kvr_cost_model_t default_model(int tl)
{
    kvr_cost_model_t m = {.put_s = 0.35e-6,
                          .put_Bps = 5e9,
                          .chunk_s = 50e-6,
                          .stage_Bps = 5e9,
                          .copy_Bps = 6e9,
                          .mapped = false};
    if (tl == 2) {
        m.put_s = 6e-6;
        m.put_Bps = 0.9e9;
        m.stage_Bps = 0.9e9;
        m.chunk_s = 100e-6;
    }
    return m;
}

kvr_status_t kvr__dpeer_open(kvr__data_t *d, const void *addr, size_t len,
                             kvr__dpeer_t **out, kvr_error_t *err)
{
    kvr__dpeer_t *p = calloc(1, sizeof(*p));
    if (p == NULL)
        return kvr_error_set(err, KVR_ERR_NO_MEMORY, "no memory");
    p->d = d;
    p->model = default_model(d->tl);
    kvr_status_t st = kvr_ep_create(d->t, addr, len, &p->ep);
    if (st != KVR_OK) {
        free(p);
        return kvr_error_set(err, st, "endpoint to the consumer: %s",
                             kvr_xfer_last_error(d->t));
    }
    *out = p;
    return KVR_OK;
}

void kvr__dpeer_close(kvr__dpeer_t *p)
{
    if (p == NULL)
        return;
    kvr_cost_free(p->probe); /* before the scratch mapping it puts into */
    for (uint32_t i = 0; i < p->num_maps; i++)
        kvr_rmem_close(p->maps[i]);
    kvr_mem_destroy(p->pack);
    kvr_ep_destroy(p->ep);
    free(p);
}

void kvr__dpeer_fail(kvr__dpeer_t *p, kvr_status_t st)
{
    if (p != NULL && p->ep != NULL)
        kvr_ep_fail(p->ep, st);
}

kvr_status_t kvr__dpeer_map(kvr__dpeer_t *p, uint64_t base, uint64_t len,
                            const uint8_t *rkey, uint32_t rkey_len,
                            uint32_t *index, kvr_error_t *err)
{
    if (p->num_maps == MAX_MAPPINGS || rkey_len > KVR_XFER_RKEY_MAX)
        return kvr_error_set(err, KVR_ERR_NO_SPACE,
                             "%u mappings or rkey of %u "
                             "bytes",
                             p->num_maps, rkey_len);
    kvr_remote_region_t r = {.base = base, .length = len, .rkey_len = rkey_len};
    memcpy(r.rkey, rkey, rkey_len);
    kvr_status_t st = kvr_rmem_open(p->ep, &r, &p->maps[p->num_maps]);
    if (st != KVR_OK)
        return kvr_error_set(err, st,
                             "remote region at 0x%llx (%llu bytes): %s",
                             (unsigned long long)base, (unsigned long long)len,
                             kvr_xfer_last_error(p->d->t));
    *index = p->num_maps++;
    return KVR_OK;
}

bool kvr__dpeer_map_stores(kvr__dpeer_t *p, uint32_t index)
{
    void *base = NULL;
    if (index >= p->num_maps || kvr_rmem_map(p->maps[index], &base) != KVR_OK)
        return false;
    p->stores[index] = base;
    return true;
}

void kvr__dpeer_counts(const kvr__dpeer_t *p, uint64_t *stored,
                       uint64_t *put)
{
    *stored += p ? p->stored_bytes : 0;
    *put += p ? p->put_bytes : 0;
}

/* xfer's segment view of ours; caller frees. */
static kvr_xfer_seg_t *to_xfer(const kvr__dpeer_t *p, const kvr__dseg_t *segs,
                               size_t n)
{
    kvr_xfer_seg_t *x = calloc(n + 1, sizeof(*x));
    for (size_t i = 0; x != NULL && i < n; i++)
        x[i] = (kvr_xfer_seg_t){
            segs[i].plan, segs[i].src,
            p && segs[i].remote < p->num_maps ? p->maps[segs[i].remote] : NULL,
            segs[i].dst_local};
    return x;
}

uint64_t kvr__dseg_bytes(const kvr__dseg_t *segs, size_t n)
{
    uint64_t b = 0;
    for (size_t i = 0; i < n; i++)
        b += segs[i].plan ? kvr_plan_bytes(segs[i].plan) : segs[i].bytes;
    return b;
}

static kvr_status_t put_error(kvr__dpeer_t *p, kvr_status_t st,
                              kvr_error_t *err, const char *what)
{
    return kvr_error_set(err, st, "%s: %s (%s)", what, kvr_status_name(st),
                         kvr_xfer_last_error(p->d->t));
}

kvr_status_t kvr__data_send_direct(kvr__dpeer_t *p, const kvr__dseg_t *segs,
                                   size_t n, uint64_t deadline_ns,
                                   kvr_error_t *err)
{
    kvr_status_t st = KVR_OK;
    for (size_t s = 0; s < n && st == KVR_OK; s++) {
        size_t nr = 0;
        const kvr_run_t *runs = kvr_plan_runs(segs[s].plan, &nr);
        if (segs[s].remote >= p->num_maps)
            return kvr_error_set(err, KVR_ERR_INVALID, "mapping %u",
                                 segs[s].remote);
        kvr_rmem_t *dst = p->maps[segs[s].remote];
        const uint8_t *src = segs[s].src;
        for (size_t i = 0; i < nr && st == KVR_OK; i++)
            st = kvr_xfer_put(p->ep, src + runs[i].src, runs[i].len, dst,
                              runs[i].dst, deadline_ns);
    }
    if (st == KVR_OK)
        st = kvr_xfer_flush(p->ep, deadline_ns);
    return st == KVR_OK ? KVR_OK : put_error(p, st, err, "direct transfer");
}

kvr_status_t kvr__data_put_some(kvr__dpeer_t *p, const kvr__dseg_t *segs,
                                size_t n, kvr__dcursor_t *cur,
                                uint64_t max_bytes, uint64_t deadline_ns,
                                bool *done, uint64_t *moved, kvr_error_t *err)
{
    uint64_t posted = 0;
    kvr_status_t st = KVR_OK;
    while (cur->seg < n && posted < max_bytes && st == KVR_OK) {
        size_t nr = 0;
        const kvr_run_t *runs = kvr_plan_runs(segs[cur->seg].plan, &nr);
        if (cur->run >= nr) {
            cur->seg++;
            cur->run = 0;
            continue;
        }
        if (segs[cur->seg].remote >= p->num_maps)
            return kvr_error_set(err, KVR_ERR_INVALID, "mapping %u",
                                 segs[cur->seg].remote);
        uint32_t m = segs[cur->seg].remote;
        const uint8_t *src = segs[cur->seg].src;
        if (p->stores[m] != NULL) { /* the plan was checked against both
                                       regions: its runs are in bounds */
            for (; cur->run < nr && posted < max_bytes; cur->run++) {
                memcpy(p->stores[m] + runs[cur->run].dst,
                       src + runs[cur->run].src, runs[cur->run].len);
                posted += runs[cur->run].len;
                p->stored_bytes += runs[cur->run].len;
            }
            continue;
        }
        const kvr_run_t *r = &runs[cur->run];
        st = kvr_xfer_put(p->ep, src + r->src, r->len, p->maps[m], r->dst,
                          deadline_ns);
        if (st != KVR_OK)
            break; /* not posted: the cursor stays on it */
        p->unflushed = true;
        p->put_bytes += r->len;
        cur->run++;
        posted += r->len;
    }
    /* the stores land before the WRITE_DONE that follows them */
    atomic_thread_fence(memory_order_release);
    *moved += posted;
    *done = cur->seg >= n;
    return st == KVR_OK ? KVR_OK : put_error(p, st, err, "direct transfer");
}

kvr_status_t kvr__data_flush(kvr__dpeer_t *p, uint64_t deadline_ns,
                             kvr_error_t *err)
{
    if (!p->unflushed) /* stores only: in place when put_some returned */
        return KVR_OK;
    kvr_status_t st = kvr_xfer_flush(p->ep, deadline_ns);
    if (st == KVR_OK)
        p->unflushed = false;
    return st == KVR_OK ? KVR_OK : put_error(p, st, err, "flush");
}

static kvr_status_t pack_buffer(kvr__dpeer_t *p, uint64_t len, void **buf)
{
    if (p->pack == NULL || kvr_mem_len(p->pack) < len) {
        kvr_mem_destroy(p->pack);
        p->pack = NULL;
        kvr_status_t st = kvr_mem_alloc(p->d->t, len, &p->pack);
        if (st != KVR_OK)
            return st;
    }
    *buf = kvr_mem_addr(p->pack);
    return KVR_OK;
}

kvr_status_t kvr__data_send_chunk(kvr__dpeer_t *p, const kvr__dseg_t *segs,
                                  size_t n, uint64_t off, uint64_t len,
                                  uint32_t staging, uint64_t staging_off,
                                  uint64_t deadline_ns, kvr_error_t *err)
{
    if (staging >= p->num_maps)
        return kvr_error_set(err, KVR_ERR_INVALID, "staging mapping %u",
                             staging);
    kvr_xfer_seg_t *x = to_xfer(p, segs, n);
    if (x == NULL)
        return kvr_error_set(err, KVR_ERR_NO_MEMORY, "no memory");
    kvr_xfer_cursor_t cur = {0};
    void *mapped = NULL, *buf = NULL;
    kvr_status_t st = KVR_OK;
    /* same host, kvrelay-allocated staging: pack straight into it */
    if (kvr_rmem_ptr(p->maps[staging], staging_off, len, &mapped) == KVR_OK) {
        kvr_xfer_pack(x, n, &cur, off, mapped, len);
    } else {
        st = pack_buffer(p, len, &buf);
        if (st == KVR_OK) {
            kvr_xfer_pack(x, n, &cur, off, buf, len);
            st = kvr_xfer_put(p->ep, buf, len, p->maps[staging], staging_off,
                              deadline_ns);
        }
        if (st == KVR_OK)
            st = kvr_xfer_flush(p->ep, deadline_ns);
    }
    free(x);
    return st == KVR_OK ? KVR_OK : put_error(p, st, err, "staged chunk");
}

kvr_status_t kvr__data_put_flush(kvr__dpeer_t *p, const void *buf,
                                 uint64_t len, uint32_t staging,
                                 uint64_t staging_off, uint64_t deadline_ns,
                                 kvr_error_t *err)
{
    if (staging >= p->num_maps)
        return kvr_error_set(err, KVR_ERR_INVALID, "staging mapping %u",
                             staging);
    kvr_status_t st = kvr_xfer_put(p->ep, buf, len, p->maps[staging],
                                   staging_off, deadline_ns);
    if (st == KVR_OK)
        st = kvr_xfer_flush(p->ep, deadline_ns);
    return st == KVR_OK ? KVR_OK : put_error(p, st, err, "gpu-staged chunk");
}

void kvr__data_unpack(const kvr__dseg_t *segs, size_t n, uint64_t off,
                      const void *buf, uint64_t len)
{
    kvr_xfer_seg_t *x = to_xfer(NULL, segs, n);
    if (x == NULL)
        return;
    kvr_xfer_cursor_t cur = {0};
    kvr_xfer_unpack(x, n, &cur, off, buf, len);
    free(x);
}

int kvr__data_choose(kvr__dpeer_t *p, int force, const kvr__dseg_t *segs,
                     size_t n, uint64_t slot_bytes)
{
    kvr_xfer_seg_t *x = to_xfer(p, segs, n);
    if (x == NULL)
        return 1;
    kvr_exec_kind_t k = kvr_cost_choose(&p->model, (kvr_exec_kind_t)force, x, n,
                                        slot_bytes, NULL, NULL);
    free(x);
    return k == KVR_EXEC_STAGED ? 2 : 1;
}

void kvr__data_model_describe(const kvr__dpeer_t *p, char *buf, size_t len)
{
    const kvr_cost_model_t *m = &p->model;
    uint32_t n = m->points;
    if (n == 0) { /* a lean probe's linear model, or the default one */
        snprintf(buf, len,
                 "put %.2f us + %.2f GB/s, staging put %.2f GB/s, rtt %.1f "
                 "us, per chunk %.1f us",
                 m->put_s * 1e6, m->put_Bps / 1e9, m->stage_Bps / 1e9,
                 m->rtt_s * 1e6, m->chunk_s * 1e6);
        return;
    }
    double big = m->point_bytes[n - 1];
    snprintf(buf, len,
             "put of %.0f B %.2f us, of %.0f B %.2f GB/s, staging put %.2f "
             "GB/s, rtt %.1f us, per chunk %.1f us",
             m->point_bytes[0], m->put_at[0] * 1e6, big,
             m->put_at[n - 1] > 0 ? big / m->put_at[n - 1] / 1e9 : 0,
             m->stage_at[n - 1] > 0 ? big / m->stage_at[n - 1] / 1e9 : 0,
             m->rtt_s * 1e6, m->chunk_s * 1e6);
}

int kvr__data_choose_gpu(kvr__dpeer_t *p, int force, const kvr__dgpu_t *g,
                         const kvr__dseg_t *segs, size_t n,
                         uint64_t slot_bytes, double pred[3])
{
    if (pred != NULL)
        pred[0] = pred[1] = pred[2] = 0;
    if (p == NULL)
        return 4;
    kvr_xfer_seg_t *x = to_xfer(p, segs, n);
    if (x == NULL)
        return g->direct_Bps > 0 ? 4 : 1;
    kvr_cost_gpu_t cg = {.cuda = true,
                         .pack_Bps = g->pack_Bps,
                         .launch_s = g->launch_s,
                         .direct_Bps = g->direct_Bps};
    double t[KVR_COST_KINDS];
    kvr_exec_kind_t f = force == 4   ? KVR_EXEC_GPU_DIRECT
                        : force == 2 ? KVR_EXEC_GPU_STAGED
                        : force == 1 ? KVR_EXEC_DIRECT
                                     : KVR_EXEC_AUTO;
    kvr_exec_kind_t k =
        kvr_cost_choose_gpu(&p->model, &cg, f, x, n, slot_bytes, t);
    free(x);
    if (pred != NULL) {
        pred[0] = t[KVR_EXEC_DIRECT];
        pred[1] = t[KVR_EXEC_GPU_STAGED];
        pred[2] = t[KVR_EXEC_GPU_DIRECT];
    }
    return k == KVR_EXEC_GPU_DIRECT ? 4 : k == KVR_EXEC_GPU_STAGED ? 2 : 1;
}

kvr_status_t kvr__data_probe_start(kvr__dpeer_t *p, uint32_t scratch,
                                   uint64_t scratch_len,
                                   const kvr__dmem_t *put_src, kvr_error_t *err)
{
    if (scratch >= p->num_maps || p->probe != NULL)
        return kvr_error_set(err, KVR_ERR_INVALID, "scratch mapping %u%s",
                             scratch, p->probe ? " (a probe under way)" : "");
    kvr_cost_probe_t probe = {
        .scratch = p->maps[scratch],
        .stage_scratch = p->maps[scratch],
        .small_bytes = 576,
        .small_count = put_src ? 64 : 256,
        .large_bytes = scratch_len < (4u << 20) ? scratch_len : (4u << 20),
        .put_src = put_src ? put_src->mem : NULL,
        /* CUDA regions: puts only (their packing is a kernel, measured by
         * the agent), in milliseconds */
        .lean = put_src != NULL};
    return kvr_cost_start(p->ep, &probe, &p->probe, err);
}

kvr_status_t kvr__data_probe_step(kvr__dpeer_t *p, uint64_t until_ns,
                                  bool *done, kvr_error_t *err)
{
    *done = true;
    if (p->probe == NULL)
        return KVR_OK;
    kvr_status_t st = kvr_cost_step(p->probe, until_ns, kvr_deadline_ns(5000),
                                    done, err);
    if (st == KVR_OK && *done)
        kvr_cost_result(p->probe, &p->model);
    if (st != KVR_OK || *done) {
        kvr_cost_free(p->probe);
        p->probe = NULL;
        *done = true;
    }
    return st;
}

bool kvr__data_probing(const kvr__dpeer_t *p)
{
    return p != NULL && p->probe != NULL;
}
