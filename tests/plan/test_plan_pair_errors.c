/* Every combination docs/design.md §18 does not plan is refused before a
 * byte moves, each with its own status and a message naming the values;
 * the single-producer API refuses layouts that need pairs; the pair
 * coverage proof rejects plans of the wrong pair; the digest covers the new
 * fields only where they leave their defaults. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include <cmocka.h>

#include "plan_fixture.h"

typedef struct {
    kvr_layout_t lay;
    uint32_t src[32];
    uint32_t dst[8];
    kvr_request_t req;
    kvr_region_pair_t pair;
    uint32_t p, c;
} pb_t;

/* A valid pair: W_p 2 (I_p 1, bs_p 16) -> W 4 (I 1, bs 16), MLA. */
static pb_t base(void)
{
    pb_t b;
    b.lay = fx_layout(16, 4, 1, 1, 1);
    b.lay.producer_dcp = 2;
    b.lay.producer_tp = 2;
    for (uint32_t i = 0; i < 32; i++)
        b.src[i] = i;
    for (uint32_t i = 0; i < 8; i++)
        b.dst[i] = 7 - i;
    b.req = (kvr_request_t){b.src, 32, b.dst, 8, 200, 0};
    b.pair = fx_mla(&b.lay, 64, 32, 8);
    b.p = 1;
    b.c = 2;
    return b;
}

/* Head-sharded dense, TP 4 -> 2, 8 heads, NHD, W 1 on both sides. */
static pb_t dense_base(void)
{
    pb_t b = base();
    b.lay = fx_layout(16, 1, 1, 0, 1);
    b.lay.producer_tp = 4;
    b.lay.tp = 2;
    kvr_region_desc_t d = {.role = KVR_ROLE_DENSE,
                           .layer = 5,
                           .heads = 8,
                           .head_dim = 16,
                           .elem_bytes = 2};
    b.pair.src = b.pair.dst = d;
    b.pair.src.num_blocks = 32;
    b.pair.dst.num_blocks = 8;
    b.pair.src.page_bytes = kvr_dense_page_bytes(&b.lay, &d, false);
    b.pair.dst.page_bytes = kvr_dense_page_bytes(&b.lay, &d, true);
    b.req.num_tokens = 100;
    b.p = 3;
    b.c = 1;
    return b;
}

/* The request's tables are the copy's own (base() returns by value). */
static void own_tables(pb_t *b)
{
    b->req.src_blocks = b->src;
    b->req.dst_blocks = b->dst;
}

static void expect_pair(pb_t *b, kvr_status_t code, const char *needle)
{
    kvr_plan_t *p = NULL;
    kvr_error_t err = {0};
    own_tables(b);
    kvr_status_t st = kvr_plan_create_pair(&b->lay, b->p, b->c, &b->pair,
                                           &b->req, &p, &err);
    if (st != code)
        fail_msg("expected %s, got %s: %s", kvr_status_name(code),
                 kvr_status_name(st), err.msg);
    if (code != KVR_OK) {
        assert_null(p);
        if (strstr(err.msg, needle) == NULL)
            fail_msg("message \"%s\" lacks \"%s\"", err.msg, needle);
    }
    kvr_plan_destroy(p);
}

static void expect_single(pb_t *b, kvr_status_t code, const char *needle)
{
    kvr_plan_t *p = NULL;
    kvr_error_t err = {0};
    own_tables(b);
    kvr_status_t st = kvr_plan_create(&b->lay, 0, &b->pair, &b->req, &p, &err);
    if (st != code || strstr(err.msg, needle) == NULL)
        fail_msg("expected %s with \"%s\", got %s: %s", kvr_status_name(code),
                 needle, kvr_status_name(st), err.msg);
    assert_null(p);
}

static void test_valid_bases(void **state)
{
    (void)state;
    pb_t b = base();
    expect_pair(&b, KVR_OK, "");
    b = dense_base();
    expect_pair(&b, KVR_OK, "");
}

