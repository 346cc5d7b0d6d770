/* axpy_i8.c — ggml type I8 (plain int8 rows, 24): to_float, and the grouped row sum of int8 down rows
 * (traits field axpy_group) as an integer scheme, not the float term-by-term sum of axpy.c:
 *   m = max_i |p_i|; nothing changes if k = 0 or m is not in [1e-30, FLT_MAX] (a zero, denormal-tiny or
 *   non-finite group, whose 127/m would overflow); iS = 127/m, S = m/127 (float divisions);
 *   z_i = (int32) nearbyint(p_i·iS)   (float product, half to even; |z_i| ≤ 127)
 *   y[j] = y[j] + S·(float) Σ_i z_i·q_i[j]   (an exact int32 sum; one float product, one float sum)
 * for j < n (any n ≥ 1), q_i the int8 row at rows + idx[i]·row_bytes (values in [-127, 127], never -128),
 * p_i = h_i·scale_i with the row's scale already applied by the caller, k ≤ 64 (PI2_FFN_GROUP).
 * Does: the I8 row of the reference table (to_float, the scalar kernel) and the same sum with AVX2,
 *       AVX-512 VNNI (vpdpbusd), NEON and NEON SDOT; pi2_kernels_install_axpy_i8 puts those a table's
 *       ISA allows in it. Every kernel takes z and S from i8_prepare and sums exact integers, so all give
 *       the scalar kernel's bits.
 * Does not: multiply rows with activations (I8 has no vec_dot nor activation format) or keep scales. */
#include "traits.h"

#include <float.h>
#include <math.h>

#define I8_MAX_K 64

/* One call's rows and weights. Integer sums are exact in any order, so the rows are regrouped: those with
 * z < 0 first, then those with z > 0 (z = 0 dropped), each run padded to a multiple of 4 with z = 0 on a
 * real row; the x86 kernels then multiply by |z| and subtract the first run, with no sign fix per byte. */
typedef struct {
    const int8_t *r[I8_MAX_K + 6];
    int8_t z[I8_MAX_K + 6];
    int32_t za[(I8_MAX_K + 6) / 4];   /* |z| of rows 4t .. 4t+3, one byte each */
    int32_t zq[(I8_MAX_K + 6) / 4];   /* z of rows 4t .. 4t+3, one byte each */
    int32_t n_neg, kp;                /* rows of the z < 0 run, of both (multiples of 4) */
    float S;
} i8_group;

/* z, S and the regrouped rows; 0 when y stays as it is. */
static int i8_prepare(i8_group *g, const void *rows, size_t rb, const int32_t *idx, const float *p, int32_t k) {
    float m = 0.0f;
    for (int32_t i = 0; i < k; i++) {
        const float a = fabsf(p[i]);
        if (a > m) m = a;
    }
    if (k <= 0 || !(m >= 1e-30f && m <= FLT_MAX)) return 0;
    const float iS = 127.0f / m;
    g->S = m / 127.0f;
    int32_t z[I8_MAX_K], n = 0;
    for (int32_t i = 0; i < k; i++) z[i] = (int32_t)nearbyintf(p[i] * iS);
    for (int neg = 1; neg >= 0; neg--) {
        for (int32_t i = 0; i < k; i++)
            if (neg ? z[i] < 0 : z[i] > 0) g->r[n] = (const int8_t *)rows + (size_t)idx[i] * rb, g->z[n++] = (int8_t)z[i];
        for (; n % 4; n++) g->r[n] = (const int8_t *)rows + (size_t)idx[0] * rb, g->z[n] = 0;
        if (neg) g->n_neg = n;
    }
    g->kp = n;
    for (int32_t t = 0; t < n / 4; t++) {
        uint8_t a[4];
        for (int u = 0; u < 4; u++) a[u] = (uint8_t)(g->z[4 * t + u] < 0 ? -g->z[4 * t + u] : g->z[4 * t + u]);
        memcpy(&g->za[t], a, 4);
        memcpy(&g->zq[t], g->z + 4 * t, 4);
    }
    return 1;
}

