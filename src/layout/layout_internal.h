/* Host-side internals of the layout layer that the layers above share: the
 * region class rule and block-table ordering. (The layout formulas, usable
 * from CUDA too, are in layout_math.h.) */
#ifndef KVRELAY_LAYOUT_INTERNAL_H
#define KVRELAY_LAYOUT_INTERNAL_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "kvrelay/layout.h"

/* The class of region r of one side: the one rule the layout digest (plan)
 * and HELLO (wire) both follow, so that the classes a HELLO announces hash
 * to its digest. An INDEX region's quant_block 0 means Q == D. Token widths
 * are the side's page over its own block size (the producer's may differ,
 * docs/design.md §18). A head-sharded DENSE class (heads > 0) is its head
 * geometry, which both sides share: width = D | H << 32, quant = E |
 * planes << 32 | hnd << 40 | KVR__CLASS_HEADS_BIT. */
#define KVR__CLASS_HEADS_BIT (1ull << 63)
kvr_region_class_t kvr__class_of(const kvr_layout_t *lay,
                                 const kvr_region_desc_t *r, bool consumer);
/* A one-block consumer region of class k: kvr__class_of of it gives k
 * back. */
kvr_region_desc_t kvr__class_region(const kvr_layout_t *lay,
                                    const kvr_region_class_t *k);
/* Total order on classes (role, width, quant); a qsort comparator. */
int kvr__class_cmp(const void *a, const void *b);
/* The distinct classes of the n regions of one side, STAGING left out, in
 * that order; out has room for n. Returns how many. */
size_t kvr__distinct_classes(const kvr_layout_t *lay,
                             const kvr_region_desc_t *regions, size_t n,
                             bool consumer, kvr_region_class_t *out);

/* A block id and its index in the block table. */
typedef struct {
    uint32_t id;
    uint32_t index;
} kvr__id_index_t;

/* out[s] for s < n: the entries table[first + i] in ascending id order,
 * each with its table index first + i (equal ids end up next to each
 * other, in no particular order). */
void kvr__sort_ids(const uint32_t *table, uint32_t first, size_t n,
                   kvr__id_index_t *out);

#endif
