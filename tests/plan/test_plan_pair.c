/* Pair plans (docs/design.md §18) on random geometries: a producer with its
 * own W_p, I_p, bs_p and index mode, the consumer's W, I, bs, and dense
 * regions head-sharded over TP_p -> TP_c, NHD and HND, replicated heads
 * when TP > H. For every geometry: every pair plans, the coverage proof
 * holds over all pairs, host execution of all pairs verifies byte for byte
 * per pair, the sources a consumer lists are exactly the pairs with bytes,
 * and a pair plan set equals its single plans. With today's producer the
 * pair plan equals kvr_plan_create's. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>

#include <cmocka.h>

#include "plan_fixture.h"

#define MAXR 8    /* ranks per side on either axis */
#define MAXT 1024 /* table entries */

typedef struct {
    kvr_layout_t lay;
    kvr_region_pair_t pair;
    uint32_t src_ids[MAXR][MAXT];
    uint32_t dst_ids[MAXT];
    kvr_request_t reqs[MAXR];
    uint32_t np, nc;
    unsigned seed;
    char what[256];
} pscen_t;

static uint32_t pick(const uint32_t *v, size_t n, unsigned *seed)
{
    return v[(size_t)rand_r(seed) % n];
}

static uint32_t divisor_of(uint32_t bs, unsigned *seed)
{
    uint32_t d;
    do
        d = 1 + (uint32_t)rand_r(seed) % bs;
    while (bs % d != 0);
    return d;
}

/* The layout a producer side alone would have, to size its tables with
 * the public math. */
static uint64_t producer_len(const kvr_layout_t *lay, uint64_t n, uint32_t p)
{
    kvr_layout_t v = *lay;
    v.block_size = kvr_producer_block_size(lay);
    v.dcp_size = kvr_producer_dcp(lay);
    v.interleave = v.dcp_size > 1 ? kvr_producer_interleave(lay) : 1;
    return kvr_local_len(&v, n, p);
}

/* Tables: the consumer's ceil(N / V) (+ one spare), and per producer rank
 * either the shared DCP table (ceil(N / V_p) + spare) or, for token and
 * head axes alike, just the blocks its own tokens need. */
static void make_tables(pscen_t *s, uint64_t N, uint64_t k, int minimal)
{
    kvr_layout_t *lay = &s->lay;
    uint64_t bsp = kvr_producer_block_size(lay), Wp = kvr_producer_dcp(lay);
    if (kvr_region_axis(&s->pair.src) == KVR_AXIS_TP)
        Wp = 1;
    size_t ndst = (size_t)kvr_num_dst_blocks(lay, N) + 1;
    size_t shared = (size_t)((N + bsp * Wp - 1) / (bsp * Wp)) + 1;
    assert_true(ndst <= MAXT && shared <= MAXT);
    uint32_t pool_src = (uint32_t)shared + 3, pool_dst = (uint32_t)ndst + 2;
    fx_table(s->dst_ids, ndst, pool_dst, &s->seed);
    for (uint32_t p = 0; p < s->np; p++) {
        size_t n = shared;
        if (minimal && Wp > 1 && !lay->producer_replicate_index)
            n = (size_t)((producer_len(lay, N, p) + bsp - 1) / bsp);
        fx_table(s->src_ids[p], shared, pool_src, &s->seed);
        s->reqs[p] = (kvr_request_t){s->src_ids[p], n, s->dst_ids, ndst, N, k};
    }
    s->pair.src.num_blocks = pool_src;
    s->pair.dst.num_blocks = pool_dst;
}

static uint64_t pick_tokens(const kvr_layout_t *lay, unsigned *seed)
{
    uint64_t V = kvr_virtual_block(lay);
    uint64_t Vp = (uint64_t)kvr_producer_block_size(lay) *
                  kvr_producer_dcp(lay);
    uint64_t big = (V > Vp ? V : Vp) * 3;
    switch (rand_r(seed) % 6) {
    case 0:
        return 0;
    case 1:
        return 1;
    case 2:
        return V;
    case 3:
        return big;
    default:
        return 1 + (uint64_t)rand_r(seed) % (big + 5);
    }
}

static uint64_t pick_k(const kvr_layout_t *lay, uint64_t N, unsigned *seed)
{
    uint64_t entries = kvr_num_dst_blocks(lay, N);
    if (entries < 2 || rand_r(seed) % 2)
        return 0;
    return (uint64_t)rand_r(seed) % entries;
}

