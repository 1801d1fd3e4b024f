/* The checkpoint directory's policy and the layout history, without HDF5
 * or MPI: names and their parsing, listing newest first, keep/prune (newer
 * checkpoints and the newest one survive, stale .tmp files go), publishing
 * (rename, `latest` naming the file, byte for byte), prepare (mkdir -p, a
 * stale .tmp removed, a regular file in the way an error naming the
 * directory), next_world byte for byte as docs/jobs.md and the job scripts
 * read it; the history's push (an unchanged layout is not added), lookup
 * by step, copy and validation of a damaged history. */
#define _XOPEN_SOURCE 700
#include <errno.h>
#include <ftw.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>
#include "dynmo/ckpt.h"
#include "ckpt/ckpt_dir.h"
#include "testing.h"

static char root[512];

static int exists(const char *path)
{
    struct stat st;
    return stat(path, &st) == 0;
}

static void touch(const char *dir, const char *name)
{
    char path[1024];
    snprintf(path, sizeof path, "%s/%s", dir, name);
    FILE *f = fopen(path, "w");
    CHECK_MSG(f != NULL, "cannot create %s", path);
    if (f) {
        fputs(name, f);
        fclose(f);
    }
}

static int remove_entry(const char *path, const struct stat *st, int flag, struct FTW *ftw)
{
    (void)st;
    (void)flag;
    (void)ftw;
    return remove(path);
}

/* ---- layout history -------------------------------------------------------------- */

static void test_history(void)
{
    struct layout_history h;
    layout_history_init(&h, 8);
    CHECK(h.count == 0 && layout_history_at(&h, 5) == -1);
    CHECK(layout_history_push(&h, 0, (int[]){4, 4}, 2) == 1);
    CHECK(layout_history_push(&h, 3, (int[]){4, 4}, 2) == 0);        /* unchanged */
    CHECK(layout_history_push(&h, 3, (int[]){3, 5}, 2) == 1);
    CHECK(layout_history_push(&h, 3, (int[]){2, 3, 3}, 3) == 1);     /* a re-pack */
    CHECK(layout_history_push(&h, 9, (int[]){2, 3, 3}, 3) == 0);
    CHECK(layout_history_push(&h, 9, (int[]){8}, 1) == 1);
    CHECK(h.count == 4 && h.layers == 8);
    long want_step[] = {0, 3, 3, 9};
    int want_stages[] = {2, 2, 3, 1};
    int want_rows[4][8] = {{4, 4}, {3, 5}, {2, 3, 3}, {8}};
    for (int k = 0; k < 4 && h.count == 4; k++) {
        CHECK(h.step[k] == want_step[k] && h.stages[k] == want_stages[k]);
        CHECK_MSG(!memcmp(layout_history_entry(&h, k), want_rows[k], sizeof want_rows[k]),
                  "entry %d is not its layout padded with zeros", k);
    }
    /* Many entries: the arrays grow and keep what they held. */
    for (int i = 0; i < 40; i++)
        layout_history_push(&h, 10 + i, i % 2 ? (int[]){1, 7} : (int[]){7, 1}, 2);
    CHECK(h.count == 44 && h.capacity >= 44);
    CHECK(layout_history_entry(&h, 2)[2] == 3 && h.step[43] == 49);
    CHECK(layout_history_at(&h, -1) == -1);
    CHECK(layout_history_at(&h, 0) == 0 && layout_history_at(&h, 2) == 0);
    CHECK(layout_history_at(&h, 3) == 2);     /* the last entry that holds from step 3 */
    CHECK(layout_history_at(&h, 9) == 3 && layout_history_at(&h, 1000) == 43);

    struct layout_history copy = {0};
    layout_history_copy(&copy, &h);
    CHECK(copy.count == h.count && copy.layers == 8 && copy.step != h.step);
    CHECK(!memcmp(copy.layout, h.layout, (size_t)h.count * 8 * sizeof(int)));
    char err[256] = "";
    CHECK_MSG(layout_history_check(&copy, err, sizeof err) == 0, "%s", err);
    copy.step[5] = 1;                                    /* before entry 4's step */
    CHECK(layout_history_check(&copy, err, sizeof err) == -1 && strstr(err, "entry 5"));
    copy.step[5] = h.step[5];
    copy.layout[8 * 1 + 2] = 1;                          /* padding is not zero */
    CHECK(layout_history_check(&copy, err, sizeof err) == -1 &&
          strstr(err, "entry 1 (2 stages) is not a layout of 8 blocks"));
    copy.layout[8 * 1 + 2] = 0;
    copy.stages[0] = 0;
    CHECK(layout_history_check(&copy, err, sizeof err) == -1 && strstr(err, "entry 0"));
    layout_history_free(&copy);
    layout_history_free(&h);
    CHECK(h.count == 0 && h.step == NULL);
    layout_history_free(&h);                             /* harmless twice */
}

