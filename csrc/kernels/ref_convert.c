/* ref_convert.c — the scalar reference conversions: the C twin of pi2/quants.py and of ggml's generic code.
 * Does: to_float for every known type (bit-exact with gguf.quants.dequantize); the activation quantizers of llama.cpp's
 *       x86 build, as pi2/quants.py specifies them (Q8_0, Q8_1, Q8_K, F16, BF16, F32), on every CPU; and puts both in
 *       the reference table (pi2_kernels_fill_ref_convert).
 * Does not: multiply (ref.c has the vec_dots and the table's other fields) or use SIMD (x86.c, neon.c). Must be
 * compiled without floating-point contraction (-std=c11 / -ffp-contract=off) to stay bit-exact. */
#include "traits.h"

#include <math.h>

/* ---------------- to_float (bit-exact with gguf.quants.dequantize) ---------------- */

static void f32_to_float(const void *src, float *y, int64_t n) { memcpy(y, src, (size_t)n * 4); }

static void f16_to_float(const void *src, float *y, int64_t n) {
    const pi2_fp16 *x = src;
    for (int64_t i = 0; i < n; i++) y[i] = pi2_fp16_to_f32(x[i]);
}

static void bf16_to_float(const void *src, float *y, int64_t n) {
    const pi2_bf16 *x = src;
    for (int64_t i = 0; i < n; i++) y[i] = pi2_bf16_to_f32(x[i]);
}

static void q4_0_to_float(const void *src, float *y, int64_t n) {
    const blk_q4_0 *x = src;
    for (int64_t i = 0; i < n / 32; i++, y += 32) {
        const float d = pi2_fp16_to_f32(x[i].d);
        for (int j = 0; j < 16; j++) {
            y[j] = ((x[i].qs[j] & 0xF) - 8) * d;
            y[j + 16] = ((x[i].qs[j] >> 4) - 8) * d;
        }
    }
}

static void q4_1_to_float(const void *src, float *y, int64_t n) {
    const blk_q4_1 *x = src;
    for (int64_t i = 0; i < n / 32; i++, y += 32) {
        const float d = pi2_fp16_to_f32(x[i].d), m = pi2_fp16_to_f32(x[i].m);
        for (int j = 0; j < 16; j++) {
            y[j] = (x[i].qs[j] & 0xF) * d + m;
            y[j + 16] = (x[i].qs[j] >> 4) * d + m;
        }
    }
}

static void q5_0_to_float(const void *src, float *y, int64_t n) {
    const blk_q5_0 *x = src;
    for (int64_t i = 0; i < n / 32; i++, y += 32) {
        const float d = pi2_fp16_to_f32(x[i].d);
        uint32_t qh; memcpy(&qh, x[i].qh, 4);
        for (int j = 0; j < 16; j++) {
            const int h0 = ((qh >> j) & 1) << 4, h1 = ((qh >> (j + 16)) & 1) << 4;
            y[j] = (((x[i].qs[j] & 0xF) | h0) - 16) * d;
            y[j + 16] = (((x[i].qs[j] >> 4) | h1) - 16) * d;
        }
    }
}

static void q5_1_to_float(const void *src, float *y, int64_t n) {
    const blk_q5_1 *x = src;
    for (int64_t i = 0; i < n / 32; i++, y += 32) {
        const float d = pi2_fp16_to_f32(x[i].d), m = pi2_fp16_to_f32(x[i].m);
        uint32_t qh; memcpy(&qh, x[i].qh, 4);
        for (int j = 0; j < 16; j++) {
            const int h0 = ((qh >> j) & 1) << 4, h1 = ((qh >> (j + 16)) & 1) << 4;
            y[j] = ((x[i].qs[j] & 0xF) | h0) * d + m;
            y[j + 16] = ((x[i].qs[j] >> 4) | h1) * d + m;
        }
    }
}

static void q8_0_to_float(const void *src, float *y, int64_t n) {
    const blk_q8_0 *x = src;
    for (int64_t i = 0; i < n / 32; i++, y += 32) {
        const float d = pi2_fp16_to_f32(x[i].d);
        for (int j = 0; j < 32; j++) y[j] = x[i].qs[j] * d;
    }
}

