/* Durable small files: mkdir -p, fsync by path, and the one atomic writer
 * of a small file (write a temporary name in the same directory, fsync,
 * rename, fsync the directory; Redis's discipline, STYLE.md). Checkpoint
 * directories (`latest`, `next_world`), run directories and prepared data
 * use these, so that every durable write in dynmo fails the same way: with
 * -1 and a message that names the path and the system's reason.
 *
 * Nothing here decides policy (which rank writes, what a failure means to
 * the run) and nothing here calls MPI: the caller picks the rank and turns
 * the message into an error of the right kind. */
#include <errno.h>
#include <fcntl.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>
#include "dynmo/core.h"

/* Longest path these helpers build (the temporary name and the parent
 * directory are built in buffers of this size). */
#define FILES_PATH_BYTES 4096

/* What this process created while starting up (dm_startup_done), undone
 * by a fatal error before then: a run refused at start-up leaves nothing. */
#define STARTUP_MAX_CREATED 64
static struct {
    char *paths[STARTUP_MAX_CREATED];
    int is_dir[STARTUP_MAX_CREATED];
    int count;
    int done;
} startup;

static void startup_record(const char *path, int is_dir)
{
    if (startup.done || startup.count == STARTUP_MAX_CREATED) return;
    size_t n = strlen(path) + 1;
    char *copy = malloc(n);   /* not dm_alloc: this is read on the fatal path */
    if (!copy) return;
    memcpy(copy, path, n);
    startup.is_dir[startup.count] = is_dir;
    startup.paths[startup.count++] = copy;
}

void dm_startup_created_file(const char *path) { startup_record(path, 0); }

/* One pass, newest first (a file before its directory); what could not
 * go stays listed. Returns how many stay. */
static int startup_undo_pass(void)
{
    for (int i = startup.count - 1; i >= 0; i--) {
        int gone = startup.is_dir[i] ? rmdir(startup.paths[i]) == 0 || errno == ENOENT
                                     : (unlink(startup.paths[i]), 1);
        if (gone) free(startup.paths[i]), startup.paths[i] = NULL;
    }
    int kept = 0;
    for (int i = 0; i < startup.count; i++)
        if (startup.paths[i]) startup.paths[kept] = startup.paths[i], startup.is_dir[kept++] = 1;
    startup.count = kept;
    return kept;
}

/* The ranks of a job create the same directories at once, and each
 * records only the levels it made: rank 0's run.out_dir can hold rank 1's
 * ckpt.dir. Every rank undoes on the same fatal path, so a directory of
 * ours that is not empty yet is retried for a second while the others
 * take theirs away; one that still holds something then (a user's file)
 * stays. */
void dm_startup_undo(void)
{
    if (startup.done) return;
    struct timespec pause = {0, 20000000L};
    for (int tries = 0; startup_undo_pass() > 0 && tries < 50; tries++)
        nanosleep(&pause, NULL);
    for (int i = 0; i < startup.count; i++) free(startup.paths[i]);
    startup.count = 0;
}

void dm_startup_done(void)
{
    for (int i = 0; i < startup.count; i++) free(startup.paths[i]);
    startup.count = 0;
    startup.done = 1;
}

void dm_set_message(char *err, size_t errsize, const char *fmt, ...)
{
    if (!err || !errsize) return;
    int saved = errno;
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(err, errsize, fmt, ap);
    va_end(ap);
    errno = saved;
}

int dm_make_dirs(const char *path, char *err, size_t errsize)
{
    char prefix[FILES_PATH_BYTES];
    size_t n = strlen(path);
    if (n == 0 || n >= sizeof prefix) {
        errno = n ? ENAMETOOLONG : ENOENT;
        dm_set_message(err, errsize, "cannot create directory '%s': %s", path, strerror(errno));
        return -1;
    }
    memcpy(prefix, path, n + 1);
    /* Each prefix ending before a '/' (and the whole path) in turn; an
     * existing one is fine as long as the last turns out a directory. */
    for (size_t i = 1; i <= n; i++) {
        if (i < n && prefix[i] != '/') continue;
        char saved = prefix[i];
        prefix[i] = '\0';
        if (mkdir(prefix, 0777) == 0) {
            startup_record(prefix, 1);
        } else if (errno != EEXIST) {
            dm_set_message(err, errsize, "cannot create directory %s: %s", prefix,
                        strerror(errno));
            return -1;
        }
        prefix[i] = saved;
    }
    struct stat st;
    if (stat(path, &st) != 0) {
        dm_set_message(err, errsize, "cannot create directory %s: %s", path, strerror(errno));
        return -1;
    }
    if (!S_ISDIR(st.st_mode)) {
        errno = ENOTDIR;
        dm_set_message(err, errsize, "cannot create directory %s: it exists and is not a "
                    "directory (%s)", path, strerror(errno));
        return -1;
    }
    return 0;
}

