/* The store (docs/store.md): a host-memory tier, bounded and LRU by bytes,
 * over the disk tier; the scan on open, verify, namespace keys. */
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <signal.h>
#include <sodium.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include "store_internal.h"

static bool ends_with(const char *s, const char *tail)
{
    size_t n = strlen(s), t = strlen(tail);
    return n >= t && strcmp(s + n - t, tail) == 0;
}

/* ---- host tier -------------------------------------------------------- */

static void unlink_entry(kvr_store_t *st, kvr__entry_t *e)
{
    if (e->prev)
        e->prev->next = e->next;
    else
        st->head = e->next;
    if (e->next)
        e->next->prev = e->prev;
    else
        st->tail = e->prev;
    e->prev = e->next = NULL;
}

static void push_front(kvr_store_t *st, kvr__entry_t *e)
{
    e->next = st->head;
    e->prev = NULL;
    if (st->head)
        st->head->prev = e;
    else
        st->tail = e;
    st->head = e;
}

static void drop_entry(kvr_store_t *st, kvr__entry_t *e)
{
    unlink_entry(st, e);
    st->stats.host_bytes -= e->len;
    st->stats.host_chunks--;
    free(e->data);
    free(e);
}

static kvr__entry_t *find(kvr_store_t *st, const kvr_chunk_key_t *key)
{
    for (kvr__entry_t *e = st->head; e != NULL; e = e->next)
        if (memcmp(&e->key, key, sizeof *key) == 0)
            return e;
    return NULL;
}

static void keep_spare(kvr_store_t *st, uint8_t *data, uint64_t len)
{
    for (unsigned i = 0; i < KVR__SPARES; i++)
        if (st->spare[i] == NULL) {
            st->spare[i] = data;
            st->spare_len[i] = len;
            return;
        }
    free(data);
}

static uint8_t *take_spare(kvr_store_t *st, uint64_t len)
{
    for (unsigned i = 0; i < KVR__SPARES; i++)
        if (st->spare[i] != NULL && st->spare_len[i] == len) {
            uint8_t *b = st->spare[i];
            st->spare[i] = NULL;
            return b;
        }
    return NULL;
}

static void evict_tail(kvr_store_t *st)
{
    kvr__entry_t *e = st->tail;
    uint8_t *data = e->data;
    uint64_t len = e->len;
    e->data = NULL;
    drop_entry(st, e);
    keep_spare(st, data, len);
    st->stats.evictions++;
}

/* A new chunk buffer (aligned to KVR__ALIGN for O_DIRECT, with
 * KVR__SLACK bytes of room). One of KVR__HUGE bytes or more starts on a
 * huge page boundary and asks for transparent huge pages: the gather and
 * the scatter walk the chunk's side of every copy in order, and with huge
 * pages that side needs one TLB entry per 2 MiB rather than per 4 KiB (a
 * few points of memcpy's rate on a host load here), and a fresh buffer
 * faults in 2 MiB at a time. Only advice: where THP is off the buffer is
 * an ordinary one. */
static uint8_t *chunk_buffer(uint64_t len)
{
    uint64_t cap = (len + KVR__ALIGN - 1) / KVR__ALIGN * KVR__ALIGN;
    cap += KVR__SLACK;
    size_t align = cap >= KVR__HUGE ? KVR__HUGE : KVR__ALIGN;
    void *b = NULL;
    if (posix_memalign(&b, align, cap) != 0)
        return NULL;
#ifdef MADV_HUGEPAGE
    if (align == KVR__HUGE)
        (void)madvise(b, cap, MADV_HUGEPAGE);
#endif
    return b;
}

/* A full host tier evicts now what this chunk's insert would evict, so the
 * chunk reuses a buffer already faulted in (same size: the chunks of a
 * request are alike) instead of new memory the kernel must zero. */
uint8_t *kvr__store_alloc(kvr_store_t *st, uint64_t len)
{
    uint8_t *b = take_spare(st, len);
    while (b == NULL && st->tail != NULL && len <= st->opts.host_bytes &&
           st->stats.host_bytes + len > st->opts.host_bytes) {
        evict_tail(st);
        b = take_spare(st, len);
    }
    return b != NULL ? b : chunk_buffer(len);
}

/* Takes data; a chunk larger than the whole tier (or with no memory for
 * its entry) is not kept: NULL, data freed. */
