/* A serving stage's relayout launches alone on one GPU, without agents,
 * processes or MPS (docs/performance.md, run 2026-12-02m): for traces of
 * request lengths, every request's MLA layers (L slots a rank) scattered
 * into W ranks' paged regions with kvr_gpu_scatter_regions, one launch
 * per request (its W ranks joined, as the agent joins a request's pulls)
 * or one per request and rank, back to back on one stream, as a PP stage
 * of `kvrelay bench serving` moves them. Block tables as the bench's with
 * `--sources distinct`: requests read consecutive stretches of a random
 * permutation of the source pool, and write consecutive stretches of a
 * ring of destination pages in random order. The L2 is flushed before each pass. Reported per trace:
 * the pass's GB/s against one large request of the same tokens (the
 * ceiling's shape), and the median device time of each request length.
 * The last request of each pass is checked against the host reference.
 *
 * Two switches take the set-up apart: --sorted gives both block tables in
 * address order (no random pages: TLB and DRAM page misses out of the
 * way), --shared has every request read the same source stretch (the
 * bench's `--sources shared`, whose ceiling re-reads it from L2).
 *
 * --grid N caps a launch at N blocks (kvr__rl_tune_grid): fewer items in
 * flight span fewer layer regions.
 *
 * --merge K adds a third way beside the two: requests K at a time in one
 * kvr_gpu_scatter_requests call, which runs their slots region-major, so
 * that the items in flight span few layer regions however short the
 * requests (docs/gpu.md, Several requests a launch). A merged group's
 * device time is shared evenly among its requests. A fourth row, "merged
 * K rq", makes the same calls in the order given, request-major
 * (kvr__rl_tune_merge_order): the control that tells the order's effect
 * from that of fewer, larger launches.
 *
 * --dst local|ipc|slab|vmm puts the destination regions in this process
 * (the default) or in a second one that owns them (dst_owner.h): a stage
 * writes decode ranks' pages through CUDA IPC. --dst-room MiB makes each
 * of the owner's allocations at least that large (the regions use their
 * start): whether mappings of production-sized allocations behave like
 * the slab's. --dst-round KiB rounds each of them up to a multiple of
 * that: which granularity of an allocation's size keeps the mapping fast
 * (docs/performance.md, run 2026-12-02o).
 *
 * Usage: bench_rl_trace [--layers L] [--reps R] [--json FILE] [--grid N]
 *        [--merge K] [--dst MODE] [--dst-room MiB] [--dst-round KiB]
 *        [--sorted] [--shared]
 *        TRACE...  (TRACE: fixed:N:COUNT, or a comma list of lengths) */
#include <cuda_runtime_api.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "bench_util.h"
#include "dst_owner.h"
#include "gpu_internal.h"

