/* gpu-direct in the agent (docs/agent.md gpu-direct, docs/design.md §5):
 * agents created with cuda_device >= 0 keep their KV in CUDA memory. A
 * consumer announces its regions in REGIONS as CUDA IPC handles; the
 * producer maps them and, per pull, launches the relayout scatter kernels
 * writing straight into the consumer's pages, on the agent's own stream.
 * send_ready's CUDA event was made a wait on that stream when it was
 * called, so the kernels run after the engine's work, without a host
 * synchronisation; the pull stays active while its kernels run and is
 * answered once their completion event fired. A host function on a side
 * stream that waits for that event writes the wake eventfd (on the work
 * stream it held every later launch for the callback's round trip), so
 * the loop looks at the event when it fired, not on a timer; for a few
 * hundred microseconds after a launch the progress thread polls the
 * event itself (kvr__agpu_spin). It is never waited on, except when a
 * pull is cut. Tables live in the agent's pool (kvr_gpu_pool_t; small
 * ones in its mapped host slots, read in place), made once per pull when
 * it starts (kvr__agpu_prepare: before its layers are ready when it is
 * streamed) and read by the launch of every layer group; the launch's
 * slot arrays are the agent's, reused (a->gslots). */
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>

#include "agent_internal.h"

kvr_status_t kvr__agpu_export(const kvr_agent_t *a, const kvr__aregion_t *g,
                              kvr_wire_region_t *r, uint8_t *key,
                              kvr_error_t *err)
{
    r->memory = KVR_WIRE_MEM_CUDA;
    r->rkey = key;
    kvr_status_t st = kvr__gpu_use(a->p.cuda_device, err);
    if (st == KVR_OK)
        st = kvr__gpu_export(g->base, key, &r->rkey_len, err);
    uint32_t ulen = 0;
    if (st == KVR_OK && g->mem != NULL &&
        (st = kvr__dmem_rkey(g->mem, key + r->rkey_len, &ulen)) != KVR_OK)
        return kvr_error_set(err, st,
                             "packing the transport key of %s "
                             "layer %u",
                             kvr_role_name(g->desc.role), g->desc.layer);
    r->rkey_len += ulen;
    return st;
}

/* Through CUDA IPC, unless the network path is forced; a failure only
 * means the consumer is not on our host (or not reachable so). */
static void map_ipc(kvr_agent_t *a, const kvr_wire_region_t *r, kvr__amap_t *m)
{
    kvr_error_t e = {0};
    if (a->p.tl == KVR_AGENT_TL_TCP ||
        kvr__gpu_open(a->p.cuda_device, r->rkey, KVR_GPU_RKEY_BYTES, &m->dev,
                      &e) != KVR_OK) {
        m->dev = NULL;
        return;
    }
    memcpy(m->rkey, r->rkey, KVR_GPU_RKEY_BYTES);
    m->rkey_len = KVR_GPU_RKEY_BYTES;
}

kvr_status_t kvr__agpu_map(kvr_agent_t *a, kvr__alink_t *l,
                           const kvr_wire_region_t *r, kvr__amap_t *m,
                           kvr_error_t *err)
{
    bool cuda = r->memory == KVR_WIRE_MEM_CUDA, ours = a->p.cuda_device >= 0;
    const char *role = kvr_role_name(r->desc.role);
    if (cuda != ours)
        return kvr_error_set(err, KVR_ERR_UNSUPPORTED,
                             "consumer %s region "
                             "layer %u is in %s memory, this producer's KV is "
                             "in %s memory",
                             role, r->desc.layer, cuda ? "CUDA" : "host",
                             ours ? "CUDA" : "host");
    if (r->rkey_len < KVR_GPU_RKEY_BYTES)
        return kvr_error_set(err, KVR_ERR_PROTO, "CUDA region key of %u bytes",
                             r->rkey_len);
    map_ipc(a, r, m);
    /* the transport's key too, where the consumer sent one, even when CUDA
     * IPC reached it: the cost model then prices gpu-direct, gpu-staged and
     * direct puts alike (kvr__agpu_choose). Puts of CUDA memory name their
     * memory type, which ended the crash beside IPC mappings on the H200
     * (docs/transport.md, CUDA memory) */
    uint32_t ulen = r->rkey_len - KVR_GPU_RKEY_BYTES;
    kvr_status_t st = KVR_OK;
    if (ulen > 0 && l->data != NULL)
        st = kvr__dpeer_map(l->data, r->base, kvr_region_bytes(&r->desc),
                            r->rkey + KVR_GPU_RKEY_BYTES, ulen, &m->mapping,
                            err);
    m->net = ulen > 0 && l->data != NULL && st == KVR_OK;
    if (st != KVR_OK || m->dev != NULL || m->net)
        return st;
    if (l->data == NULL)
        return kvr_error_set(err, KVR_ERR_UNSUPPORTED,
                             "consumer %s region layer %u is not reachable "
                             "through CUDA IPC%s, and this producer's "
                             "transport cannot move CUDA memory (UCX %s: "
                             "built without CUDA, or absent)",
                             role, r->desc.layer,
                             a->p.tl == KVR_AGENT_TL_TCP ? " (tcp forced)" : "",
                             kvr__data_ucx_version());
    return kvr_error_set(err, KVR_ERR_UNSUPPORTED,
                         "consumer %s region layer %u is not reachable "
                         "through CUDA IPC%s, and the consumer's transport "
                         "cannot move CUDA memory (it sent no transport key)",
                         role, r->desc.layer,
                         a->p.tl == KVR_AGENT_TL_TCP ? " (tcp forced)" : "");
}

