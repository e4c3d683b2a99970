/* Synthetic KV: pure, distinct per input, key/scale consistent, and
 * verifiable after a planned transfer. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include <cmocka.h>

#include "kvrelay/synth.h"
#include "plan_fixture.h"

static void test_pure_and_distinct(void **state)
{
    (void)state;
    uint8_t a[576], b[576];
    kvr_synth_latent(1, 2, 3, 4, a, sizeof(a));
    kvr_synth_latent(1, 2, 3, 4, b, sizeof(b));
    assert_memory_equal(a, b, sizeof(a));
    kvr_synth_latent(1, 2, 3, 5, b, sizeof(b)); /* token id */
    assert_memory_not_equal(a, b, sizeof(a));
    kvr_synth_latent(1, 2, 4, 4, b, sizeof(b)); /* position */
    assert_memory_not_equal(a, b, sizeof(a));
    kvr_synth_latent(1, 3, 3, 4, b, sizeof(b)); /* layer */
    assert_memory_not_equal(a, b, sizeof(a));
    kvr_synth_index_key(1, 2, 3, 4, b, 128); /* role */
    assert_memory_not_equal(a, b, 128);
}

static void test_fill_transfer_verify(void **state)
{
    (void)state;
    kvr_layout_t lay = fx_layout(16, 4, 1, 1, 1);
    uint32_t src[8] = {7, 6, 5, 4, 3, 2, 1, 0}, dst[2] = {1, 0}, ids[120];
    for (int i = 0; i < 120; i++)
        ids[i] = (uint32_t)(1000 + i * 3);
    kvr_request_t req = {src, 8, dst, 2, 120, 0};
    kvr_region_pair_t pair = fx_index(&lay, 128, 8, 2);
    size_t sb = kvr_region_bytes(&pair.src), db = kvr_region_bytes(&pair.dst);
    uint8_t *s = calloc(sb, 1), *d = calloc(db, 1);
    kvr_error_t err = {0};
    assert_int_equal(
        kvr_synth_fill_source(&lay, &pair.src, 9, src, 8, ids, 120, s, &err),
        KVR_OK);
    kvr_plan_t *p = NULL;
    assert_int_equal(kvr_plan_create(&lay, 3, &pair, &req, &p, &err), KVR_OK);
    kvr_plan_apply_host(p, s, d);
    assert_int_equal(kvr_verify_region(&lay, 3, &pair, &req, s, d, &err),
                     KVR_OK);
    /* token 70 lives in dst block dst[1] = 0, slot 70 % 64 = 6, page of 64 */
    const uint8_t *page = d + 0 * pair.dst.page_bytes;
    assert_int_equal(
        kvr_synth_check_index_token(&lay, page, 64, 6, 128, 70, &err), KVR_OK);
    ((uint8_t *)page)[64 * 128 + 6 * 4 + 3] ^= 0x40;
    assert_int_equal(
        kvr_synth_check_index_token(&lay, page, 64, 6, 128, 70, &err),
        KVR_ERR_VERIFY);
    assert_non_null(strstr(err.msg, "token 70"));
    kvr_plan_destroy(p);
    free(s);
    free(d);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_pure_and_distinct),
        cmocka_unit_test(test_fill_transfer_verify),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
