/* Decode ops on the GPU against the C reference, on fresh random inputs:
 * top-k filter (empty rows, -1 entries, I > 1, several requests, q_len > 1,
 * W in {1, 2, 4, 8}, K below, at and above one tile, graph replays, faults),
 * row maps, index slots, LSE merge. Exit 77 without a CUDA device. */
#include <cuda_runtime_api.h>
#include <math.h>
#include <string.h>

#include "decode_case.h"

#define CUDA_OK(call)                                                          \
    do {                                                                       \
        cudaError_t e_ = (call);                                               \
        CHECK(e_ == cudaSuccess, "%s", cudaGetErrorString(e_));                \
    } while (0)

static void *to_device(const void *host, size_t bytes)
{
    void *p = NULL;
    CUDA_OK(cudaMalloc(&p, bytes ? bytes : 1));
    if (host != NULL && bytes > 0)
        CUDA_OK(cudaMemcpy(p, host, bytes, cudaMemcpyHostToDevice));
    return p;
}

static void *to_host(const void *dev, size_t bytes)
{
    void *p = xmalloc(bytes);
    CUDA_OK(cudaMemcpy(p, dev, bytes, cudaMemcpyDeviceToHost));
    return p;
}

/* Device copy of a top-k case, outputs poisoned. */
static kvr_gpu_topk_args_t topk_device(const topk_case_t *t)
{
    kvr_gpu_topk_args_t d = t->a;
    size_t rows = t->a.num_rows, cells = t->cells * sizeof(int32_t);
    d.token_indices = to_device(t->a.token_indices, cells);
    d.token_to_seq = to_device(t->a.token_to_seq, rows * sizeof(int32_t));
    d.block_table = to_device(t->a.block_table,
                              (size_t)t->a.num_reqs * t->a.max_blocks * 4);
    d.out_slots = to_device(NULL, cells);
    d.out_indptr = to_device(NULL, (rows + 1) * sizeof(int32_t));
    d.owned_counts = to_device(NULL, (rows + 1) * sizeof(int32_t));
    return d;
}

static void poison_topk(const kvr_gpu_topk_args_t *d, uint64_t cells)
{
    CUDA_OK(cudaMemset(d->out_slots, 0xff, cells * 4));
    CUDA_OK(cudaMemset(d->out_indptr, 0xff, (d->num_rows + 1) * 4));
    CUDA_OK(cudaMemset(d->owned_counts, 0xff, d->num_rows * 4));
}

static void free_topk(kvr_gpu_topk_args_t *d)
{
    cudaFree((void *)d->token_indices);
    cudaFree((void *)d->token_to_seq);
    cudaFree((void *)d->block_table);
    cudaFree(d->out_slots);
    cudaFree(d->out_indptr);
    cudaFree(d->owned_counts);
}

static void compare_topk(const topk_case_t *t, const kvr_gpu_topk_args_t *d)
{
    uint32_t rows = t->a.num_rows;
    int32_t *ptr = to_host(d->out_indptr, (rows + 1) * 4);
    int32_t *cnt = to_host(d->owned_counts, (rows ? rows : 1) * 4);
    CHECK(memcmp(ptr, t->a.out_indptr, (rows + 1) * 4) == 0, "indptr differs");
    CHECK(memcmp(cnt, t->a.owned_counts, rows * 4) == 0, "owned counts differ");
    size_t n = (size_t)ptr[rows];
    int32_t *slots = to_host(d->out_slots, (n ? n : 1) * 4);
    for (size_t i = 0; i < n; i++)
        CHECK(slots[i] == t->a.out_slots[i], "slot %zu: %d, want %d", i,
              slots[i], t->a.out_slots[i]);
    free(ptr);
    free(cnt);
    free(slots);
}

