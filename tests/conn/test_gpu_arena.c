/* The agent's region arena (src/conn/gpu_arena.h) over the tests' emulated
 * GPU path, whose chunks are 1 MiB with regions 256 bytes apart. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include <cmocka.h>

#include "gpu_arena.h"
#include "gpu_path.h"

static uint64_t chunk_bytes(void)
{
    uint64_t chunk = 0, align = 0;
    kvr__gpu_chunking(&chunk, &align);
    return chunk;
}

static kvr__gpu_arena_t arena(uint64_t chunk)
{
    kvr__gpu_arena_t ar;
    kvr__gpu_arena_init(&ar);
    ar.chunk = chunk;
    return ar;
}

static unsigned char *carve(kvr__gpu_arena_t *ar, uint64_t len)
{
    void *p = NULL;
    kvr_error_t err = {0};
    assert_int_equal(kvr__gpu_arena_alloc(ar, 0, len, &p, &err), KVR_OK);
    assert_non_null(p);
    memset(p, 0x5a, len); /* all of it is ours (ASan checks) */
    return p;
}

/* Regions share a chunk, each at the next aligned offset. */
static void test_regions_share_a_chunk(void **state)
{
    (void)state;
    kvr__gpu_arena_t ar = arena(chunk_bytes());
    unsigned char *a = carve(&ar, 1000), *b = carve(&ar, 24), *c = carve(&ar, 256);
    assert_int_equal(ar.n, 1);
    assert_ptr_equal(b, a + 1024);
    assert_ptr_equal(c, b + 256);
    kvr__gpu_arena_free(&ar);
    assert_int_equal(ar.n, 0);
}

/* A region that does not fit the chunk's rest opens a new chunk; one
 * larger than a chunk gets a chunk of its own size. */
static void test_new_chunks(void **state)
{
    (void)state;
    uint64_t C = chunk_bytes();
    kvr__gpu_arena_t ar = arena(C);
    unsigned char *a = carve(&ar, C - 512);
    unsigned char *b = carve(&ar, 1024);
    assert_int_equal(ar.n, 2);
    assert_true(b < a || b >= a + C); /* not inside the first chunk */
    unsigned char *big = carve(&ar, 3 * C + 7);
    assert_int_equal(ar.n, 3);
    assert_int_equal(ar.chunks[2].size, 3 * C + 256);
    assert_ptr_equal(big, ar.chunks[2].base);
    kvr__gpu_arena_free(&ar);
}

/* Only the last carve comes back: a region that failed to come up. */
static void test_undo_last_only(void **state)
{
    (void)state;
    kvr__gpu_arena_t ar = arena(chunk_bytes());
    unsigned char *a = carve(&ar, 300), *b = carve(&ar, 300);
    kvr__gpu_arena_undo(&ar, a, 300); /* not the last: stays */
    assert_int_equal(ar.chunks[0].used, 1024);
    kvr__gpu_arena_undo(&ar, b, 300);
    assert_int_equal(ar.chunks[0].used, 512);
    assert_ptr_equal(carve(&ar, 10), b); /* its place is reused */
    kvr__gpu_arena_free(&ar);
}

/* A length that would wrap when rounded up is refused, naming it. */
static void test_huge_refused(void **state)
{
    (void)state;
    kvr__gpu_arena_t ar = arena(chunk_bytes());
    void *p = NULL;
    kvr_error_t err = {0};
    assert_int_equal(kvr__gpu_arena_alloc(&ar, 0, UINT64_MAX - 3, &p, &err),
                     KVR_ERR_INVALID);
    assert_non_null(strstr(err.msg, "18446744073709551612"));
    assert_int_equal(ar.n, 0);
}

/* Chunks of 0 bytes: one allocation a region, each of its own length
 * (KVR_AGENT_GPU_CHUNK_MB=0), rounded up to the alignment. */
static void test_no_chunks(void **state)
{
    (void)state;
    kvr__gpu_arena_t ar = arena(0);
    carve(&ar, 1000);
    carve(&ar, 10);
    assert_int_equal(ar.n, 2);
    assert_int_equal(ar.chunks[0].size, 1024);
    assert_int_equal(ar.chunks[1].size, 256);
    kvr__gpu_arena_free(&ar);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_regions_share_a_chunk),
        cmocka_unit_test(test_new_chunks),
        cmocka_unit_test(test_undo_last_only),
        cmocka_unit_test(test_huge_refused),
        cmocka_unit_test(test_no_chunks),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
