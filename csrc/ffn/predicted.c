/* ffn/predicted.c — the PI2_FFN_PREDICTED_GATE rule: a pi2-made predictor guesses each token's set P of neurons worth a
 * gate row; only those gate rows are computed (one token), and active = P ∩ {|act(gate)| > t_L}.
 * Does: the rule's parameters and buffers; the predictor's input (ffn_norm(h), or attn_norm of the layer's input
 *       kept by forward.c); ĝ = the low-bit gate copy · Q8_0(z) (kernels/lowbit.c) or fc2·(fc1·z) (pi2_matmul);
 *       P = {|act(ĝ_i)| > t_L − m_L}; the gate rows of P; the active set; |P| per layer for the statistics.
 *       One token's gate rows of P come from ffn/gate_rows.c (mapped, or streamed through the read pipeline:
 *       two-phase loading).
 * Does not: up rows, h or down (ffn/sparse.c computes them for the active set as for every rule).
 * Float order: pi2/reference/sparse_ffn.py (rule `predicted`) and pi2/convert/predictor.py, bit for bit; every value is
 *       computed by one task whichever thread runs it. */
#include "ffn/predicted.h"

#include "context.h"
#include "ffn/gate_rows.h"
#include "internal.h"
#include "kernels/lowbit.h"
#include "ops.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#define PRED_ROWS 64    /* low-bit rows per task */

struct pi2_ffn_pred {
    int32_t kind, input;
    pi2_lowbit_dot_fn lowbit;   /* PI2_PRED_LOWBIT: the kernel of the file's bits */
    size_t zq_row;              /* bytes of one Q8_0 row of n_embd values */
    size_t gq_row;              /* bytes of the largest gate activation row */
    float *cuts;                /* [n_layer] t_L − m_L */
    float *z;                   /* [B][n_embd] attn_norm of the layer's input (input 1) */
    float *ghat;                /* [B][n_ff] ĝ, then act(ĝ) */
    float *hid;                 /* [B][r_max] fc1·z */
    uint8_t *zq;                /* [B][zq_row] z as Q8_0 (low-bit) */
    uint8_t *gq;                /* [gq_row] one token's x in the gate's activation format */
    int32_t *P;                 /* [B][n_ff] predicted neurons of each token, ascending */
    int32_t *n_P;               /* [B] */
    float *gc;                  /* [n_ff] one token's gate values of P, in P's order */
    int64_t *predicted;         /* [n_layer] |P| summed over tokens since pi2_ctx_set_ffn */
};

typedef struct {
    pi2_ctx *c;
    const pi2_layer *L;
    int32_t il, n_tok;
} pred_job;

void pi2_ffn_pred_free(struct pi2_ffn_pred *pred) {
    if (!pred) return;
    void *bufs[] = {pred->cuts, pred->z, pred->ghat, pred->hid, pred->zq, pred->gq, pred->P, pred->n_P, pred->gc,
                    pred->predicted};
    for (size_t i = 0; i < sizeof bufs / sizeof bufs[0]; i++) free(bufs[i]);
    free(pred);
}

enum { N_PRED_BUFFERS = 10 };

/* The rule's buffers for a context of params p (n_batch capped): bytes of cuts, z, ghat, hid, zq, gq, P, n_P, gc,
 * predicted, in that order (pi2_ctx_query adds them up). */
static void pred_sizes(const pi2_model *m, const pi2_ctx_params *p, size_t *out) {
    const pi2_model_params *hp = &m->hp;
    const size_t B = (size_t)p->n_batch, F = (size_t)hp->n_ff, E = (size_t)hp->n_embd, L = (size_t)hp->n_layer;
    int64_t r_max = 0;
    size_t gq_row = 0;
    for (int32_t il = 0; il < hp->n_layer; il++) {
        const pi2_layer *layer = &m->layers[il];
        if (layer->fc1.n_out > r_max) r_max = layer->fc1.n_out;
        const pi2_type_traits *a = pi2_traits(pi2_traits(layer->gate.type, p->impl)->vec_dot_type, p->impl);
        const size_t rb = (size_t)(layer->gate.n_in / a->block_size) * (size_t)a->type_size;
        if (rb > gq_row) gq_row = rb;
    }
    const size_t sizes[N_PRED_BUFFERS] = {L * sizeof(float), B * E * sizeof(float), B * F * sizeof(float),
                                          B * (size_t)(r_max ? r_max : 1) * sizeof(float),
                                          B * (E / QK8_0 * sizeof(blk_q8_0)), gq_row, B * F * sizeof(int32_t),
                                          B * sizeof(int32_t), F * sizeof(float), L * sizeof(int64_t)};
    for (int i = 0; i < N_PRED_BUFFERS; i++) out[i] = sizes[i];
}

