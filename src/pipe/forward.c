/* Forward-only passes of the pipeline over samples the caller names
 * (pipe.h, engine_forward_samples): what `dynmo eval` runs, so that a
 * model split over stages is evaluated by the same blocks, the same
 * transfers and the same layout as training. Each batch goes stage to
 * stage as one message; a stage starts its next batch once its last
 * output has left, so the stages overlap as a forward pipeline. It must
 * not change the model's weights or state, nor keep anything between
 * calls. */
#include <string.h>
#include "pipe/engine_internal.h"

/* Waits for batch's input activations (count samples) from the previous
 * stage into acts->residual. */
static void receive_input(struct engine *eng, struct slot *sl, struct gpt_acts *acts, int count)
{
    const struct pipe_grid *g = &eng->grid;
    size_t n = (size_t)count * eng->T * eng->shape.channels;
    if (eng->pipe_comm) {
        engine_transport_receive(eng, acts->residual, n, g->stage - 1);
        return;
    }
    MPI_Request req;
    float *into = backend_write_begin(sl->recv_host, acts->residual);
    WORLD_MPI(MPI_Irecv(into, (int)n, MPI_FLOAT, rank_of(g, g->stage - 1, g->replica), TAG_ACT,
                        MPI_COMM_WORLD, &req));
    world_wait(&req);
    backend_write_end(acts->residual, into, n * sizeof(float));
}

/* Posts the stage's output of a batch (count samples) to the next stage;
 * sl->send_act completes when it has left. */
static void send_output(struct engine *eng, struct slot *sl, struct gpt_acts *acts, int count)
{
    const struct pipe_grid *g = &eng->grid;
    size_t n = (size_t)count * eng->T * eng->shape.channels;
    const float *out = acts->residual + (size_t)eng->model.num_blocks * n;
    if (eng->pipe_comm) {
        engine_transport_send(eng, out, n, g->stage + 1, 0);
        return;
    }
    const float *from = backend_read(sl->act_host, out, n * sizeof(float));
    WORLD_MPI(MPI_Isend(from, (int)n, MPI_FLOAT, rank_of(g, g->stage + 1, g->replica), TAG_ACT,
                        MPI_COMM_WORLD, &sl->send_act));
}

/* Replica r's batches of `batches`: [*first, *last), contiguous. */
static void replica_batches(long batches, int replicas, int replica, long *first, long *last)
{
    *first = batches * replica / replicas;
    *last = batches * (replica + 1) / replicas;
}

void engine_forward_samples(struct engine *eng, long samples, engine_fill_fn fill, void *ctx,
                            double *sums)
{
    const struct pipe_grid *g = &eng->grid;
    struct gpt *m = &eng->model;
    struct slot *sl = &eng->slots[0];
    int B = eng->micro_B, T = eng->T, rest = (int)(samples % B);
    long batches = (samples + B - 1) / B, first, last;
    replica_batches(batches, g->replicas, g->replica, &first, &last);
    long s0 = first * B, s1 = last * B < samples ? last * B : samples;
    int head = g->stage == g->stages - 1;
    double *mine = dm_alloc((size_t)(s1 > s0 ? s1 - s0 : 1) * sizeof(double));
    struct gpt_acts tail;
    int has_tail = rest && last == batches && first < last;
    if (has_tail) gpt_acts_alloc(&tail, m, rest, T);
    for (long b = first; b < last; b++) {
        int count = (has_tail && b == batches - 1) ? rest : B;
        struct gpt_acts *acts = count == B ? &sl->acts : &tail;
        if (g->stage > 0) receive_input(eng, sl, acts, count);
        if (m->has_embed || m->has_head) {
            int *tokens, *targets;
            gpt_acts_inputs(acts, &tokens, &targets);
            fill(ctx, b * B, count, tokens, targets);
            gpt_acts_inputs_ready(acts);
        }
        world_wait(&sl->send_act);   /* the last output has left: the buffers are free */
        world_compute_begin();
        gpt_forward(m, acts);
        if (!head) {
            send_output(eng, sl, acts, count);
            continue;
        }
        const float *losses = backend_read(acts->losses_host, acts->losses,
                                           (size_t)count * T * sizeof(float));
        for (int k = 0; k < count; k++) {
            double sum = 0.0;
            for (int t = 0; t < T; t++) sum += losses[(size_t)k * T + t];
            mine[b * B + k - s0] = sum;
        }
    }
    world_release_turn();
    world_wait(&sl->send_act);
    if (has_tail) gpt_acts_free(&tail);
    for (int i = 0; i < m->num_blocks; i++) m->block_fwd_s[i] = 0.0;

    /* Rank 0 gathers the last stages' sums, replica by replica: in sample order. */
    int *counts = dm_alloc((size_t)g->world_size * sizeof(int));
    int *displs = dm_alloc((size_t)g->world_size * sizeof(int));
    for (int r = 0; r < g->world_size; r++) {
        long f, l;
        replica_batches(batches, g->replicas, r / g->stages, &f, &l);
        long a = f * B, z = l * B < samples ? l * B : samples;
        counts[r] = r % g->stages == g->stages - 1 && z > a ? (int)(z - a) : 0;
        displs[r] = (int)a;
    }
    MPI_Request req;
    WORLD_MPI(MPI_Igatherv(mine, counts[g->rank], MPI_DOUBLE, sums, counts, displs, MPI_DOUBLE, 0,
                           MPI_COMM_WORLD, &req));
    world_wait(&req);
    dm_free(counts);
    dm_free(displs);
    dm_free(mine);
}
