/* Public entry points: each checks its arguments at the boundary (peer
 * input included: region lengths, message sizes) before the backend runs. */
#include <stdlib.h>
#include <string.h>

#include "xfer_internal.h"

typedef unsigned long long ull;

void kvr_transport_destroy(kvr_transport_t *t)
{
    if (t != NULL)
        t->ops->close(t);
}

const char *kvr_transport_name(const kvr_transport_t *t)
{
    return t ? t->name : "none";
}

const char *kvr_xfer_last_error(const kvr_transport_t *t)
{
    return t ? t->last_error : "";
}

kvr_status_t kvr_xfer_address(kvr_transport_t *t, const void **addr,
                              size_t *len)
{
    if (t == NULL || addr == NULL || len == NULL)
        return KVR_ERR_INVALID;
    return t->ops->address(t, addr, len);
}

kvr_status_t kvr_xfer_event_fd(kvr_transport_t *t, int *fd)
{
    if (t == NULL || fd == NULL)
        return KVR_ERR_INVALID;
    return t->ops->event_fd(t, fd);
}

kvr_status_t kvr_xfer_progress(kvr_transport_t *t)
{
    if (t == NULL)
        return KVR_ERR_INVALID;
    return t->ops->progress(t, 0);
}

kvr_status_t kvr_ep_create(kvr_transport_t *t, const void *addr, size_t len,
                           kvr_ep_t **out)
{
    if (t == NULL || addr == NULL || len == 0 || out == NULL)
        return KVR_ERR_INVALID;
    return t->ops->ep_create(t, addr, len, out);
}

void kvr_ep_destroy(kvr_ep_t *ep)
{
    if (ep != NULL)
        ep->t->ops->ep_destroy(ep);
}

kvr_status_t kvr_ep_status(const kvr_ep_t *ep)
{
    return ep ? kvr__ep_failed(ep) : KVR_ERR_INVALID;
}

kvr_status_t kvr_ep_fail(kvr_ep_t *ep, kvr_status_t st)
{
    if (ep == NULL || st == KVR_OK)
        return KVR_ERR_INVALID;
    return kvr__ep_set_failed(ep, st);
}

static kvr_status_t mem_map(kvr_transport_t *t, void *addr, size_t len,
                            bool allocate, kvr_mem_t **out)
{
    if (t == NULL || len == 0 || out == NULL || (!allocate && addr == NULL))
        return KVR_ERR_INVALID;
    return t->ops->reg(t, addr, len, allocate, out);
}

kvr_status_t kvr_mem_register(kvr_transport_t *t, void *addr, size_t len,
                              kvr_mem_t **out)
{
    return mem_map(t, addr, len, false, out);
}

kvr_status_t kvr_mem_alloc(kvr_transport_t *t, size_t len, kvr_mem_t **out)
{
    return mem_map(t, NULL, len, true, out);
}

bool kvr_xfer_has_cuda(const kvr_transport_t *t)
{
    return t != NULL && t->has_cuda;
}

kvr_status_t kvr_mem_register_kind(kvr_transport_t *t, void *addr, size_t len,
                                   kvr_mem_kind_t kind, kvr_mem_t **out,
                                   kvr_error_t *err)
{
    kvr_status_t st;
    if (kind == KVR_MEM_HOST)
        st = mem_map(t, addr, len, false, out);
    else if (kind != KVR_MEM_CUDA)
        return kvr_error_set(err, KVR_ERR_INVALID, "memory kind %d",
                             (int)kind);
    else if (t == NULL || len == 0 || out == NULL || addr == NULL)
        st = KVR_ERR_INVALID;
    else if (!t->has_cuda)
        return kvr_error_set(
            err, KVR_ERR_UNSUPPORTED,
            "transport %s cannot move CUDA memory: %s%s has no CUDA support "
            "(no cuda_copy; see docs/transport.md, CUDA memory)",
            t->name, t->ops->reg_cuda ? "UCX " : "",
            t->ops->reg_cuda ? kvr_xfer_ucx_version() : "this backend");
    else
        st = t->ops->reg_cuda(t, addr, len, out);
    if (st != KVR_OK)
        return kvr_error_set(err, st, "registering %zu bytes of %s memory: %s",
                             len, kind == KVR_MEM_CUDA ? "CUDA" : "host",
                             t ? t->last_error : "no transport");
    (*out)->kind = kind;
    return KVR_OK;
}

kvr_mem_kind_t kvr_mem_kind(const kvr_mem_t *mem)
{
    return mem ? mem->kind : KVR_MEM_HOST;
}

void kvr_mem_destroy(kvr_mem_t *mem)
{
    if (mem != NULL)
        mem->t->ops->dereg(mem);
}

void *kvr_mem_addr(const kvr_mem_t *mem)
{
    return mem ? mem->addr : NULL;
}

size_t kvr_mem_len(const kvr_mem_t *mem)
{
    return mem ? mem->len : 0;
}

