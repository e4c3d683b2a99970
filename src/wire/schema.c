/* Field tables of every message (docs/design.md §7, docs/PROTOCOL.md). The order
 * of a table is the order on the wire; appending a field is a minor version
 * bump only when old decoders may reject it (they do: trailing bytes). */
#include <stddef.h>
#include <stdint.h>

#include "wire_internal.h"

#define MEMBER_SIZE(T, m) sizeof(((T *)0)->m)
#define F_INT(T, m, w, l, h)                                                   \
    {                                                                          \
#m, KVR__F_INT, w, MEMBER_SIZE(T, m), offsetof(T, m), 0, l, h, NULL    \
    }
#define F_U32(T, m) F_INT(T, m, 4, 0, UINT32_MAX)
#define F_U64(T, m) F_INT(T, m, 8, 0, UINT64_MAX)
#define F_BOOL(T, m) F_INT(T, m, 1, 0, 1)
/* kvr_status_t travels as u32; lo excludes KVR_OK where it is meaningless. */
#define F_STATUS(T, m, l) F_INT(T, m, 4, l, INT32_MAX)
#define F_DEADLINE(T, m) F_INT(T, m, 4, 1, KVR_WIRE_DEADLINE_MAX_MS)
#define F_ID(T, m)                                                             \
    {                                                                          \
#m, KVR__F_ID, 0, 0, offsetof(T, m), 0, 1, KVR_WIRE_REQ_ID_MAX, NULL   \
    }
#define F_TEXT(T, m)                                                           \
    {                                                                          \
#m, KVR__F_TEXT, 0, 0, offsetof(T, m), 0, 0, KVR_WIRE_TEXT_MAX, NULL   \
    }
#define F_FIXED(T, m)                                                          \
    {                                                                          \
#m, KVR__F_FIXED, 0, 0, offsetof(T, m), 0, 0, MEMBER_SIZE(T, m), NULL  \
    }
#define F_ARRAY(kind, T, m, n, cap, sub)                                       \
    {                                                                          \
#m, kind, 0, 0, offsetof(T, m), offsetof(T, n), 0, cap, sub            \
    }
#define F_U32S(T, m, n, cap) F_ARRAY(KVR__F_U32S, T, m, n, cap, NULL)

/* Every request-scoped message starts with these. */
#define F_HEAD(T) F_ID(T, request_id), F_U64(T, transfer_id)
/* Producer answers name their source and echo the write nonce (never 0). */
#define F_NONCE(T) F_INT(T, write_nonce, 8, 1, UINT64_MAX)
#define F_SOURCE(T) F_U32(T, pp_rank), F_U32(T, tp_rank), F_NONCE(T)

#define REC(label, T, fields)                                                  \
    {                                                                          \
        label, fields, sizeof(fields) / sizeof(fields[0]), sizeof(T)           \
    }

static const kvr__field_t class_fields[] = {
    F_INT(kvr_wire_class_t, role, 1, KVR_ROLE_MLA, KVR_ROLE_OTHER),
    F_U64(kvr_wire_class_t, width),
    F_U64(kvr_wire_class_t, quant),
};
static const kvr__rec_t class_rec = REC("class", kvr_wire_class_t,
                                        class_fields);

