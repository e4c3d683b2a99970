/* Prefix hashes at hash_block_size and the cached-prefix arithmetic
 * (docs/design.md §2, §9). Golden values come from Python's hashlib:
 *   h = b"\0" * 32
 *   h = sha256(h + b"".join(struct.pack("<I", t) for t in block)).digest() */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>

#include <cmocka.h>

#include "kvrelay/completion.h"

static void hex_equal(const kvr_block_hash_t *h, const char *hex)
{
    char got[2 * KVR_BLOCK_HASH_BYTES + 1];
    for (int i = 0; i < KVR_BLOCK_HASH_BYTES; i++)
        snprintf(got + 2 * i, 3, "%02x", h->bytes[i]);
    assert_string_equal(got, hex);
}

static void test_golden(void **state)
{
    (void)state;
    const uint32_t tok[] = {1, 2, 3, 4, 5, 6, 7, 8, 9};
    kvr_block_hash_t h[3];
    size_t n = 0;
    assert_int_equal(kvr_prefix_hashes(NULL, tok, 9, 4, h, 3, &n, NULL),
                     KVR_OK);
    assert_int_equal(n, 2); /* the ninth token is a partial block */
    hex_equal(
        &h[0],
        "d8faa8ec8c0500567ca87b56e4bb666d69cb512e638103891defea24e88cbc92");
    hex_equal(
        &h[1],
        "d1637bc3762f67abb1ac6b35e87c7ddaee8d04b0c3879d2d3afb2f6dc3f6a56a");
    /* byte order: token ids are u32 little-endian */
    const uint32_t wide[] = {0xdeadbeefu, 0, 1, 0xffffffffu};
    assert_int_equal(kvr_prefix_hashes(NULL, wide, 4, 2, h, 3, &n, NULL),
                     KVR_OK);
    assert_int_equal(n, 2);
    hex_equal(
        &h[0],
        "9043dbcdc3acab7685f1ddefec249d52ffacb9207f4aa777c5b4260f2287674c");
    hex_equal(
        &h[1],
        "b7539288879734bacd8450d668952b82e2906a90e6bef0d6d1d116d2ee81dea4");
}

/* Hashing in pieces with a parent equals hashing at once (a received
 * prompt extends a cached prefix). */
static void test_parent_chain(void **state)
{
    (void)state;
    enum { HBS = 256, BLOCKS = 5 };
    static uint32_t tok[HBS * BLOCKS + 17];
    for (size_t i = 0; i < sizeof(tok) / sizeof(tok[0]); i++)
        tok[i] = (uint32_t)(i * 2654435761u);
    kvr_block_hash_t all[BLOCKS], part[BLOCKS];
    size_t n = 0, m = 0;
    assert_int_equal(kvr_prefix_hashes(NULL, tok, sizeof(tok) / 4, HBS, all,
                                       BLOCKS, &n, NULL),
                     KVR_OK);
    assert_int_equal(n, BLOCKS);
    assert_int_equal(
        kvr_prefix_hashes(NULL, tok, 2 * HBS, HBS, part, 2, &m, NULL), KVR_OK);
    assert_int_equal(kvr_prefix_hashes(&part[1], tok + 2 * HBS,
                                       sizeof(tok) / 4 - 2 * HBS, HBS, part + 2,
                                       3, &m, NULL),
                     KVR_OK);
    assert_int_equal(m, 3);
    assert_memory_equal(all, part, sizeof(all));
    /* a different parent gives different hashes */
    assert_int_equal(
        kvr_prefix_hashes(&part[0], tok + 2 * HBS, HBS, HBS, part, 1, &m, NULL),
        KVR_OK);
    assert_memory_not_equal(&part[0], &all[2], sizeof(part[0]));
}

static void test_count_and_errors(void **state)
{
    (void)state;
    const uint32_t tok[10] = {0};
    size_t n = 99;
    kvr_error_t err = {0};
    assert_int_equal(kvr_prefix_hashes(NULL, tok, 10, 3, NULL, 0, &n, NULL),
                     KVR_OK);
    assert_int_equal(n, 3);
    assert_int_equal(kvr_prefix_hashes(NULL, tok, 2, 3, NULL, 0, &n, NULL),
                     KVR_OK);
    assert_int_equal(n, 0);
    assert_int_equal(kvr_prefix_hashes(NULL, NULL, 0, 3, NULL, 0, &n, NULL),
                     KVR_OK);
    assert_int_equal(n, 0);
    kvr_block_hash_t h[2];
    memset(h, 0xab, sizeof(h));
    n = 99;
    assert_int_equal(kvr_prefix_hashes(NULL, tok, 10, 3, h, 2, &n, &err),
                     KVR_ERR_BUFFER_SMALL);
    assert_non_null(strstr(err.msg, "out holds 2 hashes; 10 tokens make 3"));
    assert_int_equal(n, 99);
    for (size_t i = 0; i < sizeof(h); i++) /* untouched on error */
        assert_int_equal(((uint8_t *)h)[i], 0xab);
    assert_int_equal(kvr_prefix_hashes(NULL, tok, 10, 0, h, 2, &n, &err),
                     KVR_ERR_INVALID);
    assert_non_null(strstr(err.msg, "hash_block_size 0"));
    assert_int_equal(kvr_prefix_hashes(NULL, NULL, 10, 3, h, 2, &n, &err),
                     KVR_ERR_INVALID);
    assert_int_equal(kvr_prefix_hashes(NULL, tok, 10, 3, h, 2, NULL, &err),
                     KVR_ERR_INVALID);
}

