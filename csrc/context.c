/* context.c — pi2_ctx_init / free / reset, parameters, abort flag, trace hook, and switching a context
 * to streamed FFN bundles and gate rows (the neuron cache itself is cache.c).
 * Does: size and allocate the KV cache and every scratch buffer once (decode never allocates);
 *       start the thread pool.
 * Does not: compute (forward.c). */
#include "context.h"
#include "cache.h"
#include "ffn_predict.h"
#include "ffn_pwri.h"
#include "internal.h"
#include "npu.h"
#include "npu_ffn.h"
#include "ops.h"

#include <stdlib.h>
#include <string.h>

pi2_ctx_params pi2_ctx_default_params(void) {
    return (pi2_ctx_params){.n_ctx = 4096, .n_batch = 512, .n_threads = 1, .impl = PI2_IMPL_AUTO};
}

/* The largest scratch any matrix product of a step needs at n_tok tokens. */
static size_t matmul_scratch(const pi2_model *m, int32_t n_tok, int32_t impl) {
    size_t need = pi2_matmul_scratch(&(pi2_mm){&m->output, NULL}, 1, n_tok, impl);
    for (int32_t il = 0; il < m->hp.n_layer; il++) {
        const pi2_layer *L = &m->layers[il];
        const pi2_mm qkv[3] = {{&L->q, NULL}, {&L->k, NULL}, {&L->v, NULL}};
        const pi2_mm gu[2] = {{&L->gate, NULL}, {&L->up, NULL}};
        const size_t s[6] = {pi2_matmul_scratch(qkv, 3, n_tok, impl), pi2_matmul_scratch(gu, 2, n_tok, impl),
                             pi2_matmul_scratch(&(pi2_mm){&L->o, NULL}, 1, n_tok, impl),
                             pi2_matmul_scratch(&(pi2_mm){&L->down, NULL}, 1, n_tok, impl),
                             L->fc1.data ? pi2_matmul_scratch(&(pi2_mm){&L->fc1, NULL}, 1, n_tok, impl) : 0,
                             L->fc2.data ? pi2_matmul_scratch(&(pi2_mm){&L->fc2, NULL}, 1, n_tok, impl) : 0};
        for (int i = 0; i < 6; i++) if (s[i] > need) need = s[i];
    }
    return need;
}

static void *alloc(size_t n_elems, size_t size, int *ok) {
    void *p = calloc(n_elems ? n_elems : 1, size);
    if (!p) *ok = 0;
    return p;
}

pi2_status pi2_ctx_init(pi2_model *m, const pi2_ctx_params *params, pi2_ctx **out) {
    if (!out) return pi2_set_error(PI2_ERR_INVALID, "NULL output");
    *out = NULL;
    if (!m || !params) return pi2_set_error(PI2_ERR_INVALID, "NULL model or params");
    const pi2_ctx_params p = *params;
    if (p.n_ctx < 1 || p.n_ctx > (1 << 24) || p.n_batch < 1 || p.n_batch > 65536 ||
        p.impl < PI2_IMPL_AUTO || p.impl > PI2_IMPL_BASE)
        return pi2_set_error(PI2_ERR_INVALID, "bad context parameters: n_ctx %d, n_batch %d, impl %d",
                             (int)p.n_ctx, (int)p.n_batch, (int)p.impl);
    pi2_ctx *c = calloc(1, sizeof *c);
    if (!c) return pi2_set_error(PI2_ERR_NOMEM, "out of memory for a context");
    c->m = m;
    c->p = p;
    c->p.n_batch = p.n_batch < p.n_ctx ? p.n_batch : p.n_ctx;
    pi2_status s = pi2_pool_create(p.n_threads, &c->pool);
    if (s) { free(c); return s; }
    const pi2_model_params *hp = &m->hp;
    const size_t B = (size_t)c->p.n_batch, T = (size_t)p.n_threads, L = (size_t)hp->n_layer, C = (size_t)p.n_ctx;
    const size_t kd = (size_t)hp->n_head_kv * hp->head_dim, vd = (size_t)hp->n_head_kv * hp->head_dim_v;
    int ok = 1;
    c->k_cache = alloc(L * C * kd, sizeof(float), &ok);
    c->v_cache = alloc(L * C * vd, sizeof(float), &ok);
    c->x = alloc(B * hp->n_embd, sizeof(float), &ok);
    c->xn = alloc(B * hp->n_embd, sizeof(float), &ok);
    c->q = alloc(B * hp->n_head * hp->head_dim, sizeof(float), &ok);
    c->k = alloc(B * kd, sizeof(float), &ok);
    c->v = alloc(B * vd, sizeof(float), &ok);
    c->att = alloc(B * hp->n_head * hp->head_dim_v, sizeof(float), &ok);
    c->o = alloc(B * hp->n_embd, sizeof(float), &ok);
    c->gate = alloc(B * hp->n_ff, sizeof(float), &ok);
    c->up = alloc(B * hp->n_ff, sizeof(float), &ok);
    c->rope = alloc(2 * B * hp->n_rot, sizeof(float), &ok);
    c->scores = alloc(T * C, sizeof(float), &ok);
    c->qf = alloc(T * hp->head_dim, sizeof(float), &ok);
    c->acc = alloc(T * pi2_attn_acc_floats(hp->head_dim, hp->head_dim_v), sizeof(float), &ok);
    c->mm = (pi2_matmul_env){.pool = c->pool, .impl = p.impl, .xq = alloc(matmul_scratch(m, (int32_t)B, p.impl), 1, &ok)};
    if (!ok) {
        pi2_ctx_free(c);
        return pi2_set_error(PI2_ERR_NOMEM, "out of memory for a context of %d positions", (int)p.n_ctx);
    }
    c->embd = pi2_traits(m->token_embd.type, p.impl);
    c->ffn.rule = PI2_FFN_DENSE;
    if (m->layers[0].down_rows.data && (s = pi2_ctx_set_ffn(c, &c->ffn))) {   /* FFN_DOWN_ROWS needs the buffers */
        pi2_ctx_free(c);
        return s;
    }
    *out = c;
    return PI2_OK;
}

