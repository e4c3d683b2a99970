/* Loopback transport, host pack/unpack, staging pool, cost model and both
 * executors in one process (consumer on a thread), plus every fault the
 * loopback backend injects: each must end in a clean error status and no
 * leak (LeakSanitizer runs in the sanitizer build). */
#include <math.h>
#include <pthread.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "kvrelay/xfer.h"
#include "plan_fixture.h"

#define BS 16
#define W 2
#define TOKENS (BS * W * 5 + 7)

typedef struct {
    kvr_layout_t lay;
    kvr_region_pair_t pairs[2];
    uint32_t src_ids[TOKENS / BS + 1], dst_ids[TOKENS / (BS * W) + 1];
    kvr_request_t req;
    unsigned char *src[2];
    kvr_transport_t *tp, *tc;
    kvr_ep_t *ep_pc, *ep_cp;
    kvr_mem_t *dst[2], *stage;
    kvr_rmem_t *rdst[2], *rstage;
    kvr_plan_set_t *set;
    kvr_xfer_seg_t psegs[2], csegs[2];
    uint32_t slots[4];
    kvr_exec_params_t pp, cp;
    kvr_exec_kind_t kind;
    kvr_status_t cons_st;
    kvr_error_t cons_err;
} fix_t;

/* Deadlines of waits that succeed: generous, since a loaded 2-core machine
 * under ASan is slow and a success returns long before them anyway. Waits
 * that must time out keep their short deadlines. */
#define SUCCESS_MS 30000u
static void open_remote(fix_t *f, kvr_mem_t *mem, kvr_rmem_t **out)
{
    kvr_remote_region_t desc;
    assert_int_equal(kvr_mem_pack(mem, &desc), KVR_OK);
    assert_int_equal(kvr_rmem_open(f->ep_pc, &desc, out), KVR_OK);
}

static void fix_regions(fix_t *f)
{
    unsigned seed = 5;
    f->lay = fx_layout(BS, W, 1, 1, 1);
    f->pairs[0] = fx_mla(&f->lay, 576, TOKENS / BS + 3, TOKENS / (BS * W) + 2);
    f->pairs[1] = fx_index(&f->lay, 128, TOKENS / BS + 3,
                           TOKENS / (BS * W) + 2);
    fx_table(f->src_ids, TOKENS / BS + 1, TOKENS / BS + 3, &seed);
    fx_table(f->dst_ids, TOKENS / (BS * W) + 1, TOKENS / (BS * W) + 2, &seed);
    f->req = (kvr_request_t){f->src_ids, TOKENS / BS + 1,
                             f->dst_ids, TOKENS / (BS * W) + 1,
                             TOKENS,     0};
    for (int i = 0; i < 2; i++) {
        uint64_t len = kvr_region_bytes(&f->pairs[i].src);
        f->src[i] = malloc(len);
        fx_fill(f->src[i], len, &seed);
        assert_int_equal(kvr_mem_alloc(f->tc,
                                       kvr_region_bytes(&f->pairs[i].dst),
                                       &f->dst[i]),
                         KVR_OK);
        memset(kvr_mem_addr(f->dst[i]), 0, kvr_mem_len(f->dst[i]));
    }
}

static void fix_params(fix_t *f, uint64_t slot_bytes, uint32_t num_slots,
                       uint32_t timeout_ms)
{
    for (uint32_t i = 0; i < num_slots; i++)
        f->slots[i] = num_slots - 1 - i; /* any order the pool grants */
    f->pp = (kvr_exec_params_t)KVR_EXEC_PARAMS_INIT;
    f->pp.transfer_id = 42;
    f->pp.deadline_ns = kvr_deadline_ns(timeout_ms);
    f->pp.slot_bytes = slot_bytes;
    f->pp.slots = f->slots;
    f->pp.num_slots = num_slots;
    f->cp = f->pp;
    f->pp.staging = f->rstage;
    f->cp.staging_local = kvr_mem_addr(f->stage);
}

static void fix_init(fix_t *f, const kvr_loopback_params_t *prod,
                     uint64_t slot_bytes, uint32_t num_slots,
                     uint32_t timeout_ms)
{
    const void *addr;
    size_t len;
    memset(f, 0, sizeof(*f));
    assert_int_equal(kvr_transport_loopback_create(NULL, prod, &f->tp, NULL),
                     KVR_OK);
    assert_int_equal(kvr_transport_loopback_create(f->tp, NULL, &f->tc, NULL),
                     KVR_OK);
    assert_int_equal(kvr_xfer_address(f->tc, &addr, &len), KVR_OK);
    assert_int_equal(kvr_ep_create(f->tp, addr, len, &f->ep_pc), KVR_OK);
    assert_int_equal(kvr_xfer_address(f->tp, &addr, &len), KVR_OK);
    assert_int_equal(kvr_ep_create(f->tc, addr, len, &f->ep_cp), KVR_OK);
    fix_regions(f);
    assert_int_equal(kvr_mem_alloc(f->tc, slot_bytes * num_slots, &f->stage),
                     KVR_OK);
    for (int i = 0; i < 2; i++)
        open_remote(f, f->dst[i], &f->rdst[i]);
    open_remote(f, f->stage, &f->rstage);
    assert_int_equal(
        kvr_plan_set_create(&f->lay, 0, f->pairs, 2, &f->req, &f->set, NULL),
        KVR_OK);
    for (int i = 0; i < 2; i++) {
        const kvr_plan_t *plan = kvr_plan_set_plan_of(f->set, (size_t)i);
        f->psegs[i] = (kvr_xfer_seg_t){
            .plan = plan, .src = f->src[i], .dst = f->rdst[i]};
        f->csegs[i] = (kvr_xfer_seg_t){.plan = plan,
                                       .dst_local = kvr_mem_addr(f->dst[i])};
    }
    fix_params(f, slot_bytes, num_slots, timeout_ms);
}