static void test_producer_layout(void **state)
{
    (void)state;
    pb_t b = base();
    b.lay.producer_interleave = 32;
    expect_pair(&b, KVR_ERR_INTERLEAVE_GT_BS, "producer interleave 32");
    b = base();
    b.lay.producer_interleave = 3;
    expect_pair(&b, KVR_ERR_INTERLEAVE_NOT_DIVISOR, "producer block size 16");
    b = base();
    b.lay.producer_tp = 3;
    expect_pair(&b, KVR_ERR_TP_NOT_DIVISIBLE, "producer TP size 3");
    b = base();
    b.p = 2;
    expect_pair(&b, KVR_ERR_RANK_RANGE,
                "producer DCP rank 2 out of range [0, 2)");
    b = base();
    b.c = 4;
    expect_pair(&b, KVR_ERR_RANK_RANGE, "consumer DCP rank 4");
    b = base();
    b.req.num_src_blocks = 3;
    expect_pair(&b, KVR_ERR_SRC_TABLE_SHORT, "producer rank 1");
    b = base();
    b.src[2] = 40;
    expect_pair(&b, KVR_ERR_BLOCK_RANGE, "source block id 40");
    b = base();
    b.pair.src.page_bytes = 32 * 64;
    b.lay.producer_block_size = 16;
    b.pair.dst.page_bytes = 16 * 32;
    expect_pair(&b, KVR_ERR_PAGE_GEOMETRY, "producer token bytes 128");
    b = base();
    b.req.num_computed_blocks = 4;
    expect_pair(&b, KVR_ERR_INCREMENTAL, "num_computed_blocks 4");
}

/* kvr_plan_create plans one producer only. */
static void test_single_api_needs_pairs(void **state)
{
    (void)state;
    pb_t b = base();
    expect_single(&b, KVR_ERR_PAIR_REQUIRED, "W_p=2");
    b = base();
    b.lay.producer_dcp = 0;
    b.lay.producer_block_size = 32;
    b.pair.src.page_bytes = 32 * 64;
    expect_single(&b, KVR_ERR_PAIR_REQUIRED, "bs_p=32");
    b = dense_base();
    expect_single(&b, KVR_ERR_PAIR_REQUIRED, "tp 4 -> 2");
    b = dense_base();
    b.pair.src.heads = b.pair.dst.heads = 0;
    b.pair.src.page_bytes = b.pair.dst.page_bytes = 16 * 64;
    expect_single(&b, KVR_ERR_DENSE_NO_HEADS, "head geometry");
}

static void test_index_combinations(void **state)
{
    (void)state;
    pb_t b = base();
    b.lay.producer_interleave = 4; /* sharded producer index at I_p < bs_p */
    b.pair = fx_index(&b.lay, 32, 32, 8);
    expect_pair(&b, KVR_ERR_PRODUCER_INDEX_INTERLEAVE, "I_p=4, bs_p=16");
    b.lay.producer_replicate_index = true; /* replicated: any I_p */
    b.pair.src.page_bytes = kvr_index_page_tokens(&b.lay, false) * 48;
    expect_pair(&b, KVR_OK, "");
    b = base();
    b.lay.producer_interleave = 16;
    b.lay.interleave = 16;
    b.lay.replicate_index = false; /* sharded -> sharded */
    b.pair = fx_index(&b.lay, 32, 32, 8);
    expect_pair(&b, KVR_ERR_INDEX_NEEDS_REPLICATED, "W_p=2 into consumer W=4");
    b.lay.producer_replicate_index = true; /* replicated -> sharded */
    b.pair.src.page_bytes = kvr_index_page_tokens(&b.lay, false) * 48;
    expect_pair(&b, KVR_ERR_INDEX_NEEDS_REPLICATED, "replicated consumer");
    b = base();
    b.lay.replicate_index = false; /* today's rule, on the consumer */
    b.pair = fx_index(&b.lay, 32, 32, 8);
    expect_pair(&b, KVR_ERR_SHARDED_INDEX_INTERLEAVE, "I=1, bs=16");
    b = base();
    b.lay.producer_block_size = 8;
    b.lay.producer_interleave = 8;
    b.pair = fx_index(&b.lay, 32, 32, 8);
    b.pair.src.page_bytes = 8 * 48;
    expect_pair(&b, KVR_ERR_PRESHUFFLE_BS, "producer bs=8");
}

