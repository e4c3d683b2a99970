/* Consumer staging pool: fixed-size slots handed out with back-pressure.
 * A waiter sleeps on a condition variable until slots come back or its
 * deadline passes; nothing spins. */
#include <pthread.h>
#include <stdlib.h>
#include <time.h>

#include "xfer_internal.h"

struct kvr_staging_pool {
    pthread_mutex_t lock;
    pthread_cond_t freed;
    uint32_t num_slots;
    uint64_t slot_bytes;
    uint32_t num_free;
    uint32_t *free_list; /* stack of free slot indices */
    bool *in_use;        /* catches double releases */
};

kvr_status_t kvr_staging_pool_create(uint32_t num_slots, uint64_t slot_bytes,
                                     kvr_staging_pool_t **out)
{
    if (num_slots == 0 || slot_bytes == 0 || out == NULL)
        return KVR_ERR_INVALID;
    kvr_staging_pool_t *pool = calloc(1, sizeof(*pool));
    if (pool == NULL)
        return KVR_ERR_NO_MEMORY;
    pool->free_list = calloc(num_slots, sizeof(*pool->free_list));
    pool->in_use = calloc(num_slots, sizeof(*pool->in_use));
    pthread_condattr_t attr;
    if (pool->free_list == NULL || pool->in_use == NULL ||
        pthread_condattr_init(&attr) != 0)
        goto free_arrays;
    pthread_condattr_setclock(&attr, CLOCK_MONOTONIC);
    int rc = pthread_cond_init(&pool->freed, &attr);
    pthread_condattr_destroy(&attr);
    if (rc != 0)
        goto free_arrays;
    if (pthread_mutex_init(&pool->lock, NULL) != 0)
        goto destroy_cond;
    pool->num_slots = pool->num_free = num_slots;
    pool->slot_bytes = slot_bytes;
    for (uint32_t i = 0; i < num_slots; i++)
        pool->free_list[i] = num_slots - 1 - i; /* slot 0 is handed out first */
    *out = pool;
    return KVR_OK;
destroy_cond:
    pthread_cond_destroy(&pool->freed);
free_arrays:
    free(pool->in_use);
    free(pool->free_list);
    free(pool);
    return KVR_ERR_NO_MEMORY;
}

void kvr_staging_pool_destroy(kvr_staging_pool_t *pool)
{
    if (pool == NULL)
        return;
    pthread_mutex_destroy(&pool->lock);
    pthread_cond_destroy(&pool->freed);
    free(pool->in_use);
    free(pool->free_list);
    free(pool);
}

kvr_status_t kvr_staging_acquire(kvr_staging_pool_t *pool, uint32_t min,
                                 uint32_t max, uint64_t deadline_ns,
                                 uint32_t *slots, uint32_t *num_granted)
{
    if (pool == NULL || slots == NULL || num_granted == NULL || min == 0 ||
        min > max || min > pool->num_slots)
        return KVR_ERR_INVALID;
    struct timespec ts = {.tv_sec = (time_t)(deadline_ns / 1000000000u),
                          .tv_nsec = (long)(deadline_ns % 1000000000u)};
    kvr_status_t st = KVR_OK;
    pthread_mutex_lock(&pool->lock);
    while (pool->num_free < min && st == KVR_OK)
        if (pthread_cond_timedwait(&pool->freed, &pool->lock, &ts) != 0 &&
            pool->num_free < min && kvr_now_ns() >= deadline_ns)
            st = KVR_ERR_NO_SPACE;
    uint32_t n = 0;
    while (st == KVR_OK && n < max && pool->num_free > 0) {
        uint32_t s = pool->free_list[--pool->num_free];
        pool->in_use[s] = true;
        slots[n++] = s;
    }
    pthread_mutex_unlock(&pool->lock);
    if (st == KVR_OK)
        *num_granted = n;
    return st;
}

void kvr_staging_release(kvr_staging_pool_t *pool, const uint32_t *slots,
                         uint32_t n)
{
    if (pool == NULL || slots == NULL)
        return;
    pthread_mutex_lock(&pool->lock);
    for (uint32_t i = 0; i < n; i++) {
        uint32_t s = slots[i];
        if (s < pool->num_slots && pool->in_use[s]) {
            pool->in_use[s] = false;
            pool->free_list[pool->num_free++] = s;
        }
    }
    pthread_cond_broadcast(&pool->freed);
    pthread_mutex_unlock(&pool->lock);
}

uint32_t kvr_staging_free_slots(kvr_staging_pool_t *pool)
{
    if (pool == NULL)
        return 0;
    pthread_mutex_lock(&pool->lock);
    uint32_t n = pool->num_free;
    pthread_mutex_unlock(&pool->lock);
    return n;
}
