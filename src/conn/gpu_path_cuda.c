/* The connector's GPU path over the gpu layer (see gpu_path.h). */
#include "gpu_path.h"

#include <stdlib.h>
#include <string.h>

#include "kvrelay/gpu.h"

int kvr__gpu_device_count(void)
{
    int n = 0;
    return kvr_gpu_device_count(&n, NULL) == KVR_OK ? n : 0;
}

kvr_status_t kvr__gpu_alloc(int device, uint64_t len, void **ptr,
                            kvr_error_t *err)
{
    return kvr_gpu_malloc(device, len, ptr, err);
}

void kvr__gpu_free(void *ptr)
{
    kvr_gpu_free(ptr);
}

kvr_status_t kvr__gpu_copy(void *dst, const void *src, uint64_t len,
                           kvr_error_t *err)
{
    return kvr_gpu_memcpy(dst, src, len, err);
}

kvr_status_t kvr__gpu_export(const void *ptr, uint8_t *rkey, uint32_t *len,
                             kvr_error_t *err)
{
    kvr_gpu_ipc_handle_t h;
    kvr_status_t st = kvr_gpu_ipc_export(ptr, &h, err);
    if (st != KVR_OK)
        return st;
    memcpy(rkey, h.handle, sizeof(h.handle));
    memcpy(rkey + sizeof(h.handle), &h.offset, sizeof(h.offset));
    *len = KVR_GPU_RKEY_BYTES;
    return KVR_OK;
}

static kvr_status_t handle_of(const uint8_t *rkey, uint32_t len,
                              kvr_gpu_ipc_handle_t *h, kvr_error_t *err)
{
    if (len != KVR_GPU_RKEY_BYTES)
        return kvr_error_set(err, KVR_ERR_PROTO,
                             "CUDA region key of %u bytes, "
                             "expected %u",
                             len, KVR_GPU_RKEY_BYTES);
    memcpy(h->handle, rkey, sizeof(h->handle));
    memcpy(&h->offset, rkey + sizeof(h->handle), sizeof(h->offset));
    return KVR_OK;
}

kvr_status_t kvr__gpu_open(int device, const uint8_t *rkey, uint32_t len,
                           void **ptr, kvr_error_t *err)
{
    kvr_gpu_ipc_handle_t h;
    kvr_status_t st = handle_of(rkey, len, &h, err);
    if (st == KVR_OK)
        st = kvr_gpu_set_device(device, err);
    if (st == KVR_OK)
        st = kvr_gpu_ipc_open(&h, ptr, err);
    return st;
}

void kvr__gpu_close(const uint8_t *rkey, uint32_t len, void *ptr)
{
    kvr_gpu_ipc_handle_t h;
    if (ptr != NULL && handle_of(rkey, len, &h, NULL) == KVR_OK)
        kvr_gpu_ipc_close(&h, ptr);
}

/* Pairs of one class (role and widths) share one relayout: its tables are
 * checked and uploaded once, then each region is one kernel launch. */
static bool same_class(const kvr_region_pair_t *a, const kvr_region_pair_t *b)
{
    return a->src.role == b->src.role &&
           a->src.page_bytes == b->src.page_bytes &&
           a->dst.page_bytes == b->dst.page_bytes &&
           a->src.index_dim == b->src.index_dim &&
           a->src.num_blocks == b->src.num_blocks &&
           a->dst.num_blocks == b->dst.num_blocks &&
           kvr_region_bytes(&a->src) == kvr_region_bytes(&b->src) &&
           kvr_region_bytes(&a->dst) == kvr_region_bytes(&b->dst);
}

struct kvr__gpu_job {
    kvr_gpu_relayout_t **rl; /* one per class, alive until the job ends */
    size_t nrl;
    void *done; /* recorded after the last launch */
};

/* One class's relayout, checked and uploaded once, then one launch per
 * region of that class. */
