/* ggml_order.c — the dot products of ggml_order.h, plain C whose loops GCC builds for AVX-512, AVX2 and the baseline
 * (each lane's operations are the same at every width, so all three give the same bits). */
#include "ggml_order.h"
#include "pack.h"

#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__)
/* the ifunc symbols target_clones makes keep default visibility: csrc/exports.map hides them */
#define WIDE_CLONES __attribute__((target_clones("avx512f", "avx2", "default")))
#else
#define WIDE_CLONES
#endif

static inline float fma32(float a, float b, float c) { return (float)((double)a * (double)b + (double)c); }

/* _mm512_reduce_add_ps as GCC expands it: 256-bit halves, 128-bit halves, (0+2, 1+3), 0+1. */
static inline float reduce16(const float *v) {
    float r8[8], r4[4];
    for (int i = 0; i < 8; i++) r8[i] = v[8 + i] + v[i];
    for (int i = 0; i < 4; i++) r4[i] = r8[4 + i] + r8[i];
    return (r4[0] + r4[2]) + (r4[1] + r4[3]);
}

WIDE_CLONES float pi2_go_dot_f32(int64_t n, const float *w, const float *x) {
    float acc[4][16] = {{0}};
    const int64_t nn = n - n % 64;
    for (int64_t i = 0; i < nn; i += 64)
        for (int j = 0; j < 4; j++)
            for (int l = 0; l < 16; l++) acc[j][l] = fma32(x[i + 16 * j + l], w[i + 16 * j + l], acc[j][l]);
    float s = 0.0f;
    if (nn) {
        float v[16];
        for (int l = 0; l < 16; l++) v[l] = (acc[0][l] + acc[2][l]) + (acc[1][l] + acc[3][l]);
        s = reduce16(v);
    }
    for (int64_t i = nn; i < n; i++) s = fma32(x[i], w[i], s);
    return s;
}

WIDE_CLONES float pi2_go_tinyblas_f32(int64_t n, const float *w, const float *x) {
    float acc[16] = {0};
    for (int64_t i = 0; i < n; i += 16)
        for (int l = 0; l < 16; l++) acc[l] = fma32(x[i + l], w[i + l], acc[l]);
    return reduce16(acc);
}

WIDE_CLONES float pi2_go_dot_f16(int64_t n, const pi2_fp16 *w, const float *xh) {
    float acc[4][16] = {{0}};
    for (int64_t i = 0; i < n; i += 64)
        for (int j = 0; j < 4; j++)
            for (int l = 0; l < 16; l++) {
                const int64_t k = i + 16 * j + l;
                if (k < n) acc[j][l] += pi2_fp16_to_f32(w[k]) * xh[k];   /* exact product */
            }
    float v[16];
    for (int l = 0; l < 16; l++) v[l] = (acc[0][l] + acc[2][l]) + (acc[1][l] + acc[3][l]);
    return reduce16(v);
}

WIDE_CLONES float pi2_go_tinyblas_f16(int64_t n, const pi2_fp16 *w, const float *xh) {
    float acc[16] = {0};
    for (int64_t i = 0; i < n; i += 16)
        for (int l = 0; l < 16; l++) acc[l] += pi2_fp16_to_f32(w[i + l]) * xh[i + l];
    return reduce16(acc);
}

static inline int32_t q4_0_isum(const blk_q4_0 *b, const blk_q8_0 *y) {
    int32_t s = 0;
    for (int i = 0; i < 16; i++)
        s += ((int32_t)(b->qs[i] & 0xF) - 8) * y->qs[i] + ((int32_t)(b->qs[i] >> 4) - 8) * y->qs[i + 16];
    return s;
}

float pi2_go_dot_q4_0(int64_t n, const blk_q4_0 *w, const blk_q8_0 *x) {
    float acc = 0.0f;
    for (int64_t b = 0; b < n / 32; b++)
        acc = fma32((float)q4_0_isum(&w[b], &x[b]), pi2_fp16_to_f32(w[b].d) * pi2_fp16_to_f32(x[b].d), acc);
    return acc;
}

WIDE_CLONES void pi2_go_dot_q4_0_rows4(int64_t n, float *s, const uint8_t *w, size_t w_stride, const blk_q8_0 *x) {
    float acc[4] = {0};
    const blk_q4_0 *r[4];
    for (int k = 0; k < 4; k++) r[k] = (const blk_q4_0 *)(w + (size_t)k * w_stride);
    for (int64_t b = 0; b < n / 32; b++) {
        const float dx = pi2_fp16_to_f32(x[b].d);
        for (int k = 0; k < 4; k++)
            acc[k] = fma32((float)q4_0_isum(&r[k][b], &x[b]), pi2_fp16_to_f32(r[k][b].d) * dx, acc[k]);
    }
    for (int k = 0; k < 4; k++) s[k] = acc[k];
}

