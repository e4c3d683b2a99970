/* Dump directories for inspect (docs/dump-format.md): a manifest that may be
 * hostile is parsed strictly (every number range-checked, every allocation
 * bounded by the manifest's own size), page images are mapped only when
 * their size equals num_blocks * page_bytes, then every request x region x
 * rank goes through kvr_inspect_buffers. */
#include <fcntl.h>
#include <jansson.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include "kvrelay/inspect.h"

typedef unsigned long long ull;

#define MANIFEST_MAX_BYTES (256ull << 20)
#define MAX_DCP 4096u
#define MAX_REGIONS 65536u
#define MAX_REQUESTS 65536u
#define MAX_ID_BYTES 256u
#define MAX_TOKENS (1ull << 40)
#define MAX_IMAGE_BYTES (1ull << 48)
#define MAX_REPORT 1000u
#define MAX_INDEX_DIM 65536u

typedef struct {
    kvr_region_pair_t pair;
    char *src_file;
    char **dst_files; /* W names */
    kvr_inspect_result_t res;
} dump_region_t;

typedef struct {
    char *id;
    kvr_request_t req;
    uint32_t *src, *dst, *token_ids; /* token_ids: NULL when absent */
} dump_request_t;

struct kvr_inspect_report {
    kvr_layout_t lay;
    kvr_inspect_opts_t opts;
    bool have_seed;
    uint64_t seed;
    dump_region_t *regions;
    size_t num_regions;
    dump_request_t *requests;
    size_t num_requests;
};

typedef struct {
    void *p;
    size_t len;
} map_t;

/* ---- strict manifest getters; `where` names the field in messages ---- */

static kvr_status_t bad(kvr_error_t *err, const char *where, const char *key,
                        const char *what)
{
    return kvr_error_set(err, KVR_ERR_INVALID, "manifest %s%s%s: %s", where,
                         *where ? "." : "", key, what);
}

static kvr_status_t get_u64(json_t *obj, const char *where, const char *key,
                            uint64_t min, uint64_t max, uint64_t *out,
                            kvr_error_t *err)
{
    json_t *v = json_object_get(obj, key);
    char what[96];
    if (v == NULL)
        return bad(err, where, key, "missing");
    json_int_t x = json_is_integer(v) ? json_integer_value(v) : -1;
    if (!json_is_integer(v) || x < 0 || (uint64_t)x < min ||
        (uint64_t)x > max) {
        snprintf(what, sizeof(what), "not an integer in [%llu, %llu]", (ull)min,
                 (ull)max);
        return bad(err, where, key, what);
    }
    *out = (uint64_t)x;
    return KVR_OK;
}

static kvr_status_t get_u32(json_t *obj, const char *where, const char *key,
                            uint32_t min, uint32_t max, uint32_t *out,
                            kvr_error_t *err)
{
    uint64_t v;
    kvr_status_t st = get_u64(obj, where, key, min, max, &v, err);
    if (st == KVR_OK)
        *out = (uint32_t)v;
    return st;
}

static kvr_status_t get_bool(json_t *obj, const char *where, const char *key,
                             bool *out, kvr_error_t *err)
{
    json_t *v = json_object_get(obj, key);
    if (!json_is_boolean(v))
        return bad(err, where, key, v ? "not true or false" : "missing");
    *out = json_is_true(v);
    return KVR_OK;
}

/* A non-empty string without NUL bytes, copied. */
static kvr_status_t str_value(json_t *v, const char *where, size_t max,
                              char **out, kvr_error_t *err)
{
    if (!json_is_string(v))
        return kvr_error_set(err, KVR_ERR_INVALID, "manifest %s: %s", where,
                             v ? "not a string" : "missing");
    size_t n = json_string_length(v);
    if (n == 0 || n > max || memchr(json_string_value(v), '\0', n) != NULL)
        return kvr_error_set(err, KVR_ERR_INVALID,
                             "manifest %s: empty, longer "
                             "than %zu bytes or holding NUL",
                             where, max);
    *out = strdup(json_string_value(v));
    return *out ? KVR_OK : kvr_error_set(err, KVR_ERR_NO_MEMORY, "no memory");
}