static void check_topk(kvr_gpu_decode_t *dec, const topk_shape_t *s,
                       uint64_t *rng, int graph)
{
    topk_case_t t;
    topk_case_make(&t, s, rng);
    CHECK_KVR(kvr_gpu_topk_filter_ref(&t.a, &err));
    kvr_gpu_topk_args_t d = topk_device(&t);
    cudaStream_t st;
    CUDA_OK(cudaStreamCreate(&st));
    poison_topk(&d, t.cells);
    CHECK_KVR(kvr_gpu_topk_filter(dec, &d, st, &err));
    CHECK_KVR(kvr_gpu_decode_check(dec, st, &err));
    compare_topk(&t, &d);
    if (graph) {
        cudaGraph_t g;
        cudaGraphExec_t exec;
        CUDA_OK(cudaStreamBeginCapture(st, cudaStreamCaptureModeGlobal));
        CHECK_KVR(kvr_gpu_topk_filter(dec, &d, st, &err));
        CUDA_OK(cudaStreamEndCapture(st, &g));
        CUDA_OK(cudaGraphInstantiate(&exec, g, 0));
        for (int i = 0; i < 3; i++) {
            poison_topk(&d, t.cells);
            CUDA_OK(cudaGraphLaunch(exec, st));
            CHECK_KVR(kvr_gpu_decode_check(dec, st, &err));
            compare_topk(&t, &d);
        }
        CUDA_OK(cudaGraphExecDestroy(exec));
        CUDA_OK(cudaGraphDestroy(g));
    }
    CUDA_OK(cudaStreamDestroy(st));
    free_topk(&d);
    topk_case_free(&t);
}

/* A planted bad position: the GPU drops it, and the check reports what the
 * reference reports; the next check is clean. */
static void check_topk_fault(kvr_gpu_decode_t *dec, uint64_t *rng)
{
    topk_shape_t s = {KVR_GPU_STEP_VERIFY, 5, 2, 0, 300, 4, 2, 16, 1, 10, 0};
    topk_case_t t;
    topk_case_make(&t, &s, rng);
    int32_t *idx = (int32_t *)t.a.token_indices;
    idx[3 * 300 + 17] = (int32_t)(t.a.max_blocks * 16 * 4);
    kvr_error_t want = {0}, got = {0};
    CHECK(kvr_gpu_topk_filter_ref(&t.a, &want) == KVR_ERR_INVALID, "ref ok?");
    kvr_gpu_topk_args_t d = topk_device(&t);
    CHECK_KVR(kvr_gpu_topk_filter(dec, &d, NULL, &err));
    kvr_status_t st = kvr_gpu_decode_check(dec, NULL, &got);
    CHECK(st == KVR_ERR_INVALID && strcmp(got.msg, want.msg) == 0,
          "GPU fault \"%s\", reference \"%s\"", got.msg, want.msg);
    CHECK_KVR(kvr_gpu_decode_check(dec, NULL, &err));
    free_topk(&d);
    topk_case_free(&t);
}

/* A poisoned block-table entry under an owned candidate: `bad` negative
 * (a block fault) or so large that the slot passes INT32_MAX (a slot
 * fault). Several candidates may sit on the entry, so the GPU may report
 * another one than the reference: the check is that the reported row and
 * column hold an owned candidate on that entry. */
static void check_topk_table_fault(kvr_gpu_decode_t *dec, uint64_t *rng,
                                   uint32_t W, int32_t bad)
{
    topk_shape_t s = {KVR_GPU_STEP_VERIFY, 5, 2, 0, 300, W, 2, 16, 1, 10, 0};
    topk_case_t t;
    topk_case_make(&t, &s, rng);
    const int32_t *idx = t.a.token_indices;
    int32_t *table = (int32_t *)t.a.block_table;
    uint64_t V = (uint64_t)s.bs * W, at = UINT64_MAX;
    for (uint64_t c = 0; c < t.cells && at == UINT64_MAX; c++)
        if (idx[c] >= 0 && (uint32_t)idx[c] / s.I % W == s.rank)
            at = (uint64_t)t.a.token_to_seq[c / s.K] * t.a.max_blocks +
                 (uint64_t)idx[c] / V;
    CHECK(at != UINT64_MAX, "no owned candidate in the fault case");
    table[at] = bad;
    kvr_error_t want = {0}, got = {0};
    CHECK(kvr_gpu_topk_filter_ref(&t.a, &want) == KVR_ERR_INVALID, "ref ok?");
    kvr_gpu_topk_args_t d = topk_device(&t);
    CHECK_KVR(kvr_gpu_topk_filter(dec, &d, NULL, &err));
    CHECK(kvr_gpu_decode_check(dec, NULL, &got) == KVR_ERR_INVALID,
          "no fault for entry %d", bad);
    int row = -1, col = -1, value = 0;
    int n = bad < 0 ? sscanf(got.msg, "row %d column %d: block-table entry %d",
                             &row, &col, &value)
                    : sscanf(got.msg,
                             "top-k row %d column %d: the slot in block %d",
                             &row, &col, &value);
    CHECK(n == 3 && value == bad && row >= 0 && (uint32_t)row < t.a.num_rows &&
              col >= 0 && (uint32_t)col < s.K,
          "GPU fault \"%s\", reference \"%s\"", got.msg, want.msg);
    int32_t g = idx[(uint64_t)row * s.K + (uint32_t)col];
    CHECK(g >= 0 && (uint32_t)g / s.I % W == s.rank &&
              (uint64_t)t.a.token_to_seq[row] * t.a.max_blocks +
                      (uint32_t)g / V ==
                  at,
          "GPU fault \"%s\" names a candidate off the poisoned entry", got.msg);
    CHECK_KVR(kvr_gpu_decode_check(dec, NULL, &err));
    free_topk(&d);
    topk_case_free(&t);
}

