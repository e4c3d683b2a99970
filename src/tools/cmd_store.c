/* `kvrelay store stat|verify DIR`: look at a store's disk tier without
 * opening it (opening would remove temp files and set corrupt chunks aside;
 * docs/store.md "Crash safety"). Both read every chunk through
 * kvr_store_verify, which changes nothing. */
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <getopt.h>
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "commands.h"
#include "kvrelay/store.h"

#define NS_HEX (2 * KVR_STORE_NS_BYTES)

static const char store_usage[] =
    "usage: kvrelay store stat [--json] DIR\n"
    "       kvrelay store verify DIR\n"
    "stat: chunk files, their bytes on disk, the namespaces they belong to,\n"
    "unfinished writes, chunks set aside as *.corrupt by an earlier open, and\n"
    "every chunk that fails its checksum now. verify: checks every chunk\n"
    "against its checksum; prints each bad file and why and exits 1 if any,\n"
    "0 when all are good. Neither changes the directory. Exit 2: bad usage\n"
    "(no DIR, or DIR missing or not a directory).\n";

/* What one pass over the directory finds, plus the bad files verify names. */
typedef struct {
    uint64_t chunks, bytes, temps, set_aside;
    char (*ns)[NS_HEX + 1];
    size_t num_ns, cap_ns;
    json_t *bad; /* [{"file", "reason"}] */
} store_scan_t;

static bool ends_with(const char *s, const char *tail)
{
    size_t n = strlen(s), t = strlen(tail);
    return n >= t && strcmp(s + n - t, tail) == 0;
}

/* Adds the namespace a chunk name starts with, once. */
static bool add_ns(store_scan_t *sc, const char *name)
{
    if (strlen(name) < NS_HEX || strspn(name, "0123456789abcdef") < NS_HEX)
        return true;
    for (size_t i = 0; i < sc->num_ns; i++)
        if (strncmp(sc->ns[i], name, NS_HEX) == 0)
            return true;
    if (sc->num_ns == sc->cap_ns) {
        size_t cap = sc->cap_ns ? 2 * sc->cap_ns : 8;
        void *p = realloc(sc->ns, cap * sizeof(*sc->ns));
        if (p == NULL)
            return false;
        sc->ns = p;
        sc->cap_ns = cap;
    }
    memcpy(sc->ns[sc->num_ns], name, NS_HEX);
    sc->ns[sc->num_ns++][NS_HEX] = '\0';
    return true;
}

static bool count_entry(store_scan_t *sc, int dfd, const char *name)
{
    if (strncmp(name, ".tmp-", 5) == 0) {
        sc->temps++;
        return true;
    }
    if (ends_with(name, ".kvc.corrupt")) {
        sc->set_aside++;
        return true;
    }
    if (!ends_with(name, ".kvc"))
        return true;
    struct stat sb;
    if (fstatat(dfd, name, &sb, AT_SYMLINK_NOFOLLOW) == 0)
        sc->bytes += (uint64_t)sb.st_size;
    sc->chunks++;
    return add_ns(sc, name);
}

static bool scan_dir(const char *dir, store_scan_t *sc)
{
    DIR *d = opendir(dir);
    if (d == NULL) {
        fprintf(stderr, "kvrelay store: %s: %s\n", dir, strerror(errno));
        return false;
    }
    struct dirent *de;
    bool ok = true;
    while (ok && (de = readdir(d)) != NULL)
        ok = count_entry(sc, dirfd(d), de->d_name);
    closedir(d);
    if (!ok)
        fprintf(stderr, "kvrelay store: %s: out of memory\n", dir);
    return ok;
}

static void note_bad(const char *name, const char *why, void *arg)
{
    json_array_append_new((json_t *)arg,
                          json_pack("{s:s,s:s}", "file", name, "reason", why));
}

/* Runs kvr_store_verify; *num_ok gets the good chunks. */
static bool verify_dir(const char *dir, store_scan_t *sc, uint64_t *num_ok)
{
    kvr_error_t err;
    if (kvr_store_verify(dir, note_bad, sc->bad, num_ok, NULL, &err) == KVR_OK)
        return true;
    fprintf(stderr, "kvrelay store: %s\n", err.msg);
    return false;
}

static void print_bad(const json_t *bad)
{
    size_t i;
    json_t *b;
    json_array_foreach(bad, i, b)
        printf("bad: %s: %s\n", json_string_value(json_object_get(b, "file")),
               json_string_value(json_object_get(b, "reason")));
}