static kvr_status_t get_str(json_t *obj, const char *where, const char *key,
                            size_t max, char **out, kvr_error_t *err)
{
    char w[128];
    snprintf(w, sizeof(w), "%s%s%s", where, *where ? "." : "", key);
    return str_value(json_object_get(obj, key), w, max, out, err);
}

static kvr_status_t get_obj(json_t *obj, const char *where, const char *key,
                            json_t **out, kvr_error_t *err)
{
    *out = json_object_get(obj, key);
    return json_is_object(*out) ? KVR_OK
                                : bad(err, where, key, "not an object");
}

static kvr_status_t get_array(json_t *obj, const char *where, const char *key,
                              size_t max, json_t **out, kvr_error_t *err)
{
    char what[64];
    *out = json_object_get(obj, key);
    if (!json_is_array(*out))
        return bad(err, where, key, *out ? "not an array" : "missing");
    if (json_array_size(*out) > max) {
        snprintf(what, sizeof(what), "more than %zu entries", max);
        return bad(err, where, key, what);
    }
    return KVR_OK;
}

/* An array of u32 (block ids, token ids); *out NULL for an empty one. */
static kvr_status_t get_u32s(json_t *obj, const char *where, const char *key,
                             uint32_t **out, size_t *n, kvr_error_t *err)
{
    json_t *arr, *v;
    size_t i;
    kvr_status_t st = get_array(obj, where, key, SIZE_MAX / 4, &arr, err);
    if (st != KVR_OK)
        return st;
    *n = json_array_size(arr);
    *out = *n ? malloc(*n * sizeof(**out)) : NULL;
    if (*n && *out == NULL)
        return kvr_error_set(err, KVR_ERR_NO_MEMORY, "no memory for %zu ids",
                             *n);
    json_array_foreach(arr, i, v)
    {
        json_int_t x = json_is_integer(v) ? json_integer_value(v) : -1;
        if (x < 0 || x > (json_int_t)UINT32_MAX) {
            free(*out);
            *out = NULL;
            return bad(err, where, key, "holds an entry that is not a u32");
        }
        (*out)[i] = (uint32_t)x;
    }
    return KVR_OK;
}

/* ---- manifest sections ---- */

static kvr_status_t parse_layout(json_t *root, kvr_layout_t *lay,
                                 kvr_error_t *err)
{
    json_t *o;
    kvr_status_t st = get_obj(root, "", "layout", &o, err);
    if (st == KVR_OK)
        st = get_u32(o, "layout", "block_size", 1, 1u << 20, &lay->block_size,
                     err);
    if (st == KVR_OK)
        st = get_u32(o, "layout", "dcp", 1, MAX_DCP, &lay->dcp_size, err);
    if (st == KVR_OK)
        st = get_u32(o, "layout", "interleave", 1, UINT32_MAX, &lay->interleave,
                     err);
    if (st == KVR_OK)
        st = get_u32(o, "layout", "tp", 1, UINT32_MAX, &lay->tp, err);
    if (st == KVR_OK)
        st = get_u32(o, "layout", "producer_tp", 1, UINT32_MAX,
                     &lay->producer_tp, err);
    if (st == KVR_OK)
        st = get_bool(o, "layout", "replicate_index", &lay->replicate_index,
                      err);
    if (st == KVR_OK)
        st = get_bool(o, "layout", "preshuffle", &lay->preshuffle, err);
    return st != KVR_OK ? st : kvr_layout_check(lay, err);
}

/* A plain name inside DIR: no path separators, no "." or "..". */
static kvr_status_t check_name(const char *name, const char *where,
                               kvr_error_t *err)
{
    if (strchr(name, '/') != NULL || strcmp(name, ".") == 0 ||
        strcmp(name, "..") == 0 || strlen(name) > NAME_MAX)
        return kvr_error_set(err, KVR_ERR_INVALID,
                             "manifest %s: '%s' is not "
                             "a plain file name inside the dump directory",
                             where, name);
    return KVR_OK;
}

