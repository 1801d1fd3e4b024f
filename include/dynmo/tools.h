/* dynmo tools: the subcommands behind the `dynmo` binary. Each takes the
 * arguments after its name and returns the process exit status. */
#ifndef DYNMO_TOOLS_H
#define DYNMO_TOOLS_H

int cmd_train(int argc, char **argv);
int cmd_bench(int argc, char **argv);
int cmd_prepare(int argc, char **argv);
int cmd_plan(int argc, char **argv);
int cmd_inspect(int argc, char **argv);
int cmd_check_ckpt(int argc, char **argv);
int cmd_report(int argc, char **argv);
int cmd_trace(int argc, char **argv);

#endif
