/* Reference decode ops: a worked example, brute force against a simulation
 * of DCP storage, every fault and check, the step row maps, index slots and
 * the LSE merge against dense attention. */
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include <cmocka.h>

#include "decode_case.h"

/* W = 2, I = 2, bs = 4 (V = 8): rank 0 owns positions whose g / 2 is even. */
static const int32_t EX_TABLE[] = {5, 9, 2, 7, 1, 3};
static const int32_t EX_MAP[] = {0, 1, 1};
static const int32_t EX_IDX[] = {3,  0,  -1, 17, 9,  22, /* request 0 */
                                 -1, -1, -1, -1, -1, -1, /* empty row */
                                 1,  4,  12, 2,  23, 5}; /* request 1 */

static kvr_gpu_topk_args_t example(uint32_t rank, int32_t *out, int32_t *indptr,
                                   int32_t *counts)
{
    return (kvr_gpu_topk_args_t){EX_IDX, EX_MAP, EX_TABLE, 3,      6,
                                 2,      3,      rank,     2,      4,
                                 2,      out,    18,       indptr, counts};
}

static void test_topk_example(void **state)
{
    (void)state;
    int32_t out[18], indptr[4], counts[3];
    kvr_gpu_topk_args_t a = example(0, out, indptr, counts);
    CHECK_KVR(kvr_gpu_topk_filter_ref(&a, &err));
    /* g=0 -> 5*4+0; g=17 -> 2*4 + local 9 % 4; g=9 -> 9*4 + local 5 % 4 */
    const int32_t want0[] = {20, 9, 37, 29, 30, 6, 31};
    const int32_t ptr0[] = {0, 3, 3, 7}, cnt0[] = {3, 0, 4};
    assert_memory_equal(out, want0, sizeof(want0));
    assert_memory_equal(indptr, ptr0, sizeof(ptr0));
    assert_memory_equal(counts, cnt0, sizeof(cnt0));
    a = example(1, out, indptr, counts);
    CHECK_KVR(kvr_gpu_topk_filter_ref(&a, &err));
    const int32_t want1[] = {21, 10, 28, 15}, ptr1[] = {0, 2, 2, 4};
    assert_memory_equal(out, want1, sizeof(want1));
    assert_memory_equal(indptr, ptr1, sizeof(ptr1));
}

/* Deals I-token chunks round-robin to W ranks, each appending: the owner and
 * local index of every position, independently of layout_math.h. */
static void deal(uint32_t I, uint32_t W, uint64_t len, uint32_t *owner,
                 uint64_t *local)
{
    uint64_t counts[8] = {0};
    for (uint64_t g = 0; g < len; g++) {
        owner[g] = (uint32_t)((g / I) % W);
        local[g] = counts[owner[g]]++;
    }
}

static void check_brute_force(const topk_case_t *t, const uint32_t *owner,
                              const uint64_t *local)
{
    const kvr_gpu_topk_args_t *a = &t->a;
    uint64_t V = (uint64_t)a->block_size * a->dcp_size, at = 0;
    for (uint32_t r = 0; r < a->num_rows; r++) {
        const int32_t *table = a->block_table +
                               (uint64_t)a->token_to_seq[r] * a->max_blocks;
        assert_int_equal(a->out_indptr[r], at);
        for (uint32_t c = 0; c < a->topk; c++) {
            int32_t g = a->token_indices[(uint64_t)r * a->topk + c];
            if (g < 0 || owner[g] != a->rank)
                continue;
            int64_t slot = (int64_t)table[g / V] * a->block_size +
                           (int64_t)(local[g] % a->block_size);
            assert_int_equal(a->out_slots[at++], slot);
        }
        assert_int_equal(a->owned_counts[r], at - a->out_indptr[r]);
    }
    assert_int_equal(a->out_indptr[a->num_rows], at);
}

