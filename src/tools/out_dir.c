/* The replace-whole output directory of report and simulate (out_dir.h). */
#include <dirent.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>
#include "dynmo/core.h"
#include "tools/out_dir.h"

#define OUT_MAX_BYTES 3800   /* leaves room for the temporary names beside DIR */

static char pending_dir[OUT_DIR_PATH_BYTES + 256];

/* Removes a directory of plain files (ours: one written, or being written). */
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

/* Whether DIR exists; one that is not a directory of the tool's plain
 * files is a user error. */
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
    for (struct dirent *e; (e = readdir(dir));) {
        if (!strcmp(e->d_name, ".") || !strcmp(e->d_name, "..")) continue;
        char path[OUT_DIR_PATH_BYTES + 512];
        snprintf(path, sizeof path, "%s/%s", out, e->d_name);
        if (!o->is_ours(e->d_name) || lstat(path, &st) != 0 || !S_ISREG(st.st_mode)) {
            char name[256];
            snprintf(name, sizeof name, "%s", e->d_name);   /* closedir frees e */
            closedir(dir);
            dm_user_error("%s: --out %s holds %s, which %s does not write: choose another "
                          "directory, or empty this one", o->tool, out, name, o->writer);
        }
    }
    closedir(dir);
    return 1;
}

void out_dir_check(struct out_dir *o, const char *dir)
{
    o->path = dir;
    split_out(o, dir);
    struct stat st;
    if (stat(o->parent, &st) != 0 || !S_ISDIR(st.st_mode))
        dm_user_error("%s: cannot write %s to %s: %s is not a directory (create it first)",
                      o->tool, o->what, dir, o->parent);
    o->existed = check_existing(o);
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
