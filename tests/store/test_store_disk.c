/* The disk tier's I/O and checksum paths (docs/store.md): both checksum
 * kinds (BLAKE2b and Poly1305 leaves) through every I/O mode (io_uring or
 * pread/pwrite, O_DIRECT or through the page cache, and the fallback when
 * the filesystem refuses O_DIRECT), the checksum computed while the payload
 * is read equal to the one computed at once, a flipped byte in any leaf
 * caught, and a header naming an unknown checksum kind refused. */
#include <dirent.h>
#include <fcntl.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cmocka.h>
#include <sodium.h>

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

/* I/O modes: bit 0 gives up io_uring, bit 1 O_DIRECT. */
#define PLAIN 1
#define CACHED 2
#define MODES 4

/* A disk-only store writing kind `kind`, in I/O mode `mode`. */
static kvr_store_t *open_with(unsigned kind, int mode)
{
    kvr_store_opts_t o = {.dir = dir};
    kvr_store_t *st = NULL;
    kvr_error_t err;
    assert_int_equal(kvr_store_open(&o, &st, &err), KVR_OK);
    st->sum_kind = kind;
    if (mode & PLAIN)
        kvr__disk_plain(st);
    if (mode & CACHED)
        st->direct = false;
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

/* Writes a chunk of len bytes, kind, I/O mode; checks the file (the header
 * block, the payload at KVR__CHUNK_DATA, the checksum kvr__chunk_sum gives
 * at once, nothing after it); reads it back in the modes that differ in one
 * bit. */
static void round_trip(uint64_t len, unsigned kind, int mode)
{
    uint32_t n = (uint32_t)(len & 0xff) * 16 + kind * MODES + (uint32_t)mode;
    uint8_t *data = pattern(len, n), *back = malloc(len);
    kvr_chunk_key_t k = key_n(n);
    kvr_store_t *st = open_with(kind, mode);
    kvr_error_t err;
    assert_int_equal(kvr_store_put(st, &k, data, len, &err), KVR_OK);
    kvr_store_close(st);

    char path[256];
    struct stat sb;
    uint8_t *file = malloc(len + KVR__CHUNK_FRAME), want[KVR_STORE_SUM_BYTES];
    chunk_path(&k, path, sizeof path);
    assert_int_equal(stat(path, &sb), 0);
    assert_int_equal(sb.st_size, len + KVR__CHUNK_FRAME);
    read_file(path, file, len + KVR__CHUNK_FRAME);
    assert_int_equal(file[8], KVR__CHUNK_VERSION);
    assert_int_equal(file[12], kind);
    for (uint32_t i = KVR__CHUNK_HEADER; i < KVR__CHUNK_DATA; i++)
        assert_int_equal(file[i], 0);
    assert_memory_equal(file + KVR__CHUNK_DATA, data, len);
    kvr__chunk_sum(file, data, len, want);
    assert_memory_equal(file + KVR__CHUNK_DATA + len, want, sizeof want);

    for (int flip = 1; flip <= 2; flip++) {
        uint64_t got = 0;
        st = open_with(KVR__SUM_DEFAULT, mode ^ flip);
        memset(back, 0, len);
        kvr_status_t rc = kvr_store_get(st, &k, back, len, &got, &err);
        if (rc != KVR_OK)
            fail_msg("mode %d read in mode %d: %s", mode, mode ^ flip, err.msg);
        assert_int_equal(got, len);
        assert_memory_equal(back, data, len);
        kvr_store_stats_t s;
        kvr_store_stats(st, &s);
        assert_int_equal(s.scan_dropped_corrupt, 0);
        kvr_store_close(st);
    }
    free(file);
    free(back);
    free(data);
}

/* A ragged payload (its last O_DIRECT block partial) and one of whole
 * blocks. */
static void test_kinds_and_modes_round_trip(void **state)
{
    (void)state;
    for (unsigned kind = 0; kind < KVR__SUM_KINDS; kind++)
        for (int mode = 0; mode < MODES; mode++) {
            bool dflt = kind == KVR__SUM_DEFAULT;
            if (dflt || mode == 0 || mode == 3)
                round_trip(LEN, kind, mode);
            if (dflt)
                round_trip(2 * KVR__LEAF, kind, mode);
        }
}

/* BLAKE2b-512 leaves unless the store is opened with fast_checksum; io_uring
 * where the kernel allows it; O_DIRECT until the filesystem refuses it. */
static void test_default_is_blake2b_uring_and_direct(void **state)
{
    (void)state;
    for (int fast = 0; fast < 2; fast++) {
        kvr_store_opts_t o = {.dir = dir, .fast_checksum = fast};
        kvr_store_t *st = NULL;
        kvr_error_t err;
        assert_int_equal(kvr_store_open(&o, &st, &err), KVR_OK);
        assert_int_equal(st->sum_kind,
                         fast ? KVR__SUM_POLY1305 : KVR__SUM_BLAKE2B512);
        const char *b = kvr_store_backend(st);
        assert_true(strcmp(b, "io_uring+O_DIRECT") == 0 ||
                    strcmp(b, "pread/pwrite+O_DIRECT") == 0);
        kvr__disk_plain(st);
        assert_string_equal(kvr_store_backend(st), "pread/pwrite+O_DIRECT");
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
    for (unsigned kind = 0; kind < KVR__SUM_KINDS; kind++)
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
            kvr__chunk_set_kind(header, (kind + 1) % KVR__SUM_KINDS);
            kvr__chunk_sum(header, data, lens[i], b);
            assert_memory_not_equal(a, b, sizeof a); /* the kind counts */
            kvr__sum_abort(kvr__sum_start(header, data, lens[i], false));
            kvr__sum_abort(kvr__sum_start(header, data, lens[i], true));
        }
    free(data);
}

/* Kind 2 is BLAKE2b-512 of every leaf, whichever library computed it
 * (OpenSSL where the build has it): the root recomputed with libsodium
 * alone matches. */
static void test_blake2b512_leaves_are_libsodium_s(void **state)
{
    (void)state;
    uint8_t *data = pattern(LEN, 11), header[KVR__CHUNK_HEADER];
    uint8_t got[KVR_STORE_SUM_BYTES], want[KVR_STORE_SUM_BYTES], leaf[64];
    kvr_chunk_key_t k = key_n(2);
    kvr__chunk_header(&k, LEN, header);
    assert_int_equal(header[12], KVR__SUM_BLAKE2B512);
    kvr__chunk_sum(header, data, LEN, got);
    crypto_generichash_state h;
    crypto_generichash_init(&h, NULL, 0, KVR_STORE_SUM_BYTES);
    crypto_generichash_update(&h, header, sizeof header);
    for (uint64_t at = 0; at < LEN; at += KVR__LEAF) {
        uint64_t n = LEN - at < KVR__LEAF ? LEN - at : KVR__LEAF;
        crypto_generichash(leaf, sizeof leaf, data + at, n, NULL, 0);
        crypto_generichash_update(&h, leaf, sizeof leaf);
    }
    crypto_generichash_final(&h, want, sizeof want);
    assert_memory_equal(got, want, sizeof want);
    free(data);
}

/* A flipped byte in the first, a middle and the last leaf, and in the
 * stored checksum: each is a miss counted corrupt, for every kind (the
 * default read with io_uring and O_DIRECT and with neither). */
static void test_flip_in_any_leaf_is_a_miss(void **state)
{
    (void)state;
    const uint64_t at[] = {0, KVR__LEAF + 5, LEN - 1, LEN + 3};
    uint8_t *data = pattern(LEN, 3), *back = malloc(LEN);
    uint32_t n = 100;
    for (unsigned kind = 0; kind < KVR__SUM_KINDS; kind++)
        for (int mode = 0; mode < MODES; mode += 3) /* direct, cached */
            for (size_t i = 0; i < sizeof at / sizeof at[0]; i++, n++) {
                if (mode != 0 && kind != KVR__SUM_DEFAULT)
                    continue; /* the other kinds: one mode is enough */
                kvr_chunk_key_t k = key_n(n);
                kvr_store_t *st = open_with(kind, mode);
                kvr_error_t err;
                assert_int_equal(kvr_store_put(st, &k, data, LEN, &err),
                                 KVR_OK);
                char path[256];
                chunk_path(&k, path, sizeof path);
                patch_file(path, KVR__CHUNK_DATA + at[i], 0x40);
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
    kvr_store_t *st = open_with(KVR__SUM_POLY1305, 0);
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
    st = open_with(KVR__SUM_DEFAULT, 0);
    kvr_store_stats_t s;
    kvr_store_stats(st, &s);
    assert_int_equal(s.scan_dropped_corrupt, 1);
    assert_false(kvr_store_contains(st, &k));
    kvr_store_close(st);
    free(data);
}

/* Pages of the file at path in the page cache. */
static size_t cached_pages(const char *path)
{
    int fd = open(path, O_RDONLY);
    struct stat sb;
    assert_true(fd >= 0 && fstat(fd, &sb) == 0);
    long pg = sysconf(_SC_PAGESIZE);
    size_t pages = ((size_t)sb.st_size + (size_t)pg - 1) / (size_t)pg, n = 0;
    void *m = mmap(NULL, (size_t)sb.st_size, PROT_READ, MAP_SHARED, fd, 0);
    unsigned char *vec = malloc(pages);
    assert_true(m != MAP_FAILED && vec != NULL);
    assert_int_equal(mincore(m, (size_t)sb.st_size, vec), 0);
    for (size_t i = 0; i < pages; i++)
        n += vec[i] & 1;
    munmap(m, (size_t)sb.st_size);
    free(vec);
    close(fd);
    return n;
}

/* O_DIRECT writes leave the payload out of the page cache; a filesystem
 * that refuses O_DIRECT (failpoint store-no-odirect: EINVAL, as tmpfs
 * before Linux 6.6) falls back to cached I/O for the store from then on,
 * and what it wrote reads back in every mode. */
static void test_direct_and_its_fallback(void **state)
{
    (void)state;
    uint8_t *data = pattern(LEN, 41), *back = malloc(LEN);
    size_t pages = (LEN + KVR__CHUNK_FRAME) / 4096;
    kvr_error_t err;
    char path[256];
    for (int refuse = 0; refuse < 2; refuse++) {
        kvr_chunk_key_t k = key_n(700 + (uint32_t)refuse);
        kvr_store_t *st = open_with(KVR__SUM_DEFAULT, 0);
        if (refuse)
            assert_int_equal(kvr_failpoint_arm("store-no-odirect", "", &err),
                             KVR_OK);
        assert_int_equal(kvr_store_put(st, &k, data, LEN, &err), KVR_OK);
        kvr_failpoint_disarm_all();
        assert_int_equal(st->direct, !refuse);
        assert_int_equal(strstr(kvr_store_backend(st), "O_DIRECT") != NULL,
                         !refuse);
        kvr_store_close(st);
        chunk_path(&k, path, sizeof path);
        size_t cached = cached_pages(path);
        if (refuse)
            assert_true(cached > pages / 2);
        else
            assert_true(cached < pages / 2);
        for (int mode = 0; mode < MODES; mode++) {
            uint64_t got = 0;
            st = open_with(KVR__SUM_DEFAULT, mode);
            memset(back, 0, LEN);
            assert_int_equal(kvr_store_get(st, &k, back, LEN, &got, &err),
                             KVR_OK);
            assert_memory_equal(back, data, LEN);
            kvr_store_close(st);
        }
    }
    free(back);
    free(data);
}

/* Files of format version 1 (the payload right after the 80-byte header)
 * still read; a byte flipped in a version 2 header's padding is refused. */
static void test_version1_reads_and_padding_checked(void **state)
{
    (void)state;
    const uint64_t len = 5000;
    uint8_t *data = pattern(len, 43), *back = malloc(len);
    uint8_t file[KVR__CHUNK_HEADER + 5000 + KVR_STORE_SUM_BYTES];
    kvr_chunk_key_t k = key_n(800);
    kvr__chunk_header(&k, len, file);
    file[8] = 1; /* the version, little-endian */
    memcpy(file + KVR__CHUNK_HEADER, data, len);
    kvr__chunk_sum(file, data, len, file + KVR__CHUNK_HEADER + len);
    char path[256];
    chunk_path(&k, path, sizeof path);
    FILE *f = fopen(path, "wb");
    assert_non_null(f);
    assert_int_equal(fwrite(file, 1, sizeof file, f), sizeof file);
    fclose(f);
    kvr_store_t *st = open_with(KVR__SUM_DEFAULT, 0);
    uint64_t got = 0;
    kvr_error_t err;
    assert_int_equal(kvr_store_get(st, &k, back, len, &got, &err), KVR_OK);
    assert_memory_equal(back, data, len);

    kvr_chunk_key_t k2 = key_n(801);
    assert_int_equal(kvr_store_put(st, &k2, data, len, &err), KVR_OK);
    kvr_store_close(st);
    chunk_path(&k2, path, sizeof path);
    patch_file(path, 1000, 0x01);
    uint64_t ok = 0, nbad = 0;
    assert_int_equal(kvr_store_verify(dir, NULL, NULL, &ok, &nbad, &err),
                     KVR_OK);
    assert_int_equal(ok, 1);
    assert_int_equal(nbad, 1);
    st = open_with(KVR__SUM_DEFAULT, 0);
    kvr_store_stats_t s;
    kvr_store_stats(st, &s);
    assert_int_equal(s.scan_dropped_corrupt, 1);
    kvr_store_close(st);
    free(back);
    free(data);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_setup_teardown(test_kinds_and_modes_round_trip, setup,
                                        teardown),
        cmocka_unit_test_setup_teardown(
            test_default_is_blake2b_uring_and_direct, setup, teardown),
        cmocka_unit_test_setup_teardown(test_pipelined_sum_matches, setup,
                                        teardown),
        cmocka_unit_test_setup_teardown(test_blake2b512_leaves_are_libsodium_s,
                                        setup, teardown),
        cmocka_unit_test_setup_teardown(test_flip_in_any_leaf_is_a_miss, setup,
                                        teardown),
        cmocka_unit_test_setup_teardown(test_direct_and_its_fallback, setup,
                                        teardown),
        cmocka_unit_test_setup_teardown(test_version1_reads_and_padding_checked,
                                        setup, teardown),
        cmocka_unit_test_setup_teardown(test_unknown_kind_refused, setup,
                                        teardown),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
