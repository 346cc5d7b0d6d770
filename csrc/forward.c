/* forward.c — pi2_decode: one prefill or decode step of llama, qwen2 and gemma3, read top-down.
 * Does: embed the tokens, run every block (attention, FFN) over a batch of up to n_batch tokens
 *       with the KV cache, then the output norm and logits; call the trace hook at the named
 *       checkpoints of pi2/reference.py (llama.cpp's graph names); stop at a layer boundary when pi2_abort() was called.
 *       Per-token work of a prompt batch (norms, RoPE, cache stores, FFN activation) runs on the pool
 *       in tasks of whole rows (forward_rows.c); a full context is shifted first when asked (kv_shift.c).
 * Does not: allocate (context.c sized everything), choose kernels (traits table) or step several contexts at once
 *       (decode_multi.c). Every split (here, matmul.c, ops.c) gives each thread whole output elements, so any thread
 *       count agrees. */
#include "io/io.h"
#include "forward.h"
#include "ffn/moe.h"
#include "ffn/predicted.h"
#include "ffn/sparse.h"
#include "kv_quant.h"
#include "pipeline/pipeline.h"

#include <math.h>
#include <string.h>

#define TRACE(name, il, ptr, count) \
    do { if (c->trace) c->trace(name, il, ptr, (int64_t)(count), c->trace_user); } while (0)

/* The dense products of a layer: the MoE family's in ggml's kernel per type and batch (ffn/moe_mm.c). */
static void matmul(pi2_ctx *c, const float *x, int32_t n, const pi2_mm *mm, int32_t n_mm) {
    if (c->moe) pi2_moe_matmul(c, x, n, mm, n_mm);
    else pi2_matmul(&c->mm, x, n, mm, n_mm);
}

/* The last layer of the MoE family computes its FFN on the output rows only (llama.cpp's inp_out_ids): rows
 * first..n-1 of the residual and the attention output move to the front. */
static void keep_rows(pi2_ctx *c, int32_t first, int32_t n) {
    const size_t E = (size_t)c->m->hp.n_embd;
    memmove(c->x, c->x + (size_t)first * E, (size_t)(n - first) * E * sizeof(float));
    memmove(c->o, c->o + (size_t)first * E, (size_t)(n - first) * E * sizeof(float));
    pi2_moe_keep_rows(c, first, n);
}

static void attention(pi2_ctx *c, const pi2_layer *L, int32_t il, int32_t pos0, int32_t n) {
    pi2_attn a = attn_over(c, c, L, il, c->q, c->att, n, pos0);
    a.rows = pi2_attn_rows(c->p.n_batch);
    pi2_attention(c->pool, &a);
}

/* One step over n <= n_batch tokens at positions n_past..; logits of tokens first..n-1 into `logits`, or none when
 * logits is NULL. */
