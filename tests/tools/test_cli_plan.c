/* `kvrelay plan` end to end: JSON fields and values, text output, and
 * exit status 2 with one stderr line naming the bad value. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>

#include <cmocka.h>
#include <jansson.h>

#include "kvrelay/layout.h"

static const char *kvr_bin;

typedef struct {
    int status;
    char out[65536];
    char err[4096];
} result_t;

static void slurp(const char *path, char *buf, size_t cap)
{
    FILE *f = fopen(path, "r");
    size_t n = f ? fread(buf, 1, cap - 1, f) : 0;
    buf[n] = '\0';
    if (f)
        fclose(f);
}

static void run(const char *args, result_t *r)
{
    char cmd[2048];
    snprintf(cmd, sizeof(cmd), "%s plan %s >cli_out.txt 2>cli_err.txt", kvr_bin,
             args);
    int st = system(cmd);
    r->status = WIFEXITED(st) ? WEXITSTATUS(st) : -1;
    slurp("cli_out.txt", r->out, sizeof(r->out));
    slurp("cli_err.txt", r->err, sizeof(r->err));
}

static json_int_t get_int(json_t *o, const char *key)
{
    json_t *v = json_object_get(o, key);
    assert_non_null(v);
    return json_integer_value(v);
}

static void test_json_headline(void **state)
{
    (void)state;
    kvr_layout_t lay = KVR_LAYOUT_INIT;
    lay.dcp_size = 4;
    lay.tp = 4;
    char digest0[17] = "";
    for (uint32_t rank = 0; rank < 4; rank++) {
        char args[512];
        snprintf(args, sizeof(args),
                 "--json --block-size 64 --dcp 4 --rank %u "
                 "--tokens 3001 --replicate-index --region mla:576x78 "
                 "--region index:128x26",
                 rank);
        result_t r;
        run(args, &r);
        assert_int_equal(r.status, 0);
        json_error_t jerr;
        json_t *root = json_loads(r.out, 0, &jerr);
        assert_non_null(root);
        assert_int_equal(get_int(root, "rank"), rank);
        assert_int_equal(get_int(root, "dcp"), 4);
        assert_int_equal(get_int(root, "interleave"), 1);
        assert_int_equal(get_int(root, "tokens"), 3001);
        json_t *regs = json_object_get(root, "regions");
        assert_int_equal(json_array_size(regs), 2);
        json_t *mla = json_array_get(regs, 0), *idx = json_array_get(regs, 1);
        assert_string_equal(json_string_value(json_object_get(mla, "role")),
                            "mla");
        assert_int_equal(get_int(mla, "count"), 78);
        uint64_t owned = kvr_local_len(&lay, 3001, rank);
        assert_int_equal(get_int(mla, "bytes"), (json_int_t)(owned * 576 * 78));
        assert_int_equal(get_int(mla, "runs"), (json_int_t)(owned * 78));
        /* 47 source pages, two planes each, whole planes of 64 * (128 + 4) */
        assert_int_equal(get_int(idx, "runs_uncoalesced"), 47 * 2 * 26);
        assert_int_equal(get_int(idx, "bytes"), 47 * 64 * 132 * 26);
        assert_int_equal(get_int(root, "total_bytes"),
                         get_int(mla, "bytes") + get_int(idx, "bytes"));
        assert_int_equal(get_int(root, "total_runs"),
                         get_int(mla, "runs") + get_int(idx, "runs"));
        const char *digest = json_string_value(json_object_get(root, "digest"));
        assert_int_equal(strlen(digest), 16);
        if (rank == 0)
            snprintf(digest0, sizeof(digest0), "%s", digest);
        assert_string_equal(digest, digest0); /* ranks excluded */
        json_decref(root);
    }
}

/* The headline stage: 20 MLA regions, 7 index regions, bs 16,
 * W 4, I 1, 48 tokens, replicated index. */
static void test_headline_stage(void **state)
{
    (void)state;
    json_int_t mla_sum = 0;
    for (int rank = 0; rank < 4; rank++) {
        char args[512];
        snprintf(args, sizeof(args),
                 "--json --block-size 16 --dcp 4 --rank %d "
                 "--tokens 48 --replicate-index --region mla:576x20 "
                 "--region index:128x7",
                 rank);
        result_t r;
        run(args, &r);
        assert_int_equal(r.status, 0);
        json_t *root = json_loads(r.out, 0, NULL);
        assert_non_null(root);
        assert_int_equal(get_int(root, "total_bytes"),
                         20 * 576 * 12 + 7 * (128 + 4) * 48);
        mla_sum += get_int(json_array_get(json_object_get(root, "regions"), 0),
                           "bytes");
        json_decref(root);
    }
    assert_int_equal(mla_sum, 20 * 576 * 48);
}

