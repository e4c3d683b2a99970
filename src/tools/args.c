/* Shared CLI argument parsing: strict, with messages naming the value. */
#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "commands.h"

int cli_usage_error(const char *cmd, const char *fmt, ...)
{
    va_list ap;
    fprintf(stderr, "kvrelay %s: ", cmd);
    va_start(ap, fmt);
    vfprintf(stderr, fmt, ap);
    va_end(ap);
    fputc('\n', stderr);
    return CLI_EXIT_USAGE;
}

bool cli_check_plan(const char *cmd, const kvr_layout_t *lay, uint32_t rank,
                    const kvr_region_pair_t *pairs, size_t num_pairs,
                    const kvr_request_t *req, kvr_plan_set_t **out)
{
    kvr_error_t err = {0};
    kvr_plan_set_t *set = NULL;
    if (kvr_plan_set_create(lay, rank, pairs, num_pairs, req, &set, &err) !=
        KVR_OK) {
        cli_usage_error(cmd, "%s (%s)", err.msg, kvr_status_name(err.code));
        return false;
    }
    if (out != NULL)
        *out = set;
    else
        kvr_plan_set_destroy(set);
    return true;
}

bool cli_parse_u64(const char *text, uint64_t min, uint64_t max, uint64_t *out)
{
    if (text == NULL || *text < '0' || *text > '9')
        return false;
    char *end = NULL;
    errno = 0;
    unsigned long long v = strtoull(text, &end, 10);
    if (errno != 0 || *end != '\0' || v < min || v > max)
        return false;
    *out = v;
    return true;
}

/* "WIDTH[:Q][xCOUNT]" after the role prefix. */
static bool parse_widths(char *spec, uint64_t *w, uint64_t *q, uint32_t *count)
{
    uint64_t c = 1;
    char *x = strchr(spec, 'x');
    if (x != NULL) {
        *x = '\0';
        if (!cli_parse_u64(x + 1, 1, 1u << 20, &c))
            return false;
    }
    char *colon = strchr(spec, ':');
    *q = 0;
    if (colon != NULL) {
        *colon = '\0';
        if (!cli_parse_u64(colon + 1, 1, 1u << 20, q))
            return false;
    }
    *count = (uint32_t)c;
    return cli_parse_u64(spec, 1, 1ull << 32, w);
}

bool cli_parse_region(const char *text, kvr_region_desc_t *out, uint32_t *count)
{
    char buf[128];
    const char *colon = strchr(text, ':');
    if (colon == NULL || strlen(text) >= sizeof(buf))
        return false;
    memcpy(buf, text, (size_t)(colon - text));
    buf[colon - text] = '\0';
    kvr_region_desc_t r = {0};
    if (kvr_role_parse(buf, &r.role) != KVR_OK || r.role == KVR_ROLE_STAGING)
        return false;
    snprintf(buf, sizeof(buf), "%s", colon + 1);
    uint64_t w, q;
    if (!parse_widths(buf, &w, &q, count))
        return false;
    if (r.role == KVR_ROLE_INDEX) {
        r.index_dim = (uint32_t)w;
        r.quant_block = q ? (uint32_t)q : (uint32_t)w;
    } else if (q != 0) {
        return false;
    } else {
        r.page_bytes = w; /* token bytes (MLA, DENSE) or page bytes */
    }
    *out = r;
    return true;
}

/* splitmix64: a full 64-bit stream from a seed. */
static uint64_t next_random(uint64_t *state)
{
    uint64_t x = (*state += 0x9e3779b97f4a7c15ull);
    x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
    x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
    return x ^ (x >> 31);
}

/* The permutation's entries that moved, in an open-addressed table: a
 * prefix of a permutation of a large pool costs memory for the prefix
 * only. Keys are stored plus one, so 0 marks an empty slot. */
typedef struct {
    uint64_t *keys;
    uint32_t *vals;
    size_t mask;
} moved_t;

static uint32_t *moved_slot(moved_t *m, uint64_t key)
{
    size_t i = (size_t)(key * 0x9e3779b97f4a7c15ull) & m->mask;
    while (m->keys[i] != 0 && m->keys[i] != key + 1)
        i = (i + 1) & m->mask;
    if (m->keys[i] == 0) {
        m->keys[i] = key + 1;
        m->vals[i] = (uint32_t)key; /* unmoved: the identity */
    }
    return &m->vals[i];
}

