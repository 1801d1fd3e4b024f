/* Replays inputs through one fuzz harness without libFuzzer: the main of
 * build/fuzz-replay/<target>, which the normal build links with the
 * harness (fuzz/fuzz_<target>.c) and AddressSanitizer + UBSan, so that
 * tests/t_fuzz_regressions.sh runs every kept crash input through the
 * same code path in `make check`. A crash, a sanitizer report or a
 * harness check ends the process non-zero. */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);
__attribute__((weak)) int LLVMFuzzerInitialize(int *argc, char ***argv);

/* The whole file in a buffer of exactly its size (an over-read is then a
 * sanitizer report); NULL when it cannot be read. */
static unsigned char *read_input(const char *path, size_t *size)
{
    FILE *f = fopen(path, "rb");
    if (!f) return NULL;
    long length = fseek(f, 0, SEEK_END) == 0 ? ftell(f) : -1;
    unsigned char *data = length >= 0 ? malloc(length ? (size_t)length : 1) : NULL;
    if (data && (fseek(f, 0, SEEK_SET) != 0 ||
                 fread(data, 1, (size_t)length, f) != (size_t)length)) {
        free(data);
        data = NULL;
    }
    fclose(f);
    *size = data ? (size_t)length : 0;
    return data;
}

int main(int argc, char **argv)
{
    if (argc < 2) {
        fprintf(stderr, "usage: %s INPUT...\n", argv[0]);
        return 2;
    }
    if (LLVMFuzzerInitialize) LLVMFuzzerInitialize(&argc, &argv);
    for (int i = 1; i < argc; i++) {
        size_t size = 0;
        unsigned char *data = read_input(argv[i], &size);
        if (!data) {
            fprintf(stderr, "replay: cannot read %s\n", argv[i]);
            return 2;
        }
        LLVMFuzzerTestOneInput(data, size);
        free(data);
        printf("ok: %s (%zu bytes)\n", argv[i], size);
    }
    return 0;
}
