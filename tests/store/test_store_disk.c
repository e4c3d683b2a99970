/* The disk tier's I/O and checksum paths (docs/store.md): both checksum
 * kinds (BLAKE2b and Poly1305 leaves) through both backends (io_uring
 * writes, and the pread/pwrite fallback), the checksum computed while the
 * payload is read equal to the one computed at once, a flipped byte in any
 * leaf caught, and a header naming an unknown checksum kind refused. */
#include <dirent.h>
#include <fcntl.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cmocka.h>

#include "kvrelay/base.h"
#include "store_internal.h"
#include "store_tmp.h"

/* Three leaves, the last one short, and longer than one I/O piece, so
 * writes take the io_uring path where it is allowed. */
#define LEN (2 * KVR__LEAF + 12345)

static char dir[ST_DIR_MAX];

static int setup(void **state)
{
    (void)state;
    return st_tmpdir_make(dir, "store-disk") ? 0 : -1;
}

static int teardown(void **state)
{
    (void)state;
    return st_tmpdir_remove(dir) ? 0 : -1;
}

static kvr_chunk_key_t key_n(uint32_t n)
{
    kvr_chunk_key_t k;
    memset(&k, 0, sizeof k);
    memset(k.ns, 0x3c, sizeof k.ns);
    memcpy(k.chain.bytes, &n, sizeof n);
    return k;
}

static uint8_t *pattern(uint64_t len, uint32_t salt)
{
    uint8_t *b = malloc(len);
    for (uint64_t i = 0; i < len; i++)
        b[i] = (uint8_t)((i >> 7) * 29 + i * 131 + salt);
    return b;
}

/* A disk-only store writing kind `kind`, with io_uring or without. */
static kvr_store_t *open_with(unsigned kind, bool plain)
{
    kvr_store_opts_t o = {.dir = dir};
    kvr_store_t *st = NULL;
    kvr_error_t err;
    assert_int_equal(kvr_store_open(&o, &st, &err), KVR_OK);
    st->sum_kind = kind;
    if (plain)
        kvr__disk_plain(st);
    return st;
}

static void chunk_path(const kvr_chunk_key_t *k, char *out, size_t cap)
{
    char name[KVR_STORE_NAME_MAX];
    kvr__chunk_name(k, name);
    snprintf(out, cap, "%s/%s", dir, name);
}

static void read_file(const char *path, uint8_t *buf, uint64_t len)
{
    FILE *f = fopen(path, "rb");
    assert_non_null(f);
    assert_int_equal(fread(buf, 1, len, f), len);
    fclose(f);
}

static void patch_file(const char *path, uint64_t off, uint8_t x)
{
    int fd = open(path, O_RDWR);
    uint8_t b;
    assert_true(fd >= 0);
    assert_int_equal(pread(fd, &b, 1, (off_t)off), 1);
    b ^= x;
    assert_int_equal(pwrite(fd, &b, 1, (off_t)off), 1);
    close(fd);
}

/* Writes a chunk of kind, backend plain; checks the file names its kind and
 * carries the checksum kvr__chunk_sum gives at once; reads it back through
 * the other backend too. */
static void round_trip(unsigned kind, bool plain)
{
    uint8_t *data = pattern(LEN, kind * 2 + plain), *back = malloc(LEN);
    kvr_chunk_key_t k = key_n(kind * 2 + plain);
    kvr_store_t *st = open_with(kind, plain);
    kvr_error_t err;
    assert_int_equal(kvr_store_put(st, &k, data, LEN, &err), KVR_OK);
    kvr_store_close(st);

    char path[256];
    uint8_t *file = malloc(LEN + KVR__CHUNK_FRAME), want[KVR_STORE_SUM_BYTES];
    chunk_path(&k, path, sizeof path);
    read_file(path, file, LEN + KVR__CHUNK_FRAME);
    assert_int_equal(file[12], kind);
    assert_memory_equal(file + KVR__CHUNK_HEADER, data, LEN);
    kvr__chunk_sum(file, data, LEN, want);
    assert_memory_equal(file + KVR__CHUNK_HEADER + LEN, want, sizeof want);

    for (int other = 0; other < 2; other++) {
        uint64_t got = 0;
        st = open_with(KVR__SUM_DEFAULT, other);
        memset(back, 0, LEN);
        assert_int_equal(kvr_store_get(st, &k, back, LEN, &got, &err), KVR_OK);
        assert_int_equal(got, LEN);
        assert_memory_equal(back, data, LEN);
        kvr_store_stats_t s;
        kvr_store_stats(st, &s);
        assert_int_equal(s.scan_dropped_corrupt, 0);
        kvr_store_close(st);
    }
    free(file);
    free(back);
    free(data);
}

static void test_kinds_and_backends_round_trip(void **state)
{
    (void)state;
    for (unsigned kind = 0; kind < 2; kind++)
        for (int plain = 0; plain < 2; plain++)
            round_trip(kind, plain);
}

/* BLAKE2b leaves unless the store is opened with fast_checksum; io_uring
 * where the kernel allows it. */
static void test_default_is_blake2b_and_uring_when_allowed(void **state)
{
    (void)state;
    for (int fast = 0; fast < 2; fast++) {
        kvr_store_opts_t o = {.dir = dir, .fast_checksum = fast};
        kvr_store_t *st = NULL;
        kvr_error_t err;
        assert_int_equal(kvr_store_open(&o, &st, &err), KVR_OK);
        assert_int_equal(st->sum_kind,
                         fast ? KVR__SUM_POLY1305 : KVR__SUM_BLAKE2B);
        const char *b = kvr_store_backend(st);
        assert_true(strcmp(b, "io_uring") == 0 ||
                    strcmp(b, "pread/pwrite") == 0);
        kvr__disk_plain(st);
        assert_string_equal(kvr_store_backend(st), "pread/pwrite");
        kvr_store_close(st);
    }
}