static void fix_fini(fix_t *f)
{
    kvr_plan_set_destroy(f->set);
    kvr_rmem_close(f->rstage);
    for (int i = 0; i < 2; i++) {
        kvr_rmem_close(f->rdst[i]);
        kvr_mem_destroy(f->dst[i]);
        free(f->src[i]);
    }
    kvr_mem_destroy(f->stage);
    kvr_ep_destroy(f->ep_pc);
    kvr_ep_destroy(f->ep_cp);
    kvr_transport_destroy(f->tc);
    kvr_transport_destroy(f->tp);
}

static void *consumer(void *arg)
{
    fix_t *f = arg;
    f->cons_st = kvr_exec_recv(f->ep_cp, f->kind, f->csegs, 2, &f->cp, NULL,
                               &f->cons_err);
    return NULL;
}

/* Runs one transfer; returns the producer's status, consumer's in f. */
static kvr_status_t run_pair(fix_t *f, kvr_exec_kind_t kind,
                             kvr_exec_stats_t *stats)
{
    pthread_t th;
    kvr_error_t err = {0};
    f->kind = kind;
    assert_int_equal(pthread_create(&th, NULL, consumer, f), 0);
    kvr_status_t st = kvr_exec_send(f->ep_pc, kind, f->psegs, 2, &f->pp, stats,
                                    &err);
    pthread_join(th, NULL);
    return st;
}

static kvr_status_t verify(fix_t *f)
{
    kvr_status_t st = KVR_OK;
    for (int i = 0; i < 2 && st == KVR_OK; i++)
        st = kvr_verify_region(&f->lay, 0, &f->pairs[i], &f->req, f->src[i],
                               kvr_mem_addr(f->dst[i]), NULL);
    return st;
}

static void test_direct(void **state)
{
    (void)state;
    fix_t f;
    kvr_exec_stats_t stats;
    fix_init(&f, NULL, 4096, 2, SUCCESS_MS);
    assert_int_equal(run_pair(&f, KVR_EXEC_DIRECT, &stats), KVR_OK);
    assert_int_equal(f.cons_st, KVR_OK);
    assert_int_equal(stats.puts, kvr_plan_set_total_runs(f.set));
    assert_int_equal(stats.bytes, kvr_plan_set_total_bytes(f.set));
    assert_int_equal(verify(&f), KVR_OK);
    fix_fini(&f);
}

static void staged(bool map, uint64_t slot_bytes, uint32_t num_slots)
{
    kvr_loopback_params_t lp = KVR_LOOPBACK_PARAMS_INIT;
    lp.no_map = !map;
    fix_t f;
    kvr_exec_stats_t stats;
    fix_init(&f, &lp, slot_bytes, num_slots, SUCCESS_MS);
    assert_int_equal(run_pair(&f, KVR_EXEC_STAGED, &stats), KVR_OK);
    assert_int_equal(f.cons_st, KVR_OK);
    uint64_t bytes = kvr_plan_set_total_bytes(f.set);
    assert_int_equal(stats.chunks, (bytes + slot_bytes - 1) / slot_bytes);
    assert_int_equal(stats.mapped, map);
    assert_int_equal(stats.puts, map ? 0 : stats.chunks);
    assert_int_equal(verify(&f), KVR_OK);
    fix_fini(&f);
}

static void test_staged(void **state)
{
    (void)state;
    staged(true, 8192, 2);
    staged(false, 8192, 2);
    staged(false, 1000, 1);    /* chunks split runs; one slot: ack per chunk */
    staged(true, 1u << 20, 4); /* one chunk holds everything */
}

/* gpu-staged's protocol over host memory: a packer that behaves like the
 * CUDA one (pack only queues the copy, pack_wait does it) and checks that
 * the executor waits for a buffer before reusing or putting it. */
typedef struct {
    const kvr_xfer_seg_t *segs;
    kvr_xfer_cursor_t cur;
    uint32_t depth;
    struct {
        uint64_t pos, len;
        void *dst;
        bool queued;
    } q[4];
    uint64_t packs, fail_at; /* fail_at: the k-th pack_wait fails (1-based) */
    bool misuse;
} host_packer_t;

static kvr_status_t hp_pack(void *ctx, uint64_t pos, uint64_t len, void *dst,
                            uint32_t buf, kvr_error_t *err)
{
    host_packer_t *h = ctx;
    if (buf >= h->depth || h->q[buf].queued) {
        h->misuse = true;
        return kvr_error_set(err, KVR_ERR_INVALID, "buffer %u still busy", buf);
    }
    h->q[buf].pos = pos;
    h->q[buf].len = len;
    h->q[buf].dst = dst;
    h->q[buf].queued = true;
    return KVR_OK;
}

static kvr_status_t hp_wait(void *ctx, uint32_t buf, kvr_error_t *err)
{
    host_packer_t *h = ctx;
    if (buf >= h->depth)
        return kvr_error_set(err, KVR_ERR_INVALID, "buffer %u", buf);
    if (!h->q[buf].queued)
        return KVR_OK;
    h->q[buf].queued = false;
    if (++h->packs == h->fail_at)
        return kvr_error_set(err, KVR_ERR_CUDA, "pack kernel %llu failed",
                             (unsigned long long)h->packs);
    kvr_xfer_pack(h->segs, 2, &h->cur, h->q[buf].pos, h->q[buf].dst,
                  h->q[buf].len);
    return KVR_OK;
}