void pi2_ctx_free(pi2_ctx *c) {
    if (!c) return;
    pi2_npu_free(c->mm.npu);
    pi2_npu_ffn_free(c->npu_ffn);
    pi2_cache_free(c->cache);
    pi2_ffn_pred_free(c->ffn_pred);
    pi2_ffn_pwri_free(c->ffn_pwri);
    free(c->ffn_ready);
    free(c->ffn_task_group);
    pi2_pool_free(c->pool);
    void *bufs[] = {c->k_cache, c->v_cache, c->x, c->xn, c->q, c->k, c->v, c->att, c->o, c->gate, c->up,
                    c->rope, c->scores, c->qf, c->acc, c->mm.xq, c->ffn_thresholds, c->ffn_score, c->ffn_idx,
                    c->ffn_n_active, c->ffn_xq, c->ffn_active, c->ffn_group_start, c->ffn_part};
    for (size_t i = 0; i < sizeof bufs / sizeof bufs[0]; i++) free(bufs[i]);
    free(c);
}

void pi2_ctx_reset(pi2_ctx *c) {
    c->n_past = 0;
    atomic_store(&c->abort, 0);
}

int32_t pi2_ctx_n_past(const pi2_ctx *c) { return c->n_past; }

pi2_status pi2_ctx_truncate(pi2_ctx *c, int32_t n_keep) {
    if (n_keep < 0 || n_keep > c->n_past)
        return pi2_set_error(PI2_ERR_INVALID, "cannot keep %d of %d cached positions", n_keep, c->n_past);
    if (atomic_exchange(&c->busy, 1)) return pi2_set_error(PI2_ERR_INVALID, "a decode is running on this context");
    c->n_past = n_keep;      /* positions from n_keep on are overwritten by the next decode */
    atomic_store(&c->busy, 0);
    return PI2_OK;
}

void pi2_abort(pi2_ctx *c) { atomic_store(&c->abort, 1); }

void pi2_set_trace(pi2_ctx *c, pi2_trace_fn fn, void *user) {
    c->trace = fn;
    c->trace_user = user;
}

