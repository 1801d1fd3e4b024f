/* The per-thread arithmetic of the hash-sparse attention kernels
 * (hash.cu), with src/model/group_attention.c's contract: buckets by the
 * first maximum of [xR ; -xR] (R's unit-norm columns drawn on the host),
 * positions sorted stably by bucket, query i attends to key j when both
 * share a bucket and j <= i, and to its own key j = i wherever that
 * hashed; the tiles of GROUP_TILE x GROUP_TILE of the sorted orders that
 * hold an allowed pair of one bucket are counted, and the queries whose
 * bucket holds no key at or before them (their own key is all they
 * attend to).
 *
 * The buckets are the CPU's bits (the same projections in the same
 * order), hence the same orders and tile counts. The attention itself is
 * one thread per query (forward, dq) or per key (dk, dv) walking the
 * allowed partners of its bucket in position order: no atomics, no
 * tiles; its sums run in another order than the CPU's tiled online
 * softmax, so out, lse and the gradients agree within rounding.
 * Layouts: bucket, order (B, NH, 2, T) [queries | keys]; lse (B, NH, T). */
#ifndef DYNMO_KERNELS_HASH_CUH
#define DYNMO_KERNELS_HASH_CUH

#include "common.cuh"
#include "dynmo/rotation_group.h"

#define DM_HASH_TILE 32   /* dynmo/rotation_group.h's GROUP_TILE */

/* one (item, query or key, position) per step */
DM_HD void hash_bucket_thread(struct dm_thread t, int *bucket, const float *qkv,
                              const float *rotation, int B, int T, int C, int NH, int buckets)
{
    int hs = C / NH, half = buckets / 2;
    for (long e = dm_thread_first(t); e < (long)B * NH * 2 * T; e += dm_thread_stride(t)) {
        long item = e / (2L * T), b = item / NH, h = item % NH;
        int which = (int)(e / T % 2), pos = (int)(e % T);
        const float *x = qkv + (b * T + pos) * 3L * C + which * C + h * hs;
        bucket[e] = dm_rotation_group(x, half ? rotation + h * (long)hs * half : 0, hs, half);
    }
}

/* one (item, side, position) per step: its place in the stable sort by
 * bucket (the positions of lower buckets, then of its bucket before it) */
DM_HD void hash_order_thread(struct dm_thread t, int *order, const int *bucket, int B, int NH,
                             int T)
{
    for (long e = dm_thread_first(t); e < (long)B * NH * 2 * T; e += dm_thread_stride(t)) {
        const int *bk = bucket + e / T * T;
        int pos = (int)(e % T), mine = bk[pos], rank = 0;
        for (int u = 0; u < T; u++) rank += bk[u] < mine || (bk[u] == mine && u < pos);
        order[e / T * T + rank] = pos;
    }
}

/* Whether the tile (query rows qr0..qr1, key rows kr0..kr1 of the
 * sorted orders) holds an allowed pair, as group_attention.c decides. */
DM_HD int dm_hash_tile_has_pair(const int *qo, const int *qb, const int *ko, const int *kb,
                                int qr0, int qr1, int kr0, int kr1)
{
    if (qb[qo[qr1 - 1]] < kb[ko[kr0]] || kb[ko[kr1 - 1]] < qb[qo[qr0]]) return 0;
    for (int i = qr0; i < qr1; i++)
        for (int j = kr0; j < kr1; j++)
            if (qb[qo[i]] == kb[ko[j]] && ko[j] <= qo[i]) return 1;
    return 0;
}

/* the first index of sorted[0..T) whose bucket is at least want */
DM_HD int dm_hash_bucket_start(const int *sorted, const int *bk, int T, int want)
{
    int lo = 0, hi = T;
    while (lo < hi) {
        int mid = (lo + hi) / 2;
        if (bk[sorted[mid]] < want) lo = mid + 1;
        else hi = mid;
    }
    return lo;
}

/* one (item, row of tiles) per step: tiles[e] = its tiles with a pair;
 * alone[e] (alone may be NULL) = its query rows whose bucket has no key
 * at or before them (the keys of a bucket are sorted by position, so the
 * bucket's first key decides) */
