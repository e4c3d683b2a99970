/* The disk tier (docs/store.md): one directory of chunk files. A chunk is
 * written to a temp name, fsynced, renamed and the directory fsynced, so a
 * crash leaves either the whole chunk or a temp file the next open removes.
 * Large payloads move with O_DIRECT (the disk's own speed, not the page
 * cache's; plain I/O where the filesystem refuses it), through io_uring
 * when liburing is present and the kernel allows it, else pread/pwrite.
 * The checksum's leaves are hashed while the payload is written or read. */
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/uio.h>
#include <unistd.h>
#ifdef KVR_HAVE_URING
#include <liburing.h>
#endif

#include "base_internal.h"
#include "store_internal.h"

#define PIECE (4u << 20)       /* bytes per I/O request, one checksum leaf */
#define DEPTH 4u               /* requests in flight */
#define DIRECT_MIN PIECE       /* payloads this large bypass the page cache */
#define TAIL (2u * KVR__ALIGN) /* the payload's last partial block + sum */

typedef enum { IO_READ, IO_WRITE } io_dir_t;

static uint64_t round_up(uint64_t n)
{
    return (n + KVR__ALIGN - 1) / KVR__ALIGN * KVR__ALIGN;
}

/* Moves len bytes; with got, a read stops at the end of the file (*got
 * says how many came; NULL: all must). */
static kvr_status_t io_upto(int fd, io_dir_t dir, uint8_t *buf, uint64_t len,
                            uint64_t off, uint64_t *got, kvr_error_t *err)
{
    uint64_t done = 0;
    while (done < len) {
        size_t n = len - done > (1u << 30) ? (1u << 30) : len - done;
        ssize_t r = dir == IO_WRITE ? pwrite(fd, buf + done, n, off + done)
                                    : pread(fd, buf + done, n, off + done);
        if (r < 0 && errno == EINTR)
            continue;
        if (r < 0)
            return kvr_error_set(err, KVR_ERR_IO, "%s at %llu: %s",
                                 dir == IO_WRITE ? "write" : "read",
                                 (unsigned long long)(off + done),
                                 strerror(errno));
        if (r == 0 && got == NULL)
            return kvr_error_set(err, KVR_ERR_IO, "short read at %llu",
                                 (unsigned long long)(off + done));
        done += (uint64_t)r;
        if (got != NULL && (size_t)r < n)
            break; /* the end of the file: no read past it (with O_DIRECT
                      its offset would not be aligned) */
    }
    if (got != NULL)
        *got = done;
    return KVR_OK;
}

static kvr_status_t plain_io(int fd, io_dir_t dir, uint8_t *buf, uint64_t len,
                             uint64_t off, kvr_error_t *err)
{
    return io_upto(fd, dir, buf, len, off, NULL, err);
}

/* Reads up to len bytes, of which at least need (the rest may lie past
 * the end of the file). */
static kvr_status_t read_need(int fd, uint8_t *buf, uint64_t len,
                              uint64_t need, uint64_t off, kvr_error_t *err)
{
    uint64_t got = 0;
    kvr_status_t s = io_upto(fd, IO_READ, buf, len, off, &got, err);
    if (s == KVR_OK && got < need)
        s = kvr_error_set(err, KVR_ERR_IO, "short read at %llu",
                          (unsigned long long)(off + got));
    return s;
}

/* A written piece starts its writeback now (a hint; nothing to do after an
 * O_DIRECT write), so the device works while later pieces are copied and
 * hashed and the final fsync finds little left to write. */
static void kick_writeback(int fd, uint64_t off, uint64_t n)
{
    sync_file_range(fd, (off_t)off, (off_t)n, SYNC_FILE_RANGE_WRITE);
}

/* Turns O_DIRECT on for a payload of len bytes at buf when it is large and
 * aligned. A filesystem without it (EINVAL; the failpoint store-no-odirect
 * plays one) turns it off for the store: plain I/O from then on. */
