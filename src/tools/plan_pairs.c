/* `kvrelay plan` when one consumer rank pulls from several producer ranks
 * (docs/design.md §18): a sharded producer, a producer block size of its
 * own, or a TP head reshard. Regions planned over DCP ranks (MLA, index,
 * identity pages) take the consumer's --rank; head-sharded dense regions
 * take --tp-rank. For each axis the sources are the union of the regions'
 * (kvr_plan_sources with the request), and each source gets one pair plan
 * set over that axis's regions. */
#include "plan_pairs.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "commands.h"

/* "H:D:E[:hnd][xCOUNT]" after "dense:" (E: bytes per element). */
bool cli_parse_dense(const char *text, kvr_region_desc_t *out, uint32_t *count)
{
    char buf[128];
    if (strncmp(text, "dense:", 6) != 0 || strlen(text) >= sizeof(buf))
        return false;
    snprintf(buf, sizeof(buf), "%s", text + 6);
    uint64_t c = 1, v[3];
    char *x = strchr(buf, 'x');
    if (x != NULL) {
        *x = '\0';
        if (!cli_parse_u64(x + 1, 1, 1u << 20, &c))
            return false;
    }
    kvr_region_desc_t r = {.role = KVR_ROLE_DENSE};
    char *save = NULL, *tok = strtok_r(buf, ":", &save);
    for (int i = 0; i < 3; i++, tok = strtok_r(NULL, ":", &save))
        if (tok == NULL || !cli_parse_u64(tok, 1, 1u << 16, &v[i]))
            return false;
    if (tok != NULL && strcmp(tok, "hnd") != 0 && strcmp(tok, "nhd") != 0)
        return false;
    r.hnd = tok != NULL && strcmp(tok, "hnd") == 0;
    if (tok != NULL && strtok_r(NULL, ":", &save) != NULL)
        return false;
    r.heads = (uint32_t)v[0];
    r.head_dim = (uint32_t)v[1];
    r.elem_bytes = (uint32_t)v[2];
    *out = r;
    *count = (uint32_t)c;
    return true;
}

bool cli_plan_needs_pairs(const kvr_layout_t *lay,
                          const kvr_region_pair_t *pairs, size_t n)
{
    if (!kvr_layout_producer_plain(lay))
        return true;
    for (size_t i = 0; i < n; i++)
        if (pairs[i].src.heads != 0 && lay->producer_tp != lay->tp)
            return true;
    return false;
}

void cli_pair_plan_free(cli_pair_plan_t *pp)
{
    free(pp->sources);
    free(pp->per_pair);
    memset(pp, 0, sizeof(*pp));
}

/* Producer ranks of one axis that consumer rank c pulls anything from. */
static kvr_status_t axis_sources(const kvr_layout_t *lay, kvr_axis_t axis,
                                 uint32_t c, const kvr_region_pair_t *pairs,
                                 size_t n, const kvr_request_t *req, bool *used,
                                 kvr_error_t *err)
{
    uint32_t np = kvr_axis_ranks(lay, axis, false);
    uint32_t *ranks = malloc((np + 1) * sizeof(*ranks));
    if (ranks == NULL)
        return kvr_error_set(err, KVR_ERR_NO_MEMORY, "no memory");
    kvr_status_t st = KVR_OK;
    for (size_t i = 0; i < n && st == KVR_OK; i++) {
        size_t k = 0;
        if (kvr_region_axis(&pairs[i].src) != axis)
            continue;
        st = kvr_plan_sources(lay, &pairs[i], c, req, ranks, np, &k, err);
        for (size_t j = 0; j < k && st == KVR_OK; j++)
            used[ranks[j]] = true;
    }
    free(ranks);
    return st;
}

