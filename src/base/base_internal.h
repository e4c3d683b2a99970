/* Internals of the base layer that every layer above may use: byte order
 * and the failpoint checks. */
#ifndef KVRELAY_BASE_INTERNAL_H
#define KVRELAY_BASE_INTERNAL_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "kvrelay/base.h"

/* Little-endian: the byte order of everything kvrelay hashes or puts on the
 * wire, whatever the host's. n is 1..8 bytes. */
static inline void kvr__put_le(void *p, uint64_t v, size_t n)
{
    unsigned char *b = p;
    for (size_t i = 0; i < n; i++)
        b[i] = (unsigned char)(v >> (8 * i));
}

static inline uint64_t kvr__get_le(const void *p, size_t n)
{
    const unsigned char *b = p;
    uint64_t v = 0;
    for (size_t i = 0; i < n; i++)
        v |= (uint64_t)b[i] << (8 * i);
    return v;
}

/* Every failpoint: X(ID, name). docs/failpoints.md says where each sits and
 * what it does; kvr_failpoint_arm takes the name. */
#define KVR__FAILPOINTS(X)                                                     \
    X(DIE_MID, "die-mid")                                                      \
    X(REFUSE, "refuse")                                                        \
    X(WRONG_NONCE, "wrong-nonce")                                              \
    X(DUP_DONE, "dup-done")                                                    \
    X(BAD_BLOCKS, "bad-blocks")                                                \
    X(DIE_ASSIGN, "die-assign")                                                \
    X(REFUSE_OFFER, "refuse-offer")                                            \
    X(STORE_ENOSPC, "store-enospc")                                            \
    X(STORE_NO_ODIRECT, "store-no-odirect")                                    \
    X(SLOW_PROBE, "slow-probe")

/* clang-format off */
typedef enum {
#define KVR__FP_ENUM(id, name) KVR__FP_##id,
    KVR__FAILPOINTS(KVR__FP_ENUM)
#undef KVR__FP_ENUM
    KVR__FP_COUNT
} kvr__fp_t;
/* clang-format on */

/* true when failpoint fp is armed for this key (the key bytes of a request
 * id) or for every key. Costs one atomic load while nothing is armed. */
bool kvr__failpoint(kvr__fp_t fp, const void *key, size_t len);
/* Ends the process as a kill would: exit status 9 at once, no atexit
 * handlers, no flushing. What a failpoint that plays a dead process does. */
_Noreturn void kvr__failpoint_exit(void);

#endif
