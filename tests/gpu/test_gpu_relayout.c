/* Relayout kernels against the per-token expected images and the host
 * reference: direct scatter into every rank (ranks spread over the devices
 * present, written through peer access), one rank at a time launched on the
 * consumer's device (pull), pack and chunked unpack, misaligned buffers;
 * several requests a launch (kvr_gpu_scatter_requests). Exit 77 without a
 * CUDA device, after the checks that need none. */
#include <cuda_runtime_api.h>
#include <string.h>

#include "merge_case.h"

#define CUDA_OK(call)                                                          \
    do {                                                                       \
        cudaError_t e_ = (call);                                               \
        CHECK(e_ == cudaSuccess, "%s", cudaGetErrorString(e_));                \
    } while (0)

static int devices;

/* The run copy's form (src/gpu/gpu_internal.h): 0 the default, 1 the
 * earlier warp a piece, both against the reference. */
extern int kvr__runs_tune_unroll;

/* A device buffer `shift` bytes past a fresh allocation, holding `host`. */
typedef struct {
    void *alloc;
    unsigned char *ptr;
} dbuf_t;

static dbuf_t dbuf_make(int dev, const void *host, uint64_t bytes,
                        uint32_t shift)
{
    dbuf_t b;
    CUDA_OK(cudaSetDevice(dev));
    CUDA_OK(cudaMalloc(&b.alloc, bytes + shift + 1));
    b.ptr = (unsigned char *)b.alloc + shift;
    if (host != NULL)
        CUDA_OK(cudaMemcpy(b.ptr, host, bytes, cudaMemcpyHostToDevice));
    /* A copy from pageable memory may return before its DMA lands, and a
     * kernel on another device is not ordered after it. */
    CUDA_OK(cudaDeviceSynchronize());
    CUDA_OK(cudaSetDevice(0));
    return b;
}

static void dbuf_free(dbuf_t *b)
{
    CUDA_OK(cudaFree(b->alloc));
}

static void check_device_image(const dbuf_t *b, const unsigned char *want,
                               uint64_t bytes, const char *what,
                               const char *name, uint32_t rank)
{
    unsigned char *got = xmalloc(bytes);
    CUDA_OK(cudaMemcpy(got, b->ptr, bytes, cudaMemcpyDeviceToHost));
    uint64_t i = 0;
    while (i < bytes && got[i] == want[i])
        i++;
    CHECK(i == bytes, "%s: %s rank %u: byte %llu is 0x%02x, want 0x%02x", name,
          what, rank, (unsigned long long)i, got[i], want[i]);
    free(got);
}

typedef struct {
    const relayout_case_t *c;
    kvr_gpu_relayout_t *rl;
    dbuf_t src;
    unsigned char **expect; /* per rank */
    unsigned char *poison;
    const char *name;
} run_t;

static void check_scatter_all(run_t *t, uint32_t shift)
{
    uint32_t W = t->c->lay.dcp_size;
    dbuf_t dst[8];
    void *bases[8];
    for (uint32_t r = 0; r < W; r++) {
        dst[r] = dbuf_make((int)(r % devices), t->poison, t->c->dst_bytes,
                           shift);
        bases[r] = dst[r].ptr;
    }
    CHECK_KVR(kvr_gpu_scatter(t->rl, t->src.ptr, bases, NULL, &err));
    CUDA_OK(cudaDeviceSynchronize());
    for (uint32_t r = 0; r < W; r++) {
        check_device_image(&dst[r], t->expect[r], t->c->dst_bytes, "scatter",
                           t->name, r);
        dbuf_free(&dst[r]);
    }
}

/* One rank, launched on the device that holds its pages. */
static void check_scatter_rank(run_t *t, uint32_t r)
{
    int dev = (int)(r % devices);
    dbuf_t dst = dbuf_make(dev, t->poison, t->c->dst_bytes, 0);
    CUDA_OK(cudaSetDevice(dev));
    CHECK_KVR(kvr_gpu_scatter_rank(t->rl, r, t->src.ptr, dst.ptr, NULL, &err));
    CUDA_OK(cudaDeviceSynchronize());
    CUDA_OK(cudaSetDevice(0));
    check_device_image(&dst, t->expect[r], t->c->dst_bytes, "scatter_rank",
                       t->name, r);
    dbuf_free(&dst);
}