static kvr__entry_t *host_insert(kvr_store_t *st, const kvr_chunk_key_t *key,
                                 uint8_t *data, uint64_t len,
                                 const uint8_t *sum)
{
    kvr__entry_t *old = find(st, key);
    if (old != NULL)
        drop_entry(st, old);
    kvr__entry_t *e = calloc(1, sizeof *e);
    if (e == NULL || len > st->opts.host_bytes) {
        free(e);
        free(data);
        return NULL;
    }
    while (st->stats.host_bytes + len > st->opts.host_bytes)
        evict_tail(st);
    e->key = *key;
    e->data = data;
    e->len = len;
    memcpy(e->sum, sum, KVR_STORE_SUM_BYTES);
    push_front(st, e);
    st->stats.host_bytes += len;
    st->stats.host_chunks++;
    return e;
}

/* ---- read-ahead ---------------------------------------------------------- */

/* A load's chunks are read in the order the load queued them by
 * KVR__READERS threads, each one chunk at a time: at most two chunks are in
 * flight, so each lands nearly as early as the disk allows and no chunk's
 * small reads wait behind many others' payloads (five chunks read at once
 * all landed late), while one reader's open, header read and submission
 * overlap the other's payload (a single reader, preempted by the hash
 * threads between chunks on a busy machine, left the disk idle for
 * milliseconds per chunk: docs/store.md). A reader goes on to the next
 * chunk as soon as one is in memory; that chunk's leaves are still hashed
 * on the checksum's threads, and the load finishes and compares its
 * checksum when it takes it. */
struct kvr__ahead {
    kvr_chunk_key_t key;
    uint64_t seq;     /* the order queued */
    uint8_t *buf;     /* a buffer offered for it; back to the load unused */
    uint64_t buf_len;
    bool started, done, direct;
    kvr__read_t rd; /* once done, with status KVR_OK */
    kvr_status_t status;
    kvr_error_t err;
};

/* One reader thread and its own view of the store: the directory, its
 * io_uring, whether O_DIRECT works, the buffer offered for the chunk it
 * reads; nothing it shares. */
typedef struct reader_thread {
    struct kvr__reader *r;
    kvr_store_t io;
    pthread_t tid;
} reader_thread_t;

/* The queue (under mu) and the reader threads that take from it. */
struct kvr__reader {
    pthread_mutex_t mu;
    pthread_cond_t cv;
    kvr__ahead_t *q[KVR__AHEAD + 1];
    unsigned n;
    uint64_t seq;
    bool stop;
    reader_thread_t t[KVR__READERS];
    unsigned threads;
};

/* The queued chunk not yet started that was queued first, or NULL. */
static kvr__ahead_t *first_waiting(const kvr__reader_t *r)
{
    kvr__ahead_t *a = NULL;
    for (unsigned i = 0; i < r->n; i++)
        if (!r->q[i]->started && (a == NULL || r->q[i]->seq < a->seq))
            a = r->q[i];
    return a;
}

static void read_one(reader_thread_t *t, kvr__ahead_t *a)
{
    t->io.spare[0] = a->buf;
    t->io.spare_len[0] = a->buf_len;
    a->status = kvr__disk_read_start(&t->io, &a->key, &a->rd, &a->err);
    a->buf = t->io.spare[0]; /* not taken: the wrong size, or no file */
    t->io.spare[0] = NULL;
    a->direct = t->io.direct; /* it found O_DIRECT refused */
}

static void *reader_main(void *arg)
{
    reader_thread_t *t = arg;
    kvr__reader_t *r = t->r;
    pthread_mutex_lock(&r->mu);
    for (;;) {
        kvr__ahead_t *a = NULL;
        while (!r->stop && (a = first_waiting(r)) == NULL)
            pthread_cond_wait(&r->cv, &r->mu);
        if (r->stop)
            break;
        a->started = true;
        pthread_mutex_unlock(&r->mu);
        read_one(t, a);
        pthread_mutex_lock(&r->mu);
        a->done = true;
        pthread_cond_broadcast(&r->cv);
    }
    pthread_mutex_unlock(&r->mu);
    return NULL;
}

/* The store's reader, started on first use (NULL where no thread can
 * start: the load reads each chunk itself). */
