/* context.c — pi2_ctx_init / free / reset / query, parameters, abort flag, trace hook, the sparse FFN's buffers,
 * switching a context to streamed FFN bundles and gate rows (the read pipeline, csrc/pipeline/), and statistics.
 * Does: list every buffer of a context with its size once (ctx_buffers, ffn_buffers): pi2_ctx_init allocates them
 *       (decode never allocates), pi2_ctx_query adds them up for the planner; start the thread pool.
 * Does not: compute (forward.c). */
#include "context.h"

#include "ffn/moe.h"
#include "ffn/predicted.h"
#include "ffn/pwri.h"
#include "forward.h"
#include "internal.h"
#include "kernels/pack.h"
#include "kv_mem.h"
#include "kv_quant.h"
#include "nnapi/batches.h"
#include "nnapi/hot_ffn.h"
#include "ops.h"
#include "pipeline/pipeline.h"

#include <stdlib.h>
#include <string.h>

pi2_ctx_params pi2_ctx_default_params(void) {
    return (pi2_ctx_params){.n_ctx = 4096, .n_batch = 512, .n_threads = 1, .impl = PI2_IMPL_AUTO, .type_k = PI2_T_F16,
                             .flash_attn = 0, .type_v = PI2_T_F16};
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

typedef struct {
    void **ptr;      /* the context's field */
    size_t bytes;
} ctx_buffer;

enum { N_CTX_BUFFERS = 16, N_FFN_BUFFERS = 8 };

/* Every buffer pi2_ctx_init allocates for params p (n_batch already capped at n_ctx); [0] and [1]: the KV cache. */
static void ctx_buffers(pi2_ctx *c, const pi2_model *m, const pi2_ctx_params *p, ctx_buffer *out) {
    const pi2_model_params *hp = &m->hp;
    const size_t B = (size_t)p->n_batch, T = (size_t)p->n_threads, C = (size_t)p->n_ctx;
    const size_t kd = (size_t)hp->n_head_kv * hp->head_dim, vd = (size_t)hp->n_head_kv * hp->head_dim_v;
    const size_t f = sizeof(float), R = (size_t)pi2_attn_rows(p->n_batch);
    const ctx_buffer list[N_CTX_BUFFERS] = {
        {(void **)&c->k_cache, pi2_kv_k_bytes(hp, p->type_k, p->n_ctx)},
        {(void **)&c->v_cache, pi2_kv_v_bytes(hp, p->type_v, p->n_ctx)},
        {(void **)&c->x, B * hp->n_embd * f}, {(void **)&c->xn, B * hp->n_embd * f},
        {(void **)&c->q, B * hp->n_head * hp->head_dim * f}, {(void **)&c->k, B * kd * f}, {(void **)&c->v, B * vd * f},
        {(void **)&c->att, B * hp->n_head * hp->head_dim_v * f}, {(void **)&c->o, B * hp->n_embd * f},
        {(void **)&c->gate, B * hp->n_ff * f}, {(void **)&c->up, B * hp->n_ff * f},
        {(void **)&c->rope, 2 * B * hp->n_rot * f}, {(void **)&c->scores, T * R * C * f},
        {(void **)&c->qf, T * R * hp->head_dim * f},
        {(void **)&c->acc, T * (size_t)pi2_attn_acc_floats(hp->head_dim, hp->head_dim_v) * f},
        {(void **)&c->mm.xq, matmul_scratch(m, (int32_t)B, p->impl)}};
    memcpy(out, list, sizeof list);
}

/* The sparse FFN's buffers (pi2_ctx_set_ffn; every context of a model with down rows has them). */
static void ffn_buffers(pi2_ctx *c, const pi2_model *m, const pi2_ctx_params *p, ctx_buffer *out) {
    const pi2_model_params *hp = &m->hp;
    const size_t B = (size_t)p->n_batch, F = (size_t)hp->n_ff, L = (size_t)hp->n_layer;
    const size_t G = F / PI2_FFN_GROUP + 1;
    size_t xq = 0;
    for (int32_t il = 0; il < hp->n_layer; il++) {
        const pi2_weight *up = &m->layers[il].up;
        const pi2_type_traits *a = pi2_traits(pi2_traits(up->type, p->impl)->vec_dot_type, p->impl);
        const size_t rb = (size_t)(up->n_in / a->block_size) * (size_t)a->type_size;
        if (rb > xq) xq = rb;
    }
    const ctx_buffer list[N_FFN_BUFFERS] = {
        {(void **)&c->ffn_thresholds, L * sizeof(float)}, {(void **)&c->ffn_score, B * F * sizeof(float)},
        {(void **)&c->ffn_idx, B * F * sizeof(int32_t)}, {(void **)&c->ffn_n_active, B * sizeof(int32_t)},
        {(void **)&c->ffn_xq, B * xq}, {(void **)&c->ffn_active, L * sizeof(int64_t)},
        {(void **)&c->ffn_group_start, (G + 1) * sizeof(int32_t)},
        {(void **)&c->ffn_part, m->layers[0].down_rows.data ? G * (size_t)hp->n_embd * sizeof(float) : 0}};
    memcpy(out, list, sizeof list);
}

/* Whether list entry ptr is the KV cache's (kv_mem.c's mappings, c->kv_mapped[0] and [1]). */
static int kv_index(pi2_ctx *c, void **ptr) {
    return ptr == (void **)&c->k_cache ? 0 : ptr == (void **)&c->v_cache ? 1 : -1;
}

/* Allocate n buffers (zeroed; ffn_part of a model without down rows stays NULL; the KV cache on huge pages); 0 and
 * every field NULL again when one fails. */
static int allocate(pi2_ctx *c, ctx_buffer *list, int32_t n) {
    for (int32_t i = 0; i < n; i++) {
        const int none = list[i].ptr == (void **)&c->ffn_part && !list[i].bytes, kv = kv_index(c, list[i].ptr);
        if (kv >= 0) *list[i].ptr = pi2_kv_alloc(list[i].bytes ? list[i].bytes : 1, &c->kv_mapped[kv]);
        else *list[i].ptr = none ? NULL : calloc(list[i].bytes ? list[i].bytes : 1, 1);
        if (!none && !*list[i].ptr) {
            for (int32_t k = 0; k <= i; k++) {
                const int kk = kv_index(c, list[k].ptr);
                if (kk >= 0) pi2_kv_release(*list[k].ptr, c->kv_mapped[kk]);
                else free(*list[k].ptr);
                *list[k].ptr = NULL;
            }
            return 0;
        }
    }
    return 1;
}

static pi2_status check_params(const pi2_ctx_params *p) {
    if (p->n_ctx < 1 || p->n_ctx > (1 << 24) || p->n_batch < 1 || p->n_batch > 65536 || p->impl < PI2_IMPL_AUTO ||
        p->impl > PI2_IMPL_BASE || p->n_keep < 0 || p->ctx_shift < 0 || p->ctx_shift > 1 ||
        !pi2_kv_type_ok(p->type_k) || p->flash_attn < 0 || p->flash_attn > 1 || !pi2_kv_type_ok(p->type_v) ||
        (p->type_v != PI2_T_F16 && !p->flash_attn))
        return pi2_set_error(PI2_ERR_INVALID, "bad context parameters: n_ctx %d, n_batch %d, impl %d, ctx_shift %d, "
                             "n_keep %d, type_k %d, flash_attn %d, type_v %d", (int)p->n_ctx, (int)p->n_batch,
                             (int)p->impl, (int)p->ctx_shift, (int)p->n_keep, (int)p->type_k, (int)p->flash_attn,
                             (int)p->type_v);
    if (pi2_kernels_variant()->error[0])   /* a bad PI2_CPU_VARIANT (kernels/pack.h) */
        return pi2_set_error(PI2_ERR_INVALID, "%s", pi2_kernels_variant()->error);
    return PI2_OK;
}

/* A quantized K cache needs whole blocks per head (llama.cpp's check with flash attention). */
static pi2_status check_kv(const pi2_model *m, const pi2_ctx_params *p) {
    if (p->type_k != PI2_T_F16 && m->hp.head_dim % QK8_0)
        return pi2_set_error(PI2_ERR_UNSUPPORTED, "K cache type %s with block size %d does not divide head_dim %d",
                             pi2_traits(p->type_k, PI2_IMPL_AUTO)->name, QK8_0, (int)m->hp.head_dim);
    if (p->type_v != PI2_T_F16 && m->hp.head_dim_v % QK8_0)
        return pi2_set_error(PI2_ERR_UNSUPPORTED, "V cache type %s with block size %d does not divide head_dim_v %d",
                             pi2_traits(p->type_v, PI2_IMPL_AUTO)->name, QK8_0, (int)m->hp.head_dim_v);
    return PI2_OK;
}

pi2_status pi2_ctx_query(const pi2_model *m, const pi2_ctx_params *params, pi2_ctx_sizes *out) {
    if (!m || !params || !out || !out->size) return pi2_set_error(PI2_ERR_INVALID, "NULL model, params or output");
    pi2_ctx_params p = *params;
    pi2_status s = check_params(&p);
    if (!s) s = check_kv(m, &p);
    if (s) return s;
    if (p.n_threads < 1) return pi2_set_error(PI2_ERR_INVALID, "%d threads", (int)p.n_threads);
    p.n_batch = p.n_batch < p.n_ctx ? p.n_batch : p.n_ctx;
    pi2_ctx dummy;
    ctx_buffer list[N_CTX_BUFFERS + N_FFN_BUFFERS];
    ctx_buffers(&dummy, m, &p, list);
    const int32_t n = m->layers[0].down_rows.data ? N_CTX_BUFFERS + N_FFN_BUFFERS : N_CTX_BUFFERS;
    if (n > N_CTX_BUFFERS) ffn_buffers(&dummy, m, &p, list + N_CTX_BUFFERS);
    pi2_ctx_sizes sizes = {.kv_bytes = (int64_t)(list[0].bytes + list[1].bytes)};
    for (int32_t i = 2; i < n; i++) sizes.scratch_bytes += (int64_t)list[i].bytes;
    sizes.scratch_bytes += (int64_t)pi2_ffn_pred_bytes(m, &p);   /* a predictor rule's, when the model has one */
    sizes.scratch_bytes += (int64_t)pi2_moe_bytes(m, &p);        /* the MoE family's */
    sizes.size = out->size < sizeof sizes ? out->size : (uint32_t)sizeof sizes;
    memcpy(out, &sizes, sizes.size);
    return PI2_OK;
}

pi2_status pi2_ctx_init(pi2_model *m, const pi2_ctx_params *params, pi2_ctx **out) {
    if (!out) return pi2_set_error(PI2_ERR_INVALID, "NULL output");
    *out = NULL;
    if (!m || !params) return pi2_set_error(PI2_ERR_INVALID, "NULL model or params");
    pi2_status s = check_params(params);
    if (!s) s = check_kv(m, params);
    if (s) return s;
    pi2_ctx *c = calloc(1, sizeof *c);
    if (!c) return pi2_set_error(PI2_ERR_NOMEM, "out of memory for a context");
    c->m = m;
    c->p = *params;
    c->p.n_batch = c->p.n_batch < c->p.n_ctx ? c->p.n_batch : c->p.n_ctx;
    if ((s = pi2_pool_create(c->p.n_threads, &c->pool))) {
        free(c);
        return s;
    }
    ctx_buffer list[N_CTX_BUFFERS];
    ctx_buffers(c, m, &c->p, list);
    if (!allocate(c, list, N_CTX_BUFFERS)) {
        pi2_ctx_free(c);
        return pi2_set_error(PI2_ERR_NOMEM, "out of memory for a context of %d positions", (int)c->p.n_ctx);
    }
    c->mm.pool = c->pool;
    c->mm.impl = c->p.impl;
    c->embd = pi2_traits(m->token_embd.type, c->p.impl);
    if (c->p.type_k != PI2_T_F16) {   /* quantized keys (kv_quant.c) */
        c->k_blocks = (uint8_t *)c->k_cache;
        c->kt = pi2_traits(c->p.type_k, c->p.impl);
        c->k_cell_bytes = pi2_kv_k_cell_bytes(&m->hp, c->p.type_k);
        c->k_rot = pi2_kv_rot_size(m->hp.head_dim, c->p.type_k);
    }
    kv_rows_reset(c);       /* F16 keys: rows as close as the positions in use allow (kv_rows.c) */
    if (c->p.type_v != PI2_T_F16) {   /* quantized values (flash attention only) */
        c->v_blocks = (uint8_t *)c->v_cache;
        c->vt = pi2_traits(c->p.type_v, c->p.impl);
        c->v_cell_bytes = pi2_kv_v_cell_bytes(&m->hp, c->p.type_v);
        c->v_rot = m->hp.head_dim_v % 64 ? 0 : 64;
    }
    c->ffn.rule = PI2_FFN_DENSE;
    if ((s = pi2_moe_new(m, &c->p, &c->moe))) {
        pi2_ctx_free(c);
        return s;
    }
    if (m->layers[0].down_rows.data && (s = pi2_ctx_set_ffn(c, &c->ffn))) {   /* FFN_DOWN_ROWS needs the buffers */
        pi2_ctx_free(c);
        return s;
    }
    *out = c;
    return PI2_OK;
}

void pi2_ctx_free(pi2_ctx *c) {
    if (!c) return;
    pi2_nnapi_batches_free(c->mm.npu);
    pi2_nnapi_hot_free(c->nnapi_hot);
    pi2_pipeline_free(c->pipeline);
    pi2_ffn_pred_free(c->ffn_pred);
    pi2_ffn_pwri_free(c->ffn_pwri);
    pi2_moe_free(c->moe);
    pi2_pool_free(c->pool);
    pi2_kv_release(c->k_cache, c->kv_mapped[0]);
    pi2_kv_release(c->v_cache, c->kv_mapped[1]);
    void *bufs[N_CTX_BUFFERS + N_FFN_BUFFERS] = {   /* ctx_buffers' and ffn_buffers' fields (the model may be gone) */
        NULL, NULL, c->x, c->xn, c->q, c->k, c->v, c->att, c->o, c->gate, c->up, c->rope, c->scores, c->qf,
        c->acc, c->mm.xq, c->ffn_thresholds, c->ffn_score, c->ffn_idx, c->ffn_n_active, c->ffn_xq, c->ffn_active,
        c->ffn_group_start, c->ffn_part};
    for (int32_t i = 0; i < N_CTX_BUFFERS + N_FFN_BUFFERS; i++) free(bufs[i]);
    free(c);
}

pi2_status pi2_ctx_truncate(pi2_ctx *c, int32_t n_keep) {
    if (!c || n_keep < 0 || n_keep > c->n_past)
        return pi2_set_error(PI2_ERR_INVALID, "cannot keep %d of %d cached positions", n_keep, c ? c->n_past : 0);
    if (atomic_exchange(&c->busy, 1)) return pi2_set_error(PI2_ERR_INVALID, "a decode is running on this context");
    c->n_past = n_keep;      /* positions from n_keep on are overwritten by the next decode */
    kv_rows_reset(c);
    atomic_store(&c->abort, 0);
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
    const size_t L = (size_t)c->m->hp.n_layer;
    if (p.rule < PI2_FFN_DENSE || p.rule > PI2_FFN_PWRI_PREDICTOR)
        return pi2_set_error(PI2_ERR_INVALID, "unknown FFN rule %d", (int)p.rule);
    if (p.rule == PI2_FFN_TOPK && !(p.keep > 0.0f && p.keep <= 1.0f))
        return pi2_set_error(PI2_ERR_INVALID, "keep %g is not a fraction in (0, 1]", (double)p.keep);
    if (p.rule == PI2_FFN_THRESHOLD && !p.thresholds)
        return pi2_set_error(PI2_ERR_INVALID, "the threshold rule needs one threshold per layer");
    if (atomic_load(&c->busy)) return pi2_set_error(PI2_ERR_INVALID, "a decode is running on this context");
    pi2_status ps;
    if (p.rule == PI2_FFN_PREDICTED_GATE && (ps = pi2_ffn_pred_set(c, &p))) return ps;
    if (p.rule == PI2_FFN_PWRI_PREDICTOR && (ps = pi2_ffn_pwri_set(c, &p))) return ps;
    if (!c->ffn_idx) {   /* sized once; the dense rule over FFN_DOWN_ROWS uses them too */
        ctx_buffer list[N_FFN_BUFFERS];
        ffn_buffers(c, c->m, &c->p, list);
        if (!allocate(c, list, N_FFN_BUFFERS)) return pi2_set_error(PI2_ERR_NOMEM, "out of memory for the sparse FFN");
    }
    if (p.rule == PI2_FFN_THRESHOLD || p.rule == PI2_FFN_PREDICTED_GATE || p.rule == PI2_FFN_PWRI_PREDICTOR)
        memcpy(c->ffn_thresholds, p.thresholds, L * sizeof(float));
    c->ffn = p;
    c->ffn.thresholds = c->ffn_thresholds;
    c->ffn_tokens = 0;
    memset(c->ffn_active, 0, L * sizeof(int64_t));
    return PI2_OK;
}

pi2_status pi2_ctx_set_stream(pi2_ctx *c, const pi2_stream_params *params) {
    if (!c) return pi2_set_error(PI2_ERR_INVALID, "NULL context");
    if (atomic_load(&c->busy)) return pi2_set_error(PI2_ERR_INVALID, "a decode is running on this context");
    pi2_pipeline_free(c->pipeline);
    c->pipeline = NULL;
    if (!params) return PI2_OK;
    if (!c->ffn_part && c->m->hp.arch != PI2_ARCH_MOE)   /* MoE: the experts stream (cache/experts.h) */
        return pi2_set_error(PI2_ERR_UNSUPPORTED, "only files with FFN down rows or experts can be streamed");
    return pi2_pipeline_create(c->m, params, &c->pipeline);
}

int32_t pi2_ctx_n_past(const pi2_ctx *c) {
    return c ? (int32_t)c->n_past : 0;
}

pi2_status pi2_ctx_get_stats(const pi2_ctx *c, pi2_ctx_stats *out, pi2_cache_stats *cache) {
    if (!c || (out && !out->size) || (cache && !cache->size))
        return pi2_set_error(PI2_ERR_INVALID, "NULL context, or a statistics struct without its size");
    if (cache && !c->pipeline) return pi2_set_error(PI2_ERR_INVALID, "the context does not stream its FFN bundles");
    if (out) {
        pi2_ctx_stats st = {.ffn_active = out->ffn_active, .ffn_predicted = out->ffn_predicted,
                            .ffn_tokens = c->ffn_tokens, .nnapi_bytes = (int64_t)pi2_nnapi_batches_bytes(c),
                            .hot_bytes = (int64_t)pi2_nnapi_hot_bytes(c), .n_past = c->n_past};
        st.nnapi_runs = pi2_nnapi_batches_runs(c, &st.nnapi_fallbacks);
        st.hot_runs = pi2_nnapi_hot_runs(c, &st.hot_fallbacks);
        for (int32_t il = 0; il < c->m->hp.n_layer; il++) {
            if (st.ffn_active) st.ffn_active[il] = c->ffn_active ? c->ffn_active[il] : 0;
            if (st.ffn_predicted) st.ffn_predicted[il] = pi2_ffn_pred_count(c, il);
        }
        if (out->size >= offsetof(pi2_ctx_stats, expert_rows) + sizeof st.expert_rows && out->expert_rows) {
            st.expert_rows = out->expert_rows;
            pi2_moe_routed(c, st.expert_rows);
        }
        st.size = out->size < sizeof st ? out->size : (uint32_t)sizeof st;
        memcpy(out, &st, st.size);
    }
    if (cache) {
        pi2_cache_stats st;
        pi2_pipeline_stats(c->pipeline, &st);
        st.size = cache->size < sizeof st ? cache->size : (uint32_t)sizeof st;
        memcpy(cache, &st, st.size);
    }
    return PI2_OK;
}
