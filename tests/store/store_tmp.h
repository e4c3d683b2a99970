/* The store tests' scratch directory: one per test program, made under /tmp
 * and removed with everything in it. */
#ifndef KVR_TEST_STORE_TMP_H
#define KVR_TEST_STORE_TMP_H

#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>

#define ST_DIR_MAX 64

/* dir gets "/tmp/kvr-<name>-XXXXXX", made; false when mkdtemp fails. */
static inline bool st_tmpdir_make(char dir[ST_DIR_MAX], const char *name)
{
    snprintf(dir, ST_DIR_MAX, "/tmp/kvr-%s-XXXXXX", name);
    return mkdtemp(dir) != NULL;
}

static inline bool st_tmpdir_remove(const char *dir)
{
    char cmd[ST_DIR_MAX + 16];
    snprintf(cmd, sizeof cmd, "rm -rf %s", dir);
    return system(cmd) == 0;
}

#endif
