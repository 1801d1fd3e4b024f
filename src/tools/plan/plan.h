/* The pieces of `dynmo plan` (src/tools/plan*.c), private to src/tools:
 * the command line (plan_args.c), the cost CSV reader (plan_costs.c), the
 * run-log reader (plan_runlog.c), running and printing the methods
 * (plan.c) and the benchmark (plan_bench.c). The balancers live in
 * src/balance; nothing here decides a layout. */
#ifndef DYNMO_TOOLS_PLAN_H
#define DYNMO_TOOLS_PLAN_H

#include <stddef.h>
#include <stdint.h>
#include "dynmo/balance.h"

/* ---- the input: per-block costs ------------------------------------------- */

struct plan_input {
    int blocks;
    double *fwd_ms, *bwd_ms, *params; /* (blocks) */
    double *update_ms;                /* (blocks) or NULL */
    double *wgrad_ms;                 /* (blocks) or NULL: zb's weight parts */
    int64_t *mem_bytes;               /* (blocks) */
    int has_embed, has_head;
    struct balance_profile profile;   /* points into the arrays above */
};

/* Parses a cost CSV held in memory: text[0..len), not NUL-terminated and
 * never read past; name is what messages call it (a path). The format is
 * docs/balance.md's: a header naming layer,fwd_ms,bwd_ms,params,mem_bytes
 * (any order, update_ms optional, other columns ignored), one row per
 * block, an optional first row 'embed' and last row 'head'; blank lines and
 * '#' lines skipped. Returns 0 with *out filled (free it with
 * plan_input_free), or -1 with a one-line message in err naming the name,
 * the line and the problem, and *out holding nothing to free. Never exits;
 * text is not changed. */
int plan_parse_costs(const char *text, size_t len, const char *name,
                     struct plan_input *out, char *err, size_t errsize);
/* plan_parse_costs on the file at path; a file that cannot be opened or
 * read is -1 with a message naming it. Never exits. */
int plan_read_costs(const char *path, struct plan_input *out, char *err,
                    size_t errsize);
/* Frees the arrays of either reader's input; a zeroed input is fine. */
void plan_input_free(struct plan_input *in);

/* --step N or A-B: the steps (1-based) whose mean costs a plan takes. */
struct plan_steps {
    long first, last;
};

/* What a run's log says beside its costs (plan_read_run). */
struct plan_run {
    int *layout;                /* (stages) units per stage at the step, dm_alloc'd */
    int *chunk_layout;          /* interleaved: (stages x virtual_stages) units per
                                   chunk, chunk c of stage s at c stages + s; else NULL */
    int stages;
    int micro_batches;
    int units;                  /* enum balance_units: with sublayer, a row per unit
                                   from /units/ and the layouts count units */
    enum dm_schedule schedule;
    int virtual_stages;         /* interleaved: chunks per stage; else 1 */
};

/* The costs of DIR/runlog.h5 over steps (their mean; docs/balance.md):
 * fills *in (free with plan_input_free; under zb the weight parts too)
 * and *run; as_blocks reads a sublayer run's blocks (/layers/, its layouts
 * halved). A missing or bad log, a layout that changes inside the range
 * or one that splits a block as_blocks is a user error (exit 2) naming it. */
void plan_read_run(struct plan_input *in, const char *dir, const struct plan_steps *steps,
                   int as_blocks, struct plan_run *run);

/* ---- processors: which stages share them ----------------------------------- */

/* The sharing every prediction uses; its arrays are owned here (dm_alloc). */
struct plan_sharing {
    int *group;                 /* (sharing.stages) or NULL: one processor per stage */
    double *cores;              /* (sharing.groups) */
    struct balance_sharing sharing;
    int from_run;               /* taken from the run log */
    char note[200];             /* why the run's sharing is not used, or "" */
};

/* The sharing the run recorded (root attributes stage_groups, group_cores
 * and group_turns of DIR's run log), used when plan lays out the run's
 * stage count; otherwise ps->note says why not. Bad attributes are user
 * errors. */
void plan_sharing_from_run(struct plan_sharing *ps, const char *dir,
                           int run_stages, int stages);
/* The sharing given by --cores, or by --stage-groups and --group-cores,
 * for `stages` stages. Bad values are user errors naming the option. */
void plan_sharing_from_args(struct plan_sharing *ps, double cores,
                            const char *groups_text, const char *cores_text,
                            int turns, int stages);

/* ---- the command line ------------------------------------------------------ */

/* The balance methods, then plan's two re-packers. */
enum { PLAN_REPACK = BALANCE_METHOD_COUNT, PLAN_REPACK_FIRST_FIT, PLAN_METHOD_COUNT };

const char *plan_method_name(int method);

struct plan_args {
    const char *costs_path;
    const char *run_dir;              /* --from-run */
    struct plan_steps run_steps;      /* --step N or A-B, 1-based (0: not given) */
    int stages;
    int selected[PLAN_METHOD_COUNT];
    int explicit_methods;
    int64_t mem_cap;
    int micro_batches;
    enum dm_schedule schedule;
    int virtual_stages;               /* --virtual: interleaved's chunks per stage
                                         (0 = not given); then `stages` counts
                                         chunks, stages x virtual */
    int *current;                     /* (stages) or NULL, dm_alloc'd */
    double cores;                     /* --cores, 0 = not given */
    const char *stage_groups_text;    /* --stage-groups */
    const char *group_cores_text;     /* --group-cores */
    int sharing_model;                /* --sharing: -1 not given, 0 fluid, 1 turns */
    double gamma;
    double epsilon;
    int target_stages;                /* repack-first-fit */
    int units;                        /* enum balance_units of the --costs rows */
    int units_given;                  /* --units */
    int schedule_given;               /* --schedule (else a run's, or 1f1b) */
    int current_count;                /* entries of --current */
};

/* Interleaved: --virtual (default 2, or a run's) chunks per stage, the
 * layouts over the chunks (a->stages becomes stages x virtual); refused
 * where the schedule cannot run. With --from-run, called once the run is
 * read. */
void plan_check_virtual(struct plan_args *a);

/* Parses plan's command line into *a; sets *bench for --bench (then the
 * rest is plan_bench's to read). --help prints the usage and exits 0; bad
 * arguments are user errors naming the argument. */
void plan_parse_args(struct plan_args *a, int argc, char **argv, int *bench);

/* ---- the benchmark (plan_bench.c) ------------------------------------------ */

/* Takes plan's arguments (it reads --repeats R and --seed N among them);
 * returns the exit status: 1 when any answer fails its correctness check. */
int plan_bench(int argc, char **argv);

#endif
