/* Store throughput (docs/store.md): save and load of each tier against the
 * same run's ceiling: memcpy of the same bytes for the host tier, one large
 * sequential write (+ fsync) or read of the same bytes for the disk tier.
 * Headline layout (docs/design.md §13, §17): 78 layers of MLA 576 B/token,
 * an index cache (D = 128) every third layer, bs = 64, one PP stage holding
 * all layers, producer W_p = 1 preshuffled, consumer W = 1. Disk reads start
 * cold: every file is dropped from the page cache (posix_fadvise) first.
 * Usage: bench_store [out.json] [dir] [reps] [measures]: measures (names
 * joined by commas) limits the run to those and their ceilings. Release
 * build only. */
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
#define CACHE_NOTE                                                           \
    "cold: every file dropped from the page cache (posix_fadvise "          \
    "DONTNEED after fsync) before a timed read; warm: read just after "     \
    "the write. A VM's host may still cache its virtual disk."

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
    /* long-lived disk-tier stores by [checksum kind][plain I/O] */
    kvr_store_t *saver[2][2], *loader[2][2];
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

/* How a disk-tier store runs: the checksum kind of its new chunks and
 * whether it gives up io_uring for pread/pwrite. */
typedef struct variant {
    unsigned kind;
    bool plain;
} variant_t;

static const variant_t V_DEFAULT = {KVR__SUM_DEFAULT, false};

static kvr_store_t *open_as(const kvr_store_opts_t *o, variant_t v)
{
    kvr_store_t *st;
    kvr_error_t err;
    if (kvr_store_open(o, &st, &err) != KVR_OK)
        die("open", &err);
    if (o->dir != NULL) {
        st->sum_kind = v.kind;
        if (v.plain)
            kvr__disk_plain(st);
    }
    return st;
}

/* One timed save of the whole request into a fresh store (fresh) or into
 * the case's long-lived store of that variant (new keys each time: its
 * buffers are reused, as in a process that keeps its store open). */
static double time_save(ctx_t *c, const kvr_store_opts_t *o, variant_t v,
                        bool fresh)
{
    kvr_error_t err;
    if (o->dir)
        clear_dir(o->dir);
    kvr_store_t *st = NULL, **keep = fresh ? &st : &c->saver[v.kind][v.plain];
    if (*keep == NULL)
        *keep = open_as(o, v);
    kvr_store_io_t io = io_of(c, &c->prod);
    size_t saved;
    salt_chains(c);
    double t0 = now_s();
    if (kvr_store_save(*keep, &io, &saved, &err) != KVR_OK)
        die("save", &err);
    double t = now_s() - t0;
    if (fresh)
        kvr_store_close(*keep);
    return t;
}

/* Saves (untimed), then times a load of every chunk. Host: a fresh store,
 * from its host tier. Disk: the case's long-lived loader of that variant
 * (no host tier, its buffers reused), the files dropped from the page
 * cache first (cold) or just written (warm). */
static double time_load(ctx_t *c, const kvr_store_opts_t *o, variant_t v,
                        bool cold)
{
    kvr_error_t err;
    kvr_store_t *st = NULL;
    if (o->dir == NULL) {
        st = open_as(o, v);
        kvr_store_io_t io = io_of(c, &c->prod);
        size_t saved;
        if (kvr_store_save(st, &io, &saved, &err) != KVR_OK)
            die("save", &err);
    } else {
        (void)time_save(c, o, v, false);
        if (cold)
            drop_cache(o->dir);
        kvr_store_t **keep = &c->loader[v.kind][v.plain];
        if (*keep == NULL) {
            kvr_store_opts_t q = *o;
            q.quick_scan = true;
            *keep = open_as(&q, v);
        }
        st = *keep;
    }
    kvr_store_io_t lio = io_of(c, &c->cons);
    uint64_t got = 0;
    double t0 = now_s();
    if (kvr_store_load(st, &lio, &got, &err) != KVR_OK || got != c->tokens)
        die("load", &err);
    double t = now_s() - t0;
    if (o->dir == NULL)
        kvr_store_close(st);
    return t;
}