void kvr__agpu_unmap(kvr__amap_t *m)
{
    if (m->dev != NULL)
        kvr__gpu_close(m->rkey, m->rkey_len, m->dev);
    m->dev = NULL;
}

static bool same_request(const kvr__pull_t *p, const kvr__pull_t *q)
{
    return q->request.len == p->request.len &&
           memcmp(q->request.bytes, p->request.bytes, p->request.len) == 0;
}

/* Whether q may share p's launch (one launch for every rank that pulled
 * the same request: issue 17): a gpu-direct pull of the same request not
 * launched yet, with the same layer group and the same destination tables
 * (the DCP ranks of one group share them), for another rank. */
static bool joins(const kvr__pull_t *p, const kvr__pull_t *q)
{
    return q != p && q->gpu && q->job == NULL && q->link != NULL &&
           same_request(p, q) && q->group_begin == p->group_begin &&
           q->group_end == p->group_end &&
           q->layer_lo == p->layer_lo && q->layer_hi == p->layer_hi &&
           q->num_tokens == p->num_tokens &&
           q->num_computed == p->num_computed && q->ndst == p->ndst &&
           memcmp(q->dst, p->dst, p->ndst * sizeof(*p->dst)) == 0;
}

#define JOIN_MAX 64u /* pulls in one launch */

/* A launch's pulls, a request at a time (its lead first, then the pulls
 * that join it), and each request as the GPU path takes it. */
typedef struct launch_set {
    kvr__pull_t *set[JOIN_MAX];
    uint32_t rq[JOIN_MAX]; /* each pull's request in reqs */
    uint32_t k, nreq;
    kvr_request_t reqs[JOIN_MAX];
    const kvr__gpu_tables_t *tables[JOIN_MAX]; /* its lead's */
} launch_set_t;

/* lead (of request r) and the moving pulls that join it, one per other
 * rank, appended while ls has room (JOIN_MAX pulls). */
static void add_request(const kvr_agent_t *a, const kvr__preq_t *r,
                        kvr__pull_t *lead, launch_set_t *ls)
{
    uint32_t first = ls->k, rq = ls->nreq++;
    ls->reqs[rq] = (kvr_request_t){r->src,          r->nsrc,
                                   lead->dst,       lead->ndst,
                                   lead->num_tokens, lead->num_computed};
    ls->tables[rq] = lead->tables;
    ls->rq[ls->k] = rq;
    ls->set[ls->k++] = lead;
    for (kvr__pull_t *q = a->active; q != NULL && ls->k < JOIN_MAX;
         q = q->work_next) {
        bool taken = false;
        for (uint32_t i = first; i < ls->k; i++)
            taken = taken || ls->set[i]->dcp_rank == q->dcp_rank;
        if (!taken && joins(lead, q)) {
            ls->rq[ls->k] = rq;
            ls->set[ls->k++] = q;
        }
    }
}

/* Whether q may lead another request into the launch
 * (KVR_AGENT_GPU_MERGE): a gpu-direct pull moving with its layers ready,
 * not launched, with tables made at its arrival, of a request not in ls
 * yet. */
static bool mergeable(const launch_set_t *ls, const kvr__pull_t *q)
{
    if (!q->gpu || q->job != NULL || q->link == NULL || q->tables == NULL ||
        q->state != KVR__PULL_MOVING || q->wait_layers)
        return false;
    for (uint32_t i = 0; i < ls->k; i++)
        if (same_request(ls->set[i], q))
            return false;
    return true;
}

/* p's request first, then (KVR_AGENT_GPU_MERGE > 1) the ready pulls of
 * up to that many requests in all, oldest first (the active list's
 * order), so one launch moves several short requests region-major like
 * one long one (docs/gpu.md, Several requests a launch). */
static void gather(kvr_agent_t *a, const kvr__preq_t *r, kvr__pull_t *p,
                   launch_set_t *ls)
{
    ls->k = ls->nreq = 0;
    add_request(a, r, p, ls);
    for (kvr__pull_t *q = a->active;
         q != NULL && ls->nreq < a->gpu_merge && ls->k < JOIN_MAX;
         q = q->work_next) {
        const kvr__preq_t *qr = mergeable(ls, q) ? kvr__pull_owner(a, q)
                                                 : NULL;
        if (qr != NULL)
            add_request(a, qr, q, ls);
    }
}

/* p's regions of layers [lo, hi) (of the group moving: all its layers
 * when it is not streamed) in (layer, role) order with the consumer's
 * twins, as its plan has them, appended at n; returns the new count. */
static uint32_t add_pairs(const kvr_agent_t *a, const kvr__pull_t *p,
                          uint32_t lo, uint32_t hi, kvr_region_pair_t *pairs,
                          const void **src, void **dst, uint32_t *ranks,
                          uint32_t n)
{
    for (uint32_t i = 0; i < a->num_order; i++) {
        const kvr__aregion_t *g = &a->regions[a->order[i]];
        if (g->desc.layer < lo || g->desc.layer >= hi ||
            g->desc.layer < p->layer_lo || g->desc.layer >= p->layer_hi)
            continue;
        const kvr__amap_t *m =
            &p->link->maps[kvr__twin_index(p->link, &g->desc)];
        pairs[n] = (kvr_region_pair_t){g->desc, m->desc};
        src[n] = g->base;
        ranks[n] = p->dcp_rank;
        dst[n++] = m->dev;
    }
    return n;
}

/* The agent's slot arrays (a->gslots) with room for n entries: grown
 * once, then reused by every launch and every pull's tables. */
