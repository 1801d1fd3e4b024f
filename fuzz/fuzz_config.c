/* libFuzzer harness of the INI config parser: config_parse_text, the code
 * behind `--config FILE` (config_load_file reads the file and hands its
 * bytes to it). The input is a config file's contents.
 *
 * It must not copy the parser or relax it: it calls the real function and
 * checks what every caller relies on. A parse that fails says so in a
 * message that names the file and a line; one that succeeds leaves every
 * string key NUL-terminated inside its field (config_print reads them). */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "dynmo/core.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

#define NAME "fuzz.ini"

static void field_terminated(const char *field, size_t size, const char *key)
{
    if (!memchr(field, 0, size)) {
        fprintf(stderr, "fuzz_config: %s is not NUL-terminated after a successful parse\n", key);
        abort();
    }
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    struct dm_config cfg;
    config_defaults(&cfg);
    char err[4096] = "";
    int status = config_parse_text(&cfg, (const char *)data, size, NAME, err, sizeof err);
    if (status != 0) {
        if (status != -1 || strncmp(err, NAME ":", strlen(NAME ":")) != 0) {
            fprintf(stderr, "fuzz_config: failure %d without a message naming the file: '%s'\n",
                    status, err);
            abort();
        }
        return 0;
    }
    field_terminated(cfg.train_path, sizeof cfg.train_path, "data.train");
    field_terminated(cfg.val_path, sizeof cfg.val_path, "data.val");
    field_terminated(cfg.out_dir, sizeof cfg.out_dir, "run.out_dir");
    field_terminated(cfg.schedule, sizeof cfg.schedule, "parallel.schedule");
    field_terminated(cfg.initial, sizeof cfg.initial, "balance.initial");
    field_terminated(cfg.method, sizeof cfg.method, "balance.method");
    field_terminated(cfg.cost, sizeof cfg.cost, "balance.cost");
    field_terminated(cfg.ckpt_dir, sizeof cfg.ckpt_dir, "ckpt.dir");
    field_terminated(cfg.resume, sizeof cfg.resume, "ckpt.resume");
    field_terminated(cfg.dyn_kind, sizeof cfg.dyn_kind, "dyn.kind");
    field_terminated(cfg.exit_confidence, sizeof cfg.exit_confidence, "dyn.exit_confidence");
    static char printed[1 << 15];
    config_print(&cfg, printed, sizeof printed);
    return 0;
}
