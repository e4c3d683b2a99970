/* Store throughput (docs/store.md): save and load of each tier against the
 * same run's ceiling: memcpy of the same bytes for the host tier (taken
 * just before and just after each tier measure), and for the disk tier a
 * sequential O_DIRECT write (+ fsync, rename, directory fsync) or read of
 * the same bytes in files of the chunk files' sizes, moved the way the
 * store moves them (kvr__disk_xfer) but with no checksum and no gather.
 * Headline layout (docs/design.md §13, §17): 78 layers of MLA 576 B/token,
 * an index cache (D = 128) every third layer, bs = 64, one PP stage holding
 * all layers, producer W_p = 1 preshuffled, consumer W = 1.
 * Usage: bench_store [out.json] [dir] [reps] [measures] [chunks]:
 * measures (names joined by commas, or "all") limits the run to those and
 * their ceilings, chunks (token counts joined by commas; default
 * 256,1024,4096) to those chunk sizes. Release build only. */
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
#define CACHE_NOTE                                                             \
    "O_DIRECT for the store's payloads and the ceiling; the cached "           \
    "variant reads cold (every file dropped from the page cache with "         \
    "posix_fadvise DONTNEED after fsync). A VM's host may still cache its "    \
    "virtual disk."

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
    snprintf(cmd, sizeof cmd, "rm -rf '%s'/*.kvc '%s'/ceiling*.bin", dir, dir);
    if (system(cmd) != 0)
        fprintf(stderr, "bench_store: cannot clear %s\n", dir);
}

/* How a disk-tier store runs: the checksum kind of its new chunks and
 * whether it moves payloads through the page cache instead of O_DIRECT. */
typedef struct variant {
    unsigned kind;
    bool cached;
} variant_t;

enum { V_DEFAULT, V_FAST, V_CACHED, V_COUNT };
static const variant_t variants[V_COUNT] = {{KVR__SUM_DEFAULT, false},
                                            {KVR__SUM_POLY1305, false},
                                            {KVR__SUM_DEFAULT, true}};

