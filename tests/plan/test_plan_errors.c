/* Every planner check reached, each with its own code and a message naming
 * the values; the verifier catches the historical 144-byte-token bug; the
 * coverage proof rejects bad plans; the digest covers exactly its fields. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include <cmocka.h>

#include "layout_math.h"
#include "plan_fixture.h"

typedef struct {
    kvr_layout_t lay;
    uint32_t src[16];
    uint32_t dst[4];
    kvr_request_t req;
    kvr_region_pair_t pair;
} base_t;

static base_t base(void)
{
    base_t b;
    b.lay = fx_layout(16, 4, 1, 1, 1);
    for (uint32_t i = 0; i < 16; i++)
        b.src[i] = i;
    for (uint32_t i = 0; i < 4; i++)
        b.dst[i] = 3 - i;
    b.req = (kvr_request_t){b.src, 16, b.dst, 4, 200, 0};
    b.pair = fx_mla(&b.lay, 576, 16, 4);
    return b;
}

static void expect(base_t *b, uint32_t rank, kvr_status_t code,
                   const char *needle)
{
    kvr_plan_t *p = NULL;
    kvr_error_t err = {0};
    b->req.src_blocks = b->src;
    b->req.dst_blocks = b->dst;
    kvr_status_t st = kvr_plan_create(&b->lay, rank, &b->pair, &b->req, &p,
                                      &err);
    if (st != code)
        fail_msg("expected %s, got %s: %s", kvr_status_name(code),
                 kvr_status_name(st), err.msg);
    assert_null(p);
    assert_int_equal(err.code, code);
    if (strstr(err.msg, needle) == NULL)
        fail_msg("message \"%s\" lacks \"%s\"", err.msg, needle);
}

static void test_layout_checks_reach_planner(void **state)
{
    (void)state;
    base_t b = base();
    b.lay.interleave = 0;
    expect(&b, 0, KVR_ERR_INTERLEAVE_LT1, "interleave 0");
    b = base();
    b.lay.interleave = 17;
    expect(&b, 0, KVR_ERR_INTERLEAVE_GT_BS, "17");
    b = base();
    b.lay.interleave = 5;
    expect(&b, 0, KVR_ERR_INTERLEAVE_NOT_DIVISOR, "interleave 5");
    b = base();
    b.lay.dcp_size = 0;
    expect(&b, 0, KVR_ERR_DCP_LT1, "DCP size 0");
    b = base();
    b.lay.tp = 2;
    expect(&b, 0, KVR_ERR_TP_NOT_DIVISIBLE, "TP size 2");
    b = base();
    expect(&b, 4, KVR_ERR_RANK_RANGE, "rank 4");
    b = base();
    b.lay.block_size = 0;
    expect(&b, 0, KVR_ERR_BLOCK_SIZE, "block size 0");
}

static void test_request_checks(void **state)
{
    (void)state;
    base_t b = base();
    b.req.num_src_blocks = 12;
    expect(&b, 0, KVR_ERR_SRC_TABLE_SHORT, "13 source blocks");
    b = base();
    b.req.num_dst_blocks = 3;
    expect(&b, 0, KVR_ERR_DST_TABLE_SHORT, "4 destination blocks");
    b = base();
    b.req.num_computed_blocks = 4; /* 4 * 64 >= 200 tokens */
    expect(&b, 0, KVR_ERR_INCREMENTAL, "num_computed_blocks 4");
    b = base();
    b.src[5] = 16;
    expect(&b, 0, KVR_ERR_BLOCK_RANGE, "source block id 16 at table index 5");
    b = base();
    b.dst[2] = 9;
    expect(&b, 0, KVR_ERR_BLOCK_RANGE,
           "destination block id 9 at table index 2");
    b = base();
    b.dst[3] = b.dst[0];
    expect(&b, 0, KVR_ERR_DUPLICATE_BLOCK, "block id 3");
    b = base();
    b.pair.dst.bytes = 4 * 16 * 576 - 1;
    expect(&b, 0, KVR_ERR_RUN_OUT_OF_BOUNDS, "leaves the regions");
}

/* Counts a peer may send near 2^64: ceil(N / bs) must not wrap to zero
 * blocks (an empty plan "loaded" with 0 bytes), products must not wrap. */
