/* Runs `kvrelay <command> ARGS` for the CLI tests: exit status, stdout and
 * stderr. */
#ifndef KVR_TEST_INSPECT_CLI_H
#define KVR_TEST_INSPECT_CLI_H

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>

typedef struct {
    int status;
    char out[1 << 18];
    char err[8192];
} cli_result_t;

static inline void cli_slurp(const char *path, char *buf, size_t cap)
{
    FILE *f = fopen(path, "r");
    size_t n = f ? fread(buf, 1, cap - 1, f) : 0;
    buf[n] = '\0';
    if (f)
        fclose(f);
}

/* The result is large: callers keep it static or on the heap. */
static inline void cli_run(const char *bin, const char *command,
                           const char *args, cli_result_t *r)
{
    char cmd[4096];
    snprintf(cmd, sizeof(cmd), "%s %s %s >%s_out.txt 2>%s_err.txt", bin,
             command, args, command, command);
    int st = system(cmd);
    r->status = WIFEXITED(st) ? WEXITSTATUS(st) : -1;
    snprintf(cmd, sizeof(cmd), "%s_out.txt", command);
    cli_slurp(cmd, r->out, sizeof(r->out));
    snprintf(cmd, sizeof(cmd), "%s_err.txt", command);
    cli_slurp(cmd, r->err, sizeof(r->err));
}

/* Exit 2 with exactly one stderr line containing `needle`. Call from a
 * cmocka test (after including cmocka.h). */
#define cli_expect_usage(bin, command, args, needle, r)                        \
    do {                                                                       \
        cli_run(bin, command, args, r);                                        \
        if ((r)->status != 2)                                                  \
            fail_msg("'%s' exited %d: %s", args, (r)->status, (r)->err);       \
        if (strstr((r)->err, needle) == NULL)                                  \
            fail_msg("stderr \"%s\" lacks \"%s\"", (r)->err, needle);          \
        const char *nl_ = strchr((r)->err, '\n');                              \
        assert_non_null(nl_);                                                  \
        assert_string_equal(nl_ + 1, ""); /* exactly one line */               \
    } while (0)

#endif
