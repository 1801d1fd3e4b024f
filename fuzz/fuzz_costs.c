/* libFuzzer harness of the cost CSV reader of `dynmo plan --costs`:
 * plan_parse_costs, which plan_read_costs calls on a file's bytes. The
 * input is a CSV file's contents, handed over without a terminating NUL
 * (the reader must never read past it).
 *
 * It calls the real reader and checks its contract: a failure is -1 with a
 * message naming the file and nothing left to free; a success has at least
 * one block, every number finite and not negative, and the profile
 * pointing at the arrays. */
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "tools/plan/plan.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

#define NAME "fuzz.csv"

__attribute__((noreturn)) static void broken(const char *what)
{
    fprintf(stderr, "fuzz_costs: %s\n", what);
    abort();
}

static int usable(double x) { return isfinite(x) && x >= 0; }

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    struct plan_input in;
    char err[1024] = "";
    int status = plan_parse_costs((const char *)data, size, NAME, &in, err, sizeof err);
    if (status != 0) {
        if (status != -1 || strncmp(err, NAME, strlen(NAME)) != 0)
            broken("a failure without a message naming the file");
        if (in.blocks || in.fwd_ms || in.bwd_ms || in.params || in.update_ms || in.mem_bytes)
            broken("a failure left arrays behind");
        return 0;
    }
    if (in.blocks < 1 || in.profile.blocks != in.blocks || in.profile.fwd_ms != in.fwd_ms)
        broken("a success without blocks, or a profile that does not match them");
    for (int b = 0; b < in.blocks; b++) {
        if (!usable(in.fwd_ms[b]) || !usable(in.bwd_ms[b]) || !usable(in.params[b]) ||
            in.mem_bytes[b] < 0 || (in.profile.update_ms && !usable(in.update_ms[b])))
            broken("a success with a negative or non-finite value");
    }
    plan_input_free(&in);
    return 0;
}
