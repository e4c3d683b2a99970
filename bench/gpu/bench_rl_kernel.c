/* Kernel-only timing of the relayout and run-copy kernels on one GPU
 * (docs/gpu.md, Relayout kernel speed), CUDA events, L2 flushed before
 * every rep. The case is issue 18's: rank 0 of an MLA layout, W = 4,
 * I = 1, 576-byte tokens, bs 64, random block tables:
 *  - copy: one cudaMemcpyAsync of the rank's bytes (the ceiling);
 *  - scatter_rank: the one-rank strided gather, at each knob setting;
 *  - scatter_all: every rank at once (four destinations);
 *  - copy2d: cudaMemcpy2DAsync of the same rows (576 B at a 2304 B pitch),
 *    the strided-read reference;
 *  - agent_path: relayout create + pool upload + scatter_regions + sync,
 *    host-timed, as kvr__gpu_send does it; "prepared": the tables made
 *    before the clock starts, as the agent makes them when a pull arrives;
 *    copy_host: the copy host-timed the same way (bench_gpu_net's ceiling);
 *  - pack_runs: kvr_gpu_runs_copy of the rank's 576-byte runs into one
 *    buffer (gpu-staged's pack), whole and as one 4 MiB slot, per knob.
 * Every variant's output is compared with the host reference.
 * Usage: bench_rl_kernel [tokens] [reps]. */
#include <cuda_runtime_api.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "bench_util.h"
#include "gpu_internal.h"