/* ---- names, listing, prune, publish -------------------------------------------------- */

static void test_names(void)
{
    char buf[256];
    ckpt_path(buf, sizeof buf, "/d", 120);
    CHECK(!strcmp(buf, "/d/ckpt-120.h5"));
    ckpt_tmp_path(buf, sizeof buf, "/d", 120);
    CHECK(!strcmp(buf, "/d/ckpt-120.h5.tmp"));
    CHECK(ckpt_is_temporary_name(buf) && !ckpt_is_temporary_name("/d/ckpt-120.h5"));
    CHECK(ckpt_dir_parse_name("ckpt-120.h5", 0) == 120);
    CHECK(ckpt_dir_parse_name("ckpt-0.h5", 0) == 0);
    CHECK(ckpt_dir_parse_name("ckpt-120.h5.tmp", 1) == 120);
    CHECK(ckpt_dir_parse_name("ckpt-120.h5.tmp", 0) == -1);
    CHECK(ckpt_dir_parse_name("ckpt-120.h5", 1) == -1);
    const char *bad[] = {"ckpt-.h5", "ckpt--1.h5", "ckpt-1x.h5", "ckpt-1.h5x", "latest",
                         "xckpt-1.h5", "ckpt-1234567890123456789.h5"};
    for (size_t i = 0; i < sizeof bad / sizeof *bad; i++)
        CHECK_MSG(ckpt_dir_parse_name(bad[i], 0) == -1, "%s parsed", bad[i]);
}

static void test_list_and_prune(void)
{
    char dir[600], path[700];
    snprintf(dir, sizeof dir, "%s/prune", root);
    CHECK(dm_make_dirs(dir, NULL, 0) == 0);
    const char *names[] = {"ckpt-1.h5", "ckpt-20.h5", "ckpt-3.h5", "ckpt-4.h5", "ckpt-5.h5",
                           "ckpt-30.h5", "ckpt-6.h5.tmp", "ckpt-2.h5.tmp", "latest",
                           "ckpt-7.h5.bak", "notes.txt"};
    for (size_t i = 0; i < sizeof names / sizeof *names; i++) touch(dir, names[i]);
    long *steps;
    int n = ckpt_dir_list_steps(dir, 0, &steps);
    long want[] = {30, 20, 5, 4, 3, 1};
    CHECK(n == 6);
    for (int i = 0; i < n && n == 6; i++) CHECK_MSG(steps[i] == want[i], "steps[%d] = %ld", i,
                                                    steps[i]);
    dm_free(steps);
    n = ckpt_dir_list_steps(dir, 1, &steps);
    CHECK(n == 2 && steps[0] == 6 && steps[1] == 2);
    dm_free(steps);
    snprintf(path, sizeof path, "%s/missing", root);
    CHECK(ckpt_dir_list_steps(path, 0, &steps) == -1 && steps == NULL);

    /* keep 2 after step 20: 20 and 5 stay, 30 (a newer run's) stays. */
    ckpt_dir_prune(dir, 2, 20);
    n = ckpt_dir_list_steps(dir, 0, &steps);
    CHECK(n == 3 && steps[0] == 30 && steps[1] == 20 && steps[2] == 5);
    dm_free(steps);
    CHECK(ckpt_dir_list_steps(dir, 1, &steps) == 0);
    dm_free(steps);
    snprintf(path, sizeof path, "%s/notes.txt", dir);
    CHECK(exists(path));
    ckpt_dir_prune(dir, 0, 30);                          /* keep <= 0: all */
    CHECK(ckpt_dir_list_steps(dir, 0, &steps) == 3);
    dm_free(steps);
}

