/* `kvrelay demo --save-to` then `--load-from`: every request verified
 * byte-exact both times, the second run's prefixes from the store and the
 * rest by transfer (the JSON counts both); a corrupt chunk is a miss, never
 * loaded; a full disk fails the save (exit 1) while every transfer still
 * verifies; bad store flags are refused before any process starts. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cmocka.h>
#include <jansson.h>

static const char *kvr_bin;
static char dir[64];

#define SMALL                                                                  \
    "--dcp 2 --layers 6 --pp 2 --requests 3 --tokens 300 --no-reuse "          \
    "--deadline-ms 60000 --timeout 300"

static int setup(void **state)
{
    (void)state;
    snprintf(dir, sizeof dir, "/tmp/kvr-demo-store-XXXXXX");
    return mkdtemp(dir) == NULL ? -1 : 0;
}

static int teardown(void **state)
{
    (void)state;
    char cmd[128];
    snprintf(cmd, sizeof cmd, "rm -rf %s", dir);
    return system(cmd) == 0 ? 0 : -1;
}

static int run(const char *args, char *out, size_t cap)
{
    char cmd[1024];
    snprintf(cmd, sizeof cmd, "%s demo %s 2>&1", kvr_bin, args);
    FILE *p = popen(cmd, "r");
    assert_non_null(p);
    size_t n = fread(out, 1, cap - 1, p);
    out[n] = '\0';
    int st = pclose(p);
    return WIFEXITED(st) ? WEXITSTATUS(st) : -1;
}

/* --json: the root object (the human lines go to stderr). */
static json_t *run_json(const char *args, int *code)
{
    char cmd[1024];
    snprintf(cmd, sizeof cmd, "%s demo --json %s >%s.json 2>%s.err", kvr_bin,
             args, dir, dir);
    int st = system(cmd);
    *code = WIFEXITED(st) ? WEXITSTATUS(st) : -1;
    char path[128];
    snprintf(path, sizeof path, "%s.json", dir);
    json_t *root = json_load_file(path, 0, NULL);
    unlink(path);
    if (root == NULL)
        fail_msg("demo --json %s: no JSON on stdout", args);
    return root;
}

static json_int_t num(json_t *o, const char *k)
{
    return json_integer_value(json_object_get(o, k));
}

static void save_run(void)
{
    char args[512];
    int code;
    snprintf(args, sizeof args, "--save-to %s " SMALL, dir);
    json_t *root = run_json(args, &code);
    assert_int_equal(code, 0);
    assert_true(json_is_true(json_object_get(root, "ok")));
    assert_int_equal(num(root, "verified"), 3);
    assert_int_equal(num(root, "saved"), 3);
    json_decref(root);
}

static json_t *load_run(int *code)
{
    char args[512];
    snprintf(args, sizeof args, "--load-from %s " SMALL, dir);
    return run_json(args, code);
}

/* The second run: each request's prefix (256 of ~300+ tokens, chunk = bs *
 * W = 128) from the store, the rest by transfer, all byte-exact. */
static void test_save_then_load(void **state)
{
    (void)state;
    save_run();
    int code;
    json_t *root = load_run(&code);
    assert_int_equal(code, 0);
    assert_int_equal(num(root, "verified"), 3);
    json_t *reqs = json_object_get(root, "requests");
    for (size_t r = 0; r < 3; r++) {
        json_t *q = json_array_get(reqs, r);
        json_int_t tokens = num(q, "tokens");
        assert_int_equal(num(q, "store_tokens"), (tokens - 1) / 128 * 128);
        assert_true(num(q, "store_bytes") > 0);
        assert_true(num(q, "bytes") > 0); /* the rest, by transfer */
        assert_int_equal(num(q, "computed_blocks"),
                         (tokens - 1) / 128); /* virtual blocks of 128 */
    }
    json_decref(root);
}

/* A byte flipped in one chunk file: `store verify` names it, and the load
 * run still verifies every request (that chunk's request pulls it). */
