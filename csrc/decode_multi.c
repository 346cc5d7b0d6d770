/* decode_multi.c — pi2_decode_multi: one token of each of several contexts in one step (the slots of a server):
 * the matrix products of the tokens share one pass over the weights, each token attends to its own cache.
 * Does: check the contexts can share a step (same model, cache types, a dense FFN, no trace), run it, advance each.
 * Does not: sparse, streamed or expert FFNs (pi2_decode alone); allocate (the first context's scratch serves). */
#include "forward.h"
#include "kv_quant.h"

#include <math.h>

/* pi2_decode_multi's step: row t of the first context's buffers is the token of cs[t], at cs[t]'s n_past. The
 * matrix products run once over the n rows; RoPE, the cache store and attention (as a single token: the same
 * float order as pi2_decode of that token) per row, against the row's own context. Dense FFN only. */
static pi2_status step_multi(pi2_ctx *const *cs, const int32_t *tokens, int32_t n, float *logits) {
    pi2_ctx *c = cs[0];
    const pi2_model *m = c->m;
    const pi2_model_params *hp = &m->hp;
    const int64_t E = hp->n_embd, QD = (int64_t)hp->n_head * hp->head_dim, VO = (int64_t)hp->n_head * hp->head_dim_v;
    const int64_t KD = (int64_t)hp->n_head_kv * hp->head_dim, VD = (int64_t)hp->n_head_kv * hp->head_dim_v;
    pi2_matmul_env mm = c->mm;
    mm.npu = NULL;     /* NNAPI computes prompt batches in F16: these rows must match single-token decodes */
    mm.single_order = 1;   /* and so must the CPU's: vec_dot's order, not the batch kernels' */

    embed(c, tokens, n);
    for (int32_t t = 0; t < n; t++) rope_table_row(c, t, cs[t]->n_past);
    for (int32_t il = 0; il < hp->n_layer; il++) {
        const pi2_layer *L = &m->layers[il];
        for (int32_t t = 0; t < n; t++)
            if (atomic_load_explicit(&cs[t]->abort, memory_order_relaxed)) return PI2_ERR_ABORTED;
        norm_rows(c, n, c->xn, c->x, L->attn_norm, n, E);
        pi2_matmul(&mm, c->xn, n, (pi2_mm[]){{&L->q, c->q}, {&L->k, c->k}, {&L->v, c->v}}, 3);
        if (hp->qkv_bias) {
            add_rows(c->q, L->q_bias, n, QD);
            add_rows(c->k, L->k_bias, n, KD);
            add_rows(c->v, L->v_bias, n, VD);
        }
        if (hp->qk_norm) {
            norm_rows(c, n, c->q, c->q, L->q_norm, (int64_t)n * hp->n_head, hp->head_dim);
            norm_rows(c, n, c->k, c->k, L->k_norm, (int64_t)n * hp->n_head_kv, hp->head_dim);
        }
        for_rows(c, n, (rows_job){.row = rope_row, .L = L}, n);
        if (c->k_rot) pi2_kv_fwht(c->k, n * KD, c->k_rot);   /* every context has the first one's K and V types */
        if (c->v_rot) pi2_kv_fwht(c->v, n * VD, c->v_rot);
        if (hp->q_prescale) scale(c->q, n * QD, hp->attn_scale);
        if (c->k_rot) pi2_kv_fwht(c->q, n * QD, c->k_rot);
        for (int32_t t = 0; t < n; t++) {    /* each token into its own cache, then attention over it */
            pi2_ctx *d = cs[t];
            store_kv(d, il, (size_t)d->n_past, c->k + t * KD, c->v + t * VD);
            pi2_attn a = attn_over(c, d, L, il, c->q + t * QD, c->att + t * VO, 1, d->n_past);
            pi2_attention(c->pool, &a);
        }
        if (c->v_rot) pi2_kv_fwht(c->att, (int64_t)n * VO, c->v_rot);
        pi2_matmul(&mm, c->att, n, &(pi2_mm){&L->o, c->o}, 1);
        if (L->post_attn_norm) norm_rows(c, n, c->o, c->o, L->post_attn_norm, n, E);
        add(c->x, c->o, n * E);
        norm_rows(c, n, c->xn, c->x, L->ffn_norm, n, E);
        pi2_matmul(&mm, c->xn, n, (pi2_mm[]){{&L->gate, c->gate}, {&L->up, c->up}}, 2);
        for_rows(c, n, (rows_job){.row = activate_row}, n);
        pi2_matmul(&mm, c->gate, n, &(pi2_mm){&L->down, c->o}, 1);
        for (int32_t t = 0; t < n; t++)
            if (cs[t]->ffn_active) {
                cs[t]->ffn_active[il] += hp->n_ff;
                if (il == 0) cs[t]->ffn_tokens += 1;
            }
        if (L->post_ffw_norm) norm_rows(c, n, c->o, c->o, L->post_ffw_norm, n, E);
        add(c->x, c->o, n * E);
    }
    norm_rows(c, n, c->xn, c->x, m->output_norm, n, E);
    pi2_matmul(&mm, c->xn, n, &(pi2_mm){&m->output, logits}, 1);
    const float cap = hp->logit_softcap;
    if (cap > 0)
        for (int64_t i = 0; i < (int64_t)n * hp->n_vocab; i++) logits[i] = tanhf(logits[i] / cap) * cap;
    return PI2_OK;
}

