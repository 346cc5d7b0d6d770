/* forward.c — pi2_decode: one prefill or decode step of llama, qwen2 and gemma3, read top-down.
 * Over 400 lines for now: the context shift and the multi-context step (pi2_decode_multi) share the step's static
 * helpers; they move to their own file when those helpers get a header.
 * Does: embed the tokens, run every block (attention, FFN) over a batch of up to n_batch tokens
 *       with the KV cache, then the output norm and logits; call the trace hook at the named
 *       checkpoints of pi2/reference.py (llama.cpp's graph names); stop at a layer boundary when pi2_abort() was called.
 *       Per-token work of a prompt batch (norms, RoPE, cache stores, FFN activation) runs on the pool
 *       in tasks of whole rows.
 *       pi2_decode_multi: one token of each of several contexts in one step (the slots of a server): the
 *       matrix products of the tokens share one pass over the weights, each token attends to its own cache.
 * Does not: allocate (context.c sized everything) or choose kernels (traits table). Every split
 *       (here, matmul.c, ops.c) gives each thread whole output elements, so any thread count agrees. */
#include "io/io.h"
#include "context.h"
#include "ffn/moe.h"
#include "ffn/predicted.h"
#include "ffn/sparse.h"
#include "internal.h"
#include "kv_quant.h"
#include "ops.h"
#include "pipeline/pipeline.h"

#include <math.h>
#include <string.h>

#define TRACE(name, il, ptr, count) \
    do { if (c->trace) c->trace(name, il, ptr, (int64_t)(count), c->trace_user); } while (0)

/* Per-row work of a prompt batch, split over the pool in tasks of whole rows (each row is computed
 * the same way whichever thread runs it); a single token's rows run inline (no pool job). */
typedef struct rows_job rows_job;
struct rows_job {
    void (*row)(const rows_job *j, int64_t r);
    pi2_ctx *c;
    const pi2_layer *L;
    float *y;
    const float *x, *w;
    int64_t n;                /* values per row (norms) */
    int32_t il;               /* layer (store_kv_row) */
    int64_t rows_per_task, n_rows;
};

static void rows_task(void *arg, int32_t task, int32_t thread) {
    (void)thread;
    const rows_job *j = arg;
    const int64_t r0 = (int64_t)task * j->rows_per_task, r1 = r0 + j->rows_per_task < j->n_rows ? r0 + j->rows_per_task : j->n_rows;
    for (int64_t r = r0; r < r1; r++) j->row(j, r);
}

static void for_rows(pi2_ctx *c, int32_t n_tok, rows_job j, int64_t n_rows) {
    const int64_t n_tasks = n_tok > 1 ? 8 * (int64_t)pi2_pool_n_threads(c->pool) : 1;
    j.c = c;
    j.n_rows = n_rows;
    j.rows_per_task = (n_rows + n_tasks - 1) / n_tasks;
    pi2_pool_run(c->pool, rows_task, &j, (int32_t)((n_rows + j.rows_per_task - 1) / j.rows_per_task));
}

static void norm_row(const rows_job *j, int64_t r) {
    pi2_rms_norm(j->y + r * j->n, j->x + r * j->n, j->w, j->n, j->c->m->hp.rms_eps);
}

/* y[r] = rmsnorm(x[r]) * w for n_rows rows of n values (of a batch of n_tok tokens) */
static void norm_rows(pi2_ctx *c, int32_t n_tok, float *y, const float *x, const float *w, int64_t n_rows, int64_t n) {
    for_rows(c, n_tok, (rows_job){.row = norm_row, .y = y, .x = x, .w = w, .n = n}, n_rows);
}

static void add_rows(float *x, const float *b, int64_t n_rows, int64_t n) {   /* x[r] += b */
    for (int64_t r = 0; r < n_rows; r++)
        for (int64_t i = 0; i < n; i++) x[r * n + i] += b[i];
}

static void add(float *x, const float *y, int64_t n) {
    for (int64_t i = 0; i < n; i++) x[i] += y[i];
}

static void scale(float *x, int64_t n, float s) {
    for (int64_t i = 0; i < n; i++) x[i] *= s;
}

/* x[t] = row tokens[t] of token_embd, times embd_scale. */
static void embed(pi2_ctx *c, const int32_t *tokens, int32_t n) {
    const pi2_weight *e = &c->m->token_embd;
    for (int32_t t = 0; t < n; t++)
        c->embd->to_float(e->data + (size_t)tokens[t] * e->row_bytes, c->x + (size_t)t * e->n_in, e->n_in);
    if (c->m->hp.embd_scale != 1.0f) scale(c->x, (int64_t)n * e->n_in, c->m->hp.embd_scale);
}