/* Columns [j0, n) one at a time: the reference's sum, and every fast kernel's tail. */
static void i8_cols(const i8_group *g, int64_t j0, int64_t n, float *y) {
    for (int64_t j = j0; j < n; j++) {
        int32_t acc = 0;
        for (int32_t i = 0; i < g->kp; i++) acc += (int32_t)g->z[i] * g->r[i][j];
        y[j] = y[j] + g->S * (float)acc;
    }
}

static void i8_to_float(const void *src, float *y, int64_t n) {
    const int8_t *q = src;
    for (int64_t i = 0; i < n; i++) y[i] = (float)q[i];
}

static void axpy_i8_ref(int64_t n, float *y, const void *rows, size_t rb, const int32_t *idx, const float *p,
                        int32_t k) {
    i8_group g;
    if (i8_prepare(&g, rows, rb, idx, p, k)) i8_cols(&g, 0, n, y);
}

void pi2_kernels_fill_axpy_i8(pi2_type_traits *tab) {
    tab[PI2_T_I8] = (pi2_type_traits){.name = "I8", .block_size = 1, .type_size = 1, .vec_dot_type = PI2_T_I8,
                                      .to_float = i8_to_float, .axpy_group = axpy_i8_ref};
}

#if defined(__x86_64__)
#include <immintrin.h>

/* Both x86 kernels interleave four rows so that each dword holds (q0[j], q1[j], q2[j], q3[j]) (unpack bytes,
 * then words) and multiply it by the dword (|z0|, |z1|, |z2|, |z3|) as unsigned bytes: the z < 0 run
 * first, then the sums are negated, then the z > 0 run. acc[m] lane L then holds columns 16L + 4m + 0..3. */

/* ---- AVX2: 32 columns per step, sums in registers across the group; maddubs' pair sums are at most
 * 2·127·128, so they never saturate, and madd with ones adds the pairs into int32 ---- */
#define AVX2 __attribute__((target("avx2")))

AVX2 static inline __attribute__((always_inline)) void avx2_quads(const i8_group *g, int32_t i0, int32_t i1,
                                                                  int64_t j0, __m256i acc[4]) {
    const __m256i ones = _mm256_set1_epi16(1);
    for (int32_t i = i0; i < i1; i += 4) {
        const __m256i a = _mm256_loadu_si256((const __m256i *)(g->r[i] + j0));
        const __m256i b = _mm256_loadu_si256((const __m256i *)(g->r[i + 1] + j0));
        const __m256i c = _mm256_loadu_si256((const __m256i *)(g->r[i + 2] + j0));
        const __m256i d = _mm256_loadu_si256((const __m256i *)(g->r[i + 3] + j0));
        const __m256i ab0 = _mm256_unpacklo_epi8(a, b), ab1 = _mm256_unpackhi_epi8(a, b);
        const __m256i cd0 = _mm256_unpacklo_epi8(c, d), cd1 = _mm256_unpackhi_epi8(c, d);
        const __m256i v[4] = {_mm256_unpacklo_epi16(ab0, cd0), _mm256_unpackhi_epi16(ab0, cd0),
                              _mm256_unpacklo_epi16(ab1, cd1), _mm256_unpackhi_epi16(ab1, cd1)};
        const __m256i za = _mm256_set1_epi32(g->za[i / 4]);
        for (int m = 0; m < 4; m++) acc[m] = _mm256_add_epi32(acc[m], _mm256_madd_epi16(_mm256_maddubs_epi16(za, v[m]), ones));
    }
}