/* Why cs[t] cannot join a multi-context step ("" when it can). */
static const char *multi_gap(pi2_ctx *const *cs, int32_t t) {
    const pi2_ctx *d = cs[t];
    if (d->m != cs[0]->m) return "the contexts are on different models";
    for (int32_t u = 0; u < t; u++)
        if (cs[u] == d) return "a context appears twice";
    if (d->n_past >= d->p.n_ctx) return "a context is full";
    if (d->p.n_ctx > cs[0]->p.n_ctx) return "a context is larger than the first (whose scratch serves them all)";
    if (d->p.type_k != cs[0]->p.type_k) return "the contexts have different K cache types";
    if (d->p.type_v != cs[0]->p.type_v || d->p.flash_attn != cs[0]->p.flash_attn)
        return "the contexts have different V cache types or flash attention";
    if (d->ffn.rule != PI2_FFN_DENSE || d->pipeline || d->ffn_pred || d->ffn_pwri || d->nnapi_hot || d->moe || d->trace)
        return "a context computes a sparse, streamed or expert FFN, or traces: decode it alone";
    return "";
}

pi2_status pi2_decode_multi(pi2_ctx *const *ctxs, const int32_t *tokens, int32_t n, float *logits) {
    if (!ctxs || !tokens || !logits || n < 1) return pi2_set_error(PI2_ERR_INVALID, "NULL argument or n < 1");
    if (n > ctxs[0]->p.n_batch)
        return pi2_set_error(PI2_ERR_INVALID, "%d contexts exceed the first one's n_batch %d", (int)n,
                             (int)ctxs[0]->p.n_batch);
    for (int32_t il = 0; il < ctxs[0]->m->hp.n_layer; il++)
        if (ctxs[0]->m->layers[il].down_rows.data)
            return pi2_set_error(PI2_ERR_UNSUPPORTED, "the model stores ffn_down as rows: decode each context alone");
    for (int32_t t = 0; t < n; t++) {
        if (!ctxs[t]) return pi2_set_error(PI2_ERR_INVALID, "NULL context");
        const char *gap = multi_gap(ctxs, t);
        if (*gap) return pi2_set_error(PI2_ERR_INVALID, "%s", gap);
        if (tokens[t] < 0 || tokens[t] >= ctxs[0]->m->hp.n_vocab)
            return pi2_set_error(PI2_ERR_INVALID, "token id %d is outside the vocabulary (%d)", (int)tokens[t],
                                 (int)ctxs[0]->m->hp.n_vocab);
    }
    int32_t held = 0;
    for (; held < n; held++)
        if (atomic_exchange(&ctxs[held]->busy, 1)) break;
    pi2_status s = held < n ? pi2_set_error(PI2_ERR_INVALID, "a decode is already running on a context") : PI2_OK;
    if (!s) {
        for (int32_t t = 0; t < n; t++) {
            atomic_store(&ctxs[t]->abort, 0);
            kv_rows_fit(ctxs[t], ctxs[t]->n_past + 1);
        }
        s = step_multi(ctxs, tokens, n, logits);
        int aborted = s == PI2_ERR_ABORTED;
        for (int32_t t = 0; t < n; t++) aborted |= atomic_exchange(&ctxs[t]->abort, 0);
        if (aborted) s = pi2_set_error(PI2_ERR_ABORTED, "decode aborted");
        else if (!s)
            for (int32_t t = 0; t < n; t++) ctxs[t]->n_past += 1;
    }
    for (int32_t t = 0; t < held; t++) atomic_store(&ctxs[t]->busy, 0);
    return s;
}