static kvr_status_t launch_class(kvr__gpu_job_t *job, void *stream,
                                 const kvr_layout_t *lay, uint32_t rank,
                                 const kvr_region_pair_t *pairs,
                                 const void *const *src, void *const *dst,
                                 size_t n, size_t first, bool *launched,
                                 const kvr_request_t *req, uint64_t *bytes,
                                 kvr_error_t *err)
{
    kvr_gpu_request_t g = {req->src_blocks, req->num_src_blocks,
                           req->dst_blocks, req->num_dst_blocks,
                           req->num_tokens, req->num_computed_blocks};
    kvr_gpu_relayout_t *rl = NULL;
    kvr_status_t st = kvr_gpu_relayout_create(lay, &pairs[first].src,
                                              &pairs[first].dst, &g, &rl, err);
    if (st != KVR_OK)
        return st;
    job->rl[job->nrl++] = rl;
    st = stream ? kvr_gpu_relayout_upload_async(rl, stream, err)
                : kvr_gpu_relayout_upload(rl, err);
    for (size_t i = first; i < n && st == KVR_OK; i++) {
        if (launched[i] || !same_class(&pairs[first], &pairs[i]))
            continue;
        st = kvr_gpu_scatter_rank(rl, rank, src[i], dst[i], stream, err);
        *bytes += kvr_gpu_relayout_bytes(rl, rank);
        launched[i] = true;
    }
    return st;
}

kvr_status_t kvr__gpu_job_start(int device, void *stream,
                                const kvr_layout_t *lay, uint32_t rank,
                                const kvr_region_pair_t *pairs,
                                const void *const *src, void *const *dst,
                                size_t n, const kvr_request_t *req,
                                kvr__gpu_job_t **out, uint64_t *bytes,
                                kvr_error_t *err)
{
    kvr__gpu_job_t *job = calloc(1, sizeof(*job));
    bool *launched = calloc(n + 1, sizeof(*launched));
    kvr_status_t st = job && launched ? KVR_OK : KVR_ERR_NO_MEMORY;
    if (st == KVR_OK && (job->rl = calloc(n + 1, sizeof(*job->rl))) == NULL)
        st = KVR_ERR_NO_MEMORY;
    if (st != KVR_OK)
        kvr_error_set(err, st, "no memory");
    if (st == KVR_OK)
        st = kvr_gpu_set_device(device, err);
    if (st == KVR_OK)
        st = kvr_gpu_event_create(device, &job->done, err);
    *bytes = 0;
    for (size_t i = 0; i < n && st == KVR_OK; i++)
        if (!launched[i])
            st = launch_class(job, stream, lay, rank, pairs, src, dst, n, i,
                              launched, req, bytes, err);
    if (st == KVR_OK)
        st = kvr_gpu_event_record(job->done, stream, err);
    free(launched);
    if (st != KVR_OK) {
        kvr__gpu_job_free(job);
        return st;
    }
    *out = job;
    return KVR_OK;
}

kvr_status_t kvr__gpu_job_done(kvr__gpu_job_t *job, bool *done,
                               kvr_error_t *err)
{
    int d = 0;
    kvr_status_t st = kvr_gpu_event_done(job->done, &d, err);
    *done = st != KVR_OK || d;
    return st;
}

void kvr__gpu_job_free(kvr__gpu_job_t *job)
{
    if (job == NULL)
        return;
    /* the tables must outlive the launches using them */
    if (job->done != NULL)
        kvr_gpu_event_sync(job->done, NULL);
    else if (job->nrl > 0)
        kvr_gpu_sync(NULL, NULL);
    for (size_t i = 0; i < job->nrl; i++)
        kvr_gpu_relayout_destroy(job->rl[i]);
    kvr_gpu_event_destroy(job->done);
    free(job->rl);
    free(job);
}

kvr_status_t kvr__gpu_use(int device, kvr_error_t *err)
{
    return kvr_gpu_set_device(device, err);
}

kvr_status_t kvr__gpu_stream_create(int device, void **stream, kvr_error_t *err)
{
    return kvr_gpu_stream_create(device, stream, err);
}

void kvr__gpu_stream_destroy(void *stream)
{
    kvr_gpu_stream_destroy(stream);
}

kvr_status_t kvr__gpu_stream_wait(void *stream, void *event, kvr_error_t *err)
{
    return kvr_gpu_stream_wait(stream, event, err);
}

kvr_status_t kvr__gpu_send(int device, const kvr_layout_t *lay, uint32_t rank,
                           const kvr_region_pair_t *pairs,
                           const void *const *src, void *const *dst, size_t n,
                           const kvr_request_t *req, uint64_t *bytes,
                           kvr_error_t *err)
{
    kvr__gpu_job_t *job = NULL;
    kvr_status_t st = kvr__gpu_job_start(device, NULL, lay, rank, pairs, src,
                                         dst, n, req, &job, bytes, err);
    if (st == KVR_OK)
        st = kvr_gpu_event_sync(job->done, err);
    kvr__gpu_job_free(job);
    return st;
}
