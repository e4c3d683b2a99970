/* Completion ids and the TP/PP quorum (docs/design.md §8). */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>

#include <cmocka.h>

#include "kvrelay/completion.h"

#define ID(s) kvr_completion_req((s), strlen(s))
#define OP(s, g) kvr_completion_op((s), strlen(s), (g))

static void expect_err(kvr_status_t got, const kvr_error_t *err,
                       kvr_status_t code, const char *needle)
{
    assert_int_equal(got, code);
    assert_int_equal(err->code, code);
    if (strstr(err->msg, needle) == NULL)
        fail_msg("message '%s' lacks '%s'", err->msg, needle);
}

static kvr_quorum_t *make(uint32_t members, size_t pending, size_t tombs,
                          bool bare)
{
    kvr_quorum_params_t p = KVR_QUORUM_PARAMS_INIT;
    p.members = members;
    p.max_pending = pending;
    p.tombstones = tombs;
    p.tombstone_requests = bare;
    kvr_quorum_t *q = NULL;
    kvr_error_t err = {0};
    assert_int_equal(kvr_quorum_create(&p, &q, &err), KVR_OK);
    assert_non_null(q);
    return q;
}

/* Reports and checks the outcome and final status. */
static void report(kvr_quorum_t *q, kvr_completion_id_t id, uint32_t member,
                   kvr_status_t status, kvr_quorum_outcome_t outcome,
                   kvr_status_t final)
{
    kvr_quorum_result_t res;
    kvr_error_t err = {0};
    assert_int_equal(kvr_quorum_report(q, &id, member, status, &res, &err),
                     KVR_OK);
    assert_int_equal(res.outcome, outcome);
    if (outcome != KVR_QUORUM_IGNORED)
        assert_int_equal(res.status, final);
}

static void test_id_check(void **state)
{
    (void)state;
    kvr_error_t err = {0};
    kvr_completion_id_t id = ID("req-1");
    assert_int_equal(kvr_completion_id_check(&id, &err), KVR_OK);
    id = OP("req-1", KVR_GENERATION_MAX);
    assert_int_equal(kvr_completion_id_check(&id, &err), KVR_OK);
    id = OP("req-1", -1);
    expect_err(kvr_completion_id_check(&id, &err), &err, KVR_ERR_INVALID,
               "generation -1");
    id = OP("req-1", KVR_GENERATION_MAX + 1);
    expect_err(kvr_completion_id_check(&id, &err), &err, KVR_ERR_INVALID,
               "generation 9007199254740992 outside");
    id = ID("req-1");
    id.generation = 3;
    expect_err(kvr_completion_id_check(&id, &err), &err, KVR_ERR_INVALID,
               "bare request id with generation 3");
    id = kvr_completion_req("", 0);
    expect_err(kvr_completion_id_check(&id, &err), &err, KVR_ERR_INVALID,
               "length 0");
    char big[KVR_REQ_ID_MAX + 1];
    memset(big, 'x', sizeof(big));
    id = kvr_completion_req(big, sizeof(big));
    expect_err(kvr_completion_id_check(&id, &err), &err, KVR_ERR_INVALID,
               "length 257 outside 1..256");
    id.req_id_len = KVR_REQ_ID_MAX;
    assert_int_equal(kvr_completion_id_check(&id, NULL), KVR_OK);
    id = kvr_completion_req(NULL, 4);
    expect_err(kvr_completion_id_check(&id, &err), &err, KVR_ERR_INVALID,
               "NULL");
    expect_err(kvr_completion_id_check(NULL, &err), &err, KVR_ERR_INVALID,
               "NULL");
}

