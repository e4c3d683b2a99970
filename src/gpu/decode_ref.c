/* Decode-side DCP ops (docs/design.md §10): argument checks shared with the CUDA
 * launchers, and the C reference of each op. */
#include <math.h>
#include <stdio.h>

#include "gpu_internal.h"

typedef unsigned long long ull;

static kvr_status_t check_dcp(uint32_t bs, uint32_t W, uint32_t I,
                              uint32_t rank, kvr_error_t *err)
{
    kvr_layout_t lay = KVR_LAYOUT_INIT;
    lay.block_size = bs;
    lay.dcp_size = W;
    lay.interleave = I;
    lay.tp = W ? W : 1;
    kvr_status_t st = kvr_layout_check_rank(&lay, rank, err);
    if (st == KVR_OK && (uint64_t)bs * W > INT32_MAX)
        return kvr_error_set(err, KVR_ERR_UNSUPPORTED,
                             "virtual block bs %u * W %u exceeds INT32_MAX", bs,
                             W);
    return st;
}

kvr_status_t kvr__topk_check(const kvr_gpu_topk_args_t *a, kvr_error_t *err)
{
    if (a == NULL)
        return kvr_error_set(err, KVR_ERR_INVALID, "top-k arguments are NULL");
    kvr_status_t st = check_dcp(a->block_size, a->dcp_size, a->interleave,
                                a->rank, err);
    if (st != KVR_OK)
        return st;
    uint64_t cells = (uint64_t)a->num_rows * a->topk;
    if (a->topk == 0)
        return kvr_error_set(err, KVR_ERR_INVALID, "top-k width K is 0");
    if (cells > INT32_MAX)
        return kvr_error_set(err, KVR_ERR_INVALID,
                             "%u rows * K %u = %llu candidates exceed the "
                             "int32 indptr",
                             a->num_rows, a->topk, (ull)cells);
    if (a->out_capacity < cells)
        return kvr_error_set(err, KVR_ERR_INVALID,
                             "out_slots holds %llu entries, %u rows * K %u "
                             "need %llu",
                             (ull)a->out_capacity, a->num_rows, a->topk,
                             (ull)cells);
    if (a->out_indptr == NULL)
        return kvr_error_set(err, KVR_ERR_INVALID, "out_indptr is NULL");
    if (a->num_rows == 0)
        return KVR_OK;
    if (a->num_reqs == 0 || a->max_blocks == 0)
        return kvr_error_set(err, KVR_ERR_INVALID,
                             "%u rows but a block table of %u requests x %u "
                             "blocks",
                             a->num_rows, a->num_reqs, a->max_blocks);
    if (a->token_indices == NULL || a->token_to_seq == NULL ||
        a->block_table == NULL || a->out_slots == NULL ||
        a->owned_counts == NULL)
        return kvr_error_set(err, KVR_ERR_INVALID,
                             "a top-k input or output pointer is NULL");
    return KVR_OK;
}

kvr_status_t kvr__fault_status(const kvr__fault_t *f, kvr_error_t *err)
{
    switch ((kvr__fault_code_t)f->code) {
    case KVR__FAULT_NONE:
        return KVR_OK;
    case KVR__FAULT_SEQ:
        return kvr_error_set(err, KVR_ERR_INVALID,
                             "top-k row %d: request index %d is outside the "
                             "block table",
                             f->row, f->value);
    case KVR__FAULT_POS:
        return kvr_error_set(err, KVR_ERR_INVALID,
                             "top-k row %d column %d: position %d is neither "
                             "-1 nor inside the block table",
                             f->row, f->col, f->value);
    case KVR__FAULT_BLOCK:
        return kvr_error_set(err, KVR_ERR_INVALID,
                             "row %d column %d: block-table entry %d is "
                             "negative",
                             f->row, f->col, f->value);
    case KVR__FAULT_SLOT:
        return kvr_error_set(err, KVR_ERR_INVALID,
                             "top-k row %d column %d: the slot in block %d "
                             "exceeds INT32_MAX",
                             f->row, f->col, f->value);
    case KVR__FAULT_SEQ_LEN:
        return kvr_error_set(err, KVR_ERR_INVALID,
                             "request %d: seq_len %d is negative, below q_len "
                             "or past the block table",
                             f->row, f->value);
    }
    return kvr_error_set(err, KVR_ERR_INVALID, "unknown fault %d", f->code);
}

static kvr_status_t fault(kvr__fault_code_t code, int64_t row, int64_t col,
                          int32_t value, kvr_error_t *err)
{
    kvr__fault_t f = {(int32_t)code, (int32_t)row, (int32_t)col, value};
    return kvr__fault_status(&f, err);
}

