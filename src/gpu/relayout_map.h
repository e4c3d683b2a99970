/* Where each byte of a relayout goes, piece by piece, in consumer order.
 * Built on layout_math.h; static inline for host C (the reference executors)
 * and CUDA device code (the kernels), so both move the same pieces.
 *
 * A rank's share is cut into pieces, each one contiguous on the destination
 * and in the staging stream, and on the source made of chunks of `chunk`
 * bytes `stride` bytes apart. Pieces are numbered in stream
 * order: the s-th destination block by ascending block id (table index
 * order[s]) holds pieces [s * P, (s + 1) * P):
 *  - MLA: the rank's I-token chunks of that block, R at a time, R = bs/(I*W)
 *    when I*W divides bs (then P = W, one piece per source block: R chunks
 *    contiguous on the destination, I*W tokens apart on the source), else
 *    R = 1 (P = bs / I); empty past the rank's local length;
 *  - REPL: P = 2W, pieces 0..W-1 the key sub-planes, W..2W-1 the scale
 *    sub-planes of source pages b*W + q (empty past the last source page);
 *  - SEG: P = 1, the segment of source page b*W + rank (index sharded at
 *    I == bs) or b (whole pages, W == 1).
 * Every destination block carries `full` stream bytes except the request's
 * last one, which may carry fewer; stream offsets follow in closed form. */
#ifndef KVRELAY_GPU_RELAYOUT_MAP_H
#define KVRELAY_GPU_RELAYOUT_MAP_H

#include <stdint.h>

#include "layout_math.h"

enum { KVR__RL_MLA = 1, KVR__RL_REPL = 2, KVR__RL_SEG = 3 };

typedef struct kvr__rl_geom {
    const uint32_t *src_blocks; /* host or device copy of the full tables */
    const uint32_t *dst_blocks;
    const uint32_t *order; /* table indices [first_dst, end) by dst id */
    uint64_t num_tokens;
    uint64_t unit; /* MLA token bytes, REPL D, SEG segment bytes */
    uint64_t src_page;
    uint64_t dst_page;
    uint32_t kind;
    uint32_t bs, W, I;
    uint32_t preshuffle;
    uint32_t first_dst;  /* k */
    uint32_t num_blocks; /* destination blocks of the request from k */
    uint32_t end_src;    /* ceil(N / bs) */
    uint32_t s_last;     /* sorted position of the last block */
} kvr__rl_geom_t;

typedef struct kvr__rl_piece {
    uint64_t src;    /* offset in the producer region of the first chunk */
    uint64_t dst;    /* offset in the rank's consumer region */
    uint64_t stream; /* offset in the rank's staging stream */
    uint64_t len;    /* 0: empty piece */
    uint64_t chunk;  /* source bytes contiguous from src, then... */
    uint64_t stride; /* ...the next chunk starts this far on */
} kvr__rl_piece_t;

/* MLA chunks per piece. */
KVR_HD uint32_t kvr__rl_run(const kvr__rl_geom_t *g)
{
    uint32_t IW = g->I * g->W;
    return g->bs % IW == 0 ? g->bs / IW : 1;
}

KVR_HD uint32_t kvr__rl_pieces_per_block(const kvr__rl_geom_t *g)
{
    if (g->kind == KVR__RL_MLA)
        return g->bs / g->I / kvr__rl_run(g);
    return g->kind == KVR__RL_REPL ? 2 * g->W : 1;
}

KVR_HD uint64_t kvr__rl_max_piece(const kvr__rl_geom_t *g)
{
    if (g->kind == KVR__RL_MLA)
        return (uint64_t)kvr__rl_run(g) * g->I * g->unit;
    return g->kind == KVR__RL_REPL ? (uint64_t)g->bs * g->unit : g->unit;
}

/* Source offset of byte x of piece p. */
KVR_HD uint64_t kvr__rl_src_at(const kvr__rl_piece_t *p, uint64_t x)
{
    uint64_t c = x / p->chunk;
    return p->src + c * p->stride + (x - c * p->chunk);
}

/* Stream bytes of one full destination block. */
KVR_HD uint64_t kvr__rl_full_bytes(const kvr__rl_geom_t *g)
{
    if (g->kind == KVR__RL_MLA)
        return (uint64_t)g->bs * g->unit;
    if (g->kind == KVR__RL_REPL)
        return (uint64_t)g->W * g->bs * (g->unit + 4);
    return g->unit;
}

/* Source pages in destination block b (REPL, SEG): [b*W, min(b*W + W, end)). */
KVR_HD uint32_t kvr__rl_pages_in(const kvr__rl_geom_t *g, uint64_t b)
{
    uint64_t first = b * g->W;
    uint64_t left = g->end_src > first ? g->end_src - first : 0;
    return (uint32_t)(left < g->W ? left : g->W);
}

