/* ops.c — RMSNorm, RoPE, FFN activations and attention (ops.h), each the C twin of the function of
 * the same concept in pi2/reference.py, equal to it up to float summation order. Batch attention has
 * an AVX-512 path (lane sums in registers, same float order) chosen at run time on x86-64.
 * Does not: multiply by weight matrices (matmul.c) or hold state. */
#include "ops.h"

#include "kv_quant.h"

#include <math.h>
#include <string.h>

/* a·b + c with one rounding of the exact product's sum, as ggml_order.fma32 emulates FMA: the product
 * of two floats is exact in double (no libm call, no FMA instruction needed). */
static inline float fma32(float a, float b, float c) { return (float)((double)a * (double)b + (double)c); }

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

/* The lane loops below are plain float (or exact double) operations, equal per element at any
 * vector width: on x86-64 GCC build them also for AVX2 and AVX-512 and pick at load. */
#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__)
#define WIDE_CLONES __attribute__((target_clones("avx512f", "avx2", "default")))
#else
#define WIDE_CLONES
#endif

/* Selects on integer masks (all ones or zero): GCC will not if-convert float selects under its
 * default trapping-math rules, and these loops must vectorise. */
static inline uint32_t mask_if(int cond) { return (uint32_t)0 - (uint32_t)(cond != 0); }
static inline float select_f(uint32_t mask, float a, float b) {
    return pi2_f32_from_bits((mask & pi2_f32_to_bits(a)) | (~mask & pi2_f32_to_bits(b)));
}

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