static kvr_status_t slots_room(kvr_agent_t *a, size_t n, kvr_error_t *err)
{
    if (n <= a->gslots.cap)
        return KVR_OK;
    size_t cap = n < 64 ? 64 : n;
    kvr_region_pair_t *pairs = realloc(a->gslots.pairs, cap * sizeof(*pairs));
    a->gslots.pairs = pairs ? pairs : a->gslots.pairs;
    const void **src = realloc(a->gslots.src, cap * sizeof(*src));
    a->gslots.src = src ? src : a->gslots.src;
    void **dst = realloc(a->gslots.dst, cap * sizeof(*dst));
    a->gslots.dst = dst ? dst : a->gslots.dst;
    uint32_t *ranks = realloc(a->gslots.ranks, cap * sizeof(*ranks));
    a->gslots.ranks = ranks ? ranks : a->gslots.ranks;
    uint32_t *req = realloc(a->gslots.req, cap * sizeof(*req));
    a->gslots.req = req ? req : a->gslots.req;
    if (pairs == NULL || src == NULL || dst == NULL || ranks == NULL ||
        req == NULL)
        return kvr_error_set(err, KVR_ERR_NO_MEMORY,
                             "no memory for %zu launch slots", cap);
    a->gslots.cap = cap;
    return KVR_OK;
}

void kvr__agpu_free(kvr_agent_t *a)
{
    free(a->gslots.pairs);
    free(a->gslots.src);
    free(a->gslots.dst);
    free(a->gslots.ranks);
    free(a->gslots.req);
    memset(&a->gslots, 0, sizeof(a->gslots));
}

/* ls's pulls' region pairs of their layer groups into the agent's slot
 * arrays, each with its request's index; *want their plans' bytes. */
static kvr_status_t fill_slots(kvr_agent_t *a, const launch_set_t *ls,
                               uint32_t *n, uint64_t *want, kvr_error_t *err)
{
    kvr_status_t st = slots_room(a, (size_t)ls->k * a->num_order + 1, err);
    *n = 0;
    *want = 0;
    for (uint32_t i = 0; st == KVR_OK && i < ls->k; i++) {
        const kvr__pull_t *q = ls->set[i];
        uint32_t m = *n;
        *n = add_pairs(a, q, q->group_begin, q->group_end, a->gslots.pairs,
                       a->gslots.src, a->gslots.dst, a->gslots.ranks, *n);
        for (; m < *n; m++)
            a->gslots.req[m] = ls->rq[i];
        *want += q->group_off - q->group_off0;
    }
    return st;
}

/* The launch of p's layer group and of every pull that joins it (their
 * tables are p's), and with KVR_AGENT_GPU_MERGE of other requests' ready
 * pulls (each request's tables its lead's): one job they share, on the
 * agent's stream, so after every cudaStreamWaitEvent that send_ready made
 * for these layers. */
static kvr_status_t launch(kvr_agent_t *a, const kvr__preq_t *r, kvr__pull_t *p,
                           kvr_error_t *err)
{
    launch_set_t ls;
    gather(a, r, p, &ls);
    uint32_t k = ls.k, n = 0;
    uint64_t want = 0, bytes = 0;
    kvr_status_t st = fill_slots(a, &ls, &n, &want, err);
    kvr__gpu_launch_t l = {ls.tables,       ls.reqs,       ls.nreq,
                           a->gslots.req,   a->gslots.ranks,
                           a->gslots.pairs, a->gslots.src,
                           (void *const *)a->gslots.dst, n};
    uint64_t t0 = kvr_now_ns();
    if (st == KVR_OK)
        st = kvr__gpu_job_launch(a->p.cuda_device, a->stream, a->gpool,
                                 &a->p.layout, &l, &p->job, &bytes, err);
    uint64_t took = kvr_now_ns() - t0;
    if (a->ph.on && st == KVR_OK) {
        kvr__ph_sum(a, KVR__PH_LAUNCH, took);
        p->ph_launch_ns = t0 + took;
        kvr__ph_launched(a, k, bytes, t0 + took);
    }
    if (st == KVR_OK && bytes != want)
        st = kvr_error_set(err, KVR_ERR_VERIFY,
                           "gpu-direct launched %llu bytes for %u pulls of "
                           "%u requests, their plans have %llu",
                           (unsigned long long)bytes, k, ls.nreq,
                           (unsigned long long)want);
    p->job_bytes = st == KVR_OK ? bytes : 0;
    for (uint32_t i = 0; st == KVR_OK && i < k; i++) {
        kvr__pull_t *q = ls.set[i];
        if (i > 0) {
            kvr__gpu_job_share(p->job);
            q->job = p->job;
        }
        kvr__agent_log(a,
                       "pull of '%.*s' for dcp %u, layers [%u, %u): kernels "
                       "launched, %u pulls of %u requests at once, %llu "
                       "bytes, in %.1f us",
                       (int)q->request.len, q->request.bytes, q->dcp_rank,
                       q->group_begin, q->group_end, k, ls.nreq,
                       (unsigned long long)bytes, (double)took * 1e-3);
    }
    return st;
}

/* The relayout kernels place tokens by an unsharded producer's slots
 * (W_p 1, bs_p bs, the same heads per tp rank); every other layout goes
 * through the run copy of the pull's pair plans (docs/gpu.md, Run
 * copies), which moves whatever the planner planned. */
static bool plain(const kvr_agent_t *a)
{
    const kvr_layout_t *l = &a->p.layout;
    bool heads = a->axis == KVR_AXIS_TP && l->tp != l->producer_tp;
    return kvr_layout_producer_plain(l) && !heads;
}

