/* Offload identity (docs/design.md §9): the namespace key is a 16-byte BLAKE2b of
 * a canonical JSON description of the layout (jansson, sorted keys, compact
 * separators, ASCII-escaped: unambiguous whatever the strings hold), and
 * loads use the largest chunk-aligned prefix of a hit. */
#include <jansson.h>
#include <sodium.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kvrelay/completion.h"

#define MODEL_TAG_MAX 256
#define DTYPE_MAX 32
#define INDEXER_TYPE_MAX 64
#define NAMESPACE_SCHEMA "kvrelay-page-namespace"

/* Non-empty, bounded, no control characters (these strings end up in
 * logs and in the tier's model name). UTF-8 is checked by jansson. */
static kvr_status_t check_text(const char *what, const char *text, size_t max,
                               kvr_error_t *err)
{
    if (text == NULL || text[0] == '\0')
        return kvr_error_set(err, KVR_ERR_INVALID, "%s is empty", what);
    size_t n = strnlen(text, max + 1);
    if (n > max)
        return kvr_error_set(err, KVR_ERR_INVALID, "%s longer than %zu bytes",
                             what, max);
    for (size_t i = 0; i < n; i++)
        if ((unsigned char)text[i] < 0x20 || text[i] == 0x7f)
            return kvr_error_set(err, KVR_ERR_INVALID,
                                 "%s has control byte 0x%02x at %zu", what,
                                 (unsigned char)text[i], i);
    return KVR_OK;
}

static kvr_status_t check_geometry(const kvr_offload_desc_t *d,
                                   kvr_error_t *err)
{
    kvr_layout_t lay = KVR_LAYOUT_INIT;
    lay.block_size = d->block_size;
    lay.dcp_size = d->dcp_size;
    lay.interleave = d->interleave;
    lay.tp = d->tp;
    kvr_status_t s = kvr_layout_check(&lay, err);
    if (s != KVR_OK)
        return s;
    uint64_t v = (uint64_t)d->block_size * d->dcp_size;
    if (d->chunk_size == 0 || d->chunk_size % v != 0)
        return kvr_error_set(err, KVR_ERR_CHUNK_SIZE,
                             "offload chunk size %u is not a positive "
                             "multiple of bs * W = %u * %u = %llu",
                             d->chunk_size, d->block_size, d->dcp_size,
                             (unsigned long long)v);
    return KVR_OK;
}

static kvr_status_t check_desc(const kvr_offload_desc_t *d, kvr_error_t *err)
{
    if (d == NULL)
        return kvr_error_set(err, KVR_ERR_INVALID, "offload desc is NULL");
    kvr_status_t s = check_text("model tag", d->model_tag, MODEL_TAG_MAX, err);
    if (s == KVR_OK)
        s = check_text("dtype", d->dtype, DTYPE_MAX, err);
    if (s == KVR_OK)
        s = check_geometry(d, err);
    if (s != KVR_OK)
        return s;
    if (d->num_indexer_types > KVR_OFFLOAD_MAX_LAYERS ||
        (d->num_indexer_types > 0 && d->indexer_types == NULL))
        return kvr_error_set(err, KVR_ERR_INVALID,
                             "%zu indexer types (max %u) or NULL array",
                             d->num_indexer_types, KVR_OFFLOAD_MAX_LAYERS);
    for (size_t i = 0; i < d->num_indexer_types && s == KVR_OK; i++) {
        char what[48];
        snprintf(what, sizeof(what), "indexer type of layer %zu", i);
        s = check_text(what, d->indexer_types[i], INDEXER_TYPE_MAX, err);
    }
    return s;
}

/* json_object_set_new that reports failure (NULL value: bad UTF-8 or OOM). */
static bool put(json_t *obj, const char *key, json_t *value)
{
    return value != NULL && json_object_set_new(obj, key, value) == 0;
}

static json_t *indexer_array(const kvr_offload_desc_t *d)
{
    json_t *arr = json_array();
    for (size_t i = 0; arr != NULL && i < d->num_indexer_types; i++) {
        json_t *t = json_string(d->indexer_types[i]);
        if (t == NULL || json_array_append_new(arr, t) != 0) {
            json_decref(arr);
            return NULL;
        }
    }
    return arr;
}

static json_t *describe(const kvr_offload_desc_t *d)
{
    json_t *o = json_object();
    bool ok = o != NULL && put(o, "schema", json_string(NAMESPACE_SCHEMA)) &&
              put(o, "layout_version",
                  json_integer(KVR_OFFLOAD_LAYOUT_VERSION)) &&
              put(o, "model", json_string(d->model_tag)) &&
              put(o, "kv_cache_dtype", json_string(d->dtype)) &&
              put(o, "block_size", json_integer(d->block_size)) &&
              put(o, "chunk_size", json_integer(d->chunk_size)) &&
              put(o, "tp_size", json_integer(d->tp)) &&
              put(o, "dcp_size", json_integer(d->dcp_size)) &&
              put(o, "dcp_interleave", json_integer(d->interleave)) &&
              put(o, "replicated_index_cache",
                  json_boolean(d->replicate_index)) &&
              put(o, "index_preshuffle", json_boolean(d->preshuffle)) &&
              put(o, "indexer_types", indexer_array(d));
    if (!ok) {
        json_decref(o);
        return NULL;
    }
    return o;
}

