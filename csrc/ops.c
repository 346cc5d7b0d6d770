/* ops.c — RMSNorm, RoPE, ggml's exp and the FFN activations (ops.h), each the C twin of the function of the same
 * concept in pi2/reference.py, equal to it up to float summation order.
 * Does not: attention (attn.c, attn_batch.c, attn_decode.c, flash_attn.c), multiply by weight matrices (matmul.c) or
 * hold state. */
#include "ops.h"

#include "ops_lanes.h"

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
            *a = fma32(x0, c, -(x1 * s));   /* GCC's vectorised rotate_pairs (vfmaddsub) */
            *b = fma32(x0, s, x1 * c);
        }
    }
}

static inline float pow2i(int e) { return pi2_f32_from_bits((uint32_t)(e + 127) << 23); }   /* -126 <= e <= 127 */

/* ggml_v_expf (AVX-512 branch): n = round(x log2 e), b = x - n ln2 in two FMAs, a degree-5
 * polynomial, scaled by 2^n; |n| > 192 gives 0 or inf. Twin of ggml_order.v_expf, branch-free:
 * j * 2^n is one rounding, as vscalefps and ldexpf; outside the normal exponents n is split so the
 * first product stays exact (the second factor is 1 otherwise). */
static inline float v_expf(float x) {
    const float r = 0x1.8p23f;
    const float n = fma32(x, 0x1.715476p+0f, r) - r;
    const float b = fma32(-n, 0x1.7f7d1cp-20f, fma32(-n, 0x1.62e4p-1f, x));
    const float u = b * b;
    const float j = fma32(fma32(fma32(0x1.0e4020p-7f, b, 0x1.573e2ep-5f), u, fma32(0x1.555e66p-3f, b, 0x1.fffdb6p-2f)), u,
                         fma32(0x1.ffffecp-1f, b, 1.0f));
    const uint32_t nb = pi2_f32_to_bits(n), abs_nb = nb & 0x7FFFFFFFu;
    const uint32_t in_range = mask_if(abs_nb <= 0x43400000u);            /* |n| <= 192 (not NaN) */
    const int e = (int)select_f(in_range, n, 0.0f);
    int e1 = e < -126 ? -100 : e;
    e1 = e1 > 127 ? 127 : e1;
    const float y = j * pow2i(e1) * pow2i(e - e1);
    const uint32_t to_zero = mask_if(abs_nb <= 0x7F800000u && (nb >> 31));   /* n <= 0, not NaN */
    return select_f(in_range, y, select_f(to_zero, 0.0f, INFINITY));
}

/* s[i] = v_expf(s[i] - max) */
WIDE_CLONES static void exp_shifted(float *s, int64_t n, float max) {
    for (int64_t i = 0; i < n; i++) s[i] = v_expf(s[i] - max);
}

void pi2_exp_shifted(float *s, int64_t n, float max) { exp_shifted(s, n, max); }

/* g[i] = silu(g[i]) * u[i], as ggml_v_silu then the product */
WIDE_CLONES static void swiglu(float *g, const float *u, int64_t n) {
    for (int64_t i = 0; i < n; i++) g[i] = g[i] / (1.0f + v_expf(0.0f - g[i])) * u[i];
}

void pi2_gelu_table(pi2_fp16 *table) {
    const float c = 0.7978845608028654f, a = 0.044715f;
    for (uint32_t h = 0; h < 65536; h++) {
        const float x = pi2_fp16_to_f32((pi2_fp16)h);
        table[h] = pi2_f32_to_fp16(0.5f * x * (1.0f + tanhf(c * x * (1.0f + a * x * x))));
    }
}

/* a[i] = silu(g[i]) as swiglu computes it before the product */
WIDE_CLONES static void silu(float *a, const float *g, int64_t n) {
    for (int64_t i = 0; i < n; i++) a[i] = g[i] / (1.0f + v_expf(0.0f - g[i]));
}

void pi2_ffn_act_values(float *a, const float *g, int64_t n, int32_t act, const pi2_fp16 *gelu_table) {
    if (act == 0) {
        silu(a, g, n);
    } else if (act == 1) {
        for (int64_t i = 0; i < n; i++) {
            const float x = g[i];
            a[i] = x <= -10.0f ? 0.0f : x >= 10.0f ? x : pi2_fp16_to_f32(gelu_table[pi2_f32_to_fp16(x)]);
        }
    } else {
        for (int64_t i = 0; i < n; i++) a[i] = g[i] > 0.0f ? g[i] : 0.0f;
    }
}

void pi2_ffn_activate(float *g, const float *u, int64_t n, int32_t act, const pi2_fp16 *gelu_table) {
    if (act == 0) {          /* PI2_ACT_SILU */
        swiglu(g, u, n);
    } else if (act == 1) {   /* PI2_ACT_GELU, through the F16 table like ggml */
        for (int64_t i = 0; i < n; i++) {
            const float x = g[i];
            const float y = x <= -10.0f ? 0.0f : x >= 10.0f ? x : pi2_fp16_to_f32(gelu_table[pi2_f32_to_fp16(x)]);
            g[i] = y * u[i];
        }
    } else {                 /* PI2_ACT_RELU, PI2_ACT_DRELU (relu of up too) */
        for (int64_t i = 0; i < n; i++) g[i] = (g[i] > 0.0f ? g[i] : 0.0f) * pi2_ffn_up_factor(u[i], act);
    }
}