#define KVR_OK(call)                                                           \
    do {                                                                       \
        if ((call) != KVR_OK)                                                  \
            DIE("%s:%d %s: %s", __FILE__, __LINE__, #call, err.msg);           \
    } while (0)

enum { W = 4, BS = 64, UNIT = 576 };
#define FLUSH_BYTES (256ull << 20)
#define SLOT (4ull << 20)

static kvr_error_t err;
static uint64_t rng = 0x6b65726e656cull;

typedef struct {
    kvr_layout_t lay;
    kvr_region_desc_t src, dst;
    kvr_gpu_request_t req;
    kvr_gpu_relayout_t *rl;
    unsigned char *d_src, *d_dst[W], *d_flat, *d_flush;
    unsigned char *h_src, *h_want, *h_got;
    uint64_t src_bytes, dst_bytes, bytes;
    cudaStream_t s;
    cudaEvent_t e0, e1;
    int reps;
} bench_t;

/* sorted: block tables in order (the rank's source pieces in address
 * order), to tell TLB and DRAM page misses from the kernel's own cost */
static void setup(bench_t *b, uint64_t tokens, bool sorted)
{
    b->lay = (kvr_layout_t)KVR_LAYOUT_INIT;
    b->lay.block_size = BS;
    b->lay.dcp_size = b->lay.tp = b->lay.producer_tp = W;
    b->lay.interleave = 1;
    memset(&b->src, 0, sizeof(b->src));
    b->src.role = KVR_ROLE_MLA;
    b->src.num_blocks = tokens / BS;
    b->src.page_bytes = (uint64_t)BS * UNIT;
    b->dst = b->src;
    b->dst.num_blocks = tokens / (BS * W);
    uint32_t ns = (uint32_t)b->src.num_blocks, nd = (uint32_t)b->dst.num_blocks;
    uint32_t *sb = bench_pages(ns, sorted, &rng);
    uint32_t *db = bench_pages(nd, sorted, &rng);
    b->req = (kvr_gpu_request_t){sb, b->src.num_blocks, db,
                                 b->dst.num_blocks, tokens, 0};
    KVR_OK(kvr_gpu_relayout_create(&b->lay, &b->src, &b->dst, &b->req, &b->rl,
                                   &err));
    KVR_OK(kvr_gpu_relayout_upload(b->rl, &err));
    b->src_bytes = b->src.num_blocks * b->src.page_bytes;
    b->dst_bytes = b->dst.num_blocks * b->dst.page_bytes;
    b->bytes = kvr_gpu_relayout_bytes(b->rl, 0);
    b->h_src = xmalloc(b->src_bytes);
    for (uint64_t i = 0; i < b->src_bytes; i += 8) {
        uint64_t v = bench_rng(&rng);
        memcpy(b->h_src + i, &v, 8);
    }
    b->h_want = xmalloc(b->dst_bytes);
    b->h_got = xmalloc(b->dst_bytes);
    memset(b->h_want, 0, b->dst_bytes);
    KVR_OK(kvr_gpu_ref_scatter(b->rl, 0, b->h_src, b->h_want, &err));
    CUDA_OK(cudaMalloc((void **)&b->d_src, b->src_bytes));
    CUDA_OK(cudaMemcpy(b->d_src, b->h_src, b->src_bytes,
                       cudaMemcpyHostToDevice));
    for (int r = 0; r < W; r++) {
        CUDA_OK(cudaMalloc((void **)&b->d_dst[r], b->dst_bytes));
        CUDA_OK(cudaMemset(b->d_dst[r], 0, b->dst_bytes));
    }
    CUDA_OK(cudaMalloc((void **)&b->d_flat, b->bytes));
    CUDA_OK(cudaMalloc((void **)&b->d_flush, FLUSH_BYTES));
    CUDA_OK(cudaStreamCreateWithFlags(&b->s, cudaStreamNonBlocking));
    CUDA_OK(cudaEventCreate(&b->e0));
    CUDA_OK(cudaEventCreate(&b->e1));
    CUDA_OK(cudaDeviceSynchronize());
}

static void flush_l2(bench_t *b)
{
    static int salt;
    CUDA_OK(cudaMemsetAsync(b->d_flush, ++salt & 0xff, FLUSH_BYTES, b->s));
}

typedef void (*op_fn)(bench_t *b);

static int cmp_double(const void *x, const void *y)
{
    double a = *(const double *)x, c = *(const double *)y;
    return (a > c) - (a < c);
}

/* Median microseconds of op over reps, each after an L2 flush. */
static double time_op(bench_t *b, op_fn op)
{
    float t[64];
    int n = b->reps < 64 ? b->reps : 64;
    op(b); /* warm: code loaded, tables resident on the device */
    for (int i = 0; i < n; i++) {
        flush_l2(b);
        CUDA_OK(cudaEventRecord(b->e0, b->s));
        op(b);
        CUDA_OK(cudaEventRecord(b->e1, b->s));
        CUDA_OK(cudaEventSynchronize(b->e1));
        CUDA_OK(cudaEventElapsedTime(&t[i], b->e0, b->e1));
    }
    qsort(t, (size_t)n, sizeof(float), bench_cmp_float);
    return t[n / 2] * 1e3;
}

static void line(const char *what, const char *knob, uint64_t bytes,
                 double us, double ceiling_us, const char *check)
{
    printf("%-14s %-12s %10.1f us %8.1f GB/s  ratio %.3f  %s\n", what, knob,
           us, (double)bytes / (us * 1e3), ceiling_us / us, check);
    fflush(stdout);
}

static void op_copy(bench_t *b)
{
    CUDA_OK(cudaMemcpyAsync(b->d_flat, b->d_src, b->bytes,
                            cudaMemcpyDeviceToDevice, b->s));
}

/* The same strided gather through CUDA's own 2D copy: rows of one token
 * (576 B) every W tokens (pitch 2304 B) into a packed buffer, the rank's
 * token count of rows (block tables in address order: what the sorted
 * case reads). The reference for what a strided read of this shape
 * costs, beside the contiguous copy. */
static void op_copy2d(bench_t *b)
{
    CUDA_OK(cudaMemcpy2DAsync(b->d_flat, UNIT, b->d_src, (size_t)UNIT * W,
                              UNIT, b->bytes / UNIT, cudaMemcpyDeviceToDevice,
                              b->s));
}

static void op_scatter_rank(bench_t *b)
{
    KVR_OK(kvr_gpu_scatter_rank(b->rl, 0, b->d_src, b->d_dst[0], b->s, &err));
}

static void op_scatter_all(bench_t *b)
{
    KVR_OK(kvr_gpu_scatter(b->rl, b->d_src, (void *const *)b->d_dst, b->s,
                           &err));
}

static const char *check_rank0(bench_t *b)
{
    CUDA_OK(cudaStreamSynchronize(b->s));
    CUDA_OK(cudaMemcpy(b->h_got, b->d_dst[0], b->dst_bytes,
                       cudaMemcpyDeviceToHost));
    bool ok = memcmp(b->h_got, b->h_want, b->dst_bytes) == 0;
    CUDA_OK(cudaMemset(b->d_dst[0], 0, b->dst_bytes));
    return ok ? "verified" : "MISMATCH";
}

static kvr_gpu_runs_t *runs;
static uint64_t runs_len;
static unsigned char *pack_want; /* the host reference's packed stream */

/* Rank 0's 576-byte runs from base in stream order: gpu-staged's pack. */
static kvr_gpu_runs_t *make_runs(bench_t *b, const unsigned char *base)
{
    const kvr__rl_geom_t *g = &b->rl->geom;
    uint32_t pieces = g->num_blocks * kvr__rl_pieces_per_block(g);
    size_t cap = b->bytes / UNIT + 1, n = 0;
    kvr_gpu_run_t *r = xmalloc(cap * sizeof(*r));
    kvr_gpu_runs_t *rt = NULL;
    for (uint32_t i = 0; i < pieces; i++) {
        kvr__rl_piece_t p = kvr__rl_piece_at(g, 0, i);
        for (uint64_t x = 0; x < p.len && n < cap; x += p.chunk)
            r[n++] = (kvr_gpu_run_t){
                (uint64_t)(uintptr_t)base + kvr__rl_src_at(&p, x), 0,
                p.len - x < p.chunk ? p.len - x : p.chunk};
    }
    KVR_OK(kvr_gpu_runs_create(r, n, &rt, &err));
    free(r);
    return rt;
}

static void pack_setup(bench_t *b)
{
    kvr_gpu_runs_t *host = make_runs(b, b->h_src);
    pack_want = xmalloc(kvr_gpu_runs_bytes(host));
    KVR_OK(kvr_gpu_runs_copy_ref(host, 0, kvr_gpu_runs_bytes(host), NULL,
                                 pack_want, &err));
    kvr_gpu_runs_destroy(host);
    runs = make_runs(b, b->d_src);
    KVR_OK(kvr_gpu_runs_upload(runs, NULL, &err));
}

static void op_pack(bench_t *b)
{
    KVR_OK(kvr_gpu_runs_copy(runs, 0, runs_len, NULL, b->d_flat, b->s, &err));
}

static const char *check_pack(bench_t *b)
{
    CUDA_OK(cudaStreamSynchronize(b->s));
    CUDA_OK(cudaMemcpy(b->h_got, b->d_flat, runs_len, cudaMemcpyDeviceToHost));
    bool ok = memcmp(b->h_got, pack_want, runs_len) == 0;
    CUDA_OK(cudaMemset(b->d_flat, 0, runs_len));
    return ok ? "verified" : "MISMATCH";
}

static double now_us(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec * 1e6 + (double)ts.tv_nsec * 1e-3;
}

/* As the agent's gpu-direct: relayout built and uploaded into a pool,
 * one scatter_regions launch, wait; host clock, L2 flushed first (on the
 * pool's stream, as the agent's kernels run). prepared: the tables made
 * before the clock starts, as the agent makes them when the pull
 * arrives. The median rep, and its parts (create, upload, launch, wait;
 * medians) in *parts. */
static double agent_path(bench_t *b, kvr_gpu_pool_t *pool, void *ps,
                         bool prepared, double parts[4])
{
    double tot[64], part[4][64];
    int n = b->reps < 64 ? b->reps : 64;
    for (int i = 0; i < n; i++) {
        kvr_gpu_relayout_t *rl = NULL;
        uint32_t rank = 0;
        const void *srcs[1] = {b->d_src};
        void *dsts[1] = {b->d_dst[0]};
        double t[5];
        if (prepared) {
            KVR_OK(kvr_gpu_relayout_create(&b->lay, &b->src, &b->dst, &b->req,
                                           &rl, &err));
            KVR_OK(kvr_gpu_relayout_upload_pool(rl, pool, &err));
        }
        CUDA_OK(cudaMemsetAsync(b->d_flush, i & 0xff, FLUSH_BYTES,
                                (cudaStream_t)ps));
        CUDA_OK(cudaStreamSynchronize((cudaStream_t)ps));
        t[0] = now_us();
        if (!prepared)
            KVR_OK(kvr_gpu_relayout_create(&b->lay, &b->src, &b->dst, &b->req,
                                           &rl, &err));
        t[1] = now_us();
        if (!prepared)
            KVR_OK(kvr_gpu_relayout_upload_pool(rl, pool, &err));
        t[2] = now_us();
        KVR_OK(kvr_gpu_scatter_regions(rl, &rank, srcs, dsts, 1, ps, &err));
        t[3] = now_us();
        KVR_OK(kvr_gpu_sync(ps, &err));
        t[4] = now_us();
        kvr_gpu_relayout_destroy(rl);
        tot[i] = t[4] - t[0];
        for (int k = 0; k < 4; k++)
            part[k][i] = t[k + 1] - t[k];
    }
    for (int k = 0; k < 4; k++) {
        qsort(part[k], (size_t)n, sizeof(double), cmp_double);
        parts[k] = part[k][n / 2];
    }
    qsort(tot, (size_t)n, sizeof(double), cmp_double);
    return tot[n / 2];
}

/* The same copy as op_copy, host-timed from launch to completion (as
 * bench_gpu_net's ceiling): the median. */
static double copy_host(bench_t *b, void *ps)
{
    double t[64];
    int n = b->reps < 64 ? b->reps : 64;
    for (int i = 0; i < n; i++) {
        CUDA_OK(cudaMemsetAsync(b->d_flush, i & 0xff, FLUSH_BYTES,
                                (cudaStream_t)ps));
        CUDA_OK(cudaStreamSynchronize((cudaStream_t)ps));
        double t0 = now_us();
        CUDA_OK(cudaMemcpyAsync(b->d_flat, b->d_src, b->bytes,
                                cudaMemcpyDeviceToDevice, (cudaStream_t)ps));
        CUDA_OK(cudaStreamSynchronize((cudaStream_t)ps));
        t[i] = now_us() - t0;
    }
    qsort(t, (size_t)n, sizeof(double), cmp_double);
    return t[n / 2];
}

static void teardown(bench_t *b)
{
    CUDA_OK(cudaFree(b->d_src));
    for (int r = 0; r < W; r++)
        CUDA_OK(cudaFree(b->d_dst[r]));
    CUDA_OK(cudaFree(b->d_flat));
    CUDA_OK(cudaFree(b->d_flush));
    CUDA_OK(cudaStreamDestroy(b->s));
    CUDA_OK(cudaEventDestroy(b->e0));
    CUDA_OK(cudaEventDestroy(b->e1));
    kvr_gpu_relayout_destroy(b->rl);
    free((void *)b->req.src_blocks);
    free((void *)b->req.dst_blocks);
    free(b->h_src);
    free(b->h_want);
    free(b->h_got);
}

/* The one-rank gather with sorted block tables, old and new steps. */
static void sorted_case(uint64_t tokens, int reps)
{
    bench_t b = {.reps = reps};
    setup(&b, tokens, true);
    double copy = time_op(&b, op_copy);
    double c2d = time_op(&b, op_copy2d);
    line("sorted_copy2d", "memcpy2d", b.bytes, c2d, copy, "-");
    for (int k = 0; k < 2; k++) { /* the items kernel, then the default */
        kvr__rl_tune_chunks = k ? 0 : 1;
        double us = time_op(&b, op_scatter_rank);
        line("sorted_rank", k ? "default" : "items", b.bytes, us, copy,
             check_rank0(&b));
    }
    teardown(&b);
}

int main(int argc, char **argv)
{
    uint64_t tokens = argc > 1 ? strtoull(argv[1], NULL, 10) : 1048576;
    bench_t b = {.reps = argc > 2 ? atoi(argv[2]) : 5};
    int count = 0;
    if (cudaGetDeviceCount(&count) != cudaSuccess || count == 0) {
        fprintf(stderr, "no CUDA device\n");
        return 77;
    }
    if (tokens % (BS * W) != 0 || b.reps < 1)
        DIE("tokens %llu: want a multiple of %d, reps >= 1",
            (unsigned long long)tokens, BS * W);
    struct cudaDeviceProp prop;
    CUDA_OK(cudaGetDeviceProperties(&prop, 0));
    sorted_case(tokens, b.reps);
    setup(&b, tokens, false);
    printf("%s, rank 0 of MLA W=%d I=1 bs=%d, %llu tokens of %d B: %llu B, "
           "median of %d reps, L2 flushed\n",
           prop.name, W, BS, (unsigned long long)tokens, UNIT,
           (unsigned long long)b.bytes, b.reps);
    double copy = time_op(&b, op_copy);
    line("copy", "-", b.bytes, copy, copy, "-");
    double us = time_op(&b, op_copy2d);
    line("copy2d", "memcpy2d", b.bytes, us, copy, "-");
    /* the items kernel (relayout_kernel, two items a step) the gather
     * used before 2026-12-02, then chunk_kernel's team shapes, the
     * default (8 lanes of 5 vectors) last */
    static const int teams[] = {1, 3, 4, 0};
    static const char *names[] = {"items", "teams 4x9", "teams 8x8",
                                  "default 8x5"};
    for (int i = 0; i < 4; i++) {
        kvr__rl_tune_chunks = teams[i];
        us = time_op(&b, op_scatter_rank);
        line("scatter_rank", names[i], b.bytes, us, copy, check_rank0(&b));
    }
    us = time_op(&b, op_scatter_all);
    line("scatter_all", "default", b.bytes * W, us, copy * W, check_rank0(&b));
    void *ps = NULL;
    kvr_gpu_pool_t *pool = NULL;
    KVR_OK(kvr_gpu_stream_create(0, &ps, &err));
    KVR_OK(kvr_gpu_pool_create(0, ps, &pool, &err));
    double host_copy = copy_host(&b, ps);
    line("copy_host", "-", b.bytes, host_copy, host_copy, "host clock");
    for (int prep = 0; prep < 2; prep++) {
        double parts[4] = {0, 0, 0, 0};
        char note[128];
        us = agent_path(&b, pool, ps, prep, parts);
        snprintf(note, sizeof(note),
                 "host clock, medians: create %.1f upload %.1f launch %.1f "
                 "wait %.1f us; vs copy_host %.3f",
                 parts[0], parts[1], parts[2], parts[3], host_copy / us);
        line("agent_path", prep ? "prepared" : "inside", b.bytes, us, copy,
             note);
    }
    CUDA_OK(cudaMemcpy(b.h_got, b.d_dst[0], b.dst_bytes,
                       cudaMemcpyDeviceToHost));
    printf("agent_path output %s\n",
           memcmp(b.h_got, b.h_want, b.dst_bytes) ? "MISMATCH" : "verified");
    pack_setup(&b);
    static const char *shapes[] = {"team 8x8", "old 32x1"};
    for (int k = 0; k < 2; k++) {
        kvr__runs_tune_unroll = k;
        runs_len = kvr_gpu_runs_bytes(runs);
        us = time_op(&b, op_pack);
        line("pack_runs", shapes[k], runs_len, us, copy, check_pack(&b));
        runs_len = SLOT;
        us = time_op(&b, op_pack);
        line("pack_slot", shapes[k], SLOT, us,
             copy * (double)SLOT / (double)b.bytes, check_pack(&b));
    }
    return 0;
}
