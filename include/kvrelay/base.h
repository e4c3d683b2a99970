/* kvrelay base layer, the lowest one: status codes and error detail
 * (kvrelay/status.h), the version, one-time library initialisation and the
 * clock every deadline is on. It depends on libc and libsodium only. */
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

KVR_API_END
#ifdef __cplusplus
}
#endif
#endif
