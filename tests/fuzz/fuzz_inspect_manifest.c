/* libFuzzer target over `kvrelay inspect`'s dump reader: any manifest.json
 * next to a few small, valid page images. The reader must never crash,
 * leak, or read past an image; a hostile manifest is an error, not a fault. */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "kvrelay/inspect.h"

static char dir[256];

static void write_image(const char *name, size_t len)
{
    char path[512];
    snprintf(path, sizeof(path), "%s/%s", dir, name);
    FILE *f = fopen(path, "wb");
    for (size_t i = 0; f != NULL && i < len; i++)
        fputc((int)(i * 131u + 7u) & 0xff, f);
    if (f != NULL)
        fclose(f);
}

/* Images matching tests/fuzz/inspect-seed.json: bs 4, W 2, MLA 16 B/token,
 * index D 16 (page width 32), replicated. */
int LLVMFuzzerInitialize(int *argc, char ***argv)
{
    (void)argc, (void)argv;
    snprintf(dir, sizeof(dir), "/tmp/kvr-fuzz-inspect-%d", (int)getpid());
    char cmd[300];
    snprintf(cmd, sizeof(cmd), "mkdir -p %s", dir);
    if (system(cmd) != 0)
        abort();
    write_image("s.bin", 4 * 64);
    write_image("d0.bin", 2 * 64);
    write_image("d1.bin", 2 * 64);
    write_image("is.bin", 4 * 128);
    write_image("id0.bin", 2 * 256);
    write_image("id1.bin", 2 * 256);
    return 0;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    char path[512];
    snprintf(path, sizeof(path), "%s/manifest.json", dir);
    FILE *f = fopen(path, "wb");
    if (f == NULL)
        return 0;
    fwrite(data, 1, size, f);
    fclose(f);
    kvr_inspect_report_t *rep = NULL;
    kvr_error_t err;
    if (kvr_inspect_dump(dir, NULL, &rep, &err) == KVR_OK) {
        char *json = kvr_inspect_report_json(rep);
        kvr_inspect_free(json);
        kvr_inspect_report_destroy(rep);
    }
    return 0;
}