pi2_status pi2_ctx_set_ffn(pi2_ctx *c, const pi2_ffn_params *params) {
    if (!c || !params) return pi2_set_error(PI2_ERR_INVALID, "NULL context or FFN parameters");
    const pi2_ffn_params p = *params;
    const pi2_model_params *hp = &c->m->hp;
    if (p.rule < PI2_FFN_DENSE || p.rule > PI2_FFN_PREDICTOR)
        return pi2_set_error(PI2_ERR_INVALID, "unknown FFN rule %d", (int)p.rule);
    if (p.rule == PI2_FFN_TOPK && !(p.keep > 0.0f && p.keep <= 1.0f))
        return pi2_set_error(PI2_ERR_INVALID, "keep %g is not a fraction in (0, 1]", (double)p.keep);
    if (p.rule == PI2_FFN_THRESHOLD && !p.thresholds)
        return pi2_set_error(PI2_ERR_INVALID, "the threshold rule needs one threshold per layer");
    if (atomic_load(&c->busy)) return pi2_set_error(PI2_ERR_INVALID, "a decode is running on this context");
    pi2_status ps;
    if (p.rule == PI2_FFN_PREDICTED && (ps = pi2_ffn_pred_set(c, &p))) return ps;
    if (p.rule == PI2_FFN_PREDICTOR && (ps = pi2_ffn_pwri_set(c, &p))) return ps;
    const size_t B = (size_t)c->p.n_batch, F = (size_t)hp->n_ff, L = (size_t)hp->n_layer;
    if (!c->ffn_idx) {   /* sized once; the dense rule over FFN_DOWN_ROWS uses them too */
        size_t xq = 0;
        for (int32_t il = 0; il < hp->n_layer; il++) {
            const pi2_weight *up = &c->m->layers[il].up;
            const pi2_type_traits *a = pi2_traits(pi2_traits(up->type, c->p.impl)->vec_dot_type, c->p.impl);
            const size_t rb = (size_t)(up->n_in / a->block_size) * (size_t)a->type_size;
            if (rb > xq) xq = rb;
        }
        int ok = 1;
        c->ffn_thresholds = alloc(L, sizeof(float), &ok);
        c->ffn_score = alloc(B * F, sizeof(float), &ok);
        c->ffn_idx = alloc(B * F, sizeof(int32_t), &ok);
        c->ffn_n_active = alloc(B, sizeof(int32_t), &ok);
        c->ffn_xq = alloc(B * xq, 1, &ok);
        c->ffn_active = alloc(L, sizeof(int64_t), &ok);
        const size_t G = F / PI2_FFN_GROUP + 1;
        c->ffn_group_start = alloc(G + 1, sizeof(int32_t), &ok);
        c->ffn_part = c->m->layers[0].down_rows.data ? alloc(G * (size_t)hp->n_embd, sizeof(float), &ok) : NULL;
        if (!ok) {
            void *bufs[] = {c->ffn_thresholds, c->ffn_score, c->ffn_idx, c->ffn_n_active, c->ffn_xq, c->ffn_active,
                            c->ffn_group_start, c->ffn_part};
            for (size_t i = 0; i < sizeof bufs / sizeof bufs[0]; i++) free(bufs[i]);
            c->ffn_thresholds = c->ffn_score = NULL;
            c->ffn_idx = c->ffn_n_active = NULL;
            c->ffn_xq = NULL;
            c->ffn_active = NULL;
            c->ffn_group_start = NULL;
            c->ffn_part = NULL;
            return pi2_set_error(PI2_ERR_NOMEM, "out of memory for the sparse FFN");
        }
    }
    if (p.rule == PI2_FFN_THRESHOLD || p.rule == PI2_FFN_PREDICTED || p.rule == PI2_FFN_PREDICTOR)
        memcpy(c->ffn_thresholds, p.thresholds, L * sizeof(float));
    c->ffn = p;
    c->ffn.thresholds = c->ffn_thresholds;
    c->ffn_tokens = 0;
    memset(c->ffn_active, 0, L * sizeof(int64_t));
    return PI2_OK;
}

int64_t pi2_ctx_ffn_stats(const pi2_ctx *c, int64_t *active) {
    if (active) {
        for (int32_t il = 0; il < c->m->hp.n_layer; il++) active[il] = c->ffn_active ? c->ffn_active[il] : 0;
    }
    return c->ffn_tokens;
}

pi2_status pi2_ctx_set_stream(pi2_ctx *c, const pi2_stream_params *params) {
    if (!c) return pi2_set_error(PI2_ERR_INVALID, "NULL context");
    if (atomic_load(&c->busy)) return pi2_set_error(PI2_ERR_INVALID, "a decode is running on this context");
    pi2_cache_free(c->cache);
    c->cache = NULL;
    if (!params) return PI2_OK;
    if (!c->ffn_part) return pi2_set_error(PI2_ERR_UNSUPPORTED, "only files with FFN down rows can be streamed");
    const size_t G = (size_t)c->m->hp.n_ff / PI2_FFN_GROUP + 1;
    if (!c->ffn_ready) {
        c->ffn_ready = calloc(G, 1);
        c->ffn_task_group = calloc(G, sizeof(int32_t));
        if (!c->ffn_ready || !c->ffn_task_group) {
            free(c->ffn_ready);
            free(c->ffn_task_group);
            c->ffn_ready = NULL;
            c->ffn_task_group = NULL;
            return pi2_set_error(PI2_ERR_NOMEM, "out of memory for a streamed context");
        }
    }
    return pi2_cache_create(c->m, params, &c->cache);
}

pi2_status pi2_ctx_cache_stats(const pi2_ctx *c, pi2_cache_stats *out) {
    if (!c || !out) return pi2_set_error(PI2_ERR_INVALID, "NULL context or output");
    if (!c->cache) return pi2_set_error(PI2_ERR_INVALID, "the context does not stream its FFN bundles");
    pi2_cache_get_stats(c->cache, out);
    return PI2_OK;
}
