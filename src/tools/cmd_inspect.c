/* `kvrelay inspect DIR`: decode a dump (docs/dump-format.md) back into
 * per-token form and diff every consumer rank's pages against the source.
 * Exit 0 clean, 1 on any difference, 2 on bad usage or a bad dump. */
#include <getopt.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "commands.h"
#include "kvrelay/inspect.h"

typedef unsigned long long ull;

static const char inspect_usage[] =
    "usage: kvrelay inspect [--json] [--max-report N] [--seed S | "
    "--no-synthetic]\n"
    "                       DIR\n"
    "Reads DIR/manifest.json (written by `kvrelay demo --dump DIR` or the\n"
    "Python package) and the page images it names; checks the tokens\n"
    "[k*V, N) every DCP rank must hold (sharded: owned tokens; replicated\n"
    "index: all) against the source and prints the first N (default 5) wrong\n"
    "tokens of each region. When the manifest declares a seed (or --seed is\n"
    "given) the data is synthetic: index scales are checked against their\n"
    "keys and the source images against the generator. Exit 0 clean,\n"
    "1 differences, 2 bad usage or a malformed or missing dump.\n";

typedef struct {
    bool json, no_synth, have_seed;
    uint64_t max_report, seed;
    const char *dir;
} inspect_args_t;

enum { O_JSON = 256, O_MAX, O_SEED, O_NOSYNTH, O_HELP };

static const struct option inspect_options[] = {
    {"json", no_argument, 0, O_JSON},
    {"max-report", required_argument, 0, O_MAX},
    {"seed", required_argument, 0, O_SEED},
    {"no-synthetic", no_argument, 0, O_NOSYNTH},
    {"help", no_argument, 0, O_HELP},
    {0, 0, 0, 0},
};

static int number(const char *name, const char *arg, uint64_t min, uint64_t max,
                  uint64_t *out)
{
    if (!cli_parse_u64(arg, min, max, out))
        return cli_usage_error("inspect",
                               "--%s: '%s' is not a number in "
                               "[%llu, %llu]",
                               name, arg, (ull)min, (ull)max);
    return CLI_EXIT_OK;
}

/* Returns -1 to continue, else an exit code. */
static int parse_inspect_args(int argc, char **argv, inspect_args_t *a)
{
    int opt, rc = CLI_EXIT_OK;
    optind = 1;
    opterr = 0;
    while ((opt = getopt_long(argc, argv, "", inspect_options, NULL)) != -1) {
        switch (opt) {
        case O_JSON:
            a->json = true;
            break;
        case O_NOSYNTH:
            a->no_synth = true;
            break;
        case O_MAX:
            rc = number("max-report", optarg, 1, 1000, &a->max_report);
            break;
        case O_SEED:
            rc = number("seed", optarg, 0, INT64_MAX, &a->seed);
            a->have_seed = true;
            break;
        case O_HELP:
            fputs(inspect_usage, stdout);
            return CLI_EXIT_OK;
        default:
            return cli_usage_error("inspect",
                                   "unknown or incomplete "
                                   "option '%s' (see --help)",
                                   argv[optind - 1]);
        }
        if (rc != CLI_EXIT_OK)
            return rc;
    }
    if (a->have_seed && a->no_synth)
        return cli_usage_error("inspect", "--seed and --no-synthetic "
                                          "exclude each other");
    if (optind == argc)
        return cli_usage_error("inspect", "the dump directory DIR is "
                                          "required");
    if (optind + 1 != argc)
        return cli_usage_error("inspect",
                               "one dump directory expected, "
                               "got '%s' too",
                               argv[argc - 1]);
    a->dir = argv[optind];
    return -1;
}

static void print_bytes(const char *label, const uint8_t *b, uint32_t n)
{
    printf(" %s ", label);
    for (uint32_t i = 0; i < n; i++)
        printf("%02x", b[i]);
}

/* Scales are fp32: show the values too. */
static void print_scales(const kvr_inspect_diff_t *d)
{
    float want, got;
    if (d->part != KVR_INSPECT_PART_SCALE || d->byte != 0 || d->excerpt_len < 4)
        return;
    memcpy(&want, d->expected, sizeof(want));
    memcpy(&got, d->found, sizeof(got));
    printf(" (scale %g, found %g)", (double)want, (double)got);
}