static kvr__reader_t *reader_get(kvr_store_t *st)
{
    if (st->reader != NULL)
        return st->reader;
    kvr__reader_t *r = calloc(1, sizeof *r);
    if (r == NULL)
        return NULL;
    pthread_mutex_init(&r->mu, NULL);
    pthread_cond_init(&r->cv, NULL);
    for (unsigned i = 0; i < KVR__READERS; i++) {
        reader_thread_t *t = &r->t[r->threads];
        if (st->ring != NULL && st->ahead_ring[i] == NULL)
            st->ahead_ring[i] = kvr__disk_ring_new();
        t->r = r;
        t->io.dir_fd = st->dir_fd;
        t->io.ring = st->ring != NULL ? st->ahead_ring[i] : NULL;
        t->io.direct = st->direct;
        t->io.apart = true;
        if (pthread_create(&t->tid, NULL, reader_main, t) != 0)
            break; /* fewer readers: the same reads, less overlapped */
        r->threads++;
    }
    if (r->threads == 0) {
        pthread_mutex_destroy(&r->mu);
        pthread_cond_destroy(&r->cv);
        free(r);
        return NULL;
    }
    st->reader = r;
    return r;
}

/* Index of key's entry in the queue, or r->n. Under mu. */
static unsigned queued_at(const kvr__reader_t *r, const kvr_chunk_key_t *key)
{
    unsigned i = 0;
    while (i < r->n && memcmp(&r->q[i]->key, key, sizeof *key) != 0)
        i++;
    return i;
}

/* An entry's buffers back: a read done but never taken is dropped. */
static void ahead_free(kvr_store_t *st, kvr__ahead_t *a)
{
    if (a->done && a->status == KVR_OK)
        kvr__disk_read_abort(&a->rd);
    if (a->buf != NULL)
        keep_spare(st, a->buf, a->buf_len);
    free(a);
}

void kvr__store_ahead_drop(kvr_store_t *st)
{
    kvr__reader_t *r = st->reader;
    if (r == NULL)
        return;
    pthread_mutex_lock(&r->mu);
    r->stop = true;
    pthread_cond_broadcast(&r->cv);
    pthread_mutex_unlock(&r->mu);
    for (unsigned i = 0; i < r->threads; i++) {
        pthread_join(r->t[i].tid, NULL); /* after the chunk it reads */
        st->direct = st->direct && r->t[i].io.direct;
    }
    for (unsigned i = 0; i < r->n; i++)
        ahead_free(st, r->q[i]);
    pthread_mutex_destroy(&r->mu);
    pthread_cond_destroy(&r->cv);
    free(r);
    st->reader = NULL;
}

void kvr__store_read_ahead(kvr_store_t *st, const kvr_chunk_key_t *key)
{
    if (st->dir == NULL || find(st, key) != NULL)
        return;
    kvr__reader_t *r = reader_get(st);
    if (r == NULL)
        return; /* a hint: the load reads it itself */
    pthread_mutex_lock(&r->mu);
    bool skip = queued_at(r, key) < r->n || r->n == KVR__AHEAD + 1;
    pthread_mutex_unlock(&r->mu);
    kvr__ahead_t *a = skip ? NULL : calloc(1, sizeof *a);
    if (a == NULL)
        return;
    a->key = *key;
    if (st->last_len > 0) { /* chunks of a request are alike */
        a->buf = kvr__store_alloc(st, st->last_len);
        a->buf_len = a->buf != NULL ? st->last_len : 0;
    }
    pthread_mutex_lock(&r->mu); /* only this thread adds to the queue */
    a->seq = r->seq++;
    r->q[r->n++] = a;
    pthread_cond_broadcast(&r->cv);
    pthread_mutex_unlock(&r->mu);
}

/* The queued read of key, when there is one: waits until it is read, then
 * checks it; true with *s (and on success the buffer) filled. */