static kvr_status_t parse_side(json_t *reg, const char *where, const char *key,
                               kvr_region_desc_t *d, kvr_error_t *err)
{
    char w[64];
    json_t *o;
    snprintf(w, sizeof(w), "%s.%s", where, key);
    kvr_status_t st = get_obj(reg, where, key, &o, err);
    if (st == KVR_OK)
        st = get_u64(o, w, "num_blocks", 1, UINT32_MAX + 1ull, &d->num_blocks,
                     err);
    if (st == KVR_OK)
        st = get_u64(o, w, "page_bytes", 1, MAX_IMAGE_BYTES, &d->page_bytes,
                     err);
    if (st == KVR_OK && d->num_blocks > MAX_IMAGE_BYTES / d->page_bytes)
        st = kvr_error_set(err, KVR_ERR_INVALID,
                           "manifest %s: %llu blocks x "
                           "%llu bytes exceeds %llu",
                           w, (ull)d->num_blocks, (ull)d->page_bytes,
                           (ull)MAX_IMAGE_BYTES);
    return st;
}

static kvr_status_t parse_role(json_t *reg, const char *where,
                               kvr_region_desc_t *d, kvr_error_t *err)
{
    char *role = NULL;
    kvr_status_t st = get_str(reg, where, "role", 16, &role, err);
    if (st == KVR_OK &&
        (kvr_role_parse(role, &d->role) != KVR_OK ||
         (d->role != KVR_ROLE_MLA && d->role != KVR_ROLE_INDEX)))
        st = bad(err, where, "role", "not \"mla\" or \"index\"");
    free(role);
    if (st == KVR_OK)
        st = get_u32(reg, where, "layer", 0, UINT32_MAX, &d->layer, err);
    if (st != KVR_OK || d->role != KVR_ROLE_INDEX)
        return st;
    st = get_u32(reg, where, "index_dim", 1, MAX_INDEX_DIM, &d->index_dim, err);
    if (st == KVR_OK && json_object_get(reg, "quant_block") != NULL)
        st = get_u32(reg, where, "quant_block", 1, MAX_INDEX_DIM,
                     &d->quant_block, err);
    return st;
}

static kvr_status_t parse_files(json_t *reg, const char *where, uint32_t W,
                                dump_region_t *r, kvr_error_t *err)
{
    json_t *arr;
    char w[96];
    kvr_status_t st = get_str(reg, where, "src_file", NAME_MAX, &r->src_file,
                              err);
    if (st == KVR_OK)
        st = check_name(r->src_file, where, err);
    if (st == KVR_OK)
        st = get_array(reg, where, "dst_files", W, &arr, err);
    if (st == KVR_OK && json_array_size(arr) != W)
        st = kvr_error_set(err, KVR_ERR_INVALID,
                           "manifest %s.dst_files: %zu "
                           "files for W=%u DCP ranks",
                           where, json_array_size(arr), W);
    if (st == KVR_OK && (r->dst_files = calloc(W, sizeof(char *))) == NULL)
        st = kvr_error_set(err, KVR_ERR_NO_MEMORY, "no memory");
    for (uint32_t i = 0; st == KVR_OK && i < W; i++) {
        snprintf(w, sizeof(w), "%s.dst_files[%u]", where, i);
        st = str_value(json_array_get(arr, i), w, NAME_MAX, &r->dst_files[i],
                       err);
        if (st == KVR_OK)
            st = check_name(r->dst_files[i], w, err);
    }
    return st;
}

static kvr_status_t parse_region(json_t *reg, size_t i, const kvr_layout_t *lay,
                                 dump_region_t *r, kvr_error_t *err)
{
    char where[32];
    snprintf(where, sizeof(where), "regions[%zu]", i);
    if (!json_is_object(reg))
        return kvr_error_set(err, KVR_ERR_INVALID, "manifest %s: not an object",
                             where);
    kvr_region_desc_t d = {0};
    kvr_status_t st = parse_role(reg, where, &d, err);
    r->pair.src = r->pair.dst = d;
    if (st == KVR_OK)
        st = parse_side(reg, where, "src", &r->pair.src, err);
    if (st == KVR_OK)
        st = parse_side(reg, where, "dst", &r->pair.dst, err);
    if (st == KVR_OK)
        st = parse_files(reg, where, lay->dcp_size, r, err);
    if (st == KVR_OK &&
        kvr_region_check(lay, &r->pair.src, false, err) != KVR_OK)
        st = err ? err->code : KVR_ERR_INVALID;
    if (st == KVR_OK &&
        kvr_region_check(lay, &r->pair.dst, true, err) != KVR_OK)
        st = err ? err->code : KVR_ERR_INVALID;
    return st;
}

