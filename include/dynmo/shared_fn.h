/* DM_SHARED_FN: a function of a header that both the CPU ops (gcc) and
 * the CUDA plugin's kernels (nvcc) include, written once for both
 * (include/dynmo/topk_route.h, exit_confidence.h, mod_predictor.h). Such a
 * header is plain C that is also C++, with no other dynmo header but this
 * one. */
#ifndef DYNMO_SHARED_FN_H
#define DYNMO_SHARED_FN_H

#ifdef __CUDACC__
#define DM_SHARED_FN __host__ __device__ static inline
#else
#define DM_SHARED_FN static inline
#endif

#endif