static void test_corrupt_chunk_is_a_miss(void **state)
{
    (void)state;
    save_run();
    char cmd[512], out[16384], name[256] = "";
    snprintf(cmd, sizeof cmd,
             "f=$(ls %s/*-p1.kvc | head -1) && basename $f && printf '\\377' "
             "| dd of=$f bs=1 seek=8096 conv=notrunc status=none",
             dir);
    FILE *p = popen(cmd, "r");
    assert_non_null(fgets(name, sizeof name, p));
    assert_int_equal(pclose(p), 0);
    name[strcspn(name, "\n")] = '\0';
    snprintf(cmd, sizeof cmd, "%s store verify %s 2>&1", kvr_bin, dir);
    p = popen(cmd, "r");
    size_t n = fread(out, 1, sizeof out - 1, p);
    out[n] = '\0';
    int st = pclose(p);
    assert_int_equal(WEXITSTATUS(st), 1);
    assert_non_null(strstr(out, name));
    int code;
    json_t *root = load_run(&code);
    assert_int_equal(code, 0);
    assert_int_equal(num(root, "verified"), 3);
    json_int_t hits_short = 0;
    json_t *reqs = json_object_get(root, "requests");
    for (size_t r = 0; r < 3; r++) {
        json_t *q = json_array_get(reqs, r);
        hits_short += num(q, "store_tokens") <
                      (num(q, "tokens") - 1) / 128 * 128;
    }
    assert_true(hits_short >= 1);
    json_decref(root);
}

/* A full disk on every chunk write: the saves fail and say so, the run
 * exits 1, every transfer verified all the same; nothing is left. */
static void test_full_disk(void **state)
{
    (void)state;
    char args[512], out[65536];
    /* the failpoint is keyed by chunk file names: "*" arms it for all */
    snprintf(args, sizeof args, "--save-to %s --fault 'store-enospc:*' " SMALL,
             dir);
    int code = run(args, out, sizeof out);
    if (strstr(out, "verified 3/3 requests byte-exact") == NULL)
        fail_msg("exit %d: %s", code, out);
    assert_int_equal(code, 1);
    assert_non_null(strstr(out, "save of part 1 failed"));
    /* the head's quorum: every part answered, with the failure */
    assert_non_null(strstr(out, "not saved by every stage: ERR_IO"));
    assert_non_null(strstr(out, "No space left on device"));
    assert_non_null(strstr(out, "saved 0/3 requests"));
    char cmd[128];
    snprintf(cmd, sizeof cmd, "test -z \"$(ls -A %s)\"", dir);
    assert_int_equal(system(cmd), 0);
}

static void refused(const char *args, const char *want)
{
    char out[8192];
    int code = run(args, out, sizeof out);
    if (code != 2 || strstr(out, want) == NULL)
        fail_msg("demo %s: exit %d, wanted 2 and '%s': %s", args, code, want,
                 out);
    assert_null(strstr(out, "verified")); /* nothing started */
}

static void test_bad_flags(void **state)
{
    (void)state;
    char args[512];
    snprintf(args, sizeof args, "--save-to %s --load-from %s", dir, dir);
    refused(args, "--save-to and --load-from are two runs");
    refused("--load-from /nonexistent/kvr-store", "--load-from "
                                                  "/nonexistent/kvr-store: No "
                                                  "such file");
    refused("--load-from /etc/hostname", "not a directory");
    snprintf(args, sizeof args, "--save-to %s --chunk 100", dir);
    refused(args, "--chunk 100 is not a multiple of --block-size * --dcp = "
                  "256");
    refused("--save-to /proc/kvr-no/x", "--save-to /proc/kvr-no/x");
}

int main(int argc, char **argv)
{
    if (argc < 2) {
        fprintf(stderr, "usage: %s KVRELAY\n", argv[0]);
        return 2;
    }
    kvr_bin = argv[1];
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_setup_teardown(test_save_then_load, setup, teardown),
        cmocka_unit_test_setup_teardown(test_corrupt_chunk_is_a_miss, setup,
                                        teardown),
        cmocka_unit_test_setup_teardown(test_full_disk, setup, teardown),
        cmocka_unit_test_setup_teardown(test_bad_flags, setup, teardown),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
