/* moe.c — the FFN of a PI2_ARCH_MOE layer (docs/moe.md §2; pi2/reference/moe.py and moe_routing.py): the router's
 * logits, gating (softmax with ggml's AVX-512 exp and libm tail, sigmoid, softmax_weight, sqrt_softplus), the
 * top k of libstdc++'s std::sort on the expert indices (so tied scores fall as llama.cpp leaves them), the weights
 * (normalised in double with ggml's clamp, scaled), each selected expert's SwiGLU/ReGLU FFN with the step's rows
 * grouped by expert (moe_mm.c), the weighted sum in slot order, and the shared expert; and qwen3's dense FFN.
 * Also the context's MoE buffers. Every result is computed the same way whichever thread computes it.
 * Over 400 lines: the routing and the grouped expert products share the step's buffers and their layout (moe.h);
 * the buffers' sizing moving to a file of its own is the next split. */
#include "ffn/moe.h"
#include "internal.h"
#include "kernels/ggml_order.h"
#include "ops.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#define TRACE(name, il, ptr, count) \
    do { if (c->trace) c->trace(name, il, ptr, (int64_t)(count), c->trace_user); } while (0)

/* ---------------------------------------------------------------- buffers */

static int64_t max64(int64_t a, int64_t b) { return a > b ? a : b; }

size_t pi2_moe_act_bytes(int32_t type, int64_t n) {
    size_t b = (size_t)n * sizeof(float);
    const pi2_type_traits *t = pi2_traits(type, PI2_K_IMPL_REF);
    if (type != PI2_T_F32 && type != PI2_T_F16 && t && t->vec_dot_type != type) {
        const pi2_type_traits *a = pi2_traits(t->vec_dot_type, PI2_K_IMPL_REF);
        b = (size_t)((n + a->block_size - 1) / a->block_size) * (size_t)a->type_size;
    }
    return (b + 63) / 64 * 64;
}

typedef struct { void **ptr; size_t bytes; } moe_buffer;
enum { N_MOE_BUFFERS = 15 };

static void moe_buffers(struct pi2_moe *moe, const pi2_model *m, const pi2_ctx_params *p, moe_buffer *out) {
    const pi2_model_params *hp = &m->hp;
    const size_t B = (size_t)(p->n_batch < p->n_ctx ? p->n_batch : p->n_ctx);
    const size_t k = (size_t)(hp->n_expert ? hp->n_expert_used : 1), X = (size_t)(hp->n_expert ? hp->n_expert : 1);
    const size_t F = (size_t)max64(max64(hp->n_ff_exp, hp->n_ff_shexp), hp->n_expert ? 0 : hp->n_ff);
    const size_t W = (size_t)max64(max64((int64_t)F, hp->n_embd), (int64_t)hp->n_head * max64(hp->head_dim, hp->head_dim_v));
    /* xa: the widest prep of a step (its rows a tight stride each time, pi2_moe_act_bytes): a dense product's B rows
     * as floats (an upper bound for every format), or gate and up's B rows, or down's B·k rows in their formats */
    moe->xa_row = pi2_moe_act_bytes(PI2_T_F32, (int64_t)W);
    size_t xa = B * moe->xa_row;
    for (int32_t il = 0; il < hp->n_layer && hp->n_expert; il++) {
        const pi2_layer *L = &m->layers[il];
        const size_t gu = B * pi2_moe_act_bytes(L->gate_exps.type, hp->n_embd),
                     up = B * pi2_moe_act_bytes(L->up_exps.type, hp->n_embd),
                     dn = B * k * pi2_moe_act_bytes(L->down_exps.type, hp->n_ff_exp);
        xa = xa > gu ? xa : gu;
        xa = xa > up ? xa : up;
        xa = xa > dn ? xa : dn;
    }
    const moe_buffer list[N_MOE_BUFFERS] = {
        {(void **)&moe->logits, B * X * 4}, {(void **)&moe->probs, B * X * 4}, {(void **)&moe->sel, B * k * 4},
        {(void **)&moe->wts, B * k * 4}, {(void **)&moe->count, X * 4}, {(void **)&moe->start, (X + 1) * 4},
        {(void **)&moe->list, B * k * 4}, {(void **)&moe->active, X * 4}, {(void **)&moe->gate, B * k * F * 4},
        {(void **)&moe->up, B * k * F * 4}, {(void **)&moe->down, B * k * (size_t)hp->n_embd * 4},
        {(void **)&moe->sh, B * (size_t)hp->n_embd * 4}, {(void **)&moe->shg, B * 4},
        {(void **)&moe->xa, xa}, {(void **)&moe->routed, (size_t)hp->n_layer * X * 8}};
    memcpy(out, list, sizeof list);
}

size_t pi2_moe_bytes(const pi2_model *m, const pi2_ctx_params *p) {
    if (m->hp.arch != PI2_ARCH_MOE) return 0;
    struct pi2_moe dummy;
    moe_buffer list[N_MOE_BUFFERS];
    moe_buffers(&dummy, m, p, list);
    size_t total = sizeof dummy;
    for (int i = 0; i < N_MOE_BUFFERS; i++) total += list[i].bytes;
    return total;
}

