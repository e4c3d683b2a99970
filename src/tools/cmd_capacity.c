/* `kvrelay capacity`: KV blocks and tokens a decode rank holds in a memory
 * budget, and what replicating the index cache costs (docs/design.md §11):
 * blocks = floor(budget / (L_mla*bs*token_bytes + L_idx*P*C)), P = bs*W
 * when the index is replicated, bs otherwise, C = ceil16(D + 4). */
#include <getopt.h>
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "commands.h"

#define MAX_SPECS 64

static const char capacity_usage[] =
    "usage: kvrelay capacity [--json] --budget SIZE [--block-size BS] [--dcp "
    "W]\n"
    "                        [--replicate-index] --region "
    "mla:TOKEN_BYTES[xLAYERS]\n"
    "                        [--region index:D[xLAYERS]] ...\n"
    "Blocks per rank = floor(budget / bytes per block), where a block holds\n"
    "bs tokens of every MLA layer and one index page of every index layer:\n"
    "P * C bytes, P = bs * W tokens when the index is replicated, bs when\n"
    "sharded, C = ceil16(D + 4) including padding. SIZE is bytes or a whole\n"
    "number with K, M, G, T (KiB..TiB, powers of 1024) or KB, MB, GB, TB\n"
    "(powers of 1000). bs defaults to 64, W to 1.\n";

typedef struct {
    kvr_region_desc_t tmpl; /* page_bytes: MLA token bytes */
    uint32_t layers;
} cap_spec_t;

typedef struct {
    bool json, replicate;
    uint64_t budget, bs, W;
    bool have_budget;
    cap_spec_t specs[MAX_SPECS];
    size_t num_specs;
} cap_opts_t;

/* One way of holding the index: bytes per block and what the budget holds. */
typedef struct {
    uint64_t mla, index, per_block, blocks, tokens_rank, tokens_group;
} cap_result_t;

enum { O_BUDGET = 256, O_BS, O_DCP, O_REPL, O_REGION, O_JSON, O_HELP };

static const struct option capacity_options[] = {
    {"budget", required_argument, 0, O_BUDGET},
    {"block-size", required_argument, 0, O_BS},
    {"dcp", required_argument, 0, O_DCP},
    {"replicate-index", no_argument, 0, O_REPL},
    {"region", required_argument, 0, O_REGION},
    {"json", no_argument, 0, O_JSON},
    {"help", no_argument, 0, O_HELP},
    {0, 0, 0, 0},
};

static const struct {
    const char *suffix;
    uint64_t mult;
} size_units[] = {
    {"", 1},
    {"B", 1},
    {"K", 1ull << 10},
    {"KiB", 1ull << 10},
    {"KB", 1000ull},
    {"M", 1ull << 20},
    {"MiB", 1ull << 20},
    {"MB", 1000000ull},
    {"G", 1ull << 30},
    {"GiB", 1ull << 30},
    {"GB", 1000000000ull},
    {"T", 1ull << 40},
    {"TiB", 1ull << 40},
    {"TB", 1000000000000ull},
};

/* "80GiB", "85899345920", "80G": a whole number and an optional unit. */
static bool parse_size(const char *text, uint64_t *out)
{
    size_t digits = strspn(text, "0123456789");
    char num[32];
    if (digits == 0 || digits >= sizeof(num))
        return false;
    memcpy(num, text, digits);
    num[digits] = '\0';
    uint64_t v;
    if (!cli_parse_u64(num, 0, UINT64_MAX, &v))
        return false;
    for (size_t i = 0; i < sizeof(size_units) / sizeof(size_units[0]); i++)
        if (strcmp(text + digits, size_units[i].suffix) == 0)
            return !__builtin_mul_overflow(v, size_units[i].mult, out);
    return false;
}