size_t pi2_ffn_pred_bytes(const pi2_model *m, const pi2_ctx_params *p) {
    int has = 0;
    for (int32_t il = 0; il < m->hp.n_layer; il++) has |= m->layers[il].gate_pred.data || m->layers[il].fc1.data;
    if (!has) return 0;
    size_t sizes[N_PRED_BUFFERS], sum = sizeof(struct pi2_ffn_pred);
    pred_sizes(m, p, sizes);
    for (int i = 0; i < N_PRED_BUFFERS; i++) sum += sizes[i];
    return sum;
}

static pi2_status alloc_pred(pi2_ctx *c) {
    const size_t E = (size_t)c->m->hp.n_embd;
    size_t sizes[N_PRED_BUFFERS];
    pred_sizes(c->m, &c->p, sizes);
    struct pi2_ffn_pred *p = calloc(1, sizeof *p);
    if (!p) return pi2_set_error(PI2_ERR_NOMEM, "out of memory for the FFN predictor");
    p->zq_row = E / QK8_0 * sizeof(blk_q8_0);
    p->gq_row = sizes[5];
    void **bufs[N_PRED_BUFFERS] = {(void **)&p->cuts, (void **)&p->z, (void **)&p->ghat, (void **)&p->hid,
                                   (void **)&p->zq, (void **)&p->gq, (void **)&p->P, (void **)&p->n_P,
                                   (void **)&p->gc, (void **)&p->predicted};
    for (int i = 0; i < N_PRED_BUFFERS; i++) *bufs[i] = calloc(sizes[i] ? sizes[i] : 1, 1);
    if (!p->cuts || !p->z || !p->ghat || !p->hid || !p->zq || !p->gq || !p->P || !p->n_P || !p->gc || !p->predicted) {
        pi2_ffn_pred_free(p);
        return pi2_set_error(PI2_ERR_NOMEM, "out of memory for the FFN predictor");
    }
    c->ffn_pred = p;
    return PI2_OK;
}

pi2_status pi2_ffn_pred_set(pi2_ctx *c, const pi2_ffn_params *p) {
    const pi2_model *m = c->m;
    if (p->pred_kind != PI2_PRED_LOWBIT && p->pred_kind != PI2_PRED_LOWRANK)
        return pi2_set_error(PI2_ERR_INVALID, "unknown predictor kind %d", (int)p->pred_kind);
    if (p->pred_input != 0 && p->pred_input != 1)
        return pi2_set_error(PI2_ERR_INVALID, "unknown predictor input %d", (int)p->pred_input);
    if (!p->pred_cuts || !p->thresholds)
        return pi2_set_error(PI2_ERR_INVALID, "the predicted rule needs a cut and a threshold per layer");
    if (p->score_up) return pi2_set_error(PI2_ERR_INVALID, "the predicted rule scores act(gate), not act(gate)·up");
    int32_t bits = 0;
    for (int32_t il = 0; il < m->hp.n_layer; il++) {
        const pi2_layer *L = &m->layers[il];
        if (p->pred_kind == PI2_PRED_LOWBIT) {
            const int32_t b = pi2_lowbit_bits(L->gate_pred.type);
            if (!L->gate_pred.data || (bits && b != bits))
                return pi2_set_error(PI2_ERR_INVALID, "layer %d has no low-bit predictor of the others' bits "
                                     "(blk.%d.ffn_gate_pred)", (int)il, (int)il);
            bits = b;
        } else if (!L->fc1.data) {
            return pi2_set_error(PI2_ERR_INVALID, "layer %d has no low-rank predictor (blk.%d.fc1/fc2)", (int)il, (int)il);
        }
    }
    if (!c->ffn_pred) {   /* once, for the largest rank the model has: one allocation serves both kinds */
        pi2_status s = alloc_pred(c);
        if (s) return s;
    }
    struct pi2_ffn_pred *pred = c->ffn_pred;
    pred->kind = p->pred_kind;
    pred->input = p->pred_input;
    pred->lowbit = p->pred_kind == PI2_PRED_LOWBIT ? pi2_lowbit_dot(bits, c->p.impl) : NULL;
    memcpy(pred->cuts, p->pred_cuts, (size_t)m->hp.n_layer * sizeof(float));
    memset(pred->predicted, 0, (size_t)m->hp.n_layer * sizeof(int64_t));
    return PI2_OK;
}

