/* `kvrelay plan`: print one DCP rank's plan summary (docs/design.md §11). */
#include <getopt.h>
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "commands.h"
#include "plan_pairs.h"

#define MAX_SPECS 64
#define MAX_REGIONS 65536

static const char plan_usage[] =
    "usage: kvrelay plan [--json] --block-size BS --dcp W --rank R\n"
    "                    [--interleave I] --tokens N [--computed-blocks K]\n"
    "                    [--replicate-index] [--no-preshuffle] [--tp T]\n"
    "                    [--tp-rank t] [--producer-tp T]\n"
    "                    [--producer-dcp W_P] [--producer-interleave I_P]\n"
    "                    [--producer-block-size BS_P]\n"
    "                    [--producer-replicate-index]\n"
    "                    [--src-blocks LIST|random:SEED]\n"
    "                    [--dst-blocks LIST|random:SEED]\n"
    "                    [--src-num-blocks B] [--dst-num-blocks B]\n"
    "                    --region mla:TOKEN_BYTES[xCOUNT]\n"
    "                    [--region index:D[:Q][xCOUNT]] ...\n"
    "Regions: mla:TOKEN_BYTES, index:D[:Q], dense:TOKEN_BYTES,\n"
    "dense:H:D:E[:hnd] (H kv heads, head dim D, E bytes per element, K and\n"
    "V planes; head-sharded over TP), state:PAGE_BYTES, other:PAGE_BYTES.\n"
    "Block tables are identity by default; --computed-blocks counts virtual\n"
    "blocks (bs * W tokens). --rank is the consumer's DCP rank, --tp-rank\n"
    "its TP rank (for head-sharded regions). With a sharded producer or a\n"
    "TP reshard the plan lists each producer rank it pulls from; the\n"
    "source table is the one every producer rank shares.\n";

typedef struct {
    kvr_region_desc_t tmpl;
    uint32_t count;
} spec_t;

typedef struct {
    bool json;
    kvr_layout_t lay;
    uint32_t rank, tp_rank;
    uint64_t tokens, computed, src_num_blocks, dst_num_blocks;
    bool have[4]; /* bs, dcp, rank, tokens */
    bool have_tp, have_ptp;
    spec_t specs[MAX_SPECS];
    size_t num_specs;
    const char *src_text, *dst_text;
} plan_opts_t;

enum {
    O_BS = 256,
    O_DCP,
    O_RANK,
    O_I,
    O_TOKENS,
    O_K,
    O_REPL,
    O_NOSHUF,
    O_TP,
    O_PTP,
    O_SRC,
    O_DST,
    O_SRCN,
    O_DSTN,
    O_REGION,
    O_JSON,
    O_HELP,
    O_TPR,
    O_PDCP,
    O_PI,
    O_PBS,
    O_PREPL
};

static const struct option plan_options[] = {
    {"block-size", required_argument, 0, O_BS},
    {"dcp", required_argument, 0, O_DCP},
    {"rank", required_argument, 0, O_RANK},
    {"interleave", required_argument, 0, O_I},
    {"tokens", required_argument, 0, O_TOKENS},
    {"computed-blocks", required_argument, 0, O_K},
    {"replicate-index", no_argument, 0, O_REPL},
    {"no-preshuffle", no_argument, 0, O_NOSHUF},
    {"tp", required_argument, 0, O_TP},
    {"producer-tp", required_argument, 0, O_PTP},
    {"tp-rank", required_argument, 0, O_TPR},
    {"producer-dcp", required_argument, 0, O_PDCP},
    {"producer-interleave", required_argument, 0, O_PI},
    {"producer-block-size", required_argument, 0, O_PBS},
    {"producer-replicate-index", no_argument, 0, O_PREPL},
    {"src-blocks", required_argument, 0, O_SRC},
    {"dst-blocks", required_argument, 0, O_DST},
    {"src-num-blocks", required_argument, 0, O_SRCN},
    {"dst-num-blocks", required_argument, 0, O_DSTN},
    {"region", required_argument, 0, O_REGION},
    {"json", no_argument, 0, O_JSON},
    {"help", no_argument, 0, O_HELP},
    {0, 0, 0, 0},
};

