/* Multi-process harness: see xfer_harness.h. */
#include "xfer_harness.h"

#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <sched.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mount.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "plan_fixture.h"

enum { OP_ROUND = 1, OP_QUIT = 2, OP_PROBE = 3 };
#define MSG_PROBE_END 1u
enum { R_MLA, R_INDEX, R_STAGING, R_SCRATCH, R_COUNT };
#define SCRATCH_BYTES (4u << 20)

typedef struct {
    uint32_t op, kind;
    uint64_t tid;
} cmd_t;

/* ---- fixture ---------------------------------------------------------- */

static void fill(unsigned char *buf, uint64_t n, uint64_t seed)
{
    uint64_t x = seed * 0x9e3779b97f4a7c15ull + 1;
    for (uint64_t i = 0; i < n; i += 8) {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        memcpy(buf + i, &x, n - i < 8 ? n - i : 8);
    }
}

int xh_fixture_init(const xh_config_t *cfg, xh_fixture_t *fx)
{
    memset(fx, 0, sizeof(*fx));
    fx->lay = fx_layout(cfg->bs, cfg->W, cfg->I, 1, 1);
    uint64_t nsrc = (cfg->tokens + cfg->bs - 1) / cfg->bs;
    uint64_t ndst = (cfg->tokens + (uint64_t)cfg->bs * cfg->W - 1) /
                    ((uint64_t)cfg->bs * cfg->W);
    fx->pairs[0] = fx_mla(&fx->lay, cfg->token_bytes, nsrc + 3, ndst + 2);
    fx->num_pairs = 1;
    if (cfg->with_index)
        fx->pairs[fx->num_pairs++] = fx_index(&fx->lay, 128, nsrc + 3,
                                              ndst + 2);
    fx->src_blocks = malloc((nsrc + 1) * sizeof(uint32_t));
    fx->dst_blocks = malloc((ndst + 1) * sizeof(uint32_t));
    if (fx->src_blocks == NULL || fx->dst_blocks == NULL)
        return 1;
    unsigned seed = (unsigned)cfg->seed;
    fx_table(fx->src_blocks, nsrc, (uint32_t)nsrc + 3, &seed);
    fx_table(fx->dst_blocks, ndst, (uint32_t)ndst + 2, &seed);
    fx->req = (kvr_request_t){fx->src_blocks, nsrc,        fx->dst_blocks,
                              ndst,           cfg->tokens, 0};
    for (size_t i = 0; i < fx->num_pairs; i++) {
        fx->src_len[i] = kvr_region_bytes(&fx->pairs[i].src);
        fx->dst_len[i] = kvr_region_bytes(&fx->pairs[i].dst);
        fx->src[i] = malloc(fx->src_len[i]);
        if (fx->src[i] == NULL)
            return 1;
        fill(fx->src[i], fx->src_len[i], cfg->seed + i + 1);
    }
    return 0;
}

void xh_fixture_fini(xh_fixture_t *fx)
{
    for (size_t i = 0; i < 2; i++)
        free(fx->src[i]);
    free(fx->src_blocks);
    free(fx->dst_blocks);
    memset(fx, 0, sizeof(*fx));
}

/* ---- framed blobs over a socketpair, every read bounded --------------- */

static int write_all(int fd, const void *p, size_t n)
{
    const char *c = p;
    while (n > 0) {
        ssize_t w = send(
            fd, c, n, MSG_NOSIGNAL); /* a dead peer is an error, not SIGPIPE */
        if (w < 0 && errno == EINTR)
            continue;
        if (w <= 0)
            return -1;
        c += w;
        n -= (size_t)w;
    }
    return 0;
}

