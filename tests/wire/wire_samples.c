#include "wire_samples.h"

#include <string.h>

const kvr_msg_type_t kvr_sample_types[] = {
    KVR_MSG_HELLO,      KVR_MSG_HELLO_ACK,      KVR_MSG_AUTH,
    KVR_MSG_BYE,        KVR_MSG_LAYOUT,         KVR_MSG_REGIONS,
    KVR_MSG_OFFER,      KVR_MSG_ASSIGN,         KVR_MSG_WRITE_REQUEST,
    KVR_MSG_WRITE_DONE, KVR_MSG_WRITE_FAILED,   KVR_MSG_RELEASE,
    KVR_MSG_CHUNK_DONE, KVR_MSG_JOIN,           KVR_MSG_STAGES,
    KVR_MSG_NOTIFY,     KVR_MSG_STREAM_REQUEST, KVR_MSG_LAYERS_DONE,
};
const size_t kvr_num_sample_types = sizeof(kvr_sample_types) /
                                    sizeof(kvr_sample_types[0]);

static const uint32_t src_blocks[] = {7, 3, 11, 0, 0xfffffffeu};
static const uint32_t dst_blocks[] = {42, 9};
static const uint32_t prompt[] = {1, 2, 3, 100000, 0xffffffffu, 5};
static const uint32_t slots[] = {0, 5, 6};
static const uint8_t rkey_a[] = {0xde, 0xad, 0xbe, 0xef, 0x00, 0x01};
static const uint8_t rkey_b[] = {0x55};
static const uint8_t address[] = {0x01, 0x7f, 0x00, 0x00, 0x01, 0x27, 0x10};

static const kvr_wire_stage_t stages[] = {
    {0, 0, 0x1111222233334444ull, "10.0.0.1:7001", 0},
    {1, 0, 0x5555666677778888ull, "10.0.0.2:7001", 1},
};

static const kvr_wire_region_t regions[] = {
    {{.role = KVR_ROLE_MLA,
      .layer = 3,
      .num_blocks = 1000,
      .page_bytes = 64 * 576},
     0x7f0000001000ull,
     rkey_a,
     sizeof(rkey_a),
     KVR_WIRE_MEM_HOST},
    {{.role = KVR_ROLE_INDEX,
      .layer = 3,
      .num_blocks = 1000,
      .page_bytes = 64 * 4 * 144,
      .index_dim = 128},
     0x7f0000900000ull,
     rkey_b,
     sizeof(rkey_b),
     KVR_WIRE_MEM_CUDA},
    {{.role = KVR_ROLE_STAGING,
      .num_blocks = 16,
      .page_bytes = 1 << 20,
      .bytes = 16 << 20},
     0x7f0010000000ull,
     NULL,
     0,
     KVR_WIRE_MEM_HOST},
};

void kvr_sample_hello(kvr_msg_hello_t *h)
{
    kvr_layout_t lay = KVR_LAYOUT_INIT;
    lay.dcp_size = 4;
    lay.tp = 4;
    lay.interleave = 1;
    lay.replicate_index = true;
    kvr_wire_topo_t topo = {.pp_rank = 0,
                            .pp_size = 1,
                            .tp_rank = 2,
                            .tp_size = 4,
                            .dp_rank = 0,
                            .dp_size = 1,
                            .layer_start = 0,
                            .layer_end = 61,
                            .dcp_rank = 2};
    kvr_region_desc_t r[3] = {regions[0].desc, regions[1].desc,
                              regions[2].desc};
    r[1].page_bytes = 256 * 144; /* replicated: P = bs * W */
    kvr_wire_hello_init(h, KVR_WIRE_CONSUMER, &topo, &lay, r, 3, NULL);
    kvr_wire_id_set(&h->instance, "decode-0", 8, NULL);
    h->incarnation = 0x0badc0ffee0ddf00ull;
}

static void sample_head(kvr_wire_id_t *id, uint64_t *transfer_id)
{
    static const char req[] = "cmpl-4f1c2b7e-0";
    kvr_wire_id_set(id, req, sizeof(req) - 1, NULL);
    *transfer_id = 0x1122334455667788ull;
}