static bool ahead_take(kvr_store_t *st, const kvr_chunk_key_t *key,
                       kvr_status_t *s, uint8_t **buf, uint64_t *len,
                       uint8_t *sum, kvr_error_t *err)
{
    kvr__reader_t *r = st->reader;
    if (r == NULL)
        return false;
    pthread_mutex_lock(&r->mu);
    unsigned i = queued_at(r, key);
    kvr__ahead_t *a = i < r->n ? r->q[i] : NULL;
    while (a != NULL && !a->done)
        pthread_cond_wait(&r->cv, &r->mu); /* the reader's own I/O bounds it */
    if (a != NULL)
        r->q[i] = r->q[--r->n];
    pthread_mutex_unlock(&r->mu);
    if (a == NULL)
        return false;
    st->direct = st->direct && a->direct;
    *s = a->status;
    if (*s == KVR_OK)
        *s = kvr__disk_read_check(&a->rd, sum, &a->err);
    *buf = a->rd.data;
    *len = a->rd.len;
    a->rd.data = NULL; /* the caller's now; check left no hash running */
    if (*s != KVR_OK && err != NULL)
        *err = a->err;
    ahead_free(st, a);
    return true;
}

/* ---- open, scan, close ------------------------------------------------- */

/* Whether the process that wrote temp file ".tmp-<pid>-..." is gone (or
 * is this one: it has no write in flight while it opens). Stage processes
 * sharing one directory open it while others save. */
static bool writer_gone(const char *name)
{
    char *end = NULL;
    long pid = strtol(name + 5, &end, 10);
    if (end == name + 5 || *end != '-' || pid <= 0 || pid == (long)getpid())
        return true;
    return kill((pid_t)pid, 0) != 0 && errno == ESRCH;
}

/* Removes unfinished writes of processes that are gone; renames corrupt
 * chunks to <name>.corrupt. */
static kvr_status_t scan(kvr_store_t *st, kvr_error_t *err)
{
    int fd = dup(st->dir_fd);
    DIR *d = fd >= 0 ? fdopendir(fd) : NULL;
    if (d == NULL) {
        if (fd >= 0)
            close(fd);
        return kvr_error_set(err, KVR_ERR_IO, "scan %s: %s", st->dir,
                             strerror(errno));
    }
    struct dirent *de;
    while ((de = readdir(d)) != NULL) {
        const char *n = de->d_name;
        if (strncmp(n, ".tmp-", 5) == 0) {
            if (!writer_gone(n))
                continue; /* another live process is writing it */
            if (unlinkat(st->dir_fd, n, 0) == 0)
                st->stats.scan_dropped_temp++;
            continue;
        }
        if (!ends_with(n, ".kvc"))
            continue;
        if (kvr__disk_check(st->dir_fd, n, !st->opts.quick_scan, NULL) ==
            KVR_OK) {
            st->stats.scan_ok++;
            continue;
        }
        char bad[KVR_STORE_NAME_MAX + 16];
        snprintf(bad, sizeof bad, "%s.corrupt", n);
        if (renameat(st->dir_fd, n, st->dir_fd, bad) == 0)
            st->stats.scan_dropped_corrupt++;
    }
    closedir(d);
    return KVR_OK;
}

kvr_status_t kvr_store_open(const kvr_store_opts_t *opts, kvr_store_t **out,
                            kvr_error_t *err)
{
    if (opts == NULL || out == NULL)
        return kvr_error_set(err, KVR_ERR_INVALID, "store open: %s is NULL",
                             opts == NULL ? "opts" : "out");
    if (opts->dir == NULL && opts->host_bytes == 0)
        return kvr_error_set(err, KVR_ERR_INVALID,
                             "store open: no tier "
                             "(no directory and host_bytes 0)");
    if (sodium_init() < 0)
        return kvr_error_set(err, KVR_ERR_INIT, "libsodium init failed");
    kvr_store_t *st = calloc(1, sizeof *st);
    if (st == NULL)
        return kvr_error_set(err, KVR_ERR_NO_MEMORY, "store open");
    st->opts = *opts;
    st->dir_fd = -1;
    kvr_status_t s = KVR_OK;
    if (opts->dir != NULL) {
        st->dir = strdup(opts->dir);
        s = st->dir ? kvr__disk_open(st, err)
                    : kvr_error_set(err, KVR_ERR_NO_MEMORY, "store open");
        if (s == KVR_OK)
            s = scan(st, err);
    }
    if (s != KVR_OK) {
        kvr_store_close(st);
        return s;
    }
    *out = st;
    return KVR_OK;
}

static void turn_free(kvr__turn_t *t);

void kvr_store_close(kvr_store_t *st)
{
    if (st == NULL)
        return;
    while (st->head != NULL)
        drop_entry(st, st->head);
    if (st->dir != NULL)
        kvr__disk_close(st); /* joins the read-ahead */
    turn_free(st->turn); /* every write-behind was joined by its save */
    for (unsigned i = 0; i < KVR__SPARES; i++)
        free(st->spare[i]);
    free(st->spill);
    free(st->dir);
    free(st);
}

