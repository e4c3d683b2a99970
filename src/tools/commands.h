/* kvrelay CLI: one function per subcommand, shared argument helpers. */
#ifndef CLI_TOOLS_COMMANDS_H
#define CLI_TOOLS_COMMANDS_H

#include <stdbool.h>
#include <stdint.h>

#include "kvrelay/plan.h"

/* Exit codes (docs/design.md §11). */
#define CLI_EXIT_OK 0
#define CLI_EXIT_FAILED 1
#define CLI_EXIT_USAGE 2

int cli_cmd_plan(int argc, char **argv);
int cli_cmd_serve(int argc, char **argv);
int cli_cmd_push(int argc, char **argv);
int cli_cmd_demo(int argc, char **argv);
int cli_cmd_bench(int argc, char **argv);
int cli_cmd_bench_serving(int argc, char **argv);
int cli_cmd_capacity(int argc, char **argv);
int cli_cmd_inspect(int argc, char **argv);
int cli_cmd_store(int argc, char **argv);

/* Prints "kvrelay <cmd>: <message>" on stderr; returns CLI_EXIT_USAGE. */
int cli_usage_error(const char *cmd, const char *fmt, ...)
#if defined(__GNUC__)
    __attribute__((format(printf, 2, 3)))
#endif
    ;

/* Strict unsigned parsing of an option value; false on anything but digits
 * within [min, max]. */
bool cli_parse_u64(const char *text, uint64_t min, uint64_t max, uint64_t *out);

/* Parses "mla:576x78", "index:128[:128]x26", "dense:256", "state:4096",
 * "other:4096" into a producer region template and a count. */
bool cli_parse_region(const char *text, kvr_region_desc_t *out,
                      uint32_t *count);

/* Block table option: "identity" (NULL too), "a,b,c" or "random:SEED".
 * identity gives ids 0..need-1; random the first `need` ids of a seeded
 * permutation of a pool of pool_size ids (0: 2*need+1); a list gives its
 * own length. *pool is one past the largest id the table may hold (a list:
 * its largest id + 1). On failure msg names why. Caller frees *ids. */
bool cli_parse_table(const char *text, uint64_t need, uint64_t pool_size,
                     uint32_t **ids, size_t *n, uint32_t *pool, char *msg,
                     size_t msg_len);

/* The planner's checks exactly as `kvrelay plan` runs them: the layout for
 * `rank`, then every rule of docs/design.md §4 for these region pairs and
 * this request. Every command that takes a layout calls this before it
 * starts anything, so a layout `plan` refuses is refused everywhere in the
 * same words. On a refusal prints "kvrelay CMD: message (STATUS)" and
 * returns false; *out (may be NULL) receives the plan set. */
bool cli_check_plan(const char *cmd, const kvr_layout_t *lay, uint32_t rank,
                    const kvr_region_pair_t *pairs, size_t num_pairs,
                    const kvr_request_t *req, kvr_plan_set_t **out);

/* "HOST:PORT" (the last colon splits). */
bool cli_parse_hostport(const char *text, char *host, size_t cap,
                        uint16_t *port);

#endif
