/* attn_decode.c — a single token's attention loops over the F16 cache (2-byte halves) with the CPU's half
 * conversion: q.k over the transposed keys and p.V over the value rows, for attn.c's one-token path (and flash
 * attention's one-row scores).
 * Numbers: those of attn.c's score_keys / weigh_values with vec (ggml_vec_dot_f16, pi2/reference/forward.py): term i
 * of a dot product goes to lane i % 16 of accumulator (i % 64) / 16, each summed in term order from +0, then
 * (acc0 + acc2) + (acc1 + acc3) per lane and the 16 lanes reduced as _mm512_reduce_add_ps (halves, halves,
 * (0+2) + (1+3)). The terms are products of F16 values, exact in float, so an FMA rounds as the product then the sum.
 * - q.k: 64 keys at a time; for each lane l the four accumulators of every key stay in registers, the lane's
 *   combined sum goes to scratch, then the 16 lanes are reduced; the next 64 keys' rows are prefetched.
 * - p.V: position j adds into scratch row j % 64 (that lane and accumulator) over the head's values, in order; the
 *   first 64 positions start their rows from +0, then the rows are combined and reduced as above.
 * AVX-512 (F, BW, VL: 16-bit masked loads) and AVX2 with F16C; other CPUs: 0, attn.c's portable loops.
 * Does not: the softmax, batches of tokens (attn_batch.c), quantized keys (kv_quant.c). */
#include "ops.h"
#include "kernels/pack.h"

#include <string.h>

static int isa_cap;   /* pi2_test_attention_isa: 0 every loop this CPU has, 1 none of AVX-512, 2 the portable ones */

void pi2_test_attention_isa(int32_t level) { isa_cap = level; }

#if defined(__x86_64__) && defined(__GNUC__)
#include <cpuid.h>
#include <immintrin.h>

#define T512 __attribute__((target("avx512f,avx512bw,avx512vl")))
#define T256 __attribute__((target("avx2,fma,f16c")))

int pi2_cpu_avx512_half(void) {   /* not when PI2_CPU_VARIANT forces the baseline (kernels/pack.h) */
    return isa_cap < 1 && __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
           __builtin_cpu_supports("avx512vl") && pi2_kernels_variant()->allow_ext;
}

/* s[jb..jb+64) (masked by nb) from the lane sums tl [16][64]: (the halves, halves, (0+2) + (1+3) tree) · scale. */
static T512 void scores_reduce_512(const float *tl, int32_t nb, float scale, float *s) {
    for (int q = 0; q < 4 && 16 * q < nb; q++) {
        const __mmask16 m = (__mmask16)(nb - 16 * q >= 16 ? 0xFFFF : (1u << (nb - 16 * q)) - 1);
        __m512 v[16];
        for (int l = 0; l < 16; l++) v[l] = _mm512_loadu_ps(tl + l * 64 + 16 * q);
        for (int i = 0; i < 8; i++) v[i] = _mm512_add_ps(v[8 + i], v[i]);
        for (int i = 0; i < 4; i++) v[i] = _mm512_add_ps(v[4 + i], v[i]);
        const __m512 r = _mm512_add_ps(_mm512_add_ps(v[0], v[2]), _mm512_add_ps(v[1], v[3]));
        _mm512_mask_storeu_ps(s + 16 * q, m, _mm512_mul_ps(r, _mm512_set1_ps(scale)));
    }
}

