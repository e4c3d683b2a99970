/* kvrelay base layer, the lowest one: status codes and error detail
 * (kvrelay/status.h), the version, one-time library initialisation, the
 * clock every deadline is on and failpoints for tests. It depends on libc
 * and libsodium only. */
#ifndef KVRELAY_BASE_H
#define KVRELAY_BASE_H

#include <stdint.h>

#include "kvrelay/status.h"

#ifdef __cplusplus
extern "C" {
#endif
KVR_API_BEGIN

/* The library version, e.g. "0.1.0". */
const char *kvr_version(void);

/* One-time initialisation (libsodium). Every kvrelay function that needs it
 * calls it, so calling it is optional; an engine may call it first to learn
 * early. Safe from any thread; KVR_ERR_INIT if libsodium cannot start (no
 * randomness source), on every call. */
kvr_status_t kvr_init(kvr_error_t *err);

/* Deadlines are absolute CLOCK_MONOTONIC nanoseconds on this host (they are
 * comparable across processes of one host); they never cross the wire, which
 * carries relative milliseconds. */
uint64_t kvr_now_ns(void);
/* kvr_now_ns() + timeout_ms. */
uint64_t kvr_deadline_ns(uint32_t timeout_ms);

/* ---- failpoints (docs/failpoints.md) ------------------------------------
 * Named places where kvrelay fails on purpose, for tests and for
 * `kvrelay demo|serve|push --fault`. All are off until armed. Arming is
 * process-wide; arming and the checks are safe from any thread. */

/* Longest key a failpoint is armed with, terminator included: a request
 * id, or a store chunk file name (KVR_STORE_NAME_MAX). */
#define KVR_FAILPOINT_KEY_MAX 128

/* Arms failpoint `name` for the request whose id is `key` ("" or NULL: for
 * every request). KVR_ERR_NOT_FOUND for an unknown name, KVR_ERR_INVALID for
 * a key of KVR_FAILPOINT_KEY_MAX bytes or more. */
kvr_status_t kvr_failpoint_arm(const char *name, const char *key,
                               kvr_error_t *err);
/* Disarms every failpoint. */
void kvr_failpoint_disarm_all(void);
/* Name of failpoint i (0, 1, ...), NULL past the last. */
const char *kvr_failpoint_name(uint32_t i);

KVR_API_END
#ifdef __cplusplus
}
#endif
#endif