#define H kvr_msg_hello_t
static const kvr__field_t hello_fields[] = {
    F_INT(H, proto_major, 1, 0, UINT8_MAX),
    F_INT(H, proto_minor, 1, 0, UINT8_MAX),
    F_INT(H, side, 1, KVR_WIRE_PRODUCER, KVR_WIRE_CONSUMER),
    F_BOOL(H, has_key),
    F_U32(H, topo.pp_rank),
    F_U32(H, topo.pp_size),
    F_U32(H, topo.tp_rank),
    F_U32(H, topo.tp_size),
    F_U32(H, topo.dp_rank),
    F_U32(H, topo.dp_size),
    F_U32(H, topo.layer_start),
    F_U32(H, topo.layer_end),
    F_U32(H, topo.dcp_rank),
    F_U32(H, layout_version),
    F_U32(H, layout.block_size),
    F_U32(H, layout.dcp_size),
    F_U32(H, layout.interleave),
    F_U32(H, layout.tp),
    F_U32(H, layout.producer_tp),
    F_BOOL(H, layout.replicate_index),
    F_BOOL(H, layout.preshuffle),
    F_ARRAY(KVR__F_INLINE, H, classes, num_classes, KVR_WIRE_MAX_CLASSES,
            &class_rec),
    F_U64(H, digest),
    F_FIXED(H, nonce),
    F_TEXT(H, settings),
    {"instance", KVR__F_ID, 0, 0, offsetof(H, instance), 0, 0,
     KVR_WIRE_INSTANCE_MAX, NULL},
    F_U64(H, incarnation),
    /* 3.0: the producer's own sharding (docs/design.md §18) */
    F_U32(H, layout.producer_dcp),
    F_U32(H, layout.producer_interleave),
    F_U32(H, layout.producer_block_size),
    F_BOOL(H, layout.producer_replicate_index),
};
#undef H
static const kvr__rec_t hello_rec = REC("HELLO", kvr_msg_hello_t, hello_fields);
static const kvr__rec_t hello_ack_rec = REC("HELLO_ACK", kvr_msg_hello_t,
                                            hello_fields);
static const kvr__rec_t layout_rec = REC("LAYOUT", kvr_msg_hello_t,
                                         hello_fields);

static const kvr__field_t auth_fields[] = {F_FIXED(kvr_msg_auth_t, mac)};
static const kvr__rec_t auth_rec = REC("AUTH", kvr_msg_auth_t, auth_fields);

static const kvr__field_t bye_fields[] = {
    F_STATUS(kvr_msg_bye_t, status, 0),
    F_TEXT(kvr_msg_bye_t, text),
};
static const kvr__rec_t bye_rec = REC("BYE", kvr_msg_bye_t, bye_fields);

#define R kvr_wire_region_t
static const kvr__field_t region_fields[] = {
    F_INT(R, desc.role, 1, KVR_ROLE_MLA, KVR_ROLE_OTHER),
    F_U32(R, desc.layer),
    F_U64(R, desc.num_blocks),
    F_U64(R, desc.page_bytes),
    F_U32(R, desc.index_dim),
    F_U32(R, desc.quant_block),
    F_U64(R, desc.bytes),
    F_U64(R, base),
    F_ARRAY(KVR__F_BYTES, R, rkey, rkey_len, KVR_WIRE_RKEY_MAX, NULL),
    F_INT(R, memory, 1, KVR_WIRE_MEM_HOST, KVR_WIRE_MEM_CUDA),
    /* 3.0: dense head geometry (docs/design.md §18) */
    F_U32(R, desc.heads),
    F_U32(R, desc.head_dim),
    F_U32(R, desc.elem_bytes),
    F_U32(R, desc.kv_planes),
    F_BOOL(R, desc.hnd),
};
#undef R
static const kvr__rec_t region_rec = REC("region", kvr_wire_region_t,
                                         region_fields);

static const kvr__field_t regions_fields[] = {
    F_ARRAY(KVR__F_RECS, kvr_msg_regions_t, regions, num_regions,
            KVR_WIRE_MAX_REGIONS, &region_rec),
    F_ARRAY(KVR__F_BYTES, kvr_msg_regions_t, address, address_len,
            KVR_WIRE_ADDR_MAX, NULL),
};
static const kvr__rec_t regions_rec = REC("REGIONS", kvr_msg_regions_t,
                                          regions_fields);