static kvr_status_t hp_unpack(void *ctx, uint64_t pos, uint64_t len,
                              const void *src, kvr_error_t *err)
{
    host_packer_t *h = ctx;
    (void)err;
    kvr_xfer_unpack(h->segs, 2, &h->cur, pos, src, len);
    return KVR_OK;
}

static kvr_status_t gpu_staged_run(fix_t *f, uint32_t depth, uint64_t fail_at,
                                   kvr_exec_stats_t *stats, host_packer_t *hp)
{
    host_packer_t hc = {.segs = f->csegs, .depth = depth};
    *hp = (host_packer_t){.segs = f->psegs, .depth = depth, .fail_at = fail_at};
    kvr_exec_packer_t pk = {.ctx = hp, .depth = depth, .pack = hp_pack,
                            .pack_wait = hp_wait};
    kvr_exec_packer_t uk = {.ctx = &hc, .depth = 1, .unpack = hp_unpack};
    size_t len = depth * f->pp.slot_bytes;
    void *bufs = malloc(len);
    kvr_mem_t *mem = NULL;
    assert_int_equal(kvr_mem_register(f->tp, bufs, len, &mem), KVR_OK);
    f->pp.packer = &pk;
    f->pp.pack_buf = mem;
    f->cp.packer = &uk;
    kvr_status_t st = run_pair(f, KVR_EXEC_GPU_STAGED, stats);
    kvr_mem_destroy(mem);
    free(bufs);
    return st;
}

static void gpu_staged(uint64_t slot_bytes, uint32_t num_slots, uint32_t depth)
{
    kvr_loopback_params_t lp = KVR_LOOPBACK_PARAMS_INIT;
    fix_t f;
    kvr_exec_stats_t stats;
    host_packer_t hp;
    fix_init(&f, &lp, slot_bytes, num_slots, SUCCESS_MS);
    assert_int_equal(gpu_staged_run(&f, depth, 0, &stats, &hp), KVR_OK);
    assert_int_equal(f.cons_st, KVR_OK);
    uint64_t chunks = (kvr_plan_set_total_bytes(f.set) + slot_bytes - 1) /
                      slot_bytes;
    assert_int_equal(stats.chunks, chunks);
    assert_int_equal(stats.puts, chunks); /* never through a mapping */
    assert_false(stats.mapped);
    assert_int_equal(hp.packs, chunks);
    assert_false(hp.misuse);
    assert_int_equal(verify(&f), KVR_OK);
    fix_fini(&f);
}

static void test_gpu_staged(void **state)
{
    (void)state;
    gpu_staged(8192, 2, 2);
    gpu_staged(1000, 1, 1); /* chunks split runs; an ack per chunk */
    gpu_staged(1000, 3, 4); /* packs run further ahead than slots */
    gpu_staged(1u << 20, 4, 2); /* one chunk */
}

static void test_gpu_staged_errors(void **state)
{
    (void)state;
    fix_t f;
    kvr_exec_stats_t stats;
    host_packer_t hp;
    fix_init(&f, NULL, 1000, 2, SUCCESS_MS);
    kvr_error_t err = {0};
    /* no packer: refused before anything moves */
    assert_int_equal(kvr_exec_send(f.ep_pc, KVR_EXEC_GPU_STAGED, f.psegs, 2,
                                   &f.pp, NULL, &err),
                     KVR_ERR_INVALID);
    assert_non_null(strstr(err.msg, "packer"));
    /* a pack failing mid-transfer: the producer reports it, the consumer
     * is told through ABORT */
    assert_int_equal(gpu_staged_run(&f, 2, 3, &stats, &hp), KVR_ERR_CUDA);
    assert_int_equal(f.cons_st, KVR_ERR_CUDA);
    assert_non_null(strstr(f.cons_err.msg, "abort"));
    fix_fini(&f);
}

/* Loopback has no CUDA: CUDA memory is refused, by name. */
static void test_cuda_refused(void **state)
{
    (void)state;
    kvr_transport_t *t = NULL;
    assert_int_equal(kvr_transport_loopback_create(NULL, NULL, &t, NULL),
                     KVR_OK);
    assert_false(kvr_xfer_has_cuda(t));
    char buf[64];
    kvr_mem_t *m = NULL;
    kvr_error_t err = {0};
    assert_int_equal(
        kvr_mem_register_kind(t, buf, sizeof(buf), KVR_MEM_CUDA, &m, &err),
        KVR_ERR_UNSUPPORTED);
    assert_null(m);
    assert_non_null(strstr(err.msg, "CUDA"));
    assert_int_equal(
        kvr_mem_register_kind(t, buf, sizeof(buf), KVR_MEM_HOST, &m, &err),
        KVR_OK);
    assert_int_equal(kvr_mem_kind(m), KVR_MEM_HOST);
    kvr_mem_destroy(m);
    kvr_transport_destroy(t);
}

