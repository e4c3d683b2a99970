/* Allocation failure injection (linked with --wrap=malloc,calloc,realloc):
 * every allocation of a bookkeeping call is failed in turn; the call must
 * then return KVR_ERR_NO_MEMORY and leave the object as it was, so that a
 * retry behaves exactly like a first attempt. States are set up at growth
 * boundaries so table, ring and queue growth are all hit. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>

#include <cmocka.h>

#include "kvrelay/completion.h"
#include "oom_wrap.h"

#define ID(s) kvr_completion_req((s), strlen(s))
#define OP(s, g) kvr_completion_op((s), strlen(s), (g))

typedef struct scenario {
    void *(*setup)(void);
    kvr_status_t (*op)(void *obj);
    void (*counts)(void *obj, size_t out[2]);
    void (*check)(void *obj); /* after a successful op */
    void (*destroy)(void *obj);
} scenario_t;

static void run(const scenario_t *sc)
{
    for (long n = 0;; n++) {
        void *obj = sc->setup();
        size_t before[2], after[2];
        sc->counts(obj, before);
        oom_arm(n);
        kvr_status_t s = sc->op(obj);
        oom_disarm();
        if (!oom_fired()) {
            assert_int_equal(s, KVR_OK);
            sc->check(obj);
            sc->destroy(obj);
            assert_true(n > 0); /* the op allocated something */
            return;
        }
        assert_int_equal(s, KVR_ERR_NO_MEMORY);
        sc->counts(obj, after);
        assert_memory_equal(before, after, sizeof(before));
        assert_int_equal(sc->op(obj), KVR_OK); /* the retry succeeds */
        sc->check(obj);
        sc->destroy(obj);
    }
}

/* ---- quorum ---- */

static void report_ok(kvr_quorum_t *q, kvr_completion_id_t id, uint32_t m,
                      kvr_quorum_outcome_t want)
{
    kvr_quorum_result_t r;
    assert_int_equal(kvr_quorum_report(q, &id, m, KVR_OK, &r, NULL), KVR_OK);
    assert_int_equal(r.outcome, want);
}

/* 8 pending keys (the 9th grows the table) and 16 tombstones (the 17th
 * grows the ring). */
static void *quorum_setup(void)
{
    kvr_quorum_params_t p = KVR_QUORUM_PARAMS_INIT;
    p.members = 2;
    kvr_quorum_t *q = NULL;
    assert_int_equal(kvr_quorum_create(&p, &q, NULL), KVR_OK);
    char name[16];
    for (int i = 0; i < 16; i++) {
        snprintf(name, sizeof(name), "done%d", i);
        report_ok(q, OP(name, 0), 0, KVR_QUORUM_PENDING);
        report_ok(q, OP(name, 0), 1, KVR_QUORUM_DONE);
    }
    for (int i = 0; i < 7; i++) {
        snprintf(name, sizeof(name), "p%d", i);
        report_ok(q, OP(name, 0), 0, KVR_QUORUM_PENDING);
    }
    report_ok(q, OP("A", 1), 0, KVR_QUORUM_PENDING);
    return q;
}

static void quorum_counts(void *obj, size_t out[2])
{
    out[0] = kvr_quorum_num_pending(obj);
    out[1] = kvr_quorum_num_tombstones(obj);
}

static void quorum_destroy(void *obj)
{
    kvr_quorum_destroy(obj);
}

static kvr_status_t op_complete(void *obj)
{
    kvr_completion_id_t id = OP("A", 1);
    return kvr_quorum_report(obj, &id, 1, KVR_OK, NULL, NULL);
}

static void check_complete(void *obj)
{
    report_ok(obj, OP("A", 1), 0, KVR_QUORUM_IGNORED);
    assert_int_equal(kvr_quorum_num_pending(obj), 7);
}

static kvr_status_t op_new_key(void *obj)
{
    kvr_completion_id_t id = OP("B", 0);
    return kvr_quorum_report(obj, &id, 0, KVR_OK, NULL, NULL);
}

static void check_new_key(void *obj)
{
    assert_int_equal(kvr_quorum_num_pending(obj), 9);
    report_ok(obj, OP("B", 0), 1, KVR_QUORUM_DONE);
}

static kvr_status_t op_cancel(void *obj)
{
    kvr_completion_id_t id = OP("A", 1);
    return kvr_quorum_cancel(obj, &id, NULL);
}

static void check_cancel(void *obj)
{
    assert_int_equal(kvr_quorum_num_pending(obj), 7);
    report_ok(obj, OP("A", 1), 1, KVR_QUORUM_IGNORED);
}

static void test_quorum_oom(void **state)
{
    (void)state;
    const scenario_t sc[] = {
        {quorum_setup, op_complete, quorum_counts, check_complete,
         quorum_destroy},
        {quorum_setup, op_new_key, quorum_counts, check_new_key,
         quorum_destroy},
        {quorum_setup, op_cancel, quorum_counts, check_cancel, quorum_destroy},
    };
    for (size_t i = 0; i < sizeof(sc) / sizeof(sc[0]); i++)
        run(&sc[i]);
}

/* ---- pairing ---- */

static void feed(kvr_pairing_t *p, bool is_send, kvr_completion_id_t id)
{
    kvr_status_t s = is_send
                         ? kvr_pairing_send_done(p, &id, KVR_OK, NULL, NULL)
                         : kvr_pairing_save_done(p, &id, KVR_OK, NULL, NULL);
    assert_int_equal(s, KVR_OK);
}

/* 16 unpolled events and 16 released requests (the next of each grows),
 * 8 live requests (the 9th grows the table); R has a held send. */