/* Appends row `row`'s owned slots at out[*pos]. */
static kvr_status_t topk_row(const kvr_gpu_topk_args_t *a, uint32_t row,
                             int64_t *pos, kvr_error_t *err)
{
    uint64_t bs = a->block_size, W = a->dcp_size, I = a->interleave;
    uint64_t V = bs * W;
    int32_t req = a->token_to_seq[row];
    if (req < 0 || (uint32_t)req >= a->num_reqs)
        return fault(KVR__FAULT_SEQ, row, -1, req, err);
    const int32_t *table = a->block_table + (uint64_t)req * a->max_blocks;
    const int32_t *cand = a->token_indices + (uint64_t)row * a->topk;
    for (uint32_t c = 0; c < a->topk; c++) {
        int32_t g = cand[c];
        if (g == -1)
            continue;
        if (g < -1 || (uint64_t)g / V >= a->max_blocks)
            return fault(KVR__FAULT_POS, row, c, g, err);
        if (kvr__owner((uint64_t)g, I, W) != a->rank)
            continue;
        int32_t entry = table[(uint64_t)g / V];
        if (entry < 0)
            return fault(KVR__FAULT_BLOCK, row, c, entry, err);
        uint64_t slot = kvr__dst_slot((const uint32_t *)table, (uint64_t)g, bs,
                                      I, W);
        if (slot > INT32_MAX)
            return fault(KVR__FAULT_SLOT, row, c, entry, err);
        a->out_slots[(*pos)++] = (int32_t)slot;
    }
    return KVR_OK;
}

kvr_status_t kvr_gpu_topk_filter_ref(const kvr_gpu_topk_args_t *a,
                                     kvr_error_t *err)
{
    kvr_status_t st = kvr__topk_check(a, err);
    if (st != KVR_OK)
        return st;
    int64_t pos = 0;
    a->out_indptr[0] = 0;
    for (uint32_t row = 0; row < a->num_rows; row++) {
        st = topk_row(a, row, &pos, err);
        if (st != KVR_OK)
            return st;
        a->owned_counts[row] = (int32_t)(pos - a->out_indptr[row]);
        a->out_indptr[row + 1] = (int32_t)pos;
    }
    return KVR_OK;
}

kvr_status_t kvr_gpu_rows_count(const kvr_gpu_rows_args_t *a, uint32_t *rows,
                                kvr_error_t *err)
{
    if (a == NULL || rows == NULL)
        return kvr_error_set(err, KVR_ERR_INVALID,
                             "row-map arguments are NULL");
    uint64_t n;
    switch (a->step) {
    case KVR_GPU_STEP_DECODE:
    case KVR_GPU_STEP_DRAFT:
        if (a->q_len != 1)
            return kvr_error_set(
                err, KVR_ERR_INVALID,
                "%s step has one row per request, q_len %u",
                a->step == KVR_GPU_STEP_DECODE ? "decode" : "draft", a->q_len);
        if (a->step == KVR_GPU_STEP_DRAFT && a->padded_rows < a->num_reqs)
            return kvr_error_set(err, KVR_ERR_INVALID,
                                 "draft step: %u padded rows < %u requests",
                                 a->padded_rows, a->num_reqs);
        n = a->step == KVR_GPU_STEP_DRAFT ? a->padded_rows : a->num_reqs;
        break;
    case KVR_GPU_STEP_VERIFY:
        if (a->q_len == 0)
            return kvr_error_set(err, KVR_ERR_INVALID, "verify step: q_len 0");
        n = (uint64_t)a->num_reqs * a->q_len;
        break;
    default:
        return kvr_error_set(err, KVR_ERR_INVALID, "unknown step kind %d",
                             (int)a->step);
    }
    if (n > INT32_MAX || n > a->out_capacity)
        return kvr_error_set(err, KVR_ERR_INVALID,
                             "%llu rows: out holds %u, the limit is INT32_MAX",
                             (ull)n, a->out_capacity);
    if (n > 0 && a->out == NULL)
        return kvr_error_set(err, KVR_ERR_INVALID, "row-map out is NULL");
    *rows = (uint32_t)n;
    return KVR_OK;
}

kvr_status_t kvr_gpu_rows_ref(const kvr_gpu_rows_args_t *a, kvr_error_t *err)
{
    uint32_t rows = 0;
    kvr_status_t st = kvr_gpu_rows_count(a, &rows, err);
    for (uint32_t t = 0; st == KVR_OK && t < rows; t++)
        a->out[t] = (int32_t)(a->step == KVR_GPU_STEP_VERIFY ? t / a->q_len
                                                             : t);
    return st;
}

