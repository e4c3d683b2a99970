/* GPU KV over UCX between two processes on one GPU (docs/transport.md,
 * CUDA memory and gpu-staged). The producer (one child) holds a prefill
 * region in CUDA memory, the consumer (another) DCP rank 0's region of
 * W = 4, I = 1, 576-byte tokens. Per UCX transport set ("tcp,cuda_copy":
 * the cross-host path, GPU bytes through the network stack; "auto": UCX's
 * default with cuda_ipc) it measures direct puts, gpu-staged and, where
 * CUDA IPC reaches the peer, gpu-direct; the executor the cost model picks
 * from figures measured at set-up; and the ceilings: UCX's own large-put
 * bandwidth for CUDA memory over the same transports, and the same bytes
 * as one device-to-device cudaMemcpyAsync, cold (L2 flushed before each
 * rep, as before every executor's rep) and warm. Every transfer lands in
 * a region poisoned on the device (cudaMemsetAsync) and every byte of the
 * region is compared on the device with the expected image (made once on
 * the host by the plan's reference and kvr_verify_region, uploaded once;
 * bench_cmp.cu), so no host sweep of the region's size sits between the
 * reps; the compare is checked at set-up on a flipped byte. Also what
 * registering the producer's CUDA region with UCX took.
 *   bench_gpu_net [--test] [--tokens N] [--reps N] [--out FILE]
 *                 [--ipc-beside-ucx] [--host-check]
 * Default 262144 tokens (37.7 MB to the rank). --test: at most 8192
 * tokens, one repetition, --host-check, exit 1 unless every transfer
 * verified; exit 77 without a GPU or without a CUDA-capable UCX (a ctest
 * SKIP). --host-check: every rep is also read back and checked on the
 * host by kvr_verify_region (as before 2026-12-02b), the two verdicts
 * must agree.
 * --ipc-beside-ucx: kvrelay's IPC mapping of the consumer's region stays
 * open while UCX's cuda_ipc puts into it (by default it is closed after
 * the gpu-direct cells). gpu-direct is timed until kvr__gpu_send returns
 * (its kernels done), with its relayout tables made before the clock
 * starts, as the agent makes them when a pull arrives (and again with
 * them made inside), its parts printed; the bench's note to the consumer
 * afterwards is timed apart. */
#include <errno.h>
#include <poll.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cuda_runtime.h>

#include "bench_cmp.h"
#include "bench_util.h"
#include "gpu_path.h"
#include "kvrelay/base.h"
#include "kvrelay/gpu.h"
#include "kvrelay/xfer.h"

#define W 4
#define BS 64
#define TOKEN 576
#define SLOT (4u << 20)
#define SLOTS 8u
#define DEPTH 2u
#define XFER_MS 30000u
#define SOCK_MS 40000
#define L2_FLUSH (256u << 20) /* written between reps: > 5x H200's 50 MB L2 */
#define SLOW_S 0.5 /* a warm-up slower than this: one timed rep */

typedef unsigned long long ull;

#define OK_OR_DIE(call)                                                        \
    do {                                                                       \
        kvr_error_t e_ = {0};                                                  \
        kvr_error_t *err = &e_;                                                \
        kvr_status_t s_ = (call);                                              \
        if (s_ != KVR_OK)                                                      \
            DIE("%s:%d: %s: %s (%s)", __FILE__, __LINE__, #call,               \
                kvr_status_str(s_), e_.msg);                                   \
        (void)err;                                                             \
    } while (0)

/* ---- the job both processes share (made before fork) ---- */

typedef struct {
    uint64_t tokens;
    kvr_layout_t lay;
    kvr_region_pair_t pair;
    uint32_t *src_ids, *dst_ids;
    kvr_request_t req;
    unsigned char *src_host; /* the producer region's bytes */
    uint64_t src_len, dst_len;
} job_t;

static uint64_t rng = 0x9e3779b97f4a7c15ull;
static uint64_t rng_next(void)
{
    rng ^= rng << 13;
    rng ^= rng >> 7;
    rng ^= rng << 17;
    return rng;
}

static uint32_t *permutation(uint32_t n)
{
    uint32_t *p = malloc(n * sizeof(*p));
    if (p == NULL)
        DIE("no memory");
    for (uint32_t i = 0; i < n; i++)
        p[i] = i;
    for (uint32_t i = n; i > 1; i--) {
        uint32_t j = (uint32_t)(rng_next() % i), t = p[i - 1];
        p[i - 1] = p[j];
        p[j] = t;
    }
    return p;
}

static void job_init(job_t *j, uint64_t tokens)
{
    j->tokens = tokens;
    j->lay = (kvr_layout_t)KVR_LAYOUT_INIT;
    j->lay.block_size = BS;
    j->lay.dcp_size = j->lay.tp = j->lay.producer_tp = W;
    j->lay.interleave = 1;
    kvr_region_desc_t *s = &j->pair.src, *d = &j->pair.dst;
    memset(&j->pair, 0, sizeof(j->pair));
    s->role = d->role = KVR_ROLE_MLA;
    s->page_bytes = d->page_bytes = (uint64_t)BS * TOKEN;
    s->num_blocks = (uint32_t)(tokens / BS);
    d->num_blocks = (uint32_t)(tokens / (BS * W));
    j->src_ids = permutation(s->num_blocks);
    j->dst_ids = permutation(d->num_blocks);
    j->req = (kvr_request_t){j->src_ids, s->num_blocks, j->dst_ids,
                             d->num_blocks, tokens, 0};
    j->src_len = kvr_region_bytes(s);
    j->dst_len = kvr_region_bytes(d);
    j->src_host = malloc(j->src_len);
    if (j->src_host == NULL)
        DIE("no memory");
    for (uint64_t i = 0; i < j->src_len; i += 8) {
        uint64_t v = rng_next();
        memcpy(j->src_host + i, &v, 8);
    }
}

/* ---- the socket between the two (every read has a deadline) ---- */

static void put_all(int fd, const void *buf, size_t len)
{
    const char *p = buf;
    while (len > 0) {
        ssize_t n = write(fd, p, len);
        if (n < 0 && errno == EINTR)
            continue;
        if (n <= 0)
            DIE("socket write: %s", strerror(errno));
        p += n;
        len -= (size_t)n;
    }
}

static void get_all(int fd, void *buf, size_t len)
{
    char *p = buf;
    while (len > 0) {
        struct pollfd pf = {.fd = fd, .events = POLLIN};
        int r = poll(&pf, 1, SOCK_MS);
        if (r == 0)
            DIE("peer silent for %d ms", SOCK_MS);
        if (r < 0 && errno == EINTR)
            continue;
        ssize_t n = read(fd, p, len);
        if (n <= 0)
            DIE("peer gone (socket read: %s)", n ? strerror(errno) : "EOF");
        p += n;
        len -= (size_t)n;
    }
}

/* What the consumer announces. */
typedef struct {
    uint32_t addr_len;
    unsigned char addr[8192];
    kvr_remote_region_t dst, stage;
    kvr_gpu_ipc_handle_t ipc;
    int has_cuda;
    char ucx[32];
} hello_t;

