/* Causal attention within groups of sorted tokens, the op forward and
 * backward (the CPU's entries group_attention_* of the op table): the
 * kernel of hash-sparse attention (Pagliardini et al. 2023; the scheme,
 * its rotations and its use in a block are src/dyn/hash.c).
 *
 * Per (sequence, head), queries and keys go to nb groups by a rotation R
 * (hs, nb/2) whose columns have unit norm (SCFA's): g(x) = argmax([xR ;
 * -xR]) (first maximum on ties); with nb = 1 every token is in group 0.
 * Queries and keys are sorted stably by group (so by position inside a
 * group), and query i attends to key j when both are in the same group
 * and j <= i at their original positions, and always to its own key j =
 * i: no query is left without a key. A query whose own key went to
 * another group takes it as one extra score beside its group's range
 * (below); one with no key of its group at or before it attends to its
 * own key alone, and those are counted.
 *
 * The work is done in GROUP_TILE x GROUP_TILE tiles of the sorted order,
 * with sgemm over runs of consecutive visited tiles (below); a tile with
 * no allowed pair is skipped in forward and backward, and the tiles
 * visited are counted (the block's cost follows them). The backward
 * recomputes the probabilities from the saved log-sum-exp per query (no
 * T x T matrix is kept). One (sequence, head) pair is one work item, done
 * in a fixed order by one thread, so results do not depend on the thread
 * count. Nothing here calls MPI or reads a layout. */
#include <cblas.h>
#include <math.h>
#include <string.h>
#include "dynmo/backend.h"
#include "dynmo/rotation_group.h"
#include "dynmo/model.h"
#include "model/exp_lanes.h"
#include "model/internal.h"

struct group_args {
    float *out, *lse, *dqkv;
    int *order, *group;
    long *tiles;                 /* (B*NH) tiles visited per item */
    long *alone;                 /* (B*NH) queries with their own key alone per item */
    const float *qkv, *rotation, *dout, *out_in, *lse_in;
    const int *order_in, *group_in;
    int B, T, C, NH, groups;
};

/* order[0..T) = token positions sorted stably by group (counting sort
 * over count, nb + 1 ints of the caller's) */
static void sort_by_group(int *order, const int *group, int T, int nb, int *count)
{
    memset(count, 0, (size_t)(nb + 1) * sizeof *count);
    for (int t = 0; t < T; t++) count[group[t] + 1]++;
    for (int b = 0; b < nb; b++) count[b + 1] += count[b];
    for (int t = 0; t < T; t++) order[count[group[t]]++] = t;
}

/* Groups and sorts item (b, h): group (2, T) [query | key], order (2, T);
 * count (groups + 1) is scratch. */
static void group_item(const struct group_args *a, long item, int *group, int *order, int *count)
{
    int T = a->T, C = a->C, NH = a->NH, hs = C / NH, half = a->groups / 2;
    long b = item / NH, h = item % NH;
    const float *R = a->rotation ? a->rotation + h * (long)hs * half : NULL;
    for (int t = 0; t < T; t++) {
        const float *row = a->qkv + (b * T + t) * 3L * C + h * hs;
        group[t] = dm_rotation_group(row, R, hs, half);
        group[T + t] = dm_rotation_group(row + C, R, hs, half);
    }
    sort_by_group(order, group, T, a->groups, count);
    sort_by_group(order + T, group + T, T, a->groups, count);
}

/* ---- the tiled kernel -----------------------------------------------------
 * Per item, the head's Q, K, V (and dO) are copied in group-sorted order
 * into contiguous buffers (K and V also transposed), so that every product
 * is a plain sgemm on contiguous operands. Keys sorted by group, then by
 * position, make the keys query i may see one contiguous range of the
 * sorted keys: [kstart[b], kstart[b] + (keys of group b at positions <=
 * i)). A query tile visits the key tiles that meet the range of any of its
 * rows (exactly the tiles holding an allowed pair); consecutive visited
 * tiles form a run, and each run costs one sgemm for the scores and one
 * for the output (five in the backward). A row's whole range lies inside
 * one run (its group's ranges in the tile are prefixes of the longest
 * one, whose tiles are all visited), so its softmax is done in one pass
 * over that run; its probabilities are exact zeros in every other run.
 *
 * A query's own key is the last of its range when it went to the
 * query's group. When it did not, it is one extra score beside the range
 * (own[k] set, its score in own_s[k]): forward_softmax takes it into the
 * row's maximum and sum and leaves its probability in own_p[k], and its
 * value row is added after the runs; a row whose range is empty has the
 * own key alone (probability 1, lse its score). The backward adds the
 * extra pair's terms after the runs likewise. No tile counts it. */

