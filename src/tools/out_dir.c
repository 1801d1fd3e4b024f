/* The replace-whole output directory of report and simulate (out_dir.h). */
#include <dirent.h>
#include <errno.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>
#include "dynmo/core.h"
#include "tools/out_dir.h"

#define OUT_MAX_BYTES 3800   /* leaves room for the temporary names beside DIR */

static char pending_dir[OUT_DIR_PATH_BYTES + 256];

/* Removes a directory of plain files (ours: one written, or being written;
 * its marker included). */
static void remove_flat_dir(const char *path)
{
    DIR *dir = opendir(path);
    if (dir) {
        for (struct dirent *e; (e = readdir(dir));) {
            if (!strcmp(e->d_name, ".") || !strcmp(e->d_name, "..")) continue;
            char file[OUT_DIR_PATH_BYTES + 512];
            snprintf(file, sizeof file, "%s/%s", path, e->d_name);
            unlink(file);
        }
        closedir(dir);
    }
    rmdir(path);
}

static void remove_pending(void)
{
    if (pending_dir[0]) remove_flat_dir(pending_dir);
    pending_dir[0] = '\0';
}

/* Splits DIR (trailing slashes dropped) into its parent and last name. */
static void split_out(struct out_dir *o, const char *out)
{
    char path[OUT_DIR_PATH_BYTES];
    if (strlen(out) > OUT_MAX_BYTES) dm_user_error("%s: --out '%s' is too long", o->tool, out);
    snprintf(path, sizeof path, "%s", out);
    size_t n = strlen(path);
    while (n > 1 && path[n - 1] == '/') path[--n] = '\0';
    char *slash = strrchr(path, '/');
    snprintf(o->base, sizeof o->base, "%s", slash ? slash + 1 : path);
    if (!slash) snprintf(o->parent, sizeof o->parent, ".");
    else if (slash == path) snprintf(o->parent, sizeof o->parent, "/");
    else snprintf(o->parent, sizeof o->parent, "%.*s", (int)(slash - path), path);
    if (!o->base[0] || !strcmp(o->base, ".") || !strcmp(o->base, ".."))
        dm_user_error("%s: --out '%s' must name a directory to create or replace, not . or .. "
                      "or /", o->tool, out);
}

/* DIR/.dynmo-<tool>: what the tool wrote there. */
static void marker_path(const struct out_dir *o, const char *dir, char *path, size_t size)
{
    snprintf(path, size, "%.4350s/.dynmo-%.32s", dir, o->tool);
}

static void marker_header(const struct out_dir *o, char *line, size_t size)
{
    snprintf(line, size, "dynmo %s wrote this directory and these files; it replaces them "
             "whole\n", o->tool);
}

/* The marker's text (NUL-terminated, owned by the caller), or NULL when
 * DIR has none or it is not the tool's. */
static char *read_marker(const struct out_dir *o)
{
    enum { MARKER_MAX_BYTES = 1 << 20 };
    char path[OUT_DIR_PATH_BYTES + 400], header[256];
    marker_path(o, o->path, path, sizeof path);
    FILE *f = fopen(path, "rb");
    if (!f) return NULL;
    char *text = dm_alloc(MARKER_MAX_BYTES + 1);
    size_t n = fread(text, 1, MARKER_MAX_BYTES + 1, f);
    fclose(f);
    text[n > MARKER_MAX_BYTES ? MARKER_MAX_BYTES : n] = '\0';
    marker_header(o, header, sizeof header);
    if (n > MARKER_MAX_BYTES || strlen(text) != n || strncmp(text, header, strlen(header))) {
        dm_free(text);
        return NULL;
    }
    return text;
}

/* Whether the marker's text names the file `name` on a line of its own. */
static int marker_names(const char *marker, const char *name)
{
    size_t n = strlen(name);
    for (const char *line = strchr(marker, '\n'); line && line[1]; line = strchr(line + 1, '\n'))
        if (!strncmp(line + 1, name, n) && line[1 + n] == '\n') return 1;
    return 0;
}

/* Whether DIR exists; one that is neither empty nor the tool's marked
 * output is a user error. */
static int check_existing(const struct out_dir *o)
{
    const char *out = o->path;
    struct stat st;
    if (stat(out, &st) != 0) {
        if (errno == ENOENT) return 0;
        dm_user_error("%s: cannot write %s to %s: %s", o->tool, o->what, out, strerror(errno));
    }
    if (!S_ISDIR(st.st_mode))
        dm_user_error("%s: --out %s exists and is not a directory", o->tool, out);
    DIR *dir = opendir(out);
    if (!dir) dm_user_error("%s: cannot read the directory %s: %s", o->tool, out, strerror(errno));
    char *marker = read_marker(o), own[64];
    snprintf(own, sizeof own, ".dynmo-%s", o->tool);
    for (struct dirent *e; (e = readdir(dir));) {
        if (!strcmp(e->d_name, ".") || !strcmp(e->d_name, "..")) continue;
        if (marker && !strcmp(e->d_name, own)) continue;
        char path[OUT_DIR_PATH_BYTES + 512];
        snprintf(path, sizeof path, "%s/%s", out, e->d_name);
        if (!marker || !marker_names(marker, e->d_name) || lstat(path, &st) != 0 ||
            !S_ISREG(st.st_mode)) {
            char name[256];
            snprintf(name, sizeof name, "%s", e->d_name);   /* closedir frees e */
            closedir(dir);
            dm_user_error("%s: --out %s holds %s, which %s did not write (%s): choose another "
                          "directory, or empty this one", o->tool, out, name, o->writer,
                          marker ? "its .dynmo marker does not name it"
                                 : "it has no .dynmo marker of this command");
        }
    }
    closedir(dir);
    dm_free(marker);
    return 1;
}

