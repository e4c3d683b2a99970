/* The bookkeeping's internal tables against simple reference models:
 * open addressing with backward-shift deletion under forced collisions,
 * and the FIFO tombstone ring with holes. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "book.h"

enum { POOL = 600 };

static char g_names[POOL][16];
static kvr__view_t g_views[POOL];

/* Distinct ids; hash % 8 only, so long probe runs wrap and interleave. */
static void make_pool(void)
{
    for (int i = 0; i < POOL; i++) {
        int len = snprintf(g_names[i], sizeof(g_names[i]), "id-%d", i / 3);
        g_views[i] = (kvr__view_t){(const uint8_t *)g_names[i], (size_t)len,
                                   i % 3 != 0, (uint64_t)(i % 3),
                                   (uint64_t)(i * 7919) % 8};
    }
}

static uint64_t g_rng = 88172645463325252ull;

static uint32_t rnd(uint32_t n)
{
    g_rng ^= g_rng << 13;
    g_rng ^= g_rng >> 7;
    g_rng ^= g_rng << 17;
    return (uint32_t)(g_rng % n);
}

static void test_table_model(void **state)
{
    (void)state;
    enum { MAX = 300 };
    make_pool();
    kvr__table_t t;
    kvr__table_init(&t, MAX);
    kvr__key_t *keys[POOL] = {0};
    size_t count = 0;
    for (int step = 0; step < 200000; step++) {
        int i = (int)rnd(POOL);
        kvr__slot_t *s = kvr__table_find(&t, &g_views[i]);
        assert_true((s != NULL) == (keys[i] != NULL));
        if (s != NULL) {
            assert_ptr_equal(s->key, keys[i]);
            assert_ptr_equal(s->val, &keys[i]);
            if (rnd(2) == 0) {
                kvr__table_remove(&t, s);
                free(keys[i]);
                keys[i] = NULL;
                count--;
            }
        } else if (count == MAX) {
            assert_int_equal(kvr__table_reserve(&t), KVR_ERR_TABLE_FULL);
        } else {
            assert_int_equal(kvr__table_reserve(&t), KVR_OK);
            keys[i] = kvr__key_new(&g_views[i]);
            kvr__table_insert(&t, keys[i], &keys[i]);
            count++;
        }
        assert_int_equal(t.count, count);
        assert_true(t.nslots <= 1024); /* 2 * MAX, rounded up */
    }
    for (int i = 0; i < POOL; i++)
        free(keys[i]);
    kvr__table_fini(&t);
}

/* Reference: the ring as a FIFO list of pool indices, -1 for a hole. */
typedef struct {
    int items[64];
    int n;
} ref_ring_t;

static bool ref_has(const ref_ring_t *r, int id)
{
    for (int k = 0; k < r->n; k++)
        if (r->items[k] == id)
            return true;
    return false;
}

static void ref_add(ref_ring_t *r, int id, int cap)
{
    if (r->n == cap) {
        memmove(r->items, r->items + 1, (size_t)(cap - 1) * sizeof(int));
        r->n--;
    }
    r->items[r->n++] = id;
}

static void test_tombs_model(void **state)
{
    (void)state;
    enum { CAP = 40 };
    make_pool();
    kvr__tombs_t t;
    kvr__tombs_init(&t, CAP);
    ref_ring_t ref = {.n = 0};
    for (int step = 0; step < 100000; step++) {
        int i = (int)rnd(CAP * 3);
        bool has = kvr__tombs_has(&t, &g_views[i]);
        assert_int_equal(has, ref_has(&ref, i));
        if (!has) {
            assert_int_equal(kvr__tombs_reserve(&t), KVR_OK);
            kvr__tombs_add(&t, kvr__key_new(&g_views[i]));
            ref_add(&ref, i, CAP);
        } else if (rnd(4) == 0) {
            assert_true(kvr__tombs_remove(&t, &g_views[i]));
            for (int k = 0; k < ref.n; k++)
                if (ref.items[k] == i)
                    ref.items[k] = -1;
        }
        assert_int_equal(t.used, ref.n);
        assert_true(t.set.count <= CAP);
    }
    assert_false(kvr__tombs_remove(&t, &g_views[POOL - 1]));
    kvr__tombs_fini(&t);
}

static void test_repr(void **state)
{
    (void)state;
    char buf[KVR__REPR_MAX];
    const uint8_t raw[] = {'a', '"', 0, 0xff, '\\'};
    kvr__view_t v = {raw, sizeof(raw), true, 12, 0};
    kvr__view_repr(&v, buf);
    assert_string_equal(buf, "(\"a\\x22\\x00\\xff\\x5c\", 12)");
    uint8_t big[KVR_REQ_ID_MAX];
    memset(big, 'q', sizeof(big));
    v = (kvr__view_t){big, sizeof(big), false, 0, 0};
    kvr__view_repr(&v, buf);
    assert_true(strlen(buf) < KVR__REPR_MAX);
    assert_non_null(strstr(buf, "qqq...\""));
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_table_model),
        cmocka_unit_test(test_tombs_model),
        cmocka_unit_test(test_repr),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