static int number_option(int opt, const char *arg, cap_opts_t *o)
{
    const char *name = opt == O_BS ? "block-size" : "dcp";
    uint64_t max = opt == O_BS ? (1u << 20) : (1u << 16);
    uint64_t v;
    if (!cli_parse_u64(arg, 1, max, &v))
        return cli_usage_error("capacity",
                               "--%s: '%s' is not a number "
                               "in [1, %llu]",
                               name, arg, (unsigned long long)max);
    if (opt == O_BS)
        o->bs = v;
    else
        o->W = v;
    return CLI_EXIT_OK;
}

static int region_option(const char *arg, cap_opts_t *o)
{
    if (o->num_specs == MAX_SPECS)
        return cli_usage_error("capacity", "more than %d --region options",
                               MAX_SPECS);
    cap_spec_t *s = &o->specs[o->num_specs];
    if (!cli_parse_region(arg, &s->tmpl, &s->layers) ||
        (s->tmpl.role != KVR_ROLE_MLA && s->tmpl.role != KVR_ROLE_INDEX))
        return cli_usage_error("capacity",
                               "--region '%s': expected "
                               "mla:TOKEN_BYTES[xLAYERS] or "
                               "index:D[xLAYERS]",
                               arg);
    if (s->tmpl.role == KVR_ROLE_INDEX &&
        s->tmpl.quant_block != s->tmpl.index_dim)
        return cli_usage_error("capacity",
                               "--region '%s': index D/Q must "
                               "be 1 (D=%u, Q=%u)",
                               arg, s->tmpl.index_dim, s->tmpl.quant_block);
    o->num_specs++;
    return CLI_EXIT_OK;
}

static int check_capacity_args(int argc, char **argv, const cap_opts_t *o)
{
    if (optind < argc)
        return cli_usage_error("capacity", "unexpected argument '%s'",
                               argv[optind]);
    if (!o->have_budget)
        return cli_usage_error("capacity", "--budget is required");
    if (o->num_specs == 0)
        return cli_usage_error("capacity", "at least one --region is required");
    return -1;
}

/* Returns -1 to continue, else an exit code. */
static int parse_capacity_args(int argc, char **argv, cap_opts_t *o)
{
    int opt, rc;
    optind = 1;
    opterr = 0;
    while ((opt = getopt_long(argc, argv, "", capacity_options, NULL)) != -1) {
        rc = CLI_EXIT_OK;
        switch (opt) {
        case O_BUDGET:
            if (!parse_size(optarg, &o->budget))
                return cli_usage_error("capacity",
                                       "--budget: '%s' is not "
                                       "a size (e.g. 85899345920, 80GiB, "
                                       "80G, 86GB)",
                                       optarg);
            o->have_budget = true;
            break;
        case O_REGION:
            rc = region_option(optarg, o);
            break;
        case O_REPL:
            o->replicate = true;
            break;
        case O_JSON:
            o->json = true;
            break;
        case O_HELP:
            fputs(capacity_usage, stdout);
            return CLI_EXIT_OK;
        case '?':
            return cli_usage_error("capacity",
                                   "unknown or incomplete "
                                   "option '%s' (see --help)",
                                   argv[optind - 1]);
        default:
            rc = number_option(opt, optarg, o);
            break;
        }
        if (rc != CLI_EXIT_OK)
            return rc;
    }
    return check_capacity_args(argc, argv, o);
}

/* Bytes one block of a spec takes on a rank; false on overflow. */
static bool spec_bytes(const cap_opts_t *o, const cap_spec_t *s, bool repl,
                       uint64_t *out)
{
    uint64_t tokens = s->tmpl.role == KVR_ROLE_INDEX && repl ? o->bs * o->W
                                                             : o->bs;
    uint64_t width = s->tmpl.role == KVR_ROLE_INDEX
                         ? kvr_index_stride(s->tmpl.index_dim)
                         : s->tmpl.page_bytes;
    return !__builtin_mul_overflow(tokens, width, out) &&
           !__builtin_mul_overflow(*out, (uint64_t)s->layers, out);
}