static kvr_status_t parse_request(json_t *q, size_t i, dump_request_t *r,
                                  kvr_error_t *err)
{
    char where[32];
    size_t ntok = 0;
    snprintf(where, sizeof(where), "requests[%zu]", i);
    if (!json_is_object(q))
        return kvr_error_set(err, KVR_ERR_INVALID, "manifest %s: not an object",
                             where);
    kvr_status_t st = get_str(q, where, "id", MAX_ID_BYTES, &r->id, err);
    if (st == KVR_OK)
        st = get_u64(q, where, "num_tokens", 0, MAX_TOKENS, &r->req.num_tokens,
                     err);
    if (st == KVR_OK)
        st = get_u64(q, where, "num_computed_blocks", 0, UINT32_MAX,
                     &r->req.num_computed_blocks, err);
    if (st == KVR_OK)
        st = get_u32s(q, where, "src_blocks", &r->src, &r->req.num_src_blocks,
                      err);
    if (st == KVR_OK)
        st = get_u32s(q, where, "dst_blocks", &r->dst, &r->req.num_dst_blocks,
                      err);
    if (st == KVR_OK && json_object_get(q, "token_ids") != NULL) {
        st = get_u32s(q, where, "token_ids", &r->token_ids, &ntok, err);
        if (st == KVR_OK && ntok != r->req.num_tokens)
            st = kvr_error_set(err, KVR_ERR_INVALID,
                               "manifest %s.token_ids: "
                               "%zu ids for %llu tokens",
                               where, ntok, (ull)r->req.num_tokens);
    }
    r->req.src_blocks = r->src;
    r->req.dst_blocks = r->dst;
    return st;
}

static kvr_status_t parse_header(json_t *root, kvr_inspect_report_t *rep,
                                 kvr_error_t *err)
{
    json_t *fmt = json_object_get(root, "format"), *seed;
    uint64_t version;
    if (!json_is_string(fmt) || strcmp(json_string_value(fmt), "kvrelay-dump"))
        return bad(err, "", "format", "not \"kvrelay-dump\"");
    kvr_status_t st = get_u64(root, "", "version", 1, 1, &version, err);
    if (st == KVR_OK)
        st = parse_layout(root, &rep->lay, err);
    seed = json_object_get(root, "seed");
    if (st == KVR_OK && seed != NULL && !json_is_null(seed)) {
        st = get_u64(root, "", "seed", 0, INT64_MAX, &rep->seed, err);
        rep->have_seed = true;
    }
    return st;
}

static kvr_status_t parse_lists(json_t *root, kvr_inspect_report_t *rep,
                                kvr_error_t *err)
{
    json_t *regs, *reqs, *v;
    size_t i;
    kvr_status_t st = get_array(root, "", "regions", MAX_REGIONS, &regs, err);
    if (st == KVR_OK)
        st = get_array(root, "", "requests", MAX_REQUESTS, &reqs, err);
    if (st != KVR_OK)
        return st;
    rep->regions = calloc(json_array_size(regs) + 1, sizeof(*rep->regions));
    rep->requests = calloc(json_array_size(reqs) + 1, sizeof(*rep->requests));
    if (rep->regions == NULL || rep->requests == NULL)
        return kvr_error_set(err, KVR_ERR_NO_MEMORY, "no memory");
    json_array_foreach(regs, i, v)
    {
        rep->num_regions = i + 1;
        if ((st = parse_region(v, i, &rep->lay, &rep->regions[i], err)) !=
            KVR_OK)
            return st;
    }
    json_array_foreach(reqs, i, v)
    {
        rep->num_requests = i + 1;
        if ((st = parse_request(v, i, &rep->requests[i], err)) != KVR_OK)
            return st;
    }
    return KVR_OK;
}