static pi2_status step(pi2_ctx *c, const int32_t *tokens, int32_t n, float *logits, int32_t first) {
    const pi2_model *m = c->m;
    const pi2_model_params *hp = &m->hp;
    const int64_t E = hp->n_embd, QD = (int64_t)hp->n_head * hp->head_dim;
    const int64_t KD = (int64_t)hp->n_head_kv * hp->head_dim, VD = (int64_t)hp->n_head_kv * hp->head_dim_v;
    const int32_t pos0 = c->n_past;
    int32_t nr = n;   /* rows past the attention: n, or the output rows in the MoE family's last layer */

    embed(c, tokens, n);
    rope_tables(c, pos0, n);
    for (int32_t il = 0; il < hp->n_layer; il++) {
        const pi2_layer *L = &m->layers[il];
        if (atomic_load_explicit(&c->abort, memory_order_relaxed)) {
            pi2_pool_mark(c->pool, -1);
            return PI2_ERR_ABORTED;
        }
        pi2_pool_mark(c->pool, n);   /* layers of a step are alike: the pool times them to choose sharing or not */
        if (c->pipeline) {   /* streamed: the layer's read plan, and the reads that land during attention */
            const pi2_status ps = pi2_pipeline_begin_layer(c->pipeline, il, n, pi2_ffn_unit_parts(c, L, n));
            if (ps) {
                pi2_pool_mark(c->pool, -1);
                return ps;
            }
        }

        /* attention input: norm, then q, k, v (+ bias, + per-head norm) */
        if (hp->router_before_attn) pi2_moe_router_early(c, L, il, c->x, n);   /* smallthinker */
        if (c->moe && c->pipeline && n == 1) {   /* streamed experts: read the likely ones during attention */
            const pi2_status as = hp->router_before_attn ? pi2_moe_stream_ahead(c, L, il, NULL)
                                : il == 0 ? pi2_moe_stream_ahead(c, L, 0, c->x)   /* layer 0: on the embedding row */
                                : PI2_OK;
            if (as) {
                pi2_pool_mark(c->pool, -1);
                return as;
            }
        }
        norm_rows(c, n, c->xn, c->x, L->attn_norm, n, E);
        TRACE("attn_norm", il, c->xn, n * E);
        if (c->ffn_pred) pi2_ffn_pred_note_input(c, n);   /* a predictor reading the layer's input */
        matmul(c, c->xn, n, (pi2_mm[]){{&L->q, c->q}, {&L->k, c->k}, {&L->v, c->v}}, 3);
        TRACE("Qcur", il, c->q, n * QD);
        TRACE("Kcur", il, c->k, n * KD);
        TRACE("Vcur", il, c->v, n * VD);
        if (hp->qkv_bias) {
            add_rows(c->q, L->q_bias, n, QD);
            add_rows(c->k, L->k_bias, n, KD);
            add_rows(c->v, L->v_bias, n, VD);
            TRACE("Qcur.bias", il, c->q, n * QD);
        }
        if (hp->qk_norm_full) {   /* olmoe: over the whole projection */
            norm_rows(c, n, c->q, c->q, L->q_norm, n, QD);
            norm_rows(c, n, c->k, c->k, L->k_norm, n, KD);
        } else if (hp->qk_norm) {
            norm_rows(c, n, c->q, c->q, L->q_norm, (int64_t)n * hp->n_head, hp->head_dim);
            norm_rows(c, n, c->k, c->k, L->k_norm, (int64_t)n * hp->n_head_kv, hp->head_dim);
        }

        /* rotary position embedding */
        if (!L->nope) for_rows(c, n, (rows_job){.row = rope_row, .L = L}, n);
        TRACE("Qcur.rope", il, c->q, n * QD);
        TRACE("Kcur.rope", il, c->k, n * KD);

        /* attention over the cache (a quantized K: queries and keys rotated first, as llama.cpp; a quantized V:
         * values rotated before they are stored, the output rotated back) */
        if (c->k_rot) pi2_kv_fwht(c->k, n * KD, c->k_rot);
        if (c->v_rot) pi2_kv_fwht(c->v, n * VD, c->v_rot);
        for_rows(c, n, (rows_job){.row = store_kv_row, .il = il}, n);
        if (hp->q_prescale) scale(c->q, n * QD, hp->attn_scale);
        if (c->k_rot) pi2_kv_fwht(c->q, n * QD, c->k_rot);
        attention(c, L, il, pos0, n);
        if (c->v_rot) pi2_kv_fwht(c->att, (int64_t)n * hp->n_head * hp->head_dim_v, c->v_rot);
        TRACE("kqv_out", il, c->att, (int64_t)n * hp->n_head * hp->head_dim_v);

        /* attention output (+ post norm) and residual */
        matmul(c, c->att, n, &(pi2_mm){&L->o, c->o}, 1);
        if (L->o_bias) add_rows(c->o, L->o_bias, n, E);
        if (c->moe && il == hp->n_layer - 1) {   /* the output rows only from here on */
            if (!logits) break;
            if (first) keep_rows(c, first, n);
            nr = n - first;
        }
        if (L->post_attn_norm) norm_rows(c, n, c->o, c->o, L->post_attn_norm, n, E);
        if (hp->residual_scale != 0.0f) scale(c->o, nr * E, hp->residual_scale);
        TRACE("attn_out", il, c->o, nr * E);
        add(c->x, c->o, nr * E);
        TRACE("ffn_inp", il, c->x, nr * E);

        /* feed-forward: down(act(gate(x)) * up(x)) (+ post norm) and residual */
        norm_rows(c, nr, c->xn, c->x, L->ffn_norm, nr, E);
        TRACE("ffn_norm", il, c->xn, nr * E);
        if (c->moe) {
            const pi2_status ms = pi2_moe_ffn(c, L, il, nr);   /* experts (or qwen3's dense FFN) */
            if (ms) {
                pi2_pool_mark(c->pool, -1);
                return ms;
            }
            if (hp->residual_scale != 0.0f) scale(c->o, nr * E, hp->residual_scale);
        } else if (c->ffn.rule != PI2_FFN_DENSE || L->down_rows.data) {
            pi2_status fs = pi2_ffn_sparse(c, L, il, n);   /* only the active neurons, or down stored as rows */
            if (fs) {
                pi2_pool_mark(c->pool, -1);
                return fs;
            }
        } else {
            pi2_matmul(&c->mm, c->xn, n, (pi2_mm[]){{&L->gate, c->gate}, {&L->up, c->up}}, 2);
            TRACE("ffn_gate", il, c->gate, (int64_t)n * hp->n_ff);
            TRACE("ffn_up", il, c->up, (int64_t)n * hp->n_ff);
            for_rows(c, n, (rows_job){.row = activate_row}, n);
            TRACE("ffn_swiglu", il, c->gate, (int64_t)n * hp->n_ff);
            pi2_matmul(&c->mm, c->gate, n, &(pi2_mm){&L->down, c->o}, 1);
            if (c->ffn_active) {   /* statistics asked for (pi2_ctx_set_ffn): every neuron */
                c->ffn_active[il] += (int64_t)n * hp->n_ff;
                if (il == 0) c->ffn_tokens += n;
            }
        }
        if (L->post_ffw_norm) norm_rows(c, n, c->o, c->o, L->post_ffw_norm, n, E);
        TRACE("ffn_out", il, c->o, nr * E);
        add(c->x, c->o, nr * E);
        TRACE("l_out", il, c->x, nr * E);
        if (c->moe && c->pipeline && n == 1 && !hp->router_before_attn && il + 1 < hp->n_layer) {
            const pi2_status as = pi2_moe_stream_ahead(c, &m->layers[il + 1], il + 1, c->x);   /* pre-gating */
            if (as) {
                pi2_pool_mark(c->pool, -1);
                return as;
            }
        }
    }
    pi2_pool_mark(c->pool, -1);

    /* output norm and logits (+ soft-capping, or the MoE family's logit scale) */
    if (logits) {
        const int32_t r0 = nr < n ? 0 : first, rows = n - first;
        norm_rows(c, rows, c->xn, c->x + (size_t)r0 * E, m->output_norm, rows, E);
        TRACE("result_norm", -1, c->xn, rows * E);
        matmul(c, c->xn, rows, &(pi2_mm){&m->output, logits}, 1);
        const float cap = hp->logit_softcap;
        if (cap > 0)
            for (int64_t i = 0; i < (int64_t)rows * hp->n_vocab; i++) logits[i] = tanhf(logits[i] / cap) * cap;
        if (hp->logit_scale != 0.0f) {
            const float inv = 1.0f / hp->logit_scale;
            for (int64_t i = 0; i < (int64_t)rows * hp->n_vocab; i++) logits[i] = logits[i] * inv;
        }
        TRACE("result_output", -1, logits, (int64_t)rows * hp->n_vocab);
    }
    return PI2_OK;
}