static void test_req_key(void **state)
{
    (void)state;
    const char raw[] = {'r', 0, 'q'}; /* ids are bytes, NULs included */
    kvr_completion_id_t op = kvr_completion_op(raw, 3, 7), key = {0};
    assert_int_equal(kvr_completion_req_key(&op, &key, NULL), KVR_OK);
    assert_false(key.is_op);
    assert_int_equal(key.generation, 0);
    assert_int_equal(key.req_id_len, 3);
    assert_memory_equal(key.req_id, raw, 3);
    kvr_completion_id_t bare = kvr_completion_req(raw, 3), key2 = {0};
    assert_int_equal(kvr_completion_req_key(&bare, &key2, NULL), KVR_OK);
    assert_ptr_equal(key.req_id, key2.req_id);
    assert_int_equal(key.req_id_len, key2.req_id_len);
    assert_int_equal(key.is_op, key2.is_op);
    assert_int_equal(key.generation, key2.generation);
    kvr_error_t err = {0};
    op.generation = -2;
    key.req_id_len = 99;
    expect_err(kvr_completion_req_key(&op, &key, &err), &err, KVR_ERR_INVALID,
               "generation -2");
    assert_int_equal(key.req_id_len, 99); /* untouched on error */
}

static void test_tp_quorum(void **state)
{
    (void)state;
    kvr_quorum_t *q = make(4, 16, 16, true);
    for (uint32_t w = 0; w < 3; w++)
        report(q, ID("r1"), w, KVR_OK, KVR_QUORUM_PENDING, KVR_OK);
    assert_int_equal(kvr_quorum_num_pending(q), 1);
    kvr_quorum_result_t res;
    kvr_completion_id_t id = ID("r1");
    assert_int_equal(kvr_quorum_report(q, &id, 3, KVR_OK, &res, NULL), KVR_OK);
    assert_int_equal(res.outcome, KVR_QUORUM_DONE);
    assert_int_equal(res.status, KVR_OK);
    assert_int_equal(res.reported, 4);
    assert_int_equal(kvr_quorum_num_pending(q), 0);
    /* a late duplicate of the finished bare id is ignored */
    report(q, ID("r1"), 2, KVR_OK, KVR_QUORUM_IGNORED, KVR_OK);
    assert_int_equal(kvr_quorum_num_pending(q), 0);
    kvr_quorum_destroy(q);
    kvr_quorum_destroy(NULL);
}

static void test_failure_dominates(void **state)
{
    (void)state;
    kvr_quorum_t *q = make(3, 16, 16, true);
    /* a worker's repeated reports AND together, and count once */
    report(q, ID("a"), 0, KVR_ERR_TRANSPORT, KVR_QUORUM_PENDING,
           KVR_ERR_TRANSPORT);
    kvr_quorum_result_t res;
    kvr_completion_id_t id = ID("a");
    assert_int_equal(kvr_quorum_report(q, &id, 0, KVR_OK, &res, NULL), KVR_OK);
    assert_int_equal(res.outcome, KVR_QUORUM_PENDING);
    assert_int_equal(res.reported, 1);
    assert_int_equal(res.status, KVR_ERR_TRANSPORT);
    report(q, ID("a"), 1, KVR_OK, KVR_QUORUM_PENDING, KVR_ERR_TRANSPORT);
    report(q, ID("a"), 2, KVR_OK, KVR_QUORUM_DONE, KVR_ERR_TRANSPORT);
    /* the first failure is the one reported */
    report(q, ID("b"), 2, KVR_ERR_TIMEOUT, KVR_QUORUM_PENDING, KVR_ERR_TIMEOUT);
    report(q, ID("b"), 0, KVR_ERR_PEER_DEAD, KVR_QUORUM_PENDING,
           KVR_ERR_TIMEOUT);
    report(q, ID("b"), 1, KVR_OK, KVR_QUORUM_DONE, KVR_ERR_TIMEOUT);
    /* a failure on the completing report wins too */
    report(q, ID("c"), 0, KVR_OK, KVR_QUORUM_PENDING, KVR_OK);
    report(q, ID("c"), 1, KVR_OK, KVR_QUORUM_PENDING, KVR_OK);
    report(q, ID("c"), 2, KVR_ERR_IO, KVR_QUORUM_DONE, KVR_ERR_IO);
    kvr_quorum_destroy(q);
}

/* PP quorum over 4 stages: a load failure is emitted only once every stage
 * answered, and exactly once. */
