/* Allocation failure injection for tests linked with
 * -Wl,--wrap=malloc,--wrap=calloc,--wrap=realloc: kvrelay's own malloc,
 * calloc and realloc calls go through these wrappers (a shared library's,
 * such as UCX's, do not). */
#ifndef KVRELAY_TESTS_OOM_WRAP_H
#define KVRELAY_TESTS_OOM_WRAP_H

#include <stdbool.h>

/* The calling thread's allocations after the first n fail, one of them;
 * other threads' allocations are left alone. */
void oom_arm(long n);
/* No allocation fails. */
void oom_disarm(void);
/* Whether an allocation failed since the last oom_arm. */
bool oom_fired(void);

#endif