/* Another pull of the request whose tables serve p: the same tokens,
 * destination blocks and layers (the DCP ranks of one group; a class its
 * tables lack would be made at the launch). */
static kvr__gpu_tables_t *tables_of_peer(const kvr__preq_t *r,
                                         const kvr__pull_t *p)
{
    for (const kvr__pull_t *q = r->pulls; q != NULL; q = q->next)
        if (q != p && q->tables != NULL &&
            q->num_tokens == p->num_tokens &&
            q->num_computed == p->num_computed && q->ndst == p->ndst &&
            q->layer_lo == p->layer_lo && q->layer_hi == p->layer_hi &&
            memcmp(q->dst, p->dst, p->ndst * sizeof(*p->dst)) == 0)
            return q->tables;
    return NULL;
}

/* p's region pairs of its layers, with their twins, into the agent's
 * slot arrays (a->gslots); *n their count. */
static kvr_status_t pull_pairs(kvr_agent_t *a, const kvr__pull_t *p,
                               uint32_t *n, kvr_error_t *err)
{
    kvr_status_t st = slots_room(a, (size_t)a->num_order + 1, err);
    *n = st == KVR_OK ? add_pairs(a, p, p->layer_lo, p->layer_hi,
                                  a->gslots.pairs, a->gslots.src,
                                  a->gslots.dst, a->gslots.ranks, 0)
                      : 0;
    return st;
}

/* p's relayout tables from its n pairs in a->gslots (pull_pairs). */
static kvr_status_t make_tables(kvr_agent_t *a, const kvr__preq_t *r,
                                kvr__pull_t *p, uint32_t n, kvr_error_t *err)
{
    kvr_request_t req = {r->src,  r->nsrc,       p->dst,
                         p->ndst, p->num_tokens, p->num_computed};
    uint64_t t0 = kvr_now_ns();
    kvr_status_t st = kvr__gpu_tables_make(
        a->p.cuda_device, a->stream, a->gpool, &a->p.layout, a->gslots.pairs,
        n, &req, &p->tables, err);
    if (st == KVR_OK)
        kvr__agent_log(a,
                       "pull of '%.*s' for dcp %u: relayout tables of %u "
                       "regions made in %.1f us",
                       (int)p->request.len, p->request.bytes, p->dcp_rank, n,
                       (double)(kvr_now_ns() - t0) * 1e-3);
    return st;
}

/* A planless pull's seg bytes, from its tables and its n pairs in
 * a->gslots (the planner's count for every other pull; the consumer
 * checks WRITE_DONE's total against its own plan either way). */
static kvr_status_t seg_bytes(kvr_agent_t *a, kvr__pull_t *p, uint32_t n,
                              kvr_error_t *err)
{
    if (n != p->nsegs)
        return kvr_error_set(err, KVR_ERR_INVALID,
                             "%u region pairs for %zu segs", n, p->nsegs);
    kvr_status_t st = KVR_OK;
    for (uint32_t i = 0; st == KVR_OK && i < n; i++)
        st = kvr__gpu_tables_bytes(p->tables, &a->gslots.pairs[i],
                                   p->dcp_rank, &p->segs[i].bytes, err);
    return st;
}

/* p's tables (another rank's of the same request when they fit, else
 * made), and a planless pull's seg bytes from them; its pairs are built
 * once for both, and not at all for a planned pull that shares tables. */
kvr_status_t kvr__agpu_prepare(kvr_agent_t *a, const kvr__preq_t *r,
                               kvr__pull_t *p, kvr_error_t *err)
{
    if (!p->gpu || !plain(a) || p->tables != NULL)
        return KVR_OK; /* the run copy's table is made at its launch */
    if ((p->tables = tables_of_peer(r, p)) != NULL)
        kvr__gpu_tables_share(p->tables);
    uint32_t n = 0;
    kvr_status_t st = p->tables == NULL || p->planless
                          ? pull_pairs(a, p, &n, err)
                          : KVR_OK;
    if (st == KVR_OK && p->tables == NULL)
        st = make_tables(a, r, p, n, err);
    if (st == KVR_OK && p->planless)
        st = seg_bytes(a, p, n, err);
    return st;
}

kvr_status_t kvr__agpu_seg_ends(const kvr_agent_t *a, const kvr__pull_t *p,
                                const void **src, void **dst)
{
    size_t k = 0;
    for (uint32_t i = 0; i < a->num_order && k < p->nsegs; i++) {
        const kvr__aregion_t *g = &a->regions[a->order[i]];
        if (g->desc.layer < p->layer_lo || g->desc.layer >= p->layer_hi)
            continue;
        int j = kvr__twin_index(p->link, &g->desc);
        if (src != NULL)
            src[k] = g->base;
        if (dst != NULL)
            dst[k] = j >= 0 ? p->link->maps[j].dev : NULL;
        k++;
    }
    return k == p->nsegs ? KVR_OK : KVR_ERR_INVALID;
}

/* The pull's run table (made once, with the sources and destinations of
 * each of its segs as given), on the agent's stream. */