/* The checksum fed piece by piece (out of step with the leaves, as reads
 * arrive) equals the one computed at once, for both kinds and for an
 * empty payload; an aborted one frees everything (ASan). */
static void test_pipelined_sum_matches(void **state)
{
    (void)state;
    uint8_t *data = pattern(LEN, 7);
    const uint64_t lens[] = {LEN, KVR__LEAF, 1, 0};
    for (unsigned kind = 0; kind < 2; kind++)
        for (size_t i = 0; i < sizeof lens / sizeof lens[0]; i++) {
            uint8_t header[KVR__CHUNK_HEADER], a[KVR_STORE_SUM_BYTES],
                b[KVR_STORE_SUM_BYTES];
            kvr_chunk_key_t k = key_n(1);
            kvr__chunk_header(&k, lens[i], header);
            kvr__chunk_set_kind(header, kind);
            kvr__chunk_sum(header, data, lens[i], a);
            kvr__sum_t *s = kvr__sum_start(header, data, lens[i], false);
            assert_non_null(s);
            for (uint64_t at = 0; at < lens[i]; at += 3000001) {
                kvr__sum_ready(s, at);
                (void)kvr__sum_step(s);
            }
            kvr__sum_finish(s, b);
            assert_memory_equal(a, b, sizeof a);
            kvr__chunk_set_kind(header, kind ^ 1);
            kvr__chunk_sum(header, data, lens[i], b);
            assert_memory_not_equal(a, b, sizeof a); /* the kind counts */
            kvr__sum_abort(kvr__sum_start(header, data, lens[i], false));
            kvr__sum_abort(kvr__sum_start(header, data, lens[i], true));
        }
    free(data);
}

/* A flipped byte in the first, a middle and the last leaf, and in the
 * stored checksum: each is a miss counted corrupt, on both backends and
 * kinds. */
static void test_flip_in_any_leaf_is_a_miss(void **state)
{
    (void)state;
    const uint64_t at[] = {0, KVR__LEAF + 5, LEN - 1, LEN + 3};
    uint8_t *data = pattern(LEN, 3), *back = malloc(LEN);
    uint32_t n = 100;
    for (unsigned kind = 0; kind < 2; kind++)
        for (int plain = 0; plain < 2; plain++)
            for (size_t i = 0; i < sizeof at / sizeof at[0]; i++, n++) {
                kvr_chunk_key_t k = key_n(n);
                kvr_store_t *st = open_with(kind, plain);
                kvr_error_t err;
                assert_int_equal(kvr_store_put(st, &k, data, LEN, &err),
                                 KVR_OK);
                char path[256];
                chunk_path(&k, path, sizeof path);
                patch_file(path, KVR__CHUNK_HEADER + at[i], 0x40);
                uint64_t got = 0;
                assert_int_equal(kvr_store_get(st, &k, back, LEN, &got, &err),
                                 KVR_ERR_NOT_FOUND);
                assert_non_null(strstr(err.msg, "checksum mismatch"));
                kvr_store_stats_t s;
                kvr_store_stats(st, &s);
                assert_int_equal(s.corrupt, 1);
                kvr_store_close(st);
                unlink(path);
            }
    free(back);
    free(data);
}

static void count_bad(const char *name, const char *why, void *arg)
{
    (void)name;
    (void)why;
    (*(int *)arg)++;
}

/* A header naming a checksum kind this build does not know is refused by
 * verify and set aside by the open scan. */
static void test_unknown_kind_refused(void **state)
{
    (void)state;
    uint8_t *data = pattern(4096, 9);
    kvr_chunk_key_t k = key_n(500);
    kvr_store_t *st = open_with(KVR__SUM_POLY1305, false);
    kvr_error_t err;
    assert_int_equal(kvr_store_put(st, &k, data, 4096, &err), KVR_OK);
    kvr_store_close(st);
    char path[256];
    chunk_path(&k, path, sizeof path);
    patch_file(path, 12, 0x07); /* kind 1 -> 6 */

    uint8_t header[KVR__CHUNK_HEADER];
    read_file(path, header, sizeof header);
    kvr_chunk_key_t parsed;
    uint64_t len;
    assert_int_equal(kvr__chunk_parse(header, &parsed, &len, &err),
                     KVR_ERR_VERIFY);
    assert_non_null(strstr(err.msg, "checksum kind 6"));

    int bad = 0;
    uint64_t ok = 9, nbad = 0;
    assert_int_equal(kvr_store_verify(dir, count_bad, &bad, &ok, &nbad, &err),
                     KVR_OK);
    assert_int_equal(nbad, 1);
    assert_int_equal(bad, 1);
    assert_int_equal(ok, 0);
    st = open_with(KVR__SUM_DEFAULT, false);
    kvr_store_stats_t s;
    kvr_store_stats(st, &s);
    assert_int_equal(s.scan_dropped_corrupt, 1);
    assert_false(kvr_store_contains(st, &k));
    kvr_store_close(st);
    free(data);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_setup_teardown(test_kinds_and_backends_round_trip,
                                        setup, teardown),
        cmocka_unit_test_setup_teardown(
            test_default_is_blake2b_and_uring_when_allowed, setup, teardown),
        cmocka_unit_test_setup_teardown(test_pipelined_sum_matches, setup,
                                        teardown),
        cmocka_unit_test_setup_teardown(test_flip_in_any_leaf_is_a_miss, setup,
                                        teardown),
        cmocka_unit_test_setup_teardown(test_unknown_kind_refused, setup,
                                        teardown),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
