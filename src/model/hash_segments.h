/* Hash attention over sequences of different lengths packed one after the
 * other (the chosen tokens of a mixture-of-depths block, src/model/mod.c):
 * sequence b is rows [start[b], start[b+1]) of the block's activations,
 * start (B + 1), start[B] the rows in all. Each sequence is hashed and
 * attended on its own, as hash_block_attention_forward does a (B, T)
 * batch, with the block's rotation of this step; the tiles visited add to
 * blk->hash_tiles. Private to src/model. */
#ifndef DYNMO_MODEL_HASH_SEGMENTS_H
#define DYNMO_MODEL_HASH_SEGMENTS_H

#include "dynmo/model.h"

void hash_block_attention_forward_segments(struct block *blk, struct block_acts *acts,
                                           const int *start, int B);
/* dqkv (start[B], 3C) overwritten from datty (start[B], C). */
void hash_block_attention_backward_segments(struct block *blk, struct block_acts *acts,
                                            float *dqkv, const float *datty, const int *start,
                                            int B);

#endif
