/* `kvrelay bench serving`: options, the trace and its schedule. */
#include "serving.h"

#include <errno.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "commands.h"
#include "layout_math.h"

#define SV_MAX_TOKENS (1ull << 20)

static uint64_t mix(uint64_t x)
{
    x += 0x9e3779b97f4a7c15ull;
    x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
    x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
    return x ^ (x >> 31);
}

static int bad(const char *fmt, const char *name, const char *value)
{
    char msg[512];
    snprintf(msg, sizeof(msg), fmt, name, value);
    cli_usage_error("bench serving", "%s", msg);
    return -1;
}

/* A finite number in [0, max]. */
static int real_opt(const char *name, const char *value, double max,
                    double *out)
{
    char *end = NULL;
    errno = 0;
    double v = value ? strtod(value, &end) : -1;
    if (value == NULL || end == value || *end != '\0' || errno != 0 ||
        !isfinite(v) || v < 0 || v > max) {
        char fmt[128];
        snprintf(fmt, sizeof(fmt), "--%%s: '%%s' is not a number in [0, %g]",
                 max);
        return bad(fmt, name, value ? value : "");
    }
    *out = v;
    return 1;
}

static int u64_opt(const char *name, const char *value, uint64_t lo,
                   uint64_t hi, uint64_t *out)
{
    if (cli_parse_u64(value, lo, hi, out))
        return 1;
    cli_usage_error("bench serving", "--%s: '%s' is not a number in [%llu, %llu]",
                    name, value, (unsigned long long)lo,
                    (unsigned long long)hi);
    return -1;
}

/* One length per whitespace-separated word; '#' starts a comment line. */
static int read_lengths(sv_cfg_t *c, const char *path)
{
    FILE *f = fopen(path, "r");
    if (f == NULL) {
        cli_usage_error("bench serving",
                        "--tokens-dist: '%s' is not fixed:N, uniform:A:B or "
                        "a readable file of lengths (%s)",
                        path, strerror(errno));
        return -1;
    }
    char word[64];
    int rc = 1;
    while (rc > 0 && fscanf(f, "%63s", word) == 1) {
        uint64_t v;
        if (word[0] == '#') {
            int ch;
            while ((ch = fgetc(f)) != EOF && ch != '\n')
                ;
            continue;
        }
        if (!cli_parse_u64(word, 1, SV_MAX_TOKENS, &v)) {
            cli_usage_error("bench serving",
                            "--tokens-dist %s: '%s' is not a length in "
                            "[1, %llu]",
                            path, word, SV_MAX_TOKENS);
            rc = -1;
        } else if (c->file_n == SV_MAX_REQUESTS) {
            break; /* lengths are used cyclically: the rest is never read */
        } else {
            c->file_tokens[c->file_n++] = v;
        }
    }
    fclose(f);
    if (rc > 0 && c->file_n == 0) {
        cli_usage_error("bench serving", "--tokens-dist %s: no lengths in it",
                        path);
        rc = -1;
    }
    c->dist = SV_DIST_FILE;
    return rc;
}

static int dist_opt(sv_cfg_t *c, const char *value)
{
    unsigned long long a = 0, b = 0;
    char tail;
    if (strncmp(value, "fixed:", 6) == 0) {
        if (sscanf(value + 6, "%llu%c", &a, &tail) != 1 || a < 1 ||
            a > SV_MAX_TOKENS || strchr(value + 6, '-'))
            return bad("--%s: '%s' is not fixed:N with N in [1, 1048576]",
                       "tokens-dist", value);
        c->dist = SV_DIST_FIXED;
        c->dist_a = c->dist_b = a;
        return 1;
    }
    if (strncmp(value, "uniform:", 8) == 0) {
        if (sscanf(value + 8, "%llu:%llu%c", &a, &b, &tail) != 2 || a < 1 ||
            b < a || b > SV_MAX_TOKENS || strchr(value + 8, '-'))
            return bad("--%s: '%s' is not uniform:A:B with 1 <= A <= B <= "
                       "1048576",
                       "tokens-dist", value);
        c->dist = SV_DIST_UNIFORM;
        c->dist_a = a;
        c->dist_b = b;
        return 1;
    }
    c->file_n = 0;
    if (c->file_tokens == NULL)
        c->file_tokens = calloc(SV_MAX_REQUESTS, sizeof(*c->file_tokens));
    return c->file_tokens ? read_lengths(c, value) : -1;
}

