/* The region class rule and block-table ordering (layout_internal.h). */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "layout_internal.h"

static void test_class_round_trip(void **state)
{
    (void)state;
    kvr_layout_t lay = KVR_LAYOUT_INIT;
    lay.block_size = 16;
    const kvr_region_desc_t regions[] = {
        {.role = KVR_ROLE_MLA, .num_blocks = 9, .page_bytes = 16 * 576},
        {.role = KVR_ROLE_INDEX,
         .num_blocks = 9,
         .page_bytes = 4096,
         .index_dim = 128,
         .quant_block = 0},
        {.role = KVR_ROLE_STATE, .num_blocks = 2, .page_bytes = 100},
        {.role = KVR_ROLE_DENSE,
         .num_blocks = 2,
         .page_bytes = 16 * 8 * 64 * 2 * 2,
         .heads = 8,
         .head_dim = 64,
         .elem_bytes = 2,
         .hnd = true},
    };
    const kvr_region_class_t want[] = {
        {KVR_ROLE_MLA, 576, 0},
        {KVR_ROLE_INDEX, 128, 128},
        {KVR_ROLE_STATE, 100, 0},
        {KVR_ROLE_DENSE, 64 | 8ull << 32,
         2 | 2ull << 32 | 1ull << 40 | KVR__CLASS_HEADS_BIT}};
    for (size_t i = 0; i < 4; i++) {
        kvr_region_class_t k = kvr__class_of(&lay, &regions[i], true);
        assert_int_equal(kvr__class_cmp(&k, &want[i]), 0);
        kvr_region_desc_t r = kvr__class_region(&lay, &k);
        kvr_region_class_t back = kvr__class_of(&lay, &r, true);
        assert_int_equal(kvr__class_cmp(&back, &k), 0);
    }
    assert_int_equal(kvr__class_region(&lay, &want[3]).page_bytes,
                     regions[3].page_bytes);
    /* a producer with a block size of its own: its token width is the same */
    lay.producer_block_size = 32;
    kvr_region_desc_t p = regions[0];
    p.page_bytes = 32 * 576;
    kvr_region_class_t k = kvr__class_of(&lay, &p, false);
    assert_int_equal(kvr__class_cmp(&k, &want[0]), 0);
}

static void test_distinct_classes(void **state)
{
    (void)state;
    kvr_layout_t lay = KVR_LAYOUT_INIT;
    lay.block_size = 16;
    kvr_region_desc_t r[5] = {
        {.role = KVR_ROLE_STATE, .page_bytes = 64},
        {.role = KVR_ROLE_MLA, .page_bytes = 16 * 576},
        {.role = KVR_ROLE_STAGING, .page_bytes = 1 << 20},
        {.role = KVR_ROLE_MLA, .page_bytes = 16 * 576},
        {.role = KVR_ROLE_MLA, .page_bytes = 16 * 64},
    };
    kvr_region_class_t out[5];
    assert_int_equal(kvr__distinct_classes(&lay, r, 5, true, out), 3);
    assert_int_equal(out[0].role, KVR_ROLE_MLA);
    assert_int_equal(out[0].width, 64);
    assert_int_equal(out[1].width, 576);
    assert_int_equal(out[2].role, KVR_ROLE_STATE);
    assert_int_equal(kvr__distinct_classes(&lay, r, 0, true, out), 0);
}

static void test_sort_ids(void **state)
{
    (void)state;
    const uint32_t table[] = {99, 7, 3, 7, 1, 5};
    kvr__id_index_t v[4];
    kvr__sort_ids(table, 1, 4, v); /* 7 3 7 1 at indices 1..4 */
    assert_int_equal(v[0].id, 1);
    assert_int_equal(v[0].index, 4);
    assert_int_equal(v[1].id, 3);
    assert_int_equal(v[1].index, 2);
    assert_int_equal(v[2].id, 7);
    assert_int_equal(v[3].id, 7);
    assert_int_equal(v[2].index + v[3].index, 1 + 3);
    const uint32_t sorted[] = {2, 4, 8};
    kvr__sort_ids(sorted, 0, 3, v);
    for (uint32_t i = 0; i < 3; i++) {
        assert_int_equal(v[i].id, sorted[i]);
        assert_int_equal(v[i].index, i);
    }
}

static int cmp_pair(const void *a, const void *b)
{
    const kvr__id_index_t *x = a, *y = b;
    if (x->id != y->id)
        return (x->id > y->id) - (x->id < y->id);
    return (x->index > y->index) - (x->index < y->index);
}

/* Random tables whose ids differ in every byte (the radix sort's four
 * passes), in a narrow range (passes skipped) and with repeats: the same
 * (id, index) pairs as a plain sort, in ascending id order. */
static void test_sort_ids_random(void **state)
{
    (void)state;
    uint64_t x = 0x736f7274ull;
    enum { N = 5000 };
    static uint32_t table[N + 3];
    static kvr__id_index_t got[N], want[N];
    for (int round = 0; round < 12; round++) {
        uint32_t mask = round % 3 == 0 ? 0xffffffffu
                        : round % 3 == 1 ? 0xff00u
                                         : 0x3fu; /* repeats */
        size_t n = 1 + (size_t)(round * 417) % N;
        for (size_t i = 0; i < n + 3; i++) {
            x = x * 6364136223846793005ull + 1442695040888963407ull;
            table[i] = (uint32_t)(x >> 32) & mask;
        }
        kvr__sort_ids(table, 3, n, got);
        for (size_t i = 0; i < n; i++)
            want[i] = (kvr__id_index_t){table[3 + i], 3 + (uint32_t)i};
        qsort(want, n, sizeof(*want), cmp_pair);
        for (size_t i = 1; i < n; i++)
            assert_true(got[i - 1].id <= got[i].id);
        qsort(got, n, sizeof(*got), cmp_pair); /* equal ids: any order */
        assert_memory_equal(got, want, n * sizeof(*got));
    }
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_class_round_trip),
        cmocka_unit_test(test_distinct_classes),
        cmocka_unit_test(test_sort_ids),
        cmocka_unit_test(test_sort_ids_random),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