/* CUDA regions: direct puts against gpu-staged and gpu-direct. */
static void test_cost_choose_gpu(void **state)
{
    (void)state;
    fix_t f;
    fix_init(&f, NULL, 4096, 1, SUCCESS_MS);
    /* tcp with cuda_copy: ~6 us and 2 GB/s a put, a chunk's round trip */
    kvr_cost_model_t tcp = {.put_s = 6e-6, .put_Bps = 2e9, .chunk_s = 60e-6,
                            .stage_Bps = 2e9, .copy_Bps = 6e9,
                            .rtt_s = 30e-6};
    kvr_cost_gpu_t g = {.cuda = true, .pack_Bps = 500e9, .launch_s = 5e-6};
    double t[KVR_COST_KINDS];
    /* I = 1: a run per token; packing on the GPU wins */
    assert_int_equal(kvr_cost_choose_gpu(&tcp, &g, KVR_EXEC_AUTO, f.psegs, 1,
                                         4u << 20, t),
                     KVR_EXEC_GPU_STAGED);
    assert_true(t[KVR_EXEC_GPU_STAGED] < t[KVR_EXEC_DIRECT]);
    assert_true(t[KVR_EXEC_STAGED] == 0); /* no host pack of CUDA memory */
    /* one 64 MiB run: one put beats chunking it */
    kvr_run_t big = {0, 0, 64u << 20};
    kvr_plan_t *one = NULL;
    assert_int_equal(kvr_plan_from_runs(&big, 1, &one), KVR_OK);
    kvr_xfer_seg_t seg = {.plan = one};
    assert_int_equal(
        kvr_cost_choose_gpu(&tcp, &g, KVR_EXEC_AUTO, &seg, 1, 4u << 20, t),
        KVR_EXEC_DIRECT);
    /* same host with CUDA IPC at 300 GB/s: gpu-direct */
    g.direct_Bps = 300e9;
    assert_int_equal(
        kvr_cost_choose_gpu(&tcp, &g, KVR_EXEC_AUTO, f.psegs, 1, 4u << 20, t),
        KVR_EXEC_GPU_DIRECT);
    /* forced */
    assert_int_equal(kvr_cost_choose_gpu(&tcp, &g, KVR_EXEC_GPU_STAGED,
                                         f.psegs, 1, 4u << 20, NULL),
                     KVR_EXEC_GPU_STAGED);
    /* host regions: gpu kinds are not candidates */
    g.cuda = false;
    kvr_exec_kind_t k =
        kvr_cost_choose_gpu(&tcp, &g, KVR_EXEC_AUTO, f.psegs, 1, 4u << 20, t);
    assert_true(k == KVR_EXEC_DIRECT || k == KVR_EXEC_STAGED);
    assert_true(t[KVR_EXEC_GPU_STAGED] == 0 && t[KVR_EXEC_GPU_DIRECT] == 0);
    kvr_plan_destroy(one);
    fix_fini(&f);
}

static void test_pack_roundtrip(void **state)
{
    (void)state;
    fix_t f;
    fix_init(&f, NULL, 4096, 1, SUCCESS_MS);
    uint64_t total = kvr_xfer_stream_bytes(f.psegs, 2);
    unsigned char *buf = malloc(total);
    kvr_xfer_cursor_t pc = {0}, uc = {0};
    for (uint64_t pos = 0; pos < total; pos += 777) /* odd chunk size */
        kvr_xfer_pack(f.psegs, 2, &pc, pos, buf + pos,
                      total - pos < 777 ? total - pos : 777);
    for (uint64_t pos = total; pos > 0;) { /* unpack backwards: seeks back */
        uint64_t from = pos > 1000 ? pos - 1000 : 0;
        kvr_xfer_unpack(f.csegs, 2, &uc, from, buf + from, pos - from);
        pos = from;
    }
    assert_int_equal(verify(&f), KVR_OK);
    free(buf);
    fix_fini(&f);
}

/* kvr_rmem_map: the whole peer region for stores, only where the
 * transport promises the mapping lasts (map_stores, and kvr_rmem_ptr
 * works). */
static void test_rmem_map(void **state)
{
    (void)state;
    kvr_loopback_params_t p = KVR_LOOPBACK_PARAMS_INIT;
    for (int c = 0; c < 3; c++) {
        p.map_stores = c > 0;
        p.no_map = c == 2;
        fix_t f;
        fix_init(&f, &p, 4096, 2, SUCCESS_MS);
        void *base = NULL;
        kvr_status_t st = kvr_rmem_map(f.rstage, &base);
        if (c != 1) {
            assert_int_equal(st, KVR_ERR_UNSUPPORTED);
            fix_fini(&f);
            continue;
        }
        assert_int_equal(st, KVR_OK);
        assert_ptr_equal(base, kvr_mem_addr(f.stage));
        memset(base, 0x5a, 8192); /* the stores land in the peer's memory */
        assert_int_equal(((unsigned char *)kvr_mem_addr(f.stage))[8191], 0x5a);
        fix_fini(&f);
    }
    assert_int_equal(kvr_rmem_map(NULL, NULL), KVR_ERR_INVALID);
}

static void test_bounds_and_garbage(void **state)
{
    (void)state;
    fix_t f;
    fix_init(&f, NULL, 4096, 1, SUCCESS_MS);
    unsigned char b[64] = {0};
    uint64_t len = kvr_rmem_len(f.rstage);
    uint64_t dl = kvr_deadline_ns(SUCCESS_MS);
    assert_int_equal(kvr_xfer_put(f.ep_pc, b, 64, f.rstage, len - 63, dl),
                     KVR_ERR_RUN_OUT_OF_BOUNDS);
    assert_int_equal(kvr_xfer_put(f.ep_pc, b, 1, f.rstage, UINT64_MAX, dl),
                     KVR_ERR_RUN_OUT_OF_BOUNDS);
    assert_int_equal(kvr_xfer_put(f.ep_pc, b, 64, f.rstage, len - 64, dl),
                     KVR_OK);
    void *p;
    assert_int_equal(kvr_rmem_ptr(f.rstage, len, 1, &p),
                     KVR_ERR_RUN_OUT_OF_BOUNDS);
    kvr_remote_region_t desc;
    assert_int_equal(kvr_mem_pack(f.stage, &desc), KVR_OK);
    desc.length += 1; /* claims more than the region holds */
    kvr_rmem_t *r = NULL;
    assert_int_equal(kvr_rmem_open(f.ep_pc, &desc, &r), KVR_ERR_INVALID);
    memset(desc.rkey, 0xab, desc.rkey_len);
    assert_int_equal(kvr_rmem_open(f.ep_pc, &desc, &r), KVR_ERR_INVALID);
    kvr_ep_t *ep = NULL;
    assert_int_equal(kvr_ep_create(f.tp, b, 16, &ep), KVR_ERR_PEER_DEAD);
    assert_int_equal(kvr_xfer_send_msg(f.ep_pc, 1, b, KVR_XFER_MSG_MAX + 1, dl),
                     KVR_ERR_INVALID);
    fix_fini(&f);
}