/* n slots at once (kvr_gpu_scatter_regions: past 64, more than one
 * launch), slot k rank (r + k) % W into a region of its own, its tables
 * in a pool block on a stream of its own; twice, the second time into the
 * block the first gave back; then a third time with the tables read in
 * place from a mapped slot (copied, the same, where they are larger). */
static void check_scatter_regions(run_t *t, uint32_t r, uint64_t *rng)
{
    size_t n = t->c->dst_bytes < (1u << 20) && rng_below(rng, 4) == 0 ? 66 : 3;
    uint32_t W = t->c->lay.dcp_size;
    dbuf_t *dst = xmalloc(n * sizeof(*dst));
    const void **srcs = xmalloc(n * sizeof(*srcs));
    void **bases = xmalloc(n * sizeof(*bases));
    uint32_t *ranks = xmalloc(n * sizeof(*ranks));
    void *stream = NULL;
    kvr_gpu_pool_t *pool = NULL;
    uint64_t held[2];
    CHECK_KVR(kvr_gpu_stream_create(0, &stream, &err));
    CHECK_KVR(kvr_gpu_pool_create(0, stream, &pool, &err));
    for (int rep = 0; rep < 3; rep++) {
        kvr_gpu_relayout_t *rl = NULL;
        CHECK_KVR(kvr_gpu_relayout_create(&t->c->lay, &t->c->src, &t->c->dst,
                                          &t->c->req, &rl, &err));
        if (rep < 2)
            CHECK_KVR(kvr_gpu_relayout_upload_pool(rl, pool, &err));
        else
            CHECK_KVR(kvr_gpu_relayout_upload_mapped(rl, pool, &err));
        for (size_t k = 0; k < n; k++) {
            dst[k] = dbuf_make(0, t->poison, t->c->dst_bytes, 0);
            srcs[k] = t->src.ptr;
            bases[k] = dst[k].ptr;
            ranks[k] = (uint32_t)((r + k) % W);
        }
        CHECK_KVR(
            kvr_gpu_scatter_regions(rl, ranks, srcs, bases, n, stream, &err));
        if (rep < 2)
            kvr_gpu_relayout_destroy(rl); /* stream-ordered: the block waits */
        CHECK_KVR(kvr_gpu_sync(stream, &err));
        if (rep == 2)
            kvr_gpu_relayout_destroy(rl); /* a mapped slot: once read */
        for (size_t k = 0; k < n; k++) {
            check_device_image(&dst[k], t->expect[ranks[k]], t->c->dst_bytes,
                               "scatter_regions", t->name, ranks[k]);
            dbuf_free(&dst[k]);
        }
        if (rep < 2)
            held[rep] = kvr_gpu_pool_bytes(pool);
    }
    CHECK(held[0] > 0 && held[1] == held[0],
          "%s: the pool held %llu bytes after one table, %llu after the "
          "next: its block was not reused",
          t->name, (unsigned long long)held[0], (unsigned long long)held[1]);
    kvr_gpu_pool_destroy(pool);
    kvr_gpu_stream_destroy(stream);
    free(dst);
    free(srcs);
    free(bases);
    free(ranks);
}

/* Whole-stream pack against the reference, then unpack in chunks of a
 * random (often unaligned) size, last chunk first. */
