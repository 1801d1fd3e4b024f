/* Hash-sparse attention (src/dyn/hash.c): the random rotation that puts a
 * block's queries and keys into groups (the op table's group_attention_*).
 * Private to src/dyn and tests. */
#ifndef DYNMO_DYN_HASH_H
#define DYNMO_DYN_HASH_H

#include <stdint.h>

/* rotation (NH, hs, nb/2) = N(0,1) draws that depend only on (seed, layer,
 * step), never on the layout, the rank count or timing, each column (hs
 * values) then divided by its norm. Nothing for nb = 1. */
void hash_rotation_draw(float *rotation, int NH, int hs, int buckets, uint64_t seed, int layer,
                        long step);

#endif
