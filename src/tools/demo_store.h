/* --save-to / --load-from of the demo: the store every demo process opens
 * on one directory, its namespace and the store connector of one process
 * (docs/store.md "In the demo"). */
#ifndef CLI_TOOLS_DEMO_STORE_H
#define CLI_TOOLS_DEMO_STORE_H

#include <stdio.h>

#include "demo.h"
#include "kvrelay/store.h"

/* Checks --save-to/--load-from/--chunk against the rest; prints one line
 * and returns false if bad. */
bool demo_store_check(const demo_cfg_t *cfg, const char *cmd);
/* Tokens per store chunk: --chunk, else bs * W. */
uint64_t demo_chunk(const demo_cfg_t *cfg);
/* The store directory of this run (save or load), or NULL. */
const char *demo_store_dir(const demo_cfg_t *cfg);
/* Opens the store on the run's directory (quick scan: children open it
 * while others write) and a connector for this process's regions. */
kvr_status_t demo_store_open(const demo_cfg_t *cfg,
                             const kvr_region_desc_t *descs, void *const *bases,
                             uint32_t num_regions, kvr_store_t **store,
                             kvr_store_conn_t **conn, kvr_error_t *err);
/* The chain hashes of request req's full chunks (*num of them, at most
 * cap). */
kvr_status_t demo_store_chains(const demo_cfg_t *cfg, uint32_t req,
                               kvr_block_hash_t *out, size_t cap, size_t *num,
                               kvr_error_t *err);
/* Bytes of tokens [0, tokens) of request req that land on this rank (what
 * a transfer of them would move), for the demo's "from the store" figure. */
uint64_t demo_rank_bytes(const demo_cfg_t *cfg, uint32_t rank, uint32_t req,
                         const uint32_t *dst, size_t ndst, uint64_t tokens);
/* Chunks of the largest request (a bound for demo_store_chains). */
size_t demo_store_max_chunks(const demo_cfg_t *cfg);
#endif

/* ---- the supervisor's side (kvrelay demo) ---- */

/* What the children reported about the store: each stage's saves, counted
 * to a PP quorum per request, and each rank's loads. */
typedef struct demo_tally demo_tally_t;

/* NULL with nothing to count (no --save-to/--load-from); *ok false with a
 * message printed when the directory cannot be opened. With --save-to the
 * directory is created and scanned once here, before any child runs. */
demo_tally_t *demo_tally_create(const demo_cfg_t *cfg, bool *ok);
void demo_tally_destroy(demo_tally_t *t);
/* One child line ("saved", "stored", "store-miss"); true if it was one. */
bool demo_tally_line(demo_tally_t *t, FILE *out, const char *who,
                     const char *verb, uint32_t req, const char *rest);
/* Summary lines; false when a save failed or a request was not saved by
 * every stage. */
bool demo_tally_print(const demo_tally_t *t, FILE *out,
                      uint64_t transfer_bytes);
/* Its figures into the --json object. */
void demo_tally_json(const demo_tally_t *t, void *json_root);
