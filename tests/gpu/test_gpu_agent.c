/* The agent's gpu-direct path on one GPU: a producer agent (this process)
 * and two decode ranks (DCP 2, two child processes: CUDA IPC maps another
 * process's memory) with their KV in device memory. The ranks pull two
 * requests before the producer's prefill is done; the producer's "prefill"
 * is a long queue of memsets followed by the copies of the source KV on an
 * engine stream, and send_ready hands over the event recorded after them
 * without synchronising. Each rank checks every byte it received (the
 * plan's verifier against the source it regenerates): the scatter kernels
 * must have run after the event, or they would have read the poison.
 * Fork happens before anyone touches CUDA. Exit 77 without a device.
 * `test_gpu_agent --no-event` hands over no event for the first request
 * (the device copy is then not ordered after the prefill) and must fail:
 * the proof that the check can see a copy made too early.
 * `--tcp-staged` and `--tcp` take the network path instead (tl tcp: UCX
 * limited to tcp,cuda_copy, no CUDA IPC): the decode ranks register a CUDA
 * STAGING region and force gpu-staged, or leave the choice between
 * gpu-staged and direct puts to the producer's cost model. Exit 77 when
 * the UCX cannot move CUDA memory (the reason printed).
 * `--many` loads MANY small requests of different sizes in waves of
 * WAVE (several pulls in flight, each completion woken by its host
 * function, table blocks of the agent's pool reused by the next wave with
 * other sizes); every byte of each is checked the same way, and each
 * rank prints its round trips (not asserted: no wall-clock test). */
#include <cuda_runtime_api.h>
#include <poll.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "gpu_test.h"
#include "kvrelay/agent.h"
#include "kvrelay/plan.h"
#include "kvrelay/synth.h"