AVX2 static void axpy_i8_avx2(int64_t n, float *y, const void *rows, size_t rb, const int32_t *idx, const float *p,
                              int32_t k) {
    i8_group g;
    if (!i8_prepare(&g, rows, rb, idx, p, k)) return;
    const __m256 S = _mm256_set1_ps(g.S);
    int64_t j0 = 0;
    for (; j0 + 32 <= n; j0 += 32) {
        __m256i acc[4];
        for (int m = 0; m < 4; m++) acc[m] = _mm256_setzero_si256();
        avx2_quads(&g, 0, g.n_neg, j0, acc);
        for (int m = 0; m < 4; m++) acc[m] = _mm256_sub_epi32(_mm256_setzero_si256(), acc[m]);
        avx2_quads(&g, g.n_neg, g.kp, j0, acc);
        const __m256i o[4] = {_mm256_permute2x128_si256(acc[0], acc[1], 0x20), _mm256_permute2x128_si256(acc[2], acc[3], 0x20),
                              _mm256_permute2x128_si256(acc[0], acc[1], 0x31), _mm256_permute2x128_si256(acc[2], acc[3], 0x31)};
        for (int m = 0; m < 4; m++) {
            float *yp = y + j0 + 8 * m;
            _mm256_storeu_ps(yp, _mm256_add_ps(_mm256_loadu_ps(yp), _mm256_mul_ps(S, _mm256_cvtepi32_ps(o[m]))));
        }
    }
    i8_cols(&g, j0, n, y);
}

/* ---- AVX-512 VNNI: 64 columns per step (vpdpbusd: |z| unsigned, rows signed), the tail by masked loads;
 * a 4×4 transpose of 128-bit lanes puts the columns in order ---- */
#define VNNI __attribute__((target("avx2,avx512f,avx512bw,avx512vnni")))

VNNI static inline __attribute__((always_inline)) void vnni_quads(const i8_group *g, int32_t i0, int32_t i1, int64_t j0,
                                                                  __mmask64 mask, int full, __m512i acc[4]) {
    for (int32_t i = i0; i < i1; i += 4) {
        __m512i q[4];
        for (int t = 0; t < 4; t++)
            q[t] = full ? _mm512_loadu_si512((const void *)(g->r[i + t] + j0)) : _mm512_maskz_loadu_epi8(mask, g->r[i + t] + j0);
        const __m512i ab0 = _mm512_unpacklo_epi8(q[0], q[1]), ab1 = _mm512_unpackhi_epi8(q[0], q[1]);
        const __m512i cd0 = _mm512_unpacklo_epi8(q[2], q[3]), cd1 = _mm512_unpackhi_epi8(q[2], q[3]);
        const __m512i za = _mm512_set1_epi32(g->za[i / 4]);
        acc[0] = _mm512_dpbusd_epi32(acc[0], za, _mm512_unpacklo_epi16(ab0, cd0));
        acc[1] = _mm512_dpbusd_epi32(acc[1], za, _mm512_unpackhi_epi16(ab0, cd0));
        acc[2] = _mm512_dpbusd_epi32(acc[2], za, _mm512_unpacklo_epi16(ab1, cd1));
        acc[3] = _mm512_dpbusd_epi32(acc[3], za, _mm512_unpackhi_epi16(ab1, cd1));
    }
}