static int read_all(int fd, void *p, size_t n, uint64_t deadline)
{
    char *c = p;
    while (n > 0) {
        uint64_t now = kvr_now_ns();
        if (now >= deadline)
            return -1;
        struct pollfd pfd = {.fd = fd, .events = POLLIN};
        int ms = (int)((deadline - now) / 1000000u) + 1;
        if (poll(&pfd, 1, ms) <= 0)
            continue;
        ssize_t r = read(fd, c, n);
        if (r < 0 && errno == EINTR)
            continue;
        if (r <= 0)
            return -1; /* EOF: the other side is gone */
        c += r;
        n -= (size_t)r;
    }
    return 0;
}

static int send_blob(int fd, const void *p, uint32_t n)
{
    return write_all(fd, &n, sizeof(n)) || write_all(fd, p, n) ? -1 : 0;
}

static int recv_blob(int fd, void *p, uint32_t cap, uint32_t *n,
                     uint64_t deadline)
{
    if (read_all(fd, n, sizeof(*n), deadline) != 0 || *n > cap)
        return -1;
    return read_all(fd, p, *n, deadline);
}

static int enter_netns(const char *name, char *why, size_t why_len)
{
    if (name == NULL)
        return 0;
    char path[256];
    snprintf(path, sizeof(path), "/var/run/netns/%s", name);
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0 || setns(fd, CLONE_NEWNET) != 0) {
        snprintf(why, why_len, "cannot enter netns %s: %s", name,
                 strerror(errno));
        if (fd >= 0)
            close(fd);
        return 77;
    }
    close(fd);
    /* UCX lists devices from /sys/class/net, which shows the namespace of
     * whoever mounted /sys: remount it privately, as `ip netns exec` does. */
    if (unshare(CLONE_NEWNS) != 0 ||
        mount("", "/", NULL, MS_SLAVE | MS_REC, NULL) != 0 ||
        umount2("/sys", MNT_DETACH) != 0 ||
        mount(name, "/sys", "sysfs", 0, NULL) != 0) {
        snprintf(why, why_len, "cannot remount /sys in netns %s: %s", name,
                 strerror(errno));
        return 77;
    }
    return 0;
}

/* ---- segments --------------------------------------------------------- */

static size_t consumer_segs(const xh_fixture_t *fx, kvr_plan_set_t *set,
                            kvr_plan_t *ceiling, int kind, kvr_mem_t **mems,
                            kvr_xfer_seg_t *segs)
{
    if (kind == XH_CEILING) {
        segs[0] = (kvr_xfer_seg_t){.plan = ceiling,
                                   .dst_local = kvr_mem_addr(mems[R_MLA])};
        return 1;
    }
    for (size_t i = 0; i < fx->num_pairs; i++)
        segs[i] = (kvr_xfer_seg_t){.plan = kvr_plan_set_plan_of(set, i),
                                   .dst_local = kvr_mem_addr(mems[i])};
    return fx->num_pairs;
}

size_t xh_segs(xh_session_t *s, uint32_t r, int kind, kvr_xfer_seg_t *segs)
{
    if (kind == XH_CEILING) {
        segs[0] = (kvr_xfer_seg_t){.plan = s->ceiling[r],
                                   .src = s->ceiling_src,
                                   .dst = s->rmem[r][R_MLA]};
        return 1;
    }
    for (size_t i = 0; i < s->fx.num_pairs; i++)
        segs[i] = (kvr_xfer_seg_t){.plan = kvr_plan_set_plan_of(s->plans[r], i),
                                   .src = s->fx.src[i],
                                   .dst = s->rmem[r][i]};
    return s->fx.num_pairs;
}

/* One single-run plan of the rank's whole stream: the large-put ceiling. */
static kvr_plan_t *ceiling_plan(const kvr_plan_set_t *set)
{
    kvr_run_t run = {0, 0, kvr_plan_set_total_bytes(set)};
    kvr_plan_t *plan = NULL;
    kvr_plan_from_runs(&run, 1, &plan);
    return plan;
}