static void check_sources(const pscen_t *s, uint32_t c,
                          kvr_plan_t *const *plans)
{
    uint32_t ranks[MAXR], any[MAXR];
    size_t n = 0, nany = 0, want = 0;
    kvr_error_t err = {0};
    if (kvr_plan_sources(&s->lay, &s->pair, c, &s->reqs[0], ranks, MAXR, &n,
                         &err) != KVR_OK ||
        kvr_plan_sources(&s->lay, &s->pair, c, NULL, any, MAXR, &nany, &err) !=
            KVR_OK)
        fail_msg("%s: sources of %u: %s", s->what, c, err.msg);
    for (uint32_t p = 0; p < s->np; p++) {
        int has = kvr_plan_bytes(plans[p * s->nc + c]) > 0;
        if (has && (want >= n || ranks[want] != p))
            fail_msg("%s: consumer %u: producer %u has bytes but is not "
                     "source %zu of %zu",
                     s->what, c, p, want, n);
        want += has;
        int listed = 0;
        for (size_t i = 0; i < nany; i++)
            listed |= any[i] == p;
        if (has && !listed)
            fail_msg("%s: producer %u missing from the request-free sources",
                     s->what, p);
    }
    if (want != n)
        fail_msg("%s: consumer %u lists %zu sources, %zu have bytes", s->what,
                 c, n, want);
}

/* Executes every pair on the host into per-consumer images and verifies
 * each pair against its producer's image. */
static void execute_and_verify(const pscen_t *s, kvr_plan_t *const *plans,
                               unsigned *seed)
{
    size_t sb = kvr_region_bytes(&s->pair.src),
           db = kvr_region_bytes(&s->pair.dst);
    unsigned char *src[MAXR], *dst = malloc(db);
    for (uint32_t p = 0; p < s->np; p++) {
        src[p] = malloc(sb);
        fx_fill(src[p], sb, seed);
    }
    kvr_error_t err = {0};
    for (uint32_t c = 0; c < s->nc; c++) {
        memset(dst, 0, db);
        for (uint32_t p = 0; p < s->np; p++)
            kvr_plan_apply_host(plans[p * s->nc + c], src[p], dst);
        for (uint32_t p = 0; p < s->np; p++)
            if (kvr_verify_region_pair(&s->lay, p, c, &s->pair, &s->reqs[p],
                                       src[p], dst, &err) != KVR_OK)
                fail_msg("%s: verify (%u, %u): %s", s->what, p, c, err.msg);
        /* a corrupted byte of a non-empty pair is caught (index slack
         * aside, so latent and dense only) */
        for (uint32_t p = 0; p < s->np; p++) {
            size_t n;
            const kvr_run_t *r = kvr_plan_runs(plans[p * s->nc + c], &n);
            if (n == 0 || s->pair.src.role == KVR_ROLE_INDEX)
                continue;
            dst[r[0].dst] ^= 0x5a;
            if (kvr_verify_region_pair(&s->lay, p, c, &s->pair, &s->reqs[p],
                                       src[p], dst, &err) != KVR_ERR_VERIFY)
                fail_msg("%s: corrupted (%u, %u) verified", s->what, p, c);
            dst[r[0].dst] ^= 0x5a;
        }
    }
    for (uint32_t p = 0; p < s->np; p++)
        free(src[p]);
    free(dst);
}

/* A set of two copies of the pair is the single plan twice. */
static void check_set(const pscen_t *s, uint32_t p, uint32_t c,
                      const kvr_plan_t *single)
{
    kvr_region_pair_t two[2] = {s->pair, s->pair};
    two[1].src.layer = two[1].dst.layer = 9;
    kvr_plan_set_t *set = NULL;
    kvr_error_t err = {0};
    if (kvr_plan_set_create_pair(&s->lay, p, c, two, 2, &s->reqs[p], &set,
                                 &err) != KVR_OK)
        fail_msg("%s: set (%u, %u): %s", s->what, p, c, err.msg);
    assert_int_equal(kvr_plan_set_num_classes(set), 1);
    size_t n1, n2;
    const kvr_run_t *a = kvr_plan_runs(single, &n1);
    const kvr_run_t *b = kvr_plan_runs(kvr_plan_set_plan_of(set, 1), &n2);
    assert_int_equal(n1, n2);
    if (n1)
        assert_memory_equal(a, b, n1 * sizeof(*a));
    assert_int_equal(kvr_plan_set_total_bytes(set), 2 * kvr_plan_bytes(single));
    kvr_plan_set_destroy(set);
}

