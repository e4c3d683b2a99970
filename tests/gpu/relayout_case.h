/* Random relayout cases and their expected destination images, built token by
 * token and byte by byte from layout_math.h (independently of the pieces the
 * gpu layer moves). */
#ifndef KVRELAY_GPU_RELAYOUT_CASE_H
#define KVRELAY_GPU_RELAYOUT_CASE_H

#include "gpu_test.h"

typedef struct relayout_case {
    kvr_layout_t lay;
    kvr_region_desc_t src, dst;
    kvr_gpu_request_t req;
    uint32_t *src_blocks, *dst_blocks;
    unsigned char *src_img; /* the producer region */
    uint64_t src_bytes, dst_bytes;
} relayout_case_t;

typedef struct case_shape {
    kvr_role_t role;
    uint32_t bs, W, I;
    int replicate, preshuffle;
    uint64_t unit; /* token bytes (MLA, DENSE, ...) or index D */
    uint64_t tokens;
    uint64_t computed; /* num_computed_blocks */
} case_shape_t;

/* The shape's layout (tp = producer_tp = W), and a producer or consumer
 * region of `blocks` pages. */
kvr_layout_t case_layout(const case_shape_t *s);
kvr_region_desc_t case_region(const case_shape_t *s, int consumer,
                              uint64_t blocks);
/* The ids below `range` in random order. */
uint32_t *case_random_ids(uint64_t *rng, uint64_t range);

/* Random block tables (non-contiguous, spare entries past the end) and a
 * random producer region for the shape. */
void case_make(relayout_case_t *c, const case_shape_t *shape, uint64_t *rng);
void case_free(relayout_case_t *c);

/* A random valid shape: role, bs, W, I, widths, tokens, incremental. */
case_shape_t case_random_shape(uint64_t *rng);

/* Writes into dst_img (a consumer region, other bytes untouched) every byte
 * rank `rank` must hold after the transfer. */
void case_expect(const relayout_case_t *c, uint32_t rank,
                 unsigned char *dst_img);

/* Fills a region image with a poison pattern that no source byte run
 * matches by chance. */
void case_poison(unsigned char *img, uint64_t bytes, uint32_t salt);

const char *case_name(const case_shape_t *s, char *buf, size_t n);

#endif