pi2_status pi2_decode(pi2_ctx *c, const int32_t *tokens, int32_t n_tokens, float *logits, int32_t all_logits) {
    if (!c || !tokens || !logits) return pi2_set_error(PI2_ERR_INVALID, "NULL context, tokens or logits");
    if (n_tokens < 1) return pi2_set_error(PI2_ERR_INVALID, "nothing to decode");
    if (c->p.ctx_shift && c->n_past + n_tokens >= c->p.n_ctx && !atomic_load(&c->busy)) {
        const int32_t n_discard = (c->n_past - c->p.n_keep) / 2;     /* llama-completion's rule */
        if (n_discard > 0 && c->n_past - n_discard + n_tokens <= c->p.n_ctx) kv_shift(c, c->p.n_keep, n_discard);
    }
    if (n_tokens > c->p.n_ctx - c->n_past)
        return pi2_set_error(PI2_ERR_INVALID, "context full: %d + %d tokens > n_ctx %d", (int)c->n_past,
                             (int)n_tokens, (int)c->p.n_ctx);
    for (int32_t i = 0; i < n_tokens; i++)
        if (tokens[i] < 0 || tokens[i] >= c->m->hp.n_vocab)
            return pi2_set_error(PI2_ERR_INVALID, "token id %d is outside the vocabulary (%d)", (int)tokens[i],
                                 (int)c->m->hp.n_vocab);
    if (atomic_exchange(&c->busy, 1)) return pi2_set_error(PI2_ERR_INVALID, "a decode is already running on this context");
    if (all_logits < 0 && -all_logits >= n_tokens) {
        atomic_store(&c->busy, 0);
        return pi2_set_error(PI2_ERR_INVALID, "logits from token %d of %d", (int)-all_logits, (int)n_tokens);
    }
    kv_rows_fit(c, c->n_past + n_tokens);
    const int32_t start = c->n_past, n_vocab = c->m->hp.n_vocab;
    const int32_t f = all_logits > 0 ? 0 : all_logits < 0 ? -all_logits : n_tokens - 1;   /* the first output token */
    pi2_status s = PI2_OK;
    atomic_store(&c->abort, 0);
    for (int32_t i = 0; i < n_tokens && !s; i += c->p.n_batch) {
        const int32_t n = n_tokens - i < c->p.n_batch ? n_tokens - i : c->p.n_batch;
        const int32_t first = f > i ? f - i : 0;   /* this step's first output row */
        float *out = first < n ? logits + (size_t)(i + first - f) * n_vocab : NULL;
        if (!(s = step(c, tokens + i, n, out, first))) c->n_past += n;
    }
    if (!s) s = model_check_maps(c->m);   /* the file failed under its mapping: no logits from zeros */
    if (s || atomic_exchange(&c->abort, 0)) {
        c->n_past = start;
        atomic_store(&c->busy, 0);
        if (s && s != PI2_ERR_ABORTED) return s;   /* a read failed: its message stays */
        return pi2_set_error(PI2_ERR_ABORTED, "decode aborted");
    }
    atomic_store(&c->busy, 0);
    return PI2_OK;
}

