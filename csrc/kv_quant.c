/* kv_quant.c — a quantized K cache (Q8_0, Q4_0, Q4_1, Q5_0, Q5_1) as llama.cpp 0c1e570 keeps it with flash attention
 * off (kv_quant.h): keys and queries rotated by a Walsh-Hadamard matrix (ggml_compute_forward_fwht), keys quantized
 * by the CPU type traits' from_float (quantize_row_q8_0; the scalar reference quantizers of the 4- and 5-bit types,
 * which ggml_set_rows calls), K·Q by the type's vec_dot on the query quantized to its vec_dot type (Q8_0, or Q8_1 for
 * Q4_1 and Q5_1), and the context shift through floats. pi2/reference/kv_cache.py is the specification.
 * Does not: the softmax or the product with V (attn.c), decide when to shift (forward.c), allocate (context.c). */
#include "kv_quant.h"

#include <math.h>

#include "context.h"
#include "ops.h"

#include <float.h>
#include <string.h>

/* Bytes of one 32-value block of a quantized K type; 0 for other types. */
static size_t block_bytes(int32_t type_k) {
    switch (type_k) {
    case PI2_T_Q8_0: return sizeof(blk_q8_0);
    case PI2_T_Q4_0: return sizeof(blk_q4_0);
    case PI2_T_Q4_1: return sizeof(blk_q4_1);
    case PI2_T_Q5_0: return sizeof(blk_q5_0);
    case PI2_T_Q5_1: return sizeof(blk_q5_1);
    default: return 0;
    }
}

int pi2_kv_type_ok(int32_t type_k) { return type_k == PI2_T_F16 || block_bytes(type_k) > 0; }

size_t pi2_kv_k_cell_bytes(const pi2_model_params *hp, int32_t type_k) {
    const size_t kd = (size_t)hp->n_head_kv * (size_t)hp->head_dim;
    return type_k == PI2_T_F16 ? kd * sizeof(pi2_fp16) : kd / QK8_0 * block_bytes(type_k);
}

/* The 32 values of x: their absolute maximum's signed value (the first of equal magnitudes); min_max: both ends. */
static float signed_amax(const float *x) {
    float amax = 0.0f, max = 0.0f;
    for (int j = 0; j < 32; j++)
        if (amax < fabsf(x[j])) { amax = fabsf(x[j]); max = x[j]; }
    return max;
}

static void min_max(const float *x, float *mn, float *mx) {
    *mn = FLT_MAX, *mx = -FLT_MAX;
    for (int j = 0; j < 32; j++) {
        if (x[j] < *mn) *mn = x[j];
        if (x[j] > *mx) *mx = x[j];
    }
}

/* ggml's scalar quantizers of one 32-value block (quantize_row_q4_0_ref, _q4_1_ref, _q5_0_ref, _q5_1_ref): the
 * codes are (int8_t)(x·id + offset) capped at 15 or 31, packed low nibble first, 5th bits in qh. */
static void quantize_block(int32_t type, const float *x, uint8_t *out) {
    const int bits5 = type == PI2_T_Q5_0 || type == PI2_T_Q5_1, top = bits5 ? 31 : 15;
    const int with_min = type == PI2_T_Q4_1 || type == PI2_T_Q5_1;
    float mn = 0.0f, d;
    if (with_min) {
        float mx;
        min_max(x, &mn, &mx);
        d = (mx - mn) / (float)top;
    } else {
        d = signed_amax(x) / (bits5 ? -16.0f : -8.0f);
    }
    const float id = d ? 1.0f / d : 0.0f, off = with_min ? 0.5f : bits5 ? 16.5f : 8.5f;
    uint8_t q[32];
    for (int j = 0; j < 32; j++) {      /* Q5_1's codes are (uint8_t)(·) uncapped, the others' capped int8_t */
        const int v = with_min && bits5 ? (uint8_t)((x[j] - mn) * id + off) : (int8_t)((x[j] - mn) * id + off);
        q[j] = (uint8_t)(v < top || (with_min && bits5) ? v : top);
    }
    const pi2_fp16 dh = pi2_f32_to_fp16(d), mh = pi2_f32_to_fp16(mn);
    uint8_t *qs = out + (with_min ? 4 : 2) + (bits5 ? 4 : 0);
    memcpy(out, &dh, 2);
    if (with_min) memcpy(out + 2, &mh, 2);
    uint32_t qh = 0;
    for (int j = 0; j < 16; j++) {
        qs[j] = (uint8_t)((q[j] & 0x0F) | ((q[j + 16] & 0x0F) << 4));
        qh |= ((q[j] & 0x10u) >> 4) << j | ((q[j + 16] & 0x10u) >> 4) << (j + 16);
    }
    if (bits5) memcpy(out + (with_min ? 4 : 2), &qh, 4);
}

