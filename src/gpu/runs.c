/* Run tables of the gpu layer (include/kvrelay/gpu.h, Run copies): the
 * host side and the reference copy. */
#include <stdlib.h>
#include <string.h>

#include "gpu_internal.h"

/* Longest piece one warp copies: longer runs are cut, so that a plan of
 * few long runs (I = bs, HND pages) still spreads over the device. */
#define PIECE_BYTES (16u << 10)

static size_t pieces_of(uint64_t len)
{
    return (size_t)((len + PIECE_BYTES - 1) / PIECE_BYTES);
}

kvr_status_t kvr_gpu_runs_create(const kvr_gpu_run_t *runs, size_t n,
                                 kvr_gpu_runs_t **out, kvr_error_t *err)
{
    if (out == NULL || (runs == NULL && n > 0))
        return kvr_error_set(err, KVR_ERR_INVALID, "runs or out is NULL");
    size_t np = 0;
    for (size_t i = 0; i < n; i++)
        np += pieces_of(runs[i].len);
    kvr_gpu_runs_t *rt = calloc(1, sizeof(*rt));
    kvr__run_item_t *it = calloc(np + 1, sizeof(*it));
    if (rt == NULL || it == NULL) {
        free(rt);
        free(it);
        return kvr_error_set(err, KVR_ERR_NO_MEMORY, "no memory for %zu runs",
                             n);
    }
    size_t k = 0;
    uint64_t off = 0;
    for (size_t i = 0; i < n; i++)
        for (uint64_t x = 0; x < runs[i].len; x += PIECE_BYTES) {
            uint64_t len = runs[i].len - x;
            len = len < PIECE_BYTES ? len : PIECE_BYTES;
            uint64_t s = runs[i].src ? runs[i].src + x : 0;
            uint64_t d = runs[i].dst ? runs[i].dst + x : 0;
            it[k++] = (kvr__run_item_t){s, d, off, len};
            off += len;
            rt->some_without_src |= s == 0;
            rt->some_without_dst |= d == 0;
        }
    rt->items = it;
    rt->n = k;
    rt->bytes = off;
    *out = rt;
    return KVR_OK;
}

void kvr_gpu_runs_destroy(kvr_gpu_runs_t *rt)
{
    if (rt == NULL)
        return;
    if (rt->device != NULL && rt->free_device != NULL)
        rt->free_device(rt->device, rt->n * sizeof(*rt->items),
                        rt->device_owner);
    free(rt->items);
    free(rt);
}

uint64_t kvr_gpu_runs_bytes(const kvr_gpu_runs_t *rt)
{
    return rt ? rt->bytes : 0;
}

/* First piece whose end is past pos (pieces are in stream order). */
static size_t piece_at(const kvr_gpu_runs_t *rt, uint64_t pos)
{
    size_t lo = 0, hi = rt->n;
    while (lo < hi) {
        size_t mid = lo + (hi - lo) / 2;
        if (rt->items[mid].off + rt->items[mid].len <= pos)
            lo = mid + 1;
        else
            hi = mid;
    }
    return lo;
}

kvr_status_t kvr__runs_span(const kvr_gpu_runs_t *rt, uint64_t pos,
                            uint64_t len, const void *src_buf,
                            const void *dst_buf, size_t *first, size_t *last,
                            kvr_error_t *err)
{
    if (rt == NULL)
        return kvr_error_set(err, KVR_ERR_INVALID, "run table is NULL");
    if (src_buf != NULL && dst_buf != NULL)
        return kvr_error_set(err, KVR_ERR_INVALID,
                             "a run copy packs or unpacks, not both");
    if (pos > rt->bytes || len > rt->bytes - pos)
        return kvr_error_set(err, KVR_ERR_RUN_OUT_OF_BOUNDS,
                             "stream bytes [%llu, +%llu) outside a run "
                             "table of %llu",
                             (unsigned long long)pos, (unsigned long long)len,
                             (unsigned long long)rt->bytes);
    *first = piece_at(rt, pos);
    *last = len == 0 ? *first : piece_at(rt, pos + len - 1) + 1;
    /* a scan only where some piece lacks an address: over 262144 pieces it
     * took longer than the copy it checked (docs/gpu.md, Run copy speed) */
    bool scan = (src_buf == NULL && rt->some_without_src) ||
                (dst_buf == NULL && rt->some_without_dst);
    for (size_t i = *first; scan && i < *last; i++)
        if ((src_buf == NULL && rt->items[i].src == 0) ||
            (dst_buf == NULL && rt->items[i].dst == 0))
            return kvr_error_set(err, KVR_ERR_INVALID,
                                 "run at stream byte %llu has no %s address",
                                 (unsigned long long)rt->items[i].off,
                                 rt->items[i].src == 0 ? "source"
                                                       : "destination");
    return KVR_OK;
}

kvr_status_t kvr_gpu_runs_copy_ref(const kvr_gpu_runs_t *rt, uint64_t pos,
                                   uint64_t len, const void *src_buf,
                                   void *dst_buf, kvr_error_t *err)
{
    size_t first = 0, last = 0;
    kvr_status_t st =
        kvr__runs_span(rt, pos, len, src_buf, dst_buf, &first, &last, err);
    for (size_t i = first; st == KVR_OK && i < last; i++) {
        const kvr__run_item_t *it = &rt->items[i];
        uint64_t lo = it->off > pos ? it->off : pos;
        uint64_t end = it->off + it->len, hi = pos + len;
        hi = end < hi ? end : hi;
        const unsigned char *s =
            src_buf ? (const unsigned char *)src_buf + (lo - pos)
                    : (const unsigned char *)(uintptr_t)it->src + (lo - it->off);
        unsigned char *d =
            dst_buf ? (unsigned char *)dst_buf + (lo - pos)
                    : (unsigned char *)(uintptr_t)it->dst + (lo - it->off);
        memmove(d, s, hi - lo);
    }
    return st;
}
