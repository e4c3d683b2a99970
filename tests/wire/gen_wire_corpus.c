/* Writes the fuzz seed corpus: one valid frame of every message type, plus
 * variants with empty arrays. Usage: gen_wire_corpus DIR */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kvrelay/wire.h"
#include "wire_samples.h"

static int write_frame(const char *dir, const char *name, const kvr_msg_t *m)
{
    uint8_t *buf;
    size_t len;
    kvr_error_t err = {0};
    if (kvr_wire_encode_alloc(m, &buf, &len, &err) != KVR_OK) {
        fprintf(stderr, "gen_wire_corpus: %s: %s\n", name, err.msg);
        return 1;
    }
    char path[4096];
    snprintf(path, sizeof(path), "%s/%s.bin", dir, name);
    FILE *f = fopen(path, "wb");
    int bad = f == NULL || fwrite(buf, 1, len, f) != len;
    if (f && fclose(f) != 0)
        bad = 1;
    if (bad)
        perror(path);
    free(buf);
    return bad;
}

/* Same message with every array emptied (counts 0, pointers NULL). */
static void empty_arrays(kvr_msg_t *m)
{
    m->u.offer.num_src_blocks = m->u.offer.num_prompt = 0;
    m->u.offer.src_blocks = m->u.offer.prompt = NULL;
}

int main(int argc, char **argv)
{
    if (argc != 2) {
        fprintf(stderr, "usage: gen_wire_corpus DIR\n");
        return 2;
    }
    int bad = 0;
    for (size_t i = 0; i < kvr_num_sample_types; i++) {
        kvr_msg_t m;
        kvr_sample_msg(kvr_sample_types[i], &m);
        const char *name = kvr_msg_type_name(m.type);
        bad |= write_frame(argv[1], name, &m);
        if (m.type == KVR_MSG_OFFER) {
            char alt[64];
            empty_arrays(&m);
            snprintf(alt, sizeof(alt), "%s-empty", name);
            bad |= write_frame(argv[1], alt, &m);
        }
    }
    return bad;
}
