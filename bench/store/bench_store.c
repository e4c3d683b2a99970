/* Store throughput (docs/store.md): save and load of each tier against the
 * same run's ceiling: memcpy of the same bytes for the host tier, one large
 * sequential write (+ fsync) or read of the same bytes for the disk tier.
 * Headline layout (docs/design.md §13, §17): 78 layers of MLA 576 B/token,
 * an index cache (D = 128) every third layer, bs = 64, one PP stage holding
 * all layers, producer W_p = 1 preshuffled, consumer W = 1. Disk reads start
 * cold: every file is dropped from the page cache (posix_fadvise) first.
 * Usage: bench_store [out.json] [dir] [reps]. Release build only. */
#include <dirent.h>
#include <fcntl.h>
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include <sodium.h>

#include "kvrelay/store.h"
#include "store_internal.h" /* kvr__chunk_sum, for its own rate */

#define BS 64u
#define LAYERS 78u
#define TB 576u
#define D 128u

typedef struct side {
    kvr_store_region_t r[LAYERS * 2];
    size_t n;
    uint32_t *blocks;
    size_t nblocks;
} side_t;

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
}

static int cmp_d(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

static void side_init(side_t *s, uint64_t tokens, const kvr_layout_t *lay)
{
    s->nblocks = tokens / BS;
    s->blocks = malloc(s->nblocks * sizeof *s->blocks);
    for (size_t i = 0; i < s->nblocks; i++) /* reversed: not the identity */
        s->blocks[i] = (uint32_t)(s->nblocks - 1 - i);
    s->n = 0;
    for (uint32_t l = 0; l < LAYERS; l++) {
        kvr_region_desc_t m = {.role = KVR_ROLE_MLA,
                               .layer = l,
                               .num_blocks = s->nblocks,
                               .page_bytes = BS * TB};
        s->r[s->n].desc = m;
        s->r[s->n++].base = NULL;
        if (l % 3 == 0) {
            kvr_region_desc_t x = {
                .role = KVR_ROLE_INDEX,
                .layer = l,
                .num_blocks = s->nblocks,
                .page_bytes = kvr_index_page_tokens(lay, true) * 144,
                .index_dim = D,
                .quant_block = D};
            s->r[s->n].desc = x;
            s->r[s->n++].base = NULL;
        }
    }
    for (size_t i = 0; i < s->n; i++) {
        uint64_t b = kvr_region_bytes(&s->r[i].desc);
        s->r[i].base = malloc(b);
        memset(s->r[i].base, (int)(i * 37 + 1), b); /* faulted in */
    }
}

static void side_free(side_t *s)
{
    for (size_t i = 0; i < s->n; i++)
        free(s->r[i].base);
    free(s->blocks);
}

/* Drops every file of dir from the page cache (clean pages only: callers
 * fsync first). */
static void drop_cache(const char *dir)
{
    DIR *d = opendir(dir);
    struct dirent *de;
    while (d && (de = readdir(d)) != NULL) {
        int fd = openat(dirfd(d), de->d_name, O_RDONLY);
        if (fd >= 0) {
            posix_fadvise(fd, 0, 0, POSIX_FADV_DONTNEED);
            close(fd);
        }
    }
    if (d)
        closedir(d);
}

static void clear_dir(const char *dir)
{
    char cmd[512];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'/*.kvc '%s'/ceiling.bin", dir, dir);
    if (system(cmd) != 0)
        fprintf(stderr, "bench_store: cannot clear %s\n", dir);
}

typedef struct ctx {
    uint64_t tokens, chunk, bytes; /* bytes: canonical payload of the request */
    kvr_layout_t lay;
    side_t prod, cons;
    uint8_t ns[KVR_STORE_NS_BYTES];
    kvr_block_hash_t *chains;
    size_t nchains;
    const char *dir;
    uint8_t *flat_a, *flat_b; /* for the ceilings */
    kvr_store_t *warm;        /* host tier kept full across reps */
    uint64_t salt;            /* new chunk keys for each warm save */
} ctx_t;

static void salt_chains(ctx_t *c)
{
    c->salt++;
    for (size_t i = 0; i < c->nchains; i++)
        memcpy(c->chains[i].bytes + 8, &c->salt, sizeof c->salt);
}

static kvr_store_io_t io_of(ctx_t *c, side_t *s)
{
    kvr_store_io_t io = {.ns = c->ns,
                         .block_size = BS,
                         .chunk = c->chunk,
                         .chains = c->chains,
                         .num_chains = c->nchains,
                         .lay = &c->lay,
                         .regions = s->r,
                         .num_regions = s->n,
                         .blocks = s->blocks,
                         .num_blocks = s->nblocks};
    return io;
}

static void die(const char *what, const kvr_error_t *err)
{
    fprintf(stderr, "bench_store: %s: %s\n", what, err->msg);
    exit(1);
}

/* Host tier in its steady state: full (one request's bytes), so a save
 * evicts older chunks and reuses their memory. New keys each time. */
static double time_save_warm(ctx_t *c)
{
    kvr_error_t err;
    kvr_store_io_t io = io_of(c, &c->prod);
    size_t saved;
    if (c->warm == NULL) {
        kvr_store_opts_t o = {.host_bytes = c->bytes + c->bytes / 64};
        if (kvr_store_open(&o, &c->warm, &err) != KVR_OK)
            die("open", &err);
        salt_chains(c);
        if (kvr_store_save(c->warm, &io, &saved, &err) != KVR_OK)
            die("save", &err);
    }
    salt_chains(c);
    double t0 = now_s();
    if (kvr_store_save(c->warm, &io, &saved, &err) != KVR_OK)
        die("save", &err);
    return now_s() - t0;
}

static double time_blake2b(ctx_t *c)
{
    uint8_t out[32];
    double t0 = now_s();
    crypto_generichash(out, sizeof out, c->flat_a, c->bytes, NULL, 0);
    return now_s() - t0;
}

/* The store's chunk checksum (BLAKE2b leaves on several threads) over one
 * chunk's bytes at a time, as a save or load computes it. */
static double time_checksum(ctx_t *c)
{
    uint8_t header[KVR__CHUNK_HEADER] = {0}, out[KVR_STORE_SUM_BYTES];
    uint64_t per = c->bytes / c->nchains;
    double t0 = now_s();
    for (size_t i = 0; i < c->nchains; i++)
        kvr__chunk_sum(header, c->flat_a + i * per, per, out);
    return now_s() - t0;
}

/* One timed save of the whole request into a fresh store. */
static double time_save(ctx_t *c, const kvr_store_opts_t *o)
{
    kvr_store_t *st;
    kvr_error_t err;
    if (o->dir)
        clear_dir(o->dir);
    if (kvr_store_open(o, &st, &err) != KVR_OK)
        die("open", &err);
    kvr_store_io_t io = io_of(c, &c->prod);
    size_t saved;
    double t0 = now_s();
    if (kvr_store_save(st, &io, &saved, &err) != KVR_OK)
        die("save", &err);
    double t = now_s() - t0;
    kvr_store_close(st);
    return t;
}

/* Saves once (untimed), then times a load of every chunk. Host: from the
 * host tier. Disk: a fresh open, cache dropped, no host tier. */
static double time_load(ctx_t *c, const kvr_store_opts_t *o)
{
    kvr_store_t *st;
    kvr_error_t err;
    if (kvr_store_open(o, &st, &err) != KVR_OK)
        die("open", &err);
    kvr_store_io_t io = io_of(c, &c->prod);
    size_t saved;
    if (kvr_store_save(st, &io, &saved, &err) != KVR_OK)
        die("save", &err);
    if (o->dir) {
        kvr_store_close(st);
        drop_cache(o->dir);
        kvr_store_opts_t q = *o;
        q.quick_scan = true;
        if (kvr_store_open(&q, &st, &err) != KVR_OK)
            die("reopen", &err);
    }
    kvr_store_io_t lio = io_of(c, &c->cons);
    uint64_t got = 0;
    double t0 = now_s();
    if (kvr_store_load(st, &lio, &got, &err) != KVR_OK || got != c->tokens)
        die("load", &err);
    double t = now_s() - t0;
    kvr_store_close(st);
    if (o->dir)
        clear_dir(o->dir);
    return t;
}

static double time_memcpy(ctx_t *c)
{
    double t0 = now_s();
    memcpy(c->flat_b, c->flat_a, c->bytes);
    return now_s() - t0;
}

static double time_seq(ctx_t *c, bool write)
{
    char path[512];
    snprintf(path, sizeof path, "%s/ceiling.bin", c->dir);
    if (!write)
        drop_cache(c->dir);
    int fd = open(path, write ? O_WRONLY | O_CREAT | O_TRUNC : O_RDONLY, 0644);
    if (fd < 0) {
        perror(path);
        exit(1);
    }
    double t0 = now_s();
    for (uint64_t off = 0; off < c->bytes;) {
        size_t n = c->bytes - off > (16u << 20) ? 16u << 20 : c->bytes - off;
        ssize_t r = write ? pwrite(fd, c->flat_a + off, n, off)
                          : pread(fd, c->flat_b + off, n, off);
        if (r <= 0) {
            perror("ceiling I/O");
            exit(1);
        }
        off += (uint64_t)r;
    }
    if (write && fsync(fd) != 0)
        perror("fsync");
    double t = now_s() - t0;
    close(fd);
    return t;
}

typedef enum {
    M_MEMCPY,
    M_HOST_SAVE,
    M_HOST_SAVE_COLD,
    M_HOST_LOAD,
    M_BLAKE2B,
    M_CHECKSUM,
    M_SEQ_WRITE,
    M_SEQ_READ,
    M_DISK_SAVE,
    M_DISK_LOAD,
    M_COUNT
} measure_t;
static const char *names[M_COUNT] = {
    "memcpy",    "host_save",          "host_save_fresh_store",
    "host_load", "blake2b_one_stream", "chunk_checksum",
    "seq_write", "seq_read",           "disk_save",
    "disk_load"};

static double measure(ctx_t *c, measure_t m)
{
    kvr_store_opts_t host = {.host_bytes = c->bytes * 2};
    kvr_store_opts_t disk = {.dir = c->dir};
    switch (m) {
    case M_MEMCPY:
        return time_memcpy(c);
    case M_HOST_SAVE:
        return time_save_warm(c);
    case M_HOST_SAVE_COLD:
        return time_save(c, &host);
    case M_BLAKE2B:
        return time_blake2b(c);
    case M_CHECKSUM:
        return time_checksum(c);
    case M_HOST_LOAD:
        return time_load(c, &host);
    case M_SEQ_WRITE:
        return time_seq(c, true);
    case M_SEQ_READ:
        return time_seq(c, false);
    case M_DISK_SAVE:
        return time_save(c, &disk);
    default:
        return time_load(c, &disk);
    }
}

static json_t *run_case(ctx_t *c, int reps, int idx, int total)
{
    json_t *res = json_object();
    double gbs[M_COUNT][3];
    for (int m = 0; m < M_COUNT; m++) {
        double *t = malloc(reps * sizeof *t);
        for (int r = 0; r < reps; r++) {
            fprintf(stderr, "\r[case %d/%d] chunk %llu: %-10s rep %d/%d   ",
                    idx, total, (unsigned long long)c->chunk, names[m], r + 1,
                    reps);
            t[r] = measure(c, (measure_t)m);
        }
        qsort(t, reps, sizeof *t, cmp_d);
        /* throughput: fastest time is the max */
        gbs[m][0] = c->bytes / t[reps - 1] / 1e9;
        gbs[m][1] = c->bytes / t[reps / 2] / 1e9;
        gbs[m][2] = c->bytes / t[0] / 1e9;
        json_object_set_new(res, names[m],
                            json_pack("{s:f,s:f,s:f}", "min_gbs", gbs[m][0],
                                      "median_gbs", gbs[m][1], "max_gbs",
                                      gbs[m][2]));
        free(t);
    }
    const int pairs[4][2] = {{M_HOST_SAVE, M_MEMCPY},
                             {M_HOST_LOAD, M_MEMCPY},
                             {M_DISK_SAVE, M_SEQ_WRITE},
                             {M_DISK_LOAD, M_SEQ_READ}};
    json_t *ratio = json_object();
    for (int i = 0; i < 4; i++)
        json_object_set_new(
            ratio, names[pairs[i][0]],
            json_real(gbs[pairs[i][0]][1] / gbs[pairs[i][1]][1]));
    json_object_set_new(res, "median_ratio_to_ceiling", ratio);
    json_object_set_new(res, "chunk_tokens",
                        json_integer((json_int_t)c->chunk));
    json_object_set_new(res, "chunk_bytes",
                        json_integer((json_int_t)(c->bytes / c->nchains)));
    json_object_set_new(res, "request_tokens",
                        json_integer((json_int_t)c->tokens));
    json_object_set_new(res, "request_bytes",
                        json_integer((json_int_t)c->bytes));
    fprintf(stderr, "\r%80s\r", "");
    printf("%5llu tok %6.1f MB | host save %5.2f (fresh %5.2f) load %5.2f | "
           "memcpy %5.2f | disk save %5.2f load %5.2f | seq w %5.2f r %5.2f | "
           "sum %4.2f (1 stream %4.2f)\n",
           (unsigned long long)c->chunk, c->bytes / c->nchains / 1e6,
           gbs[M_HOST_SAVE][1], gbs[M_HOST_SAVE_COLD][1], gbs[M_HOST_LOAD][1],
           gbs[M_MEMCPY][1], gbs[M_DISK_SAVE][1], gbs[M_DISK_LOAD][1],
           gbs[M_SEQ_WRITE][1], gbs[M_SEQ_READ][1], gbs[M_CHECKSUM][1],
           gbs[M_BLAKE2B][1]);
    return res;
}

static void ctx_init(ctx_t *c, uint64_t tokens, uint64_t chunk, const char *dir)
{
    memset(c, 0, sizeof *c);
    c->tokens = tokens;
    c->chunk = chunk;
    c->dir = dir;
    kvr_layout_t lay = KVR_LAYOUT_INIT; /* bs 64, W 1, preshuffled */
    c->lay = lay;
    side_init(&c->prod, tokens, &lay);
    side_init(&c->cons, tokens, &lay);
    c->bytes = tokens * (LAYERS * TB + (LAYERS / 3) * (D + 4));
    c->nchains = tokens / chunk;
    c->chains = calloc(c->nchains, sizeof *c->chains);
    for (size_t i = 0; i < c->nchains; i++)
        memcpy(c->chains[i].bytes, &i, sizeof i);
    memset(c->ns, 0x5a, sizeof c->ns);
    c->flat_a = malloc(c->bytes);
    c->flat_b = malloc(c->bytes);
    memset(c->flat_a, 1, c->bytes);
    memset(c->flat_b, 2, c->bytes);
}

static void ctx_free(ctx_t *c)
{
    kvr_store_close(c->warm);
    side_free(&c->prod);
    side_free(&c->cons);
    free(c->chains);
    free(c->flat_a);
    free(c->flat_b);
}

int main(int argc, char **argv)
{
    const char *out = argc > 1 ? argv[1] : "bench/results/store.json";
    const char *dir = argc > 2 ? argv[2] : "/tmp/kvr-bench-store";
    int reps = argc > 3 ? atoi(argv[3]) : 5;
    if (sodium_init() < 0 || reps < 1)
        return 1;
    const uint64_t tokens = 4096, chunks[] = {256, 1024, 4096};
    const int ncase = (int)(sizeof chunks / sizeof chunks[0]);
    char cmd[600];
    snprintf(cmd, sizeof cmd, "mkdir -p '%s'", dir);
    if (system(cmd) != 0)
        return 1;
    printf("store bench: %llu-token request, GB/s medians of %d reps\n",
           (unsigned long long)tokens, reps);
    json_t *arr = json_array();
    const char *backend = "?";
    for (int i = 0; i < ncase; i++) {
        ctx_t c;
        ctx_init(&c, tokens, chunks[i], dir);
        json_array_append_new(arr, run_case(&c, reps, i + 1, ncase));
        ctx_free(&c);
    }
    kvr_store_t *st;
    kvr_store_opts_t o = {.dir = dir};
    if (kvr_store_open(&o, &st, NULL) == KVR_OK) {
        backend = kvr_store_backend(st);
        kvr_store_close(st);
    }
    json_t *root = json_pack(
        "{s:s,s:s,s:i,s:i,s:i,s:i,s:i,s:s,s:i,s:s,s:I,s:o}", "bench", "store",
        "layout", "78 layers MLA 576 B/token, index D=128 every third layer",
        "block_size", BS, "layers", LAYERS, "token_bytes", TB, "index_dim", D,
        "request_tokens", (int)tokens, "disk_backend", backend, "reps", reps,
        "dir", dir, "cpus", (json_int_t)sysconf(_SC_NPROCESSORS_ONLN), "cases",
        arr);
    if (json_dump_file(root, out, JSON_INDENT(1)) != 0)
        fprintf(stderr, "bench_store: cannot write %s\n", out);
    json_decref(root);
    return 0;
}
