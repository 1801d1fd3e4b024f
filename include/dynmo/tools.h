/* dynmo tools: the subcommands behind the `dynmo` binary. Each takes the
 * arguments after its name and returns the process exit status. */
#ifndef DYNMO_TOOLS_H
#define DYNMO_TOOLS_H

int cmd_train(int argc, char **argv);
int cmd_bench(int argc, char **argv);
/* `dynmo prepare --out DIR [--val-fraction F] FILE...`: byte-level tokens
 * (token = byte value, vocab 256); files are joined with one 0x00 byte
 * between consecutive files; val is the last fraction F (default 0.05,
 * 0 < F <= 0.5) of the stream, moved forward to the next line start;
 * DIR/train.bin and DIR/val.bin are written atomically. Returns the exit
 * status (0); bad input is dm_user_error (status 2). argv[0] = "prepare". */
int cmd_prepare(int argc, char **argv);
int cmd_plan(int argc, char **argv);
int cmd_inspect(int argc, char **argv);
int cmd_check_ckpt(int argc, char **argv);
int cmd_report(int argc, char **argv);
int cmd_trace(int argc, char **argv);
/* `dynmo simulate --from-run RUN_DIR [options]` (docs/simulate.md). */
int cmd_simulate(int argc, char **argv);
/* `dynmo calibrate` (src/tools/calibrate.c): a hardware file of this machine. */
int cmd_calibrate(int argc, char **argv);
/* `dynmo import-hf DIR --out CKPT.h5`, `dynmo export-hf CKPT.h5 --out DIR`
 * and `dynmo eval --checkpoint CKPT.h5 --data PATH` (docs/weights.md). */
int cmd_import_hf(int argc, char **argv);
int cmd_export_hf(int argc, char **argv);
int cmd_eval(int argc, char **argv);

#endif