static void test_text_output(void **state)
{
    (void)state;
    result_t r;
    run("--block-size 16 --dcp 2 --rank 0 --tokens 40 --interleave 16 "
        "--region mla:576 --src-blocks random:5 --dst-blocks 4,1",
        &r);
    assert_int_equal(r.status, 0);
    assert_non_null(strstr(r.out, "layout digest"));
    assert_non_null(strstr(r.out, "block tables: given"));
    run("--help", &r);
    assert_int_equal(r.status, 0);
    assert_non_null(strstr(r.out, "usage: kvrelay plan"));
}

static void expect_usage(const char *args, const char *needle)
{
    result_t r;
    run(args, &r);
    if (r.status != 2)
        fail_msg("'%s' exited %d: %s", args, r.status, r.err);
    if (strstr(r.err, needle) == NULL)
        fail_msg("stderr \"%s\" lacks \"%s\"", r.err, needle);
    char *nl = strchr(r.err, '\n');
    assert_non_null(nl);
    assert_string_equal(nl + 1, ""); /* exactly one line */
}

static void test_errors(void **state)
{
    (void)state;
    const char *base = "--block-size 64 --dcp 4 --tokens 100 --region mla:576";
    char args[512];
    snprintf(args, sizeof(args), "%s --rank 4", base);
    expect_usage(args, "DCP rank 4 out of range");
    snprintf(args, sizeof(args), "%s --rank 0 --interleave 3", base);
    expect_usage(args, "interleave 3");
    snprintf(args, sizeof(args), "%s --rank 0 --region index:128", base);
    expect_usage(args, "needs I == bs");
    snprintf(args, sizeof(args), "%s --rank 0 --region bogus:1", base);
    expect_usage(args, "--region 'bogus:1'");
    snprintf(args, sizeof(args), "%s --rank 0 --dst-blocks 0,x", base);
    expect_usage(args, "block id 'x'");
    snprintf(args, sizeof(args), "%s --rank 0 --computed-blocks 9", base);
    expect_usage(args, "num_computed_blocks 9");
    snprintf(args, sizeof(args),
             "%s --rank 0 --dst-num-blocks 3 --dst-blocks 5", base);
    expect_usage(args, "destination block id 5");
    expect_usage("--dcp 4 --rank 0 --tokens 5 --region mla:576",
                 "--block-size is required");
    expect_usage("--block-size 64 --dcp 1 --rank 0 --tokens 5 --wat",
                 "'--wat'");
    snprintf(args, sizeof(args), "%s --rank 0 --region state:4096", base);
    expect_usage(args, "no relayout");
}

/* random:SEED draws from --dst-num-blocks / --src-num-blocks when given
 * (before, it drew from [0, 2n + 1) and ran past a smaller pool), refuses a
 * pool smaller than the table, and needs memory for the table only. */
static void test_random_tables_honour_pools(void **state)
{
    (void)state;
    const char *base =
        "--block-size 64 --dcp 4 --rank 1 --tokens 4096 --region mla:576";
    char args[512];
    result_t r;
    for (int seed = 1; seed <= 5; seed++) { /* 16 of 17 ids: nothing to spare */
        snprintf(args, sizeof(args),
                 "%s --dst-blocks random:%d --dst-num-blocks 17 "
                 "--src-blocks random:%d --src-num-blocks 65",
                 base, seed, seed);
        run(args, &r);
        if (r.status != 0)
            fail_msg("'%s' exited %d: %s", args, r.status, r.err);
    }
    snprintf(args, sizeof(args),
             "%s --dst-blocks random:3 --dst-num-blocks 4000000000", base);
    run(args, &r);
    assert_int_equal(r.status, 0);
    snprintf(args, sizeof(args), "%s --dst-blocks random:3 --dst-num-blocks 10",
             base);
    expect_usage(args,
                 "--dst-blocks: a pool of 10 blocks is smaller than the 16 "
                 "blocks the tokens need");
    expect_usage("--block-size 1 --dcp 1 --rank 0 --tokens 1099511627776 "
                 "--region mla:576",
                 "is beyond u32 block ids");
}

#if defined(__SANITIZE_ADDRESS__)
#define UNDER_ASAN 1
#elif defined(__has_feature)
#if __has_feature(address_sanitizer)
#define UNDER_ASAN 1
#endif
#endif

