/* Store layer internals (docs/store.md). */
#ifndef KVR_STORE_INTERNAL_H
#define KVR_STORE_INTERNAL_H

#include <stdint.h>

#include "book.h" /* the conn layer's keyed tables */
#include "kvrelay/store.h"

#define KVR__CHUNK_MAGIC "KVRCHNK1"
/* Version 2 puts the payload at KVR__CHUNK_DATA (the header's block zero
 * padded), so large payloads move with O_DIRECT straight from and into
 * aligned buffers; version 1 files (payload right after the header) still
 * read. */
#define KVR__CHUNK_VERSION 2u
#define KVR__CHUNK_HEADER 80u
#define KVR__ALIGN 4096u /* O_DIRECT alignment: buffers, offsets, lengths */
#define KVR__CHUNK_DATA KVR__ALIGN /* payload offset (version 2) */
#define KVR__CHUNK_FRAME (KVR__CHUNK_DATA + KVR_STORE_SUM_BYTES)
#define KVR__SPARES (KVR__AHEAD + 1) /* a load queues this many */
#define KVR__LEAF (4ull << 20) /* checksum leaf */
#define KVR__HASH_THREADS 8u
/* chunks of a load read ahead of the one it waits for: KVR__AHEAD when
 * they are KVR__AHEAD_SMALL bytes or less (their hashing lags their reads
 * more), else 2 (memory) */
#define KVR__AHEAD 4u
#define KVR__AHEAD_SMALL (16ull << 20)
/* a load's reader threads: each reads one chunk at a time, so that the next
 * chunk's open, header read and submission overlap the payload of the
 * chunk before it (one reader left the disk idle between chunks) */
#define KVR__READERS 2u
#define KVR__SLACK KVR__ALIGN
#define KVR__HUGE (2u << 20) /* chunk buffers this large ask for huge pages */
#define KVR__BEHIND 2u /* chunks of a save written behind it */
#define KVR__TMP_NAME_MAX (KVR_STORE_NAME_MAX + 48)
/* checksum kinds: how the leaves are hashed (header offset 12) */
#define KVR__SUM_BLAKE2B 0u  /* BLAKE2b-256 (libsodium) */
#define KVR__SUM_POLY1305 1u /* Poly1305 under a fixed public key */
#define KVR__SUM_BLAKE2B512                                                    \
    2u /* BLAKE2b-512 (OpenSSL's when built with
                                  it, else libsodium's: the same digest) */
#define KVR__SUM_KINDS 3u
#define KVR__SUM_DEFAULT KVR__SUM_BLAKE2B512 /* fast_checksum: POLY1305 */

/* One host-tier entry, on the LRU list (head: most recent). */
typedef struct kvr__entry {
    kvr_chunk_key_t key;
    uint8_t *data;
    uint64_t len;
    uint8_t sum[KVR_STORE_SUM_BYTES];
    struct kvr__entry *prev, *next;
} kvr__entry_t;

/* Chunks read on a thread, in order, while the load scatters earlier ones
 * (store.c). */
typedef struct kvr__ahead kvr__ahead_t;
typedef struct kvr__reader kvr__reader_t;
/* A chunk written on a thread while a save gathers the next (store.c). */
typedef struct kvr__behind kvr__behind_t;
typedef struct kvr__turn kvr__turn_t;

struct kvr_store {
    kvr_store_opts_t opts;
    char *dir;
    int dir_fd;
    kvr__entry_t *head, *tail;
    kvr_store_stats_t stats;
    uint64_t tmp_seq;
    unsigned sum_kind; /* for new chunk files (KVR__SUM_*) */
    void *ring;     /* io_uring, when built with liburing */
    bool apart;     /* a load's reader: reads leave every leaf to the
                       checksum's helpers (kvr__sum_start_apart) */
    bool direct;    /* large payloads use O_DIRECT (off once the
                       filesystem refused it) */
    uint8_t *spill; /* a disk hit the host tier cannot hold */
    uint64_t spill_len;
    /* buffers of evicted chunks, reused by the next chunks of their size:
     * a full tier saves into memory already faulted in */
    uint8_t *spare[KVR__SPARES];
    uint64_t spare_len[KVR__SPARES];
    kvr__reader_t *reader; /* a load's read-ahead, or NULL */
    void *ahead_ring[KVR__READERS]; /* the readers' io_urings, kept across
                                       loads */
    uint64_t last_len;               /* the last chunk read from disk */
    /* a save's writes in flight, oldest first (store.c) */
    kvr__behind_t *behind[KVR__BEHIND];
    unsigned behinds;
    void *behind_ring[KVR__BEHIND]; /* each write-behind slot's io_uring */
    kvr__turn_t *turn;              /* the order their renames go in */
};