static void check_scenario(pscen_t *s)
{
    kvr_plan_t *plans[MAXR * MAXR] = {0};
    kvr_error_t err = {0};
    for (uint32_t p = 0; p < s->np; p++)
        for (uint32_t c = 0; c < s->nc; c++)
            if (kvr_plan_create_pair(&s->lay, p, c, &s->pair, &s->reqs[p],
                                     &plans[p * s->nc + c], &err) != KVR_OK)
                fail_msg("%s: plan (%u, %u): %s", s->what, p, c, err.msg);
    if (kvr_plan_check_coverage_pair(&s->lay, &s->pair, s->reqs,
                                     (const kvr_plan_t *const *)plans,
                                     &err) != KVR_OK)
        fail_msg("%s: coverage: %s", s->what, err.msg);
    for (uint32_t c = 0; c < s->nc; c++)
        check_sources(s, c, plans);
    execute_and_verify(s, plans, &s->seed);
    check_set(s, s->np - 1, s->nc - 1, plans[(s->np - 1) * s->nc + s->nc - 1]);
    for (uint32_t i = 0; i < s->np * s->nc; i++)
        kvr_plan_destroy(plans[i]);
}

static void describe(pscen_t *s, const char *kind)
{
    const kvr_layout_t *l = &s->lay;
    snprintf(s->what, sizeof(s->what),
             "%s W_p=%u I_p=%u bs_p=%u%s -> W=%u I=%u bs=%u%s TP %u->%u "
             "H=%u N=%llu k=%llu%s",
             kind, kvr_producer_dcp(l), kvr_producer_interleave(l),
             kvr_producer_block_size(l),
             l->producer_replicate_index ? " repl" : "", l->dcp_size,
             l->interleave, l->block_size, l->replicate_index ? " repl" : "",
             l->producer_tp, l->tp, s->pair.src.heads,
             (unsigned long long)s->reqs[0].num_tokens,
             (unsigned long long)s->reqs[0].num_computed_blocks,
             s->pair.src.hnd ? " hnd" : "");
}

static void set_sides(kvr_layout_t *lay, uint32_t Wp, uint32_t Ip, uint32_t bsp,
                      uint32_t W, uint32_t I, uint32_t bs)
{
    *lay = fx_layout(bs, W, I, 0, 0);
    lay->producer_dcp = Wp;
    lay->producer_interleave = Ip;
    lay->producer_block_size = bsp;
    lay->producer_tp = Wp;
}

static void finish_scenario(pscen_t *s, const char *kind)
{
    uint64_t N = pick_tokens(&s->lay, &s->seed);
    uint64_t k = pick_k(&s->lay, N, &s->seed);
    make_tables(s, N, k, rand_r(&s->seed) % 2);
    describe(s, kind);
    check_scenario(s);
}

static void mla_case(pscen_t *s)
{
    static const uint32_t bss[] = {1, 2, 4, 8, 16}, ws[] = {1, 2, 3, 4, 8};
    uint32_t bsp = pick(bss, 5, &s->seed), bs = pick(bss, 5, &s->seed);
    set_sides(&s->lay, pick(ws, 5, &s->seed), divisor_of(bsp, &s->seed), bsp,
              pick(ws, 5, &s->seed), divisor_of(bs, &s->seed), bs);
    uint64_t tb = 1 + (uint64_t)rand_r(&s->seed) % 6;
    s->pair = fx_mla(&s->lay, tb, 1, 1);
    s->pair.src.page_bytes = bsp * tb;
    s->np = kvr_producer_dcp(&s->lay);
    s->nc = s->lay.dcp_size;
    finish_scenario(s, "mla");
}

/* Only the index combinations §18 plans: W_p == 1 into anything today's
 * rules allow; W_p > 1 (replicated, or sharded at I_p == bs_p) into a
 * replicated consumer. */