int dm_fsync_path(const char *path, char *err, size_t errsize)
{
    int fd = open(path, O_RDONLY);
    if (fd < 0) {
        dm_set_message(err, errsize, "cannot open %s to fsync it: %s", path, strerror(errno));
        return -1;
    }
    if (fsync(fd) != 0) {
        dm_set_message(err, errsize, "fsync of %s failed: %s", path, strerror(errno));
        close(fd);
        return -1;
    }
    if (close(fd) != 0) {
        dm_set_message(err, errsize, "close of %s failed: %s", path, strerror(errno));
        return -1;
    }
    return 0;
}

/* The directory that holds path: everything before its last '/', "/" for
 * a file in the root, "." for a bare name. */
static void parent_directory(char *out, size_t size, const char *path)
{
    const char *slash = strrchr(path, '/');
    if (!slash) snprintf(out, size, ".");
    else if (slash == path) snprintf(out, size, "/");
    else snprintf(out, size, "%.*s", (int)(slash - path), path);
}

int dm_write_all(int fd, const void *data, size_t bytes)
{
    const char *p = data;
    while (bytes > 0) {
        ssize_t put = write(fd, p, bytes);
        if (put < 0) {
            if (errno == EINTR) continue;
            return -1;
        }
        p += put;
        bytes -= (size_t)put;
    }
    return 0;
}

int dm_write_file_atomic(const char *path, const void *data, size_t bytes, char *err,
                         size_t errsize)
{
    char tmp[FILES_PATH_BYTES], dir[FILES_PATH_BYTES];
    if ((size_t)snprintf(tmp, sizeof tmp, "%s.tmp", path) >= sizeof tmp) {
        errno = ENAMETOOLONG;
        dm_set_message(err, errsize, "cannot write %s: %s", path, strerror(errno));
        return -1;
    }
    parent_directory(dir, sizeof dir, path);
    /* Only a regular file is replaced: a rename over /dev/null (a user's
     * "--out /dev/null") or a FIFO would remove the device, not write to it. */
    struct stat st;
    if (stat(path, &st) == 0 && !S_ISREG(st.st_mode)) {
        dm_set_message(err, errsize, "%s exists and is not a regular file (a directory, a "
                       "device or a FIFO is never replaced)", path);
        return -1;
    }
    int fd = open(tmp, O_WRONLY | O_CREAT | O_TRUNC, 0644);
    if (fd < 0) {
        dm_set_message(err, errsize, "cannot create %s (to replace %s): %s", tmp, path,
                    strerror(errno));
        return -1;
    }
    const char *failed = dm_write_all(fd, data, bytes) != 0 ? "write"
                       : fsync(fd) != 0                 ? "fsync"
                                                        : NULL;
    if (failed) {
        dm_set_message(err, errsize, "%s of %s (to replace %s) failed: %s", failed, tmp, path,
                    strerror(errno));
        close(fd);
        unlink(tmp);
        return -1;
    }
    if (close(fd) != 0) {
        dm_set_message(err, errsize, "close of %s (to replace %s) failed: %s", tmp, path,
                    strerror(errno));
        unlink(tmp);
        return -1;
    }
    if (rename(tmp, path) != 0) {
        dm_set_message(err, errsize, "cannot rename %s to %s: %s", tmp, path, strerror(errno));
        unlink(tmp);
        return -1;
    }
    /* Until the directory is synced, a crash may still lose the rename. */
    char reason[FILES_PATH_BYTES + 128];
    if (dm_fsync_path(dir, reason, sizeof reason) != 0) {
        dm_set_message(err, errsize, "%s was written but may not survive a crash: %s", path,
                    reason);
        return -1;
    }
    return 0;
}

int dm_probe_writable(const char *dir, char *err, size_t errsize)
{
    char probe[FILES_PATH_BYTES];
    snprintf(probe, sizeof probe, "%s/.dynmo-probe-%ld", dir, (long)getpid());
    int fd = open(probe, O_WRONLY | O_CREAT | O_TRUNC, 0600);
    if (fd < 0) {
        dm_set_message(err, errsize, "%s", strerror(errno));
        return -1;
    }
    int ok = write(fd, "x", 1) == 1;
    if (!ok) dm_set_message(err, errsize, "%s", strerror(errno));
    if (close(fd) != 0 && ok) {
        ok = 0;
        dm_set_message(err, errsize, "%s", strerror(errno));
    }
    unlink(probe);
    return ok ? 0 : -1;
}