static void q8_1_to_float(const void *src, float *y, int64_t n) {
    const blk_q8_1 *x = src;
    for (int64_t i = 0; i < n / 32; i++, y += 32) {
        const float d = pi2_fp16_to_f32(x[i].d);
        for (int j = 0; j < 32; j++) y[j] = x[i].qs[j] * d;
    }
}

static void q8_K_to_float(const void *src, float *y, int64_t n) {
    const blk_q8_K *x = src;
    for (int64_t i = 0; i < n / QK_K; i++, y += QK_K)
        for (int j = 0; j < QK_K; j++) y[j] = x[i].d * x[i].qs[j];
}

static void q4_K_to_float(const void *src, float *y, int64_t n) {
    const blk_q4_K *x = src;
    for (int64_t i = 0; i < n / QK_K; i++) {
        const float d = pi2_fp16_to_f32(x[i].d), dmin = pi2_fp16_to_f32(x[i].dmin);
        const uint8_t *q = x[i].qs;
        for (int c = 0; c < 4; c++, q += 32) {
            uint8_t sc, mn;
            pi2_k4_scale_min(2 * c, x[i].scales, &sc, &mn);
            const float d1 = d * sc, m1 = dmin * mn;
            pi2_k4_scale_min(2 * c + 1, x[i].scales, &sc, &mn);
            const float d2 = d * sc, m2 = dmin * mn;
            for (int l = 0; l < 32; l++) *y++ = d1 * (q[l] & 0xF) - m1;
            for (int l = 0; l < 32; l++) *y++ = d2 * (q[l] >> 4) - m2;
        }
    }
}

static void q5_K_to_float(const void *src, float *y, int64_t n) {
    const blk_q5_K *x = src;
    for (int64_t i = 0; i < n / QK_K; i++) {
        const float d = pi2_fp16_to_f32(x[i].d), dmin = pi2_fp16_to_f32(x[i].dmin);
        const uint8_t *q = x[i].qs, *qh = x[i].qh;
        for (int c = 0; c < 4; c++, q += 32) {
            uint8_t sc, mn;
            pi2_k4_scale_min(2 * c, x[i].scales, &sc, &mn);
            const float d1 = d * sc, m1 = dmin * mn;
            pi2_k4_scale_min(2 * c + 1, x[i].scales, &sc, &mn);
            const float d2 = d * sc, m2 = dmin * mn;
            for (int l = 0; l < 32; l++) *y++ = d1 * ((q[l] & 0xF) + (((qh[l] >> (2 * c)) & 1) << 4)) - m1;
            for (int l = 0; l < 32; l++) *y++ = d2 * ((q[l] >> 4) + (((qh[l] >> (2 * c + 1)) & 1) << 4)) - m2;
        }
    }
}

static void q6_K_to_float(const void *src, float *y, int64_t n) {
    const blk_q6_K *x = src;
    for (int64_t i = 0; i < n / QK_K; i++) {
        const float d = pi2_fp16_to_f32(x[i].d);
        const uint8_t *ql = x[i].ql, *qh = x[i].qh;
        const int8_t *sc = x[i].scales;
        for (int h = 0; h < 2; h++, y += 128, ql += 64, qh += 32, sc += 8) {
            for (int l = 0; l < 32; l++) {
                const int is = l / 16;
                const int q1 = ((ql[l] & 0xF) | (((qh[l] >> 0) & 3) << 4)) - 32;
                const int q2 = ((ql[l + 32] & 0xF) | (((qh[l] >> 2) & 3) << 4)) - 32;
                const int q3 = ((ql[l] >> 4) | (((qh[l] >> 4) & 3) << 4)) - 32;
                const int q4 = ((ql[l + 32] >> 4) | (((qh[l] >> 6) & 3) << 4)) - 32;
                y[l] = d * sc[is] * q1;
                y[l + 32] = d * sc[is + 2] * q2;
                y[l + 64] = d * sc[is + 4] * q3;
                y[l + 96] = d * sc[is + 6] * q4;
            }
        }
    }
}

/* ---------------- activation quantizers (bit-exact with pi2/quants.py) ---------------- */

static void f32_from_float(const float *x, void *dst, int64_t n) { memcpy(dst, x, (size_t)n * 4); }

static void f16_from_float(const float *x, void *dst, int64_t n) {
    pi2_fp16 *y = dst;
    for (int64_t i = 0; i < n; i++) y[i] = pi2_f32_to_fp16(x[i]);
}