/* pi2_fp16_to_f32(pi2_f32_to_fp16(x)) (traits.h's FP16-library bit tricks), with integer selects. */
static inline float f16_round(float f) {
    const uint32_t w = pi2_f32_to_bits(f), shl1_w = w + w, sign = w & 0x80000000u;
    uint32_t bias = shl1_w & 0xFF000000u;
    bias = bias < 0x71000000u ? 0x71000000u : bias;
    const float base = pi2_f32_from_bits((bias >> 1) + 0x07800000u) + (fabsf(f) * 0x1.0p+112f) * 0x1.0p-110f;
    const uint32_t bb = pi2_f32_to_bits(base), nonsign = ((bb >> 13) & 0x7C00u) + (bb & 0x0FFFu);
    const uint32_t is_nan = mask_if(shl1_w > 0xFF000000u);
    const uint32_t h = ((sign >> 16) | (is_nan & 0x7E00u) | (~is_nan & nonsign)) & 0xFFFFu;
    const uint32_t w2 = h << 16, two_w = w2 + w2;
    const float normalized = pi2_f32_from_bits((two_w >> 4) + (0xE0u << 23)) * 0x1.0p-112f;
    const float denormalized = pi2_f32_from_bits((two_w >> 17) | (126u << 23)) - 0.5f;
    return pi2_f32_from_bits((w2 & 0x80000000u) | pi2_f32_to_bits(select_f(mask_if(two_w < (1u << 27)), denormalized, normalized)));
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

/* Horizontal sum of 16 lanes as GCC expands _mm512_reduce_add_ps: halves, halves, (0+2, 1+3), 0+1. */
static float reduce16(const float *v) {
    float r8[8], r4[4];
    for (int i = 0; i < 8; i++) r8[i] = v[8 + i] + v[i];
    for (int i = 0; i < 4; i++) r4[i] = r8[4 + i] + r8[i];
    return (r4[0] + r4[2]) + (r4[1] + r4[3]);
}

/* ggml's two F16 dot-product orders (ggml_order.dot_f16_vec, dot_f16_tinyblas): term i of a dot
 * product goes to lane i % 16 of accumulator (i % 64) / 16 (one token, ggml_vec_dot_f16) or of a
 * single accumulator (batches, tinyBLAS); accumulators add up in term order, then lanes are
 * combined ((0+2) + (1+3)) and reduced (reduce16). Terms are products of F16 values, exact in
 * float, so no FMA is involved. Here many dot products run side by side (keys for q.k, value
 * dimensions for p.V): each (accumulator, lane) is a row of `width` floats updated by an axpy. */
#define KEY_BLOCK 64   /* keys scored together */
#define ACC(vec, i) ((vec) ? ((i) & 63) >> 4 : 0)

/* out[k] = the dot products' results from acc [4][16][width] (only [0] when !vec). */
WIDE_CLONES static void lanes_reduce(float *out, float *acc, int64_t width, int vec) {
    float *a[4] = {acc, acc + 16 * width, acc + 32 * width, acc + 48 * width};
    if (vec)
        for (int l = 0; l < 16; l++)
            for (int64_t k = 0; k < width; k++)
                a[0][l * width + k] = (a[0][l * width + k] + a[2][l * width + k]) + (a[1][l * width + k] + a[3][l * width + k]);
    float *v = a[0];
    for (int i = 0; i < 8; i++)
        for (int64_t k = 0; k < width; k++) v[i * width + k] = v[(8 + i) * width + k] + v[i * width + k];
    for (int i = 0; i < 4; i++)
        for (int64_t k = 0; k < width; k++) v[i * width + k] = v[(4 + i) * width + k] + v[i * width + k];
    for (int64_t k = 0; k < width; k++) out[k] = (v[k] + v[2 * width + k]) + (v[width + k] + v[3 * width + k]);
}

/* w[i] = F16 rounding of w[i] * inv (the attention weights as ggml stores them) */
WIDE_CLONES static void scale_to_f16(float *w, int64_t n, float inv) {
    for (int64_t i = 0; i < n; i++) w[i] = f16_round(w[i] * inv);
}

int64_t pi2_attn_acc_floats(int32_t head_dim, int32_t head_dim_v) {
    (void)head_dim;
    return 64 * (int64_t)(KEY_BLOCK > head_dim_v ? KEY_BLOCK : head_dim_v);
}

/* s[j] = scale · (q . key j) for j in [j0, j1): q.k for a block of keys at a time. */
WIDE_CLONES static void score_keys(const pi2_attn *a, const float *q, const pi2_fp16 *kT, float *s, int32_t j0,
                                   int32_t j1, float *acc, int vec) {
    for (int32_t jb = j0; jb < j1; jb += KEY_BLOCK) {
        const int32_t nb = j1 - jb < KEY_BLOCK ? j1 - jb : KEY_BLOCK;
        memset(acc, 0, (size_t)(vec ? 64 : 16) * nb * sizeof *acc);
        for (int32_t i = 0; i < a->head_dim; i++) {
            float *row = acc + (size_t)(ACC(vec, i) * 16 + (i & 15)) * nb;
            const pi2_fp16 *kr = kT + (size_t)i * a->n_ctx + jb;
            const float qi = q[i];
            for (int32_t k = 0; k < nb; k++) row[k] += qi * pi2_kv_h2f(kr[k]);
        }
        lanes_reduce(s + jb, acc, nb, vec);
        for (int32_t k = 0; k < nb; k++) s[jb + k] *= a->scale;
    }
}

/* out[d] = sum over j in [j0, j1) of p[j] · V[j][d]. */
WIDE_CLONES static void weigh_values(const pi2_attn *a, const float *p, const pi2_fp16 *v, float *out, int32_t j0,
                                     int32_t j1, float *acc, int vec) {
    const int32_t hdv = a->head_dim_v;
    const size_t vd = (size_t)a->n_head_kv * hdv;
    memset(acc, 0, (size_t)(vec ? 64 : 16) * hdv * sizeof *acc);
    for (int32_t j = j0; j < j1; j++) {
        float *row = acc + (size_t)(ACC(vec, j) * 16 + (j & 15)) * hdv;
        const pi2_fp16 *vr = v + (size_t)j * vd;
        const float pj = p[j];
        for (int32_t d = 0; d < hdv; d++) row[d] += pj * pi2_kv_h2f(vr[d]);
    }
    lanes_reduce(out, acc, hdv, vec);
}

#if defined(__x86_64__) && defined(__GNUC__)
#include <immintrin.h>
#define ATTN512 1
#define T512 __attribute__((target("avx512f,avx512bw,avx512vl")))

/* 16 halves at p (lanes outside m: +0) as floats. */
static inline T512 __m512 load_h16(__mmask16 m, const pi2_fp16 *p) {
    return _mm512_cvtph_ps(_mm256_maskz_loadu_epi16(m, p));
}

/* The sixteen lane sums l[0..15] of a batch dot product (one per vector lane: 16 keys or 16 value
 * dimensions) reduced as lanes_reduce does without vec: halves, halves, (0+2) + (1+3). */
static inline T512 __m512 reduce_lanes16(__m512 *l) {
    for (int i = 0; i < 8; i++) l[i] = _mm512_add_ps(l[8 + i], l[i]);
    for (int i = 0; i < 4; i++) l[i] = _mm512_add_ps(l[4 + i], l[i]);
    return _mm512_add_ps(_mm512_add_ps(l[0], l[2]), _mm512_add_ps(l[1], l[3]));
}

/* score_keys for a batch (tinyBLAS's order, one accumulator) with the 16 lane sums of 16 keys in
 * registers: term i goes to l[i % 16], added in term order; products of F16 values are exact in float,
 * so the FMA rounds like the separate product and sum. */
static T512 void score_keys_512(const pi2_attn *a, const float *q, const pi2_fp16 *kT, float *s, int32_t j0,
                                 int32_t j1) {
    const int32_t hd = a->head_dim;
    for (int32_t jb = j0; jb < j1; jb += 16) {
        const __mmask16 m = (__mmask16)(j1 - jb >= 16 ? 0xFFFF : (1u << (j1 - jb)) - 1);
        __m512 l[16];
        for (int k = 0; k < 16; k++) l[k] = _mm512_setzero_ps();
        for (int32_t i0 = 0; i0 < hd; i0 += 16) {
#pragma GCC unroll 16
            for (int k = 0; k < 16; k++)
                if (i0 + k < hd)
                    l[k] = _mm512_fmadd_ps(_mm512_set1_ps(q[i0 + k]),
                                           load_h16(m, kT + (size_t)(i0 + k) * a->n_ctx + jb), l[k]);
        }
        _mm512_mask_storeu_ps(s + jb, m, _mm512_mul_ps(reduce_lanes16(l), _mm512_set1_ps(a->scale)));
    }
}

/* weigh_values for a batch: term j goes to l[j % 16] (absolute position, as ACC and the lane index
 * above), 16 value dimensions per pass. */
static T512 void weigh_values_512(const pi2_attn *a, const float *p, const pi2_fp16 *v, float *out, int32_t j0,
                                   int32_t j1) {
    const int32_t hdv = a->head_dim_v;
    const size_t vd = (size_t)a->n_head_kv * hdv;
    for (int32_t d0 = 0; d0 < hdv; d0 += 16) {
        const __mmask16 m = (__mmask16)(hdv - d0 >= 16 ? 0xFFFF : (1u << (hdv - d0)) - 1);
        __m512 l[16];
        for (int k = 0; k < 16; k++) l[k] = _mm512_setzero_ps();
        for (int32_t jb = j0 & ~15; jb < j1; jb += 16) {
#pragma GCC unroll 16
            for (int k = 0; k < 16; k++)
                if (jb + k >= j0 && jb + k < j1)
                    l[k] = _mm512_fmadd_ps(_mm512_set1_ps(p[jb + k]),
                                           load_h16(m, v + (size_t)(jb + k) * vd + d0), l[k]);
        }
        _mm512_mask_storeu_ps(out + d0, m, reduce_lanes16(l));
    }
}
#else
#define ATTN512 0
#endif

#if ATTN512
/* The largest of s[j0..pos] as the loop below finds it: lanes keep x when x > their max (NaN never), then the
 * lanes the same way; only the sign of a zero maximum can differ, which s - max and v_expf do not see. */
static T512 float row_max_512(const float *s, int32_t j0, int32_t pos) {
    const __m512 ninf = _mm512_set1_ps(-INFINITY);
    __m512 mx = ninf;
    for (int32_t j = j0; j <= pos; j += 16) {
        const __mmask16 m = (__mmask16)(pos + 1 - j >= 16 ? 0xFFFF : (1u << (pos + 1 - j)) - 1);
        const __m512 x = _mm512_mask_loadu_ps(ninf, m, s + j);
        mx = _mm512_mask_mov_ps(mx, _mm512_cmp_ps_mask(x, mx, _CMP_GT_OQ), x);
    }
    float l[16], max = -INFINITY;
    _mm512_storeu_ps(l, mx);
    for (int i = 0; i < 16; i++) max = l[i] > max ? l[i] : max;
    return max;
}

/* The sum below: each aligned block of 16 positions (zero outside j0..pos) reduced as reduce16, in double. */
static T512 double row_sum_512(const float *s, int32_t j0, int32_t pos) {
    double sum = 0.0;
    for (int32_t b = j0 & ~15; b <= pos; b += 16) {
        const uint32_t lo = b < j0 ? 0xFFFFu << (j0 - b) : 0xFFFFu, hi = pos + 1 - b >= 16 ? 0xFFFFu : (1u << (pos + 1 - b)) - 1;
        const __m512 x = _mm512_maskz_loadu_ps((__mmask16)(lo & hi), s + b);
        const __m256 r8 = _mm256_add_ps(_mm512_castps512_ps256(x), _mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(x), 1)));
        const __m128 r4 = _mm_add_ps(_mm256_castps256_ps128(r8), _mm256_extractf128_ps(r8, 1));
        const __m128 t = _mm_add_ps(r4, _mm_movehl_ps(r4, r4));    /* r4[0] + r4[2], r4[1] + r4[3] */
        sum += (double)_mm_cvtss_f32(_mm_add_ss(t, _mm_shuffle_ps(t, t, 1)));
    }
    return sum;
}
#endif