static void check_pack_unpack(run_t *t, uint32_t r, uint64_t *rng)
{
    uint64_t total = kvr_gpu_relayout_bytes(t->rl, r);
    if (total == 0)
        return;
    unsigned char *want = xmalloc(total);
    CHECK_KVR(kvr_gpu_ref_pack(t->rl, r, t->c->src_img, 0, total, want, &err));
    dbuf_t stage = dbuf_make(0, NULL, total, 0);
    CHECK_KVR(
        kvr_gpu_pack(t->rl, r, t->src.ptr, 0, total, stage.ptr, NULL, &err));
    CUDA_OK(cudaDeviceSynchronize());
    check_device_image(&stage, want, total, "pack", t->name, r);
    dbuf_t dst = dbuf_make((int)(r % devices), t->poison, t->c->dst_bytes, 0);
    uint64_t chunk = rng_below(rng, 2)
                         ? 4096
                         : 1 + rng_below(rng, (uint32_t)(total / 2 + 1));
    for (uint64_t end = total; end > 0;) {
        uint64_t off = end > chunk ? end - chunk : 0;
        CHECK_KVR(kvr_gpu_unpack(t->rl, r, stage.ptr + off, off, end - off,
                                 dst.ptr, NULL, &err));
        end = off;
    }
    CUDA_OK(cudaDeviceSynchronize());
    check_device_image(&dst, t->expect[r], t->c->dst_bytes, "unpack", t->name,
                       r);
    dbuf_free(&dst);
    dbuf_free(&stage);
    free(want);
}

static void upload_everywhere(kvr_gpu_relayout_t *rl)
{
    for (int d = 0; d < devices; d++) {
        CUDA_OK(cudaSetDevice(d));
        CHECK_KVR(kvr_gpu_relayout_upload(rl, &err));
    }
    CUDA_OK(cudaSetDevice(0));
}

static void run_case(const case_shape_t *shape, uint64_t *rng, int thorough)
{
    relayout_case_t c;
    char name[160];
    case_make(&c, shape, rng);
    run_t t = {&c,
               NULL,
               {0},
               NULL,
               xmalloc(c.dst_bytes),
               case_name(shape, name, sizeof(name))};
    CHECK_KVR(
        kvr_gpu_relayout_create(&c.lay, &c.src, &c.dst, &c.req, &t.rl, &err));
    upload_everywhere(t.rl);
    case_poison(t.poison, c.dst_bytes, 3);
    t.expect = xmalloc(shape->W * sizeof(*t.expect));
    for (uint32_t r = 0; r < shape->W; r++) {
        t.expect[r] = xmalloc(c.dst_bytes);
        memcpy(t.expect[r], t.poison, c.dst_bytes);
        case_expect(&c, r, t.expect[r]);
    }
    static const uint32_t SHIFTS[] = {0, 0, 8, 4, 1};
    uint32_t shift = SHIFTS[rng_below(rng, 5)];
    t.src = dbuf_make(0, c.src_img, c.src_bytes, shift);
    check_scatter_all(&t, shift);
    for (uint32_t r = 0; thorough && r < shape->W; r++) {
        check_scatter_rank(&t, r);
        check_pack_unpack(&t, r, rng);
        if (r == 0 && rng_below(rng, 8) == 0)
            check_scatter_regions(&t, r, rng);
    }
    for (uint32_t r = 0; r < shape->W; r++)
        free(t.expect[r]);
    free(t.expect);
    free(t.poison);
    dbuf_free(&t.src);
    kvr_gpu_relayout_destroy(t.rl);
    case_free(&c);
}

static void check_errors(void)
{
    uint64_t rng = 5;
    case_shape_t s = {KVR_ROLE_MLA, 16, 2, 4, 0, 0, 64, 100, 0};
    relayout_case_t c;
    case_make(&c, &s, &rng);
    kvr_gpu_relayout_t *rl = NULL;
    kvr_error_t err = {0};
    kvr_status_t st = kvr_gpu_relayout_create(&c.lay, &c.src, &c.dst, &c.req,
                                              &rl, &err);
    CHECK(st == KVR_OK, "%s", err.msg);
    void *p = (void *)&c, *bases[2] = {p, p};
    st = kvr_gpu_scatter(rl, p, bases, NULL, &err);
    CHECK(st == KVR_ERR_INVALID && strstr(err.msg, "kvr_gpu_relayout_upload"),
          "scatter before upload: %s", err.msg);
    CHECK(kvr_gpu_relayout_upload(rl, &err) == KVR_OK, "%s", err.msg);
    st = kvr_gpu_pack(rl, 0, p, 1, kvr_gpu_relayout_bytes(rl, 0), p, NULL,
                      &err);
    CHECK(st == KVR_ERR_INVALID, "pack past the stream: %s", err.msg);
    st = kvr_gpu_scatter_rank(rl, 2, p, p, NULL, &err);
    CHECK(st == KVR_ERR_RANK_RANGE, "rank 2 of 2: %s", err.msg);
    bases[1] = NULL;
    st = kvr_gpu_scatter(rl, p, bases, NULL, &err);
    CHECK(st == KVR_ERR_INVALID && strstr(err.msg, "rank 1"), "%s", err.msg);
    kvr_gpu_relayout_destroy(rl);
    case_free(&c);
}

