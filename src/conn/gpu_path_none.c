/* Built without CUDA: device memory is refused with a clear error. */
#include "gpu_path.h"
#include "gpu_refused.h"

static kvr_status_t no_cuda(kvr_error_t *err)
{
    return kvr_error_set(err, KVR_ERR_UNSUPPORTED,
                         "kvrelay was built without CUDA: no device memory");
}

/* gpu_refused.c's calls refuse with it too. */
kvr_status_t kvr__gpu_refused(kvr_error_t *err)
{
    return no_cuda(err);
}

kvr_status_t kvr__gpu_gate_create(int device, void **gate, kvr_error_t *err)
{
    (void)device, (void)gate;
    return no_cuda(err);
}

kvr_status_t kvr__gpu_gate_sync(void *gate, kvr_error_t *err)
{
    (void)gate;
    return no_cuda(err);
}

void kvr__gpu_gate_destroy(void *gate)
{
    (void)gate;
}

kvr_status_t kvr__gpu_gate_arm(void *stream, void *engine_event, void *gate,
                               int fd, kvr_error_t *err)
{
    (void)stream, (void)engine_event, (void)gate, (void)fd;
    return no_cuda(err);
}

kvr_status_t kvr__gpu_gate_done(void *gate, bool *done, kvr_error_t *err)
{
    (void)gate;
    *done = true;
    return no_cuda(err);
}

int kvr__gpu_device_count(void)
{
    return 0;
}

kvr_status_t kvr__gpu_alloc(int device, uint64_t len, void **ptr,
                            kvr_error_t *err)
{
    (void)device, (void)len, (void)ptr;
    return no_cuda(err);
}

void kvr__gpu_free(void *ptr)
{
    (void)ptr;
}

void kvr__gpu_chunking(uint64_t *chunk, uint64_t *align)
{
    *chunk = 2ull << 30; /* never allocated: kvr__gpu_alloc refuses */
    *align = 2ull << 20;
}

kvr_status_t kvr__gpu_copy(void *dst, const void *src, uint64_t len,
                           kvr_error_t *err)
{
    (void)dst, (void)src, (void)len;
    return no_cuda(err);
}

kvr_status_t kvr__gpu_export(const void *ptr, uint8_t *rkey, uint32_t *len,
                             kvr_error_t *err)
{
    (void)ptr, (void)rkey, (void)len;
    return no_cuda(err);
}

kvr_status_t kvr__gpu_open(int device, const uint8_t *rkey, uint32_t len,
                           void **ptr, kvr_error_t *err)
{
    (void)device, (void)rkey, (void)len, (void)ptr;
    return no_cuda(err);
}

void kvr__gpu_close(const uint8_t *rkey, uint32_t len, void *ptr)
{
    (void)rkey, (void)len, (void)ptr;
}

kvr_status_t kvr__gpu_tables_make(int device, void *stream,
                                  struct kvr_gpu_pool *pool,
                                  const kvr_layout_t *lay,
                                  const kvr_region_pair_t *pairs, size_t n,
                                  const kvr_request_t *req,
                                  kvr__gpu_tables_t **out, kvr_error_t *err)
{
    (void)device, (void)stream, (void)pool, (void)lay, (void)pairs, (void)n;
    (void)req, (void)out;
    return no_cuda(err);
}

void kvr__gpu_tables_share(kvr__gpu_tables_t *t)
{
    (void)t;
}

kvr_status_t kvr__gpu_tables_bytes(const kvr__gpu_tables_t *t,
                                   const kvr_region_pair_t *pair,
                                   uint32_t rank, uint64_t *bytes,
                                   kvr_error_t *err)
{
    (void)t, (void)pair, (void)rank, (void)bytes;
    return no_cuda(err);
}

void kvr__gpu_tables_free(kvr__gpu_tables_t *t)
{
    (void)t;
}

kvr_status_t kvr__gpu_send(int device, void *stream, struct kvr_gpu_pool *pool,
                           const kvr_layout_t *lay, uint32_t rank,
                           const kvr_region_pair_t *pairs,
                           const void *const *src, void *const *dst, size_t n,
                           const kvr_request_t *req,
                           const kvr__gpu_tables_t *tables, uint64_t *bytes,
                           uint64_t *stamps, kvr_error_t *err)
{
    (void)device, (void)stream, (void)pool, (void)lay, (void)rank, (void)pairs;
    (void)src, (void)dst;
    (void)n, (void)req, (void)tables, (void)bytes, (void)stamps;
    return no_cuda(err);
}

kvr_status_t kvr__gpu_job_launch(int device, void *stream,
                                 struct kvr_gpu_pool *pool,
                                 const kvr_layout_t *lay,
                                 const kvr__gpu_launch_t *l,
                                 kvr__gpu_job_t **out, uint64_t *bytes,
                                 kvr_error_t *err)
{
    (void)device, (void)stream, (void)pool, (void)lay, (void)l, (void)out;
    (void)bytes;
    return no_cuda(err);
}

kvr_status_t kvr__gpu_job_notify(kvr__gpu_job_t *job, void *side, int fd,
                                 kvr_error_t *err)
{
    (void)job, (void)side, (void)fd;
    return no_cuda(err);
}

kvr_status_t kvr__gpu_job_done(kvr__gpu_job_t *job, bool *done,
                               kvr_error_t *err)
{
    (void)job;
    *done = true;
    return no_cuda(err);
}

void kvr__gpu_job_free(kvr__gpu_job_t *job)
{
    (void)job;
}

void kvr__gpu_job_share(kvr__gpu_job_t *job)
{
    (void)job;
}

kvr_status_t kvr__gpu_use(int device, kvr_error_t *err)
{
    (void)device;
    return no_cuda(err);
}

kvr_status_t kvr__gpu_stream_create(int device, void **stream, kvr_error_t *err)
{
    (void)device, (void)stream;
    return no_cuda(err);
}

void kvr__gpu_stream_destroy(void *stream)
{
    (void)stream;
}

kvr_status_t kvr__gpu_runs_make(int device, void *stream,
                                struct kvr_gpu_pool *pool,
                                const kvr_plan_t *const *plans,
                                const void *const *src, void *const *dst,
                                size_t n, kvr__gpu_runs_t **out,
                                kvr_error_t *err)
{
    (void)device, (void)stream, (void)pool, (void)plans, (void)src;
    (void)dst, (void)n, (void)out;
    return no_cuda(err);
}

void kvr__gpu_runs_free(kvr__gpu_runs_t *rt)
{
    (void)rt;
}

kvr_status_t kvr__gpu_job_runs(int device, void *stream,
                               const kvr__gpu_runs_t *rt, uint64_t pos,
                               uint64_t len, const void *src_buf,
                               void *dst_buf, kvr__gpu_job_t **out,
                               kvr_error_t *err)
{
    (void)device, (void)stream, (void)rt, (void)pos, (void)len;
    (void)src_buf, (void)dst_buf, (void)out;
    return no_cuda(err);
}

kvr_status_t kvr__gpu_stream_sync(void *stream, kvr_error_t *err)
{
    (void)stream;
    return no_cuda(err);
}

kvr_status_t kvr__gpu_pool_create(int device, void *stream,
                                  struct kvr_gpu_pool **pool, kvr_error_t *err)
{
    (void)device, (void)stream, (void)pool;
    return no_cuda(err);
}

void kvr__gpu_pool_destroy(struct kvr_gpu_pool *pool)
{
    (void)pool;
}

kvr_status_t kvr__gpu_warm(int device, void *stream, kvr_error_t *err)
{
    (void)device, (void)stream;
    return no_cuda(err);
}