kvr_status_t kvr__agpu_runs(kvr_agent_t *a, kvr__pull_t *p, bool src, bool dst,
                            kvr_error_t *err)
{
    if (p->runs != NULL)
        return KVR_OK;
    const kvr_plan_t **plans = calloc(p->nsegs + 1, sizeof(*plans));
    const void **s = calloc(p->nsegs + 1, sizeof(*s));
    void **d = calloc(p->nsegs + 1, sizeof(*d));
    kvr_status_t st = plans && s && d ? KVR_OK : KVR_ERR_NO_MEMORY;
    if (st == KVR_OK && kvr__agpu_seg_ends(a, p, s, d) != KVR_OK)
        st = KVR_ERR_INVALID;
    for (size_t i = 0; st == KVR_OK && i < p->nsegs; i++)
        plans[i] = p->segs[i].plan;
    if (st != KVR_OK)
        kvr_error_set(err, st, "the pull's run table");
    else
        st = kvr__gpu_runs_make(a->p.cuda_device, a->stream, a->gpool, plans,
                                src ? s : NULL, dst ? (void *const *)d : NULL,
                                p->nsegs, &p->runs, err);
    free(plans);
    free(s);
    free(d);
    return st;
}

/* The layer group moving, through the run copy: one launch. */
static kvr_status_t launch_runs(kvr_agent_t *a, kvr__pull_t *p,
                                kvr_error_t *err)
{
    kvr_status_t st = kvr__agpu_runs(a, p, true, true, err);
    if (st == KVR_OK)
        st = kvr__gpu_job_runs(a->p.cuda_device, a->stream, p->runs,
                               p->group_off0, p->group_off - p->group_off0,
                               NULL, NULL, &p->job, err);
    if (st == KVR_OK)
        kvr__agent_log(a,
                       "pull of '%.*s' for dcp %u, layers [%u, %u): run copy "
                       "launched, %llu bytes",
                       (int)p->request.len, p->request.bytes, p->dcp_rank,
                       p->group_begin, p->group_end,
                       (unsigned long long)(p->group_off - p->group_off0));
    return st;
}

/* Whether a gpu-direct pull may launch now: fewer than two jobs queued
 * on the agent's stream, or their kernels move fewer bytes than the cap.
 * Else it waits for a completion; by then the other ranks' pulls of its
 * request are usually here, and one launch serves them all (issue 17's
 * "one launch for every rank at once") instead of one each. Two jobs keep
 * the stream busy while the loop sees one complete and launches the next
 * (with one, it sat idle that long: 5-8 % of the trace's rate, run
 * 2026-12-02j in docs/performance.md). */
static bool may_launch(const kvr_agent_t *a)
{
    uint64_t bytes = 0;
    uint32_t jobs = 0;
    for (const kvr__pull_t *p = a->active; p != NULL; p = p->work_next)
        if (p->gpu && p->job != NULL && p->job_bytes > 0) {
            bytes += p->job_bytes;
            jobs++;
        }
    return a->gpu_queue_cap == 0 || jobs < 2 || bytes < a->gpu_queue_cap;
}

kvr_status_t kvr__agpu_slice(kvr_agent_t *a, const kvr__preq_t *r,
                             kvr__pull_t *p, bool *done, kvr_error_t *err)
{
    *done = false;
    if (p->job == NULL && !may_launch(a))
        return KVR_OK; /* launched after a completion */
    if (p->job == NULL) {
        kvr_status_t st = plain(a) ? launch(a, r, p, err)
                                   : launch_runs(a, p, err);
        uint64_t t0 = kvr__ph_start(a);
        if (st == KVR_OK) /* the loop wakes when the kernels are done */
            st = kvr__gpu_job_notify(p->job, a->nstream, a->wake_fd, err);
        kvr__ph_add(a, KVR__PH_NOTIFY, t0);
        if (st != KVR_OK) {
            kvr__gpu_job_free(p->job);
            p->job = NULL;
        } else { /* and watches them meanwhile (kvr__agpu_spin) */
            a->gpu_spin_until = kvr_now_ns() + KVR_AGENT_GPU_SPIN_NS;
        }
        return st;
    }
    kvr_status_t st = kvr__gpu_job_done(p->job, done, err);
    if (*done) { /* complete (or failed): its tables may go */
        kvr__ph_job_done(a, p->ph_launch_ns);
        p->ph_launch_ns = 0;
        p->job_bytes = 0;
        kvr__agent_log(a, "pull of '%.*s' for dcp %u: kernels done",
                       (int)p->request.len, p->request.bytes, p->dcp_rank);
        kvr__gpu_job_free(p->job);
        p->job = NULL;
    }
    return st;
}

void kvr__agpu_launch_now(kvr_agent_t *a, const kvr__preq_t *r,
                          kvr__pull_t *p)
{
    bool done = false;
    kvr_error_t err = {0};
    if (!p->gpu || p->job != NULL || p->state != KVR__PULL_MOVING ||
        p->wait_layers || !may_launch(a))
        return;
    /* a failed launch leaves the pull listed with no job: its next slice
     * launches again and answers that attempt's error; this one's goes to
     * the debug log rather than nowhere */
    if (kvr__agpu_slice(a, r, p, &done, &err) != KVR_OK)
        kvr__agent_log(a, "pull of '%.*s' for dcp %u: launch failed (%s), "
                       "tried again in the turn's work",
                       (int)p->request.len, p->request.bytes, p->dcp_rank,
                       err.msg);
}

bool kvr__agpu_cpu_work(const kvr_agent_t *a)
{
    bool waiting = false;
    for (const kvr__pull_t *p = a->active; p != NULL; p = p->work_next) {
        if (!p->gpu)
            return true;
        waiting = waiting || p->job == NULL;
    }
    return waiting && may_launch(a);
}

/* 1: some pull's kernels completed (or failed), 0: they run, -1: none
 * runs, or more than KVR_AGENT_GPU_SPIN_JOBS do (a busy stage; their
 * host functions wake it, the queries would only cost it). */