void kvr_store_stats(const kvr_store_t *st, kvr_store_stats_t *out)
{
    *out = st->stats;
}

const char *kvr_store_backend(const kvr_store_t *st)
{
    if (st->dir == NULL)
        return "host";
    return kvr__disk_backend(st);
}

/* ---- chunks -------------------------------------------------------------- */

/* A chunk written (or kept in memory only): counted, and cached in the
 * host tier or kept as the next chunk's buffer. Takes data. */
static void put_done(kvr_store_t *st, const kvr_chunk_key_t *key, uint8_t *data,
                     uint64_t len, const uint8_t *sum)
{
    st->stats.saved_bytes += len;
    if (st->opts.host_bytes > 0)
        (void)host_insert(st, key, data, len, sum); /* a cache: may drop */
    else
        keep_spare(st, data, len); /* the next chunk's buffer, faulted in */
}

kvr_status_t kvr__store_put_owned(kvr_store_t *st, const kvr_chunk_key_t *key,
                                  uint8_t *data, uint64_t len, kvr_error_t *err)
{
    uint8_t header[KVR__CHUNK_HEADER], sum[KVR_STORE_SUM_BYTES] = {0};
    /* The checksum guards bytes that leave memory (the disk write computes
     * it); a host-only tier computes it only when asked to re-check its
     * hits (verify_host). */
    if (st->dir == NULL && st->opts.verify_host) {
        kvr__chunk_header(key, len, header);
        kvr__chunk_sum(header, data, len, sum);
    }
    if (st->dir != NULL) {
        kvr_status_t s = kvr__disk_write(st, key, data, len, sum, err);
        if (s != KVR_OK) {
            free(data);
            return s;
        }
    }
    put_done(st, key, data, len, sum);
    return KVR_OK;
}

/* ---- write-behind ------------------------------------------------------ */

/* The renames of a save's writes in flight go in the order the save
 * started them: each waits for its turn, and once one has failed none
 * after it becomes visible (a failed write stops the save). */
struct kvr__turn {
    pthread_mutex_t mu;
    pthread_cond_t cv;
    uint64_t next, now; /* the next write's number; whose turn it is */
    bool failed;
};

/* Chunks written to disk on threads, KVR__BEHIND at most, while the save
 * gathers the next: one chunk's data is written and hashed while the one
 * before it is fsynced and renamed. Each thread has its own view of the
 * store (the directory, its slot's io_uring, a temp name number, whether
 * O_DIRECT works); the caller touches none of the disk fields until every
 * write is joined. */
struct kvr__behind {
    kvr_store_t io;
    kvr__turn_t *turn;
    uint64_t seq;
    unsigned slot;
    kvr_chunk_key_t key;
    uint8_t *data;
    uint64_t len;
    uint8_t sum[KVR_STORE_SUM_BYTES];
    kvr_status_t status;
    kvr_error_t err;
    pthread_t tid;
};

static void *behind_main(void *arg)
{
    kvr__behind_t *b = arg;
    char tmp[KVR__TMP_NAME_MAX];
    kvr_status_t s = kvr__disk_write_tmp(&b->io, &b->key, b->data, b->len,
                                         b->sum, tmp, &b->err);
    kvr__turn_t *t = b->turn;
    pthread_mutex_lock(&t->mu);
    while (t->now != b->seq)
        pthread_cond_wait(&t->cv, &t->mu); /* the write before: on its way */
    if (s == KVR_OK && t->failed) {
        unlinkat(b->io.dir_fd, tmp, 0);
        s = kvr_error_set(&b->err, KVR_ERR_IO, "chunk not kept: an earlier "
                                               "write of the save failed");
    } else if (s == KVR_OK) {
        s = kvr__disk_commit(&b->io, &b->key, tmp, &b->err);
    }
    t->failed = t->failed || s != KVR_OK;
    t->now++;
    pthread_cond_broadcast(&t->cv);
    pthread_mutex_unlock(&t->mu);
    b->status = s;
    return NULL;
}

