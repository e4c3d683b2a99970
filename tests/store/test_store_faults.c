/* The store under bad input and faults: a process killed mid-save, a
 * flipped byte, a torn chunk file, a full disk (failpoint store-enospc), a
 * host tier over its bound, and arguments it must refuse by name. */
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <setjmp.h>
#include <signal.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <cmocka.h>

#include "kvrelay/base.h"
#include "store_fixture.h"
#include "store_tmp.h"

static char dir[ST_DIR_MAX];

static int setup(void **state)
{
    (void)state;
    return st_tmpdir_make(dir, "store-faults") ? 0 : -1;
}

static int teardown(void **state)
{
    (void)state;
    kvr_failpoint_disarm_all();
    return st_tmpdir_remove(dir) ? 0 : -1;
}

static kvr_chunk_key_t key_n(uint32_t n)
{
    kvr_chunk_key_t k;
    memset(&k, 0, sizeof k);
    memset(k.ns, 0xab, sizeof k.ns);
    memcpy(k.chain.bytes, &n, sizeof n);
    return k;
}

static uint8_t *pattern(uint64_t len, uint32_t salt)
{
    uint8_t *b = malloc(len);
    for (uint64_t i = 0; i < len; i++)
        b[i] = (uint8_t)(i * 131 + salt);
    return b;
}

/* Files in dir whose name ends with tail (or starts with .tmp- when tail is
 * NULL). */
static int count_files(const char *tail)
{
    DIR *d = opendir(dir);
    struct dirent *de;
    int n = 0;
    while ((de = readdir(d)) != NULL) {
        size_t l = strlen(de->d_name);
        bool tmp = strncmp(de->d_name, ".tmp-", 5) == 0;
        if (tail == NULL ? tmp
                         : !tmp && l > strlen(tail) &&
                               strcmp(de->d_name + l - strlen(tail), tail) == 0)
            n++;
    }
    closedir(d);
    return n;
}

typedef struct bad_list {
    int n;
    char names[8][KVR_STORE_NAME_MAX + 16];
} bad_list_t;

static void on_bad(const char *name, const char *why, void *arg)
{
    bad_list_t *b = arg;
    (void)why;
    if (b->n < 8)
        snprintf(b->names[b->n], sizeof b->names[0], "%s", name);
    b->n++;
}

static void chunk_path(const kvr_chunk_key_t *k, char *out, size_t cap)
{
    char hex[65];
    for (int i = 0; i < 32; i++)
        snprintf(hex + 2 * i, 3, "%02x", k->chain.bytes[i]);
    char ns[33];
    for (int i = 0; i < 16; i++)
        snprintf(ns + 2 * i, 3, "%02x", k->ns[i]);
    snprintf(out, cap, "%s/%s-%s-p%u.kvc", dir, ns, hex, k->part);
}

static void test_put_get_roundtrip(void **state)
{
    (void)state;
    kvr_store_opts_t o = {.dir = dir, .host_bytes = 1 << 20};
    kvr_store_t *st;
    kvr_error_t err;
    assert_int_equal(kvr_store_open(&o, &st, &err), KVR_OK);
    kvr_chunk_key_t k = key_n(1);
    uint8_t *data = pattern(100000, 1), *back = malloc(100000);
    uint64_t len;
    assert_int_equal(kvr_store_put(st, &k, data, 100000, &err), KVR_OK);
    assert_int_equal(count_files(".kvc"), 1);
    assert_int_equal(count_files(NULL), 0);
    assert_int_equal(kvr_store_get(st, &k, back, 10, &len, &err),
                     KVR_ERR_BUFFER_SMALL);
    assert_int_equal(len, 100000);
    assert_int_equal(kvr_store_get(st, &k, back, 100000, &len, &err), KVR_OK);
    assert_memory_equal(back, data, 100000);
    kvr_store_close(st);
    /* a fresh open finds it on disk */
    assert_int_equal(kvr_store_open(&o, &st, &err), KVR_OK);
    kvr_store_stats_t s;
    kvr_store_stats(st, &s);
    assert_int_equal(s.scan_ok, 1);
    memset(back, 0, 100000);
    assert_int_equal(kvr_store_get(st, &k, back, 100000, &len, &err), KVR_OK);
    assert_memory_equal(back, data, 100000);
    kvr_store_stats(st, &s);
    assert_int_equal(s.disk_hits, 1);
    kvr_store_close(st);
    free(data);
    free(back);
}

/* Chunks of several I/O pieces (io_uring when the build has it, 4 MiB
 * pieces) and a ragged tail: read back whole, and a byte flipped in the
 * last piece is caught. */
