/* The GPU path's bookkeeping that touches no CUDA (see gpu_tables.h). */
#include "gpu_tables.h"

#include <stdlib.h>

kvr_status_t kvr__gpu_tables_new(size_t n, kvr__gpu_tables_t **out,
                                 kvr_error_t *err)
{
    kvr__gpu_tables_t *t = calloc(1, sizeof(*t));
    if (t != NULL)
        t->refs = 1;
    kvr_status_t st = t && (t->reps = calloc(n + 1, sizeof(*t->reps))) &&
                              (t->rl = calloc(n + 1, sizeof(*t->rl)))
                          ? KVR_OK
                          : kvr_error_set(err, KVR_ERR_NO_MEMORY, "no memory");
    if (st != KVR_OK) {
        kvr__gpu_tables_free(t);
        t = NULL;
    }
    *out = t;
    return st;
}

kvr_gpu_relayout_t *kvr__gpu_tables_find(const kvr__gpu_tables_t *t,
                                         const kvr_region_pair_t *pair)
{
    for (size_t c = 0; t != NULL && c < t->n; c++)
        if (kvr__gpu_tables_match(&t->reps[c], pair))
            return t->rl[c];
    return NULL;
}

void kvr__gpu_tables_share(kvr__gpu_tables_t *t)
{
    t->refs++;
}

kvr_status_t kvr__gpu_tables_bytes(const kvr__gpu_tables_t *t,
                                   const kvr_region_pair_t *pair,
                                   uint32_t rank, uint64_t *bytes,
                                   kvr_error_t *err)
{
    const kvr_gpu_relayout_t *rl = kvr__gpu_tables_find(t, pair);
    if (rl == NULL)
        return kvr_error_set(err, KVR_ERR_NOT_FOUND,
                             "no relayout tables for %s layer %u",
                             kvr_role_name(pair->src.role), pair->src.layer);
    *bytes = kvr_gpu_relayout_bytes(rl, rank);
    return KVR_OK;
}

void kvr__gpu_tables_free(kvr__gpu_tables_t *t)
{
    if (t == NULL || !kvr__gpu_unref(&t->refs))
        return;
    for (size_t c = 0; c < t->n; c++) /* device copies: stream-ordered */
        kvr_gpu_relayout_destroy(t->rl[c]);
    free(t->reps);
    free(t->rl);
    free(t);
}

kvr_gpu_request_t kvr__gpu_request(const kvr_request_t *req)
{
    kvr_gpu_request_t g = {req->src_blocks, req->num_src_blocks,
                           req->dst_blocks, req->num_dst_blocks,
                           req->num_tokens, req->num_computed_blocks};
    return g;
}

bool kvr__gpu_unref(uint32_t *refs)
{
    return --*refs == 0;
}

kvr_status_t kvr__gpu_job_end(kvr__gpu_job_t *job, kvr_status_t st,
                              kvr__gpu_job_t **out)
{
    if (st != KVR_OK) {
        kvr__gpu_job_free(job);
        return st;
    }
    *out = job;
    return KVR_OK;
}

static uint64_t address(const void *base, uint64_t off)
{
    return base ? (uint64_t)(uintptr_t)base + off : 0;
}

kvr_status_t kvr__gpu_runs_of_plans(const kvr_plan_t *const *plans,
                                    const void *const *src, void *const *dst,
                                    size_t n, kvr_gpu_runs_t **out,
                                    kvr_error_t *err)
{
    size_t total = 0, k = 0;
    for (size_t i = 0; i < n; i++)
        total += kvr_plan_num_runs(plans[i]);
    kvr_gpu_run_t *runs = calloc(total + 1, sizeof(*runs));
    if (runs == NULL)
        return kvr_error_set(err, KVR_ERR_NO_MEMORY, "no memory for %zu runs",
                             total);
    for (size_t i = 0; i < n; i++) {
        size_t nr = 0;
        const kvr_run_t *pr = kvr_plan_runs(plans[i], &nr);
        for (size_t j = 0; j < nr; j++)
            runs[k++] = (kvr_gpu_run_t){address(src ? src[i] : NULL, pr[j].src),
                                        address(dst ? dst[i] : NULL, pr[j].dst),
                                        pr[j].len};
    }
    kvr_status_t st = kvr_gpu_runs_create(runs, k, out, err);
    free(runs);
    return st;
}