static bool compute(const cap_opts_t *o, bool repl, cap_result_t *out)
{
    cap_result_t r = {0};
    for (size_t i = 0; i < o->num_specs; i++) {
        uint64_t b;
        uint64_t *sum = o->specs[i].tmpl.role == KVR_ROLE_INDEX ? &r.index
                                                                : &r.mla;
        if (!spec_bytes(o, &o->specs[i], repl, &b) ||
            __builtin_add_overflow(*sum, b, sum))
            return false;
    }
    /* Widths and layer counts are >= 1, so per_block > 0 unless it wrapped. */
    if (__builtin_add_overflow(r.mla, r.index, &r.per_block) ||
        r.per_block == 0)
        return false;
    r.blocks = o->budget / r.per_block;
    /* blocks * bs <= budget: cannot overflow; the group total can. */
    r.tokens_rank = r.blocks * o->bs;
    if (__builtin_mul_overflow(r.tokens_rank, o->W, &r.tokens_group))
        return false;
    *out = r;
    return true;
}

static json_t *result_json(const cap_result_t *r)
{
    return json_pack(
        "{s:I,s:I,s:I,s:I,s:I,s:I}", "mla_bytes_per_block", (json_int_t)r->mla,
        "index_bytes_per_block", (json_int_t)r->index, "bytes_per_block",
        (json_int_t)r->per_block, "blocks_per_rank", (json_int_t)r->blocks,
        "tokens_per_rank", (json_int_t)r->tokens_rank, "tokens_per_group",
        (json_int_t)r->tokens_group);
}

static json_t *specs_json(const cap_opts_t *o)
{
    json_t *arr = json_array();
    for (size_t i = 0; i < o->num_specs; i++) {
        const cap_spec_t *s = &o->specs[i];
        uint64_t b = 0;
        spec_bytes(o, s, o->replicate, &b);
        json_t *e = json_pack(
            "{s:s,s:I,s:I}", "role", kvr_role_name(s->tmpl.role), "layers",
            (json_int_t)s->layers, "bytes_per_block", (json_int_t)b);
        if (s->tmpl.role == KVR_ROLE_INDEX) {
            json_object_set_new(e, "index_dim",
                                json_integer(s->tmpl.index_dim));
            json_object_set_new(
                e, "stride",
                json_integer((json_int_t)kvr_index_stride(s->tmpl.index_dim)));
            json_object_set_new(
                e, "page_tokens",
                json_integer(
                    (json_int_t)(o->replicate ? o->bs * o->W : o->bs)));
        } else {
            json_object_set_new(e, "token_bytes",
                                json_integer((json_int_t)s->tmpl.page_bytes));
        }
        json_array_append_new(arr, e);
    }
    return arr;
}

/* Replicated over sharded blocks; main() refuses a budget that holds no
 * block, and the sharded index never holds fewer blocks. */
static double ratio(const cap_result_t *repl, const cap_result_t *shard)
{
    return (double)repl->blocks / (double)shard->blocks;
}

static void print_json(const cap_opts_t *o, const cap_result_t *chosen,
                       const cap_result_t *repl, const cap_result_t *shard)
{
    uint64_t lost = shard->blocks - repl->blocks;
    json_t *cost = json_pack("{s:I,s:I,s:I,s:o}", "blocks", (json_int_t)lost,
                             "tokens_per_rank", (json_int_t)(lost * o->bs),
                             "tokens_per_group",
                             (json_int_t)(lost * o->bs * o->W), "ratio",
                             json_real(ratio(repl, shard)));
    json_t *root = json_pack(
        "{s:I,s:I,s:I,s:b,s:o,s:I,s:I,s:I,s:I,s:o,s:o,s:o}", "budget",
        (json_int_t)o->budget, "block_size", (json_int_t)o->bs, "dcp",
        (json_int_t)o->W, "replicate_index", o->replicate, "regions",
        specs_json(o), "bytes_per_block", (json_int_t)chosen->per_block,
        "blocks_per_rank", (json_int_t)chosen->blocks, "tokens_per_rank",
        (json_int_t)chosen->tokens_rank, "tokens_per_group",
        (json_int_t)chosen->tokens_group, "sharded", result_json(shard),
        "replicated", result_json(repl), "replication_cost", cost);
    char *text = json_dumps(root, JSON_COMPACT | JSON_REAL_PRECISION(6));
    if (text != NULL)
        puts(text);
    free(text);
    json_decref(root);
}