static void test_topk_brute_force(void **state)
{
    (void)state;
    static const uint32_t WS[] = {1, 2, 4, 8}, IS[] = {1, 2, 4, 16};
    static const kvr_gpu_step_t STEPS[] = {
        KVR_GPU_STEP_DECODE, KVR_GPU_STEP_VERIFY, KVR_GPU_STEP_DRAFT};
    uint64_t rng = 42;
    uint32_t *owner = xmalloc(40 * 16 * 8 * sizeof(*owner));
    uint64_t *local = xmalloc(40 * 16 * 8 * sizeof(*local));
    for (int i = 0; i < 200; i++) {
        topk_shape_t s = {STEPS[i % 3],
                          1 + rng_below(&rng, 6),
                          1,
                          0,
                          1 + rng_below(&rng, 70),
                          WS[rng_below(&rng, 4)],
                          IS[rng_below(&rng, 4)],
                          16,
                          0,
                          25,
                          20 * (i % 2)};
        s.q_len = s.step == KVR_GPU_STEP_VERIFY ? 1 + rng_below(&rng, 4) : 1;
        s.padded_rows = s.num_reqs + rng_below(&rng, 3);
        s.rank = rng_below(&rng, s.W);
        topk_case_t t;
        topk_case_make(&t, &s, &rng);
        deal(s.I, s.W, (uint64_t)t.a.max_blocks * s.bs * s.W, owner, local);
        CHECK_KVR(kvr_gpu_topk_filter_ref(&t.a, &err));
        check_brute_force(&t, owner, local);
        topk_case_free(&t);
    }
    free(owner);
    free(local);
}

static void expect_topk(const kvr_gpu_topk_args_t *a, kvr_status_t code,
                        const char *needle)
{
    kvr_error_t err = {0};
    kvr_status_t st = kvr_gpu_topk_filter_ref(a, &err);
    if (st != code || strstr(err.msg, needle) == NULL)
        fail_msg("expected %s with \"%s\", got %s: %s", kvr_status_name(code),
                 needle, kvr_status_name(st), err.msg);
}

static void test_topk_faults(void **state)
{
    (void)state;
    int32_t out[18], indptr[4], counts[3], idx[18], map[3], table[6];
    memcpy(idx, EX_IDX, sizeof(idx));
    memcpy(map, EX_MAP, sizeof(map));
    memcpy(table, EX_TABLE, sizeof(table));
    kvr_gpu_topk_args_t a = example(0, out, indptr, counts);
    a.token_indices = idx;
    a.token_to_seq = map;
    a.block_table = table;
    map[2] = 2;
    expect_topk(&a, KVR_ERR_INVALID, "row 2: request index 2");
    map[2] = 1;
    idx[13] = 24; /* 24 / V = 3 = max_blocks */
    expect_topk(&a, KVR_ERR_INVALID, "row 2 column 1: position 24");
    idx[13] = -7;
    expect_topk(&a, KVR_ERR_INVALID, "position -7");
    idx[13] = 4;
    table[3] = -1;
    expect_topk(&a, KVR_ERR_INVALID, "row 2 column 0: block-table entry -1");
    table[3] = INT32_MAX / 2;
    expect_topk(&a, KVR_ERR_INVALID, "exceeds INT32_MAX");
    a = example(2, out, indptr, counts);
    expect_topk(&a, KVR_ERR_RANK_RANGE, "DCP rank 2");
    a = example(0, out, indptr, counts);
    a.interleave = 3;
    expect_topk(&a, KVR_ERR_INTERLEAVE_NOT_DIVISOR, "interleave 3");
    a = example(0, out, indptr, counts);
    a.out_capacity = 17;
    expect_topk(&a, KVR_ERR_INVALID, "need 18");
    a = example(0, out, indptr, counts);
    a.topk = 0;
    expect_topk(&a, KVR_ERR_INVALID, "K is 0");
    a = example(0, out, indptr, counts);
    a.num_rows = 70000;
    a.topk = 70000;
    expect_topk(&a, KVR_ERR_INVALID, "exceed the int32 indptr");
    a = example(0, out, indptr, counts);
    a.block_table = NULL;
    expect_topk(&a, KVR_ERR_INVALID, "pointer is NULL");
    a = example(0, out, indptr, counts);
    a.num_rows = 0;
    a.token_indices = NULL;
    CHECK_KVR(kvr_gpu_topk_filter_ref(&a, &err));
    assert_int_equal(indptr[0], 0);
}

