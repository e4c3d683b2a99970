/* kvrelay wire layer: the binary protocol of docs/design.md §7 (framing, messages,
 * strict decoding), the HELLO layout comparison and the optional pre-shared
 * key authentication. No transport: bytes in, bytes out. See docs/PROTOCOL.md
 * for the byte layout and the caps. */
#ifndef KVRELAY_WIRE_H
#define KVRELAY_WIRE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "kvrelay/layout.h"
#include "kvrelay/status.h"

#ifdef __cplusplus
extern "C" {
#endif
KVR_API_BEGIN

/* Protocol version: frames of another major version are refused. 2.0: keyed
 * sessions send LAYOUT after AUTH and a MAC tag after every frame that
 * follows AUTH (docs/PROTOCOL.md "Session MAC"); HELLO carries settings.
 * 3.0: HELLO carries the producer's own sharding, REGIONS the dense head
 * geometry, STAGES each stage's DCP rank (appended fields, which 2.x
 * readers refuse: hence a major version). 3.1: STREAM_REQUEST and
 * LAYERS_DONE (layer-wise streaming), sent only to a peer whose HELLO says
 * 3.1 or later. */
#define KVR_WIRE_VERSION_MAJOR 3u
#define KVR_WIRE_VERSION_MINOR 1u
/* The first minor version (of this major) that knows STREAM_REQUEST and
 * LAYERS_DONE. */
#define KVR_WIRE_MINOR_STREAM 1u

/* Frame header: magic "KVRW", major u8, minor u8, type u16, payload length
 * u32, all little-endian. */
#define KVR_WIRE_MAGIC 0x5752564bu /* bytes 'K' 'V' 'R' 'W' */
#define KVR_WIRE_HEADER_BYTES 12u

/* Caps, enforced on encode and on decode (KVR_ERR_WIRE_LIMIT). */
#define KVR_WIRE_MAX_PAYLOAD (8u << 20) /* bytes after the header */
#define KVR_WIRE_REQ_ID_MAX 256u        /* request id bytes (>= 1) */
#define KVR_WIRE_TEXT_MAX 255u          /* message text bytes, no NUL */
#define KVR_WIRE_MAX_BLOCKS (1u << 17)  /* block ids per list */
#define KVR_WIRE_MAX_PROMPT (1u << 20)  /* prompt token ids per OFFER */
#define KVR_WIRE_MAX_REGIONS 1024u      /* regions per REGIONS */
#define KVR_WIRE_RKEY_MAX 4096u         /* packed remote key bytes */
#define KVR_WIRE_ADDR_MAX 4096u         /* transport address bytes */
#define KVR_WIRE_MAX_SLOTS 4096u        /* staging slots per WRITE_REQUEST */
#define KVR_WIRE_MAX_CLASSES 32u        /* region classes per HELLO */
#define KVR_WIRE_DEADLINE_DEFAULT_MS 30000u
#define KVR_WIRE_DEADLINE_MAX_MS 3600000u /* deadlines are 1..max ms */
#define KVR_WIRE_HELLO_FRAME_MAX 1088u    /* a whole HELLO frame, bytes */
#define KVR_WIRE_INSTANCE_MAX 64u         /* instance id bytes (0: none) */
#define KVR_WIRE_MAX_STAGES 1024u         /* stages per STAGES */
#define KVR_WIRE_NOTIFY_MAX 16384u        /* NOTIFY payload bytes */

#define KVR_WIRE_NONCE_BYTES 32u /* HELLO auth nonce */
#define KVR_WIRE_MAC_BYTES 32u   /* HMAC-SHA256 */
#define KVR_WIRE_KEY_BYTES 32u   /* pre-shared key */
#define KVR_WIRE_TAG_BYTES 32u /* session MAC after a frame: HMAC-SHA512-256 */

typedef enum kvr_msg_type {
    KVR_MSG_HELLO = 1,
    KVR_MSG_HELLO_ACK = 2,
    KVR_MSG_AUTH = 3,
    KVR_MSG_BYE = 4,
    KVR_MSG_LAYOUT = 5, /* HELLO's payload, sent after AUTH in keyed sessions */
    KVR_MSG_REGIONS = 16,
    KVR_MSG_OFFER = 17,
    KVR_MSG_ASSIGN = 18,
    KVR_MSG_WRITE_REQUEST = 19,
    KVR_MSG_WRITE_DONE = 20,
    KVR_MSG_WRITE_FAILED = 21,
    KVR_MSG_RELEASE = 22,
    KVR_MSG_CHUNK_DONE = 23,
    KVR_MSG_JOIN = 24,
    KVR_MSG_STAGES = 25,
    KVR_MSG_NOTIFY = 26,
    KVR_MSG_STREAM_REQUEST = 27, /* 2.1: WRITE_REQUEST served per layer group */
    KVR_MSG_LAYERS_DONE = 28,    /* 2.1: one layer group of it written */
} kvr_msg_type_t;

/* "HELLO", "WRITE_REQUEST", ...; NULL for an unknown type. */
const char *kvr_msg_type_name(kvr_msg_type_t type);

typedef enum kvr_wire_side {
    KVR_WIRE_PRODUCER = 1,
    KVR_WIRE_CONSUMER = 2,
} kvr_wire_side_t;

typedef enum kvr_wire_exec {
    KVR_WIRE_EXEC_AUTO = 0, /* producer picks by its cost model */
    KVR_WIRE_EXEC_DIRECT = 1,
    KVR_WIRE_EXEC_STAGED = 2,
    KVR_WIRE_EXEC_GPU_DIRECT = 3,
    KVR_WIRE_EXEC_GPU_STAGED = 4, /* CUDA KV: packed on the GPU into chunks
                                     through CUDA STAGING slots */
} kvr_wire_exec_t;

/* A request id: an opaque byte string of 1..KVR_WIRE_REQ_ID_MAX bytes. */
typedef struct kvr_wire_id {
    uint16_t len;
    uint8_t bytes[KVR_WIRE_REQ_ID_MAX];
} kvr_wire_id_t;

kvr_status_t kvr_wire_id_set(kvr_wire_id_t *id, const void *bytes, size_t len,
                             kvr_error_t *err);
bool kvr_wire_id_equal(const kvr_wire_id_t *a, const kvr_wire_id_t *b);

/* The sender's place in its deployment. */
typedef struct kvr_wire_topo {
    uint32_t pp_rank, pp_size;
    uint32_t tp_rank, tp_size;
    uint32_t dp_rank, dp_size;
    uint32_t layer_start, layer_end; /* half-open model layer range */
    uint32_t dcp_rank;
} kvr_wire_topo_t;

/* A region class as HELLO carries it (kvr_region_class_t, kvrelay/layout.h). */
typedef kvr_region_class_t kvr_wire_class_t;

/* HELLO and HELLO_ACK. The layout digest travels with the raw fields behind
 * it so that a mismatch names the first field that differs. */
typedef struct kvr_msg_hello {
    uint8_t proto_major, proto_minor;
    kvr_wire_side_t side;
    bool has_key; /* the sender requires AUTH (pre-shared key configured) */
    kvr_wire_topo_t topo;
    uint32_t layout_version;
    kvr_layout_t layout; /* bs, W, I, tp, producer tp, replicate, preshuffle */
    uint32_t num_classes;
    kvr_wire_class_t classes[KVR_WIRE_MAX_CLASSES]; /* sorted, distinct */
    uint64_t digest;
    uint8_t nonce[KVR_WIRE_NONCE_BYTES];
    /* Settings both sides must share beyond the layout, defined by the
     * application ("" none): space-separated key=value pairs, e.g. the
     * demo's workload "requests=4 tokens=3000 seed=1". */
    char settings[KVR_WIRE_TEXT_MAX + 1];
    kvr_wire_id_t instance; /* the sender's instance id, 0..64 bytes */
    uint64_t incarnation;   /* random per process life; 0: none given */
} kvr_msg_hello_t;

typedef struct kvr_msg_auth {
    uint8_t mac[KVR_WIRE_MAC_BYTES];
} kvr_msg_auth_t;

/* Orderly close, or the reason a handshake was refused. */
typedef struct kvr_msg_bye {
    kvr_status_t status;
    char text[KVR_WIRE_TEXT_MAX + 1];
} kvr_msg_bye_t;

/* Where a region's bytes live: host memory reached through the transport's
 * rkey, or CUDA device memory: the rkey bytes are then a CUDA IPC handle
 * (72 bytes, kvr_gpu_ipc_handle_t), followed, when the consumer's
 * transport moves CUDA memory, by that transport's packed key for the
 * region (docs/agent.md, GPU executors). */
typedef enum kvr_wire_memory {
    KVR_WIRE_MEM_HOST = 0,
    KVR_WIRE_MEM_CUDA = 1,
} kvr_wire_memory_t;

/* One consumer region. A STAGING region is the staging pool: num_blocks
 * slots of page_bytes each. */
typedef struct kvr_wire_region {
    kvr_region_desc_t desc;
    uint64_t base;       /* remote address of the region's first byte */
    const uint8_t *rkey; /* packed remote key, transport-defined */
    uint32_t rkey_len;
    kvr_wire_memory_t memory;
} kvr_wire_region_t;

/* The consumer's regions and the transport address producers connect
 * their data endpoint to (opaque, transport-defined). */
typedef struct kvr_msg_regions {
    const kvr_wire_region_t *regions;
    uint32_t num_regions;
    const uint8_t *address;
    uint32_t address_len;
} kvr_msg_regions_t;

typedef struct kvr_msg_offer {
    kvr_wire_id_t request_id;
    uint64_t transfer_id;
    uint64_t num_tokens;
    const uint32_t *src_blocks;
    uint32_t num_src_blocks;
    const uint32_t *prompt; /* prompt token ids */
    uint32_t num_prompt;
} kvr_msg_offer_t;

typedef struct kvr_msg_assign {
    kvr_wire_id_t request_id;
    uint64_t transfer_id;
    const uint32_t *dst_blocks;
    uint32_t num_dst_blocks;
    uint64_t num_computed_blocks; /* virtual blocks */
    uint32_t deadline_ms;         /* relative */
} kvr_msg_assign_t;

typedef struct kvr_msg_write_request {
    kvr_wire_id_t request_id;
    uint64_t transfer_id;
    const uint32_t *src_blocks; /* full tables, never pre-sliced */
    uint32_t num_src_blocks;
    const uint32_t *dst_blocks;
    uint32_t num_dst_blocks;
    uint64_t num_tokens;
    uint64_t num_computed_blocks; /* virtual blocks */
    uint32_t dcp_rank;
    kvr_wire_exec_t executor;
    const uint32_t *staging_slots; /* granted slots of the STAGING pool */
    uint32_t num_staging_slots;
    uint64_t write_nonce; /* random, never 0 */
    uint32_t deadline_ms; /* relative */
    /* STREAM_REQUEST only (WRITE_REQUEST carries neither): the half-open
     * model layer range asked of the stage, served one ready layer group
     * at a time in layer order, each group answered by LAYERS_DONE */
    uint32_t layer_begin, layer_end;
} kvr_msg_write_request_t;

typedef struct kvr_msg_write_done {
    kvr_wire_id_t request_id;
    uint64_t transfer_id;
    uint32_t pp_rank, tp_rank;
    uint64_t write_nonce;
    uint64_t bytes;
    uint32_t chunks;
} kvr_msg_write_done_t;

/* One layer group of a STREAM_REQUEST is in place (flushed, or every chunk
 * of it sent): layers [layer_begin, layer_end), its bytes and chunks. The
 * pull's WRITE_DONE (all groups' bytes) still ends it. */
typedef struct kvr_msg_layers_done {
    kvr_wire_id_t request_id;
    uint64_t transfer_id;
    uint32_t pp_rank, tp_rank;
    uint64_t write_nonce;
    uint32_t layer_begin, layer_end;
    uint64_t bytes;
    uint32_t chunks;
} kvr_msg_layers_done_t;

typedef struct kvr_msg_write_failed {
    kvr_wire_id_t request_id;
    uint64_t transfer_id;
    uint32_t pp_rank, tp_rank;
    uint64_t write_nonce;
    kvr_status_t status; /* never KVR_OK */
    char text[KVR_WIRE_TEXT_MAX + 1];
} kvr_msg_write_failed_t;

typedef struct kvr_msg_release {
    kvr_wire_id_t request_id;
    uint64_t transfer_id;
    uint32_t consumer_rank; /* the consumer's tp rank */
    uint64_t write_nonce;
    kvr_status_t outcome; /* KVR_OK on success, else why it failed */
} kvr_msg_release_t;

/* Staged executor: one chunk landed in a staging slot and was flushed. */
typedef struct kvr_msg_chunk_done {
    kvr_wire_id_t request_id;
    uint64_t transfer_id;
    uint32_t pp_rank, tp_rank;
    uint64_t write_nonce;
    uint32_t chunk;  /* chunk index within the transfer */
    uint32_t slot;   /* staging slot it was written to */
    uint64_t offset; /* byte offset of the chunk in the rank's packed stream */
    uint64_t bytes;  /* bytes in the chunk */
} kvr_msg_chunk_done_t;

/* A non-head producer stage announces itself to its instance's PP head
 * (pp 0, tp 0) over a link it dialled; ranks come from its HELLO. */
typedef struct kvr_msg_join {
    char address[KVR_WIRE_TEXT_MAX + 1]; /* "host:port" consumers dial */
} kvr_msg_join_t;

typedef struct kvr_wire_stage {
    uint32_t pp_rank, tp_rank;
    uint64_t incarnation;
    char address[KVR_WIRE_TEXT_MAX + 1];
    uint32_t dcp_rank; /* the stage's producer DCP rank (appended, 2.1) */
} kvr_wire_stage_t;

/* PP head -> consumer: the instance's stages known so far (itself
 * included); sent when the link is ready and again whenever it changes. */
typedef struct kvr_msg_stages {
    uint32_t pp_size, tp_size;
    const kvr_wire_stage_t *stages;
    uint32_t num_stages;
} kvr_msg_stages_t;

/* Any agent -> any agent: an application's message (routers built on the
 * agent). Who sent it is the link's authenticated identity (HELLO or
 * LAYOUT), never a field of the message. */
typedef struct kvr_msg_notify {
    char address[KVR_WIRE_TEXT_MAX + 1]; /* the sender's own listening
                                            "host:port", or "" */
    const uint8_t *payload;
    uint32_t len; /* 0..KVR_WIRE_NOTIFY_MAX */
} kvr_msg_notify_t;

/* A message. Built by the caller (arrays are the caller's, priv_arena NULL)
 * or by kvr_wire_decode (arrays live in priv_arena; kvr_msg_free releases
 * them). kvr_msg_free on a caller-built message only zeroes it. */
typedef struct kvr_msg {
    kvr_msg_type_t type;
    union {
        kvr_msg_hello_t hello; /* HELLO, HELLO_ACK and LAYOUT */
        kvr_msg_auth_t auth;
        kvr_msg_bye_t bye;
        kvr_msg_regions_t regions;
        kvr_msg_offer_t offer;
        kvr_msg_assign_t assign;
        kvr_msg_write_request_t write_request; /* and STREAM_REQUEST */
        kvr_msg_write_done_t write_done;
        kvr_msg_layers_done_t layers_done;
        kvr_msg_write_failed_t write_failed;
        kvr_msg_release_t release;
        kvr_msg_chunk_done_t chunk_done;
        kvr_msg_join_t join;
        kvr_msg_stages_t stages;
        kvr_msg_notify_t notify;
    } u;
    void *priv_arena;
} kvr_msg_t;

/* Zeroes msg and sets type and defaults (deadlines, protocol version). */
void kvr_msg_init(kvr_msg_t *msg, kvr_msg_type_t type);
/* Frees what kvr_wire_decode allocated and zeroes msg (no dangling array
 * pointers); accepts NULL. */
void kvr_msg_free(kvr_msg_t *msg);

/* Frame size of msg after validating every field, cap and range. */
kvr_status_t kvr_wire_encoded_size(const kvr_msg_t *msg, size_t *len,
                                   kvr_error_t *err);
/* Encodes one frame into buf; KVR_ERR_BUFFER_SMALL when cap is short (buf
 * untouched). */
kvr_status_t kvr_wire_encode(const kvr_msg_t *msg, void *buf, size_t cap,
                             size_t *len, kvr_error_t *err);
/* Same into a malloc'ed buffer the caller frees. */
kvr_status_t kvr_wire_encode_alloc(const kvr_msg_t *msg, uint8_t **out,
                                   size_t *len, kvr_error_t *err);
/* Decodes exactly one frame of len bytes (trailing bytes are an error).
 * KVR_ERR_PROTO (malformed; the message names the field), KVR_ERR_VERSION
 * (other major version), KVR_ERR_WIRE_LIMIT (a count above its cap). On
 * failure nothing is allocated and out is untouched. */
kvr_status_t kvr_wire_decode(const void *buf, size_t len, kvr_msg_t *out,
                             kvr_error_t *err);

typedef struct kvr_wire_header {
    uint8_t major, minor;
    uint16_t type;   /* not checked: may be a type this side does not know */
    uint32_t length; /* payload bytes */
} kvr_wire_header_t;

/* Stream helper: how many bytes the frame starting at buf needs in total.
 * With len < KVR_WIRE_HEADER_BYTES, *need is KVR_WIRE_HEADER_BYTES; otherwise
 * magic, major version and the payload cap are checked, *need is header plus
 * payload, and hdr (may be NULL) is filled. */
kvr_status_t kvr_wire_frame_need(const void *buf, size_t len, size_t *need,
                                 kvr_wire_header_t *hdr, kvr_error_t *err);

/* ---- Handshake ---- */

/* Fills a HELLO from this side's configuration: protocol version, side, topo,
 * layout, the region classes of `regions` (STAGING excluded), their digest
 * (kvr_layout_digest) and a fresh random nonce. has_key is false; set it when
 * a pre-shared key is configured. */
kvr_status_t kvr_wire_hello_init(kvr_msg_hello_t *hello, kvr_wire_side_t side,
                                 const kvr_wire_topo_t *topo,
                                 const kvr_layout_t *lay,
                                 const kvr_region_desc_t *regions,
                                 size_t num_regions, kvr_error_t *err);

/* The HELLO (or HELLO_ACK) a side with a pre-shared key sends before AUTH:
 * version, side, has_key and nonce of `full`, every topology and layout
 * field zero. The full HELLO follows as LAYOUT once the peer authenticated,
 * so nothing about the layout reaches an unauthenticated peer. */
void kvr_wire_hello_blank(const kvr_msg_hello_t *full, kvr_msg_hello_t *out);

/* The checks of kvr_wire_hello_check that need no layout (version, side,
 * key on both sides or neither): what a keyed side checks at HELLO. */
kvr_status_t kvr_wire_hello_check_intro(const kvr_msg_hello_t *ours,
                                        const kvr_msg_hello_t *peer,
                                        kvr_wire_side_t peer_side,
                                        kvr_error_t *err);

/* Compares our HELLO with the peer's: KVR_ERR_VERSION (major differs),
 * KVR_ERR_PEER_ROLE (peer is not peer_side), KVR_ERR_AUTH (only one side has
 * a key), KVR_ERR_PROTO (peer's ranks out of range), KVR_ERR_LAYOUT_MISMATCH
 * naming the first raw field that differs with both values, then the first
 * setting ("settings differ: requests=4 vs requests=2 (here vs peer)"). A
 * producer may lack a region class the consumer holds (a PP stage with no
 * index layer); every class it holds must be the consumer's. */
kvr_status_t kvr_wire_hello_check(const kvr_msg_hello_t *ours,
                                  const kvr_msg_hello_t *peer,
                                  kvr_wire_side_t peer_side, kvr_error_t *err);

/* A random non-zero 64-bit write nonce (libsodium randombytes); 0, never a
 * nonce, when kvr_init() fails (kvr_conn_create fails first then). */
uint64_t kvr_wire_random_nonce(void);

/* ---- Pre-shared key authentication ---- */

/* Parses 64 hex digits (surrounding whitespace allowed) into a key. */
kvr_status_t kvr_wire_key_parse(const char *text, size_t len,
                                uint8_t key[KVR_WIRE_KEY_BYTES],
                                kvr_error_t *err);
/* Reads and parses a key file (KVR_ERR_IO when unreadable). */
kvr_status_t kvr_wire_key_load(const char *path,
                               uint8_t key[KVR_WIRE_KEY_BYTES],
                               kvr_error_t *err);

/* One connection's handshake state: the two HELLO frames as sent, the key,
 * and whether the peer authenticated. */
typedef struct kvr_wire_auth kvr_wire_auth_t;

/* key may be NULL (no pre-shared key: no AUTH exchanged). */
kvr_status_t kvr_wire_auth_create(const uint8_t *key, kvr_wire_auth_t **out,
                                  kvr_error_t *err);
/* Wipes the key; accepts NULL. */
void kvr_wire_auth_destroy(kvr_wire_auth_t *auth);
bool kvr_wire_auth_has_key(const kvr_wire_auth_t *auth);

/* Records a HELLO or HELLO_ACK frame, the exact bytes sent (ours) or
 * received. The initiator sends HELLO, the acceptor answers HELLO_ACK. */
kvr_status_t kvr_wire_auth_note_hello(kvr_wire_auth_t *auth, const void *frame,
                                      size_t len, bool ours, kvr_error_t *err);
/* Our AUTH: HMAC-SHA256 over the version label, our role and initiator
 * bytes, the HELLO and the HELLO_ACK frames. Needs the key and both frames. */
kvr_status_t kvr_wire_auth_sign(const kvr_wire_auth_t *auth,
                                kvr_msg_auth_t *out, kvr_error_t *err);
/* Verifies the peer's AUTH in constant time; opens the gate on success. A
 * failure is final for this connection. */
kvr_status_t kvr_wire_auth_verify(kvr_wire_auth_t *auth,
                                  const kvr_msg_auth_t *msg, kvr_error_t *err);
/* True once the peer's AUTH verified (then our LAYOUT may go out). */
bool kvr_wire_auth_verified(const kvr_wire_auth_t *auth);
/* Records the peer's LAYOUT (keyed sessions, after its AUTH verified). Its
 * side, has_key and nonce must be those of the peer's HELLO. Compare it
 * with kvr_wire_hello_check first. */
kvr_status_t kvr_wire_auth_note_layout(kvr_wire_auth_t *auth,
                                       const kvr_msg_hello_t *layout,
                                       kvr_error_t *err);
/* True once both HELLOs are noted and, with a key, the peer authenticated
 * and its LAYOUT was noted. */
bool kvr_wire_auth_ready(const kvr_wire_auth_t *auth);

/* Call before handling any decoded message of `type` from the peer. BYE is
 * always accepted; HELLO/HELLO_ACK until the peer's HELLO is noted; AUTH
 * only with a key, after both HELLOs, once; LAYOUT only with a key, after
 * the peer's AUTH verified, once; anything else only when
 * kvr_wire_auth_ready (KVR_ERR_AUTH before authentication, KVR_ERR_PROTO
 * before the HELLO exchange or the LAYOUT). */
kvr_status_t kvr_wire_gate(const kvr_wire_auth_t *auth, kvr_msg_type_t type,
                           kvr_error_t *err);

/* ---- Session framing and MAC (docs/PROTOCOL.md "Session MAC") ----
 *
 * With a key, every frame a side sends after its own AUTH is followed by a
 * KVR_WIRE_TAG_BYTES tag: HMAC-SHA512-256 under a key for that direction
 * (derived from the pre-shared key and both HELLO frames) over a 64-bit
 * sequence number of the direction and the frame. The header's length
 * counts the payload only. Without a key nothing changes. */

/* The largest frame (header, payload, tag) accepted now: a HELLO frame
 * until the peer authenticated (keyless: until both HELLOs are noted), so
 * an unauthenticated peer cannot make a reader buffer more. */
size_t kvr_wire_session_frame_max(const kvr_wire_auth_t *auth);
/* kvr_wire_frame_need for this connection: also refuses a frame above
 * kvr_wire_session_frame_max at its header (KVR_ERR_WIRE_LIMIT), and counts
 * the tag in *need once the peer's AUTH verified. Call it for a frame only
 * after handling the one before (an AUTH changes the framing). */
kvr_status_t kvr_wire_session_need(const kvr_wire_auth_t *auth, const void *buf,
                                   size_t len, size_t *need,
                                   kvr_wire_header_t *hdr, kvr_error_t *err);
/* Call with every frame this side sends, in order, before sending it:
 * *tag_len is KVR_WIRE_TAG_BYTES with the tag to send right after the
 * frame, or 0 (no key; our AUTH and the frames before it). */
kvr_status_t kvr_wire_seal(kvr_wire_auth_t *auth, const void *frame, size_t len,
                           uint8_t tag[KVR_WIRE_TAG_BYTES], size_t *tag_len,
                           kvr_error_t *err);
/* Call with every frame received, in order, as kvr_wire_session_need
 * counted it: verifies and strips the tag; *frame_len is the frame without
 * it. A frame that does not verify (tampered, reordered, replayed, a frame
 * missing before it, truncated) is KVR_ERR_AUTH naming the frame, and final:
 * the session refuses everything after it. */
kvr_status_t kvr_wire_open(kvr_wire_auth_t *auth, const void *buf, size_t len,
                           size_t *frame_len, kvr_error_t *err);

KVR_API_END
#ifdef __cplusplus
}
#endif
#endif
