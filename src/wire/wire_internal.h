/* Internals of the wire layer: messages are described by field tables
 * (schema.c) that one encoder and one decoder walk (codec.c), so every
 * message gets the same bounds, cap and range checks on both sides. */
#ifndef KVRELAY_WIRE_INTERNAL_H
#define KVRELAY_WIRE_INTERNAL_H

#include <stddef.h>
#include <stdint.h>

#include "kvrelay/wire.h"

#include "base_internal.h"

typedef enum {
    KVR__F_INT,    /* integer, bool or enum; range [lo, hi] */
    KVR__F_ID,     /* kvr_wire_id_t: u16 length + bytes */
    KVR__F_TEXT,   /* char[KVR_WIRE_TEXT_MAX + 1]: u16 length + bytes */
    KVR__F_FIXED,  /* uint8_t[hi]: raw bytes */
    KVR__F_U32S,   /* const uint32_t * + uint32_t count: u32 count + items */
    KVR__F_BYTES,  /* const uint8_t * + uint32_t count: u32 count + bytes */
    KVR__F_RECS,   /* const T * + uint32_t count: u32 count + records */
    KVR__F_INLINE, /* T[hi] inline + uint32_t count: u32 count + records */
} kvr__kind_t;

typedef struct kvr__rec kvr__rec_t;

typedef struct kvr__field {
    const char *name;
    uint8_t kind;
    uint8_t wire;          /* INT: bytes on the wire */
    uint8_t mem;           /* INT: bytes in memory */
    size_t off;            /* value, pointer or inline array */
    size_t count_off;      /* arrays: their uint32_t count */
    uint64_t lo, hi;       /* INT: accepted range; arrays: cap; FIXED: size */
    const kvr__rec_t *sub; /* RECS, INLINE: the element's fields */
} kvr__field_t;

struct kvr__rec {
    const char *name;
    const kvr__field_t *fields;
    size_t num_fields;
    size_t size; /* sizeof the C struct */
};

/* The field table of a message type; NULL for an unknown type. */
const kvr__rec_t *kvr__schema(uint16_t type);

#endif
