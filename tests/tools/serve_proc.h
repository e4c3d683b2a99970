/* Starts a `kvrelay serve` for the process tests and reads the port it
 * listens on ("listening PORT", its first line). Include after cmocka.h. */
#ifndef KVR_TEST_SERVE_PROC_H
#define KVR_TEST_SERVE_PROC_H

#include <stdio.h>
#include <sys/types.h>
#include <unistd.h>

/* Runs `sh -c cmd` (cmd should exec kvrelay serve) with stdout piped and
 * reads up to its "listening PORT" line; *rest (NULL: the pipe is closed)
 * receives the pipe for the event lines after it. */
static inline pid_t start_listening_rest(const char *cmd, int *port,
                                         FILE **rest)
{
    int p[2];
    assert_int_equal(pipe(p), 0);
    pid_t pid = fork();
    if (pid == 0) {
        dup2(p[1], STDOUT_FILENO);
        close(p[0]);
        execl("/bin/sh", "sh", "-c", cmd, (char *)NULL);
        _exit(127);
    }
    close(p[1]);
    FILE *f = fdopen(p[0], "r");
    char line[256] = "";
    *port = 0;
    while (fgets(line, sizeof(line), f) != NULL &&
           sscanf(line, "listening %d", port) != 1)
        ;
    if (rest != NULL)
        *rest = f;
    else
        fclose(f);
    assert_true(*port > 0);
    return pid;
}

static inline pid_t start_listening(const char *cmd, int *port)
{
    return start_listening_rest(cmd, port, NULL);
}

#endif
