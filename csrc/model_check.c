/* model_check.c — what pi2_model_load checks before it trusts a model: hyper-parameters in range, each tensor
 * descriptor (role, layer, the shape the architecture expects, a type pi2 computes with, byte size, row stride,
 * alignment, bounds against the mapping), every tensor the architecture reads present, and the tensors that come
 * in pairs together. Names are GGUF's (MODEL_ROLE_NAMES).
 * Does not: map the file (model_map.c) or make views of the tensors (model.c). */
#include "model.h"
#include "internal.h"
#include "kernels/lowbit.h"

#include <math.h>

const char *const MODEL_ROLE_NAMES[PI2_TENSOR_COUNT] = {
    "token_embd", "output_norm", "output", "rope_freqs", "attn_norm", "attn_q", "attn_k", "attn_v",
    "attn_output", "attn_q.bias", "attn_k.bias", "attn_v.bias", "attn_q_norm", "attn_k_norm",
    "post_attention_norm", "ffn_norm", "ffn_gate", "ffn_up", "ffn_down", "post_ffw_norm", "ffn_down_rows",
    "ffn_gate_pred", "fc1", "fc2", "ffn_down_scale", "ffn_down_colscale", "attn_output.bias", "ffn_gate_inp",
    "ffn_gate_exps", "ffn_up_exps", "ffn_down_exps", "ffn_gate_shexp", "ffn_up_shexp", "ffn_down_shexp",
    "ffn_gate_inp_shexp", "ffn_down_rows_exps", "ffn_down_scale_exps", "ffn_down_colscale_exps"};

int model_per_layer(int32_t role) { return role >= PI2_TENSOR_ATTN_NORM; }

static int is_expert(int32_t role) {
    return (role >= PI2_TENSOR_FFN_GATE_EXPS && role <= PI2_TENSOR_FFN_DOWN_EXPS) || role >= PI2_TENSOR_FFN_DOWN_ROWS_EXPS;
}

/* The ggml shape (ne0, ne1) a role must have (0: any, the low-rank predictor's rank), and whether the
 * architecture reads it at all. */
