/* kvrelay inspect: decode received pages back into per-token form with the
 * layout math (not the planner: an independent check) and diff them against
 * the producer's pages. The tool that finds silent relayout corruption; used
 * by `kvrelay inspect` and the Python package. Part of the tools layer. */
#ifndef KVRELAY_INSPECT_H
#define KVRELAY_INSPECT_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "kvrelay/plan.h"
#include "kvrelay/status.h"

#ifdef __cplusplus
extern "C" {
#endif
KVR_API_BEGIN

/* What a finding is about. */
typedef enum kvr_inspect_kind {
    KVR_INSPECT_WRONG = 0, /* received token differs from the source token */
    KVR_INSPECT_SCALE = 1, /* received index token: scale does not match its
                               keys (synthetic data only) */
    KVR_INSPECT_SOURCE =
        2, /* source token is not the declared synthetic data */
} kvr_inspect_kind_t;
#define KVR_INSPECT_KINDS 3

/* Parts of a token, as bits of kvr_inspect_diff_t.parts. */
#define KVR_INSPECT_PART_LATENT 1u
#define KVR_INSPECT_PART_KEY 2u
#define KVR_INSPECT_PART_SCALE 4u

#define KVR_INSPECT_EXCERPT 16
#define KVR_INSPECT_DEFAULT_REPORT 5

/* One wrong token. Offsets are region-relative bytes of the first differing
 * byte; `byte` is its index in the part in token order (key byte d, not its
 * preshuffled position). Excerpts start at that byte. */
typedef struct kvr_inspect_diff {
    kvr_inspect_kind_t kind;
    uint32_t request; /* manifest request index (kvr_inspect_dump) */
    uint32_t rank;    /* DCP rank that holds the token (SOURCE: 0) */
    uint32_t parts;   /* KVR_INSPECT_PART_* bits of every differing part */
    uint64_t token;   /* global position g */
    uint32_t part;    /* the first differing part (one PART bit) */
    uint32_t excerpt_len;
    uint64_t byte;
    uint64_t src_offset; /* SCALE: same as dst_offset */
    uint64_t dst_offset; /* SOURCE: same as src_offset */
    uint8_t expected[KVR_INSPECT_EXCERPT];
    uint8_t found[KVR_INSPECT_EXCERPT];
} kvr_inspect_diff_t;

/* Accumulates findings over many calls (requests x ranks of one region).
 * The caller owns `diffs` (diffs_cap entries) and zeroes the counters; the
 * first max_report findings of each kind are kept. */
typedef struct kvr_inspect_result {
    uint64_t checked[KVR_INSPECT_KINDS]; /* tokens checked, per kind */
    uint64_t found[KVR_INSPECT_KINDS];   /* tokens with a difference */
    kvr_inspect_diff_t *diffs;
    size_t diffs_cap;
    size_t num_diffs;
} kvr_inspect_result_t;

typedef struct kvr_inspect_opts {
    size_t max_report; /* findings kept per region and kind; 0 = default 5;
                          kvr_inspect_dump takes at most 1000 */
    bool synthetic;    /* data is kvr_synth data of `seed`: check index
                          scales against keys, and sources against the
                          generator */
    uint64_t seed;
    bool manifest_seed; /* kvr_inspect_dump: synthetic and seed come from the
                           manifest (a declared seed means synthetic data) */
} kvr_inspect_opts_t;

#define KVR_INSPECT_OPTS_INIT                                                  \
    {                                                                          \
        .max_report = KVR_INSPECT_DEFAULT_REPORT, .synthetic = false,          \
        .seed = 0, .manifest_seed = true                                       \
    }

/* Checks every token DCP rank `rank` must hold, [k*V, N) (sharded: owned
 * tokens; replicated index: all), in dst (the consumer region image,
 * dst_len bytes) against src (the producer region image). With
 * opts->synthetic, also checks each received index token's scale against its
 * keys. Validates the layout, region pair (MLA or INDEX), request, block ids
 * and that the images hold num_blocks * page_bytes bytes. Returns KVR_OK
 * when the check ran (differences are in res), an error code otherwise. */
kvr_status_t kvr_inspect_buffers(const kvr_layout_t *lay, uint32_t rank,
                                 const kvr_region_pair_t *pair,
                                 const kvr_request_t *req, const void *src,
                                 uint64_t src_len, const void *dst,
                                 uint64_t dst_len,
                                 const kvr_inspect_opts_t *opts,
                                 kvr_inspect_result_t *res, kvr_error_t *err);

/* Checks that the request's tokens [k*V, N) in the producer image are the
 * synthetic data of (opts->seed, layer, position, token_ids[g]). */
kvr_status_t kvr_inspect_source(const kvr_layout_t *lay,
                                const kvr_region_pair_t *pair,
                                const kvr_request_t *req,
                                const uint32_t *token_ids, const void *src,
                                uint64_t src_len,
                                const kvr_inspect_opts_t *opts,
                                kvr_inspect_result_t *res, kvr_error_t *err);

/* ---- dump directories (docs/dump-format.md) ---- */

typedef struct kvr_inspect_report kvr_inspect_report_t;

/* Reads DIR/manifest.json and the page images it names and checks every
 * request x region x rank. A malformed manifest, a missing file or a size
 * that does not match the manifest is an error (KVR_ERR_INVALID, KVR_ERR_IO
 * or the layout check's code) naming the field; differences are not: they
 * are in the report. opts NULL means KVR_INSPECT_OPTS_INIT. */
kvr_status_t kvr_inspect_dump(const char *dir, const kvr_inspect_opts_t *opts,
                              kvr_inspect_report_t **out, kvr_error_t *err);
void kvr_inspect_report_destroy(kvr_inspect_report_t *rep);

/* True when no region has a finding of any kind. */
bool kvr_inspect_report_clean(const kvr_inspect_report_t *rep);
size_t kvr_inspect_report_num_regions(const kvr_inspect_report_t *rep);
size_t kvr_inspect_report_num_requests(const kvr_inspect_report_t *rep);
/* Region i's description (consumer side) and findings; NULL if out of range. */
const kvr_inspect_result_t *
kvr_inspect_report_region(const kvr_inspect_report_t *rep, size_t i,
                          kvr_region_desc_t *desc);
const char *kvr_inspect_report_request_id(const kvr_inspect_report_t *rep,
                                          size_t i);
const kvr_layout_t *kvr_inspect_report_layout(const kvr_inspect_report_t *rep);
/* The options the dump was checked with (synthetic, seed, max_report). */
kvr_inspect_opts_t kvr_inspect_report_opts(const kvr_inspect_report_t *rep);
/* The report as JSON text (docs/inspect.md); free with kvr_inspect_free. */
char *kvr_inspect_report_json(const kvr_inspect_report_t *rep);
void kvr_inspect_free(void *p);

/* "latent", "key", "scale" for a single PART bit; "?" otherwise. */
const char *kvr_inspect_part_name(uint32_t part);
/* "wrong", "scale", "source". */
const char *kvr_inspect_kind_name(kvr_inspect_kind_t kind);

KVR_API_END
#ifdef __cplusplus
}
#endif
#endif