#define KVR_OK(call)                                                           \
    do {                                                                       \
        if ((call) != KVR_OK)                                                  \
            DIE("%s:%d %s: %s", __FILE__, __LINE__, #call, err.msg);           \
    } while (0)

enum { W = 4, BS = 64, UNIT = 576, MAX_REQ = 256, MAX_L = 64, MAX_MERGE = 16 };
#define FLUSH_BYTES (256ull << 20)

static kvr_error_t err;
static uint64_t rng = 0x747261636521ull;

typedef struct {
    uint64_t tokens[MAX_REQ];
    uint32_t n;
    const char *name;
} trace_t;

typedef struct {
    kvr_layout_t lay;
    bool sorted, shared;
    uint32_t L, src_pool, dst_pool; /* pages */
    uint32_t *src_table, *dst_table;
    unsigned char *src[MAX_L], *dst[MAX_L][W], *flush;
    cudaStream_t s;
    dst_mode_t dst_mode; /* where the destination regions live */
    uint64_t dst_room;   /* --dst-room: bytes each owner's allocation holds */
    uint64_t dst_round;  /* --dst-round: ... rounded up to a multiple of */
    uint64_t dst_each;   /* the bytes each owner allocation got */
    dst_remote_t remote;
} rig_t;

static uint64_t vblocks(uint64_t tokens)
{
    return (tokens + BS * W - 1) / (BS * W);
}

static kvr_region_desc_t region(uint32_t pages)
{
    kvr_region_desc_t d;
    memset(&d, 0, sizeof(d));
    d.role = KVR_ROLE_MLA;
    d.num_blocks = pages;
    d.page_bytes = (uint64_t)BS * UNIT;
    return d;
}

static void rig_make(rig_t *r, uint32_t L, uint64_t most, uint64_t ring)
{
    r->lay = (kvr_layout_t)KVR_LAYOUT_INIT;
    r->lay.block_size = BS;
    r->lay.dcp_size = r->lay.tp = r->lay.producer_tp = W;
    r->lay.interleave = 1;
    r->L = L;
    r->src_pool = (uint32_t)((most + BS - 1) / BS);
    r->dst_pool = (uint32_t)ring;
    r->src_table = bench_pages(r->src_pool, r->sorted, &rng);
    r->dst_table = bench_pages(r->dst_pool, r->sorted, &rng);
    uint64_t sb = (uint64_t)r->src_pool * BS * UNIT;
    uint64_t db = (uint64_t)r->dst_pool * BS * UNIT;
    unsigned char *h = xmalloc(sb);
    for (uint64_t i = 0; i < sb; i += 8) {
        uint64_t v = bench_rng(&rng);
        memcpy(h + i, &v, 8);
    }
    for (uint32_t l = 0; l < L; l++) {
        CUDA_OK(cudaMalloc((void **)&r->src[l], sb));
        CUDA_OK(cudaMemcpy(r->src[l], h, sb, cudaMemcpyHostToDevice));
        for (int k = 0; r->dst_mode == DST_LOCAL && k < W; k++)
            CUDA_OK(cudaMalloc((void **)&r->dst[l][k], db));
    }
    uint64_t each = db > r->dst_room ? db : r->dst_room;
    if (r->dst_round > 0)
        each = bench_round_up(each, r->dst_round);
    r->dst_each = r->dst_mode == DST_LOCAL ? db : each;
    if (r->dst_mode != DST_LOCAL) /* r->dst is L rows of W in a row */
        dst_remote_open("/proc/self/exe", r->dst_mode, L * W, each,
                        &r->dst[0][0], &r->remote);
    free(h);
    CUDA_OK(cudaMalloc((void **)&r->flush, FLUSH_BYTES));
    CUDA_OK(cudaStreamCreateWithFlags(&r->s, cudaStreamNonBlocking));
}

static void rig_free(rig_t *r)
{
    for (uint32_t l = 0; l < r->L; l++) {
        cudaFree(r->src[l]);
        for (int k = 0; r->dst_mode == DST_LOCAL && k < W; k++)
            cudaFree(r->dst[l][k]);
    }
    if (r->dst_mode != DST_LOCAL)
        dst_remote_close(&r->remote);
    cudaFree(r->flush);
    cudaStreamDestroy(r->s);
    free(r->src_table);
    free(r->dst_table);
}

/* Request i's relayout: source pages from the table's `from` on (each
 * request its own stretch, as `--sources distinct`: a service moves
 * distinct data, and a source read again would sit in L2), ring pages
 * from `at` (wrapping). */
static kvr_gpu_relayout_t *request(const rig_t *r, uint64_t tokens,
                                   uint64_t from, uint64_t at)
{
    uint64_t ns = (tokens + BS - 1) / BS, nd = vblocks(tokens);
    uint32_t *db = xmalloc(nd * sizeof(*db));
    for (uint64_t k = 0; k < nd; k++)
        db[k] = r->dst_table[(at + k) % r->dst_pool];
    kvr_region_desc_t s = region(r->src_pool), d = region(r->dst_pool);
    kvr_gpu_request_t q = {r->src_table + from, ns, db, nd, tokens, 0};
    kvr_gpu_relayout_t *rl = NULL;
    KVR_OK(kvr_gpu_relayout_create(&r->lay, &s, &d, &q, &rl, &err));
    KVR_OK(kvr_gpu_relayout_upload(rl, &err));
    free(db);
    return rl;
}

/* One request's launches: its W ranks in one (joined) or one a rank. */
static void launch(const rig_t *r, kvr_gpu_relayout_t *rl, bool joined)
{
    uint32_t ranks[MAX_L * W];
    const void *srcs[MAX_L * W];
    void *dsts[MAX_L * W];
    size_t m = 0;
    for (int k = 0; k < W; k++) {
        for (uint32_t l = 0; l < r->L; l++) {
            ranks[m] = (uint32_t)k;
            srcs[m] = r->src[l];
            dsts[m++] = r->dst[l][k];
        }
        if (!joined) {
            KVR_OK(kvr_gpu_scatter_regions(rl, ranks, srcs, dsts, m, r->s,
                                           &err));
            m = 0;
        }
    }
    if (m > 0)
        KVR_OK(kvr_gpu_scatter_regions(rl, ranks, srcs, dsts, m, r->s, &err));
}

/* How a pass launches its requests: one launch a rank, one a request
 * (joined), or K >= 2 requests a call (merged: region-major, or in the
 * order given with kvr__rl_tune_merge_order 1). */
enum { A_RANK = 0, JOINED = 1 };

static const char *how_name(uint32_t how, bool json)
{
    static char buf[48];
    bool given = kvr__rl_tune_merge_order == 1;
    if (how == A_RANK)
        return json ? "per-rank" : "a rank";
    if (how == JOINED)
        return "joined";
    snprintf(buf, sizeof(buf), json ? "merged-%u%s" : "merged %u%s", how,
             !given ? "" : json ? "-request-major" : " rq");
    return buf;
}

/* m requests in one kvr_gpu_scatter_requests call, every (layer, rank)
 * slot of each, given request-major as launch() gives them: the call runs
 * them region-major. */
static void launch_merged(const rig_t *r, kvr_gpu_relayout_t **rl, uint32_t m)
{
    static kvr_gpu_scatter_slot_t s[MAX_MERGE * MAX_L * W];
    size_t n = 0;
    for (uint32_t i = 0; i < m; i++)
        for (int k = 0; k < W; k++)
            for (uint32_t l = 0; l < r->L; l++)
                s[n++] = (kvr_gpu_scatter_slot_t){i, (uint32_t)k, r->src[l],
                                                  r->dst[l][k]};
    KVR_OK(kvr_gpu_scatter_requests((const kvr_gpu_relayout_t *const *)rl, m,
                                    s, n, r->s, &err));
}

/* The pass's launches, an event before each request's (or each merged
 * group's), then each request's device time. */
static void launches(const rig_t *r, kvr_gpu_relayout_t **rl, uint32_t n,
                     uint32_t how, cudaEvent_t *ev, double *req_us)
{
    uint32_t step = how > JOINED ? how : 1;
    for (uint32_t i = 0; i < n; i += step) {
        CUDA_OK(cudaEventRecord(ev[i], r->s));
        if (how > JOINED)
            launch_merged(r, rl + i, n - i < step ? n - i : step);
        else
            launch(r, rl[i], how == JOINED);
    }
    CUDA_OK(cudaEventRecord(ev[n], r->s));
    CUDA_OK(cudaEventSynchronize(ev[n]));
    for (uint32_t i = 0; i < n; i += step) {
        uint32_t end = n - i < step ? n : i + step;
        float ms = 0;
        CUDA_OK(cudaEventElapsedTime(&ms, ev[i], ev[end]));
        for (uint32_t j = i; j < end; j++)
            req_us[j] = ms * 1e3 / (end - i);
    }
}

/* Layer 0, rank W-1 of the pass's last request against the host
 * reference, page by page. */
static const char *check(const rig_t *r, kvr_gpu_relayout_t *rl,
                         uint64_t tokens, uint64_t at)
{
    uint64_t page = (uint64_t)BS * UNIT, sb = (uint64_t)r->src_pool * page;
    uint64_t db = (uint64_t)r->dst_pool * page, nd = vblocks(tokens);
    unsigned char *hs = xmalloc(sb), *want = xmalloc(db), *got = xmalloc(db);
    CUDA_OK(cudaStreamSynchronize(r->s));
    CUDA_OK(cudaMemcpy(hs, r->src[0], sb, cudaMemcpyDeviceToHost));
    CUDA_OK(cudaMemcpy(got, r->dst[0][W - 1], db, cudaMemcpyDeviceToHost));
    memcpy(want, got, db);
    KVR_OK(kvr_gpu_ref_scatter(rl, W - 1, hs, want, &err));
    bool ok = true;
    for (uint64_t k = 0; k < nd && ok; k++) {
        uint64_t p = r->dst_table[(at + k) % r->dst_pool];
        ok = memcmp(got + p * page, want + p * page, page) == 0;
    }
    free(hs);
    free(want);
    free(got);
    return ok ? "verified" : "MISMATCH";
}

typedef struct {
    double us, gbps, req_us[MAX_REQ];
    uint64_t bytes;
    const char *check;
} pass_t;

/* One pass of the trace: every request's launches back to back, an event
 * before each, after the L2 flush. */
static void pass(const rig_t *r, const trace_t *t, uint32_t how, pass_t *out)
{
    kvr_gpu_relayout_t *rl[MAX_REQ];
    uint64_t at[MAX_REQ], cursor = 0, from = 0;
    cudaEvent_t ev[MAX_REQ + 1];
    out->bytes = 0;
    for (uint32_t i = 0; i < t->n; i++) {
        if (cursor + vblocks(t->tokens[i]) > r->dst_pool)
            cursor = 0;
        at[i] = cursor;
        cursor += vblocks(t->tokens[i]);
        rl[i] = request(r, t->tokens[i], from, at[i]);
        from += r->shared ? 0 : (t->tokens[i] + BS - 1) / BS;
        for (int k = 0; k < W; k++)
            out->bytes += kvr_gpu_relayout_bytes(rl[i], (uint32_t)k) * r->L;
    }
    for (uint32_t i = 0; i <= t->n; i++)
        CUDA_OK(cudaEventCreate(&ev[i]));
    CUDA_OK(cudaMemsetAsync(r->flush, (int)(rng++ & 0xff), FLUSH_BYTES, r->s));
    launches(r, rl, t->n, how, ev, out->req_us);
    float ms = 0;
    CUDA_OK(cudaEventElapsedTime(&ms, ev[0], ev[t->n]));
    out->us = ms * 1e3;
    out->gbps = (double)out->bytes / (out->us * 1e3);
    out->check = check(r, rl[t->n - 1], t->tokens[t->n - 1], at[t->n - 1]);
    for (uint32_t i = 0; i <= t->n; i++)
        cudaEventDestroy(ev[i]);
    for (uint32_t i = 0; i < t->n; i++)
        kvr_gpu_relayout_destroy(rl[i]);
}

static bool parse_trace(const char *arg, trace_t *t)
{
    memset(t, 0, sizeof(*t));
    t->name = arg;
    unsigned long long n = 0, c = 0;
    if (sscanf(arg, "fixed:%llu:%llu", &n, &c) == 2) {
        for (t->n = 0; t->n < c && t->n < MAX_REQ; t->n++)
            t->tokens[t->n] = n;
        return n > 0 && c > 0 && c <= MAX_REQ;
    }
    const char *p = arg;
    while (*p && t->n < MAX_REQ) {
        char *end = NULL;
        t->tokens[t->n++] = strtoull(p, &end, 10);
        if (end == p || t->tokens[t->n - 1] == 0)
            return false;
        p = *end == ',' ? end + 1 : end;
        if (*end != ',' && *end != '\0')
            return false;
    }
    return t->n > 0;
}

/* Median over reps of each pass measure; returns the median GB/s. */
static double run(const rig_t *r, const trace_t *t, uint32_t how, int reps,
                  double ceiling, FILE *json, bool *first)
{
    pass_t p[16];
    float g[16];
    int n = reps < 16 ? reps : 16;
    pass_t warm;
    pass(r, t, how, &warm); /* code loaded */
    for (int k = 0; k < n; k++) {
        pass(r, t, how, &p[k]);
        g[k] = (float)p[k].gbps;
    }
    float lo = g[0], hi = g[0];
    for (int k = 0; k < n; k++) {
        lo = g[k] < lo ? g[k] : lo;
        hi = g[k] > hi ? g[k] : hi;
    }
    qsort(g, (size_t)n, sizeof(float), bench_cmp_float);
    double med = g[n / 2], per = 0;
    for (uint32_t i = 0; i < t->n; i++)
        per += p[0].req_us[i];
    printf("%-28.28s %-7s %4u req %8.1f MB %8.1f GB/s (%.1f-%.1f)  ratio %.3f"
           "  %.1f us a request  %s\n",
           t->name, how_name(how, false), t->n, p[0].bytes / 1e6, med, lo, hi,
           ceiling > 0 ? med / ceiling : 1.0, per / t->n, p[0].check);
    fflush(stdout);
    if (json == NULL)
        return med;
    fprintf(json,
            "%s\n  {\"trace\": \"%s\", \"launch\": \"%s\", \"requests\": %u, "
            "\"bytes\": %llu, \"GBps_median\": %.2f, \"GBps_min\": %.2f, "
            "\"GBps_max\": %.2f, \"ratio\": %.4f, \"check\": \"%s\", "
            "\"request_us\": [",
            *first ? "" : ",", t->name, how_name(how, true), t->n,
            (unsigned long long)p[0].bytes, med, lo, hi,
            ceiling > 0 ? med / ceiling : 1.0, p[0].check);
    for (uint32_t i = 0; i < t->n; i++)
        fprintf(json, "%s[%llu, %.1f]", i ? ", " : "",
                (unsigned long long)t->tokens[i], p[0].req_us[i]);
    fprintf(json, "]}");
    *first = false;
    return med;
}

/* --dst-room and --dst-round: a whole number of units (1 MiB, 1 KiB) from 0
 * to 1 << 20 of them, in bytes. */
static uint64_t size_opt(const char *o, const char *v, unsigned shift)
{
    char *end = NULL;
    unsigned long long n = strtoull(v, &end, 10);
    if (end == v || *end != '\0' || v[0] == '-' || n > (1ull << 20))
        DIE("%s: '%s' is not a whole number from 0 to %llu", o, v,
            1ull << 20);
    return (uint64_t)n << shift;
}

int main(int argc, char **argv)
{
    int reps = 5, count = 0, a = 1;
    uint32_t L = 20, merge = 0;
    const char *json_path = NULL;
    rig_t r;
    memset(&r, 0, sizeof(r));
    if (argc > 1 && strcmp(argv[1], "--dst-owner") == 0)
        return dst_owner_main(argc, argv);
    while (a < argc && strncmp(argv[a], "--", 2) == 0) {
        const char *o = argv[a++];
        r.sorted = r.sorted || strcmp(o, "--sorted") == 0;
        r.shared = r.shared || strcmp(o, "--shared") == 0;
        if (strcmp(o, "--sorted") == 0 || strcmp(o, "--shared") == 0)
            continue;
        if (a >= argc)
            DIE("%s needs a value", o);
        const char *v = argv[a++];
        if (strcmp(o, "--layers") == 0)
            L = (uint32_t)atoi(v);
        else if (strcmp(o, "--reps") == 0)
            reps = atoi(v);
        else if (strcmp(o, "--json") == 0)
            json_path = v;
        else if (strcmp(o, "--grid") == 0)
            kvr__rl_tune_grid = atoi(v);
        else if (strcmp(o, "--merge") == 0)
            merge = (uint32_t)atoi(v);
        else if (strcmp(o, "--dst") == 0 && dst_mode_parse(v) < 0)
            DIE("--dst: '%s' is not local, ipc, slab or vmm", v);
        else if (strcmp(o, "--dst") == 0)
            r.dst_mode = (dst_mode_t)dst_mode_parse(v);
        else if (strcmp(o, "--dst-room") == 0)
            r.dst_room = size_opt(o, v, 20);
        else if (strcmp(o, "--dst-round") == 0)
            r.dst_round = size_opt(o, v, 10);
        else
            DIE("unknown option %s", o);
    }
    if (L < 1 || L > MAX_L || reps < 1 || a >= argc || merge == 1 ||
        merge > MAX_MERGE)
        DIE("usage: bench_rl_trace [--layers 1-%d] [--reps N] [--json F] "
            "[--grid BLOCKS] [--merge 2-%d] [--dst local|ipc|slab|vmm] "
            "[--dst-room MiB] [--dst-round KiB] [--sorted] [--shared] TRACE... "
            "(fixed:N:COUNT or a comma list of lengths)",
            MAX_L, MAX_MERGE);
    if (cudaGetDeviceCount(&count) != cudaSuccess || count == 0) {
        fprintf(stderr, "no CUDA device\n");
        return 77;
    }
    int nt = argc - a;
    trace_t *t = xmalloc((size_t)nt * sizeof(*t));
    uint64_t most = 0, ring = 0, total = 0;
    for (int i = 0; i < nt; i++) {
        if (!parse_trace(argv[a + i], &t[i]))
            DIE("bad trace %s", argv[a + i]);
        uint64_t v = 0, tokens = 0;
        for (uint32_t k = 0; k < t[i].n; k++) {
            most = t[i].tokens[k] > most ? t[i].tokens[k] : most;
            v += vblocks(t[i].tokens[k]);
            tokens += t[i].tokens[k];
        }
        ring = v > ring ? v : ring;
        total = tokens > total ? tokens : total;
    }
    /* the ceiling: one request of the largest trace's tokens */
    trace_t ceil_t = {.n = 1, .name = "ceiling (one request)"};
    ceil_t.tokens[0] = total;
    most = total > most ? total : most;
    ring = vblocks(total) > ring ? vblocks(total) : ring;
    struct cudaDeviceProp prop;
    CUDA_OK(cudaGetDeviceProperties(&prop, 0));
    /* room for every request's own stretch, each rounded up to pages */
    rig_make(&r, L, most + (uint64_t)MAX_REQ * BS, ring);
    printf("%s: MLA W=%d I=1 bs=%d %d-byte tokens, %u layers, %s pages, %s "
           "source, destination %s (room %llu MiB, %llu bytes an allocation), "
           "grid %d (0: what fits), "
           "median of %d passes, L2 flushed before each\n",
           prop.name, W, BS, UNIT, L, r.sorted ? "sorted" : "random",
           r.shared ? "shared" : "distinct", dst_mode_name(r.dst_mode),
           (unsigned long long)(r.dst_room >> 20),
           (unsigned long long)r.dst_each, kvr__rl_tune_grid, reps);
    if (merge > 0)
        printf("merged %u: %u requests a kvr_gpu_scatter_requests call, "
               "slots region-major (rq: request-major, the control)\n",
               merge, merge);
    FILE *json = json_path ? fopen(json_path, "w") : NULL;
    if (json_path && json == NULL)
        DIE("cannot write %s", json_path);
    if (json)
        fprintf(json,
                "{\"bench\": \"rl_trace\", \"device\": \"%s\", "
                "\"layers\": %u, \"reps\": %d, \"pages\": \"%s\", "
                "\"source\": \"%s\", \"destination\": \"%s\", "
                "\"grid\": %d, \"merge\": %u, \"runs\": [",
                prop.name, L, reps, r.sorted ? "sorted" : "random",
                r.shared ? "shared" : "distinct", dst_mode_name(r.dst_mode),
                kvr__rl_tune_grid, merge);
    bool first = true;
    double ceiling = run(&r, &ceil_t, JOINED, reps, 0, json, &first);
    for (int i = 0; i < nt; i++) {
        run(&r, &t[i], JOINED, reps, ceiling, json, &first);
        run(&r, &t[i], A_RANK, reps, ceiling, json, &first);
        if (merge == 0)
            continue;
        run(&r, &t[i], merge, reps, ceiling, json, &first);
        kvr__rl_tune_merge_order = 1; /* the control */
        run(&r, &t[i], merge, reps, ceiling, json, &first);
        kvr__rl_tune_merge_order = 0;
    }
    if (json) {
        fprintf(json, "\n]}\n");
        fclose(json);
    }
    rig_free(&r);
    free(t);
    return 0;
}