static void exec_params(const xh_config_t *cfg, uint64_t tid,
                        kvr_exec_params_t *p, uint32_t *slots)
{
    for (uint32_t i = 0; i < cfg->num_slots; i++)
        slots[i] = i;
    *p = (kvr_exec_params_t)KVR_EXEC_PARAMS_INIT;
    p->transfer_id = tid;
    p->deadline_ns = kvr_deadline_ns(cfg->timeout_ms);
    p->slot_bytes = cfg->slot_bytes;
    p->slots = slots;
    p->num_slots = cfg->num_slots;
}

/* ---- consumer process ------------------------------------------------- */

typedef struct {
    const xh_config_t *cfg;
    uint32_t rank;
    int fd;
    xh_fixture_t fx;
    kvr_transport_t *t;
    kvr_mem_t *mems[R_COUNT];
    void *owned[R_COUNT]; /* registered (not UCX-allocated) memory */
    kvr_ep_t *ep;
    kvr_plan_set_t *set;
    kvr_plan_t *ceiling;
} consumer_t;

static kvr_status_t consumer_region(consumer_t *c, int i, uint64_t len,
                                    bool allocate)
{
    if (allocate)
        return kvr_mem_alloc(c->t, len, &c->mems[i]);
    if (posix_memalign(&c->owned[i], 4096, len) != 0)
        return KVR_ERR_NO_MEMORY;
    memset(c->owned[i], 0, len);
    return kvr_mem_register(c->t, c->owned[i], len, &c->mems[i]);
}

static kvr_status_t consumer_regions(consumer_t *c)
{
    const xh_config_t *cfg = c->cfg;
    kvr_status_t st = consumer_region(c, R_MLA, c->fx.dst_len[0],
                                      cfg->dst_alloc);
    if (st == KVR_OK && c->fx.num_pairs > 1) /* index: always allocated */
        st = consumer_region(c, R_INDEX, c->fx.dst_len[1], true);
    if (st == KVR_OK)
        st = consumer_region(c, R_STAGING,
                             (uint64_t)cfg->slot_bytes * cfg->num_slots, true);
    if (st == KVR_OK)
        st = consumer_region(c, R_SCRATCH, SCRATCH_BYTES, cfg->dst_alloc);
    return st;
}

static int consumer_connect(consumer_t *c)
{
    const void *addr;
    size_t len;
    kvr_remote_region_t desc[R_COUNT];
    memset(desc, 0, sizeof(desc));
    for (int i = 0; i < R_COUNT; i++)
        if (c->mems[i] != NULL && kvr_mem_pack(c->mems[i], &desc[i]) != KVR_OK)
            return 1;
    if (kvr_xfer_address(c->t, &addr, &len) != KVR_OK ||
        send_blob(c->fd, addr, (uint32_t)len) != 0 ||
        send_blob(c->fd, desc, sizeof(desc)) != 0)
        return 1;
    static unsigned char peer[65536];
    uint32_t n;
    if (recv_blob(c->fd, peer, sizeof(peer), &n,
                  kvr_deadline_ns(c->cfg->timeout_ms)) != 0)
        return 1;
    return kvr_ep_create(c->t, peer, n, &c->ep) != KVR_OK;
}

static void consumer_verify(consumer_t *c, xh_result_t *res)
{
    kvr_error_t err = {0};
    res->verify = KVR_OK;
    for (size_t i = 0; i < c->fx.num_pairs && res->verify == KVR_OK; i++)
        res->verify = kvr_verify_region(&c->fx.lay, c->rank, &c->fx.pairs[i],
                                        &c->fx.req, c->fx.src[i],
                                        kvr_mem_addr(c->mems[i]), &err);
    if (res->verify != KVR_OK)
        snprintf(res->msg, sizeof(res->msg), "verify: %.256s", err.msg);
}

