/* kernel_lint DIR: writes every distinct kernel program the library builds under its built-in tuning
   table and under the tunings the test suites' variants cases run (tests/variant_tunings.h, each
   resolved as a device would resolve it: vector, micro-tile and the rest derived where 0) into DIR,
   for tests/kernel_lint.sh to compile with clang's warnings on.  For each tuning, each family whose
   program that tuning builds (the causal forward's own program only where
   castle__causal_forward_family says so) and each head-dimension class (64, 128, 256; the families
   that do not depend on it give one program), DIR/NNN.cl holds the program's source and DIR/NNN.opt
   its build options less CASTLE_BUILD_QUIET (so that the compiler's warnings are seen), and a line
   "NNN tuning family-file class" goes to DIR/index (tuning: the entry's name, or variant-I and
   sums-I).  Programs equal to one already written (same file, same options) are skipped.  The
   sources are those the library would build: $CASTLE_CL_DIR's if set, else the embedded copies.
   DIR/max_kernels holds CASTLE_MAX_PROGRAM_KERNELS, the most kernels a program may define (the
   context's kernel slots are sized by it: host/program.h).
   Exit status 0, or 1 with a message on stderr. */
#include "program.h"
#include "tuning.h"
#include "variant_tunings.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

enum { MAX_PROGRAMS = 256 };

static const char *const family_files[CASTLE_FAMILY_COUNT] = {
    [CASTLE_FAMILY_FORWARD] = "forward",
    [CASTLE_FAMILY_BACKWARD] = "backward",
    [CASTLE_FAMILY_CACHE] = "cache",
    [CASTLE_FAMILY_CAUSAL] = "causal",
    [CASTLE_FAMILY_CAUSAL_FORWARD] = "causal_forward",
};

static int write_file(const char *path, const char *text)
{
    FILE *f = fopen(path, "w");
    if (!f || fputs(text, f) == EOF || fclose(f) != 0) {
        fprintf(stderr, "kernel_lint: cannot write %s\n", path);
        return 1;
    }
    return 0;
}

static char *seen[MAX_PROGRAMS];
static castle_family seen_family[MAX_PROGRAMS];
static int n;

/* Writes the programs of tuning t (named name in the index) that are not written yet.  0, or 1 with
   a message on stderr. */
static int lint_tuning(const char *dir, FILE *index, const char *name, const castle_tuning *t)
{
    static const int classes[] = {64, 128, 256};
    const size_t quiet = strlen(CASTLE_BUILD_QUIET);
    char path[4096];
    for (int f = 0; f < CASTLE_FAMILY_COUNT; ++f) {
        if ((f == CASTLE_FAMILY_CAUSAL_FORWARD) && castle__causal_forward_family(t) != CASTLE_FAMILY_CAUSAL_FORWARD)
            continue;
        for (size_t c = 0; c < sizeof classes / sizeof classes[0]; ++c) {
            const int dclass = castle__head_dim_class((castle_family)f, t, (size_t)classes[c]);
            char *src, *opt;
            if (castle__program_source((castle_family)f, t, dclass, &src, &opt) != CASTLE_SUCCESS) {
                fprintf(stderr, "kernel_lint: %s, %s: %s\n", name, family_files[f], castle_last_error());
                return 1;
            }
            const size_t len = strlen(opt);
            if (len < quiet || strcmp(opt + len - quiet, CASTLE_BUILD_QUIET) != 0) {
                fprintf(stderr, "kernel_lint: the options '%s' do not end with '%s'\n", opt, CASTLE_BUILD_QUIET);
                return 1;
            }
            opt[len - quiet] = '\0';
            int dup = 0;
            for (int i = 0; i < n && !dup; ++i)
                dup = seen_family[i] == (castle_family)f && strcmp(seen[i], opt) == 0;
            int fail = 0;
            if (!dup) {
                if (n == MAX_PROGRAMS) {
                    fprintf(stderr, "kernel_lint: more than %d programs\n", MAX_PROGRAMS);
                    return 1;
                }
                snprintf(path, sizeof path, "%s/%03d.cl", dir, n);
                fail = write_file(path, src);
                snprintf(path, sizeof path, "%s/%03d.opt", dir, n);
                fail = fail || write_file(path, opt);
                fprintf(index, "%03d %s %s %d\n", n, name, family_files[f], dclass);
                seen_family[n] = (castle_family)f;
                seen[n++] = opt;
            } else {
                free(opt);
            }
            free(src);
            if (fail)
                return 1;
            if (dclass == CASTLE_MAX_HEAD_DIM && classes[c] < CASTLE_MAX_HEAD_DIM)
                break; /* the family's program serves every class */
        }
    }
    return 0;
}

/* A test tuning as a context would take it: normalised, 0s derived (no device: the tunings name
   their vector and micro-tile), checked. */
static int lint_test_tuning(const char *dir, FILE *index, const char *kind, size_t i, const castle_tuning *given)
{
    castle_tuning t;
    castle__tuning_normalize(&t, given);
    castle__tuning_resolve(&t, NULL);
    char name[64];
    snprintf(name, sizeof name, "%s-%zu", kind, i);
    if (castle__tuning_check(&t, NULL) != CASTLE_SUCCESS) {
        fprintf(stderr, "kernel_lint: %s is no valid tuning: %s\n", name, castle_last_error());
        return 1;
    }
    return lint_tuning(dir, index, name, &t);
}

int main(int argc, char **argv)
{
    if (argc != 2) {
        fprintf(stderr, "usage: kernel_lint DIR\n");
        return 2;
    }
    char path[4096];
    snprintf(path, sizeof path, "%s/index", argv[1]);
    FILE *index = fopen(path, "w");
    if (!index) {
        fprintf(stderr, "kernel_lint: cannot write %s\n", path);
        return 1;
    }
    snprintf(path, sizeof path, "%s/max_kernels", argv[1]);
    char limit[16];
    snprintf(limit, sizeof limit, "%d\n", CASTLE_MAX_PROGRAM_KERNELS);
    if (write_file(path, limit))
        return 1;
    const size_t entries = castle__tuning_table_size();
    for (size_t e = 0; e < entries; ++e) {
        castle_tuning t;
        const char *entry = castle__tuning_table_entry(e, &t);
        if (lint_tuning(argv[1], index, entry, &t))
            return 1;
    }
    for (size_t i = 0; i < VARIANT_TUNINGS; ++i)
        if (lint_test_tuning(argv[1], index, "variant", i, &variant_tunings[i]))
            return 1;
    for (size_t i = 0; i < sizeof sum_tunings / sizeof sum_tunings[0]; ++i)
        if (lint_test_tuning(argv[1], index, "sums", i, &sum_tunings[i]))
            return 1;
    if (fclose(index) != 0) {
        fprintf(stderr, "kernel_lint: cannot write %s/index\n", argv[1]);
        return 1;
    }
    printf("kernel_lint: %d programs from %zu tuning entries and %zu test tunings in %s\n", n, entries,
           (size_t)VARIANT_TUNINGS + sizeof sum_tunings / sizeof sum_tunings[0], argv[1]);
    return 0;
}