static void test_dense_combinations(void **state)
{
    (void)state;
    pb_t b = dense_base();
    b.lay.dcp_size = 2;
    b.lay.interleave = 1;
    b.c = 0;
    expect_pair(&b, KVR_ERR_NOT_IMPLEMENTED, "head-sharded over TP only");
    b = dense_base();
    b.lay.producer_dcp = 2;
    expect_pair(&b, KVR_ERR_NOT_IMPLEMENTED, "W_p=2");
    b = dense_base();
    b.pair.src.heads = b.pair.dst.heads = 6; /* 6 heads over TP 4 */
    expect_pair(&b, KVR_ERR_DENSE_HEADS, "6 kv heads over TP 4");
    b = dense_base();
    b.lay.tp = 3; /* 8 heads over TP 3 */
    b.c = 0;
    expect_pair(&b, KVR_ERR_DENSE_HEADS, "consumer dense region layer 5");
    b = dense_base();
    b.pair.dst.page_bytes += 2;
    expect_pair(&b, KVR_ERR_PAGE_GEOMETRY, "needs 4096");
    b = dense_base();
    b.pair.dst.hnd = true;
    expect_pair(&b, KVR_ERR_PAGE_GEOMETRY, "order differ");
    b = dense_base();
    b.pair.src.heads = b.pair.dst.heads = 0;
    b.pair.src.page_bytes = b.pair.dst.page_bytes = 16 * 64;
    b.p = b.c = 0;
    expect_pair(&b, KVR_ERR_DENSE_NO_HEADS, "tp 4 -> 2");
    b = dense_base();
    b.p = 4;
    expect_pair(&b, KVR_ERR_RANK_RANGE,
                "producer TP rank 4 out of range [0, 4)");
    b = dense_base();
    b.pair.dst.role = KVR_ROLE_MLA;
    expect_pair(&b, KVR_ERR_ROLE_MISMATCH, "consumer region layer 5 is mla");
}

static void test_identity_roles(void **state)
{
    (void)state;
    pb_t b = base();
    b.pair.src.role = b.pair.dst.role = KVR_ROLE_STATE;
    expect_pair(&b, KVR_ERR_NO_RELAYOUT, "W_p=2, W=4");
    b = base();
    b.lay = fx_layout(16, 1, 1, 0, 1);
    b.lay.producer_block_size = 32;
    b.pair.src.role = b.pair.dst.role = KVR_ROLE_OTHER;
    b.p = b.c = 0;
    b.req.num_tokens = 100;
    expect_pair(&b, KVR_ERR_NO_RELAYOUT, "bs 32 -> 16");
    b.lay.producer_block_size = 0;
    expect_pair(&b, KVR_OK, "");
    b.pair.src.role = b.pair.dst.role = KVR_ROLE_STAGING;
    expect_pair(&b, KVR_ERR_NO_RELAYOUT, "not KV");
}

static void test_set_axes_and_sources(void **state)
{
    (void)state;
    pb_t b = dense_base();
    kvr_region_pair_t two[2] = {b.pair, b.pair};
    two[1].src.heads = two[1].dst.heads = 0;
    two[1].src.page_bytes = two[1].dst.page_bytes = 16 * 64;
    b.lay.producer_tp = b.lay.tp = 2; /* both planable, on two axes */
    two[0].src.page_bytes = kvr_dense_page_bytes(&b.lay, &two[0].src, false);
    kvr_plan_set_t *set = NULL;
    kvr_error_t err = {0};
    own_tables(&b);
    assert_int_equal(
        kvr_plan_set_create_pair(&b.lay, 0, 0, two, 2, &b.req, &set, &err),
        KVR_ERR_INVALID);
    assert_non_null(strstr(err.msg, "one set per axis"));
    assert_null(set);
    /* TP 4 -> 2 with 8 heads: tp rank 1 takes heads 4-7 from ranks 2, 3 */
    b = dense_base();
    uint32_t ranks[4];
    size_t n = 0;
    assert_int_equal(
        kvr_plan_sources(&b.lay, &b.pair, 1, NULL, ranks, 1, &n, &err),
        KVR_ERR_BUFFER_SMALL);
    assert_int_equal(n, 2);
    assert_int_equal(
        kvr_plan_sources(&b.lay, &b.pair, 1, NULL, ranks, 4, &n, &err), KVR_OK);
    assert_int_equal(n, 2);
    assert_int_equal(ranks[0], 2);
    assert_int_equal(ranks[1], 3);
    /* TP 8 -> 4 with 2 heads: consumers 0, 1 hold head 0, replicated on
     * producers 0-3; consumer 1 takes it from replica 1 */
    b.lay.producer_tp = 8;
    b.lay.tp = 4;
    b.pair.src.heads = b.pair.dst.heads = 2;
    b.pair.src.page_bytes = kvr_dense_page_bytes(&b.lay, &b.pair.src, false);
    b.pair.dst.page_bytes = kvr_dense_page_bytes(&b.lay, &b.pair.dst, true);
    assert_int_equal(
        kvr_plan_sources(&b.lay, &b.pair, 1, NULL, ranks, 4, &n, &err), KVR_OK);
    assert_int_equal(n, 1);
    assert_int_equal(ranks[0], 1);
    /* MLA W_p 2 -> W 4 at I 1: consumer 2 owns tokens 4k + 2, all even */
    b = base();
    assert_int_equal(
        kvr_plan_sources(&b.lay, &b.pair, 2, NULL, ranks, 4, &n, &err), KVR_OK);
    assert_int_equal(n, 1);
    assert_int_equal(ranks[0], 0);
    b.req.num_tokens = 2; /* consumer 2 holds nothing of 2 tokens */
    assert_int_equal(
        kvr_plan_sources(&b.lay, &b.pair, 2, &b.req, ranks, 4, &n, &err),
        KVR_OK);
    assert_int_equal(n, 0);
}

