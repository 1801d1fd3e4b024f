/* The operand precision of the matrix products (train.precision,
 * docs/gpu.md): an fp32 value rounded to what the tensor cores multiply,
 * one element at a time. The CUDA plugin's conversion kernel (matmul.cu)
 * writes bf16 operands with it; the emulated device (emulate.c) rounds
 * copies of both operands with it before CBLAS; tests/test_kernels_host.c
 * checks it. Only the operands are rounded: the products accumulate in
 * fp32 and land in fp32. Nothing else of the model may use it. */
#ifndef DYNMO_KERNELS_PRECISION_CUH
#define DYNMO_KERNELS_PRECISION_CUH

#include "common.cuh"
#include "dynmo/backend.h"

/* The mantissa bits each precision drops from fp32's 23: TF32 keeps 10,
 * bf16 keeps 7. */
enum { DM_TF32_DROPPED_BITS = 13, DM_BF16_DROPPED_BITS = 16 };

DM_HD uint32_t dm_float_bits(float x)
{
    union { float f; uint32_t u; } v;
    v.f = x;
    return v.u;
}

DM_HD float dm_bits_float(uint32_t u)
{
    union { float f; uint32_t u; } v;
    v.u = u;
    return v.f;
}

/* fp32 bits with the low `dropped` mantissa bits cleared, rounded to
 * nearest, ties to even (0 < dropped < 23). A NaN stays a NaN (quiet,
 * its sign kept: its payload might otherwise round to an infinity);
 * infinities stay; a finite value beyond the narrower format's largest
 * becomes an infinity, as IEEE rounding does; subnormals round in the
 * same bits (bf16 and TF32 have fp32's exponent). */
DM_HD uint32_t dm_round_mantissa(uint32_t bits, int dropped)
{
    uint32_t keep = ~((1u << dropped) - 1u);
    if ((bits & 0x7f800000u) == 0x7f800000u && (bits & 0x007fffffu))
        return (bits | 0x00400000u) & keep;
    uint32_t lowest_kept = (bits >> dropped) & 1u;
    return (bits + (1u << (dropped - 1)) - 1u + lowest_kept) & keep;
}

/* x rounded to TF32 (10 mantissa bits), as an fp32 value. cuBLAS does not
 * specify how its TF32 products round their inputs: the emulated device's
 * use of this is an approximation of a GPU's. */
DM_HD float dm_round_tf32(float x)
{
    return dm_bits_float(dm_round_mantissa(dm_float_bits(x), DM_TF32_DROPPED_BITS));
}

/* x rounded to bf16 (7 mantissa bits), as bf16's 16 bits and as fp32 */
DM_HD uint16_t dm_bf16_from_float(float x)
{
    return (uint16_t)(dm_round_mantissa(dm_float_bits(x), DM_BF16_DROPPED_BITS) >> 16);
}

DM_HD float dm_round_bf16(float x)
{
    return dm_bits_float((uint32_t)dm_bf16_from_float(x) << 16);
}

/* x as a product operand of `precision` (enum dm_precision) sees it */
DM_HD float dm_round_operand(float x, int precision)
{
    if (precision == DM_PRECISION_BF16) return dm_round_bf16(x);
    if (precision == DM_PRECISION_TF32) return dm_round_tf32(x);
    return x;
}

/* out[i] = bf16 bits of in[i], i < n (the plugin's conversion kernel) */
DM_HD void precision_to_bf16_thread(struct dm_thread t, uint16_t *out, const float *in, long n)
{
    for (long i = dm_thread_first(t); i < n; i += dm_thread_stride(t))
        out[i] = dm_bf16_from_float(in[i]);
}

/* out[i] = in[i] rounded as `precision`'s operands, i < n (the emulated
 * device's copies) */
DM_HD void precision_round_thread(struct dm_thread t, float *out, const float *in, long n,
                                  int precision)
{
    for (long i = dm_thread_first(t); i < n; i += dm_thread_stride(t))
        out[i] = dm_round_operand(in[i], precision);
}

#endif
