/* kv_quant.c — a Q8_0 K cache as llama.cpp 0c1e570 keeps it with flash attention off (kv_quant.h): keys and queries
 * rotated by a Walsh-Hadamard matrix (ggml_compute_forward_fwht), keys quantized by the Q8_0 traits' quantizer
 * (quantize_row_q8_0), K·Q by the Q8_0 vec_dot on the query quantized to Q8_0, and the context shift through
 * floats. pi2/reference/kv_cache.py is the specification.
 * Does not: the softmax or the product with V (ops.c), decide when to shift (forward.c), allocate (context.c). */
#include "kv_quant.h"

#include <math.h>

#include "context.h"
#include "ops.h"

int pi2_kv_type_ok(int32_t type_k) { return type_k == PI2_T_F16 || type_k == PI2_T_Q8_0; }

size_t pi2_kv_k_cell_bytes(const pi2_model_params *hp, int32_t type_k) {
    const size_t kd = (size_t)hp->n_head_kv * (size_t)hp->head_dim;
    return type_k == PI2_T_Q8_0 ? kd / QK8_0 * sizeof(blk_q8_0) : kd * sizeof(float);
}

size_t pi2_kv_k_bytes(const pi2_model_params *hp, int32_t type_k, int32_t n_ctx) {
    return (size_t)hp->n_layer * (size_t)n_ctx * pi2_kv_k_cell_bytes(hp, type_k);
}

int32_t pi2_kv_rot_size(int32_t head_dim, int32_t type_k) {
    if (type_k == PI2_T_F16 || head_dim % 64) return 0;
    int32_t n = 64;
    while (head_dim % (2 * n) == 0) n *= 2;
    return n;
}

void pi2_kv_fwht(float *x, int64_t n_vals, int32_t n) {
    const float scale = 1.0f / sqrtf((float)n);
    for (int64_t r = 0; r < n_vals; r += n) {
        float *y = x + r;
        for (int32_t j = 0; j < n; j++) y[j] = y[j] * scale;
        for (int32_t len = 1; len < n; len <<= 1)
            for (int32_t i = 0; i < n; i += 2 * len)
                for (int32_t j = 0; j < len; j++) {
                    const float u = y[i + j], v = y[i + len + j];
                    y[i + j] = u + v;
                    y[i + len + j] = u - v;
                }
    }
}

void pi2_kv_store_k(pi2_ctx *c, int32_t il, size_t pos, const float *k) {
    const pi2_model_params *hp = &c->m->hp;
    uint8_t *cell = c->k_blocks + ((size_t)il * (size_t)c->p.n_ctx + pos) * c->k_cell_bytes;
    c->kt->quantize_act(k, cell, (int64_t)hp->n_head_kv * hp->head_dim);
}

void pi2_kv_scores(const pi2_type_traits *kt, const uint8_t *keys, size_t cell_bytes, int32_t hkv, int32_t head_dim,
                   const float *q, float scale, float *s, int32_t j0, int32_t j1, void *qq) {
    const size_t head_bytes = (size_t)head_dim / QK8_0 * sizeof(blk_q8_0);
    kt->quantize_act(q, qq, head_dim);
    const uint8_t *k = keys + (size_t)hkv * head_bytes;
    for (int32_t j = j0; j < j1; j++) {
        kt->vec_dot(head_dim, &s[j], k + (size_t)j * cell_bytes, qq);
        s[j] *= scale;
    }
}

void pi2_kv_shift_k(pi2_ctx *c, int32_t il, int32_t n_keep, int32_t n_discard, int32_t m, const float *cs,
                    float *row) {
    const pi2_model_params *hp = &c->m->hp;
    const int64_t kd = (int64_t)hp->n_head_kv * hp->head_dim;
    uint8_t *layer = c->k_blocks + (size_t)il * (size_t)c->p.n_ctx * c->k_cell_bytes;
    for (int32_t t = 0; t < m; t++) {
        const uint8_t *from = layer + (size_t)(n_keep + n_discard + t) * c->k_cell_bytes;
        c->kt->to_float(from, row, kd);
        if (c->k_rot) pi2_kv_fwht(row, kd, c->k_rot);
        pi2_rope(row, hp->n_head_kv, hp->head_dim, hp->n_rot, cs, hp->rope_neox);
        if (c->k_rot) pi2_kv_fwht(row, kd, c->k_rot);
        c->kt->quantize_act(row, layer + (size_t)(n_keep + t) * c->k_cell_bytes, kd);
    }
}