static int kernels_done(kvr_agent_t *a)
{
    uint32_t k = 0;
    for (const kvr__pull_t *p = a->active; p != NULL; p = p->work_next)
        if (p->gpu && p->job != NULL && ++k > KVR_AGENT_GPU_SPIN_JOBS)
            return -1;
    for (kvr__pull_t *p = a->active; k > 0 && p != NULL; p = p->work_next) {
        bool done = false;
        kvr_error_t err = {0};
        if (p->gpu && p->job != NULL &&
            (kvr__gpu_job_done(p->job, &done, &err) != KVR_OK || done))
            return 1;
    }
    return k > 0 ? 0 : -1;
}

int kvr__agpu_spin(kvr_agent_t *a, struct epoll_event *ev, int cap)
{
    if (a->p.cuda_device < 0)
        return -1;
    for (;;) { /* the list is the turn's: looked at under its lock */
        if (pthread_mutex_trylock(&a->turn_lock) != 0)
            return -1;
        int d = kvr_now_ns() < a->gpu_spin_until ? kernels_done(a) : -1;
        pthread_mutex_unlock(&a->turn_lock);
        if (d != 0)
            return d > 0 ? 0 : -1;
        int n = epoll_wait(a->epoll_fd, ev, cap, 0);
        if (n != 0)
            return n;
    }
}

/* ---- gpu-staged and the choice among the GPU executors ---- */

/* Rates assumed where none was measured (no STAGING region to probe). */
#define GPU_DIRECT_BPS_DEFAULT 100e9
#define GPU_LAUNCH_S_DEFAULT 10e-6
#define PROBE_PIECE 576u /* one MLA token: the small runs of I = 1 */

/* Seconds of one run copy of `n` pieces of PROBE_PIECE bytes read every
 * fourth piece from src, into dst (contiguous); len 0: all of them. */
static kvr_status_t time_pieces(kvr_agent_t *a, const void *src, void *dst,
                                uint64_t n, double *secs, kvr_error_t *err)
{
    kvr_run_t *runs = calloc(n + 1, sizeof(*runs));
    if (runs == NULL)
        return kvr_error_set(err, KVR_ERR_NO_MEMORY, "no memory");
    for (uint64_t i = 0; i < n; i++)
        runs[i] = (kvr_run_t){.src = i * 4 * PROBE_PIECE,
                              .dst = i * PROBE_PIECE,
                              .len = PROBE_PIECE};
    kvr_plan_t *plan = NULL;
    kvr__gpu_runs_t *rt = NULL;
    kvr_status_t st = kvr_plan_from_runs(runs, n, &plan);
    if (st != KVR_OK)
        kvr_error_set(err, st, "a probe plan of %llu runs",
                      (unsigned long long)n);
    const kvr_plan_t *plans[1] = {plan};
    void *dsts[1] = {dst};
    if (st == KVR_OK)
        st = kvr__gpu_runs_make(a->p.cuda_device, a->stream, a->gpool, plans,
                                &src, dsts, 1, &rt, err);
    if (st == KVR_OK)
        st = kvr__gpu_runs_time(rt, n * PROBE_PIECE, NULL, NULL, a->stream,
                                secs, err);
    kvr__gpu_runs_free(rt);
    kvr_plan_destroy(plan);
    free(runs);
    return st;
}

/* The link's GPU figures: the run copy of 576-byte pieces from our first
 * moving region into a pack buffer (pack and unpack rate), one piece (a
 * launch), and (CUDA IPC) into the consumer's probe slot (gpu-direct). */
static kvr_status_t measure(kvr_agent_t *a, kvr__alink_t *l, const void *peer,
                            uint64_t slot, kvr_error_t *err)
{
    const kvr__aregion_t *g = NULL;
    for (uint32_t i = 0; g == NULL && i < a->num_order; i++)
        g = &a->regions[a->order[i]];
    uint64_t n = g ? kvr_region_bytes(&g->desc) / (4 * PROBE_PIECE) : 0;
    n = n < slot / PROBE_PIECE ? n : slot / PROBE_PIECE;
    if (n == 0)
        return KVR_OK; /* nothing to measure with: the defaults stay */
    double t = 0, t1 = 0;
    kvr_status_t st = time_pieces(a, g->base, l->gpack, n, &t, err);
    if (st == KVR_OK)
        st = time_pieces(a, g->base, l->gpack, 1, &t1, err);
    if (st == KVR_OK && t > 0)
        l->gfig.pack_Bps = (double)(n * PROBE_PIECE) / t;
    if (st == KVR_OK)
        l->gfig.launch_s = t1;
    if (st == KVR_OK && peer != NULL &&
        (st = time_pieces(a, g->base, (void *)peer, n, &t, err)) == KVR_OK &&
        t > 0)
        l->gfig.direct_Bps = (double)(n * PROBE_PIECE) / t;
    kvr__agent_log(a,
                   "link %u: GPU figures: pack %.1f GB/s, launch %.1f us, "
                   "gpu-direct %.1f GB/s",
                   l->serial, l->gfig.pack_Bps / 1e9, l->gfig.launch_s * 1e6,
                   l->gfig.direct_Bps / 1e9);
    return st;
}