static int number_option(int opt, const char *arg, plan_opts_t *o)
{
    static const char *const names[] = {"block-size",
                                        "dcp",
                                        "rank",
                                        "interleave",
                                        "tokens",
                                        "computed-blocks",
                                        "tp",
                                        "producer-tp",
                                        "src-num-blocks",
                                        "dst-num-blocks",
                                        "tp-rank",
                                        "producer-dcp",
                                        "producer-interleave",
                                        "producer-block-size"};
    static const int ids[] = {O_BS,  O_DCP,  O_RANK, O_I,    O_TOKENS,
                              O_K,   O_TP,   O_PTP,  O_SRCN, O_DSTN,
                              O_TPR, O_PDCP, O_PI,   O_PBS};
    size_t i = 0;
    while (ids[i] != opt)
        i++;
    uint64_t max = (opt == O_TOKENS || opt == O_K) ? (1ull << 40) : UINT32_MAX;
    uint64_t v;
    if (!cli_parse_u64(arg, 0, max, &v))
        return cli_usage_error("plan",
                               "--%s: '%s' is not a number in "
                               "[0, %llu]",
                               names[i], arg, (unsigned long long)max);
    switch (opt) {
    case O_BS:
        o->lay.block_size = (uint32_t)v;
        o->have[0] = true;
        break;
    case O_DCP:
        o->lay.dcp_size = (uint32_t)v;
        o->have[1] = true;
        break;
    case O_RANK:
        o->rank = (uint32_t)v;
        o->have[2] = true;
        break;
    case O_I:
        o->lay.interleave = (uint32_t)v;
        break;
    case O_TOKENS:
        o->tokens = v;
        o->have[3] = true;
        break;
    case O_K:
        o->computed = v;
        break;
    case O_TP:
        o->lay.tp = (uint32_t)v;
        o->have_tp = true;
        break;
    case O_PTP:
        o->lay.producer_tp = (uint32_t)v;
        o->have_ptp = true;
        break;
    case O_SRCN:
        o->src_num_blocks = v;
        break;
    case O_TPR:
        o->tp_rank = (uint32_t)v;
        break;
    case O_PDCP:
        o->lay.producer_dcp = (uint32_t)v;
        break;
    case O_PI:
        o->lay.producer_interleave = (uint32_t)v;
        break;
    case O_PBS:
        o->lay.producer_block_size = (uint32_t)v;
        break;
    default:
        o->dst_num_blocks = v;
        break;
    }
    return CLI_EXIT_OK;
}

static int region_option(const char *arg, plan_opts_t *o)
{
    if (o->num_specs == MAX_SPECS)
        return cli_usage_error("plan", "more than %d --region options",
                               MAX_SPECS);
    spec_t *s = &o->specs[o->num_specs];
    bool heads = strncmp(arg, "dense:", 6) == 0 && strchr(arg + 6, ':');
    if (heads ? !cli_parse_dense(arg, &s->tmpl, &s->count)
              : !cli_parse_region(arg, &s->tmpl, &s->count))
        return cli_usage_error("plan",
                               "--region '%s': expected "
                               "mla:TOKEN_BYTES[xCOUNT], index:D[:Q][xCOUNT], "
                               "dense:TOKEN_BYTES, dense:H:D:E[:hnd][xCOUNT], "
                               "state:PAGE_BYTES or other:PAGE_BYTES",
                               arg);
    o->num_specs++;
    return CLI_EXIT_OK;
}

