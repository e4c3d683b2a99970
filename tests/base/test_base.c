/* The base layer: status text, error detail, byte order, init, clock. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include <cmocka.h>

#include "base_internal.h"

static void test_status_names(void **state)
{
    (void)state;
    assert_string_equal(kvr_status_name(KVR_OK), "OK");
    assert_string_equal(kvr_status_name(KVR_ERR_INIT), "ERR_INIT");
    assert_string_equal(kvr_status_str(KVR_ERR_BLOCK_RANGE),
                        "block id outside the region");
    assert_null(kvr_status_name((kvr_status_t)9999));
    assert_string_equal(kvr_status_str((kvr_status_t)9999), "unknown status");
    /* every listed code has a name and a text of its own */
#define CHECK(name, value, text)                                               \
    assert_string_equal(kvr_status_name(KVR_##name), #name);                   \
    assert_string_equal(kvr_status_str(KVR_##name), text);
    KVR_STATUS_MAP(CHECK)
#undef CHECK
}

static void test_error_set(void **state)
{
    (void)state;
    kvr_error_t err = {0};
    assert_int_equal(kvr_error_set(&err, KVR_ERR_RANK_RANGE, "rank %u", 7u),
                     KVR_ERR_RANK_RANGE);
    assert_int_equal(err.code, KVR_ERR_RANK_RANGE);
    assert_string_equal(err.msg, "rank 7");
    assert_int_equal(kvr_error_set(NULL, KVR_ERR_IO, "x"), KVR_ERR_IO);
    char big[2 * KVR_ERROR_MSG_MAX];
    memset(big, 'a', sizeof(big) - 1);
    big[sizeof(big) - 1] = '\0';
    kvr_error_set(&err, KVR_ERR_INVALID, "%s", big);
    assert_int_equal(strlen(err.msg), KVR_ERROR_MSG_MAX - 1);
}

static void test_byte_order(void **state)
{
    (void)state;
    unsigned char b[8];
    kvr__put_le(b, 0x0807060504030201ull, 8);
    for (int i = 0; i < 8; i++)
        assert_int_equal(b[i], i + 1);
    assert_int_equal(kvr__get_le(b, 8), 0x0807060504030201ull);
    assert_int_equal(kvr__get_le(b, 3), 0x030201u);
    memset(b, 0xee, sizeof(b));
    kvr__put_le(b, 0xa1b2c3d4u, 2); /* only n bytes are written */
    assert_int_equal(b[0], 0xd4);
    assert_int_equal(b[1], 0xc3);
    assert_int_equal(b[2], 0xee);
}

static void test_init_clock_version(void **state)
{
    (void)state;
    kvr_error_t err = {0};
    assert_int_equal(kvr_init(&err), KVR_OK);
    assert_int_equal(kvr_init(NULL), KVR_OK); /* once, then cheap */
    uint64_t a = kvr_now_ns(), d = kvr_deadline_ns(1000), b = kvr_now_ns();
    assert_true(a > 0 && b >= a);
    assert_true(d >= a + 1000000000ull && d <= b + 1000000000ull);
    assert_string_equal(kvr_version(), KVR_TEST_VERSION);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_status_names),
        cmocka_unit_test(test_error_set),
        cmocka_unit_test(test_byte_order),
        cmocka_unit_test(test_init_clock_version),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