/* ---- run copies (kvr_gpu_runs_copy) against kvr_gpu_runs_copy_ref ---- */

/* n runs of random length (1 byte to past the 16 KiB piece cut) at random
 * offsets (every alignment) of src, to disjoint places of dst: the same
 * runs as offsets, made absolute over the host images and the device
 * buffers. */
typedef struct {
    kvr_gpu_run_t *off; /* src, dst as offsets */
    size_t n;
    uint64_t src_bytes, dst_bytes, total;
} runs_case_t;

static runs_case_t runs_make(uint64_t *rng)
{
    runs_case_t rc = {0};
    rc.n = 1 + rng_below(rng, 700);
    rc.off = xmalloc(rc.n * sizeof(*rc.off));
    uint64_t d = 0;
    rc.src_bytes = 1u << 20;
    for (size_t i = 0; i < rc.n; i++) {
        uint32_t pick = rng_below(rng, 8);
        uint64_t len = pick == 0   ? 1 + rng_below(rng, 40000)
                       : pick < 4 ? 576
                                  : 1 + rng_below(rng, 2048);
        uint64_t align = pick < 4 ? 16 : 1;
        uint64_t s = rng_below(rng, (uint32_t)(rc.src_bytes - len)) / align *
                     align;
        d += rng_below(rng, 3) == 0 ? rng_below(rng, 64) : 0;
        rc.off[i] = (kvr_gpu_run_t){s, d, len};
        d += len;
        rc.total += len;
    }
    rc.dst_bytes = d + 1;
    return rc;
}

static kvr_gpu_runs_t *runs_at(const runs_case_t *rc, const void *src,
                               const void *dst)
{
    kvr_gpu_run_t *r = xmalloc(rc->n * sizeof(*r));
    for (size_t i = 0; i < rc->n; i++)
        r[i] = (kvr_gpu_run_t){(uint64_t)(uintptr_t)src + rc->off[i].src,
                               (uint64_t)(uintptr_t)dst + rc->off[i].dst,
                               rc->off[i].len};
    kvr_gpu_runs_t *rt = NULL;
    CHECK_KVR(kvr_gpu_runs_create(r, rc->n, &rt, &err));
    free(r);
    return rt;
}

/* Scatter of stream range [pos, pos + len), pack of it into a buffer
 * (shifted by `shift`), unpack of that buffer back: each image equal to
 * the reference's. */
