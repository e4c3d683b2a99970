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
    if (kvr_plan_set_create(lay, rank, pairs, num_pairs, req, &set, &err) != KVR_OK) {
        cli_usage_error(cmd, "%s (%s)", err.msg, kvr_status_name(err.code));
        return false;
    }
    if (out != NULL)
        *out = set;
    else
        kvr_plan_set_destroy(set);
    return true;
}

bool cli_parse_u64(const char *text, uint64_t min, uint64_t max,
                        uint64_t *out)
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

bool cli_parse_region(const char *text, kvr_region_desc_t *out,
                           uint32_t *count)
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

static bool parse_random_table(const char *text, uint32_t *ids, size_t n,
                               uint32_t pool)
{
    uint64_t seed;
    if (!cli_parse_u64(text, 0, UINT32_MAX, &seed))
        return false;
    unsigned s = (unsigned)seed;
    uint32_t *perm = malloc((pool + 1) * sizeof(*perm));
    if (perm == NULL)
        return false;
    for (uint32_t i = 0; i < pool; i++)
        perm[i] = i;
    for (uint32_t i = pool; i > 1; i--) {
        uint32_t j = (uint32_t)rand_r(&s) % i, t = perm[i - 1];
        perm[i - 1] = perm[j];
        perm[j] = t;
    }
    memcpy(ids, perm, n * sizeof(*ids));
    free(perm);
    return true;
}

static bool parse_list(const char *text, uint32_t **ids, size_t *n,
                       char *msg, size_t msg_len)
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

bool cli_parse_table(const char *text, size_t need, uint32_t **ids,
                          size_t *n, uint32_t *pool, char *msg,
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
    int random = text != NULL && strncmp(text, "random:", 7) == 0;
    uint32_t size = (uint32_t)(random ? 2 * need + 1 : need);
    uint32_t *out = malloc((need + 1) * sizeof(*out));
    if (out == NULL)
        return false;
    for (size_t i = 0; i < need; i++)
        out[i] = (uint32_t)i;
    if (random && !parse_random_table(text + 7, out, need, size)) {
        snprintf(msg, msg_len, "'%s': expected random:SEED (u32)", text);
        free(out);
        return false;
    }
    *ids = out;
    *n = need;
    *pool = size;
    return true;
}