static void test_prepare_and_publish(void)
{
    char dir[600], path[700], err[1024] = "";
    snprintf(dir, sizeof dir, "%s/run/ck", root);
    CHECK_MSG(ckpt_dir_prepare(dir, 10, err, sizeof err) == 0, "%s", err);
    touch(dir, "ckpt-10.h5.tmp");
    CHECK(ckpt_dir_prepare(dir, 10, err, sizeof err) == 0);
    snprintf(path, sizeof path, "%s/ckpt-10.h5.tmp", dir);
    CHECK(!exists(path));                                /* the stale .tmp is gone */

    touch(dir, "ckpt-10.h5.tmp");
    CHECK_MSG(ckpt_dir_publish(dir, 1, 10, err, sizeof err) == 0, "%s", err);
    snprintf(path, sizeof path, "%s/ckpt-10.h5", dir);
    CHECK(testing_file_holds(path, "ckpt-10.h5.tmp"));           /* the .tmp's bytes, renamed */
    snprintf(path, sizeof path, "%s/ckpt-10.h5.tmp", dir);
    CHECK(!exists(path));
    snprintf(path, sizeof path, "%s/latest", dir);
    CHECK(testing_file_holds(path, "ckpt-10.h5\n"));
    touch(dir, "ckpt-20.h5.tmp");
    CHECK(ckpt_dir_publish(dir, 1, 20, err, sizeof err) == 0);
    CHECK(testing_file_holds(path, "ckpt-20.h5\n"));
    snprintf(path, sizeof path, "%s/ckpt-10.h5", dir);
    CHECK(!exists(path));                                /* keep = 1 */

    /* Nothing to publish: an error naming the .tmp; latest unchanged. */
    err[0] = '\0';
    CHECK(ckpt_dir_publish(dir, 1, 30, err, sizeof err) == -1);
    CHECK_MSG(strstr(err, "ckpt-30.h5.tmp") != NULL, "'%s'", err);
    snprintf(path, sizeof path, "%s/latest", dir);
    CHECK(testing_file_holds(path, "ckpt-20.h5\n"));

    /* A regular file in the way of the directory. */
    snprintf(path, sizeof path, "%s/latest/sub", dir);
    err[0] = '\0';
    CHECK(ckpt_dir_prepare(path, 10, err, sizeof err) == -1);
    CHECK_MSG(strstr(err, "cannot create the checkpoint directory") && strstr(err, path) &&
              strstr(err, strerror(ENOTDIR)), "'%s'", err);
}

static void test_next_world(void)
{
    char dir[600], path[700], err[1024] = "";
    snprintf(dir, sizeof dir, "%s/run/ck", root);
    CHECK_MSG(ckpt_write_next_world(dir, 3, 2, (int[]){2, 3, 3}, 40, err, sizeof err) == 0,
              "%s", err);
    snprintf(path, sizeof path, "%s/next_world", dir);
    CHECK(testing_file_holds(path, "# written by dynmo " DYNMO_VERSION " on re-pack: the next world "
                           "of this job chain\nranks = 6\npp = 3\ndp = 2\nlayout = 2,3,3\n"
                           "step = 40\ncheckpoint = ckpt-40.h5\n"));
    snprintf(path, sizeof path, "%s/next_world.tmp", dir);
    CHECK(!exists(path));
    CHECK(ckpt_write_next_world(dir, 1, 1, (int[]){8}, 0, err, sizeof err) == 0);
    snprintf(path, sizeof path, "%s/next_world", dir);
    CHECK(testing_file_holds(path, "# written by dynmo " DYNMO_VERSION " on re-pack: the next world "
                           "of this job chain\nranks = 1\npp = 1\ndp = 1\nlayout = 8\n"
                           "step = 0\ncheckpoint = ckpt-0.h5\n"));
    snprintf(path, sizeof path, "%s/latest/sub", dir);   /* latest is a file */
    err[0] = '\0';
    CHECK(ckpt_write_next_world(path, 1, 1, (int[]){8}, 0, err, sizeof err) == -1);
    CHECK_MSG(strstr(err, path) != NULL, "'%s'", err);
}

int main(void)
{
    const char *base = getenv("TMPDIR") ? getenv("TMPDIR") : "/tmp";
    snprintf(root, sizeof root, "%s/dynmo-test-ckpt-dir.XXXXXX", base);
    if (!mkdtemp(root)) {
        fprintf(stderr, "mkdtemp %s: %s\n", root, strerror(errno));
        return 1;
    }
    test_history();
    test_names();
    test_list_and_prune();
    test_prepare_and_publish();
    test_next_world();
    nftw(root, remove_entry, 16, FTW_DEPTH | FTW_PHYS);
    return testing_report("test_ckpt_dir");
}