/* A table that does not fit in memory is named, never an uninitialised
 * message: 2^36 tokens need 2^30 source ids (4 GiB) under a 1 GiB limit
 * (ASan reserves far more address space than that, so there its allocator
 * refuses large allocations instead). */
static void test_table_beyond_memory(void **state)
{
    (void)state;
    char cmd[1024];
#ifdef UNDER_ASAN
    const char *limit = "ASAN_OPTIONS=allocator_may_return_null=1:"
                        "max_allocation_size_mb=1024";
#else
    const char *limit = "ulimit -v 1048576;";
#endif
    snprintf(cmd, sizeof(cmd),
             "%s %s plan --block-size 64 --dcp 1 --rank 0 "
             "--tokens 68719476736 --region mla:576 >cli_out.txt 2>cli_err.txt",
             limit, kvr_bin);
    int st = system(cmd);
    char err[4096];
    slurp("cli_err.txt", err, sizeof(err));
    if (!WIFEXITED(st) || WEXITSTATUS(st) != 2)
        fail_msg("exit %d: %s", WIFEXITED(st) ? WEXITSTATUS(st) : -1, err);
    if (strstr(
            err,
            "--src-blocks: no memory for a table of 1073741824 block ids\n") ==
        NULL)
        fail_msg("stderr \"%s\"", err);
}

/* JSON of one consumer rank with several producer ranks: its sources in
 * ascending order, their sums the totals. Returns the root (caller frees). */
static json_t *pairs_json(const char *args, json_int_t *src_ranks, size_t cap,
                          size_t *n, const char *axis)
{
    result_t r;
    run(args, &r);
    if (r.status != 0)
        fail_msg("'%s' exited %d: %s", args, r.status, r.err);
    json_t *root = json_loads(r.out, 0, NULL);
    assert_non_null(root);
    json_t *src = json_object_get(root, "sources");
    assert_non_null(src);
    json_int_t runs = 0, bytes = 0;
    *n = json_array_size(src);
    assert_true(*n <= cap);
    for (size_t i = 0; i < *n; i++) {
        json_t *s = json_array_get(src, i);
        src_ranks[i] = get_int(s, "producer_rank");
        assert_string_equal(json_string_value(json_object_get(s, "axis")),
                            axis);
        assert_true(i == 0 || src_ranks[i] > src_ranks[i - 1]);
        assert_true(get_int(s, "bytes") > 0);
        runs += get_int(s, "runs");
        bytes += get_int(s, "bytes");
    }
    assert_int_equal(runs, get_int(root, "total_runs"));
    assert_int_equal(bytes, get_int(root, "total_bytes"));
    return root;
}

/* W_p 2 -> W 4 and 4 -> 2 at I 1 and 16: every consumer rank's sources sum
 * to its totals, the ranks' latent bytes to every token once. At I 1,
 * W_p 4 -> W 2, consumer 0 (even tokens) pulls from producers 0 and 2. */
static void test_sharded_producer(void **state)
{
    (void)state;
    static const unsigned w[][2] = {{2, 4}, {4, 2}}, I[] = {1, 16};
    for (int a = 0; a < 2; a++)
        for (int b = 0; b < 2; b++) {
            json_int_t mla = 0;
            for (unsigned c = 0; c < w[a][1]; c++) {
                char args[512];
                json_int_t ranks[8];
                size_t n;
                snprintf(args, sizeof(args),
                         "--json --block-size 16 --dcp %u --interleave %u "
                         "--rank %u --producer-dcp %u --producer-interleave %u "
                         "--tokens 1001 --replicate-index "
                         "--producer-replicate-index "
                         "--region mla:576x3 "
                         "--region index:128",
                         w[a][1], I[b], c, w[a][0], I[b]);
                json_t *root = pairs_json(args, ranks, 8, &n, "dcp");
                json_t *regs = json_object_get(root, "regions");
                mla += get_int(json_array_get(regs, 0), "bytes");
                assert_int_equal(get_int(root, "producer_dcp"), w[a][0]);
                if (a == 1 && b == 0 && c == 0) {
                    assert_int_equal(n, 2);
                    assert_int_equal(ranks[0], 0);
                    assert_int_equal(ranks[1], 2);
                }
                json_decref(root);
            }
            assert_int_equal(mla, 1001 * 576 * 3);
        }
}

/* TP 4 -> 2 with 8 kv heads: tp rank 1 takes heads 4-7, two from each of
 * producers 2 and 3; TP 2 -> 8 with 2 heads (replicated on the consumer):
 * each rank takes its one head from one producer. K and V planes. */