/* Options demo has that mean nothing here. */
static const char *const refused[] = {
    "tokens",  "abort",     "fault",       "dump", "no-reuse",
    "save-to", "load-from", "cuda-device", NULL};

/* --pages' values, indexed by sorted_src * 2 + sorted_dst */
static const char *const page_kinds[] = {"random", "sorted-dst",
                                         "sorted-src", "sorted"};

static int sv_option(void *ctx, const char *name, const char *value)
{
    sv_cfg_t *c = ctx;
    uint64_t v;
    int rc;
    for (int i = 0; refused[i] != NULL; i++)
        if (strcmp(name, refused[i]) == 0)
            return bad("--%s is a demo option bench serving does not take%s",
                       name,
                       i == 0 ? " (lengths come from --tokens-dist)" : "");
    if (strcmp(name, "requests") == 0) {
        rc = u64_opt(name, value, 1, SV_MAX_REQUESTS, &v);
        c->requests = (uint32_t)v;
        return rc;
    }
    if (strcmp(name, "reps") == 0) {
        rc = u64_opt(name, value, 1, SV_MAX_REPS, &v);
        c->reps = (uint32_t)v;
        return rc;
    }
    if (strcmp(name, "rate") == 0)
        return real_opt(name, value, 1e6, &c->rate);
    if (strcmp(name, "prefill-us-per-layer-per-ktoken") == 0)
        return real_opt(name, value, 1e7, &c->prefill_us);
    if (strcmp(name, "tokens-dist") == 0)
        return dist_opt(c, value);
    if (strcmp(name, "layer-group") == 0) {
        rc = u64_opt(name, value, 1, DEMO_MAX_LAYERS, &v);
        c->layer_group = (uint32_t)v;
        return rc;
    }
    if (strcmp(name, "pool-tokens") == 0)
        return u64_opt(name, value, 1, 1ull << 26, &c->pool_tokens);
    if (strcmp(name, "sources") == 0) {
        if (strcmp(value, "shared") != 0 && strcmp(value, "distinct") != 0)
            return bad("--%s: '%s' is not shared or distinct", name, value);
        c->distinct_src = value[0] == 'd';
        return 1;
    }
    if (strcmp(name, "pages") == 0) {
        int k = 0;
        while (k < 4 && strcmp(value, page_kinds[k]) != 0)
            k++;
        if (k == 4)
            return bad("--%s: '%s' is not random, sorted, sorted-src or "
                       "sorted-dst", name, value);
        c->sorted_src = k & 2;
        c->sorted_dst = k & 1;
        return 1;
    }
    if (strcmp(name, "decode-progress") == 0) {
        if (strcmp(value, "wait") != 0 && strcmp(value, "thread") != 0)
            return bad("--%s: '%s' is not wait or thread", name, value);
        c->decode_thread = value[0] == 't';
        c->decode_progress_set = true;
        return 1;
    }
    if (strcmp(name, "prefill") == 0) {
        if (strcmp(value, "host") != 0 && strcmp(value, "gpu") != 0)
            return bad("--%s: '%s' is not host or gpu", name, value);
        c->prefill_gpu = value[0] == 'g';
        return 1;
    }
    if (strcmp(name, "json") == 0) {
        c->json_path = value;
        return 1;
    }
    return 0;
}

