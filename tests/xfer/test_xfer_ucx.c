/* A producer and W consumer processes over UCX (shared memory or TCP, from
 * argv[1]), I in {1, bs}, sharded MLA plus a replicated index, both
 * executors; every byte checked by kvr_verify_region in the consumers. */
#include <pthread.h>
#include <setjmp.h>
#include <signal.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>
#include <time.h>

#include <cmocka.h>

#include "xfer_harness.h"

static kvr_xfer_tl_t g_tl = KVR_XFER_TL_SHM;

static xh_config_t base_config(uint32_t W, uint32_t I)
{
    xh_config_t cfg = {
        .tl = g_tl,
        .W = W,
        .bs = 64,
        .I = I,
        .token_bytes = 576,
        .with_index = true,
        .slot_bytes = 64 * 1024,
        .num_slots = 3,
        .timeout_ms = 20000,
        .seed = 11 + I + W,
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
    cfg.dst_alloc = true;       /* UCX-allocated destination */
    cfg.consumer_thread = true; /* consumers progress from a thread */
    run_rounds(&cfg);
}

static void test_four_ranks(void **state)
{
    (void)state;
    xh_config_t cfg = base_config(4, 16);
    cfg.tokens = 64 * 4 * 2 + 5;
    run_rounds(&cfg);
}

static void *killer(void *arg)
{
    pid_t pid = *(pid_t *)arg;
    struct timespec ts = {0, 30 * 1000 * 1000};
    nanosleep(&ts, NULL);
    kill(pid, SIGKILL);
    return NULL;
}

/* A consumer killed mid-transfer surfaces as PEER_DEAD or TIMEOUT within
 * the round's deadline, never as a hang. */
static void test_dead_peer(void **state)
{
    (void)state;
    xh_config_t cfg = base_config(1, 1);
    cfg.tokens = 16384;
    cfg.with_index = false;
    cfg.timeout_ms = 30000; /* the live round: a loaded 2-core machine, ASan */
    xh_session_t s;
    assert_int_equal(xh_start(&s, &cfg), 0);
    assert_int_equal(xh_round(&s, KVR_EXEC_DIRECT, NULL, NULL), KVR_OK);
    /* rounds to the dead peer must fail: over shared memory only their
     * deadline ends them, so it is short; the bounds below allow for load */
    s.cfg.timeout_ms = cfg.timeout_ms = 5000;
    pthread_t th;
    pid_t pid = s.pids[0];
    assert_int_equal(pthread_create(&th, NULL, killer, &pid), 0);
    uint64_t t0 = kvr_now_ns();
    kvr_status_t st = KVR_OK;
    for (int i = 0; i < 200 && st == KVR_OK; i++)
        st = xh_round(&s, i % 2 ? KVR_EXEC_STAGED : KVR_EXEC_DIRECT, NULL,
                      NULL);
    double secs = (double)(kvr_now_ns() - t0) * 1e-9;
    pthread_join(th, NULL);
    fprintf(stderr, "dead peer: %s after %.2f s (%s)\n", kvr_status_name(st),
            secs, s.error);
    assert_true(st == KVR_ERR_PEER_DEAD || st == KVR_ERR_TIMEOUT);
    /* ended by the death or the round's deadline, not a hang; the slack
     * is for load, not a speed requirement */
    assert_true(secs < cfg.timeout_ms / 1000.0 + 60.0);
    /* the round may have failed on the control socket first: the transport
     * itself must report the death too */
    kvr_xfer_seg_t segs[2];
    size_t n = xh_segs(&s, 0, KVR_EXEC_DIRECT, segs);
    kvr_exec_params_t p = KVR_EXEC_PARAMS_INIT;
    p.transfer_id = 999;
    p.deadline_ns = kvr_deadline_ns(cfg.timeout_ms);
    kvr_error_t err = {0};
    t0 = kvr_now_ns();
    st = kvr_exec_send(s.eps[0], KVR_EXEC_DIRECT, segs, n, &p, NULL, &err);
    secs = (double)(kvr_now_ns() - t0) * 1e-9;
    fprintf(stderr, "send to the dead peer: %s after %.2f s: %s\n",
            kvr_status_name(st), secs, err.msg);
    assert_true(st == KVR_ERR_PEER_DEAD || st == KVR_ERR_TIMEOUT);
    assert_true(secs < cfg.timeout_ms / 1000.0 + 60.0);
    xh_stop(&s); /* the killed child reports failure; that is the point */
}

/* The cost probe against a live consumer: a sane model (its duration is
 * printed, never asserted: speed belongs in benchmarks), and the session
 * still works after it. Staging is 4 x 1 MiB
 * (UCX-allocated): mapped on shared memory, probed with puts over TCP. */
static void test_probe(void **state)
{
    (void)state;
    xh_config_t cfg = base_config(1, 1);
    cfg.slot_bytes = 1u << 20;
    cfg.num_slots = 4;
    xh_session_t s;
    assert_int_equal(xh_start(&s, &cfg), 0);
    kvr_cost_model_t m;
    uint64_t t0 = kvr_now_ns();
    kvr_status_t st = xh_probe(&s, 0, &m);
    double secs = (double)(kvr_now_ns() - t0) * 1e-9;
    if (st != KVR_OK)
        fprintf(stderr, "probe: %s\n", s.error);
    assert_int_equal(st, KVR_OK);
    fprintf(stderr,
            "probe %.3f s: rtt %.1f us, put(576) %.2f us, copy(576) "
            "%.3f us, mapped %d\n",
            secs, m.rtt_s * 1e6, m.put_at[0] * 1e6, m.copy_at[0] * 1e6,
            m.mapped);
    assert_true(m.points >= 2 && m.points <= KVR_COST_POINTS);
    assert_true(m.rtt_s > 0 && m.put_Bps > 0 && m.copy_Bps > 0);
    assert_int_equal(m.mapped, g_tl == KVR_XFER_TL_SHM);
    for (uint32_t i = 0; i < m.points; i++) {
        assert_true(m.copy_at[i] > 0 && m.put_at[i] >= m.copy_at[i]);
        assert_true(m.mapped ? m.stage_at[i] == 0
                             : m.stage_at[i] >= m.copy_at[i]);
    }
    /* the lean probe: a linear model of puts alone, no copy rate, so host
     * staging is no candidate; the session still works after it */
    t0 = kvr_now_ns();
    assert_int_equal(xh_probe_lean(&s, 0, true, &m), KVR_OK);
    fprintf(stderr, "lean probe %.3f s: put %.2f us + %.2f GB/s, rtt %.1f us\n",
            (double)(kvr_now_ns() - t0) * 1e-9, m.put_s * 1e6,
            m.put_Bps / 1e9, m.rtt_s * 1e6);
    assert_int_equal(m.points, 0);
    assert_false(m.mapped);
    assert_true(m.rtt_s > 0 && m.put_s > 0 && m.put_Bps > 0);
    assert_true(m.stage_Bps > 0 && m.chunk_s > m.rtt_s);
    assert_true(m.copy_Bps == 0);
    kvr_run_t run = {.src = 0, .dst = 0, .len = 4096};
    kvr_plan_t *plan = NULL;
    assert_int_equal(kvr_plan_from_runs(&run, 1, &plan), KVR_OK);
    kvr_xfer_seg_t seg = {.plan = plan};
    double td = 0, ts = 1;
    assert_int_equal(kvr_cost_choose(&m, KVR_EXEC_AUTO, &seg, 1, 1u << 20,
                                     &td, &ts),
                     KVR_EXEC_DIRECT);
    assert_true(td > 0 && ts == 0);
    kvr_plan_destroy(plan);
    assert_int_equal(xh_round(&s, KVR_EXEC_STAGED, NULL, NULL), KVR_OK);
    assert_int_equal(xh_stop(&s), 0);
}

/* A UCX without CUDA (Debian's) refuses CUDA memory, naming its version;
 * one with CUDA reports it (and registering needs a GPU: not here). */
static void test_cuda_memory(void **state)
{
    (void)state;
    kvr_ucx_params_t p = KVR_UCX_PARAMS_INIT;
    p.tl = g_tl;
    kvr_transport_t *t = NULL;
    assert_int_equal(kvr_transport_ucx_create(&p, &t, NULL), KVR_OK);
    if (kvr_xfer_has_cuda(t)) {
        printf("UCX %s has CUDA memory support\n", kvr_xfer_ucx_version());
        kvr_transport_destroy(t);
        return;
    }
    static char buf[4096];
    kvr_mem_t *m = NULL;
    kvr_error_t err = {0};
    assert_int_equal(
        kvr_mem_register_kind(t, buf, sizeof(buf), KVR_MEM_CUDA, &m, &err),
        KVR_ERR_UNSUPPORTED);
    printf("%s\n", err.msg);
    assert_non_null(strstr(err.msg, kvr_xfer_ucx_version()));
    assert_non_null(strstr(err.msg, "no CUDA support"));
    kvr_transport_destroy(t);
}

/* The transport sets asked for with cuda ("tcp,cuda_copy",
 * "sm,cuda_copy,cuda_ipc", UCX's default) are accepted by this UCX and
 * move bytes: a put of host memory between two transports of this process
 * (a UCX without CUDA warns about the CUDA names and keeps the rest). */
static void test_cuda_tls(void **state)
{
    (void)state;
    const kvr_xfer_tl_t tls[2] = {KVR_XFER_TL_AUTO, g_tl};
    for (int i = 0; i < 2; i++) {
        kvr_ucx_params_t p = KVR_UCX_PARAMS_INIT;
        p.tl = tls[i];
        p.cuda = true;
        kvr_transport_t *src = NULL, *dst = NULL;
        kvr_error_t err = {0};
        assert_int_equal(kvr_transport_ucx_create(&p, &src, &err), KVR_OK);
        p.progress = KVR_XFER_PROGRESS_THREAD; /* the target of the put */
        assert_int_equal(kvr_transport_ucx_create(&p, &dst, &err), KVR_OK);
        static char from[4096], to[4096];
        memset(from, 'a' + i, sizeof(from));
        memset(to, 0, sizeof(to));
        kvr_mem_t *m = NULL;
        kvr_remote_region_t r;
        const void *addr;
        size_t len;
        kvr_ep_t *ep = NULL;
        kvr_rmem_t *rm = NULL;
        uint64_t dl = kvr_deadline_ns(10000);
        assert_int_equal(kvr_mem_register(dst, to, sizeof(to), &m), KVR_OK);
        assert_int_equal(kvr_mem_pack(m, &r), KVR_OK);
        assert_int_equal(kvr_xfer_address(dst, &addr, &len), KVR_OK);
        assert_int_equal(kvr_ep_create(src, addr, len, &ep), KVR_OK);
        assert_int_equal(kvr_rmem_open(ep, &r, &rm), KVR_OK);
        assert_int_equal(kvr_xfer_put(ep, from, sizeof(from), rm, 0, dl),
                         KVR_OK);
        assert_int_equal(kvr_xfer_flush(ep, dl), KVR_OK);
        assert_memory_equal(from, to, sizeof(to));
        kvr_rmem_close(rm);
        kvr_ep_destroy(ep);
        kvr_mem_destroy(m);
        kvr_transport_destroy(src);
        kvr_transport_destroy(dst);
    }
}

int main(int argc, char **argv)
{
    if (argc > 1 && strcmp(argv[1], "tcp") == 0)
        g_tl = KVR_XFER_TL_TCP;
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_interleave_1),
        cmocka_unit_test(test_interleave_bs),
        cmocka_unit_test(test_four_ranks),
        cmocka_unit_test(test_probe),
        cmocka_unit_test(test_dead_peer),
        cmocka_unit_test(test_cuda_memory),
        cmocka_unit_test(test_cuda_tls),
    };
    return cmocka_run_group_tests_name(
        g_tl == KVR_XFER_TL_TCP ? "ucx-tcp" : "ucx-shm", tests, NULL, NULL);
}