static void test_large_chunk(void **state)
{
    (void)state;
    kvr_store_opts_t o = {.dir = dir};
    kvr_store_t *st;
    kvr_error_t err;
    assert_int_equal(kvr_store_open(&o, &st, &err), KVR_OK);
    uint64_t n = (9u << 20) + 12345, len;
    kvr_chunk_key_t k = key_n(6);
    uint8_t *data = pattern(n, 9), *back = malloc(n);
    assert_int_equal(kvr_store_put(st, &k, data, n, &err), KVR_OK);
    assert_int_equal(kvr_store_get(st, &k, back, n, &len, &err), KVR_OK);
    assert_int_equal(len, n);
    assert_memory_equal(back, data, n);
    char path[256];
    chunk_path(&k, path, sizeof path);
    int fd = open(path, O_RDWR);
    uint8_t b = 0;
    assert_int_equal(pread(fd, &b, 1, n - 7), 1);
    b ^= 1;
    assert_int_equal(pwrite(fd, &b, 1, n - 7), 1);
    close(fd);
    assert_int_equal(kvr_store_get(st, &k, back, n, &len, &err),
                     KVR_ERR_NOT_FOUND);
    print_message("backend %s: %s\n", kvr_store_backend(st), err.msg);
    kvr_store_close(st);
    free(data);
    free(back);
}

/* A flipped byte: the load misses and counts it, verify names the file,
 * the next open renames it to .corrupt. */
static void test_flipped_byte(void **state)
{
    (void)state;
    kvr_store_opts_t o = {.dir = dir};
    kvr_store_t *st;
    kvr_error_t err;
    assert_int_equal(kvr_store_open(&o, &st, &err), KVR_OK);
    kvr_chunk_key_t good = key_n(2), bad = key_n(3);
    uint8_t *data = pattern(50000, 2), *back = malloc(50000);
    assert_int_equal(kvr_store_put(st, &good, data, 50000, &err), KVR_OK);
    assert_int_equal(kvr_store_put(st, &bad, data, 50000, &err), KVR_OK);
    char path[256];
    chunk_path(&bad, path, sizeof path);
    int fd = open(path, O_RDWR);
    assert_true(fd >= 0);
    uint8_t b;
    assert_int_equal(pread(fd, &b, 1, 20000), 1);
    b ^= 0x10;
    assert_int_equal(pwrite(fd, &b, 1, 20000), 1);
    close(fd);
    uint64_t len;
    assert_int_equal(kvr_store_get(st, &bad, back, 50000, &len, &err),
                     KVR_ERR_NOT_FOUND);
    assert_non_null(strstr(err.msg, "checksum"));
    kvr_store_stats_t s;
    kvr_store_stats(st, &s);
    assert_int_equal(s.corrupt, 1);
    assert_int_equal(kvr_store_get(st, &good, back, 50000, &len, &err), KVR_OK);
    bad_list_t bl = {0};
    uint64_t ok = 0, nbad = 0;
    assert_int_equal(kvr_store_verify(dir, on_bad, &bl, &ok, &nbad, &err),
                     KVR_OK);
    assert_int_equal(ok, 1);
    assert_int_equal(nbad, 1);
    assert_non_null(strstr(path, bl.names[0]));
    kvr_store_close(st);
    assert_int_equal(kvr_store_open(&o, &st, &err), KVR_OK);
    kvr_store_stats(st, &s);
    assert_int_equal(s.scan_dropped_corrupt, 1);
    assert_int_equal(s.scan_ok, 1);
    assert_int_equal(count_files(".corrupt"), 1);
    assert_false(kvr_store_contains(st, &bad));
    kvr_store_close(st);
    free(data);
    free(back);
}

/* A chunk file cut short (what a crash without the rename discipline would
 * leave) and a leftover temp file: the scan drops both. */