/* Returns -1 to continue, else an exit code. */
static int parse_plan_args(int argc, char **argv, plan_opts_t *o)
{
    int opt, rc;
    optind = 1;
    opterr = 0;
    while ((opt = getopt_long(argc, argv, "", plan_options, NULL)) != -1) {
        switch (opt) {
        case O_REGION:
            rc = region_option(optarg, o);
            break;
        case O_REPL:
            o->lay.replicate_index = true;
            rc = 0;
            break;
        case O_PREPL:
            o->lay.producer_replicate_index = true;
            rc = 0;
            break;
        case O_NOSHUF:
            o->lay.preshuffle = false;
            rc = 0;
            break;
        case O_SRC:
            o->src_text = optarg;
            rc = 0;
            break;
        case O_DST:
            o->dst_text = optarg;
            rc = 0;
            break;
        case O_JSON:
            o->json = true;
            rc = 0;
            break;
        case O_HELP:
            fputs(plan_usage, stdout);
            return CLI_EXIT_OK;
        case '?':
            return cli_usage_error("plan",
                                   "unknown or incomplete option "
                                   "'%s' (see --help)",
                                   argv[optind - 1]);
        default:
            rc = number_option(opt, optarg, o);
            break;
        }
        if (rc != CLI_EXIT_OK)
            return rc;
    }
    if (optind < argc)
        return cli_usage_error("plan", "unexpected argument '%s'",
                               argv[optind]);
    static const char *const req[] = {"--block-size", "--dcp", "--rank",
                                      "--tokens"};
    for (int i = 0; i < 4; i++)
        if (!o->have[i])
            return cli_usage_error("plan", "%s is required", req[i]);
    if (o->num_specs == 0)
        return cli_usage_error("plan", "at least one --region is required");
    if (!o->have_tp)
        o->lay.tp = o->lay.dcp_size;
    if (!o->have_ptp) /* one TP rank per producer DCP rank, as for --tp */
        o->lay.producer_tp = kvr_producer_dcp(&o->lay);
    return -1;
}

typedef struct {
    uint32_t *src, *dst;
    size_t nsrc, ndst;
    uint32_t src_pool, dst_pool;
    kvr_region_pair_t *pairs;
    size_t num_pairs;
} plan_input_t;

static void free_input(plan_input_t *in)
{
    free(in->src);
    free(in->dst);
    free(in->pairs);
}

static int build_tables(const plan_opts_t *o, plan_input_t *in)
{
    char msg[160];
    kvr_error_t err = {0};
    if (kvr_layout_check_rank(&o->lay, o->rank, &err) != KVR_OK)
        return cli_usage_error("plan", "%s", err.msg);
    /* the table every producer rank shares: one entry per bs_p * W_p */
    uint64_t vp = (uint64_t)kvr_producer_block_size(&o->lay) *
                  kvr_producer_dcp(&o->lay);
    uint64_t need_src = (o->tokens + vp - 1) / vp;
    uint64_t need_dst = kvr_num_dst_blocks(&o->lay, o->tokens);
    if (!cli_parse_table(o->src_text, need_src, o->src_num_blocks, &in->src,
                         &in->nsrc, &in->src_pool, msg, sizeof(msg)))
        return cli_usage_error("plan", "--src-blocks: %s", msg);
    if (!cli_parse_table(o->dst_text, need_dst, o->dst_num_blocks, &in->dst,
                         &in->ndst, &in->dst_pool, msg, sizeof(msg)))
        return cli_usage_error("plan", "--dst-blocks: %s", msg);
    if (o->src_num_blocks)
        in->src_pool = (uint32_t)o->src_num_blocks;
    if (o->dst_num_blocks)
        in->dst_pool = (uint32_t)o->dst_num_blocks;
    return -1;
}

/* Producer and consumer descriptions of one region from its template. */
static kvr_region_pair_t make_pair(const plan_opts_t *o, const plan_input_t *in,
                                   const kvr_region_desc_t *t, uint32_t layer)
{
    kvr_region_pair_t p = {*t, *t};
    p.src.layer = p.dst.layer = layer;
    p.src.num_blocks = in->src_pool ? in->src_pool : 1;
    p.dst.num_blocks = in->dst_pool ? in->dst_pool : 1;
    uint64_t bs = o->lay.block_size, bsp = kvr_producer_block_size(&o->lay);
    if (t->role == KVR_ROLE_DENSE && t->heads != 0) {
        p.src.page_bytes = kvr_dense_page_bytes(&o->lay, t, false);
        p.dst.page_bytes = kvr_dense_page_bytes(&o->lay, t, true);
    } else if (t->role == KVR_ROLE_MLA || t->role == KVR_ROLE_DENSE) {
        p.src.page_bytes = bsp * t->page_bytes;
        p.dst.page_bytes = bs * t->page_bytes;
    } else if (t->role == KVR_ROLE_INDEX) {
        uint64_t c = kvr_index_stride(t->index_dim);
        p.src.page_bytes = kvr_index_page_tokens(&o->lay, false) * c;
        p.dst.page_bytes = kvr_index_page_tokens(&o->lay, true) * c;
    }
    return p;
}

