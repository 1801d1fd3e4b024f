/* What every kernel of the CUDA backend shares: the per-thread view of a
 * launch, the block reductions, and the exponential of the CPU ops.
 *
 * Each kernel's arithmetic is written as DM_HD functions of an explicit
 * struct dm_thread (block and thread index, grid and block size) instead
 * of CUDA's built-in indices, so that the same functions compile for the
 * device (nvcc, the .cu files here) and for the host (gcc, the tests' grid
 * harness in tests/test_kernels_host.c, which runs every block and thread
 * of a launch in a loop). A kernel that needs __syncthreads is cut into
 * phases at each barrier; the harness runs a phase for every thread of a
 * block before the next phase. Within a phase a thread writes only what
 * no other thread of that phase reads, so the order of the threads does
 * not matter (the harness checks: forward and reverse give the same bits).
 *
 * Plain C that is also C++: no designated initializers, no C-only
 * keywords. Reductions never use atomics: a block reduces in a fixed tree,
 * a column reduction is one thread walking the rows in order. */
#ifndef DYNMO_KERNELS_COMMON_CUH
#define DYNMO_KERNELS_COMMON_CUH

#include <math.h>
#include <stdint.h>

#ifdef __CUDACC__
#define DM_HD __host__ __device__ static inline
#else
#define DM_HD static inline
#endif

/* Threads per block of every launch of the plugin (a power of two: the
 * tree reductions halve it); the host tests run blocks of this size and
 * of a smaller one. */
enum { DM_BLOCK_THREADS = 256 };

/* One thread of a one-dimensional launch: blocks x threads. */
struct dm_thread {
    long block, blocks;
    int thread, threads;
};

DM_HD struct dm_thread dm_thread_at(long block, long blocks, int thread, int threads)
{
    struct dm_thread t;
    t.block = block;
    t.blocks = blocks;
    t.thread = thread;
    t.threads = threads;
    return t;
}

/* The grid-stride loop of an element-wise kernel: first index and step. */
DM_HD long dm_thread_first(struct dm_thread t)
{
    return t.block * t.threads + t.thread;
}

DM_HD long dm_thread_stride(struct dm_thread t)
{
    return t.blocks * t.threads;
}

/* One level of a block's tree reduction over shared[0 .. 2 stride):
 * thread i < stride combines element i + stride into element i. Run for
 * stride = threads/2, threads/4, .., 1 with a barrier after each level
 * (threads a power of two); the result is in shared[0]. */
DM_HD void dm_tree_sum_step(float *shared, int thread, int stride)
{
    if (thread < stride) shared[thread] += shared[thread + stride];
}

DM_HD void dm_tree_max_step(float *shared, int thread, int stride)
{
    if (thread < stride && shared[thread + stride] > shared[thread])
        shared[thread] = shared[thread + stride];
}

/* exp(x) to about 2 ulp, the same arithmetic as src/model/ops.c's
 * exp_accurate (Cody-Waite reduction, degree-7 polynomial, 2^n in the
 * exponent bits). Built without contraction on both sides (gcc
 * -ffp-contract=off, nvcc --fmad=false), it gives the CPU's bits. */
DM_HD float dm_exp_accurate(float x)
{
    const float log2e = 1.44269504088896341f;
    const float ln2_hi = 0.693359375f;
    const float ln2_lo = -2.12194440e-4f;
    const float shifter = 12582912.0f;
    float xc = x > 88.3f ? 88.3f : x;
    xc = xc < -87.3f ? -87.3f : xc;
    float t = xc * log2e + shifter;
    float n = t - shifter;
    float r = xc - n * ln2_hi;
    r = r - n * ln2_lo;
    float p = 1.0f / 5040.0f;
    p = p * r + 1.0f / 720.0f;
    p = p * r + 1.0f / 120.0f;
    p = p * r + 1.0f / 24.0f;
    p = p * r + 1.0f / 6.0f;
    p = p * r + 0.5f;
    p = p * r + 1.0f;
    p = p * r + 1.0f;
    union { int32_t i; float f; } scale;
    scale.i = ((int32_t)n + 127) << 23;
    float result = p * scale.f;
    return x < -87.3f ? 0.0f : result;
}

#ifdef __CUDACC__
/* The calling thread of a kernel, and a whole tree reduction with its
 * barriers (device side only; the harness loops instead). */
#define DM_THREAD_HERE dm_thread_at(blockIdx.x, gridDim.x, threadIdx.x, blockDim.x)

__device__ static inline void dm_block_sum(float *shared)
{
    for (int stride = blockDim.x / 2; stride > 0; stride /= 2) {
        dm_tree_sum_step(shared, threadIdx.x, stride);
        __syncthreads();
    }
}

__device__ static inline void dm_block_max(float *shared)
{
    for (int stride = blockDim.x / 2; stride > 0; stride /= 2) {
        dm_tree_max_step(shared, threadIdx.x, stride);
        __syncthreads();
    }
}

/* Blocks for an element-wise launch of n items at `threads` per block,
 * capped (the grid-stride loop covers the rest). */
static inline unsigned dm_grid_for(long n, int threads)
{
    long blocks = (n + threads - 1) / threads;
    if (blocks < 1) blocks = 1;
    return (unsigned)(blocks < 65535 ? blocks : 65535);
}
#endif
#endif