/* cos/sin tables of positions pos0.. for both RoPE bases. */
static void rope_tables(pi2_ctx *c, int32_t pos0, int32_t n) {
    const pi2_model_params *hp = &c->m->hp;
    float *local = c->rope + (size_t)c->p.n_batch * hp->n_rot;
    for (int32_t t = 0; t < n; t++) {
        pi2_rope_cache(c->rope + (size_t)t * hp->n_rot, pos0 + t, hp->n_rot, hp->rope_base, hp->rope_freq_scale, c->m->rope_freqs);
        if (hp->rope_base_local > 0)
            pi2_rope_cache(local + (size_t)t * hp->n_rot, pos0 + t, hp->n_rot, hp->rope_base_local,
                           hp->rope_freq_scale, c->m->rope_freqs);
    }
}

/* Token t's query and key heads rotated in place. */
static void rope_row(const rows_job *j, int64_t t) {
    const pi2_model_params *hp = &j->c->m->hp;
    const int32_t nb = j->c->p.n_batch;
    const float *cs = j->c->rope + ((size_t)j->L->rope_local * nb + (size_t)t) * hp->n_rot;
    pi2_rope(j->c->q + (size_t)t * hp->n_head * hp->head_dim, hp->n_head, hp->head_dim, hp->n_rot, cs, hp->rope_neox);
    pi2_rope(j->c->k + (size_t)t * hp->n_head_kv * hp->head_dim, hp->n_head_kv, hp->head_dim, hp->n_rot, cs, hp->rope_neox);
}

/* One token's k and v at cell pos of layer il of c's cache: V rounded to F16 (halves, nearest even as ggml's
 * fp32-to-fp16); K the same, transposed, or quantized (kv_quant.c). */
static void store_kv(pi2_ctx *c, int32_t il, size_t pos, const float *kr, const float *vr) {
    const pi2_model_params *hp = &c->m->hp;
    const size_t kd = (size_t)hp->n_head_kv * hp->head_dim, vd = (size_t)hp->n_head_kv * hp->head_dim_v;
    const size_t n_ctx = (size_t)c->p.n_ctx, ld = (size_t)c->k_ld;
    if (c->k_blocks) pi2_kv_store_k(c, il, pos, kr);
    else {
        pi2_fp16 *k = c->k_cache + (size_t)il * kd * ld + pos;
        for (size_t i = 0; i < kd; i++) k[i * ld] = pi2_f32_to_fp16(kr[i]);
    }
    if (c->v_blocks) {
        pi2_kv_store_v(c, il, pos, vr);
        return;
    }
    pi2_fp16 *v = c->v_cache + ((size_t)il * n_ctx + pos) * vd;
    for (size_t i = 0; i < vd; i++) v[i] = pi2_f32_to_fp16(vr[i]);
}

/* Token t's k and v at position n_past + t of layer j->il. */
static void store_kv_row(const rows_job *j, int64_t t) {
    pi2_ctx *c = j->c;
    const pi2_model_params *hp = &c->m->hp;
    const size_t kd = (size_t)hp->n_head_kv * hp->head_dim, vd = (size_t)hp->n_head_kv * hp->head_dim_v;
    store_kv(c, j->il, (size_t)c->n_past + (size_t)t, c->k + t * kd, c->v + t * vd);
}

/* Token t's FFN activation: gate = act(gate) * up. */
static void activate_row(const rows_job *j, int64_t t) {
    const pi2_ctx *c = j->c;
    const int64_t n_ff = c->m->hp.n_ff;
    pi2_ffn_activate(c->gate + t * n_ff, c->up + t * n_ff, n_ff, c->m->hp.ffn_act, c->m->gelu_table);
}

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

/* Flash attention and a quantized V cache of context c's layer il into a. */
static void set_flash(const pi2_ctx *c, int32_t il, pi2_attn *a) {
    a->flash = c->p.flash_attn;
    if (c->v_blocks) {
        a->vq = c->v_blocks + (size_t)il * c->p.n_ctx * c->v_cell_bytes;
        a->v_cell_bytes = c->v_cell_bytes;
        a->vt = c->vt;
    }
}