typedef struct ctx {
    uint64_t tokens, chunk, bytes; /* bytes: canonical payload of the request */
    kvr_layout_t lay;
    side_t prod, cons;
    uint8_t ns[KVR_STORE_NS_BYTES];
    kvr_block_hash_t *chains;
    size_t nchains;
    const char *dir;
    uint8_t *flat_a, *flat_b; /* memcpy and checksum measures */
    uint8_t *ceil;            /* the ceiling's files, one aligned slot each */
    uint64_t file, slot;      /* a chunk file's bytes; its slot (aligned) */
    kvr_store_t *warm;        /* host tier kept full across reps */
    kvr_store_t *engine;      /* the store whose I/O the ceiling uses */
    /* long-lived disk-tier stores by variant */
    kvr_store_t *saver[V_COUNT], *loader[V_COUNT];
    uint64_t salt; /* new chunk keys for each warm save */
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
static double time_host_save(ctx_t *c)
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

/* A load of the request from the warm host tier (its last save). */
static double time_host_load(ctx_t *c)
{
    kvr_error_t err;
    kvr_store_io_t lio = io_of(c, &c->cons);
    uint64_t got = 0;
    double t0 = now_s();
    if (kvr_store_load(c->warm, &lio, &got, &err) != KVR_OK || got != c->tokens)
        die("host load", &err);
    return now_s() - t0;
}

static double time_memcpy(ctx_t *c)
{
    double t0 = now_s();
    memcpy(c->flat_b, c->flat_a, c->bytes);
    return now_s() - t0;
}

static double time_blake2b(ctx_t *c)
{
    uint8_t out[32];
    double t0 = now_s();
    crypto_generichash(out, sizeof out, c->flat_a, c->bytes, NULL, 0);
    return now_s() - t0;
}

/* The store's chunk checksum (leaves on several threads) of one kind over
 * one chunk's bytes at a time, as a save or load computes it. */
static double time_checksum(ctx_t *c, unsigned kind)
{
    uint8_t header[KVR__CHUNK_HEADER] = {0}, out[KVR_STORE_SUM_BYTES];
    kvr__chunk_set_kind(header, kind);
    uint64_t per = c->bytes / c->nchains;
    double t0 = now_s();
    for (size_t i = 0; i < c->nchains; i++)
        kvr__chunk_sum(header, c->flat_a + i * per, per, out);
    return now_s() - t0;
}

static kvr_store_t *open_as(const kvr_store_opts_t *o, int v)
{
    kvr_store_t *st;
    kvr_error_t err;
    if (kvr_store_open(o, &st, &err) != KVR_OK)
        die("open", &err);
    st->sum_kind = variants[v].kind;
    if (variants[v].cached)
        st->direct = false;
    return st;
}

/* One timed save of the whole request into the case's long-lived store of
 * that variant (new keys each time: its buffers are reused, as in a
 * process that keeps its store open). */
static double time_disk_save(ctx_t *c, int v)
{
    kvr_error_t err;
    kvr_store_opts_t o = {.dir = c->dir};
    clear_dir(c->dir);
    if (c->saver[v] == NULL)
        c->saver[v] = open_as(&o, v);
    kvr_store_io_t io = io_of(c, &c->prod);
    size_t saved;
    salt_chains(c);
    double t0 = now_s();
    if (kvr_store_save(c->saver[v], &io, &saved, &err) != KVR_OK)
        die("save", &err);
    return now_s() - t0;
}

/* Saves (untimed), then times a load of every chunk by the case's
 * long-lived loader of that variant (no host tier, its buffers reused);
 * the files dropped from the page cache first. */
static double time_disk_load(ctx_t *c, int v)
{
    kvr_error_t err;
    (void)time_disk_save(c, v);
    drop_cache(c->dir);
    if (c->loader[v] == NULL) {
        kvr_store_opts_t q = {.dir = c->dir, .quick_scan = true};
        c->loader[v] = open_as(&q, v);
    }
    kvr_store_io_t lio = io_of(c, &c->cons);
    uint64_t got = 0;
    double t0 = now_s();
    if (kvr_store_load(c->loader[v], &lio, &got, &err) != KVR_OK ||
        got != c->tokens)
        die("load", &err);
    return now_s() - t0;
}

static void xfer(ctx_t *c, int fd, bool write, uint8_t *buf, uint64_t len)
{
    kvr_error_t err;
    if (kvr__disk_xfer(c->engine, fd, write, buf, len, 0, &err) != KVR_OK)
        die("ceiling I/O", &err);
}

/* The ceiling: the same bytes in files of the chunk files' sizes, with
 * O_DIRECT, written with the store's durability (temp name, fsync, rename,
 * directory fsync; the last partial block padded, then cut back) or read
 * back whole. */
static double time_seq_files(ctx_t *c, bool write)
{
    uint64_t body = c->file / KVR__ALIGN * KVR__ALIGN;
    int dfd = open(c->dir, O_RDONLY | O_DIRECTORY);
    char tmp[64], name[64];
    double t0 = now_s();
    for (size_t i = 0; i < c->nchains; i++) {
        snprintf(tmp, sizeof tmp, ".tmp-ceiling-%zu", i);
        snprintf(name, sizeof name, "ceiling-%zu.bin", i);
        int fd = openat(
            dfd, write ? tmp : name,
            (write ? O_WRONLY | O_CREAT | O_TRUNC : O_RDONLY) | O_DIRECT, 0644);
        if (fd < 0) {
            perror(name);
            exit(1);
        }
        uint8_t *buf = c->ceil + i * c->slot;
        xfer(c, fd, write, buf, body);
        ssize_t r = write ? pwrite(fd, buf + body, c->slot - body, body)
                          : pread(fd, buf + body, c->slot - body, body);
        if (r < (ssize_t)(c->file - body) ||
            (write && (ftruncate(fd, c->file) != 0 || fsync(fd) != 0 ||
                       renameat(dfd, tmp, dfd, name) != 0 || fsync(dfd) != 0)))
            perror("ceiling tail/fsync/rename");
        close(fd);
    }
    double t = now_s() - t0;
    close(dfd);
    return t;
}

typedef enum {
    M_BLAKE2B,
    M_SUM_BLAKE2B,
    M_SUM_BLAKE2B512,
    M_SUM_POLY,
    M_SEQ_WRITE,
    M_SEQ_READ,
    M_DISK_SAVE,
    M_DISK_LOAD,
    M_DISK_SAVE_FAST,
    M_DISK_LOAD_FAST,
    M_DISK_SAVE_CACHED,
    M_DISK_LOAD_CACHED,
    M_MEMCPY,
    M_HOST_SAVE,
    M_HOST_LOAD,
    M_COUNT
} measure_t;
static const char *names[M_COUNT] = {"blake2b_one_stream",
                                     "chunk_checksum_blake2b256_leaves",
                                     "chunk_checksum_blake2b512_leaves",
                                     "chunk_checksum_poly1305_leaves",
                                     "seq_write_direct",
                                     "seq_read_direct",
                                     "disk_save",
                                     "disk_load",
                                     "disk_save_fast_checksum",
                                     "disk_load_fast_checksum",
                                     "disk_save_page_cache",
                                     "disk_load_page_cache_cold",
                                     "memcpy",
                                     "host_save",
                                     "host_load"};
#define DISK_MEASURES M_MEMCPY /* measures before it run once a rep */
#define HOST_PER_REP 3         /* host rounds per rep */

static double measure(ctx_t *c, measure_t m)
{
    switch (m) {
    case M_BLAKE2B:
        return time_blake2b(c);
    case M_SUM_BLAKE2B:
        return time_checksum(c, KVR__SUM_BLAKE2B);
    case M_SUM_BLAKE2B512:
        return time_checksum(c, KVR__SUM_BLAKE2B512);
    case M_SUM_POLY:
        return time_checksum(c, KVR__SUM_POLY1305);
    case M_SEQ_WRITE:
        return time_seq_files(c, true);
    case M_SEQ_READ:
        return time_seq_files(c, false);
    case M_DISK_SAVE:
        return time_disk_save(c, V_DEFAULT);
    case M_DISK_LOAD:
        return time_disk_load(c, V_DEFAULT);
    case M_DISK_SAVE_FAST:
        return time_disk_save(c, V_FAST);
    case M_DISK_LOAD_FAST:
        return time_disk_load(c, V_FAST);
    case M_DISK_SAVE_CACHED:
        return time_disk_save(c, V_CACHED);
    case M_DISK_LOAD_CACHED:
        return time_disk_load(c, V_CACHED);
    case M_MEMCPY:
        return time_memcpy(c);
    case M_HOST_SAVE:
        return time_host_save(c);
    default:
        return time_host_load(c);
    }
}

/* Store measure over ceiling measure, per rep (side by side). The host
 * measures' ceiling is the mean of the memcpy just before and just after
 * each of them. */
static const int pairs[][2] = {
    {M_HOST_SAVE, M_MEMCPY},           {M_HOST_LOAD, M_MEMCPY},
    {M_DISK_SAVE, M_SEQ_WRITE},        {M_DISK_LOAD, M_SEQ_READ},
    {M_DISK_SAVE_FAST, M_SEQ_WRITE},   {M_DISK_LOAD_FAST, M_SEQ_READ},
    {M_DISK_SAVE_CACHED, M_SEQ_WRITE}, {M_DISK_LOAD_CACHED, M_SEQ_READ}};
#define NPAIRS (sizeof pairs / sizeof pairs[0])

static json_t *spread(double *v, int n, const char *unit)
{
    qsort(v, n, sizeof *v, cmp_d);
    char k[3][32];
    snprintf(k[0], sizeof k[0], "min%s", unit);
    snprintf(k[1], sizeof k[1], "median%s", unit);
    snprintf(k[2], sizeof k[2], "max%s", unit);
    return json_pack("{s:f,s:f,s:f}", k[0], v[0], k[1], v[n / 2], k[2],
                     v[n - 1]);
}

static bool wanted(const char *only, measure_t m)
{
    if (only == NULL)
        return true;
    if (m == M_SEQ_WRITE && wanted(only, M_SEQ_READ))
        return true; /* the read ceiling reads its files */
    for (size_t i = 0; i < NPAIRS; i++)
        if ((pairs[i][0] == (int)m || pairs[i][1] == (int)m) &&
            strstr(only, names[pairs[i][0]]) != NULL)
            return true;
    return strstr(only, names[m]) != NULL;
}

/* Rates (GB/s) and ratios of every sample, per measure and pair. */
typedef struct samples {
    int n[M_COUNT], np[NPAIRS];
    double *gbs[M_COUNT], *ratio[NPAIRS];
} samples_t;

static void add(double *v, int *n, double x)
{
    v[(*n)++] = x;
}

/* One rep of the host tier: memcpy, save, memcpy, load, memcpy; each tier
 * measure against the mean rate of the memcpys around it. */
static void host_round(ctx_t *c, samples_t *S)
{
    double g = c->bytes / 1e9;
    double m0 = g / time_memcpy(c), sv = g / time_host_save(c);
    double m1 = g / time_memcpy(c), ld = g / time_host_load(c);
    double m2 = g / time_memcpy(c);
    add(S->gbs[M_MEMCPY], &S->n[M_MEMCPY], m0);
    add(S->gbs[M_MEMCPY], &S->n[M_MEMCPY], m1);
    add(S->gbs[M_HOST_SAVE], &S->n[M_HOST_SAVE], sv);
    add(S->gbs[M_HOST_LOAD], &S->n[M_HOST_LOAD], ld);
    add(S->ratio[0], &S->np[0], sv / ((m0 + m1) / 2));
    add(S->ratio[1], &S->np[1], ld / ((m1 + m2) / 2));
}

/* Every rep runs each disk measure once, in turn, so a store measure and
 * its ceiling see the same machine state; ratios are taken per rep. */
static void disk_rep(ctx_t *c, samples_t *S, int r, int reps, const char *only)
{
    double g[M_COUNT] = {0};
    for (int m = 0; m < DISK_MEASURES; m++) {
        if (!wanted(only, (measure_t)m))
            continue;
        fprintf(stderr, "\rchunk %llu rep %d/%d: %-32s",
                (unsigned long long)c->chunk, r + 1, reps, names[m]);
        g[m] = c->bytes / measure(c, (measure_t)m) / 1e9;
        add(S->gbs[m], &S->n[m], g[m]);
    }
    for (size_t i = 2; i < NPAIRS; i++)
        if (wanted(only, (measure_t)pairs[i][0]))
            add(S->ratio[i], &S->np[i], g[pairs[i][0]] / g[pairs[i][1]]);
}

static json_t *case_json(ctx_t *c, samples_t *S)
{
    json_t *res = json_object(), *ratio = json_object();
    double med[M_COUNT] = {0};
    for (int m = 0; m < M_COUNT; m++)
        if (S->n[m] > 0) {
            json_object_set_new(res, names[m],
                                spread(S->gbs[m], S->n[m], "_gbs"));
            med[m] = S->gbs[m][S->n[m] / 2];
        }
    printf("%5llu tok %5.1f MB:", (unsigned long long)c->chunk,
           c->bytes / c->nchains / 1e6);
    for (size_t i = 0; i < NPAIRS; i++) {
        int a = pairs[i][0], b = pairs[i][1], n = S->np[i];
        if (n == 0)
            continue;
        char key[96];
        snprintf(key, sizeof key, "%s/%s", names[a], names[b]);
        json_object_set_new(ratio, key, spread(S->ratio[i], n, ""));
        double *v = S->ratio[i];
        printf("\n      %s %.2f/%.2f GB/s: %.0f%% (%.0f-%.0f%%, %d reps)",
               names[a], med[a], med[b], 100 * v[n / 2], 100 * v[0],
               100 * v[n - 1], n);
    }
    printf("\n");
    for (int m = M_BLAKE2B; m <= M_SUM_POLY; m++)
        if (S->n[m] > 0)
            printf("      %s %.2f GB/s\n", names[m], med[m]);
    json_object_set_new(res, "ratio_per_rep", ratio);
    json_object_set_new(res, "chunk_tokens",
                        json_integer((json_int_t)c->chunk));
    json_object_set_new(res, "chunk_bytes",
                        json_integer((json_int_t)(c->bytes / c->nchains)));
    json_object_set_new(res, "request_tokens",
                        json_integer((json_int_t)c->tokens));
    json_object_set_new(res, "request_bytes",
                        json_integer((json_int_t)c->bytes));
    return res;
}

/* The 1-minute load average: the VM's two cores are shared with other
 * sessions, whose load the BLAKE2b-bound measures feel most. */
static double load1(void)
{
    double l[1] = {-1};
    return getloadavg(l, 1) == 1 ? l[0] : -1;
}

static json_t *run_case(ctx_t *c, int reps, const char *only)
{
    samples_t S = {0};
    double load_start = load1();
    int cap = 2 * HOST_PER_REP * reps + reps;
    for (int m = 0; m < M_COUNT; m++)
        S.gbs[m] = calloc(cap, sizeof(double));
    for (size_t i = 0; i < NPAIRS; i++)
        S.ratio[i] = calloc(cap, sizeof(double));
    bool host = wanted(only, M_HOST_SAVE) || wanted(only, M_HOST_LOAD);
    for (int r = 0; r < reps; r++) {
        for (int h = 0; host && h < HOST_PER_REP; h++)
            host_round(c, &S);
        disk_rep(c, &S, r, reps, only);
    }
    fprintf(stderr, "\r%80s\r", "");
    json_t *res = case_json(c, &S);
    json_object_set_new(
        res, "load_average_1min",
        json_pack("{s:f,s:f}", "start", load_start, "end", load1()));
    printf("      load average %.1f -> %.1f\n", load_start, load1());
    for (int m = 0; m < M_COUNT; m++)
        free(S.gbs[m]);
    for (size_t i = 0; i < NPAIRS; i++)
        free(S.ratio[i]);
    return res;
}

static void *aligned(uint64_t len, int fill)
{
    void *b = NULL;
    if (posix_memalign(&b, KVR__ALIGN, len) != 0) {
        perror("bench_store: memory");
        exit(1);
    }
    memset(b, fill, len);
    return b;
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
    c->flat_a = aligned(c->bytes, 1);
    c->flat_b = aligned(c->bytes, 2);
    c->file = c->bytes / c->nchains + KVR__CHUNK_FRAME;
    c->slot = (c->file + KVR__ALIGN - 1) / KVR__ALIGN * KVR__ALIGN;
    c->ceil = aligned(c->slot * c->nchains, 3);
    kvr_store_opts_t o = {.dir = dir, .quick_scan = true};
    kvr_error_t err;
    if (kvr_store_open(&o, &c->engine, &err) != KVR_OK)
        die("open", &err);
}

static void ctx_free(ctx_t *c)
{
    kvr_store_close(c->warm);
    kvr_store_close(c->engine);
    for (int v = 0; v < V_COUNT; v++) {
        kvr_store_close(c->saver[v]);
        kvr_store_close(c->loader[v]);
    }
    side_free(&c->prod);
    side_free(&c->cons);
    free(c->chains);
    free(c->flat_a);
    free(c->flat_b);
    free(c->ceil);
}

/* Chunk sizes from "256,1024": each a divisor of the request and a
 * multiple of bs; the count, or 0 (said on stderr) when one is not. */
static int parse_chunks(const char *arg, uint64_t tokens, uint64_t *out)
{
    int n = 0;
    for (const char *p = arg; *p != '\0' && n < 8; n++) {
        char *end = NULL;
        unsigned long long v = strtoull(p, &end, 10);
        if (end == p || v == 0 || v % BS != 0 || tokens % v != 0) {
            fprintf(stderr, "bench_store: chunk size '%s' is not a multiple of "
                            "%u dividing %llu\n",
                    p, BS, (unsigned long long)tokens);
            return 0;
        }
        out[n] = v;
        p = *end == ',' ? end + 1 : end;
    }
    return n;
}

int main(int argc, char **argv)
{
    for (int i = 1; i < argc && i < 6; i++)
        if (argv[i][0] == '-') {
            fprintf(stderr, "usage: bench_store [OUT.json [DIR [REPS [all|NAMES "
                            "[CHUNKS]]]]]; unexpected '%s'\n",
                    argv[i]);
            return 2;
        }
    const char *out = argc > 1 ? argv[1] : "bench/results/store.json";
    const char *dir = argc > 2 ? argv[2] : "/tmp/kvr-bench-store";
    int reps = argc > 3 ? atoi(argv[3]) : 5;
    const char *only = argc > 4 && strcmp(argv[4], "all") != 0
                           ? argv[4]
                           : NULL; /* measure names */
    const uint64_t tokens = 4096;
    uint64_t chunks[8] = {256, 1024, 4096};
    int ncase = argc > 5 ? parse_chunks(argv[5], tokens, chunks) : 3;
    if (sodium_init() < 0 || reps < 1 || ncase < 1)
        return 1;
    char cmd[600];
    snprintf(cmd, sizeof cmd, "mkdir -p '%s'", dir);
    if (system(cmd) != 0)
        return 1;
    printf("store bench: %llu-token request, GB/s medians; store/ceiling "
           "per rep: median (min-max)\n",
           (unsigned long long)tokens);
    json_t *arr = json_array();
    const char *backend = "?";
    for (int i = 0; i < ncase; i++) {
        ctx_t c;
        ctx_init(&c, tokens, chunks[i], dir);
        json_array_append_new(arr, run_case(&c, reps, only));
        ctx_free(&c);
    }
    kvr_store_t *st;
    kvr_store_opts_t o = {.dir = dir};
    if (kvr_store_open(&o, &st, NULL) == KVR_OK) {
        backend = kvr_store_backend(st);
        json_t *root = json_pack(
            "{s:s,s:s,s:s,s:i,s:i,s:i,s:i,s:i,s:s,s:i,s:i,s:s,s:I,s:o}",
            "bench", "store", "cache", CACHE_NOTE, "layout",
            "78 layers MLA 576 B/token, index D=128 every third layer",
            "block_size", BS, "layers", LAYERS, "token_bytes", TB, "index_dim",
            D, "request_tokens", (int)tokens, "disk_backend", backend, "reps",
            reps, "host_rounds_per_rep", HOST_PER_REP, "dir", dir, "cpus",
            (json_int_t)sysconf(_SC_NPROCESSORS_ONLN), "cases", arr);
        if (json_dump_file(root, out, JSON_INDENT(1)) != 0)
            fprintf(stderr, "bench_store: cannot write %s\n", out);
        json_decref(root);
        kvr_store_close(st);
    }
    return 0;
}
