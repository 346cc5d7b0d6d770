/* moe_route.c — the routing of a PI2_ARCH_MOE layer's tokens (docs/moe.md §2; pi2/reference/moe_routing.py): from the
 * router's logits, the gating (softmax with ggml's AVX-512 exp and libm tail, sigmoid, softmax_weight, sqrt_softplus),
 * the top k of libstdc++'s std::sort on the expert indices (so tied scores fall as llama.cpp leaves them), the weights
 * (normalised in double with ggml's clamp, scaled), and the step's rows grouped by expert (mul_mat_id's order).
 * Does not: compute the router's logits or any expert product (moe.c, moe_mm.c), or own the buffers (moe.c). */
#include "ffn/moe.h"
#include "ops.h"

#include <math.h>
#include <string.h>

/* ---------------------------------------------------------------- gating */

static float reduce16(const float *v) {   /* _mm512_reduce_add_ps as GCC expands it */
    float r8[8], r4[4];
    for (int i = 0; i < 8; i++) r8[i] = v[8 + i] + v[i];
    for (int i = 0; i < 4; i++) r4[i] = r8[4 + i] + r8[i];
    return (r4[0] + r4[2]) + (r4[1] + r4[3]);
}

/* ggml_soft_max of one row (no mask, scale 1), in place: whole groups of 16 through ggml_v_expf, their sums (in
 * float) added into a double; the n % 16 tail through libm expf, each added into the double; then × (float)(1/sum). */
static void softmax_row(float *x, int64_t n) {
    float mx = -INFINITY;
    for (int64_t i = 0; i < n; i++) mx = x[i] > mx ? x[i] : mx;
    const int64_t n16 = n - n % 16;
    double sum = 0.0;
    pi2_exp_shifted(x, n16, mx);
    for (int64_t g = 0; g < n16; g += 16) sum += (double)reduce16(x + g);
    for (int64_t i = n16; i < n; i++) {
        x[i] = expf(x[i] - mx);
        sum += (double)x[i];
    }
    const float s = (float)(1.0 / sum);
    for (int64_t i = 0; i < n; i++) x[i] *= s;
}

static void gate_probs(float *p, const float *logits, int64_t n, int32_t gating) {
    memcpy(p, logits, (size_t)n * sizeof *p);
    switch (gating) {
    case PI2_GATING_SOFTMAX: softmax_row(p, n); break;
    case PI2_GATING_SIGMOID: for (int64_t i = 0; i < n; i++) p[i] = 1.0f / (1.0f + expf(-p[i])); break;
    case PI2_GATING_SQRT_SOFTPLUS:
        for (int64_t i = 0; i < n; i++) p[i] = sqrtf(p[i] > 20.0f ? p[i] : logf(1.0f + expf(p[i])));
        break;
    default: break;   /* softmax_weight: the logits; the softmax comes after the selection */
    }
}

/* ---------------------------------------------------------------- libstdc++'s std::sort, descending */

typedef struct { int32_t *a; const float *key; } sorter;
#define COMP(s, x, y) ((s)->key[x] > (s)->key[y])

static void median_to_first(sorter *s, int32_t result, int32_t i, int32_t j, int32_t k) {
    int32_t *a = s->a, m;
    const int32_t x = a[i], y = a[j], z = a[k];
    if (COMP(s, x, y)) m = COMP(s, y, z) ? j : (COMP(s, x, z) ? k : i);
    else if (COMP(s, x, z)) m = i;
    else m = COMP(s, y, z) ? k : j;
    const int32_t t = a[result]; a[result] = a[m]; a[m] = t;
}

static int32_t unguarded_partition(sorter *s, int32_t first, int32_t last, int32_t pivot) {
    int32_t *a = s->a;
    for (;;) {
        while (COMP(s, a[first], a[pivot])) first++;
        last--;
        while (COMP(s, a[pivot], a[last])) last--;
        if (!(first < last)) return first;
        const int32_t t = a[first]; a[first] = a[last]; a[last] = t;
        first++;
    }
}

static void linear_insert(sorter *s, int32_t last) {
    int32_t *a = s->a;
    const int32_t val = a[last];
    int32_t nxt = last - 1;
    while (COMP(s, val, a[nxt])) { a[last] = a[nxt]; last = nxt; nxt--; }
    a[last] = val;
}

static void insertion_sort(sorter *s, int32_t first, int32_t last) {
    int32_t *a = s->a;
    for (int32_t i = first + 1; i < last; i++) {
        if (COMP(s, a[i], a[first])) {
            const int32_t val = a[i];
            memmove(a + first + 1, a + first, (size_t)(i - first) * sizeof *a);
            a[first] = val;
        } else {
            linear_insert(s, i);
        }
    }
}