static void check_topk_all(void)
{
    static const uint32_t WS[] = {1, 2, 3, 4, 8}, IS[] = {1, 4, 64, 2};
    static const uint32_t KS[] = {2048, 100, 5000, 7, 2047};
    static const kvr_gpu_step_t STEPS[] = {
        KVR_GPU_STEP_DECODE, KVR_GPU_STEP_VERIFY, KVR_GPU_STEP_DRAFT};
    uint64_t rng = 0x746f706bull;
    kvr_gpu_decode_t *dec = NULL;
    CHECK_KVR(kvr_gpu_decode_create(40000, &dec, &err));
    int n = 0;
    for (int i = 0; i < 240; i++, n++) {
        topk_shape_t s = {STEPS[i % 3],
                          1 + rng_below(&rng, 200),
                          1,
                          0,
                          KS[rng_below(&rng, 5)],
                          WS[rng_below(&rng, 5)],
                          IS[rng_below(&rng, 4)],
                          64,
                          0,
                          20 * rng_below(&rng, 3),
                          10 * (i % 2)};
        s.q_len = s.step == KVR_GPU_STEP_VERIFY ? 1 + rng_below(&rng, 4) : 1;
        s.padded_rows = s.num_reqs + rng_below(&rng, 9);
        s.rank = rng_below(&rng, s.W);
        check_topk(dec, &s, &rng, i % 20 == 0);
    }
    topk_shape_t big = {
        KVR_GPU_STEP_DECODE, 4096, 1, 0, 2048, 4, 1, 64, 3, 10, 0};
    check_topk(dec, &big, &rng, 1);
    /* Rows owning more than a slice of shared memory holds, at every W. */
    for (uint32_t i = 0; i < 5; i++, n++) {
        topk_shape_t own = {
            KVR_GPU_STEP_VERIFY, 300, 3,         0, KS[i], WS[i],
            IS[i % 4],           64,  WS[i] - 1, 5, 30};
        check_topk(dec, &own, &rng, i == 0);
    }
    /* More tiles than the device holds at once: blocks look back over
     * tiles whose blocks have finished. */
    topk_shape_t many = {
        KVR_GPU_STEP_DECODE, 8192, 1, 0, 128, 8, 4, 16, 5, 10, 20};
    check_topk(dec, &many, &rng, 1);
    /* 40000 short rows: 5000 tiles, many waves of blocks. */
    topk_shape_t waves = {
        KVR_GPU_STEP_DECODE, 40000, 1, 0, 16, 2, 1, 16, 1, 10, 20};
    check_topk(dec, &waves, &rng, 1);
    n += 2;
    check_topk_fault(dec, &rng);
    for (uint32_t W = 3; W <= 4; W++) { /* the general and the POW2 kernel */
        check_topk_table_fault(dec, &rng, W, -7);
        check_topk_table_fault(dec, &rng, W, INT32_MAX / 16 + 1);
    }
    kvr_gpu_decode_destroy(dec);
    printf("top-k: %d cases\n", n + 6);
}

static void check_rows(void)
{
    static const kvr_gpu_rows_args_t CASES[] = {
        {KVR_GPU_STEP_DECODE, 37, 1, 0, NULL, 0},
        {KVR_GPU_STEP_VERIFY, 37, 4, 0, NULL, 0},
        {KVR_GPU_STEP_DRAFT, 37, 1, 64, NULL, 0},
    };
    for (int i = 0; i < 3; i++) {
        kvr_gpu_rows_args_t a = CASES[i];
        uint32_t rows = 0;
        int32_t want[256];
        a.out = want;
        a.out_capacity = 256;
        CHECK_KVR(kvr_gpu_rows_ref(&a, &err));
        CHECK_KVR(kvr_gpu_rows_count(&a, &rows, &err));
        a.out = to_device(NULL, rows * 4);
        CHECK_KVR(kvr_gpu_rows(&a, NULL, &err));
        int32_t *got = to_host(a.out, rows * 4);
        CHECK(memcmp(got, want, rows * 4) == 0, "row map %d differs", i);
        free(got);
        cudaFree(a.out);
    }
}

