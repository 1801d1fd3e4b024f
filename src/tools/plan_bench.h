/* `dynmo plan --bench`, private to src/tools: times the balancers and
 * compares their quality (plan_bench.c). */
#ifndef DYNMO_TOOLS_PLAN_BENCH_H
#define DYNMO_TOOLS_PLAN_BENCH_H

/* Takes plan's arguments (it reads --repeats R and --seed N among them);
 * returns the exit status: 1 when any answer fails its correctness check. */
int plan_bench(int argc, char **argv);

#endif