DM_HD void hash_tiles_thread(struct dm_thread t, long *tiles, long *alone, const int *order,
                             const int *bucket, int B, int NH, int T)
{
    int rows = (T + DM_HASH_TILE - 1) / DM_HASH_TILE;
    for (long e = dm_thread_first(t); e < (long)B * NH * rows; e += dm_thread_stride(t)) {
        long item = e / rows;
        const int *qo = order + item * 2L * T, *ko = qo + T, *qb = bucket + item * 2L * T;
        const int *kb = qb + T;
        int r0 = (int)(e % rows) * DM_HASH_TILE, r1 = r0 + DM_HASH_TILE < T ? r0 + DM_HASH_TILE : T;
        long count = 0;
        for (int c0 = 0; c0 < T; c0 += DM_HASH_TILE)
            count += dm_hash_tile_has_pair(qo, qb, ko, kb, r0, r1, c0,
                                           c0 + DM_HASH_TILE < T ? c0 + DM_HASH_TILE : T);
        tiles[e] = count;
        if (!alone) continue;
        long lone = 0;
        for (int i = r0; i < r1; i++) {
            int mine = qb[qo[i]], j = dm_hash_bucket_start(ko, kb, T, mine);
            lone += !(j < T && kb[ko[j]] == mine && ko[j] <= qo[i]);
        }
        alone[e] = lone;
    }
}

DM_HD float dm_hash_dot(const float *a, const float *b, int n)
{
    float s = 0.0f;
    for (int d = 0; d < n; d++) s += a[d] * b[d];
    return s;
}

/* one (item, query position) per step: out and lse over the keys of its
 * bucket at or before it and its own key when that hashed elsewhere (two
 * passes: the maximum, then the sums; the sum is at least 1) */
DM_HD void hash_forward_thread(struct dm_thread t, float *out, float *lse, const int *order,
                               const int *bucket, const float *qkv, int B, int T, int C, int NH)
{
    int hs = C / NH;
    float scale = (float)(1.0 / sqrt((double)hs));
    for (long e = dm_thread_first(t); e < (long)B * NH * T; e += dm_thread_stride(t)) {
        long item = e / T, b = item / NH, h = item % NH;
        int qpos = (int)(e % T);
        const int *ko = order + item * 2L * T + T, *kb = bucket + item * 2L * T + T;
        int mine = bucket[item * 2L * T + qpos], own = kb[qpos] != mine;
        int j0 = dm_hash_bucket_start(ko, kb, T, mine);
        const float *q = qkv + (b * T + qpos) * 3L * C + h * hs;
        const float *kown = qkv + (b * T + qpos) * 3L * C + C + h * hs;
        float *o = out + (b * T + qpos) * (long)C + h * hs, mx = -INFINITY, sum = 0.0f;
        float sown = own ? dm_hash_dot(q, kown, hs) * scale : -INFINITY;
        for (int j = j0; j < T && kb[ko[j]] == mine && ko[j] <= qpos; j++) {
            float s = dm_hash_dot(q, qkv + (b * T + ko[j]) * 3L * C + C + h * hs, hs) * scale;
            mx = s > mx ? s : mx;
        }
        mx = sown > mx ? sown : mx;
        for (int d = 0; d < hs; d++) o[d] = 0.0f;
        for (int j = j0; j < T && kb[ko[j]] == mine && ko[j] <= qpos; j++) {
            const float *k = qkv + (b * T + ko[j]) * 3L * C + C + h * hs;
            float p = expf(dm_hash_dot(q, k, hs) * scale - mx);
            sum += p;
            for (int d = 0; d < hs; d++) o[d] += p * k[C + d];
        }
        if (own) {
            float p = expf(sown - mx);
            sum += p;
            for (int d = 0; d < hs; d++) o[d] += p * kown[C + d];
        }
        float inv = 1.0f / sum;
        for (int d = 0; d < hs; d++) o[d] *= inv;
        lse[e] = mx + logf(sum);
    }
}

/* one (item, position) per step: delta = dout . out of that query */
DM_HD void hash_delta_thread(struct dm_thread t, float *delta, const float *dout,
                             const float *out, int B, int T, int C, int NH)
{
    int hs = C / NH;
    for (long e = dm_thread_first(t); e < (long)B * NH * T; e += dm_thread_stride(t)) {
        long item = e / T, b = item / NH, h = item % NH, at = (b * T + e % T) * C + h * hs;
        delta[e] = dm_hash_dot(dout + at, out + at, hs);
    }
}

/* one (item, query position) per step: its dq (overwritten) over the
 * keys it attends to (its own last when that hashed elsewhere);
 * p = exp(q.k scale - lse), ds = p (dout.v - delta) scale */
