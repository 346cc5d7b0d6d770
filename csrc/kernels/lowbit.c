/* lowbit.c — dot products of pi2-made low-bit gate rows (lowbit.h) with Q8_0 activations: the scalar reference
 * and an AVX2 kernel, chosen by pi2_lowbit_dot. Both sum exact integers per block and then do the same float
 * operations in the same order, so they agree bit for bit (tests/c/kernel_selftest.c checks it). */
#include "lowbit.h"

#include "traits.h"

#define LB 32   /* values per block */

int32_t pi2_lowbit_bits(int32_t type) { return type == 1001 ? 1 : type == 1002 ? 2 : 0; }

size_t pi2_lowbit_row_bytes(int32_t bits, int64_t n) { return (size_t)(n / LB) * (size_t)(2 + 4 * bits); }

/* the reference: code j of a block at bit j·bits of its code bytes */
static void dot_ref(int32_t bits, int64_t n, float *out, const uint8_t *w, const blk_q8_0 *x) {
    const int32_t per = 2 + 4 * bits, L = (1 << bits) - 1, mask = L, per_byte = 8 / bits;
    float acc = 0.0f;
    for (int64_t b = 0; b < n / LB; b++, w += per) {
        pi2_fp16 d;
        memcpy(&d, w, 2);
        int32_t sumi = 0;
        for (int j = 0; j < LB; j++) {
            const int32_t c = (w[2 + j / per_byte] >> (j % per_byte * bits)) & mask;
            sumi += (2 * c - L) * x[b].qs[j];
        }
        const float s = pi2_fp16_to_f32(d) * pi2_fp16_to_f32(x[b].d);
        acc += (float)sumi * s;
    }
    *out = acc;
}

static void dot1_ref(int64_t n, float *out, const void *row, const void *x_q) { dot_ref(1, n, out, row, x_q); }
static void dot2_ref(int64_t n, float *out, const void *row, const void *x_q) { dot_ref(2, n, out, row, x_q); }

#if defined(__x86_64__)
#include <immintrin.h>

#define AVX2 __attribute__((target("avx2")))

/* the bytes s_j·q_j, s_j = +1 where bit j of `bits` is set, else −1: each mask byte broadcast to 8 lanes,
 * one bit tested per lane (q is never −128: Q8_0 quantizes to ±127) */
AVX2 static inline __m256i signed_q(uint32_t bits, __m256i q) {
    const __m256i spread = _mm256_setr_epi8(0, 0, 0, 0, 0, 0, 0, 0, 1, 1, 1, 1, 1, 1, 1, 1,
                                            2, 2, 2, 2, 2, 2, 2, 2, 3, 3, 3, 3, 3, 3, 3, 3);
    const __m256i bit = _mm256_set1_epi64x((long long)0x8040201008040201ull);
    const __m256i set = _mm256_cmpeq_epi8(_mm256_and_si256(_mm256_shuffle_epi8(_mm256_set1_epi32((int)bits), spread),
                                                           bit), bit);
    const __m256i s = _mm256_or_si256(_mm256_xor_si256(set, _mm256_set1_epi8(-1)), _mm256_set1_epi8(1));
    return _mm256_sign_epi8(q, s);   /* s: 0x01 where set, 0xFF where unset */
}

/* int32 lanes of Σ pairs of signed bytes */
AVX2 static inline __m256i sum_bytes(__m256i v) {
    const __m256i lo = _mm256_srai_epi16(_mm256_slli_epi16(v, 8), 8), hi = _mm256_srai_epi16(v, 8);
    return _mm256_madd_epi16(_mm256_add_epi16(lo, hi), _mm256_set1_epi16(1));
}

AVX2 static inline int32_t hsum(__m256i v) {
    __m128i s = _mm_add_epi32(_mm256_castsi256_si128(v), _mm256_extracti128_si256(v, 1));
    s = _mm_add_epi32(s, _mm_shuffle_epi32(s, 0x4E));
    s = _mm_add_epi32(s, _mm_shuffle_epi32(s, 0xB1));
    return _mm_cvtsi128_si32(s);
}

/* bit plane p (0 or 1) of 32 2-bit codes as a mask: bit j = bit p of code j (code j at bits 2j, 2j+1) */
static inline uint32_t plane2(const uint8_t *codes, int p) {
    uint64_t v;
    memcpy(&v, codes, 8);
    v = (v >> p) & 0x5555555555555555ull;          /* keep the even bits, then pack them */
    v = (v | (v >> 1)) & 0x3333333333333333ull;
    v = (v | (v >> 2)) & 0x0F0F0F0F0F0F0F0Full;
    v = (v | (v >> 4)) & 0x00FF00FF00FF00FFull;
    v = (v | (v >> 8)) & 0x0000FFFF0000FFFFull;
    return (uint32_t)(v | (v >> 16));
}

/* 1 bit: weight = ±d (set bit: +). 2 bits: 2c − 3 = (2b0 − 1) + 2·(2b1 − 1) for c = b0 + 2·b1. */
AVX2 static void dot_avx2(int32_t bits, int64_t n, float *out, const uint8_t *w, const blk_q8_0 *x) {
    const int32_t per = 2 + 4 * bits;
    float acc = 0.0f;
    for (int64_t b = 0; b < n / LB; b++, w += per) {
        pi2_fp16 d;
        memcpy(&d, w, 2);
        const __m256i q = _mm256_loadu_si256((const __m256i *)x[b].qs);
        int32_t sumi;
        if (bits == 1) {
            uint32_t m;
            memcpy(&m, w + 2, 4);
            sumi = hsum(sum_bytes(signed_q(m, q)));
        } else {
            const __m256i s0 = sum_bytes(signed_q(plane2(w + 2, 0), q));
            const __m256i s1 = sum_bytes(signed_q(plane2(w + 2, 1), q));
            sumi = hsum(_mm256_add_epi32(s0, _mm256_slli_epi32(s1, 1)));
        }
        const float s = pi2_fp16_to_f32(d) * pi2_fp16_to_f32(x[b].d);
        acc += (float)sumi * s;
    }
    *out = acc;
}

AVX2 static void dot1_avx2(int64_t n, float *out, const void *row, const void *x_q) { dot_avx2(1, n, out, row, x_q); }
AVX2 static void dot2_avx2(int64_t n, float *out, const void *row, const void *x_q) { dot_avx2(2, n, out, row, x_q); }
#endif

pi2_lowbit_dot_fn pi2_lowbit_dot(int32_t bits, int32_t impl) {
    if (bits != 1 && bits != 2) return NULL;
#if defined(__x86_64__)
    if (impl != PI2_K_IMPL_REF && (pi2_kernels_isa() & PI2_K_AVX2)) return bits == 1 ? dot1_avx2 : dot2_avx2;
#endif
    (void)impl;
    return bits == 1 ? dot1_ref : dot2_ref;
}
