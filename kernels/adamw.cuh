/* The per-thread arithmetic of the AdamW kernel (adamw.cu): torch's
 * AdamW as src/model/optim.c computes it, element by element with the
 * same constants, so the CPU's bits. */
#ifndef DYNMO_KERNELS_ADAMW_CUH
#define DYNMO_KERNELS_ADAMW_CUH

#include "common.cuh"

/* The step's constants, computed on the host in double as optim.c does. */
struct dm_adamw_constants {
    float decay;              /* 1 - lr * weight_decay */
    float beta1, one_minus_beta1, beta2, one_minus_beta2;
    float step_size;          /* lr / (1 - beta1^t) */
    float bias2_sqrt;         /* sqrt(1 - beta2^t) */
    float eps, grad_scale;
};

static inline struct dm_adamw_constants dm_adamw_constants_make(
    float lr, float beta1, float beta2, float eps, float weight_decay, float grad_scale, int t)
{
    struct dm_adamw_constants k;
    k.decay = (float)(1.0 - (double)lr * weight_decay);
    k.beta1 = beta1;
    k.one_minus_beta1 = (float)(1.0 - beta1);
    k.beta2 = beta2;
    k.one_minus_beta2 = (float)(1.0 - beta2);
    k.step_size = (float)(lr / (1.0 - pow(beta1, t)));
    k.bias2_sqrt = (float)sqrt(1.0 - pow(beta2, t));
    k.eps = eps;
    k.grad_scale = grad_scale;
    return k;
}

DM_HD void adamw_update_thread(struct dm_thread t, float *params, const float *grads,
                               float *m, float *v, long n, struct dm_adamw_constants k)
{
    for (long i = dm_thread_first(t); i < n; i += dm_thread_stride(t)) {
        float grad = grads[i] * k.grad_scale;
        m[i] = m[i] * k.beta1 + grad * k.one_minus_beta1;
        v[i] = v[i] * k.beta2 + (grad * grad) * k.one_minus_beta2;
        float denom = sqrtf(v[i]) / k.bias2_sqrt + k.eps;
        params[i] = params[i] * k.decay - k.step_size * (m[i] / denom);
    }
}

#endif