static kvr_layout_t dcp(uint32_t bs, uint32_t W)
{
    kvr_layout_t lay = KVR_LAYOUT_INIT;
    lay.block_size = bs;
    lay.dcp_size = W;
    lay.interleave = 1;
    lay.tp = W;
    return lay;
}

static void test_hash_block_size(void **state)
{
    (void)state;
    kvr_layout_t lay = dcp(16, 4);
    uint64_t hbs = 0;
    assert_int_equal(kvr_hash_block_size(&lay, &hbs, NULL), KVR_OK);
    assert_int_equal(hbs, 64);
    lay = dcp(64, 1);
    assert_int_equal(kvr_hash_block_size(&lay, &hbs, NULL), KVR_OK);
    assert_int_equal(hbs, 64);
    kvr_error_t err = {0};
    lay = dcp(16, 4);
    lay.tp = 6;
    hbs = 5;
    assert_int_equal(kvr_hash_block_size(&lay, &hbs, &err),
                     KVR_ERR_TP_NOT_DIVISIBLE);
    assert_int_equal(hbs, 5);
    assert_int_equal(kvr_hash_block_size(NULL, &hbs, &err), KVR_ERR_INVALID);
    /* a DCP consumer hashes at bs * W: hashing a received prompt at bs
     * instead gives other hashes, which would never hit the cache */
    lay = dcp(4, 2);
    assert_int_equal(kvr_hash_block_size(&lay, &hbs, NULL), KVR_OK);
    uint32_t tok[16];
    for (uint32_t i = 0; i < 16; i++)
        tok[i] = 100 + i;
    kvr_block_hash_t good[4], bad[4];
    size_t ng = 0, nb = 0;
    assert_int_equal(kvr_prefix_hashes(NULL, tok, 16, hbs, good, 4, &ng, NULL),
                     KVR_OK);
    assert_int_equal(kvr_prefix_hashes(NULL, tok, 16, 4, bad, 4, &nb, NULL),
                     KVR_OK);
    assert_int_equal(ng, 2);
    assert_int_equal(nb, 4);
    assert_memory_not_equal(&good[0], &bad[0], sizeof(good[0]));
}

/* num_computed_blocks counts VIRTUAL blocks. The seed system divided the
 * cached tokens by bs instead of bs * W, which overstates the offset W-fold
 * and points the incremental plan past the request. */
static void test_cached_virtual_blocks(void **state)
{
    (void)state;
    kvr_layout_t lay = dcp(64, 4); /* V = 256 */
    uint64_t tokens = 0, blocks = 0;
    assert_int_equal(kvr_prefix_cached(&lay, 1000, 3, &tokens, &blocks, NULL),
                     KVR_OK);
    assert_int_equal(tokens, 768);
    assert_int_equal(blocks, 3);
    uint64_t seed_bug = tokens / lay.block_size;
    assert_int_equal(seed_bug, 12);
    assert_int_not_equal(blocks, seed_bug);
    /* §4: an incremental offset k is valid only if k * V < num_tokens */
    uint64_t V = (uint64_t)lay.block_size * lay.dcp_size;
    assert_true(blocks * V < 1000);
    assert_false(seed_bug * V < 1000);
    /* W == 1: virtual and physical blocks coincide */
    lay = dcp(16, 1);
    assert_int_equal(kvr_prefix_cached(&lay, 100, 6, &tokens, &blocks, NULL),
                     KVR_OK);
    assert_int_equal(tokens, 96);
    assert_int_equal(blocks, 6);
    /* either output may be NULL; zero hit */
    assert_int_equal(kvr_prefix_cached(&lay, 100, 0, NULL, &blocks, NULL),
                     KVR_OK);
    assert_int_equal(blocks, 0);
}

static void test_cached_errors(void **state)
{
    (void)state;
    kvr_layout_t lay = dcp(64, 4);
    kvr_error_t err = {0};
    uint64_t tokens = 7, blocks = 7;
    /* 1000 tokens hold 3 full hash blocks of 256 */
    assert_int_equal(kvr_prefix_cached(&lay, 1000, 4, &tokens, &blocks, &err),
                     KVR_ERR_INVALID);
    assert_non_null(strstr(err.msg, "hit of 4 blocks exceeds the 3 full "
                                    "blocks of 256 tokens"));
    assert_int_equal(tokens, 7);
    assert_int_equal(blocks, 7);
    assert_int_equal(
        kvr_prefix_cached(&lay, 1000, UINT64_MAX, &tokens, &blocks, &err),
        KVR_ERR_INVALID);
    lay.dcp_size = 0;
    assert_int_equal(kvr_prefix_cached(&lay, 1000, 1, &tokens, &blocks, &err),
                     KVR_ERR_DCP_LT1);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_golden),
        cmocka_unit_test(test_parent_chain),
        cmocka_unit_test(test_count_and_errors),
        cmocka_unit_test(test_hash_block_size),
        cmocka_unit_test(test_cached_virtual_blocks),
        cmocka_unit_test(test_cached_errors),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
