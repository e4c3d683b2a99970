/* kvrelay status codes: one list, stable numeric values (they cross the wire
 * and reach Python). Append only; never renumber. */
#ifndef KVRELAY_STATUS_H
#define KVRELAY_STATUS_H

#include <stdint.h>

/* libkvrelay.so exports what the public headers declare between
 * KVR_API_BEGIN and KVR_API_END and nothing else: the library is compiled
 * with -fvisibility=hidden (docs/architecture.md, "Exports"). */
#if defined(__GNUC__)
#define KVR_API_BEGIN _Pragma("GCC visibility push(default)")
#define KVR_API_END _Pragma("GCC visibility pop")
#else
#define KVR_API_BEGIN
#define KVR_API_END
#endif

#ifdef __cplusplus
extern "C" {
#endif
KVR_API_BEGIN

/* X(name, value, text) */
#define KVR_STATUS_MAP(X)                                                      \
    X(OK, 0, "success")                                                        \
    X(ERR_INVALID, 1, "invalid argument")                                      \
    X(ERR_NO_MEMORY, 2, "out of memory")                                       \
    X(ERR_INIT, 3, "library initialisation failed")                            \
    X(ERR_INTERLEAVE_LT1, 10, "interleave I < 1")                              \
    X(ERR_INTERLEAVE_GT_BS, 11, "interleave I > block size")                   \
    X(ERR_INTERLEAVE_NOT_DIVISOR, 12, "block size not a multiple of I")        \
    X(ERR_DCP_LT1, 13, "DCP size W < 1")                                       \
    X(ERR_TP_NOT_DIVISIBLE, 14, "TP size not a multiple of W")                 \
    X(ERR_RANK_RANGE, 15, "DCP rank out of range")                             \
    X(ERR_SRC_TABLE_SHORT, 16, "source block table too short")                 \
    X(ERR_DST_TABLE_SHORT, 17, "destination block table too short")            \
    X(ERR_INCREMENTAL, 18, "invalid incremental offset")                       \
    X(ERR_BLOCK_RANGE, 19, "block id outside the region")                      \
    X(ERR_PAGE_NOT_TOKENS, 20, "page bytes not a whole number of tokens")      \
    X(ERR_ROLE_MISMATCH, 21, "producer and consumer roles differ")             \
    X(ERR_INDEX_QUANT, 22, "index D/Q != 1")                                   \
    X(ERR_PRESHUFFLE_BS, 23, "preshuffled index needs bs % 16 == 0")           \
    X(ERR_SHARDED_INDEX_INTERLEAVE, 24, "sharded index needs I == bs")         \
    X(ERR_NOT_IMPLEMENTED, 25, "not implemented (DENSE under W > 1)")          \
    X(ERR_NO_RELAYOUT, 26, "no relayout exists for this role")                 \
    X(ERR_RUN_OUT_OF_BOUNDS, 27, "run outside the destination region")         \
    X(ERR_PAGE_GEOMETRY, 28, "page bytes do not match the region geometry")    \
    X(ERR_VERIFY, 29, "verification failed")                                   \
    X(ERR_BLOCK_SIZE, 30, "block size < 1")                                    \
    X(ERR_DUPLICATE_BLOCK, 31, "destination block id used twice")              \
    X(ERR_TRANSPORT, 40, "transport error")                                    \
    X(ERR_TIMEOUT, 41, "deadline passed")                                      \
    X(ERR_PEER_DEAD, 42, "peer closed or died")                                \
    X(ERR_NO_SPACE, 43, "staging space exhausted")                             \
    X(ERR_UNSUPPORTED, 44, "capability not available")                         \
    X(ERR_PROTO, 50, "malformed or unexpected message")                        \
    X(ERR_VERSION, 51, "protocol version mismatch")                            \
    X(ERR_AUTH, 52, "authentication failed")                                   \
    X(ERR_LAYOUT_MISMATCH, 53, "layout mismatch")                              \
    X(ERR_REFUSED, 54, "request refused by peer")                              \
    X(ERR_CANCELED, 55, "canceled")                                            \
    X(ERR_NOT_FOUND, 56, "not found")                                          \
    X(ERR_EXISTS, 57, "already exists")                                        \
    X(ERR_IO, 60, "I/O error")                                                 \
    X(ERR_CUDA, 70, "CUDA error")                                              \
    X(ERR_PEER_ROLE, 90, "peer has an unexpected role")                        \
    X(ERR_WIRE_LIMIT, 91, "message exceeds a protocol limit")                  \
    X(ERR_BUFFER_SMALL, 92, "output buffer too small")                         \
    X(ERR_TABLE_FULL, 100, "bookkeeping table full")                           \
    X(ERR_CHUNK_SIZE, 101, "offload chunk size 0 or not a multiple of bs * W") \
    X(ERR_PAIR_REQUIRED, 102, "several producer ranks: plan per pair")         \
    X(ERR_PRODUCER_INDEX_INTERLEAVE, 103,                                      \
      "sharded producer index needs I == bs")                                  \
    X(ERR_INDEX_NEEDS_REPLICATED, 104,                                         \
      "sharded producer needs a replicated consumer index")                    \
    X(ERR_DENSE_HEADS, 105, "kv heads and TP size do not divide")              \
    X(ERR_DENSE_NO_HEADS, 106, "dense reshard needs the head geometry")

typedef enum {
#define KVR__STATUS_ENUM(name, value, text) KVR_##name = value,
    KVR_STATUS_MAP(KVR__STATUS_ENUM)
#undef KVR__STATUS_ENUM
} kvr_status_t;

/* Short fixed text for a status; never NULL ("unknown status" for others). */
const char *kvr_status_str(kvr_status_t status);
/* Symbolic name without prefix, e.g. "ERR_BLOCK_RANGE"; NULL if unknown. */
const char *kvr_status_name(kvr_status_t status);

#define KVR_ERROR_MSG_MAX 256

/* Error detail for functions without a context object: code plus a message
 * naming the offending values. */
typedef struct kvr_error {
    kvr_status_t code;
    char msg[KVR_ERROR_MSG_MAX];
} kvr_error_t;

/* Fills err (if non-NULL) with code and a printf-style message; returns code. */
kvr_status_t kvr_error_set(kvr_error_t *err, kvr_status_t code, const char *fmt,
                           ...)
#if defined(__GNUC__)
    __attribute__((format(printf, 3, 4)))
#endif
    ;

KVR_API_END
#ifdef __cplusplus
}
#endif
#endif