static T512 void scores_512(const float *qf, const pi2_fp16 *kT, size_t ld, int32_t hd, float scale, float *s,
                            int32_t j0, int32_t j1, float *tl) {
    for (int32_t jb = j0; jb < j1; jb += 64) {
        const int32_t nb = j1 - jb < 64 ? j1 - jb : 64;
        __mmask16 mk[4];
        for (int q = 0; q < 4; q++) {
            const int32_t r = nb - 16 * q;
            mk[q] = (__mmask16)(r >= 16 ? 0xFFFF : r <= 0 ? 0 : (1u << r) - 1);
        }
        if (jb + 64 < j1)
            for (int32_t i = 0; i < hd; i++) {
                _mm_prefetch((const char *)(kT + (size_t)i * ld + jb + 64), _MM_HINT_T0);
                _mm_prefetch((const char *)(kT + (size_t)i * ld + jb + 96), _MM_HINT_T0);
            }
        for (int l = 0; l < 16; l++) {
            __m512 c[4][4];
#pragma GCC unroll 4
            for (int a = 0; a < 4; a++)
#pragma GCC unroll 4
                for (int q = 0; q < 4; q++) c[a][q] = _mm512_setzero_ps();
            for (int32_t i0 = 0; i0 < hd; i0 += 64) {
#pragma GCC unroll 4
                for (int a = 0; a < 4; a++) {
                    const int32_t i = i0 + 16 * a + l;
                    if (i < hd) {
                        const __m512 qi = _mm512_set1_ps(qf[i]);
                        const pi2_fp16 *row = kT + (size_t)i * ld + jb;
#pragma GCC unroll 4
                        for (int q = 0; q < 4; q++)
                            c[a][q] = _mm512_fmadd_ps(qi, _mm512_cvtph_ps(_mm256_maskz_loadu_epi16(mk[q], row + 16 * q)),
                                                      c[a][q]);
                    }
                }
            }
#pragma GCC unroll 4
            for (int q = 0; q < 4; q++)
                _mm512_storeu_ps(tl + l * 64 + 16 * q,
                                 _mm512_add_ps(_mm512_add_ps(c[0][q], c[2][q]), _mm512_add_ps(c[1][q], c[3][q])));
        }
        scores_reduce_512(tl, nb, scale, s + jb);
    }
}

static T512 void values_512(const float *p, const pi2_fp16 *v, size_t vd, int32_t hdv, float *out, int32_t j0,
                            int32_t j1, float *acc) {
    const __mmask16 tail = (__mmask16)(hdv % 16 ? (1u << (hdv % 16)) - 1 : 0xFFFF);
    const int32_t first = j1 - j0 >= 64 ? j0 + 64 : j0;   /* positions before it start their rows from +0 */
    if (first == j0) memset(acc, 0, (size_t)64 * hdv * sizeof *acc);
    for (int32_t j = j0; j < j1; j++) {
        float *row = acc + (size_t)(j & 63) * hdv;
        const pi2_fp16 *vr = v + (size_t)j * vd;
        const __m512 pj = _mm512_set1_ps(p[j]);
        const int fresh = j < first;
        for (int32_t d = 0; d < hdv; d += 16) {
            const __mmask16 m = d + 16 <= hdv ? (__mmask16)0xFFFF : tail;
            const __m512 x = _mm512_cvtph_ps(_mm256_maskz_loadu_epi16(m, vr + d));
            const __m512 a = fresh ? _mm512_setzero_ps() : _mm512_maskz_loadu_ps(m, row + d);
            _mm512_mask_storeu_ps(row + d, m, _mm512_fmadd_ps(pj, x, a));
        }
    }
    for (int32_t d = 0; d < hdv; d += 16) {
        const __mmask16 m = d + 16 <= hdv ? (__mmask16)0xFFFF : tail;
        __m512 t[16];
        for (int l = 0; l < 16; l++) {
            const float *r = acc + (size_t)l * hdv + d;
            const size_t A = (size_t)16 * hdv;
            t[l] = _mm512_add_ps(_mm512_add_ps(_mm512_maskz_loadu_ps(m, r), _mm512_maskz_loadu_ps(m, r + 2 * A)),
                                 _mm512_add_ps(_mm512_maskz_loadu_ps(m, r + A), _mm512_maskz_loadu_ps(m, r + 3 * A)));
        }
        for (int i = 0; i < 8; i++) t[i] = _mm512_add_ps(t[8 + i], t[i]);
        for (int i = 0; i < 4; i++) t[i] = _mm512_add_ps(t[4 + i], t[i]);
        _mm512_mask_storeu_ps(out + d, m, _mm512_add_ps(_mm512_add_ps(t[0], t[2]), _mm512_add_ps(t[1], t[3])));
    }
}

