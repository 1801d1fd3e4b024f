/* Hash-sparse causal attention (Pagliardini et al. 2023), the op forward
 * and backward, and the random rotations it hashes with.
 *
 * Per (sequence, head), queries and keys are hashed into nb buckets by a
 * random rotation R (hs, nb/2): h(x) = argmax([xR ; -xR]) (first maximum
 * on ties); with nb = 1 every token is in bucket 0. Queries and keys are
 * sorted stably by bucket (so by position inside a bucket), and query i
 * attends to key j only when both are in the same bucket and j <= i at
 * their original positions. A query with no such key outputs zero.
 *
 * The work is done in HASH_TILE x HASH_TILE tiles of the sorted order; a
 * tile with no allowed pair is skipped in forward and backward, and the
 * tiles visited are counted (the block's cost follows them). The backward
 * recomputes the probabilities from the saved log-sum-exp per query (no
 * T x T matrix is kept). One (sequence, head) pair is one work item, done
 * in a fixed order by one thread, so results do not depend on the thread
 * count. Nothing here calls MPI or reads a layout. */
#include <math.h>
#include <string.h>
#include "dynmo/model.h"
#include "model/internal.h"

/* A stream far above every block tensor's ((index + 1) << 8 | k). */
#define HASH_ROTATION_STREAM_BASE (UINT64_C(0x48415348) << 32)

void hash_rotation_draw(float *rotation, int NH, int hs, int buckets, uint64_t seed,
                        int layer, long step)
{
    DM_ASSERT(buckets >= 1 && (buckets == 1 || buckets % 2 == 0));
    size_t n = (size_t)NH * hs * (size_t)(buckets / 2);
    if (n == 0) return;
    uint64_t stream = HASH_ROTATION_STREAM_BASE ^
                      dm_hash64((uint64_t)layer, UINT64_C(0x726f74), (uint64_t)step);
    init_normal(rotation, n, seed, stream, 1.0f);
}

struct hash_args {
    float *out, *lse, *dqkv;
    int *order, *bucket;
    long *tiles;                 /* (B*NH) tiles visited per item */
    const float *qkv, *rotation, *dout, *out_in, *lse_in;
    const int *order_in, *bucket_in;
    int B, T, C, NH, buckets;
};

/* bucket of x (hs): the first maximum of [xR ; -xR], R (hs, half), in
 * that index order (torch.argmax's tie rule). */
static int hash_bucket(const float *x, const float *R, int hs, int half)
{
    if (half == 0) return 0;
    float proj[half];
    for (int c = 0; c < half; c++) {
        float s = 0.0f;
        for (int d = 0; d < hs; d++) s += x[d] * R[(long)d * half + c];
        proj[c] = s;
    }
    int best = 0;
    for (int c = 1; c < half; c++)
        if (proj[c] > proj[best]) best = c;
    for (int c = 0; c < half; c++)
        if (-proj[c] > (best < half ? proj[best] : -proj[best - half])) best = half + c;
    return best;
}

/* order[0..T) = token positions sorted stably by bucket (counting sort) */
static void sort_by_bucket(int *order, const int *bucket, int T, int nb)
{
    int count[nb + 1];
    memset(count, 0, sizeof count);
    for (int t = 0; t < T; t++) count[bucket[t] + 1]++;
    for (int b = 0; b < nb; b++) count[b + 1] += count[b];
    for (int t = 0; t < T; t++) order[count[bucket[t]]++] = t;
}

/* Whether tile (query rows qr0..qr1, key rows kr0..kr1 of the sorted
 * orders) holds an allowed pair. */
static int tile_has_pair(const int *qorder, const int *qbucket, const int *korder,
                         const int *kbucket, int qr0, int qr1, int kr0, int kr1)
{
    /* sorted by bucket: the tile's bucket ranges are its ends */
    if (qbucket[qorder[qr1 - 1]] < kbucket[korder[kr0]] ||
        kbucket[korder[kr1 - 1]] < qbucket[qorder[qr0]])
        return 0;
    for (int i = qr0; i < qr1; i++)
        for (int j = kr0; j < kr1; j++)
            if (qbucket[qorder[i]] == kbucket[korder[j]] && korder[j] <= qorder[i]) return 1;
    return 0;
}

