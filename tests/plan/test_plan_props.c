/* Planner properties on random block tables: coverage, no overlap, bytes per
 * rank, run counts, byte-exact host execution, incremental slicing. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>

#include <cmocka.h>

#include "plan_fixture.h"

#define MAXW 8

typedef struct {
    kvr_layout_t lay;
    kvr_request_t req;
    uint32_t src_ids[256];
    uint32_t dst_ids[64];
} scenario_t;

static void make_scenario(scenario_t *s, uint32_t bs, uint32_t W, uint32_t I,
                          int repl, uint64_t N, uint64_t k, unsigned *seed)
{
    s->lay = fx_layout(bs, W, I, repl, bs % 16 == 0);
    size_t nsrc = (size_t)kvr_num_src_blocks(&s->lay, N) + 1;
    size_t ndst = (size_t)kvr_num_dst_blocks(&s->lay, N) + 1;
    assert_true(nsrc <= 256 && ndst <= 64);
    fx_table(s->src_ids, nsrc, (uint32_t)nsrc + 5, seed);
    fx_table(s->dst_ids, ndst, (uint32_t)ndst + 3, seed);
    s->req = (kvr_request_t){s->src_ids, nsrc, s->dst_ids, ndst, N, k};
}

/* Plans every rank, proves coverage, executes on the host and verifies. */
static void check_pair(const scenario_t *s, const kvr_region_pair_t *pair,
                       unsigned *seed)
{
    const kvr_layout_t *lay = &s->lay;
    kvr_plan_t *plans[MAXW] = {0};
    kvr_error_t err = {0};
    uint64_t total = 0;
    for (uint32_t r = 0; r < lay->dcp_size; r++) {
        kvr_status_t st = kvr_plan_create(lay, r, pair, &s->req, &plans[r],
                                          &err);
        if (st != KVR_OK)
            fail_msg("plan rank %u: %s", r, err.msg);
        total += kvr_plan_bytes(plans[r]);
    }
    if (kvr_plan_check_coverage(lay, pair, &s->req,
                                (const kvr_plan_t *const *)plans,
                                &err) != KVR_OK)
        fail_msg("coverage bs=%u W=%u I=%u N=%llu k=%llu: %s", lay->block_size,
                 lay->dcp_size, lay->interleave,
                 (unsigned long long)s->req.num_tokens,
                 (unsigned long long)s->req.num_computed_blocks, err.msg);
    size_t sb = kvr_region_bytes(&pair->src), db = kvr_region_bytes(&pair->dst);
    unsigned char *src = malloc(sb), *dst = malloc(db);
    fx_fill(src, sb, seed);
    for (uint32_t r = 0; r < lay->dcp_size; r++) {
        memset(dst, 0, db);
        kvr_plan_apply_host(plans[r], src, dst);
        if (kvr_verify_region(lay, r, pair, &s->req, src, dst, &err) != KVR_OK)
            fail_msg("verify rank %u: %s", r, err.msg);
        kvr_plan_destroy(plans[r]);
    }
    free(src);
    free(dst);
    (void)total;
}

static uint64_t owned_after(const kvr_layout_t *lay, uint32_t r, uint64_t N,
                            uint64_t k)
{
    uint64_t first = k * kvr_virtual_block(lay);
    return kvr_local_len(lay, N, r) - kvr_local_len(lay, first, r);
}

static void check_mla_counts(const scenario_t *s, uint64_t tb)
{
    kvr_region_pair_t pair = fx_mla(&s->lay, tb, 300, 80);
    uint64_t N = s->req.num_tokens, k = s->req.num_computed_blocks;
    uint32_t bs = s->lay.block_size, I = s->lay.interleave;
    uint64_t V = kvr_virtual_block(&s->lay);
    for (uint32_t r = 0; r < s->lay.dcp_size; r++) {
        kvr_plan_t *p = NULL;
        assert_int_equal(kvr_plan_create(&s->lay, r, &pair, &s->req, &p, NULL),
                         KVR_OK);
        uint64_t owned = owned_after(&s->lay, r, N, k);
        assert_int_equal(kvr_plan_bytes(p), owned * tb);
        uint64_t chunks = 0;
        for (uint64_t c = k * V + (uint64_t)r * I; c < N;
             c += (uint64_t)I * s->lay.dcp_size)
            chunks++;
        assert_int_equal(kvr_plan_runs_uncoalesced(p), chunks);
        if (N % V == 0)
            assert_int_equal(chunks, (N / V - k) * (bs / I));
        size_t n;
        const kvr_run_t *runs = kvr_plan_runs(p, &n);
        for (size_t i = 1; i < n; i++)
            assert_true(runs[i - 1].dst + runs[i - 1].len <= runs[i].dst);
        kvr_plan_destroy(p);
    }
}