static void index_case(pscen_t *s)
{
    static const uint32_t plain[] = {1, 2, 4, 8, 16}, shuf[] = {16, 32, 48};
    static const uint32_t ws[] = {1, 2, 3, 4};
    int preshuffle = rand_r(&s->seed) % 2;
    const uint32_t *bss = preshuffle ? shuf : plain;
    size_t nb = preshuffle ? 3 : 5;
    uint32_t bsp = pick(bss, nb, &s->seed), bs = pick(bss, nb, &s->seed);
    uint32_t Wp = pick(ws, 4, &s->seed), W = pick(ws, 4, &s->seed);
    int prepl = Wp > 1 && rand_r(&s->seed) % 2;
    int crepl = Wp > 1 || W == 1 || rand_r(&s->seed) % 2;
    uint32_t Ip = prepl ? divisor_of(bsp, &s->seed) : bsp;
    uint32_t I = crepl ? divisor_of(bs, &s->seed) : bs;
    set_sides(&s->lay, Wp, Ip, bsp, W, I, bs);
    s->lay.preshuffle = preshuffle;
    s->lay.producer_replicate_index = prepl;
    s->lay.replicate_index = crepl;
    uint32_t D = preshuffle ? 16 * (1 + (uint32_t)rand_r(&s->seed) % 2)
                            : 1 + (uint32_t)rand_r(&s->seed) % 8;
    s->pair = fx_index(&s->lay, D, 1, 1);
    s->pair.src.page_bytes = kvr_index_page_tokens(&s->lay, false) *
                             kvr_index_stride(D);
    s->np = Wp;
    s->nc = W;
    finish_scenario(s, "index");
}

/* H kv heads over TP sizes that divide it or that it divides. */
static void dense_case(pscen_t *s)
{
    static const uint32_t hs[] = {1, 2, 3, 4, 6, 8}, bss[] = {1, 2, 3, 4, 8};
    uint32_t H = pick(hs, 6, &s->seed);
    uint32_t tps[16], n = 0;
    for (uint32_t t = 1; t <= MAXR; t++)
        if (H % t == 0 || t % H == 0)
            tps[n++] = t;
    uint32_t bsp = pick(bss, 5, &s->seed), bs = pick(bss, 5, &s->seed);
    set_sides(&s->lay, 1, 1, bsp, 1, 1, bs);
    s->lay.producer_tp = pick(tps, n, &s->seed);
    s->lay.tp = pick(tps, n, &s->seed);
    kvr_region_desc_t d = {.role = KVR_ROLE_DENSE,
                           .layer = 2,
                           .heads = H,
                           .head_dim = 1 + (uint32_t)rand_r(&s->seed) % 4,
                           .elem_bytes = 1 + (uint32_t)rand_r(&s->seed) % 2,
                           .kv_planes = (uint32_t)rand_r(&s->seed) % 3,
                           .hnd = rand_r(&s->seed) % 2};
    s->pair.src = s->pair.dst = d;
    s->pair.src.page_bytes = kvr_dense_page_bytes(&s->lay, &d, false);
    s->pair.dst.page_bytes = kvr_dense_page_bytes(&s->lay, &d, true);
    s->np = s->lay.producer_tp;
    s->nc = s->lay.tp;
    finish_scenario(s, "dense");
}

static void test_random_mla(void **state)
{
    (void)state;
    pscen_t s = {.seed = 101};
    for (int i = 0; i < 1500; i++)
        mla_case(&s);
}

static void test_random_index(void **state)
{
    (void)state;
    pscen_t s = {.seed = 202};
    for (int i = 0; i < 1000; i++)
        index_case(&s);
}

static void test_random_dense(void **state)
{
    (void)state;
    pscen_t s = {.seed = 303};
    for (int i = 0; i < 1500; i++)
        dense_case(&s);
}

/* The cases by name: W_p 2 -> 4 and 4 -> 2 at I 1 and 16; TP 4 -> 2
 * and 2 -> 8 with 8 and 2 kv heads, NHD and HND. */
static void test_named_cases(void **state)
{
    (void)state;
    static const uint32_t w[][2] = {{2, 4}, {4, 2}}, I[] = {1, 16};
    pscen_t s = {.seed = 404};
    for (int a = 0; a < 2; a++)
        for (int b = 0; b < 2; b++) {
            set_sides(&s.lay, w[a][0], I[b], 16, w[a][1], I[b], 16);
            s.pair = fx_mla(&s.lay, 5, 1, 1);
            s.np = w[a][0];
            s.nc = w[a][1];
            make_tables(&s, 16 * 8 * 3 + 5, 0, 0);
            describe(&s, "mla");
            check_scenario(&s);
        }
    static const uint32_t tp[][2] = {{4, 2}, {2, 8}}, heads[] = {8, 2};
    for (int a = 0; a < 2; a++)
        for (int h = 0; h < 2; h++)
            for (int hnd = 0; hnd < 2; hnd++) {
                set_sides(&s.lay, 1, 1, 16, 1, 1, 16);
                s.lay.producer_tp = tp[a][0];
                s.lay.tp = tp[a][1];
                kvr_region_desc_t d = {.role = KVR_ROLE_DENSE,
                                       .heads = heads[h],
                                       .head_dim = 8,
                                       .elem_bytes = 2,
                                       .hnd = hnd};
                s.pair.src = s.pair.dst = d;
                s.pair.src.page_bytes = kvr_dense_page_bytes(&s.lay, &d, false);
                s.pair.dst.page_bytes = kvr_dense_page_bytes(&s.lay, &d, true);
                s.np = tp[a][0];
                s.nc = tp[a][1];
                make_tables(&s, 16 * 5 + 3, 1, 0);
                describe(&s, "dense");
                check_scenario(&s);
            }
}