static inline int pair_allowed(int qpos, int qb, int kpos, int kb)
{
    return qb == kb && kpos <= qpos;
}

/* Hashes and sorts item (b, h): bucket (2, T) [query | key], order (2, T). */
static void hash_item(const struct hash_args *a, long item, int *bucket, int *order)
{
    int T = a->T, C = a->C, NH = a->NH, hs = C / NH, half = a->buckets / 2;
    long b = item / NH, h = item % NH;
    const float *R = a->rotation ? a->rotation + h * (long)hs * half : NULL;
    for (int t = 0; t < T; t++) {
        const float *row = a->qkv + (b * T + t) * 3L * C + h * hs;
        bucket[t] = hash_bucket(row, R, hs, half);
        bucket[T + t] = hash_bucket(row + C, R, hs, half);
    }
    sort_by_bucket(order, bucket, T, a->buckets);
    sort_by_bucket(order + T, bucket + T, T, a->buckets);
}

static void hash_forward_range(void *arg, long begin, long end)
{
    const struct hash_args *a = arg;
    int T = a->T, C = a->C, NH = a->NH, hs = C / NH;
    float scale = (float)(1.0 / sqrt((double)hs));
    float *acc = dm_alloc((size_t)HASH_TILE * hs * sizeof(float));
    float m[HASH_TILE], l[HASH_TILE], s[HASH_TILE];
    for (long item = begin; item < end; item++) {
        long b = item / NH, h = item % NH;
        int *bucket = a->bucket + item * 2L * T, *order = a->order + item * 2L * T;
        hash_item(a, item, bucket, order);
        const int *qo = order, *ko = order + T, *qb = bucket, *kb = bucket + T;
        long tiles = 0;
        for (int r0 = 0; r0 < T; r0 += HASH_TILE) {
            int r1 = r0 + HASH_TILE < T ? r0 + HASH_TILE : T;
            for (int i = 0; i < r1 - r0; i++) { m[i] = -INFINITY; l[i] = 0.0f; }
            memset(acc, 0, (size_t)HASH_TILE * hs * sizeof(float));
            for (int c0 = 0; c0 < T; c0 += HASH_TILE) {
                int c1 = c0 + HASH_TILE < T ? c0 + HASH_TILE : T;
                if (!tile_has_pair(qo, qb, ko, kb, r0, r1, c0, c1)) continue;
                tiles++;
                for (int i = r0; i < r1; i++) {
                    int qpos = qo[i];
                    const float *q = a->qkv + (b * T + qpos) * 3L * C + h * hs;
                    float mx = m[i - r0];
                    for (int j = c0; j < c1; j++) {
                        s[j - c0] = -INFINITY;
                        if (!pair_allowed(qpos, qb[qpos], ko[j], kb[ko[j]])) continue;
                        const float *k = a->qkv + (b * T + ko[j]) * 3L * C + C + h * hs;
                        float dot = 0.0f;
                        for (int d = 0; d < hs; d++) dot += q[d] * k[d];
                        s[j - c0] = dot * scale;
                        if (s[j - c0] > mx) mx = s[j - c0];
                    }
                    if (mx == -INFINITY) continue;   /* nothing allowed yet */
                    float correction = expf(m[i - r0] - mx);   /* 0 when m was -inf */
                    float *o = acc + (long)(i - r0) * hs;
                    float sum = l[i - r0] * correction;
                    for (int d = 0; d < hs; d++) o[d] *= correction;
                    for (int j = c0; j < c1; j++) {
                        if (s[j - c0] == -INFINITY) continue;
                        float p = expf(s[j - c0] - mx);
                        sum += p;
                        const float *v = a->qkv + (b * T + ko[j]) * 3L * C + 2 * C + h * hs;
                        for (int d = 0; d < hs; d++) o[d] += p * v[d];
                    }
                    m[i - r0] = mx;
                    l[i - r0] = sum;
                }
            }
            for (int i = r0; i < r1; i++) {
                int qpos = qo[i];
                float *out = a->out + (b * T + qpos) * (long)C + h * hs;
                const float *o = acc + (long)(i - r0) * hs;
                float *lse = a->lse + item * (long)T + qpos;
                if (l[i - r0] > 0.0f) {
                    float inv = 1.0f / l[i - r0];
                    for (int d = 0; d < hs; d++) out[d] = o[d] * inv;
                    *lse = m[i - r0] + logf(l[i - r0]);
                } else {
                    memset(out, 0, (size_t)hs * sizeof(float));
                    *lse = -INFINITY;
                }
            }
        }
        a->tiles[item] = tiles;
    }
    dm_free(acc);
}

