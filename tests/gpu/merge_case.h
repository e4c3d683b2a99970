/* Several requests of one class for kvr_gpu_scatter_requests, as a serving
 * stage holds them: every request's pages in one producer region a layer
 * and one consumer region a (layer, rank), each request its own stretch of
 * the pools' pages in random order, spare pages left untouched. Expected
 * images from the host reference, request by request. */
#ifndef KVRELAY_GPU_MERGE_CASE_H
#define KVRELAY_GPU_MERGE_CASE_H

#include "relayout_case.h"

typedef struct merge_case {
    uint32_t nreq, layers, W;
    kvr_gpu_relayout_t **rls; /* per request */
    uint64_t src_bytes, dst_bytes;
    unsigned char **src_img; /* per layer */
    unsigned char **expect;  /* per layer * W + rank */
    unsigned char *poison;   /* every consumer region before */
} merge_case_t;

/* nreq requests of shape s (its tokens and computed blocks unused) of
 * tokens[i] tokens each, over `layers` layers. */
void merge_make(merge_case_t *m, const case_shape_t *s, const uint64_t *tokens,
                uint32_t nreq, uint32_t layers, uint64_t *rng);
void merge_free(merge_case_t *m);

/* Every (request, layer, rank) slot, request-major as one launch a
 * request gives them (not the region-major order the call runs): src[l]
 * is layer l's producer region, dst[l * W + r] the consumer region of
 * layer l on rank r. Sets *n. */
kvr_gpu_scatter_slot_t *merge_slots(const merge_case_t *m,
                                    const void *const *src, void *const *dst,
                                    size_t *n);

#endif
