/* axpy_i8.c — ggml type I8 (plain int8 rows, 24): to_float, and the grouped row sum of int8 down rows
 * (traits field axpy_group) as an integer scheme, not the float term-by-term sum of axpy.c:
 *   m = max_i |p_i|; nothing changes if k = 0 or m is not in [1e-30, FLT_MAX] (a zero, denormal-tiny or
 *   non-finite group, whose 32767/m would overflow); iS = 32767/m, S = m/32767 (float divisions);
 *   z_i = (int32) nearbyint(p_i·iS)   (float product, half to even; |z_i| ≤ 32767)
 *   y[j] = y[j] + S·(float) Σ_i z_i·q_i[j]   (an exact int32 sum, |sum| ≤ 64·32767·127 < 2^31; the
 *                                             conversion rounds to nearest even; one float product, one sum)
 * for j < n (any n ≥ 1), q_i the int8 row at rows + idx[i]·row_bytes (values in [-127, 127], never -128),
 * p_i = h_i·scale_i with the row's scale already applied by the caller, k ≤ 64 (PI2_FFN_GROUP).
 * Does: the I8 row of the reference table (to_float, the scalar kernel) and the same sum with AVX2 (madd),
 *       AVX-512 VNNI (vpdpwssd) and NEON (smlal; the NEON SDOT table gets it too, SDOT has no int16 form);
 *       pi2_kernels_install_axpy_i8 puts those a table's ISA allows in it. Every kernel takes z and S from
 *       i8_prepare and sums exact integers, so all give the scalar kernel's bits.
 * Does not: multiply rows with activations (I8 has no vec_dot nor activation format) or keep scales. */
#include "traits.h"

#include <float.h>
#include <math.h>

#define I8_MAX_K 64

/* One call's rows and 16-bit weights. Integer sums are exact in any order, so rows with z = 0 are dropped
 * and the rest padded to an even count with z = 0 on a real row; the x86 kernels multiply rows 2t and 2t+1
 * together by the int16 pair zp[t]. */
typedef struct {
    const int8_t *r[I8_MAX_K + 1];
    int16_t z[I8_MAX_K + 1];
    int32_t zp[(I8_MAX_K + 2) / 2];   /* z of rows 2t (low half) and 2t+1 (high half) */
    int32_t kp;                       /* rows kept, a multiple of 2 */
    float S;
} i8_group;