enum { CMD_RECV = 1, CMD_SINK, CMD_VERIFY, CMD_QUIT };
typedef struct {
    int op, kind;
    uint64_t id;
} cmd_t;
typedef struct {
    int st, verified;
    char msg[KVR_ERROR_MSG_MAX];
} res_t;

/* ---- one UCX side ---- */

typedef struct {
    kvr_transport_t *t;
    kvr_ep_t *ep;
} side_t;

static void side_open(side_t *s, int tl, uint64_t id)
{
    kvr_ucx_params_t p = KVR_UCX_PARAMS_INIT;
    p.tl = (kvr_xfer_tl_t)tl;
    p.cuda = true;
    p.id = id;
    OK_OR_DIE(kvr_transport_ucx_create(&p, &s->t, err));
}

/* ---- consumer ---- */

typedef struct {
    job_t *j;
    side_t s;
    int fd;
    void *dst, *stage;
    kvr_mem_t *mdst, *mstage;
    kvr_plan_set_t *set;
    kvr__gpu_packer_t *pk;
    cudaStream_t cs;
    void *expect, *scratch; /* the expected image; the compare's result */
    unsigned char *back;    /* host_check: the region read back */
} cons_t;

#define POISON 0xa5

static bool host_check; /* --test, --host-check */

/* The first byte where the region differs from the expected image,
 * dst_len when none (on the device: no host sweep between reps). */
static uint64_t cons_diff(cons_t *c)
{
    uint64_t first = 0;
    if (bench_first_diff(c->dst, c->expect, c->j->dst_len, c->scratch, c->cs,
                         &first) != 0)
        DIE("device compare: %s", cudaGetErrorString(cudaGetLastError()));
    return first;
}

/* Every byte of the region against the expected image (the plan's host
 * reference over a poisoned region, checked by kvr_verify_region once at
 * set-up): the rank's share, and nothing written outside it. host_check:
 * also read back and checked by kvr_verify_region, both verdicts must
 * agree. */
static void cons_verify(cons_t *c, res_t *r)
{
    uint64_t first = cons_diff(c);
    r->verified = first == c->j->dst_len;
    if (!r->verified)
        snprintf(r->msg, sizeof(r->msg),
                 "region differs from the expected image at byte %llu of "
                 "%llu",
                 (ull)first, (ull)c->j->dst_len);
    if (!host_check)
        return;
    kvr_error_t e = {0};
    kvr_status_t st = kvr_gpu_memcpy(c->back, c->dst, c->j->dst_len, &e);
    if (st == KVR_OK)
        st = kvr_verify_region(&c->j->lay, 0, &c->j->pair, &c->j->req,
                               c->j->src_host, c->back, &e);
    if (st == KVR_OK && !r->verified)
        DIE("the device compare saw byte %llu differ where the host "
            "verifier passed the region",
            (ull)first);
    if (st != KVR_OK && r->verified)
        DIE("the host verifier failed a region the device compare passed: "
            "%s",
            e.msg);
    if (st != KVR_OK)
        memcpy(r->msg, e.msg, sizeof(r->msg));
}

static void cons_poison(cons_t *c)
{
    if (cudaMemsetAsync(c->dst, POISON, c->j->dst_len, c->cs) != cudaSuccess ||
        cudaStreamSynchronize(c->cs) != cudaSuccess)
        DIE("poison: %s", cudaGetErrorString(cudaGetLastError()));
}

/* The expected image: a poisoned region with the plan's runs applied on
 * the host, checked once by kvr_verify_region, uploaded once. Then the
 * compare itself is checked: the image copied into the region must
 * compare equal, and one flipped byte must be found at its offset. */
static void cons_expect(cons_t *c)
{
    job_t *j = c->j;
    unsigned char *img = malloc(j->dst_len);
    if (img == NULL)
        DIE("no memory");
    memset(img, POISON, j->dst_len);
    kvr_plan_apply_host(kvr_plan_set_plan_of(c->set, 0), j->src_host, img);
    OK_OR_DIE(kvr_verify_region(&j->lay, 0, &j->pair, &j->req, j->src_host,
                                img, err));
    OK_OR_DIE(kvr_gpu_malloc(0, j->dst_len, &c->expect, err));
    OK_OR_DIE(kvr_gpu_malloc(0, 16, &c->scratch, err));
    OK_OR_DIE(kvr_gpu_memcpy(c->expect, img, j->dst_len, err));
    OK_OR_DIE(kvr_gpu_memcpy(c->dst, img, j->dst_len, err));
    uint64_t at = j->dst_len / 2 + 7;
    unsigned char flip = (unsigned char)~img[at];
    free(img);
    if (cons_diff(c) != j->dst_len)
        DIE("device compare: the expected image differs from its copy");
    OK_OR_DIE(kvr_gpu_memcpy((unsigned char *)c->dst + at, &flip, 1, err));
    uint64_t got = cons_diff(c);
    if (got != at)
        DIE("device compare: byte %llu flipped, found %llu", (ull)at,
            (ull)got);
}

static void cons_serve(cons_t *c)
{
    for (;;) {
        cmd_t cmd;
        res_t r = {0};
        get_all(c->fd, &cmd, sizeof(cmd));
        if (cmd.op == CMD_QUIT)
            return;
        if (cmd.op == CMD_SINK) { /* progress until the producer's note */
            put_all(c->fd, &r, sizeof(r));
            kvr_xfer_msg_t *m = NULL;
            r.st = kvr_xfer_recv_msg(c->s.t, NULL, NULL, &m,
                                     kvr_deadline_ns(XFER_MS));
            kvr_xfer_msg_free(m);
            put_all(c->fd, &r, sizeof(r));
            continue;
        }
        kvr_error_t e = {0};
        cons_poison(c);
        put_all(c->fd, &r, sizeof(r)); /* poisoned: go */
        if (cmd.op == CMD_RECV) {
            uint32_t slots[SLOTS];
            for (uint32_t i = 0; i < SLOTS; i++)
                slots[i] = i;
            kvr_exec_params_t p = KVR_EXEC_PARAMS_INIT;
            p.transfer_id = cmd.id;
            p.deadline_ns = kvr_deadline_ns(XFER_MS);
            p.slot_bytes = SLOT;
            p.slots = slots;
            p.num_slots = SLOTS;
            p.staging_local = c->stage;
            p.packer = kvr__gpu_packer_ops(c->pk);
            kvr_xfer_seg_t seg = {.plan = kvr_plan_set_plan_of(c->set, 0),
                                  .dst_local = c->dst};
            r.st = kvr_exec_recv(c->s.ep, (kvr_exec_kind_t)cmd.kind, &seg, 1,
                                 &p, NULL, &e);
            if (r.st != KVR_OK)
                snprintf(r.msg, sizeof(r.msg), "%s", e.msg);
        } else {
            get_all(c->fd, &r, sizeof(r)); /* the producer wrote it */
        }
        if (r.st == KVR_OK)
            cons_verify(c, &r);
        put_all(c->fd, &r, sizeof(r));
    }
}