/* n values (a multiple of 32) into blocks of `type`, as ggml_set_rows stores them; tr: the type's traits. */
static void quantize_rows(int32_t type, const pi2_type_traits *tr, const float *x, uint8_t *dst, int64_t n) {
    if (type == PI2_T_Q8_0) {
        tr->quantize_act(x, dst, n);     /* Q8_0's from_float is its activation quantizer */
        return;
    }
    const size_t bb = block_bytes(type);
    for (int64_t b = 0; b < n / 32; b++) quantize_block(type, x + b * 32, dst + (size_t)b * bb);
}

/* n keys' values (a multiple of 32) into blocks of the cache's type. */
static void quantize_keys(const pi2_ctx *c, const float *x, uint8_t *dst, int64_t n) {
    quantize_rows(c->p.type_k, c->kt, x, dst, n);
}

size_t pi2_kv_v_cell_bytes(const pi2_model_params *hp, int32_t type_v) {
    const size_t vd = (size_t)hp->n_head_kv * (size_t)hp->head_dim_v;
    return type_v == PI2_T_F16 ? vd * sizeof(pi2_fp16) : vd / QK8_0 * block_bytes(type_v);
}

size_t pi2_kv_v_bytes(const pi2_model_params *hp, int32_t type_v, int32_t n_ctx) {
    return (size_t)hp->n_layer * (size_t)n_ctx * pi2_kv_v_cell_bytes(hp, type_v);
}

void pi2_kv_store_v(pi2_ctx *c, int32_t il, size_t pos, const float *v) {
    const pi2_model_params *hp = &c->m->hp;
    uint8_t *cell = c->v_blocks + ((size_t)il * (size_t)c->p.n_ctx + pos) * c->v_cell_bytes;
    quantize_rows(c->p.type_v, c->vt, v, cell, (int64_t)hp->n_head_kv * hp->head_dim_v);
}

int32_t pi2_kv_k_ld(int32_t n_ctx) {
    return (n_ctx + 31) / 32 * 32;   /* whole 64-byte lines of halves */
}

size_t pi2_kv_k_bytes(const pi2_model_params *hp, int32_t type_k, int32_t n_ctx) {
    const int32_t cells = type_k == PI2_T_F16 ? pi2_kv_k_ld(n_ctx) : n_ctx;
    return (size_t)hp->n_layer * (size_t)cells * pi2_kv_k_cell_bytes(hp, type_k);
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
    quantize_keys(c, k, cell, (int64_t)hp->n_head_kv * hp->head_dim);
}

void pi2_kv_scores(const pi2_type_traits *kt, const uint8_t *keys, size_t cell_bytes, int32_t hkv, int32_t head_dim,
                   const float *q, float scale, float *s, int32_t j0, int32_t j1, void *qq) {
    const size_t head_bytes = (size_t)head_dim / (size_t)kt->block_size * (size_t)kt->type_size;
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
        quantize_keys(c, row, layer + (size_t)(n_keep + t) * c->k_cell_bytes, kd);
    }
}