int pi2_cpu_avx2_half(void) {   /* F16C: CPUID leaf 1, ECX bit 29 (not every compiler's cpu_supports knows it) */
    static int known = -1;
    if (known < 0) {
        unsigned a, b, c = 0, d;
        const int f16c = __get_cpuid(1, &a, &b, &c, &d) && (c >> 29 & 1);
        known = f16c && __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
    }
    return known && isa_cap < 2;
}

/* One key at a time in the same order: the keys after the AVX2 loop's last whole block of 16. */
static void scores_1(const float *qf, const pi2_fp16 *kT, size_t ld, int32_t hd, float scale, float *s, int32_t j0,
                     int32_t j1) {
    for (int32_t j = j0; j < j1; j++) {
        float v[16];
        for (int l = 0; l < 16; l++) {
            float c[4] = {0.0f, 0.0f, 0.0f, 0.0f};
            for (int32_t i0 = 0; i0 < hd; i0 += 64)
                for (int a = 0; a < 4 && i0 + 16 * a + l < hd; a++) {
                    const int32_t i = i0 + 16 * a + l;
                    c[a] += qf[i] * pi2_kv_h2f(kT[(size_t)i * ld + j]);
                }
            v[l] = (c[0] + c[2]) + (c[1] + c[3]);
        }
        for (int i = 0; i < 8; i++) v[i] = v[8 + i] + v[i];
        for (int i = 0; i < 4; i++) v[i] = v[4 + i] + v[i];
        s[j] = ((v[0] + v[2]) + (v[1] + v[3])) * scale;
    }
}

/* The AVX2 twins: 16 keys (two registers) at a time, the last incomplete block by scores_1; values in whole
 * registers of 8 (callers check head_dim_v), so every load is whole. */
static T256 void scores_256(const float *qf, const pi2_fp16 *kT, size_t ld, int32_t hd, float scale, float *s,
                            int32_t j0, int32_t j1, float *tl) {
    for (int32_t jb = j0; jb + 16 <= j1; jb += 16) {
        for (int l = 0; l < 16; l++) {
            __m256 c[4][2];
#pragma GCC unroll 4
            for (int a = 0; a < 4; a++) c[a][0] = c[a][1] = _mm256_setzero_ps();
            for (int32_t i0 = 0; i0 < hd; i0 += 64) {
#pragma GCC unroll 4
                for (int a = 0; a < 4; a++) {
                    const int32_t i = i0 + 16 * a + l;
                    if (i < hd) {
                        const __m256 qi = _mm256_set1_ps(qf[i]);
                        const pi2_fp16 *row = kT + (size_t)i * ld + jb;
                        c[a][0] = _mm256_fmadd_ps(qi, _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)row)), c[a][0]);
                        c[a][1] = _mm256_fmadd_ps(qi, _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(row + 8))),
                                                  c[a][1]);
                    }
                }
            }
            for (int q = 0; q < 2; q++)
                _mm256_storeu_ps(tl + l * 16 + 8 * q,
                                 _mm256_add_ps(_mm256_add_ps(c[0][q], c[2][q]), _mm256_add_ps(c[1][q], c[3][q])));
        }
        for (int q = 0; q < 2; q++) {
            __m256 v[16];
            for (int l = 0; l < 16; l++) v[l] = _mm256_loadu_ps(tl + l * 16 + 8 * q);
            for (int i = 0; i < 8; i++) v[i] = _mm256_add_ps(v[8 + i], v[i]);
            for (int i = 0; i < 4; i++) v[i] = _mm256_add_ps(v[4 + i], v[i]);
            const __m256 r = _mm256_add_ps(_mm256_add_ps(v[0], v[2]), _mm256_add_ps(v[1], v[3]));
            _mm256_storeu_ps(s + jb + 8 * q, _mm256_mul_ps(r, _mm256_set1_ps(scale)));
        }
    }
}

