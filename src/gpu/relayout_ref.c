/* Host reference executors: the same pieces as the kernels, one memcpy each. */
#include <string.h>

#include "gpu_internal.h"

typedef enum { REF_SCATTER, REF_PACK, REF_UNPACK } ref_mode_t;

/* Copies the part of piece p that falls in stream bytes [lo, hi). */
static void copy_piece(ref_mode_t mode, const kvr__rl_piece_t *p,
                       const unsigned char *src, unsigned char *dst,
                       uint64_t lo, uint64_t hi)
{
    uint64_t a = p->stream > lo ? p->stream : lo;
    uint64_t b = p->stream + p->len < hi ? p->stream + p->len : hi;
    if (a >= b)
        return;
    if (mode == REF_UNPACK) {
        memcpy(dst + p->dst + (a - p->stream), src + (a - lo), b - a);
        return;
    }
    /* The source side comes in chunks. */
    for (uint64_t x = a - p->stream, end = b - p->stream; x < end;) {
        uint64_t n = (x / p->chunk + 1) * p->chunk - x;
        n = n < end - x ? n : end - x;
        unsigned char *to = mode == REF_SCATTER ? dst + p->dst + x
                                                : dst + (p->stream + x - lo);
        memcpy(to, src + kvr__rl_src_at(p, x), n);
        x += n;
    }
}

static kvr_status_t ref_run(const kvr_gpu_relayout_t *rl, uint32_t rank,
                            ref_mode_t mode, const void *src, void *dst,
                            uint64_t offset, uint64_t len, kvr_error_t *err)
{
    kvr_status_t st = kvr__rl_check_range(rl, rank, offset, len, err);
    if (st != KVR_OK || len == 0)
        return st;
    if (src == NULL || dst == NULL)
        return kvr_error_set(err, KVR_ERR_INVALID, "buffer is NULL");
    uint32_t s0, s1, per = kvr__rl_pieces_per_block(&rl->geom);
    kvr__rl_block_span(&rl->geom, rank, offset, len, &s0, &s1);
    for (uint32_t i = s0 * per; i < s1 * per; i++) {
        kvr__rl_piece_t p = kvr__rl_piece_at(&rl->geom, rank, i);
        copy_piece(mode, &p, src, dst, offset, offset + len);
    }
    return KVR_OK;
}

kvr_status_t kvr_gpu_ref_scatter(const kvr_gpu_relayout_t *rl, uint32_t rank,
                                 const void *src_base, void *dst_base,
                                 kvr_error_t *err)
{
    uint64_t total = kvr_gpu_relayout_bytes(rl, rank);
    return ref_run(rl, rank, REF_SCATTER, src_base, dst_base, 0, total, err);
}

kvr_status_t kvr_gpu_ref_pack(const kvr_gpu_relayout_t *rl, uint32_t rank,
                              const void *src_base, uint64_t offset,
                              uint64_t len, void *staging, kvr_error_t *err)
{
    return ref_run(rl, rank, REF_PACK, src_base, staging, offset, len, err);
}

kvr_status_t kvr_gpu_ref_unpack(const kvr_gpu_relayout_t *rl, uint32_t rank,
                                const void *staging, uint64_t offset,
                                uint64_t len, void *dst_base, kvr_error_t *err)
{
    return ref_run(rl, rank, REF_UNPACK, staging, dst_base, offset, len, err);
}