static void check_runs(uint64_t *rng)
{
    runs_case_t rc = runs_make(rng);
    unsigned char *h_src = xmalloc(rc.src_bytes);
    unsigned char *h_dst = xmalloc(rc.dst_bytes);
    unsigned char *h_buf = xmalloc(rc.total + 16);
    rng_fill(rng, h_src, rc.src_bytes);
    memset(h_dst, 0xa5, rc.dst_bytes);
    memset(h_buf, 0x5a, rc.total + 16);
    uint64_t pos = rng_below(rng, 2) ? 0 : rng_below(rng, (uint32_t)rc.total);
    uint64_t len = rng_below(rng, 2) ? rc.total - pos
                                     : rng_below(rng, (uint32_t)(rc.total - pos) + 1);
    uint32_t shift = rng_below(rng, 2) ? 0 : rng_below(rng, 16);
    dbuf_t src = dbuf_make(0, h_src, rc.src_bytes, 0);
    dbuf_t dst = dbuf_make(0, h_dst, rc.dst_bytes, 0);
    dbuf_t buf = dbuf_make(0, h_buf, rc.total + 16, 0);
    kvr_gpu_runs_t *host = runs_at(&rc, h_src, h_dst);
    kvr_gpu_runs_t *dev = runs_at(&rc, src.ptr, dst.ptr);
    CHECK_KVR(kvr_gpu_runs_upload(dev, NULL, &err));
    /* scatter, then pack into buf + shift, then unpack it into dst again */
    CHECK_KVR(kvr_gpu_runs_copy_ref(host, pos, len, NULL, NULL, &err));
    CHECK_KVR(kvr_gpu_runs_copy(dev, pos, len, NULL, NULL, NULL, &err));
    CHECK_KVR(
        kvr_gpu_runs_copy_ref(host, pos, len, NULL, h_buf + shift, &err));
    CHECK_KVR(kvr_gpu_runs_copy(dev, pos, len, NULL, buf.ptr + shift, NULL,
                                &err));
    CUDA_OK(cudaDeviceSynchronize());
    check_device_image(&dst, h_dst, rc.dst_bytes, "runs scatter", "runs", 0);
    check_device_image(&buf, h_buf, rc.total + 16, "runs pack", "runs", 0);
    CUDA_OK(cudaMemset(dst.ptr, 0x3c, rc.dst_bytes));
    memset(h_dst, 0x3c, rc.dst_bytes);
    CHECK_KVR(
        kvr_gpu_runs_copy_ref(host, pos, len, h_buf + shift, NULL, &err));
    CHECK_KVR(kvr_gpu_runs_copy(dev, pos, len, buf.ptr + shift, NULL, NULL,
                                &err));
    CUDA_OK(cudaDeviceSynchronize());
    check_device_image(&dst, h_dst, rc.dst_bytes, "runs unpack", "runs", 0);
    kvr_gpu_runs_destroy(host);
    kvr_gpu_runs_destroy(dev);
    dbuf_free(&src);
    dbuf_free(&dst);
    dbuf_free(&buf);
    free(h_src);
    free(h_dst);
    free(h_buf);
    free(rc.off);
}

/* ---- several requests a launch (kvr_gpu_scatter_requests) ---- */

static void refused(kvr_status_t st, kvr_status_t want, const kvr_error_t *err,
                    const char *text)
{
    CHECK(st == want && strstr(err->msg, text) != NULL,
          "want %s naming \"%s\", got %s: %s", kvr_status_str(want), text,
          kvr_status_str(st), err->msg);
}

/* The call's refusals, every one before a device is touched (so they run
 * on a machine without one too). */
