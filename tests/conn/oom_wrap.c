/* See oom_wrap.h. */
#include "oom_wrap.h"

#include <pthread.h>
#include <stddef.h>

void *__real_malloc(size_t n);
void *__real_calloc(size_t n, size_t m);
void *__real_realloc(void *p, size_t n);
void *__wrap_malloc(size_t n);
void *__wrap_calloc(size_t n, size_t m);
void *__wrap_realloc(void *p, size_t n);

static long g_countdown = -1; /* allocations to let through; -1: off */
static pthread_t g_thread;
static bool g_fired;

void oom_arm(long n)
{
    g_thread = pthread_self();
    g_fired = false;
    g_countdown = n;
}

void oom_disarm(void)
{
    g_countdown = -1;
}

bool oom_fired(void)
{
    return g_fired;
}

static bool inject(void)
{
    if (g_countdown < 0 || !pthread_equal(pthread_self(), g_thread))
        return false;
    if (g_countdown-- > 0)
        return false;
    g_fired = true;
    return true;
}

void *__wrap_malloc(size_t n)
{
    return inject() ? NULL : __real_malloc(n);
}

void *__wrap_calloc(size_t n, size_t m)
{
    return inject() ? NULL : __real_calloc(n, m);
}

void *__wrap_realloc(void *p, size_t n)
{
    return inject() ? NULL : __real_realloc(p, n);
}