int model_expected(const pi2_model_params *p, int32_t role, int64_t *ne0, int64_t *ne1) {
    const int64_t E = p->n_embd, q = (int64_t)p->n_head * p->head_dim, k = (int64_t)p->n_head_kv * p->head_dim;
    const int64_t v = (int64_t)p->n_head_kv * p->head_dim_v, o = (int64_t)p->n_head * p->head_dim_v;
    const int moe = p->arch == PI2_ARCH_MOE, experts = moe && p->n_expert > 0;
    *ne1 = 1;
    switch (role) {
    case PI2_TENSOR_ATTN_OUTPUT_BIAS: *ne0 = E; return moe;
    case PI2_TENSOR_FFN_GATE_INP: *ne0 = E; *ne1 = p->n_expert; return experts;
    case PI2_TENSOR_FFN_GATE_EXPS: case PI2_TENSOR_FFN_UP_EXPS: *ne0 = E; *ne1 = p->n_ff_exp; return experts;
    case PI2_TENSOR_FFN_DOWN_EXPS: *ne0 = p->n_ff_exp; *ne1 = E; return experts;
    case PI2_TENSOR_FFN_DOWN_ROWS_EXPS: *ne0 = E; *ne1 = p->n_ff_exp; return experts;
    case PI2_TENSOR_FFN_DOWN_SCALE_EXPS: *ne0 = p->n_ff_exp; return experts;
    case PI2_TENSOR_FFN_DOWN_COLSCALE_EXPS: *ne0 = E; return experts;
    case PI2_TENSOR_FFN_GATE_SHEXP: case PI2_TENSOR_FFN_UP_SHEXP: *ne0 = E; *ne1 = p->n_ff_shexp; return experts && p->n_ff_shexp;
    case PI2_TENSOR_FFN_DOWN_SHEXP: *ne0 = p->n_ff_shexp; *ne1 = E; return experts && p->n_ff_shexp;
    case PI2_TENSOR_FFN_GATE_INP_SHEXP: *ne0 = E; return experts && p->n_ff_shexp && p->shexp_gate;
    case PI2_TENSOR_ATTN_Q_NORM: *ne0 = p->qk_norm_full ? q : p->head_dim; return p->qk_norm || p->qk_norm_full;
    case PI2_TENSOR_ATTN_K_NORM: *ne0 = p->qk_norm_full ? k : p->head_dim; return p->qk_norm || p->qk_norm_full;
    case PI2_TENSOR_FFN_GATE: case PI2_TENSOR_FFN_UP: case PI2_TENSOR_FFN_DOWN:
        if (experts) return 0;
        break;
    default: break;
    }
    switch (role) {
    case PI2_TENSOR_TOKEN_EMBD: case PI2_TENSOR_OUTPUT: *ne0 = E; *ne1 = p->n_vocab; return 1;
    case PI2_TENSOR_OUTPUT_NORM: case PI2_TENSOR_ATTN_NORM: case PI2_TENSOR_FFN_NORM: *ne0 = E; return 1;
    case PI2_TENSOR_ROPE_FREQS: *ne0 = p->n_rot / 2; return 1;
    case PI2_TENSOR_ATTN_Q: *ne0 = E; *ne1 = q; return 1;
    case PI2_TENSOR_ATTN_K: *ne0 = E; *ne1 = k; return 1;
    case PI2_TENSOR_ATTN_V: *ne0 = E; *ne1 = v; return 1;
    case PI2_TENSOR_ATTN_OUTPUT: *ne0 = o; *ne1 = E; return 1;
    case PI2_TENSOR_ATTN_Q_BIAS: *ne0 = q; return p->qkv_bias;
    case PI2_TENSOR_ATTN_K_BIAS: *ne0 = k; return p->qkv_bias;
    case PI2_TENSOR_ATTN_V_BIAS: *ne0 = v; return p->qkv_bias;
    case PI2_TENSOR_ATTN_Q_NORM: case PI2_TENSOR_ATTN_K_NORM: *ne0 = p->head_dim; return p->qk_norm;
    case PI2_TENSOR_POST_ATTN_NORM: case PI2_TENSOR_POST_FFW_NORM: *ne0 = E; return p->post_norms;
    case PI2_TENSOR_FFN_GATE: case PI2_TENSOR_FFN_UP: *ne0 = E; *ne1 = p->n_ff; return 1;
    case PI2_TENSOR_FFN_DOWN: *ne0 = p->n_ff; *ne1 = E; return 1;
    case PI2_TENSOR_FFN_DOWN_ROWS: case PI2_TENSOR_FFN_GATE_PRED: *ne0 = E; *ne1 = p->n_ff; return 1;
    case PI2_TENSOR_FFN_PRED_FC1: *ne0 = E; *ne1 = 0; return 1;
    case PI2_TENSOR_FFN_PRED_FC2: *ne0 = 0; *ne1 = p->n_ff; return 1;
    case PI2_TENSOR_FFN_DOWN_SCALE: *ne0 = p->n_ff; return 1;
    case PI2_TENSOR_FFN_DOWN_COLSCALE: *ne0 = E; return 1;
    }
    return 0;
}

static int is_vector(int32_t role) {
    return role == PI2_TENSOR_OUTPUT_NORM || role == PI2_TENSOR_ROPE_FREQS || role == PI2_TENSOR_ATTN_NORM ||
           (role >= PI2_TENSOR_ATTN_Q_BIAS && role <= PI2_TENSOR_POST_ATTN_NORM) ||
           role == PI2_TENSOR_FFN_NORM || role == PI2_TENSOR_POST_FFW_NORM || role == PI2_TENSOR_FFN_DOWN_SCALE ||
           role == PI2_TENSOR_FFN_DOWN_COLSCALE || role == PI2_TENSOR_ATTN_OUTPUT_BIAS ||
           role == PI2_TENSOR_FFN_GATE_INP_SHEXP || role == PI2_TENSOR_FFN_DOWN_SCALE_EXPS ||
           role == PI2_TENSOR_FFN_DOWN_COLSCALE_EXPS;
}

