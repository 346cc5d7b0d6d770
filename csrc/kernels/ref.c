/* ref.c — scalar reference kernels: the C twin of pi2/qdot.py's orders and of ggml's generic vec_dots, and the
 * reference table.
 * Does: vec_dot for every weight type, summing integers per block and applying the scales afterwards: Q4_K and Q6_K
 *       (ref_k.h) and Q5_K in llama.cpp's x86 float order for single tokens and for batches (vec_dot_batch); the
 *       table of every type's scalar kernels (its conversions, to_float and the activation quantizers, come from
 *       ref_convert.c).
 * Does not: use SIMD or pick implementations (traits.c), validate arguments (api.c).
 * Always built; fast paths (x86.c, neon.c) are tested against these functions. Must be compiled
 * without floating-point contraction (-std=c11 / -ffp-contract=off) to stay bit-exact. */
#include "traits.h"

#include <math.h>

/* ---------------- vec_dot (integer sums per block, then scales) ---------------- */

static void f32_vec_dot(int64_t n, float *s, const void *w, const void *x) {
    const float *a = w, *b = x;
    double sum = 0;
    for (int64_t i = 0; i < n; i++) sum += (double)(a[i] * b[i]);
    *s = (float)sum;
}

static void f16_vec_dot(int64_t n, float *s, const void *w, const void *x) {
    const pi2_fp16 *a = w, *b = x;
    double sum = 0;
    for (int64_t i = 0; i < n; i++) sum += (double)(pi2_fp16_to_f32(a[i]) * pi2_fp16_to_f32(b[i]));
    *s = (float)sum;
}

static void bf16_vec_dot(int64_t n, float *s, const void *w, const void *x) {
    const pi2_bf16 *a = w, *b = x;
    double sum = 0;
    for (int64_t i = 0; i < n; i++) sum += (double)(pi2_bf16_to_f32(a[i]) * pi2_bf16_to_f32(b[i]));
    *s = (float)sum;
}

static void q4_0_vec_dot(int64_t n, float *s, const void *w, const void *xq) {
    const blk_q4_0 *x = w; const blk_q8_0 *y = xq;
    float sumf = 0;
    for (int64_t i = 0; i < n / 32; i++) {
        int sumi = 0;
        for (int j = 0; j < 16; j++)
            sumi += ((x[i].qs[j] & 0xF) - 8) * y[i].qs[j] + ((x[i].qs[j] >> 4) - 8) * y[i].qs[j + 16];
        sumf += sumi * pi2_fp16_to_f32(x[i].d) * pi2_fp16_to_f32(y[i].d);
    }
    *s = sumf;
}

static void q4_1_vec_dot(int64_t n, float *s, const void *w, const void *xq) {
    const blk_q4_1 *x = w; const blk_q8_1 *y = xq;
    float sumf = 0;
    for (int64_t i = 0; i < n / 32; i++) {
        int sumi = 0;
        for (int j = 0; j < 16; j++)
            sumi += (x[i].qs[j] & 0xF) * y[i].qs[j] + (x[i].qs[j] >> 4) * y[i].qs[j + 16];
        sumf += (pi2_fp16_to_f32(x[i].d) * pi2_fp16_to_f32(y[i].d)) * sumi
              + pi2_fp16_to_f32(x[i].m) * pi2_fp16_to_f32(y[i].s);
    }
    *s = sumf;
}

static void q5_0_vec_dot(int64_t n, float *s, const void *w, const void *xq) {
    const blk_q5_0 *x = w; const blk_q8_0 *y = xq;
    float sumf = 0;
    for (int64_t i = 0; i < n / 32; i++) {
        uint32_t qh; memcpy(&qh, x[i].qh, 4);
        int sumi = 0;
        for (int j = 0; j < 16; j++) {
            const int x0 = ((x[i].qs[j] & 0xF) | (((qh >> j) & 1) << 4)) - 16;
            const int x1 = ((x[i].qs[j] >> 4) | (((qh >> (j + 16)) & 1) << 4)) - 16;
            sumi += x0 * y[i].qs[j] + x1 * y[i].qs[j + 16];
        }
        sumf += (pi2_fp16_to_f32(x[i].d) * pi2_fp16_to_f32(y[i].d)) * sumi;
    }
    *s = sumf;
}

