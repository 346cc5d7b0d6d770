/* ffn/pwri.c — the PI2_FFN_PWRI_PREDICTOR rule: PowerInfer's own predictor (PWRI files, and pi2 files converted from
 * them) chooses each token's active neurons before the FFN runs.
 * Does: the rule's buffers; s = fc2·relu(fc1·h) by pi2_matmul, like the model's own products, on the residual h
 *       before ffn_norm (c->x: forward.c adds the FFN's output to it only afterwards), into c->up (free until the
 *       up rows); each token's active set {s_i >= t_L}; for one token the gate rows of its active neurons only,
 *       and act(gate) of them.
 * Does not: up rows, h or down (ffn/sparse.c computes them for the active set as for every rule).
 * Float order: pi2/reference/sparse_ffn.py (rule `predictor`, predictor_scores) bit for bit; relu(v) = v <= 0 ? 0 : v is numpy's
 *       maximum(v, 0); every value is computed by one task whichever thread runs it. */
#include "ffn/pwri.h"

#include "ffn/gate_rows.h"

#include "context.h"
#include "internal.h"
#include "ops.h"

#include <stdlib.h>
#include <string.h>

struct pi2_ffn_pwri {
    float *hid;         /* [B][r_max] relu(fc1·h) */
    uint8_t *gq;        /* [gq_row] one token's x in the gate's activation format */
    float *gc;          /* [n_ff] one token's gate values of its active neurons, in their order */
};

typedef struct {
    pi2_ctx *c;
    const pi2_layer *L;
    int32_t il;
} pwri_job;

void pi2_ffn_pwri_free(struct pi2_ffn_pwri *pw) {
    if (!pw) return;
    free(pw->hid);
    free(pw->gq);
    free(pw->gc);
    free(pw);
}

pi2_status pi2_ffn_pwri_set(pi2_ctx *c, const pi2_ffn_params *p) {
    const pi2_model *m = c->m;
    if (p->score_up) return pi2_set_error(PI2_ERR_INVALID, "the predictor rule has no score (score_up)");
    if (!p->thresholds) return pi2_set_error(PI2_ERR_INVALID, "the predictor rule needs a threshold per layer");
    int64_t r_max = 0;
    size_t gq_row = 0;
    for (int32_t il = 0; il < m->hp.n_layer; il++) {
        const pi2_layer *L = &m->layers[il];
        if (!L->fc1.data)
            return pi2_set_error(PI2_ERR_INVALID, "layer %d has no predictor (blk.%d.fc1/fc2)", (int)il, (int)il);
        if (L->fc1.n_out > r_max) r_max = L->fc1.n_out;
        const pi2_type_traits *a = pi2_traits(pi2_traits(L->gate.type, c->p.impl)->vec_dot_type, c->p.impl);
        const size_t rb = (size_t)(L->gate.n_in / a->block_size) * (size_t)a->type_size;
        if (rb > gq_row) gq_row = rb;
    }
    if (c->ffn_pwri) return PI2_OK;   /* sized by the model alone: once */
    const size_t B = (size_t)c->p.n_batch, F = (size_t)m->hp.n_ff;
    struct pi2_ffn_pwri *pw = calloc(1, sizeof *pw);
    if (pw) {
        pw->hid = calloc(B * (size_t)r_max, sizeof(float));
        pw->gq = calloc(gq_row, 1);
        pw->gc = calloc(F, sizeof(float));
    }
    if (!pw || !pw->hid || !pw->gq || !pw->gc) {
        pi2_ffn_pwri_free(pw);
        return pi2_set_error(PI2_ERR_NOMEM, "out of memory for the FFN predictor");
    }
    c->ffn_pwri = pw;
    return PI2_OK;
}

/* token t: its active neurons {s_i >= t_L}, ascending */
static void select_task(void *arg, int32_t t, int32_t thread) {
    (void)thread;
    const pwri_job *j = arg;
    pi2_ctx *c = j->c;
    const int64_t F = c->m->hp.n_ff;
    const float *s = c->up + (size_t)t * (size_t)F, thr = c->ffn.thresholds[j->il];
    int32_t *idx = c->ffn_idx + (size_t)t * (size_t)F, k = 0;
    for (int64_t i = 0; i < F; i++) if (s[i] >= thr) idx[k++] = (int32_t)i;
    c->ffn_n_active[t] = k;
}

pi2_status pi2_ffn_pwri(pi2_ctx *c, const pi2_layer *L, int32_t il, int32_t n, int *done) {
    struct pi2_ffn_pwri *pw = c->ffn_pwri;
    const size_t hid = (size_t)n * (size_t)L->fc1.n_out;
    pi2_matmul(&c->mm, c->x, n, &(pi2_mm){&L->fc1, pw->hid}, 1);
    for (size_t i = 0; i < hid; i++) pw->hid[i] = pw->hid[i] <= 0.0f ? 0.0f : pw->hid[i];
    pi2_matmul(&c->mm, pw->hid, n, &(pi2_mm){&L->fc2, c->up}, 1);
    pwri_job j = {.c = c, .L = L, .il = il};
    *done = n == 1;
    if (n > 1) {
        pi2_pool_run(c->pool, select_task, &j, n);
        return PI2_OK;
    }
    select_task(&j, 0, 0);   /* one token: the gate rows of its active neurons only, and act(gate) of them */
    return pi2_ffn_one_token(c, L, il, c->ffn_idx, c->ffn_n_active[0], NULL, pw->gc, pw->gc, pw->gq);
}