static void bf16_from_float(const float *x, void *dst, int64_t n) {
    pi2_bf16 *y = dst;
    for (int64_t i = 0; i < n; i++) y[i] = pi2_f32_to_bf16(x[i]);
}

static inline int nearest_int(float fval) {  /* round half to even via the 1.5·2^23 trick */
    float val = fval + 12582912.f;
    int i; memcpy(&i, &val, sizeof i);
    return (i & 0x007fffff) - 0x00400000;
}

/* As llama.cpp's x86 quantize_row_q8_0 (AVX2), the numpy lane's choice on every platform:
 * d = amax/127, q = round-half-even(x · (127/amax)). Returns the f32 d; fills d16 and qs. */
static float q8_32_block(const float *x, pi2_fp16 *d16, int8_t *qs) {
    float amax = 0.0f;
    for (int j = 0; j < 32; j++) amax = fmaxf(amax, fabsf(x[j]));
    const float d = amax / 127.0f, id = amax != 0.0f ? 127.0f / amax : 0.0f;
    *d16 = pi2_f32_to_fp16(d);
    for (int j = 0; j < 32; j++) qs[j] = (int8_t)nearest_int(x[j] * id);
    return d;
}

static void q8_0_from_float(const float *x, void *dst, int64_t n) {
    blk_q8_0 *y = dst;
    for (int64_t i = 0; i < n / 32; i++, x += 32) q8_32_block(x, &y[i].d, y[i].qs);
}

static void q8_1_from_float(const float *x, void *dst, int64_t n) {  /* s = fp16(d_f32 · Σq) */
    blk_q8_1 *y = dst;
    for (int64_t i = 0; i < n / 32; i++, x += 32) {
        const float d = q8_32_block(x, &y[i].d, y[i].qs);
        int sum = 0;
        for (int j = 0; j < 32; j++) sum += y[i].qs[j];
        y[i].s = pi2_f32_to_fp16(d * (float)sum);
    }
}

/* As quantize_row_q8_K_ref (llama.cpp's x86 build uses it too). */
static void q8_K_from_float(const float *x, void *dst, int64_t n) {
    blk_q8_K *y = dst;
    for (int64_t i = 0; i < n / QK_K; i++, x += QK_K) {
        float max = 0, amax = 0;
        for (int j = 0; j < QK_K; j++) {
            const float ax = fabsf(x[j]);
            if (ax > amax) { amax = ax; max = x[j]; }
        }
        memset(&y[i], 0, sizeof y[i]);
        if (!amax) continue;
        const float iscale = -127.f / max;
        for (int j = 0; j < QK_K; j++) {
            const int v = nearest_int(iscale * x[j]);
            y[i].qs[j] = (int8_t)(v < 127 ? v : 127);
        }
        for (int j = 0; j < QK_K / 16; j++) {
            int sum = 0;
            for (int l = 0; l < 16; l++) sum += y[i].qs[16 * j + l];
            y[i].bsums[j] = (int16_t)sum;
        }
        y[i].d = 1 / iscale;
    }
}

/* ---------------- their places in the reference table ---------------- */

#define CONV(T, TOF, QA) (tab[T].to_float = TOF, tab[T].quantize_act = QA)

void pi2_kernels_fill_ref_convert(pi2_type_traits *tab) {
    CONV(PI2_T_F32, f32_to_float, f32_from_float);
    CONV(PI2_T_F16, f16_to_float, f16_from_float);
    CONV(PI2_T_BF16, bf16_to_float, bf16_from_float);
    CONV(PI2_T_Q4_0, q4_0_to_float, q8_0_from_float);
    CONV(PI2_T_Q4_1, q4_1_to_float, q8_1_from_float);
    CONV(PI2_T_Q5_0, q5_0_to_float, q8_0_from_float);
    CONV(PI2_T_Q5_1, q5_1_to_float, q8_1_from_float);
    CONV(PI2_T_Q8_0, q8_0_to_float, q8_0_from_float);
    CONV(PI2_T_Q8_1, q8_1_to_float, q8_1_from_float);
    CONV(PI2_T_Q4_K, q4_K_to_float, q8_K_from_float);
    CONV(PI2_T_Q5_K, q5_K_to_float, q8_K_from_float);
    CONV(PI2_T_Q6_K, q6_K_to_float, q8_K_from_float);
    CONV(PI2_T_Q8_K, q8_K_to_float, q8_K_from_float);
}