/* The first n entries of a seeded permutation of [0, pool): a partial
 * Fisher-Yates shuffle from the front. */
static bool random_prefix(uint64_t seed, uint32_t *ids, size_t n, uint64_t pool)
{
    size_t cap = 4;
    while (cap < 2 * n + 2)
        cap *= 2;
    moved_t m = {calloc(cap, sizeof(uint64_t)), calloc(cap, sizeof(uint32_t)),
                 cap - 1};
    bool ok = m.keys != NULL && m.vals != NULL;
    uint64_t state = seed;
    for (size_t i = 0; ok && i < n; i++) {
        uint64_t j = i + next_random(&state) % (pool - i);
        uint32_t *at_j = moved_slot(&m, j);
        ids[i] = *at_j;
        *at_j = *moved_slot(&m, i);
    }
    free(m.keys);
    free(m.vals);
    return ok;
}

static bool parse_list(const char *text, uint32_t **ids, size_t *n, char *msg,
                       size_t msg_len)
{
    size_t cap = 1;
    for (const char *c = text; *c; c++)
        cap += (*c == ',');
    uint32_t *out = malloc(cap * sizeof(*out));
    if (out == NULL)
        return false;
    size_t i = 0;
    for (const char *p = text; i < cap; i++) {
        size_t len = strcspn(p, ",");
        uint64_t v;
        char item[32];
        snprintf(item, sizeof(item), "%.*s", (int)(len < 31 ? len : 31), p);
        if (len >= 31 || !cli_parse_u64(item, 0, UINT32_MAX - 1, &v)) {
            snprintf(msg, msg_len, "block id '%s' is not a u32", item);
            free(out);
            return false;
        }
        out[i] = (uint32_t)v;
        p += len + (p[len] == ',');
    }
    *ids = out;
    *n = cap;
    return true;
}

/* A table of `need` ids: identity, or random over a pool of `pool` ids. */
static bool generated_table(const char *text, uint64_t need, uint64_t pool,
                            uint32_t **ids, char *msg, size_t msg_len)
{
    bool random = text != NULL && strncmp(text, "random:", 7) == 0;
    uint64_t seed = 0;
    if (random && !cli_parse_u64(text + 7, 0, UINT32_MAX, &seed)) {
        snprintf(msg, msg_len, "'%s': expected random:SEED (u32)", text);
        return false;
    }
    uint32_t *out = malloc((size_t)(need + 1) * sizeof(*out));
    if (out == NULL ||
        (random && !random_prefix(seed, out, (size_t)need, pool))) {
        snprintf(msg, msg_len, "no memory for a table of %llu block ids",
                 (unsigned long long)need);
        free(out);
        return false;
    }
    for (uint64_t i = 0; !random && i < need; i++)
        out[i] = (uint32_t)i;
    *ids = out;
    return true;
}

bool cli_parse_table(const char *text, uint64_t need, uint64_t pool_size,
                     uint32_t **ids, size_t *n, uint32_t *pool, char *msg,
                     size_t msg_len)
{
    if (text != NULL && strncmp(text, "random:", 7) != 0 &&
        strcmp(text, "identity") != 0) {
        if (!parse_list(text, ids, n, msg, msg_len))
            return false;
        *pool = 0;
        for (size_t i = 0; i < *n; i++)
            *pool = (*ids)[i] + 1 > *pool ? (*ids)[i] + 1 : *pool;
        return true;
    }
    /* ids are u32 below UINT32_MAX, so a table holds at most UINT32_MAX */
    if (need > UINT32_MAX) {
        snprintf(msg, msg_len,
                 "a table of %llu block ids is beyond u32 block ids",
                 (unsigned long long)need);
        return false;
    }
    bool random = text != NULL && strncmp(text, "random:", 7) == 0;
    uint64_t size = pool_size ? pool_size : random ? 2 * need + 1 : need;
    if (size > UINT32_MAX)
        size = UINT32_MAX;
    if (size < need) {
        snprintf(msg, msg_len,
                 "a pool of %llu blocks is smaller than the %llu "
                 "blocks the tokens need",
                 (unsigned long long)size, (unsigned long long)need);
        return false;
    }
    if (!generated_table(text, need, size, ids, msg, msg_len))
        return false;
    *n = (size_t)need;
    *pool = (uint32_t)size;
    return true;
}