/* With today's producer the pair plan is kvr_plan_create's, run for run. */
static void same_plan(const kvr_layout_t *lay, uint32_t r, uint32_t p,
                      uint32_t c, const kvr_region_pair_t *pair,
                      const kvr_request_t *req)
{
    kvr_plan_t *a = NULL, *b = NULL;
    kvr_error_t err = {0};
    if (kvr_plan_create(lay, r, pair, req, &a, &err) != KVR_OK ||
        kvr_plan_create_pair(lay, p, c, pair, req, &b, &err) != KVR_OK)
        fail_msg("rank %u: %s", r, err.msg);
    size_t na, nb;
    const kvr_run_t *ra = kvr_plan_runs(a, &na), *rb = kvr_plan_runs(b, &nb);
    if (na != nb || (na && memcmp(ra, rb, na * sizeof(*ra)) != 0))
        fail_msg("%s bs=%u W=%u I=%u N=%llu k=%llu rank %u: %zu runs vs %zu",
                 kvr_role_name(pair->src.role), lay->block_size, lay->dcp_size,
                 lay->interleave, (unsigned long long)req->num_tokens,
                 (unsigned long long)req->num_computed_blocks, r, na, nb);
    assert_int_equal(kvr_plan_bytes(a), kvr_plan_bytes(b));
    kvr_plan_destroy(a);
    kvr_plan_destroy(b);
}

static void test_equals_today(void **state)
{
    (void)state;
    static const uint32_t bss[] = {1, 16, 64}, ws[] = {1, 2, 4, 8};
    unsigned seed = 505;
    uint32_t src[MAXT], dst[MAXT];
    for (int i = 0; i < 300; i++) {
        uint32_t bs = pick(bss, 3, &seed), W = pick(ws, 4, &seed);
        uint32_t I = divisor_of(bs, &seed);
        int repl = rand_r(&seed) % 2 || (W > 1 && I < bs);
        kvr_layout_t lay = fx_layout(bs, W, I, repl, bs % 16 == 0);
        uint64_t N = pick_tokens(&lay, &seed), k = pick_k(&lay, N, &seed);
        size_t ns = (size_t)kvr_num_src_blocks(&lay, N) + 1;
        size_t nd = (size_t)kvr_num_dst_blocks(&lay, N) + 1;
        if (ns > MAXT)
            continue;
        fx_table(src, ns, (uint32_t)ns + 2, &seed);
        fx_table(dst, nd, (uint32_t)nd + 2, &seed);
        kvr_request_t req = {src, ns, dst, nd, N, k};
        kvr_region_pair_t mla = fx_mla(&lay, 7, ns + 2, nd + 2);
        kvr_region_pair_t idx = fx_index(&lay, 16, ns + 2, nd + 2);
        for (uint32_t r = 0; r < W; r++) {
            same_plan(&lay, r, 0, r, &mla, &req);
            if (bs % 16 == 0)
                same_plan(&lay, r, 0, r, &idx, &req);
        }
        if (W == 1) {
            kvr_region_pair_t st = mla;
            st.src.role = st.dst.role = KVR_ROLE_STATE;
            same_plan(&lay, 0, 0, 0, &st, &req);
            /* head-sharded dense at equal TP: tp rank t's pages to t */
            kvr_region_desc_t d = {.role = KVR_ROLE_DENSE,
                                   .heads = 4,
                                   .head_dim = 2,
                                   .elem_bytes = 2};
            lay.tp = lay.producer_tp = 2;
            kvr_region_pair_t dn = {d, d};
            dn.src.num_blocks = ns + 2;
            dn.dst.num_blocks = nd + 2;
            dn.src.page_bytes = dn.dst.page_bytes = kvr_dense_page_bytes(
                &lay, &d, true);
            same_plan(&lay, 0, 1, 1, &dn, &req);
        }
    }
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_equals_today),
        cmocka_unit_test(test_named_cases),
        cmocka_unit_test(test_random_mla),
        cmocka_unit_test(test_random_index),
        cmocka_unit_test(test_random_dense),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
