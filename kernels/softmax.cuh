/* The per-thread arithmetic of the softmax kernels (softmax.cu): the
 * fused softmax cross-entropy of the loss, and the causal row softmax of
 * attention, forward and backward. One block per row; the phases sit
 * around tree reductions (max, then sum). Rows of the causal softmax
 * are (B, NH, T, T) as attention's att: row r is query r % T and sees
 * keys 0 .. r % T; every other column is written 0. */
#ifndef DYNMO_KERNELS_SOFTMAX_CUH
#define DYNMO_KERNELS_SOFTMAX_CUH

#include "common.cuh"

/* most[thread] = max of this thread's share of row[0 .. valid) */
DM_HD void softmax_max_phase(struct dm_thread t, float *most, const float *row, int valid)
{
    float m = -INFINITY;
    for (int i = t.thread; i < valid; i += t.threads) m = row[i] > m ? row[i] : m;
    most[t.thread] = m;
}

/* out[i] = exp(row[i] - most[0]) for i < valid; sum[thread] its share */
DM_HD void softmax_exp_phase(struct dm_thread t, float *sum, const float *most, float *out,
                             const float *row, int valid)
{
    float s = 0.0f;
    for (int i = t.thread; i < valid; i += t.threads) {
        float e = dm_exp_accurate(row[i] - most[0]);
        out[i] = e;
        s += e;
    }
    sum[t.thread] = s;
}

/* out[i] /= sum[0] below valid, 0 from valid to width */
DM_HD void softmax_normalize_phase(struct dm_thread t, float *out, const float *sum, int valid,
                                   int width)
{
    float inv = 1.0f / sum[0];
    for (int i = t.thread; i < width; i += t.threads) out[i] = i < valid ? out[i] * inv : 0.0f;
}

/* cross-entropy forward, row t.block of (N, V): the three phases above on
 * the logits into probs, then thread 0 writes the loss -log p[target] */
DM_HD void crossentropy_loss_phase(struct dm_thread t, float *losses, const float *most,
                                   const float *sum, const float *logits, const int *targets,
                                   int V)
{
    if (t.thread != 0) return;
    const float *l = logits + t.block * V;
    int target = targets[t.block];
    losses[t.block] = (float)(log((double)sum[0]) - (double)(l[target] - most[0]));
}

/* dlogits = (probs - onehot(target)) * scale, one element per step;
 * dlogits may be probs */
DM_HD void crossentropy_backward_thread(struct dm_thread t, float *dlogits, const float *probs,
                                        const int *targets, float scale, int N, int V)
{
    for (long e = dm_thread_first(t); e < (long)N * V; e += dm_thread_stride(t)) {
        long n = e / V, i = e % V;
        float p = probs[e];
        dlogits[e] = (i == targets[n] ? p - 1.0f : p) * scale;
    }
}

/* causal softmax backward, row t.block of (rows, T): dot[thread] = this
 * thread's share of sum_j p_j d_j over the valid keys */
DM_HD void attention_softmax_backward_dot_phase(struct dm_thread t, float *dot, const float *att,
                                                const float *dscores, int T)
{
    const float *p = att + t.block * T, *d = dscores + t.block * T;
    int valid = (int)(t.block % T) + 1;
    float s = 0.0f;
    for (int j = t.thread; j < valid; j += t.threads) s += p[j] * d[j];
    dot[t.thread] = s;
}

/* d = scale p (d - dot[0]) for the valid keys, 0 for the rest, in place */
DM_HD void attention_softmax_backward_phase(struct dm_thread t, float *dscores, const float *dot,
                                            const float *att, float scale, int T)
{
    const float *p = att + t.block * T;
    float *d = dscores + t.block * T;
    int valid = (int)(t.block % T) + 1;
    for (int j = t.thread; j < T; j += t.threads)
        d[j] = j < valid ? scale * (p[j] * (d[j] - dot[0])) : 0.0f;
}

#endif
