/* The learning-rate schedule and AdamW, with torch.optim.AdamW's
 * arithmetic so that a run can be checked step by step against PyTorch.
 * Element-wise and split with dm_parallel_for; each element's update is
 * independent, so the result does not depend on the thread count. */
#include <math.h>
#include "dynmo/backend.h"
#include "dynmo/model.h"

double lr_at_step(const struct dm_config *cfg, int step)
{
    if (step < cfg->warmup) return cfg->lr * (step + 1) / cfg->warmup;
    int span = cfg->steps - cfg->warmup;
    double ratio = (double)(step - cfg->warmup) / (span > 1 ? span : 1);
    double min_lr = cfg->lr * cfg->min_lr_ratio;
    return min_lr + 0.5 * (1.0 + cos(M_PI * ratio)) * (cfg->lr - min_lr);
}

struct adamw_args {
    float *params, *m, *v;
    const float *grads;
    float decay;          /* 1 - lr * weight_decay */
    float beta1, one_minus_beta1, beta2, one_minus_beta2;
    float step_size;      /* lr / (1 - beta1^t) */
    float bias2_sqrt;     /* sqrt(1 - beta2^t) */
    float eps, grad_scale;
};

/* In blocks of ADAMW_BLOCK elements, so that everything but the square
 * root vectorizes: gcc keeps sqrtf scalar under -fmath-errno (the default
 * of -fno-fast-math), and a call inside the loop would stop the rest. */
#define ADAMW_BLOCK 256

static void adamw_range(void *arg, long begin, long end)
{
    const struct adamw_args *a = arg;
    float *restrict p = a->params, *restrict m = a->m, *restrict v = a->v;
    const float *restrict g = a->grads;
    const float scale = a->grad_scale, decay = a->decay, step_size = a->step_size;
    const float b1 = a->beta1, c1 = a->one_minus_beta1, b2 = a->beta2, c2 = a->one_minus_beta2;
    const float bias2_sqrt = a->bias2_sqrt, eps = a->eps;
    float root[ADAMW_BLOCK];
    for (long i0 = begin; i0 < end; i0 += ADAMW_BLOCK) {
        long n = end - i0 < ADAMW_BLOCK ? end - i0 : ADAMW_BLOCK;
        for (long j = 0; j < n; j++) {
            float grad = g[i0 + j] * scale;
            m[i0 + j] = m[i0 + j] * b1 + grad * c1;
            v[i0 + j] = v[i0 + j] * b2 + (grad * grad) * c2;
        }
        for (long j = 0; j < n; j++) root[j] = sqrtf(v[i0 + j]);
        for (long j = 0; j < n; j++) {
            float denom = root[j] / bias2_sqrt + eps;
            p[i0 + j] = p[i0 + j] * decay - step_size * (m[i0 + j] / denom);
        }
    }
}

void adamw_update(float *params, const float *grads, float *m, float *v, long n,
                  float lr, float beta1, float beta2, float eps, float weight_decay,
                  float grad_scale, int t)
{
    struct adamw_args a = {
        .params = params, .m = m, .v = v, .grads = grads,
        .decay = (float)(1.0 - (double)lr * weight_decay),
        .beta1 = beta1, .one_minus_beta1 = (float)(1.0 - beta1),
        .beta2 = beta2, .one_minus_beta2 = (float)(1.0 - beta2),
        .step_size = (float)(lr / (1.0 - pow(beta1, t))),
        .bias2_sqrt = (float)sqrt(1.0 - pow(beta2, t)),
        .eps = eps, .grad_scale = grad_scale,
    };
    dm_parallel_for(n, 4096, adamw_range, &a);
}

void gpt_adamw_update(struct gpt *model, double lr, double beta1, double beta2, double eps,
                      double weight_decay, float grad_scale, int t)
{
    const struct dm_backend *ops = backend_current();
    if (model->wte_grads_pending)
        DM_FATAL("gpt_adamw_update before gpt_tie_wte_grads: the head's share of the tied "
                 "wte gradient is not in dwte yet");
    double clock = dm_profile_now();
    for (int i = 0; i < model->num_blocks; i++) {
        struct block *blk = &model->blocks[i];
        if (blk->frozen) continue;   /* layer freezing: no update at all */
        for (int k = 0; k < block_tensor_count(blk); k++) {
            size_t off, size;
            /* a half block's other half is another stage's to update */
            if (block_is_half(blk) && block_tensor_half(blk, k) != blk->halves) continue;
            double wd = block_tensor_at(blk, k, &off, &size) ? weight_decay : 0.0;
            ops->adamw_update(blk->params + off, blk->grads + off, blk->m + off, blk->v + off,
                              (long)size, (float)lr, (float)beta1, (float)beta2, (float)eps,
                              (float)wd, grad_scale, t);
        }
        gpt_charge_update(model, i, &clock);
    }
    if (!model->embed_slab) return;
    size_t C = (size_t)model->shape.channels, V = (size_t)model->shape.vocab;
    size_t wpe = V * C, lnf = wpe + (size_t)model->shape.max_seq * C;
    float *p = model->wte, *g = model->dwte, *m = model->embed_m, *v = model->embed_v;
    /* wte: both stages that hold it apply the same update to the same
     * (exchanged) gradient, so the copies stay equal. */
    ops->adamw_update(p, g, m, v, (long)wpe, (float)lr, (float)beta1, (float)beta2, (float)eps,
                      (float)weight_decay, grad_scale, t);
    if (model->has_embed && model->frozen_prefix == 0)   /* wpe freezes with block 0 */
        ops->adamw_update(p + wpe, g + wpe, m + wpe, v + wpe, (long)(lnf - wpe), (float)lr,
                          (float)beta1, (float)beta2, (float)eps, (float)weight_decay,
                          grad_scale, t);
    if (model->has_head)
        ops->adamw_update(p + lnf, g + lnf, m + lnf, v + lnf, (long)(2 * C), (float)lr,
                          (float)beta1, (float)beta2, (float)eps, 0.0f, grad_scale, t);
}