#define O kvr_msg_offer_t
static const kvr__field_t offer_fields[] = {
    F_HEAD(O),
    F_U64(O, num_tokens),
    F_U32S(O, src_blocks, num_src_blocks, KVR_WIRE_MAX_BLOCKS),
    F_U32S(O, prompt, num_prompt, KVR_WIRE_MAX_PROMPT),
};
#undef O
static const kvr__rec_t offer_rec = REC("OFFER", kvr_msg_offer_t, offer_fields);

#define A kvr_msg_assign_t
static const kvr__field_t assign_fields[] = {
    F_HEAD(A),
    F_U32S(A, dst_blocks, num_dst_blocks, KVR_WIRE_MAX_BLOCKS),
    F_U64(A, num_computed_blocks),
    F_DEADLINE(A, deadline_ms),
};
#undef A
static const kvr__rec_t assign_rec = REC("ASSIGN", kvr_msg_assign_t,
                                         assign_fields);

#define W kvr_msg_write_request_t
#define WRITE_REQUEST_FIELDS                                                   \
    F_HEAD(W), F_U32S(W, src_blocks, num_src_blocks, KVR_WIRE_MAX_BLOCKS),     \
        F_U32S(W, dst_blocks, num_dst_blocks, KVR_WIRE_MAX_BLOCKS),            \
        F_U64(W, num_tokens), F_U64(W, num_computed_blocks),                   \
        F_U32(W, dcp_rank),                                                    \
        F_INT(W, executor, 1, KVR_WIRE_EXEC_AUTO, KVR_WIRE_EXEC_GPU_STAGED),   \
        F_U32S(W, staging_slots, num_staging_slots, KVR_WIRE_MAX_SLOTS),       \
        F_NONCE(W), F_DEADLINE(W, deadline_ms)
static const kvr__field_t write_request_fields[] = {WRITE_REQUEST_FIELDS};
/* 3.1: WRITE_REQUEST's fields, then the layer range (a new type rather
 * than new fields, so that 3.0 peers keep reading WRITE_REQUEST) */
static const kvr__field_t stream_request_fields[] = {
    WRITE_REQUEST_FIELDS,
    F_U32(W, layer_begin),
    F_INT(W, layer_end, 4, 1, UINT32_MAX),
};
#undef WRITE_REQUEST_FIELDS
#undef W
static const kvr__rec_t write_request_rec = REC(
    "WRITE_REQUEST", kvr_msg_write_request_t, write_request_fields);
static const kvr__rec_t stream_request_rec = REC(
    "STREAM_REQUEST", kvr_msg_write_request_t, stream_request_fields);

#define D kvr_msg_write_done_t
static const kvr__field_t write_done_fields[] = {
    F_HEAD(D),
    F_SOURCE(D),
    F_U64(D, bytes),
    F_U32(D, chunks),
};
#undef D
static const kvr__rec_t write_done_rec = REC("WRITE_DONE", kvr_msg_write_done_t,
                                             write_done_fields);

#define G kvr_msg_layers_done_t
static const kvr__field_t layers_done_fields[] = {
    F_HEAD(G),
    F_SOURCE(G),
    F_U32(G, layer_begin),
    F_INT(G, layer_end, 4, 1, UINT32_MAX),
    F_U64(G, bytes),
    F_U32(G, chunks),
};
#undef G
static const kvr__rec_t layers_done_rec = REC(
    "LAYERS_DONE", kvr_msg_layers_done_t, layers_done_fields);

#define F kvr_msg_write_failed_t
static const kvr__field_t write_failed_fields[] = {
    F_HEAD(F),
    F_SOURCE(F),
    F_STATUS(F, status, 1),
    F_TEXT(F, text),
};
#undef F
static const kvr__rec_t write_failed_rec = REC(
    "WRITE_FAILED", kvr_msg_write_failed_t, write_failed_fields);

#define L kvr_msg_release_t
static const kvr__field_t release_fields[] = {
    F_HEAD(L),
    F_U32(L, consumer_rank),
    F_NONCE(L),
    F_STATUS(L, outcome, 0),
};
#undef L
static const kvr__rec_t release_rec = REC("RELEASE", kvr_msg_release_t,
                                          release_fields);

