/* kvrelay conn layer, bookkeeping part: completion ids, TP/PP quorum with
 * bounded tombstones, send/save pairing on the producer's PP head, prefix
 * hashes and the offload namespace key (docs/design.md §8-9). No UCX, no CUDA.
 *
 * Objects here are not thread-safe: one owner thread (or the caller's lock)
 * per object. Every fallible function returns kvr_status_t and fills err (may
 * be NULL) with a message naming the offending values; outputs are written
 * only on success, and a failed call leaves the object as it was. */
#ifndef KVRELAY_COMPLETION_H
#define KVRELAY_COMPLETION_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "kvrelay/layout.h"
#include "kvrelay/status.h"

#ifdef __cplusplus
extern "C" {
#endif
KVR_API_BEGIN

/* ---- completion ids ---------------------------------------------------- */

/* Request ids are byte strings of 1..KVR_REQ_ID_MAX bytes (the wire's limit). */
#define KVR_REQ_ID_MAX 256
/* Largest generation: 2^53 - 1, so an operation id survives a JSON or double
 * round trip (--json output, Python bindings) unchanged. */
#define KVR_GENERATION_MAX ((int64_t)9007199254740991)

/* A bare request id (is_op false, generation 0) or an operation id
 * (request id, generation) of a save or load. Borrowed bytes, not copied.
 * (R) and (R, 0) are different ids, and so are (R, 0) and (R, 1). */
typedef struct kvr_completion_id {
    const void *req_id;
    size_t req_id_len;
    bool is_op;
    int64_t generation; /* 0..KVR_GENERATION_MAX; must be 0 when !is_op */
} kvr_completion_id_t;

static inline kvr_completion_id_t kvr_completion_req(const void *req_id,
                                                     size_t len)
{
    kvr_completion_id_t id = {req_id, len, false, 0};
    return id;
}

static inline kvr_completion_id_t
kvr_completion_op(const void *req_id, size_t len, int64_t generation)
{
    kvr_completion_id_t id = {req_id, len, true, generation};
    return id;
}

/* Checks length (1..KVR_REQ_ID_MAX), pointer and generation range. */
kvr_status_t kvr_completion_id_check(const kvr_completion_id_t *id,
                                     kvr_error_t *err);

/* completion_req_key: the bare request id an id belongs to. Everything that
 * pairs completions with per-request state keys on it. */
kvr_status_t kvr_completion_req_key(const kvr_completion_id_t *id,
                                    kvr_completion_id_t *out, kvr_error_t *err);

/* ---- quorum (TP workers or PP stages) ---------------------------------- */

#define KVR_QUORUM_MAX_MEMBERS 4096u
#define KVR_BOOK_MAX_ENTRIES (1u << 22) /* cap on any table's configured size */

typedef struct kvr_quorum_params {
    uint32_t members;        /* reports a key needs: TP world size or PP size */
    size_t max_pending;      /* keys with some but not all reports */
    size_t tombstones;       /* finished keys remembered, FIFO, >= 1 */
    bool tombstone_requests; /* remember finished bare request ids too */
} kvr_quorum_params_t;

#define KVR_QUORUM_PARAMS_INIT                                                 \
    {                                                                          \
        .members = 1, .max_pending = 16384, .tombstones = 4096,                \
        .tombstone_requests = true                                             \
    }

typedef enum kvr_quorum_outcome {
    KVR_QUORUM_PENDING = 0, /* recorded; other members have not reported */
    KVR_QUORUM_DONE = 1,    /* this report completed the key */
    KVR_QUORUM_IGNORED = 2, /* late duplicate of a finished key: dropped */
} kvr_quorum_outcome_t;

typedef struct kvr_quorum_result {
    kvr_quorum_outcome_t outcome;
    /* DONE: KVR_OK when every report succeeded, else the first failure
     * reported (failure dominates). PENDING: the failure so far, if any.
     * IGNORED: KVR_OK (the key's result was given when it finished). */
    kvr_status_t status;
    uint32_t reported; /* distinct members heard for this key */
} kvr_quorum_result_t;

typedef struct kvr_quorum kvr_quorum_t;

kvr_status_t kvr_quorum_create(const kvr_quorum_params_t *params,
                               kvr_quorum_t **out, kvr_error_t *err);
void kvr_quorum_destroy(kvr_quorum_t *q);

/* Member `member` reports id with `status` (KVR_OK = success, anything else
 * = failure). A key completes once every member reported; a member's
 * repeated reports AND together. Finished keys are tombstoned (operation ids
 * always; bare ids when tombstone_requests) so late duplicates come back
 * IGNORED. KVR_ERR_TABLE_FULL when a new key would exceed max_pending. */
kvr_status_t kvr_quorum_report(kvr_quorum_t *q, const kvr_completion_id_t *id,
                               uint32_t member, kvr_status_t status,
                               kvr_quorum_result_t *result, kvr_error_t *err);

/* Drops id's partial reports (an aborted request) and tombstones it, so
 * reports still in flight are ignored. Unknown ids are fine. */
kvr_status_t kvr_quorum_cancel(kvr_quorum_t *q, const kvr_completion_id_t *id,
                               kvr_error_t *err);

/* Forgets id entirely (partial reports and tombstone): call it before an
 * engine re-issues a request id that already completed here. */
kvr_status_t kvr_quorum_forget(kvr_quorum_t *q, const kvr_completion_id_t *id,
                               kvr_error_t *err);

size_t kvr_quorum_num_pending(const kvr_quorum_t *q);
size_t kvr_quorum_num_tombstones(const kvr_quorum_t *q);

/* ---- send/save pairing on the producer's PP head ----------------------- */

#define KVR_PAIRING_MAX_SAVES 16u /* outstanding saves per request */

typedef struct kvr_pairing_params {
    size_t max_requests; /* requests with held sends or outstanding saves */
    size_t max_events;   /* released events not yet polled */
    size_t tombstones;   /* requests whose send was released, FIFO, >= 1 */
} kvr_pairing_params_t;

#define KVR_PAIRING_PARAMS_INIT                                                \
    {                                                                          \
        .max_requests = 16384, .max_events = 32768, .tombstones = 4096         \
    }

typedef enum kvr_pair_outcome {
    KVR_PAIR_HELD = 0,      /* send held until its request's saves complete */
    KVR_PAIR_RELEASED = 1,  /* event(s) queued for kvr_pairing_poll */
    KVR_PAIR_DUPLICATE = 2, /* already known: nothing queued */
} kvr_pair_outcome_t;

typedef enum kvr_release_kind {
    KVR_RELEASE_SAVE = 1, /* a save finished (never held) */
    KVR_RELEASE_SEND = 2, /* a send finished and no save of its request is
                           * outstanding: the request's blocks may be freed */
} kvr_release_kind_t;

/* One released completion; owns a copy of its id. */
typedef struct kvr_release {
    kvr_release_kind_t kind;
    kvr_status_t status; /* as fed: KVR_OK or the failure */
    bool is_op;
    int64_t generation;
    size_t req_id_len;
    uint8_t req_id[KVR_REQ_ID_MAX];
} kvr_release_t;

/* The id of a release, borrowing r's bytes. */
static inline kvr_completion_id_t kvr_release_id(const kvr_release_t *r)
{
    kvr_completion_id_t id = {r->req_id, r->req_id_len, r->is_op,
                              r->generation};
    return id;
}

typedef struct kvr_pairing kvr_pairing_t;

kvr_status_t kvr_pairing_create(const kvr_pairing_params_t *params,
                                kvr_pairing_t **out, kvr_error_t *err);
void kvr_pairing_destroy(kvr_pairing_t *p);

/* Declares that the request of `save` (its completion_req_key) has a save in
 * flight: its send is held until that save completes. Matching is by exact
 * id: declare (R, g) and finish (R, g). Declaring a save that already
 * finished (it arrived first) matches it. KVR_ERR_EXISTS if the request's
 * send was already released (its blocks may be gone). */
kvr_status_t kvr_pairing_expect_save(kvr_pairing_t *p,
                                     const kvr_completion_id_t *save,
                                     kvr_error_t *err);

/* A finished (TP/PP-aggregated) send: released at once when its request has
 * no declared save outstanding, else held. */
kvr_status_t kvr_pairing_send_done(kvr_pairing_t *p,
                                   const kvr_completion_id_t *send,
                                   kvr_status_t status,
                                   kvr_pair_outcome_t *outcome,
                                   kvr_error_t *err);

/* A finished (PP-aggregated) save: always released as a SAVE event; when it
 * was its request's last outstanding save and a send is held, the SEND is
 * released right after it. */
kvr_status_t kvr_pairing_save_done(kvr_pairing_t *p,
                                   const kvr_completion_id_t *save,
                                   kvr_status_t status,
                                   kvr_pair_outcome_t *outcome,
                                   kvr_error_t *err);

/* Moves up to cap released events, oldest first, into out. */
kvr_status_t kvr_pairing_poll(kvr_pairing_t *p, kvr_release_t *out, size_t cap,
                              size_t *num, kvr_error_t *err);

/* Forgets everything about id's request (declared saves, a held send, its
 * tombstone): for aborted requests and re-issued request ids. A held send is
 * dropped, not released. */
kvr_status_t kvr_pairing_forget(kvr_pairing_t *p, const kvr_completion_id_t *id,
                                kvr_error_t *err);

size_t kvr_pairing_num_requests(const kvr_pairing_t *p);
size_t kvr_pairing_num_events(const kvr_pairing_t *p);

/* ---- prefix hashes (§9) ------------------------------------------------ */

#define KVR_BLOCK_HASH_BYTES 32

typedef struct kvr_block_hash {
    uint8_t bytes[KVR_BLOCK_HASH_BYTES];
} kvr_block_hash_t;

/* hash_block_size = bs * W (§2), after kvr_layout_check. */
kvr_status_t kvr_hash_block_size(const kvr_layout_t *lay, uint64_t *out,
                                 kvr_error_t *err);

/* Hashes the full blocks of tokens: h_i = SHA-256(h_{i-1} || block i's
 * token ids as u32 little-endian), h_{-1} = *parent or 32 zero bytes when
 * parent is NULL. A trailing partial block is not hashed. *num gets the
 * number of full blocks; with out == NULL only that count is computed, else
 * out_cap must hold them all (KVR_ERR_BUFFER_SMALL otherwise). */
kvr_status_t kvr_prefix_hashes(const kvr_block_hash_t *parent,
                               const uint32_t *tokens, size_t num_tokens,
                               uint64_t hash_block_size, kvr_block_hash_t *out,
                               size_t out_cap, size_t *num, kvr_error_t *err);

/* A prefix-cache hit of hit_blocks hash blocks on a prompt of num_tokens:
 * num_cached_tokens = hit_blocks * hash_block_size and num_computed_blocks
 * in VIRTUAL blocks = num_cached_tokens / (bs * W). Either output may be
 * NULL. Error when the hit covers more than the prompt's full blocks. */
kvr_status_t kvr_prefix_cached(const kvr_layout_t *lay, uint64_t num_tokens,
                               uint64_t hit_blocks, uint64_t *num_cached_tokens,
                               uint64_t *num_computed_blocks, kvr_error_t *err);

/* ---- offload identity (§9) --------------------------------------------- */

#define KVR_OFFLOAD_LAYOUT_VERSION 3u
#define KVR_OFFLOAD_KEY_BYTES 16
#define KVR_OFFLOAD_KEY_HEX_LEN (2 * KVR_OFFLOAD_KEY_BYTES) /* + NUL */
#define KVR_OFFLOAD_MAX_LAYERS 4096u

/* What makes offloaded pages interchangeable. interleave and preshuffle are
 * part of it because they change the bytes of a rank-local page. */
typedef struct kvr_offload_desc {
    const char *model_tag; /* non-empty, <= 256 bytes, UTF-8 */
    const char *dtype;     /* KV cache dtype, non-empty, <= 32 bytes */
    uint32_t block_size;   /* bs */
    uint32_t chunk_size;   /* tokens per offload chunk, multiple of bs * W */
    uint32_t tp;           /* TP (world) size of the replica writing pages */
    uint32_t dcp_size;     /* W */
    uint32_t interleave;   /* I */
    bool replicate_index;  /* DSA index cache replicated on every DCP rank */
    bool preshuffle;       /* index key plane preshuffled */
    const char *const *indexer_types; /* per indexer layer, e.g. "full" */
    size_t num_indexer_types;         /* 0..KVR_OFFLOAD_MAX_LAYERS */
} kvr_offload_desc_t;

/* Canonical description: compact JSON, sorted keys, ASCII-escaped, e.g.
 * {"block_size":64,...,"schema":"kvrelay-page-namespace","tp_size":4}.
 * *len gets its length; buf (NULL: length only) gets it NUL-terminated,
 * or KVR_ERR_BUFFER_SMALL when cap <= its length. */
kvr_status_t kvr_offload_canonical(const kvr_offload_desc_t *desc, char *buf,
                                   size_t cap, size_t *len, kvr_error_t *err);

/* Namespace key: 16-byte BLAKE2b (crypto_generichash) of the canonical
 * description, as 32 lowercase hex digits plus NUL. */
kvr_status_t kvr_offload_key(const kvr_offload_desc_t *desc,
                             char out[KVR_OFFLOAD_KEY_HEX_LEN + 1],
                             kvr_error_t *err);

/* "<model_tag>::kvrelay-page-v3-<key>", for tiers keyed by model name. */
kvr_status_t kvr_offload_namespace(const kvr_offload_desc_t *desc, char *buf,
                                   size_t cap, kvr_error_t *err);

/* Largest chunk-aligned prefix of a hit: floor(hit / chunk) * chunk, 0 for a
 * hit <= 0. chunk_size must be >= 1. */
kvr_status_t kvr_offload_aligned_prefix(int64_t hit_tokens, uint64_t chunk_size,
                                        uint64_t *out, kvr_error_t *err);

KVR_API_END
#ifdef __cplusplus
}
#endif
#endif