static void test_pp_load_failure_waits(void **state)
{
    (void)state;
    kvr_quorum_t *q = make(4, 16, 16, true);
    report(q, OP("r", 0), 1, KVR_ERR_IO, KVR_QUORUM_PENDING, KVR_ERR_IO);
    report(q, OP("r", 0), 0, KVR_OK, KVR_QUORUM_PENDING, KVR_ERR_IO);
    report(q, OP("r", 0), 2, KVR_OK, KVR_QUORUM_PENDING, KVR_ERR_IO);
    report(q, OP("r", 0), 3, KVR_OK, KVR_QUORUM_DONE, KVR_ERR_IO);
    for (uint32_t s = 0; s < 4; s++)
        report(q, OP("r", 0), s, KVR_ERR_IO, KVR_QUORUM_IGNORED, KVR_OK);
    /* saves: complete when every stage reported */
    for (uint32_t s = 0; s < 3; s++)
        report(q, OP("r", 1), s, KVR_OK, KVR_QUORUM_PENDING, KVR_OK);
    report(q, OP("r", 1), 3, KVR_OK, KVR_QUORUM_DONE, KVR_OK);
    kvr_quorum_destroy(q);
}

static void test_generations_distinct(void **state)
{
    (void)state;
    kvr_quorum_t *q = make(2, 16, 16, true);
    report(q, OP("r", 0), 0, KVR_OK, KVR_QUORUM_PENDING, KVR_OK);
    report(q, OP("r", 1), 1, KVR_OK, KVR_QUORUM_PENDING, KVR_OK);
    report(q, ID("r"), 1, KVR_OK, KVR_QUORUM_PENDING, KVR_OK);
    assert_int_equal(kvr_quorum_num_pending(q), 3);
    report(q, OP("r", 0), 1, KVR_OK, KVR_QUORUM_DONE, KVR_OK);
    /* (r, 0) finishing neither completes nor tombstones (r, 1) or r */
    report(q, OP("r", 0), 0, KVR_OK, KVR_QUORUM_IGNORED, KVR_OK);
    report(q, OP("r", 1), 1, KVR_OK, KVR_QUORUM_PENDING, KVR_OK);
    report(q, OP("r", 1), 0, KVR_ERR_IO, KVR_QUORUM_DONE, KVR_ERR_IO);
    report(q, ID("r"), 0, KVR_OK, KVR_QUORUM_DONE, KVR_OK);
    report(q, OP("r", 2), 0, KVR_OK, KVR_QUORUM_PENDING, KVR_OK);
    kvr_quorum_destroy(q);
}

static void test_tombstones_fifo(void **state)
{
    (void)state;
    kvr_quorum_t *q = make(1, 16, 3, true);
    const char *ids[] = {"A", "B", "C", "D"};
    for (int i = 0; i < 4; i++)
        report(q, OP(ids[i], 5), 0, KVR_OK, KVR_QUORUM_DONE, KVR_OK);
    assert_int_equal(kvr_quorum_num_tombstones(q), 3);
    for (int i = 1; i < 4; i++)
        report(q, OP(ids[i], 5), 0, KVR_OK, KVR_QUORUM_IGNORED, KVR_OK);
    /* A was evicted first: the bound is what lets it through again */
    report(q, OP("A", 5), 0, KVR_OK, KVR_QUORUM_DONE, KVR_OK);
    report(q, OP("B", 5), 0, KVR_OK, KVR_QUORUM_DONE, KVR_OK);
    report(q, OP("D", 5), 0, KVR_OK, KVR_QUORUM_IGNORED, KVR_OK);
    assert_int_equal(kvr_quorum_num_tombstones(q), 3);
    /* many more: the count never exceeds the capacity */
    for (int i = 0; i < 1000; i++) {
        char name[16];
        snprintf(name, sizeof(name), "k%d", i);
        report(q, OP(name, 0), 0, KVR_OK, KVR_QUORUM_DONE, KVR_OK);
        assert_true(kvr_quorum_num_tombstones(q) <= 3);
    }
    kvr_quorum_destroy(q);
}

/* Bare ids: tombstoned by default (late WRITE_DONE-derived duplicates are
 * dropped); with tombstone_requests off they behave as in the seed system. */
