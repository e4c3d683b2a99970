/* Shared by the executors (exec.c, exec_staged.c, cost.c). */
#ifndef KVRELAY_EXEC_INTERNAL_H
#define KVRELAY_EXEC_INTERNAL_H

#include "xfer_internal.h"

#define KVR__BIT(type) (1u << ((type)-KVR_XFER_MSG_RESERVED))

kvr_status_t kvr__exec_send_ctl(kvr_ep_t *ep, uint32_t type,
                                const kvr__exec_msg_t *m, uint64_t deadline_ns,
                                kvr_exec_stats_t *stats);
/* Takes the next executor message of one of `types` (bits) for this
 * transfer; an ABORT from the peer returns the status it carries. */
kvr_status_t kvr__exec_recv_ctl(kvr_ep_t *ep, uint64_t transfer_id,
                                uint32_t types, uint64_t deadline_ns,
                                uint32_t *type, kvr__exec_msg_t *out);
kvr_status_t kvr__exec_abort_status(uint32_t code);
void kvr__exec_abort(kvr_ep_t *ep, uint64_t transfer_id, kvr_status_t st,
                     kvr_exec_stats_t *stats);
kvr_status_t kvr__exec_error(kvr_ep_t *ep, kvr_error_t *err, kvr_status_t st,
                             const char *what, uint64_t transfer_id);

kvr_status_t kvr__staged_check(const kvr_exec_params_t *p, bool producer,
                               kvr_error_t *err);
/* kvr__staged_check plus the packer and its pack buffers. */
kvr_status_t kvr__gpu_staged_check(const kvr_exec_params_t *p, bool producer,
                                   kvr_error_t *err);
kvr_status_t kvr__staged_send(kvr_ep_t *ep, const kvr_xfer_seg_t *segs,
                              size_t n, const kvr_exec_params_t *p,
                              kvr_exec_stats_t *stats);
kvr_status_t kvr__staged_recv(kvr_ep_t *ep, const kvr_xfer_seg_t *segs,
                              size_t n, const kvr_exec_params_t *p,
                              kvr_exec_stats_t *stats);

#endif
