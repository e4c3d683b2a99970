/* HELLO: this side's layout and topology, and the comparison that names the
 * first raw layout field two sides disagree on (docs/PROTOCOL.md Handshake).
 * With a key, the layout travels only in LAYOUT, after AUTH. */
#include <inttypes.h>
#include <sodium.h>
#include <stdlib.h>
#include <string.h>

#include "kvrelay/plan.h"
#include "layout_internal.h"
#include "wire_internal.h"

/* Sorted distinct classes of this side's non-STAGING regions (token widths
 * over the side's own block size). */
static kvr_status_t collect_classes(kvr_msg_hello_t *h, const kvr_layout_t *lay,
                                    const kvr_region_desc_t *regions, size_t n,
                                    kvr_error_t *err)
{
    kvr_wire_class_t *all = calloc(n + 1, sizeof(*all));
    if (all == NULL)
        return kvr_error_set(err, KVR_ERR_NO_MEMORY, "no memory");
    size_t m = kvr__distinct_classes(lay, regions, n,
                                     h->side == KVR_WIRE_CONSUMER, all);
    if (m > KVR_WIRE_MAX_CLASSES) {
        free(all);
        return kvr_error_set(err, KVR_ERR_WIRE_LIMIT,
                             "more than %u region classes (%zu)",
                             KVR_WIRE_MAX_CLASSES, m);
    }
    memcpy(h->classes, all, m * sizeof(*all));
    h->num_classes = (uint32_t)m;
    free(all);
    return KVR_OK;
}

/* Digest of the layout plus the announced classes. */
static kvr_status_t classes_digest(const kvr_msg_hello_t *h, uint64_t *out,
                                   kvr_error_t *err)
{
    kvr_region_desc_t r[KVR_WIRE_MAX_CLASSES];
    for (uint32_t i = 0; i < h->num_classes; i++)
        r[i] = kvr__class_region(&h->layout, &h->classes[i]);
    return kvr_layout_digest(&h->layout, r, h->num_classes, out, err);
}

kvr_status_t kvr_wire_hello_init(kvr_msg_hello_t *hello, kvr_wire_side_t side,
                                 const kvr_wire_topo_t *topo,
                                 const kvr_layout_t *lay,
                                 const kvr_region_desc_t *regions,
                                 size_t num_regions, kvr_error_t *err)
{
    if (hello == NULL || topo == NULL || lay == NULL ||
        (num_regions && regions == NULL))
        return kvr_error_set(err, KVR_ERR_INVALID, "NULL argument");
    if (side != KVR_WIRE_PRODUCER && side != KVR_WIRE_CONSUMER)
        return kvr_error_set(err, KVR_ERR_INVALID, "side %d unknown",
                             (int)side);
    if (kvr_init(err) != KVR_OK)
        return KVR_ERR_INIT;
    kvr_msg_hello_t h;
    memset(&h, 0, sizeof(h));
    h.proto_major = KVR_WIRE_VERSION_MAJOR;
    h.proto_minor = KVR_WIRE_VERSION_MINOR;
    h.side = side;
    h.topo = *topo;
    h.layout_version = KVR_LAYOUT_VERSION;
    h.layout = *lay;
    uint64_t check;
    kvr_status_t s = kvr_layout_digest_side(
        lay, regions, num_regions, side == KVR_WIRE_CONSUMER, &h.digest, err);
    if (s == KVR_OK)
        s = collect_classes(&h, lay, regions, num_regions, err);
    if (s == KVR_OK)
        s = classes_digest(&h, &check, err);
    if (s != KVR_OK)
        return s;
    if (check != h.digest)
        return kvr_error_set(
            err, KVR_ERR_INVALID,
            "region classes do not reproduce the layout digest "
            "(wire and plan disagree on the digest's fields)");
    randombytes_buf(h.nonce, sizeof(h.nonce));
    *hello = h;
    return KVR_OK;
}

uint64_t kvr_wire_random_nonce(void)
{
    uint64_t v = 0;
    if (kvr_init(NULL) != KVR_OK)
        return 0;
    while (v == 0)
        randombytes_buf(&v, sizeof(v));
    return v;
}

static const char *side_name(kvr_wire_side_t side)
{
    return side == KVR_WIRE_PRODUCER ? "producer" : "consumer";
}

#define MISMATCH(err, what, fmt, a, b)                                         \
    kvr_error_set(                                                             \
        err, KVR_ERR_LAYOUT_MISMATCH,                                          \
        "layout mismatch: " what " " fmt " vs " fmt " (here vs peer)", a, b)