static void test_extreme_counts(void **state)
{
    (void)state;
    const uint64_t huge[] = {UINT64_MAX, UINT64_MAX - 14, UINT64_MAX - 15,
                             1ull << 63};
    for (size_t i = 0; i < sizeof(huge) / sizeof(huge[0]); i++) {
        base_t b = base();
        b.req.num_tokens = huge[i];
        expect(&b, 0, KVR_ERR_SRC_TABLE_SHORT,
               "source blocks of 16, the table has 16");
        b.req.num_src_blocks = b.req.num_dst_blocks = 0;
        expect(&b, 1, KVR_ERR_SRC_TABLE_SHORT, "the table has 0");
    }
    base_t b = base();
    b.req.num_tokens = UINT64_MAX;
    expect(
        &b, 0, KVR_ERR_SRC_TABLE_SHORT,
        "18446744073709551615 tokens need 1152921504606846976 source blocks");
    b = base();
    b.req.num_computed_blocks = UINT64_MAX;
    expect(&b, 0, KVR_ERR_INCREMENTAL,
           "num_computed_blocks 18446744073709551615");
    b = base();
    b.req.num_computed_blocks = (1ull << 58) + 1; /* k * V wraps to 64 < N */
    expect(&b, 0, KVR_ERR_INCREMENTAL,
           "num_computed_blocks 288230376151711745");
    /* a region whose blocks x page bytes wrap to exactly what the plan needs */
    b = base();
    b.pair.dst.num_blocks = (1ull << 54) + 4;
    expect(&b, 0, KVR_ERR_PAGE_GEOMETRY,
           "18014398509481988 blocks of 9216 bytes");
    b = base();
    b.pair.src.num_blocks = 1ull << 60;
    expect(&b, 0, KVR_ERR_PAGE_GEOMETRY, "1152921504606846976 blocks");
}

/* The plan set (what both connector sides plan with) refuses the same. */
static void test_extreme_counts_plan_set(void **state)
{
    (void)state;
    base_t b = base();
    kvr_request_t req = {NULL, 0, NULL, 0, UINT64_MAX, 0};
    kvr_plan_set_t *set = NULL;
    kvr_error_t err = {0};
    assert_int_equal(
        kvr_plan_set_create(&b.lay, 0, &b.pair, 1, &req, &set, &err),
        KVR_ERR_SRC_TABLE_SHORT);
    assert_null(set);
    assert_non_null(strstr(err.msg, "18446744073709551615 tokens"));
    kvr_run_t runs[2] = {{0, 0, 8}, {UINT64_MAX - 1, 16, 4}};
    kvr_plan_t *p = NULL;
    assert_int_equal(kvr_plan_from_runs(runs, 2, &p), KVR_ERR_INVALID);
    assert_null(p);
    runs[1] = (kvr_run_t){16, 16, UINT64_MAX - 4};
    assert_int_equal(kvr_plan_from_runs(runs, 2, &p), KVR_ERR_INVALID);
    runs[1] = (kvr_run_t){16, 16, 4};
    assert_int_equal(kvr_plan_from_runs(runs, 2, &p), KVR_OK);
    assert_int_equal(kvr_plan_bytes(p), 12);
    kvr_plan_destroy(p);
}

static void test_region_checks(void **state)
{
    (void)state;
    base_t b = base();
    b.pair.src.page_bytes = b.pair.dst.page_bytes = 16 * 576 + 8;
    expect(&b, 0, KVR_ERR_PAGE_NOT_TOKENS, "9224");
    b = base();
    b.pair.dst.role = KVR_ROLE_INDEX;
    expect(&b, 0, KVR_ERR_ROLE_MISMATCH, "producer region layer 0 is mla");
    b = base();
    b.pair.dst.page_bytes = 16 * 1152;
    expect(&b, 0, KVR_ERR_PAGE_GEOMETRY, "consumer page bytes 18432");
    b = base();
    b.pair = fx_index(&b.lay, 128, 16, 4);
    b.pair.src.quant_block = b.pair.dst.quant_block = 64;
    expect(&b, 0, KVR_ERR_INDEX_QUANT, "D=128, Q=64");
    b = base();
    b.lay.block_size = 8;
    b.lay.interleave = 8;
    b.pair = fx_index(&b.lay, 128, 16, 4);
    b.req.num_tokens = 100;
    expect(&b, 0, KVR_ERR_PRESHUFFLE_BS, "bs=8");
    b = base();
    b.lay.replicate_index = false;
    b.pair = fx_index(&b.lay, 128, 16, 4);
    expect(&b, 0, KVR_ERR_SHARDED_INDEX_INTERLEAVE, "I=1, bs=16");
    b = base();
    b.pair.src.role = b.pair.dst.role = KVR_ROLE_DENSE;
    expect(&b, 0, KVR_ERR_NOT_IMPLEMENTED, "W=4");
    b = base();
    b.pair.src.role = b.pair.dst.role = KVR_ROLE_STATE;
    expect(&b, 0, KVR_ERR_NO_RELAYOUT, "state region");
    b = base();
    b.pair.src.role = b.pair.dst.role = KVR_ROLE_OTHER;
    expect(&b, 0, KVR_ERR_NO_RELAYOUT, "other region");
}