static void check_merge_errors(void)
{
    uint64_t rng = 9, tokens[2] = {100, 300};
    case_shape_t a = {KVR_ROLE_MLA, 16, 2, 4, 0, 0, 64, 0, 0}, b = a;
    b.unit = 128;
    merge_case_t ma, mb;
    merge_make(&ma, &a, tokens, 2, 1, &rng);
    merge_make(&mb, &b, tokens, 1, 1, &rng);
    int x = 0;
    const void *src[1] = {&x};
    void *dst[2] = {&x, &x};
    size_t n = 0;
    kvr_gpu_scatter_slot_t *s = merge_slots(&ma, src, dst, &n);
    const kvr_gpu_relayout_t *const *rls =
        (const kvr_gpu_relayout_t *const *)ma.rls;
    const kvr_gpu_relayout_t *mixed[2] = {ma.rls[0], mb.rls[0]};
    kvr_error_t err = {0};
    refused(kvr_gpu_scatter_requests(mixed, 2, s, 1, NULL, &err),
            KVR_ERR_INVALID, &err, "relayout 1's unit 128 differs");
    mixed[1] = NULL;
    refused(kvr_gpu_scatter_requests(mixed, 2, s, 1, NULL, &err),
            KVR_ERR_INVALID, &err, "relayout 1 is NULL");
    refused(kvr_gpu_scatter_requests(NULL, 2, s, n, NULL, &err),
            KVR_ERR_INVALID, &err, "NULL");
    refused(kvr_gpu_scatter_requests(rls, 2, NULL, n, NULL, &err),
            KVR_ERR_INVALID, &err, "NULL");
    kvr_gpu_scatter_slot_t bad[4]; /* a bad slot among good ones */
    CHECK(n == 4, "%zu slots", n);
    memcpy(bad, s, sizeof(bad));
    bad[1].relayout = 2;
    refused(kvr_gpu_scatter_requests(rls, 2, bad, n, NULL, &err),
            KVR_ERR_INVALID, &err, "slot 1: relayout 2 of 2");
    memcpy(bad, s, sizeof(bad));
    bad[2].rank = 2;
    refused(kvr_gpu_scatter_requests(rls, 2, bad, n, NULL, &err),
            KVR_ERR_RANK_RANGE, &err, "slot 2: DCP rank 2");
    memcpy(bad, s, sizeof(bad));
    bad[3].dst_base = NULL;
    refused(kvr_gpu_scatter_requests(rls, 2, bad, n, NULL, &err),
            KVR_ERR_INVALID, &err, "slot 3: destination base is NULL");
    free(s);
    merge_free(&ma);
    merge_free(&mb);
}

/* Every request of a merge case in one call, its regions `shift` bytes
 * into fresh allocations: refused before the tables are uploaded, then
 * every consumer region equal to the reference's image. */
static void check_merged(const case_shape_t *s, const uint64_t *tokens,
                         uint32_t nreq, uint32_t layers, uint32_t shift,
                         uint64_t *rng)
{
    merge_case_t m;
    char name[160], what[64];
    merge_make(&m, s, tokens, nreq, layers, rng);
    case_name(s, name, sizeof(name));
    uint32_t nd = layers * m.W;
    dbuf_t *buf = xmalloc((layers + nd) * sizeof(*buf));
    const void **src = xmalloc(layers * sizeof(*src));
    void **dst = xmalloc(nd * sizeof(*dst));
    for (uint32_t l = 0; l < layers; l++) {
        buf[l] = dbuf_make(0, m.src_img[l], m.src_bytes, shift);
        src[l] = buf[l].ptr;
    }
    for (uint32_t k = 0; k < nd; k++) {
        buf[layers + k] = dbuf_make(0, m.poison, m.dst_bytes, shift);
        dst[k] = buf[layers + k].ptr;
    }
    size_t n = 0;
    kvr_gpu_scatter_slot_t *slots = merge_slots(&m, src, dst, &n);
    const kvr_gpu_relayout_t *const *rls =
        (const kvr_gpu_relayout_t *const *)m.rls;
    kvr_error_t e = {0};
    refused(kvr_gpu_scatter_requests(rls, nreq, slots, n, NULL, &e),
            KVR_ERR_INVALID, &e, "kvr_gpu_relayout_upload");
    for (uint32_t i = 0; i < nreq; i++)
        CHECK_KVR(kvr_gpu_relayout_upload(m.rls[i], &err));
    CHECK_KVR(kvr_gpu_scatter_requests(rls, nreq, slots, n, NULL, &err));
    CUDA_OK(cudaDeviceSynchronize());
    for (uint32_t k = 0; k < nd; k++) {
        snprintf(what, sizeof(what), "scatter_requests layer %u", k / m.W);
        check_device_image(&buf[layers + k], m.expect[k], m.dst_bytes, what,
                           name, k % m.W);
    }
    for (uint32_t k = 0; k < layers + nd; k++)
        dbuf_free(&buf[k]);
    free(buf);
    free(src);
    free(dst);
    free(slots);
    merge_free(&m);
}

