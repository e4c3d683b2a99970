/* Internals of the base layer that every layer above may use: byte order. */
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

#endif
