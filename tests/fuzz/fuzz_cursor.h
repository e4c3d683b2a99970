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

#endif