static void print_stat_text(const char *dir, const store_scan_t *sc,
                            uint64_t ok)
{
    printf("store %s\n", dir);
    printf("chunks:      %llu (%llu good, %llu bad)\n",
           (unsigned long long)sc->chunks, (unsigned long long)ok,
           (unsigned long long)(sc->chunks - ok));
    printf("bytes:       %llu\n", (unsigned long long)sc->bytes);
    printf("namespaces:  %zu\n", sc->num_ns);
    for (size_t i = 0; i < sc->num_ns; i++)
        printf("  %s\n", sc->ns[i]);
    printf("unfinished:  %llu\n", (unsigned long long)sc->temps);
    printf("set aside:   %llu\n", (unsigned long long)sc->set_aside);
    print_bad(sc->bad);
}

static void print_stat_json(const char *dir, const store_scan_t *sc,
                            uint64_t ok)
{
    json_t *ns = json_array();
    for (size_t i = 0; i < sc->num_ns; i++)
        json_array_append_new(ns, json_string(sc->ns[i]));
    json_t *root = json_pack("{s:s,s:I,s:I,s:I,s:o,s:I,s:I,s:O}", "dir", dir,
                             "chunks", (json_int_t)sc->chunks, "good",
                             (json_int_t)ok, "bytes", (json_int_t)sc->bytes,
                             "namespaces", ns, "unfinished",
                             (json_int_t)sc->temps, "set_aside",
                             (json_int_t)sc->set_aside, "bad", sc->bad);
    json_dumpf(root, stdout, JSON_INDENT(2));
    putchar('\n');
    json_decref(root);
}

/* DIR must name an existing directory; exit 2 otherwise. */
static int check_dir(const char *dir)
{
    struct stat sb;
    if (stat(dir, &sb) != 0)
        return cli_usage_error("store", "DIR '%s': %s", dir, strerror(errno));
    if (!S_ISDIR(sb.st_mode))
        return cli_usage_error("store",
                               "DIR '%s' is not a directory, so not "
                               "a store",
                               dir);
    return CLI_EXIT_OK;
}

static int run_store(bool verify, bool json, const char *dir)
{
    store_scan_t sc = {.bad = json_array()};
    uint64_t ok = 0;
    int rc = CLI_EXIT_FAILED;
    if (!scan_dir(dir, &sc) || !verify_dir(dir, &sc, &ok))
        goto out;
    if (!verify) {
        if (json)
            print_stat_json(dir, &sc, ok);
        else
            print_stat_text(dir, &sc, ok);
        rc = CLI_EXIT_OK;
        goto out;
    }
    print_bad(sc.bad);
    printf("%llu chunks good, %zu bad\n", (unsigned long long)ok,
           json_array_size(sc.bad));
    rc = json_array_size(sc.bad) == 0 ? CLI_EXIT_OK : CLI_EXIT_FAILED;
out:
    json_decref(sc.bad);
    free(sc.ns);
    return rc;
}

enum { O_JSON = 256, O_HELP };

static const struct option store_options[] = {
    {"json", no_argument, 0, O_JSON},
    {"help", no_argument, 0, O_HELP},
    {0, 0, 0, 0},
};

int cli_cmd_store(int argc, char **argv)
{
    if (argc >= 2 && strcmp(argv[1], "--help") == 0) {
        fputs(store_usage, stdout);
        return CLI_EXIT_OK;
    }
    if (argc < 2)
        return cli_usage_error("store", "expected 'stat' or 'verify'");
    bool verify = strcmp(argv[1], "verify") == 0;
    if (!verify && strcmp(argv[1], "stat") != 0)
        return cli_usage_error("store",
                               "unknown subcommand '%s' (expected "
                               "'stat' or 'verify')",
                               argv[1]);
    bool json = false;
    int opt;
    opterr = 0;
    optind = 1;
    while ((opt = getopt_long(argc - 1, argv + 1, "", store_options, NULL)) !=
           -1) {
        if (opt == O_HELP) {
            fputs(store_usage, stdout);
            return CLI_EXIT_OK;
        }
        if (opt != O_JSON || verify)
            return cli_usage_error("store",
                                   "%s: unknown or incomplete option "
                                   "'%s'",
                                   argv[1], argv[optind]);
        json = true;
    }
    if (optind + 1 >= argc)
        return cli_usage_error("store", "%s: DIR is required", argv[1]);
    if (optind + 2 < argc)
        return cli_usage_error("store", "%s: unexpected argument '%s'", argv[1],
                               argv[optind + 2]);
    int rc = check_dir(argv[optind + 1]);
    return rc != CLI_EXIT_OK ? rc : run_store(verify, json, argv[optind + 1]);
}