static void check_slots(kvr_gpu_decode_t *dec, uint64_t *rng)
{
    static const uint32_t WS[] = {1, 2, 4, 8}, QS[] = {1, 2, 4};
    for (int i = 0; i < 48; i++) {
        slots_case_t c;
        slots_case_make(&c, 1 + rng_below(rng, 300), QS[i % 3], i % 2 ? 64 : 16,
                        WS[(i / 3) % 4], rng);
        if (i == 47)
            ((int32_t *)c.a.seq_lens)[0] = (int32_t)c.a.q_len - 1 +
                                           (c.a.q_len == 1);
        kvr_error_t want = {0}, got = {0};
        kvr_status_t ref = kvr_gpu_index_slots_ref(&c.a, &want);
        kvr_gpu_slots_args_t d = c.a;
        size_t n = (size_t)c.a.num_reqs * c.a.q_len;
        d.seq_lens = to_device(c.a.seq_lens, c.a.num_reqs * 4);
        d.block_table = to_device(c.a.block_table,
                                  (size_t)c.a.num_reqs * c.a.max_blocks * 4);
        d.out_slots = to_device(NULL, n * 8);
        CHECK_KVR(kvr_gpu_index_slots(dec, &d, NULL, &err));
        kvr_status_t st = kvr_gpu_decode_check(dec, NULL, &got);
        CHECK(st == ref && strcmp(got.msg, want.msg) == 0,
              "slots case %d: GPU %s \"%s\", reference %s \"%s\"", i,
              kvr_status_name(st), got.msg, kvr_status_name(ref), want.msg);
        int64_t *out = to_host(d.out_slots, n * 8);
        CHECK(ref != KVR_OK || memcmp(out, c.a.out_slots, n * 8) == 0,
              "slots case %d differ", i);
        free(out);
        cudaFree((void *)d.seq_lens);
        cudaFree((void *)d.block_table);
        cudaFree(d.out_slots);
        slots_case_free(&c);
    }
}

static int close_enough(float got, float want)
{
    if (isinf(want) || want == 0.0f)
        return got == want;
    return !isnan(got) && fabsf(got - want) <= 1e-5f * fmaxf(1.0f, fabsf(want));
}

static void check_lse(uint64_t *rng)
{
    static const uint32_t WS[] = {1, 2, 4, 8}, DS[] = {512, 33};
    for (int i = 0; i < 8; i++) {
        lse_case_t c;
        lse_case_make(&c, WS[i % 4], 7, 16, DS[i / 4], rng);
        CHECK_KVR(kvr_gpu_lse_merge_ref(&c.a, &err));
        uint64_t BH = 7 * 16, D = c.a.head_dim, W = c.a.ranks;
        kvr_gpu_lse_args_t d = c.a;
        d.outs = to_device(c.a.outs, W * BH * D * 4);
        d.lses = to_device(c.a.lses, W * BH * 4);
        d.out = to_device(NULL, BH * D * 4);
        d.lse = to_device(NULL, BH * 4);
        CHECK_KVR(kvr_gpu_lse_merge(&d, NULL, &err));
        float *out = to_host(d.out, BH * D * 4), *lse = to_host(d.lse, BH * 4);
        for (uint64_t k = 0; k < BH * D; k++)
            CHECK(close_enough(out[k], c.a.out[k]),
                  "W=%llu out[%llu] %g, want %g", (unsigned long long)W,
                  (unsigned long long)k, out[k], c.a.out[k]);
        for (uint64_t k = 0; k < BH; k++)
            CHECK(close_enough(lse[k], c.a.lse[k]), "lse[%llu] %g, want %g",
                  (unsigned long long)k, lse[k], c.a.lse[k]);
        free(out);
        free(lse);
        cudaFree((void *)d.outs);
        cudaFree((void *)d.lses);
        cudaFree(d.out);
        cudaFree(d.lse);
        lse_case_free(&c);
    }
}

int main(void)
{
    int devices = 0;
    CHECK_KVR(kvr_gpu_device_count(&devices, &err));
    if (devices == 0) {
        printf("SKIP: no CUDA device\n");
        return 77;
    }
    uint64_t rng = 99;
    check_topk_all();
    check_rows();
    kvr_gpu_decode_t *dec = NULL;
    CHECK_KVR(kvr_gpu_decode_create(16, &dec, &err));
    check_slots(dec, &rng);
    kvr_gpu_decode_destroy(dec);
    check_lse(&rng);
    printf("test_gpu_decode: passed\n");
    return 0;
}