void pi2_ffn_pred_note_input(pi2_ctx *c, int32_t n) {
    if (c->ffn.rule == PI2_FFN_PREDICTED_GATE && c->ffn_pred->input == 1)
        memcpy(c->ffn_pred->z, c->xn, (size_t)n * (size_t)c->m->hp.n_embd * sizeof(float));
}

int64_t pi2_ffn_pred_count(const pi2_ctx *c, int32_t il) {
    return c->ffn_pred && c->ffn.rule == PI2_FFN_PREDICTED_GATE ? c->ffn_pred->predicted[il] : 0;
}

/* ---- ĝ ---- */

static void lowbit_task(void *arg, int32_t task, int32_t thread) {   /* PRED_ROWS rows of every token */
    (void)thread;
    const pred_job *j = arg;
    const struct pi2_ffn_pred *p = j->c->ffn_pred;
    const pi2_weight *w = &j->L->gate_pred;
    const int64_t F = w->n_out, r0 = (int64_t)task * PRED_ROWS, r1 = r0 + PRED_ROWS < F ? r0 + PRED_ROWS : F;
    for (int32_t t = 0; t < j->n_tok; t++)
        for (int64_t r = r0; r < r1; r++)
            p->lowbit(w->n_in, &p->ghat[(size_t)t * F + r], w->data + (size_t)r * w->row_bytes, p->zq + (size_t)t * p->zq_row);
}

/* token t: act(ĝ) in place, then P */
static void select_p_task(void *arg, int32_t t, int32_t thread) {
    (void)thread;
    const pred_job *j = arg;
    const pi2_ctx *c = j->c;
    struct pi2_ffn_pred *p = c->ffn_pred;
    const int64_t F = c->m->hp.n_ff;
    float *a = p->ghat + (size_t)t * F;
    int32_t *P = p->P + (size_t)t * F, n = 0;
    pi2_ffn_act_values(a, a, F, c->m->hp.ffn_act, c->m->gelu_table);
    const float cut = p->cuts[j->il];
    for (int64_t i = 0; i < F; i++) if (fabsf(a[i]) > cut) P[n++] = (int32_t)i;
    p->n_P[t] = n;
}

pi2_status pi2_ffn_predict(pi2_ctx *c, const pi2_layer *L, int32_t il, int32_t n, int *done) {
    struct pi2_ffn_pred *p = c->ffn_pred;
    const int64_t E = c->m->hp.n_embd, F = c->m->hp.n_ff;
    const float *z = p->input == 1 ? p->z : c->xn;
    pred_job j = {.c = c, .L = L, .il = il, .n_tok = n};
    if (p->kind == PI2_PRED_LOWBIT) {
        const pi2_type_traits *q8 = pi2_traits(PI2_T_Q8_0, c->p.impl);
        for (int32_t t = 0; t < n; t++) q8->quantize_act(z + (size_t)t * E, p->zq + (size_t)t * p->zq_row, E);
        pi2_pool_run(c->pool, lowbit_task, &j, (int32_t)((F + PRED_ROWS - 1) / PRED_ROWS));
    } else {
        pi2_matmul(&c->mm, z, n, &(pi2_mm){&L->fc1, p->hid}, 1);
        pi2_matmul(&c->mm, p->hid, n, &(pi2_mm){&L->fc2, p->ghat}, 1);
    }
    pi2_pool_run(c->pool, select_p_task, &j, n);
    for (int32_t t = 0; t < n; t++) p->predicted[il] += p->n_P[t];
    *done = n == 1;
    if (n > 1) return PI2_OK;
    /* one token: the gate rows of P only, then active = P ∩ {|act(gate)| > t_L}; act(gate) in P's order into ĝ */
    return pi2_ffn_one_token(c, L, il, p->P, p->n_P[0], &c->ffn.thresholds[il], p->gc, p->ghat, p->gq);
}

int32_t pi2_ffn_pred_select(const pi2_ctx *c, int32_t il, int32_t t, const float *s, int32_t *idx) {
    const struct pi2_ffn_pred *p = c->ffn_pred;
    const int32_t *P = p->P + (size_t)t * c->m->hp.n_ff, n = p->n_P[t];
    const float thr = c->ffn.thresholds[il];
    int32_t k = 0;
    for (int32_t i = 0; i < n; i++) if (fabsf(s[P[i]]) > thr) idx[k++] = P[i];
    return k;
}