static void test_row_maps(void **state)
{
    (void)state;
    int32_t out[16];
    kvr_gpu_rows_args_t a = {KVR_GPU_STEP_DECODE, 3, 1, 0, out, 16};
    CHECK_KVR(kvr_gpu_rows_ref(&a, &err));
    assert_memory_equal(out, ((int32_t[]){0, 1, 2}), 3 * sizeof(int32_t));
    a = (kvr_gpu_rows_args_t){KVR_GPU_STEP_VERIFY, 3, 3, 0, out, 16};
    CHECK_KVR(kvr_gpu_rows_ref(&a, &err));
    assert_memory_equal(out, ((int32_t[]){0, 0, 0, 1, 1, 1, 2, 2, 2}),
                        9 * sizeof(int32_t));
    a = (kvr_gpu_rows_args_t){KVR_GPU_STEP_DRAFT, 3, 1, 5, out, 16};
    uint32_t rows = 0;
    CHECK_KVR(kvr_gpu_rows_count(&a, &rows, &err));
    assert_int_equal(rows, 5);
    CHECK_KVR(kvr_gpu_rows_ref(&a, &err));
    assert_memory_equal(out, ((int32_t[]){0, 1, 2, 3, 4}), 5 * sizeof(int32_t));
    kvr_error_t err = {0};
    a = (kvr_gpu_rows_args_t){KVR_GPU_STEP_DECODE, 3, 2, 0, out, 16};
    assert_int_equal(kvr_gpu_rows_ref(&a, &err), KVR_ERR_INVALID);
    assert_non_null(
        strstr(err.msg, "decode step has one row per request, q_len 2"));
    a = (kvr_gpu_rows_args_t){KVR_GPU_STEP_DRAFT, 3, 1, 2, out, 16};
    assert_int_equal(kvr_gpu_rows_ref(&a, &err), KVR_ERR_INVALID);
    assert_non_null(strstr(err.msg, "2 padded rows < 3 requests"));
    a = (kvr_gpu_rows_args_t){KVR_GPU_STEP_VERIFY, 6, 3, 0, out, 16};
    assert_int_equal(kvr_gpu_rows_ref(&a, &err), KVR_ERR_INVALID);
    assert_non_null(strstr(err.msg, "18 rows: out holds 16"));
    a.step = (kvr_gpu_step_t)9;
    assert_int_equal(kvr_gpu_rows_ref(&a, &err), KVR_ERR_INVALID);
}

static void test_index_slots(void **state)
{
    (void)state;
    /* bs 4, W 2: V 8. Request 0 at length 10, q_len 3: positions 7, 8, 9. */
    int32_t lens[] = {10, 0}, table[] = {6, 2, 9, 4, 5, 1};
    int64_t out[6];
    kvr_gpu_slots_args_t a = {lens, table, 2, 3, 3, 4, 2, out};
    CHECK_KVR(kvr_gpu_index_slots_ref(&a, &err));
    const int64_t want[] = {6 * 8 + 7, 2 * 8 + 0, 2 * 8 + 1, -1, -1, -1};
    assert_memory_equal(out, want, sizeof(want));
    kvr_error_t err = {0};
    lens[1] = 2;
    assert_int_equal(kvr_gpu_index_slots_ref(&a, &err), KVR_ERR_INVALID);
    assert_non_null(strstr(err.msg, "request 1: seq_len 2"));
    lens[1] = 25; /* needs 4 blocks of 8 */
    assert_int_equal(kvr_gpu_index_slots_ref(&a, &err), KVR_ERR_INVALID);
    lens[1] = 24;
    table[5] = -3;
    assert_int_equal(kvr_gpu_index_slots_ref(&a, &err), KVR_ERR_INVALID);
    assert_non_null(strstr(err.msg, "row 1 column 0: block-table entry -3"));
    a.q_len = 0;
    assert_int_equal(kvr_gpu_index_slots_ref(&a, &err), KVR_ERR_INVALID);
    a.q_len = 1;
    a.dcp_size = 0;
    assert_int_equal(kvr_gpu_index_slots_ref(&a, &err), KVR_ERR_DCP_LT1);
}