static kvr_status_t cmp_flag(const char *yes, const char *no, const char *what,
                             bool a, bool b, kvr_error_t *err)
{
    if (a == b)
        return KVR_OK;
    return kvr_error_set(err, KVR_ERR_LAYOUT_MISMATCH,
                         "layout mismatch: %s vs %s %s (here vs peer)",
                         a ? yes : no, b ? yes : no, what);
}

static void class_text(const kvr_wire_class_t *k, char *buf, size_t cap)
{
    const char *name = kvr_role_name(k->role);
    if (k->role == KVR_ROLE_INDEX)
        snprintf(buf, cap, "index D %" PRIu64 " Q %" PRIu64, k->width,
                 k->quant);
    else if (k->role == KVR_ROLE_MLA || k->role == KVR_ROLE_DENSE)
        snprintf(buf, cap, "%s token bytes %" PRIu64, name, k->width);
    else
        snprintf(buf, cap, "%s page bytes %" PRIu64, name ? name : "?",
                 k->width);
}

/* Both sides hold the same classes (two decode ranks). */
static kvr_status_t same_classes(const kvr_msg_hello_t *a,
                                 const kvr_msg_hello_t *b, kvr_error_t *err)
{
    uint32_t n = a->num_classes > b->num_classes ? a->num_classes
                                                 : b->num_classes;
    char x[96] = "(none)", y[96] = "(none)";
    for (uint32_t i = 0; i < n; i++) {
        const kvr_wire_class_t *p = i < a->num_classes ? &a->classes[i] : NULL;
        const kvr_wire_class_t *q = i < b->num_classes ? &b->classes[i] : NULL;
        if (p && q && kvr__class_cmp(p, q) == 0)
            continue;
        if (p)
            class_text(p, x, sizeof(x));
        if (q)
            class_text(q, y, sizeof(y));
        return kvr_error_set(err, KVR_ERR_LAYOUT_MISMATCH,
                             "layout mismatch: region class %u: %s vs %s "
                             "(here vs peer)",
                             i, x, y);
    }
    return KVR_OK;
}

static const kvr_wire_class_t *find_class(const kvr_msg_hello_t *h,
                                          const kvr_wire_class_t *k,
                                          bool same_role_only)
{
    for (uint32_t i = 0; i < h->num_classes; i++)
        if (same_role_only ? h->classes[i].role == k->role
                           : kvr__class_cmp(&h->classes[i], k) == 0)
            return &h->classes[i];
    return NULL;
}

/* A producer stage holds the classes of its own layers only: a stage with
 * no index layer has no index class. Each of its classes must be one the
 * consumer holds; a class the consumer lacks, or holds with other widths,
 * is a real mismatch. */
static kvr_status_t producer_classes(const kvr_msg_hello_t *a,
                                     const kvr_msg_hello_t *b, kvr_error_t *err)
{
    bool here_producer = a->side == KVR_WIRE_PRODUCER;
    const kvr_msg_hello_t *prod = here_producer ? a : b;
    const kvr_msg_hello_t *cons = here_producer ? b : a;
    for (uint32_t i = 0; i < prod->num_classes; i++) {
        const kvr_wire_class_t *k = &prod->classes[i];
        if (find_class(cons, k, false) != NULL)
            continue;
        const kvr_wire_class_t *role = find_class(cons, k, true);
        char p[96], c[96];
        class_text(k, p, sizeof(p));
        if (role == NULL)
            return kvr_error_set(err, KVR_ERR_LAYOUT_MISMATCH,
                                 "layout mismatch: the producer's (%s) region "
                                 "class %s has no twin on the consumer (%s)",
                                 here_producer ? "here" : "peer", p,
                                 here_producer ? "peer" : "here");
        class_text(role, c, sizeof(c));
        return kvr_error_set(err, KVR_ERR_LAYOUT_MISMATCH,
                             "layout mismatch: region class %s vs %s "
                             "(here vs peer)",
                             here_producer ? p : c, here_producer ? c : p);
    }
    return KVR_OK;
}

static kvr_status_t cmp_classes(const kvr_msg_hello_t *a,
                                const kvr_msg_hello_t *b, kvr_error_t *err)
{
    /* two stages of a prefill instance (a JOIN) hold the classes of their
     * own layers: each is compared with the consumers it serves */
    if (a->side == KVR_WIRE_PRODUCER && b->side == KVR_WIRE_PRODUCER)
        return KVR_OK;
    if (a->side == b->side)
        return same_classes(a, b, err);
    return producer_classes(a, b, err);
}

