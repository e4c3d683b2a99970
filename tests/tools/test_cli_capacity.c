/* `kvrelay capacity` against hand-computed cases (numbers worked out in the
 * comments), text and JSON, and exit 2 with one stderr line for bad usage. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#include <cmocka.h>
#include <jansson.h>

#include "test_inspect_cli.h"

static const char *kvr_bin;
static cli_result_t res;

static json_t *capacity_json(const char *args)
{
    char full[1024];
    snprintf(full, sizeof(full), "--json %s", args);
    cli_run(kvr_bin, "capacity", full, &res);
    if (res.status != 0)
        fail_msg("capacity %s exited %d: %s", full, res.status, res.err);
    json_error_t jerr;
    json_t *root = json_loads(res.out, 0, &jerr);
    if (root == NULL)
        fail_msg("not JSON (%s): %s", jerr.text, res.out);
    return root;
}

static json_int_t get(json_t *o, const char *path)
{
    char key[64];
    const char *dot = strchr(path, '.');
    if (dot != NULL) {
        snprintf(key, sizeof(key), "%.*s", (int)(dot - path), path);
        return get(json_object_get(o, key), dot + 1);
    }
    json_t *v = json_object_get(o, path);
    if (!json_is_integer(v))
        fail_msg("no integer '%s'", path);
    return json_integer_value(v);
}

static double ratio(json_t *root)
{
    return json_real_value(
        json_object_get(json_object_get(root, "replication_cost"), "ratio"));
}

/* DeepSeek-V3.2 shapes, W = 4, 80 GiB = 85899345920 B per rank:
 * MLA 61 x 64 x 576 = 2248704; replicated index 61 x 256 x 144 = 2248704,
 * total 4497408 -> floor(85899345920 / 4497408) = 19099 blocks
 * (19099 * 4497408 = 85895995392 <= budget < 19100 * 4497408).
 * Sharded index 61 x 64 x 144 = 562176, total 2810880 -> 30559 blocks
 * (30559 * 2810880 = 85897681920). Cost 11460 blocks = 733440 tokens per
 * rank = 2933760 per group of 4; ratio 19099 / 30559 = 0.62499. */
static void test_headline_replicated(void **state)
{
    (void)state;
    json_t *r = capacity_json("--budget 80GiB --block-size 64 --dcp 4 "
                              "--replicate-index --region mla:576x61 "
                              "--region index:128x61");
    assert_int_equal(get(r, "budget"), 85899345920LL);
    assert_int_equal(get(r, "bytes_per_block"), 4497408);
    assert_int_equal(get(r, "blocks_per_rank"), 19099);
    assert_int_equal(get(r, "tokens_per_rank"), 19099 * 64);
    assert_int_equal(get(r, "tokens_per_group"), 19099 * 64 * 4);
    assert_int_equal(get(r, "replicated.index_bytes_per_block"), 2248704);
    assert_int_equal(get(r, "sharded.bytes_per_block"), 2810880);
    assert_int_equal(get(r, "sharded.blocks_per_rank"), 30559);
    assert_int_equal(get(r, "replication_cost.blocks"), 11460);
    assert_int_equal(get(r, "replication_cost.tokens_per_rank"), 733440);
    assert_int_equal(get(r, "replication_cost.tokens_per_group"), 2933760);
    assert_true(ratio(r) > 0.62498 && ratio(r) < 0.62500);
    json_t *idx = json_array_get(json_object_get(r, "regions"), 1);
    assert_int_equal(get(idx, "stride"), 144);
    assert_int_equal(get(idx, "page_tokens"), 256);
    json_decref(r);
}

/* The same shapes sharded: the chosen numbers are the sharded ones and the
 * cost of replicating is still reported. */
static void test_headline_sharded(void **state)
{
    (void)state;
    json_t *r = capacity_json(
        "--budget 85899345920 --dcp 4 --region mla:576x61 "
        "--region index:128x61");
    assert_int_equal(get(r, "block_size"), 64); /* default */
    assert_false(json_is_true(json_object_get(r, "replicate_index")));
    assert_int_equal(get(r, "blocks_per_rank"), 30559);
    assert_int_equal(get(r, "tokens_per_rank"), 30559 * 64);
    assert_int_equal(get(r, "tokens_per_group"), 30559 * 64 * 4);
    assert_int_equal(get(r, "replication_cost.blocks"), 11460);
    json_decref(r);
}

/* 1000000 B, bs 16, W 2: MLA 16 x 576 = 9216; replicated index 32 x 144 =
 * 4608 -> 13824 B, 72 blocks (72 * 13824 = 995328), 1152 tokens per rank,
 * 2304 per group. Sharded: 9216 + 2304 = 11520 -> 86 blocks (990720).
 * Cost 14 blocks, 224 tokens per rank, 448 per group, ratio 72/86. */
static void test_small_by_hand(void **state)
{
    (void)state;
    json_t *r = capacity_json("--budget 1000000 --block-size 16 --dcp 2 "
                              "--replicate-index --region mla:576 "
                              "--region index:128");
    assert_int_equal(get(r, "bytes_per_block"), 13824);
    assert_int_equal(get(r, "blocks_per_rank"), 72);
    assert_int_equal(get(r, "tokens_per_rank"), 1152);
    assert_int_equal(get(r, "tokens_per_group"), 2304);
    assert_int_equal(get(r, "sharded.blocks_per_rank"), 86);
    assert_int_equal(get(r, "replication_cost.blocks"), 14);
    assert_int_equal(get(r, "replication_cost.tokens_per_rank"), 224);
    assert_int_equal(get(r, "replication_cost.tokens_per_group"), 448);
    assert_true(ratio(r) > 72.0 / 86 - 1e-5 && ratio(r) < 72.0 / 86 + 1e-5);
    json_decref(r);
}