static bool set_stream(sv_cfg_t *c, const char *value)
{
    if (strcmp(value, "on") == 0 || strcmp(value, "off") == 0) {
        c->stream[0] = value[1] == 'n';
        c->passes = 1;
    } else if (strcmp(value, "both") == 0) {
        c->stream[0] = false;
        c->stream[1] = true;
        c->passes = 2;
    } else {
        return false;
    }
    return true;
}

/* --stream [on|off|both], --stream=X and --no-stream, taken out of argv
 * before the shared parser sees it (which has no optional values). */
static int take_stream(sv_cfg_t *c, int *argc, char **argv)
{
    int n = 1;
    for (int i = 1; i < *argc; i++) {
        const char *a = argv[i];
        if (strcmp(a, "--no-stream") == 0) {
            set_stream(c, "off");
        } else if (strcmp(a, "--stream") == 0) {
            if (i + 1 < *argc && set_stream(c, argv[i + 1]))
                i++;
            else
                set_stream(c, "on");
        } else if (strncmp(a, "--stream=", 9) == 0) {
            if (!set_stream(c, a + 9))
                return bad("--%s: '%s' is not on, off or both", "stream",
                           a + 9);
        } else {
            argv[n++] = argv[i];
        }
    }
    *argc = n;
    return 1;
}

static const char sv_usage[] =
    "usage: kvrelay bench serving [options]\n"
    "A trace of requests through real agents: P prefill instances of PP\n"
    "stage processes and G decode groups of W rank processes. Each request\n"
    "arrives (Poisson), its simulated prefill makes layers ready one after\n"
    "another (send_ready per layer group), its decode group loads it; every\n"
    "request is verified byte-exact. The same run measures the ceiling (the\n"
    "same bytes as one transfer per (stage, rank) pair) and the round trip\n"
    "of a one-block request on an idle link.\n"
    "  --requests N (32)  --rate R (arrivals/s, 0 = all at once; 0)\n"
    "  --tokens-dist fixed:N | uniform:A:B | FILE (uniform:2048:16384)\n"
    "  --prefill-us-per-layer-per-ktoken US (0)  --layer-group K (1)\n"
    "  --prefill host|gpu (host): the simulated prefill's layer groups are\n"
    "    timed on the host (send_ready once each is due), or compute on\n"
    "    each stage's GPU (--device cuda): a kernel per group on an engine\n"
    "    stream, send_ready at once with the event recorded after it, the\n"
    "    prefill's end when the last group's event completed\n"
    "  --stream [on|off|both] | --no-stream (off)\n"
    "  --reps N (3): the passes and a ceiling after them, N times; the\n"
    "    medians are reported, every repetition in the JSON\n"
    "  --pool-tokens N (destination tokens per group; default: every\n"
    "    request's, so nothing is reused)\n"
    "  --sources shared|distinct (shared): every request reads one shared\n"
    "    source (the ceiling cycles over it), or each its own blocks (the\n"
    "    ceiling reads exactly those; the sources take as much memory as\n"
    "    the destinations)\n"
    "  --pages random|sorted|sorted-src|sorted-dst (random): block tables\n"
    "    are slices of a shuffled pool, or in address order (a fresh\n"
    "    allocator's) on both sides or on one\n"
    "  --decode-progress wait|thread (wait; thread with --device cuda):\n"
    "    decode ranks drive their agents in their waits (kvr_agent_wait, no\n"
    "    progress thread), or run the agent's progress thread and wait on\n"
    "    its event fd\n"
    "  --device host|cuda  --json FILE\n";