/* The producer's own sharding (docs/design.md §18), defaults resolved:
 * W_p, then I_p and its index replication where W_p > 1 gives them a
 * meaning, then bs_p. */
static kvr_status_t cmp_producer(const kvr_layout_t *x, const kvr_layout_t *y,
                                 kvr_error_t *err)
{
    uint32_t wx = kvr_producer_dcp(x), wy = kvr_producer_dcp(y);
    if (wx != wy)
        return MISMATCH(err, "producer DCP size W_p", "%u", wx, wy);
    if (wx > 1 &&
        kvr_producer_interleave(x) != kvr_producer_interleave(y))
        return MISMATCH(err, "producer interleave I_p", "%u",
                        kvr_producer_interleave(x), kvr_producer_interleave(y));
    if (kvr_producer_block_size(x) != kvr_producer_block_size(y))
        return MISMATCH(err, "producer block size bs_p", "%u",
                        kvr_producer_block_size(x), kvr_producer_block_size(y));
    if (wx > 1)
        return cmp_flag("replicated", "sharded", "producer index",
                        x->producer_replicate_index,
                        y->producer_replicate_index, err);
    return KVR_OK;
}

/* Raw layout fields in digest order, then those outside the digest. */
static kvr_status_t cmp_layout(const kvr_msg_hello_t *a,
                               const kvr_msg_hello_t *b, kvr_error_t *err)
{
    const kvr_layout_t *x = &a->layout, *y = &b->layout;
    if (a->layout_version != b->layout_version)
        return MISMATCH(err, "layout version", "%u", a->layout_version,
                        b->layout_version);
    if (x->block_size != y->block_size)
        return MISMATCH(err, "block size", "%u", x->block_size, y->block_size);
    if (x->dcp_size != y->dcp_size)
        return MISMATCH(err, "DCP size W", "%u", x->dcp_size, y->dcp_size);
    if (x->interleave != y->interleave)
        return MISMATCH(err, "interleave", "%u", x->interleave, y->interleave);
    kvr_status_t s = cmp_flag("replicated", "sharded", "index",
                              x->replicate_index, y->replicate_index, err);
    if (s == KVR_OK)
        s = cmp_flag("preshuffled", "plain", "index keys", x->preshuffle,
                     y->preshuffle, err);
    if (s == KVR_OK)
        s = cmp_classes(a, b, err);
    if (s != KVR_OK)
        return s;
    if (x->tp != y->tp)
        return MISMATCH(err, "consumer TP size", "%u", x->tp, y->tp);
    if (x->producer_tp != y->producer_tp)
        return MISMATCH(err, "producer TP size", "%u", x->producer_tp,
                        y->producer_tp);
    s = cmp_producer(x, y, err);
    if (s != KVR_OK)
        return s;
    /* The two digests cover different class sets when a stage lacks a
     * class, so the peer's digest is checked against its own raw fields:
     * a difference means the two builds compute the digest differently. */
    uint64_t theirs = 0;
    s = classes_digest(b, &theirs, err);
    if (s == KVR_OK && theirs != b->digest)
        return MISMATCH(err, "digest (raw fields agree)", "%016" PRIx64, theirs,
                        b->digest);
    return s;
}

/* The next "key=value" token of a settings text: *key and *klen name the
 * key, *tok and *tlen the whole token; returns the rest, or NULL at the end. */
static const char *next_setting(const char *s, const char **tok, size_t *tlen,
                                size_t *klen)
{
    s += strspn(s, " ");
    if (*s == '\0')
        return NULL;
    *tok = s;
    *tlen = strcspn(s, " ");
    const char *eq = memchr(s, '=', *tlen);
    *klen = eq ? (size_t)(eq - s) : *tlen;
    return s + *tlen;
}

/* The token of `text` whose key is key[0..klen), or NULL. */
static const char *find_setting(const char *text, const char *key, size_t klen,
                                size_t *tlen)
{
    const char *tok = NULL;
    size_t kl = 0;
    for (const char *s = text; (s = next_setting(s, &tok, tlen, &kl)) != NULL;)
        if (kl == klen && memcmp(tok, key, klen) == 0)
            return tok;
    return NULL;
}

/* The first setting of `a` that `b` lacks or holds with another value. */
static bool first_difference(const char *a, const char *b, const char **tok,
                             size_t *tlen, const char **other, size_t *olen)
{
    size_t klen = 0;
    for (const char *s = a; (s = next_setting(s, tok, tlen, &klen)) != NULL;) {
        *other = find_setting(b, *tok, klen, olen);
        if (*other == NULL || *olen != *tlen ||
            memcmp(*other, *tok, *tlen) != 0)
            return true;
    }
    return false;
}

