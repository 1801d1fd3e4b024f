/* One input of a token stream (src/model/data.c): a file, or a Megatron
 * dataset's index and data pair, opened by token_formats.c. Private to
 * src/model; the formats are in docs/data.md. */
#ifndef DYNMO_MODEL_TOKEN_INPUT_H
#define DYNMO_MODEL_TOKEN_INPUT_H

#include <stddef.h>
#include <stdint.h>
#include "dynmo/core.h"

/* A failed check of a token input (data.c, token_formats.c): its message
 * into the caller's err, then its common way out, a label fail. */
#define TOKEN_FAIL(...)                            \
    do {                                           \
        dm_set_message(err, errsize, __VA_ARGS__); \
        goto fail;                                 \
    } while (0)

enum token_format { TOKEN_FORMAT_DYNMO, TOKEN_FORMAT_LLMC, TOKEN_FORMAT_MEGATRON,
                    TOKEN_FORMAT_MEMORY };

/* How one token is stored: little-endian, signed or not. */
enum token_dtype { TOKEN_U8, TOKEN_I8, TOKEN_I16, TOKEN_U16, TOKEN_I32, TOKEN_U32, TOKEN_I64 };

struct token_input {
    char name[1024];             /* the file, or a Megatron dataset's prefix */
    enum token_format format;
    enum token_dtype dtype;
    int item_bytes;
    const unsigned char *tokens; /* (count) items of dtype, in map (or the caller's memory) */
    uint64_t count;
    uint32_t bound;              /* every token is below this */
    uint64_t hash;               /* identifies the tokens (token_input_open) */
    /* Megatron only, views into index_map (little-endian int64, any alignment) */
    const unsigned char *pointers;   /* (sequences) byte offset of each sequence in .bin */
    const unsigned char *document_index; /* (documents + 1) first sequence of each document,
                                            then the sequence count */
    uint64_t sequences, documents;       /* documents: 1 for every other format */
    void *map, *index_map;
    size_t map_bytes, index_map_bytes;
    /* where it sits in the stream, set by data.c */
    uint64_t first, span;
};

/* Opens `name` (a regular file, or the prefix of a Megatron dataset when
 * name itself does not exist), detects its format from its first bytes,
 * maps it and checks it whole: the header, the sizes, every token >= 0
 * and below model_vocab (a dynmo file: below its header's vocab, which
 * must not exceed model_vocab). 0, or -1 with one line naming the file
 * and what is wrong (with its byte offset) in err and in empty. */
int token_input_open(struct token_input *in, const char *name, uint32_t model_vocab,
                     char *err, size_t errsize);
void token_input_close(struct token_input *in);

/* out[0..n) = tokens [first, first + n) of in (n small: a window). */
void token_input_decode(int *out, const struct token_input *in, uint64_t first, size_t n);

/* Token index of the first token of document d <= documents (d ==
 * documents: count). */
uint64_t token_input_document_start(const struct token_input *in, uint64_t d);

#endif
