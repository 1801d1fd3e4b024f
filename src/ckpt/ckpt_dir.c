/* The checkpoint directory's policy, apart from the HDF5 files in it: the
 * names (ckpt-<step>.h5, its .tmp, `latest`, `next_world`), listing the
 * steps present, preparing the directory for a save and publishing the
 * written file (fsync, rename, move `latest`, prune to `keep`), the scan
 * that resume=auto makes (which file it loads, what it falls back to and
 * what it says), and `next_world`, the job scripts' description of the
 * next, smaller world.
 *
 * This file never calls HDF5: checkpoint.c writes the files, ckpt_load.c
 * reads them, and the resume scan asks it to load one (ckpt_load_agreed).
 * It decides nothing about training (when to save, whether a failed save
 * ends the run): it returns errors to its caller. Only one rank touches
 * the directory; what it finds is broadcast, so that every rank tries the
 * same files in the same order. The small files are written with core's
 * atomic writer, so a reader sees the old file or the whole new one. */
#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/statvfs.h>
#include <dirent.h>
#include <unistd.h>
#include "dynmo/ckpt.h"
#include "dynmo/world.h"
#include "ckpt/ckpt_dir.h"

#define PATH_BYTES 4096
#define MESSAGE_BYTES 1024

/* ---- names --------------------------------------------------------------------- */

void ckpt_path(char *buf, size_t size, const char *dir, long step)
{
    snprintf(buf, size, "%s/ckpt-%ld.h5", dir, step);
}

void ckpt_tmp_path(char *buf, size_t size, const char *dir, long step)
{
    snprintf(buf, size, "%s/ckpt-%ld.h5.tmp", dir, step);
}

int ckpt_is_temporary_name(const char *path)
{
    size_t n = strlen(path);
    return n >= 4 && !strcmp(path + n - 4, ".tmp");
}

long ckpt_dir_parse_name(const char *name, int tmp)
{
    if (strncmp(name, "ckpt-", 5) != 0) return -1;
    const char *p = name + 5, *digits = p;
    while (*p >= '0' && *p <= '9') p++;
    if (p == digits || p - digits > 18) return -1;
    if (strcmp(p, tmp ? ".h5.tmp" : ".h5") != 0) return -1;
    return strtol(digits, NULL, 10);
}

static int newest_first(const void *a, const void *b)
{
    long x = *(const long *)a, y = *(const long *)b;
    return (x < y) - (x > y);
}

int ckpt_dir_list_steps(const char *dir, int tmp, long **steps)
{
    *steps = NULL;
    DIR *d = opendir(dir);
    if (!d) return -1;
    int count = 0, capacity = 16;
    long *out = dm_alloc((size_t)capacity * sizeof(long));
    struct dirent *e;
    while ((e = readdir(d)) != NULL) {
        long step = ckpt_dir_parse_name(e->d_name, tmp);
        if (step < 0) continue;
        if (count == capacity) {
            long *grown = dm_alloc((size_t)(2 * capacity) * sizeof(long));
            memcpy(grown, out, (size_t)count * sizeof(long));
            dm_free(out);
            out = grown;
            capacity *= 2;
        }
        out[count++] = step;
    }
    closedir(d);
    qsort(out, (size_t)count, sizeof(long), newest_first);
    *steps = out;
    return count;
}

/* ---- saving: prepare, publish, prune ------------------------------------------------ */

int ckpt_dir_prepare(const char *dir, long step, char *err, size_t errsize)
{
    char reason[MESSAGE_BYTES], tmp[PATH_BYTES];
    if (dm_make_dirs(dir, reason, sizeof reason) != 0) {
        dm_set_message(err, errsize, "cannot create the checkpoint directory %s (%s)", dir, reason);
        return -1;
    }
    if (access(dir, W_OK | X_OK) != 0) {
        dm_set_message(err, errsize, "the checkpoint directory %s is not writable: %s", dir,
                  strerror(errno));
        return -1;
    }
    ckpt_tmp_path(tmp, sizeof tmp, dir, step);
    if (unlink(tmp) != 0 && errno != ENOENT) {
        dm_set_message(err, errsize, "cannot remove the stale %s: %s", tmp, strerror(errno));
        return -1;
    }
    return 0;
}