static bool go_direct(kvr_store_t *st, int fd, const void *buf, uint64_t len,
                      const char *name)
{
    if (!st->direct || len < DIRECT_MIN || (uintptr_t)buf % KVR__ALIGN != 0)
        return false;
    int fl = fcntl(fd, F_GETFL);
    if (kvr__failpoint(KVR__FP_STORE_NO_ODIRECT, name, strlen(name)))
        errno = EINVAL, fl = -1;
    if (fl >= 0 && fcntl(fd, F_SETFL, fl | O_DIRECT) == 0)
        return true;
    if (errno == EINVAL)
        st->direct = false;
    return false;
}

#ifdef KVR_HAVE_URING
/* Waits for a completion, or hashes a leaf instead when one is waiting:
 * the CPU hashes while the device works. */
static int submit_or_hash(struct io_uring *ring, kvr__sum_t *sum)
{
    int r = io_uring_submit(ring);
    if (r >= 0 && (sum == NULL || !kvr__sum_step(sum)))
        r = io_uring_submit_and_wait(ring, 1);
    return r;
}

/* Transfer state: pieces are submitted in order, DEPTH in flight; reads
 * tell the checksum how many leading pieces have landed. A read may end
 * early at the end of the file once need bytes have come (an O_DIRECT
 * read of whole blocks past the file's last byte). */
typedef struct uring_xfer {
    int fd;
    io_dir_t dir;
    uint8_t *buf;
    uint64_t len, need, off, pieces, next, low;
    uint8_t *done; /* reads: per piece, landed */
    unsigned inflight;
    kvr__sum_t *sum;
    bool help; /* this thread hashes leaves while it waits */
} uring_xfer_t;

static uint64_t piece_len(const uring_xfer_t *x, uint64_t i)
{
    uint64_t at = i * PIECE;
    return x->len - at > PIECE ? PIECE : x->len - at;
}

static void queue_pieces(struct io_uring *ring, uring_xfer_t *x)
{
    struct io_uring_sqe *sqe;
    while (x->next < x->pieces && x->inflight < DEPTH &&
           (sqe = io_uring_get_sqe(ring)) != NULL) {
        uint64_t at = x->next * PIECE;
        unsigned n = (unsigned)piece_len(x, x->next);
        if (x->dir == IO_WRITE)
            io_uring_prep_write(sqe, x->fd, x->buf + at, n, x->off + at);
        else
            io_uring_prep_read(sqe, x->fd, x->buf + at, n, x->off + at);
        sqe->user_data = x->next++;
        x->inflight++;
    }
}

/* One completion: a short transfer finishes with plain I/O (a read up to
 * the end of the file). */
static kvr_status_t reap_piece(uring_xfer_t *x, uint64_t i, int res,
                               kvr_error_t *err)
{
    uint64_t at = i * PIECE, want = piece_len(x, i);
    x->inflight--;
    if (res < 0)
        return kvr_error_set(err, KVR_ERR_IO, "%s at %llu: %s",
                             x->dir == IO_WRITE ? "write" : "read",
                             (unsigned long long)(x->off + at), strerror(-res));
    kvr_status_t s = KVR_OK;
    if ((uint64_t)res < want && x->dir == IO_WRITE)
        s = plain_io(x->fd, x->dir, x->buf + at + res, want - res,
                     x->off + at + res, err);
    else if ((uint64_t)res < want && at + res < x->need)
        s = read_need(x->fd, x->buf + at + res, want - res, x->need - at - res,
                      x->off + at + res, err);
    if (s == KVR_OK && x->dir == IO_WRITE)
        kick_writeback(x->fd, x->off + at, want);
    if (s == KVR_OK && x->done != NULL) {
        x->done[i] = 1;
        while (x->low < x->pieces && x->done[x->low])
            x->low++;
        if (x->sum != NULL) /* never past len: the payload's tail may
                               still be on its way (read_tail) */
            kvr__sum_ready(x->sum,
                           x->low == x->pieces ? x->len : x->low * PIECE);
    }
    return s;
}