static int consumer(job_t *j, int fd, int tl)
{
    cons_t c = {.j = j, .fd = fd};
    hello_t *h = calloc(1, sizeof(*h));
    c.back = host_check ? malloc(j->dst_len) : NULL;
    if (h == NULL || (host_check && c.back == NULL))
        DIE("no memory");
    OK_OR_DIE(kvr_gpu_set_device(0, err));
    if (cudaStreamCreateWithFlags(&c.cs, cudaStreamNonBlocking) != cudaSuccess)
        DIE("cudaStreamCreate failed");
    side_open(&c.s, tl, 2);
    h->has_cuda = kvr_xfer_has_cuda(c.s.t);
    snprintf(h->ucx, sizeof(h->ucx), "%s", kvr_xfer_ucx_version());
    if (h->has_cuda) {
        OK_OR_DIE(kvr_gpu_malloc(0, j->dst_len, &c.dst, err));
        OK_OR_DIE(kvr_gpu_malloc(0, (size_t)SLOT * SLOTS, &c.stage, err));
        OK_OR_DIE(kvr_mem_register_kind(c.s.t, c.dst, j->dst_len,
                                        KVR_MEM_CUDA, &c.mdst, err));
        OK_OR_DIE(kvr_mem_register_kind(c.s.t, c.stage, (size_t)SLOT * SLOTS,
                                        KVR_MEM_CUDA, &c.mstage, err));
        OK_OR_DIE(kvr_mem_pack(c.mdst, &h->dst));
        OK_OR_DIE(kvr_mem_pack(c.mstage, &h->stage));
        OK_OR_DIE(kvr_gpu_ipc_export(c.dst, &h->ipc, err));
        OK_OR_DIE(kvr_plan_set_create(&j->lay, 0, &j->pair, 1, &j->req,
                                      &c.set, err));
        void *dsts[1] = {c.dst};
        OK_OR_DIE(kvr__gpu_packer_create(0, &j->lay, 0, &j->pair, NULL, dsts,
                                         1, &j->req, 1, &c.pk, err));
        cons_expect(&c);
    }
    const void *addr;
    size_t len;
    OK_OR_DIE(kvr_xfer_address(c.s.t, &addr, &len));
    if (len > sizeof(h->addr))
        DIE("UCX address of %zu bytes", len);
    h->addr_len = (uint32_t)len;
    memcpy(h->addr, addr, len);
    put_all(fd, h, sizeof(*h));
    hello_t peer;
    get_all(fd, &peer, sizeof(peer));
    if (h->has_cuda) {
        OK_OR_DIE(kvr_ep_create(c.s.t, peer.addr, peer.addr_len, &c.s.ep));
        cons_serve(&c);
        kvr_ep_destroy(c.s.ep);
        kvr__gpu_packer_destroy(c.pk);
        kvr_plan_set_destroy(c.set);
        kvr_mem_destroy(c.mdst);
        kvr_mem_destroy(c.mstage);
        kvr_gpu_free(c.dst);
        kvr_gpu_free(c.stage);
        kvr_gpu_free(c.expect);
        kvr_gpu_free(c.scratch);
    }
    cudaStreamDestroy(c.cs);
    kvr_transport_destroy(c.s.t);
    free(h);
    free(c.back);
    return 0;
}

/* ---- producer ---- */

typedef struct {
    job_t *j;
    side_t s;
    int fd, tl;
    hello_t peer;
    void *src, *bufs, *copy_dst, *ipc_dst, *flush;
    cudaStream_t cs;
    kvr_gpu_pool_t *pool; /* gpu-direct's tables, as the agent keeps them */
    kvr_mem_t *msrc, *mbufs;
    kvr_rmem_t *rdst, *rstage;
    kvr_plan_set_t *set;
    kvr__gpu_packer_t *pk;
    uint64_t bytes, next_id;
    int reps;
    double reg_s;  /* registering src with UCX */
    bool keep_ipc; /* IPC mapping open while UCX puts into the region */
    FILE *js;
    bool first_cell, all_ok;
    /* gpu-direct: tables made before the timed part, as the agent makes
     * them when the pull arrives (else inside it, as before), and each
     * timed rep's parts in microseconds: tables, launch, wait, free */
    bool prep;
    double parts[32][8];
    int nparts;
} prod_t;

/* Evicts L2 (both processes share the GPU's): every timed rep, the
 * device-to-device ceiling's cold reps included, starts from HBM. */
static void l2_flush(prod_t *p)
{
    if (cudaMemsetAsync(p->flush, (int)(p->next_id & 0xff), L2_FLUSH, p->cs) !=
            cudaSuccess ||
        cudaStreamSynchronize(p->cs) != cudaSuccess)
        DIE("L2 flush: %s", cudaGetErrorString(cudaGetLastError()));
}

static double elapsed(const char *what, uint64_t t0)
{
    double s = (double)(kvr_now_ns() - t0) * 1e-9;
    fprintf(stderr, "  [%s: %.2f s]\n", what, s);
    return s;
}

static res_t ask(prod_t *p, int op, int kind)
{
    cmd_t cmd = {op, kind, ++p->next_id};
    res_t r;
    put_all(p->fd, &cmd, sizeof(cmd));
    get_all(p->fd, &r, sizeof(r)); /* poisoned, or sinking */
    return r;
}

static res_t finish(prod_t *p, res_t mine)
{
    res_t r;
    get_all(p->fd, &r, sizeof(r));
    if (mine.st != KVR_OK) {
        r.st = mine.st;
        memcpy(r.msg, mine.msg, sizeof(r.msg));
        r.verified = 0;
    }
    return r;
}

static void exec_params(prod_t *p, kvr_exec_params_t *x, uint32_t *slots)
{
    for (uint32_t i = 0; i < SLOTS; i++)
        slots[i] = i;
    *x = (kvr_exec_params_t)KVR_EXEC_PARAMS_INIT;
    x->transfer_id = p->next_id;
    x->deadline_ns = kvr_deadline_ns(XFER_MS);
    x->slot_bytes = SLOT;
    x->slots = slots;
    x->num_slots = SLOTS;
    x->staging = p->rstage;
    x->pack_buf = p->mbufs;
    x->packer = kvr__gpu_packer_ops(p->pk);
}