void pi2_attn_softmax_row(float *s, int32_t j0, int32_t pos) {
#if ATTN512
    const int wide = pi2_cpu_avx512_half();
#else
    const int wide = 0;
#endif
    float max = -INFINITY;
    if (!wide)
        for (int32_t j = j0; j <= pos; j++) max = s[j] > max ? s[j] : max;
#if ATTN512
    else max = row_max_512(s, j0, pos);
#endif
    exp_shifted(s + j0, pos + 1 - j0, max);
    double sum = 0.0;
    if (!wide)
        for (int32_t b = j0 & ~15; b <= pos; b += 16) {
            float lane[16] = {0};
            for (int32_t j = b > j0 ? b : j0; j < b + 16 && j <= pos; j++) lane[j & 15] = s[j];
            sum += (double)reduce16(lane);
        }
#if ATTN512
    else sum = row_sum_512(s, j0, pos);
#endif
    scale_to_f16(s + j0, pos + 1 - j0, (float)(1.0 / sum));
}

WIDE_CLONES static void round_f16(float *y, const float *x, int64_t n) {
    for (int64_t i = 0; i < n; i++) y[i] = f16_round(x[i]);
}

void pi2_f16_round_row(float *y, const float *x, int64_t n) { round_f16(y, x, n); }

/* One (token, head): softmax(scale · q.k) over the visible keys (ggml_order.softmax: v_expf, sums of
 * 16 aligned positions reduced in float and added into a double), weights rounded to F16, times V.
 * Keys and values come from the cache. */