static kvr__turn_t *turn_get(kvr_store_t *st)
{
    if (st->turn == NULL && (st->turn = calloc(1, sizeof *st->turn)) != NULL) {
        pthread_mutex_init(&st->turn->mu, NULL);
        pthread_cond_init(&st->turn->cv, NULL);
    }
    if (st->turn != NULL && st->behinds == 0)
        st->turn->failed = false; /* nothing in flight: a new save */
    return st->turn;
}

static void turn_free(kvr__turn_t *t)
{
    if (t == NULL)
        return;
    pthread_mutex_destroy(&t->mu);
    pthread_cond_destroy(&t->cv);
    free(t);
}

static unsigned free_slot(const kvr_store_t *st)
{
    unsigned slot = 0;
    for (unsigned i = 0; i < st->behinds; i++)
        if (st->behind[i]->slot == slot)
            slot++, i = (unsigned)-1; /* taken: look again from the first */
    return slot;
}

/* A write-behind of key, or NULL when none can start (host only, full,
 * no memory): its view of the store set up. */
static kvr__behind_t *behind_new(kvr_store_t *st, const kvr_chunk_key_t *key)
{
    kvr__turn_t *t = st->dir != NULL && st->behinds < KVR__BEHIND
                         ? turn_get(st)
                         : NULL;
    kvr__behind_t *b = t != NULL ? calloc(1, sizeof *b) : NULL;
    if (b == NULL)
        return NULL;
    b->slot = free_slot(st);
    if (st->ring != NULL && st->behind_ring[b->slot] == NULL)
        st->behind_ring[b->slot] = kvr__disk_ring_new();
    b->io.dir = st->dir;
    b->io.dir_fd = st->dir_fd;
    b->io.ring = st->ring != NULL ? st->behind_ring[b->slot] : NULL;
    b->io.direct = st->direct;
    b->io.sum_kind = st->sum_kind;
    b->io.tmp_seq = st->tmp_seq++;
    b->turn = t;
    b->seq = t->next;
    b->key = *key;
    return b;
}

kvr_status_t kvr__store_put_start(kvr_store_t *st, const kvr_chunk_key_t *key,
                                  uint8_t *data, uint64_t len, bool *now,
                                  kvr_error_t *err)
{
    kvr__behind_t *b = behind_new(st, key);
    *now = true;
    if (b == NULL) /* host only, or no memory: write it now */
        return kvr__store_put_owned(st, key, data, len, err);
    b->data = data;
    b->len = len;
    if (pthread_create(&b->tid, NULL, behind_main, b) != 0) {
        free(b);
        return kvr__store_put_owned(st, key, data, len, err);
    }
    st->turn->next++;
    st->behind[st->behinds++] = b;
    *now = false;
    return KVR_OK;
}

/* Joins the oldest write in flight: its outcome, its chunk kept in the
 * host tier when written. */
static kvr_status_t join_oldest(kvr_store_t *st, bool *wrote, kvr_error_t *err)
{
    kvr__behind_t *b = st->behind[0];
    memmove(st->behind, st->behind + 1, --st->behinds * sizeof *st->behind);
    pthread_join(b->tid, NULL);
    st->direct = st->direct && b->io.direct; /* it found O_DIRECT refused */
    kvr_status_t s = b->status;
    *wrote = s == KVR_OK;
    if (s == KVR_OK)
        put_done(st, &b->key, b->data, b->len, b->sum);
    else
        free(b->data);
    if (s != KVR_OK && err != NULL)
        *err = b->err;
    free(b);
    return s;
}

kvr_status_t kvr__store_put_join(kvr_store_t *st, unsigned keep, size_t *wrote,
                                 kvr_error_t *err)
{
    kvr_status_t first = KVR_OK;
    while (st->behinds > keep || (first != KVR_OK && st->behinds > 0)) {
        bool ok = false;
        kvr_status_t s = join_oldest(st, &ok, first == KVR_OK ? err : NULL);
        if (first == KVR_OK)
            first = s;
        if (ok && wrote != NULL)
            (*wrote)++;
    }
    return first;
}

kvr_status_t kvr_store_put(kvr_store_t *st, const kvr_chunk_key_t *key,
                           const void *data, uint64_t len, kvr_error_t *err)
{
    if (st == NULL || key == NULL || (data == NULL && len > 0))
        return kvr_error_set(err, KVR_ERR_INVALID, "store put: NULL argument");
    uint8_t *copy = kvr__store_alloc(st, len);
    if (copy == NULL)
        return kvr_error_set(err, KVR_ERR_NO_MEMORY, "store put: %llu bytes",
                             (unsigned long long)len);
    if (len > 0)
        memcpy(copy, data, len);
    return kvr__store_put_owned(st, key, copy, len, err);
}