static kvr_status_t load_manifest(const char *dir, kvr_inspect_report_t *rep,
                                  kvr_error_t *err)
{
    char path[PATH_MAX];
    struct stat sb;
    json_error_t jerr;
    if ((size_t)snprintf(path, sizeof(path), "%s/manifest.json", dir) >=
        sizeof(path))
        return kvr_error_set(err, KVR_ERR_INVALID,
                             "dump directory path too long");
    if (stat(path, &sb) != 0 || !S_ISREG(sb.st_mode))
        return kvr_error_set(err, KVR_ERR_IO, "%s: no such file", path);
    if ((uint64_t)sb.st_size > MANIFEST_MAX_BYTES)
        return kvr_error_set(err, KVR_ERR_INVALID,
                             "%s: %llu bytes exceeds the "
                             "%llu-byte limit",
                             path, (ull)sb.st_size, (ull)MANIFEST_MAX_BYTES);
    json_t *root = json_load_file(path, JSON_REJECT_DUPLICATES, &jerr);
    if (root == NULL)
        return kvr_error_set(err, KVR_ERR_INVALID, "%s: line %d column %d: %s",
                             path, jerr.line, jerr.column, jerr.text);
    kvr_status_t st = json_is_object(root)
                          ? parse_header(root, rep, err)
                          : bad(err, "", "(root)", "not an object");
    if (st == KVR_OK)
        st = parse_lists(root, rep, err);
    json_decref(root);
    return st;
}

/* ---- page images ---- */

static kvr_status_t map_image(const char *dir, const char *name,
                              const kvr_region_desc_t *d, map_t *m,
                              kvr_error_t *err)
{
    char path[PATH_MAX];
    struct stat sb;
    uint64_t want = d->num_blocks * d->page_bytes; /* bounded at parse */
    snprintf(path, sizeof(path), "%s/%s", dir, name);
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0)
        return kvr_error_set(err, KVR_ERR_IO, "%s: cannot open", path);
    kvr_status_t st = KVR_OK;
    if (fstat(fd, &sb) != 0 || !S_ISREG(sb.st_mode))
        st = kvr_error_set(err, KVR_ERR_IO, "%s: not a regular file", path);
    else if ((uint64_t)sb.st_size != want || want > SIZE_MAX)
        st = kvr_error_set(err, KVR_ERR_INVALID,
                           "%s: %llu bytes, the manifest "
                           "says %llu blocks x %llu = %llu",
                           path, (ull)sb.st_size, (ull)d->num_blocks,
                           (ull)d->page_bytes, (ull)want);
    if (st == KVR_OK) {
        m->p = mmap(NULL, (size_t)want, PROT_READ, MAP_PRIVATE, fd, 0);
        m->len = (size_t)want;
        if (m->p == MAP_FAILED) {
            m->p = NULL;
            st = kvr_error_set(err, KVR_ERR_IO, "%s: cannot map %llu bytes",
                               path, (ull)want);
        }
    }
    close(fd);
    return st;
}

static void unmap_image(map_t *m)
{
    if (m->p != NULL)
        munmap(m->p, m->len);
    m->p = NULL;
}

/* Prefixes err's message with the request and region it is about. */
static kvr_status_t blame(kvr_status_t st, const dump_request_t *q, size_t reg,
                          const dump_region_t *r, kvr_error_t *err)
{
    if (st != KVR_OK && err != NULL) {
        char msg[KVR_ERROR_MSG_MAX];
        snprintf(msg, sizeof(msg), "%s", err->msg);
        kvr_error_set(err, st, "request '%s', region %zu (%s layer %u): %s",
                      q->id, reg, kvr_role_name(r->pair.src.role),
                      r->pair.src.layer, msg);
    }
    return st;
}

static void tag_request(kvr_inspect_result_t *res, size_t from, size_t q)
{
    for (size_t i = from; i < res->num_diffs; i++)
        res->diffs[i].request = (uint32_t)q;
}