static int consumer_round(consumer_t *c, const cmd_t *cmd)
{
    xh_result_t res = {.verify = -1};
    kvr_xfer_seg_t segs[2];
    uint32_t slots[64];
    kvr_exec_params_t p;
    for (size_t i = 0; i < c->fx.num_pairs; i++)
        memset(kvr_mem_addr(c->mems[i]), 0, kvr_mem_len(c->mems[i]));
    size_t n = consumer_segs(&c->fx, c->set, c->ceiling, (int)cmd->kind,
                             c->mems, segs);
    exec_params(c->cfg, cmd->tid, &p, slots);
    p.staging_local = kvr_mem_addr(c->mems[R_STAGING]);
    char ready = 1;
    if (write_all(c->fd, &ready, 1) != 0)
        return 1;
    kvr_error_t err = {0};
    int kind = cmd->kind == XH_CEILING ? KVR_EXEC_DIRECT : (int)cmd->kind;
    res.status = kvr_exec_recv(c->ep, (kvr_exec_kind_t)kind, segs, n, &p, NULL,
                               &err);
    if (res.status != KVR_OK)
        snprintf(res.msg, sizeof(res.msg), "%.256s", err.msg);
    /* verify only once every rank was sent to: it must not steal the CPU
     * from the transfers still being timed */
    if (read_all(c->fd, &ready, 1, kvr_deadline_ns(c->cfg->timeout_ms * 2)))
        return 1;
    if (res.status == KVR_OK && cmd->kind != XH_CEILING)
        consumer_verify(c, &res);
    return write_all(c->fd, &res, sizeof(res));
}

/* Progresses (emulated puts need it) until the producer's probe ends. */
static int consumer_probe(consumer_t *c)
{
    xh_result_t res = {.verify = -1};
    char ready = 1;
    if (write_all(c->fd, &ready, 1) != 0)
        return 1;
    kvr_xfer_msg_t *m = NULL;
    res.status = kvr_xfer_recv_msg(c->t, NULL, NULL, &m,
                                   kvr_deadline_ns(c->cfg->timeout_ms));
    if (res.status == KVR_OK && m->type != MSG_PROBE_END)
        res.status = KVR_ERR_PROTO;
    kvr_xfer_msg_free(m);
    return write_all(c->fd, &res, sizeof(res));
}

static void consumer_fini(consumer_t *c)
{
    kvr_ep_destroy(c->ep);
    for (int i = 0; i < R_COUNT; i++) {
        kvr_mem_destroy(c->mems[i]);
        free(c->owned[i]);
    }
    kvr_transport_destroy(c->t);
    kvr_plan_set_destroy(c->set);
    kvr_plan_destroy(c->ceiling);
    xh_fixture_fini(&c->fx);
}

static int consumer_setup(consumer_t *c)
{
    kvr_ucx_params_t up = KVR_UCX_PARAMS_INIT;
    up.tl = c->cfg->tl;
    up.progress = c->cfg->consumer_thread ? KVR_XFER_PROGRESS_THREAD
                                          : KVR_XFER_PROGRESS_CALLER;
    up.id = c->rank + 1;
    up.net_devices = c->cfg->net_devices;
    kvr_error_t err = {0};
    if (xh_fixture_init(c->cfg, &c->fx) != 0 ||
        kvr_plan_set_create(&c->fx.lay, c->rank, c->fx.pairs, c->fx.num_pairs,
                            &c->fx.req, &c->set, &err) != KVR_OK ||
        (c->ceiling = ceiling_plan(c->set)) == NULL ||
        kvr_transport_ucx_create(&up, &c->t, &err) != KVR_OK ||
        consumer_regions(c) != KVR_OK || consumer_connect(c) != 0) {
        fprintf(stderr, "consumer %u: setup failed: %s %s\n", c->rank, err.msg,
                kvr_xfer_last_error(c->t));
        return 1;
    }
    return 0;
}