static void attn_task(void *arg, int32_t task, int32_t thread) {
    const pi2_attn *a = arg;
    const int32_t t = task / a->n_head, h = task % a->n_head, hkv = h / (a->n_head / a->n_head_kv);
    const int32_t pos = a->pos0 + t, vec = a->n_tok == 1, hd = a->head_dim, hdv = a->head_dim_v;
    const int32_t j0 = a->window && pos - a->window + 1 > 0 ? pos - a->window + 1 : 0;
    float *s = a->scores + (size_t)thread * a->n_ctx, *qf = a->qf + (size_t)thread * hd;
    float *acc = a->acc + (size_t)thread * pi2_attn_acc_floats(hd, hdv);
    const float *q = a->q + ((size_t)t * a->n_head + h) * hd;
#if ATTN512
    const int wide = !vec && pi2_cpu_avx512_half();
#endif
    const pi2_fp16 *kT = a->k + (size_t)hkv * hd * a->n_ctx, *v = a->v + (size_t)hkv * hdv;
    float *out = a->out + ((size_t)t * a->n_head + h) * hdv;
    if (a->kq)   /* quantized keys: the query quantized to their dot product's format (qf as scratch) */
        pi2_kv_scores(a->kt, a->kq, a->k_cell_bytes, hkv, hd, q, a->scale, s, j0, pos + 1, qf);
    else {
        for (int32_t d = 0; d < hd; d++) qf[d] = f16_round(q[d]);
#if ATTN512
        if (wide) score_keys_512(a, qf, kT, s, j0, pos + 1);
        else
#endif
        if (!vec || !pi2_attn_dec_scores(qf, kT, (size_t)a->n_ctx, hd, a->scale, s, j0, pos + 1, acc))
            score_keys(a, qf, kT, s, j0, pos + 1, acc, vec);
    }
    pi2_attn_softmax_row(s, j0, pos);
#if ATTN512
    if (wide) weigh_values_512(a, s, v, out, j0, pos + 1);
    else
#endif
    if (!vec || !pi2_attn_dec_values(s, v, (size_t)a->n_head_kv * hdv, hdv, out, j0, pos + 1, acc))
        weigh_values(a, s, v, out, j0, pos + 1, acc, vec);
}

void pi2_attention(pi2_pool *pool, pi2_attn *a) {
    if (a->flash) pi2_flash_attention(pool, a);
    else if (!pi2_attn_batch(pool, a)) pi2_pool_run(pool, attn_task, a, a->n_tok * a->n_head);
}

void pi2_attn_scores_vec(const pi2_attn *a, const float *qf, const pi2_fp16 *kT, float *s, int32_t j0, int32_t j1,
                         float *acc) {
    if (!pi2_attn_dec_scores(qf, kT, (size_t)a->n_ctx, a->head_dim, a->scale, s, j0, j1, acc))
        score_keys(a, qf, kT, s, j0, j1, acc, 1);
}