static kvr_status_t check_region(kvr_inspect_report_t *rep, size_t i,
                                 const map_t *src, const map_t *dst,
                                 kvr_error_t *err)
{
    dump_region_t *r = &rep->regions[i];
    kvr_status_t st = KVR_OK;
    for (size_t q = 0; q < rep->num_requests && st == KVR_OK; q++) {
        const dump_request_t *rq = &rep->requests[q];
        size_t from = r->res.num_diffs;
        for (uint32_t w = 0; w < rep->lay.dcp_size && st == KVR_OK; w++)
            st = kvr_inspect_buffers(&rep->lay, w, &r->pair, &rq->req, src->p,
                                     src->len, dst[w].p, dst[w].len, &rep->opts,
                                     &r->res, err);
        if (st == KVR_OK && rep->opts.synthetic && rq->token_ids != NULL)
            st = kvr_inspect_source(&rep->lay, &r->pair, &rq->req,
                                    rq->token_ids, src->p, src->len, &rep->opts,
                                    &r->res, err);
        tag_request(&r->res, from, q);
        st = blame(st, rq, i, r, err);
    }
    return st;
}

/* Memory for findings is sized for max_report while a region is checked,
 * then shrunk to what was found: most regions keep none. */
static void keep_found(kvr_inspect_result_t *res)
{
    if (res->num_diffs == 0) {
        free(res->diffs);
        res->diffs = NULL;
    } else {
        kvr_inspect_diff_t *d = realloc(res->diffs,
                                        res->num_diffs * sizeof(*d));
        res->diffs = d ? d : res->diffs;
    }
    res->diffs_cap = res->num_diffs;
}

/* Maps one region's W + 1 images, checks it, unmaps. */
static kvr_status_t run_region(kvr_inspect_report_t *rep, const char *dir,
                               size_t i, kvr_error_t *err)
{
    dump_region_t *r = &rep->regions[i];
    uint32_t W = rep->lay.dcp_size;
    map_t src = {0}, *dst = calloc(W, sizeof(*dst));
    if (dst == NULL)
        return kvr_error_set(err, KVR_ERR_NO_MEMORY, "no memory");
    r->res.diffs_cap = KVR_INSPECT_KINDS * rep->opts.max_report;
    r->res.diffs = calloc(r->res.diffs_cap, sizeof(*r->res.diffs));
    kvr_status_t st = r->res.diffs
                          ? map_image(dir, r->src_file, &r->pair.src, &src, err)
                          : kvr_error_set(err, KVR_ERR_NO_MEMORY, "no memory");
    for (uint32_t w = 0; w < W && st == KVR_OK; w++)
        st = map_image(dir, r->dst_files[w], &r->pair.dst, &dst[w], err);
    if (st == KVR_OK)
        st = check_region(rep, i, &src, dst, err);
    if (st == KVR_OK)
        keep_found(&r->res);
    for (uint32_t w = 0; w < W; w++)
        unmap_image(&dst[w]);
    unmap_image(&src);
    free(dst);
    return st;
}

static kvr_status_t resolve_opts(kvr_inspect_report_t *rep,
                                 const kvr_inspect_opts_t *opts,
                                 kvr_error_t *err)
{
    kvr_inspect_opts_t o = KVR_INSPECT_OPTS_INIT;
    if (opts != NULL)
        o = *opts;
    if (o.manifest_seed) {
        o.synthetic = rep->have_seed;
        o.seed = rep->seed;
    }
    if (o.max_report == 0)
        o.max_report = KVR_INSPECT_DEFAULT_REPORT;
    if (o.max_report > MAX_REPORT)
        return kvr_error_set(err, KVR_ERR_INVALID, "max_report %zu > %u",
                             o.max_report, MAX_REPORT);
    rep->opts = o;
    return KVR_OK;
}

kvr_status_t kvr_inspect_dump(const char *dir, const kvr_inspect_opts_t *opts,
                              kvr_inspect_report_t **out, kvr_error_t *err)
{
    if (dir == NULL || out == NULL)
        return kvr_error_set(err, KVR_ERR_INVALID, "NULL directory or output");
    kvr_inspect_report_t *rep = calloc(1, sizeof(*rep));
    if (rep == NULL)
        return kvr_error_set(err, KVR_ERR_NO_MEMORY, "no memory");
    kvr_status_t st = load_manifest(dir, rep, err);
    if (st == KVR_OK)
        st = resolve_opts(rep, opts, err);
    for (size_t i = 0; i < rep->num_regions && st == KVR_OK; i++)
        st = run_region(rep, dir, i, err);
    if (st != KVR_OK) {
        kvr_inspect_report_destroy(rep);
        return st;
    }
    *out = rep;
    return KVR_OK;
}

