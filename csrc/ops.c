/* ops.c — RMSNorm, RoPE, FFN activations and attention (ops.h), each the C twin of the function of
 * the same concept in pi2/reference.py, equal to it up to float summation order.
 * Does not: multiply by weight matrices (matmul.c) or hold state. */
#include "ops.h"

#include <math.h>

void pi2_rms_norm(float *y, const float *x, const float *w, int64_t n, float eps) {
    double ss = 0.0;
    for (int64_t i = 0; i < n; i++) ss += (double)(x[i] * x[i]);
    const float mean = (float)(ss / (double)n);
    const float scale = 1.0f / sqrtf(mean + eps);
    if (w) for (int64_t i = 0; i < n; i++) y[i] = x[i] * scale * w[i];
    else for (int64_t i = 0; i < n; i++) y[i] = x[i] * scale;
}

void pi2_rope_cache(float *cs, int32_t pos, int32_t n_rot, float base, float freq_scale, const float *ff) {
    const float theta_scale = powf(base, -2.0f / (float)n_rot);
    float theta = (float)pos;
    for (int32_t i = 0; i < n_rot / 2; i++) {
        const float t = ff ? theta / ff[i] : theta;
        const float a = freq_scale * t;
        cs[2 * i] = cosf(a);
        cs[2 * i + 1] = sinf(a);
        theta *= theta_scale;
    }
}

void pi2_rope(float *x, int32_t n_heads, int32_t head_dim, int32_t n_rot, const float *cs, int32_t neox) {
    const int32_t half = n_rot / 2, stride = neox ? half : 1, step = neox ? 1 : 2;
    for (int32_t h = 0; h < n_heads; h++) {
        float *xh = x + (size_t)h * head_dim;
        for (int32_t i = 0; i < half; i++) {
            float *a = xh + i * step, *b = a + stride;
            const float c = cs[2 * i], s = cs[2 * i + 1], x0 = *a, x1 = *b;
            *a = x0 * c - x1 * s;
            *b = x0 * s + x1 * c;
        }
    }
}

void pi2_gelu_table(pi2_fp16 *table) {
    const float c = 0.7978845608028654f, a = 0.044715f;
    for (uint32_t h = 0; h < 65536; h++) {
        const float x = pi2_fp16_to_f32((pi2_fp16)h);
        table[h] = pi2_f32_to_fp16(0.5f * x * (1.0f + tanhf(c * x * (1.0f + a * x * x))));
    }
}

void pi2_ffn_activate(float *g, const float *u, int64_t n, int32_t act, const pi2_fp16 *gelu_table) {
    if (act == 0) {          /* PI2_ACT_SILU */
        for (int64_t i = 0; i < n; i++) g[i] = g[i] / (1.0f + expf(-g[i])) * u[i];
    } else if (act == 1) {   /* PI2_ACT_GELU, through the F16 table like ggml */
        for (int64_t i = 0; i < n; i++) {
            const float x = g[i];
            const float y = x <= -10.0f ? 0.0f : x >= 10.0f ? x : pi2_fp16_to_f32(gelu_table[pi2_f32_to_fp16(x)]);
            g[i] = y * u[i];
        }
    } else {                 /* PI2_ACT_RELU */
        for (int64_t i = 0; i < n; i++) g[i] = (g[i] > 0.0f ? g[i] : 0.0f) * u[i];
    }
}

/* One (token, head): softmax(scale * q.k) over the visible keys, weights rounded to F16, times V. */
static void attn_task(void *arg, int32_t task, int32_t thread) {
    const pi2_attn *a = arg;
    const int32_t t = task / a->n_head, h = task % a->n_head;
    const int32_t hkv = h / (a->n_head / a->n_head_kv), pos = a->pos0 + t;
    const int32_t j0 = a->window && pos - a->window + 1 > 0 ? pos - a->window + 1 : 0;
    const size_t k_stride = (size_t)a->n_head_kv * a->head_dim;
    float *s = a->scores + (size_t)thread * a->n_ctx;
    pi2_fp16 *qh = a->qh + (size_t)thread * a->head_dim, *ph = a->ph + (size_t)thread * a->n_ctx;
    const float *q = a->q + ((size_t)t * a->n_head + h) * a->head_dim;
    for (int32_t d = 0; d < a->head_dim; d++) qh[d] = pi2_f32_to_fp16(q[d]);

    float max = -INFINITY;
    for (int32_t j = j0; j <= pos; j++) {
        float kq;
        a->dot_f16(a->head_dim, &kq, a->k + (size_t)j * k_stride + (size_t)hkv * a->head_dim, qh);
        s[j] = kq * a->scale;
        if (s[j] > max) max = s[j];
    }
    double sum = 0.0;
    for (int32_t j = j0; j <= pos; j++) {
        s[j] = expf(s[j] - max);
        sum += (double)s[j];
    }
    const float inv = (float)(1.0 / sum);
    for (int32_t j = j0; j <= pos; j++) ph[j] = pi2_f32_to_fp16(s[j] * inv);
    float *out = a->out + ((size_t)t * a->n_head + h) * a->head_dim_v;
    const pi2_fp16 *v = a->v + (size_t)hkv * a->head_dim_v * a->n_ctx;
    for (int32_t d = 0; d < a->head_dim_v; d++)
        a->dot_f16(pos - j0 + 1, &out[d], v + (size_t)d * a->n_ctx + j0, ph + j0);
}

void pi2_attention(pi2_pool *pool, pi2_attn *a) {
    pi2_pool_run(pool, attn_task, a, a->n_tok * a->n_head);
}