DM_HD void hash_dq_thread(struct dm_thread t, float *dqkv, const float *dout, const float *qkv,
                          const float *lse, const float *delta, const int *order,
                          const int *bucket, int B, int T, int C, int NH)
{
    int hs = C / NH;
    float scale = (float)(1.0 / sqrt((double)hs));
    for (long e = dm_thread_first(t); e < (long)B * NH * T; e += dm_thread_stride(t)) {
        long item = e / T, b = item / NH, h = item % NH;
        int qpos = (int)(e % T), mine = bucket[item * 2L * T + qpos];
        const int *ko = order + item * 2L * T + T, *kb = bucket + item * 2L * T + T;
        const float *q = qkv + (b * T + qpos) * 3L * C + h * hs;
        const float *dy = dout + (b * T + qpos) * (long)C + h * hs;
        float *dq = dqkv + (b * T + qpos) * 3L * C + h * hs;
        for (int d = 0; d < hs; d++) dq[d] = 0.0f;
        int j = dm_hash_bucket_start(ko, kb, T, mine);
        for (; j < T && kb[ko[j]] == mine && ko[j] <= qpos; j++) {
            const float *k = qkv + (b * T + ko[j]) * 3L * C + C + h * hs;
            float p = expf(dm_hash_dot(q, k, hs) * scale - lse[e]);
            float ds = p * (dm_hash_dot(dy, k + C, hs) - delta[e]) * scale;
            for (int d = 0; d < hs; d++) dq[d] += ds * k[d];
        }
        if (kb[qpos] != mine) {
            const float *k = qkv + (b * T + qpos) * 3L * C + C + h * hs;
            float p = expf(dm_hash_dot(q, k, hs) * scale - lse[e]);
            float ds = p * (dm_hash_dot(dy, k + C, hs) - delta[e]) * scale;
            for (int d = 0; d < hs; d++) dq[d] += ds * k[d];
        }
    }
}

/* the pair (query at qpos, key k) of item's key thread: dk and dv += */
DM_HD void dm_hash_dkv_pair(float *dk, float *dv, const float *k, const float *dout,
                            const float *qkv, const float *lse, const float *delta, long item,
                            long b, long h, int qpos, int T, int C, int hs, float scale)
{
    const float *q = qkv + (b * T + qpos) * 3L * C + h * hs;
    const float *dy = dout + (b * T + qpos) * (long)C + h * hs;
    long qe = item * T + qpos;
    float p = expf(dm_hash_dot(q, k, hs) * scale - lse[qe]);
    float ds = p * (dm_hash_dot(dy, k + C, hs) - delta[qe]) * scale;
    for (int d = 0; d < hs; d++) {
        dv[d] += p * dy[d];
        dk[d] += ds * q[d];
    }
}

/* one (item, key position) per step: its dk and dv (overwritten) over the
 * queries of its bucket at or after it, and the query at its own position
 * last when that one hashed elsewhere */
DM_HD void hash_dkv_thread(struct dm_thread t, float *dqkv, const float *dout, const float *qkv,
                           const float *lse, const float *delta, const int *order,
                           const int *bucket, int B, int T, int C, int NH)
{
    int hs = C / NH;
    float scale = (float)(1.0 / sqrt((double)hs));
    for (long e = dm_thread_first(t); e < (long)B * NH * T; e += dm_thread_stride(t)) {
        long item = e / T, b = item / NH, h = item % NH;
        int kpos = (int)(e % T), mine = bucket[item * 2L * T + T + kpos];
        const int *qo = order + item * 2L * T, *qb = bucket + item * 2L * T;
        const float *k = qkv + (b * T + kpos) * 3L * C + C + h * hs;
        float *dk = dqkv + (b * T + kpos) * 3L * C + C + h * hs, *dv = dk + C;
        for (int d = 0; d < hs; d++) dk[d] = dv[d] = 0.0f;
        for (int i = dm_hash_bucket_start(qo, qb, T, mine); i < T && qb[qo[i]] == mine; i++)
            if (qo[i] >= kpos)
                dm_hash_dkv_pair(dk, dv, k, dout, qkv, lse, delta, item, b, h, qo[i], T, C, hs,
                                 scale);
        if (qb[kpos] != mine)
            dm_hash_dkv_pair(dk, dv, k, dout, qkv, lse, delta, item, b, h, kpos, T, C, hs,
                             scale);
    }
}

#endif
