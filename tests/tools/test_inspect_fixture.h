/* Builds dump directories (docs/dump-format.md) for the inspect tests: a
 * small headline-shaped layout (bs 16, W 4, I 1, replicated preshuffled
 * index), an MLA and an index region, two requests (one incremental),
 * synthetic sources, and a transfer whose runs a test may corrupt. */
#ifndef KVR_TEST_INSPECT_FIXTURE_H
#define KVR_TEST_INSPECT_FIXTURE_H

#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "kvrelay/plan.h"
#include "kvrelay/synth.h"

#define TD_W 4
#define TD_BS 16
#define TD_TB 64         /* MLA token bytes */
#define TD_D 128         /* index dim */
#define TD_SRC_BLOCKS 24 /* the last one is never in a table */
#define TD_DST_BLOCKS 8
#define TD_SEED 7

typedef struct {
    const char *id;
    uint32_t src[16], dst[4], tok[256];
    kvr_request_t req;
} td_request_t;

typedef struct {
    kvr_layout_t lay;
    kvr_region_pair_t pairs[2]; /* 0: mla layer 3, 1: index layer 3 */
    td_request_t reqs[2];
    uint8_t *src[2];
    uint8_t *dst[2][TD_W];
} td_dump_t;

/* Gets the correct runs of (region, request, rank) and may rewrite them. */
typedef void (*td_mutate_fn)(const td_dump_t *d, size_t region, size_t req,
                             uint32_t rank, kvr_run_t **runs, size_t *n);

static inline uint64_t td_bytes(const kvr_region_desc_t *r)
{
    return r->num_blocks * r->page_bytes;
}

/* Request tables: the first-th.. entries of fixed permutations of the
 * source ids [0, 23) and destination ids [0, 8), so requests never share a
 * block and source block 23 stays out of every table. */
static inline void td_request(td_request_t *q, const char *id, uint64_t N,
                              uint64_t k, uint32_t first_src,
                              uint32_t first_dst)
{
    q->id = id;
    for (uint32_t i = 0; i < 16; i++)
        q->src[i] = ((first_src + i) * 5) % 23;
    for (uint32_t i = 0; i < 4; i++)
        q->dst[i] = ((first_dst + i) * 3) % TD_DST_BLOCKS;
    for (uint32_t g = 0; g < 256; g++)
        q->tok[g] = 1000 + g * 7 + (uint32_t)k;
    q->req = (kvr_request_t){q->src, (N + TD_BS - 1) / TD_BS,
                             q->dst, (N + TD_BS * TD_W - 1) / (TD_BS * TD_W),
                             N,      k};
}

static inline void td_init(td_dump_t *d)
{
    memset(d, 0, sizeof(*d));
    d->lay = (kvr_layout_t)KVR_LAYOUT_INIT;
    d->lay.block_size = TD_BS;
    d->lay.dcp_size = d->lay.tp = TD_W;
    d->lay.replicate_index = true;
    kvr_region_desc_t m = {.role = KVR_ROLE_MLA,
                           .layer = 3,
                           .num_blocks = TD_SRC_BLOCKS,
                           .page_bytes = TD_BS * TD_TB};
    kvr_region_desc_t x = {.role = KVR_ROLE_INDEX,
                           .layer = 3,
                           .num_blocks = TD_SRC_BLOCKS,
                           .page_bytes = TD_BS * kvr_index_stride(TD_D),
                           .index_dim = TD_D,
                           .quant_block = TD_D};
    d->pairs[0] = (kvr_region_pair_t){m, m};
    d->pairs[1] = (kvr_region_pair_t){x, x};
    d->pairs[0].dst.num_blocks = d->pairs[1].dst.num_blocks = TD_DST_BLOCKS;
    d->pairs[1].dst.page_bytes = TD_BS * TD_W * kvr_index_stride(TD_D);
    /* req-0: 150 tokens (10 source, 3 destination blocks, the last
     * partial); req-1: 200 tokens (13 source, 4 destination blocks) of which
     * the first virtual block is already cached. */
    td_request(&d->reqs[0], "req-0", 150, 0, 0, 0);
    td_request(&d->reqs[1], "req-1", 200, 1, 10, 3);
    for (size_t r = 0; r < 2; r++) {
        d->src[r] = calloc(1, td_bytes(&d->pairs[r].src));
        for (uint32_t w = 0; w < TD_W; w++)
            d->dst[r][w] = calloc(1, td_bytes(&d->pairs[r].dst));
        for (size_t q = 0; q < 2; q++) {
            const td_request_t *rq = &d->reqs[q];
            kvr_status_t st = kvr_synth_fill_source(
                &d->lay, &d->pairs[r].src, TD_SEED, rq->src,
                rq->req.num_src_blocks, rq->tok, rq->req.num_tokens, d->src[r],
                NULL);
            if (st != KVR_OK)
                abort();
        }
    }
}

/* Plans every (region, request, rank), lets `mutate` rewrite the runs,
 * applies them. */