static kvr_status_t uring_io(struct io_uring *ring, uring_xfer_t *x,
                             kvr_error_t *err)
{
    kvr_status_t s = KVR_OK;
    while (x->next < x->pieces || x->inflight > 0) {
        if (s == KVR_OK)
            queue_pieces(ring, x);
        if (x->inflight == 0)
            break;
        int r = submit_or_hash(ring, x->help ? x->sum : NULL);
        if (r < 0 && r != -EINTR)
            return kvr_error_set(err, KVR_ERR_IO, "io_uring submit: %s",
                                 strerror(-r));
        struct io_uring_cqe *cqe;
        while (io_uring_peek_cqe(ring, &cqe) == 0) {
            uint64_t i = cqe->user_data;
            int res = cqe->res;
            io_uring_cqe_seen(ring, cqe);
            kvr_status_t p = reap_piece(x, i, res, err);
            if (s == KVR_OK)
                s = p;
        }
        if (s != KVR_OK)
            x->next = x->pieces; /* drain what is in flight, submit nothing */
    }
    return s;
}

/* Through io_uring, DEPTH pieces in flight. */
static kvr_status_t uring_xfer(struct io_uring *ring, int fd, io_dir_t dir,
                               uint8_t *buf, uint64_t len, uint64_t need,
                               uint64_t off, kvr__sum_t *sum, bool help,
                               kvr_error_t *err)
{
    uring_xfer_t x = {.fd = fd,
                      .dir = dir,
                      .buf = buf,
                      .len = len,
                      .need = need,
                      .off = off,
                      .pieces = (len + PIECE - 1) / PIECE,
                      .sum = sum,
                      .help = help};
    if (dir == IO_READ) {
        x.done = calloc(x.pieces, 1);
        if (x.done == NULL)
            return kvr_error_set(err, KVR_ERR_NO_MEMORY, "read of %llu bytes",
                                 (unsigned long long)len);
    }
    kvr_status_t s = uring_io(ring, &x, err);
    free(x.done);
    return s;
}
#endif

/* Plain I/O a piece at a time: the checksum's helpers hash the leading
 * pieces of a read while the rest is read (up to the end of the file once
 * need bytes came); written pieces start their writeback. */
static kvr_status_t plain_pieces(int fd, io_dir_t dir, uint8_t *buf,
                                 uint64_t len, uint64_t need, uint64_t off,
                                 kvr__sum_t *sum, kvr_error_t *err)
{
    for (uint64_t at = 0; at < len; at += PIECE) {
        uint64_t n = len - at > PIECE ? PIECE : len - at;
        uint64_t must = need - at < n ? need - at : n;
        kvr_status_t s = dir == IO_WRITE
                             ? plain_io(fd, dir, buf + at, n, off + at, err)
                             : read_need(fd, buf + at, n, must, off + at, err);
        if (s != KVR_OK)
            return s;
        if (dir == IO_WRITE)
            kick_writeback(fd, off + at, n);
        else if (sum != NULL)
            kvr__sum_ready(sum, at + n);
        if (must < n)
            break; /* the end of the file */
    }
    return KVR_OK;
}

/* A payload transfer of len bytes (a read: of which need must come, the
 * rest may lie past the end of the file); sum (may be NULL) is the
 * checksum of its bytes, fed and helped along as the transfer goes.
 * Writes, and O_DIRECT reads, go through io_uring where it is allowed;
 * buffered reads are sequential preads, which the kernel's readahead
 * serves faster than parallel io_uring reads of a cold file (measured:
 * docs/store.md). */
static kvr_status_t do_io(kvr_store_t *st, int fd, io_dir_t dir, void *buf,
                          uint64_t len, uint64_t need, uint64_t off,
                          bool direct, kvr__sum_t *sum, kvr_error_t *err)
{
#ifdef KVR_HAVE_URING
    if (st->ring != NULL && (dir == IO_WRITE || direct) && len >= PIECE)
        return uring_xfer(st->ring, fd, dir, buf, len, need, off, sum,
                          !st->apart, err);
#else
    (void)st;
    (void)direct;
#endif
    return plain_pieces(fd, dir, buf, len, need, off, sum, err);
}

kvr_status_t kvr__disk_xfer(kvr_store_t *st, int fd, bool write, void *buf,
                            uint64_t len, uint64_t off, kvr_error_t *err)
{
    return do_io(st, fd, write ? IO_WRITE : IO_READ, buf, len, len, off, true,
                 NULL, err);
}