/* z, S and the kept rows; 0 when y stays as it is. */
static int i8_prepare(i8_group *g, const void *rows, size_t rb, const int32_t *idx, const float *p, int32_t k) {
    float m = 0.0f;
    for (int32_t i = 0; i < k; i++) {
        const float a = fabsf(p[i]);
        if (a > m) m = a;
    }
    if (k <= 0 || !(m >= 1e-30f && m <= FLT_MAX)) return 0;
    const float iS = 32767.0f / m;
    g->S = m / 32767.0f;
    int32_t n = 0;
    for (int32_t i = 0; i < k; i++) {
        const int32_t z = (int32_t)nearbyintf(p[i] * iS);
        if (z != 0) g->r[n] = (const int8_t *)rows + (size_t)idx[i] * rb, g->z[n++] = (int16_t)z;
    }
    if (n % 2) g->r[n] = (const int8_t *)rows + (size_t)idx[0] * rb, g->z[n++] = 0;
    g->kp = n;
    for (int32_t t = 0; t < n / 2; t++) memcpy(&g->zp[t], g->z + 2 * t, 4);
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

/* Both x86 kernels sign-extend rows to int16 (cvtepi8_epi16: 8 columns per 128-bit lane), put
 * (q_2t[j], q_2t+1[j]) in each dword with unpacklo/hi_epi16 of rows 2t and 2t+1, and multiply that by the
 * pair zp[t], adding both products into int32 (madd / vpdpwssd; a product is at most 32767·127, so nothing
 * saturates). Lane L of the lo / hi sums holds columns 8L + 0..3 / 8L + 4..7 of the widened block; a
 * permutation of 128-bit lanes puts them in column order. */

/* ---- AVX2: 32 columns per step, sums in registers across the group ---- */
#define AVX2 __attribute__((target("avx2")))

AVX2 static void axpy_i8_avx2(int64_t n, float *y, const void *rows, size_t rb, const int32_t *idx, const float *p,
                              int32_t k) {
    i8_group g;
    if (!i8_prepare(&g, rows, rb, idx, p, k)) return;
    const __m256 S = _mm256_set1_ps(g.S);
    int64_t j0 = 0;
    for (; j0 + 32 <= n; j0 += 32) {
        __m256i acc[4];
        for (int m = 0; m < 4; m++) acc[m] = _mm256_setzero_si256();
        for (int32_t i = 0; i < g.kp; i += 2) {
            const __m256i zz = _mm256_set1_epi32(g.zp[i / 2]);
            for (int h = 0; h < 2; h++) {
                const __m256i a = _mm256_cvtepi8_epi16(_mm_loadu_si128((const __m128i *)(g.r[i] + j0 + 16 * h)));
                const __m256i b = _mm256_cvtepi8_epi16(_mm_loadu_si128((const __m128i *)(g.r[i + 1] + j0 + 16 * h)));
                acc[2 * h] = _mm256_add_epi32(acc[2 * h], _mm256_madd_epi16(_mm256_unpacklo_epi16(a, b), zz));
                acc[2 * h + 1] = _mm256_add_epi32(acc[2 * h + 1], _mm256_madd_epi16(_mm256_unpackhi_epi16(a, b), zz));
            }
        }
        const __m256i o[4] = {_mm256_permute2x128_si256(acc[0], acc[1], 0x20), _mm256_permute2x128_si256(acc[0], acc[1], 0x31),
                              _mm256_permute2x128_si256(acc[2], acc[3], 0x20), _mm256_permute2x128_si256(acc[2], acc[3], 0x31)};
        for (int m = 0; m < 4; m++) {
            float *yp = y + j0 + 8 * m;
            _mm256_storeu_ps(yp, _mm256_add_ps(_mm256_loadu_ps(yp), _mm256_mul_ps(S, _mm256_cvtepi32_ps(o[m]))));
        }
    }
    i8_cols(&g, j0, n, y);
}

/* ---- AVX-512 VNNI: 64 columns per step (vpdpwssd), the tail by masked loads and stores; a permutation
 * of 128-bit lanes (vpermt2q) interleaves the lo and hi sums into column order ---- */
#define VNNI __attribute__((target("avx2,avx512f,avx512bw,avx512vl,avx512vnni")))
#define PREFETCH_AHEAD 256   /* bytes: four steps */

VNNI static inline __attribute__((always_inline)) void vnni_step(const i8_group *g, int64_t j0, int64_t w, float *y,
                                                                 int full) {
    const __mmask64 mask = full ? ~(__mmask64)0 : ((__mmask64)1 << w) - 1;
    __m512i acc[4];
    for (int m = 0; m < 4; m++) acc[m] = _mm512_setzero_si512();
    for (int32_t i = 0; i < g->kp; i += 2) {
        const __m512i zz = _mm512_set1_epi32(g->zp[i / 2]);
        if (full) {   /* the rows are read 64 bytes a step: ask for them a few steps ahead */
            _mm_prefetch((const char *)(g->r[i] + j0 + PREFETCH_AHEAD), _MM_HINT_T0);
            _mm_prefetch((const char *)(g->r[i + 1] + j0 + PREFETCH_AHEAD), _MM_HINT_T0);
        }
        for (int h = 0; h < 2; h++) {
            const int8_t *ra = g->r[i] + j0 + 32 * h, *rb = g->r[i + 1] + j0 + 32 * h;
            const __mmask32 mk = (__mmask32)(mask >> (32 * h));
            const __m512i a = _mm512_cvtepi8_epi16(full ? _mm256_loadu_si256((const __m256i *)ra) : _mm256_maskz_loadu_epi8(mk, ra));
            const __m512i b = _mm512_cvtepi8_epi16(full ? _mm256_loadu_si256((const __m256i *)rb) : _mm256_maskz_loadu_epi8(mk, rb));
            acc[2 * h] = _mm512_dpwssd_epi32(acc[2 * h], _mm512_unpacklo_epi16(a, b), zz);
            acc[2 * h + 1] = _mm512_dpwssd_epi32(acc[2 * h + 1], _mm512_unpackhi_epi16(a, b), zz);
        }
    }
    const __m512i lo = _mm512_set_epi64(11, 10, 3, 2, 9, 8, 1, 0), hi = _mm512_set_epi64(15, 14, 7, 6, 13, 12, 5, 4);
    const __m512i o[4] = {_mm512_permutex2var_epi64(acc[0], lo, acc[1]), _mm512_permutex2var_epi64(acc[0], hi, acc[1]),
                          _mm512_permutex2var_epi64(acc[2], lo, acc[3]), _mm512_permutex2var_epi64(acc[2], hi, acc[3])};
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

/* ---- NEON: 16 columns per step; each row sign-extended to int16 (sxtl) and multiplied by its z into
 * four int32 sums (smlal / smlal2 by element) ---- */
static void axpy_i8_neon(int64_t n, float *y, const void *rows, size_t rb, const int32_t *idx, const float *p,
                         int32_t k) {
    i8_group g;
    if (!i8_prepare(&g, rows, rb, idx, p, k)) return;
    const float32x4_t S = vdupq_n_f32(g.S);
    int64_t j0 = 0;
    for (; j0 + 16 <= n; j0 += 16) {
        int32x4_t acc[4] = {vdupq_n_s32(0), vdupq_n_s32(0), vdupq_n_s32(0), vdupq_n_s32(0)};
        for (int32_t i = 0; i < g.kp; i++) {
            const int8x16_t q = vld1q_s8(g.r[i] + j0);
            const int16x8_t lo = vmovl_s8(vget_low_s8(q)), hi = vmovl_high_s8(q);
            const int16_t z = g.z[i];
            acc[0] = vmlal_n_s16(acc[0], vget_low_s16(lo), z);
            acc[1] = vmlal_high_n_s16(acc[1], lo, z);
            acc[2] = vmlal_n_s16(acc[2], vget_low_s16(hi), z);
            acc[3] = vmlal_high_n_s16(acc[3], hi, z);
        }
        for (int m = 0; m < 4; m++)
            vst1q_f32(y + j0 + 4 * m, vaddq_f32(vld1q_f32(y + j0 + 4 * m), vmulq_f32(S, vcvtq_f32_s32(acc[m]))));
    }
    i8_cols(&g, j0, n, y);
}

void pi2_kernels_install_axpy_i8(pi2_type_traits *tab, uint32_t isa) {
    if (isa & (PI2_K_NEON | PI2_K_DOTPROD)) tab[PI2_T_I8].axpy_group = axpy_i8_neon;
}

#else

void pi2_kernels_install_axpy_i8(pi2_type_traits *tab, uint32_t isa) { (void)tab; (void)isa; }

#endif
