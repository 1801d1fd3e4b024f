/* The ops' backwards split into input gradient and weight gradient, for the
 * zero-bubble schedule: each half is the whole backward (ops.c) asked for
 * only its own outputs, so the halves compute the same bits as the whole.
 * Must not: compute anything of its own (a second implementation would
 * drift from ops.c's summation orders). */
#include <stddef.h>
#include "dynmo/model.h"

void matmul_backward_input(float *dinp, const float *dout, const float *weight,
                           int N, int C, int OC)
{
    matmul_backward_overwrite(dinp, NULL, NULL, dout, NULL, weight, N, C, OC);
}

void matmul_backward_weight(float *dweight, float *dbias, const float *dout,
                            const float *inp, int N, int C, int OC)
{
    matmul_backward(NULL, dweight, dbias, dout, inp, NULL, N, C, OC);
}

void layernorm_backward_input(float *dinp, const float *dout, const float *inp,
                              const float *weight, const float *mean, const float *rstd,
                              int N, int C)
{
    layernorm_backward(dinp, NULL, NULL, dout, inp, weight, mean, rstd, N, C);
}

void layernorm_backward_weight(float *dweight, float *dbias, const float *dout,
                               const float *inp, const float *mean, const float *rstd,
                               int N, int C)
{
    layernorm_backward(NULL, dweight, dbias, dout, inp, NULL, mean, rstd, N, C);
}
