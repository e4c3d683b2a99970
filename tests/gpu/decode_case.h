/* Random inputs for the decode ops, shared by the reference tests and the
 * device tests. */
#ifndef KVRELAY_GPU_DECODE_CASE_H
#define KVRELAY_GPU_DECODE_CASE_H

#include "gpu_test.h"

typedef struct topk_case {
    kvr_gpu_topk_args_t a; /* host pointers into the arrays below */
    int32_t *seq_lens;     /* [num_reqs] */
    uint64_t cells;        /* num_rows * K */
} topk_case_t;

typedef struct topk_shape {
    kvr_gpu_step_t step;
    uint32_t num_reqs, q_len, padded_rows;
    uint32_t K, W, I, bs, rank;
    uint32_t empty_pct; /* share of -1 candidates */
    uint32_t own_pct;   /* share of rows whose positions the rank all owns */
} topk_shape_t;

/* Rows from kvr_gpu_rows_ref for the step; per request a random length and
 * distinct random block ids; every row's candidates are positions below its
 * request's length, -1 at random columns, some rows all -1. */
void topk_case_make(topk_case_t *t, const topk_shape_t *s, uint64_t *rng);
void topk_case_free(topk_case_t *t);

typedef struct slots_case {
    kvr_gpu_slots_args_t a;
} slots_case_t;

/* Lengths >= q_len, some 0 (padding). */
void slots_case_make(slots_case_t *c, uint32_t num_reqs, uint32_t q_len,
                     uint32_t bs, uint32_t W, uint64_t *rng);
void slots_case_free(slots_case_t *c);

typedef struct lse_case {
    kvr_gpu_lse_args_t a;
} lse_case_t;

/* Random partial outputs and LSEs; some ranks empty (lse -inf, NaN or +inf,
 * outputs NaN), some heads empty on every rank. */
void lse_case_make(lse_case_t *c, uint32_t W, uint32_t B, uint32_t H,
                   uint32_t D, uint64_t *rng);
void lse_case_free(lse_case_t *c);

#endif
