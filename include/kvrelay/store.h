/* kvrelay store layer: the offload tier (docs/store.md, docs/design.md §17).
 * Chunks of `chunk` tokens keyed by a namespace key and the prefix hash chain
 * up to the chunk's end, kept in canonical form (independent of any rank
 * layout) in a bounded host-memory tier over a local-disk tier. Every chunk
 * carries a checksum (a BLAKE2b tree, docs/store.md); a chunk that fails it
 * is reported and treated as a miss, never loaded. Not thread-safe: one
 * store per thread. */
#ifndef KVRELAY_STORE_H
#define KVRELAY_STORE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "kvrelay/completion.h"
#include "kvrelay/plan.h"

#ifdef __cplusplus
extern "C" {
#endif
KVR_API_BEGIN

#define KVR_STORE_NS_BYTES 16
#define KVR_STORE_SUM_BYTES 32
/* file name: <ns 32 hex>-<chain 64 hex>-p<part>.kvc */
#define KVR_STORE_NAME_MAX 128

/* Identity of one stored chunk: namespace, the prefix hash chain over
 * chunk-sized blocks up to the chunk's end, and the part (the PP stage whose
 * layers it holds). */
typedef struct kvr_chunk_key {
    uint8_t ns[KVR_STORE_NS_BYTES];
    kvr_block_hash_t chain;
    uint32_t part;
} kvr_chunk_key_t;

typedef struct kvr_store_opts {
    const char *dir;     /* disk tier directory (created); NULL: host only */
    uint64_t host_bytes; /* host tier bound; 0: no host tier */
    bool verify_host;    /* re-check the checksum on host-tier hits too */
    bool quick_scan;     /* the open scan checks headers and sizes only
                            (payload checksums are still checked on every
                            load and by kvr_store_verify) */
    bool fast_checksum;  /* new chunk files hash their 4 MiB leaves with
                            Poly1305 under a fixed public key instead of
                            BLAKE2b (several times faster; detects accidental
                            corruption only, docs/store.md "Checksum"); the
                            root is BLAKE2b either way, files of both kinds
                            read */
} kvr_store_opts_t;

typedef struct kvr_store_stats {
    uint64_t host_bytes, host_chunks; /* held now */
    uint64_t host_hits, disk_hits, misses;
    uint64_t corrupt; /* chunks found corrupt on load */
    uint64_t evictions;
    uint64_t scan_ok;                   /* valid chunks found by the scan */
    uint64_t scan_dropped_temp;         /* unfinished writes removed */
    uint64_t scan_dropped_corrupt;      /* renamed to *.corrupt by the scan */
    uint64_t saved_bytes, loaded_bytes; /* chunk payload bytes */
} kvr_store_stats_t;

typedef struct kvr_store kvr_store_t;

/* Opens (creating the directory) and scans the disk tier: unfinished temp
 * files are removed and corrupt chunks renamed to <name>.corrupt, both
 * counted in the stats. */
kvr_status_t kvr_store_open(const kvr_store_opts_t *opts, kvr_store_t **out,
                            kvr_error_t *err);
void kvr_store_close(kvr_store_t *st);
void kvr_store_stats(const kvr_store_t *st, kvr_store_stats_t *out);
/* What the store runs with: "host" (no directory), or its disk I/O:
 * "io_uring+O_DIRECT", "io_uring", "pread/pwrite+O_DIRECT", "pread/pwrite"
 * (docs/store.md "Tiers"). */
const char *kvr_store_backend(const kvr_store_t *st);

/* Raw chunks. put copies len payload bytes into the host tier (LRU) and,
 * with a directory, writes them to disk durably (temp name, fsync, rename);
 * a failed disk write (KVR_ERR_IO naming errno, e.g. a full disk) leaves
 * no chunk on disk. get copies the payload into buf: KVR_ERR_NOT_FOUND on a
 * miss or on a corrupt chunk (counted in stats.corrupt), KVR_ERR_BUFFER_SMALL
 * when cap < its length (*len says it). */
kvr_status_t kvr_store_put(kvr_store_t *st, const kvr_chunk_key_t *key,
                           const void *data, uint64_t len, kvr_error_t *err);
kvr_status_t kvr_store_get(kvr_store_t *st, const kvr_chunk_key_t *key,
                           void *buf, uint64_t cap, uint64_t *len,
                           kvr_error_t *err);
bool kvr_store_contains(kvr_store_t *st, const kvr_chunk_key_t *key);

/* Checks every chunk file in dir against its checksum without changing
 * anything; calls bad(name, why, arg) for each corrupt or unfinished one.
 * *num_ok and *num_bad (either may be NULL) get the counts. */
typedef void (*kvr_store_bad_fn)(const char *name, const char *why, void *arg);
kvr_status_t kvr_store_verify(const char *dir, kvr_store_bad_fn bad, void *arg,
                              uint64_t *num_ok, uint64_t *num_bad,
                              kvr_error_t *err);

/* Namespace key of a store: BLAKE2b of the offload key of desc taken at the
 * canonical layout (W = I = tp = 1, no replication, no preshuffle: a chunk
 * does not depend on them) and of the model geometry: every region's role,
 * layer and token widths, plus the speculative config text (NULL: none). */
kvr_status_t kvr_store_namespace(const kvr_offload_desc_t *desc,
                                 const kvr_region_desc_t *regions,
                                 size_t num_regions, const char *spec_config,
                                 uint8_t out[KVR_STORE_NS_BYTES],
                                 kvr_error_t *err);

/* Chain hashes of the full chunks of tokens (chunk-sized hash blocks, so
 * they do not depend on any rank layout); out needs num_tokens / chunk. */
kvr_status_t kvr_store_chains(const uint32_t *tokens, size_t num_tokens,
                              uint64_t chunk, kvr_block_hash_t *out, size_t cap,
                              size_t *num, kvr_error_t *err);

/* ---- save and load through the planner -------------------------------- */

/* A region of one side and where it lives in this process. */
typedef struct kvr_store_region {
    kvr_region_desc_t desc;
    void *base;
} kvr_store_region_t;

/* One request of one side: its layout (a producer for a save: W_p = 1, any
 * bs_p; a consumer for a load: any W, I, replication, preshuffle, at the
 * store's bs), its regions (a save: the PP stage's layers; MLA and INDEX)
 * and its full block table. */
typedef struct kvr_store_io {
    const uint8_t *ns;              /* KVR_STORE_NS_BYTES */
    uint32_t part;                  /* PP stage */
    uint32_t block_size;            /* the store's canonical bs */
    uint64_t chunk;                 /* tokens per chunk, multiple of bs*W */
    const kvr_block_hash_t *chains; /* one per full chunk of the request */
    size_t num_chains;
    const kvr_layout_t *lay;
    uint32_t rank; /* consumer DCP rank (load) */
    const kvr_store_region_t *regions;
    size_t num_regions;
    const uint32_t *blocks; /* the side's block table */
    size_t num_blocks;
} kvr_store_io_t;

/* Saves chunks [0, num_chains) of the request (each in canonical form), in
 * order; chunks already present are skipped. On an error the chunks before
 * the failing one stay saved (each whole) and the save stops there. *saved
 * (may be NULL) gets the number written. */
kvr_status_t kvr_store_save(kvr_store_t *st, const kvr_store_io_t *io,
                            size_t *saved, kvr_error_t *err);
/* Loads the longest run of leading chunks present and valid into the
 * consumer rank's regions; *tokens gets its length (floor(hit / chunk) *
 * chunk). A chunk is checked against its checksum before any of its bytes
 * are scattered; a corrupt one ends the hit there. */
kvr_status_t kvr_store_load(kvr_store_t *st, const kvr_store_io_t *io,
                            uint64_t *tokens, kvr_error_t *err);

/* ---- the store connector: saves and loads beside the transfer ----------
 * (docs/store.md "The store connector"). The offload half of the seed's
 * multi-connector: a producer stage saves its layers of a request on a
 * worker thread while the agent serves the same request's pulls, and the
 * request's sources stay held until both its send and its save completed
 * (send/save pairing); a save of (request, generation) completes when every
 * PP part reported (PP quorum). A consumer loads the longest cached prefix
 * present in every part (a quorum over the parts) and pulls only the rest.
 * Every function is safe from any thread; events are polled. */

typedef struct kvr_store_conn_params {
    kvr_store_t *store;        /* borrowed; after create, used only through the
                           connector (it serialises every store call) */
    const uint8_t *ns;         /* KVR_STORE_NS_BYTES, copied */
    uint32_t block_size;       /* the store's canonical bs */
    uint64_t chunk;            /* tokens per chunk, a multiple of bs * W */
    kvr_layout_t lay;          /* this side's layout */
    uint32_t parts;            /* PP stages of the producer, 1..64 */
    const uint32_t *part_ends; /* parts entries, increasing: part p holds
                                  layers [part_ends[p-1], part_ends[p]) */
    const kvr_store_region_t *regions; /* this process's regions, copied:
                                          a producer stage's layers (or
                                          several stages'), a consumer
                                          rank's; layers past the last part
                                          (consumer-only) are never loaded */
    size_t num_regions;
    uint32_t remote_wait_ms; /* parts held by other processes: 0: the engine
                                forwards their outcomes
                                (kvr_store_conn_part_saved); > 0: through
                                the store's directory, which the stages
                                share: a connector without part 0 records
                                each part it saves there, the one with part
                                0 (the PP head) reads and removes those
                                records, and fails a part none recorded
                                within this many ms of the save */
} kvr_store_conn_params_t;

typedef struct kvr_store_conn kvr_store_conn_t;

typedef enum kvr_store_event_kind {
    KVR_STORE_PART_SAVED = 1, /* one part (PP stage) held here finished its
                                 save of (request, generation): status */
    KVR_STORE_SAVED = 2,      /* every part reported (PP quorum): status is
                                 KVR_OK or the first failure */
    KVR_STORE_RELEASE = 3,    /* the request's send and every save declared
                                 here completed: its sources may be freed;
                                 status is the send's */
} kvr_store_event_kind_t;

typedef struct kvr_store_event {
    kvr_store_event_kind_t kind;
    uint8_t request[KVR_REQ_ID_MAX];
    size_t request_len;
    int64_t generation; /* saves; 0 for RELEASE */
    uint32_t part;      /* PART_SAVED */
    kvr_status_t status;
    char message[KVR_ERROR_MSG_MAX];
    uint64_t bytes;  /* PART_SAVED: chunk payload bytes written */
    uint64_t chunks; /* PART_SAVED: chunks written (present ones skipped) */
} kvr_store_event_t;

const char *kvr_store_event_name(kvr_store_event_kind_t kind);

kvr_status_t kvr_store_conn_create(const kvr_store_conn_params_t *params,
                                   kvr_store_conn_t **out, kvr_error_t *err);
/* Waits for the save in progress (not the queued ones: they are dropped,
 * without events), stops the worker, frees everything. Accepts NULL. */
void kvr_store_conn_destroy(kvr_store_conn_t *c);

/* A save of this process's parts of a request: its full chunks (one chain
 * each, kvr_store_chains) from src_blocks (the stage's block table, copied),
 * operation id (request, generation). Declares the save to the pairing at
 * once (the send is held from now on) and queues it for the worker.
 * Generations (docs/store.md): a request saved again (preempted and
 * prefilled again) comes with a higher generation; its saves of older
 * generations still queued are dropped, each reported PART_SAVED and
 * SAVED with KVR_ERR_CANCELED ("superseded"); one running finishes under
 * its own id. A generation not above the request's latest is refused:
 * KVR_ERR_EXISTS for the same one, KVR_ERR_CANCELED for an older one. Each
 * part saved here is also recorded in the store's directory when other
 * processes hold parts (remote_wait_ms). */
typedef struct kvr_store_save_req {
    const void *request_id;
    size_t request_id_len;
    int64_t generation;
    const kvr_block_hash_t *chains;
    size_t num_chains;
    const uint32_t *src_blocks;
    size_t num_src_blocks;
} kvr_store_save_req_t;
kvr_status_t kvr_store_conn_save(kvr_store_conn_t *c,
                                 const kvr_store_save_req_t *req,
                                 kvr_error_t *err);
/* A part held by another process reported its save of (request,
 * generation) (the engine forwards it): counts toward the PP quorum. */
kvr_status_t kvr_store_conn_part_saved(kvr_store_conn_t *c,
                                       const void *request_id, size_t len,
                                       int64_t generation, uint32_t part,
                                       kvr_status_t status, kvr_error_t *err);
/* The request's send finished (the agent's SENT, SEND_FAILED or
 * SEND_EXPIRED): RELEASE follows at once, or when its saves finished. */
kvr_status_t kvr_store_conn_send_done(kvr_store_conn_t *c,
                                      const void *request_id, size_t len,
                                      kvr_status_t status, kvr_error_t *err);

/* Non-blocking: true with *out filled when an event was queued. */
bool kvr_store_conn_poll(kvr_store_conn_t *c, kvr_store_event_t *out);
/* Readable while events are queued; never read or close it. */
int kvr_store_conn_event_fd(const kvr_store_conn_t *c);

/* A consumer rank's load of (request, generation): every part is loaded
 * (checksums checked before any byte lands) and reported to a quorum over
 * the parts; the hit is the shortest part's, at most max_tokens, chunk
 * aligned. Bytes of later chunks of longer parts may land too: they lie
 * past the hit, where the transfer writes. *tokens gets the hit, *bytes the
 * payload bytes read. A part's miss or corrupt chunk only shortens the
 * hit; an error (bad layout, bad table) fails the load with nothing
 * counted. */
typedef struct kvr_store_load_req {
    const void *request_id;
    size_t request_id_len;
    int64_t generation;
    const kvr_block_hash_t *chains;
    size_t num_chains;
    const uint32_t *dst_blocks;
    size_t num_dst_blocks;
    uint32_t rank;       /* this consumer's DCP rank */
    uint64_t max_tokens; /* at most this many (e.g. the prompt less one) */
} kvr_store_load_req_t;
kvr_status_t kvr_store_conn_load(kvr_store_conn_t *c,
                                 const kvr_store_load_req_t *req,
                                 uint64_t *tokens, uint64_t *bytes,
                                 kvr_error_t *err);
/* A load's generation is its request's latest from then on: a load of an
 * older generation (a late call for a request since preempted and
 * admitted again) is refused with KVR_ERR_CANCELED and lands nothing.
 * forget drops what the connector holds about a finished request (its
 * latest save and load generations), so that its id may be used again;
 * a producer's are dropped at RELEASE anyway. */
kvr_status_t kvr_store_conn_forget(kvr_store_conn_t *c, const void *request_id,
                                   size_t len, kvr_error_t *err);

KVR_API_END
#ifdef __cplusplus
}
#endif
#endif
