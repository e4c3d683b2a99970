/* Regions' device memory in large chunks (gpu_arena.h). */
#include "gpu_arena.h"

#include <stdlib.h>
#include <string.h>

#include "gpu_path.h"

/* The bytes a region of len takes: up to the next region's start. */
static uint64_t carve_bytes(const kvr__gpu_arena_t *ar, uint64_t len)
{
    uint64_t a = ar->align, x = len > 0 ? len : 1;
    return (x + a - 1) / a * a;
}

static kvr_status_t add_chunk(kvr__gpu_arena_t *ar, int device, uint64_t size,
                              kvr_error_t *err)
{
    kvr__gpu_chunk_t *c = realloc(ar->chunks, (ar->n + 1) * sizeof(*c));
    if (c == NULL)
        return kvr_error_set(err, KVR_ERR_NO_MEMORY, "no memory");
    ar->chunks = c;
    void *base = NULL;
    kvr_status_t st = kvr__gpu_alloc(device, size, &base, err);
    if (st == KVR_OK)
        c[ar->n++] = (kvr__gpu_chunk_t){base, size, 0};
    return st;
}

void kvr__gpu_arena_init(kvr__gpu_arena_t *ar)
{
    memset(ar, 0, sizeof(*ar));
    kvr__gpu_chunking(&ar->chunk, &ar->align);
}

kvr_status_t kvr__gpu_arena_alloc(kvr__gpu_arena_t *ar, int device,
                                  uint64_t len, void **out, kvr_error_t *err)
{
    if (len > UINT64_MAX - ar->align)
        return kvr_error_set(err, KVR_ERR_INVALID,
                             "a device region of %llu bytes",
                             (unsigned long long)len);
    uint64_t need = carve_bytes(ar, len);
    kvr__gpu_chunk_t *last = ar->n > 0 ? &ar->chunks[ar->n - 1] : NULL;
    if (last == NULL || last->size - last->used < need) {
        kvr_status_t st =
            add_chunk(ar, device, need > ar->chunk ? need : ar->chunk, err);
        if (st != KVR_OK)
            return st;
        last = &ar->chunks[ar->n - 1];
    }
    *out = (unsigned char *)last->base + last->used;
    last->used += need;
    return KVR_OK;
}

void kvr__gpu_arena_undo(kvr__gpu_arena_t *ar, const void *ptr, uint64_t len)
{
    kvr__gpu_chunk_t *last = ar->n > 0 ? &ar->chunks[ar->n - 1] : NULL;
    uint64_t need = carve_bytes(ar, len);
    if (last != NULL && last->used >= need &&
        (const unsigned char *)last->base + last->used - need ==
            (const unsigned char *)ptr)
        last->used -= need;
}

void kvr__gpu_arena_free(kvr__gpu_arena_t *ar)
{
    for (size_t i = 0; i < ar->n; i++)
        kvr__gpu_free(ar->chunks[i].base);
    free(ar->chunks);
    ar->chunks = NULL;
    ar->n = 0;
}