void kvr_inspect_report_destroy(kvr_inspect_report_t *rep)
{
    if (rep == NULL)
        return;
    for (size_t i = 0; i < rep->num_regions; i++) {
        dump_region_t *r = &rep->regions[i];
        for (uint32_t w = 0; r->dst_files && w < rep->lay.dcp_size; w++)
            free(r->dst_files[w]);
        free(r->dst_files);
        free(r->src_file);
        free(r->res.diffs);
    }
    for (size_t i = 0; i < rep->num_requests; i++) {
        free(rep->requests[i].id);
        free(rep->requests[i].src);
        free(rep->requests[i].dst);
        free(rep->requests[i].token_ids);
    }
    free(rep->regions);
    free(rep->requests);
    free(rep);
}

/* ---- accessors ---- */

bool kvr_inspect_report_clean(const kvr_inspect_report_t *rep)
{
    for (size_t i = 0; i < rep->num_regions; i++)
        for (int k = 0; k < KVR_INSPECT_KINDS; k++)
            if (rep->regions[i].res.found[k] != 0)
                return false;
    return true;
}

size_t kvr_inspect_report_num_regions(const kvr_inspect_report_t *rep)
{
    return rep->num_regions;
}

size_t kvr_inspect_report_num_requests(const kvr_inspect_report_t *rep)
{
    return rep->num_requests;
}

const kvr_inspect_result_t *
kvr_inspect_report_region(const kvr_inspect_report_t *rep, size_t i,
                          kvr_region_desc_t *desc)
{
    if (i >= rep->num_regions)
        return NULL;
    if (desc != NULL)
        *desc = rep->regions[i].pair.dst;
    return &rep->regions[i].res;
}

const char *kvr_inspect_report_request_id(const kvr_inspect_report_t *rep,
                                          size_t i)
{
    return i < rep->num_requests ? rep->requests[i].id : NULL;
}

const kvr_layout_t *kvr_inspect_report_layout(const kvr_inspect_report_t *rep)
{
    return &rep->lay;
}

kvr_inspect_opts_t kvr_inspect_report_opts(const kvr_inspect_report_t *rep)
{
    return rep->opts;
}

void kvr_inspect_free(void *p)
{
    free(p);
}

/* ---- JSON report (docs/inspect.md) ---- */

static void hex(const uint8_t *b, uint32_t n, char *out)
{
    for (uint32_t i = 0; i < n; i++)
        snprintf(out + 2 * i, 3, "%02x", b[i]);
    out[2 * n] = '\0';
}

static json_t *diff_json(const kvr_inspect_report_t *rep,
                         const kvr_inspect_diff_t *d)
{
    char want[2 * KVR_INSPECT_EXCERPT + 1], got[2 * KVR_INSPECT_EXCERPT + 1];
    hex(d->expected, d->excerpt_len, want);
    hex(d->found, d->excerpt_len, got);
    json_t *parts = json_array();
    for (uint32_t bit = 1; bit <= KVR_INSPECT_PART_SCALE; bit <<= 1)
        if (d->parts & bit)
            json_array_append_new(parts,
                                  json_string(kvr_inspect_part_name(bit)));
    return json_pack("{s:s,s:s,s:I,s:I,s:s,s:o,s:I,s:I,s:I,s:s,s:s}", "kind",
                     kvr_inspect_kind_name(d->kind), "request",
                     rep->requests[d->request].id, "rank", (json_int_t)d->rank,
                     "token", (json_int_t)d->token, "part",
                     kvr_inspect_part_name(d->part), "parts", parts, "byte",
                     (json_int_t)d->byte, "src_offset",
                     (json_int_t)d->src_offset, "dst_offset",
                     (json_int_t)d->dst_offset, "expected", want, "found", got);
}

