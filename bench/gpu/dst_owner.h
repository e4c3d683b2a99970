/* Destination regions that another process owns, for bench_rl_trace
 * --dst (docs/performance.md, run 2026-12-02n): in `kvrelay bench
 * serving` a stage writes decode ranks' pages through CUDA IPC mappings,
 * and random destination pages cost half the rate there that they cost
 * nothing in one process. This takes the mapping apart from the agents:
 * the bench starts itself again as the owner (`--dst-owner`), which
 * allocates the regions and hands them over a socket, as
 *   ipc:  one cudaMalloc a region, a cudaIpcMemHandle each (as the agents);
 *   slab: one cudaMalloc for all regions (2 MiB apart), one handle;
 *   vmm:  cuMemCreate a region (the granularity CUDA recommends), its
 *         POSIX file descriptor passed with SCM_RIGHTS, mapped here with
 *         cuMemImportFromShareableHandle and cuMemMap. */
#ifndef KVRELAY_BENCH_DST_OWNER_H
#define KVRELAY_BENCH_DST_OWNER_H

#include <stdint.h>
#include <sys/types.h>

typedef enum { DST_LOCAL, DST_IPC, DST_SLAB, DST_VMM } dst_mode_t;

typedef struct {
    dst_mode_t mode;
    pid_t pid;   /* the owner; 0: none */
    int sock;    /* to it; EOF tells it to free and leave */
    uint32_t n;  /* regions mapped */
    uint64_t size; /* each mapping's length (vmm: rounded up) */
    void **ptr;  /* mappings (slab: one, at ptr[0]) */
    unsigned long long *handles; /* vmm: imported allocation handles */
} dst_remote_t;

/* "local", "ipc", "slab" or "vmm"; -1 for anything else. */
int dst_mode_parse(const char *s);
const char *dst_mode_name(dst_mode_t m);

/* Starts `self --dst-owner MODE COUNT BYTES` and maps its COUNT regions
 * of BYTES each into out[0..COUNT); exits with a message on failure
 * (77: the mode is not supported here). */
void dst_remote_open(const char *self, dst_mode_t m, uint32_t count,
                     uint64_t bytes, unsigned char **out, dst_remote_t *h);
/* Unmaps, lets the owner go and waits for it. */
void dst_remote_close(dst_remote_t *h);

/* The owner's side: argv = {self, "--dst-owner", MODE, COUNT, BYTES},
 * the socket on fd 3. Returns the exit status. */
int dst_owner_main(int argc, char **argv);

#endif