struct group_work {
    float *qs, *kt, *ks, *vs, *vt, *dos;   /* (T, hs) sorted; kt, vt (hs, T) */
    float *dqs, *dks, *dvs;                /* (T, hs) sorted gradients */
    float *s, *dp;                         /* (GROUP_TILE, T) a query tile's scores */
    float *lse, *delta;                    /* (T) per sorted query */
    int *kstart;                           /* (groups + 1) first sorted key of a group */
    int *kinv;                             /* (T) sorted place of the key at a position */
    int lo[GROUP_TILE], hi[GROUP_TILE];    /* allowed sorted keys of a tile's rows */
    int own[GROUP_TILE];                   /* the row's own key is outside [lo, hi) */
    float own_s[GROUP_TILE], own_p[GROUP_TILE];  /* its score and probability */
    unsigned char *visit;                  /* (key tiles) visited by the query tile */
};

static void group_work_alloc(struct group_work *w, int T, int hs, int groups)
{
    size_t th = (size_t)T * hs;
    w->qs = dm_alloc((9 * th + 2 * (size_t)GROUP_TILE * T + 2 * (size_t)T) * sizeof(float));
    w->kt = w->qs + th;   w->ks = w->kt + th;   w->vs = w->ks + th;
    w->vt = w->vs + th;   w->dos = w->vt + th;  w->dqs = w->dos + th;
    w->dks = w->dqs + th; w->dvs = w->dks + th;
    w->s = w->dvs + th;
    w->dp = w->s + (size_t)GROUP_TILE * T;
    w->lse = w->dp + (size_t)GROUP_TILE * T;
    w->delta = w->lse + T;
    w->kstart = dm_alloc((size_t)(groups + 1) * sizeof(int));
    w->kinv = dm_alloc((size_t)(T > 0 ? T : 1) * sizeof(int));
    w->visit = dm_alloc((size_t)(T / GROUP_TILE + 1));
}

static void group_work_free(struct group_work *w)
{
    dm_free(w->qs);
    dm_free(w->kstart);
    dm_free(w->kinv);
    dm_free(w->visit);
}

/* dst (T, hs) = rows order[0..T) of src (leading dimension ld) */
static void gather_sorted(float *restrict dst, const float *restrict src, const int *order,
                          int T, int hs, long ld)
{
    for (int i = 0; i < T; i++)
        memcpy(dst + (long)i * hs, src + order[i] * ld, (size_t)hs * sizeof(float));
}

/* dst (hs, T) = the same rows, transposed */
static void gather_sorted_transposed(float *restrict dst, const float *restrict src,
                                     const int *order, int T, int hs, long ld)
{
    for (int i = 0; i < T; i++) {
        const float *row = src + order[i] * ld;
        for (int d = 0; d < hs; d++) dst[(long)d * T + i] = row[d];
    }
}

/* rows order[0..T) of dst (leading dimension ld) = src (T, hs) */
static void scatter_sorted(float *restrict dst, const float *restrict src, const int *order,
                           int T, int hs, long ld)
{
    for (int i = 0; i < T; i++)
        memcpy(dst + order[i] * ld, src + (long)i * hs, (size_t)hs * sizeof(float));
}

/* kstart[b] = the first sorted key of group b; kstart[nb] = T */
static void group_starts(int *kstart, const int *ko, const int *kb, int T, int nb)
{
    int j = 0;
    for (int b = 0; b <= nb; b++) {
        while (j < T && kb[ko[j]] < b) j++;
        kstart[b] = j;
    }
}

/* The end of the sorted keys [from, to) (ascending positions) at or
 * before position pos: the first index whose position is > pos. */
static int keys_upto(const int *ko, int from, int to, int pos)
{
    while (from < to) {
        int mid = from + (to - from) / 2;
        if (ko[mid] <= pos) from = mid + 1;
        else to = mid;
    }
    return from;
}

/* For query rows [r0, r1): each row's allowed sorted keys [lo, hi), and
 * the key tiles they meet marked in visit. Returns the tiles visited. */
