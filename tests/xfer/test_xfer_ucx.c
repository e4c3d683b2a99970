/* A producer and W consumer processes over UCX (shared memory or TCP, from
 * argv[1]), I in {1, bs}, sharded MLA plus a replicated index, both
 * executors; every byte checked by kvr_verify_region in the consumers. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>

#include <cmocka.h>

#include "xfer_harness.h"

static kvr_xfer_tl_t g_tl = KVR_XFER_TL_SHM;

static xh_config_t base_config(uint32_t W, uint32_t I)
{
    xh_config_t cfg = {
        .tl = g_tl, .W = W, .bs = 64, .I = I, .token_bytes = 576,
        .with_index = true, .slot_bytes = 64 * 1024, .num_slots = 3,
        .timeout_ms = 20000, .seed = 11 + I + W,
    };
    cfg.tokens = (uint64_t)cfg.bs * W * 5 + 37; /* ends inside a block */
    return cfg;
}

static void run_rounds(const xh_config_t *cfg)
{
    xh_session_t s;
    int rc = xh_start(&s, cfg);
    if (rc != 0)
        fprintf(stderr, "start: %s\n", s.error);
    assert_int_equal(rc, 0);
    xh_result_t res[XH_MAX_RANKS];
    const int kinds[] = {KVR_EXEC_DIRECT, KVR_EXEC_STAGED, KVR_EXEC_STAGED};
    for (size_t k = 0; k < sizeof(kinds) / sizeof(kinds[0]); k++) {
        kvr_status_t st = xh_round(&s, kinds[k], NULL, res);
        if (st != KVR_OK)
            fprintf(stderr, "%s round (W=%u I=%u): %s; %s; rank0 %s\n",
                    kvr_exec_name((kvr_exec_kind_t)kinds[k]), cfg->W, cfg->I,
                    kvr_status_name(st), s.error, res[0].msg);
        assert_int_equal(st, KVR_OK);
    }
    assert_int_equal(xh_stop(&s), 0);
}

static void test_interleave_1(void **state)
{
    (void)state;
    xh_config_t cfg = base_config(2, 1);
    run_rounds(&cfg);
}

static void test_interleave_bs(void **state)
{
    (void)state;
    xh_config_t cfg = base_config(2, 64);
    cfg.dst_alloc = true;        /* UCX-allocated destination */
    cfg.consumer_thread = true;  /* consumers progress from a thread */
    run_rounds(&cfg);
}

static void test_four_ranks(void **state)
{
    (void)state;
    xh_config_t cfg = base_config(4, 16);
    cfg.tokens = 64 * 4 * 2 + 5;
    run_rounds(&cfg);
}

int main(int argc, char **argv)
{
    if (argc > 1 && strcmp(argv[1], "tcp") == 0)
        g_tl = KVR_XFER_TL_TCP;
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_interleave_1),
        cmocka_unit_test(test_interleave_bs),
        cmocka_unit_test(test_four_ranks),
    };
    return cmocka_run_group_tests_name(g_tl == KVR_XFER_TL_TCP ? "ucx-tcp"
                                                               : "ucx-shm",
                                       tests, NULL, NULL);
}