static double time_memcpy(ctx_t *c)
{
    double t0 = now_s();
    memcpy(c->flat_b, c->flat_a, c->bytes);
    return now_s() - t0;
}

static void seq_io(int fd, bool write, uint8_t *buf, uint64_t len)
{
    for (uint64_t off = 0; off < len;) {
        size_t n = len - off > (16u << 20) ? 16u << 20 : len - off;
        ssize_t r = write ? pwrite(fd, buf + off, n, off)
                          : pread(fd, buf + off, n, off);
        if (r <= 0) {
            perror("ceiling I/O");
            exit(1);
        }
        if (write) /* writeback starts now, as the store does it */
            sync_file_range(fd, (off_t)off, r, SYNC_FILE_RANGE_WRITE);
        off += (uint64_t)r;
    }
}

/* The old ceiling: the request's payload as one file, one fsync. */
static double time_seq_one(ctx_t *c)
{
    char path[512];
    snprintf(path, sizeof path, "%s/ceiling.bin", c->dir);
    int fd = open(path, O_WRONLY | O_CREAT | O_TRUNC, 0644);
    if (fd < 0) {
        perror(path);
        exit(1);
    }
    double t0 = now_s();
    seq_io(fd, true, c->flat_a, c->bytes);
    if (fsync(fd) != 0)
        perror("fsync");
    double t = now_s() - t0;
    close(fd);
    return t;
}

/* The ceiling the store is held to: the same bytes in files of the same
 * sizes as its chunk files (header + payload + checksum), written with the
 * same durability (temp name, fsync, rename, directory fsync) or read back
 * whole, cold (dropped from the page cache first) or warm. */
static double time_seq_files(ctx_t *c, bool write, bool cold)
{
    uint64_t per = c->bytes / c->nchains, file = per + KVR__CHUNK_FRAME;
    int dfd = open(c->dir, O_RDONLY | O_DIRECTORY);
    char tmp[64], name[64];
    if (!write && cold)
        drop_cache(c->dir);
    double t0 = now_s();
    for (size_t i = 0; i < c->nchains; i++) {
        snprintf(tmp, sizeof tmp, ".tmp-ceiling-%zu", i);
        snprintf(name, sizeof name, "ceiling-%zu.bin", i);
        int fd = openat(dfd, write ? tmp : name,
                        write ? O_WRONLY | O_CREAT | O_TRUNC : O_RDONLY, 0644);
        if (fd < 0) {
            perror(name);
            exit(1);
        }
        uint8_t *buf = (write ? c->flat_a : c->flat_b) + i * per;
        seq_io(fd, write, buf, file);
        if (write && (fsync(fd) != 0 || renameat(dfd, tmp, dfd, name) != 0 ||
                      fsync(dfd) != 0))
            perror("ceiling fsync/rename");
        close(fd);
    }
    double t = now_s() - t0;
    close(dfd);
    return t;
}

typedef enum {
    M_MEMCPY,
    M_HOST_SAVE,
    M_HOST_SAVE_COLD,
    M_HOST_LOAD,
    M_BLAKE2B,
    M_SUM_BLAKE2B,
    M_SUM_POLY,
    M_SEQ_WRITE_ONE,
    M_SEQ_WRITE,
    M_SEQ_READ,
    M_SEQ_READ_WARM,
    M_DISK_SAVE,
    M_DISK_SAVE_FRESH,
    M_DISK_LOAD,
    M_DISK_LOAD_WARM,
    M_DISK_SAVE_FAST,
    M_DISK_LOAD_FAST,
    M_DISK_SAVE_PLAIN,
    M_DISK_LOAD_PLAIN,
    M_COUNT
} measure_t;
static const char *names[M_COUNT] = {
    "memcpy",
    "host_save",
    "host_save_fresh_store",
    "host_load",
    "blake2b_one_stream",
    "chunk_checksum_blake2b_leaves",
    "chunk_checksum_poly1305_leaves",
    "seq_write_one_file",
    "seq_write_chunk_files",
    "seq_read_chunk_files_cold",
    "seq_read_chunk_files_warm",
    "disk_save",
    "disk_save_fresh_store",
    "disk_load_cold",
    "disk_load_warm",
    "disk_save_fast_checksum",
    "disk_load_cold_fast_checksum",
    "disk_save_pwrite",
    "disk_load_cold_pread"};