static int consumer_main(const xh_config_t *cfg, uint32_t rank, int fd)
{
    consumer_t c = {.cfg = cfg, .rank = rank, .fd = fd};
    char why[256];
    if (enter_netns(cfg->consumer_netns, why, sizeof(why)) != 0) {
        fprintf(stderr, "consumer %u: %s\n", rank, why);
        return 77;
    }
    int rc = consumer_setup(&c);
    while (rc == 0) {
        cmd_t cmd;
        /* the parent may be busy with the other ranks for a while */
        if (read_all(fd, &cmd, sizeof(cmd),
                     kvr_deadline_ns(cfg->timeout_ms * (cfg->W + 4))) != 0)
            rc = 1;
        else if (cmd.op == OP_QUIT)
            break;
        else if (cmd.op == OP_PROBE)
            rc = consumer_probe(&c);
        else
            rc = consumer_round(&c, &cmd);
    }
    consumer_fini(&c);
    return rc;
}

/* ---- producer (parent) ------------------------------------------------ */

static int spawn(xh_session_t *s, uint32_t r)
{
    int sv[2];
    if (socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, sv) != 0)
        return 1;
    fflush(NULL);
    pid_t pid = fork();
    if (pid < 0) {
        close(sv[0]);
        close(sv[1]);
        return 1;
    }
    if (pid == 0) {
        close(sv[0]);
        for (uint32_t i = 0; i < r; i++)
            close(s->fds[i]);
        exit(consumer_main(&s->cfg, r,
                           sv[1])); /* exit: LeakSanitizer checks the child */
    }
    close(sv[1]);
    s->pids[r] = pid;
    s->fds[r] = sv[0];
    return 0;
}

static int connect_rank(xh_session_t *s, uint32_t r)
{
    static unsigned char addr[65536];
    kvr_remote_region_t desc[R_COUNT];
    uint32_t n, dn;
    uint64_t deadline = kvr_deadline_ns(s->cfg.timeout_ms + 10000);
    const void *mine;
    size_t mine_len;
    if (recv_blob(s->fds[r], addr, sizeof(addr), &n, deadline) != 0 ||
        recv_blob(s->fds[r], desc, sizeof(desc), &dn, deadline) != 0 ||
        dn != sizeof(desc) ||
        kvr_xfer_address(s->t, &mine, &mine_len) != KVR_OK ||
        send_blob(s->fds[r], mine, (uint32_t)mine_len) != 0) {
        snprintf(s->error, sizeof(s->error), "rank %u: no address exchange", r);
        return 1;
    }
    if (kvr_ep_create(s->t, addr, n, &s->eps[r]) != KVR_OK)
        goto transport_error;
    for (int i = 0; i < R_COUNT; i++)
        if (desc[i].rkey_len != 0 &&
            kvr_rmem_open(s->eps[r], &desc[i], &s->rmem[r][i]) != KVR_OK)
            goto transport_error;
    return 0;
transport_error:
    snprintf(s->error, sizeof(s->error), "rank %u: %.256s", r,
             kvr_xfer_last_error(s->t));
    return 1;
}

static int producer_setup(xh_session_t *s)
{
    kvr_ucx_params_t up = KVR_UCX_PARAMS_INIT;
    up.tl = s->cfg.tl;
    up.net_devices = s->cfg.net_devices;
    kvr_error_t err = {0};
    if (xh_fixture_init(&s->cfg, &s->fx) != 0 ||
        kvr_transport_ucx_create(&up, &s->t, &err) != KVR_OK) {
        snprintf(s->error, sizeof(s->error), "producer: %.256s", err.msg);
        return 1;
    }
    uint64_t most = 0;
    for (uint32_t r = 0; r < s->cfg.W; r++) {
        if (connect_rank(s, r) != 0)
            return 1;
        if (kvr_plan_set_create(&s->fx.lay, r, s->fx.pairs, s->fx.num_pairs,
                                &s->fx.req, &s->plans[r], &err) != KVR_OK ||
            (s->ceiling[r] = ceiling_plan(s->plans[r])) == NULL) {
            snprintf(s->error, sizeof(s->error), "plan rank %u: %.256s", r,
                     err.msg);
            return 1;
        }
        uint64_t b = kvr_plan_bytes(s->ceiling[r]);
        most = b > most ? b : most;
    }
    s->ceiling_src = malloc(most + 1);
    if (s->ceiling_src == NULL)
        return 1;
    fill(s->ceiling_src, most + 1, 7);
    return 0;
}