static int tile_plan(struct group_work *w, const int *qo, const int *qb, const int *ko, int r0,
                     int r1, int T)
{
    int ntiles = (T + GROUP_TILE - 1) / GROUP_TILE, visited = 0;
    memset(w->visit, 0, (size_t)ntiles);
    for (int i = r0; i < r1; i++) {
        int b = qb[qo[i]];
        w->lo[i - r0] = w->kstart[b];
        w->hi[i - r0] = keys_upto(ko, w->kstart[b], w->kstart[b + 1], qo[i]);
        /* a group's last row in the tile has its longest range */
        int last = i + 1 == r1 || qb[qo[i + 1]] != b;
        if (!last || w->hi[i - r0] == w->lo[i - r0]) continue;
        for (int t = w->lo[i - r0] / GROUP_TILE; t <= (w->hi[i - r0] - 1) / GROUP_TILE; t++) {
            visited += !w->visit[t];
            w->visit[t] = 1;
        }
    }
    return visited;
}

/* For the tile's rows [r0, r0 + rows): whether each one's own key lies
 * outside its range, and then its score (q . k scale, q the sorted row,
 * k the key at the query's position, ld 3C from kbase). Returns the rows
 * whose range is empty (their own key is all they attend to). */
static int own_key_plan(struct group_work *w, const int *qo, const int *qb, const int *kb,
                        int r0, int rows, int hs, const float *kbase, long ld, float scale)
{
    int alone = 0;
    for (int k = 0; k < rows; k++) {
        int pos = qo[r0 + k];
        w->own[k] = kb[pos] != qb[pos];
        w->own_p[k] = 1.0f;
        alone += w->hi[k] == w->lo[k];
        if (!w->own[k]) continue;
        const float *q = w->qs + (long)(r0 + k) * hs, *key = kbase + pos * ld;
        float s = 0.0f;
        for (int d = 0; d < hs; d++) s += q[d] * key[d];
        w->own_s[k] = s * scale;
    }
    return alone;
}

/* The next run of visited key tiles at or after tile *t, as sorted key
 * columns [*c0, *c1); returns 0 when there is none. */
static int next_run(const struct group_work *w, int *t, int T, int *c0, int *c1)
{
    int ntiles = (T + GROUP_TILE - 1) / GROUP_TILE;
    while (*t < ntiles && !w->visit[*t]) (*t)++;
    if (*t == ntiles) return 0;
    *c0 = *t * GROUP_TILE;
    while (*t < ntiles && w->visit[*t]) (*t)++;
    *c1 = *t * GROUP_TILE < T ? *t * GROUP_TILE : T;
    return 1;
}

/* Whether row k's allowed range lies in the run [c0, c1) (else it is
 * empty or in another run). */
static int row_in_run(const struct group_work *w, int k, int c0, int c1)
{
    if (w->hi[k] == w->lo[k] || w->hi[k] <= c0 || w->lo[k] >= c1) return 0;
    DM_ASSERT(w->lo[k] >= c0 && w->hi[k] <= c1);
    return 1;
}

/* The forward over a run's scores s (rows, ld T, columns [c0, c1)): the
 * softmax of each row over its range (and its own key when that is
 * outside the range: own_p), zero elsewhere, and its lse. */
static void forward_softmax(struct group_work *w, int r0, int rows, int c0, int c1, int T)
{
    for (int k = 0; k < rows; k++) {
        float *row = w->s + (long)k * T;
        if (!row_in_run(w, k, c0, c1)) {
            memset(row, 0, (size_t)(c1 - c0) * sizeof(float));
            continue;
        }
        int lo = w->lo[k] - c0, hi = w->hi[k] - c0;
        float mx = max_lanes(row + lo, hi - lo);
        if (w->own[k] && w->own_s[k] > mx) mx = w->own_s[k];
        float sum = exp_shifted_lanes(row + lo, hi - lo, mx);
        float own = w->own[k] ? exp_lanes(w->own_s[k] - mx) : 0.0f;
        sum += own;
        float inv = 1.0f / sum;
        for (int j = lo; j < hi; j++) row[j] *= inv;
        w->own_p[k] = own * inv;
        memset(row, 0, (size_t)lo * sizeof(float));
        memset(row + hi, 0, (size_t)(c1 - c0 - hi) * sizeof(float));
        w->lse[r0 + k] = mx + logf(sum);
    }
}