/* One transfer with `kind`; seconds, and whether every byte arrived. */
static double one_xfer(prod_t *p, kvr_exec_kind_t kind, bool *ok)
{
    res_t r = kind == KVR_EXEC_GPU_DIRECT ? ask(p, CMD_VERIFY, 0)
                                          : ask(p, CMD_RECV, (int)kind);
    res_t mine = {0};
    kvr_error_t e = {0};
    kvr__gpu_tables_t *tables = NULL;
    if (kind == KVR_EXEC_GPU_DIRECT && p->prep) /* as the pull arrives */
        OK_OR_DIE(kvr__gpu_tables_make(0, p->cs, p->pool, &p->j->lay,
                                       &p->j->pair, 1, &p->j->req, &tables,
                                       err));
    l2_flush(p); /* after the consumer's poisoning: every rep starts cold */
    uint64_t t0 = kvr_now_ns(), t1 = 0;
    if (kind == KVR_EXEC_GPU_DIRECT) {
        /* the bytes are in place when kvr__gpu_send returns (its kernels
         * waited for); the note to the consumer after it is the bench's
         * protocol, timed apart as the part "notify" */
        uint64_t moved = 0, at[9];
        const void *srcs[1] = {p->src};
        void *dsts[1] = {p->ipc_dst};
        mine.st = kvr__gpu_send(0, p->cs, p->pool, &p->j->lay, 0, &p->j->pair,
                                srcs, dsts, 1, &p->j->req, tables, &moved, at,
                                &e);
        t1 = kvr_now_ns();
        put_all(p->fd, &mine, sizeof(mine));
        at[8] = kvr_now_ns();
        for (int k = 0; k < 8 && p->nparts < 32; k++)
            p->parts[p->nparts][k] = (double)(at[k + 1] - at[k]) * 1e-3;
        p->nparts += p->nparts < 32;
    } else {
        uint32_t slots[SLOTS];
        kvr_exec_params_t x;
        exec_params(p, &x, slots);
        kvr_xfer_seg_t seg = {.plan = kvr_plan_set_plan_of(p->set, 0),
                              .src = p->src,
                              .dst = p->rdst};
        mine.st = kvr_exec_send(p->s.ep, kind, &seg, 1, &x, NULL, &e);
    }
    double secs = (double)((t1 ? t1 : kvr_now_ns()) - t0) * 1e-9;
    kvr__gpu_tables_free(tables);
    if (mine.st != KVR_OK)
        snprintf(mine.msg, sizeof(mine.msg), "%s", e.msg);
    r = finish(p, mine);
    *ok = r.st == KVR_OK && r.verified;
    if (!*ok)
        fprintf(stderr, "  %s: %s: %s\n", kvr_exec_name(kind),
                kvr_status_str((kvr_status_t)r.st), r.msg);
    return secs;
}