static int build_pairs(const plan_opts_t *o, plan_input_t *in)
{
    size_t total = 0;
    for (size_t s = 0; s < o->num_specs; s++)
        total += o->specs[s].count;
    if (total > MAX_REGIONS)
        return cli_usage_error("plan", "%zu regions exceed the limit of %d",
                               total, MAX_REGIONS);
    in->pairs = calloc(total, sizeof(*in->pairs));
    if (in->pairs == NULL)
        return cli_usage_error("plan", "out of memory");
    for (size_t s = 0; s < o->num_specs; s++)
        for (uint32_t c = 0; c < o->specs[s].count; c++, in->num_pairs++)
            in->pairs[in->num_pairs] = make_pair(o, in, &o->specs[s].tmpl,
                                                 (uint32_t)in->num_pairs);
    return -1;
}

/* What was planned: per region pair totals, and with several producer
 * ranks the sources they came from (NULL otherwise). */
typedef struct {
    cli_totals_t *per_pair;
    uint64_t total_runs, total_bytes;
    const cli_pair_plan_t *pairs;
} plan_out_t;

static cli_totals_t spec_totals(const plan_out_t *out, size_t first,
                                uint32_t count)
{
    cli_totals_t t = {0, 0, 0};
    for (size_t i = first; i < first + count; i++) {
        t.runs += out->per_pair[i].runs;
        t.uncoalesced += out->per_pair[i].uncoalesced;
        t.bytes += out->per_pair[i].bytes;
    }
    return t;
}

static json_t *json_region(const spec_t *sp, cli_totals_t t)
{
    json_t *r = json_pack(
        "{s:s,s:I,s:I,s:I,s:I}", "role", kvr_role_name(sp->tmpl.role), "count",
        (json_int_t)sp->count, "runs", (json_int_t)t.runs, "runs_uncoalesced",
        (json_int_t)t.uncoalesced, "bytes", (json_int_t)t.bytes);
    if (sp->tmpl.role == KVR_ROLE_INDEX)
        json_object_set_new(r, "index_dim", json_integer(sp->tmpl.index_dim));
    else if (sp->tmpl.heads != 0) {
        json_object_set_new(r, "heads", json_integer(sp->tmpl.heads));
        json_object_set_new(r, "head_dim", json_integer(sp->tmpl.head_dim));
        json_object_set_new(r, "elem_bytes", json_integer(sp->tmpl.elem_bytes));
        json_object_set_new(r, "order",
                            json_string(sp->tmpl.hnd ? "hnd" : "nhd"));
    } else
        json_object_set_new(r, "width",
                            json_integer((json_int_t)sp->tmpl.page_bytes));
    return r;
}

static const char *axis_word(kvr_axis_t axis)
{
    return axis == KVR_AXIS_TP ? "tp" : "dcp";
}

/* With several producer ranks: the producer fields, the consumer's tp rank
 * and one source per producer rank pulled from. */
static void json_pairs(const plan_opts_t *o, const cli_pair_plan_t *pp,
                       json_t *root)
{
    json_t *src = json_array();
    for (size_t i = 0; i < pp->num_sources; i++) {
        const cli_source_t *s = &pp->sources[i];
        json_array_append_new(
            src,
            json_pack("{s:I,s:s,s:I,s:I}", "producer_rank", (json_int_t)s->rank,
                      "axis", axis_word(s->axis), "runs", (json_int_t)s->runs,
                      "bytes", (json_int_t)s->bytes));
    }
    json_object_set_new(root, "sources", src);
    json_object_set_new(root, "tp_rank", json_integer(o->tp_rank));
    json_object_set_new(root, "tp", json_integer(o->lay.tp));
    json_object_set_new(root, "producer_tp", json_integer(o->lay.producer_tp));
    json_object_set_new(root, "producer_dcp",
                        json_integer(kvr_producer_dcp(&o->lay)));
    json_object_set_new(root, "producer_interleave",
                        json_integer(kvr_producer_interleave(&o->lay)));
    json_object_set_new(root, "producer_block_size",
                        json_integer(kvr_producer_block_size(&o->lay)));
    json_object_set_new(root, "producer_replicate_index",
                        json_boolean(o->lay.producer_replicate_index));
}