/* One item's forward: out rows and lse by position. */
static void group_forward_item(const struct group_args *a, struct group_work *w, long item,
                              float *o /* (GROUP_TILE, hs) */)
{
    int T = a->T, C = a->C, NH = a->NH, hs = C / NH;
    long b = item / NH, h = item % NH;
    float scale = (float)(1.0 / sqrt((double)hs));
    int *group = a->group + item * 2L * T, *order = a->order + item * 2L * T;
    group_item(a, item, group, order, w->kstart);   /* kstart: set again below */
    const int *qo = order, *ko = order + T, *qb = group, *kb = group + T;
    const float *base = a->qkv + b * T * 3L * C + h * hs;
    gather_sorted(w->qs, base, qo, T, hs, 3L * C);
    gather_sorted_transposed(w->kt, base + C, ko, T, hs, 3L * C);
    gather_sorted(w->vs, base + 2 * C, ko, T, hs, 3L * C);
    group_starts(w->kstart, ko, kb, T, a->groups);
    long tiles = 0, alone = 0;
    for (int r0 = 0; r0 < T; r0 += GROUP_TILE) {
        int rows = r0 + GROUP_TILE < T ? GROUP_TILE : T - r0;
        tiles += tile_plan(w, qo, qb, ko, r0, r0 + rows, T);
        alone += own_key_plan(w, qo, qb, kb, r0, rows, hs, base + C, 3L * C, scale);
        memset(o, 0, (size_t)rows * hs * sizeof(float));
        for (int k = 0; k < rows; k++)   /* the own key alone, unless a run says more */
            w->lse[r0 + k] = w->own[k] ? w->own_s[k] : -INFINITY;
        int t = 0, c0, c1;
        while (next_run(w, &t, T, &c0, &c1)) {
            cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, rows, c1 - c0, hs, scale,
                        w->qs + (long)r0 * hs, hs, w->kt + c0, T, 0.0f, w->s, T);
            forward_softmax(w, r0, rows, c0, c1, T);
            cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, rows, hs, c1 - c0, 1.0f,
                        w->s, T, w->vs + (long)c0 * hs, hs, 1.0f, o, hs);
        }
        for (int k = 0; k < rows; k++) {
            int pos = qo[r0 + k];
            if (w->own[k]) {
                const float *v = base + 2 * C + pos * 3L * C;
                for (int d = 0; d < hs; d++) o[(long)k * hs + d] += w->own_p[k] * v[d];
            }
            memcpy(a->out + (b * T + pos) * (long)C + h * hs, o + (long)k * hs,
                   (size_t)hs * sizeof(float));
            a->lse[item * (long)T + pos] = w->lse[r0 + k];
        }
    }
    a->tiles[item] = tiles;
    a->alone[item] = alone;
}

static void group_forward_range(void *arg, long begin, long end)
{
    const struct group_args *a = arg;
    int hs = a->C / a->NH;
    struct group_work w;
    group_work_alloc(&w, a->T, hs, a->groups);
    float *o = dm_alloc((size_t)GROUP_TILE * hs * sizeof(float));
    for (long item = begin; item < end; item++) group_forward_item(a, &w, item, o);
    dm_free(o);
    group_work_free(&w);
}

static long sum_tiles(const long *tiles, long n)
{
    long total = 0;
    for (long i = 0; i < n; i++) total += tiles[i];
    return total;
}

long group_attention_forward(float *out, float *lse, int *order, int *group, long *alone,
                             const float *qkv, const float *rotation, int B, int T, int C, int NH,
                             int groups)
{
    DM_ASSERT(groups >= 1 && (groups == 1 || groups % 2 == 0) && C % NH == 0);
    long items = (long)B * NH;
    long *tiles = dm_alloc(2 * (size_t)items * sizeof(long));
    struct group_args a = {.out = out, .lse = lse, .order = order, .group = group,
                          .tiles = tiles, .alone = tiles + items, .qkv = qkv,
                          .rotation = groups > 1 ? rotation : NULL,
                          .B = B, .T = T, .C = C, .NH = NH, .groups = groups};
    dm_parallel_for(items, 1, group_forward_range, &a);
    long total = sum_tiles(tiles, items);
    if (alone) *alone = sum_tiles(tiles + items, items);
    dm_free(tiles);
    return total;
}

