/* `kvrelay demo` over any-to-any layouts (docs/design.md §18): a sharded
 * producer into another DCP size (MLA, I = 1 and I = bs), TP reshards of
 * head-sharded dense K/V (8 KV heads, and 2 replicated over more TP ranks),
 * NHD and HND, each verified byte-exact on every decode rank (the demo
 * exits 0 only then); combinations the planner refuses stop the demo at
 * once with the planner's status, before any process starts. Tiny sizes:
 * seconds each under ASan. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>

#include <cmocka.h>

static const char *kvr_bin;

#define MLA                                                                    \
    "--pp 2 --layers 3 --index-every 2 --tokens 200 --requests 2 "             \
    "--block-size 16 --token-bytes 64 --index-dim 64 --timeout 120"
#define GQA                                                                    \
    "--model gqa --layers 2 --pp 1 --tokens 100 --requests 2 "                 \
    "--block-size 16 --head-dim 16 --dcp 1 --timeout 120"

/* Runs the demo; its exit code, stderr's first line in err. */
static int demo(const char *common, const char *args, char *err, size_t cap)
{
    char cmd[1024];
    snprintf(cmd, sizeof(cmd), "%s demo %s %s >anyxfer_out.txt 2>anyxfer_err.txt",
             kvr_bin, common, args);
    int st = system(cmd);
    FILE *f = fopen("anyxfer_err.txt", "r");
    err[0] = '\0';
    if (f != NULL) {
        if (fgets(err, (int)cap, f) == NULL)
            err[0] = '\0';
        fclose(f);
    }
    return WIFEXITED(st) ? WEXITSTATUS(st) : -1;
}

static void verified(const char *common, const char *args)
{
    char err[1024];
    int rc = demo(common, args, err, sizeof(err));
    if (rc != 0)
        fail_msg("demo %s exited %d: %s", args, rc, err);
}

static void test_sharded_producer_mla(void **state)
{
    (void)state;
    verified(MLA, "--producer-dcp 2 --dcp 4");
    verified(MLA, "--producer-dcp 4 --dcp 2");
    verified(MLA, "--producer-dcp 2 --dcp 4 --interleave 16 "
                  "--producer-interleave 16");
    verified(MLA, "--producer-dcp 4 --dcp 2 --interleave 16 "
                  "--producer-interleave 16 --producer-sharded-index");
}

static void test_tp_reshard_dense(void **state)
{
    (void)state;
    verified(GQA, "--producer-tp 4 --tp 2");
    verified(GQA, "--producer-tp 2 --tp 8 --hnd");
    verified(GQA, "--producer-tp 4 --tp 2 --kv-heads 2 --hnd");
    verified(GQA, "--producer-tp 2 --tp 8 --kv-heads 2");
}

static void refused(const char *common, const char *args, const char *status)
{
    char err[1024];
    time_t t0 = time(NULL);
    int rc = demo(common, args, err, sizeof(err));
    if (rc != 2 || strstr(err, status) == NULL)
        fail_msg("demo %s: exit %d, '%s' (want 2 naming %s)", args, rc, err,
                 status);
    assert_true(time(NULL) - t0 < 30); /* no process was started */
}

static void test_refused_fast(void **state)
{
    (void)state;
    refused(MLA, "--producer-dcp 2 --dcp 4 --producer-sharded-index",
            "ERR_PRODUCER_INDEX_INTERLEAVE");
    refused(MLA, "--producer-dcp 2 --dcp 2 --interleave 16 --sharded-index",
            "ERR_INDEX_NEEDS_REPLICATED");
    refused(GQA, "--dcp 2 --tp 2", "ERR_NOT_IMPLEMENTED");
    refused(GQA, "--producer-tp 3 --tp 2", "ERR_DENSE_HEADS");
}

int main(int argc, char **argv)
{
    if (argc < 2) {
        fprintf(stderr, "usage: test_demo_anyxfer KVRELAY\n");
        return 2;
    }
    kvr_bin = argv[1];
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_sharded_producer_mla),
        cmocka_unit_test(test_tp_reshard_dense),
        cmocka_unit_test(test_refused_fast),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