static bool host_ok(kvr_store_t *st, kvr__entry_t *e)
{
    if (!st->opts.verify_host)
        return true;
    uint8_t header[KVR__CHUNK_HEADER], sum[KVR_STORE_SUM_BYTES];
    kvr__chunk_header(&e->key, e->len, header);
    kvr__chunk_sum(header, e->data, e->len, sum);
    return memcmp(sum, e->sum, sizeof sum) == 0;
}

kvr_status_t kvr__store_ref(kvr_store_t *st, const kvr_chunk_key_t *key,
                            const uint8_t **data, uint64_t *len,
                            kvr_error_t *err)
{
    char name[KVR_STORE_NAME_MAX];
    kvr__entry_t *e = find(st, key);
    if (e != NULL && !host_ok(st, e)) {
        drop_entry(st, e);
        st->stats.corrupt++;
        e = NULL;
        kvr__chunk_name(key, name);
        return kvr_error_set(err, KVR_ERR_NOT_FOUND,
                             "chunk %s: host copy "
                             "fails its checksum",
                             name);
    }
    if (e != NULL) {
        unlink_entry(st, e);
        push_front(st, e);
        st->stats.host_hits++;
    } else if (st->dir != NULL) {
        uint8_t *buf = NULL, sum[KVR_STORE_SUM_BYTES];
        uint64_t n = 0;
        kvr_status_t s;
        if (!ahead_take(st, key, &s, &buf, &n, sum, err))
            s = kvr__disk_read(st, key, &buf, &n, sum, err);
        if (s == KVR_OK)
            st->last_len = n;
        if (s != KVR_OK) {
            st->stats.misses++;
            if (s == KVR_ERR_VERIFY)
                st->stats.corrupt++;
            if (s == KVR_ERR_VERIFY && err != NULL)
                err->code = KVR_ERR_NOT_FOUND; /* a corrupt chunk is a miss */
            return s == KVR_ERR_VERIFY ? KVR_ERR_NOT_FOUND : s;
        }
        st->stats.disk_hits++;
        if (st->opts.host_bytes >= n) {
            e = host_insert(st, key, buf, n, sum);
            if (e == NULL)
                return kvr_error_set(err, KVR_ERR_NO_MEMORY,
                                     "store: no "
                                     "memory for a host-tier entry");
        } else {
            /* no room in the host tier: keep it in a one-slot spill */
            if (st->spill != NULL)
                keep_spare(st, st->spill, st->spill_len);
            st->spill = buf;
            st->spill_len = n;
            *data = buf;
            *len = n;
            return KVR_OK;
        }
    } else {
        st->stats.misses++;
        kvr__chunk_name(key, name);
        return kvr_error_set(err, KVR_ERR_NOT_FOUND, "chunk %s: not stored",
                             name);
    }
    *data = e->data;
    *len = e->len;
    return KVR_OK;
}

kvr_status_t kvr_store_get(kvr_store_t *st, const kvr_chunk_key_t *key,
                           void *buf, uint64_t cap, uint64_t *len,
                           kvr_error_t *err)
{
    if (st == NULL || key == NULL || len == NULL)
        return kvr_error_set(err, KVR_ERR_INVALID, "store get: NULL argument");
    const uint8_t *data;
    kvr_status_t s = kvr__store_ref(st, key, &data, len, err);
    if (s != KVR_OK)
        return s;
    if (cap < *len)
        return kvr_error_set(err, KVR_ERR_BUFFER_SMALL,
                             "store get: chunk of "
                             "%llu bytes, buffer of %llu",
                             (unsigned long long)*len, (unsigned long long)cap);
    if (*len > 0)
        memcpy(buf, data, *len);
    st->stats.loaded_bytes += *len;
    return KVR_OK;
}

bool kvr__store_in_host(kvr_store_t *st, const kvr_chunk_key_t *key)
{
    return find(st, key) != NULL;
}

bool kvr_store_contains(kvr_store_t *st, const kvr_chunk_key_t *key)
{
    return find(st, key) != NULL || (st->dir != NULL && kvr__disk_has(st, key));
}

