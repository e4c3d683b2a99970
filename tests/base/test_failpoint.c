/* Failpoints: arming by name and key, the checks, the exit, and checks from
 * threads while another thread arms. */
#include <pthread.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cmocka.h>

#include "base_internal.h"

static bool hit(kvr__fp_t fp, const char *key)
{
    return kvr__failpoint(fp, key, strlen(key));
}

static int disarm(void **state)
{
    (void)state;
    kvr_failpoint_disarm_all();
    return 0;
}

static void test_names(void **state)
{
    (void)state;
    uint32_t n = 0;
    while (kvr_failpoint_name(n) != NULL)
        n++;
    assert_int_equal(n, KVR__FP_COUNT);
    assert_string_equal(kvr_failpoint_name(KVR__FP_DIE_MID), "die-mid");
    assert_string_equal(kvr_failpoint_name(KVR__FP_BAD_BLOCKS), "bad-blocks");
}

static void test_off_until_armed(void **state)
{
    (void)state;
    for (int fp = 0; fp < KVR__FP_COUNT; fp++)
        assert_false(hit((kvr__fp_t)fp, "req-1"));
}

static void test_arm_by_key(void **state)
{
    (void)state;
    assert_int_equal(kvr_failpoint_arm("refuse", "req-1", NULL), KVR_OK);
    assert_true(hit(KVR__FP_REFUSE, "req-1"));
    assert_false(hit(KVR__FP_REFUSE, "req-10"));
    assert_false(hit(KVR__FP_REFUSE, "req-"));
    assert_false(hit(KVR__FP_DUP_DONE, "req-1")); /* only the one armed */
    /* arming again replaces the key */
    assert_int_equal(kvr_failpoint_arm("refuse", "req-2", NULL), KVR_OK);
    assert_false(hit(KVR__FP_REFUSE, "req-1"));
    assert_true(hit(KVR__FP_REFUSE, "req-2"));
    /* an empty key: every request */
    assert_int_equal(kvr_failpoint_arm("dup-done", "", NULL), KVR_OK);
    assert_true(hit(KVR__FP_DUP_DONE, "anything"));
    assert_true(hit(KVR__FP_DUP_DONE, ""));
    kvr_failpoint_disarm_all();
    assert_false(hit(KVR__FP_REFUSE, "req-2"));
    assert_false(hit(KVR__FP_DUP_DONE, "anything"));
}

static void test_bad_arguments(void **state)
{
    (void)state;
    kvr_error_t err = {0};
    assert_int_equal(kvr_failpoint_arm("die-later", "x", &err),
                     KVR_ERR_NOT_FOUND);
    assert_non_null(strstr(err.msg, "'die-later'"));
    assert_int_equal(kvr_failpoint_arm(NULL, "x", &err), KVR_ERR_NOT_FOUND);
    char key[KVR_FAILPOINT_KEY_MAX + 1];
    memset(key, 'k', sizeof(key) - 1);
    key[sizeof(key) - 1] = '\0';
    assert_int_equal(kvr_failpoint_arm("refuse", key, &err), KVR_ERR_INVALID);
    char want[64];
    snprintf(want, sizeof want, "%d bytes, at most %d", KVR_FAILPOINT_KEY_MAX,
             KVR_FAILPOINT_KEY_MAX - 1);
    assert_non_null(strstr(err.msg, want));
    key[KVR_FAILPOINT_KEY_MAX - 1] = '\0'; /* the longest that fits */
    assert_int_equal(kvr_failpoint_arm("refuse", key, &err), KVR_OK);
    assert_true(hit(KVR__FP_REFUSE, key));
}

static void test_exit_is_a_kill(void **state)
{
    (void)state;
    pid_t pid = fork();
    assert_true(pid >= 0);
    if (pid == 0)
        kvr__failpoint_exit();
    int status = 0;
    assert_int_equal(waitpid(pid, &status, 0), pid);
    assert_true(WIFEXITED(status));
    assert_int_equal(WEXITSTATUS(status), 9);
}

/* Readers check while the main thread re-arms with other keys: a check
 * never sees a key that was not armed. */
static void *reader(void *arg)
{
    long *bad = arg;
    for (int i = 0; i < 20000; i++)
        *bad += hit(KVR__FP_WRONG_NONCE, "never-armed");
    return NULL;
}

static void test_threads(void **state)
{
    (void)state;
    pthread_t t[2];
    long bad[2] = {0, 0};
    for (int i = 0; i < 2; i++)
        assert_int_equal(pthread_create(&t[i], NULL, reader, &bad[i]), 0);
    for (int i = 0; i < 2000; i++) {
        assert_int_equal(
            kvr_failpoint_arm("wrong-nonce", i % 2 ? "a" : "bb", NULL), KVR_OK);
        if (i % 7 == 0)
            kvr_failpoint_disarm_all();
    }
    for (int i = 0; i < 2; i++)
        pthread_join(t[i], NULL);
    assert_int_equal(bad[0] + bad[1], 0);
    assert_int_equal(kvr_failpoint_arm("wrong-nonce", "a", NULL), KVR_OK);
    assert_true(hit(KVR__FP_WRONG_NONCE, "a"));
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_teardown(test_names, disarm),
        cmocka_unit_test_teardown(test_off_until_armed, disarm),
        cmocka_unit_test_teardown(test_arm_by_key, disarm),
        cmocka_unit_test_teardown(test_bad_arguments, disarm),
        cmocka_unit_test_teardown(test_exit_is_a_kill, disarm),
        cmocka_unit_test_teardown(test_threads, disarm),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
