/* Region classes and block-table ordering, shared by plan, wire and gpu. */
#include <stdbool.h>
#include <stdlib.h>

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

void kvr__sort_ids(const uint32_t *table, uint32_t first, size_t n,
                   kvr__id_index_t *out)
{
    bool sorted = true;
    for (size_t i = 0; i < n; i++) {
        out[i] = (kvr__id_index_t){table[first + i], first + (uint32_t)i};
        sorted &= i == 0 || out[i - 1].id < out[i].id;
    }
    if (!sorted) /* tables are mostly ascending already: skip the sort */
        qsort(out, n, sizeof(*out), cmp_id);
}