static void test_messages(void **state)
{
    (void)state;
    fix_t f;
    fix_init(&f, NULL, 4096, 1, SUCCESS_MS);
    uint64_t dl = kvr_deadline_ns(SUCCESS_MS);
    assert_int_equal(kvr_xfer_send_msg(f.ep_pc, 7, "seven", 5, dl), KVR_OK);
    assert_int_equal(kvr_xfer_send_msg(f.ep_pc, 8, "eight", 5, dl), KVR_OK);
    kvr_xfer_msg_t *m = NULL;
    assert_int_equal(kvr_xfer_recv_msg(f.tc, NULL, NULL, &m, dl), KVR_OK);
    assert_int_equal(m->type, 7);
    assert_memory_equal(m->data, "seven", 5);
    kvr_xfer_msg_free(m);
    assert_int_equal(kvr_xfer_recv_msg(f.tc, NULL, NULL, &m, dl), KVR_OK);
    assert_int_equal(m->type, 8);
    kvr_xfer_msg_free(m);
    assert_int_equal(
        kvr_xfer_recv_msg(f.tc, NULL, NULL, &m, kvr_deadline_ns(20)),
        KVR_ERR_TIMEOUT);
    fix_fini(&f);
}

/* ---- injected faults -------------------------------------------------- */

static void fault(kvr_loopback_params_t lp, kvr_exec_kind_t kind,
                  uint32_t timeout_ms, kvr_status_t prod, kvr_status_t cons,
                  kvr_status_t ver)
{
    fix_t f;
    fix_init(&f, &lp, 4096, 2, timeout_ms);
    assert_int_equal(run_pair(&f, kind, NULL), prod);
    assert_int_equal(f.cons_st, cons);
    if (ver != KVR_OK || cons == KVR_OK)
        assert_int_equal(verify(&f), ver);
    fix_fini(&f);
}

static void test_fault_fail_put(void **state)
{
    (void)state;
    kvr_loopback_params_t lp = KVR_LOOPBACK_PARAMS_INIT;
    lp.fail_put_at = 3;
    /* the failed put kills the ep, so the consumer hears nothing more */
    fault(lp, KVR_EXEC_DIRECT, 300, KVR_ERR_TRANSPORT, KVR_ERR_TIMEOUT,
          KVR_ERR_VERIFY);
    lp.no_map = true;
    lp.fail_put_at = 2;
    fault(lp, KVR_EXEC_STAGED, 300, KVR_ERR_TRANSPORT, KVR_ERR_TIMEOUT,
          KVR_ERR_VERIFY);
}

static void test_fault_drop_and_dup(void **state)
{
    (void)state;
    kvr_loopback_params_t lp = KVR_LOOPBACK_PARAMS_INIT;
    lp.drop_msg_at = 1; /* direct: DONE lost; the data is there, unconfirmed */
    fault(lp, KVR_EXEC_DIRECT, 200, KVR_OK, KVR_ERR_TIMEOUT, KVR_OK);
    fault(lp, KVR_EXEC_STAGED, 200, KVR_ERR_TIMEOUT, KVR_ERR_TIMEOUT,
          KVR_ERR_VERIFY);
    lp.drop_msg_at = 0;
    lp.dup_msg_at = 1; /* duplicates are ignored */
    fault(lp, KVR_EXEC_DIRECT, SUCCESS_MS, KVR_OK, KVR_OK, KVR_OK);
    fault(lp, KVR_EXEC_STAGED, SUCCESS_MS, KVR_OK, KVR_OK, KVR_OK);
    lp.dup_msg_at = 3;
    fault(lp, KVR_EXEC_STAGED, SUCCESS_MS, KVR_OK, KVR_OK, KVR_OK);
}

static void test_fault_delay(void **state)
{
    (void)state;
    kvr_loopback_params_t lp = KVR_LOOPBACK_PARAMS_INIT;
    lp.delay_ms = 300;
    fault(lp, KVR_EXEC_DIRECT, 100, KVR_ERR_TIMEOUT, KVR_ERR_TIMEOUT, KVR_OK);
    lp.delay_ms = 5; /* slow but within the deadline */
    fault(lp, KVR_EXEC_STAGED, SUCCESS_MS, KVR_OK, KVR_OK, KVR_OK);
}

static void test_fault_corrupt(void **state)
{
    (void)state;
    kvr_loopback_params_t lp = KVR_LOOPBACK_PARAMS_INIT;
    lp.corrupt_put_at = 4;
    fault(lp, KVR_EXEC_DIRECT, SUCCESS_MS, KVR_OK, KVR_OK, KVR_ERR_VERIFY);
}