pi2_status model_check_params(const pi2_model_params *p) {
    const int32_t dims[] = {p->n_vocab, p->n_embd, p->n_layer, p->n_ff, p->n_head, p->n_head_kv,
                            p->head_dim, p->head_dim_v, p->n_rot};
    for (size_t i = 0; i < sizeof dims / sizeof dims[0]; i++)
        if (dims[i] <= 0 || dims[i] > (1 << 24))
            return pi2_set_error(PI2_ERR_INVALID, "hyper-parameter %zu out of range: %d", i, (int)dims[i]);
    if (p->arch < PI2_ARCH_LLAMA || p->arch > PI2_ARCH_MOE)
        return pi2_set_error(PI2_ERR_UNSUPPORTED, "unknown architecture id %d", (int)p->arch);
    if (p->ffn_act < PI2_ACT_SILU || p->ffn_act > PI2_ACT_DRELU)
        return pi2_set_error(PI2_ERR_UNSUPPORTED, "unknown FFN activation id %d", (int)p->ffn_act);
    if (p->n_head % p->n_head_kv || p->n_rot % 2 || p->n_rot > p->head_dim || p->n_layer > 65536 ||
        p->head_dim > 4096 || p->head_dim_v > 4096 || p->sliding_window < 0 || p->swa_period < 0)
        return pi2_set_error(PI2_ERR_INVALID, "inconsistent attention hyper-parameters");
    if (!(p->rms_eps > 0 && isfinite(p->rms_eps) && p->rope_base > 0 && isfinite(p->rope_base) &&
          p->rope_freq_scale > 0 && isfinite(p->attn_scale) && isfinite(p->embd_scale) && p->logit_softcap >= 0))
        return pi2_set_error(PI2_ERR_INVALID, "a float hyper-parameter is out of range");
    if (p->arch == PI2_ARCH_MOE) {
        if (p->n_expert < 0 || p->n_expert > 1024 || (p->n_expert && (p->n_expert_used < 1 || p->n_expert_used > p->n_expert ||
            p->n_ff_exp < 1 || p->n_ff_exp > (1 << 24) || p->n_ff_shexp < 0 || p->n_ff_shexp > (1 << 24))))
            return pi2_set_error(PI2_ERR_INVALID, "bad expert hyper-parameters: %d experts, %d used, width %d",
                                 (int)p->n_expert, (int)p->n_expert_used, (int)p->n_ff_exp);
        if (p->n_expert && (p->expert_gating < PI2_GATING_SOFTMAX || p->expert_gating > PI2_GATING_SQRT_SOFTPLUS))
            return pi2_set_error(PI2_ERR_UNSUPPORTED, "unknown expert gating function %d", (int)p->expert_gating);
        if (p->expert_act != PI2_ACT_SILU && p->expert_act != PI2_ACT_RELU)
            return pi2_set_error(PI2_ERR_UNSUPPORTED, "expert activation %d is not SwiGLU or ReGLU", (int)p->expert_act);
        if (!isfinite(p->residual_scale) || !isfinite(p->logit_scale) || !isfinite(p->expert_weights_scale))
            return pi2_set_error(PI2_ERR_INVALID, "a float hyper-parameter is out of range");
    }
    return PI2_OK;
}

