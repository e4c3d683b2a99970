/* `kvrelay bench`: the executors side by side in one run (docs/design.md §11).
 * Runs `kvrelay demo` with each executor, --reps times, interleaved so noise
 * hits both alike, and reports min/median/max GB/s and the ratio to the best
 * median; writes JSON with --out. */
#include <errno.h>
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "commands.h"
#include "demo.h"

#define MAX_REPS 50

static const char bench_usage[] =
    "usage: kvrelay bench [--reps N] [--out FILE.json] [options]\n"
    "       kvrelay bench serving [options] (see kvrelay bench serving --help)\n"
    "Runs `kvrelay demo` with --executor direct and staged, N times each\n"
    "(default 3, interleaved), every run verified byte-exact; prints\n"
    "min/median/max GB/s per executor and the ratio to the best median.\n";

typedef struct {
    demo_cfg_t cfg;
    uint64_t reps;
    const char *out;
    FILE *out_file; /* opened before any run, so a bad path fails at once */
} bench_t;

static int bench_option(void *ctx, const char *name, const char *value)
{
    bench_t *b = ctx;
    if (strcmp(name, "out") == 0) {
        b->out = value;
        return 1;
    }
    if (strcmp(name, "reps") != 0)
        return 0;
    if (!cli_parse_u64(value, 1, MAX_REPS, &b->reps)) {
        cli_usage_error("bench", "--reps: '%s' is not in [1, %d]", value,
                        MAX_REPS);
        return -1;
    }
    return 1;
}

/* One demo run; its GB/s, or a negative value when it did not verify. */
static double run_demo(const bench_t *b, const char *executor)
{
    char *args[96], cmd[8192], self[4096];
    ssize_t sl = readlink("/proc/self/exe", self, sizeof(self) - 1);
    if (sl <= 0)
        return -1;
    self[sl] = '\0'; /* the shell popen starts has its own /proc/self */
    int n = demo_cfg_args(&b->cfg, args, 90);
    int len = snprintf(cmd, sizeof(cmd), "'%s' demo --json", self);
    for (int i = 0; i < n && len > 0 && (size_t)len < sizeof(cmd); i++)
        len += snprintf(cmd + len, sizeof(cmd) - (size_t)len, " '%s'", args[i]);
    if (len <= 0 || (size_t)len >= sizeof(cmd) - 64)
        return -1;
    snprintf(cmd + len, sizeof(cmd) - (size_t)len, " --executor=%s 2>/dev/null",
             executor);
    FILE *p = popen(cmd, "r");
    char line[65536];
    double gbps = -1;
    while (p != NULL && fgets(line, sizeof(line), p) != NULL) {
        json_t *j = line[0] == '{' ? json_loads(line, 0, NULL) : NULL;
        if (j != NULL && json_is_true(json_object_get(j, "ok")))
            gbps = json_real_value(json_object_get(j, "gbps"));
        json_decref(j);
    }
    if (p == NULL || pclose(p) != 0)
        return -1;
    return gbps;
}

static int cmp_double(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

static int report(const bench_t *b, double rates[2][MAX_REPS])
{
    static const char *const names[] = {"direct", "staged"};
    double med[2];
    for (int e = 0; e < 2; e++) {
        qsort(rates[e], b->reps, sizeof(double), cmp_double);
        med[e] = rates[e][b->reps / 2];
    }
    double best = med[0] > med[1] ? med[0] : med[1];
    json_t *arr = json_array();
    printf("%-8s %10s %10s %10s %14s\n", "executor", "min GB/s", "median",
           "max", "vs best median");
    for (int e = 0; e < 2; e++) {
        printf("%-8s %10.3f %10.3f %10.3f %14.2f\n", names[e], rates[e][0],
               med[e], rates[e][b->reps - 1], med[e] / best);
        json_array_append_new(arr, json_pack("{s:s,s:f,s:f,s:f,s:f}",
                                             "executor", names[e], "min_gbps",
                                             rates[e][0], "median_gbps", med[e],
                                             "max_gbps", rates[e][b->reps - 1],
                                             "ratio_to_best", med[e] / best));
    }
    json_t *root = json_pack(
        "{s:s,s:I,s:I,s:I,s:I,s:I,s:o}", "bench", "executors", "reps",
        (json_int_t)b->reps, "W", (json_int_t)b->cfg.lay.dcp_size, "I",
        (json_int_t)b->cfg.lay.interleave, "tokens", (json_int_t)b->cfg.tokens,
        "requests", (json_int_t)b->cfg.requests, "results", arr);
    int rc = CLI_EXIT_OK;
    if (b->out_file != NULL &&
        (json_dumpf(root, b->out_file, JSON_INDENT(1)) != 0 ||
         fputc('\n', b->out_file) == EOF)) {
        fprintf(stderr, "kvrelay bench: cannot write %s\n", b->out);
        rc = CLI_EXIT_FAILED;
    }
    json_decref(root);
    return rc;
}

int cli_cmd_bench(int argc, char **argv)
{
    if (argc > 1 && strcmp(argv[1], "serving") == 0)
        return cli_cmd_bench_serving(argc - 1, argv + 1);
    bench_t *b = calloc(1, sizeof(*b));
    static double rates[2][MAX_REPS];
    if (b == NULL)
        return CLI_EXIT_FAILED;
    demo_cfg_init(&b->cfg);
    b->reps = 3;
    int rc = demo_parse(argc, argv, &b->cfg, "bench", bench_usage, NULL,
                        bench_option, b);
    if (rc < 0 && b->out != NULL && (b->out_file = fopen(b->out, "w")) == NULL)
        rc = cli_usage_error("bench", "--out %s: %s", b->out, strerror(errno));
    for (uint64_t r = 0; rc < 0 && r < b->reps; r++)
        for (int e = 0; e < 2 && rc < 0; e++) {
            rates[e][r] = run_demo(b, e == 0 ? "direct" : "staged");
            if (rates[e][r] < 0) {
                fprintf(stderr, "kvrelay bench: a %s run failed to verify\n",
                        e == 0 ? "direct" : "staged");
                rc = CLI_EXIT_FAILED;
            }
        }
    if (rc < 0)
        rc = report(b, rates);
    if (b->out_file != NULL && fclose(b->out_file) != 0 && rc == CLI_EXIT_OK) {
        fprintf(stderr, "kvrelay bench: cannot write %s: %s\n", b->out,
                strerror(errno));
        rc = CLI_EXIT_FAILED;
    }
    if (b->out_file != NULL && rc != CLI_EXIT_OK)
        remove(b->out); /* no half-written or empty result */
    free(b);
    return rc;
}
