/* Status text and error detail: the one list in kvrelay/status.h. */
#include <stdarg.h>
#include <stdio.h>

#include "kvrelay/status.h"

const char *kvr_status_str(kvr_status_t status)
{
    switch (status) {
#define KVR__STATUS_STR(name, value, text)                                     \
    case KVR_##name:                                                           \
        return text;
        KVR_STATUS_MAP(KVR__STATUS_STR)
#undef KVR__STATUS_STR
    }
    return "unknown status";
}

const char *kvr_status_name(kvr_status_t status)
{
    switch (status) {
#define KVR__STATUS_NAME(name, value, text)                                    \
    case KVR_##name:                                                           \
        return #name;
        KVR_STATUS_MAP(KVR__STATUS_NAME)
#undef KVR__STATUS_NAME
    }
    return NULL;
}

kvr_status_t kvr_error_set(kvr_error_t *err, kvr_status_t code, const char *fmt,
                           ...)
{
    if (err == NULL)
        return code;
    err->code = code;
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(err->msg, sizeof(err->msg), fmt, ap);
    va_end(ap);
    return code;
}