/* ---- verify ---------------------------------------------------------------- */

kvr_status_t kvr_store_verify(const char *dir, kvr_store_bad_fn bad, void *arg,
                              uint64_t *num_ok, uint64_t *num_bad,
                              kvr_error_t *err)
{
    uint64_t ok = 0, nbad = 0;
    DIR *d = dir ? opendir(dir) : NULL;
    if (d == NULL)
        return kvr_error_set(err, dir ? KVR_ERR_IO : KVR_ERR_INVALID,
                             "store verify %s: %s", dir ? dir : "(NULL)",
                             dir ? strerror(errno) : "no directory");
    struct dirent *de;
    kvr_error_t why;
    while ((de = readdir(d)) != NULL) {
        const char *n = de->d_name;
        bool tmp = strncmp(n, ".tmp-", 5) == 0;
        if (!tmp && !ends_with(n, ".kvc"))
            continue;
        if (!tmp && kvr__disk_check(dirfd(d), n, true, &why) == KVR_OK) {
            ok++;
            continue;
        }
        nbad++;
        if (bad != NULL)
            bad(n, tmp ? "unfinished write" : why.msg, arg);
    }
    closedir(d);
    if (num_ok)
        *num_ok = ok;
    if (num_bad)
        *num_bad = nbad;
    return KVR_OK;
}

/* ---- keys -------------------------------------------------------------- */

static void hash_u64(crypto_generichash_state *s, uint64_t v)
{
    uint8_t b[8];
    for (int i = 0; i < 8; i++)
        b[i] = (uint8_t)(v >> (8 * i));
    crypto_generichash_update(s, b, sizeof b);
}

kvr_status_t kvr_store_namespace(const kvr_offload_desc_t *desc,
                                 const kvr_region_desc_t *regions,
                                 size_t num_regions, const char *spec_config,
                                 uint8_t out[KVR_STORE_NS_BYTES],
                                 kvr_error_t *err)
{
    if (desc == NULL || out == NULL || (regions == NULL && num_regions > 0))
        return kvr_error_set(err, KVR_ERR_INVALID,
                             "store namespace: NULL "
                             "argument");
    kvr_offload_desc_t canon = *desc;
    canon.tp = canon.dcp_size = canon.interleave = 1;
    canon.replicate_index = canon.preshuffle = false;
    char key[KVR_OFFLOAD_KEY_HEX_LEN + 1];
    kvr_status_t s = kvr_offload_key(&canon, key, err);
    if (s != KVR_OK)
        return s;
    crypto_generichash_state h;
    crypto_generichash_init(&h, NULL, 0, KVR_STORE_NS_BYTES);
    crypto_generichash_update(&h, (const uint8_t *)"kvrelay-store-1\n", 16);
    crypto_generichash_update(&h, (const uint8_t *)key, strlen(key));
    hash_u64(&h, num_regions);
    for (size_t i = 0; i < num_regions; i++) {
        const kvr_region_desc_t *r = &regions[i];
        hash_u64(&h, r->role);
        hash_u64(&h, r->layer);
        hash_u64(&h, r->role == KVR_ROLE_INDEX
                         ? 0
                         : r->page_bytes / desc->block_size);
        hash_u64(&h, r->index_dim);
        hash_u64(&h, r->quant_block ? r->quant_block : r->index_dim);
        hash_u64(&h, r->heads);
        hash_u64(&h, r->head_dim);
        hash_u64(&h, r->elem_bytes);
    }
    const char *spec = spec_config ? spec_config : "";
    hash_u64(&h, strlen(spec));
    crypto_generichash_update(&h, (const uint8_t *)spec, strlen(spec));
    crypto_generichash_final(&h, out, KVR_STORE_NS_BYTES);
    return KVR_OK;
}

kvr_status_t kvr_store_chains(const uint32_t *tokens, size_t num_tokens,
                              uint64_t chunk, kvr_block_hash_t *out, size_t cap,
                              size_t *num, kvr_error_t *err)
{
    if (chunk == 0)
        return kvr_error_set(err, KVR_ERR_CHUNK_SIZE,
                             "store chains: chunk "
                             "size 0");
    return kvr_prefix_hashes(NULL, tokens, num_tokens, chunk, out, cap, num,
                             err);
}