int sv_parse(int argc, char **argv, sv_cfg_t *c)
{
    memset(c, 0, sizeof(*c));
    demo_cfg_init(&c->d);
    c->d.reuse = false;
    c->d.requests = 1;
    c->requests = 32;
    c->dist = SV_DIST_UNIFORM;
    c->dist_a = 2048;
    c->dist_b = 16384;
    c->layer_group = 1;
    c->passes = 1;
    c->reps = 3;
    char **args = malloc(((size_t)argc + 1) * sizeof(*args));
    if (args == NULL)
        return CLI_EXIT_FAILED;
    memcpy(args, argv, (size_t)argc * sizeof(*args));
    int n = argc;
    int rc = take_stream(c, &n, args) < 0
                 ? CLI_EXIT_USAGE
                 : demo_parse(n, args, &c->d, "bench serving", sv_usage, NULL,
                              sv_option, c);
    free(args);
    if (rc >= 0)
        return rc;
    /* the layout checked at the largest length a request can have */
    uint64_t most = c->dist_b;
    for (uint32_t i = 0; c->dist == SV_DIST_FILE && i < c->file_n; i++)
        most = c->file_tokens[i] > most ? c->file_tokens[i] : most;
    c->d.tokens = most;
    if (c->d.pp > c->d.layers || !demo_cfg_check(&c->d, "bench serving"))
        return CLI_EXIT_USAGE;
    if (c->d.use_cuda && c->d.exec == KVR_AGENT_EXEC_STAGED)
        return cli_usage_error("bench serving",
                               "--executor staged: KV in CUDA memory moves "
                               "gpu-direct");
    if (c->prefill_gpu && !c->d.use_cuda)
        return cli_usage_error("bench serving", "--prefill gpu: the prefill "
                               "runs on the stages' GPU, which needs "
                               "--device cuda");
    if (c->prefill_gpu && !sv_engine_built())
        return cli_usage_error("bench serving", "--prefill gpu: kvrelay was "
                               "built without CUDA");
    if (!c->decode_progress_set) /* the GPU form as its results were taken */
        c->decode_thread = c->d.use_cuda;
    return -1;
}

void sv_cfg_free(sv_cfg_t *c)
{
    free(c->file_tokens);
    c->file_tokens = NULL;
}

uint64_t sv_vblocks(const sv_cfg_t *cfg, uint64_t n)
{
    uint64_t v = kvr_virtual_block(&cfg->d.lay);
    return (n + v - 1) / v;
}

static uint64_t length_of(const sv_cfg_t *c, uint32_t i)
{
    if (c->dist == SV_DIST_FILE)
        return c->file_tokens[i % c->file_n];
    uint64_t span = c->dist_b - c->dist_a + 1;
    return c->dist_a + mix(c->d.seed ^ 0x7e4u ^ ((uint64_t)i << 20)) % span;
}

/* Exponential gaps of mean 1/rate: a Poisson process. */
static void arrivals(const sv_cfg_t *c, sv_trace_t *t)
{
    double at = 0;
    for (uint32_t i = 0; i < t->n; i++) {
        if (c->rate > 0) {
            uint64_t r = mix(c->d.seed ^ 0xa441u ^ ((uint64_t)i << 24));
            double u = ((double)(r >> 11) + 1.0) / 9007199254740993.0;
            at += -log(u) / c->rate * 1e9;
        }
        t->arrival[i] = (uint64_t)at;
    }
}

/* Each instance's stages run one request at a time, in arrival order: a
 * stage starts request i once it is free and the previous stage handed
 * i's activations over (its last layer). */
static void prefill_schedule(const sv_cfg_t *c, sv_trace_t *t)
{
    uint32_t pp = c->d.pp;
    uint64_t free_at[64][64] = {{0}};
    for (uint32_t i = 0; i < t->n; i++) {
        uint32_t p = demo_instance_of(&c->d, i);
        t->layer_ns[i] = (uint64_t)(c->prefill_us * (double)t->tokens[i]);
        uint64_t ready = t->arrival[i];
        for (uint32_t s = 0; s < pp; s++) {
            uint32_t lo, hi;
            demo_stage_layers(&c->d, s, &lo, &hi);
            uint64_t start = ready > free_at[p][s] ? ready : free_at[p][s];
            t->stage_start[(size_t)i * pp + s] = start;
            ready = start + (hi - lo) * t->layer_ns[i];
            free_at[p][s] = ready;
        }
    }
}