static double measure(ctx_t *c, measure_t m)
{
    kvr_store_opts_t host = {.host_bytes = c->bytes * 2};
    kvr_store_opts_t disk = {.dir = c->dir};
    const variant_t fast = {KVR__SUM_POLY1305, false};
    const variant_t plain = {KVR__SUM_DEFAULT, true};
    switch (m) {
    case M_MEMCPY:
        return time_memcpy(c);
    case M_HOST_SAVE:
        return time_save_warm(c);
    case M_HOST_SAVE_COLD:
        return time_save(c, &host, V_DEFAULT, true);
    case M_HOST_LOAD:
        return time_load(c, &host, V_DEFAULT, false);
    case M_BLAKE2B:
        return time_blake2b(c);
    case M_SUM_BLAKE2B:
        return time_checksum(c, KVR__SUM_BLAKE2B);
    case M_SUM_POLY:
        return time_checksum(c, KVR__SUM_POLY1305);
    case M_SEQ_WRITE_ONE:
        return time_seq_one(c);
    case M_SEQ_WRITE:
        return time_seq_files(c, true, false);
    case M_SEQ_READ:
        return time_seq_files(c, false, true);
    case M_SEQ_READ_WARM:
        return time_seq_files(c, false, false);
    case M_DISK_SAVE:
        return time_save(c, &disk, V_DEFAULT, false);
    case M_DISK_SAVE_FRESH:
        return time_save(c, &disk, V_DEFAULT, true);
    case M_DISK_LOAD:
        return time_load(c, &disk, V_DEFAULT, true);
    case M_DISK_LOAD_WARM:
        return time_load(c, &disk, V_DEFAULT, false);
    case M_DISK_SAVE_FAST:
        return time_save(c, &disk, fast, false);
    case M_DISK_LOAD_FAST:
        return time_load(c, &disk, fast, true);
    case M_DISK_SAVE_PLAIN:
        return time_save(c, &disk, plain, false);
    default:
        return time_load(c, &disk, plain, true);
    }
}

/* Store measure over ceiling measure, per rep (side by side). */
static const int pairs[][2] = {{M_HOST_SAVE, M_MEMCPY},
                               {M_HOST_LOAD, M_MEMCPY},
                               {M_DISK_SAVE, M_SEQ_WRITE},
                               {M_DISK_SAVE_FRESH, M_SEQ_WRITE},
                               {M_DISK_LOAD, M_SEQ_READ},
                               {M_DISK_LOAD_WARM, M_SEQ_READ_WARM},
                               {M_DISK_SAVE_FAST, M_SEQ_WRITE},
                               {M_DISK_LOAD_FAST, M_SEQ_READ},
                               {M_DISK_SAVE_PLAIN, M_SEQ_WRITE},
                               {M_DISK_LOAD_PLAIN, M_SEQ_READ}};
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
    if (m == M_SEQ_WRITE && (wanted(only, M_SEQ_READ) ||
                             wanted(only, M_SEQ_READ_WARM)))
        return true; /* the read ceilings read its files */
    for (size_t i = 0; i < NPAIRS; i++)
        if ((pairs[i][0] == (int)m || pairs[i][1] == (int)m) &&
            strstr(only, names[pairs[i][0]]) != NULL)
            return true;
    return strstr(only, names[m]) != NULL;
}