static void adjust_heap(sorter *s, int32_t first, int32_t hole, int32_t len, int32_t value) {
    int32_t *a = s->a;
    const int32_t top = hole;
    int32_t child = hole;
    while (child < (len - 1) / 2) {
        child = 2 * (child + 1);
        if (COMP(s, a[first + child], a[first + child - 1])) child--;
        a[first + hole] = a[first + child];
        hole = child;
    }
    if (len % 2 == 0 && child == (len - 2) / 2) {
        child = 2 * (child + 1);
        a[first + hole] = a[first + child - 1];
        hole = child - 1;
    }
    int32_t parent = (hole - 1) / 2;
    while (hole > top && COMP(s, a[first + parent], value)) {
        a[first + hole] = a[first + parent];
        hole = parent;
        parent = (hole - 1) / 2;
    }
    a[first + hole] = value;
}

static void heap_sort(sorter *s, int32_t first, int32_t last) {
    int32_t *a = s->a;
    const int32_t n = last - first;
    if (n >= 2)
        for (int32_t parent = (n - 2) / 2; parent >= 0; parent--) adjust_heap(s, first, parent, n, a[first + parent]);
    while (last - first > 1) {
        last--;
        const int32_t value = a[last];
        a[last] = a[first];
        adjust_heap(s, first, 0, last - first, value);
    }
}

static void introsort_loop(sorter *s, int32_t first, int32_t last, int32_t depth) {
    while (last - first > 16) {
        if (depth == 0) {
            heap_sort(s, first, last);
            return;
        }
        depth--;
        const int32_t mid = first + (last - first) / 2;
        median_to_first(s, first, first + 1, mid, last - 1);
        const int32_t cut = unguarded_partition(s, first + 1, last, first);
        introsort_loop(s, cut, last, depth);
        last = cut;
    }
}

/* idx = 0..n-1 sorted by descending key as std::sort(idx, comp(a, b) = key[a] > key[b]) leaves them. */
static void argsort_desc(int32_t *idx, const float *key, int32_t n) {
    for (int32_t i = 0; i < n; i++) idx[i] = i;
    if (n < 2) return;
    sorter s = {idx, key};
    int32_t lg = 0;
    while ((1 << (lg + 1)) <= n) lg++;
    introsort_loop(&s, 0, n, 2 * lg);
    if (n > 16) {
        insertion_sort(&s, 0, 16);
        for (int32_t i = 16; i < n; i++) linear_insert(&s, i);
    } else {
        insertion_sort(&s, 0, n);
    }
}

/* Token t's experts and weights (moe_routing.route). idx: scratch of n_expert. */
static void route_token(const pi2_model_params *hp, struct pi2_moe *moe, int32_t t, int32_t *idx) {
    const int32_t X = hp->n_expert, k = hp->n_expert_used;
    float *p = moe->probs + (size_t)t * X, *w = moe->wts + (size_t)t * k;
    int32_t *sel = moe->sel + (size_t)t * k;
    gate_probs(p, moe->logits + (size_t)t * X, X, hp->expert_gating);
    argsort_desc(idx, p, X);
    for (int32_t j = 0; j < k; j++) {
        sel[j] = idx[j];
        w[j] = p[idx[j]];
    }
    if (hp->expert_gating == PI2_GATING_SOFTMAX_WEIGHT) softmax_row(w, k);
    if (hp->expert_weights_norm) {
        double sum = 0.0;
        for (int32_t j = 0; j < k; j++) sum += (double)w[j];
        float s = (float)sum;
        s = s > 6.103515625e-5f ? s : 6.103515625e-5f;   /* ggml_clamp(sum, 2^-14, inf) */
        for (int32_t j = 0; j < k; j++) w[j] = w[j] / s;
    }
    if (hp->expert_weights_scale != 0.0f && hp->expert_weights_scale != 1.0f)
        for (int32_t j = 0; j < k; j++) w[j] *= hp->expert_weights_scale;
}

void pi2_moe_select(const pi2_model_params *hp, const float *logits, float *probs, int32_t *idx, int32_t *sel) {
    const int32_t X = hp->n_expert;
    gate_probs(probs, logits, X, hp->expert_gating);
    argsort_desc(idx, probs, X);
    memcpy(sel, idx, (size_t)hp->n_expert_used * sizeof *sel);
}

void pi2_moe_route(const pi2_model_params *hp, struct pi2_moe *moe, int32_t n) {
    int32_t idx[1024];
    for (int32_t t = 0; t < n; t++) route_token(hp, moe, t, idx);
}

/* count, start, list and active from sel (n tokens): mul_mat_id's grouping, experts ascending, rows in scan order. */
void pi2_moe_group_rows(struct pi2_moe *moe, int32_t n) {
    const int32_t X = moe->X, k = moe->k;
    memset(moe->count, 0, (size_t)X * sizeof *moe->count);
    for (int32_t i = 0; i < n * k; i++) moe->count[moe->sel[i]]++;
    moe->start[0] = 0;
    moe->n_active = 0;
    for (int32_t e = 0; e < X; e++) {
        moe->start[e + 1] = moe->start[e] + moe->count[e];
        if (moe->count[e]) moe->active[moe->n_active++] = e;
    }
    for (int32_t e = 0; e < X; e++) moe->count[e] = 0;
    for (int32_t i = 0; i < n * k; i++) {
        const int32_t e = moe->sel[i];
        moe->list[moe->start[e] + moe->count[e]++] = i;
    }
}
