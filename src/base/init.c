/* Version, one-time initialisation and the clock. */
#include <pthread.h>
#include <sodium.h>
#include <time.h>

#include "kvrelay/base.h"

const char *kvr_version(void)
{
    return KVR_VERSION_STRING;
}

static pthread_once_t init_once = PTHREAD_ONCE_INIT;
static int sodium_rc = -1;

static void init_sodium(void)
{
    sodium_rc = sodium_init(); /* 0 started, 1 already started, -1 failed */
}

kvr_status_t kvr_init(kvr_error_t *err)
{
    /* pthread_once orders the write of sodium_rc before every reader */
    pthread_once(&init_once, init_sodium);
    if (sodium_rc < 0)
        return kvr_error_set(err, KVR_ERR_INIT,
                             "libsodium failed to initialise (sodium_init "
                             "returned %d): no randomness source?",
                             sodium_rc);
    return KVR_OK;
}

uint64_t kvr_now_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

uint64_t kvr_deadline_ns(uint32_t timeout_ms)
{
    return kvr_now_ns() + (uint64_t)timeout_ms * 1000000ull;
}