static void test_fault_no_space(void **state)
{
    (void)state;
    kvr_loopback_params_t lp = KVR_LOOPBACK_PARAMS_INIT;
    lp.mem_limit = 1 << 20;
    kvr_transport_t *t = NULL;
    kvr_mem_t *a = NULL, *b = NULL;
    assert_int_equal(kvr_transport_loopback_create(NULL, &lp, &t, NULL),
                     KVR_OK);
    assert_int_equal(kvr_mem_alloc(t, 768 << 10, &a), KVR_OK);
    assert_int_equal(kvr_mem_alloc(t, 512 << 10, &b), KVR_ERR_NO_SPACE);
    assert_null(b);
    kvr_mem_destroy(a);
    assert_int_equal(kvr_mem_alloc(t, 1 << 20, &b), KVR_OK);
    kvr_mem_destroy(b);
    kvr_transport_destroy(t);
}

static void test_staging_pool(void **state)
{
    (void)state;
    kvr_staging_pool_t *pool = NULL;
    uint32_t slots[4], n = 0, more[4];
    assert_int_equal(kvr_staging_pool_create(3, 4096, &pool), KVR_OK);
    assert_int_equal(
        kvr_staging_acquire(pool, 1, 4, kvr_deadline_ns(10), slots, &n),
        KVR_OK);
    assert_int_equal(n, 3);
    assert_int_equal(kvr_staging_free_slots(pool), 0);
    uint64_t t0 = kvr_now_ns();
    assert_int_equal(
        kvr_staging_acquire(pool, 1, 1, kvr_deadline_ns(50), more, &n),
        KVR_ERR_NO_SPACE);
    assert_true(kvr_now_ns() - t0 >= 45000000u);
    kvr_staging_release(pool, slots, 2);
    kvr_staging_release(pool, slots, 2); /* double release is ignored */
    assert_int_equal(kvr_staging_free_slots(pool), 2);
    assert_int_equal(
        kvr_staging_acquire(pool, 2, 2, kvr_deadline_ns(10), more, &n), KVR_OK);
    assert_int_equal(
        kvr_staging_acquire(pool, 4, 4, kvr_deadline_ns(10), more, &n),
        KVR_ERR_INVALID);
    kvr_staging_pool_destroy(pool);
}

static void test_peer_gone(void **state)
{
    (void)state;
    fix_t f;
    fix_init(&f, NULL, 4096, 1, SUCCESS_MS);
    kvr_rmem_close(f.rstage);
    f.rstage = NULL;
    for (int i = 0; i < 2; i++) {
        kvr_rmem_close(f.rdst[i]);
        f.rdst[i] = NULL;
        kvr_mem_destroy(f.dst[i]);
        f.dst[i] = NULL;
    }
    kvr_mem_destroy(f.stage);
    f.stage = NULL;
    kvr_ep_destroy(f.ep_cp);
    f.ep_cp = NULL;
    kvr_transport_destroy(f.tc);
    f.tc = NULL;
    assert_int_equal(kvr_xfer_send_msg(f.ep_pc, 1, "x", 1, kvr_deadline_ns(10)),
                     KVR_ERR_PEER_DEAD);
    assert_int_equal(kvr_ep_status(f.ep_pc), KVR_ERR_PEER_DEAD);
    fix_fini(&f);
}

static void test_forged_chunk(void **state)
{
    (void)state;
    fix_t f;
    fix_init(&f, NULL, 4096, 2, SUCCESS_MS);
    unsigned char m[28] = {42}; /* transfer 42, chunk 0, 0 bytes, slot 0 */
    assert_int_equal(kvr_xfer_send_msg(f.ep_pc, KVR_XFER_MSG_RESERVED + 1, m,
                                       sizeof(m), kvr_deadline_ns(SUCCESS_MS)),
                     KVR_OK);
    kvr_error_t err = {0};
    assert_int_equal(
        kvr_exec_recv(f.ep_cp, KVR_EXEC_STAGED, f.csegs, 2, &f.cp, NULL, &err),
        KVR_ERR_PROTO);
    assert_non_null(strstr(err.msg, "does not match"));
    fix_fini(&f);
}

static void test_cost_choose(void **state)
{
    (void)state;
    fix_t f;
    fix_init(&f, NULL, 4096, 1, SUCCESS_MS);
    kvr_cost_model_t tcp = {.put_s = 6e-6,
                            .put_Bps = 1e9,
                            .chunk_s = 50e-6,
                            .stage_Bps = 1e9,
                            .copy_Bps = 6e9};
    double td, ts;
    /* I = 1: a run per token */
    assert_int_equal(
        kvr_cost_choose(&tcp, KVR_EXEC_AUTO, f.psegs, 1, 1 << 20, &td, &ts),
        KVR_EXEC_STAGED);
    assert_true(ts < td);
    assert_int_equal(
        kvr_cost_choose(&tcp, KVR_EXEC_DIRECT, f.psegs, 1, 1 << 20, NULL, NULL),
        KVR_EXEC_DIRECT);
    kvr_run_t big = {0, 0, 8u << 20};
    kvr_plan_t *one = NULL;
    assert_int_equal(kvr_plan_from_runs(&big, 1, &one), KVR_OK);
    kvr_xfer_seg_t seg = {.plan = one};
    assert_int_equal(
        kvr_cost_choose(&tcp, KVR_EXEC_AUTO, &seg, 1, 1 << 20, &td, &ts),
        KVR_EXEC_DIRECT);
    assert_int_equal(
        kvr_cost_choose(&tcp, KVR_EXEC_STAGED, &seg, 1, 1 << 20, NULL, NULL),
        KVR_EXEC_STAGED);
    assert_int_equal(
        kvr_cost_choose(NULL, KVR_EXEC_AUTO, &seg, 1, 1 << 20, NULL, NULL),
        KVR_EXEC_DIRECT);
    kvr_plan_destroy(one);
    fix_fini(&f);
}