/* Application settings: the same pairs on both sides, in any order. */
static kvr_status_t cmp_settings(const kvr_msg_hello_t *a,
                                 const kvr_msg_hello_t *b, kvr_error_t *err)
{
    const char *x = NULL, *y = NULL;
    size_t xl = 0, yl = 0;
    bool here_first = first_difference(a->settings, b->settings, &x, &xl, &y,
                                       &yl);
    if (!here_first &&
        !first_difference(b->settings, a->settings, &y, &yl, &x, &xl))
        return KVR_OK;
    return kvr_error_set(err, KVR_ERR_LAYOUT_MISMATCH,
                         "settings differ: %.*s vs %.*s (here vs peer)",
                         x ? (int)xl : 7, x ? x : "(unset)", y ? (int)yl : 7,
                         y ? y : "(unset)");
}

/* A sharded producer's DCP rank is one of its W_p; any other side's (an
 * unsharded producer's too, as before W_p existed) one of the consumer's W. */
static uint32_t dcp_size_of(const kvr_msg_hello_t *p)
{
    uint32_t Wp = kvr_producer_dcp(&p->layout);
    return p->side == KVR_WIRE_PRODUCER && Wp > 1 ? Wp : p->layout.dcp_size;
}

/* The peer's own topology must make sense before anything is planned. */
static kvr_status_t check_topo(const kvr_msg_hello_t *p, kvr_error_t *err)
{
    const kvr_wire_topo_t *t = &p->topo;
    const struct {
        const char *name;
        uint32_t rank, size;
    } r[] = {
        {"pp", t->pp_rank, t->pp_size},
        {"tp", t->tp_rank, t->tp_size},
        {"dp", t->dp_rank, t->dp_size},
        {"dcp", t->dcp_rank, dcp_size_of(p)},
    };
    for (size_t i = 0; i < sizeof(r) / sizeof(r[0]); i++)
        if (r[i].rank >= r[i].size)
            return kvr_error_set(err, KVR_ERR_PROTO,
                                 "peer %s rank %u >= %s size %u", r[i].name,
                                 r[i].rank, r[i].name, r[i].size);
    if (t->layer_start >= t->layer_end)
        return kvr_error_set(err, KVR_ERR_PROTO,
                             "peer layer range [%u, %u) is empty",
                             t->layer_start, t->layer_end);
    return KVR_OK;
}

void kvr_wire_hello_blank(const kvr_msg_hello_t *full, kvr_msg_hello_t *out)
{
    kvr_msg_hello_t h;
    memset(&h, 0, sizeof(h));
    h.proto_major = full->proto_major;
    h.proto_minor = full->proto_minor;
    h.side = full->side;
    h.has_key = full->has_key;
    memcpy(h.nonce, full->nonce, sizeof(h.nonce));
    *out = h;
}

kvr_status_t kvr_wire_hello_check_intro(const kvr_msg_hello_t *ours,
                                        const kvr_msg_hello_t *peer,
                                        kvr_wire_side_t peer_side,
                                        kvr_error_t *err)
{
    if (ours == NULL || peer == NULL)
        return kvr_error_set(err, KVR_ERR_INVALID, "NULL argument");
    if (ours->proto_major != peer->proto_major)
        return kvr_error_set(err, KVR_ERR_VERSION,
                             "protocol version %u.%u vs %u.%u (here vs peer)",
                             ours->proto_major, ours->proto_minor,
                             peer->proto_major, peer->proto_minor);
    if (peer->side != peer_side)
        return kvr_error_set(err, KVR_ERR_PEER_ROLE,
                             "peer is a %s, expected a %s",
                             side_name(peer->side), side_name(peer_side));
    if (ours->has_key != peer->has_key)
        return kvr_error_set(err, KVR_ERR_AUTH,
                             "pre-shared key: %s here, %s on the peer",
                             ours->has_key ? "configured" : "not configured",
                             peer->has_key ? "configured" : "not configured");
    return KVR_OK;
}

kvr_status_t kvr_wire_hello_check(const kvr_msg_hello_t *ours,
                                  const kvr_msg_hello_t *peer,
                                  kvr_wire_side_t peer_side, kvr_error_t *err)
{
    kvr_status_t s = kvr_wire_hello_check_intro(ours, peer, peer_side, err);
    if (s == KVR_OK)
        s = check_topo(peer, err);
    if (s == KVR_OK)
        s = cmp_layout(ours, peer, err);
    return s == KVR_OK ? cmp_settings(ours, peer, err) : s;
}
