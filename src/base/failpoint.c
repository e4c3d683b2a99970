/* Failpoints (docs/failpoints.md). A bit per failpoint says whether it is
 * armed, so a check costs one atomic load while nothing is armed; the keys
 * are read and written under a lock, so arming from one thread while
 * another checks is safe. */
#include <pthread.h>
#include <stdatomic.h>
#include <string.h>
#include <unistd.h>

#include "base_internal.h"

static const char *const names[KVR__FP_COUNT] = {
#define KVR__FP_NAME(id, name) [KVR__FP_##id] = name,
    KVR__FAILPOINTS(KVR__FP_NAME)
#undef KVR__FP_NAME
};

_Static_assert(KVR__FP_COUNT <= 32, "one bit per failpoint in `armed`");

static atomic_uint armed;
static pthread_mutex_t lock = PTHREAD_MUTEX_INITIALIZER;
static char keys[KVR__FP_COUNT][KVR_FAILPOINT_KEY_MAX]; /* "": every key */

const char *kvr_failpoint_name(uint32_t i)
{
    return i < KVR__FP_COUNT ? names[i] : NULL;
}

kvr_status_t kvr_failpoint_arm(const char *name, const char *key,
                               kvr_error_t *err)
{
    size_t len = key ? strlen(key) : 0;
    if (len >= KVR_FAILPOINT_KEY_MAX)
        return kvr_error_set(err, KVR_ERR_INVALID,
                             "failpoint key of %zu bytes, at most %d", len,
                             KVR_FAILPOINT_KEY_MAX - 1);
    for (uint32_t i = 0; name != NULL && i < KVR__FP_COUNT; i++) {
        if (strcmp(name, names[i]) != 0)
            continue;
        pthread_mutex_lock(&lock);
        memcpy(keys[i], key ? key : "", len + 1);
        atomic_fetch_or(&armed, 1u << i);
        pthread_mutex_unlock(&lock);
        return KVR_OK;
    }
    return kvr_error_set(err, KVR_ERR_NOT_FOUND,
                         "no failpoint named '%s' (docs/failpoints.md)",
                         name ? name : "(null)");
}

void kvr_failpoint_disarm_all(void)
{
    atomic_store(&armed, 0u);
}

bool kvr__failpoint(kvr__fp_t fp, const void *key, size_t len)
{
    if ((atomic_load_explicit(&armed, memory_order_relaxed) >> fp & 1u) == 0)
        return false;
    pthread_mutex_lock(&lock);
    size_t n = strlen(keys[fp]);
    bool hit = (atomic_load(&armed) >> fp & 1u) &&
               (n == 0 || (n == len && memcmp(keys[fp], key, n) == 0));
    pthread_mutex_unlock(&lock);
    return hit;
}

_Noreturn void kvr__failpoint_exit(void)
{
    _exit(9);
}
