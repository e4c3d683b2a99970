/* The GPU path's calls (gpu_path.h) that a build without CUDA
 * (gpu_path_none.c) and the tests' emulation (gpu_path_emul.c) both
 * refuse: gpu-staged's packer and run copies through a staging buffer
 * (docs/transport.md, gpu-staged). gpu_refused.c defines them once; each
 * of the two says why. */
#ifndef KVRELAY_CONN_GPU_REFUSED_H
#define KVRELAY_CONN_GPU_REFUSED_H

#include "gpu_path.h"

/* KVR_ERR_UNSUPPORTED with the implementation's reason (no CUDA, not
 * emulated). */
kvr_status_t kvr__gpu_refused(kvr_error_t *err);

#endif
