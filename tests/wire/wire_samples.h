/* One valid message of every type, for the codec tests, the fuzz seed
 * corpus and the fuzz target. Arrays are static: never kvr_msg_free them. */
#ifndef KVR_TEST_WIRE_SAMPLES_H
#define KVR_TEST_WIRE_SAMPLES_H

#include <stddef.h>

#include "kvrelay/wire.h"

extern const kvr_msg_type_t kvr_sample_types[];
extern const size_t kvr_num_sample_types;

/* Fills msg with a valid sample of type. */
void kvr_sample_msg(kvr_msg_type_t type, kvr_msg_t *msg);

/* The HELLO a consumer of a PP4 -> TP4 x DCP4 deployment would send. */
void kvr_sample_hello(kvr_msg_hello_t *hello);

#endif