static inline void td_transfer(td_dump_t *d, td_mutate_fn mutate)
{
    for (size_t r = 0; r < 2; r++)
        for (size_t q = 0; q < 2; q++)
            for (uint32_t w = 0; w < TD_W; w++) {
                kvr_plan_t *plan = NULL, *bad = NULL;
                if (kvr_plan_create(&d->lay, w, &d->pairs[r], &d->reqs[q].req,
                                    &plan, NULL) != KVR_OK)
                    abort();
                size_t n;
                const kvr_run_t *runs = kvr_plan_runs(plan, &n);
                kvr_run_t *copy = malloc((n + 1) * sizeof(*copy));
                memcpy(copy, runs, n * sizeof(*copy));
                if (mutate != NULL)
                    mutate(d, r, q, w, &copy, &n);
                if (kvr_plan_from_runs(copy, n, &bad) != KVR_OK)
                    abort();
                kvr_plan_apply_host(bad, d->src[r], d->dst[r][w]);
                kvr_plan_destroy(bad);
                kvr_plan_destroy(plan);
                free(copy);
            }
}

static inline void td_write_file(const char *dir, const char *name,
                                 const void *buf, uint64_t len)
{
    char path[512];
    snprintf(path, sizeof(path), "%s/%s", dir, name);
    FILE *f = fopen(path, "wb");
    if (f == NULL || fwrite(buf, 1, len, f) != len)
        abort();
    fclose(f);
}

static inline json_t *td_ids(const uint32_t *ids, size_t n)
{
    json_t *a = json_array();
    for (size_t i = 0; i < n; i++)
        json_array_append_new(a, json_integer(ids[i]));
    return a;
}

static inline json_t *td_side(const kvr_region_desc_t *r)
{
    return json_pack("{s:I,s:I}", "num_blocks", (json_int_t)r->num_blocks,
                     "page_bytes", (json_int_t)r->page_bytes);
}

static inline json_t *td_region_json(const td_dump_t *d, size_t r,
                                     const char *dir)
{
    const kvr_region_pair_t *p = &d->pairs[r];
    const char *role = kvr_role_name(p->src.role);
    char name[64];
    json_t *files = json_array();
    for (uint32_t w = 0; w < TD_W; w++) {
        snprintf(name, sizeof(name), "dst-r%u-L%03u-%s.bin", w, p->dst.layer,
                 role);
        td_write_file(dir, name, d->dst[r][w], td_bytes(&p->dst));
        json_array_append_new(files, json_string(name));
    }
    snprintf(name, sizeof(name), "src-L%03u-%s.bin", p->src.layer, role);
    td_write_file(dir, name, d->src[r], td_bytes(&p->src));
    json_t *o = json_pack("{s:s,s:I,s:o,s:o,s:s,s:o}", "role", role, "layer",
                          (json_int_t)p->src.layer, "src", td_side(&p->src),
                          "dst", td_side(&p->dst), "src_file", name,
                          "dst_files", files);
    if (p->src.role == KVR_ROLE_INDEX) {
        json_object_set_new(o, "index_dim", json_integer(p->src.index_dim));
        json_object_set_new(o, "quant_block", json_integer(p->src.quant_block));
    }
    return o;
}

static inline json_t *td_request_json(const td_request_t *q)
{
    return json_pack("{s:s,s:I,s:I,s:o,s:o,s:o}", "id", q->id, "num_tokens",
                     (json_int_t)q->req.num_tokens, "num_computed_blocks",
                     (json_int_t)q->req.num_computed_blocks, "src_blocks",
                     td_ids(q->src, q->req.num_src_blocks), "dst_blocks",
                     td_ids(q->dst, q->req.num_dst_blocks), "token_ids",
                     td_ids(q->tok, q->req.num_tokens));
}

/* Writes DIR/manifest.json and every image. */
static inline void td_write(const td_dump_t *d, const char *dir)
{
    mkdir(dir, 0755);
    json_t *regions = json_array(), *reqs = json_array();
    for (size_t r = 0; r < 2; r++)
        json_array_append_new(regions, td_region_json(d, r, dir));
    for (size_t q = 0; q < 2; q++)
        json_array_append_new(reqs, td_request_json(&d->reqs[q]));
    const kvr_layout_t *l = &d->lay;
    json_t *root = json_pack(
        "{s:s,s:i,s:{s:I,s:I,s:I,s:I,s:I,s:b,s:b},s:I,s:o,s:o}", "format",
        "kvrelay-dump", "version", 1, "layout", "block_size",
        (json_int_t)l->block_size, "dcp", (json_int_t)l->dcp_size, "interleave",
        (json_int_t)l->interleave, "tp", (json_int_t)l->tp, "producer_tp",
        (json_int_t)l->producer_tp, "replicate_index", l->replicate_index,
        "preshuffle", l->preshuffle, "seed", (json_int_t)TD_SEED, "regions",
        regions, "requests", reqs);
    char path[512];
    snprintf(path, sizeof(path), "%s/manifest.json", dir);
    if (root == NULL || json_dump_file(root, path, JSON_INDENT(1)) != 0)
        abort();
    json_decref(root);
}

static inline void td_free(td_dump_t *d)
{
    for (size_t r = 0; r < 2; r++) {
        free(d->src[r]);
        for (uint32_t w = 0; w < TD_W; w++)
            free(d->dst[r][w]);
    }
}

#endif
