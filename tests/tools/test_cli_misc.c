/* The CLI's checks that need no peer: `kvrelay --version`, and every layout
 * or workload mistake demo, serve, push and bench refuse with exit 2 and one
 * stderr line before they start anything (before, demo --sharded-index
 * waited out --timeout and bench --out to a missing directory ran the whole
 * benchmark first). */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#include <cmocka.h>

#include "test_inspect_cli.h"

static const char *kvr_bin;
static cli_result_t res;

static void test_version(void **state)
{
    (void)state;
    const char *forms[] = {"--version", "version"};
    for (int i = 0; i < 2; i++) {
        cli_run(kvr_bin, forms[i], "", &res);
        assert_int_equal(res.status, 0);
        if (strncmp(res.out, "kvrelay ", 8) != 0 ||
            strstr(res.out, "wire protocol") == NULL)
            fail_msg("%s printed \"%s\"", forms[i], res.out);
    }
    cli_run(kvr_bin, "--help", "", &res);
    assert_non_null(strstr(res.out, "version"));
}

/* The same refusal, in plan's words, from every command that takes a
 * layout; --timeout 600 would make a late failure obvious (ctest's limit). */
static void test_layout_refused_at_once(void **state)
{
    (void)state;
    const char *needle =
        "sharded index layer 0 under W=4 needs I == bs (I=1, "
        "bs=64); replicate it instead (ERR_SHARDED_INDEX_INTERLEAVE)";
    cli_expect_usage(kvr_bin, "demo", "--sharded-index --timeout 600", needle,
                     &res);
    cli_expect_usage(kvr_bin, "serve", "--rank 0 --sharded-index --timeout 600",
                     needle, &res);
    cli_expect_usage(kvr_bin, "push",
                     "--stage 0 --sharded-index --timeout 600 "
                     "--routers 127.0.0.1:1",
                     needle, &res);
    cli_expect_usage(kvr_bin, "bench", "--sharded-index", needle, &res);
    cli_expect_usage(kvr_bin, "plan",
                     "--block-size 64 --dcp 4 --rank 0 --tokens 3000 "
                     "--region index:128",
                     "needs I == bs", &res);
}

static void test_options_refused(void **state)
{
    (void)state;
    cli_expect_usage(kvr_bin, "demo", "--staging-slots 0",
                     "--staging-slots: '0' is not a number in [1, 1024]", &res);
    cli_expect_usage(kvr_bin, "serve", "--rank 0 --staging-slots 0",
                     "--staging-slots", &res);
    cli_expect_usage(kvr_bin, "demo", "--pp 9 --layers 8",
                     "--pp 9 exceeds --layers 8", &res);
    /* checked before any process starts, GPU or not */
    cli_expect_usage(kvr_bin, "serve", "--rank 0 --executor gpu-direct",
                     "--executor gpu-direct needs KV in CUDA memory", &res);
    /* bench opens its output before the first run */
    cli_expect_usage(kvr_bin, "bench", "--out /nonexistent/dir/x.json",
                     "--out /nonexistent/dir/x.json: No such file or directory",
                     &res);
}

int main(int argc, char **argv)
{
    kvr_bin = argc > 1 ? argv[1] : "kvrelay";
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_version),
        cmocka_unit_test(test_layout_refused_at_once),
        cmocka_unit_test(test_options_refused),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