static long sum_tiles(const long *tiles, long n)
{
    long total = 0;
    for (long i = 0; i < n; i++) total += tiles[i];
    return total;
}

long hash_attention_forward(float *out, float *lse, int *order, int *bucket, const float *qkv,
                            const float *rotation, int B, int T, int C, int NH, int buckets)
{
    DM_ASSERT(buckets >= 1 && (buckets == 1 || buckets % 2 == 0) && C % NH == 0);
    long items = (long)B * NH;
    long *tiles = dm_alloc((size_t)items * sizeof(long));
    struct hash_args a = {.out = out, .lse = lse, .order = order, .bucket = bucket,
                          .tiles = tiles, .qkv = qkv, .rotation = buckets > 1 ? rotation : NULL,
                          .B = B, .T = T, .C = C, .NH = NH, .buckets = buckets};
    dm_parallel_for(items, 1, hash_forward_range, &a);
    long total = sum_tiles(tiles, items);
    dm_free(tiles);
    return total;
}

static void hash_backward_range(void *arg, long begin, long end)
{
    const struct hash_args *a = arg;
    int T = a->T, C = a->C, NH = a->NH, hs = C / NH;
    float scale = (float)(1.0 / sqrt((double)hs));
    float *delta = dm_alloc((size_t)T * sizeof(float));
    for (long item = begin; item < end; item++) {
        long b = item / NH, h = item % NH;
        const int *qo = a->order_in + item * 2L * T, *ko = qo + T;
        const int *qb = a->bucket_in + item * 2L * T, *kb = qb + T;
        const float *lse = a->lse_in + item * (long)T;
        for (int t = 0; t < T; t++) {
            float *dq = a->dqkv + (b * T + t) * 3L * C + h * hs;
            memset(dq, 0, (size_t)hs * sizeof(float));
            memset(dq + C, 0, (size_t)hs * sizeof(float));
            memset(dq + 2 * C, 0, (size_t)hs * sizeof(float));
            const float *dout = a->dout + (b * T + t) * (long)C + h * hs;
            const float *o = a->out_in + (b * T + t) * (long)C + h * hs;
            float dd = 0.0f;
            for (int d = 0; d < hs; d++) dd += dout[d] * o[d];
            delta[t] = dd;
        }
        long tiles = 0;
        for (int r0 = 0; r0 < T; r0 += HASH_TILE) {
            int r1 = r0 + HASH_TILE < T ? r0 + HASH_TILE : T;
            for (int c0 = 0; c0 < T; c0 += HASH_TILE) {
                int c1 = c0 + HASH_TILE < T ? c0 + HASH_TILE : T;
                if (!tile_has_pair(qo, qb, ko, kb, r0, r1, c0, c1)) continue;
                tiles++;
                for (int i = r0; i < r1; i++) {
                    int qpos = qo[i];
                    const float *q = a->qkv + (b * T + qpos) * 3L * C + h * hs;
                    const float *dout = a->dout + (b * T + qpos) * (long)C + h * hs;
                    float *dq = a->dqkv + (b * T + qpos) * 3L * C + h * hs;
                    for (int j = c0; j < c1; j++) {
                        int kpos = ko[j];
                        if (!pair_allowed(qpos, qb[qpos], kpos, kb[kpos])) continue;
                        const float *k = a->qkv + (b * T + kpos) * 3L * C + C + h * hs;
                        const float *v = k + C;
                        float *dk = a->dqkv + (b * T + kpos) * 3L * C + C + h * hs;
                        float *dv = dk + C;
                        float dot = 0.0f, dp = 0.0f;
                        for (int d = 0; d < hs; d++) dot += q[d] * k[d];
                        float p = expf(dot * scale - lse[qpos]);
                        for (int d = 0; d < hs; d++) dp += dout[d] * v[d];
                        float ds = p * (dp - delta[qpos]) * scale;
                        for (int d = 0; d < hs; d++) {
                            dv[d] += p * dout[d];
                            dq[d] += ds * k[d];
                            dk[d] += ds * q[d];
                        }
                    }
                }
            }
        }
        a->tiles[item] = tiles;
    }
    dm_free(delta);
}

