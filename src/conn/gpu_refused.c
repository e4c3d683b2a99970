/* The GPU path calls refused without a device (see gpu_refused.h). */
#include "gpu_refused.h"

kvr_status_t kvr__gpu_packer_create(int device, const kvr_layout_t *lay,
                                    uint32_t rank,
                                    const kvr_region_pair_t *pairs,
                                    const void *const *src, void *const *dst,
                                    size_t n, const kvr_request_t *req,
                                    uint32_t depth, kvr__gpu_packer_t **out,
                                    kvr_error_t *err)
{
    (void)device, (void)lay, (void)rank, (void)pairs, (void)src, (void)dst;
    (void)n, (void)req, (void)depth, (void)out;
    return kvr__gpu_refused(err);
}

const kvr_exec_packer_t *kvr__gpu_packer_ops(const kvr__gpu_packer_t *pk)
{
    (void)pk;
    return NULL;
}

uint64_t kvr__gpu_packer_bytes(const kvr__gpu_packer_t *pk)
{
    (void)pk;
    return 0;
}

void kvr__gpu_packer_destroy(kvr__gpu_packer_t *pk)
{
    (void)pk;
}

kvr_status_t kvr__gpu_runs_copy(const kvr__gpu_runs_t *rt, uint64_t pos,
                                uint64_t len, const void *src_buf,
                                void *dst_buf, void *stream, kvr_error_t *err)
{
    (void)rt, (void)pos, (void)len, (void)src_buf, (void)dst_buf;
    (void)stream;
    return kvr__gpu_refused(err);
}

kvr_status_t kvr__gpu_runs_time(const kvr__gpu_runs_t *rt, uint64_t len,
                                const void *src_buf, void *dst_buf,
                                void *stream, double *secs, kvr_error_t *err)
{
    (void)rt, (void)len, (void)src_buf, (void)dst_buf, (void)stream;
    (void)secs;
    return kvr__gpu_refused(err);
}
