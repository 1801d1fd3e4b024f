/* An output directory that is replaced whole or not at all (`dynmo report
 * --out DIR`, `dynmo simulate --out DIR`): the files are written into a
 * new directory beside DIR, which is then renamed to DIR (a previous DIR
 * renamed away first and removed after). The directory carries a marker,
 * `.dynmo-<tool>`, naming the tool and every file it wrote. DIR may not
 * exist, may be empty, or must hold that tool's marker and only the files
 * the marker names: anything else (a user's files, another tool's output,
 * one of the tool's own inputs) is a user error (exit 2) before a byte is
 * written, so the tool never deletes what it did not write. A directory
 * being written is removed if the process exits first. */
#ifndef DYNMO_TOOLS_OUT_DIR_H
#define DYNMO_TOOLS_OUT_DIR_H

#define OUT_DIR_PATH_BYTES 4096

struct out_dir {
    const char *tool;      /* messages start "<tool>: " */
    const char *what;      /* "the report": "cannot write <what> to DIR" */
    const char *writer;    /* "a report": "DIR holds x, which <writer> does not write" */
    const char *const *inputs;   /* files the tool reads: never inside DIR */
    int input_count;
    const char *path;      /* DIR as given */
    char parent[OUT_DIR_PATH_BYTES], base[OUT_DIR_PATH_BYTES];
    char tmp[OUT_DIR_PATH_BYTES + 256];
    int existed;
};

/* Checks DIR (its name, its parent a directory, no input inside it, what
 * is there now: nothing, or the tool's marked files); sets o->path,
 * parent, base, existed. May run early, before the tool's work, and again
 * in out_dir_begin. */
void out_dir_check(struct out_dir *o, const char *dir);
/* out_dir_check, then the new directory beside DIR (o->tmp; as readable as
 * a mkdir would make it), removed at exit unless committed. */
void out_dir_begin(struct out_dir *o, const char *dir);
/* Writes the marker naming the files now in o->tmp, fsyncs o->tmp and puts
 * it in DIR's place. */
void out_dir_commit(struct out_dir *o);

#endif
