#include "decode_case.h"

#include <math.h>
#include <string.h>

static int32_t *random_table(uint32_t rows, uint32_t cols, uint64_t *rng)
{
    int32_t *t = xmalloc((size_t)rows * cols * sizeof(*t));
    for (uint64_t i = 0; i < (uint64_t)rows * cols; i++)
        t[i] = (int32_t)(i * 7 + rng_below(rng, 7)); /* distinct, scattered */
    for (uint64_t i = (uint64_t)rows * cols; i > 1; i--) {
        uint32_t j = rng_below(rng, (uint32_t)i);
        int32_t x = t[i - 1];
        t[i - 1] = t[j];
        t[j] = x;
    }
    return t;
}

static void fill_row(int32_t *row, uint32_t K, int32_t len, uint32_t empty_pct,
                     uint64_t *rng)
{
    int all_empty = len == 0 || rng_below(rng, 16) == 0;
    for (uint32_t c = 0; c < K; c++)
        row[c] = all_empty || rng_below(rng, 100) < empty_pct
                     ? -1
                     : (int32_t)rng_below(rng, (uint32_t)len);
}

/* Moves every position of a row into the rank's own chunk of its I*W
 * group (-1 where that passes the length): a row that owns all it holds,
 * more than the GPU kernel stages per row. */
static void own_row(int32_t *row, const topk_shape_t *s, int32_t len)
{
    for (uint32_t c = 0; c < s->K; c++) {
        if (row[c] < 0)
            continue;
        uint32_t p = (uint32_t)row[c], chunk = p / s->I;
        uint32_t q = (chunk - chunk % s->W + s->rank) * s->I + p % s->I;
        row[c] = q < (uint32_t)len ? (int32_t)q : -1;
    }
}

void topk_case_make(topk_case_t *t, const topk_shape_t *s, uint64_t *rng)
{
    memset(t, 0, sizeof(*t));
    kvr_gpu_topk_args_t *a = &t->a;
    uint32_t table_rows = s->step == KVR_GPU_STEP_DRAFT ? s->padded_rows
                                                        : s->num_reqs;
    uint32_t V = s->bs * s->W, rows = 0;
    int32_t *map = xmalloc(((size_t)table_rows * s->q_len + 1) * sizeof(*map));
    kvr_gpu_rows_args_t ra = {s->step,  s->num_reqs,
                              s->q_len, s->padded_rows,
                              map,      table_rows * s->q_len + 1};
    CHECK_KVR(kvr_gpu_rows_count(&ra, &rows, &err));
    CHECK_KVR(kvr_gpu_rows_ref(&ra, &err));
    a->max_blocks = 1 + rng_below(rng, 40);
    a->num_reqs = table_rows;
    a->block_table = random_table(table_rows, a->max_blocks, rng);
    t->seq_lens = xmalloc(table_rows * sizeof(int32_t));
    for (uint32_t i = 0; i < table_rows; i++)
        t->seq_lens[i] = i < s->num_reqs
                             ? (int32_t)(1 + rng_below(rng, a->max_blocks * V))
                             : 0; /* draft padding */
    a->num_rows = rows;
    a->topk = s->K;
    t->cells = (uint64_t)rows * s->K;
    int32_t *idx = xmalloc(t->cells * sizeof(int32_t));
    for (uint32_t r = 0; r < rows; r++)
        fill_row(idx + (uint64_t)r * s->K, s->K, t->seq_lens[map[r]],
                 s->empty_pct, rng);
    for (uint32_t r = 0; r < rows; r++)
        if (rng_below(rng, 100) < s->own_pct)
            own_row(idx + (uint64_t)r * s->K, s, t->seq_lens[map[r]]);
    a->token_indices = idx;
    a->token_to_seq = map;
    a->rank = s->rank;
    a->dcp_size = s->W;
    a->block_size = s->bs;
    a->interleave = s->I;
    a->out_slots = xmalloc(t->cells * sizeof(int32_t));
    a->out_capacity = t->cells;
    a->out_indptr = xmalloc((rows + 1) * sizeof(int32_t));
    a->owned_counts = xmalloc((rows + 1) * sizeof(int32_t));
}

void topk_case_free(topk_case_t *t)
{
    free((void *)t->a.token_indices);
    free((void *)t->a.token_to_seq);
    free((void *)t->a.block_table);
    free(t->a.out_slots);
    free(t->a.out_indptr);
    free(t->a.owned_counts);
    free(t->seq_lens);
}

void slots_case_make(slots_case_t *c, uint32_t num_reqs, uint32_t q_len,
                     uint32_t bs, uint32_t W, uint64_t *rng)
{
    kvr_gpu_slots_args_t *a = &c->a;
    memset(c, 0, sizeof(*c));
    uint32_t V = bs * W;
    a->num_reqs = num_reqs;
    a->q_len = q_len;
    a->block_size = bs;
    a->dcp_size = W;
    a->max_blocks = 1 + (q_len + V - 1) / V + rng_below(rng, 20);
    a->block_table = random_table(num_reqs, a->max_blocks, rng);
    int32_t *lens = xmalloc(num_reqs * sizeof(int32_t));
    for (uint32_t i = 0; i < num_reqs; i++)
        lens[i] = rng_below(rng, 8) == 0
                      ? 0
                      : (int32_t)(q_len + rng_below(rng, a->max_blocks * V -
                                                             q_len + 1));
    a->seq_lens = lens;
    a->out_slots = xmalloc((size_t)num_reqs * q_len * sizeof(int64_t));
}

void slots_case_free(slots_case_t *c)
{
    free((void *)c->a.seq_lens);
    free((void *)c->a.block_table);
    free(c->a.out_slots);
}

static float random_lse(uint64_t *rng)
{
    static const float odd[] = {-INFINITY, NAN, INFINITY};
    if (rng_below(rng, 5) == 0)
        return odd[rng_below(rng, 3)];
    return (float)((int32_t)rng_below(rng, 4000) - 2000) / 100.0f;
}

void lse_case_make(lse_case_t *c, uint32_t W, uint32_t B, uint32_t H,
                   uint32_t D, uint64_t *rng)
{
    kvr_gpu_lse_args_t *a = &c->a;
    uint64_t BH = (uint64_t)B * H;
    memset(c, 0, sizeof(*c));
    float *lses = xmalloc(W * BH * sizeof(float));
    float *outs = xmalloc(W * BH * D * sizeof(float));
    for (uint64_t i = 0; i < W * BH; i++)
        lses[i] = random_lse(rng);
    for (uint64_t bh = 0; bh < BH; bh += 7) /* some heads empty everywhere */
        for (uint32_t r = 0; r < W; r++)
            lses[r * BH + bh] = -INFINITY;
    for (uint64_t i = 0; i < W * BH; i++)
        for (uint32_t d = 0; d < D; d++)
            outs[i * D + d] = isfinite(lses[i])
                                  ? (float)rng_below(rng, 20001) / 1e4f - 1.0f
                                  : NAN;
    *a = (kvr_gpu_lse_args_t){outs,
                              lses,
                              W,
                              B,
                              H,
                              D,
                              xmalloc(BH * D * sizeof(float)),
                              xmalloc(BH * sizeof(float))};
}

void lse_case_free(lse_case_t *c)
{
    free((void *)c->a.outs);
    free((void *)c->a.lses);
    free(c->a.out);
    free(c->a.lse);
}