static void test_torn_files(void **state)
{
    (void)state;
    kvr_store_opts_t o = {.dir = dir};
    kvr_store_t *st;
    kvr_error_t err;
    assert_int_equal(kvr_store_open(&o, &st, &err), KVR_OK);
    kvr_chunk_key_t k = key_n(4);
    uint8_t *data = pattern(70000, 4);
    assert_int_equal(kvr_store_put(st, &k, data, 70000, &err), KVR_OK);
    kvr_store_close(st);
    char path[256], tmp[300];
    chunk_path(&k, path, sizeof path);
    assert_int_equal(truncate(path, 40000), 0);
    /* an unfinished write of a process that is gone, and one of a live
     * process (our parent) that another stage may still be writing */
    pid_t gone = fork();
    if (gone == 0)
        _exit(0);
    assert_true(gone > 0);
    waitpid(gone, NULL, 0);
    char live[300];
    snprintf(tmp, sizeof tmp, "%s/.tmp-%d-0-x.kvc", dir, (int)gone);
    snprintf(live, sizeof live, "%s/.tmp-%d-0-y.kvc", dir, (int)getppid());
    for (int i = 0; i < 2; i++) {
        FILE *f = fopen(i ? live : tmp, "w");
        fputs("partial", f);
        fclose(f);
    }
    bad_list_t bl = {0};
    uint64_t nbad = 0;
    assert_int_equal(kvr_store_verify(dir, on_bad, &bl, NULL, &nbad, &err),
                     KVR_OK);
    assert_int_equal(nbad, 3);
    /* the quick scan (headers and sizes) catches a torn file too */
    o.quick_scan = true;
    assert_int_equal(kvr_store_open(&o, &st, &err), KVR_OK);
    kvr_store_stats_t s;
    kvr_store_stats(st, &s);
    assert_int_equal(s.scan_dropped_temp, 1);
    assert_int_equal(s.scan_dropped_corrupt, 1);
    assert_int_equal(count_files(NULL), 1);
    assert_int_equal(access(live, F_OK), 0); /* its writer lives: kept */
    assert_false(kvr_store_contains(st, &k));
    kvr_store_close(st);
    unlink(live);
    free(data);
}

/* A child saving large chunks in a loop, killed with SIGKILL while a temp
 * file is being written: afterwards every chunk file that exists is whole
 * and valid, and the scan removes the unfinished one. */
static void test_killed_mid_save(void **state)
{
    (void)state;
    pid_t pid = fork();
    assert_true(pid >= 0);
    if (pid == 0) {
        kvr_store_opts_t o = {.dir = dir};
        kvr_store_t *st;
        if (kvr_store_open(&o, &st, NULL) != KVR_OK)
            _exit(3);
        uint8_t *data = pattern(32u << 20, 5);
        for (uint32_t i = 0;; i++) {
            kvr_chunk_key_t k = key_n(100 + i);
            if (kvr_store_put(st, &k, data, 32u << 20, NULL) != KVR_OK)
                _exit(4);
        }
    }
    /* kill once a temp file exists and at least one chunk is done, or after
     * a generous deadline */
    struct timespec nap = {0, 1000000};
    for (int i = 0; i < 60000; i++) {
        if (count_files(".kvc") >= 1 && count_files(NULL) >= 1)
            break;
        nanosleep(&nap, NULL);
    }
    assert_int_equal(kill(pid, SIGKILL), 0);
    int status;
    assert_int_equal(waitpid(pid, &status, 0), pid);
    assert_true(WIFSIGNALED(status));
    uint64_t ok = 0, nbad = 0;
    kvr_error_t err;
    bad_list_t bl = {0};
    assert_int_equal(kvr_store_verify(dir, on_bad, &bl, &ok, &nbad, &err),
                     KVR_OK);
    /* only unfinished temp files may be bad; no chunk file is */
    for (int i = 0; i < bl.n && i < 8; i++)
        assert_int_equal(strncmp(bl.names[i], ".tmp-", 5), 0);
    kvr_store_opts_t o = {.dir = dir};
    kvr_store_t *st;
    assert_int_equal(kvr_store_open(&o, &st, &err), KVR_OK);
    kvr_store_stats_t s;
    kvr_store_stats(st, &s);
    assert_int_equal(s.scan_dropped_corrupt, 0);
    assert_int_equal(s.scan_ok, ok);
    assert_int_equal(s.scan_dropped_temp, nbad);
    assert_int_equal(count_files(NULL), 0);
    print_message("killed child: %llu whole chunks, %llu unfinished\n",
                  (unsigned long long)ok, (unsigned long long)nbad);
    kvr_store_close(st);
}

/* A full disk: the save fails with ENOSPC named, no chunk or temp file is
 * left, nothing is kept in the host tier; disarmed, the same save works. */