static void test_bare_id_tombstones(void **state)
{
    (void)state;
    kvr_quorum_t *q = make(2, 16, 16, false);
    report(q, ID("r"), 0, KVR_OK, KVR_QUORUM_PENDING, KVR_OK);
    report(q, ID("r"), 1, KVR_OK, KVR_QUORUM_DONE, KVR_OK);
    assert_int_equal(kvr_quorum_num_tombstones(q), 0);
    report(q, ID("r"), 1, KVR_OK, KVR_QUORUM_PENDING, KVR_OK);
    /* operation ids are tombstoned either way */
    report(q, OP("r", 0), 0, KVR_OK, KVR_QUORUM_PENDING, KVR_OK);
    report(q, OP("r", 0), 1, KVR_OK, KVR_QUORUM_DONE, KVR_OK);
    report(q, OP("r", 0), 1, KVR_OK, KVR_QUORUM_IGNORED, KVR_OK);
    kvr_quorum_destroy(q);
}

static void test_pending_cap(void **state)
{
    (void)state;
    kvr_quorum_t *q = make(2, 2, 16, true);
    kvr_error_t err = {0};
    report(q, OP("a", 0), 0, KVR_OK, KVR_QUORUM_PENDING, KVR_OK);
    report(q, OP("b", 0), 0, KVR_OK, KVR_QUORUM_PENDING, KVR_OK);
    kvr_completion_id_t c = OP("c", 9);
    kvr_quorum_result_t res = {.outcome = 77};
    expect_err(kvr_quorum_report(q, &c, 0, KVR_OK, &res, &err), &err,
               KVR_ERR_TABLE_FULL, "(\"c\", 9): table full (max_pending 2");
    assert_int_equal(res.outcome, 77);
    assert_int_equal(kvr_quorum_num_pending(q), 2);
    /* known keys still progress when the table is full */
    report(q, OP("a", 0), 1, KVR_OK, KVR_QUORUM_DONE, KVR_OK);
    /* the slot a finished key freed takes the rejected key */
    report(q, OP("c", 9), 0, KVR_OK, KVR_QUORUM_PENDING, KVR_OK);
    report(q, OP("c", 9), 1, KVR_OK, KVR_QUORUM_DONE, KVR_OK);
    report(q, OP("b", 0), 1, KVR_OK, KVR_QUORUM_DONE, KVR_OK);
    assert_int_equal(kvr_quorum_num_pending(q), 0);
    kvr_quorum_destroy(q);
}

static void test_cancel_forget(void **state)
{
    (void)state;
    kvr_quorum_t *q = make(2, 16, 16, true);
    kvr_completion_id_t r = ID("r"), s = OP("s", 1);
    report(q, r, 0, KVR_OK, KVR_QUORUM_PENDING, KVR_OK);
    assert_int_equal(kvr_quorum_cancel(q, &r, NULL), KVR_OK);
    assert_int_equal(kvr_quorum_num_pending(q), 0);
    report(q, r, 1, KVR_OK, KVR_QUORUM_IGNORED, KVR_OK);
    assert_int_equal(kvr_quorum_cancel(q, &s, NULL), KVR_OK); /* unknown */
    assert_int_equal(kvr_quorum_cancel(q, &s, NULL), KVR_OK); /* twice */
    report(q, s, 0, KVR_OK, KVR_QUORUM_IGNORED, KVR_OK);
    /* forget: a re-issued id counts from scratch */
    assert_int_equal(kvr_quorum_forget(q, &r, NULL), KVR_OK);
    report(q, r, 1, KVR_OK, KVR_QUORUM_PENDING, KVR_OK);
    assert_int_equal(kvr_quorum_forget(q, &r, NULL), KVR_OK);
    assert_int_equal(kvr_quorum_num_pending(q), 0);
    report(q, r, 0, KVR_OK, KVR_QUORUM_PENDING, KVR_OK);
    report(q, r, 1, KVR_OK, KVR_QUORUM_DONE, KVR_OK);
    kvr_quorum_destroy(q);
}