kvr_status_t kvr__agpu_link(kvr_agent_t *a, kvr__alink_t *l,
                            const kvr_wire_region_t *staging,
                            const kvr__amap_t *sm, kvr_error_t *err)
{
    const kvr_region_desc_t *d = &staging->desc;
    uint64_t slot = d->page_bytes;
    l->gfig = (kvr__dgpu_t){0, GPU_LAUNCH_S_DEFAULT, 0};
    if (!sm->net)
        return KVR_OK; /* no gpu-staged to this consumer */
    kvr_status_t st = kvr__gpu_alloc(a->p.cuda_device, 2 * slot, &l->gpack,
                                     err);
    if (st == KVR_OK)
        st = kvr__dmem_register_cuda(a->data, l->gpack, 2 * slot, &l->gpack_mem,
                                     err);
    if (st != KVR_OK || a->p.executor != KVR_AGENT_EXEC_AUTO)
        return st; /* a forced choice needs no figures */
    uint64_t probe = (d->num_blocks - 1) * slot;
    uint32_t scratch = 0;
    st = kvr__dpeer_map(l->data, staging->base + probe, slot,
                        staging->rkey + KVR_GPU_RKEY_BYTES,
                        staging->rkey_len - KVR_GPU_RKEY_BYTES, &scratch, err);
    if (st == KVR_OK)
        st = measure(a, l, sm->dev ? (uint8_t *)sm->dev + probe : NULL, slot,
                     err);
    /* the transport's figures in steps between turns (kvr__probe_work) */
    if (st == KVR_OK)
        st = kvr__probe_start(a, l, scratch, slot, l->gpack_mem, err);
    return st;
}

void kvr__agpu_link_free(kvr_agent_t *a, kvr__alink_t *l)
{
    if (l->gpack == NULL)
        return;
    kvr__gpu_stream_sync(a->stream, NULL); /* no pack still writing */
    kvr__dmem_destroy(l->gpack_mem);
    kvr__gpu_free(l->gpack);
    l->gpack = NULL;
    l->gpack_mem = NULL;
}

/* 1 direct puts, 2 gpu-staged, 4 gpu-direct, 0 the model decides: what
 * the consumer asked, else our own setting. */
static int forced_gpu(kvr_wire_exec_t asked, kvr_agent_exec_t ours)
{
    switch (asked) {
    case KVR_WIRE_EXEC_DIRECT:
        return 1;
    case KVR_WIRE_EXEC_STAGED:
    case KVR_WIRE_EXEC_GPU_STAGED:
        return 2;
    case KVR_WIRE_EXEC_GPU_DIRECT:
        return 4;
    default:
        break;
    }
    return ours == KVR_AGENT_EXEC_DIRECT       ? 1
           : ours == KVR_AGENT_EXEC_STAGED     ? 2
           : ours == KVR_AGENT_EXEC_GPU_DIRECT ? 4
                                               : 0;
}

static const char *gpu_exec_name(int k)
{
    return k == 4 ? "gpu-direct" : k == 2 ? "gpu-staged" : "direct puts";
}

/* Which executors reach the pull's destinations: bit 1 direct puts (every
 * twin on the data peer), 2 gpu-staged (and slots in a mapped staging
 * region), 4 gpu-direct (every twin through CUDA IPC). */
static int reachable(const kvr_agent_t *a, const kvr__pull_t *p)
{
    const kvr__alink_t *l = p->link;
    bool ipc = true, net = l->data != NULL;
    for (uint32_t i = 0; i < a->num_order; i++) {
        const kvr__aregion_t *g = &a->regions[a->order[i]];
        if (g->desc.layer < p->layer_lo || g->desc.layer >= p->layer_hi)
            continue;
        int j = kvr__twin_index(l, &g->desc);
        ipc = ipc && j >= 0 && l->maps[j].dev != NULL;
        net = net && j >= 0 && l->maps[j].net;
    }
    bool staged = net && p->nslots > 0 && l->staging >= 0 &&
                  l->maps[l->staging].net && l->gpack != NULL;
    return (net ? 1 : 0) | (staged ? 2 : 0) | (ipc ? 4 : 0);
}

static kvr_status_t check_slots(const kvr__pull_t *p, kvr_error_t *err)
{
    const kvr__alink_t *l = p->link;
    const kvr_region_desc_t *d = &l->maps[l->staging].desc;
    for (uint32_t i = 0; i < p->nslots; i++)
        if (p->slots[i] >= d->num_blocks - 1)
            return kvr_error_set(err, KVR_ERR_BLOCK_RANGE,
                                 "staging slot %u outside the %llu usable "
                                 "slots",
                                 p->slots[i],
                                 (unsigned long long)(d->num_blocks - 1));
    return KVR_OK;
}

bool kvr__agpu_planless(const kvr_agent_t *a, const kvr__pull_t *p)
{
    if (a->p.cuda_device < 0 || !plain(a) || p->link == NULL)
        return false;
    int k = forced_gpu(p->executor, a->p.executor);
    return (k == 4 || (k == 0 && p->link->gdirect)) && (reachable(a, p) & 4);
}