int xh_start(xh_session_t *s, const xh_config_t *cfg)
{
    memset(s, 0, sizeof(*s));
    s->cfg = *cfg;
    s->next_tid = 1;
    for (uint32_t r = 0; r < XH_MAX_RANKS; r++)
        s->fds[r] = -1;
    if (cfg->W == 0 || cfg->W > XH_MAX_RANKS || cfg->num_slots > 64)
        return 1;
    for (uint32_t r = 0; r < cfg->W; r++)
        if (spawn(s, r) != 0)
            return 1;
    int rc = enter_netns(cfg->producer_netns, s->error, sizeof(s->error));
    if (rc == 0)
        rc = producer_setup(s);
    return rc;
}

static kvr_status_t send_rank(xh_session_t *s, uint32_t r, int kind,
                              uint64_t tid, double *secs)
{
    kvr_xfer_seg_t segs[2];
    uint32_t slots[64];
    kvr_exec_params_t p;
    size_t n = xh_segs(s, r, kind, segs);
    exec_params(&s->cfg, tid, &p, slots);
    p.staging = s->rmem[r][R_STAGING];
    kvr_error_t err = {0};
    uint64_t t0 = kvr_now_ns();
    kvr_status_t st = kvr_exec_send(
        s->eps[r], kind == XH_CEILING ? KVR_EXEC_DIRECT : (kvr_exec_kind_t)kind,
        segs, n, &p, NULL, &err);
    if (secs != NULL)
        secs[r] = (double)(kvr_now_ns() - t0) * 1e-9;
    if (st != KVR_OK)
        snprintf(s->error, sizeof(s->error), "producer rank %u: %.256s", r,
                 err.msg);
    return st;
}

kvr_status_t xh_round(xh_session_t *s, int kind, double *secs,
                      xh_result_t *results)
{
    uint64_t tid = s->next_tid;
    s->next_tid += s->cfg.W;
    uint64_t deadline = kvr_deadline_ns(s->cfg.timeout_ms);
    kvr_status_t first = KVR_OK;
    for (uint32_t r = 0; r < s->cfg.W; r++) {
        cmd_t cmd = {.op = OP_ROUND, .kind = (uint32_t)kind, .tid = tid + r};
        char ready;
        if (write_all(s->fds[r], &cmd, sizeof(cmd)) != 0 ||
            read_all(s->fds[r], &ready, 1, deadline) != 0)
            first = KVR_ERR_PEER_DEAD;
    }
    for (uint32_t r = 0; r < s->cfg.W && first == KVR_OK; r++)
        first = send_rank(s, r, kind, tid + r, secs);
    for (uint32_t r = 0; r < s->cfg.W; r++) {
        char go = 1;
        write_all(s->fds[r], &go, 1);
    }
    for (uint32_t r = 0; r < s->cfg.W; r++) {
        xh_result_t res = {.status = KVR_ERR_PEER_DEAD, .verify = -1};
        if (read_all(s->fds[r], &res, sizeof(res),
                     kvr_deadline_ns(s->cfg.timeout_ms + 2000)) != 0)
            res.status = KVR_ERR_PEER_DEAD;
        if (results != NULL)
            results[r] = res;
        if (first == KVR_OK && res.status != KVR_OK)
            first = (kvr_status_t)res.status;
        if (first == KVR_OK && res.verify != KVR_OK && kind != XH_CEILING)
            first = KVR_ERR_VERIFY;
    }
    return first;
}