/* Block ids are 32-bit: a pool of n blocks, or the error (fmt names n). */
static bool few_blocks(uint64_t n, const char *fmt)
{
    if (n <= UINT32_MAX / 2)
        return true;
    cli_usage_error("bench serving", fmt, (unsigned long long)n);
    return false;
}

/* Each group's requests take consecutive virtual blocks of a ring, from
 * its start again when the rest does not fit (a rank waits for an earlier
 * request there to be released and verified before it loads into it). */
static bool dst_ring(const sv_cfg_t *c, sv_trace_t *t)
{
    uint64_t need[64] = {0}, most = 1;
    for (uint32_t i = 0; i < t->n; i++) {
        uint64_t v = sv_vblocks(c, t->tokens[i]);
        need[demo_group_of(&c->d, i)] += v;
        most = v > most ? v : most;
    }
    uint64_t pool = 1;
    for (uint32_t g = 0; g < c->d.groups; g++)
        pool = need[g] > pool ? need[g] : pool;
    if (c->pool_tokens > 0)
        pool = sv_vblocks(c, c->pool_tokens);
    if (pool < most) {
        cli_usage_error("bench serving",
                        "--pool-tokens %llu holds %llu virtual blocks, a "
                        "request needs %llu",
                        (unsigned long long)c->pool_tokens,
                        (unsigned long long)pool, (unsigned long long)most);
        return false;
    }
    if (!few_blocks(pool, "a destination pool of %llu blocks is too large "
                          "(use --pool-tokens)"))
        return false;
    t->pool_vblocks = pool;
    uint64_t cursor[64] = {0};
    for (uint32_t i = 0; i < t->n; i++) {
        uint32_t g = demo_group_of(&c->d, i);
        uint64_t v = sv_vblocks(c, t->tokens[i]);
        if (cursor[g] + v > pool)
            cursor[g] = 0;
        t->dst_start[i] = cursor[g];
        cursor[g] += v;
    }
    return true;
}

/* Distinct sources: each instance's requests take consecutive stretches
 * of its source table. */
static bool src_stretches(const sv_cfg_t *c, sv_trace_t *t)
{
    const kvr_layout_t *lay = &c->d.lay;
    t->src_blocks = kvr_num_src_blocks(lay, t->src_tokens);
    if (!c->distinct_src)
        return true;
    uint64_t at[64] = {0}, most = 0;
    t->src_at = calloc(t->n + 1, sizeof(uint64_t));
    if (t->src_at == NULL)
        return false;
    for (uint32_t i = 0; i < t->n; i++) {
        uint32_t p = demo_instance_of(&c->d, i);
        t->src_at[i] = at[p];
        at[p] += kvr_num_src_blocks(lay, t->tokens[i]);
        most = at[p] > most ? at[p] : most;
    }
    if (!few_blocks(most, "--sources distinct: %llu source blocks per "
                          "instance are too many"))
        return false;
    t->src_blocks = most;
    return true;
}

void sv_src_table(const sv_trace_t *t, const uint32_t *table, uint32_t i,
                  uint64_t n, uint32_t *out)
{
    uint64_t at = t->src_at == NULL || i == UINT32_MAX ? 0 : t->src_at[i];
    uint64_t m = t->src_blocks;
    for (uint64_t k = 0; k < n; k++)
        out[k] = table[(at + k) % m];
}