static void q5_1_vec_dot(int64_t n, float *s, const void *w, const void *xq) {
    const blk_q5_1 *x = w; const blk_q8_1 *y = xq;
    float sumf = 0;
    for (int64_t i = 0; i < n / 32; i++) {
        uint32_t qh; memcpy(&qh, x[i].qh, 4);
        int sumi = 0;
        for (int j = 0; j < 16; j++) {
            const int x0 = (x[i].qs[j] & 0xF) | (((qh >> j) & 1) << 4);
            const int x1 = (x[i].qs[j] >> 4) | (((qh >> (j + 16)) & 1) << 4);
            sumi += x0 * y[i].qs[j] + x1 * y[i].qs[j + 16];
        }
        sumf += (pi2_fp16_to_f32(x[i].d) * pi2_fp16_to_f32(y[i].d)) * sumi
              + pi2_fp16_to_f32(x[i].m) * pi2_fp16_to_f32(y[i].s);
    }
    *s = sumf;
}

static void q8_0_vec_dot(int64_t n, float *s, const void *w, const void *xq) {
    const blk_q8_0 *x = w; const blk_q8_0 *y = xq;
    float sumf = 0;
    for (int64_t i = 0; i < n / 32; i++) {
        int sumi = 0;
        for (int j = 0; j < 32; j++) sumi += x[i].qs[j] * y[i].qs[j];
        sumf += sumi * (pi2_fp16_to_f32(x[i].d) * pi2_fp16_to_f32(y[i].d));
    }
    *s = sumf;
}

static inline float fma_d(float a, float b, float c) { return (float)((double)a * (double)b + (double)c); }

/* Q5_K's 5-bit code of value l of 32-value sub-block j. */
static inline int q5_K_code(const blk_q5_K *x, int j, int l) {
    const uint8_t q = x->qs[32 * (j / 2) + l];
    return ((j & 1) ? q >> 4 : q & 0xF) | (((x->qh[l] >> j) & 1) << 4);
}

/* ggml_vec_dot_q5_K_q8_K (AVX2), fewer than 8 tokens (qdot.dot_q5_k_vec): int lane m = Σ_j sc_j·Σ code·q8 over
 * values 4m..4m+3 of every sub-block j; per block acc_m = fma(float(lane_m), d_y·d_x, acc_m) and
 * summs = fma(−d_y·dmin_x, Σ_j mn_j·(bsums[2j] + bsums[2j+1]), summs); then hsum_float_8(acc) + summs. */
static void q5_K_vec_dot(int64_t n, float *s, const void *w, const void *xq) {
    const blk_q5_K *x = w; const blk_q8_K *y = xq;
    float acc[8] = {0}, summs = 0;
    for (int64_t i = 0; i < n / QK_K; i++) {
        int32_t lane[8] = {0}, hs = 0;
        for (int j = 0; j < 8; j++) {
            uint8_t sc, mn;
            pi2_k4_scale_min(j, x[i].scales, &sc, &mn);
            for (int m = 0; m < 8; m++) {
                int32_t dot = 0;
                for (int l = 4 * m; l < 4 * m + 4; l++) dot += q5_K_code(&x[i], j, l) * y[i].qs[32 * j + l];
                lane[m] += sc * dot;
            }
            hs += mn * (y[i].bsums[2 * j] + y[i].bsums[2 * j + 1]);
        }
        const float d = y[i].d * pi2_fp16_to_f32(x[i].d), dmin = -y[i].d * pi2_fp16_to_f32(x[i].dmin);
        for (int m = 0; m < 8; m++) acc[m] = fma_d((float)lane[m], d, acc[m]);
        summs = fma_d(dmin, (float)hs, summs);
    }
    float r[4];
    for (int m = 0; m < 4; m++) r[m] = acc[m + 4] + acc[m];
    *s = ((r[0] + r[2]) + (r[1] + r[3])) + summs;
}

/* The tiled kernel with mins (8+ tokens, qdot.dot_q5_k_tiled): per block s1 = Σ_j sc_j·Σ code·q8 and
 * s2 = Σ_j mn_j·bsum_j (int), res = fma(−dmin_x, float(s2), float(s1)·d_x), acc = fma(res, d_y, acc). */