int ckpt_dir_check_usable(const char *dir, uint64_t need_bytes, char *err, size_t errsize)
{
    char reason[MESSAGE_BYTES], path[PATH_BYTES];
    struct stat st;
    if (dm_make_dirs(dir, reason, sizeof reason) != 0) {
        dm_set_message(err, errsize, "ckpt.dir = %s cannot be used: %s", dir, reason);
        return -1;
    }
    if (dm_probe_writable(dir, reason, sizeof reason) != 0) {
        dm_set_message(err, errsize, "ckpt.dir = %s is not writable: %s", dir, reason);
        return -1;
    }
    snprintf(path, sizeof path, "%s/%s", dir, CHECKPOINT_LATEST_NAME);
    if (lstat(path, &st) == 0 && !S_ISREG(st.st_mode)) {
        dm_set_message(err, errsize, "ckpt.dir = %s: %s is not a regular file; remove it (it "
                  "should name the newest complete checkpoint)", dir, path);
        return -1;
    }
    struct statvfs fs;
    if (statvfs(dir, &fs) == 0 && (uint64_t)fs.f_bavail * fs.f_frsize < need_bytes) {
        dm_set_message(err, errsize, "ckpt.dir = %s has %.1f MiB free, but a checkpoint of this "
                  "run needs about %.1f MiB", dir,
                  (double)fs.f_bavail * fs.f_frsize / 1048576.0, need_bytes / 1048576.0);
        return -1;
    }
    return 0;
}

/* Replaces DIR/latest by one line naming checkpoint `step`. */
static int write_latest(const char *dir, long step, char *err, size_t errsize)
{
    char path[PATH_BYTES], line[64];
    snprintf(path, sizeof path, "%s/%s", dir, CHECKPOINT_LATEST_NAME);
    int n = snprintf(line, sizeof line, "ckpt-%ld.h5\n", step);
    return dm_write_file_atomic(path, line, (size_t)n, err, errsize);
}

int ckpt_dir_publish(const char *dir, int keep, long step, char *err, size_t errsize)
{
    char tmp[PATH_BYTES], final[PATH_BYTES];
    ckpt_tmp_path(tmp, sizeof tmp, dir, step);
    ckpt_path(final, sizeof final, dir, step);
    if (dm_fsync_path(tmp, err, errsize) != 0) return -1;
    if (rename(tmp, final) != 0) {
        dm_set_message(err, errsize, "cannot rename %s to %s: %s", tmp, final, strerror(errno));
        return -1;
    }
    if (dm_fsync_path(dir, err, errsize) != 0) return -1;
    if (write_latest(dir, step, err, errsize) != 0) return -1;
    ckpt_dir_prune(dir, keep, step);
    return 0;
}

void ckpt_dir_prune(const char *dir, int keep, long newest)
{
    char path[PATH_BYTES];
    long *steps;
    int count = ckpt_dir_list_steps(dir, 0, &steps), kept = 1;
    for (int i = 0; i < count; i++) {
        if (steps[i] >= newest) continue;
        if (keep <= 0 || kept < keep) {
            kept++;
            continue;
        }
        ckpt_path(path, sizeof path, dir, steps[i]);
        if (unlink(path) != 0 && errno != ENOENT)
            dm_warn("cannot delete the old checkpoint %s: %s\n", path, strerror(errno));
    }
    dm_free(steps);
    count = ckpt_dir_list_steps(dir, 1, &steps);
    for (int i = 0; i < count; i++) {
        ckpt_tmp_path(path, sizeof path, dir, steps[i]);
        if (unlink(path) != 0 && errno != ENOENT)
            dm_warn("cannot delete the stale %s: %s\n", path, strerror(errno));
    }
    dm_free(steps);
}

/* ---- next_world -------------------------------------------------------------------- */

int ckpt_write_next_world(const char *dir, int pp, int dp, const int *layout, long step,
                          char *err, size_t errsize)
{
    DM_ASSERT(pp >= 1 && dp >= 1 && step >= 0);
    size_t layout_bytes = (size_t)pp * 12 + 1, used = 0;
    char *layout_text = dm_alloc(layout_bytes);
    for (int s = 0; s < pp; s++) {
        DM_ASSERT(layout[s] >= 1);
        used += (size_t)snprintf(layout_text + used, layout_bytes - used, "%s%d",
                                 s ? "," : "", layout[s]);
    }
    static const char format[] =
        "# written by dynmo %s on re-pack: the next world of this job chain\n"
        "ranks = %d\npp = %d\ndp = %d\nlayout = %s\nstep = %ld\ncheckpoint = ckpt-%ld.h5\n";
    int n = snprintf(NULL, 0, format, DYNMO_VERSION, pp * dp, pp, dp, layout_text, step, step);
    char *text = dm_alloc((size_t)n + 1);
    snprintf(text, (size_t)n + 1, format, DYNMO_VERSION, pp * dp, pp, dp, layout_text, step,
             step);
    char path[PATH_BYTES];
    snprintf(path, sizeof path, "%s/%s", dir, CHECKPOINT_NEXT_WORLD_NAME);
    int rc = dm_write_file_atomic(path, text, (size_t)n, err, errsize);
    dm_free(text);
    dm_free(layout_text);
    return rc;
}

