/* The interface between the dispatcher (dyn.c) and one dynamism scheme:
 * a scheme is a state created from the config plus the three hooks of
 * dyn.h. Schemes register in dyn.c's table; nothing else includes this. */
#ifndef DYNMO_DYN_SCHEME_H
#define DYNMO_DYN_SCHEME_H

#include <mpi.h>
#include "dynmo/dyn.h"
#include "dynmo/world.h"

struct dyn_scheme {
    const char *kind;
    /* Validates cfg's dyn.* keys for this scheme (user error on a bad one)
     * and returns the scheme's state. */
    void *(*create)(const struct dm_config *cfg, const struct dyn_env *env);
    void (*destroy)(void *state, struct gpt *model);
    void (*before_step)(void *state, struct gpt *model, int step);
    void (*after_reduce)(void *state, struct gpt *model, int step, const double *block_sumsq);
    void (*describe)(const void *state, const struct gpt *model, char *buf, size_t size);
    /* Optional (NULL: the scheme keeps no state across steps beyond the
     * slabs): the scheme's own state as doubles, for checkpoints.
     * state_size is the count; save writes that many; restore gets what a
     * checkpoint held and returns 0, or -1 with err set when it does not
     * fit this run (another window, another depth). */
    long (*state_size)(const void *state);
    void (*state_save)(const void *state, double *out);
    int (*state_restore)(void *state, const double *in, long n, char *err, size_t errsize);
    /* With state_size: dyn_state_check's rules for this scheme's state. */
    int (*state_check)(const double *in, long n, int layers, char *err, size_t errsize);
};

extern const struct dyn_scheme dyn_scheme_freeze;
extern const struct dyn_scheme dyn_scheme_early_exit;
extern const struct dyn_scheme dyn_scheme_prune;


#endif