static void print_diff(const kvr_inspect_report_t *rep,
                       const kvr_inspect_diff_t *d)
{
    static const char *const what[] = {"wrong token", "scale/key mismatch",
                                       "source not synthetic"};
    static const char *const where[] = {
        "at dst offset %llu (src offset %llu)",
        "at dst offset %llu (expected = the scale its keys give)",
        "at src offset %llu (expected = the generator's bytes)"};
    printf("  %s %llu (%s, rank %u): %s", what[d->kind], (ull)d->token,
           kvr_inspect_report_request_id(rep, d->request), d->rank,
           kvr_inspect_part_name(d->part));
    if (d->parts != d->part)
        printf(" (also %s)",
               d->parts & ~d->part & KVR_INSPECT_PART_SCALE ? "scale" : "key");
    printf(" byte %llu ", (ull)d->byte);
    printf(where[d->kind], (ull)d->dst_offset, (ull)d->src_offset);
    printf(": expected 0x%02x found 0x%02x;", d->expected[0], d->found[0]);
    print_bytes("expected", d->expected, d->excerpt_len);
    print_bytes("found", d->found, d->excerpt_len);
    print_scales(d);
    putchar('\n');
}

static void print_region(const kvr_inspect_report_t *rep, size_t i)
{
    kvr_region_desc_t d;
    const kvr_inspect_result_t *res = kvr_inspect_report_region(rep, i, &d);
    printf("region %zu %s layer %u: %llu tokens checked, %llu wrong", i,
           kvr_role_name(d.role), d.layer, (ull)res->checked[KVR_INSPECT_WRONG],
           (ull)res->found[KVR_INSPECT_WRONG]);
    if (res->checked[KVR_INSPECT_SCALE])
        printf("; %llu scales checked, %llu inconsistent with their keys",
               (ull)res->checked[KVR_INSPECT_SCALE],
               (ull)res->found[KVR_INSPECT_SCALE]);
    if (res->checked[KVR_INSPECT_SOURCE])
        printf("; %llu source tokens checked, %llu not synthetic",
               (ull)res->checked[KVR_INSPECT_SOURCE],
               (ull)res->found[KVR_INSPECT_SOURCE]);
    putchar('\n');
    for (size_t k = 0; k < res->num_diffs; k++)
        print_diff(rep, &res->diffs[k]);
}

static void print_text(const char *dir, const kvr_inspect_report_t *rep)
{
    const kvr_layout_t *l = kvr_inspect_report_layout(rep);
    kvr_inspect_opts_t o = kvr_inspect_report_opts(rep);
    printf("inspect %s: bs=%u W=%u I=%u, index %s%s; %zu requests, %zu regions",
           dir, l->block_size, l->dcp_size, l->interleave,
           l->replicate_index ? "replicated" : "sharded",
           l->preshuffle ? ", preshuffled" : "",
           kvr_inspect_report_num_requests(rep),
           kvr_inspect_report_num_regions(rep));
    if (o.synthetic)
        printf("; synthetic data, seed %llu\n", (ull)o.seed);
    else
        puts("; no synthetic seed: scale and source checks off");
    uint64_t checked = 0, wrong = 0, scale = 0, source = 0, differ = 0;
    for (size_t i = 0; i < kvr_inspect_report_num_regions(rep); i++) {
        const kvr_inspect_result_t *r = kvr_inspect_report_region(rep, i, NULL);
        print_region(rep, i);
        checked += r->checked[KVR_INSPECT_WRONG];
        wrong += r->found[KVR_INSPECT_WRONG];
        scale += r->found[KVR_INSPECT_SCALE];
        source += r->found[KVR_INSPECT_SOURCE];
        differ += r->found[0] + r->found[1] + r->found[2] != 0;
    }
    printf(
        "summary: %s: %llu of %zu regions differ; %llu of %llu tokens wrong, "
        "%llu scales inconsistent, %llu source tokens not synthetic\n",
        differ ? "DIFFERENCES" : "clean", (ull)differ,
        kvr_inspect_report_num_regions(rep), (ull)wrong, (ull)checked,
        (ull)scale, (ull)source);
}

int cli_cmd_inspect(int argc, char **argv)
{
    inspect_args_t a = {0};
    int rc = parse_inspect_args(argc, argv, &a);
    if (rc >= 0)
        return rc;
    kvr_inspect_opts_t opts = KVR_INSPECT_OPTS_INIT;
    if (a.max_report)
        opts.max_report = a.max_report;
    if (a.have_seed || a.no_synth) {
        opts.manifest_seed = false;
        opts.synthetic = a.have_seed;
        opts.seed = a.seed;
    }
    kvr_inspect_report_t *rep = NULL;
    kvr_error_t err = {0};
    if (kvr_inspect_dump(a.dir, &opts, &rep, &err) != KVR_OK)
        return cli_usage_error("inspect", "%s (%s)", err.msg,
                               kvr_status_name(err.code));
    if (a.json) {
        char *text = kvr_inspect_report_json(rep);
        if (text != NULL)
            puts(text);
        kvr_inspect_free(text);
    } else {
        print_text(a.dir, rep);
    }
    rc = kvr_inspect_report_clean(rep) ? CLI_EXIT_OK : CLI_EXIT_FAILED;
    kvr_inspect_report_destroy(rep);
    return rc;
}