#if defined(__x86_64__) && defined(__GNUC__)
#include <immintrin.h>

/* Eight rows' exact block sums side by side (AVX2): per row, the unsigned nibbles times the activation (maddubs,
 * then madd) give eight int32 partial sums; hadd trees put row k's Σ nibble·y in lane k, and Σ (nibble − 8)·y is that
 * minus 8·Σ y (one per block, shared by the rows). The FMA chain per row is fdot.py's (product and sum in double,
 * one rounding to float); the scales go through F16C. */
/* One block of 8 rows: acc += isum · (d_row · d_x), each product and sum in double rounded to float, as ggml's
 * order has it (both Q4_0 row kernels below). */
__attribute__((target("avx2,fma,f16c"))) static inline void accumulate8(__m256 isum, const pi2_fp16 *dh, pi2_fp16 dx,
                                                                        __m256d *acc_lo, __m256d *acc_hi) {
    const __m256 scale = _mm256_mul_ps(_mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)dh)),
                                       _mm256_set1_ps(pi2_fp16_to_f32(dx)));
    const __m256d i_lo = _mm256_cvtps_pd(_mm256_castps256_ps128(isum)), i_hi = _mm256_cvtps_pd(_mm256_extractf128_ps(isum, 1));
    const __m256d s_lo = _mm256_cvtps_pd(_mm256_castps256_ps128(scale)), s_hi = _mm256_cvtps_pd(_mm256_extractf128_ps(scale, 1));
    *acc_lo = _mm256_cvtps_pd(_mm256_cvtpd_ps(_mm256_add_pd(_mm256_mul_pd(i_lo, s_lo), *acc_lo)));
    *acc_hi = _mm256_cvtps_pd(_mm256_cvtpd_ps(_mm256_add_pd(_mm256_mul_pd(i_hi, s_hi), *acc_hi)));
}

__attribute__((target("avx2,fma,f16c"))) static void q4_0_rows8_avx2(int64_t n, float *s, const uint8_t *w, size_t w_stride,
                                                                     const blk_q8_0 *x) {
    const __m256i m4 = _mm256_set1_epi8(0xF), ones = _mm256_set1_epi16(1), ones8 = _mm256_set1_epi8(1);
    __m256d acc_lo = _mm256_setzero_pd(), acc_hi = _mm256_setzero_pd();
    const blk_q4_0 *r[8];
    for (int k = 0; k < 8; k++) r[k] = (const blk_q4_0 *)(w + (size_t)k * w_stride);
    for (int64_t b = 0; b < n / 32; b++) {
        const __m256i y = _mm256_loadu_si256((const __m256i *)x[b].qs);
        /* Σ y over the block, times 8, in every lane */
        const __m256i ysum16 = _mm256_maddubs_epi16(ones8, y);
        __m256i ysum = _mm256_madd_epi16(ysum16, ones);
        ysum = _mm256_hadd_epi32(ysum, ysum);
        ysum = _mm256_hadd_epi32(ysum, ysum);
        ysum = _mm256_add_epi32(ysum, _mm256_permute2x128_si256(ysum, ysum, 0x01));
        const __m256i y8 = _mm256_slli_epi32(ysum, 3);
        __m256i p[8];
        uint16_t dh[8];
        for (int k = 0; k < 8; k++) {
            const blk_q4_0 *rb = r[k] + b;
            const __m128i q = _mm_loadu_si128((const __m128i *)rb->qs);
            const __m256i v = _mm256_and_si256(_mm256_set_m128i(_mm_srli_epi16(q, 4), q), m4);
            p[k] = _mm256_madd_epi16(_mm256_maddubs_epi16(v, y), ones);
            dh[k] = rb->d;
        }
        const __m256i h01 = _mm256_hadd_epi32(p[0], p[1]), h23 = _mm256_hadd_epi32(p[2], p[3]);
        const __m256i h45 = _mm256_hadd_epi32(p[4], p[5]), h67 = _mm256_hadd_epi32(p[6], p[7]);
        const __m256i h0123 = _mm256_hadd_epi32(h01, h23), h4567 = _mm256_hadd_epi32(h45, h67);
        /* lanes: [r0 r1 r2 r3 | r0 r1 r2 r3] halves of rows 0-3, the same for 4-7 */
        const __m256i lo = _mm256_permute2x128_si256(h0123, h4567, 0x20), hi = _mm256_permute2x128_si256(h0123, h4567, 0x31);
        const __m256 isum = _mm256_cvtepi32_ps(_mm256_sub_epi32(_mm256_add_epi32(lo, hi), y8));
        accumulate8(isum, dh, x[b].d, &acc_lo, &acc_hi);
    }
    _mm_storeu_ps(s, _mm256_cvtpd_ps(acc_lo));
    _mm_storeu_ps(s + 4, _mm256_cvtpd_ps(acc_hi));
}