/* ---- resume=auto -------------------------------------------------------------------- */

/* Rank 0's view of the directory, the same on every rank. */
struct scan {
    char *text;          /* owns the strings below */
    const char *latest;  /* what `latest` names; "" without one, "(empty)" if empty */
    char *complete;      /* complete checkpoints' names, newest first, one a line */
    char *incomplete;    /* .tmp names, newest first, one a line */
};

/* Appends one name per step (newest first) to text, within capacity. */
static size_t list_names(char *text, size_t used, size_t capacity, const char *dir, int tmp)
{
    long *steps;
    int count = ckpt_dir_list_steps(dir, tmp, &steps);
    for (int i = 0; i < count && used + 64 < capacity; i++)
        used += (size_t)snprintf(text + used, capacity - used, "ckpt-%ld.h5%s\n", steps[i],
                                 tmp ? ".tmp" : "");
    dm_free(steps);
    return used;
}

/* Rank 0 reads the directory into text: line 1 what latest names, then
 * the complete checkpoints, "--", the .tmp names; every rank receives it. */
static void scan_directory(const char *dir, MPI_Comm comm, struct scan *scan)
{
    int rank;
    WORLD_MPI(MPI_Comm_rank(comm, &rank));
    size_t capacity = 1 << 16;
    char *text = dm_alloc(capacity);
    int length = 0;
    if (rank == 0) {
        char path[PATH_BYTES], latest[512] = "";
        snprintf(path, sizeof path, "%s/%s", dir, CHECKPOINT_LATEST_NAME);
        FILE *f = fopen(path, "r");
        if (f) {
            if (!fgets(latest, sizeof latest, f)) latest[0] = '\0';
            fclose(f);
            latest[strcspn(latest, "\r\n")] = '\0';
            const char *base = strrchr(latest, '/') ? strrchr(latest, '/') + 1 : latest;
            if (!latest[0])
                snprintf(latest, sizeof latest, "%s", "(empty)");
            else if (ckpt_dir_parse_name(base, 0) < 0)   /* never echo raw bytes */
                snprintf(latest, sizeof latest, "%s", "(something that is no checkpoint name)");
        }
        size_t used = (size_t)snprintf(text, capacity, "%s\n", latest);
        used = list_names(text, used, capacity, dir, 0);
        used += (size_t)snprintf(text + used, capacity - used, "--\n");
        used = list_names(text, used, capacity, dir, 1);
        length = (int)used + 1;
    }
    MPI_Request request;
    WORLD_MPI(MPI_Ibcast(&length, 1, MPI_INT, 0, comm, &request));
    world_wait(&request);
    WORLD_MPI(MPI_Ibcast(text, length, MPI_CHAR, 0, comm, &request));
    world_wait(&request);
    scan->text = text;
    scan->latest = text;
    scan->complete = strchr(text, '\n');
    *scan->complete++ = '\0';
    scan->incomplete = strstr(scan->complete, "--\n");
    *scan->incomplete = '\0';
    scan->incomplete += 3;
}

/* What the scan has tried: each failed file with its problem. */
struct attempts {
    int tried;
    char failures[4096];
};

static void add_failure(struct attempts *a, const char *problem)
{
    size_t used = strlen(a->failures);
    if (used + 1 < sizeof a->failures)
        snprintf(a->failures + used, sizeof a->failures - used, "%s%s", used ? "; " : "",
                 problem);
}

/* stdout of rank 0 of comm (dm_log speaks for rank 0 of the world). */
__attribute__((format(printf, 2, 3)))
static void say(MPI_Comm comm, const char *fmt, ...)
{
    int rank;
    WORLD_MPI(MPI_Comm_rank(comm, &rank));
    if (rank != 0) return;
    va_list ap;
    va_start(ap, fmt);
    vprintf(fmt, ap);
    va_end(ap);
    fflush(stdout);
}

/* Loads path; 1 on success, 0 with the problem in err when the file is
 * unusable. Another model ends the run (status 2): never a fallback. */
static int try_load(const char *path, struct gpt *model, struct ckpt_meta *meta,
                    MPI_Comm comm, char *err, size_t errsize)
{
    enum ckpt_load_outcome outcome = ckpt_load_agreed(path, model, meta, comm, err, errsize);
    if (outcome == CKPT_LOAD_MODEL_MISMATCH) dm_user_error("%s", err);
    return outcome == CKPT_LOAD_OK;
}