kvr_status_t kvr__slots_check(const kvr_gpu_slots_args_t *a, kvr_error_t *err)
{
    if (a == NULL)
        return kvr_error_set(err, KVR_ERR_INVALID, "slot arguments are NULL");
    kvr_status_t st = check_dcp(a->block_size, a->dcp_size, 1, 0, err);
    if (st != KVR_OK)
        return st;
    if (a->q_len == 0)
        return kvr_error_set(err, KVR_ERR_INVALID, "q_len is 0");
    if ((uint64_t)a->num_reqs * a->q_len > INT32_MAX)
        return kvr_error_set(err, KVR_ERR_INVALID,
                             "%u requests * q_len %u exceed INT32_MAX",
                             a->num_reqs, a->q_len);
    if (a->num_reqs == 0)
        return KVR_OK;
    if (a->max_blocks == 0 || a->seq_lens == NULL || a->block_table == NULL ||
        a->out_slots == NULL)
        return kvr_error_set(err, KVR_ERR_INVALID,
                             "%u requests but an empty block table or a NULL "
                             "pointer",
                             a->num_reqs);
    return KVR_OK;
}

static kvr_status_t slots_request(const kvr_gpu_slots_args_t *a, uint32_t i,
                                  kvr_error_t *err)
{
    uint64_t V = (uint64_t)a->block_size * a->dcp_size, q = a->q_len;
    int32_t L = a->seq_lens[i];
    int64_t *out = a->out_slots + i * q;
    const int32_t *table = a->block_table + (uint64_t)i * a->max_blocks;
    if (L == 0) {
        for (uint64_t k = 0; k < q; k++)
            out[k] = -1;
        return KVR_OK;
    }
    if (L < 0 || (uint64_t)L < q ||
        kvr__ceil_div((uint64_t)L, V) > a->max_blocks)
        return fault(KVR__FAULT_SEQ_LEN, i, -1, L, err);
    for (uint64_t k = 0; k < q; k++) {
        uint64_t t = (uint64_t)L - q + k;
        if (table[t / V] < 0)
            return fault(KVR__FAULT_BLOCK, i, (int64_t)k, table[t / V], err);
        out[k] = (int64_t)kvr__dst_slot_repl((const uint32_t *)table, t,
                                             a->block_size, a->dcp_size);
    }
    return KVR_OK;
}

kvr_status_t kvr_gpu_index_slots_ref(const kvr_gpu_slots_args_t *a,
                                     kvr_error_t *err)
{
    kvr_status_t st = kvr__slots_check(a, err);
    for (uint32_t i = 0; st == KVR_OK && i < a->num_reqs; i++)
        st = slots_request(a, i, err);
    return st;
}

kvr_status_t kvr__lse_check(const kvr_gpu_lse_args_t *a, kvr_error_t *err)
{
    if (a == NULL)
        return kvr_error_set(err, KVR_ERR_INVALID, "LSE arguments are NULL");
    if (a->ranks == 0)
        return kvr_error_set(err, KVR_ERR_DCP_LT1, "LSE merge over 0 ranks");
    uint64_t bh = (uint64_t)a->batch * a->heads;
    if (bh == 0)
        return KVR_OK;
    if (a->lses == NULL || (a->head_dim && (a->outs == NULL || a->out == NULL)))
        return kvr_error_set(err, KVR_ERR_INVALID,
                             "LSE merge of %u x %u heads: a pointer is NULL",
                             a->batch, a->heads);
    return KVR_OK;
}

/* NaN and +inf mean "no keys" like -inf. */
static float sane(float lse)
{
    return isnan(lse) || lse == INFINITY ? -INFINITY : lse;
}

static void lse_merge_one(const kvr_gpu_lse_args_t *a, uint64_t bh)
{
    uint64_t BH = (uint64_t)a->batch * a->heads, D = a->head_dim;
    float m = -INFINITY, sum = 0.0f;
    for (uint32_t i = 0; i < a->ranks; i++)
        m = fmaxf(m, sane(a->lses[i * BH + bh]));
    if (m == -INFINITY)
        m = 0.0f;
    for (uint32_t i = 0; i < a->ranks; i++)
        sum += expf(sane(a->lses[i * BH + bh]) - m);
    float G = logf(sum) + m;
    for (uint64_t d = 0; d < D; d++)
        a->out[bh * D + d] = 0.0f;
    for (uint32_t i = 0; i < a->ranks; i++) {
        float f = expf(sane(sane(a->lses[i * BH + bh]) - G));
        for (uint64_t d = 0; f > 0.0f && d < D; d++)
            a->out[bh * D + d] += f * a->outs[(i * BH + bh) * D + d];
    }
    if (a->lse != NULL)
        a->lse[bh] = G;
}

kvr_status_t kvr_gpu_lse_merge_ref(const kvr_gpu_lse_args_t *a,
                                   kvr_error_t *err)
{
    kvr_status_t st = kvr__lse_check(a, err);
    if (st != KVR_OK)
        return st;
    for (uint64_t bh = 0; bh < (uint64_t)a->batch * a->heads; bh++)
        lse_merge_one(a, bh);
    return KVR_OK;
}
