/* Small test helpers for the gpu layer's tests. Plain C without cmocka: the
 * device tests must build and run on the GPU machine, which has none. */
#ifndef KVRELAY_GPU_TEST_H
#define KVRELAY_GPU_TEST_H

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>

#include "kvrelay/gpu.h"

#define CHECK(cond, ...)                                                       \
    do {                                                                       \
        if (!(cond)) {                                                         \
            fprintf(stderr, "%s:%d: CHECK(%s) failed: ", __FILE__, __LINE__,   \
                    #cond);                                                    \
            fprintf(stderr, __VA_ARGS__);                                      \
            fputc('\n', stderr);                                               \
            exit(1);                                                           \
        }                                                                      \
    } while (0)

/* Runs a kvr call that takes &err as its last argument and must succeed. */
#define CHECK_KVR(call)                                                        \
    do {                                                                       \
        kvr_error_t err = {0};                                                 \
        kvr_status_t st_ = (call);                                             \
        CHECK(st_ == KVR_OK, "%s: %s", kvr_status_str(st_), err.msg);          \
    } while (0)

/* splitmix64 */
static inline uint64_t rng_next(uint64_t *s)
{
    uint64_t z = (*s += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

static inline uint32_t rng_below(uint64_t *s, uint32_t n)
{
    return n ? (uint32_t)(rng_next(s) % n) : 0;
}

static inline void rng_fill(uint64_t *s, void *buf, size_t n)
{
    unsigned char *p = buf;
    for (size_t i = 0; i < n; i++)
        p[i] = (unsigned char)rng_next(s);
}

static inline void *xmalloc(size_t n)
{
    void *p = malloc(n ? n : 1);
    CHECK(p != NULL, "malloc(%zu)", n);
    return p;
}

#endif