/* chunk.c: names, header and checksum */
void kvr__chunk_name(const kvr_chunk_key_t *key, char out[KVR_STORE_NAME_MAX]);
void kvr__chunk_header(const kvr_chunk_key_t *key, uint64_t len,
                       uint8_t out[KVR__CHUNK_HEADER]);
/* Parses a header: the key it names and its payload length. */
kvr_status_t kvr__chunk_parse(const uint8_t h[KVR__CHUNK_HEADER],
                              kvr_chunk_key_t *key, uint64_t *len,
                              kvr_error_t *err);
void kvr__chunk_set_kind(uint8_t header[KVR__CHUNK_HEADER], unsigned kind);
/* Where the payload of a parsed header's file starts (its version's). */
uint64_t kvr__chunk_data_at(const uint8_t header[KVR__CHUNK_HEADER]);
/* The checksum of a header (which names the kind) and its payload. */
void kvr__chunk_sum(const uint8_t header[KVR__CHUNK_HEADER], const void *data,
                    uint64_t len, uint8_t out[KVR_STORE_SUM_BYTES]);
/* The same checksum, computed while the payload is still being read or
 * written: start (NULL when out of memory) hashes leaves on helper threads
 * as they become present (all at once with present); ready says how many
 * leading payload bytes are present; step hashes one present leaf on the
 * calling thread (false when none is waiting); finish marks everything
 * present, helps, joins and frees; abort stops and frees. */
typedef struct kvr__sum kvr__sum_t;
kvr__sum_t *kvr__sum_start(const uint8_t header[KVR__CHUNK_HEADER],
                           const void *data, uint64_t len, bool present);
/* The same for a payload still to be read by a thread that does not hash
 * (a load's reader): helper threads hash until finish, one for a chunk of
 * KVR__AHEAD_SMALL bytes or less (several such are read ahead at once),
 * else one per CPU. */
kvr__sum_t *kvr__sum_start_apart(const uint8_t header[KVR__CHUNK_HEADER],
                                 const void *data, uint64_t len);
void kvr__sum_ready(kvr__sum_t *s, uint64_t bytes);
bool kvr__sum_step(kvr__sum_t *s);
void kvr__sum_finish(kvr__sum_t *s, uint8_t out[KVR_STORE_SUM_BYTES]);
void kvr__sum_abort(kvr__sum_t *s);

/* disk.c: the disk tier */
kvr_status_t kvr__disk_open(kvr_store_t *st, kvr_error_t *err);
void kvr__disk_close(kvr_store_t *st);
/* Writes a chunk durably and computes its checksum into sum. */
kvr_status_t kvr__disk_write(kvr_store_t *st, const kvr_chunk_key_t *key,
                             const void *data, uint64_t len,
                             uint8_t sum[KVR_STORE_SUM_BYTES],
                             kvr_error_t *err);
/* Reads and checks one chunk into a new buffer (*data, freed by the
 * caller). KVR_ERR_NOT_FOUND when absent; KVR_ERR_VERIFY when corrupt. */
kvr_status_t kvr__disk_read(kvr_store_t *st, const kvr_chunk_key_t *key,
                            uint8_t **data, uint64_t *len,
                            uint8_t sum[KVR_STORE_SUM_BYTES], kvr_error_t *err);
/* The same in two steps, so that a reader can go on to the next chunk
 * while this one's leaves are still being hashed: start reads the file
 * (header checked, payload and stored checksum in memory, the checksum's
 * threads hashing the leaves); check finishes the checksum and compares
 * it (on a mismatch KVR_ERR_VERIFY, data freed); abort drops a started
 * read. Until check succeeds the bytes are not verified. */
typedef struct kvr__read {
    uint8_t header[KVR__CHUNK_HEADER];
    uint8_t stored[KVR_STORE_SUM_BYTES];
    uint8_t *data; /* len bytes (and the buffer's slack) */
    uint64_t len;
    kvr__sum_t *job; /* NULL: hashed by check */
    char name[KVR_STORE_NAME_MAX];
} kvr__read_t;
kvr_status_t kvr__disk_read_start(kvr_store_t *st, const kvr_chunk_key_t *key,
                                  kvr__read_t *r, kvr_error_t *err);
kvr_status_t kvr__disk_read_check(kvr__read_t *r,
                                  uint8_t sum[KVR_STORE_SUM_BYTES],
                                  kvr_error_t *err);
void kvr__disk_read_abort(kvr__read_t *r);
/* The same in two steps: the file written and fsynced under a temp name
 * (tmp; removed on failure), then renamed to its own name and the
 * directory fsynced (commit: the chunk becomes visible; the temp file is
 * removed when the rename fails). */
kvr_status_t kvr__disk_write_tmp(kvr_store_t *st, const kvr_chunk_key_t *key,
                                 const void *data, uint64_t len,
                                 uint8_t sum[KVR_STORE_SUM_BYTES],
                                 char tmp[KVR__TMP_NAME_MAX], kvr_error_t *err);