static void print_json(const plan_opts_t *o, const plan_out_t *out,
                       const char *digest)
{
    json_t *regions = json_array();
    size_t first = 0;
    for (size_t s = 0; s < o->num_specs; s++) {
        const spec_t *sp = &o->specs[s];
        json_array_append_new(
            regions, json_region(sp, spec_totals(out, first, sp->count)));
        first += sp->count;
    }
    json_t *root = json_pack(
        "{s:I,s:I,s:I,s:I,s:I,s:I,s:b,s:b,s:s,s:o,s:I,s:I,s:s}", "rank",
        (json_int_t)o->rank, "dcp", (json_int_t)o->lay.dcp_size, "interleave",
        (json_int_t)o->lay.interleave, "block_size",
        (json_int_t)o->lay.block_size, "tokens", (json_int_t)o->tokens,
        "computed_blocks", (json_int_t)o->computed, "replicate_index",
        o->lay.replicate_index, "preshuffle", o->lay.preshuffle, "block_tables",
        (o->src_text || o->dst_text) ? "given" : "identity", "regions", regions,
        "total_runs", (json_int_t)out->total_runs, "total_bytes",
        (json_int_t)out->total_bytes, "digest", digest);
    if (out->pairs != NULL)
        json_pairs(o, out->pairs, root);
    char *text = json_dumps(root, JSON_COMPACT);
    if (text != NULL)
        puts(text);
    free(text);
    json_decref(root);
}

static void width_text(const kvr_region_desc_t *t, char *buf, size_t cap)
{
    if (t->role == KVR_ROLE_INDEX)
        snprintf(buf, cap, "D=%u", t->index_dim);
    else if (t->heads != 0)
        snprintf(buf, cap, "%ux%ux%u%s", t->heads, t->head_dim, t->elem_bytes,
                 t->hnd ? "h" : "");
    else
        snprintf(buf, cap, "%llu B", (unsigned long long)t->page_bytes);
}

static void print_sources(const plan_opts_t *o, const cli_pair_plan_t *pp)
{
    printf("producer W_p=%u, I_p=%u, bs_p=%u, TP %u -> %u (tp rank %u)\n",
           kvr_producer_dcp(&o->lay), kvr_producer_interleave(&o->lay),
           kvr_producer_block_size(&o->lay), o->lay.producer_tp, o->lay.tp,
           o->tp_rank);
    for (size_t i = 0; i < pp->num_sources; i++)
        printf("source: producer %s rank %u: %llu runs, %llu bytes\n",
               axis_word(pp->sources[i].axis), pp->sources[i].rank,
               (unsigned long long)pp->sources[i].runs,
               (unsigned long long)pp->sources[i].bytes);
}

static void print_table(const plan_opts_t *o, const plan_input_t *in,
                        const plan_out_t *out, const char *digest)
{
    printf("rank %u of W=%u, I=%u, bs=%u, %llu tokens, computed blocks %llu, "
           "index %s%s\n",
           o->rank, o->lay.dcp_size, o->lay.interleave, o->lay.block_size,
           (unsigned long long)o->tokens, (unsigned long long)o->computed,
           o->lay.replicate_index ? "replicated" : "sharded",
           o->lay.preshuffle ? ", preshuffled" : "");
    printf("block tables: %s (%zu source, %zu destination ids)\n",
           (o->src_text || o->dst_text) ? "given" : "identity", in->nsrc,
           in->ndst);
    if (out->pairs != NULL)
        print_sources(o, out->pairs);
    printf("%-6s %6s %10s %12s %16s %14s\n", "role", "count", "width", "runs",
           "runs_uncoalesced", "bytes");
    size_t first = 0;
    for (size_t s = 0; s < o->num_specs; s++) {
        const spec_t *sp = &o->specs[s];
        cli_totals_t t = spec_totals(out, first, sp->count);
        char width[48];
        width_text(&sp->tmpl, width, sizeof(width));
        printf("%-6s %6u %10s %12llu %16llu %14llu\n",
               kvr_role_name(sp->tmpl.role), sp->count, width,
               (unsigned long long)t.runs, (unsigned long long)t.uncoalesced,
               (unsigned long long)t.bytes);
        first += sp->count;
    }
    printf("total: %llu runs, %llu bytes; layout digest %s\n",
           (unsigned long long)out->total_runs,
           (unsigned long long)out->total_bytes, digest);
}

