/* A vectorizable exponential and the row reductions built on it, for the
 * softmax-like kernels of src/model (ops.c's attention, cross-entropy and
 * sigmoid, group_attention.c): a few ulp, no
 * libm call, so gcc vectorizes loops over it without -ffast-math; the
 * sums go into LANES fixed partial sums added in a fixed order, so no
 * result depends on the vector width or the thread count. Private to
 * src/model; everything here is static inline. */
#ifndef DYNMO_MODEL_EXP_LANES_H
#define DYNMO_MODEL_EXP_LANES_H

#include <math.h>
#include <stdint.h>

enum { EXP_LANES = 16 };

/* exp(x) to about 2 ulp for x in [-87.3, 88.3]; 0 below, saturates above:
 * Cody-Waite reduction x = n ln2 + r, a degree-7 Taylor polynomial, 2^n
 * built in the exponent bits. */
static inline float exp_lanes(float x)
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

static inline float max_lanes(const float *x, long n)
{
    float lane[EXP_LANES];
    for (int k = 0; k < EXP_LANES; k++) lane[k] = -INFINITY;
    long i = 0;
    for (; i + EXP_LANES <= n; i += EXP_LANES)
        for (int k = 0; k < EXP_LANES; k++) lane[k] = x[i + k] > lane[k] ? x[i + k] : lane[k];
    for (int k = 0; i < n; i++, k++) lane[k] = x[i] > lane[k] ? x[i] : lane[k];
    float m = lane[0];
    for (int k = 1; k < EXP_LANES; k++) m = lane[k] > m ? lane[k] : m;
    return m;
}

/* x[i] = exp(x[i] - shift); returns the sum of the results. */
static inline float exp_shifted_lanes(float *x, long n, float shift)
{
    float lane[EXP_LANES] = {0};
    long i = 0;
    for (; i + EXP_LANES <= n; i += EXP_LANES)
        for (int k = 0; k < EXP_LANES; k++) {
            float e = exp_lanes(x[i + k] - shift);
            x[i + k] = e;
            lane[k] += e;
        }
    for (int k = 0; i < n; i++, k++) {
        float e = exp_lanes(x[i] - shift);
        x[i] = e;
        lane[k] += e;
    }
    float s = 0.0f;
    for (int k = 0; k < EXP_LANES; k++) s += lane[k];
    return s;
}

#endif
