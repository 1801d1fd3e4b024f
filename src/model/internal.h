/* Helpers shared by the files of src/model and by nothing else. */
#ifndef DYNMO_MODEL_INTERNAL_H
#define DYNMO_MODEL_INTERNAL_H

#include <stddef.h>
#include <stdint.h>

/* out[i] = std * dm_normal(seed, stream, i) for i in [0, n), in parallel. */
void init_normal(float *out, size_t n, uint64_t seed, uint64_t stream, float std);

/* dst[0..n) = src[0..n), in parallel. */
void parallel_copy(float *dst, const float *src, long n);

/* dst[0..n) = 0, in parallel. */
void parallel_zero(float *dst, long n);

#endif