static void q5_K_tiled_dot(int64_t n, float *s, const void *w, const void *xq) {
    const blk_q5_K *x = w; const blk_q8_K *y = xq;
    float acc = 0;
    for (int64_t i = 0; i < n / QK_K; i++) {
        int32_t s1 = 0, s2 = 0;
        for (int j = 0; j < 8; j++) {
            uint8_t sc, mn;
            pi2_k4_scale_min(j, x[i].scales, &sc, &mn);
            int32_t dot = 0;
            for (int l = 0; l < 32; l++) dot += q5_K_code(&x[i], j, l) * y[i].qs[32 * j + l];
            s1 += sc * dot;
            s2 += mn * (y[i].bsums[2 * j] + y[i].bsums[2 * j + 1]);
        }
        const float f1d = (float)s1 * pi2_fp16_to_f32(x[i].d);
        const float res = fma_d(-pi2_fp16_to_f32(x[i].dmin), (float)s2, f1d);
        acc = fma_d(res, y[i].d, acc);
    }
    *s = acc;
}

#include "ref_k.h"   /* Q4_K and Q6_K in ggml's x86 float order */

/* ---------------- the reference table ---------------- */

#define ROW(T, NAME, BS, TS, VDT, DOT) \
    tab[T] = (pi2_type_traits){NAME, BS, TS, VDT, NULL, DOT, NULL, "ref", NULL, 0, 0, NULL, NULL, NULL, NULL, NULL, 0, NULL}

void pi2_kernels_fill_ref(pi2_type_traits *tab) {
    memset(tab, 0, sizeof(pi2_type_traits) * PI2_T_COUNT);
    ROW(PI2_T_F32, "F32", 1, 4, PI2_T_F32, f32_vec_dot);
    ROW(PI2_T_F16, "F16", 1, 2, PI2_T_F16, f16_vec_dot);
    ROW(PI2_T_BF16, "BF16", 1, 2, PI2_T_BF16, bf16_vec_dot);
    ROW(PI2_T_Q4_0, "Q4_0", 32, 18, PI2_T_Q8_0, q4_0_vec_dot);
    ROW(PI2_T_Q4_1, "Q4_1", 32, 20, PI2_T_Q8_1, q4_1_vec_dot);
    ROW(PI2_T_Q5_0, "Q5_0", 32, 22, PI2_T_Q8_0, q5_0_vec_dot);
    ROW(PI2_T_Q5_1, "Q5_1", 32, 24, PI2_T_Q8_1, q5_1_vec_dot);
    ROW(PI2_T_Q8_0, "Q8_0", 32, 34, PI2_T_Q8_0, q8_0_vec_dot);
    ROW(PI2_T_Q8_1, "Q8_1", 32, 36, PI2_T_Q8_1, NULL);
    ROW(PI2_T_Q4_K, "Q4_K", 256, 144, PI2_T_Q8_K, q4_K_vec_dot);
    ROW(PI2_T_Q5_K, "Q5_K", 256, 176, PI2_T_Q8_K, q5_K_vec_dot);
    ROW(PI2_T_Q6_K, "Q6_K", 256, 210, PI2_T_Q8_K, q6_K_vec_dot);
    ROW(PI2_T_Q8_K, "Q8_K", 256, 292, PI2_T_Q8_K, NULL);
    pi2_kernels_fill_ref_convert(tab);   /* to_float and quantize_act (ref_convert.c) */
    tab[PI2_T_Q4_K].vec_dot_batch = q4_K_gemm_dot;
    tab[PI2_T_Q4_K].batch_group = 4, tab[PI2_T_Q4_K].batch_min = 4;
    tab[PI2_T_Q6_K].vec_dot_batch = q6_K_tiled_dot;
    tab[PI2_T_Q6_K].batch_group = 1, tab[PI2_T_Q6_K].batch_min = 8;
    tab[PI2_T_Q5_K].vec_dot_batch = q5_K_tiled_dot;
    tab[PI2_T_Q5_K].batch_group = 1, tab[PI2_T_Q5_K].batch_min = 8;
    tab[PI2_T_Q8_1].vec_dot_impl = tab[PI2_T_Q8_K].vec_dot_impl = NULL;  /* activation-only */
}
