/* ffn/select.c — the active set of one token of a layer by the context's rule (threshold, top-k, ReLU, all,
 *       predicted, predictor): its score (act(gate), or act(gate)·up), then its active neurons in ascending order.
 * Does not: compute gate or up rows (ffn/sparse.c), choose P (ffn/predicted.c) or PowerInfer's set (ffn/pwri.c).
 * Invariants: the scores follow pi2_ffn_activate's float operations; top-k breaks ties by the lower index. */
#include "ffn/select.h"

#include "context.h"
#include "ffn/predicted.h"
#include "internal.h"
#include "ops.h"

#include <math.h>

static void swap_f(float *a, float *b) { const float t = *a; *a = *b; *b = t; }

/* The k-th largest (k >= 1) of v[0..n), reordering v. */
static float kth_largest(float *v, int64_t n, int64_t k) {
    int64_t lo = 0, hi = n - 1;
    const int64_t want = k - 1;
    while (lo < hi) {
        const int64_t mid = lo + (hi - lo) / 2;   /* median of three as the pivot */
        if (v[mid] > v[lo]) swap_f(&v[mid], &v[lo]);
        if (v[hi] > v[lo]) swap_f(&v[hi], &v[lo]);
        if (v[mid] > v[hi]) swap_f(&v[mid], &v[hi]);
        const float pivot = v[hi];
        int64_t i = lo, j = hi;
        while (i <= j) {                          /* descending: larger values to the left */
            while (v[i] > pivot) i++;
            while (v[j] < pivot) j--;
            if (i <= j) { swap_f(&v[i], &v[j]); i++; j--; }
        }
        if (want <= j) hi = j;
        else if (want >= i) lo = i;
        else return v[want];
    }
    return v[want];
}

void pi2_ffn_select(pi2_ctx *c, int32_t il, int32_t t) {
    const int64_t F = c->m->hp.n_ff;
    const float *g = c->gate + (size_t)t * F, *u = c->up + (size_t)t * F;
    float *s = c->ffn_score + (size_t)t * F, *keys = c->gate + (size_t)t * F;   /* g is not needed after s */
    int32_t *idx = c->ffn_idx + (size_t)t * F, n = 0;
    const int32_t act = c->m->hp.ffn_act;
    pi2_ffn_act_values(s, g, F, act, c->m->gelu_table);
    if (c->ffn.score_up)
        for (int64_t i = 0; i < F; i++) s[i] = s[i] * pi2_ffn_up_factor(u[i], act);   /* h, as pi2_ffn_activate */
    switch (c->ffn.rule) {
    case PI2_FFN_DENSE:
        for (int64_t i = 0; i < F; i++) idx[n++] = (int32_t)i;
        break;
    case PI2_FFN_RELU:
        for (int64_t i = 0; i < F; i++) if (g[i] > 0.0f) idx[n++] = (int32_t)i;
        break;
    case PI2_FFN_THRESHOLD: {
        const float thr = c->ffn.thresholds[il];
        for (int64_t i = 0; i < F; i++) if (fabsf(s[i]) > thr) idx[n++] = (int32_t)i;
        break;
    }
    case PI2_FFN_TOPK: {   /* the keys go over g (combine_task overwrites it with h anyway) */
        double kd = ceil((double)c->ffn.keep * (double)F - 1e-9);
        const int64_t k = kd < 1 ? 1 : kd > (double)F ? F : (int64_t)kd;
        for (int64_t i = 0; i < F; i++) keys[i] = fabsf(s[i]);
        const float kth = kth_largest(keys, F, k);
        int64_t above = 0;
        for (int64_t i = 0; i < F; i++) above += fabsf(s[i]) > kth;
        int64_t ties = k - above;
        for (int64_t i = 0; i < F; i++) {
            const float a = fabsf(s[i]);
            if (a > kth || (a == kth && ties-- > 0)) idx[n++] = (int32_t)i;
        }
        break;
    }
    case PI2_FFN_PREDICTED_GATE:   /* a batch: every gate row was computed; P from ffn/predicted.c */
        n = pi2_ffn_pred_select(c, il, t, s, idx);
        break;
    case PI2_FFN_PWRI_PREDICTOR:   /* a batch: ffn/pwri.c chose the active neurons before the gate rows */
        n = c->ffn_n_active[t];
        break;
    }
    c->ffn_n_active[t] = n;
}