static void test_full_disk(void **state)
{
    (void)state;
    kvr_store_opts_t o = {.dir = dir, .host_bytes = 1 << 20};
    kvr_store_t *st;
    kvr_error_t err;
    assert_int_equal(kvr_store_open(&o, &st, &err), KVR_OK);
    assert_int_equal(kvr_failpoint_arm("store-enospc", "", &err), KVR_OK);
    kvr_chunk_key_t k = key_n(5);
    uint8_t *data = pattern(10000, 6);
    assert_int_equal(kvr_store_put(st, &k, data, 10000, &err), KVR_ERR_IO);
    assert_non_null(strstr(err.msg, strerror(ENOSPC)));
    assert_int_equal(count_files(".kvc"), 0);
    assert_int_equal(count_files(NULL), 0);
    assert_false(kvr_store_contains(st, &k));
    kvr_failpoint_disarm_all();
    assert_int_equal(kvr_store_put(st, &k, data, 10000, &err), KVR_OK);
    assert_true(kvr_store_contains(st, &k));
    kvr_store_close(st);
    free(data);
}

/* A write failing mid-save (store-enospc on the second chunk's name)
 * stops the save: the first chunk is on disk, no later one is, although
 * the third may have been written behind it before the failure was seen;
 * no temp file is left. */
static void test_failed_write_mid_save(void **state)
{
    (void)state;
    kvr_store_opts_t o = {.dir = dir, .host_bytes = 1 << 20};
    kvr_store_t *st;
    kvr_error_t err;
    assert_int_equal(kvr_store_open(&o, &st, &err), KVR_OK);
    sf_model_t m = {
        .layers = 1, .pp = 1, .bs = 16, .tb = 64, .D = 128, .pool = 8};
    kvr_layout_t lay = KVR_LAYOUT_INIT;
    lay.block_size = 16;
    unsigned seed = 2;
    sf_side_t s;
    sf_side_init(&s, &m, &lay, false, 0, 1, 8, &seed);
    uint8_t ns[KVR_STORE_NS_BYTES] = {0};
    kvr_block_hash_t chains[4] = {{{1}}, {{2}}, {{3}}, {{4}}};
    kvr_store_io_t io = {.ns = ns,
                         .block_size = 16,
                         .chunk = 32,
                         .chains = chains,
                         .num_chains = 4,
                         .lay = &lay,
                         .regions = s.regions,
                         .num_regions = s.num_regions,
                         .blocks = s.blocks,
                         .num_blocks = s.num_blocks};
    char second[KVR_STORE_NAME_MAX];
    snprintf(second, sizeof second, "%032d-02%062d-p0.kvc", 0, 0);
    assert_int_equal(kvr_failpoint_arm("store-enospc", second, &err), KVR_OK);
    size_t saved = 9;
    assert_int_equal(kvr_store_save(st, &io, &saved, &err), KVR_ERR_IO);
    assert_non_null(strstr(err.msg, second));
    kvr_failpoint_disarm_all();
    assert_int_equal(saved, 1);
    assert_int_equal(count_files(".kvc"), 1);
    assert_int_equal(count_files(NULL), 0);
    for (size_t c = 0; c < 4; c++) {
        kvr_chunk_key_t k = {.chain = chains[c]};
        assert_int_equal(kvr_store_contains(st, &k), c == 0);
    }
    assert_int_equal(kvr_store_save(st, &io, &saved, &err), KVR_OK);
    assert_int_equal(saved, 3);
    assert_int_equal(count_files(".kvc"), 4);
    sf_side_free(&s);
    kvr_store_close(st);
}

/* LRU by bytes: a tier of 2.5 chunks holds the two most recent. */
static void test_lru_by_bytes(void **state)
{
    (void)state;
    kvr_store_opts_t o = {.host_bytes = 25000};
    kvr_store_t *st;
    kvr_error_t err;
    assert_int_equal(kvr_store_open(&o, &st, &err), KVR_OK);
    uint8_t *data = pattern(10000, 7), *back = malloc(10000);
    uint64_t len;
    kvr_chunk_key_t a = key_n(10), b = key_n(11), c = key_n(12);
    assert_int_equal(kvr_store_put(st, &a, data, 10000, &err), KVR_OK);
    assert_int_equal(kvr_store_put(st, &b, data, 10000, &err), KVR_OK);
    /* touch a: b becomes the least recent */
    assert_int_equal(kvr_store_get(st, &a, back, 10000, &len, &err), KVR_OK);
    assert_int_equal(kvr_store_put(st, &c, data, 10000, &err), KVR_OK);
    kvr_store_stats_t s;
    kvr_store_stats(st, &s);
    assert_int_equal(s.host_bytes, 20000);
    assert_int_equal(s.evictions, 1);
    assert_true(kvr_store_contains(st, &a));
    assert_false(kvr_store_contains(st, &b));
    assert_int_equal(kvr_store_get(st, &b, back, 10000, &len, &err),
                     KVR_ERR_NOT_FOUND);
    /* larger than the whole tier: accepted, not kept */
    uint8_t *big = pattern(30000, 8);
    kvr_chunk_key_t d = key_n(13);
    assert_int_equal(kvr_store_put(st, &d, big, 30000, &err), KVR_OK);
    assert_false(kvr_store_contains(st, &d));
    kvr_store_close(st);
    free(data);
    free(back);
    free(big);
}

