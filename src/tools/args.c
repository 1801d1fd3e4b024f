/* The subcommands' number arguments and help option (tools/args.h). */
#include <errno.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include "dynmo/core.h"
#include "tools/args.h"

long tool_parse_long(const char *prefix, const char *arg, const char *text, long min, long max)
{
    char *end;
    errno = 0;
    long v = strtol(text, &end, 10);
    if (end == text || *end || errno || v < min || v > max)
        dm_user_error("%s%s: '%s' is not a whole number in [%ld, %ld]", prefix, arg, text, min,
                      max);
    return v;
}

double tool_parse_double(const char *prefix, const char *arg, const char *text, double min)
{
    char *end;
    errno = 0;
    double v = strtod(text, &end);
    if (end == text || *end || errno || !isfinite(v) || v < min)
        dm_user_error("%s%s: '%s' is not a number >= %g", prefix, arg, text, min);
    return v;
}

void tool_help(const char *arg, void (*usage)(FILE *out))
{
    if (strcmp(arg, "--help") && strcmp(arg, "-h")) return;
    usage(stdout);
    exit(DM_EXIT_OK);
}