#define CUDA_OK(call)                                                          \
    do {                                                                       \
        cudaError_t e_ = (call);                                               \
        CHECK(e_ == cudaSuccess, "%s: %s", #call, cudaGetErrorString(e_));     \
    } while (0)

enum {
    LAYERS = 4,
    TOKEN_BYTES = 96,
    INDEX_DIM = 64,
    SRC_POOL = 256,
    DST_POOL = 192,
    RANKS = 2,
    REQS = 2,
    MANY = 16,
    WAVE = 4,
    MAX_REGIONS = 8
};
static const uint64_t TOKENS[REQS] = {300, 173};
static bool many; /* --many */
static uint32_t nreqs = REQS;
/* 0: gpu-direct (CUDA IPC); 1: tcp, the cost model's choice; 2: tcp,
 * gpu-staged forced */
static int net_mode;
#define SLOT_BYTES (16u << 10) /* small: many chunks, the pipeline runs */
static const char *const IDS[REQS] = {"req-event", "req-plain"};

/* Request i's id (the two of the default run, or "many-i"). */
static const char *id_of(uint32_t i)
{
    static char buf[MANY][16];
    if (!many)
        return IDS[i];
    snprintf(buf[i], sizeof(buf[i]), "many-%u", i);
    return buf[i];
}

/* 1 to 15 blocks of 16, never two neighbours alike. */
static uint64_t tokens_of(uint32_t i)
{
    return many ? 5 + (uint64_t)(i * 37u) % 235u : TOKENS[i];
}

typedef struct side {
    kvr_agent_t *agent;
    kvr_region_desc_t desc[MAX_REGIONS];
    void *base[MAX_REGIONS]; /* device */
    uint32_t n;
} side_t;

typedef struct req {
    uint32_t src[SRC_POOL], dst[DST_POOL];
    uint32_t nsrc, ndst;
    uint64_t tokens;
} req_t;

static kvr_layout_t layout(void)
{
    kvr_layout_t l = KVR_LAYOUT_INIT;
    l.block_size = 16;
    l.dcp_size = RANKS;
    l.interleave = 1;
    l.tp = RANKS;
    l.producer_tp = 1;
    l.replicate_index = true;
    l.preshuffle = true;
    return l;
}

static uint64_t now_us(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000u + (uint64_t)ts.tv_nsec / 1000u;
}

static uint64_t now_ms(void)
{
    return now_us() / 1000u;
}

/* Request i: permuted tables, disjoint from request j's. */
static void make_req(const kvr_layout_t *lay, uint32_t i, req_t *r)
{
    memset(r, 0, sizeof(*r));
    r->tokens = tokens_of(i);
    r->nsrc = (uint32_t)kvr_num_src_blocks(lay, r->tokens);
    r->ndst = (uint32_t)kvr_num_dst_blocks(lay, r->tokens);
    CHECK(r->nsrc <= SRC_POOL / nreqs && r->ndst <= DST_POOL / nreqs, "sizes");
    for (uint32_t k = 0; k < r->nsrc; k++)
        r->src[k] = i * (SRC_POOL / nreqs) + r->nsrc - 1 - k;
    for (uint32_t k = 0; k < r->ndst; k++)
        r->dst[k] = i * (DST_POOL / nreqs) +
                    (k % 2 ? r->ndst - 1 - k / 2 : k / 2);
}

static kvr_region_desc_t region(const kvr_layout_t *lay, kvr_role_t role,
                                uint32_t layer, bool consumer)
{
    kvr_region_desc_t d = {.role = role,
                           .layer = layer,
                           .num_blocks = consumer ? DST_POOL : SRC_POOL};
    if (role == KVR_ROLE_MLA) {
        d.page_bytes = (uint64_t)lay->block_size * TOKEN_BYTES;
    } else {
        d.index_dim = d.quant_block = INDEX_DIM;
        d.page_bytes = kvr_index_page_tokens(lay, consumer) *
                       kvr_index_stride(INDEX_DIM);
    }
    return d;
}

/* MLA on every layer, INDEX on even ones, in device memory set to poison
 * (those already there, first, stay). */
static void add_regions(const kvr_layout_t *lay, side_t *s, bool consumer)
{
    uint32_t have = s->n;
    for (uint32_t l = 0; l < LAYERS; l++)
        for (int k = 0; k < 1 + (l % 2 == 0); k++) {
            if (have > 0) {
                have--; /* network_ok added MLA layer 0 */
                continue;
            }
            kvr_region_desc_t d = region(lay, k ? KVR_ROLE_INDEX : KVR_ROLE_MLA,
                                         l, consumer);
            s->desc[s->n] = d;
            CHECK(kvr_agent_alloc_region(s->agent, &d, 0, &s->base[s->n]) ==
                      KVR_OK,
                  "alloc: %s", kvr_agent_last_error(s->agent));
            CUDA_OK(cudaMemset(s->base[s->n], 0xee, kvr_region_bytes(&d)));
            s->n++;
        }
    CUDA_OK(cudaDeviceSynchronize());
}

static void create(side_t *s, kvr_agent_params_t *p)
{
    kvr_error_t err = {0};
    memset(s, 0, sizeof(*s));
    p->cuda_device = 0;
    if (net_mode != 0) {
        p->tl = KVR_AGENT_TL_TCP;
        if (p->role == KVR_AGENT_CONSUMER && net_mode == 2)
            p->executor = KVR_AGENT_EXEC_STAGED;
    }
    p->deadline_ms = 30000;
    p->unknown_wait_ms = 30000;
    CHECK(kvr_agent_create(p, &s->agent, &err) == KVR_OK, "create: %s",
          err.msg);
}

/* Request i's source KV for region d, as host bytes. */
static unsigned char *source_image(const kvr_layout_t *lay,
                                   const kvr_region_desc_t *d, uint32_t i,
                                   const req_t *r)
{
    unsigned char *img = xmalloc(kvr_region_bytes(d));
    uint32_t ids[512];
    kvr_error_t err = {0};
    CHECK(r->tokens <= 512, "tokens");
    memset(img, 0, kvr_region_bytes(d));
    for (uint64_t g = 0; g < r->tokens; g++)
        ids[g] = i * 100000u + (uint32_t)g;
    CHECK(kvr_synth_fill_source(lay, d, 77 + i, r->src, r->nsrc, ids, r->tokens,
                                img, &err) == KVR_OK,
          "fill: %s", err.msg);
    return img;
}

static kvr_agent_event_t wait_event(kvr_agent_t *a, const char *id,
                                    kvr_agent_event_kind_t kind)
{
    kvr_agent_event_t ev;
    uint64_t end = now_ms() + 60000;
    for (;;) {
        while (kvr_agent_poll(a, &ev)) {
            bool mine = ev.request.len == strlen(id) &&
                        memcmp(ev.request.bytes, id, ev.request.len) == 0;
            CHECK(!mine || ev.status == KVR_OK || kind == ev.kind,
                  "'%s': %s %s: %s", id, kvr_agent_event_name(ev.kind),
                  kvr_status_name(ev.status), ev.message);
            if (mine && ev.kind == kind)
                return ev;
        }
        CHECK(now_ms() < end, "no %s for '%s'", kvr_agent_event_name(kind), id);
        struct pollfd p = {.fd = kvr_agent_event_fd(a), .events = POLLIN};
        poll(&p, 1, 50);
    }
}

/* ---- a decode rank (child) ---- */

static void recv_one(side_t *s, const kvr_layout_t *lay, const char *addr,
                     uint32_t i, req_t *r)
{
    make_req(lay, i, r);
    const char *id = id_of(i);
    kvr_agent_recv_t q = {"prefill", 7,         addr, id, strlen(id), r->dst,
                          r->ndst,   r->tokens, 0,    0,  false};
    CHECK(kvr_agent_recv(s->agent, &q) == KVR_OK, "recv: %s",
          kvr_agent_last_error(s->agent));
}

static int cmp_u64(const void *a, const void *b)
{
    uint64_t x = *(const uint64_t *)a, y = *(const uint64_t *)b;
    return (x > y) - (x < y);
}

/* --many: waves of WAVE requests, each wave's loads all asked at once and
 * all LOADED and RELEASED before the next; returns the bytes loaded. */
static uint64_t rank_many(side_t *s, const kvr_layout_t *lay, const char *addr,
                          req_t *r)
{
    uint64_t bytes = 0, us[MANY];
    for (uint32_t w = 0; w < MANY; w += WAVE) {
        uint64_t t0 = now_us();
        for (uint32_t i = w; i < w + WAVE; i++)
            recv_one(s, lay, addr, i, &r[i]);
        for (uint32_t i = w; i < w + WAVE; i++) {
            bytes += wait_event(s->agent, id_of(i), KVR_AGENT_LOADED).bytes;
            us[i] = now_us() - t0;
            wait_event(s->agent, id_of(i), KVR_AGENT_RELEASED);
        }
    }
    qsort(us, MANY, sizeof(us[0]), cmp_u64);
    printf("test_gpu_agent: --many: %u loads in waves of %u, recv to "
           "LOADED p50 %llu us, max %llu us\n",
           MANY, WAVE, (unsigned long long)us[MANY / 2],
           (unsigned long long)us[MANY - 1]);
    return bytes;
}

static int rank_main(uint32_t rank, int in_fd, int out_fd)
{
    char addr[256] = "";
    ssize_t got = read(in_fd, addr, sizeof(addr) - 1);
    if (got <= 0 || addr[0] == '\0')
        return 77; /* no device: the producer said so */
    kvr_layout_t lay = layout();
    kvr_agent_params_t p = KVR_AGENT_PARAMS_INIT;
    p.instance_id = "decode";
    p.instance_id_len = 6;
    p.role = KVR_AGENT_CONSUMER;
    p.layout = lay;
    p.topo = (kvr_wire_topo_t){.pp_rank = 0,
                               .pp_size = 1,
                               .tp_rank = rank,
                               .tp_size = RANKS,
                               .dp_rank = 0,
                               .dp_size = 1,
                               .layer_start = 0,
                               .layer_end = LAYERS,
                               .dcp_rank = rank};
    side_t s;
    create(&s, &p);
    add_regions(&lay, &s, true);
    if (net_mode != 0) {
        kvr_region_desc_t st = {.role = KVR_ROLE_STAGING,
                                .num_blocks = 5,
                                .page_bytes = SLOT_BYTES};
        void *base = NULL;
        CHECK(kvr_agent_alloc_region(s.agent, &st, 0, &base) == KVR_OK,
              "staging: %s", kvr_agent_last_error(s.agent));
    }
    CHECK(kvr_agent_start(s.agent) == KVR_OK, "start: %s",
          kvr_agent_last_error(s.agent));
    req_t r[MANY];
    uint64_t bytes = 0;
    if (many) {
        bytes = rank_many(&s, &lay, addr, r);
        char one = 1;
        CHECK(write(out_fd, &one, 1) == 1, "pipe");
    } else {
        for (uint32_t i = 0; i < REQS; i++)
            recv_one(&s, &lay, addr, i, &r[i]);
        char one = 1;
        CHECK(write(out_fd, &one, 1) == 1, "pipe");
        for (uint32_t i = 0; i < REQS; i++) {
            bytes += wait_event(s.agent, IDS[i], KVR_AGENT_LOADED).bytes;
            wait_event(s.agent, IDS[i], KVR_AGENT_RELEASED);
        }
    }
    /* every byte against the source, regenerated here */
    for (uint32_t i = 0; i < nreqs; i++)
        for (uint32_t k = 0; k < s.n; k++) {
            kvr_region_desc_t sd = region(&lay, s.desc[k].role, s.desc[k].layer,
                                          false);
            unsigned char *src = source_image(&lay, &sd, i, &r[i]);
            unsigned char *dst = xmalloc(kvr_region_bytes(&s.desc[k]));
            CUDA_OK(cudaMemcpy(dst, s.base[k], kvr_region_bytes(&s.desc[k]),
                               cudaMemcpyDeviceToHost));
            kvr_region_pair_t pair = {sd, s.desc[k]};
            kvr_request_t req = {r[i].src,  r[i].nsrc,   r[i].dst,
                                 r[i].ndst, r[i].tokens, 0};
            kvr_error_t err = {0};
            CHECK(kvr_verify_region(&lay, rank, &pair, &req, src, dst, &err) ==
                      KVR_OK,
                  "rank %u '%s' %s layer %u: %s", rank, id_of(i),
                  kvr_role_name(s.desc[k].role), s.desc[k].layer, err.msg);
            free(src);
            free(dst);
        }
    printf("test_gpu_agent: rank %u verified %u requests, %llu bytes, %s\n",
           rank, nreqs, (unsigned long long)bytes,
           net_mode == 0   ? "gpu-direct"
           : net_mode == 1 ? "tcp,cuda_copy (cost model's choice)"
                           : "tcp,cuda_copy gpu-staged");
    fflush(stdout); /* the child leaves through _exit */
    kvr_agent_destroy(s.agent);
    return 0;
}

/* ---- the producer (parent) ---- */

/* The network path needs a UCX that moves CUDA memory: registering a
 * region says (ERR_UNSUPPORTED naming the UCX otherwise). The region stays
 * as the first of the producer's. */
static bool network_ok(const kvr_layout_t *lay, side_t *s)
{
    kvr_region_desc_t d = region(lay, KVR_ROLE_MLA, 0, false);
    void *base = NULL;
    kvr_status_t st = kvr_agent_alloc_region(s->agent, &d, 0, &base);
    if (st == KVR_ERR_UNSUPPORTED) {
        printf("test_gpu_agent: SKIP, the network path needs a UCX built "
               "with CUDA: %s\n",
               kvr_agent_last_error(s->agent));
        return false;
    }
    CHECK(st == KVR_OK, "alloc: %s", kvr_agent_last_error(s->agent));
    s->desc[0] = d;
    s->base[0] = base;
    CUDA_OK(cudaMemset(base, 0xee, kvr_region_bytes(&d)));
    s->n = 1;
    return true;
}

/* A host function on the engine stream: the stream stalls this long, as
 * if a forward pass were running (no CUDA call in here). */
static void CUDART_CB stall(void *ms)
{
    usleep((useconds_t)(uintptr_t)ms * 1000u);
}

/* The engine's prefill: a stall and a queue of memsets, then the request's
 * source blocks of each region copied in from pinned images (made first:
 * nothing that may synchronise comes between the launches); the event
 * marks its end. Nothing waits for it here. Returns the pinned images. */
static unsigned char **prefill(const kvr_layout_t *lay, const side_t *s,
                               const req_t *r, uint32_t i, cudaStream_t engine,
                               void *scratch, size_t scratch_len,
                               cudaEvent_t done)
{
    unsigned char **pinned = xmalloc(s->n * sizeof(*pinned));
    for (uint32_t k = 0; k < s->n; k++) {
        size_t len = kvr_region_bytes(&s->desc[k]);
        unsigned char *img = source_image(lay, &s->desc[k], i, r);
        CUDA_OK(cudaMallocHost((void **)&pinned[k], len));
        memcpy(pinned[k], img, len);
        free(img);
    }
    CUDA_OK(cudaLaunchHostFunc(engine, stall, (void *)(uintptr_t)300));
    for (int k = 0; k < 8; k++)
        CUDA_OK(cudaMemsetAsync(scratch, k, scratch_len, engine));
    for (uint32_t k = 0; k < s->n; k++)
        for (uint32_t b = 0; b < r->nsrc; b++) { /* other requests' stay */
            size_t off = (size_t)r->src[b] * s->desc[k].page_bytes;
            CUDA_OK(cudaMemcpyAsync((unsigned char *)s->base[k] + off,
                                    pinned[k] + off, s->desc[k].page_bytes,
                                    cudaMemcpyHostToDevice, engine));
        }
    CUDA_OK(cudaEventRecord(done, engine));
    return pinned;
}

static void free_pinned(unsigned char **pinned, uint32_t n)
{
    for (uint32_t k = 0; k < n; k++)
        CUDA_OK(cudaFreeHost(pinned[k]));
    free(pinned);
}

/* --many: every request's source in place and ready before the ranks
 * ask; SENT for each once both ranks pulled it. */
static void producer_many(const kvr_layout_t *lay, side_t *s,
                          const int *to_rank, const int *from_rank)
{
    req_t r[MANY];
    for (uint32_t i = 0; i < MANY; i++) {
        make_req(lay, i, &r[i]);
        for (uint32_t k = 0; k < s->n; k++) {
            unsigned char *img = source_image(lay, &s->desc[k], i, &r[i]);
            for (uint32_t b = 0; b < r[i].nsrc; b++) {
                size_t off = (size_t)r[i].src[b] * s->desc[k].page_bytes;
                CUDA_OK(cudaMemcpy((unsigned char *)s->base[k] + off, img + off,
                                   s->desc[k].page_bytes,
                                   cudaMemcpyHostToDevice));
            }
            free(img);
        }
        const char *id = id_of(i);
        kvr_agent_send_t o = {id,          strlen(id), r[i].src, r[i].nsrc,
                              r[i].tokens, 0,          1};
        CHECK(kvr_agent_send_open(s->agent, &o) == KVR_OK, "open: %s",
              kvr_agent_last_error(s->agent));
        CHECK(kvr_agent_send_ready(s->agent, id, strlen(id), 0, LAYERS, NULL) ==
                  KVR_OK,
              "ready: %s", kvr_agent_last_error(s->agent));
    }
    const char *addr = kvr_agent_address(s->agent);
    for (int k = 0; k < RANKS; k++)
        CHECK(write(to_rank[k], addr, strlen(addr) + 1) > 0, "pipe");
    for (uint32_t i = 0; i < MANY; i++)
        wait_event(s->agent, id_of(i), KVR_AGENT_SENT);
    for (int k = 0; k < RANKS; k++) {
        char one = 0;
        CHECK(read(from_rank[k], &one, 1) == 1 && one == 1, "rank %d failed",
              k);
    }
}

static int producer_main(const int *to_rank, const int *from_rank,
                         bool use_event)
{
    int devices = 0;
    kvr_error_t err = {0};
    CHECK(kvr_gpu_device_count(&devices, &err) == KVR_OK, "%s", err.msg);
    if (devices == 0) {
        for (int k = 0; k < RANKS; k++)
            CHECK(write(to_rank[k], "", 1) == 1, "pipe");
        return 77;
    }
    kvr_layout_t lay = layout();
    kvr_agent_params_t p = KVR_AGENT_PARAMS_INIT;
    p.instance_id = "prefill";
    p.instance_id_len = 7;
    p.role = KVR_AGENT_PRODUCER;
    p.layout = lay;
    p.listen = "127.0.0.1:0";
    p.topo = (kvr_wire_topo_t){.pp_rank = 0,
                               .pp_size = 1,
                               .tp_rank = 0,
                               .tp_size = 1,
                               .dp_rank = 0,
                               .dp_size = 1,
                               .layer_start = 0,
                               .layer_end = LAYERS};
    side_t s;
    create(&s, &p);
    if (net_mode != 0 && !network_ok(&lay, &s)) {
        for (int k = 0; k < RANKS; k++)
            CHECK(write(to_rank[k], "", 1) == 1, "pipe");
        kvr_agent_destroy(s.agent);
        return 77;
    }
    add_regions(&lay, &s, false);
    CHECK(kvr_agent_start(s.agent) == KVR_OK, "start: %s",
          kvr_agent_last_error(s.agent));
    if (many) {
        producer_many(&lay, &s, to_rank, from_rank);
        kvr_agent_destroy(s.agent);
        return 0;
    }
    req_t r[REQS];
    for (uint32_t i = 0; i < REQS; i++) {
        make_req(&lay, i, &r[i]);
        kvr_agent_send_t o = {
            IDS[i], strlen(IDS[i]), r[i].src, r[i].nsrc, r[i].tokens, 0, 1};
        CHECK(kvr_agent_send_open(s.agent, &o) == KVR_OK, "open: %s",
              kvr_agent_last_error(s.agent));
    }
    const char *addr = kvr_agent_address(s.agent);
    for (int k = 0; k < RANKS; k++)
        CHECK(write(to_rank[k], addr, strlen(addr) + 1) > 0, "pipe");
    for (int k = 0; k < RANKS; k++) {
        char one = 0;
        CHECK(read(from_rank[k], &one, 1) == 1 && one == 1, "rank %d failed",
              k);
    }
    usleep(300 * 1000); /* their pulls arrive and are held (not ready) */
    cudaStream_t engine;
    cudaEvent_t done;
    void *scratch = NULL;
    size_t scratch_len = (size_t)1 << 30;
    CUDA_OK(cudaStreamCreateWithFlags(&engine, cudaStreamNonBlocking));
    CUDA_OK(cudaEventCreateWithFlags(&done, cudaEventDisableTiming));
    CUDA_OK(cudaMalloc(&scratch, scratch_len));
    /* request 0: ready by event, at once; request 1: after a host sync,
     * without an event */
    unsigned char **pinned = prefill(&lay, &s, &r[0], 0, engine, scratch,
                                     scratch_len, done);
    uint64_t t0 = now_ms();
    CHECK(kvr_agent_send_ready(s.agent, IDS[0], strlen(IDS[0]), 0, LAYERS,
                               use_event ? done : NULL) == KVR_OK,
          "ready: %s", kvr_agent_last_error(s.agent));
    wait_event(s.agent, IDS[0], KVR_AGENT_SENT);
    printf("test_gpu_agent: '%s' sent %llu ms after send_ready (%s)\n", IDS[0],
           (unsigned long long)(now_ms() - t0),
           use_event ? "ordered after the engine's event" : "no event");
    CUDA_OK(cudaStreamSynchronize(engine));
    free_pinned(pinned, s.n);
    pinned = prefill(&lay, &s, &r[1], 1, engine, scratch, 1 << 20, done);
    CUDA_OK(cudaStreamSynchronize(engine));
    free_pinned(pinned, s.n);
    CHECK(kvr_agent_send_ready(s.agent, IDS[1], strlen(IDS[1]), 0, LAYERS,
                               NULL) == KVR_OK,
          "ready: %s", kvr_agent_last_error(s.agent));
    wait_event(s.agent, IDS[1], KVR_AGENT_SENT);
    kvr_agent_destroy(s.agent);
    CUDA_OK(cudaFree(scratch));
    CUDA_OK(cudaEventDestroy(done));
    CUDA_OK(cudaStreamDestroy(engine));
    return 0;
}

int main(int argc, char **argv)
{
    bool use_event = !(argc > 1 && strcmp(argv[1], "--no-event") == 0);
    many = argc > 1 && strcmp(argv[1], "--many") == 0;
    nreqs = many ? MANY : REQS;
    net_mode = argc > 1 && strcmp(argv[1], "--tcp") == 0          ? 1
               : argc > 1 && strcmp(argv[1], "--tcp-staged") == 0 ? 2
                                                                  : 0;
    /* CUDA's lazy module loading waits for the whole device at a kernel's
     * first launch, which would order the first copy after the prefill
     * whatever the agent does: load everything at start instead */
    setenv("CUDA_MODULE_LOADING", "EAGER", 1);
    int to[RANKS][2], from[RANKS][2];
    pid_t pid[RANKS];
    for (int k = 0; k < RANKS; k++) {
        CHECK(pipe(to[k]) == 0 && pipe(from[k]) == 0, "pipe");
        pid[k] = fork();
        CHECK(pid[k] >= 0, "fork");
        if (pid[k] == 0)
            _exit(rank_main((uint32_t)k, to[k][0], from[k][1]));
    }
    int to_rank[RANKS], from_rank[RANKS];
    for (int k = 0; k < RANKS; k++) {
        to_rank[k] = to[k][1];
        from_rank[k] = from[k][0];
    }
    int rc = producer_main(to_rank, from_rank, use_event);
    for (int k = 0; k < RANKS; k++) {
        int status = 0;
        CHECK(waitpid(pid[k], &status, 0) == pid[k], "waitpid");
        int code = WIFEXITED(status) ? WEXITSTATUS(status) : 1;
        CHECK(code == rc, "rank %d exited %d (producer %d)", k, code, rc);
    }
    if (rc == 0)
        printf("test_gpu_agent: OK\n");
    return rc;
}
