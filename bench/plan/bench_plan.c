/* Planner timing: one DCP rank's plan for a long request, measured many
 * times in one run (min/median/max), plus the headline plan set. Writes
 * JSON to bench/results/ and prints a table. Release build only. */
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
                                 uint32_t layer, uint64_t nsrc, uint64_t ndst)
{
    kvr_region_pair_t p = {{.role = role, .layer = layer, .num_blocks = nsrc},
                           {.role = role, .layer = layer, .num_blocks = ndst}};
    if (role == KVR_ROLE_MLA) {
        p.src.page_bytes = p.dst.page_bytes = lay->block_size * 576ull;
    } else {
        p.src.index_dim = p.dst.index_dim = p.src.quant_block = p.dst.quant_block = 128;
        p.src.page_bytes = kvr_index_page_tokens(lay, false) * 144;
        p.dst.page_bytes = kvr_index_page_tokens(lay, true) * 144;
    }
    return p;
}

/* Median over ranks and repetitions of one plan (or plan set) build. */
static json_t *run_case(const case_t *c, int reps)
{
    kvr_layout_t lay = KVR_LAYOUT_INIT;
    lay.dcp_size = lay.tp = c->W;
    lay.interleave = c->I;
    lay.replicate_index = true;
    size_t nsrc = (size_t)kvr_num_src_blocks(&lay, c->tokens);
    size_t ndst = (size_t)kvr_num_dst_blocks(&lay, c->tokens);
    uint32_t *src = malloc(nsrc * sizeof(*src)), *dst = malloc(ndst * sizeof(*dst));
    for (size_t i = 0; i < nsrc; i++)
        src[i] = (uint32_t)((i * 7919) % nsrc); /* scattered, injective when nsrc % 7919 */
    for (size_t i = 0; i < ndst; i++)
        dst[i] = (uint32_t)(ndst - 1 - i);
    kvr_request_t req = {src, nsrc, dst, ndst, c->tokens, 0};
    size_t npairs = c->headline_set ? 104 : 1;
    kvr_region_pair_t *pairs = calloc(npairs, sizeof(*pairs));
    for (size_t i = 0; i < npairs; i++)
        pairs[i] = pair_of(&lay, i < 78 ? KVR_ROLE_MLA : KVR_ROLE_INDEX, (uint32_t)i,
                           nsrc, ndst);
    double *t = malloc((size_t)reps * c->W * sizeof(*t));
    size_t n = 0, runs = 0;
    for (int r = 0; r < reps; r++)
        for (uint32_t rank = 0; rank < c->W; rank++) {
            kvr_plan_set_t *set = NULL;
            double t0 = now_us();
            if (kvr_plan_set_create(&lay, rank, pairs, npairs, &req, &set, NULL) != KVR_OK)
                abort();
            t[n++] = now_us() - t0;
            runs = (size_t)kvr_plan_set_total_runs(set);
            kvr_plan_set_destroy(set);
        }
    qsort(t, n, sizeof(*t), cmp_d);
    printf("%-22s W=%u I=%-3u %7llu tokens  %8zu runs  min %8.1f  median %8.1f  max %8.1f us\n",
           c->name, c->W, c->I, (unsigned long long)c->tokens, runs, t[0], t[n / 2], t[n - 1]);
    json_t *j = json_pack("{s:s,s:I,s:I,s:I,s:I,s:I,s:f,s:f,s:f}", "case", c->name, "W",
                          (json_int_t)c->W, "I", (json_int_t)c->I, "tokens",
                          (json_int_t)c->tokens, "regions", (json_int_t)npairs, "runs",
                          (json_int_t)runs, "min_us", t[0], "median_us", t[n / 2],
                          "max_us", t[n - 1]);
    free(t);
    free(pairs);
    free(src);
    free(dst);
    return j;
}

int main(int argc, char **argv)
{
    const char *out = argc > 1 ? argv[1] : "bench/results/plan.json";
    static const case_t cases[] = {
        {"mla-128k", 8, 1, 131072, false},
        {"mla-128k", 8, 64, 131072, false},
        {"mla-128k", 4, 1, 131072, false},
        {"headline-set-128k", 4, 1, 131072, true},
        {"headline-set-4k", 4, 1, 4096, true},
    };
    json_t *arr = json_array();
    printf("planner timing, bs=64, one rank's plan per measurement, 50 reps x W ranks\n");
    for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++)
        json_array_append_new(arr, run_case(&cases[i], 50));
    json_t *root = json_pack("{s:s,s:i,s:o}", "bench", "plan", "block_size", 64,
                             "cases", arr);
    if (json_dump_file(root, out, JSON_INDENT(1)) != 0)
        fprintf(stderr, "bench_plan: cannot write %s\n", out);
    json_decref(root);
    return 0;
}