/* Plans of the wrong pair, or one missing, fail the proof. */
static void test_coverage_rejects(void **state)
{
    (void)state;
    pb_t b = base();
    own_tables(&b);
    kvr_request_t reqs[2] = {b.req, b.req};
    kvr_plan_t *plans[8];
    kvr_error_t err = {0};
    for (uint32_t p = 0; p < 2; p++)
        for (uint32_t c = 0; c < 4; c++)
            assert_int_equal(kvr_plan_create_pair(&b.lay, p, c, &b.pair,
                                                  &reqs[p], &plans[p * 4 + c],
                                                  &err),
                             KVR_OK);
    const kvr_plan_t *const *cp = (const kvr_plan_t *const *)plans;
    assert_int_equal(
        kvr_plan_check_coverage_pair(&b.lay, &b.pair, reqs, cp, &err), KVR_OK);
    kvr_plan_t *t = plans[0]; /* producer 0's plan for consumer 0 as 1's */
    plans[0] = plans[4];
    plans[4] = t;
    assert_int_equal(
        kvr_plan_check_coverage_pair(&b.lay, &b.pair, reqs, cp, &err),
        KVR_ERR_VERIFY);
    kvr_plan_t *empty = NULL;
    assert_int_equal(kvr_plan_from_runs(NULL, 0, &empty), KVR_OK);
    plans[4] = plans[0];
    plans[0] = empty;
    assert_int_equal(
        kvr_plan_check_coverage_pair(&b.lay, &b.pair, reqs, cp, &err),
        KVR_ERR_VERIFY);
    assert_non_null(strstr(err.msg, "never written"));
    plans[0] = t;
    kvr_plan_destroy(empty);
    reqs[1].num_tokens = 100;
    assert_int_equal(
        kvr_plan_check_coverage_pair(&b.lay, &b.pair, reqs, cp, &err),
        KVR_ERR_INVALID);
    for (int i = 0; i < 8; i++)
        kvr_plan_destroy(plans[i]);
}

static uint64_t digest(const kvr_layout_t *lay, const kvr_region_desc_t *r,
                       size_t n, bool consumer)
{
    uint64_t d = 0;
    assert_int_equal(kvr_layout_digest_side(lay, r, n, consumer, &d, NULL),
                     KVR_OK);
    return d;
}