/* An input inside DIR (or DIR itself) would be replaced with it. */
static void check_inputs(const struct out_dir *o)
{
    char out_real[PATH_MAX];
    if (!realpath(o->path, out_real)) return;   /* DIR does not exist yet: nothing inside */
    size_t n = strlen(out_real);
    for (int i = 0; i < o->input_count; i++) {
        char in_real[PATH_MAX];
        if (!realpath(o->inputs[i], in_real)) continue;
        if (!strcmp(in_real, out_real) || (!strncmp(in_real, out_real, n) &&
                                           (in_real[n] == '/' || !strcmp(out_real, "/"))))
            dm_user_error("%s: --out %s holds the input %s: write %s to another directory",
                          o->tool, o->path, o->inputs[i], o->what);
    }
}

void out_dir_check(struct out_dir *o, const char *dir)
{
    o->path = dir;
    split_out(o, dir);
    struct stat st;
    if (stat(o->parent, &st) != 0 || !S_ISDIR(st.st_mode))
        dm_user_error("%s: cannot write %s to %s: %s is not a directory (create it first)",
                      o->tool, o->what, dir, o->parent);
    check_inputs(o);
    o->existed = check_existing(o);
}

/* The names of o->tmp's files, one a line, after `header`; NUL-terminated,
 * owned by the caller. */
static char *list_files(const struct out_dir *o, const char *header, size_t *bytes)
{
    size_t size = strlen(header) + 1;
    for (int pass = 0; pass < 2; pass++) {
        char *text = pass ? dm_alloc(size) : NULL;
        size_t used = 0;
        if (text) used = (size_t)sprintf(text, "%s", header);
        DIR *dir = opendir(o->tmp);
        if (!dir) dm_user_error("%s: cannot read %s: %s", o->tool, o->tmp, strerror(errno));
        for (struct dirent *e; (e = readdir(dir));) {
            if (e->d_name[0] == '.') continue;   /* ., .. (the tools write no hidden files) */
            if (!text) { size += strlen(e->d_name) + 1; continue; }
            used += (size_t)snprintf(text + used, size - used, "%s\n", e->d_name);
        }
        closedir(dir);
        if (text) {
            *bytes = used;
            return text;
        }
    }
    return NULL;
}

/* DIR/.dynmo-<tool> in the new directory: the header, then each file there. */
static void write_marker(const struct out_dir *o)
{
    char header[256], path[OUT_DIR_PATH_BYTES + 400], err[1024];
    marker_header(o, header, sizeof header);
    size_t bytes = 0;
    char *text = list_files(o, header, &bytes);
    marker_path(o, o->tmp, path, sizeof path);
    if (dm_write_file_atomic(path, text, bytes, err, sizeof err) != 0)
        dm_user_error("%s: %s", o->tool, err);
    dm_free(text);
}

void out_dir_begin(struct out_dir *o, const char *dir)
{
    out_dir_check(o, dir);
    snprintf(o->tmp, sizeof o->tmp, "%.3800s/.%.200s.tmp-XXXXXX", o->parent, o->base);
    if (!mkdtemp(o->tmp))
        dm_user_error("%s: cannot write %s to %s: cannot create a directory in %s: %s", o->tool,
                      o->what, dir, o->parent, strerror(errno));
    snprintf(pending_dir, sizeof pending_dir, "%s", o->tmp);
    atexit(remove_pending);
    mode_t mask = umask(0);   /* mkdtemp made it 0700; make it as readable as a mkdir */
    umask(mask);
    if (chmod(o->tmp, 0777 & ~mask) != 0)
        dm_user_error("%s: cannot write %s to %s: chmod %s: %s", o->tool, o->what, dir, o->tmp,
                      strerror(errno));
}

void out_dir_commit(struct out_dir *o)
{
    char err[1024], old[OUT_DIR_PATH_BYTES + 256];
    write_marker(o);
    if (dm_fsync_path(o->tmp, err, sizeof err) != 0) dm_user_error("%s: %s", o->tool, err);
    if (o->existed) {
        snprintf(old, sizeof old, "%.3800s/.%.200s.old-XXXXXX", o->parent, o->base);
        if (!mkdtemp(old) || rename(o->path, old) != 0)
            dm_user_error("%s: cannot replace %s: %s", o->tool, o->path, strerror(errno));
    }
    if (rename(o->tmp, o->path) != 0) {
        int saved = errno;
        if (o->existed) rename(old, o->path);
        dm_user_error("%s: cannot rename %s to %s: %s", o->tool, o->tmp, o->path,
                      strerror(saved));
    }
    pending_dir[0] = '\0';
    if (o->existed) remove_flat_dir(old);
    dm_fsync_path(o->parent, NULL, 0);
}