kvr_status_t kvr__agpu_choose(kvr_agent_t *a, kvr__pull_t *p, kvr_error_t *err)
{
    kvr__alink_t *l = p->link;
    if (p->planless) { /* kvr__agpu_planless: nothing to price */
        p->gpu = true;
        p->staged = p->gstaged = false;
        return KVR_OK;
    }
    int can = reachable(a, p), k = forced_gpu(p->executor, a->p.executor);
    if (k != 0 && !(can & k))
        return kvr_error_set(err, KVR_ERR_UNSUPPORTED,
                             "%s asked for KV in CUDA memory, but it cannot "
                             "reach this consumer (%s)",
                             gpu_exec_name(k),
                             k == 4   ? "no CUDA IPC mapping: another host, "
                                        "or tcp forced"
                             : k == 2 ? "no staging slots granted, or its "
                                        "staging is not on our transport"
                                      : "its regions are not on our transport");
    if ((can & 2) && check_slots(p, err) != KVR_OK)
        return err->code;
    double pred[3] = {0, 0, 0};
    if (k == 0 && can == 4)
        k = 4; /* the only path: nothing to choose */
    if (k == 0) {
        kvr__dgpu_t g = l->gfig;
        g.pack_Bps = can & 2 ? g.pack_Bps : 0;
        g.direct_Bps = !(can & 4)         ? 0
                       : g.direct_Bps > 0 ? g.direct_Bps
                                          : GPU_DIRECT_BPS_DEFAULT;
        uint64_t slot = l->staging >= 0 ? l->maps[l->staging].desc.page_bytes
                                        : 4u << 20;
        k = kvr__data_choose_gpu(l->data, 0, &g, p->segs, p->nsegs, slot,
                                 pred);
    }
    p->gpu = k == 4;
    p->staged = p->gstaged = k == 2;
    l->gdirect = l->gdirect || (p->gpu && (can & 4));
    kvr__agent_log(a,
                   "pull of '%.*s' for dcp %u: %s (predicted ms: direct "
                   "puts %.3f, gpu-staged %.3f, gpu-direct %.3f; 0: not a "
                   "candidate)",
                   (int)p->request.len, p->request.bytes, p->dcp_rank,
                   gpu_exec_name(k), pred[0] * 1e3, pred[1] * 1e3,
                   pred[2] * 1e3);
    return KVR_OK;
}

kvr_status_t kvr__agpu_direct_ready(kvr_agent_t *a, kvr__pull_t *p,
                                    kvr_error_t *err)
{
    if (a->p.cuda_device < 0 || p->synced_group == p->group_end)
        return KVR_OK;
    p->synced_group = p->group_end;
    return kvr__gpu_stream_sync(a->stream, err);
}

/* Launches the pack of the chunk at the packed front into the pack
 * buffer of chunk index c (the front never passes the group's end). */
static kvr_status_t pack_next(kvr_agent_t *a, kvr__pull_t *p, uint32_t c,
                              uint64_t slot, kvr_error_t *err)
{
    uint64_t len = p->group_off - p->packed_off;
    len = len < slot ? len : slot;
    if (len == 0)
        return KVR_OK;
    kvr_status_t st = kvr__gpu_runs_copy(
        p->runs, p->packed_off, len, NULL,
        (uint8_t *)p->link->gpack + (c & 1) * slot, a->stream, err);
    if (st == KVR_OK)
        p->packed_off += len;
    return st;
}

/* One chunk: packed (the kernel launched one chunk ahead, on the agent's
 * stream after the engine's events), the next one's pack launched, then
 * the put and its flush overlap that pack. */
kvr_status_t kvr__agpu_staged_chunk(kvr_agent_t *a, kvr__pull_t *p,
                                    uint64_t *len, kvr_error_t *err)
{
    kvr__alink_t *l = p->link;
    const kvr__amap_t *sm = &l->maps[l->staging];
    uint64_t slot = sm->desc.page_bytes;
    kvr_status_t st = KVR_OK;
    if (p->packed_off == p->sent_off)
        st = pack_next(a, p, p->chunks, slot, err);
    uint64_t n = p->packed_off - p->sent_off;
    if (st == KVR_OK)
        st = kvr__gpu_stream_sync(a->stream, err);
    if (st == KVR_OK)
        st = pack_next(a, p, p->chunks + 1, slot, err);
    uint32_t s = p->slots[p->chunks % p->nslots];
    if (st == KVR_OK)
        st = kvr__data_put_flush(l->data,
                                 (uint8_t *)l->gpack + (p->chunks & 1) * slot,
                                 n, sm->mapping, s * slot, p->deadline_ns, err);
    if (st == KVR_OK && kvr__staged_chunk_done(a, p, s, n) != KVR_OK)
        st = kvr_error_set(err, KVR_ERR_PEER_DEAD, "consumer link lost");
    *len = n;
    return st;
}

kvr_status_t kvr__agpu_staged_begin(kvr_agent_t *a, kvr__pull_t *p,
                                    kvr_error_t *err)
{
    return kvr__agpu_runs(a, p, true, false, err);
}

kvr_status_t kvr__agpu_unpack(kvr_agent_t *a, kvr__cstage_t *s, uint64_t off,
                              const void *buf, uint64_t len, kvr_error_t *err)
{
    kvr_status_t st = KVR_OK;
    if (s->gruns == NULL) {
        const kvr_plan_t **plans = calloc(s->nsegs + 1, sizeof(*plans));
        void **dst = calloc(s->nsegs + 1, sizeof(*dst));
        st = plans && dst ? KVR_OK
                          : kvr_error_set(err, KVR_ERR_NO_MEMORY, "no memory");
        for (size_t i = 0; st == KVR_OK && i < s->nsegs; i++) {
            plans[i] = s->segs[i].plan;
            dst[i] = s->segs[i].dst_local;
        }
        if (st == KVR_OK)
            st = kvr__gpu_runs_make(a->p.cuda_device, a->stream, a->gpool,
                                    plans, NULL, (void *const *)dst, s->nsegs,
                                    &s->gruns, err);
        free(plans);
        free(dst);
    }
    if (st == KVR_OK)
        st = kvr__gpu_runs_copy(s->gruns, off, len, buf, NULL, a->stream, err);
    return st == KVR_OK ? kvr__gpu_stream_sync(a->stream, err) : st;
}