static void check_index_counts(const scenario_t *s)
{
    kvr_region_pair_t pair = fx_index(&s->lay, 128, 300, 80);
    uint64_t N = s->req.num_tokens,
             first = s->req.num_computed_blocks * s->lay.dcp_size;
    uint64_t pages = kvr_num_src_blocks(&s->lay, N) - first;
    kvr_plan_t *p = NULL;
    assert_int_equal(kvr_plan_create(&s->lay, 0, &pair, &s->req, &p, NULL),
                     KVR_OK);
    assert_int_equal(kvr_plan_runs_uncoalesced(p), 2 * pages);
    assert_int_equal(kvr_plan_bytes(p), pages * s->lay.block_size * (128 + 4));
    kvr_plan_destroy(p);
}

static void sweep(uint32_t bs, uint32_t W, unsigned *seed)
{
    uint64_t V = (uint64_t)bs * W;
    uint64_t lens[] = {0, 1, V - 1, V, V + 1, 2 * V + bs / 2 + 1, 3 * V + 1};
    for (uint32_t I = 1; I <= bs; I++) {
        if (bs % I)
            continue;
        for (size_t l = 0; l < sizeof(lens) / sizeof(lens[0]); l++) {
            uint64_t N = lens[l];
            for (uint64_t k = 0; k == 0 || k * V < N; k++) {
                scenario_t s;
                make_scenario(&s, bs, W, I, 1, N, k, seed);
                kvr_region_pair_t mla = fx_mla(&s.lay, 24, 300, 80);
                check_pair(&s, &mla, seed);
                check_mla_counts(&s, 576);
                if (bs % 16 == 0) {
                    kvr_region_pair_t idx = fx_index(&s.lay, 32, 300, 80);
                    check_pair(&s, &idx, seed);
                    check_index_counts(&s);
                }
                if (I == bs || W == 1) {
                    s.lay.replicate_index = false;
                    kvr_region_pair_t idx = fx_index(&s.lay, 16, 300, 80);
                    check_pair(&s, &idx, seed);
                }
            }
        }
    }
}

static void test_random_tables_all_layouts(void **state)
{
    (void)state;
    unsigned seed = 12345;
    const uint32_t bss[] = {1, 16, 64}, ws[] = {1, 2, 4, 8};
    for (size_t b = 0; b < 3; b++)
        for (size_t w = 0; w < 4; w++)
            sweep(bss[b], ws[w], &seed);
}

/* I == bs: one uncoalesced run per destination block a rank writes. */
static void test_whole_block_interleave(void **state)
{
    (void)state;
    unsigned seed = 7;
    scenario_t s;
    make_scenario(&s, 64, 4, 64, 1, 4 * 256 + 10, 0, &seed);
    kvr_region_pair_t pair = fx_mla(&s.lay, 576, 300, 80);
    for (uint32_t r = 0; r < 4; r++) {
        kvr_plan_t *p = NULL;
        assert_int_equal(kvr_plan_create(&s.lay, r, &pair, &s.req, &p, NULL),
                         KVR_OK);
        size_t n;
        const kvr_run_t *runs = kvr_plan_runs(p, &n);
        for (size_t i = 0; i < n; i++)
            assert_true(runs[i].len <= 64 * 576);
        assert_int_equal(kvr_plan_runs_uncoalesced(p), r == 0 ? 5 : 4);
        kvr_plan_destroy(p);
    }
}

/* Identity tables coalesce into long runs; plans are deterministic. */
static void test_coalescing_and_determinism(void **state)
{
    (void)state;
    kvr_layout_t lay = fx_layout(16, 1, 1, 0, 1);
    uint32_t ids[8] = {0, 1, 2, 3, 4, 5, 6, 7};
    kvr_request_t req = {ids, 8, ids, 8, 128, 0};
    kvr_region_pair_t pair = fx_mla(&lay, 576, 8, 8);
    kvr_plan_t *a = NULL, *b = NULL;
    assert_int_equal(kvr_plan_create(&lay, 0, &pair, &req, &a, NULL), KVR_OK);
    assert_int_equal(kvr_plan_num_runs(a), 1);
    assert_int_equal(kvr_plan_runs_uncoalesced(a), 128);
    assert_int_equal(kvr_plan_create(&lay, 0, &pair, &req, &b, NULL), KVR_OK);
    size_t na, nb;
    const kvr_run_t *ra = kvr_plan_runs(a, &na), *rb = kvr_plan_runs(b, &nb);
    assert_int_equal(na, nb);
    assert_memory_equal(ra, rb, na * sizeof(*ra));
    kvr_plan_destroy(a);
    kvr_plan_destroy(b);
}