VNNI static inline __attribute__((always_inline)) void vnni_step(const i8_group *g, int64_t j0, int64_t w, float *y,
                                                                 int full) {
    const __mmask64 mask = full ? ~(__mmask64)0 : ((__mmask64)1 << w) - 1;
    __m512i acc[4];
    for (int m = 0; m < 4; m++) acc[m] = _mm512_setzero_si512();
    vnni_quads(g, 0, g->n_neg, j0, mask, full, acc);
    for (int m = 0; m < 4; m++) acc[m] = _mm512_sub_epi32(_mm512_setzero_si512(), acc[m]);
    vnni_quads(g, g->n_neg, g->kp, j0, mask, full, acc);
    const __m512i t0 = _mm512_shuffle_i32x4(acc[0], acc[1], 0x44), t1 = _mm512_shuffle_i32x4(acc[2], acc[3], 0x44);
    const __m512i t2 = _mm512_shuffle_i32x4(acc[0], acc[1], 0xEE), t3 = _mm512_shuffle_i32x4(acc[2], acc[3], 0xEE);
    const __m512i o[4] = {_mm512_shuffle_i32x4(t0, t1, 0x88), _mm512_shuffle_i32x4(t0, t1, 0xDD),
                          _mm512_shuffle_i32x4(t2, t3, 0x88), _mm512_shuffle_i32x4(t2, t3, 0xDD)};
    const __m512 S = _mm512_set1_ps(g->S);
    for (int m = 0; m < 4; m++) {
        const __m512 v = _mm512_mul_ps(S, _mm512_cvtepi32_ps(o[m]));
        float *yp = y + j0 + 16 * m;
        if (full) {
            _mm512_storeu_ps(yp, _mm512_add_ps(_mm512_loadu_ps(yp), v));
        } else if (w > 16 * m) {
            const __mmask16 mk = w >= 16 * m + 16 ? (__mmask16)0xFFFF : (__mmask16)((1u << (w - 16 * m)) - 1);
            _mm512_mask_storeu_ps(yp, mk, _mm512_add_ps(_mm512_maskz_loadu_ps(mk, yp), v));
        }
    }
}

VNNI static void axpy_i8_vnni(int64_t n, float *y, const void *rows, size_t rb, const int32_t *idx, const float *p,
                              int32_t k) {
    i8_group g;
    if (!i8_prepare(&g, rows, rb, idx, p, k)) return;
    int64_t j0 = 0;
    for (; j0 + 64 <= n; j0 += 64) vnni_step(&g, j0, 64, y, 1);
    if (j0 < n) vnni_step(&g, j0, n - j0, y, 0);
}

void pi2_kernels_install_axpy_i8(pi2_type_traits *tab, uint32_t isa) {
    if (isa & PI2_K_AVX2) tab[PI2_T_I8].axpy_group = axpy_i8_avx2;
    if (isa & PI2_K_AVX512VNNI) tab[PI2_T_I8].axpy_group = axpy_i8_vnni;
}

#elif defined(__aarch64__)
#include <arm_neon.h>

/* ---- NEON: 16 columns per step; two rows' products in int16 (≤ 2·127·127), widened into int32 ---- */
static void axpy_i8_neon(int64_t n, float *y, const void *rows, size_t rb, const int32_t *idx, const float *p,
                         int32_t k) {
    i8_group g;
    if (!i8_prepare(&g, rows, rb, idx, p, k)) return;
    const float32x4_t S = vdupq_n_f32(g.S);
    int64_t j0 = 0;
    for (; j0 + 16 <= n; j0 += 16) {
        int32x4_t acc[4] = {vdupq_n_s32(0), vdupq_n_s32(0), vdupq_n_s32(0), vdupq_n_s32(0)};
        for (int32_t i = 0; i < g.kp; i += 2) {
            const int8x16_t q0 = vld1q_s8(g.r[i] + j0), q1 = vld1q_s8(g.r[i + 1] + j0);
            const int8x16_t z0 = vdupq_n_s8(g.z[i]), z1 = vdupq_n_s8(g.z[i + 1]);
            const int16x8_t lo = vmlal_s8(vmull_s8(vget_low_s8(q0), vget_low_s8(z0)), vget_low_s8(q1), vget_low_s8(z1));
            const int16x8_t hi = vmlal_high_s8(vmull_high_s8(q0, z0), q1, z1);
            acc[0] = vaddw_s16(acc[0], vget_low_s16(lo));
            acc[1] = vaddw_high_s16(acc[1], lo);
            acc[2] = vaddw_s16(acc[2], vget_low_s16(hi));
            acc[3] = vaddw_high_s16(acc[3], hi);
        }
        for (int m = 0; m < 4; m++)
            vst1q_f32(y + j0 + 4 * m, vaddq_f32(vld1q_f32(y + j0 + 4 * m), vmulq_f32(S, vcvtq_f32_s32(acc[m]))));
    }
    i8_cols(&g, j0, n, y);
}

