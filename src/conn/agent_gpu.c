/* gpu-direct in the agent (docs/agent.md gpu-direct, docs/design.md §5):
 * agents created with cuda_device >= 0 keep their KV in CUDA memory. A
 * consumer announces its regions in REGIONS as CUDA IPC handles; the
 * producer maps them and, per pull, launches the relayout scatter kernels
 * writing straight into the consumer's pages, on the agent's own stream.
 * send_ready's CUDA event was made a wait on that stream when it was
 * called, so the kernels run after the engine's work, without a host
 * synchronisation; the pull stays active while its kernels run and is
 * answered once their completion event fired (queried each turn, never
 * waited on, except when a pull is cut). */
#include <stdlib.h>
#include <string.h>

#include "agent_internal.h"

kvr_status_t kvr__agpu_export(const kvr_agent_t *a, const kvr__aregion_t *g,
                              kvr_wire_region_t *r, uint8_t *key,
                              kvr_error_t *err)
{
    r->memory = KVR_WIRE_MEM_CUDA;
    r->rkey = key;
    kvr_status_t st = kvr__gpu_use(a->p.cuda_device, err);
    return st == KVR_OK ? kvr__gpu_export(g->base, key, &r->rkey_len, err) : st;
}

kvr_status_t kvr__agpu_map(kvr_agent_t *a, const kvr_wire_region_t *r,
                           kvr__amap_t *m, kvr_error_t *err)
{
    bool cuda = r->memory == KVR_WIRE_MEM_CUDA, ours = a->p.cuda_device >= 0;
    if (cuda != ours || r->desc.role == KVR_ROLE_STAGING)
        return kvr_error_set(err, KVR_ERR_UNSUPPORTED,
                             "consumer %s region "
                             "layer %u is in %s memory, this producer's KV is "
                             "in %s memory",
                             kvr_role_name(r->desc.role), r->desc.layer,
                             cuda ? "CUDA" : "host", ours ? "CUDA" : "host");
    if (r->rkey_len > sizeof(m->rkey))
        return kvr_error_set(err, KVR_ERR_PROTO, "CUDA region key of %u bytes",
                             r->rkey_len);
    kvr_status_t st = kvr__gpu_open(a->p.cuda_device, r->rkey, r->rkey_len,
                                    &m->dev, err);
    if (st == KVR_OK) {
        memcpy(m->rkey, r->rkey, r->rkey_len);
        m->rkey_len = r->rkey_len;
    }
    return st;
}

void kvr__agpu_unmap(kvr__amap_t *m)
{
    if (m->dev != NULL)
        kvr__gpu_close(m->rkey, m->rkey_len, m->dev);
    m->dev = NULL;
}

/* Our regions of the layer group moving (all the pull's layers when it is
 * not streamed) in (layer, role) order with the consumer's twins, as the
 * plan of the pull has them. Launched on the agent's stream, so after
 * every cudaStreamWaitEvent that send_ready made for these layers. */
static kvr_status_t launch(kvr_agent_t *a, const kvr__preq_t *r, kvr__pull_t *p,
                           kvr_error_t *err)
{
    uint32_t n = 0;
    kvr_region_pair_t *pairs = calloc(a->num_order + 1, sizeof(*pairs));
    const void **src = calloc(a->num_order + 1, sizeof(*src));
    void **dst = calloc(a->num_order + 1, sizeof(*dst));
    kvr_status_t st = pairs && src && dst ? KVR_OK : KVR_ERR_NO_MEMORY;
    if (st != KVR_OK)
        kvr_error_set(err, st, "no memory");
    for (uint32_t i = 0; st == KVR_OK && i < a->num_order; i++) {
        const kvr__aregion_t *g = &a->regions[a->order[i]];
        if (g->desc.layer < p->group_begin || g->desc.layer >= p->group_end ||
            g->desc.layer < p->layer_lo || g->desc.layer >= p->layer_hi)
            continue;
        const kvr__amap_t *m =
            &p->link->maps[kvr__twin_index(p->link, &g->desc)];
        pairs[n] = (kvr_region_pair_t){g->desc, m->desc};
        src[n] = g->base;
        dst[n++] = m->dev;
    }
    kvr_request_t req = {r->src,  r->nsrc,       p->dst,
                         p->ndst, p->num_tokens, p->num_computed};
    uint64_t bytes = 0;
    if (st == KVR_OK)
        st = kvr__gpu_job_start(a->p.cuda_device, a->stream, &a->p.layout,
                                p->dcp_rank, pairs, src, (void *const *)dst, n,
                                &req, &p->job, &bytes, err);
    if (st == KVR_OK)
        kvr__agent_log(a,
                       "pull of '%.*s' for dcp %u, layers [%u, %u): kernels "
                       "launched, %llu bytes",
                       (int)p->request.len, p->request.bytes, p->dcp_rank,
                       p->group_begin, p->group_end, (unsigned long long)bytes);
    if (st == KVR_OK && bytes != p->group_off - p->group_off0)
        st = kvr_error_set(err, KVR_ERR_VERIFY,
                           "gpu-direct launched %llu "
                           "bytes, the plan has %llu",
                           (unsigned long long)bytes,
                           (unsigned long long)(p->group_off - p->group_off0));
    free(pairs);
    free(src);
    free(dst);
    return st;
}

/* The relayout kernels place tokens by an unsharded producer's slots
 * (W_p 1, bs_p bs, the same heads per tp rank): any other layout is
 * refused, never copied wrong. */
static kvr_status_t check_plain(const kvr_agent_t *a, kvr_error_t *err)
{
    const kvr_layout_t *l = &a->p.layout;
    bool heads = a->axis == KVR_AXIS_TP && l->tp != l->producer_tp;
    if (kvr_layout_producer_plain(l) && !heads)
        return KVR_OK;
    return kvr_error_set(err, KVR_ERR_UNSUPPORTED,
                         "gpu-direct moves an unsharded producer's layout "
                         "only (W_p %u, bs_p %u, TP %u -> %u): use host memory "
                         "for this pair layout",
                         kvr_producer_dcp(l), kvr_producer_block_size(l),
                         l->producer_tp, l->tp);
}

kvr_status_t kvr__agpu_slice(kvr_agent_t *a, const kvr__preq_t *r,
                             kvr__pull_t *p, bool *done, kvr_error_t *err)
{
    *done = false;
    if (p->job == NULL && check_plain(a, err) != KVR_OK)
        return err->code;
    if (p->job == NULL) {
        kvr_status_t st = launch(a, r, p, err);
        if (st != KVR_OK) {
            kvr__gpu_job_free(p->job);
            p->job = NULL;
        }
        return st;
    }
    kvr_status_t st = kvr__gpu_job_done(p->job, done, err);
    if (*done) { /* complete (or failed): its tables may go */
        kvr__agent_log(a, "pull of '%.*s' for dcp %u: kernels done",
                       (int)p->request.len, p->request.bytes, p->dcp_rank);
        kvr__gpu_job_free(p->job);
        p->job = NULL;
    }
    return st;
}

bool kvr__agpu_cpu_work(const kvr_agent_t *a)
{
    for (const kvr__pull_t *p = a->active; p != NULL; p = p->work_next)
        if (!p->gpu || p->job == NULL)
            return true;
    return false;
}
