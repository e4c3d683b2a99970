/* Bookkeeping of the GPU path (gpu_path.h) that touches no CUDA, written
 * once for gpu_path_cuda.c and the tests' emulation (gpu_path_emul.c):
 * how a request's relayout tables are kept, found, shared, counted and
 * freed, the last-reference rule, a job handed out or freed, and the run
 * table built from plans (docs/gpu.md, In the connector: gpu-direct; Run
 * copies).
 * Compiled into every build that has the gpu layer's tables (kvr_gpu_ref);
 * the refusing gpu_path_none.c needs none of it. */
#ifndef KVRELAY_CONN_GPU_TABLES_H
#define KVRELAY_CONN_GPU_TABLES_H

#include "gpu_path.h"
#include "kvrelay/gpu.h"

/* A request's relayout tables: a representative pair of each entry and
 * its relayout; which pairs an entry serves is the implementation's rule
 * (kvr__gpu_tables_match). */
struct kvr__gpu_tables {
    kvr_region_pair_t *reps; /* the pair each entry was made for */
    kvr_gpu_relayout_t **rl; /* its relayout */
    size_t n;
    uint32_t refs; /* the pulls sharing it */
};

/* Whether the tables made for rep serve pair: defined by each
 * implementation (the device shares one per region class, the emulation
 * keeps one per pair). */
bool kvr__gpu_tables_match(const kvr_region_pair_t *rep,
                           const kvr_region_pair_t *pair);

/* Empty tables of one reference with room for n entries; *out is NULL
 * when there was no memory. */
kvr_status_t kvr__gpu_tables_new(size_t n, kvr__gpu_tables_t **out,
                                 kvr_error_t *err);
/* The relayout serving pair (NULL: t is NULL or has none). */
kvr_gpu_relayout_t *kvr__gpu_tables_find(const kvr__gpu_tables_t *t,
                                         const kvr_region_pair_t *pair);

/* The request's tables as the gpu layer takes them. */
kvr_gpu_request_t kvr__gpu_request(const kvr_request_t *req);

/* Drops one of *refs; true when it was the last (the holder frees). */
bool kvr__gpu_unref(uint32_t *refs);

/* The job to the caller when st is KVR_OK, else freed
 * (kvr__gpu_job_free). */
kvr_status_t kvr__gpu_job_end(kvr__gpu_job_t *job, kvr_status_t st,
                              kvr__gpu_job_t **out);

/* The host run table of plans (docs/gpu.md, Run copies): plans[i]'s runs
 * at src[i] and dst[i] (src or dst NULL: offsets into a staging buffer). */
kvr_status_t kvr__gpu_runs_of_plans(const kvr_plan_t *const *plans,
                                    const void *const *src, void *const *dst,
                                    size_t n, kvr_gpu_runs_t **out,
                                    kvr_error_t *err);

#endif