/* Every rep runs each measure once, in turn, so a store measure and its
 * ceiling see the same machine state; ratios are taken per rep. */
static json_t *run_case(ctx_t *c, int reps, const char *only)
{
    json_t *res = json_object();
    double(*gbs)[M_COUNT] = calloc(reps, sizeof *gbs);
    for (int r = 0; r < reps; r++)
        for (int m = 0; m < M_COUNT; m++) {
            if (!wanted(only, (measure_t)m))
                continue;
            fprintf(stderr, "\rchunk %llu rep %d/%d: %-32s",
                    (unsigned long long)c->chunk, r + 1, reps, names[m]);
            gbs[r][m] = c->bytes / measure(c, (measure_t)m) / 1e9;
        }
    fprintf(stderr, "\r%80s\r", "");
    double *v = malloc(reps * sizeof *v);
    double med[M_COUNT] = {0};
    for (int m = 0; m < M_COUNT; m++) {
        if (!wanted(only, (measure_t)m))
            continue;
        for (int r = 0; r < reps; r++)
            v[r] = gbs[r][m];
        json_object_set_new(res, names[m], spread(v, reps, "_gbs"));
        med[m] = v[reps / 2];
    }
    json_t *ratio = json_object();
    printf("%5llu tok %5.1f MB:", (unsigned long long)c->chunk,
           c->bytes / c->nchains / 1e6);
    for (size_t i = 0; i < NPAIRS; i++) {
        int a = pairs[i][0], b = pairs[i][1];
        if (!wanted(only, (measure_t)a))
            continue;
        for (int r = 0; r < reps; r++)
            v[r] = gbs[r][a] / gbs[r][b];
        char key[96];
        snprintf(key, sizeof key, "%s/%s", names[a], names[b]);
        json_object_set_new(ratio, key, spread(v, reps, ""));
        printf(" %s %.2f/%.2f=%.0f%% (%.0f-%.0f%%)", names[a], med[a], med[b],
               100 * v[reps / 2], 100 * v[0], 100 * v[reps - 1]);
    }
    printf("\n");
    for (int m = M_BLAKE2B; m <= M_SEQ_WRITE_ONE; m++)
        if (wanted(only, (measure_t)m))
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
    free(v);
    free(gbs);
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
    c->flat_a = malloc(c->bytes + KVR__CHUNK_FRAME); /* + a file's frame */
    c->flat_b = malloc(c->bytes + KVR__CHUNK_FRAME);
    memset(c->flat_a, 1, c->bytes + KVR__CHUNK_FRAME);
    memset(c->flat_b, 2, c->bytes + KVR__CHUNK_FRAME);
}

static void ctx_free(ctx_t *c)
{
    kvr_store_close(c->warm);
    for (int k = 0; k < 2; k++)
        for (int p = 0; p < 2; p++) {
            kvr_store_close(c->saver[k][p]);
            kvr_store_close(c->loader[k][p]);
        }
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
    const char *only = argc > 4 ? argv[4] : NULL; /* measure names */
    if (sodium_init() < 0 || reps < 1)
        return 1;
    const uint64_t tokens = 4096, chunks[] = {256, 1024, 4096};
    const int ncase = (int)(sizeof chunks / sizeof chunks[0]);
    char cmd[600];
    snprintf(cmd, sizeof cmd, "mkdir -p '%s'", dir);
    if (system(cmd) != 0)
        return 1;
    printf("store bench: %llu-token request, GB/s medians of %d reps, "
           "store/ceiling per rep: median (min-max)\n",
           (unsigned long long)tokens, reps);
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
        kvr_store_close(st);
    }
    json_t *root = json_pack(
        "{s:s,s:s,s:s,s:i,s:i,s:i,s:i,s:i,s:s,s:i,s:s,s:I,s:o}", "bench",
        "store", "cache", CACHE_NOTE,
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
