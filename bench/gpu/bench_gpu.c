/* Side-by-side GPU benchmark (docs/design.md §5, §10), one run, JSON out.
 *
 * Relayout of a request into W = 4 DCP ranks whose pages all live on the
 * second GPU, from producer pages on the first, for MLA tokens of 576 and
 * 1152 bytes at I in {1, 4, 16, 64} and for replicated index planes:
 *  - ceiling: one cudaMemcpyPeerAsync of the same bytes;
 *  - scatter: kvr_gpu_scatter launched on the producer (writes over NVLink);
 *  - scatter_pull: the same kernel launched on the consumer (reads);
 *  - pack_copy_unpack: kvr_gpu_pack per rank, one peer copy, kvr_gpu_unpack;
 *  - batched: cudaMemcpyBatchAsync with one descriptor per coalesced run.
 * Top-k filter at K = 2048 against a device-to-device copy ceiling.
 * Timings: CUDA events, median/min/max per run over batches of runs. */
#include <cuda_runtime_api.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "bench_util.h"
#include "gpu_internal.h"

#define KVR_OK_OR_DIE(call)                                                    \
    do {                                                                       \
        kvr_error_t err = {0};                                                 \
        if ((call) != KVR_OK)                                                  \
            DIE("%s:%d %s: %s", __FILE__, __LINE__, #call, err.msg);           \
    } while (0)

enum { W = 4, BS = 64, TOKENS = 262144, INDEX_D = 128 };

static uint64_t rng_state = 0x62656e6368ull;

static uint64_t rng_next(void)
{
    return bench_rng(&rng_state);
}

/* ---- timing ---- */

typedef struct {
    double med, min, max; /* ms per run */
    int runs;
} stat_t;

typedef void (*op_fn)(void *ctx);

static int cmp_double(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

/* Times op (which enqueues on stream s of device dev) in batches of back-to-
 * back runs between two events; sizes the batches from a first run so that
 * each op gets about budget_ms. */
static stat_t time_op(int dev, cudaStream_t s, op_fn op, void *ctx,
                      double budget_ms)
{
    cudaEvent_t a, b;
    CUDA_OK(cudaSetDevice(dev));
    CUDA_OK(cudaEventCreate(&a));
    CUDA_OK(cudaEventCreate(&b));
    float ms = 0;
    for (int warm = 0; warm < 2; warm++) {
        CUDA_OK(cudaSetDevice(dev));
        CUDA_OK(cudaEventRecord(a, s));
        op(ctx);
        CUDA_OK(cudaSetDevice(dev));
        CUDA_OK(cudaEventRecord(b, s));
        CUDA_OK(cudaEventSynchronize(b));
        CUDA_OK(cudaEventElapsedTime(&ms, a, b));
    }
    int per = ms < 1.0 ? (int)(1.0 / (ms + 1e-3)) + 1 : 1;
    int batches = (int)(budget_ms / (per * (ms + 1e-3)));
    batches = batches < 3 ? 3 : batches > 15 ? 15 : batches;
    double t[15];
    for (int i = 0; i < batches; i++) {
        CUDA_OK(cudaSetDevice(dev));
        CUDA_OK(cudaEventRecord(a, s));
        for (int k = 0; k < per; k++)
            op(ctx);
        CUDA_OK(cudaSetDevice(dev));
        CUDA_OK(cudaEventRecord(b, s));
        CUDA_OK(cudaEventSynchronize(b));
        CUDA_OK(cudaEventElapsedTime(&ms, a, b));
        t[i] = ms / per;
    }
    qsort(t, batches, sizeof(double), cmp_double);
    CUDA_OK(cudaEventDestroy(a));
    CUDA_OK(cudaEventDestroy(b));
    return (stat_t){t[batches / 2], t[0], t[batches - 1], batches * per};
}

/* ---- JSON ---- */

static FILE *js;
static int js_first;

static void js_method(const char *name, stat_t st, double bytes,
                      double ceiling_ms, const char *note)
{
    double gbps = bytes / (st.med * 1e6);
    fprintf(js,
            "%s\n        \"%s\": {\"median_ms\": %.5f, \"min_ms\": %.5f, "
            "\"max_ms\": %.5f, \"runs\": %d, \"GBps\": %.2f, "
            "\"GBps_best\": %.2f, \"GBps_worst\": %.2f, \"vs_ceiling\": "
            "%.4f%s%s%s}",
            js_first ? "" : ",", name, st.med, st.min, st.max, st.runs, gbps,
            bytes / (st.min * 1e6), bytes / (st.max * 1e6),
            ceiling_ms > 0 ? ceiling_ms / st.med : 0.0,
            note ? ", \"note\": \"" : "", note ? note : "", note ? "\"" : "");
    js_first = 0;
    printf("  %-18s %9.4f ms  %8.2f GB/s  (min %.4f max %.4f)  %5.1f%% of "
           "ceiling\n",
           name, st.med, gbps, st.min, st.max,
           ceiling_ms > 0 ? 100.0 * ceiling_ms / st.med : 0.0);
}

/* ---- relayout ---- */

typedef struct {
    const char *label;
    kvr_role_t role;
    uint32_t unit; /* token bytes, or D */
    uint32_t I;
    kvr_gpu_relayout_t *rl;
    unsigned char *src;           /* device 0 */
    unsigned char *dst[W];        /* device 1 */
    unsigned char *flat0, *flat1; /* ceiling and staging, devices 0 and 1 */
    uint64_t bytes, rank_bytes[W], dst_bytes;
    cudaStream_t s0, s1;
    cudaEvent_t copied, unpacked;
    /* batched descriptors */
    void **dsts;
    const void **srcs;
    size_t *sizes;
    size_t runs;
} relayout_t;

static void setup_regions(relayout_t *b, kvr_region_desc_t *src,
                          kvr_region_desc_t *dst, kvr_layout_t *lay)
{
    *lay = (kvr_layout_t)KVR_LAYOUT_INIT;
    lay->block_size = BS;
    lay->dcp_size = lay->tp = lay->producer_tp = W;
    lay->interleave = b->I;
    lay->replicate_index = b->role == KVR_ROLE_INDEX;
    lay->preshuffle = true;
    memset(src, 0, sizeof(*src));
    src->role = b->role;
    src->num_blocks = TOKENS / BS;
    *dst = *src;
    dst->num_blocks = TOKENS / (BS * W);
    if (b->role == KVR_ROLE_MLA) {
        src->page_bytes = dst->page_bytes = (uint64_t)BS * b->unit;
    } else {
        src->index_dim = dst->index_dim = b->unit;
        src->page_bytes = BS * kvr_index_stride(b->unit);
        dst->page_bytes = BS * W * kvr_index_stride(b->unit);
    }
}

/* Appends one copy, merged into the last one where both sides continue. */
static void add_run(relayout_t *b, size_t first, const unsigned char *s,
                    unsigned char *d, size_t len)
{
    size_t k = b->runs;
    if (k > first &&
        (const unsigned char *)b->srcs[k - 1] + b->sizes[k - 1] == s &&
        (unsigned char *)b->dsts[k - 1] + b->sizes[k - 1] == d) {
        b->sizes[k - 1] += len;
        return;
    }
    b->srcs[k] = s;
    b->dsts[k] = d;
    b->sizes[k] = len;
    b->runs++;
}

/* Coalesced runs of every rank, in plan order: the batched baseline. */
static void build_runs(relayout_t *b)
{
    const kvr__rl_geom_t *g = &b->rl->geom;
    uint32_t pieces = g->num_blocks * kvr__rl_pieces_per_block(g);
    size_t cap = (size_t)W * TOKENS / (g->kind == KVR__RL_MLA ? W : BS / 2);
    b->dsts = xmalloc(cap * sizeof(void *));
    b->srcs = xmalloc(cap * sizeof(void *));
    b->sizes = xmalloc(cap * sizeof(size_t));
    b->runs = 0;
    for (uint32_t r = 0; r < W; r++) {
        size_t first = b->runs;
        for (uint32_t i = 0; i < pieces; i++) {
            kvr__rl_piece_t p = kvr__rl_piece_at(g, r, i);
            for (uint64_t x = 0; x < p.len; x += p.chunk)
                add_run(b, first, b->src + kvr__rl_src_at(&p, x),
                        b->dst[r] + p.dst + x,
                        p.len - x < p.chunk ? p.len - x : p.chunk);
        }
    }
}

static void relayout_setup(relayout_t *b)
{
    kvr_layout_t lay;
    kvr_region_desc_t src, dst;
    setup_regions(b, &src, &dst, &lay);
    uint32_t *sb = bench_permutation((uint32_t)src.num_blocks, &rng_state);
    uint32_t *db = bench_permutation((uint32_t)dst.num_blocks, &rng_state);
    kvr_gpu_request_t req = {sb, src.num_blocks, db, dst.num_blocks, TOKENS, 0};
    KVR_OK_OR_DIE(
        kvr_gpu_relayout_create(&lay, &src, &dst, &req, &b->rl, &err));
    free(sb);
    free(db);
    b->bytes = 0;
    for (uint32_t r = 0; r < W; r++)
        b->bytes += b->rank_bytes[r] = kvr_gpu_relayout_bytes(b->rl, r);
    b->dst_bytes = dst.num_blocks * dst.page_bytes;
    uint64_t src_bytes = src.num_blocks * src.page_bytes;
    unsigned char *host = xmalloc(src_bytes);
    for (uint64_t i = 0; i < src_bytes; i += 8) {
        uint64_t v = rng_next();
        memcpy(host + i, &v, src_bytes - i < 8 ? src_bytes - i : 8);
    }
    for (int dev = 1; dev >= 0; dev--) {
        CUDA_OK(cudaSetDevice(dev));
        KVR_OK_OR_DIE(kvr_gpu_relayout_upload(b->rl, &err));
    }
    CUDA_OK(cudaSetDevice(1));
    for (uint32_t r = 0; r < W; r++)
        CUDA_OK(cudaMalloc((void **)&b->dst[r], b->dst_bytes));
    CUDA_OK(cudaMalloc((void **)&b->flat1, b->bytes));
    CUDA_OK(cudaStreamCreateWithFlags(&b->s1, cudaStreamNonBlocking));
    CUDA_OK(cudaEventCreateWithFlags(&b->unpacked, cudaEventDisableTiming));
    CUDA_OK(cudaSetDevice(0));
    CUDA_OK(cudaMalloc((void **)&b->src, src_bytes));
    CUDA_OK(cudaMalloc((void **)&b->flat0, b->bytes));
    CUDA_OK(cudaMemcpy(b->src, host, src_bytes, cudaMemcpyHostToDevice));
    CUDA_OK(cudaMemset(b->flat0, 0x5a, b->bytes));
    CUDA_OK(cudaStreamCreateWithFlags(&b->s0, cudaStreamNonBlocking));
    CUDA_OK(cudaEventCreateWithFlags(&b->copied, cudaEventDisableTiming));
    free(host);
    build_runs(b);
    for (int dev = 0; dev < 2; dev++) {
        CUDA_OK(cudaSetDevice(dev));
        CUDA_OK(cudaDeviceSynchronize());
    }
    CUDA_OK(cudaSetDevice(0));
}

static void relayout_teardown(relayout_t *b)
{
    CUDA_OK(cudaSetDevice(1));
    for (uint32_t r = 0; r < W; r++)
        CUDA_OK(cudaFree(b->dst[r]));
    CUDA_OK(cudaFree(b->flat1));
    CUDA_OK(cudaStreamDestroy(b->s1));
    CUDA_OK(cudaEventDestroy(b->unpacked));
    CUDA_OK(cudaSetDevice(0));
    CUDA_OK(cudaFree(b->src));
    CUDA_OK(cudaFree(b->flat0));
    CUDA_OK(cudaStreamDestroy(b->s0));
    CUDA_OK(cudaEventDestroy(b->copied));
    kvr_gpu_relayout_destroy(b->rl);
    free(b->dsts);
    free(b->srcs);
    free(b->sizes);
}

static void op_ceiling(void *ctx)
{
    relayout_t *b = ctx;
    CUDA_OK(cudaMemcpyPeerAsync(b->flat1, 1, b->flat0, 0, b->bytes, b->s0));
}

static void op_scatter(void *ctx)
{
    relayout_t *b = ctx;
    CUDA_OK(cudaSetDevice(0));
    KVR_OK_OR_DIE(
        kvr_gpu_scatter(b->rl, b->src, (void *const *)b->dst, b->s0, &err));
}

static void op_scatter_pull(void *ctx)
{
    relayout_t *b = ctx;
    CUDA_OK(cudaSetDevice(1));
    KVR_OK_OR_DIE(
        kvr_gpu_scatter(b->rl, b->src, (void *const *)b->dst, b->s1, &err));
}

static void op_pack_copy_unpack(void *ctx)
{
    relayout_t *b = ctx;
    uint64_t at = 0;
    CUDA_OK(cudaSetDevice(0));
    for (uint32_t r = 0; r < W; at += b->rank_bytes[r++])
        KVR_OK_OR_DIE(kvr_gpu_pack(b->rl, r, b->src, 0, b->rank_bytes[r],
                                   b->flat0 + at, b->s0, &err));
    CUDA_OK(cudaMemcpyPeerAsync(b->flat1, 1, b->flat0, 0, b->bytes, b->s0));
    CUDA_OK(cudaEventRecord(b->copied, b->s0));
    CUDA_OK(cudaSetDevice(1));
    CUDA_OK(cudaStreamWaitEvent(b->s1, b->copied, 0));
    at = 0;
    for (uint32_t r = 0; r < W; at += b->rank_bytes[r++])
        KVR_OK_OR_DIE(kvr_gpu_unpack(b->rl, r, b->flat1 + at, 0,
                                     b->rank_bytes[r], b->dst[r], b->s1, &err));
    CUDA_OK(cudaEventRecord(b->unpacked, b->s1));
    CUDA_OK(cudaSetDevice(0));
    CUDA_OK(cudaStreamWaitEvent(b->s0, b->unpacked, 0));
}

static cudaError_t batch_status;

static void op_batched(void *ctx)
{
    relayout_t *b = ctx;
    struct cudaMemcpyAttributes attr;
    memset(&attr, 0, sizeof(attr));
    attr.srcAccessOrder = cudaMemcpySrcAccessOrderStream;
    CUDA_OK(cudaSetDevice(0));
    for (size_t at = 0; at < b->runs && batch_status == cudaSuccess;
         at += 65536) {
        size_t n = b->runs - at < 65536 ? b->runs - at : 65536, zero = 0;
        batch_status = cudaMemcpyBatchAsync(b->dsts + at, b->srcs + at,
                                            b->sizes + at, n, &attr, &zero, 1,
                                            b->s0);
    }
}

/* Rank images after an op equal the host reference scatter. */
static int relayout_verify(relayout_t *b, const unsigned char *want[W])
{
    unsigned char *got = xmalloc(b->dst_bytes);
    int ok = 1;
    for (uint32_t r = 0; r < W; r++) {
        CUDA_OK(
            cudaMemcpy(got, b->dst[r], b->dst_bytes, cudaMemcpyDeviceToHost));
        ok &= memcmp(got, want[r], b->dst_bytes) == 0;
    }
    free(got);
    return ok;
}

static void clear_dst(relayout_t *b)
{
    for (uint32_t r = 0; r < W; r++)
        CUDA_OK(cudaMemset(b->dst[r], 0xa5, b->dst_bytes));
    CUDA_OK(cudaDeviceSynchronize());
}

/* Expected rank images: the host reference scatter from a host copy. */
static unsigned char **reference_images(relayout_t *b)
{
    uint64_t src_bytes = (uint64_t)TOKENS / BS * b->rl->geom.src_page;
    unsigned char *host = xmalloc(src_bytes),
                  **want = xmalloc(W * sizeof(*want));
    CUDA_OK(cudaMemcpy(host, b->src, src_bytes, cudaMemcpyDeviceToHost));
    for (uint32_t r = 0; r < W; r++) {
        want[r] = xmalloc(b->dst_bytes);
        memset(want[r], 0xa5, b->dst_bytes);
        KVR_OK_OR_DIE(kvr_gpu_ref_scatter(b->rl, r, host, want[r], &err));
    }
    free(host);
    return want;
}

static void bench_relayout(const char *label, kvr_role_t role, uint32_t unit,
                           uint32_t I, int first)
{
    relayout_t b = {.label = label, .role = role, .unit = unit, .I = I};
    relayout_setup(&b);
    unsigned char **want = reference_images(&b);
    printf("%s: %llu bytes, %zu coalesced runs\n", label,
           (unsigned long long)b.bytes, b.runs);
    fprintf(js,
            "%s\n    {\"case\": \"%s\", \"role\": \"%s\", \"%s\": %u, "
            "\"interleave\": %u, \"dcp_size\": %d, \"block_size\": %d, "
            "\"tokens\": %d, \"bytes\": %llu, \"coalesced_runs\": %zu, "
            "\"methods\": {",
            first ? "" : ",", label, kvr_role_name(role),
            role == KVR_ROLE_MLA ? "token_bytes" : "index_dim", unit, I, W, BS,
            TOKENS, (unsigned long long)b.bytes, b.runs);
    js_first = 1;
    stat_t ceil = time_op(0, b.s0, op_ceiling, &b, 150);
    js_method("ceiling_p2p_copy", ceil, (double)b.bytes, ceil.med, NULL);
    static const struct {
        const char *name;
        op_fn op;
        int dev;
    } ops[] = {{"scatter", op_scatter, 0},
               {"scatter_pull", op_scatter_pull, 1},
               {"pack_copy_unpack", op_pack_copy_unpack, 0},
               {"batched_descriptors", op_batched, 0}};
    for (int i = 0; i < 4; i++) {
        clear_dst(&b);
        batch_status = cudaSuccess;
        stat_t st = time_op(ops[i].dev, ops[i].dev ? b.s1 : b.s0, ops[i].op, &b,
                            ops[i].op == op_batched ? 1500 : 150);
        CUDA_OK(cudaSetDevice(0));
        int ok = batch_status == cudaSuccess &&
                 relayout_verify(&b, (const unsigned char **)want);
        const char *note = batch_status != cudaSuccess
                               ? cudaGetErrorString(batch_status)
                           : ok ? NULL
                                : "WRONG BYTES";
        js_method(ops[i].name, st, (double)b.bytes, ceil.med, note);
        if (!ok)
            printf("  %s: %s\n", ops[i].name, note);
    }
    fprintf(js, "}}");
    for (uint32_t r = 0; r < W; r++)
        free(want[r]);
    free(want);
    relayout_teardown(&b);
}

/* ---- top-k ---- */

typedef struct {
    kvr_gpu_decode_t *dec;
    kvr_gpu_topk_args_t d;
    cudaStream_t s;
    void *copy_src, *copy_dst;
    size_t copy_bytes;
} topk_bench_t;

static void op_topk(void *ctx)
{
    topk_bench_t *t = ctx;
    KVR_OK_OR_DIE(kvr_gpu_topk_filter(t->dec, &t->d, t->s, &err));
}

static void op_copy(void *ctx)
{
    topk_bench_t *t = ctx;
    CUDA_OK(cudaMemcpyAsync(t->copy_dst, t->copy_src, t->copy_bytes,
                            cudaMemcpyDeviceToDevice, t->s));
}

/* rows decode rows, one request each, K candidates below seq_len, 5% -1. */
static void topk_inputs(kvr_gpu_topk_args_t *h, uint32_t rows, uint32_t K,
                        uint32_t I, uint32_t dcp)
{
    uint32_t max_blocks = 64, seq = max_blocks * BS * dcp;
    int32_t *idx = xmalloc((size_t)rows * K * 4), *map = xmalloc(rows * 4);
    int32_t *table = xmalloc((size_t)rows * max_blocks * 4);
    for (size_t i = 0; i < (size_t)rows * K; i++) {
        uint64_t v = rng_next();
        idx[i] = v % 100 < 5 ? -1 : (int32_t)((v >> 8) % seq);
    }
    for (uint32_t r = 0; r < rows; r++)
        map[r] = (int32_t)r;
    for (size_t i = 0; i < (size_t)rows * max_blocks; i++)
        table[i] = (int32_t)(rng_next() % (1u << 20));
    *h = (kvr_gpu_topk_args_t){idx,
                               map,
                               table,
                               rows,
                               K,
                               rows,
                               max_blocks,
                               0,
                               dcp,
                               BS,
                               I,
                               xmalloc((size_t)rows * K * 4),
                               (uint64_t)rows * K,
                               xmalloc((rows + 1) * 4),
                               xmalloc(rows * 4)};
}

static void *upload(const void *h, size_t n)
{
    void *p;
    CUDA_OK(cudaMalloc(&p, n));
    if (h)
        CUDA_OK(cudaMemcpy(p, h, n, cudaMemcpyHostToDevice));
    return p;
}

static int topk_verify(const kvr_gpu_topk_args_t *h,
                       const kvr_gpu_topk_args_t *d)
{
    KVR_OK_OR_DIE(kvr_gpu_topk_filter_ref(h, &err));
    uint32_t rows = h->num_rows;
    size_t n = (size_t)h->out_indptr[rows];
    int32_t *got = xmalloc((rows + 1 > n ? rows + 1 : n) * 4);
    CUDA_OK(
        cudaMemcpy(got, d->out_indptr, (rows + 1) * 4, cudaMemcpyDeviceToHost));
    int ok = memcmp(got, h->out_indptr, (rows + 1) * 4) == 0;
    CUDA_OK(cudaMemcpy(got, d->out_slots, n * 4, cudaMemcpyDeviceToHost));
    ok &= memcmp(got, h->out_slots, n * 4) == 0;
    free(got);
    return ok;
}

static void bench_topk(uint32_t rows, uint32_t I, uint32_t dcp,
                       double copy_gbps, int first)
{
    const uint32_t K = 2048;
    topk_bench_t t = {0};
    kvr_gpu_topk_args_t h;
    topk_inputs(&h, rows, K, I, dcp);
    CUDA_OK(cudaSetDevice(0));
    CUDA_OK(cudaStreamCreateWithFlags(&t.s, cudaStreamNonBlocking));
    KVR_OK_OR_DIE(kvr_gpu_decode_create(rows, &t.dec, &err));
    t.d = h;
    t.d.token_indices = upload(h.token_indices, (size_t)rows * K * 4);
    t.d.token_to_seq = upload(h.token_to_seq, rows * 4);
    t.d.block_table = upload(h.block_table, (size_t)rows * h.max_blocks * 4);
    t.d.out_slots = upload(NULL, (size_t)rows * K * 4);
    t.d.out_indptr = upload(NULL, (rows + 1) * 4);
    t.d.owned_counts = upload(NULL, rows * 4);
    CUDA_OK(cudaDeviceSynchronize());
    stat_t st = time_op(0, t.s, op_topk, &t, 200);
    KVR_OK_OR_DIE(kvr_gpu_decode_check(t.dec, t.s, &err));
    int ok = topk_verify(&h, &t.d);
    uint64_t owned = (uint64_t)h.out_indptr[rows];
    double bytes = (double)rows * K * 4 + rows * 4.0 + owned * 4.0 +
                   (rows + 1) * 4.0 + rows * 4.0 +
                   (double)rows * h.max_blocks * 4;
    t.copy_bytes = (size_t)(bytes / 2);
    t.copy_src = upload(NULL, t.copy_bytes);
    t.copy_dst = upload(NULL, t.copy_bytes);
    stat_t same = time_op(0, t.s, op_copy, &t, 200);
    double gbps = bytes / (st.med * 1e6);
    fprintf(
        js,
        "%s\n    {\"rows\": %u, \"topk\": %u, \"dcp_size\": %u, "
        "\"interleave\": %u, \"block_size\": %d, \"owned\": %llu, "
        "\"bytes_read_written\": %.0f, \"median_ms\": %.5f, \"min_ms\": %.5f, "
        "\"max_ms\": %.5f, \"runs\": %d, \"GBps\": %.1f, \"correct\": %s, "
        "\"same_bytes_copy_ms\": %.5f, \"same_bytes_copy_GBps\": %.1f, "
        "\"vs_copy_ceiling\": %.4f, \"vs_same_bytes_copy\": %.4f}",
        first ? "" : ",", rows, K, dcp, I, BS, (unsigned long long)owned, bytes,
        st.med, st.min, st.max, st.runs, gbps, ok ? "true" : "false", same.med,
        bytes / (same.med * 1e6), gbps / copy_gbps, same.med / st.med);
    printf("  top-k rows %6u I %2u W %u: %.4f ms %7.1f GB/s = %5.1f%% of copy "
           "ceiling (same-bytes copy %.4f ms)%s\n",
           rows, I, dcp, st.med, gbps, 100 * gbps / copy_gbps, same.med,
           ok ? "" : "  WRONG");
    cudaFree((void *)t.d.token_indices);
    cudaFree((void *)t.d.token_to_seq);
    cudaFree((void *)t.d.block_table);
    cudaFree(t.d.out_slots);
    cudaFree(t.d.out_indptr);
    cudaFree(t.d.owned_counts);
    cudaFree(t.copy_src);
    cudaFree(t.copy_dst);
    kvr_gpu_decode_destroy(t.dec);
    CUDA_OK(cudaStreamDestroy(t.s));
    free((void *)h.token_indices);
    free((void *)h.token_to_seq);
    free((void *)h.block_table);
    free(h.out_slots);
    free(h.out_indptr);
    free(h.owned_counts);
}

/* Large device-to-device copy, counting bytes read plus written. */
static double copy_ceiling(void)
{
    topk_bench_t t = {0};
    t.copy_bytes = 1ull << 30;
    CUDA_OK(cudaSetDevice(0));
    CUDA_OK(cudaStreamCreateWithFlags(&t.s, cudaStreamNonBlocking));
    t.copy_src = upload(NULL, t.copy_bytes);
    t.copy_dst = upload(NULL, t.copy_bytes);
    CUDA_OK(cudaMemset(t.copy_src, 1, t.copy_bytes));
    stat_t st = time_op(0, t.s, op_copy, &t, 300);
    double gbps = 2.0 * t.copy_bytes / (st.med * 1e6);
    fprintf(js,
            "  \"copy_ceiling\": {\"bytes\": %llu, \"median_ms\": %.5f, "
            "\"min_ms\": %.5f, \"max_ms\": %.5f, \"GBps_read_plus_written\": "
            "%.1f},\n",
            (unsigned long long)t.copy_bytes, st.med, st.min, st.max, gbps);
    printf("d2d copy ceiling: %.1f GB/s (read + written)\n", gbps);
    cudaFree(t.copy_src);
    cudaFree(t.copy_dst);
    CUDA_OK(cudaStreamDestroy(t.s));
    return gbps;
}

static void header(int devices)
{
    struct cudaDeviceProp p;
    int driver = 0, runtime = 0, p2p = 0;
    char date[32];
    time_t now = time(NULL);
    strftime(date, sizeof(date), "%Y-%m-%dT%H:%M:%SZ", gmtime(&now));
    CUDA_OK(cudaGetDeviceProperties(&p, 0));
    CUDA_OK(cudaDriverGetVersion(&driver));
    CUDA_OK(cudaRuntimeGetVersion(&runtime));
    if (devices > 1)
        CUDA_OK(cudaDeviceCanAccessPeer(&p2p, 0, 1));
    fprintf(
        js,
        "{\n  \"date\": \"%s\", \"card\": \"%s\", \"devices\": %d, "
        "\"sms\": %d, \"peer_access\": %s, \"driver\": %d, \"runtime\": %d,\n",
        date, p.name, devices, p.multiProcessorCount, p2p ? "true" : "false",
        driver, runtime);
    printf("%s x%d, %d SMs, driver %d, runtime %d, %s\n", p.name, devices,
           p.multiProcessorCount, driver, runtime, date);
}

int main(int argc, char **argv)
{
    int devices = 0,
        relayout_only = argc == 3 && !strcmp(argv[1], "--relayout-only");
    int topk_only = argc == 3 && !strcmp(argv[1], "--topk-only");
    if (argc != 2 && !relayout_only && !topk_only)
        DIE("usage: bench_gpu [--relayout-only | --topk-only] OUT.json");
    if (cudaGetDeviceCount(&devices) != cudaSuccess || devices == 0)
        DIE("no CUDA device");
    js = fopen(argv[argc - 1], "w");
    if (js == NULL)
        DIE("cannot write %s", argv[argc - 1]);
    header(devices);
    if (!relayout_only) {
        double copy_gbps = copy_ceiling();
        fprintf(js, "  \"topk\": [");
        static const uint32_t ROWS[] = {4096, 16384, 32768, 65536};
        for (int i = 0; i < 4; i++)
            bench_topk(ROWS[i], 1, W, copy_gbps, i == 0);
        bench_topk(4096, 64, W, copy_gbps, 0);
        static const uint32_t DCP[] = {1, 2, 8}; /* other widths */
        for (int i = 0; i < 3; i++) {
            bench_topk(4096, 1, DCP[i], copy_gbps, 0);
            bench_topk(65536, 1, DCP[i], copy_gbps, 0);
        }
        fprintf(js, "],\n");
    }
    fprintf(js, "  \"relayout\": [");
    if (devices >= 2 && !topk_only) {
        KVR_OK_OR_DIE(kvr_gpu_enable_peer(0, 1, &err));
        KVR_OK_OR_DIE(kvr_gpu_enable_peer(1, 0, &err));
        static const uint32_t IS[] = {1, 4, 16, 64}, TB[] = {576, 1152};
        char label[64];
        for (int t = 0; t < 2; t++)
            for (int i = 0; i < 4; i++) {
                snprintf(label, sizeof(label), "mla tb=%u I=%u", TB[t], IS[i]);
                bench_relayout(label, KVR_ROLE_MLA, TB[t], IS[i], t + i == 0);
            }
        bench_relayout("index replicated D=128", KVR_ROLE_INDEX, INDEX_D, 1, 0);
    } else {
        printf("one device: relayout benchmark needs two\n");
    }
    fprintf(js, "]\n}\n");
    fclose(js);
    return 0;
}