/* Stream bytes of the request's last destination block on `rank`. */
KVR_HD uint64_t kvr__rl_last_bytes(const kvr__rl_geom_t *g, uint32_t rank)
{
    uint64_t last = (uint64_t)g->first_dst + g->num_blocks - 1;
    if (g->kind == KVR__RL_MLA)
        return (kvr__local_len(g->num_tokens, rank, g->I, g->W) -
                last * g->bs) *
               g->unit;
    if (g->kind == KVR__RL_REPL)
        return (uint64_t)kvr__rl_pages_in(g, last) * g->bs * (g->unit + 4);
    return last * g->W + rank < g->end_src ? g->unit : 0;
}

/* Stream offset of the s-th destination block in sorted order. */
KVR_HD uint64_t kvr__rl_block_stream(const kvr__rl_geom_t *g, uint64_t s,
                                     uint64_t last_bytes)
{
    uint64_t full = kvr__rl_full_bytes(g);
    return s * full - (s > g->s_last ? full - last_bytes : 0);
}

/* Total stream bytes of `rank`. */
KVR_HD uint64_t kvr__rl_rank_bytes(const kvr__rl_geom_t *g, uint32_t rank)
{
    if (g->num_blocks == 0)
        return 0;
    return (uint64_t)(g->num_blocks - 1) * kvr__rl_full_bytes(g) +
           kvr__rl_last_bytes(g, rank);
}

KVR_HD kvr__rl_piece_t kvr__rl_mla_piece(const kvr__rl_geom_t *g, uint32_t rank,
                                         uint64_t b, uint32_t q, uint64_t base)
{
    kvr__rl_piece_t p = {0, 0, 0, 0, 1, 0};
    uint64_t len_r = kvr__local_len(g->num_tokens, rank, g->I, g->W);
    uint64_t tokens = (uint64_t)kvr__rl_run(g) * g->I;
    uint64_t j = b * g->bs + q * tokens;
    if (j >= len_r)
        return p;
    uint64_t n = len_r - j < tokens ? len_r - j : tokens;
    uint64_t pos = kvr__global(j, rank, g->I, g->W);
    p.src = kvr__src_slot(g->src_blocks, pos, g->bs) * g->unit;
    p.dst = kvr__dst_slot(g->dst_blocks, pos, g->bs, g->I, g->W) * g->unit;
    p.stream = base + q * tokens * g->unit;
    p.len = n * g->unit;
    p.chunk = (uint64_t)g->I * g->unit;
    p.stride = (uint64_t)g->I * g->W * g->unit;
    return p;
}

/* Key plane (q < W) or scale plane of source page b*W + q % W, placed as
 * sub-page q % W of the W-times-wider destination page (docs/design.md §4). */
KVR_HD kvr__rl_piece_t kvr__rl_repl_piece(const kvr__rl_geom_t *g, uint64_t b,
                                          uint32_t q, uint64_t base)
{
    kvr__rl_piece_t p = {0, 0, 0, 0, 1, 0};
    uint64_t bs = g->bs, W = g->W, D = g->unit, sub = q % W;
    uint64_t pages = kvr__rl_pages_in(g, b);
    if (sub >= pages)
        return p;
    uint64_t sp = (uint64_t)g->src_blocks[b * W + sub] * g->src_page;
    uint64_t dp = (uint64_t)g->dst_blocks[b] * g->dst_page;
    if (q < W) {
        p.src = sp + kvr__index_key_off(0, 0, D, (int)g->preshuffle);
        p.dst = dp + kvr__index_key_off(sub * bs, 0, D, (int)g->preshuffle);
        p.stream = base + sub * bs * D;
        p.len = bs * D;
    } else {
        p.src = sp + kvr__index_scale_off(0, bs, D);
        p.dst = dp + kvr__index_scale_off(sub * bs, bs * W, D);
        p.stream = base + pages * bs * D + sub * bs * 4;
        p.len = bs * 4;
    }
    p.chunk = p.len;
    return p;
}

KVR_HD kvr__rl_piece_t kvr__rl_seg_piece(const kvr__rl_geom_t *g, uint32_t rank,
                                         uint64_t b, uint64_t base)
{
    kvr__rl_piece_t p = {0, 0, 0, 0, 1, 0};
    uint64_t j = b * g->W + rank;
    if (j >= g->end_src)
        return p;
    p.src = (uint64_t)g->src_blocks[j] * g->src_page;
    p.dst = (uint64_t)g->dst_blocks[b] * g->dst_page;
    p.stream = base;
    p.len = p.chunk = g->unit;
    return p;
}

/* Piece `piece` of `rank`'s share, in stream order. */
KVR_HD kvr__rl_piece_t kvr__rl_piece_at(const kvr__rl_geom_t *g, uint32_t rank,
                                        uint32_t piece)
{
    uint32_t per = kvr__rl_pieces_per_block(g);
    uint32_t s = piece / per, q = piece - s * per;
    uint64_t b = g->order[s];
    uint64_t base = kvr__rl_block_stream(g, s, kvr__rl_last_bytes(g, rank));
    if (g->kind == KVR__RL_MLA)
        return kvr__rl_mla_piece(g, rank, b, q, base);
    if (g->kind == KVR__RL_REPL)
        return kvr__rl_repl_piece(g, b, q, base);
    return kvr__rl_seg_piece(g, rank, b, base);
}

#endif
