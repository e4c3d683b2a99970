/* Destination regions another process owns (dst_owner.h). */
#include "dst_owner.h"

#include <cuda.h>
#include <cuda_runtime_api.h>
#include <errno.h>
#include <fcntl.h>
#include <stdbool.h>
#include <spawn.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/time.h>
#include <sys/wait.h>
#include <unistd.h>

#include "bench_util.h"

#define SLAB_ALIGN (2ull << 20) /* a slab's regions start 2 MiB apart */
#define OWNER_FD 3

extern char **environ;

static const char *const names[] = {"local", "ipc", "slab", "vmm"};

int dst_mode_parse(const char *s)
{
    for (int i = 0; i < 4; i++)
        if (strcmp(s, names[i]) == 0)
            return i;
    return -1;
}

const char *dst_mode_name(dst_mode_t m)
{
    return names[m];
}

#define CU_OK(call)                                                            \
    do {                                                                       \
        CUresult r_ = (call);                                                  \
        if (r_ != CUDA_SUCCESS)                                                \
            DIE("%s:%d %s: CUresult %d", __FILE__, __LINE__, #call, (int)r_);  \
    } while (0)

/* The driver's VMM calls through its entry points, so that nothing links
 * libcuda: the bench starts, and says it has no device, without one (as
 * src/gpu/device.cu does). */
#define DRIVER_FNS(X)                                                          \
    X(cuMemGetAllocationGranularity)                                           \
    X(cuMemCreate)                                                             \
    X(cuMemExportToShareableHandle)                                            \
    X(cuMemImportFromShareableHandle)                                          \
    X(cuMemAddressReserve)                                                     \
    X(cuMemMap)                                                                \
    X(cuMemSetAccess)                                                          \
    X(cuMemUnmap)                                                              \
    X(cuMemAddressFree)                                                        \
    X(cuMemRelease)
#define DECLARE(f) static __typeof__(&f) p_##f;
DRIVER_FNS(DECLARE)

static void *driver_fn(const char *name)
{
    void *fn = NULL;
    enum cudaDriverEntryPointQueryResult found;
    CUDA_OK(cudaGetDriverEntryPointByVersion(name, &fn, 12000,
                                             cudaEnableDefault, &found));
    if (fn == NULL || found != cudaDriverEntryPointSuccess) {
        fprintf(stderr, "driver has no %s: no vmm here\n", name);
        exit(77);
    }
    return fn;
}

static void driver_load(void)
{
#define LOAD(f) p_##f = (__typeof__(&f))driver_fn(#f);
    DRIVER_FNS(LOAD)
}

static void send_all(int fd, const void *p, size_t n)
{
    const char *c = p;
    while (n > 0) {
        ssize_t k = send(fd, c, n, MSG_NOSIGNAL);
        if (k <= 0 && errno != EINTR)
            DIE("owner: send: %s", strerror(errno));
        if (k > 0) {
            c += k;
            n -= (size_t)k;
        }
    }
}

static void recv_all(int fd, void *p, size_t n)
{
    char *c = p;
    while (n > 0) {
        ssize_t k = recv(fd, c, n, 0);
        if (k == 0)
            DIE("dst owner left early");
        if (k < 0 && errno != EINTR)
            DIE("recv from dst owner: %s", strerror(errno));
        if (k > 0) {
            c += k;
            n -= (size_t)k;
        }
    }
}

/* One descriptor with a byte of payload (SCM_RIGHTS). */
static void send_fd(int sock, int fd)
{
    char byte = 'f', ctl[CMSG_SPACE(sizeof(int))];
    struct iovec io = {&byte, 1};
    struct msghdr m = {0};
    memset(ctl, 0, sizeof(ctl));
    m.msg_iov = &io;
    m.msg_iovlen = 1;
    m.msg_control = ctl;
    m.msg_controllen = sizeof(ctl);
    struct cmsghdr *c = CMSG_FIRSTHDR(&m);
    c->cmsg_level = SOL_SOCKET;
    c->cmsg_type = SCM_RIGHTS;
    c->cmsg_len = CMSG_LEN(sizeof(int));
    memcpy(CMSG_DATA(c), &fd, sizeof(int));
    if (sendmsg(sock, &m, MSG_NOSIGNAL) != 1)
        DIE("owner: sendmsg: %s", strerror(errno));
}

static int recv_fd(int sock)
{
    char byte = 0, ctl[CMSG_SPACE(sizeof(int))];
    struct iovec io = {&byte, 1};
    struct msghdr m = {0};
    m.msg_iov = &io;
    m.msg_iovlen = 1;
    m.msg_control = ctl;
    m.msg_controllen = sizeof(ctl);
    if (recvmsg(sock, &m, 0) != 1)
        DIE("recvmsg from dst owner: %s", strerror(errno));
    struct cmsghdr *c = CMSG_FIRSTHDR(&m);
    if (c == NULL || c->cmsg_type != SCM_RIGHTS)
        DIE("dst owner sent no descriptor");
    int fd = -1;
    memcpy(&fd, CMSG_DATA(c), sizeof(int));
    return fd;
}

static CUmemAllocationProp vmm_prop(void)
{
    CUmemAllocationProp p;
    memset(&p, 0, sizeof(p));
    p.type = CU_MEM_ALLOCATION_TYPE_PINNED;
    p.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
    p.location.id = 0;
    p.requestedHandleTypes = CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR;
    return p;
}

static uint64_t vmm_size(uint64_t bytes)
{
    if (p_cuMemCreate == NULL)
        driver_load();
    CUmemAllocationProp p = vmm_prop();
    size_t g = 0;
    CU_OK(p_cuMemGetAllocationGranularity(&g, &p,
                                        CU_MEM_ALLOC_GRANULARITY_RECOMMENDED));
    return bench_round_up(bytes, g);
}

/* ---- the owner ---- */

static void owner_ipc(int sock, uint32_t n, uint64_t bytes, bool slab)
{
    uint32_t k = slab ? 1 : n;
    uint64_t each = slab ? bench_round_up(bytes, SLAB_ALIGN) * n : bytes;
    for (uint32_t i = 0; i < k; i++) {
        void *p = NULL;
        cudaIpcMemHandle_t h;
        CUDA_OK(cudaMalloc(&p, each));
        CUDA_OK(cudaIpcGetMemHandle(&h, p));
        send_all(sock, &h, sizeof(h));
    }
}

static void owner_vmm(int sock, uint32_t n, uint64_t bytes)
{
    CUmemAllocationProp p = vmm_prop();
    uint64_t size = vmm_size(bytes);
    for (uint32_t i = 0; i < n; i++) {
        CUmemGenericAllocationHandle h;
        int fd = -1;
        CU_OK(p_cuMemCreate(&h, size, &p, 0));
        CU_OK(p_cuMemExportToShareableHandle(
            &fd, h, CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR, 0));
        send_fd(sock, fd);
        close(fd);
    }
}

int dst_owner_main(int argc, char **argv)
{
    if (argc != 5)
        DIE("usage: %s --dst-owner MODE COUNT BYTES", argv[0]);
    int m = dst_mode_parse(argv[2]);
    uint32_t n = (uint32_t)strtoul(argv[3], NULL, 10);
    uint64_t bytes = strtoull(argv[4], NULL, 10);
    if (m <= DST_LOCAL || n == 0 || bytes == 0)
        DIE("dst owner: bad arguments %s %s %s", argv[2], argv[3], argv[4]);
    CUDA_OK(cudaFree(NULL)); /* the primary context, current */
    if (m == DST_VMM)
        owner_vmm(OWNER_FD, n, bytes);
    else
        owner_ipc(OWNER_FD, n, bytes, m == DST_SLAB);
    char c;
    while (recv(OWNER_FD, &c, 1, 0) > 0) /* until the bench closes */
        ;
    return 0; /* the process's exit frees everything */
}

/* ---- the bench's side ---- */

static pid_t spawn_owner(const char *self, dst_mode_t m, uint32_t n,
                         uint64_t bytes, int fd)
{
    char cnt[16], len[24];
    snprintf(cnt, sizeof(cnt), "%u", n);
    snprintf(len, sizeof(len), "%llu", (unsigned long long)bytes);
    char *argv[] = {(char *)self, "--dst-owner", (char *)names[m], cnt, len,
                    NULL};
    posix_spawn_file_actions_t fa;
    posix_spawn_file_actions_init(&fa);
    posix_spawn_file_actions_adddup2(&fa, fd, OWNER_FD);
    pid_t pid = 0;
    int e = posix_spawn(&pid, self, &fa, NULL, argv, environ);
    posix_spawn_file_actions_destroy(&fa);
    if (e != 0)
        DIE("spawn %s: %s", self, strerror(e));
    return pid;
}

static void open_ipc(dst_remote_t *h, uint32_t n, uint64_t bytes,
                     unsigned char **out)
{
    uint32_t k = h->mode == DST_SLAB ? 1 : n;
    for (uint32_t i = 0; i < k; i++) {
        cudaIpcMemHandle_t ih;
        recv_all(h->sock, &ih, sizeof(ih));
        CUDA_OK(cudaIpcOpenMemHandle(&h->ptr[i], ih,
                                     cudaIpcMemLazyEnablePeerAccess));
        h->n++;
    }
    for (uint32_t i = 0; i < n; i++)
        out[i] = h->mode == DST_SLAB ? (unsigned char *)h->ptr[0] +
                                           i * bench_round_up(bytes, SLAB_ALIGN)
                                     : (unsigned char *)h->ptr[i];
}

static void open_vmm(dst_remote_t *h, uint32_t n, unsigned char **out)
{
    CUmemAccessDesc a;
    memset(&a, 0, sizeof(a));
    a.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
    a.location.id = 0;
    a.flags = CU_MEM_ACCESS_FLAGS_PROT_READWRITE;
    for (uint32_t i = 0; i < n; i++) {
        int fd = recv_fd(h->sock);
        CUmemGenericAllocationHandle g;
        CUdeviceptr p = 0;
        CU_OK(p_cuMemImportFromShareableHandle(
            &g, (void *)(uintptr_t)fd, CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR));
        close(fd);
        CU_OK(p_cuMemAddressReserve(&p, h->size, 0, 0, 0));
        CU_OK(p_cuMemMap(p, h->size, 0, g, 0));
        CU_OK(p_cuMemSetAccess(p, h->size, &a, 1));
        h->handles[i] = g;
        h->ptr[i] = (void *)(uintptr_t)p;
        out[i] = (unsigned char *)h->ptr[i];
        h->n++;
    }
}

void dst_remote_open(const char *self, dst_mode_t m, uint32_t count,
                     uint64_t bytes, unsigned char **out, dst_remote_t *h)
{
    int sv[2];
    memset(h, 0, sizeof(*h));
    h->mode = m;
    h->size = m == DST_VMM ? vmm_size(bytes) : bytes;
    h->ptr = calloc(count, sizeof(*h->ptr));
    h->handles = calloc(count, sizeof(*h->handles));
    if (h->ptr == NULL || h->handles == NULL)
        DIE("no memory for %u mappings", count);
    if (socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, sv) != 0)
        DIE("socketpair: %s", strerror(errno));
    /* above fd 3, so that the spawn's dup2 onto 3 clears close-on-exec */
    int fd = fcntl(sv[1], F_DUPFD_CLOEXEC, 10);
    if (fd < 0)
        DIE("fcntl: %s", strerror(errno));
    h->pid = spawn_owner(self, m, count, bytes, fd);
    close(fd);
    close(sv[1]);
    h->sock = sv[0];
    struct timeval limit = {60, 0}; /* an owner stuck in CUDA: fail, not hang */
    setsockopt(h->sock, SOL_SOCKET, SO_RCVTIMEO, &limit, sizeof(limit));
    if (m == DST_VMM)
        open_vmm(h, count, out);
    else
        open_ipc(h, count, bytes, out);
}

void dst_remote_close(dst_remote_t *h)
{
    for (uint32_t i = 0; i < h->n; i++) {
        if (h->mode != DST_VMM) {
            cudaIpcCloseMemHandle(h->ptr[i]);
            continue;
        }
        p_cuMemUnmap((CUdeviceptr)(uintptr_t)h->ptr[i], h->size);
        p_cuMemAddressFree((CUdeviceptr)(uintptr_t)h->ptr[i], h->size);
        p_cuMemRelease(h->handles[i]);
    }
    close(h->sock);
    int status = 0;
    if (h->pid > 0 && waitpid(h->pid, &status, 0) == h->pid &&
        !(WIFEXITED(status) && WEXITSTATUS(status) == 0))
        fprintf(stderr, "dst owner ended with status %d\n", status);
    free(h->ptr);
    free(h->handles);
}
