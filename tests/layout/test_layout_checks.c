/* Layout and region validation: each check its own code, message naming
 * the values. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include <cmocka.h>

#include "kvrelay/layout.h"

static kvr_layout_t base(void)
{
    kvr_layout_t lay = KVR_LAYOUT_INIT;
    lay.block_size = 16;
    lay.dcp_size = 4;
    lay.interleave = 1;
    lay.tp = 4;
    return lay;
}

static void expect(const kvr_layout_t *lay, kvr_status_t code,
                   const char *needle)
{
    kvr_error_t err = {0};
    assert_int_equal(kvr_layout_check(lay, &err), code);
    assert_int_equal(err.code, code);
    assert_non_null(strstr(err.msg, needle));
}

static void test_layout_errors(void **state)
{
    (void)state;
    kvr_layout_t lay = base();
    assert_int_equal(kvr_layout_check(&lay, NULL), KVR_OK);
    lay.interleave = 0;
    expect(&lay, KVR_ERR_INTERLEAVE_LT1, "interleave 0");
    lay = base();
    lay.interleave = 32;
    expect(&lay, KVR_ERR_INTERLEAVE_GT_BS, "interleave 32 > block size 16");
    lay = base();
    lay.interleave = 3;
    expect(&lay, KVR_ERR_INTERLEAVE_NOT_DIVISOR, "interleave 3");
    lay = base();
    lay.dcp_size = 0;
    expect(&lay, KVR_ERR_DCP_LT1, "DCP size 0");
    lay = base();
    lay.tp = 6;
    expect(&lay, KVR_ERR_TP_NOT_DIVISIBLE, "TP size 6");
    lay = base();
    lay.block_size = 0;
    expect(&lay, KVR_ERR_BLOCK_SIZE, "block size 0");
    lay = base();
    kvr_error_t err = {0};
    assert_int_equal(kvr_layout_check_rank(&lay, 4, &err), KVR_ERR_RANK_RANGE);
    assert_non_null(strstr(err.msg, "rank 4"));
}

static void test_region_errors(void **state)
{
    (void)state;
    kvr_layout_t lay = base();
    kvr_error_t err = {0};
    kvr_region_desc_t mla = {.role = KVR_ROLE_MLA,
                             .layer = 3,
                             .num_blocks = 8,
                             .page_bytes = 16 * 576 + 1};
    assert_int_equal(kvr_region_check(&lay, &mla, false, &err),
                     KVR_ERR_PAGE_NOT_TOKENS);
    assert_non_null(strstr(err.msg, "9217"));
    kvr_region_desc_t idx = {.role = KVR_ROLE_INDEX,
                             .layer = 1,
                             .num_blocks = 8,
                             .page_bytes = 16 * 144,
                             .index_dim = 128,
                             .quant_block = 64};
    assert_int_equal(kvr_region_check(&lay, &idx, false, &err),
                     KVR_ERR_INDEX_QUANT);
    assert_non_null(strstr(err.msg, "Q=64"));
    idx.quant_block = 128;
    assert_int_equal(kvr_region_check(&lay, &idx, false, NULL), KVR_OK);
    /* a replicated consumer page must be W times wider */
    lay.replicate_index = true;
    assert_int_equal(kvr_region_check(&lay, &idx, true, &err),
                     KVR_ERR_PAGE_GEOMETRY);
    idx.page_bytes *= 4;
    assert_int_equal(kvr_region_check(&lay, &idx, true, NULL), KVR_OK);
    lay.block_size = 8;
    lay.interleave = 8;
    assert_int_equal(kvr_region_check(&lay, &idx, false, &err),
                     KVR_ERR_PRESHUFFLE_BS);
    assert_non_null(strstr(err.msg, "bs=8"));
    lay.preshuffle = false;
    idx.page_bytes = 8 * 144;
    assert_int_equal(kvr_region_check(&lay, &idx, false, NULL), KVR_OK);
}

/* Sizes a peer announces must not wrap: blocks x page bytes, and the index
 * page a replicated consumer needs (V x (D + 4)). */
static void test_region_overflow(void **state)
{
    (void)state;
    kvr_layout_t lay = base();
    kvr_error_t err = {0};
    kvr_region_desc_t mla = {.role = KVR_ROLE_MLA,
                             .layer = 2,
                             .num_blocks = 1ull << 51,
                             .page_bytes = 16 * 576};
    assert_int_equal(kvr_region_check(&lay, &mla, true, &err),
                     KVR_ERR_PAGE_GEOMETRY);
    assert_non_null(strstr(err.msg, "2251799813685248 blocks of 9216 bytes"));
    mla.num_blocks = UINT64_MAX / 9216;
    assert_int_equal(kvr_region_check(&lay, &mla, true, NULL), KVR_OK);
    kvr_region_desc_t st = {.role = KVR_ROLE_STAGING,
                            .num_blocks = 3,
                            .page_bytes = UINT64_MAX / 2};
    assert_int_equal(kvr_region_check(&lay, &st, true, &err),
                     KVR_ERR_PAGE_GEOMETRY);
    assert_non_null(strstr(err.msg, "9223372036854775807"));
    /* V = bs * W near 2^64, so V * (D + 4) wraps */
    kvr_layout_t wide = base();
    wide.block_size = 1u << 31;
    wide.interleave = 1u << 31;
    wide.dcp_size = 1u << 31;
    wide.tp = 1u << 31;
    wide.replicate_index = true;
    kvr_region_desc_t idx = {.role = KVR_ROLE_INDEX,
                             .layer = 1,
                             .num_blocks = 1,
                             .page_bytes = 1024,
                             .index_dim = 128};
    assert_int_equal(kvr_region_check(&wide, &idx, true, &err),
                     KVR_ERR_PAGE_GEOMETRY);
    assert_non_null(strstr(err.msg, "4611686018427387904 tokens"));
}

static void test_status_names(void **state)
{
    (void)state;
    assert_string_equal(kvr_status_name(KVR_ERR_BLOCK_RANGE),
                        "ERR_BLOCK_RANGE");
    assert_int_equal(KVR_ERR_BLOCK_RANGE, 19);
    assert_string_equal(kvr_status_str((kvr_status_t)12345), "unknown status");
    kvr_role_t role;
    assert_int_equal(kvr_role_parse("index", &role), KVR_OK);
    assert_int_equal(role, KVR_ROLE_INDEX);
    assert_int_equal(kvr_role_parse("bogus", &role), KVR_ERR_INVALID);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_layout_errors),
        cmocka_unit_test(test_region_errors),
        cmocka_unit_test(test_region_overflow),
        cmocka_unit_test(test_status_names),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
