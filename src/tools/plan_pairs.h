/* `kvrelay plan` with several producer ranks (docs/design.md §18). */
#ifndef CLI_TOOLS_PLAN_PAIRS_H
#define CLI_TOOLS_PLAN_PAIRS_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "kvrelay/plan.h"

typedef struct {
    uint64_t runs, uncoalesced, bytes;
} cli_totals_t;

/* One producer rank the consumer rank pulls from, on its axis. */
typedef struct {
    kvr_axis_t axis;
    uint32_t rank;
    uint64_t runs, bytes;
} cli_source_t;

typedef struct {
    cli_source_t *sources; /* DCP sources, then TP, ascending */
    size_t num_sources;
    cli_totals_t *per_pair; /* per region pair, summed over sources */
    uint64_t total_runs, total_bytes;
} cli_pair_plan_t;

/* Parses "dense:H:D:E[:hnd][xCOUNT]" into a head-sharded dense template
 * (page bytes are left to the caller: they depend on the side's TP). */
bool cli_parse_dense(const char *text, kvr_region_desc_t *out, uint32_t *count);

/* Whether the consumer rank has more than today's single producer: a
 * producer of its own DCP or block size, or a dense TP reshard. */
bool cli_plan_needs_pairs(const kvr_layout_t *lay,
                          const kvr_region_pair_t *pairs, size_t n);

/* Plans everything consumer DCP rank dcp_rank (for DCP-planned regions)
 * and TP rank tp_rank (head-sharded dense) take, source by source. req's
 * source table serves every producer rank (the shared DCP table). */
kvr_status_t cli_plan_pairs(const kvr_layout_t *lay, uint32_t dcp_rank,
                            uint32_t tp_rank, const kvr_region_pair_t *pairs,
                            size_t n, const kvr_request_t *req,
                            cli_pair_plan_t *pp, kvr_error_t *err);
void cli_pair_plan_free(cli_pair_plan_t *pp);

#endif
