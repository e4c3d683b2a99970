/* kvrelay: command-line entry point; one table of subcommands. */
#include <stdio.h>
#include <string.h>

#include "commands.h"
#include "kvrelay/wire.h"

typedef struct {
    const char *name;
    int (*run)(int argc, char **argv);
    const char *summary;
} command_t;

static const command_t commands[] = {
    {"plan", cli_cmd_plan, "print one DCP rank's transfer plan summary"},
    {"demo", cli_cmd_demo, "run the headline case on this machine, verified"},
    {"serve", cli_cmd_serve, "one decode rank (consumer); rank 0 leads"},
    {"push", cli_cmd_push, "one prefill stage (producer)"},
    {"bench", cli_cmd_bench, "the executors side by side through kvrelay demo"},
    {"capacity", cli_cmd_capacity,
     "KV blocks and tokens a decode rank holds in a budget"},
    {"inspect", cli_cmd_inspect,
     "diff dumped received pages against the source, per token"},
    {"store", cli_cmd_store, "stat or verify a store's disk tier (checksums)"},
};

static int print_version(void)
{
    printf("kvrelay %s (wire protocol %u.%u, layout version %u)\n", CLI_VERSION,
           KVR_WIRE_VERSION_MAJOR, KVR_WIRE_VERSION_MINOR, KVR_LAYOUT_VERSION);
    return CLI_EXIT_OK;
}

static void usage(FILE *out)
{
    fputs("usage: kvrelay <command> [options]   (kvrelay <command> --help)\n"
          "commands:\n",
          out);
    for (size_t i = 0; i < sizeof(commands) / sizeof(commands[0]); i++)
        fprintf(out, "  %-10s %s\n", commands[i].name, commands[i].summary);
    fprintf(out, "  %-10s %s\n", "version",
            "print the version (also --version)");
}

int main(int argc, char **argv)
{
    if (argc < 2) {
        usage(stderr);
        return CLI_EXIT_USAGE;
    }
    if (strcmp(argv[1], "--help") == 0 || strcmp(argv[1], "help") == 0) {
        usage(stdout);
        return CLI_EXIT_OK;
    }
    if (strcmp(argv[1], "--version") == 0 || strcmp(argv[1], "version") == 0)
        return print_version();
    for (size_t i = 0; i < sizeof(commands) / sizeof(commands[0]); i++)
        if (strcmp(argv[1], commands[i].name) == 0)
            return commands[i].run(argc - 1, argv + 1);
    fprintf(stderr, "kvrelay: unknown command '%s'\n", argv[1]);
    usage(stderr);
    return CLI_EXIT_USAGE;
}
