/* libFuzzer harness of the token-file readers: token_file_try_open, which
 * `dynmo train` and token_file_open call on a path. The input is a file's
 * contents (a dynmo token file, an llm.c shard, or anything else); the
 * harness writes it to one temporary file (in $TMPDIR, default /dev/shm
 * when it exists, else /tmp) and opens that, so that the readers' own
 * detection, open, fstat and mmap all run.
 *
 * It checks the readers' contract: a failure is -1 with a message naming
 * the file and tf empty; a success holds at least one token, every token
 * is below the stream's vocab, and that vocab is not above the model's. */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include "dynmo/model.h"

int LLVMFuzzerInitialize(int *argc, char ***argv);
int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

#define MODEL_VOCAB 131072   /* Llama 3's 128,256 ids fit: the llm.c seeds open */

static char path[1024];
static int fd = -1;

__attribute__((noreturn)) static void broken(const char *what)
{
    fprintf(stderr, "fuzz_tokens: %s\n", what);
    abort();
}

static void remove_temporary(void)
{
    if (fd >= 0) close(fd);
    unlink(path);
}

int LLVMFuzzerInitialize(int *argc, char ***argv)
{
    (void)argc;
    (void)argv;
    const char *dir = getenv("TMPDIR");
    if (!dir || !*dir) dir = access("/dev/shm", W_OK) == 0 ? "/dev/shm" : "/tmp";
    snprintf(path, sizeof path, "%s/dynmo-fuzz-tokens.XXXXXX", dir);
    fd = mkstemp(path);
    if (fd < 0) broken("cannot create the temporary token file");
    atexit(remove_temporary);
    return 0;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    if (fd < 0) LLVMFuzzerInitialize(NULL, NULL);
    if (ftruncate(fd, 0) != 0 || (size > 0 && pwrite(fd, data, size, 0) != (ssize_t)size))
        broken("cannot write the temporary token file");
    struct token_file tf;
    char err[2048] = "";
    int status = token_file_try_open(&tf, path, MODEL_VOCAB, -1, 1, err, sizeof err);
    if (status != 0) {
        if (status != -1 || !strstr(err, path)) broken("a failure without a message naming the file");
        if (tf.inputs || tf.input_count || tf.count) broken("a failure left an input behind");
        return 0;
    }
    if (tf.count == 0 || tf.input_count != 1) broken("a success without tokens");
    if (tf.vocab == 0 || tf.vocab > MODEL_VOCAB) broken("a success with an impossible vocab");
    enum { CHUNK = 4096 };
    static int tokens[CHUNK];
    for (uint64_t first = 0; first < tf.count; first += CHUNK) {
        size_t n = tf.count - first < CHUNK ? (size_t)(tf.count - first) : CHUNK;
        token_file_read(&tf, first, n, tokens);
        for (size_t i = 0; i < n; i++)
            if (tokens[i] < 0 || (uint32_t)tokens[i] >= tf.vocab)
                broken("a success with a token not below the vocab");
    }
    token_file_close(&tf);
    return 0;
}