/* Softmax attention of one query over `n` keys with scalar values. */
static void attend(const double *score, const double *value, int n, double *out,
                   double *lse)
{
    double m = -INFINITY, s = 0, o = 0;
    for (int i = 0; i < n; i++)
        m = fmax(m, score[i]);
    for (int i = 0; i < n; i++) {
        s += exp(score[i] - m);
        o += exp(score[i] - m) * value[i];
    }
    *lse = n ? log(s) + m : -INFINITY;
    *out = n ? o / s : NAN;
}

/* Keys dealt to W ranks; the merged partials equal attention over all. */
static void test_lse_matches_dense(void **state)
{
    (void)state;
    uint64_t rng = 7;
    for (uint32_t W = 1; W <= 8; W++) {
        double score[64], value[64], part_s[8][64], part_v[8][64], o, l;
        int n[8] = {0};
        float outs[8], lses[8], merged, merged_lse;
        for (int k = 0; k < 64; k++) {
            score[k] = (double)rng_below(&rng, 2000) / 100.0 - 10.0;
            value[k] = (double)rng_below(&rng, 2000) / 1000.0 - 1.0;
            uint32_t r = rng_below(&rng,
                                   W > 1 ? W - 1 : 1); /* last rank empty */
            part_s[r][n[r]] = score[k];
            part_v[r][n[r]++] = value[k];
        }
        for (uint32_t r = 0; r < W; r++) {
            double po, pl;
            attend(part_s[r], part_v[r], n[r], &po, &pl);
            outs[r] = (float)po;
            lses[r] = (float)pl;
        }
        kvr_gpu_lse_args_t a = {outs, lses, W, 1, 1, 1, &merged, &merged_lse};
        CHECK_KVR(kvr_gpu_lse_merge_ref(&a, &err));
        attend(score, value, 64, &o, &l);
        assert_true(fabs(merged - o) < 1e-5);
        assert_true(fabs(merged_lse - l) < 1e-4);
    }
}

static void test_lse_empty_ranks(void **state)
{
    (void)state;
    float outs[] = {0.5f, NAN, -2.0f, NAN},
          lses[] = {1.0f, NAN, 1.0f, INFINITY};
    float out[1], lse[1];
    kvr_gpu_lse_args_t a = {outs, lses, 4, 1, 1, 1, out, lse};
    CHECK_KVR(kvr_gpu_lse_merge_ref(&a, &err));
    assert_true(fabsf(out[0] - (-0.75f)) < 1e-6f); /* half of each */
    assert_true(fabsf(lse[0] - (1.0f + logf(2.0f))) < 1e-6f);
    float none[] = {-INFINITY, NAN, INFINITY, -INFINITY};
    a.lses = none;
    CHECK_KVR(kvr_gpu_lse_merge_ref(&a, &err));
    assert_true(out[0] == 0.0f && !signbit(out[0]));
    assert_true(isinf(lse[0]) && lse[0] < 0);
    kvr_error_t err = {0};
    a.ranks = 0;
    assert_int_equal(kvr_gpu_lse_merge_ref(&a, &err), KVR_ERR_DCP_LT1);
    a.ranks = 1;
    a.out = NULL;
    assert_int_equal(kvr_gpu_lse_merge_ref(&a, &err), KVR_ERR_INVALID);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_topk_example),
        cmocka_unit_test(test_topk_brute_force),
        cmocka_unit_test(test_topk_faults),
        cmocka_unit_test(test_row_maps),
        cmocka_unit_test(test_index_slots),
        cmocka_unit_test(test_lse_matches_dense),
        cmocka_unit_test(test_lse_empty_ranks),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