long hash_attention_backward(float *dqkv, const float *dout, const float *qkv, const float *out,
                             const float *lse, const int *order, const int *bucket, int B,
                             int T, int C, int NH)
{
    long items = (long)B * NH;
    long *tiles = dm_alloc((size_t)items * sizeof(long));
    struct hash_args a = {.dqkv = dqkv, .tiles = tiles, .qkv = qkv, .dout = dout,
                          .out_in = out, .lse_in = lse, .order_in = order, .bucket_in = bucket,
                          .B = B, .T = T, .C = C, .NH = NH};
    dm_parallel_for(items, 1, hash_backward_range, &a);
    long total = sum_tiles(tiles, items);
    dm_free(tiles);
    return total;
}

/* ---- inside a block ------------------------------------------------------ */

struct hash_acts {
    int B, T;
    float *lse;         /* (B,NH,T) */
    int *order;         /* (B,NH,2,T) */
    int *bucket;        /* (B,NH,2,T) */
    float *rotation;    /* (NH, hs, nb/2) */
};

void hash_acts_free(struct hash_acts *ha)
{
    if (!ha) return;
    dm_free(ha->lse);
    dm_free(ha->order);
    dm_free(ha->bucket);
    dm_free(ha->rotation);
    dm_free(ha);
}

static struct hash_acts *hash_acts_get(const struct block *blk, struct block_acts *acts)
{
    if (acts->hash) return acts->hash;
    int B = acts->B, T = acts->T, NH = blk->NH, hs = blk->C / blk->NH;
    struct hash_acts *ha = dm_alloc(sizeof *ha);
    ha->B = B;
    ha->T = T;
    ha->lse = dm_alloc((size_t)B * NH * T * sizeof(float));
    ha->order = dm_alloc((size_t)B * NH * 2 * T * sizeof(int));
    ha->bucket = dm_alloc((size_t)B * NH * 2 * T * sizeof(int));
    ha->rotation = dm_alloc(((size_t)NH * hs * (size_t)(blk->hash_buckets / 2) + 1) *
                            sizeof(float));
    acts->hash = ha;
    return ha;
}

void hash_block_attention_forward(struct block *blk, struct block_acts *acts, int B, int T)
{
    struct hash_acts *ha = hash_acts_get(blk, acts);
    int C = blk->C, NH = blk->NH;
    hash_rotation_draw(ha->rotation, NH, C / NH, blk->hash_buckets, blk->hash_seed,
                       blk->index, acts->hash_step);
    blk->hash_tiles += (double)hash_attention_forward(acts->atty, ha->lse, ha->order,
                                                      ha->bucket, acts->qkv, ha->rotation,
                                                      B, T, C, NH, blk->hash_buckets);
}

void hash_block_attention_backward(struct block *blk, struct block_acts *acts, float *dqkv,
                                   const float *datty, int B, int T)
{
    struct hash_acts *ha = acts->hash;
    DM_ASSERT(ha != NULL);
    blk->hash_tiles += (double)hash_attention_backward(dqkv, datty, acts->qkv, acts->atty,
                                                       ha->lse, ha->order, ha->bucket, B, T,
                                                       blk->C, blk->NH);
}
