/* `kvrelay store stat` and `store verify` on a store made here through the
 * store API: counts, bytes and namespaces; a flipped payload byte and an
 * unfinished write named by verify (exit 1); bad usage exits 2 naming the
 * value. */
#include <fcntl.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cmocka.h>
#include <jansson.h>

#include "kvrelay/store.h"
#include "test_inspect_cli.h"

#define PAYLOAD 5000
#define CHUNK_FILE (4096 + PAYLOAD + 32) /* header block + payload + sum */

static const char *kvr_bin;
static cli_result_t res;
static char dir[64];

static kvr_chunk_key_t key_of(uint8_t ns, uint8_t n)
{
    kvr_chunk_key_t k;
    memset(&k, 0, sizeof k);
    memset(k.ns, ns, sizeof k.ns);
    k.chain.bytes[0] = n;
    return k;
}

static void chunk_name(const kvr_chunk_key_t *k, char *out, size_t cap)
{
    char ns[33], chain[65];
    for (int i = 0; i < 16; i++)
        snprintf(ns + 2 * i, 3, "%02x", k->ns[i]);
    for (int i = 0; i < 32; i++)
        snprintf(chain + 2 * i, 3, "%02x", k->chain.bytes[i]);
    snprintf(out, cap, "%s-%s-p%u.kvc", ns, chain, k->part);
}

/* Three chunks: two in namespace ab.., one in cd... */
static int setup(void **state)
{
    (void)state;
    snprintf(dir, sizeof dir, "/tmp/kvr-cli-store-XXXXXX");
    if (mkdtemp(dir) == NULL)
        return -1;
    kvr_store_opts_t o = {.dir = dir};
    kvr_store_t *st;
    kvr_error_t err;
    if (kvr_store_open(&o, &st, &err) != KVR_OK)
        return -1;
    static uint8_t data[PAYLOAD];
    for (size_t i = 0; i < PAYLOAD; i++)
        data[i] = (uint8_t)(i * 7);
    kvr_chunk_key_t keys[3] = {key_of(0xab, 1), key_of(0xab, 2),
                               key_of(0xcd, 1)};
    int rc = 0;
    for (int i = 0; i < 3 && rc == 0; i++)
        rc = kvr_store_put(st, &keys[i], data, PAYLOAD, &err) == KVR_OK ? 0
                                                                        : -1;
    kvr_store_close(st);
    return rc;
}

static int teardown(void **state)
{
    (void)state;
    char cmd[128];
    snprintf(cmd, sizeof cmd, "rm -rf %s", dir);
    return system(cmd) == 0 ? 0 : -1;
}

static json_t *stat_json(void)
{
    char args[128];
    snprintf(args, sizeof args, "stat --json %s", dir);
    cli_run(kvr_bin, "store", args, &res);
    assert_int_equal(res.status, 0);
    json_error_t jerr;
    json_t *root = json_loads(res.out, 0, &jerr);
    if (root == NULL)
        fail_msg("not JSON (%s): %s", jerr.text, res.out);
    return root;
}

static json_int_t get(json_t *o, const char *key)
{
    json_t *v = json_object_get(o, key);
    if (!json_is_integer(v))
        fail_msg("no integer '%s'", key);
    return json_integer_value(v);
}

static void run_verify(int expect)
{
    char args[128];
    snprintf(args, sizeof args, "verify %s", dir);
    cli_run(kvr_bin, "store", args, &res);
    if (res.status != expect)
        fail_msg("verify exited %d, not %d: %s%s", res.status, expect, res.out,
                 res.err);
}

static void test_clean_store(void **state)
{
    (void)state;
    json_t *r = stat_json();
    assert_int_equal(get(r, "chunks"), 3);
    assert_int_equal(get(r, "good"), 3);
    assert_int_equal(get(r, "bytes"), 3 * CHUNK_FILE);
    assert_int_equal(get(r, "unfinished"), 0);
    json_t *ns = json_object_get(r, "namespaces");
    assert_int_equal(json_array_size(ns), 2);
    assert_int_equal(json_array_size(json_object_get(r, "bad")), 0);
    json_decref(r);

    char args[128];
    snprintf(args, sizeof args, "stat %s", dir);
    cli_run(kvr_bin, "store", args, &res);
    assert_int_equal(res.status, 0);
    assert_non_null(strstr(res.out, "chunks:      3 (3 good, 0 bad)"));
    assert_non_null(strstr(res.out, "abababababababababababababababab"));
    assert_non_null(strstr(res.out, "cdcdcdcdcdcdcdcdcdcdcdcdcdcdcdcd"));

    run_verify(0);
    assert_non_null(strstr(res.out, "3 chunks good, 0 bad"));
}

