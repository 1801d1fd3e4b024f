/* An output directory that is replaced whole or not at all (`dynmo report
 * --out DIR`, `dynmo simulate --out DIR`): the files are written into a
 * new directory beside DIR, which is then renamed to DIR (a previous DIR
 * renamed away first and removed after). DIR may not exist, or must be a
 * directory holding only plain files the tool writes: anything else is a
 * user error (exit 2) before a byte is written. A directory being written
 * is removed if the process exits first. */
#ifndef DYNMO_TOOLS_OUT_DIR_H
#define DYNMO_TOOLS_OUT_DIR_H

#define OUT_DIR_PATH_BYTES 4096

struct out_dir {
    const char *tool;      /* messages start "<tool>: " */
    const char *what;      /* "the report": "cannot write <what> to DIR" */
    const char *writer;    /* "a report": "DIR holds x, which <writer> does not write" */
    int (*is_ours)(const char *name);   /* a file name the tool writes */
    const char *path;      /* DIR as given */
    char parent[OUT_DIR_PATH_BYTES], base[OUT_DIR_PATH_BYTES];
    char tmp[OUT_DIR_PATH_BYTES + 256];
    int existed;
};

/* Checks DIR (its name, its parent a directory, what is there now); sets
 * o->path, parent, base, existed. Calls no one back; may run early, before
 * the tool's work, and again in out_dir_begin. */
void out_dir_check(struct out_dir *o, const char *dir);
/* out_dir_check, then the new directory beside DIR (o->tmp; as readable as
 * a mkdir would make it), removed at exit unless committed. */
void out_dir_begin(struct out_dir *o, const char *dir);
/* fsyncs o->tmp and puts it in DIR's place. */
void out_dir_commit(struct out_dir *o);

#endif