/* The backward's probabilities and score gradients over a run, in place:
 * s (scores) becomes P = exp(s - lse) on each row's range, dp (dO V^T)
 * becomes dS = scale P (dP - delta); both exact zeros elsewhere. */
static void backward_scores(struct group_work *w, int r0, int rows, int c0, int c1, int T,
                            float scale)
{
    for (int k = 0; k < rows; k++) {
        float *p = w->s + (long)k * T, *d = w->dp + (long)k * T;
        int lo = 0, hi = 0;
        if (row_in_run(w, k, c0, c1)) {
            lo = w->lo[k] - c0;
            hi = w->hi[k] - c0;
        }
        float lse = w->lse[r0 + k], delta = w->delta[r0 + k];
        for (int j = lo; j < hi; j++) {
            p[j] = exp_lanes(p[j] - lse);
            d[j] = scale * (p[j] * (d[j] - delta));
        }
        memset(p, 0, (size_t)lo * sizeof(float));
        memset(d, 0, (size_t)lo * sizeof(float));
        memset(p + hi, 0, (size_t)(c1 - c0 - hi) * sizeof(float));
        memset(d + hi, 0, (size_t)(c1 - c0 - hi) * sizeof(float));
    }
}

/* One run of a query tile's backward: dQ, dK, dV of the sorted rows. */
static void backward_run(struct group_work *w, int r0, int rows, int c0, int c1, int T, int hs,
                         float scale)
{
    int n = c1 - c0;
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, rows, n, hs, scale,
                w->qs + (long)r0 * hs, hs, w->kt + c0, T, 0.0f, w->s, T);
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, rows, n, hs, 1.0f,
                w->dos + (long)r0 * hs, hs, w->vt + c0, T, 0.0f, w->dp, T);
    backward_scores(w, r0, rows, c0, c1, T, scale);
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, rows, hs, n, 1.0f, w->dp, T,
                w->ks + (long)c0 * hs, hs, 1.0f, w->dqs + (long)r0 * hs, hs);
    cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, n, hs, rows, 1.0f, w->dp, T,
                w->qs + (long)r0 * hs, hs, 1.0f, w->dks + (long)c0 * hs, hs);
    cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, n, hs, rows, 1.0f, w->s, T,
                w->dos + (long)r0 * hs, hs, 1.0f, w->dvs + (long)c0 * hs, hs);
}

/* The sorted copies the backward of item (b, h) reads, and lse, delta =
 * dO . O per sorted query; the sorted gradients zeroed. */
static void backward_gather(const struct group_args *a, struct group_work *w, long item)
{
    int T = a->T, C = a->C, NH = a->NH, hs = C / NH;
    long b = item / NH, h = item % NH;
    const int *qo = a->order_in + item * 2L * T, *ko = qo + T;
    const float *base = a->qkv + b * T * 3L * C + h * hs;
    gather_sorted(w->qs, base, qo, T, hs, 3L * C);
    gather_sorted_transposed(w->kt, base + C, ko, T, hs, 3L * C);
    gather_sorted(w->ks, base + C, ko, T, hs, 3L * C);
    gather_sorted_transposed(w->vt, base + 2 * C, ko, T, hs, 3L * C);
    gather_sorted(w->dos, a->dout + b * T * (long)C + h * hs, qo, T, hs, C);
    for (int i = 0; i < T; i++) {
        const float *o = a->out_in + (b * T + qo[i]) * (long)C + h * hs;
        const float *d = w->dos + (long)i * hs;
        float dd = 0.0f;
        for (int k = 0; k < hs; k++) dd += d[k] * o[k];
        w->delta[i] = dd;
        w->lse[i] = a->lse_in[item * (long)T + qo[i]];
    }
    memset(w->dqs, 0, 3 * (size_t)T * hs * sizeof(float));   /* dqs, dks, dvs */
    for (int j = 0; j < T; j++) w->kinv[ko[j]] = j;
}

/* The own-key pairs of a query tile outside their rows' ranges: p =
 * exp(s - lse), ds = scale p (dO . v - delta) into dQ, dK and dV, like
 * backward_scores and backward_run for one pair (v, the value at the
 * query's position, from vbase with ld 3C). */