static void test_bad_input(void **state)
{
    (void)state;
    kvr_store_t *st;
    kvr_error_t err;
    assert_int_equal(kvr_store_open(NULL, &st, &err), KVR_ERR_INVALID);
    assert_non_null(strstr(err.msg, "opts"));
    kvr_store_opts_t none = {0};
    assert_int_equal(kvr_store_open(&none, &st, &err), KVR_ERR_INVALID);
    assert_non_null(strstr(err.msg, "no tier"));
    kvr_store_opts_t nodir = {.dir = "/proc/no/such/dir"};
    assert_int_equal(kvr_store_open(&nodir, &st, &err), KVR_ERR_IO);
    assert_non_null(strstr(err.msg, "/proc/no/such/dir"));
    assert_int_equal(
        kvr_store_verify("/proc/no/such/dir", NULL, NULL, NULL, NULL, &err),
        KVR_ERR_IO);

    kvr_store_opts_t o = {.host_bytes = 1 << 20};
    assert_int_equal(kvr_store_open(&o, &st, &err), KVR_OK);
    sf_model_t m = {
        .layers = 1, .pp = 1, .bs = 16, .tb = 64, .D = 128, .pool = 8};
    kvr_layout_t lay = KVR_LAYOUT_INIT;
    lay.block_size = 16;
    unsigned seed = 1;
    sf_side_t s;
    sf_side_init(&s, &m, &lay, false, 0, 1, 4, &seed);
    uint8_t ns[KVR_STORE_NS_BYTES] = {0};
    kvr_block_hash_t chains[2] = {{{0}}, {{1}}};
    kvr_store_io_t io = {.ns = ns,
                         .block_size = 16,
                         .chunk = 24,
                         .chains = chains,
                         .num_chains = 2,
                         .lay = &lay,
                         .regions = s.regions,
                         .num_regions = s.num_regions,
                         .blocks = s.blocks,
                         .num_blocks = s.num_blocks};
    size_t saved;
    assert_int_equal(kvr_store_save(st, &io, &saved, &err), KVR_ERR_CHUNK_SIZE);
    assert_non_null(strstr(err.msg, "24"));
    io.chunk = 32;
    s.regions[0].desc.role = KVR_ROLE_STATE;
    assert_int_equal(kvr_store_save(st, &io, &saved, &err),
                     KVR_ERR_NO_RELAYOUT);
    assert_non_null(strstr(err.msg, "state"));
    s.regions[0].desc.role = KVR_ROLE_MLA;
    /* a table too short for the second chunk is the planner's refusal;
     * the first chunk, whole, is saved */
    io.num_blocks = 3;
    assert_int_equal(kvr_store_save(st, &io, &saved, &err),
                     KVR_ERR_SRC_TABLE_SHORT);
    assert_int_equal(saved, 1);
    io.num_blocks = 4;
    assert_int_equal(kvr_store_save(st, &io, &saved, &err), KVR_OK);
    assert_int_equal(saved, 1);
    assert_int_equal(kvr_store_save(st, &io, &saved, &err), KVR_OK);
    assert_int_equal(saved, 0); /* already stored */
    kvr_layout_t other = lay;
    other.block_size = 32;
    io.lay = &other;
    uint64_t got;
    assert_int_equal(kvr_store_load(st, &io, &got, &err),
                     KVR_ERR_LAYOUT_MISMATCH);
    assert_non_null(strstr(err.msg, "32"));
    sf_side_free(&s);
    kvr_store_close(st);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_setup_teardown(test_put_get_roundtrip, setup,
                                        teardown),
        cmocka_unit_test_setup_teardown(test_large_chunk, setup, teardown),
        cmocka_unit_test_setup_teardown(test_flipped_byte, setup, teardown),
        cmocka_unit_test_setup_teardown(test_torn_files, setup, teardown),
        cmocka_unit_test_setup_teardown(test_killed_mid_save, setup, teardown),
        cmocka_unit_test_setup_teardown(test_full_disk, setup, teardown),
        cmocka_unit_test_setup_teardown(test_failed_write_mid_save, setup,
                                        teardown),
        cmocka_unit_test_setup_teardown(test_lru_by_bytes, setup, teardown),
        cmocka_unit_test(test_bad_input),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
