/* Planner timing: one DCP rank's plan for a long request, measured many
 * times in one run (min/median/max), plus the headline plan set; and the
 * same requests from a sharded producer (docs/design.md §18), where one
 * measurement is everything a consumer rank plans: one pair plan set per
 * producer rank it pulls from. Time per byte planned compares the two.
 * Writes JSON to bench/results/ and prints a table. Release build only. */
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "kvrelay/plan.h"

typedef struct {
    const char *name;
    uint32_t W, I;
    uint64_t tokens;
    bool headline_set; /* 78 MLA + 26 index regions instead of one MLA */
    uint32_t Wp, Ip;   /* producer DCP; 0: today's unsharded producer */
    uint32_t tpp;      /* dense: 32 layers of 8 kv heads x 128 x 2 B over
                          producer TP tpp -> consumer TP 2; 0: MLA */
    bool hnd;
} case_t;

static double now_us(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec * 1e6 + (double)ts.tv_nsec / 1e3;
}

static int cmp_d(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

static kvr_region_pair_t pair_of(const kvr_layout_t *lay, kvr_role_t role,
                                 uint32_t layer, uint64_t nsrc, uint64_t ndst,
                                 bool hnd)
{
    kvr_region_pair_t p = {{.role = role, .layer = layer, .num_blocks = nsrc},
                           {.role = role, .layer = layer, .num_blocks = ndst}};
    if (role == KVR_ROLE_DENSE) {
        kvr_region_desc_t d = {.role = role,
                               .layer = layer,
                               .heads = 8,
                               .head_dim = 128,
                               .elem_bytes = 2,
                               .hnd = hnd};
        p.src = p.dst = d;
        p.src.num_blocks = nsrc;
        p.dst.num_blocks = ndst;
        p.src.page_bytes = kvr_dense_page_bytes(lay, &d, false);
        p.dst.page_bytes = kvr_dense_page_bytes(lay, &d, true);
    } else if (role == KVR_ROLE_MLA) {
        p.src.page_bytes = p.dst.page_bytes = lay->block_size * 576ull;
    } else {
        p.src.index_dim = p.dst.index_dim = p.src.quant_block =
            p.dst.quant_block = 128;
        p.src.page_bytes = kvr_index_page_tokens(lay, false) * 144;
        p.dst.page_bytes = kvr_index_page_tokens(lay, true) * 144;
    }
    return p;
}

/* What one consumer rank plans for the request: its plan set (today), or
 * one pair plan set per producer rank it pulls from. Returns runs and adds
 * the bytes planned. */
static size_t plan_rank(const kvr_layout_t *lay, uint32_t rank,
                        const kvr_region_pair_t *pairs, size_t npairs,
                        const kvr_request_t *req, const uint32_t *sources,
                        size_t nsources, uint64_t *bytes)
{
    size_t runs = 0;
    for (size_t i = 0; i < (nsources ? nsources : 1); i++) {
        kvr_plan_set_t *set = NULL;
        kvr_status_t st = nsources
                              ? kvr_plan_set_create_pair(lay, sources[i], rank,
                                                         pairs, npairs, req,
                                                         &set, NULL)
                              : kvr_plan_set_create(lay, rank, pairs, npairs,
                                                    req, &set, NULL);
        if (st != KVR_OK)
            abort();
        runs += (size_t)kvr_plan_set_total_runs(set);
        *bytes += kvr_plan_set_total_bytes(set);
        kvr_plan_set_destroy(set);
    }
    return runs;
}

/* Producer ranks rank pulls any region from (none for today's producer). */
static size_t rank_sources(const kvr_layout_t *lay, uint32_t rank,
                           const kvr_region_pair_t *pairs, size_t npairs,
                           const kvr_request_t *req, uint32_t *out)
{
    if (kvr_layout_producer_plain(lay) && lay->tp == lay->producer_tp)
        return 0;
    bool used[64] = {false};
    uint32_t ranks[64];
    for (size_t i = 0; i < npairs; i++) {
        size_t n = 0;
        if (kvr_plan_sources(lay, &pairs[i], rank, req, ranks, 64, &n, NULL) !=
            KVR_OK)
            abort();
        for (size_t j = 0; j < n; j++)
            used[ranks[j]] = true;
    }
    size_t n = 0;
    for (uint32_t p = 0; p < 64; p++)
        if (used[p])
            out[n++] = p;
    return n;
}

static kvr_layout_t case_layout(const case_t *c)
{
    kvr_layout_t lay = KVR_LAYOUT_INIT;
    lay.dcp_size = lay.tp = c->W;
    lay.interleave = c->I;
    lay.replicate_index = true;
    if (c->tpp) {
        lay.tp = 2;
        lay.producer_tp = c->tpp;
    } else if (c->Wp) {
        lay.producer_dcp = lay.producer_tp = c->Wp;
        lay.producer_interleave = c->Ip;
        lay.producer_replicate_index = true;
    }
    return lay;
}

/* Median over ranks and repetitions of one consumer rank's planning; time
 * per byte from the medians of the time and the bytes of a rank. */
static json_t *run_case(const case_t *c, int reps)
{
    kvr_layout_t lay = case_layout(c);
    uint64_t vp = (uint64_t)lay.block_size * (c->Wp ? c->Wp : 1);
    size_t nsrc = (size_t)((c->tokens + vp - 1) / vp);
    size_t ndst = (size_t)kvr_num_dst_blocks(&lay, c->tokens);
    uint32_t *src = malloc(nsrc * sizeof(*src)),
             *dst = malloc(ndst * sizeof(*dst));
    for (size_t i = 0; i < nsrc; i++)
        src[i] = (uint32_t)((i * 7919) %
                            nsrc); /* scattered, injective when nsrc % 7919 */
    for (size_t i = 0; i < ndst; i++)
        dst[i] = (uint32_t)(ndst - 1 - i);
    kvr_request_t req = {src, nsrc, dst, ndst, c->tokens, 0};
    size_t npairs = c->headline_set ? 104 : c->tpp ? 32 : 1;
    kvr_region_pair_t *pairs = calloc(npairs, sizeof(*pairs));
    for (size_t i = 0; i < npairs; i++) {
        kvr_role_t role = c->tpp   ? KVR_ROLE_DENSE
                          : i < 78 ? KVR_ROLE_MLA
                                   : KVR_ROLE_INDEX;
        pairs[i] = pair_of(&lay, role, (uint32_t)i, nsrc, ndst, c->hnd);
    }
    double *t = malloc((size_t)reps * c->W * sizeof(*t));
    size_t n = 0, runs = 0, srcs = 0;
    uint64_t bytes = 0;
    uint32_t sources[64];
    for (int r = 0; r < reps; r++)
        for (uint32_t rank = 0; rank < c->W; rank++) {
            uint64_t b = 0;
            double t0 = now_us();
            size_t ns = rank_sources(&lay, rank, pairs, npairs, &req, sources);
            runs = plan_rank(&lay, rank, pairs, npairs, &req, sources, ns, &b);
            t[n++] = now_us() - t0;
            bytes = b;
            srcs = ns ? ns : 1;
        }
    qsort(t, n, sizeof(*t), cmp_d);
    double ps_per_byte = t[n / 2] * 1e6 / (double)bytes;
    printf(
        "%-26s W_p=%u W=%u I=%-3u TP %u->%u %7llu tokens %2zu src %8zu runs  "
        "median %8.1f us  %7.3f ps/B\n",
        c->name, c->Wp ? c->Wp : 1, c->W, c->I, lay.producer_tp, lay.tp,
        (unsigned long long)c->tokens, srcs, runs, t[n / 2], ps_per_byte);
    json_t *j = json_pack(
        "{s:s,s:I,s:I,s:I,s:I,s:I,s:I,s:I,s:I,s:I,s:I,s:f,s:f,s:f,s:f}", "case",
        c->name, "W", (json_int_t)c->W, "I", (json_int_t)c->I, "tp",
        (json_int_t)lay.tp, "producer_tp", (json_int_t)lay.producer_tp,
        "producer_dcp", (json_int_t)(c->Wp ? c->Wp : 1), "tokens",
        (json_int_t)c->tokens, "regions", (json_int_t)npairs, "sources",
        (json_int_t)srcs, "runs", (json_int_t)runs, "bytes", (json_int_t)bytes,
        "min_us", t[0], "median_us", t[n / 2], "max_us", t[n - 1],
        "ps_per_byte", ps_per_byte);
    free(t);
    free(pairs);
    free(src);
    free(dst);
    return j;
}

int main(int argc, char **argv)
{
    if (argc > 2 || (argc == 2 && argv[1][0] == '-')) {
        fprintf(stderr, "usage: bench_plan [OUT.json] (default "
                        "bench/results/plan.json); unexpected '%s'\n",
                argc > 2 ? argv[2] : argv[1]);
        return 2;
    }
    const char *out = argc > 1 ? argv[1] : "bench/results/plan.json";
    static const case_t cases[] = {
        {"mla-128k", 8, 1, 131072, false, 0, 0, 0, false},
        {"mla-128k", 8, 64, 131072, false, 0, 0, 0, false},
        {"mla-128k", 4, 1, 131072, false, 0, 0, 0, false},
        {"headline-set-128k", 4, 1, 131072, true, 0, 0, 0, false},
        {"headline-set-4k", 4, 1, 4096, true, 0, 0, 0, false},
        /* a sharded producer: W_p ranks, replicated producer index */
        {"sharded-mla-128k", 8, 1, 131072, false, 2, 1, 0, false},
        {"sharded-mla-128k", 8, 64, 131072, false, 2, 64, 0, false},
        {"sharded-mla-128k", 4, 1, 131072, false, 4, 1, 0, false},
        {"sharded-mla-128k", 4, 1, 131072, false, 8, 1, 0, false},
        {"sharded-mla-128k-Ip16", 4, 1, 131072, false, 2, 16, 0, false},
        {"sharded-headline-set-128k", 4, 1, 131072, true, 2, 1, 0, false},
        {"sharded-headline-set-4k", 4, 1, 4096, true, 2, 1, 0, false},
        /* dense K/V, 32 layers: identity pages at TP 2 -> 2 (today), and
         * head reshards TP 4 -> 2 in both page orders */
        {"dense-32L-128k", 1, 1, 131072, false, 0, 0, 2, false},
        {"dense-32L-128k-nhd", 1, 1, 131072, false, 0, 0, 4, false},
        {"dense-32L-128k-hnd", 1, 1, 131072, false, 0, 0, 4, true},
    };
    json_t *arr = json_array();
    printf(
        "planner timing, bs=64, one consumer rank's planning per measurement "
        "(all its sources), 50 reps x W ranks\n");
    for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++)
        json_array_append_new(arr, run_case(&cases[i], 50));
    json_t *root = json_pack("{s:s,s:i,s:o}", "bench", "plan", "block_size", 64,
                             "cases", arr);
    if (json_dump_file(root, out, JSON_INDENT(1)) != 0)
        fprintf(stderr, "bench_plan: cannot write %s\n", out);
    json_decref(root);
    return 0;
}