static void attention(pi2_ctx *c, const pi2_layer *L, int32_t il, int32_t pos0, int32_t n) {
    const pi2_model_params *hp = &c->m->hp;
    const size_t cells = (size_t)il * c->p.n_ctx * hp->n_head_kv, rows = (size_t)il * hp->n_head_kv * hp->head_dim;
    pi2_attn a = {
        .q = c->q, .k = c->k_cache + rows * (size_t)c->k_ld, .v = c->v_cache + cells * hp->head_dim_v,
        .out = c->att, .scores = c->scores, .qf = c->qf, .acc = c->acc, .n_tok = n, .pos0 = pos0, .n_ctx = c->p.n_ctx,
        .k_ld = c->k_ld,
        .n_head = hp->n_head, .n_head_kv = hp->n_head_kv, .head_dim = hp->head_dim, .head_dim_v = hp->head_dim_v,
        .window = L->swa ? hp->sliding_window : 0, .scale = hp->q_prescale ? 1.0f : hp->attn_scale,
        .rows = pi2_attn_rows(c->p.n_batch)};
    if (c->k_blocks) {
        a.kq = c->k_blocks + (size_t)il * c->p.n_ctx * c->k_cell_bytes;
        a.k_cell_bytes = c->k_cell_bytes;
        a.kt = c->kt;
    }
    set_flash(c, il, &a);
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

/* llama.cpp's context shift (llama_memory_seq_rm + llama_memory_seq_add) with the cache kept in position order:
 * positions n_keep .. n_keep+n_discard-1 are dropped and the later ones move down by n_discard, each key rotated by
 * RoPE at position -n_discard (its F16 value rotated in float and rounded to F16 again, as ggml_rope_ext on the F16
 * cache). pi2/reference/forward.py (ReferenceContext.shift) is the specification. */
static void kv_shift(pi2_ctx *c, int32_t n_keep, int32_t n_discard) {
    const pi2_model_params *hp = &c->m->hp;
    const size_t C = (size_t)c->p.n_ctx, ld = (size_t)c->k_ld, kd = (size_t)hp->n_head_kv * hp->head_dim;
    const size_t vd = (size_t)hp->n_head_kv * hp->head_dim_v;
    const int32_t m = c->n_past - n_keep - n_discard;
    float *cs = c->rope, *row = c->k;     /* scratch: the rope tables and one token's keys (rebuilt every step) */
    for (int32_t il = 0; il < hp->n_layer; il++) {
        const int local = c->m->layers[il].rope_local && hp->rope_base_local > 0;
        pi2_rope_cache(cs, -n_discard, hp->n_rot, local ? hp->rope_base_local : hp->rope_base, hp->rope_freq_scale,
                       c->m->rope_freqs);
        pi2_fp16 *K = c->k_cache + (size_t)il * kd * ld, *V = c->v_cache + (size_t)il * C * vd;
        if (c->k_blocks) pi2_kv_shift_k(c, il, n_keep, n_discard, m, cs, row);   /* through floats (kv_quant.c) */
        for (int32_t t = 0; t < m; t++) {
            const size_t from = (size_t)(n_keep + n_discard + t), to = (size_t)(n_keep + t);
            if (!c->k_blocks) {
                for (size_t i = 0; i < kd; i++) row[i] = pi2_fp16_to_f32(K[i * ld + from]);
                pi2_rope(row, hp->n_head_kv, hp->head_dim, hp->n_rot, cs, hp->rope_neox);
                for (size_t i = 0; i < kd; i++) K[i * ld + to] = pi2_f32_to_fp16(row[i]);
            }
            if (c->v_blocks) {
                uint8_t *VB = c->v_blocks + (size_t)il * C * c->v_cell_bytes;
                memmove(VB + to * c->v_cell_bytes, VB + from * c->v_cell_bytes, c->v_cell_bytes);
            } else {
                memmove(V + to * vd, V + from * vd, vd * sizeof *V);
            }
        }
    }
    c->n_past -= n_discard;
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
    float *local = c->rope + (size_t)c->p.n_batch * hp->n_rot;
    for (int32_t t = 0; t < n; t++) {
        pi2_rope_cache(c->rope + (size_t)t * hp->n_rot, cs[t]->n_past, hp->n_rot, hp->rope_base, hp->rope_freq_scale,
                       m->rope_freqs);
        if (hp->rope_base_local > 0)
            pi2_rope_cache(local + (size_t)t * hp->n_rot, cs[t]->n_past, hp->n_rot, hp->rope_base_local,
                           hp->rope_freq_scale, m->rope_freqs);
    }
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
            const size_t n_ctx = (size_t)d->p.n_ctx, pos = (size_t)d->n_past, cells = (size_t)il * n_ctx * hp->n_head_kv;
            store_kv(d, il, pos, c->k + t * KD, c->v + t * VD);
            pi2_attn a = {
                .q = c->q + t * QD, .k = d->k_cache + (size_t)il * KD * (size_t)d->k_ld,
                .v = d->v_cache + cells * hp->head_dim_v,
                .out = c->att + t * VO, .scores = c->scores, .qf = c->qf, .acc = c->acc, .n_tok = 1,
                .pos0 = d->n_past, .n_ctx = d->p.n_ctx, .k_ld = d->k_ld, .n_head = hp->n_head,
                .n_head_kv = hp->n_head_kv, .head_dim = hp->head_dim, .head_dim_v = hp->head_dim_v, .window = L->swa ? hp->sliding_window : 0,
                .scale = hp->q_prescale ? 1.0f : hp->attn_scale};
            if (d->k_blocks) {
                a.kq = d->k_blocks + (size_t)il * n_ctx * d->k_cell_bytes;
                a.k_cell_bytes = d->k_cell_bytes;
                a.kt = d->kt;
            }
            set_flash(d, il, &a);
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
        for (int32_t t = 0; t < n; t++) atomic_store(&ctxs[t]->abort, 0);
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