/* At W == 1 every role copies whole pages src[j] -> dst[j]. */
static void test_identity_pages(void **state)
{
    (void)state;
    kvr_layout_t lay = fx_layout(16, 1, 1, 0, 1);
    uint32_t src[4] = {3, 1, 0, 2}, dst[4] = {2, 0, 3, 1};
    kvr_request_t req = {src, 4, dst, 4, 50, 1};
    kvr_region_pair_t pair = fx_mla(&lay, 64, 4, 4);
    pair.src.role = pair.dst.role = KVR_ROLE_STATE;
    kvr_plan_t *p = NULL;
    assert_int_equal(kvr_plan_create(&lay, 0, &pair, &req, &p, NULL), KVR_OK);
    /* src 1->dst 0 and src 2->dst 1 continue on both sides: one run */
    assert_int_equal(kvr_plan_runs_uncoalesced(p), 3);
    assert_int_equal(kvr_plan_num_runs(p), 2);
    assert_int_equal(kvr_plan_bytes(p), 3 * 16 * 64);
    const kvr_plan_t *plans[1] = {p};
    kvr_error_t err = {0};
    assert_int_equal(kvr_plan_check_coverage(&lay, &pair, &req, plans, &err),
                     KVR_OK);
    kvr_plan_destroy(p);
}

/* The historical bug: an index page moved as 144-byte "tokens". */
static void test_verifier_catches_token_windows(void **state)
{
    (void)state;
    kvr_layout_t lay = fx_layout(64, 4, 1, 1, 1);
    uint32_t src[8] = {0, 1, 2, 3, 4, 5, 6, 7}, dst[2] = {1, 0};
    kvr_request_t req = {src, 8, dst, 2, 512, 0};
    kvr_region_pair_t pair = fx_index(&lay, 128, 8, 2);
    kvr_run_t runs[512];
    for (uint64_t g = 0; g < 512; g++)
        runs[g] = (kvr_run_t){kvr__src_slot(src, g, 64) * 144,
                              kvr__dst_slot_repl(dst, g, 64, 4) * 144, 144};
    kvr_plan_t *bad = NULL;
    assert_int_equal(kvr_plan_from_runs(runs, 512, &bad), KVR_OK);
    unsigned seed = 1;
    size_t sb = kvr_region_bytes(&pair.src), db = kvr_region_bytes(&pair.dst);
    unsigned char *s = malloc(sb), *d = calloc(db, 1);
    fx_fill(s, sb, &seed);
    kvr_plan_apply_host(bad, s, d);
    kvr_error_t err = {0};
    assert_int_equal(kvr_verify_region(&lay, 2, &pair, &req, s, d, &err),
                     KVR_ERR_VERIFY);
    assert_non_null(strstr(err.msg, "token 0 wrong"));
    const kvr_plan_t *plans[4] = {bad, bad, bad, bad};
    assert_int_equal(kvr_plan_check_coverage(&lay, &pair, &req, plans, &err),
                     KVR_ERR_VERIFY);
    /* the planner's own plan passes */
    kvr_plan_t *good = NULL;
    assert_int_equal(kvr_plan_create(&lay, 2, &pair, &req, &good, NULL),
                     KVR_OK);
    memset(d, 0, db);
    kvr_plan_apply_host(good, s, d);
    assert_int_equal(kvr_verify_region(&lay, 2, &pair, &req, s, d, &err),
                     KVR_OK);
    d[db / 2 + 7] ^= 1; /* a single flipped byte names its token */
    assert_int_equal(kvr_verify_region(&lay, 2, &pair, &req, s, d, &err),
                     KVR_ERR_VERIFY);
    assert_non_null(strstr(err.msg, "wrong"));
    kvr_plan_destroy(good);
    kvr_plan_destroy(bad);
    free(s);
    free(d);
}