static void test_errors(void **state)
{
    (void)state;
    kvr_error_t err = {0};
    kvr_quorum_t *q = (kvr_quorum_t *)&err;
    kvr_quorum_params_t p = KVR_QUORUM_PARAMS_INIT;
    p.members = 0;
    expect_err(kvr_quorum_create(&p, &q, &err), &err, KVR_ERR_INVALID,
               "members 0 outside 1..4096");
    p.members = 5000;
    expect_err(kvr_quorum_create(&p, &q, &err), &err, KVR_ERR_INVALID,
               "members 5000");
    p.members = 2;
    p.max_pending = 0;
    expect_err(kvr_quorum_create(&p, &q, &err), &err, KVR_ERR_INVALID,
               "max_pending 0");
    p.max_pending = 8;
    p.tombstones = (size_t)KVR_BOOK_MAX_ENTRIES + 1;
    expect_err(kvr_quorum_create(&p, &q, &err), &err, KVR_ERR_INVALID,
               "tombstones 4194305");
    assert_ptr_equal(q, (kvr_quorum_t *)&err); /* out untouched */
    expect_err(kvr_quorum_create(NULL, &q, &err), &err, KVR_ERR_INVALID,
               "NULL");
    q = make(4, 8, 8, true);
    kvr_completion_id_t id = ID("r");
    expect_err(kvr_quorum_report(q, &id, 4, KVR_OK, NULL, &err), &err,
               KVR_ERR_INVALID, "member 4 outside 0..3");
    id = OP("r", -5);
    expect_err(kvr_quorum_report(q, &id, 0, KVR_OK, NULL, &err), &err,
               KVR_ERR_INVALID, "generation -5");
    expect_err(kvr_quorum_report(NULL, &id, 0, KVR_OK, NULL, &err), &err,
               KVR_ERR_INVALID, "NULL");
    expect_err(kvr_quorum_cancel(q, NULL, &err), &err, KVR_ERR_INVALID, "NULL");
    expect_err(kvr_quorum_forget(NULL, &id, &err), &err, KVR_ERR_INVALID,
               "NULL");
    assert_int_equal(kvr_quorum_num_pending(q), 0);
    assert_int_equal(kvr_quorum_num_pending(NULL), 0);
    kvr_quorum_destroy(q);
}

/* Many keys, interleaved members, a world of 130 (three bitmap words). */
static void test_many_keys(void **state)
{
    (void)state;
    enum { KEYS = 2000, MEMBERS = 130 };
    kvr_quorum_t *q = make(MEMBERS, KEYS, 512, true);
    char name[32];
    int done = 0;
    for (uint32_t m = 0; m < MEMBERS; m++) {
        for (int k = 0; k < KEYS; k++) {
            snprintf(name, sizeof(name), "request-%d", k);
            kvr_completion_id_t id = OP(name, k % 3);
            kvr_quorum_result_t res;
            uint32_t member = (m + (uint32_t)k) % MEMBERS;
            assert_int_equal(
                kvr_quorum_report(q, &id, member, KVR_OK, &res, NULL), KVR_OK);
            done += res.outcome == KVR_QUORUM_DONE;
            assert_int_equal(res.outcome, m + 1 == MEMBERS
                                              ? KVR_QUORUM_DONE
                                              : KVR_QUORUM_PENDING);
        }
    }
    assert_int_equal(done, KEYS);
    assert_int_equal(kvr_quorum_num_pending(q), 0);
    assert_int_equal(kvr_quorum_num_tombstones(q), 512);
    kvr_quorum_destroy(q);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_id_check),
        cmocka_unit_test(test_req_key),
        cmocka_unit_test(test_tp_quorum),
        cmocka_unit_test(test_failure_dominates),
        cmocka_unit_test(test_pp_load_failure_waits),
        cmocka_unit_test(test_generations_distinct),
        cmocka_unit_test(test_tombstones_fifo),
        cmocka_unit_test(test_bare_id_tombstones),
        cmocka_unit_test(test_pending_cap),
        cmocka_unit_test(test_cancel_forget),
        cmocka_unit_test(test_errors),
        cmocka_unit_test(test_many_keys),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
