/* Region classes and block-table ordering, shared by plan, wire and gpu. */
#include <stdbool.h>
#include <stdlib.h>
#include <string.h>

#include "layout_internal.h"

static bool token_role(kvr_role_t role)
{
    return role == KVR_ROLE_MLA || role == KVR_ROLE_DENSE;
}

kvr_region_class_t kvr__class_of(const kvr_layout_t *lay,
                                 const kvr_region_desc_t *r, bool consumer)
{
    kvr_region_class_t k = {r->role, r->page_bytes, 0};
    uint64_t planes = r->kv_planes ? r->kv_planes : 2;
    if (r->role == KVR_ROLE_DENSE && r->heads != 0) {
        k.width = r->head_dim | (uint64_t)r->heads << 32;
        k.quant = r->elem_bytes | planes << 32 | (uint64_t)r->hnd << 40 |
                  KVR__CLASS_HEADS_BIT;
    } else if (token_role(r->role)) {
        k.width = kvr_region_token_bytes_side(lay, r, consumer);
    } else if (r->role == KVR_ROLE_INDEX) {
        k.width = r->index_dim;
        k.quant = r->quant_block ? r->quant_block : r->index_dim;
    }
    return k;
}

kvr_region_desc_t kvr__class_region(const kvr_layout_t *lay,
                                    const kvr_region_class_t *k)
{
    kvr_region_desc_t r = {
        .role = k->role, .num_blocks = 1, .page_bytes = k->width};
    if (k->role == KVR_ROLE_DENSE && (k->quant & KVR__CLASS_HEADS_BIT)) {
        r.head_dim = (uint32_t)k->width;
        r.heads = (uint32_t)(k->width >> 32);
        r.elem_bytes = (uint32_t)k->quant;
        r.kv_planes = (uint32_t)(k->quant >> 32) & 0xff;
        r.hnd = (k->quant >> 40) & 1;
        r.page_bytes = kvr_dense_page_bytes(lay, &r, true);
    } else if (token_role(k->role)) {
        r.page_bytes = k->width * lay->block_size;
    } else if (k->role == KVR_ROLE_INDEX) {
        r.index_dim = (uint32_t)k->width;
        r.quant_block = (uint32_t)k->quant;
    }
    return r;
}

int kvr__class_cmp(const void *a, const void *b)
{
    const kvr_region_class_t *x = a, *y = b;
    if (x->role != y->role)
        return x->role < y->role ? -1 : 1;
    if (x->width != y->width)
        return x->width < y->width ? -1 : 1;
    return (x->quant > y->quant) - (x->quant < y->quant);
}

size_t kvr__distinct_classes(const kvr_layout_t *lay,
                             const kvr_region_desc_t *regions, size_t n,
                             bool consumer, kvr_region_class_t *out)
{
    size_t m = 0, distinct = 0;
    for (size_t i = 0; i < n; i++)
        if (regions[i].role != KVR_ROLE_STAGING)
            out[m++] = kvr__class_of(lay, &regions[i], consumer);
    qsort(out, m, sizeof(*out), kvr__class_cmp);
    for (size_t i = 0; i < m; i++)
        if (distinct == 0 || kvr__class_cmp(&out[distinct - 1], &out[i]) != 0)
            out[distinct++] = out[i];
    return distinct;
}

static int cmp_id(const void *a, const void *b)
{
    const kvr__id_index_t *x = a, *y = b;
    return (x->id > y->id) - (x->id < y->id);
}

/* One stable counting pass on byte `shift / 8` of the ids, from `in` into
 * `out`; false (and nothing moved) when every id has the same byte there. */
static bool radix_pass(const kvr__id_index_t *in, kvr__id_index_t *out,
                       size_t n, unsigned shift)
{
    size_t count[257] = {0};
    for (size_t i = 0; i < n; i++)
        count[((in[i].id >> shift) & 0xff) + 1]++;
    for (int d = 0; d < 256; d++)
        if (count[d + 1] == n)
            return false;
    for (int d = 0; d < 256; d++)
        count[d + 1] += count[d];
    for (size_t i = 0; i < n; i++)
        out[count[(in[i].id >> shift) & 0xff]++] = in[i];
    return true;
}

/* A 4096-entry destination table took qsort about 0.3 ms, more than the
 * GPU needs to move a million tokens (docs/gpu.md, Relayout kernel speed):
 * ids are 32-bit, so a least-significant-byte radix sort, O(n) a byte,
 * skipping the bytes every id shares (the high ones, mostly). */
void kvr__sort_ids(const uint32_t *table, uint32_t first, size_t n,
                   kvr__id_index_t *out)
{
    bool sorted = true;
    for (size_t i = 0; i < n; i++) {
        out[i] = (kvr__id_index_t){table[first + i], first + (uint32_t)i};
        sorted &= i == 0 || out[i - 1].id < out[i].id;
    }
    if (sorted) /* tables are mostly ascending already: skip the sort */
        return;
    kvr__id_index_t *tmp = malloc(n * sizeof(*tmp));
    if (tmp == NULL) {
        qsort(out, n, sizeof(*out), cmp_id);
        return;
    }
    kvr__id_index_t *a = out, *b = tmp;
    for (unsigned shift = 0; shift < 32; shift += 8)
        if (radix_pass(a, b, n, shift)) {
            kvr__id_index_t *t = a;
            a = b;
            b = t;
        }
    if (a != out)
        memcpy(out, a, n * sizeof(*out));
    free(tmp);
}