/* Check one descriptor against the file and the hyper-parameters. */
pi2_status model_check_desc(const pi2_model *m, const pi2_tensor_desc *d, int32_t i) {
    const pi2_model_params *p = &m->hp;
    if (d->role < 0 || d->role >= PI2_TENSOR_COUNT)
        return pi2_set_error(PI2_ERR_FORMAT, "tensor descriptor %d has unknown role %d", (int)i, (int)d->role);
    const char *name = MODEL_ROLE_NAMES[d->role];
    if (model_per_layer(d->role) ? (d->layer < 0 || d->layer >= p->n_layer) : d->layer != -1)
        return pi2_set_error(PI2_ERR_FORMAT, "tensor %s has layer %d (n_layer %d)", name, (int)d->layer, (int)p->n_layer);
    int64_t ne0, ne1;
    if (!model_expected(p, d->role, &ne0, &ne1))
        return pi2_set_error(PI2_ERR_FORMAT, "tensor %s (layer %d) is not read by this architecture", name, (int)d->layer);
    if ((ne0 ? d->ne[0] != ne0 : d->ne[0] < 1 || d->ne[0] > p->n_ff) ||
        (ne1 ? d->ne[1] != ne1 : d->ne[1] < 1 || d->ne[1] > p->n_ff) ||
        d->ne[2] != (is_expert(d->role) ? p->n_expert : 1) || d->ne[3] != 1)
        return pi2_set_error(PI2_ERR_FORMAT, "tensor %s (layer %d) has shape [%lld, %lld, %lld, %lld], expected [%lld, %lld]",
                             name, (int)d->layer, (long long)d->ne[0], (long long)d->ne[1], (long long)d->ne[2],
                             (long long)d->ne[3], (long long)ne0, (long long)ne1);
    ne0 = d->ne[0];
    ne1 = d->ne[1] * d->ne[2];   /* an expert tensor: n_expert runs of rows */
    uint64_t row;
    if (d->role == PI2_TENSOR_FFN_GATE_PRED) {   /* pi2's low-bit rows, times Q8_0 activations */
        if (!pi2_lowbit_bits(d->type))
            return pi2_set_error(PI2_ERR_UNSUPPORTED, "tensor %s (layer %d) has type %d, not a low-bit gate copy",
                                 name, (int)d->layer, (int)d->type);
        if (ne0 % QK8_0)
            return pi2_set_error(PI2_ERR_FORMAT, "tensor %s rows of %lld values are not whole blocks of %d",
                                 name, (long long)ne0, QK8_0);
        row = pi2_lowbit_row_bytes(pi2_lowbit_bits(d->type), ne0);
    } else {
        const pi2_type_traits *t = pi2_traits(d->type, PI2_IMPL_REF);
        const int rows_only = (d->role == PI2_TENSOR_FFN_DOWN_ROWS || d->role == PI2_TENSOR_FFN_DOWN_ROWS_EXPS) &&
                              d->type == PI2_T_I8;   /* summed, never dotted */
        if (is_vector(d->role) ? d->type != PI2_T_F32 : (!t || !(rows_only ? t->axpy_group != NULL : t->vec_dot != NULL)))
            return pi2_set_error(PI2_ERR_UNSUPPORTED, "tensor %s (layer %d) has ggml type %d, which pi2 cannot compute with",
                                 name, (int)d->layer, (int)d->type);
        const pi2_type_traits *a = rows_only ? t : pi2_traits(t->vec_dot_type, PI2_IMPL_REF);
        if (ne0 % t->block_size || ne0 % a->block_size)
            return pi2_set_error(PI2_ERR_FORMAT, "tensor %s rows of %lld values are not whole %s blocks",
                                 name, (long long)ne0, ne0 % t->block_size ? t->name : a->name);
        row = (uint64_t)(ne0 / t->block_size) * (uint64_t)t->type_size;
    }
    if (d->row_stride && (d->row_stride < row || d->row_stride % 4 || d->row_stride > m->map_size))
        return pi2_set_error(PI2_ERR_FORMAT, "tensor %s (layer %d) has a row stride of %llu bytes for rows of %llu",
                             name, (int)d->layer, (unsigned long long)d->row_stride, (unsigned long long)row);
    const uint64_t need = d->row_stride ? (uint64_t)(ne1 - 1) * d->row_stride + row : (uint64_t)ne1 * row;
    if (d->nbytes != need)
        return pi2_set_error(PI2_ERR_FORMAT, "tensor %s (layer %d) has %llu bytes, its shape and type need %llu",
                             name, (int)d->layer, (unsigned long long)d->nbytes, (unsigned long long)need);
    if (d->offset > m->map_size || d->nbytes > m->map_size - d->offset)
        return pi2_set_error(PI2_ERR_FORMAT, "tensor %s (layer %d) at offset %llu + %llu bytes runs past the end of "
                             "the file (%zu bytes)", name, (int)d->layer, (unsigned long long)d->offset,
                             (unsigned long long)d->nbytes, m->map_size);
    const unsigned align = d->type == PI2_T_F32 ? 4 : 2;
    if (d->offset % align)
        return pi2_set_error(PI2_ERR_FORMAT, "tensor %s (layer %d) at offset %llu is not %u-byte aligned",
                             name, (int)d->layer, (unsigned long long)d->offset, align);
    return PI2_OK;
}