/* Padding: D = 64 gives C = ceil16(68) = 80. 1 MiB, bs 64, W 2,
 * MLA 3 x 64 x 656 = 125952; index 2 x 128 x 80 = 20480 replicated
 * (146432 -> 7 blocks) or 2 x 64 x 80 = 10240 sharded (136192 -> 7):
 * replication costs no whole block here. Units: 1M = 1048576. */
static void test_padding_and_units(void **state)
{
    (void)state;
    json_t *r = capacity_json("--budget 1M --dcp 2 --replicate-index "
                              "--region mla:656x3 --region index:64x2");
    assert_int_equal(get(r, "budget"), 1048576);
    assert_int_equal(get(r, "replicated.index_bytes_per_block"), 20480);
    assert_int_equal(get(r, "bytes_per_block"), 146432);
    assert_int_equal(get(r, "blocks_per_rank"), 7);
    assert_int_equal(get(r, "sharded.bytes_per_block"), 136192);
    assert_int_equal(get(r, "replication_cost.blocks"), 0);
    json_decref(r);
    r = capacity_json("--budget 2GB --region mla:576");
    assert_int_equal(get(r, "budget"), 2000000000LL);
    /* W = 1: replication changes nothing; 2e9 / 36864 = 54253 */
    assert_int_equal(get(r, "blocks_per_rank"), 54253);
    assert_int_equal(get(r, "replication_cost.blocks"), 0);
    assert_true(ratio(r) == 1.0);
    json_decref(r);
}

/* A budget below one block is refused (a bare number is bytes: "80" is not
 * 80 GiB), naming the budget and the block size; one block is enough. */
static void test_budget_below_one_block(void **state)
{
    (void)state;
    cli_expect_usage(kvr_bin, "capacity", "--budget 80 --region mla:576x61",
                     "--budget 80 bytes holds no block (one block takes "
                     "2248704 bytes)",
                     &res);
    assert_non_null(strstr(res.err, "80G"));
    /* W = 4: sharded 36864 B per block, replicated 64 x 4 x 144 + 36864 */
    cli_expect_usage(kvr_bin, "capacity",
                     "--budget 40000 --dcp 4 --replicate-index "
                     "--region mla:576 --region index:128",
                     "holds no block", &res);
    json_t *r = capacity_json("--budget 36864 --region mla:576");
    assert_int_equal(get(r, "blocks_per_rank"), 1);
    assert_true(ratio(r) == 1.0);
    json_decref(r);
    r = capacity_json("--budget 512M --region mla:576");
    assert_int_equal(get(r, "budget"), 536870912);
    assert_int_equal(get(r, "blocks_per_rank"), 536870912 / 36864);
    json_decref(r);
}

static void test_text(void **state)
{
    (void)state;
    cli_run(kvr_bin, "capacity",
            "--budget 80GiB --dcp 4 --replicate-index "
            "--region mla:576x61 --region index:128x61",
            &res);
    assert_int_equal(res.status, 0);
    assert_non_null(strstr(res.out, "index replicated"));
    assert_non_null(strstr(res.out, "blocks per rank:      19099\n"));
    assert_non_null(strstr(res.out, "tokens per rank:      1222336"));
    assert_non_null(strstr(res.out, "tokens per DCP group: 4889344"));
    assert_non_null(strstr(res.out, "-11460 blocks, -733440 tokens per rank, "
                                    "-2933760 tokens per group (ratio 0.6250"));
    cli_run(kvr_bin, "capacity", "--help", &res);
    assert_int_equal(res.status, 0);
    assert_non_null(strstr(res.out, "usage: kvrelay capacity"));
}

static void expect_usage(const char *args, const char *needle)
{
    cli_expect_usage(kvr_bin, "capacity", args, needle, &res);
}

static void test_errors(void **state)
{
    (void)state;
    expect_usage("--region mla:576", "--budget is required");
    expect_usage("--budget 1G", "at least one --region");
    expect_usage("--budget 12XB --region mla:576", "--budget: '12XB'");
    expect_usage("--budget -5 --region mla:576", "--budget: '-5'");
    expect_usage("--budget 1G --region state:4096", "--region 'state:4096'");
    expect_usage("--budget 1G --region index:128:64", "D/Q must be 1");
    expect_usage("--budget 1G --dcp 0 --region mla:576", "--dcp: '0'");
    expect_usage("--budget 1G --block-size x --region mla:576",
                 "--block-size: 'x'");
    expect_usage("--budget 1G --wat --region mla:576", "'--wat'");
    expect_usage("--budget 1G --region mla:576 extra", "unexpected argument");
    expect_usage("--budget 1G --block-size 1048576 --dcp 65536 "
                 "--region mla:4294967296x1048576",
                 "overflow");
}

int main(int argc, char **argv)
{
    kvr_bin = argc > 1 ? argv[1] : "kvrelay";
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_headline_replicated),
        cmocka_unit_test(test_headline_sharded),
        cmocka_unit_test(test_small_by_hand),
        cmocka_unit_test(test_padding_and_units),
        cmocka_unit_test(test_budget_below_one_block),
        cmocka_unit_test(test_text),
        cmocka_unit_test(test_errors),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