static void coverage_rejects(const kvr_run_t *runs, size_t n,
                             const char *needle)
{
    kvr_layout_t lay = fx_layout(4, 2, 1, 0, 0);
    uint32_t src[2] = {0, 1}, dst[1] = {0};
    kvr_request_t req = {src, 2, dst, 1, 8, 0};
    kvr_region_pair_t pair = fx_mla(&lay, 2, 2, 1);
    kvr_plan_t *p0 = NULL, *p1 = NULL;
    assert_int_equal(kvr_plan_create(&lay, 0, &pair, &req, &p0, NULL), KVR_OK);
    assert_int_equal(kvr_plan_from_runs(runs, n, &p1), KVR_OK);
    const kvr_plan_t *plans[2] = {p0, p1};
    kvr_error_t err = {0};
    assert_int_not_equal(
        kvr_plan_check_coverage(&lay, &pair, &req, plans, &err), KVR_OK);
    if (strstr(err.msg, needle) == NULL)
        fail_msg("\"%s\" lacks \"%s\"", err.msg, needle);
    kvr_plan_destroy(p0);
    kvr_plan_destroy(p1);
}

static void test_coverage_rejects_bad_plans(void **state)
{
    (void)state;
    /* rank 1 owns odd tokens 1,3,5,7 -> local 0..3, src token g at g*2 */
    kvr_run_t good[4] = {{2, 0, 2}, {6, 2, 2}, {10, 4, 2}, {14, 6, 2}};
    kvr_run_t missing[3] = {{2, 0, 2}, {6, 2, 2}, {10, 4, 2}};
    kvr_run_t twice[5] = {
        {2, 0, 2}, {6, 2, 2}, {10, 4, 2}, {14, 6, 2}, {14, 6, 1}};
    kvr_run_t swapped[4] = {{6, 0, 2}, {2, 2, 2}, {10, 4, 2}, {14, 6, 2}};
    kvr_run_t outside[1] = {{0, 7, 2}};
    coverage_rejects(missing, 3, "never written");
    coverage_rejects(twice, 5, "twice");
    coverage_rejects(swapped, 4, "wrong source");
    coverage_rejects(outside, 1, "leaves the regions");
    (void)good;
}

static uint64_t digest_of(const kvr_layout_t *lay, const kvr_region_desc_t *r,
                          size_t n)
{
    uint64_t d = 0;
    assert_int_equal(kvr_layout_digest(lay, r, n, &d, NULL), KVR_OK);
    return d;
}

static void test_digest_fields(void **state)
{
    (void)state;
    kvr_layout_t lay = fx_layout(64, 4, 1, 1, 1);
    kvr_region_pair_t m = fx_mla(&lay, 576, 100, 100),
                      x = fx_index(&lay, 128, 100, 100);
    kvr_region_desc_t regs[3] = {m.src, x.src, m.src};
    uint64_t d0 = digest_of(&lay, regs, 3);
    regs[2].layer = 7;
    regs[2].num_blocks = 3;
    assert_true(digest_of(&lay, regs, 3) ==
                d0); /* layers and counts excluded */
    assert_true(digest_of(&lay, regs, 2) == d0); /* a set, not a list */
    kvr_region_desc_t swapped[2] = {x.src, m.src};
    assert_true(digest_of(&lay, swapped, 2) == d0);
    kvr_layout_t l2 = lay;
    l2.dcp_size = 8;
    l2.tp = 8;
    assert_true(digest_of(&l2, regs, 2) != d0);
    l2 = lay;
    l2.interleave = 4;
    assert_true(digest_of(&l2, regs, 2) != d0);
    l2 = lay;
    l2.replicate_index = false;
    assert_true(digest_of(&l2, regs, 2) != d0);
    l2 = lay;
    l2.preshuffle = false;
    assert_true(digest_of(&l2, regs, 2) != d0);
    l2 = lay;
    l2.block_size = 16;
    assert_true(digest_of(&l2, regs, 2) != d0);
    regs[0].page_bytes = 64 * 1152;
    assert_true(digest_of(&lay, regs, 2) != d0);
    char hex[17];
    kvr_digest_hex(0x0123456789abcdefull, hex);
    assert_string_equal(hex, "efcdab8967452301");
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_layout_checks_reach_planner),
        cmocka_unit_test(test_request_checks),
        cmocka_unit_test(test_extreme_counts),
        cmocka_unit_test(test_extreme_counts_plan_set),
        cmocka_unit_test(test_region_checks),
        cmocka_unit_test(test_identity_pages),
        cmocka_unit_test(test_verifier_catches_token_windows),
        cmocka_unit_test(test_coverage_rejects_bad_plans),
        cmocka_unit_test(test_digest_fields),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