/* The regions of one axis, with their indexes in the full list. */
static size_t axis_pairs(kvr_axis_t axis, const kvr_region_pair_t *pairs,
                         size_t n, kvr_region_pair_t *sub, size_t *index)
{
    size_t m = 0;
    for (size_t i = 0; i < n; i++)
        if (kvr_region_axis(&pairs[i].src) == axis) {
            sub[m] = pairs[i];
            index[m++] = i;
        }
    return m;
}

static kvr_status_t add_source(cli_pair_plan_t *pp, kvr_axis_t axis, uint32_t p,
                               const kvr_plan_set_t *set, const size_t *index,
                               size_t m)
{
    cli_source_t *s = &pp->sources[pp->num_sources++];
    *s = (cli_source_t){axis, p, kvr_plan_set_total_runs(set),
                        kvr_plan_set_total_bytes(set)};
    for (size_t i = 0; i < m; i++) {
        const kvr_plan_t *plan = kvr_plan_set_plan_of(set, i);
        cli_totals_t *t = &pp->per_pair[index[i]];
        t->runs += kvr_plan_num_runs(plan);
        t->uncoalesced += kvr_plan_runs_uncoalesced(plan);
        t->bytes += kvr_plan_bytes(plan);
    }
    pp->total_runs += s->runs;
    pp->total_bytes += s->bytes;
    return KVR_OK;
}

static kvr_status_t plan_axis(const kvr_layout_t *lay, kvr_axis_t axis,
                              uint32_t c, const kvr_region_pair_t *pairs,
                              size_t n, const kvr_request_t *req,
                              cli_pair_plan_t *pp, kvr_error_t *err)
{
    uint32_t np = kvr_axis_ranks(lay, axis, false);
    kvr_region_pair_t *sub = calloc(n + 1, sizeof(*sub));
    size_t *index = calloc(n + 1, sizeof(*index));
    bool *used = calloc(np + 1, sizeof(*used));
    kvr_status_t st = sub && index && used ? KVR_OK : KVR_ERR_NO_MEMORY;
    size_t m = st == KVR_OK ? axis_pairs(axis, pairs, n, sub, index) : 0;
    if (st == KVR_OK && m > 0)
        st = axis_sources(lay, axis, c, sub, m, req, used, err);
    for (uint32_t p = 0; st == KVR_OK && m > 0 && p < np; p++) {
        kvr_plan_set_t *set = NULL;
        if (!used[p])
            continue;
        st = kvr_plan_set_create_pair(lay, p, c, sub, m, req, &set, err);
        if (st == KVR_OK)
            st = add_source(pp, axis, p, set, index, m);
        kvr_plan_set_destroy(set);
    }
    free(sub);
    free(index);
    free(used);
    if (st == KVR_ERR_NO_MEMORY)
        kvr_error_set(err, st, "no memory");
    return st;
}

kvr_status_t cli_plan_pairs(const kvr_layout_t *lay, uint32_t dcp_rank,
                            uint32_t tp_rank, const kvr_region_pair_t *pairs,
                            size_t n, const kvr_request_t *req,
                            cli_pair_plan_t *pp, kvr_error_t *err)
{
    memset(pp, 0, sizeof(*pp));
    size_t cap = (size_t)kvr_axis_ranks(lay, KVR_AXIS_DCP, false) +
                 kvr_axis_ranks(lay, KVR_AXIS_TP, false);
    pp->sources = calloc(cap + 1, sizeof(*pp->sources));
    pp->per_pair = calloc(n + 1, sizeof(*pp->per_pair));
    if (pp->sources == NULL || pp->per_pair == NULL) {
        cli_pair_plan_free(pp);
        return kvr_error_set(err, KVR_ERR_NO_MEMORY, "no memory");
    }
    kvr_status_t st = plan_axis(lay, KVR_AXIS_DCP, dcp_rank, pairs, n, req, pp,
                                err);
    if (st == KVR_OK)
        st = plan_axis(lay, KVR_AXIS_TP, tp_rank, pairs, n, req, pp, err);
    if (st != KVR_OK)
        cli_pair_plan_free(pp);
    return st;
}