/* One payload byte flipped: verify names that file (checksum), exit 1;
 * the other chunks are still good; the file is left where it is. */
static void test_flipped_byte(void **state)
{
    (void)state;
    kvr_chunk_key_t k = key_of(0xab, 2);
    char name[KVR_STORE_NAME_MAX], path[256];
    chunk_name(&k, name, sizeof name);
    snprintf(path, sizeof path, "%s/%s", dir, name);
    int fd = open(path, O_RDWR);
    assert_true(fd >= 0);
    uint8_t b;
    assert_int_equal(pread(fd, &b, 1, 4096 + 100), 1);
    b ^= 0x01;
    assert_int_equal(pwrite(fd, &b, 1, 4096 + 100), 1);
    close(fd);

    run_verify(1);
    char line[512];
    snprintf(line, sizeof line, "bad: %s: ", name);
    if (strstr(res.out, line) == NULL || strstr(res.out, "checksum") == NULL)
        fail_msg("verify output does not name %s: %s", name, res.out);
    assert_non_null(strstr(res.out, "2 chunks good, 1 bad"));
    assert_int_equal(access(path, F_OK), 0);

    json_t *r = stat_json();
    assert_int_equal(get(r, "chunks"), 3);
    assert_int_equal(get(r, "good"), 2);
    json_t *bad = json_array_get(json_object_get(r, "bad"), 0);
    assert_string_equal(json_string_value(json_object_get(bad, "file")), name);
    json_decref(r);
}

/* A temp file a killed save left: stat counts it, verify names it. */
static void test_unfinished_write(void **state)
{
    (void)state;
    char path[256];
    snprintf(path, sizeof path, "%s/.tmp-1-1-x.kvc", dir);
    FILE *f = fopen(path, "w");
    assert_non_null(f);
    fputs("partial", f);
    fclose(f);
    json_t *r = stat_json();
    assert_int_equal(get(r, "unfinished"), 1);
    json_decref(r);
    run_verify(1);
    assert_non_null(strstr(res.out, "bad: .tmp-1-1-x.kvc: unfinished write"));
    unlink(path);
}

static void test_bad_usage(void **state)
{
    (void)state;
    cli_expect_usage(kvr_bin, "store", "verify /nonexistent/kvr-store",
                     "/nonexistent/kvr-store", &res);
    cli_expect_usage(kvr_bin, "store", "stat /nonexistent/kvr-store",
                     "/nonexistent/kvr-store", &res);
    cli_expect_usage(kvr_bin, "store", "verify", "DIR is required", &res);
    cli_expect_usage(kvr_bin, "store", "stat /dev/null",
                     "'/dev/null' is not "
                     "a directory",
                     &res);
    cli_expect_usage(kvr_bin, "store", "check /tmp", "'check'", &res);
    cli_expect_usage(kvr_bin, "store", "verify --json /tmp", "'--json'", &res);
    cli_run(kvr_bin, "store", "verify --help", &res);
    assert_int_equal(res.status, 0);
    assert_non_null(strstr(res.out, "usage: kvrelay store"));
    cli_run(kvr_bin, "store", "--help", &res);
    assert_int_equal(res.status, 0);
}

int main(int argc, char **argv)
{
    if (argc < 2) {
        fprintf(stderr, "usage: %s KVRELAY_BINARY\n", argv[0]);
        return 2;
    }
    kvr_bin = argv[1];
    /* the tests run in order: clean, then damaged */
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_clean_store),
        cmocka_unit_test(test_flipped_byte),
        cmocka_unit_test(test_unfinished_write),
        cmocka_unit_test(test_bad_usage),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
