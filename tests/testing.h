/* A small harness for dynmo's C tests: each test binary runs its cases,
 * prints one line per failed check with file:line, a summary line, and
 * exits non-zero if any check failed. */
#ifndef DYNMO_TESTING_H
#define DYNMO_TESTING_H

#include <math.h>
#include <stdio.h>
#include <string.h>

static int testing_failures;
static int testing_checks;

#define CHECK(cond)                                                           \
    do {                                                                      \
        testing_checks++;                                                     \
        if (!(cond)) {                                                        \
            testing_failures++;                                               \
            fprintf(stderr, "%s:%d: check failed: %s\n", __FILE__, __LINE__,  \
                    #cond);                                                   \
        }                                                                     \
    } while (0)

#define CHECK_MSG(cond, ...)                                                  \
    do {                                                                      \
        testing_checks++;                                                     \
        if (!(cond)) {                                                        \
            testing_failures++;                                               \
            fprintf(stderr, "%s:%d: check failed: %s: ", __FILE__, __LINE__,  \
                    #cond);                                                   \
            fprintf(stderr, __VA_ARGS__);                                     \
            fprintf(stderr, "\n");                                            \
        }                                                                     \
    } while (0)

/* |a - b| <= tol, reporting both values. */
#define CHECK_NEAR(a, b, tol)                                                 \
    do {                                                                      \
        double testing_a = (a), testing_b = (b);                              \
        CHECK_MSG(fabs(testing_a - testing_b) <= (tol) &&                     \
                      !isnan(testing_a) && !isnan(testing_b),                 \
                  "%s = %.9g, %s = %.9g, tol %.3g", #a, testing_a, #b,        \
                  testing_b, (double)(tol));                                  \
    } while (0)

/* Whether the whole file at path is `want`, byte for byte (a file of up
 * to 1 KiB). */
static inline int testing_file_holds(const char *path, const char *want)
{
    char buf[1024];
    FILE *f = fopen(path, "rb");
    if (!f) return 0;
    size_t n = fread(buf, 1, sizeof buf, f);
    fclose(f);
    return n == strlen(want) && !memcmp(buf, want, n);
}

static inline int testing_report(const char *name)
{
    printf("%s: %d checks, %d failed\n", name, testing_checks, testing_failures);
    return testing_failures ? 1 : 0;
}

#endif