static int cmp_double(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

static double median(double *t, int n)
{
    qsort(t, (size_t)n, sizeof(*t), cmp_double);
    return t[n / 2];
}

static const char *tl_name(int tl)
{
    return tl == KVR_XFER_TL_TCP ? "tcp,cuda_copy" : "auto (cuda_ipc)";
}

/* One JSON cell (written out at once: a producer that dies later keeps
 * it) and its line. */
static void cell_n(prod_t *p, uint64_t bytes, const char *executor,
                   double gbps, double ceiling, int reps, bool verified,
                   const char *note)
{
    fprintf(p->js,
            "%s\n    {\"transport\": \"%s\", \"executor\": \"%s\", \"I\": 1, "
            "\"bytes\": %llu, \"GBps\": %.3f, \"ceiling_GBps\": %.3f, "
            "\"ratio\": %.3f, \"reps\": %d, \"verified\": %s%s%s%s}",
            p->first_cell ? "" : ",", tl_name(p->tl), executor, (ull)bytes,
            gbps, ceiling, ceiling > 0 ? gbps / ceiling : 0,
            reps, verified ? "true" : "false", note ? ", \"note\": \"" : "",
            note ? note : "", note ? "\"" : "");
    fflush(p->js);
    p->first_cell = false;
    printf("  %-16s %-22s %9.3f GB/s  ceiling %9.3f  ratio %.3f  reps %d  %s\n",
           tl_name(p->tl), executor, gbps, ceiling,
           ceiling > 0 ? gbps / ceiling : 0, reps,
           verified ? "verified" : "FAILED");
    p->all_ok = p->all_ok && verified;
}

/* A cell of the rank's bytes. */
static void cell(prod_t *p, const char *executor, double gbps, double ceiling,
                 int reps, bool verified, const char *note)
{
    cell_n(p, p->bytes, executor, gbps, ceiling, reps, verified, note);
}

/* GB/s of `kind`: the median of reps after one warm-up, each from a cold
 * L2; a kind whose warm-up took over SLOW_S (direct puts over tcp, 0.03
 * GB/s) gets one timed rep, said in its cell. */
static double measure(prod_t *p, kvr_exec_kind_t kind, int *reps,
                      bool *verified)
{
    double t[32];
    bool ok = true, one;
    uint64_t t0 = kvr_now_ns();
    double warm = one_xfer(p, kind, &one); /* registration caches, pages */
    ok = one;
    *reps = warm > SLOW_S ? 1 : p->reps;
    p->nparts = 0;
    for (int i = 0; i < *reps; i++) {
        t[i] = one_xfer(p, kind, &one);
        ok = ok && one;
    }
    elapsed(kvr_exec_name(kind), t0);
    *verified = ok;
    return (double)p->bytes / median(t, *reps) / 1e9;
}

/* Ends a CMD_SINK: the note that lets the consumer stop progressing, out
 * of this process before we wait on the socket (a message still queued
 * here would leave the consumer waiting until its deadline), then its
 * answer. */
static void sink_end(prod_t *p, uint64_t deadline_ns)
{
    kvr_status_t st = kvr_xfer_send_msg(p->s.ep, 7, "x", 1, deadline_ns);
    if (st == KVR_OK)
        st = kvr_xfer_drain(p->s.ep, deadline_ns);
    if (st != KVR_OK)
        DIE("note to the consumer: %s", kvr_xfer_last_error(p->s.t));
    res_t r;
    get_all(p->fd, &r, sizeof(r));
}

/* UCX's own large-put bandwidth for CUDA memory: the rank's byte count as
 * back-to-back 4 MiB puts from the producer's CUDA region into the
 * consumer's CUDA staging memory, one flush; the consumer only
 * progresses. Also as puts of all the staging memory (32 MiB) at once;
 * the better of the two. */
static double put_ceiling(prod_t *p)
{
    double best = 0;
    for (int how = 0; how < 2; how++) {
        double t[32];
        for (int i = 0; i <= p->reps; i++) {
            ask(p, CMD_SINK, 0);
            l2_flush(p);
            uint64_t room = SLOT * SLOTS;
            uint64_t piece = !how ? SLOT : p->bytes < room ? p->bytes : room;
            uint64_t t0 = kvr_now_ns(), dl = kvr_deadline_ns(XFER_MS);
            kvr_status_t st = KVR_OK;
            for (uint64_t off = 0; off < p->bytes && st == KVR_OK;
                 off += piece) {
                uint64_t len = p->bytes - off < piece ? p->bytes - off : piece;
                st = kvr_xfer_put(p->s.ep, (char *)p->src + off, len,
                                  p->rstage, off % room, dl);
            }
            if (st == KVR_OK)
                st = kvr_xfer_flush(p->s.ep, dl);
            if (i > 0)
                t[i - 1] = (double)(kvr_now_ns() - t0) * 1e-9;
            if (st != KVR_OK)
                DIE("ceiling puts: %s", kvr_xfer_last_error(p->s.t));
            sink_end(p, dl);
        }
        double gbps = (double)p->bytes / median(t, p->reps) / 1e9;
        best = gbps > best ? gbps : best;
    }
    return best;
}

/* The same bytes as one cudaMemcpyAsync device to device, timed as the
 * executors are (from the host: launch to completion); cold: L2 flushed
 * before each rep, as before every executor's rep; warm: straight after
 * the previous copy. exchange: each rep after the same exchange with the
 * consumer as an executor's rep (it poisons its region first, and checks
 * it afterwards: unwritten here, so its verdict is ignored), so that the
 * copy and the executors start from the same host state. */
static double copy_ceiling(prod_t *p, bool cold, bool exchange)
{
    double t[32];
    for (int i = 0; i <= p->reps; i++) {
        res_t mine = {0};
        if (exchange)
            ask(p, CMD_VERIFY, 0);
        if (cold)
            l2_flush(p);
        uint64_t t0 = kvr_now_ns();
        if (cudaMemcpyAsync(p->copy_dst, p->src, p->bytes,
                            cudaMemcpyDeviceToDevice, p->cs) != cudaSuccess ||
            cudaStreamSynchronize(p->cs) != cudaSuccess)
            DIE("device copy: %s", cudaGetErrorString(cudaGetLastError()));
        if (i > 0)
            t[i - 1] = (double)(kvr_now_ns() - t0) * 1e-9;
        if (exchange) {
            put_all(p->fd, &mine, sizeof(mine));
            finish(p, mine);
        }
    }
    return (double)p->bytes / median(t, p->reps) / 1e9;
}

/* The cost model's figures, measured as the connector would at set-up:
 * puts of CUDA memory into the consumer's CUDA staging memory, the pack
 * kernel over the rank's runs, gpu-direct where CUDA IPC reaches. */
static kvr_exec_kind_t pick(prod_t *p, bool ipc, double t[KVR_COST_KINDS])
{
    kvr_cost_probe_t probe = {.scratch = p->rstage,
                              .small_bytes = TOKEN,
                              .small_count = 64,
                              .large_bytes = SLOT,
                              .deadline_ns = kvr_deadline_ns(XFER_MS),
                              .put_src = p->msrc,
                              .lean = true}; /* as the agent's */
    kvr_cost_model_t m;
    ask(p, CMD_SINK, 0);
    uint64_t p0 = kvr_now_ns();
    OK_OR_DIE(kvr_cost_measure(p->s.ep, &probe, &m, err));
    double probe_s = (double)(kvr_now_ns() - p0) * 1e-9;
    sink_end(p, probe.deadline_ns);
    kvr_cost_gpu_t g = {.cuda = true};
    const kvr_exec_packer_t *k = kvr__gpu_packer_ops(p->pk);
    uint64_t len = p->bytes < SLOT ? p->bytes : SLOT;
    for (int i = 0; i < 2; i++) { /* the second: warm */
        uint64_t t0 = kvr_now_ns();
        OK_OR_DIE(k->pack(k->ctx, 0, TOKEN, p->bufs, 0, err));
        OK_OR_DIE(k->pack_wait(k->ctx, 0, err));
        uint64_t t1 = kvr_now_ns();
        OK_OR_DIE(k->pack(k->ctx, 0, len, p->bufs, 0, err));
        OK_OR_DIE(k->pack_wait(k->ctx, 0, err));
        uint64_t t2 = kvr_now_ns();
        g.launch_s = (double)(t1 - t0) * 1e-9;
        g.pack_Bps = (double)len / ((double)(t2 - t1) * 1e-9);
    }
    if (ipc) {
        bool ok;
        double secs = one_xfer(p, KVR_EXEC_GPU_DIRECT, &ok);
        g.direct_Bps = (double)p->bytes / secs;
    }
    printf("  %-16s figures: pack %.1f GB/s, launch %.1f us, gpu-direct "
           "%.1f GB/s; UCX (lean probe, %.1f ms): put %.2f us + %.2f GB/s, "
           "staging put %.2f GB/s, rtt %.1f us\n",
           tl_name(p->tl), g.pack_Bps / 1e9, g.launch_s * 1e6,
           g.direct_Bps / 1e9, probe_s * 1e3, m.put_s * 1e6, m.put_Bps / 1e9,
           m.stage_Bps / 1e9, m.rtt_s * 1e6);
    kvr_xfer_seg_t seg = {.plan = kvr_plan_set_plan_of(p->set, 0)};
    return kvr_cost_choose_gpu(&m, &g, KVR_EXEC_AUTO, &seg, 1, SLOT, t);
}

static void prod_setup(prod_t *p)
{
    job_t *j = p->j;
    OK_OR_DIE(kvr_gpu_set_device(0, err));
    OK_OR_DIE(kvr_gpu_malloc(0, j->src_len, &p->src, err));
    OK_OR_DIE(kvr_gpu_malloc(0, (size_t)SLOT * DEPTH, &p->bufs, err));
    OK_OR_DIE(kvr_gpu_malloc(0, j->dst_len, &p->copy_dst, err));
    OK_OR_DIE(kvr_gpu_malloc(0, L2_FLUSH, &p->flush, err));
    if (cudaStreamCreateWithFlags(&p->cs, cudaStreamNonBlocking) != cudaSuccess)
        DIE("cudaStreamCreate failed");
    OK_OR_DIE(kvr_gpu_pool_create(0, p->cs, &p->pool, err));
    OK_OR_DIE(kvr_gpu_memcpy(p->src, j->src_host, j->src_len, err));
    /* what registering CUDA memory with UCX costs (the agent registers
     * every CUDA region at set-up; docs/transport.md, CUDA memory) */
    uint64_t t0 = kvr_now_ns();
    OK_OR_DIE(kvr_mem_register_kind(p->s.t, p->src, j->src_len, KVR_MEM_CUDA,
                                    &p->msrc, err));
    p->reg_s = (double)(kvr_now_ns() - t0) * 1e-9;
    OK_OR_DIE(kvr_mem_register_kind(p->s.t, p->bufs, (size_t)SLOT * DEPTH,
                                    KVR_MEM_CUDA, &p->mbufs, err));
    OK_OR_DIE(kvr_ep_create(p->s.t, p->peer.addr, p->peer.addr_len, &p->s.ep));
    OK_OR_DIE(kvr_rmem_open(p->s.ep, &p->peer.dst, &p->rdst));
    OK_OR_DIE(kvr_rmem_open(p->s.ep, &p->peer.stage, &p->rstage));
    OK_OR_DIE(kvr_plan_set_create(&j->lay, 0, &j->pair, 1, &j->req, &p->set,
                                  err));
    const void *srcs[1] = {p->src};
    OK_OR_DIE(kvr__gpu_packer_create(0, &j->lay, 0, &j->pair, srcs, NULL, 1,
                                     &j->req, DEPTH, &p->pk, err));
    p->bytes = kvr_plan_set_total_bytes(p->set);
    if (kvr__gpu_packer_bytes(p->pk) != p->bytes)
        DIE("packer stream %llu bytes, plan %llu",
            (ull)kvr__gpu_packer_bytes(p->pk), (ull)p->bytes);
    /* CUDA IPC reaches the peer on one host; over tcp,cuda_copy the run
     * stands for two hosts, where it does not */
    if (p->tl != KVR_XFER_TL_TCP)
        OK_OR_DIE(kvr_gpu_ipc_open(&p->peer.ipc, &p->ipc_dst, err));
}

static void prod_teardown(prod_t *p)
{
    cmd_t quit = {CMD_QUIT, 0, 0};
    put_all(p->fd, &quit, sizeof(quit));
    if (p->ipc_dst != NULL)
        kvr_gpu_ipc_close(&p->peer.ipc, p->ipc_dst);
    kvr__gpu_packer_destroy(p->pk);
    kvr_plan_set_destroy(p->set);
    kvr_rmem_close(p->rdst);
    kvr_rmem_close(p->rstage);
    kvr_ep_destroy(p->s.ep);
    kvr_mem_destroy(p->msrc);
    kvr_mem_destroy(p->mbufs);
    kvr_gpu_free(p->src);
    kvr_gpu_free(p->bufs);
    kvr_gpu_free(p->copy_dst);
    kvr_gpu_free(p->flush);
    kvr_gpu_pool_destroy(p->pool);
    cudaStreamDestroy(p->cs);
}

/* The median of each part of the gpu-direct reps just measured. */
/* kvr__gpu_send's parts (its stamps), then the note to the consumer */
static const char *const PARTS[8] = {"tables", "setup",  "event", "launch",
                                     "record", "wait",   "free",  "notify"};

static void print_parts(prod_t *p, const char *what)
{
    double col[32];
    printf("  %-16s %s, median parts (host clock, us):", tl_name(p->tl),
           what);
    fprintf(p->js,
            ",\n    {\"transport\": \"%s\", \"executor\": \"%s-parts\", "
            "\"note\": \"median us; notify is after the timed part\"",
            tl_name(p->tl), what);
    for (int k = 0; k < 8; k++) {
        for (int i = 0; i < p->nparts; i++)
            col[i] = p->parts[i][k];
        double m = p->nparts ? median(col, p->nparts) : 0;
        printf(" %s %.1f", PARTS[k], m);
        fprintf(p->js, ", \"%s_us\": %.1f", PARTS[k], m);
    }
    printf("\n");
    fprintf(p->js, "}");
    fflush(p->js);
}

/* The relayout kernel alone into the consumer's IPC-mapped region, CUDA
 * events on the producer's stream, L2 flushed before each rep: whether
 * writing through the mapping costs anything beside bench_rl_kernel's
 * local buffers. Every byte checked by the consumer afterwards. */
static void kernel_cell(prod_t *p, double ceiling)
{
    kvr__gpu_tables_t *t = NULL;
    kvr__gpu_job_t *job = NULL;
    cudaEvent_t e0, e1;
    float ms[32];
    uint32_t rank = 0;
    uint64_t moved = 0;
    const void *srcs[1] = {p->src};
    void *dsts[1] = {p->ipc_dst};
    OK_OR_DIE(kvr__gpu_tables_make(0, p->cs, p->pool, &p->j->lay,
                                   &p->j->pair, 1, &p->j->req, &t, err));
    if (cudaEventCreate(&e0) != cudaSuccess ||
        cudaEventCreate(&e1) != cudaSuccess)
        DIE("cudaEventCreate failed");
    bool ok = true;
    for (int i = 0; i <= p->reps; i++) {
        res_t r = ask(p, CMD_VERIFY, 0), mine = {0};
        l2_flush(p);
        kvr_error_t e = {0};
        cudaEventRecord(e0, p->cs);
        mine.st = kvr__gpu_job_start(0, p->cs, p->pool, &p->j->lay, t, &rank,
                                     &p->j->pair, srcs, dsts, 1, &p->j->req,
                                     &job, &moved, &e);
        cudaEventRecord(e1, p->cs);
        if (cudaEventSynchronize(e1) != cudaSuccess)
            DIE("kernel cell: %s", cudaGetErrorString(cudaGetLastError()));
        kvr__gpu_job_free(job);
        job = NULL;
        if (i > 0)
            cudaEventElapsedTime(&ms[i - 1], e0, e1);
        put_all(p->fd, &mine, sizeof(mine));
        r = finish(p, mine);
        ok = ok && r.st == KVR_OK && r.verified;
    }
    kvr__gpu_tables_free(t);
    cudaEventDestroy(e0);
    cudaEventDestroy(e1);
    double t_ms[32];
    for (int i = 0; i < p->reps; i++)
        t_ms[i] = ms[i];
    double gbps = (double)p->bytes / (median(t_ms, p->reps) * 1e-3) / 1e9;
    cell(p, "gpu-direct-kernel-events", gbps, ceiling, p->reps, ok,
         "the launch alone, CUDA events, into the IPC mapping; the ceiling "
         "is host-timed: compare with bench_rl_kernel's event-timed copy");
}

static double host_us(uint64_t t0)
{
    return (double)(kvr_now_ns() - t0) * 1e-3;
}

/* What the host calls of a launch cost in this process (UCX loaded, the
 * consumer's region mapped): medians of 32 of each, host clock. */
static void host_costs(prod_t *p)
{
    double t[5][32];
    kvr__gpu_tables_t *tb = NULL;
    OK_OR_DIE(kvr__gpu_tables_make(0, p->cs, p->pool, &p->j->lay,
                                   &p->j->pair, 1, &p->j->req, &tb, err));
    for (int i = 0; i < 32; i++) {
        void *ev = NULL, *mem = NULL;
        kvr__gpu_job_t *job = NULL;
        uint32_t rank = 0;
        uint64_t moved = 0;
        const void *srcs[1] = {p->src};
        void *dsts[1] = {p->ipc_dst};
        uint64_t t0 = kvr_now_ns();
        OK_OR_DIE(kvr_gpu_set_device(0, err));
        t[0][i] = host_us(t0);
        t0 = kvr_now_ns();
        OK_OR_DIE(kvr_gpu_event_create(0, &ev, err));
        kvr_gpu_event_destroy(ev);
        t[1][i] = host_us(t0);
        t0 = kvr_now_ns();
        mem = malloc(100000);
        memset(mem, 1, 100000);
        free(mem);
        t[2][i] = host_us(t0);
        t0 = kvr_now_ns();
        OK_OR_DIE(kvr__gpu_job_start(0, p->cs, p->pool, &p->j->lay, tb,
                                     &rank, &p->j->pair, srcs, dsts, 1,
                                     &p->j->req, &job, &moved, err));
        t[3][i] = host_us(t0);
        OK_OR_DIE(kvr_gpu_sync(p->cs, err));
        t0 = kvr_now_ns();
        kvr__gpu_job_free(job);
        t[4][i] = host_us(t0);
    }
    kvr__gpu_tables_free(tb);
    printf("  %-16s host calls, medians of 32: set_device %.1f us, event "
           "create+destroy %.1f us, 100 kB malloc+touch+free %.1f us, "
           "job_start %.1f us, job_free %.1f us\n",
           tl_name(p->tl), median(t[0], 32), median(t[1], 32),
           median(t[2], 32), median(t[3], 32), median(t[4], 32));
}

/* gpu-direct: as the agent runs it (tables made when the pull arrives,
 * before the timed part), then with the tables made inside it (how the
 * cell was measured before 2026-12-02), then the kernel alone. */
static void direct_cells(prod_t *p, double ceiling, double *got, int *reps)
{
    bool v;
    p->prep = true;
    *got = measure(p, KVR_EXEC_GPU_DIRECT, reps, &v);
    cell(p, "gpu-direct", *got, ceiling, *reps, v,
         "tables made before the timed part, as the agent makes them when "
         "the pull arrives");
    print_parts(p, "gpu-direct");
    double hs = copy_ceiling(p, true, true);
    cell(p, "d2d-copy-cold-handshake", hs, 0, p->reps, true,
         "the cold copy, each rep after the consumer's exchange as the "
         "executors' reps");
    printf("  %-16s gpu-direct / the copy after the same exchange: %.3f\n",
           tl_name(p->tl), *got / hs);
    p->prep = false;
    int r2 = 0;
    double inside = measure(p, KVR_EXEC_GPU_DIRECT, &r2, &v);
    cell(p, "gpu-direct-tables-inside", inside, ceiling, r2, v,
         "tables made (checked, sorted, uploaded) inside the timed part");
    print_parts(p, "gpu-direct-tables-inside");
    p->prep = true;
    kernel_cell(p, ceiling);
    host_costs(p);
}

/* One executor's cell: its GB/s against the ceiling, into got and reps. */
static void one_cell(prod_t *p, kvr_exec_kind_t kind, double ceiling,
                     double got[KVR_COST_KINDS], int reps[KVR_COST_KINDS])
{
    bool v;
    got[kind] = measure(p, kind, &reps[kind], &v);
    cell(p, kvr_exec_name(kind), got[kind], ceiling, reps[kind], v, NULL);
}

static void prod_cells(prod_t *p)
{
    bool ipc = p->tl != KVR_XFER_TL_TCP;
    uint64_t t0 = kvr_now_ns();
    double put_c = put_ceiling(p);
    double cold = copy_ceiling(p, true, false);
    double warm = copy_ceiling(p, false, false);
    elapsed("ceilings", t0);
    double ceiling = ipc ? cold : put_c;
    char note[160];
    snprintf(note, sizeof(note),
             "ucp_mem_map of the producer's %llu-byte CUDA region: %.3f ms",
             (ull)p->j->src_len, p->reg_s * 1e3);
    cell_n(p, p->j->src_len, "ucx-register-cuda",
           (double)p->j->src_len / p->reg_s / 1e9, 0, 1, true, note);
    cell(p, "ucx-put-ceiling", put_c, 0, p->reps, true,
         "large CUDA-memory puts");
    cell(p, "d2d-copy-cold", cold, 0, p->reps, true,
         "one cudaMemcpyAsync device to device, L2 flushed before each rep, "
         "host-timed launch to completion as the executors are");
    cell(p, "d2d-copy-warm", warm, 0, p->reps, true,
         "the same, straight after the previous copy");
    double got[KVR_COST_KINDS] = {0};
    int reps[KVR_COST_KINDS] = {0};
    /* gpu-direct before anything puts small pieces of CUDA memory through
     * UCX: with cuda_ipc that crashed a producer on the H200
     * (docs/transport.md, CUDA memory) */
    if (ipc)
        direct_cells(p, ceiling, &got[KVR_EXEC_GPU_DIRECT],
                     &reps[KVR_EXEC_GPU_DIRECT]);
    double t[KVR_COST_KINDS];
    t0 = kvr_now_ns();
    kvr_exec_kind_t k = pick(p, ipc, t);
    elapsed("cost model's figures", t0);
    printf("  %-16s cost model (s): direct %.4g gpu-staged %.4g gpu-direct "
           "%.4g -> %s\n",
           tl_name(p->tl), t[KVR_EXEC_DIRECT], t[KVR_EXEC_GPU_STAGED],
           t[KVR_EXEC_GPU_DIRECT], kvr_exec_name(k));
    fprintf(p->js,
            ",\n    {\"transport\": \"%s\", \"executor\": \"cost-model\", "
            "\"predicted_s\": {\"direct\": %.6g, \"gpu-staged\": %.6g, "
            "\"gpu-direct\": %.6g}, \"pick\": \"%s\"}",
            tl_name(p->tl), t[KVR_EXEC_DIRECT], t[KVR_EXEC_GPU_STAGED],
            t[KVR_EXEC_GPU_DIRECT], kvr_exec_name(k));
    fflush(p->js);
    one_cell(p, KVR_EXEC_GPU_STAGED, ceiling, got, reps);
    /* kvrelay's IPC mapping is closed before UCX's direct puts into the
     * same region make UCX's cuda_ipc open it too (--ipc-beside-ucx keeps
     * both) */
    if (p->ipc_dst != NULL && !p->keep_ipc) {
        kvr_gpu_ipc_close(&p->peer.ipc, p->ipc_dst);
        p->ipc_dst = NULL;
    }
    one_cell(p, KVR_EXEC_DIRECT, ceiling, got, reps);
    char name[48];
    snprintf(name, sizeof(name), "picked:%s", kvr_exec_name(k));
    cell(p, name, got[k], ceiling, reps[k], true,
         ipc ? "target: >= 0.8 of a same-size device-to-device copy (cold)"
             : "the pick; gpu-staged's target is >= 0.8 of the put "
               "ceiling");
}

static bool keep_ipc; /* --ipc-beside-ucx */

static int producer(job_t *j, int fd, int tl, int reps, bool first, FILE *js,
                    bool *ok)
{
    prod_t p = {
        .j = j, .fd = fd, .tl = tl, .reps = reps, .js = js, .prep = true};
    p.keep_ipc = keep_ipc;
    p.first_cell = first;
    p.all_ok = true;
    OK_OR_DIE(kvr_gpu_set_device(0, err));
    side_open(&p.s, tl, 1);
    get_all(fd, &p.peer, sizeof(p.peer));
    hello_t *h = calloc(1, sizeof(*h));
    const void *addr;
    size_t len;
    OK_OR_DIE(kvr_xfer_address(p.s.t, &addr, &len));
    h->addr_len = (uint32_t)len;
    memcpy(h->addr, addr, len);
    put_all(fd, h, sizeof(*h));
    free(h);
    if (!p.peer.has_cuda || !kvr_xfer_has_cuda(p.s.t)) {
        printf("UCX %s has no CUDA memory support: skipped\n", p.peer.ucx);
        kvr_transport_destroy(p.s.t);
        return 77;
    }
    prod_setup(&p);
    prod_cells(&p);
    prod_teardown(&p);
    kvr_transport_destroy(p.s.t);
    *ok = p.all_ok;
    return 0;
}

static int wait_child(pid_t pid, const char *who)
{
    int status = 0;
    if (waitpid(pid, &status, 0) != pid || !WIFEXITED(status))
        DIE("%s process failed (status %d)", who, status);
    return WEXITSTATUS(status);
}

static const char *how_ended(int status, char *buf, size_t len)
{
    if (WIFSIGNALED(status))
        snprintf(buf, len, "killed by signal %d", WTERMSIG(status));
    else
        snprintf(buf, len, "exit %d", WEXITSTATUS(status));
    return buf;
}

/* Producer and consumer are both children: CUDA is never initialised in
 * this process, so that every fork starts clean. When either ends badly
 * the other is killed at once (a consumer waiting on a dead producer
 * would sit out its deadline). Returns the producer's exit code (0 all
 * verified, 1 not, 77 no CUDA in UCX), or -1 when a process crashed or
 * died: the pair's cells are then incomplete. */
static int run_pair(job_t *j, int tl, int reps, bool first, FILE *js)
{
    int sv[2];
    if (socketpair(AF_UNIX, SOCK_STREAM, 0, sv) != 0)
        DIE("socketpair: %s", strerror(errno));
    fflush(NULL);
    pid_t cons = fork();
    if (cons == 0) {
        close(sv[0]);
        _exit(consumer(j, sv[1], tl));
    }
    pid_t prod = cons < 0 ? -1 : fork();
    if (prod == 0) {
        close(sv[1]);
        bool ok = false;
        int rc = producer(j, sv[0], tl, reps, first, js, &ok);
        fflush(NULL);
        _exit(rc ? rc : ok ? 0 : 1);
    }
    if (prod < 0)
        DIE("fork: %s", strerror(errno));
    close(sv[0]);
    close(sv[1]);
    int rc = 0, left = 2;
    while (left > 0) {
        int status = 0;
        pid_t w = waitpid(-1, &status, 0);
        if (w < 0 && errno == EINTR)
            continue;
        if (w != prod && w != cons)
            DIE("waitpid: %s", strerror(errno));
        left--;
        bool bad = !WIFEXITED(status) ||
                   (w == cons && WEXITSTATUS(status) != 0) ||
                   (w == prod && WEXITSTATUS(status) != 0 &&
                    WEXITSTATUS(status) != 1 && WEXITSTATUS(status) != 77);
        if (w == prod && !bad)
            rc = WEXITSTATUS(status);
        if (bad) {
            char why[48];
            fprintf(stderr, "%s (%s): %s\n", w == prod ? "producer" : "consumer",
                    tl_name(tl), how_ended(status, why, sizeof(why)));
            if (left > 0)
                kill(w == prod ? cons : prod, SIGKILL);
            rc = -1;
        }
    }
    return rc;
}

/* The card's name from a child (CUDA stays out of this process); exit 77
 * without a device. */
static void card_name(char *name, size_t len)
{
    int fd[2];
    if (pipe(fd) != 0)
        DIE("pipe: %s", strerror(errno));
    fflush(NULL);
    pid_t pid = fork();
    if (pid == 0) {
        int n = 0;
        struct cudaDeviceProp prop;
        if (cudaGetDeviceCount(&n) != cudaSuccess || n == 0 ||
            cudaGetDeviceProperties(&prop, 0) != cudaSuccess)
            _exit(77);
        put_all(fd[1], prop.name, sizeof(prop.name));
        _exit(0);
    }
    close(fd[1]);
    char buf[256] = "";
    if (wait_child(pid, "device query") == 77) {
        printf("no CUDA device: skipped\n");
        exit(77);
    }
    get_all(fd[0], buf, sizeof(buf));
    close(fd[0]);
    snprintf(name, len, "%s", buf);
}

int main(int argc, char **argv)
{
    bool test = false;
    uint64_t tokens = 262144;
    int reps = 5;
    const char *out = NULL;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--test"))
            test = true;
        else if (!strcmp(argv[i], "--tokens") && i + 1 < argc)
            tokens = strtoull(argv[++i], NULL, 10);
        else if (!strcmp(argv[i], "--reps") && i + 1 < argc)
            reps = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--out") && i + 1 < argc)
            out = argv[++i];
        else if (!strcmp(argv[i], "--ipc-beside-ucx"))
            keep_ipc = true;
        else if (!strcmp(argv[i], "--host-check"))
            host_check = true;
        else
            DIE("usage: %s [--test] [--tokens N] [--reps N] [--out FILE] "
                "[--ipc-beside-ucx] [--host-check]; bad argument '%s'",
                argv[0], argv[i]);
    }
    if (test) {
        host_check = true;
        reps = 1;
        tokens = tokens > 8192 ? 8192 : tokens;
    }
    if (tokens == 0 || tokens % (BS * W) != 0 || reps < 1 || reps > 31)
        DIE("--tokens %llu must be a multiple of %d, --reps %d in 1-31",
            (ull)tokens, BS * W, reps);
    setvbuf(stdout, NULL, _IOLBF, 0); /* a killed run keeps its lines */
    char card[256];
    card_name(card, sizeof(card));
    job_t j;
    job_init(&j, tokens);
    FILE *js = out ? fopen(out, "w") : tmpfile();
    if (js == NULL)
        DIE("cannot write %s", out);
    fprintf(js,
            "{\n  \"card\": \"%s\",\n  \"ucx\": \"%s\",\n  \"command\": "
            "\"",
            card, kvr_xfer_ucx_version());
    for (int i = 0; i < argc; i++)
        fprintf(js, "%s%s", i ? " " : "", argv[i]);
    fprintf(js,
            "\",\n  \"W\": %d, \"rank\": 0, \"bs\": %d, \"token_bytes\": %d, "
            "\"tokens\": %llu, \"reps\": %d, \"slot_bytes\": %u, \"slots\": "
            "%u, \"pack_depth\": %u,\n  \"verify\": \"%s\",\n  "
            "\"cells\": [",
            W, BS, TOKEN, (ull)tokens, reps, SLOT, SLOTS, DEPTH,
            host_check ? "every rep: device compare with the expected image "
                         "and kvr_verify_region on the host"
                       : "every rep: device compare with the expected "
                         "image (poisoned on the device)");
    fflush(js);
    off_t cells = lseek(fileno(js), 0, SEEK_CUR);
    printf("%s, UCX %s, rank 0 of W=%d, I=1, %llu tokens of %d B\n",
           card, kvr_xfer_ucx_version(), W, (ull)tokens, TOKEN);
    int tls[2] = {KVR_XFER_TL_TCP, KVR_XFER_TL_AUTO};
    bool all = true, complete = true;
    int rc = 0;
    for (int i = 0; i < 2 && rc != 77; i++) {
        fflush(js); /* the producer writes its cells at the shared offset */
        bool first = lseek(fileno(js), 0, SEEK_CUR) == cells;
        rc = run_pair(&j, tls[i], reps, first, js);
        all = all && rc == 0;
        complete = complete && rc >= 0;
    }
    fprintf(js, "\n  ],\n  \"complete\": %s\n}\n",
            complete ? "true" : "false");
    fclose(js);
    if (rc == 77)
        return 77;
    printf(all ? "every transfer verified\n" : "VERIFY FAILED\n");
    return all ? 0 : 1;
}