static void *pairing_setup(void)
{
    kvr_pairing_params_t prm = KVR_PAIRING_PARAMS_INIT;
    kvr_pairing_t *p = NULL;
    assert_int_equal(kvr_pairing_create(&prm, &p, NULL), KVR_OK);
    char name[16];
    for (int i = 0; i < 16; i++) {
        snprintf(name, sizeof(name), "s%d", i);
        feed(p, true, ID(name));
    }
    for (int i = 0; i < 7; i++) {
        snprintf(name, sizeof(name), "w%d", i);
        kvr_completion_id_t id = OP(name, 0);
        assert_int_equal(kvr_pairing_expect_save(p, &id, NULL), KVR_OK);
    }
    kvr_completion_id_t r = OP("R", 0);
    assert_int_equal(kvr_pairing_expect_save(p, &r, NULL), KVR_OK);
    feed(p, true, ID("R"));
    return p;
}

static void pairing_counts(void *obj, size_t out[2])
{
    out[0] = kvr_pairing_num_requests(obj);
    out[1] = kvr_pairing_num_events(obj);
}

static void pairing_destroy(void *obj)
{
    kvr_pairing_destroy(obj);
}

static kvr_status_t op_release_pair(void *obj)
{
    kvr_completion_id_t id = OP("R", 0);
    return kvr_pairing_save_done(obj, &id, KVR_OK, NULL, NULL);
}

static void check_release_pair(void *obj)
{
    assert_int_equal(kvr_pairing_num_events(obj), 18);
    assert_int_equal(kvr_pairing_num_requests(obj), 7);
    kvr_pair_outcome_t o;
    kvr_completion_id_t id = ID("R");
    assert_int_equal(kvr_pairing_send_done(obj, &id, KVR_OK, &o, NULL), KVR_OK);
    assert_int_equal(o, KVR_PAIR_DUPLICATE);
}

static kvr_status_t op_declare(void *obj)
{
    kvr_completion_id_t id = OP("N", 0);
    return kvr_pairing_expect_save(obj, &id, NULL);
}

static void check_declare(void *obj)
{
    assert_int_equal(kvr_pairing_num_requests(obj), 9);
}

static kvr_status_t op_hold(void *obj)
{
    kvr_completion_id_t id = ID("w3");
    return kvr_pairing_send_done(obj, &id, KVR_OK, NULL, NULL);
}

static void check_hold(void *obj)
{
    assert_int_equal(kvr_pairing_num_events(obj), 16);
    feed(obj, false, OP("w3", 0));
    assert_int_equal(kvr_pairing_num_events(obj), 18);
}

static kvr_status_t op_send_free(void *obj)
{
    kvr_completion_id_t id = ID("free");
    return kvr_pairing_send_done(obj, &id, KVR_OK, NULL, NULL);
}

static void check_send_free(void *obj)
{
    assert_int_equal(kvr_pairing_num_events(obj), 17);
}

static kvr_status_t op_save_early(void *obj)
{
    kvr_completion_id_t id = OP("early", 2);
    return kvr_pairing_save_done(obj, &id, KVR_OK, NULL, NULL);
}

static void check_save_early(void *obj)
{
    assert_int_equal(kvr_pairing_num_events(obj), 17);
    assert_int_equal(kvr_pairing_num_requests(obj), 9);
}

static void test_pairing_oom(void **state)
{
    (void)state;
    const scenario_t sc[] = {
        {pairing_setup, op_release_pair, pairing_counts, check_release_pair,
         pairing_destroy},
        {pairing_setup, op_declare, pairing_counts, check_declare,
         pairing_destroy},
        {pairing_setup, op_hold, pairing_counts, check_hold, pairing_destroy},
        {pairing_setup, op_send_free, pairing_counts, check_send_free,
         pairing_destroy},
        {pairing_setup, op_save_early, pairing_counts, check_save_early,
         pairing_destroy},
    };
    for (size_t i = 0; i < sizeof(sc) / sizeof(sc[0]); i++)
        run(&sc[i]);
}

/* Creation and the offload key fail cleanly too (no leak under ASan). */
static void test_create_and_key_oom(void **state)
{
    (void)state;
    static const char *const types[] = {"full"};
    kvr_offload_desc_t d = {.model_tag = "m",
                            .dtype = "fp8",
                            .block_size = 16,
                            .chunk_size = 64,
                            .tp = 4,
                            .dcp_size = 4,
                            .interleave = 1,
                            .indexer_types = types,
                            .num_indexer_types = 1};
    kvr_quorum_params_t qp = KVR_QUORUM_PARAMS_INIT;
    kvr_pairing_params_t pp = KVR_PAIRING_PARAMS_INIT;
    for (long n = 0; n < 4; n++) {
        char key[33] = "x";
        kvr_quorum_t *q = NULL;
        kvr_pairing_t *p = NULL;
        oom_arm(n);
        kvr_status_t a = kvr_quorum_create(&qp, &q, NULL);
        oom_arm(n);
        kvr_status_t b = kvr_pairing_create(&pp, &p, NULL);
        oom_arm(n);
        kvr_status_t c = kvr_offload_key(&d, key, NULL);
        oom_disarm();
        assert_true(a == KVR_OK || (a == KVR_ERR_NO_MEMORY && q == NULL));
        assert_true(b == KVR_OK || (b == KVR_ERR_NO_MEMORY && p == NULL));
        assert_true(c == KVR_OK ||
                    (c == KVR_ERR_NO_MEMORY && strcmp(key, "x") == 0));
        kvr_quorum_destroy(q);
        kvr_pairing_destroy(p);
    }
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_quorum_oom),
        cmocka_unit_test(test_pairing_oom),
        cmocka_unit_test(test_create_and_key_oom),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
