/* Built instead of the UCX backend when UCX is not found. */
#include "xfer_internal.h"

kvr_status_t kvr_transport_ucx_create(const kvr_ucx_params_t *params,
                                      kvr_transport_t **out, kvr_error_t *err)
{
    (void)params;
    (void)out;
    return kvr_error_set(err, KVR_ERR_UNSUPPORTED,
                         "kvrelay was built without UCX");
}

const char *kvr_xfer_ucx_version(void)
{
    return "none";
}