static json_t *region_json(const kvr_inspect_report_t *rep, size_t i)
{
    const dump_region_t *r = &rep->regions[i];
    const kvr_inspect_result_t *res = &r->res;
    json_t *diffs = json_array();
    for (size_t k = 0; k < res->num_diffs; k++)
        json_array_append_new(diffs, diff_json(rep, &res->diffs[k]));
    json_t *o = json_pack(
        "{s:I,s:s,s:I,s:I,s:I,s:I,s:I,s:I,s:I,s:o}", "region", (json_int_t)i,
        "role", kvr_role_name(r->pair.dst.role), "layer",
        (json_int_t)r->pair.dst.layer, "tokens_checked",
        (json_int_t)res->checked[KVR_INSPECT_WRONG], "tokens_wrong",
        (json_int_t)res->found[KVR_INSPECT_WRONG], "scales_checked",
        (json_int_t)res->checked[KVR_INSPECT_SCALE], "scales_inconsistent",
        (json_int_t)res->found[KVR_INSPECT_SCALE], "source_checked",
        (json_int_t)res->checked[KVR_INSPECT_SOURCE], "source_wrong",
        (json_int_t)res->found[KVR_INSPECT_SOURCE], "diffs", diffs);
    if (r->pair.dst.role == KVR_ROLE_INDEX)
        json_object_set_new(o, "index_dim",
                            json_integer(r->pair.dst.index_dim));
    return o;
}

static json_t *summary_json(const kvr_inspect_report_t *rep)
{
    uint64_t checked[KVR_INSPECT_KINDS] = {0}, found[KVR_INSPECT_KINDS] = {0};
    uint64_t differ = 0;
    for (size_t i = 0; i < rep->num_regions; i++) {
        const kvr_inspect_result_t *res = &rep->regions[i].res;
        uint64_t any = 0;
        for (int k = 0; k < KVR_INSPECT_KINDS; k++) {
            checked[k] += res->checked[k];
            found[k] += res->found[k];
            any += res->found[k];
        }
        differ += any != 0;
    }
    return json_pack("{s:I,s:I,s:I,s:I,s:I,s:I,s:I,s:I}", "regions",
                     (json_int_t)rep->num_regions, "regions_with_differences",
                     (json_int_t)differ, "tokens_checked",
                     (json_int_t)checked[KVR_INSPECT_WRONG], "tokens_wrong",
                     (json_int_t)found[KVR_INSPECT_WRONG], "scales_checked",
                     (json_int_t)checked[KVR_INSPECT_SCALE],
                     "scales_inconsistent",
                     (json_int_t)found[KVR_INSPECT_SCALE], "source_checked",
                     (json_int_t)checked[KVR_INSPECT_SOURCE], "source_wrong",
                     (json_int_t)found[KVR_INSPECT_SOURCE]);
}

char *kvr_inspect_report_json(const kvr_inspect_report_t *rep)
{
    const kvr_layout_t *l = &rep->lay;
    json_t *ids = json_array(), *regions = json_array();
    for (size_t i = 0; i < rep->num_requests; i++)
        json_array_append_new(ids, json_string(rep->requests[i].id));
    for (size_t i = 0; i < rep->num_regions; i++)
        json_array_append_new(regions, region_json(rep, i));
    json_t *layout = json_pack(
        "{s:I,s:I,s:I,s:I,s:I,s:b,s:b}", "block_size",
        (json_int_t)l->block_size, "dcp", (json_int_t)l->dcp_size, "interleave",
        (json_int_t)l->interleave, "tp", (json_int_t)l->tp, "producer_tp",
        (json_int_t)l->producer_tp, "replicate_index", l->replicate_index,
        "preshuffle", l->preshuffle);
    json_t *root = json_pack(
        "{s:s,s:I,s:b,s:o,s:b,s:o,s:I,s:o,s:o,s:o}", "format",
        "kvrelay-inspect", "version", (json_int_t)1, "clean",
        kvr_inspect_report_clean(rep), "layout", layout, "synthetic",
        rep->opts.synthetic, "seed",
        rep->opts.synthetic ? json_integer((json_int_t)rep->opts.seed)
                            : json_null(),
        "max_report", (json_int_t)rep->opts.max_report, "requests", ids,
        "regions", regions, "summary", summary_json(rep));
    char *text = root ? json_dumps(root, JSON_COMPACT) : NULL;
    json_decref(root);
    return text;
}