void pi2_moe_free(struct pi2_moe *moe) {
    if (!moe) return;
    void *bufs[N_MOE_BUFFERS] = {moe->logits, moe->probs, moe->sel, moe->wts, moe->count, moe->start, moe->list,
                                 moe->active, moe->gate, moe->up, moe->down, moe->sh, moe->shg, moe->xa, moe->routed};
    for (int i = 0; i < N_MOE_BUFFERS; i++) free(bufs[i]);
    pi2_moe_stream_free(moe->stream);
    free(moe);
}

pi2_status pi2_moe_new(const pi2_model *m, const pi2_ctx_params *p, struct pi2_moe **out) {
    *out = NULL;
    if (m->hp.arch != PI2_ARCH_MOE) return PI2_OK;
    struct pi2_moe *moe = calloc(1, sizeof *moe);
    if (!moe) return pi2_set_error(PI2_ERR_NOMEM, "out of memory for the expert buffers");
    moe->k = m->hp.n_expert ? m->hp.n_expert_used : 1;
    moe->X = m->hp.n_expert ? m->hp.n_expert : 1;
    moe_buffer list[N_MOE_BUFFERS];
    moe_buffers(moe, m, p, list);
    for (int i = 0; i < N_MOE_BUFFERS; i++)
        if (!(*list[i].ptr = calloc(list[i].bytes ? list[i].bytes : 1, 1))) {
            pi2_moe_free(moe);
            return pi2_set_error(PI2_ERR_NOMEM, "out of memory for the expert buffers");
        }
    *out = moe;
    return PI2_OK;
}

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
static void route(const pi2_model_params *hp, struct pi2_moe *moe, int32_t t, int32_t *idx) {
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

/* count, start, list and active from sel (n tokens): mul_mat_id's grouping, experts ascending, rows in scan order. */
static void group_rows(struct pi2_moe *moe, int32_t n) {
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

/* ---------------------------------------------------------------- activations and the FFNs */

void pi2_moe_activate(float *g, const float *u, int64_t n, int32_t act) {
    if (act == PI2_ACT_RELU) {
        for (int64_t i = 0; i < n; i++) g[i] = g[i] > 0.0f ? g[i] * u[i] : 0.0f;
        return;
    }
    const int64_t n16 = n - n % 16;
    pi2_ffn_activate(g, u, n16, PI2_ACT_SILU, NULL);
    for (int64_t i = n16; i < n; i++) g[i] = (g[i] / (1.0f + expf(-g[i]))) * u[i];
}

typedef struct {
    float *g;
    const float *u;
    int64_t n;
    int32_t act, rows_per_task, n_rows;
} act_job;

static void act_task(void *arg, int32_t task, int32_t thread) {
    (void)thread;
    const act_job *j = arg;
    const int32_t r0 = task * j->rows_per_task, r1 = r0 + j->rows_per_task < j->n_rows ? r0 + j->rows_per_task : j->n_rows;
    for (int32_t r = r0; r < r1; r++) pi2_moe_activate(j->g + (size_t)r * j->n, j->u + (size_t)r * j->n, j->n, j->act);
}

static void activate_rows(pi2_ctx *c, float *g, const float *u, int32_t n_rows, int64_t n, int32_t act) {
    const int32_t n_tasks = n_rows < 4 * pi2_pool_n_threads(c->pool) ? n_rows : 4 * pi2_pool_n_threads(c->pool);
    act_job j = {g, u, n, act, (n_rows + n_tasks - 1) / n_tasks, n_rows};
    if (n_tasks == 1) act_task(&j, 0, 0);
    else pi2_pool_run(c->pool, act_task, &j, (n_rows + j.rows_per_task - 1) / j.rows_per_task);
}

/* y[t] = down(act(gate·h) ⊙ up·h) for n rows of h: a dense SwiGLU FFN in the MoE family's products. */
static void dense_ffn(pi2_ctx *c, const pi2_weight *gate, const pi2_weight *up, const pi2_weight *down, const float *h,
                      int32_t n, float *y) {
    struct pi2_moe *moe = c->moe;
    pi2_moe_matmul(c, h, n, (pi2_mm[]){{gate, moe->gate}, {up, moe->up}}, 2);
    activate_rows(c, moe->gate, moe->up, n, gate->n_out, PI2_ACT_SILU);
    pi2_moe_matmul(c, moe->gate, n, &(pi2_mm){down, y}, 1);
}

void pi2_moe_routed(const pi2_ctx *c, int64_t *out) {
    const pi2_model_params *hp = &c->m->hp;
    const size_t n = (size_t)hp->n_layer * (size_t)hp->n_expert;
    if (c->moe && hp->n_expert) memcpy(out, c->moe->routed, n * sizeof *out);
}

void pi2_moe_router_early(pi2_ctx *c, const pi2_layer *L, int32_t il, const float *x, int32_t n) {
    pi2_moe_matmul(c, x, n, &(pi2_mm){&L->router, c->moe->logits}, 1);
    TRACE("ffn_moe_logits", il, c->moe->logits, (int64_t)n * c->moe->X);
}

void pi2_moe_keep_rows(pi2_ctx *c, int32_t first, int32_t n) {
    if (!c->m->hp.router_before_attn || !first) return;
    const size_t X = (size_t)c->moe->X;
    memmove(c->moe->logits, c->moe->logits + (size_t)first * X, (size_t)(n - first) * X * sizeof(float));
}

pi2_status pi2_moe_ffn(pi2_ctx *c, const pi2_layer *L, int32_t il, int32_t n) {
    const pi2_model_params *hp = &c->m->hp;
    struct pi2_moe *moe = c->moe;
    const int64_t E = hp->n_embd;
    if (!hp->n_expert) {
        dense_ffn(c, &L->gate, &L->up, &L->down, c->xn, n, c->o);
        return PI2_OK;
    }
    const int32_t k = moe->k;
    if (!hp->router_before_attn) {
        pi2_moe_matmul(c, c->xn, n, &(pi2_mm){&L->router, moe->logits}, 1);
        TRACE("ffn_moe_logits", il, moe->logits, (int64_t)n * moe->X);
    }
    int32_t idx[1024];
    for (int32_t t = 0; t < n; t++) route(hp, moe, t, idx);
    TRACE("ffn_moe_weights", il, moe->wts, (int64_t)n * k);
    group_rows(moe, n);
    for (int32_t e = 0; e < moe->X; e++) moe->routed[(size_t)il * moe->X + e] += moe->count[e];

    const int64_t F = hp->n_ff_exp;
    if (c->pipeline && L->gate_exps.data) {   /* the experts come from the expert cache (moe_stream.c) */
        const pi2_status s = pi2_moe_stream_experts(c, L, il, n);
        if (s) return s;
    } else {
        /* gate and up of every (token, slot) by its expert, then the activation, then down */
        if (pi2_moe_relu_ok(c, L, n)) {   /* ReLU experts: up rows of the neurons a gate opened (moe_relu.c) */
            pi2_moe_relu_gate_up(c, L, il, n);
        } else if (L->gate_exps.type == L->up_exps.type) {
            pi2_moe_prep(c, L->gate_exps.type, c->xn, n, E);
            pi2_moe_experts(c, (const pi2_weight *[]){&L->gate_exps, &L->up_exps}, (float *[]){moe->gate, moe->up}, 2, 1);
        } else {
            pi2_moe_prep(c, L->up_exps.type, c->xn, n, E);
            pi2_moe_experts(c, (const pi2_weight *[]){&L->up_exps}, (float *[]){moe->up}, 1, 1);
            pi2_moe_prep(c, L->gate_exps.type, c->xn, n, E);
            pi2_moe_experts(c, (const pi2_weight *[]){&L->gate_exps}, (float *[]){moe->gate}, 1, 1);
        }
        if (moe->neuron_counts || moe->cluster_counts) pi2_moe_count_neurons(c, il);   /* pi2 convert's profile */
        activate_rows(c, moe->gate, moe->up, n * k, F, hp->expert_act);
        if (L->down_rows_exps.data) {   /* a converted file: down rows of the bundles (moe_down_rows.c) */
            pi2_moe_down_rows(c, L, n);
        } else {
            pi2_moe_prep(c, L->down_exps.type, moe->gate, n * k, F);
            pi2_moe_experts(c, (const pi2_weight *[]){&L->down_exps}, (float *[]){moe->down}, 1, 0);
        }
    }

    /* y_t = Σ_j w_j·down_j in slot order (ggml_mul, then the adds) */
    for (int32_t t = 0; t < n; t++) {
        float *y = c->o + (size_t)t * E;
        const float *w = moe->wts + (size_t)t * k;
        const float *d = moe->down + (size_t)t * k * E;
        for (int64_t i = 0; i < E; i++) y[i] = d[i] * w[0];
        for (int32_t j = 1; j < k; j++)
            for (int64_t i = 0; i < E; i++) y[i] = y[i] + d[(size_t)j * E + i] * w[j];
    }
    TRACE("ffn_moe_out", il, c->o, (int64_t)n * E);

    if (L->gate_sh.data) {   /* the shared expert (qwen2moe: × silu(t)/t, t = gate_inp_shexp · h) */
        dense_ffn(c, &L->gate_sh, &L->up_sh, &L->down_sh, c->xn, n, moe->sh);
        for (int32_t t = 0; t < n; t++) {
            float *sh = moe->sh + (size_t)t * E;
            if (L->gate_inp_sh) {
                const float g = pi2_go_dot_f32(E, L->gate_inp_sh, c->xn + (size_t)t * E);
                const float f = (g / (1.0f + expf(-g))) / g;
                for (int64_t i = 0; i < E; i++) sh[i] = sh[i] * f;
            }
        }
        TRACE("ffn_shexp", il, moe->sh, (int64_t)n * E);
        for (int64_t i = 0; i < (int64_t)n * E; i++) c->o[i] = c->o[i] + moe->sh[i];
    }
    return PI2_OK;
}