/* Every tensor the architecture reads was described (seen[(layer + 1) * PI2_TENSOR_COUNT + role]), ffn_down or
 * ffn_down_rows (ffn_down_exps or ffn_down_rows_exps) but not both; the predictors and rope_freqs are optional. */
pi2_status model_check_present(const pi2_model_params *params, const uint8_t *seen) {
    for (int32_t layer = -1; layer < params->n_layer; layer++)
        for (int32_t role = 0; role < PI2_TENSOR_COUNT; role++) {
            int64_t ne0, ne1;
            if (model_per_layer(role) != (layer >= 0) || role == PI2_TENSOR_ROPE_FREQS || role == PI2_TENSOR_FFN_DOWN_ROWS ||
                (role >= PI2_TENSOR_FFN_GATE_PRED && role <= PI2_TENSOR_ATTN_OUTPUT_BIAS) ||
                role >= PI2_TENSOR_FFN_DOWN_ROWS_EXPS || !model_expected(params, role, &ne0, &ne1)) continue;
            const uint8_t *row = &seen[(size_t)(layer + 1) * PI2_TENSOR_COUNT];
            if (role == PI2_TENSOR_FFN_DOWN_EXPS && row[PI2_TENSOR_FFN_DOWN_ROWS_EXPS]) {
                if (row[role])
                    return pi2_set_error(PI2_ERR_FORMAT, "layer %d has both ffn_down_exps and ffn_down_rows_exps",
                                         (int)layer);
                continue;
            }
            if (role == PI2_TENSOR_FFN_DOWN && row[PI2_TENSOR_FFN_DOWN] && row[PI2_TENSOR_FFN_DOWN_ROWS])
                return pi2_set_error(PI2_ERR_FORMAT, "layer %d has both ffn_down and ffn_down_rows", (int)layer);
            if (!row[role] && !(role == PI2_TENSOR_FFN_DOWN && row[PI2_TENSOR_FFN_DOWN_ROWS]))
                return pi2_set_error(PI2_ERR_FORMAT, "tensor %s (layer %d) is missing", MODEL_ROLE_NAMES[role],
                                     (int)layer);
        }
    return PI2_OK;
}

/* Layer il's tensors that come together: int8 down rows with their scales (dense and experts), fc1 with fc2. */
pi2_status model_check_layer(const pi2_layer *L, int32_t il) {
    const int i8 = L->down_rows.data && L->down_rows.type == PI2_T_I8;
    if (i8 != (L->down_scale != NULL) || i8 != (L->down_colscale != NULL))
        return pi2_set_error(PI2_ERR_FORMAT, i8 ? "layer %d's int8 ffn_down_rows need ffn_down_scale and ffn_down_colscale"
                                             : "layer %d has ffn_down_scale/colscale without int8 ffn_down_rows", (int)il);
    const int i8x = L->down_rows_exps.data && L->down_rows_exps.type == PI2_T_I8;
    if (i8x != (L->down_scale_exps != NULL) || i8x != (L->down_colscale_exps != NULL))
        return pi2_set_error(PI2_ERR_FORMAT, "layer %d: int8 ffn_down_rows_exps go with ffn_down_scale_exps and "
                             "ffn_down_colscale_exps, and only they", (int)il);
    if (!L->fc1.data != !L->fc2.data || (L->fc1.data && L->fc1.n_out != L->fc2.n_in))
        return pi2_set_error(PI2_ERR_FORMAT, "layer %d: a predictor needs fc1 [r][n_embd] and fc2 [n_ff][r]", (int)il);
    return PI2_OK;
}