static void check_merges(uint64_t *rng)
{
    /* a PP stage's MLA class, requests of every length (2500 and 333 not
     * multiples of bs * W): through chunk_kernel (I = 1) and
     * relayout_kernel (I = 16, chunks past CHUNK_MAX) */
    static const uint64_t lens[] = {1000, 2500, 4096, 333};
    case_shape_t mla = {KVR_ROLE_MLA, 64, 4, 1, 0, 0, 576, 0, 0};
    check_merged(&mla, lens, 4, 3, 0, rng);
    mla.I = 16;
    check_merged(&mla, lens, 4, 2, 0, rng);
    /* more than 8 requests and 128 slots: several launches; 100-byte
     * tokens one byte off: byte accesses */
    uint64_t many[10];
    for (int i = 0; i < 10; i++)
        many[i] = 1 + rng_below(rng, 700);
    case_shape_t odd = {KVR_ROLE_MLA, 16, 4, 2, 0, 0, 100, 0, 0};
    check_merged(&odd, many, 10, 5, 1, rng);
    /* the index classes: replicated and preshuffled, sharded pages */
    static const uint64_t idx[] = {700, 64, 1500};
    case_shape_t repl = {KVR_ROLE_INDEX, 64, 4, 1, 1, 1, 128, 0, 0};
    case_shape_t seg = {KVR_ROLE_INDEX, 16, 4, 16, 0, 0, 36, 0, 0};
    check_merged(&repl, idx, 3, 2, 8, rng);
    check_merged(&seg, idx, 3, 2, 4, rng);
    /* random classes, 1-12 requests (empty ones too) over 1-4 layers */
    static const uint32_t SHIFTS[] = {0, 4, 8, 1};
    for (int c = 0; c < 40; c++) {
        case_shape_t r = case_random_shape(rng);
        uint64_t t[12];
        uint32_t nreq = 1 + rng_below(rng, 12);
        for (uint32_t i = 0; i < nreq; i++)
            t[i] = rng_below(rng, 6 * r.bs * r.W + 6);
        check_merged(&r, t, nreq, 1 + rng_below(rng, 4),
                     SHIFTS[rng_below(rng, 4)], rng);
    }
}

int main(void)
{
    check_merge_errors();
    CHECK_KVR(kvr_gpu_device_count(&devices, &err));
    if (devices == 0) {
        printf("SKIP: no CUDA device\n");
        return 77;
    }
    devices = devices > 2 ? 2 : devices;
    for (int d = 1; d < devices; d++) {
        kvr_error_t err = {0};
        if (kvr_gpu_enable_peer(0, d, &err) != KVR_OK ||
            kvr_gpu_enable_peer(d, 0, &err) != KVR_OK) {
            printf("no peer access between devices 0 and %d (%s): one device\n",
                   d, err.msg);
            devices = 1;
        }
    }
    check_errors();
    uint64_t rng = 0x475055ull;
    check_merges(&rng);
    for (int i = 0; i < 300; i++) {
        kvr__runs_tune_unroll = i % 2;
        check_runs(&rng);
    }
    kvr__runs_tune_unroll = 0;
    int cases = 0;
    for (; cases < 400; cases++) {
        case_shape_t s = case_random_shape(&rng);
        run_case(&s, &rng, 1);
    }
    /* The benchmark's shapes at full size. */
    static const uint32_t IS[] = {1, 4, 16, 64};
    for (int i = 0; i < 4; i++, cases++) {
        case_shape_t mla = {KVR_ROLE_MLA, 64, 4, IS[i], 0, 0, 576, 262144, 0};
        run_case(&mla, &rng, i == 0);
    }
    case_shape_t big = {KVR_ROLE_MLA, 64, 4, 1, 0, 0, 1152, 262144 - 77, 3};
    case_shape_t repl = {KVR_ROLE_INDEX, 64, 4, 1, 1, 1, 128, 262144, 0};
    run_case(&big, &rng, 0);
    run_case(&repl, &rng, 1);
    printf("test_gpu_relayout: %d cases passed on %d device(s)\n", cases + 2,
           devices);
    return 0;
}