kvr_status_t kvr_mem_pack(const kvr_mem_t *mem, kvr_remote_region_t *out)
{
    if (mem == NULL || out == NULL)
        return KVR_ERR_INVALID;
    kvr_remote_region_t desc;
    memset(&desc, 0, sizeof(desc));
    kvr_status_t st = mem->t->ops->pack_rkey(mem, &desc);
    if (st != KVR_OK)
        return st;
    desc.base = (uint64_t)(uintptr_t)mem->addr;
    desc.length = mem->len;
    *out = desc;
    return KVR_OK;
}

kvr_status_t kvr_rmem_open(kvr_ep_t *ep, const kvr_remote_region_t *desc,
                           kvr_rmem_t **out)
{
    if (ep == NULL || desc == NULL || out == NULL)
        return KVR_ERR_INVALID;
    if (desc->rkey_len == 0 || desc->rkey_len > KVR_XFER_RKEY_MAX ||
        desc->length == 0 || desc->base + desc->length < desc->base)
        return kvr__fail(ep->t, KVR_ERR_INVALID,
                         "remote region base 0x%llx length %llu rkey %u bytes",
                         (ull)desc->base, (ull)desc->length, desc->rkey_len);
    kvr_status_t st = kvr__ep_failed(ep);
    if (st != KVR_OK)
        return st;
    return ep->t->ops->rmem_open(ep, desc, out);
}

void kvr_rmem_close(kvr_rmem_t *rmem)
{
    if (rmem != NULL)
        rmem->ep->t->ops->rmem_close(rmem);
}

uint64_t kvr_rmem_len(const kvr_rmem_t *rmem)
{
    return rmem ? rmem->len : 0;
}

/* The only guard against writing outside a peer's region: UCX checks none. */
static kvr_status_t check_bounds(const kvr_rmem_t *r, uint64_t off,
                                 uint64_t len)
{
    if (off > r->len || len > r->len - off)
        return kvr__fail(r->ep->t, KVR_ERR_RUN_OUT_OF_BOUNDS,
                         "put of %llu bytes at offset %llu outside a remote "
                         "region of %llu bytes",
                         (ull)len, (ull)off, (ull)r->len);
    return KVR_OK;
}

kvr_status_t kvr_rmem_ptr(kvr_rmem_t *rmem, uint64_t off, uint64_t len,
                          void **out)
{
    if (rmem == NULL || out == NULL)
        return KVR_ERR_INVALID;
    kvr_status_t st = check_bounds(rmem, off, len);
    if (st != KVR_OK)
        return st;
    return rmem->ep->t->ops->rmem_ptr(rmem, off, out);
}

kvr_status_t kvr_rmem_map(kvr_rmem_t *rmem, void **base)
{
    if (rmem == NULL || base == NULL)
        return KVR_ERR_INVALID;
    if (!rmem->ep->t->map_stores)
        return kvr__fail(rmem->ep->t, KVR_ERR_UNSUPPORTED,
                         "%s: no stores into mapped peer memory",
                         rmem->ep->t->name);
    return kvr_rmem_ptr(rmem, 0, rmem->len, base);
}

kvr_status_t kvr_xfer_put(kvr_ep_t *ep, const void *src, uint64_t len,
                          kvr_rmem_t *dst, uint64_t dst_off,
                          uint64_t deadline_ns)
{
    if (ep == NULL || dst == NULL || (src == NULL && len) || dst->ep != ep)
        return KVR_ERR_INVALID;
    kvr_status_t st = check_bounds(dst, dst_off, len);
    if (st == KVR_OK)
        st = kvr__ep_failed(ep);
    if (st != KVR_OK || len == 0)
        return st;
    return ep->t->ops->put(ep, src, len, dst, dst_off, deadline_ns);
}

kvr_status_t kvr_xfer_flush(kvr_ep_t *ep, uint64_t deadline_ns)
{
    if (ep == NULL)
        return KVR_ERR_INVALID;
    kvr_status_t st = kvr__ep_failed(ep);
    if (st != KVR_OK)
        return st;
    return ep->t->ops->flush(ep, deadline_ns);
}

kvr_status_t kvr_xfer_drain(kvr_ep_t *ep, uint64_t deadline_ns)
{
    if (ep == NULL)
        return KVR_ERR_INVALID;
    kvr_status_t st = kvr__ep_failed(ep);
    return st != KVR_OK ? st : ep->t->ops->drain(ep, deadline_ns);
}

kvr_status_t kvr_xfer_send_msg(kvr_ep_t *ep, uint32_t type, const void *data,
                               size_t len, uint64_t deadline_ns)
{
    if (ep == NULL || (data == NULL && len))
        return KVR_ERR_INVALID;
    if (len > KVR_XFER_MSG_MAX)
        return kvr__fail(ep->t, KVR_ERR_INVALID,
                         "control message of %zu bytes > max %u", len,
                         KVR_XFER_MSG_MAX);
    kvr_status_t st = kvr__ep_failed(ep);
    if (st != KVR_OK)
        return st;
    return ep->t->ops->send_msg(ep, type, data, len, deadline_ns);
}
