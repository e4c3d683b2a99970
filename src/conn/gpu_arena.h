/* Device memory for the regions an agent allocates itself
 * (kvr_agent_alloc_region), carved from a few large allocations rather
 * than one allocation a region. A producer stage writes a decode rank's
 * pages through a CUDA IPC mapping of the allocation that holds them, and
 * on an H200 scattered pages written through the mapping of an allocation
 * whose size is not a multiple of 64 KiB (one region's exact size) ran at
 * 0.57-0.69 of the rate of the same writes through a mapping of a rounded
 * or a large one (docs/performance.md, runs 2026-12-02n and o): chunks
 * and carves are whole multiples of the path's alignment (2 MiB on CUDA),
 * and fewer allocations mean fewer mappings. Regions live as long as their
 * agent: chunks are freed together when it is destroyed. Callers
 * serialise (the agent's turn lock). */
#ifndef KVRELAY_CONN_GPU_ARENA_H
#define KVRELAY_CONN_GPU_ARENA_H

#include <stddef.h>
#include <stdint.h>

#include "kvrelay/status.h"

typedef struct kvr__gpu_chunk {
    void *base;
    uint64_t size, used;
} kvr__gpu_chunk_t;

typedef struct kvr__gpu_arena {
    kvr__gpu_chunk_t *chunks;
    size_t n;
    uint64_t chunk; /* a new chunk's bytes; 0: one allocation a region */
    uint64_t align; /* regions start this far apart */
} kvr__gpu_arena_t;

/* An empty arena with the GPU path's chunks and alignment
 * (kvr__gpu_chunking); a caller may set ar->chunk after (0: an allocation
 * a region, its size still rounded up to ar->align: not the exact sizes
 * of before the arena). */
void kvr__gpu_arena_init(kvr__gpu_arena_t *ar);
/* len bytes on `device`, aligned as ar->align, at the end of the last
 * chunk when they fit there, else in a new chunk of ar->chunk bytes (or
 * of len, rounded up, when larger). */
kvr_status_t kvr__gpu_arena_alloc(kvr__gpu_arena_t *ar, int device,
                                  uint64_t len, void **out, kvr_error_t *err);
/* Gives back the last carve (ptr, len), after a region failed to come up;
 * anything else stays until kvr__gpu_arena_free. */
void kvr__gpu_arena_undo(kvr__gpu_arena_t *ar, const void *ptr, uint64_t len);
void kvr__gpu_arena_free(kvr__gpu_arena_t *ar);

#endif