kvr_status_t xh_probe(xh_session_t *s, uint32_t r, kvr_cost_model_t *out)
{
    return xh_probe_lean(s, r, false, out);
}

kvr_status_t xh_probe_lean(xh_session_t *s, uint32_t r, bool lean,
                           kvr_cost_model_t *out)
{
    cmd_t cmd = {.op = OP_PROBE};
    char ready;
    uint64_t deadline = kvr_deadline_ns(s->cfg.timeout_ms);
    if (write_all(s->fds[r], &cmd, sizeof(cmd)) != 0 ||
        read_all(s->fds[r], &ready, 1, deadline) != 0)
        return KVR_ERR_PEER_DEAD;
    kvr_cost_probe_t probe = {.scratch = s->rmem[r][R_SCRATCH],
                              .stage_scratch = s->rmem[r][R_STAGING],
                              .small_bytes = s->cfg.token_bytes,
                              .small_count = 512,
                              .large_bytes = SCRATCH_BYTES,
                              .deadline_ns = deadline,
                              .lean = lean};
    if (s->cfg.slot_bytes * s->cfg.num_slots < SCRATCH_BYTES)
        probe.stage_scratch = NULL;
    kvr_error_t err = {0};
    kvr_status_t st = kvr_cost_measure(s->eps[r], &probe, out, &err);
    if (st != KVR_OK)
        snprintf(s->error, sizeof(s->error), "probe: %.256s", err.msg);
    kvr_status_t sent = kvr_xfer_send_msg(s->eps[r], MSG_PROBE_END, NULL, 0,
                                          deadline);
    xh_result_t res = {.status = KVR_ERR_PEER_DEAD};
    read_all(s->fds[r], &res, sizeof(res), kvr_deadline_ns(s->cfg.timeout_ms));
    if (st == KVR_OK)
        st = sent != KVR_OK ? sent : (kvr_status_t)res.status;
    return st;
}

/* Waits for every child until the deadline, then kills what is left. */
static int reap(xh_session_t *s, uint64_t deadline)
{
    int rc = 0;
    for (uint32_t r = 0; r < s->cfg.W; r++) {
        int status = 0;
        pid_t got = 0;
        while (s->pids[r] > 0 &&
               (got = waitpid(s->pids[r], &status, WNOHANG)) == 0 &&
               kvr_now_ns() < deadline) {
            struct timespec ts = {0, 5000000};
            nanosleep(&ts, NULL);
        }
        if (s->pids[r] > 0 && got == 0) {
            kill(s->pids[r], SIGKILL);
            waitpid(s->pids[r], &status, 0);
            rc = 1;
        }
        if (s->pids[r] > 0 && (!WIFEXITED(status) || WEXITSTATUS(status) != 0))
            rc = 1;
        s->pids[r] = 0;
    }
    return rc;
}

int xh_stop(xh_session_t *s)
{
    for (uint32_t r = 0; r < s->cfg.W; r++) {
        cmd_t cmd = {.op = OP_QUIT};
        if (s->fds[r] >= 0)
            write_all(s->fds[r], &cmd, sizeof(cmd));
    }
    for (uint32_t r = 0; r < XH_MAX_RANKS; r++) {
        for (int i = 0; i < R_COUNT; i++)
            kvr_rmem_close(s->rmem[r][i]);
        kvr_ep_destroy(s->eps[r]);
        kvr_plan_set_destroy(s->plans[r]);
        kvr_plan_destroy(s->ceiling[r]);
    }
    int rc = reap(s, kvr_deadline_ns(s->cfg.timeout_ms + 5000));
    for (uint32_t r = 0; r < XH_MAX_RANKS; r++)
        if (s->fds[r] >= 0)
            close(s->fds[r]);
    kvr_transport_destroy(s->t);
    free(s->ceiling_src);
    xh_fixture_fini(&s->fx);
    return rc;
}