static void sample_requests(kvr_msg_t *m)
{
    kvr_msg_offer_t *o = &m->u.offer;
    kvr_msg_assign_t *a = &m->u.assign;
    kvr_msg_write_request_t *w = &m->u.write_request;
    switch (m->type) {
    case KVR_MSG_OFFER:
        o->num_tokens = 300;
        o->src_blocks = src_blocks;
        o->num_src_blocks = 5;
        o->prompt = prompt;
        o->num_prompt = 6;
        break;
    case KVR_MSG_ASSIGN:
        a->dst_blocks = dst_blocks;
        a->num_dst_blocks = 2;
        a->num_computed_blocks = 1;
        break;
    default:
        w->src_blocks = src_blocks;
        w->num_src_blocks = 5;
        w->dst_blocks = dst_blocks;
        w->num_dst_blocks = 2;
        w->num_tokens = 300;
        w->dcp_rank = 3;
        w->executor = KVR_WIRE_EXEC_STAGED;
        w->staging_slots = slots;
        w->num_staging_slots = 3;
        w->write_nonce = 0x0123456789abcdefull;
        w->deadline_ms = 1500;
        if (m->type == KVR_MSG_STREAM_REQUEST) {
            w->layer_begin = 15;
            w->layer_end = 30;
        }
        break;
    }
}

static void sample_answers(kvr_msg_t *m)
{
    kvr_msg_write_done_t *d = &m->u.write_done;
    kvr_msg_write_failed_t *f = &m->u.write_failed;
    kvr_msg_release_t *r = &m->u.release;
    kvr_msg_chunk_done_t *c = &m->u.chunk_done;
    kvr_msg_layers_done_t *g = &m->u.layers_done;
    switch (m->type) {
    case KVR_MSG_LAYERS_DONE:
        *g = (kvr_msg_layers_done_t){.pp_rank = 1,
                                     .tp_rank = 0,
                                     .write_nonce = 81,
                                     .layer_begin = 15,
                                     .layer_end = 17,
                                     .bytes = 3 << 20,
                                     .chunks = 3};
        break;
    case KVR_MSG_WRITE_DONE:
        *d = (kvr_msg_write_done_t){.pp_rank = 3,
                                    .tp_rank = 0,
                                    .write_nonce = 77,
                                    .bytes = 1 << 20,
                                    .chunks = 4};
        break;
    case KVR_MSG_WRITE_FAILED:
        *f = (kvr_msg_write_failed_t){
            .pp_rank = 1, .write_nonce = 78, .status = KVR_ERR_BLOCK_RANGE};
        strcpy(f->text, "block id 5000 outside region of 4096 blocks");
        break;
    case KVR_MSG_RELEASE:
        *r = (kvr_msg_release_t){
            .consumer_rank = 2, .write_nonce = 79, .outcome = KVR_ERR_TIMEOUT};
        break;
    default:
        *c = (kvr_msg_chunk_done_t){.pp_rank = 2,
                                    .tp_rank = 1,
                                    .write_nonce = 80,
                                    .chunk = 9,
                                    .slot = 5,
                                    .offset = 9ull << 20,
                                    .bytes = 1 << 20};
        break;
    }
    sample_head(&m->u.write_done.request_id, &m->u.write_done.transfer_id);
}

void kvr_sample_msg(kvr_msg_type_t type, kvr_msg_t *m)
{
    kvr_msg_init(m, type);
    switch (type) {
    case KVR_MSG_HELLO:
    case KVR_MSG_HELLO_ACK:
    case KVR_MSG_LAYOUT:
        kvr_sample_hello(&m->u.hello);
        break;
    case KVR_MSG_AUTH:
        for (size_t i = 0; i < sizeof(m->u.auth.mac); i++)
            m->u.auth.mac[i] = (uint8_t)(i * 7 + 1);
        break;
    case KVR_MSG_BYE:
        m->u.bye.status = KVR_ERR_LAYOUT_MISMATCH;
        strcpy(m->u.bye.text, "layout mismatch: interleave 1 vs 4");
        break;
    case KVR_MSG_REGIONS:
        m->u.regions.regions = regions;
        m->u.regions.num_regions = 3;
        m->u.regions.address = address;
        m->u.regions.address_len = sizeof(address);
        break;
    case KVR_MSG_JOIN:
        strcpy(m->u.join.address, "10.0.0.2:7001");
        break;
    case KVR_MSG_STAGES:
        m->u.stages.pp_size = 2;
        m->u.stages.tp_size = 1;
        m->u.stages.stages = stages;
        m->u.stages.num_stages = 2;
        break;
    case KVR_MSG_NOTIFY:
        strcpy(m->u.notify.address, "10.0.0.9:7100");
        m->u.notify.payload = address;
        m->u.notify.len = sizeof(address);
        break;
    case KVR_MSG_OFFER:
    case KVR_MSG_ASSIGN:
    case KVR_MSG_WRITE_REQUEST:
    case KVR_MSG_STREAM_REQUEST:
        sample_head(&m->u.offer.request_id, &m->u.offer.transfer_id);
        sample_requests(m);
        break;
    default:
        sample_answers(m);
        break;
    }
}