bool sv_trace_build(const sv_cfg_t *c, sv_trace_t *t)
{
    memset(t, 0, sizeof(*t));
    t->n = c->requests;
    t->tokens = calloc(t->n, sizeof(uint64_t));
    t->arrival = calloc(t->n, sizeof(uint64_t));
    t->stage_start = calloc((size_t)t->n * c->d.pp, sizeof(uint64_t));
    t->layer_ns = calloc(t->n, sizeof(uint64_t));
    t->dst_start = calloc(t->n, sizeof(uint64_t));
    if (!t->tokens || !t->arrival || !t->stage_start || !t->layer_ns ||
        !t->dst_start) {
        fprintf(stderr, "kvrelay bench serving: no memory for the trace\n");
        return false;
    }
    uint64_t most = c->d.lay.block_size;
    for (uint32_t i = 0; i < t->n; i++) {
        t->tokens[i] = length_of(c, i);
        t->total_tokens += t->tokens[i];
        most = t->tokens[i] > most ? t->tokens[i] : most;
    }
    arrivals(c, t);
    prefill_schedule(c, t);
    if (!dst_ring(c, t))
        return false;
    /* instance p's ceiling goes to group p mod G; instances sharing a
     * group split its pool */
    uint32_t P = c->d.instances, G = c->d.groups, share = (P + G - 1) / G;
    uint64_t V = kvr_virtual_block(&c->d.lay);
    uint64_t room = t->pool_vblocks / share * V, each = t->total_tokens / P;
    t->ceiling_tokens = room < each ? room : each;
    if (t->ceiling_tokens == 0)
        t->ceiling_tokens = 1;
    t->src_tokens = most; /* the ceiling reads it cyclically */
    return src_stretches(c, t);
}

void sv_trace_free(sv_trace_t *t)
{
    free(t->tokens);
    free(t->arrival);
    free(t->stage_start);
    free(t->layer_ns);
    free(t->dst_start);
    free(t->src_at);
    memset(t, 0, sizeof(*t));
}

uint64_t sv_layer_ready(const sv_cfg_t *cfg, const sv_trace_t *t, uint32_t i,
                        uint32_t stage, uint32_t layer)
{
    uint32_t lo, hi;
    demo_stage_layers(&cfg->d, stage, &lo, &hi);
    return t->stage_start[(size_t)i * cfg->d.pp + stage] +
           (uint64_t)(layer - lo + 1) * t->layer_ns[i];
}

uint64_t sv_prefill_end(const sv_cfg_t *cfg, const sv_trace_t *t, uint32_t i)
{
    uint32_t lo, hi;
    demo_stage_layers(&cfg->d, cfg->d.pp - 1, &lo, &hi);
    return sv_layer_ready(cfg, t, i, cfg->d.pp - 1, hi - 1);
}

uint32_t sv_src_pool(const sv_trace_t *t, const sv_cfg_t *cfg)
{
    (void)cfg;
    return (uint32_t)(t->src_blocks + 7);
}

void sv_perm(uint32_t n, uint64_t seed, uint32_t *out)
{
    for (uint32_t i = 0; i < n; i++)
        out[i] = i;
    uint64_t s = seed;
    for (uint32_t i = n; i > 1; i--) {
        s = mix(s);
        uint32_t j = (uint32_t)(s % i), x = out[i - 1];
        out[i - 1] = out[j];
        out[j] = x;
    }
}

const char *sv_pages_name(const sv_cfg_t *c)
{
    return page_kinds[c->sorted_src * 2 + c->sorted_dst];
}

void sv_pages(const sv_cfg_t *c, bool consumer, uint32_t n, uint64_t seed,
              uint32_t *out)
{
    if (!(consumer ? c->sorted_dst : c->sorted_src)) {
        sv_perm(n, seed, out);
        return;
    }
    for (uint32_t i = 0; i < n; i++)
        out[i] = i;
}

void sv_request_id(char *buf, size_t len, const char *kind, uint32_t a,
                   uint32_t b)
{
    if (strcmp(kind, "t") == 0)
        snprintf(buf, len, "t%u-%u", a, b);
    else
        snprintf(buf, len, "%s-%u-%u", kind, a, b);
}