/* A plan of `n` runs of `len` bytes, every other piece of the source. */
static kvr_plan_t *pieces_plan(uint64_t n, uint64_t len)
{
    kvr_run_t *runs = malloc(n * sizeof(*runs));
    assert_non_null(runs);
    for (uint64_t i = 0; i < n; i++)
        runs[i] = (kvr_run_t){.src = 2 * i * len, .dst = i * len, .len = len};
    kvr_plan_t *plan = NULL;
    assert_int_equal(kvr_plan_from_runs(runs, n, &plan), KVR_OK);
    free(runs);
    return plan;
}

/* A measured-like model: put(s) = put_fixed + s / put_Bps, copy(s) =
 * 20 ns + s / copy_Bps, stage(s) = s / stage_Bps, at 576 * 4^k bytes. */
static kvr_cost_model_t curve_model(double put_fixed, double put_Bps,
                                    double copy_Bps, double stage_Bps,
                                    double chunk_s, bool mapped)
{
    kvr_cost_model_t m = {.put_s = put_fixed,
                          .put_Bps = put_Bps,
                          .chunk_s = chunk_s,
                          .stage_Bps = stage_Bps,
                          .copy_Bps = copy_Bps,
                          .mapped = mapped,
                          .rtt_s = 20e-6};
    for (double s = 576; s <= (4u << 20); s *= 4) {
        uint32_t i = m.points++;
        m.point_bytes[i] = s;
        m.put_at[i] = put_fixed + s / put_Bps;
        m.copy_at[i] = 20e-9 + s / copy_Bps;
        m.stage_at[i] = mapped ? 0 : s / stage_Bps;
    }
    return m;
}

static void test_cost_choose_curves(void **state)
{
    (void)state;
    kvr_plan_t *tok = pieces_plan(16384, 576); /* I = 1 */
    kvr_plan_t *blk = pieces_plan(256, 36864); /* I = 64, same bytes */
    kvr_plan_t *mid = pieces_plan(4096, 1440); /* between two points */
    kvr_xfer_seg_t s_tok = {.plan = tok}, s_blk = {.plan = blk},
                   s_mid = {.plan = mid};
    double td, ts;

    /* shared memory, staging mapped: staged costs a copy, not a put, so it
     * wins even for block-sized runs (emulated puts copy twice) */
    kvr_cost_model_t shm = curve_model(0.4e-6, 9e9, 20e9, 0, 0.8e-6, true);
    assert_int_equal(
        kvr_cost_choose(&shm, KVR_EXEC_AUTO, &s_tok, 1, 256 << 10, &td, &ts),
        KVR_EXEC_STAGED);
    assert_int_equal(
        kvr_cost_choose(&shm, KVR_EXEC_AUTO, &s_blk, 1, 256 << 10, &td, &ts),
        KVR_EXEC_STAGED);
    /* exactly the curve at a measured size: 256 puts, plus the round trip */
    assert_true(fabs(td - (256 * (0.4e-6 + 36864 / 9e9) + 20e-6)) < 1e-12);
    /* mapped: the staging put curve is never charged */
    kvr_cost_model_t shm_odd = shm;
    for (uint32_t i = 0; i < shm_odd.points; i++)
        shm_odd.stage_at[i] = 1.0;
    double ts2;
    kvr_cost_choose(&shm_odd, KVR_EXEC_AUTO, &s_blk, 1, 256 << 10, NULL, &ts2);
    assert_true(fabs(ts2 - ts) < 1e-12);
    /* mapped staged, exactly: pack (16384 copies of 576 B) paced by the
     * pack, 37 chunks of 256 KiB, the last chunk's unpack, the round trip */
    double pack = 16384 * (20e-9 + 576 / 20e9), b = 16384.0 * 576;
    kvr_cost_choose(&shm, KVR_EXEC_AUTO, &s_tok, 1, 256 << 10, NULL, &ts);
    assert_true(fabs(ts - (pack + 36 * 0.8e-6 + pack * (256 << 10) / b +
                           20e-6)) < 1e-12);
    /* a consumer that unpacks three times slower sets the pace instead */
    kvr_cost_model_t slow = shm;
    for (uint32_t i = 0; i < slow.points; i++)
        slow.unpack_at[i] = 3 * slow.copy_at[i];
    kvr_cost_choose(&slow, KVR_EXEC_AUTO, &s_tok, 1, 256 << 10, NULL, &ts);
    assert_true(fabs(ts - (3 * pack + 36 * 0.8e-6 + 3 * pack * (256 << 10) / b +
                           20e-6)) < 1e-12);
    /* the same model unmapped pays a put per chunk: big runs go direct */
    shm_odd.mapped = false;
    assert_int_equal(kvr_cost_choose(&shm_odd, KVR_EXEC_AUTO, &s_blk, 1,
                                     256 << 10, NULL, NULL),
                     KVR_EXEC_DIRECT);

    /* TCP: a put costs a syscall; staged wins on tokens, direct on blocks
     * (the pack and the chunk round trips outweigh 256 put overheads) */
    kvr_cost_model_t tcp = curve_model(1.5e-6, 3e9, 20e9, 3e9, 50e-6, false);
    assert_int_equal(
        kvr_cost_choose(&tcp, KVR_EXEC_AUTO, &s_tok, 1, 1 << 20, &td, &ts),
        KVR_EXEC_STAGED);
    assert_true(ts < td);
    assert_int_equal(
        kvr_cost_choose(&tcp, KVR_EXEC_AUTO, &s_blk, 1, 1 << 20, &td, &ts),
        KVR_EXEC_DIRECT);
    assert_true(td < ts);
    /* between measured sizes (576 and 2304) the curve is linear */
    kvr_cost_choose(&tcp, KVR_EXEC_AUTO, &s_mid, 1, 1 << 20, &td, NULL);
    assert_true(fabs(td - (4096 * (1.5e-6 + 1440 / 3e9) + 20e-6)) < 1e-12);
    /* force still wins */
    assert_int_equal(
        kvr_cost_choose(&tcp, KVR_EXEC_STAGED, &s_blk, 1, 1 << 20, NULL, NULL),
        KVR_EXEC_STAGED);
    /* a malformed curve (sizes not ascending) is not used */
    kvr_cost_model_t bad = tcp;
    bad.point_bytes[1] = bad.point_bytes[0];
    assert_int_equal(
        kvr_cost_choose(&bad, KVR_EXEC_AUTO, &s_tok, 1, 1 << 20, &td, &ts),
        KVR_EXEC_DIRECT);
    assert_true(td == 0 && ts == 0);
    kvr_plan_destroy(tok);
    kvr_plan_destroy(blk);
    kvr_plan_destroy(mid);
}