/* Counts near 2^64 are refused, never wrapped into a small plan. */
static void test_extreme_counts(void **state)
{
    (void)state;
    pb_t b = base();
    b.req.num_tokens = UINT64_MAX;
    expect_pair(&b, KVR_ERR_DST_TABLE_SHORT, "18446744073709551615 tokens");
    b = base();
    b.req.num_computed_blocks = UINT64_MAX;
    expect_pair(&b, KVR_ERR_INCREMENTAL, "18446744073709551615");
    b = base();
    b.pair.src.num_blocks = 1ull << 60;
    expect_pair(&b, KVR_ERR_PAGE_GEOMETRY, "1152921504606846976 blocks");
    b = dense_base();
    b.req.num_computed_blocks = 1ull << 62;
    expect_pair(&b, KVR_ERR_INCREMENTAL, "4611686018427387904");
    /* a request whose virtual blocks span past 2^64 tokens */
    b = base();
    b.lay.block_size = 1u << 30;
    b.lay.interleave = 1;
    b.lay.dcp_size = b.lay.tp = 1u << 31;
    b.lay.producer_dcp = 0;
    b.lay.producer_tp = 1;
    b.pair = fx_mla(&b.lay, 1, 32, 8);
    b.req.num_tokens = UINT64_MAX - 1; /* 8 entries of 2^61 tokens */
    b.p = b.c = 0;
    expect_pair(&b, KVR_ERR_INVALID, "pass 2^64");
    uint32_t ranks[2];
    size_t n = 9;
    b.req.num_tokens = 100;
    b.req.num_computed_blocks = UINT64_MAX;
    own_tables(&b);
    assert_int_equal(
        kvr_plan_sources(&b.lay, &b.pair, 0, &b.req, ranks, 2, &n, NULL),
        KVR_OK);
    assert_int_equal(n, 0);
}

static void test_digest_fields(void **state)
{
    (void)state;
    kvr_layout_t lay = fx_layout(64, 4, 1, 1, 1);
    kvr_region_pair_t m = fx_mla(&lay, 576, 10, 10);
    uint64_t d0 = digest(&lay, &m.src, 1, true);
    kvr_layout_t l2 = lay;
    l2.producer_dcp = 1;
    l2.producer_interleave = 4; /* irrelevant at W_p == 1 */
    l2.producer_replicate_index = true;
    l2.producer_block_size = 64;
    assert_true(digest(&l2, &m.src, 1, true) == d0);
    l2.producer_dcp = 2;
    l2.producer_interleave = 1;
    l2.producer_replicate_index = false;
    uint64_t d1 = digest(&l2, &m.src, 1, true);
    assert_true(d1 != d0);
    l2.producer_interleave = 2;
    assert_true(digest(&l2, &m.src, 1, true) != d1);
    l2.producer_interleave = 1;
    l2.producer_replicate_index = true;
    assert_true(digest(&l2, &m.src, 1, true) != d1);
    /* a producer block size of its own: both sides' regions agree */
    l2 = lay;
    l2.producer_block_size = 32;
    kvr_region_desc_t ps = m.src;
    ps.page_bytes = 32 * 576;
    assert_true(digest(&l2, &ps, 1, false) == digest(&l2, &m.dst, 1, true));
    assert_true(digest(&l2, &ps, 1, false) != d0);
    /* head geometry and, with it only, the TP sizes */
    kvr_layout_t ld = fx_layout(16, 1, 1, 0, 1);
    kvr_region_desc_t d = {
        .role = KVR_ROLE_DENSE, .heads = 8, .head_dim = 16, .elem_bytes = 2};
    d.page_bytes = kvr_dense_page_bytes(&ld, &d, true);
    uint64_t e0 = digest(&ld, &d, 1, true);
    kvr_layout_t lt = ld;
    lt.tp = 2;
    assert_true(digest(&lt, &d, 1, true) != e0);
    kvr_region_desc_t d2 = d;
    d2.hnd = true;
    assert_true(digest(&ld, &d2, 1, true) != e0);
    d2 = d;
    d2.kv_planes = 2; /* 0 means 2 */
    assert_true(digest(&ld, &d2, 1, true) == e0);
    kvr_region_pair_t st = fx_mla(&ld, 8, 1, 1);
    st.src.role = KVR_ROLE_STATE;
    assert_true(digest(&lt, &st.src, 1, true) == digest(&ld, &st.src, 1, true));
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_valid_bases),
        cmocka_unit_test(test_producer_layout),
        cmocka_unit_test(test_single_api_needs_pairs),
        cmocka_unit_test(test_index_combinations),
        cmocka_unit_test(test_dense_combinations),
        cmocka_unit_test(test_identity_roles),
        cmocka_unit_test(test_set_axes_and_sources),
        cmocka_unit_test(test_coverage_rejects),
        cmocka_unit_test(test_extreme_counts),
        cmocka_unit_test(test_digest_fields),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