/* jansson writes \u escapes with upper-case hex; lower-case them so the
 * text equals Python's json.dumps(sort_keys=True, separators=(",", ":"),
 * ensure_ascii=True) and other tools can reproduce the key. */
static void lower_escapes(char *text, size_t n)
{
    for (size_t i = 0; i + 1 < n; i++) {
        if (text[i] != '\\')
            continue;
        if (text[i + 1] == 'u')
            for (size_t j = i + 2; j < i + 6 && j < n; j++)
                if (text[j] >= 'A' && text[j] <= 'F')
                    text[j] = (char)(text[j] - 'A' + 'a');
        i++; /* skip the escaped character: "\\u" is not an escape */
    }
}

/* The canonical text in a new heap string (caller frees), length in *len. */
static kvr_status_t canonical_new(const kvr_offload_desc_t *d, char **out,
                                  size_t *len, kvr_error_t *err)
{
    kvr_status_t s = check_desc(d, err);
    if (s != KVR_OK)
        return s;
    json_t *o = describe(d);
    if (o == NULL)
        return kvr_error_set(err, KVR_ERR_INVALID,
                             "model tag, dtype or an indexer type is not "
                             "valid UTF-8 (or out of memory)");
    const size_t flags = JSON_COMPACT | JSON_SORT_KEYS | JSON_ENSURE_ASCII;
    size_t n = json_dumpb(o, NULL, 0, flags);
    char *text = n > 0 ? malloc(n + 1) : NULL;
    if (text == NULL || json_dumpb(o, text, n, flags) != n) {
        free(text);
        json_decref(o);
        return kvr_error_set(err, KVR_ERR_NO_MEMORY,
                             "cannot encode the namespace description");
    }
    json_decref(o);
    text[n] = '\0';
    lower_escapes(text, n);
    *out = text;
    *len = n;
    return KVR_OK;
}

kvr_status_t kvr_offload_canonical(const kvr_offload_desc_t *desc, char *buf,
                                   size_t cap, size_t *len, kvr_error_t *err)
{
    char *text;
    size_t n;
    if (len == NULL || (buf == NULL && cap > 0))
        return kvr_error_set(err, KVR_ERR_INVALID, "len or buf is NULL");
    kvr_status_t s = canonical_new(desc, &text, &n, err);
    if (s != KVR_OK)
        return s;
    if (buf != NULL && cap <= n) {
        free(text);
        return kvr_error_set(err, KVR_ERR_BUFFER_SMALL,
                             "buffer of %zu bytes; the description needs %zu",
                             cap, n + 1);
    }
    if (buf != NULL)
        memcpy(buf, text, n + 1);
    free(text);
    *len = n;
    return KVR_OK;
}

kvr_status_t kvr_offload_key(const kvr_offload_desc_t *desc,
                             char out[KVR_OFFLOAD_KEY_HEX_LEN + 1],
                             kvr_error_t *err)
{
    char *text;
    size_t n;
    if (out == NULL)
        return kvr_error_set(err, KVR_ERR_INVALID, "out is NULL");
    if (kvr_init(err) != KVR_OK)
        return KVR_ERR_INIT;
    kvr_status_t s = canonical_new(desc, &text, &n, err);
    if (s != KVR_OK)
        return s;
    unsigned char digest[KVR_OFFLOAD_KEY_BYTES];
    crypto_generichash(digest, sizeof(digest), (const unsigned char *)text, n,
                       NULL, 0);
    free(text);
    sodium_bin2hex(out, KVR_OFFLOAD_KEY_HEX_LEN + 1, digest, sizeof(digest));
    return KVR_OK;
}

kvr_status_t kvr_offload_namespace(const kvr_offload_desc_t *desc, char *buf,
                                   size_t cap, kvr_error_t *err)
{
    char key[KVR_OFFLOAD_KEY_HEX_LEN + 1];
    if (buf == NULL)
        return kvr_error_set(err, KVR_ERR_INVALID, "buf is NULL");
    kvr_status_t s = kvr_offload_key(desc, key, err);
    if (s != KVR_OK)
        return s;
    int n = snprintf(NULL, 0, "%s::kvrelay-page-v%u-%s", desc->model_tag,
                     KVR_OFFLOAD_LAYOUT_VERSION, key);
    if (n < 0 || (size_t)n >= cap)
        return kvr_error_set(err, KVR_ERR_BUFFER_SMALL,
                             "buffer of %zu bytes; the namespace needs %d", cap,
                             n + 1);
    snprintf(buf, cap, "%s::kvrelay-page-v%u-%s", desc->model_tag,
             KVR_OFFLOAD_LAYOUT_VERSION, key);
    return KVR_OK;
}

kvr_status_t kvr_offload_aligned_prefix(int64_t hit_tokens, uint64_t chunk_size,
                                        uint64_t *out, kvr_error_t *err)
{
    if (chunk_size < 1)
        return kvr_error_set(err, KVR_ERR_CHUNK_SIZE, "chunk size 0 < 1");
    if (out == NULL)
        return kvr_error_set(err, KVR_ERR_INVALID, "out is NULL");
    uint64_t hit = hit_tokens > 0 ? (uint64_t)hit_tokens : 0;
    *out = hit / chunk_size * chunk_size;
    return KVR_OK;
}