/* The same with AVX-512 VNNI on 256-bit vectors: rows two by two in one vector ([row a | row b], the activation's
 * halves repeated), vpdpbusd for the nibble products, three hadds for the eight totals. */
__attribute__((target("avx2,fma,f16c,avx512vl,avx512vnni"))) static void q4_0_rows8_vnni(int64_t n, float *s,
                                                                                       const uint8_t *w, size_t w_stride,
                                                                                       const blk_q8_0 *x) {
    const __m256i m4 = _mm256_set1_epi8(0xF), ones8 = _mm256_set1_epi8(1), zero = _mm256_setzero_si256();
    const __m256i order = _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7);
    __m256d acc_lo = _mm256_setzero_pd(), acc_hi = _mm256_setzero_pd();
    const blk_q4_0 *r[8];
    for (int k = 0; k < 8; k++) r[k] = (const blk_q4_0 *)(w + (size_t)k * w_stride);
    for (int64_t b = 0; b < n / 32; b++) {
        const char *ahead = (const char *)w + 8 * w_stride + (size_t)b * 8 * sizeof(blk_q4_0);
        _mm_prefetch(ahead, _MM_HINT_T0);   /* the next eight rows, spread over this pass (its share of them) */
        _mm_prefetch(ahead + 64, _MM_HINT_T0);
        _mm_prefetch(ahead + 128, _MM_HINT_T0);
        const __m128i ylo = _mm_loadu_si128((const __m128i *)x[b].qs), yhi = _mm_loadu_si128((const __m128i *)(x[b].qs + 16));
        const __m256i ylo2 = _mm256_set_m128i(ylo, ylo), yhi2 = _mm256_set_m128i(yhi, yhi);
        __m256i ysum = _mm256_dpbusd_epi32(zero, ones8, _mm256_set_m128i(yhi, ylo));
        ysum = _mm256_hadd_epi32(ysum, ysum);
        ysum = _mm256_hadd_epi32(ysum, ysum);
        ysum = _mm256_add_epi32(ysum, _mm256_permute2x128_si256(ysum, ysum, 0x01));
        __m256i a[4];
        uint16_t dh[8];
        for (int p = 0; p < 4; p++) {
            const blk_q4_0 *ra = r[2 * p] + b, *rb = r[2 * p + 1] + b;
            const __m256i q = _mm256_set_m128i(_mm_loadu_si128((const __m128i *)rb->qs), _mm_loadu_si128((const __m128i *)ra->qs));
            const __m256i lo = _mm256_and_si256(q, m4), hi = _mm256_and_si256(_mm256_srli_epi16(q, 4), m4);
            a[p] = _mm256_dpbusd_epi32(_mm256_dpbusd_epi32(zero, lo, ylo2), hi, yhi2);
            dh[2 * p] = ra->d;
            dh[2 * p + 1] = rb->d;
        }
        const __m256i h = _mm256_hadd_epi32(_mm256_hadd_epi32(a[0], a[1]), _mm256_hadd_epi32(a[2], a[3]));
        const __m256i tot = _mm256_permutevar8x32_epi32(h, order);   /* [r0 r2 r4 r6 | r1 r3 r5 r7] -> r0..r7 */
        const __m256 isum = _mm256_cvtepi32_ps(_mm256_sub_epi32(tot, _mm256_slli_epi32(ysum, 3)));
        accumulate8(isum, dh, x[b].d, &acc_lo, &acc_hi);
    }
    _mm_storeu_ps(s, _mm256_cvtpd_ps(acc_lo));
    _mm_storeu_ps(s + 4, _mm256_cvtpd_ps(acc_hi));
}

#ifdef __clang__
#define CPU_F16C 1      /* clang's __builtin_cpu_supports does not know "f16c"; every AVX2 CPU has it */
#else
#define CPU_F16C __builtin_cpu_supports("f16c")
#endif

pi2_go_rows8_fn pi2_go_q4_0_rows8(void) {
    if (__builtin_cpu_supports("avx512vnni") && __builtin_cpu_supports("avx512vl") && CPU_F16C &&
        pi2_kernels_variant()->allow_ext)   /* PI2_CPU_VARIANT=avx2: not (pack.h) */
        return q4_0_rows8_vnni;
    return __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") && CPU_F16C ? q4_0_rows8_avx2 : NULL;
}
#else
pi2_go_rows8_fn pi2_go_q4_0_rows8(void) { return NULL; }
#endif