const char *kvr__disk_backend(const kvr_store_t *st)
{
    if (st->ring != NULL)
        return st->direct ? "io_uring+O_DIRECT" : "io_uring";
    return st->direct ? "pread/pwrite+O_DIRECT" : "pread/pwrite";
}

kvr_status_t kvr__disk_open(kvr_store_t *st, kvr_error_t *err)
{
    if (mkdir(st->dir, 0755) != 0 && errno != EEXIST)
        return kvr_error_set(err, KVR_ERR_IO, "store directory %s: %s", st->dir,
                             strerror(errno));
    st->dir_fd = open(st->dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (st->dir_fd < 0)
        return kvr_error_set(err, KVR_ERR_IO, "store directory %s: %s", st->dir,
                             strerror(errno));
    st->ring = kvr__disk_ring_new();
    st->sum_kind = st->opts.fast_checksum ? KVR__SUM_POLY1305
                                          : KVR__SUM_DEFAULT;
    st->direct = true; /* until the filesystem refuses it */
    return KVR_OK;
}

void *kvr__disk_ring_new(void)
{
#ifdef KVR_HAVE_URING
    struct io_uring *ring = calloc(1, sizeof *ring);
    if (ring != NULL && io_uring_queue_init(2 * DEPTH, ring, 0) == 0)
        return ring;
    free(ring); /* not allowed here (seccomp, old kernel): plain I/O */
#endif
    return NULL;
}

void kvr__disk_ring_free(void *ring)
{
#ifdef KVR_HAVE_URING
    if (ring != NULL)
        io_uring_queue_exit(ring);
#endif
    free(ring);
}

void kvr__disk_plain(kvr_store_t *st)
{
    kvr__store_ahead_drop(st);
    kvr__disk_ring_free(st->ring);
    st->ring = NULL;
    for (unsigned i = 0; i < KVR__READERS; i++) {
        kvr__disk_ring_free(st->ahead_ring[i]);
        st->ahead_ring[i] = NULL;
    }
    for (unsigned i = 0; i < KVR__BEHIND; i++) {
        kvr__disk_ring_free(st->behind_ring[i]);
        st->behind_ring[i] = NULL;
    }
}

void kvr__disk_close(kvr_store_t *st)
{
    kvr__disk_plain(st);
    if (st->dir_fd >= 0)
        close(st->dir_fd);
    st->dir_fd = -1;
}

/* The payload's last partial block (n < KVR__ALIGN bytes after an
 * O_DIRECT body; none after a plain one) and the checksum, from tmp (TAIL
 * bytes, aligned): O_DIRECT writes whole blocks, so the file is cut back to
 * its size after. */
static kvr_status_t write_tail(int fd, uint8_t *tmp, const uint8_t *rest,
                               uint64_t n, const uint8_t *sum, uint64_t off,
                               bool direct, kvr_error_t *err)
{
    uint64_t total = n + KVR_STORE_SUM_BYTES;
    uint64_t out = direct ? round_up(total) : total;
    memcpy(tmp, rest, n);
    memcpy(tmp + n, sum, KVR_STORE_SUM_BYTES);
    memset(tmp + total, 0, out - total);
    kvr_status_t s = plain_io(fd, IO_WRITE, tmp, out, off, err);
    if (s == KVR_OK && out != total && ftruncate(fd, (off_t)(off + total)))
        s = kvr_error_set(err, KVR_ERR_IO, "truncate: %s", strerror(errno));
    return s;
}

/* Header block, payload (hashed while it is written: the checksum's
 * helpers start at once, this thread hashes while requests are in flight),
 * then the tail and the checksum, then fsync. frame: KVR__ALIGN + TAIL
 * bytes, aligned. */
static kvr_status_t write_file(kvr_store_t *st, int fd, const uint8_t *header,
                               const uint8_t *data, uint64_t len, uint8_t *sum,
                               const char *name, uint8_t *frame,
                               kvr_error_t *err)
{
    if (kvr__failpoint(KVR__FP_STORE_ENOSPC, name, strlen(name)))
        return kvr_error_set(err, KVR_ERR_IO, "write of chunk %s: %s", name,
                             strerror(ENOSPC));
    bool direct = go_direct(st, fd, data, len, name);
    uint64_t body = direct ? len / KVR__ALIGN * KVR__ALIGN : len;
    memset(frame, 0, KVR__ALIGN);
    memcpy(frame, header, KVR__CHUNK_HEADER);
    kvr__sum_t *job = kvr__sum_start(header, data, len, true);
    kvr_status_t s = plain_io(fd, IO_WRITE, frame, KVR__ALIGN, 0, err);
    if (s == KVR_OK)
        s = do_io(st, fd, IO_WRITE, (void *)data, body, body, KVR__CHUNK_DATA,
                  direct, job, err);
    if (s != KVR_OK) {
        kvr__sum_abort(job);
        return s;
    }
    if (!direct)
        sync_file_range(fd, 0, 0, SYNC_FILE_RANGE_WRITE); /* a hint only */
    if (job != NULL)
        kvr__sum_finish(job, sum);
    else
        kvr__chunk_sum(header, data, len, sum);
    s = write_tail(fd, frame + KVR__ALIGN, data + body, len - body, sum,
                   KVR__CHUNK_DATA + body, direct, err);
    if (s == KVR_OK && fsync(fd) != 0)
        s = kvr_error_set(err, KVR_ERR_IO, "fsync of chunk %s: %s", name,
                          strerror(errno));
    return s;
}

static uint8_t *frame_alloc(void)
{
    void *b = NULL;
    return posix_memalign(&b, KVR__ALIGN, KVR__ALIGN + TAIL) == 0 ? b : NULL;
}

kvr_status_t kvr__disk_write_tmp(kvr_store_t *st, const kvr_chunk_key_t *key,
                                 const void *data, uint64_t len,
                                 uint8_t sum[KVR_STORE_SUM_BYTES],
                                 char tmp[KVR__TMP_NAME_MAX], kvr_error_t *err)
{
    char name[KVR_STORE_NAME_MAX];
    uint8_t header[KVR__CHUNK_HEADER];
    kvr__chunk_name(key, name);
    kvr__chunk_header(key, len, header);
    kvr__chunk_set_kind(header, st->sum_kind);
    snprintf(tmp, KVR__TMP_NAME_MAX, ".tmp-%ld-%llu-%s", (long)getpid(),
             (unsigned long long)st->tmp_seq++, name);
    uint8_t *frame = frame_alloc();
    if (frame == NULL)
        return kvr_error_set(err, KVR_ERR_NO_MEMORY, "chunk %s", name);
    int fd = openat(st->dir_fd, tmp, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC,
                    0644);
    if (fd < 0) {
        free(frame);
        return kvr_error_set(err, KVR_ERR_IO, "create %s/%s: %s", st->dir, tmp,
                             strerror(errno));
    }
    kvr_status_t s = write_file(st, fd, header, data, len, sum, name, frame,
                                err);
    free(frame);
    close(fd);
    if (s != KVR_OK)
        unlinkat(st->dir_fd, tmp, 0);
    return s;
}

kvr_status_t kvr__disk_commit(kvr_store_t *st, const kvr_chunk_key_t *key,
                              const char *tmp, kvr_error_t *err)
{
    char name[KVR_STORE_NAME_MAX];
    kvr__chunk_name(key, name);
    if (renameat(st->dir_fd, tmp, st->dir_fd, name) != 0) {
        kvr_status_t s = kvr_error_set(err, KVR_ERR_IO, "rename to %s/%s: %s",
                                       st->dir, name, strerror(errno));
        unlinkat(st->dir_fd, tmp, 0);
        return s;
    }
    if (fsync(st->dir_fd) != 0)
        return kvr_error_set(err, KVR_ERR_IO, "fsync of %s: %s", st->dir,
                             strerror(errno));
    return KVR_OK;
}

kvr_status_t kvr__disk_write(kvr_store_t *st, const kvr_chunk_key_t *key,
                             const void *data, uint64_t len,
                             uint8_t sum[KVR_STORE_SUM_BYTES], kvr_error_t *err)
{
    char tmp[KVR__TMP_NAME_MAX];
    kvr_status_t s = kvr__disk_write_tmp(st, key, data, len, sum, tmp, err);
    return s == KVR_OK ? kvr__disk_commit(st, key, tmp, err) : s;
}

bool kvr__disk_has(kvr_store_t *st, const kvr_chunk_key_t *key)
{
    char name[KVR_STORE_NAME_MAX];
    kvr__chunk_name(key, name);
    return st->dir_fd >= 0 && faccessat(st->dir_fd, name, F_OK, 0) == 0;
}

/* The header block of a file of size bytes: the header names want (NULL:
 * any), its size matches, and in version 2 its padding is zero (a flipped
 * byte there is corruption too). */
static kvr_status_t read_header(int fd, const char *name, uint64_t size,
                                const kvr_chunk_key_t *want, uint8_t *header,
                                kvr_chunk_key_t *key, uint64_t *len,
                                kvr_error_t *err)
{
    uint8_t block[KVR__ALIGN];
    if (size < KVR__CHUNK_HEADER + KVR_STORE_SUM_BYTES)
        return kvr_error_set(err, KVR_ERR_VERIFY,
                             "chunk %s: truncated "
                             "(%llu bytes)",
                             name, (unsigned long long)size);
    /* the header block in one read (a version 1 file's payload follows its
     * header: those bytes are read and ignored) */
    uint64_t n = size < KVR__ALIGN ? size : KVR__ALIGN;
    kvr_status_t s = plain_io(fd, IO_READ, block, n, 0, err);
    if (s == KVR_OK)
        s = kvr__chunk_parse(block, key, len, err);
    if (s != KVR_OK)
        return kvr_error_set(err, KVR_ERR_VERIFY, "chunk %s: bad header", name);
    uint64_t at = kvr__chunk_data_at(block);
    if (size < at + KVR_STORE_SUM_BYTES ||
        *len != size - at - KVR_STORE_SUM_BYTES ||
        (want != NULL && memcmp(key, want, sizeof *key) != 0))
        return kvr_error_set(err, KVR_ERR_VERIFY,
                             "chunk %s: header does not "
                             "match its name or size",
                             name);
    uint64_t pad = at - KVR__CHUNK_HEADER;
    for (uint64_t i = 0; s == KVR_OK && i < pad; i++)
        if (block[KVR__CHUNK_HEADER + i] != 0)
            s = kvr_error_set(err, KVR_ERR_VERIFY,
                              "chunk %s: header padding "
                              "not zero at byte %llu",
                              name,
                              (unsigned long long)(KVR__CHUNK_HEADER + i));
    memcpy(header, block, KVR__CHUNK_HEADER);
    return s;
}

/* Starts reading a whole chunk file: header checked against want (NULL:
 * any), then the payload and the stored checksum in one transfer into a
 * new buffer (its slack holds the checksum and, with O_DIRECT, the rest of
 * the last block), its leaves hashed as they land; the rest of the hash is
 * left to kvr__disk_read_check. */
static kvr_status_t read_start(kvr_store_t *st, int fd, const char *name,
                               const kvr_chunk_key_t *want, kvr__read_t *r,
                               kvr_error_t *err)
{
    struct stat sb;
    kvr_chunk_key_t key;
    memset(r, 0, sizeof *r);
    snprintf(r->name, sizeof r->name, "%s", name);
    if (fstat(fd, &sb) != 0)
        return kvr_error_set(err, KVR_ERR_IO, "chunk %s: %s", name,
                             strerror(errno));
    kvr_status_t s = read_header(fd, name, (uint64_t)sb.st_size, want,
                                 r->header, &key, &r->len, err);
    if (s != KVR_OK)
        return s;
    uint64_t at = kvr__chunk_data_at(r->header);
    r->data = kvr__store_alloc(st, r->len);
    if (r->data == NULL)
        return kvr_error_set(err, KVR_ERR_NO_MEMORY, "chunk %s: %llu bytes",
                             name, (unsigned long long)r->len);
    bool direct = at == KVR__CHUNK_DATA &&
                  go_direct(st, fd, r->data, r->len, name);
    uint64_t need = r->len + KVR_STORE_SUM_BYTES;
    r->job = st->apart ? kvr__sum_start_apart(r->header, r->data, r->len)
                       : kvr__sum_start(r->header, r->data, r->len, false);
    s = do_io(st, fd, IO_READ, r->data, direct ? round_up(need) : need, need,
              at, direct, r->job, err);
    if (s != KVR_OK) {
        kvr__disk_read_abort(r);
        return s;
    }
    memcpy(r->stored, r->data + r->len, KVR_STORE_SUM_BYTES);
    return KVR_OK;
}

kvr_status_t kvr__disk_read_check(kvr__read_t *r,
                                  uint8_t sum[KVR_STORE_SUM_BYTES],
                                  kvr_error_t *err)
{
    if (r->job != NULL)
        kvr__sum_finish(r->job, sum);
    else
        kvr__chunk_sum(r->header, r->data, r->len, sum);
    r->job = NULL;
    if (memcmp(sum, r->stored, KVR_STORE_SUM_BYTES) == 0)
        return KVR_OK;
    free(r->data);
    r->data = NULL;
    return kvr_error_set(err, KVR_ERR_VERIFY, "chunk %s: checksum mismatch",
                         r->name);
}

void kvr__disk_read_abort(kvr__read_t *r)
{
    kvr__sum_abort(r->job);
    r->job = NULL;
    free(r->data);
    r->data = NULL;
}

kvr_status_t kvr__disk_read_start(kvr_store_t *st, const kvr_chunk_key_t *key,
                                  kvr__read_t *r, kvr_error_t *err)
{
    char name[KVR_STORE_NAME_MAX];
    kvr__chunk_name(key, name);
    int fd = openat(st->dir_fd, name, O_RDONLY | O_CLOEXEC);
    if (fd < 0) {
        memset(r, 0, sizeof *r);
        return kvr_error_set(err, KVR_ERR_NOT_FOUND, "chunk %s: %s", name,
                             strerror(errno));
    }
    kvr_status_t s = read_start(st, fd, name, key, r, err);
    close(fd);
    return s;
}

kvr_status_t kvr__disk_read(kvr_store_t *st, const kvr_chunk_key_t *key,
                            uint8_t **data, uint64_t *len,
                            uint8_t sum[KVR_STORE_SUM_BYTES], kvr_error_t *err)
{
    kvr__read_t r;
    kvr_status_t s = kvr__disk_read_start(st, key, &r, err);
    if (s == KVR_OK)
        s = kvr__disk_read_check(&r, sum, err);
    *data = r.data;
    *len = r.len;
    return s;
}

kvr_status_t kvr__disk_check(int dirfd, const char *name, bool full,
                             kvr_error_t *err)
{
    kvr_store_t tmp = {.dir_fd = dirfd, .ring = NULL, .direct = true};
    uint8_t sum[KVR_STORE_SUM_BYTES], header[KVR__CHUNK_HEADER];
    uint64_t len;
    int fd = openat(dirfd, name, O_RDONLY | O_CLOEXEC);
    if (fd < 0)
        return kvr_error_set(err, KVR_ERR_IO, "chunk %s: %s", name,
                             strerror(errno));
    kvr_chunk_key_t named;
    char expect[KVR_STORE_NAME_MAX];
    struct stat sb;
    kvr_status_t s = fstat(fd, &sb) == 0
                         ? read_header(fd, name, (uint64_t)sb.st_size, NULL,
                                       header, &named, &len, err)
                         : kvr_error_set(err, KVR_ERR_IO, "chunk %s: %s", name,
                                         strerror(errno));
    if (s == KVR_OK) {
        kvr__chunk_name(&named, expect);
        if (strcmp(expect, name) != 0)
            s = kvr_error_set(err, KVR_ERR_VERIFY, "chunk %s: header names %s",
                              name, expect);
    }
    kvr__read_t r = {0};
    if (s == KVR_OK && full)
        s = read_start(&tmp, fd, name, &named, &r, err);
    if (s == KVR_OK && full)
        s = kvr__disk_read_check(&r, sum, err);
    close(fd);
    free(r.data);
    return s;
}