static void print_specs(const cap_opts_t *o)
{
    typedef unsigned long long ull;
    for (size_t i = 0; i < o->num_specs; i++) {
        const cap_spec_t *s = &o->specs[i];
        uint64_t b = 0;
        char what[96];
        spec_bytes(o, s, o->replicate, &b);
        if (s->tmpl.role == KVR_ROLE_INDEX)
            snprintf(what, sizeof(what),
                     "index %4u layers x %5llu tokens x "
                     "%4llu B (D=%u, padded)",
                     s->layers, (ull)(o->replicate ? o->bs * o->W : o->bs),
                     (ull)kvr_index_stride(s->tmpl.index_dim),
                     s->tmpl.index_dim);
        else
            snprintf(what, sizeof(what),
                     "mla   %4u layers x %5llu tokens x "
                     "%4llu B",
                     s->layers, (ull)o->bs, (ull)s->tmpl.page_bytes);
        printf("  %-58s %14llu B\n", what, (ull)b);
    }
}

static void print_text(const cap_opts_t *o, const cap_result_t *chosen,
                       const cap_result_t *repl, const cap_result_t *shard)
{
    typedef unsigned long long ull;
    printf("budget %llu B per rank (%.2f GiB), bs=%llu, W=%llu, index %s\n",
           (ull)o->budget, (double)o->budget / (double)(1ull << 30), (ull)o->bs,
           (ull)o->W, o->replicate ? "replicated" : "sharded");
    puts("bytes per block on one rank:");
    print_specs(o);
    printf("  %-58s %14llu B\n", "total", (ull)chosen->per_block);
    printf("blocks per rank:      %llu\n", (ull)chosen->blocks);
    printf(
        "tokens per rank:      %llu  (blocks x bs: KV slots each rank holds)\n",
        (ull)chosen->tokens_rank);
    printf("tokens per DCP group: %llu  (blocks x bs x W: context the %llu "
           "ranks hold together)\n",
           (ull)chosen->tokens_group, (ull)o->W);
    uint64_t lost = shard->blocks - repl->blocks;
    printf("replication cost: a replicated index holds %llu blocks per rank, a "
           "sharded one %llu:\n",
           (ull)repl->blocks, (ull)shard->blocks);
    printf("  -%llu blocks, -%llu tokens per rank, -%llu tokens per group "
           "(ratio %.4f, %.1f%% fewer)\n",
           (ull)lost, (ull)(lost * o->bs), (ull)(lost * o->bs * o->W),
           ratio(repl, shard), 100.0 * (1.0 - ratio(repl, shard)));
    if (o->W > 1 && !o->replicate)
        puts("note: a sharded index under W > 1 needs I == bs");
}

int cli_cmd_capacity(int argc, char **argv)
{
    cap_opts_t o = {0};
    o.bs = 64;
    o.W = 1;
    int rc = parse_capacity_args(argc, argv, &o);
    if (rc >= 0)
        return rc;
    cap_result_t repl, shard;
    if (!compute(&o, true, &repl) || !compute(&o, false, &shard))
        return cli_usage_error("capacity", "bytes per block or tokens "
                                           "overflow 64 bits for these shapes");
    const cap_result_t *chosen = o.replicate ? &repl : &shard;
    if (chosen->blocks == 0)
        return cli_usage_error(
            "capacity",
            "--budget %llu bytes holds no block "
            "(one block takes %llu bytes); sizes take a unit, "
            "e.g. 80G, 80GiB, 512M",
            (unsigned long long)o.budget,
            (unsigned long long)chosen->per_block);
    if (o.json)
        print_json(&o, chosen, &repl, &shard);
    else
        print_text(&o, chosen, &repl, &shard);
    return CLI_EXIT_OK;
}
