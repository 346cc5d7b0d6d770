/* moe.c — the FFN of a PI2_ARCH_MOE layer (docs/moe.md §2; pi2/reference/moe.py): the router's logits, the routing
 * (moe_route.c), each selected expert's SwiGLU/ReGLU FFN with the step's rows grouped by expert (moe_mm.c), the
 * weighted sum in slot order, and the shared expert; and qwen3's dense FFN. Also the context's MoE buffers. Every
 * result is computed the same way whichever thread computes it.
 * Does not: gate, pick or weight the experts (moe_route.c), or pick a product's kernel (moe_mm.c). */
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
    pi2_moe_route(hp, moe, n);   /* each token's experts and weights (moe_route.c) */
    TRACE("ffn_moe_weights", il, moe->wts, (int64_t)n * k);
    pi2_moe_group_rows(moe, n);
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