#define C kvr_msg_chunk_done_t
static const kvr__field_t chunk_done_fields[] = {
    F_HEAD(C),      F_SOURCE(C),      F_U32(C, chunk),
    F_U32(C, slot), F_U64(C, offset), F_U64(C, bytes),
};
#undef C
static const kvr__rec_t chunk_done_rec = REC("CHUNK_DONE", kvr_msg_chunk_done_t,
                                             chunk_done_fields);

static const kvr__field_t join_fields[] = {F_TEXT(kvr_msg_join_t, address)};
static const kvr__rec_t join_rec = REC("JOIN", kvr_msg_join_t, join_fields);

#define S kvr_wire_stage_t
static const kvr__field_t stage_fields[] = {
    F_U32(S, pp_rank),
    F_U32(S, tp_rank),
    F_U64(S, incarnation),
    F_TEXT(S, address),
    F_U32(S, dcp_rank), /* 3.0 */
};
#undef S
static const kvr__rec_t stage_rec = REC("stage", kvr_wire_stage_t,
                                        stage_fields);

static const kvr__field_t stages_fields[] = {
    F_INT(kvr_msg_stages_t, pp_size, 4, 1, UINT32_MAX),
    F_INT(kvr_msg_stages_t, tp_size, 4, 1, UINT32_MAX),
    F_ARRAY(KVR__F_RECS, kvr_msg_stages_t, stages, num_stages,
            KVR_WIRE_MAX_STAGES, &stage_rec),
};
static const kvr__rec_t stages_rec = REC("STAGES", kvr_msg_stages_t,
                                         stages_fields);

static const kvr__field_t notify_fields[] = {
    F_TEXT(kvr_msg_notify_t, address),
    F_ARRAY(KVR__F_BYTES, kvr_msg_notify_t, payload, len, KVR_WIRE_NOTIFY_MAX,
            NULL),
};
static const kvr__rec_t notify_rec = REC("NOTIFY", kvr_msg_notify_t,
                                         notify_fields);

static const kvr__rec_t *const schemas[] = {
    [KVR_MSG_HELLO] = &hello_rec,
    [KVR_MSG_HELLO_ACK] = &hello_ack_rec,
    [KVR_MSG_AUTH] = &auth_rec,
    [KVR_MSG_BYE] = &bye_rec,
    [KVR_MSG_LAYOUT] = &layout_rec,
    [KVR_MSG_REGIONS] = &regions_rec,
    [KVR_MSG_OFFER] = &offer_rec,
    [KVR_MSG_ASSIGN] = &assign_rec,
    [KVR_MSG_WRITE_REQUEST] = &write_request_rec,
    [KVR_MSG_WRITE_DONE] = &write_done_rec,
    [KVR_MSG_WRITE_FAILED] = &write_failed_rec,
    [KVR_MSG_RELEASE] = &release_rec,
    [KVR_MSG_CHUNK_DONE] = &chunk_done_rec,
    [KVR_MSG_JOIN] = &join_rec,
    [KVR_MSG_STAGES] = &stages_rec,
    [KVR_MSG_NOTIFY] = &notify_rec,
    [KVR_MSG_STREAM_REQUEST] = &stream_request_rec,
    [KVR_MSG_LAYERS_DONE] = &layers_done_rec,
};

const kvr__rec_t *kvr__schema(uint16_t type)
{
    if (type >= sizeof(schemas) / sizeof(schemas[0]))
        return NULL;
    return schemas[type];
}

const char *kvr_msg_type_name(kvr_msg_type_t type)
{
    const kvr__rec_t *r = ((unsigned)type <= UINT16_MAX)
                              ? kvr__schema((uint16_t)type)
                              : NULL;
    return r ? r->name : NULL;
}