/* The first choice: the file `latest` names, always inside dir. Returns 1
 * when it loaded (its path in path); otherwise records the problem and
 * sets *below to its step: the fallback takes only older checkpoints, a
 * newer one belonging to a run that did not continue from it. */
static int try_latest(const char *dir, const char *latest, struct gpt *model,
                      struct ckpt_meta *meta, MPI_Comm comm, struct attempts *a,
                      long *below, char *path, size_t pathsize)
{
    const char *base = strrchr(latest, '/') ? strrchr(latest, '/') + 1 : latest;
    long step = ckpt_dir_parse_name(base, 0);
    char err[MESSAGE_BYTES], problem[MESSAGE_BYTES];
    snprintf(path, pathsize, "%s/%s", dir, base);
    a->tried++;
    struct stat st;
    if (world_agree(step < 0 || stat(path, &st) != 0, "", comm, NULL, 0) != 0) {
        dm_set_message(problem, sizeof problem, "%s/%s names %s, which %s", dir,
                  CHECKPOINT_LATEST_NAME, latest,
                  step < 0 ? "is not a complete checkpoint's name (ckpt-<step>.h5)"
                           : "does not exist");
    } else if (try_load(path, model, meta, comm, err, sizeof err)) {
        return 1;
    } else {
        dm_set_message(problem, sizeof problem, "%s (named by %s/%s)", err, dir,
                  CHECKPOINT_LATEST_NAME);
    }
    *below = step;
    add_failure(a, problem);
    return 0;
}

/* The fallback: the newest complete checkpoint before `below` (any when
 * below < 0) that loads. Returns 1 with its path in path, or 0. */
static int try_older(const char *dir, char *names, long below, struct gpt *model,
                     struct ckpt_meta *meta, MPI_Comm comm, struct attempts *a, char *path,
                     size_t pathsize)
{
    char *save = NULL, err[MESSAGE_BYTES];
    for (char *name = strtok_r(names, "\n", &save); name; name = strtok_r(NULL, "\n", &save)) {
        long step = ckpt_dir_parse_name(name, 0);
        if (below >= 0 && step >= below) continue;
        snprintf(path, pathsize, "%s/%s", dir, name);
        a->tried++;
        if (try_load(path, model, meta, comm, err, sizeof err)) return 1;
        add_failure(a, err);
    }
    return 0;
}

/* Says why resume=auto did not load what `latest` names, and what instead. */
static void say_fallback(MPI_Comm comm, const char *dir, const struct scan *scan,
                         const struct attempts *a, const char *path)
{
    if (scan->latest[0])
        say(comm, "resume: %s; resuming from the previous complete checkpoint %s instead\n",
            a->failures, path);
    else if (a->failures[0])
        say(comm, "resume: %s/%s is missing and newer checkpoints are unusable (%s); "
            "resuming from %s\n", dir, CHECKPOINT_LATEST_NAME, a->failures, path);
    else
        say(comm, "resume: %s/%s is missing; resuming from the newest complete checkpoint "
            "%s\n", dir, CHECKPOINT_LATEST_NAME, path);
}

/* Nothing complete was found: a fresh start, said (naming a .tmp if any). */
static void say_fresh_start(MPI_Comm comm, const char *dir, char *incomplete)
{
    if (incomplete[0]) {
        incomplete[strcspn(incomplete, "\n")] = '\0';
        say(comm, "resume: no complete checkpoint in %s (ignoring the incomplete %s, which "
            "has no completion marker); starting from step 0\n", dir, incomplete);
    } else {
        say(comm, "resume: no checkpoint in %s; starting from step 0\n", dir);
    }
}

int ckpt_resume_auto(const char *dir, struct gpt *model, struct ckpt_meta *meta,
                     MPI_Comm comm, char *loaded_path, size_t loaded_path_size)
{
    struct scan scan;
    scan_directory(dir, comm, &scan);
    struct attempts a = {0};
    char path[PATH_BYTES];
    long below = -1;
    int found = scan.latest[0] &&
                try_latest(dir, scan.latest, model, meta, comm, &a, &below, path, sizeof path);
    if (!found && try_older(dir, scan.complete, below, model, meta, comm, &a, path,
                            sizeof path)) {
        say_fallback(comm, dir, &scan, &a, path);
        found = 1;
    }
    if (!found && a.tried > 0) dm_user_error("no usable checkpoint in %s: %s", dir, a.failures);
    if (!found) {
        say_fresh_start(comm, dir, scan.incomplete);
        memset(meta, 0, sizeof *meta);
        path[0] = '\0';
    }
    dm_free(scan.text);
    if (loaded_path && loaded_path_size) snprintf(loaded_path, loaded_path_size, "%s", path);
    return found;
}