static T256 void values_256(const float *p, const pi2_fp16 *v, size_t vd, int32_t hdv, float *out, int32_t j0,
                            int32_t j1, float *acc) {
    const int32_t first = j1 - j0 >= 64 ? j0 + 64 : j0;
    if (first == j0) memset(acc, 0, (size_t)64 * hdv * sizeof *acc);
    for (int32_t j = j0; j < j1; j++) {
        float *row = acc + (size_t)(j & 63) * hdv;
        const pi2_fp16 *vr = v + (size_t)j * vd;
        const __m256 pj = _mm256_set1_ps(p[j]);
        const int fresh = j < first;
        for (int32_t d = 0; d < hdv; d += 8) {
            const __m256 x = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(vr + d)));
            _mm256_storeu_ps(row + d, _mm256_fmadd_ps(pj, x, fresh ? _mm256_setzero_ps() : _mm256_loadu_ps(row + d)));
        }
    }
    for (int32_t d = 0; d < hdv; d += 8) {
        __m256 t[16];
        const size_t A = (size_t)16 * hdv;
        for (int l = 0; l < 16; l++) {
            const float *r = acc + (size_t)l * hdv + d;
            t[l] = _mm256_add_ps(_mm256_add_ps(_mm256_loadu_ps(r), _mm256_loadu_ps(r + 2 * A)),
                                 _mm256_add_ps(_mm256_loadu_ps(r + A), _mm256_loadu_ps(r + 3 * A)));
        }
        for (int i = 0; i < 8; i++) t[i] = _mm256_add_ps(t[8 + i], t[i]);
        for (int i = 0; i < 4; i++) t[i] = _mm256_add_ps(t[4 + i], t[i]);
        _mm256_storeu_ps(out + d, _mm256_add_ps(_mm256_add_ps(t[0], t[2]), _mm256_add_ps(t[1], t[3])));
    }
}

int pi2_attn_dec_scores(const float *qf, const pi2_fp16 *kT, size_t ld, int32_t hd, float scale, float *s, int32_t j0,
                        int32_t j1, float *acc) {
    if (pi2_cpu_avx512_half()) {
        scores_512(qf, kT, ld, hd, scale, s, j0, j1, acc);
        return 1;
    }
    if (!pi2_cpu_avx2_half()) return 0;
    scores_256(qf, kT, ld, hd, scale, s, j0, j1, acc);
    scores_1(qf, kT, ld, hd, scale, s, j1 - (j1 - j0) % 16, j1);
    return 1;
}

int pi2_attn_dec_values(const float *p, const pi2_fp16 *v, size_t vd, int32_t hdv, float *out, int32_t j0, int32_t j1,
                        float *acc) {
    if (pi2_cpu_avx512_half()) {
        values_512(p, v, vd, hdv, out, j0, j1, acc);
        return 1;
    }
    if (hdv % 8 || !pi2_cpu_avx2_half()) return 0;
    values_256(p, v, vd, hdv, out, j0, j1, acc);
    return 1;
}

#else
int pi2_cpu_avx512_half(void) { return 0; }
int pi2_cpu_avx2_half(void) { return 0; }

int pi2_attn_dec_scores(const float *qf, const pi2_fp16 *kT, size_t ld, int32_t hd, float scale, float *s, int32_t j0,
                        int32_t j1, float *acc) {
    (void)qf, (void)kT, (void)ld, (void)hd, (void)scale, (void)s, (void)j0, (void)j1, (void)acc;
    return 0;
}

int pi2_attn_dec_values(const float *p, const pi2_fp16 *v, size_t vd, int32_t hdv, float *out, int32_t j0, int32_t j1,
                        float *acc) {
    (void)p, (void)v, (void)vd, (void)hdv, (void)out, (void)j0, (void)j1, (void)acc;
    return 0;
}
#endif
