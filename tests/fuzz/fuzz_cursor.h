/* A fuzz input read as a stream of small numbers (shared by the targets). */
#ifndef KVR_FUZZ_CURSOR_H
#define KVR_FUZZ_CURSOR_H

#include <stddef.h>
#include <stdint.h>

typedef struct {
    const uint8_t *p;
    size_t n;
} cursor_t;

/* The next byte modulo mod; 0 once the input is used up (or mod is 0). */
static inline uint32_t take(cursor_t *c, uint32_t mod)
{
    if (c->n == 0 || mod == 0)
        return 0;
    uint32_t v = *c->p++;
    c->n--;
    return v % mod;
}

/* Eight bytes, big-end first: anywhere in u64. */
static inline uint64_t take_u64(cursor_t *c)
{
    uint64_t v = 0;
    for (int i = 0; i < 8; i++)
        v = v << 8 | take(c, 256);
    return v;
}

/* A count as a peer may send it: mostly `small`, else anywhere in u64, next
 * to 2^64, or next to a power of two (where N + bs - 1 wraps). */
static inline uint64_t take_count(cursor_t *c, uint64_t small)
{
    switch (take(c, 8)) {
    case 0:
        return take_u64(c);
    case 1:
        return UINT64_MAX - take(c, 256);
    case 2:
        return (1ull << take(c, 64)) + take(c, 3) - 1;
    default:
        return small;
    }
}

#endif