/* Today's single producer: one plan set for the rank. */
static int plan_single(const plan_opts_t *o, const plan_input_t *in,
                       const kvr_request_t *req, plan_out_t *out)
{
    kvr_plan_set_t *set = NULL;
    if (!cli_check_plan("plan", &o->lay, o->rank, in->pairs, in->num_pairs, req,
                        &set))
        return CLI_EXIT_USAGE;
    for (size_t i = 0; i < in->num_pairs; i++) {
        const kvr_plan_t *p = kvr_plan_set_plan_of(set, i);
        out->per_pair[i] = (cli_totals_t){kvr_plan_num_runs(p),
                                          kvr_plan_runs_uncoalesced(p),
                                          kvr_plan_bytes(p)};
    }
    out->total_runs = kvr_plan_set_total_runs(set);
    out->total_bytes = kvr_plan_set_total_bytes(set);
    kvr_plan_set_destroy(set);
    return -1;
}

/* The digest from the producer's regions, read with its block size. */
static int digest_hex(const plan_opts_t *o, const plan_input_t *in,
                      char hex[17])
{
    kvr_error_t err = {0};
    kvr_region_desc_t *descs = calloc(in->num_pairs + 1, sizeof(*descs));
    uint64_t digest = 0;
    for (size_t i = 0; descs && i < in->num_pairs; i++)
        descs[i] = in->pairs[i].src;
    kvr_status_t st = descs ? kvr_layout_digest_side(&o->lay, descs,
                                                     in->num_pairs, false,
                                                     &digest, &err)
                            : KVR_ERR_NO_MEMORY;
    free(descs);
    if (st != KVR_OK)
        return cli_usage_error("plan", "digest: %s", kvr_status_str(st));
    kvr_digest_hex(digest, hex);
    return -1;
}

static int run_plan(const plan_opts_t *o, plan_input_t *in)
{
    kvr_request_t req = {in->src,  in->nsrc,  in->dst,
                         in->ndst, o->tokens, o->computed};
    cli_pair_plan_t pp = {0};
    plan_out_t out = {0};
    kvr_error_t err = {0};
    int rc = -1;
    if (cli_plan_needs_pairs(&o->lay, in->pairs, in->num_pairs)) {
        if (cli_plan_pairs(&o->lay, o->rank, o->tp_rank, in->pairs,
                           in->num_pairs, &req, &pp, &err) != KVR_OK)
            return cli_usage_error("plan", "%s (%s)", err.msg,
                                   kvr_status_name(err.code));
        out = (plan_out_t){pp.per_pair, pp.total_runs, pp.total_bytes, &pp};
    } else {
        out.per_pair = calloc(in->num_pairs + 1, sizeof(*out.per_pair));
        rc = out.per_pair ? plan_single(o, in, &req, &out)
                          : cli_usage_error("plan", "out of memory");
    }
    char hex[17];
    if (rc < 0)
        rc = digest_hex(o, in, hex);
    if (rc < 0 && o->json)
        print_json(o, &out, hex);
    else if (rc < 0)
        print_table(o, in, &out, hex);
    if (out.pairs != NULL)
        cli_pair_plan_free(&pp);
    else
        free(out.per_pair);
    return rc < 0 ? CLI_EXIT_OK : rc;
}

int cli_cmd_plan(int argc, char **argv)
{
    plan_opts_t o = {0};
    o.lay = (kvr_layout_t)KVR_LAYOUT_INIT;
    o.lay.interleave = 1;
    int rc = parse_plan_args(argc, argv, &o);
    if (rc >= 0)
        return rc;
    plan_input_t in = {0};
    rc = build_tables(&o, &in);
    if (rc < 0)
        rc = build_pairs(&o, &in);
    if (rc < 0)
        rc = run_plan(&o, &in);
    free_input(&in);
    return rc;
}