/* ---- NEON SDOT: 16 columns per step; zips put (q0[j], q1[j], q2[j], q3[j]) in each dword, in column
 * order, and vdotq_s32 multiplies them by the quad (z0, z1, z2, z3) ---- */
#if defined(__clang__)
#define DOTPROD __attribute__((target("dotprod")))
#else
#define DOTPROD __attribute__((target("arch=armv8.2-a+dotprod")))
#endif

/* acc + SDOT(a, b); older clang hides vdotq_s32 unless the whole file is built with +dotprod (as neon_body.h) */
DOTPROD static inline int32x4_t sdot(int32x4_t acc, int8x16_t a, int8x16_t b) {
#if defined(__clang__) && __clang_major__ < 18 && !defined(__ARM_FEATURE_DOTPROD)
    __asm__(".arch_extension dotprod\n\tsdot %0.4s, %1.16b, %2.16b" : "+w"(acc) : "w"(a), "w"(b));
    return acc;
#else
    return vdotq_s32(acc, a, b);
#endif
}

DOTPROD static void axpy_i8_dotprod(int64_t n, float *y, const void *rows, size_t rb, const int32_t *idx,
                                    const float *p, int32_t k) {
    i8_group g;
    if (!i8_prepare(&g, rows, rb, idx, p, k)) return;
    const float32x4_t S = vdupq_n_f32(g.S);
    int64_t j0 = 0;
    for (; j0 + 16 <= n; j0 += 16) {
        int32x4_t acc[4] = {vdupq_n_s32(0), vdupq_n_s32(0), vdupq_n_s32(0), vdupq_n_s32(0)};
        for (int32_t i = 0; i < g.kp; i += 4) {
            const int8x16_t a = vld1q_s8(g.r[i] + j0), b = vld1q_s8(g.r[i + 1] + j0);
            const int8x16_t c = vld1q_s8(g.r[i + 2] + j0), d = vld1q_s8(g.r[i + 3] + j0);
            const int16x8_t ab0 = vreinterpretq_s16_s8(vzip1q_s8(a, b)), ab1 = vreinterpretq_s16_s8(vzip2q_s8(a, b));
            const int16x8_t cd0 = vreinterpretq_s16_s8(vzip1q_s8(c, d)), cd1 = vreinterpretq_s16_s8(vzip2q_s8(c, d));
            const int8x16_t zv = vreinterpretq_s8_s32(vdupq_n_s32(g.zq[i / 4]));
            acc[0] = sdot(acc[0], vreinterpretq_s8_s16(vzip1q_s16(ab0, cd0)), zv);
            acc[1] = sdot(acc[1], vreinterpretq_s8_s16(vzip2q_s16(ab0, cd0)), zv);
            acc[2] = sdot(acc[2], vreinterpretq_s8_s16(vzip1q_s16(ab1, cd1)), zv);
            acc[3] = sdot(acc[3], vreinterpretq_s8_s16(vzip2q_s16(ab1, cd1)), zv);
        }
        for (int m = 0; m < 4; m++)
            vst1q_f32(y + j0 + 4 * m, vaddq_f32(vld1q_f32(y + j0 + 4 * m), vmulq_f32(S, vcvtq_f32_s32(acc[m]))));
    }
    i8_cols(&g, j0, n, y);
}

void pi2_kernels_install_axpy_i8(pi2_type_traits *tab, uint32_t isa) {
    if (isa & PI2_K_NEON) tab[PI2_T_I8].axpy_group = axpy_i8_neon;
    if (isa & PI2_K_DOTPROD) tab[PI2_T_I8].axpy_group = axpy_i8_dotprod;
}

#else

void pi2_kernels_install_axpy_i8(pi2_type_traits *tab, uint32_t isa) { (void)tab; (void)isa; }

#endif