kvr_status_t kvr__disk_commit(kvr_store_t *st, const kvr_chunk_key_t *key,
                              const char *tmp, kvr_error_t *err);
bool kvr__disk_has(kvr_store_t *st, const kvr_chunk_key_t *key);
/* An io_uring for a read-ahead thread (NULL without liburing or where the
 * kernel refuses it: that thread uses pread), and its release. */
void *kvr__disk_ring_new(void);
void kvr__disk_ring_free(void *ring);
/* Checks one chunk file at dirfd/name: its header names it and its size
 * matches, and with full its checksum. KVR_OK or why not in err. */
kvr_status_t kvr__disk_check(int dirfd, const char *name, bool full,
                             kvr_error_t *err);
const char *kvr__disk_backend(const kvr_store_t *st);
/* len bytes at off moved the way the store moves a payload (io_uring when
 * it has one, 4 MiB pieces, DEPTH in flight), with no checksum: the
 * benchmark's sequential-I/O ceiling (fd opened with O_DIRECT for it). */
kvr_status_t kvr__disk_xfer(kvr_store_t *st, int fd, bool write, void *buf,
                            uint64_t len, uint64_t off, kvr_error_t *err);
/* Drops io_uring: plain pread/pwrite from now on (as where the kernel
 * refuses io_uring; tests run both paths with it). */
void kvr__disk_plain(kvr_store_t *st);

/* store.c: a chunk's payload, from the host tier or the disk (promoted);
 * valid until the next store call. NOT_FOUND on a miss or corrupt chunk. */
kvr_status_t kvr__store_ref(kvr_store_t *st, const kvr_chunk_key_t *key,
                            const uint8_t **data, uint64_t *len,
                            kvr_error_t *err);
bool kvr__store_in_host(kvr_store_t *st, const kvr_chunk_key_t *key);
/* Queues a chunk for the read-ahead threads (when it is on disk only, not
 * already queued, and fewer than KVR__AHEAD + 1 are), which read queued
 * chunks in the order queued, each one at a time, so that a kvr__store_ref of
 * it finds it read and checks it; a load queues the chunk it is about to
 * take and up to KVR__AHEAD after it. drop stops the threads and frees
 * every chunk queued. */
void kvr__store_read_ahead(kvr_store_t *st, const kvr_chunk_key_t *key);
void kvr__store_ahead_drop(kvr_store_t *st);
/* A buffer of len bytes for a chunk (a spare of that size, else a new one
 * aligned to KVR__ALIGN for O_DIRECT; freed with free), with KVR__SLACK
 * bytes of room past len rounded up to KVR__ALIGN: a read lands the stored
 * checksum there (and with O_DIRECT the rest of the file's last block). */
uint8_t *kvr__store_alloc(kvr_store_t *st, uint64_t len);
/* Takes ownership of data (malloc'ed) on success and on failure. */
kvr_status_t kvr__store_put_owned(kvr_store_t *st, const kvr_chunk_key_t *key,
                                  uint8_t *data, uint64_t len,
                                  kvr_error_t *err);
/* The same, with the disk write on a thread (KVR__BEHIND at most): start
 * takes data and returns at once (*now false), or puts it now (*now true:
 * no disk tier, or KVR__BEHIND writes already in flight); join waits until
 * at most keep writes are in flight (all of them once one has failed) and
 * gives the first failure, counting the chunks written in *wrote. Chunks
 * become visible in the order started; none after a failed one does.
 * Nothing else may touch the store's disk tier until all are joined. */
kvr_status_t kvr__store_put_start(kvr_store_t *st, const kvr_chunk_key_t *key,
                                  uint8_t *data, uint64_t len, bool *now,
                                  kvr_error_t *err);
kvr_status_t kvr__store_put_join(kvr_store_t *st, unsigned keep, size_t *wrote,
                                 kvr_error_t *err);

/* gens.c: the latest generation of each request, bounded. */
typedef struct kvr__gens {
    kvr__table_t t; /* bare request id -> generation */
    uint8_t hkey[KVR__HKEY_BYTES];
} kvr__gens_t;
kvr_status_t kvr__gens_init(kvr__gens_t *g, size_t max, kvr_error_t *err);
void kvr__gens_fini(kvr__gens_t *g);
/* The request's latest generation, -1 when none is held. */
int64_t kvr__gens_latest(const kvr__gens_t *g, const void *id, size_t len);
/* Makes gen the request's latest: KVR_ERR_TABLE_FULL when a new request
 * would exceed the bound. */
kvr_status_t kvr__gens_set(kvr__gens_t *g, const void *id, size_t len,
                           int64_t gen, kvr_error_t *err);
void kvr__gens_drop(kvr__gens_t *g, const void *id, size_t len);

#endif
