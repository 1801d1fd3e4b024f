/* The per-thread arithmetic of the embedding kernels (encoder.cu). The
 * forward writes each element once; the backward gives each column of
 * dwte and dwpe to one thread that walks the tokens in order (tokens
 * repeat: no atomics), the CPU's order, so the CPU's bits. */
#ifndef DYNMO_KERNELS_ENCODER_CUH
#define DYNMO_KERNELS_ENCODER_CUH

#include "common.cuh"

/* out[b,t,:] = wte[tokens[b,t],:] + wpe[t,:], one element per step */
DM_HD void encoder_forward_thread(struct dm_thread t, float *out, const int *tokens,
                                  const float *wte, const float *wpe, int B, int T, int C)
{
    long total = (long)B * T * C;
    for (long e = dm_thread_first(t); e < total; e += dm_thread_stride(t)) {
        long n = e / C, c = e % C;
        out[e] = wte[(long)tokens[n] * C + c] + wpe[(n % T) * C + c];
    }
}

/* one column c per step: dwte[tokens[n], c] += dout[n, c] and
 * dwpe[n % T, c] += dout[n, c] for n = 0, 1, .. in order */
DM_HD void encoder_backward_thread(struct dm_thread t, float *dwte, float *dwpe,
                                   const float *dout, const int *tokens, int B, int T, int C)
{
    long N = (long)B * T;
    for (long c = dm_thread_first(t); c < C; c += dm_thread_stride(t))
        for (long n = 0; n < N; n++) {
            float d = dout[n * C + c];
            dwte[(long)tokens[n] * C + c] += d;
            dwpe[(n % T) * C + c] += d;
        }
}

#endif
