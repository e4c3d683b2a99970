/* The disk tier (docs/store.md): one directory of chunk files. A chunk is
 * written to a temp name, fsynced, renamed and the directory fsynced, so a
 * crash leaves either the whole chunk or a temp file the next open removes.
 * Large writes go through io_uring when liburing is present and the kernel
 * allows it, else through pwrite; reads are sequential preads. The
 * checksum is computed while the payload is written or read. */
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

#define PIECE (4u << 20) /* bytes per I/O request */
#define DEPTH 4u         /* requests in flight */

typedef enum { IO_READ, IO_WRITE } io_dir_t;

static kvr_status_t plain_io(int fd, io_dir_t dir, uint8_t *buf, uint64_t len,
                             uint64_t off, kvr_error_t *err)
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
        if (r == 0)
            return kvr_error_set(err, KVR_ERR_IO, "short read at %llu",
                                 (unsigned long long)(off + done));
        done += (uint64_t)r;
    }
    return KVR_OK;
}

/* A written piece starts its writeback now (a hint), so the device works
 * while later pieces are copied and hashed and the final fsync finds
 * little left to write. */
static void kick_writeback(int fd, uint64_t off, uint64_t n)
{
    sync_file_range(fd, (off_t)off, (off_t)n, SYNC_FILE_RANGE_WRITE);
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

static void queue_write(struct io_uring_sqe *sqe, int fd, const uint8_t *buf,
                        unsigned n, uint64_t off, uint64_t at)
{
    io_uring_prep_write(sqe, fd, buf + at, n, off + at);
    sqe->user_data = at;
}

/* Writes through io_uring, DEPTH pieces in flight; a short write finishes
 * with plain I/O. */
static kvr_status_t uring_write(struct io_uring *ring, int fd, uint8_t *buf,
                                uint64_t len, uint64_t off, kvr__sum_t *sum,
                                kvr_error_t *err)
{
    uint64_t next = 0;
    unsigned inflight = 0;
    kvr_status_t s = KVR_OK;
    while (next < len || inflight > 0) {
        struct io_uring_sqe *sqe;
        while (next < len && inflight < DEPTH &&
               (sqe = io_uring_get_sqe(ring)) != NULL) {
            unsigned n = len - next > PIECE ? PIECE : (unsigned)(len - next);
            queue_write(sqe, fd, buf, n, off, next);
            next += n;
            inflight++;
        }
        if (inflight == 0)
            break;
        int r = submit_or_hash(ring, sum);
        if (r < 0 && r != -EINTR)
            return kvr_error_set(err, KVR_ERR_IO, "io_uring submit: %s",
                                 strerror(-r));
        struct io_uring_cqe *cqe;
        while (io_uring_peek_cqe(ring, &cqe) == 0) {
            uint64_t at = cqe->user_data;
            int res = cqe->res;
            io_uring_cqe_seen(ring, cqe);
            inflight--;
            uint64_t want = len - at > PIECE ? PIECE : len - at;
            if (res < 0 && s == KVR_OK)
                s = kvr_error_set(err, KVR_ERR_IO, "write at %llu: %s",
                                  (unsigned long long)(off + at),
                                  strerror(-res));
            else if (res >= 0 && (uint64_t)res < want && s == KVR_OK)
                s = plain_io(fd, IO_WRITE, buf + at + res, want - res,
                             off + at + res, err);
            if (s == KVR_OK)
                kick_writeback(fd, off + at, want);
        }
        if (s != KVR_OK)
            next = len; /* drain what is in flight, submit nothing new */
    }
    return s;
}
#endif

/* Plain I/O a piece at a time: the checksum's helpers hash the leading
 * pieces of a read while the kernel reads ahead the rest; written pieces
 * start their writeback. */
static kvr_status_t plain_pieces(int fd, io_dir_t dir, uint8_t *buf,
                                 uint64_t len, uint64_t off, kvr__sum_t *sum,
                                 kvr_error_t *err)
{
    for (uint64_t at = 0; at < len; at += PIECE) {
        uint64_t n = len - at > PIECE ? PIECE : len - at;
        kvr_status_t s = plain_io(fd, dir, buf + at, n, off + at, err);
        if (s != KVR_OK)
            return s;
        if (dir == IO_WRITE)
            kick_writeback(fd, off + at, n);
        else if (sum != NULL)
            kvr__sum_ready(sum, at + n);
    }
    return KVR_OK;
}

/* A payload transfer; sum (may be NULL) is the checksum of its bytes, fed
 * and helped along as the transfer goes. Writes go through io_uring where
 * it is allowed; reads are sequential preads, which the kernel's
 * readahead serves faster than parallel io_uring reads of a cold file
 * (measured: docs/store.md). */
static kvr_status_t do_io(kvr_store_t *st, int fd, io_dir_t dir, void *buf,
                          uint64_t len, uint64_t off, kvr__sum_t *sum,
                          kvr_error_t *err)
{
#ifdef KVR_HAVE_URING
    if (st->ring != NULL && dir == IO_WRITE && len >= PIECE)
        return uring_write(st->ring, fd, buf, len, off, sum, err);
#else
    (void)st;
#endif
    return plain_pieces(fd, dir, buf, len, off, sum, err);
}

const char *kvr__disk_backend(const kvr_store_t *st)
{
    return st->ring != NULL ? "io_uring" : "pread/pwrite";
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
#ifdef KVR_HAVE_URING
    struct io_uring *ring = calloc(1, sizeof *ring);
    if (ring != NULL && io_uring_queue_init(2 * DEPTH, ring, 0) == 0)
        st->ring = ring;
    else
        free(ring); /* not allowed here (seccomp, old kernel): plain I/O */
#endif
    st->sum_kind = st->opts.fast_checksum ? KVR__SUM_POLY1305
                                          : KVR__SUM_DEFAULT;
    return KVR_OK;
}

void kvr__disk_plain(kvr_store_t *st)
{
#ifdef KVR_HAVE_URING
    if (st->ring != NULL) {
        io_uring_queue_exit(st->ring);
        free(st->ring);
    }
#endif
    st->ring = NULL;
}

void kvr__disk_close(kvr_store_t *st)
{
    kvr__disk_plain(st);
    if (st->dir_fd >= 0)
        close(st->dir_fd);
    st->dir_fd = -1;
}

/* Header and payload, hashed while they are written (the checksum's
 * helpers start at once, this thread hashes while requests are in flight);
 * writeback starts before the last leaves are hashed; then the checksum,
 * then fsync. */
static kvr_status_t write_file(kvr_store_t *st, int fd, const uint8_t *header,
                               const void *data, uint64_t len, uint8_t *sum,
                               const char *name, kvr_error_t *err)
{
    if (kvr__failpoint(KVR__FP_STORE_ENOSPC, name, strlen(name)))
        return kvr_error_set(err, KVR_ERR_IO, "write of chunk %s: %s", name,
                             strerror(ENOSPC));
    kvr__sum_t *job = kvr__sum_start(header, data, len, true);
    kvr_status_t s = plain_io(fd, IO_WRITE, (uint8_t *)header,
                              KVR__CHUNK_HEADER, 0, err);
    if (s == KVR_OK)
        s = do_io(st, fd, IO_WRITE, (void *)data, len, KVR__CHUNK_HEADER, job,
                  err);
    if (s != KVR_OK) {
        kvr__sum_abort(job);
        return s;
    }
    sync_file_range(fd, 0, 0, SYNC_FILE_RANGE_WRITE); /* a hint only */
    if (job != NULL)
        kvr__sum_finish(job, sum);
    else
        kvr__chunk_sum(header, data, len, sum);
    s = plain_io(fd, IO_WRITE, sum, KVR_STORE_SUM_BYTES,
                 KVR__CHUNK_HEADER + len, err);
    if (s == KVR_OK && fsync(fd) != 0)
        s = kvr_error_set(err, KVR_ERR_IO, "fsync of chunk %s: %s", name,
                          strerror(errno));
    return s;
}

kvr_status_t kvr__disk_write(kvr_store_t *st, const kvr_chunk_key_t *key,
                             const void *data, uint64_t len,
                             uint8_t sum[KVR_STORE_SUM_BYTES], kvr_error_t *err)
{
    char name[KVR_STORE_NAME_MAX], tmp[KVR_STORE_NAME_MAX + 48];
    uint8_t header[KVR__CHUNK_HEADER];
    kvr__chunk_name(key, name);
    kvr__chunk_header(key, len, header);
    kvr__chunk_set_kind(header, st->sum_kind);
    snprintf(tmp, sizeof tmp, ".tmp-%ld-%llu-%s", (long)getpid(),
             (unsigned long long)st->tmp_seq++, name);
    int fd = openat(st->dir_fd, tmp, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC,
                    0644);
    if (fd < 0)
        return kvr_error_set(err, KVR_ERR_IO, "create %s/%s: %s", st->dir, tmp,
                             strerror(errno));
    kvr_status_t s = write_file(st, fd, header, data, len, sum, name, err);
    close(fd);
    if (s == KVR_OK && renameat(st->dir_fd, tmp, st->dir_fd, name) != 0)
        s = kvr_error_set(err, KVR_ERR_IO, "rename to %s/%s: %s", st->dir, name,
                          strerror(errno));
    if (s != KVR_OK) {
        unlinkat(st->dir_fd, tmp, 0);
        return s;
    }
    if (fsync(st->dir_fd) != 0)
        return kvr_error_set(err, KVR_ERR_IO, "fsync of %s: %s", st->dir,
                             strerror(errno));
    return KVR_OK;
}

bool kvr__disk_has(kvr_store_t *st, const kvr_chunk_key_t *key)
{
    char name[KVR_STORE_NAME_MAX];
    kvr__chunk_name(key, name);
    return st->dir_fd >= 0 && faccessat(st->dir_fd, name, F_OK, 0) == 0;
}

void kvr__disk_prefetch(kvr_store_t *st, const kvr_chunk_key_t *key)
{
    char name[KVR_STORE_NAME_MAX];
    kvr__chunk_name(key, name);
    int fd = st->dir_fd >= 0 ? openat(st->dir_fd, name, O_RDONLY | O_CLOEXEC)
                             : -1;
    if (fd >= 0) {
        posix_fadvise(fd, 0, 0, POSIX_FADV_WILLNEED);
        close(fd);
    }
}

/* Reads a whole chunk file: header checked against want (NULL: any),
 * payload into a new buffer, checksum compared. */
static kvr_status_t read_chunk(kvr_store_t *st, int fd, const char *name,
                               const kvr_chunk_key_t *want, uint8_t **data,
                               uint64_t *len, uint8_t *sum, kvr_error_t *err)
{
    struct stat sb;
    uint8_t header[KVR__CHUNK_HEADER], stored[KVR_STORE_SUM_BYTES];
    kvr_chunk_key_t key;
    if (fstat(fd, &sb) != 0 || (uint64_t)sb.st_size < KVR__CHUNK_FRAME)
        return kvr_error_set(err, KVR_ERR_VERIFY,
                             "chunk %s: truncated "
                             "(%lld bytes)",
                             name, (long long)sb.st_size);
    kvr_status_t s = plain_io(fd, IO_READ, header, sizeof header, 0, err);
    if (s == KVR_OK)
        s = kvr__chunk_parse(header, &key, len, err);
    if (s != KVR_OK)
        return kvr_error_set(err, KVR_ERR_VERIFY, "chunk %s: bad header", name);
    if (*len != (uint64_t)sb.st_size - KVR__CHUNK_FRAME ||
        (want != NULL && memcmp(&key, want, sizeof key) != 0))
        return kvr_error_set(err, KVR_ERR_VERIFY,
                             "chunk %s: header does not "
                             "match its name or size",
                             name);
    *data = kvr__store_alloc(st, *len);
    if (*data == NULL)
        return kvr_error_set(err, KVR_ERR_NO_MEMORY, "chunk %s: %llu bytes",
                             name, (unsigned long long)*len);
    kvr__sum_t *job = kvr__sum_start(header, *data, *len, false);
    s = do_io(st, fd, IO_READ, *data, *len, KVR__CHUNK_HEADER, job, err);
    if (s == KVR_OK)
        s = plain_io(fd, IO_READ, stored, sizeof stored,
                     KVR__CHUNK_HEADER + *len, err);
    if (s != KVR_OK)
        kvr__sum_abort(job);
    else if (job != NULL)
        kvr__sum_finish(job, sum);
    else
        kvr__chunk_sum(header, *data, *len, sum);
    if (s == KVR_OK) {
        if (memcmp(sum, stored, sizeof stored) != 0)
            s = kvr_error_set(err, KVR_ERR_VERIFY,
                              "chunk %s: checksum "
                              "mismatch",
                              name);
    }
    if (s != KVR_OK) {
        free(*data);
        *data = NULL;
    }
    return s;
}

kvr_status_t kvr__disk_read(kvr_store_t *st, const kvr_chunk_key_t *key,
                            uint8_t **data, uint64_t *len,
                            uint8_t sum[KVR_STORE_SUM_BYTES], kvr_error_t *err)
{
    char name[KVR_STORE_NAME_MAX];
    kvr__chunk_name(key, name);
    int fd = openat(st->dir_fd, name, O_RDONLY | O_CLOEXEC);
    if (fd < 0)
        return kvr_error_set(err, KVR_ERR_NOT_FOUND, "chunk %s: %s", name,
                             strerror(errno));
    kvr_status_t s = read_chunk(st, fd, name, key, data, len, sum, err);
    close(fd);
    return s;
}

kvr_status_t kvr__disk_check(int dirfd, const char *name, bool full,
                             kvr_error_t *err)
{
    kvr_store_t tmp = {.dir_fd = dirfd, .ring = NULL};
    uint8_t *data = NULL, sum[KVR_STORE_SUM_BYTES];
    uint64_t len;
    int fd = openat(dirfd, name, O_RDONLY | O_CLOEXEC);
    if (fd < 0)
        return kvr_error_set(err, KVR_ERR_IO, "chunk %s: %s", name,
                             strerror(errno));
    kvr_chunk_key_t named;
    char expect[KVR_STORE_NAME_MAX];
    uint8_t header[KVR__CHUNK_HEADER];
    uint64_t hlen;
    kvr_status_t s = plain_io(fd, IO_READ, header, sizeof header, 0, err);
    if (s == KVR_OK && kvr__chunk_parse(header, &named, &hlen, err) == KVR_OK) {
        kvr__chunk_name(&named, expect);
        struct stat sb;
        if (strcmp(expect, name) != 0)
            s = kvr_error_set(err, KVR_ERR_VERIFY,
                              "chunk %s: header names "
                              "%s",
                              name, expect);
        else if (!full)
            s = fstat(fd, &sb) == 0 &&
                        (uint64_t)sb.st_size >= KVR__CHUNK_FRAME &&
                        (uint64_t)sb.st_size - KVR__CHUNK_FRAME == hlen
                    ? KVR_OK
                    : kvr_error_set(err, KVR_ERR_VERIFY,
                                    "chunk %s: size does "
                                    "not match its header",
                                    name);
        else
            s = read_chunk(&tmp, fd, name, &named, &data, &len, sum, err);
    } else if (s == KVR_OK || s == KVR_ERR_IO) {
        s = kvr_error_set(err, KVR_ERR_VERIFY, "chunk %s: bad header", name);
    }
    close(fd);
    free(data);
    return s;
}
