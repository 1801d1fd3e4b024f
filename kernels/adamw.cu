/* The AdamW kernel of the CUDA backend: adamw.cuh's arithmetic with the
 * constants computed on the host in double as src/model/optim.c does. */
#include "adamw.cuh"
#include "plugin.h"

__global__ void adamw_update_kernel(float *params, const float *grads, float *m, float *v,
                                    long n, struct dm_adamw_constants k)
{
    adamw_update_thread(DM_THREAD_HERE, params, grads, m, v, n, k);
}

void cuda_adamw_update(float *params, const float *grads, float *m, float *v, long n, float lr,
                       float beta1, float beta2, float eps, float weight_decay,
                       float grad_scale, int t)
{
    struct dm_adamw_constants k = dm_adamw_constants_make(lr, beta1, beta2, eps, weight_decay,
                                                          grad_scale, t);
    adamw_update_kernel<<<dm_grid_for(n, DM_CUDA_THREADS), DM_CUDA_THREADS, 0,
                          dm_cuda_stream()>>>(params, grads, m, v, n, k);
    LAUNCH_CHECK(adamw_update_kernel);
}