static void backward_own_keys(struct group_work *w, const int *qo, int r0, int rows, int hs,
                              const float *vbase, long ld, float scale)
{
    for (int k = 0; k < rows; k++) {
        if (!w->own[k]) continue;
        int i = r0 + k, pos = qo[i], j = w->kinv[pos];
        const float *v = vbase + pos * ld, *dy = w->dos + (long)i * hs;
        const float *q = w->qs + (long)i * hs, *key = w->ks + (long)j * hs;
        float p = exp_lanes(w->own_s[k] - w->lse[i]), dp = 0.0f;
        for (int d = 0; d < hs; d++) dp += dy[d] * v[d];
        float ds = scale * (p * (dp - w->delta[i]));
        float *dq = w->dqs + (long)i * hs, *dk = w->dks + (long)j * hs, *dv = w->dvs + (long)j * hs;
        for (int d = 0; d < hs; d++) {
            dq[d] += ds * key[d];
            dk[d] += ds * q[d];
            dv[d] += p * dy[d];
        }
    }
}

static void group_backward_item(const struct group_args *a, struct group_work *w, long item)
{
    int T = a->T, C = a->C, NH = a->NH, hs = C / NH;
    long b = item / NH, h = item % NH;
    float scale = (float)(1.0 / sqrt((double)hs));
    const int *qo = a->order_in + item * 2L * T, *ko = qo + T;
    const int *qb = a->group_in + item * 2L * T, *kb = qb + T;
    const float *in = a->qkv + b * T * 3L * C + h * hs;
    backward_gather(a, w, item);
    group_starts(w->kstart, ko, kb, T, a->groups);
    long tiles = 0;
    for (int r0 = 0; r0 < T; r0 += GROUP_TILE) {
        int rows = r0 + GROUP_TILE < T ? GROUP_TILE : T - r0;
        tiles += tile_plan(w, qo, qb, ko, r0, r0 + rows, T);
        own_key_plan(w, qo, qb, kb, r0, rows, hs, in + C, 3L * C, scale);
        int t = 0, c0, c1;
        while (next_run(w, &t, T, &c0, &c1)) backward_run(w, r0, rows, c0, c1, T, hs, scale);
        backward_own_keys(w, qo, r0, rows, hs, in + 2 * C, 3L * C, scale);
    }
    float *base = a->dqkv + b * T * 3L * C + h * hs;
    scatter_sorted(base, w->dqs, qo, T, hs, 3L * C);
    scatter_sorted(base + C, w->dks, ko, T, hs, 3L * C);
    scatter_sorted(base + 2 * C, w->dvs, ko, T, hs, 3L * C);
    a->tiles[item] = tiles;
}

static void group_backward_range(void *arg, long begin, long end)
{
    const struct group_args *a = arg;
    int T = a->T, groups = 1;
    /* the group count is not an argument: the largest group used + 1
     * (sorted, so the last query's or key's) */
    for (long item = begin; item < end && T > 0; item++) {
        const int *qo = a->order_in + item * 2L * T, *qb = a->group_in + item * 2L * T;
        int last = qb[qo[T - 1]] > qb[T + qo[2 * T - 1]] ? qb[qo[T - 1]] : qb[T + qo[2 * T - 1]];
        if (last + 1 > groups) groups = last + 1;
    }
    struct group_work w;
    group_work_alloc(&w, T, a->C / a->NH, groups);
    struct group_args local = *a;
    local.groups = groups;
    for (long item = begin; item < end; item++) group_backward_item(&local, &w, item);
    group_work_free(&w);
}

long group_attention_backward(float *dqkv, const float *dout, const float *qkv, const float *out,
                              const float *lse, const int *order, const int *group, int B,
                              int T, int C, int NH)
{
    long items = (long)B * NH;
    long *tiles = dm_alloc((size_t)items * sizeof(long));
    struct group_args a = {.dqkv = dqkv, .tiles = tiles, .qkv = qkv, .dout = dout,
                          .out_in = out, .lse_in = lse, .order_in = order, .group_in = group,
                          .B = B, .T = T, .C = C, .NH = NH};
    dm_parallel_for(items, 1, group_backward_range, &a);
    long total = sum_tiles(tiles, items);
    dm_free(tiles);
    return total;
}

double group_attention_even_share(int tokens, int groups)
{
    double nt = ceil(tokens / (double)GROUP_TILE);
    if (groups <= 1 || nt <= 0) return 1.0;
    double per_group = ceil(ceil((double)tokens / groups) / GROUP_TILE);
    double share = groups * per_group * (per_group + 1) / (nt * (nt + 1));
    return share < 1 ? share : 1.0;
}