static void test_tp_reshard(void **state)
{
    (void)state;
    json_int_t ranks[8];
    size_t n;
    json_t *root = pairs_json("--json --block-size 16 --dcp 1 --rank 0 "
                              "--tokens 100 --producer-tp 4 --tp 2 --tp-rank 1 "
                              "--region dense:8:128:2x4",
                              ranks, 8, &n, "tp");
    assert_int_equal(n, 2);
    assert_int_equal(ranks[0], 2);
    assert_int_equal(ranks[1], 3);
    assert_int_equal(get_int(root, "total_bytes"), 100 * 4 * 128 * 2 * 2 * 4);
    json_t *reg = json_array_get(json_object_get(root, "regions"), 0);
    assert_int_equal(get_int(reg, "heads"), 8);
    assert_string_equal(json_string_value(json_object_get(reg, "order")),
                        "nhd");
    /* NHD: one run per token per plane per source */
    assert_int_equal(get_int(reg, "runs_uncoalesced"), 100 * 2 * 2 * 4);
    json_decref(root);
    for (unsigned t = 0; t < 8; t++) {
        char args[512];
        snprintf(args, sizeof(args),
                 "--json --block-size 16 --dcp 1 --rank 0 "
                 "--tokens 100 --producer-tp 2 --tp 8 --tp-rank %u "
                 "--region dense:2:64:2:hnd",
                 t);
        root = pairs_json(args, ranks, 8, &n, "tp");
        assert_int_equal(n, 1);
        assert_int_equal(ranks[0], t / 4); /* head t / 4 lives on rank t / 4 */
        assert_int_equal(get_int(root, "total_bytes"), 100 * 64 * 2 * 2);
        json_decref(root);
    }
}

/* Today's layouts print no sources; a bad dense spec or refused
 * combination exits 2 naming it. */
static void test_pairs_text_and_errors(void **state)
{
    (void)state;
    result_t r;
    run("--json --block-size 16 --dcp 4 --rank 0 --tokens 40 --region mla:576",
        &r);
    assert_int_equal(r.status, 0);
    assert_null(strstr(r.out, "sources"));
    run("--block-size 16 --dcp 4 --rank 1 --tokens 400 --producer-dcp 2 "
        "--region mla:576",
        &r);
    assert_int_equal(r.status, 0);
    assert_non_null(strstr(r.out, "source: producer dcp rank 1:"));
    assert_null(strstr(r.out, "source: producer dcp rank 0:"));
    const char *base = "--block-size 16 --dcp 1 --rank 0 --tokens 100";
    char args[512];
    snprintf(args, sizeof(args), "%s --region dense:8:128", base);
    expect_usage(args, "--region 'dense:8:128'");
    snprintf(args, sizeof(args), "%s --region dense:8:128:2:xyz", base);
    expect_usage(args, "dense:8:128:2:xyz");
    snprintf(args, sizeof(args), "%s --producer-tp 4 --region dense:6:128:2",
             base);
    expect_usage(args, "ERR_DENSE_HEADS");
    snprintf(args, sizeof(args),
             "%s --producer-tp 4 --tp-rank 1 "
             "--region dense:8:128:2",
             base);
    expect_usage(args, "consumer TP rank 1 out of range");
    expect_usage(
        "--block-size 16 --dcp 4 --rank 0 --tokens 100 --interleave 16 "
        "--producer-dcp 2 --producer-interleave 16 --region index:128",
        "ERR_INDEX_NEEDS_REPLICATED");
    expect_usage("--block-size 16 --dcp 4 --rank 0 --tokens 100 "
                 "--replicate-index --producer-dcp 2 --region index:128",
                 "ERR_PRODUCER_INDEX_INTERLEAVE");
    expect_usage("--block-size 16 --dcp 2 --rank 0 --tokens 100 "
                 "--producer-tp 2 --region dense:8:128:2",
                 "ERR_NOT_IMPLEMENTED");
}

int main(int argc, char **argv)
{
    kvr_bin = argc > 1 ? argv[1] : "kvrelay";
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_json_headline),
        cmocka_unit_test(test_headline_stage),
        cmocka_unit_test(test_text_output),
        cmocka_unit_test(test_errors),
        cmocka_unit_test(test_random_tables_honour_pools),
        cmocka_unit_test(test_table_beyond_memory),
        cmocka_unit_test(test_sharded_producer),
        cmocka_unit_test(test_tp_reshard),
        cmocka_unit_test(test_pairs_text_and_errors),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
