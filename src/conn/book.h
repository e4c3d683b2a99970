/* Internals of the conn layer's bookkeeping: validated id views, owned keys,
 * a bounded open-addressing table and a FIFO tombstone set. */
#ifndef KVRELAY_CONN_BOOK_H
#define KVRELAY_CONN_BOOK_H

#include <sodium.h>

#include "kvrelay/completion.h"

#include "base_internal.h"

#define KVR__HKEY_BYTES crypto_shorthash_KEYBYTES

/* A validated completion id plus its keyed hash; borrows the bytes. */
typedef struct kvr__view {
    const uint8_t *bytes;
    size_t len;
    bool is_op;
    uint64_t gen;
    uint64_t hash;
} kvr__view_t;

/* An owned copy of a view (one allocation). */
typedef struct kvr__key {
    uint64_t hash;
    uint64_t gen;
    uint16_t len;
    bool is_op;
    uint8_t bytes[];
} kvr__key_t;

/* Random SipHash key: request ids come from peers, so bucket hashing is
 * keyed per object to keep collisions out of their control. */
kvr_status_t kvr__hkey_init(uint8_t hkey[KVR__HKEY_BYTES], kvr_error_t *err);

/* Checks id (kvr_completion_id_check) and hashes it with hkey. */
kvr_status_t kvr__view_of(const kvr_completion_id_t *id,
                          const uint8_t hkey[KVR__HKEY_BYTES], kvr__view_t *out,
                          kvr_error_t *err);
/* The bare request id view of v (completion_req_key). */
kvr__view_t kvr__view_req(const kvr__view_t *v,
                          const uint8_t hkey[KVR__HKEY_BYTES]);
kvr__view_t kvr__view_of_key(const kvr__key_t *k);
kvr__key_t *kvr__key_new(const kvr__view_t *v);
bool kvr__key_eq(const kvr__key_t *k, const kvr__view_t *v);

/* Printable, escaped, truncated form of an id for error messages:
 * "abc" for a request id, ("abc", 3) for an operation id. */
#define KVR__REPR_MAX 96
void kvr__view_repr(const kvr__view_t *v, char buf[KVR__REPR_MAX]);
/* KVR_ERR_TABLE_FULL / KVR_ERR_NO_MEMORY with "<what> <id>: ..." */
kvr_status_t kvr__fail_full(kvr_error_t *err, const char *what,
                            const kvr__view_t *v, const char *limit,
                            size_t value);
kvr_status_t kvr__fail_nomem(kvr_error_t *err, const char *what,
                             const kvr__view_t *v);

/* Checks a configured table size (1..KVR_BOOK_MAX_ENTRIES). */
kvr_status_t kvr__check_size(const char *what, size_t n, kvr_error_t *err);

/* Open addressing, linear probing, backward-shift deletion. Grows by
 * doubling up to 2 * max_count slots (next power of two); never more. The
 * table borrows keys and values; their owner frees them. */
typedef struct kvr__slot {
    kvr__key_t *key; /* NULL: empty */
    void *val;
} kvr__slot_t;

typedef struct kvr__table {
    kvr__slot_t *slots;
    size_t nslots; /* 0 or a power of two */
    size_t count;
    size_t max_count;
} kvr__table_t;

void kvr__table_init(kvr__table_t *t, size_t max_count);
void kvr__table_fini(kvr__table_t *t);
/* Makes the next insert infallible: KVR_ERR_TABLE_FULL at max_count,
 * KVR_ERR_NO_MEMORY when growing fails (table unchanged either way). */
kvr_status_t kvr__table_reserve(kvr__table_t *t);
void kvr__table_insert(kvr__table_t *t, kvr__key_t *key, void *val);
kvr__slot_t *kvr__table_find(const kvr__table_t *t, const kvr__view_t *v);
void kvr__table_remove(kvr__table_t *t, kvr__slot_t *slot);

/* Finished ids, oldest evicted first once cap are held. Owns its keys. A
 * forgotten id leaves a hole in the ring that is reclaimed when evicted. */
typedef struct kvr__tombs {
    kvr__table_t set; /* key -> ring position */
    kvr__key_t **ring;
    size_t ring_alloc;
    size_t cap;
    size_t head;
    size_t used; /* ring positions in use from head, holes included */
} kvr__tombs_t;

void kvr__tombs_init(kvr__tombs_t *t, size_t cap);
void kvr__tombs_fini(kvr__tombs_t *t);
bool kvr__tombs_has(const kvr__tombs_t *t, const kvr__view_t *v);
/* Makes the next kvr__tombs_add infallible. */
kvr_status_t kvr__tombs_reserve(kvr__tombs_t *t);
/* Takes ownership of key, which must not be present. */
void kvr__tombs_add(kvr__tombs_t *t, kvr__key_t *key);
/* Returns whether v was present. */
bool kvr__tombs_remove(kvr__tombs_t *t, const kvr__view_t *v);

#endif