/* A probe of sizes 576 B to 1 MiB into the fixture's staging. */
static kvr_cost_probe_t small_probe(const fix_t *f)
{
    return (kvr_cost_probe_t){.scratch = f->rstage,
                              .small_bytes = 576,
                              .small_count = 64,
                              .large_bytes = 1 << 20,
                              .deadline_ns = kvr_deadline_ns(SUCCESS_MS)};
}

static void test_cost_measure(void **state)
{
    (void)state;
    fix_t f;
    fix_init(&f, NULL, 4u << 20, 1, SUCCESS_MS);
    kvr_cost_probe_t probe = small_probe(&f);
    kvr_cost_model_t m;
    assert_int_equal(kvr_cost_measure(f.ep_pc, &probe, &m, NULL), KVR_OK);
    assert_true(m.put_Bps > 0 && m.copy_Bps > 0 && m.put_s >= 0);
    assert_true(m.mapped);
    /* sizes 576 * 2^k up to 1 MiB, and 1 MiB itself */
    assert_int_equal(m.points, 12);
    assert_true(m.point_bytes[0] == 576 && m.point_bytes[11] == 1 << 20);
    for (uint32_t i = 0; i < m.points; i++)
        assert_true(m.put_at[i] >= m.copy_at[i] && m.copy_at[i] > 0 &&
                    m.stage_at[i] == 0);
    probe.large_bytes = 64u << 20;
    assert_int_equal(kvr_cost_measure(f.ep_pc, &probe, &m, NULL),
                     KVR_ERR_INVALID);
    fix_fini(&f);
}

/* The probe in steps: a step whose until_ns has passed runs one unit (a
 * stretch of the source, the warm-up or one timed batch); there is no
 * model before the last; the model then is a full one. */
static void test_cost_steps(void **state)
{
    (void)state;
    fix_t f;
    fix_init(&f, NULL, 4u << 20, 1, SUCCESS_MS);
    kvr_cost_probe_t probe = small_probe(&f);
    kvr_cost_run_t *run = NULL;
    assert_int_equal(kvr_cost_start(f.ep_pc, &probe, &run, NULL), KVR_OK);
    kvr_cost_model_t m;
    bool done = false;
    uint32_t steps = 0;
    while (!done && steps < 100000) {
        assert_false(kvr_cost_result(run, &m));
        assert_int_equal(kvr_cost_step(run, 0, kvr_deadline_ns(SUCCESS_MS),
                                       &done, NULL),
                         KVR_OK);
        steps++;
    }
    assert_true(done && kvr_cost_result(run, &m));
    /* at least the warm-up and 5 rounds of a round trip and 4 units for
     * each of the 12 sizes */
    assert_true(steps >= 1 + 5 * (1 + 4 * 12));
    assert_int_equal(m.points, 12);
    assert_true(m.put_Bps > 0 && m.copy_Bps > 0 && m.mapped);
    kvr_cost_free(run);
    probe.large_bytes = 64u << 20; /* larger than the scratch */
    assert_int_equal(kvr_cost_start(f.ep_pc, &probe, &run, NULL),
                     KVR_ERR_INVALID);
    fix_fini(&f);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_direct),
        cmocka_unit_test(test_staged),
        cmocka_unit_test(test_gpu_staged),
        cmocka_unit_test(test_gpu_staged_errors),
        cmocka_unit_test(test_cuda_refused),
        cmocka_unit_test(test_cost_choose_gpu),
        cmocka_unit_test(test_pack_roundtrip),
        cmocka_unit_test(test_rmem_map),
        cmocka_unit_test(test_bounds_and_garbage),
        cmocka_unit_test(test_messages),
        cmocka_unit_test(test_fault_fail_put),
        cmocka_unit_test(test_fault_drop_and_dup),
        cmocka_unit_test(test_fault_delay),
        cmocka_unit_test(test_fault_corrupt),
        cmocka_unit_test(test_fault_no_space),
        cmocka_unit_test(test_staging_pool),
        cmocka_unit_test(test_peer_gone),
        cmocka_unit_test(test_forged_chunk),
        cmocka_unit_test(test_cost_choose),
        cmocka_unit_test(test_cost_choose_curves),
        cmocka_unit_test(test_cost_measure),
        cmocka_unit_test(test_cost_steps),
    };
    return cmocka_run_group_tests_name("xfer-loopback", tests, NULL, NULL);
}