/* Incremental: the k-sliced plan is the full plan without tokens < k*V. */
static void test_incremental_slice(void **state)
{
    (void)state;
    unsigned seed = 99;
    scenario_t s;
    make_scenario(&s, 16, 4, 2, 1, 3 * 64 + 7, 0, &seed);
    kvr_region_pair_t pair = fx_mla(&s.lay, 8, 300, 80);
    for (uint32_t r = 0; r < 4; r++) {
        kvr_plan_t *full = NULL, *inc = NULL;
        assert_int_equal(kvr_plan_create(&s.lay, r, &pair, &s.req, &full, NULL),
                         KVR_OK);
        s.req.num_computed_blocks = 2;
        assert_int_equal(kvr_plan_create(&s.lay, r, &pair, &s.req, &inc, NULL),
                         KVR_OK);
        s.req.num_computed_blocks = 0;
        assert_int_equal(kvr_plan_bytes(full) - kvr_plan_bytes(inc),
                         kvr_local_len(&s.lay, 128, r) * 8);
        size_t n;
        const kvr_run_t *runs = kvr_plan_runs(inc, &n);
        for (size_t i = 0; i < n; i++) /* nothing lands in blocks 0 and 1 */
            assert_true(runs[i].dst / (16 * 8) != s.dst_ids[0] &&
                        runs[i].dst / (16 * 8) != s.dst_ids[1]);
        kvr_plan_destroy(full);
        kvr_plan_destroy(inc);
    }
}

/* Plan sets share one token-space plan per class and scale it. */
static void test_plan_set_classes(void **state)
{
    (void)state;
    unsigned seed = 5;
    scenario_t s;
    make_scenario(&s, 64, 4, 1, 1, 1000, 0, &seed);
    kvr_region_pair_t pairs[6];
    for (int i = 0; i < 3; i++)
        pairs[i] = fx_mla(&s.lay, 576, 300, 80);
    pairs[3] = fx_mla(&s.lay, 1152, 300, 80);
    pairs[4] = fx_index(&s.lay, 128, 300, 80);
    pairs[5] = fx_index(&s.lay, 128, 300, 80);
    kvr_plan_set_t *set = NULL;
    kvr_error_t err = {0};
    assert_int_equal(
        kvr_plan_set_create(&s.lay, 1, pairs, 6, &s.req, &set, &err), KVR_OK);
    assert_int_equal(kvr_plan_set_num_classes(set), 3);
    assert_int_equal(kvr_plan_set_class_of(set, 2), 0);
    assert_int_equal(kvr_plan_set_class_of(set, 5), 2);
    const kvr_plan_t *a = kvr_plan_set_plan_of(set, 0),
                     *b = kvr_plan_set_plan_of(set, 3);
    assert_int_equal(kvr_plan_bytes(b), 2 * kvr_plan_bytes(a));
    assert_int_equal(kvr_plan_num_runs(a), kvr_plan_num_runs(b));
    uint64_t want = 3 * kvr_plan_bytes(a) + kvr_plan_bytes(b) +
                    2 * kvr_plan_bytes(kvr_plan_set_plan_of(set, 4));
    assert_int_equal(kvr_plan_set_total_bytes(set), want);
    kvr_plan_t *single = NULL;
    assert_int_equal(
        kvr_plan_create(&s.lay, 1, &pairs[3], &s.req, &single, NULL), KVR_OK);
    size_t n1, n2;
    const kvr_run_t *r1 = kvr_plan_runs(single, &n1),
                    *r2 = kvr_plan_runs(b, &n2);
    assert_int_equal(n1, n2);
    assert_memory_equal(r1, r2, n1 * sizeof(*r1));
    kvr_plan_destroy(single);
    kvr_plan_set_destroy(set);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_random_tables_all_layouts),
        cmocka_unit_test(test_whole_block_interleave),
        cmocka_unit_test(test_coalescing_and_determinism),
        cmocka_unit_test(test_incremental_slice),
        cmocka_unit_test(test_plan_set_classes),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
