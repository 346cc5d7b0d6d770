/* axpy_qx1.c — the grouped row sum (traits field axpy_group) of Q4_1 and Q5_1 down rows in integers, with
 * 8-bit activations, as pi2/reference/down_qx1.py specifies. For each 32-column block b:
 *   a_i = p_i·d_ib;  M_b = ((+0 + p_0·m_0b) + p_1·m_1b) + …   (float, ascending i)
 *   mx = max_i |a_i|; if mx is in [1e-30, FLT_MAX]: iS = 127/mx, S = mx/127, z_i = nearbyint(a_i·iS)
 *   (|z_i| ≤ 127), else S = 0 and every z_i = 0;
 *   y[j] = y[j] + (S·(float) Σ_i z_i·q_ij + M_b)   (an exact int32 sum; then two float operations)
 * for the row values q (0..15 or 0..31), p_i = h_i, k ≤ 64 (PI2_FFN_GROUP), n a multiple of 32.
 * Does: the scalar kernel (every table; aarch64 runs it) and AVX2 (maddubs on two rows' interleaved bytes,
 *       int16 sums widened to int32 before they can wrap) and AVX-512BW (the same on two blocks per register)
 *       kernels; all take z, S and M from qx1_prepare and sum exact integers, so all give the scalar bits.
 * Does not: the float row sums of the other types (axpy.c) or int8 rows (axpy_i8.c). */
#include "traits.h"

#include <float.h>
#include <math.h>

#define QX_MAX_K 64
#define QX_CHUNK 64   /* blocks prepared at a time (2048 columns) */

/* One call's rows and, for one chunk of blocks, their 8-bit weights: zp[b][t] = z of rows 2t (low byte) and
 * 2t+1 (high byte) in block b; odd k is padded with a zero weight on a real row. */
typedef struct {
    const uint8_t *r[QX_MAX_K + 1];
    int32_t kp;                               /* rows, a multiple of 2 */
    int16_t zp[(QX_MAX_K + 2) / 2][QX_CHUNK]; /* z_2t + 256·z_2t+1: low byte z_2t, high byte z_2t+1 */
    float S[QX_CHUNK], M[QX_CHUNK];
    float a[QX_MAX_K][QX_CHUNK], mx[QX_CHUNK];
    uint8_t bad[QX_CHUNK];                    /* some a_i of the block is NaN */
} qx_group;

static void qx1_rows(qx_group *g, const void *rows, size_t rb, const int32_t *idx, int32_t k) {
    for (int32_t i = 0; i < k; i++) g->r[i] = (const uint8_t *)rows + (size_t)idx[i] * rb;
    g->kp = k;
    if (k % 2) g->r[g->kp++] = g->r[0];
}

/* Pass 1 for blocks [b0 + c0, b0 + c1) of row i: a_i, M, mx (one block at a time; the vector passes keep this
 * order per block). */
static void qx1_pass1(qx_group *g, size_t bs, float p, int32_t i, int64_t b0, int32_t c0, int32_t c1) {
    const uint8_t *blk = g->r[i] + (size_t)(b0 + c0) * bs;
    for (int32_t b = c0; b < c1; b++, blk += bs) {
        pi2_fp16 d, m;
        memcpy(&d, blk, 2);
        memcpy(&m, blk + 2, 2);
        g->a[i][b] = p * pi2_fp16_to_f32(d);
        g->M[b] = g->M[b] + p * pi2_fp16_to_f32(m);
        const float v = fabsf(g->a[i][b]);
        if (v > g->mx[b]) g->mx[b] = v;
        else if (v != v) g->bad[b] = 1;
    }
}

/* Pass 2 for blocks [c0, c1): S and the pairs of z. */
static void qx1_pass2(qx_group *g, int32_t k, int32_t c0, int32_t c1) {
    for (int32_t b = c0; b < c1; b++) {
        const int ok = !g->bad[b] && g->mx[b] >= 1e-30f && g->mx[b] <= FLT_MAX;
        const float iS = ok ? 127.0f / g->mx[b] : 0.0f;
        g->S[b] = ok ? g->mx[b] / 127.0f : 0.0f;
        for (int32_t t = 0; t < g->kp / 2; t++) {
            const int32_t z0 = ok ? (int32_t)nearbyintf(g->a[2 * t][b] * iS) : 0;
            const int32_t z1 = ok && 2 * t + 1 < k ? (int32_t)nearbyintf(g->a[2 * t + 1][b] * iS) : 0;
            g->zp[t][b] = (int16_t)(z1 * 256 + (z0 & 0xFF));
        }
    }
}

static void qx1_clear(qx_group *g, int32_t nb) {
    for (int32_t b = 0; b < nb; b++) g->M[b] = 0.0f, g->mx[b] = 0.0f, g->bad[b] = 0;
}

/* z, S and M of blocks [b0, b0 + nb) (nb ≤ QX_CHUNK); bs is the block's bytes (d and m lead every block). */
static void qx1_prepare(qx_group *g, size_t bs, const float *p, int32_t k, int64_t b0, int32_t nb) {
    qx1_clear(g, nb);
    for (int32_t i = 0; i < k; i++) qx1_pass1(g, bs, p[i], i, b0, 0, nb);
    qx1_pass2(g, k, 0, nb);
}

/* the 32 values of a block in column order */
static void qx1_values(const uint8_t *blk, int five, uint8_t *q) {
    const uint8_t *qs = blk + (five ? 8 : 4);
    uint32_t qh = 0;
    if (five) memcpy(&qh, blk + 4, 4);
    for (int j = 0; j < 16; j++) {
        q[j] = (uint8_t)((qs[j] & 0x0F) | (five ? ((qh >> j) & 1u) << 4 : 0));
        q[j + 16] = (uint8_t)((qs[j] >> 4) | (five ? ((qh >> (j + 16)) & 1u) << 4 : 0));
    }
}

static void qx1_scalar(int five, int64_t n, float *y, const void *rows, size_t rb, const int32_t *idx, const float *p,
                       int32_t k) {
    if (k <= 0) return;
    qx_group g;
    const size_t bs = five ? sizeof(blk_q5_1) : sizeof(blk_q4_1);
    qx1_rows(&g, rows, rb, idx, k);
    for (int64_t b0 = 0; b0 < n / 32; b0 += QX_CHUNK) {
        const int32_t nb = n / 32 - b0 < QX_CHUNK ? (int32_t)(n / 32 - b0) : QX_CHUNK;
        qx1_prepare(&g, bs, p, k, b0, nb);
        for (int32_t b = 0; b < nb; b++) {
            int32_t acc[32] = {0};
            uint8_t q[32];
            for (int32_t i = 0; i < g.kp; i++) {
                const int32_t z = (int8_t)(uint8_t)((uint16_t)g.zp[i / 2][b] >> (8 * (i % 2)));
                qx1_values(g.r[i] + (size_t)(b0 + b) * bs, five, q);
                for (int j = 0; j < 32; j++) acc[j] += z * q[j];
            }
            float *yb = y + (b0 + b) * 32;
            for (int j = 0; j < 32; j++) yb[j] = yb[j] + (g.S[b] * (float)acc[j] + g.M[b]);
        }
    }
}

static void axpy_q4_1_int(int64_t n, float *y, const void *rows, size_t rb, const int32_t *idx, const float *p,
                          int32_t k) {
    qx1_scalar(0, n, y, rows, rb, idx, p, k);
}

static void axpy_q5_1_int(int64_t n, float *y, const void *rows, size_t rb, const int32_t *idx, const float *p,
                          int32_t k) {
    qx1_scalar(1, n, y, rows, rb, idx, p, k);
}

void pi2_kernels_fill_axpy_qx1(pi2_type_traits *tab) {
    tab[PI2_T_Q4_1].axpy_group = axpy_q4_1_int;
    tab[PI2_T_Q5_1].axpy_group = axpy_q5_1_int;
}

#if defined(__x86_64__)
#include <immintrin.h>

#define AVX2 __attribute__((target("avx2")))
#define AVX2F16C __attribute__((target("avx2,f16c")))

/* a block's 32 values as bytes, column order in 128-bit lanes: lane 0 columns 0..15, lane 1 16..31 */
AVX2 static inline __m256i q4_1_vals(const uint8_t *blk) {
    const __m128i qs = _mm_loadu_si128((const __m128i *)(blk + 4)), m4 = _mm_set1_epi8(0x0F);
    return _mm256_set_m128i(_mm_and_si128(_mm_srli_epi16(qs, 4), m4), _mm_and_si128(qs, m4));
}

AVX2 static inline __m256i q5_1_vals(const uint8_t *blk) {
    uint32_t qh;
    memcpy(&qh, blk + 4, 4);
    const __m128i qs = _mm_loadu_si128((const __m128i *)(blk + 8)), m4 = _mm_set1_epi8(0x0F);
    const __m128i lo = _mm_and_si128(qs, m4), hi = _mm_and_si128(_mm_srli_epi16(qs, 4), m4);
    const __m256i shuf = _mm256_setr_epi8(0, 0, 0, 0, 0, 0, 0, 0, 1, 1, 1, 1, 1, 1, 1, 1,
                                          2, 2, 2, 2, 2, 2, 2, 2, 3, 3, 3, 3, 3, 3, 3, 3);
    const __m256i bits = _mm256_shuffle_epi8(_mm256_set1_epi32((int)qh), shuf);
    const __m256i mask = _mm256_set1_epi64x((long long)0x7fbfdfeff7fbfdfeULL);
    const __m256i set = _mm256_cmpeq_epi8(_mm256_or_si256(bits, mask), _mm256_set1_epi64x(-1));
    return _mm256_or_si256(_mm256_set_m128i(hi, lo), _mm256_and_si256(set, _mm256_set1_epi8(0x10)));
}

/* One block over every row pair: lo / hi hold columns 0..7 + 16..23 / 8..15 + 24..31 as int16 for at most
 * `flush` pairs (8·2·15·127 and 4·2·31·127 stay below 2^15), then move into the int32 sums. */
#define QX1_BLOCK_AVX2(VALS, FLUSH)                                                                            \
    do {                                                                                                       \
        __m256i s32[4] = {_mm256_setzero_si256(), _mm256_setzero_si256(), _mm256_setzero_si256(),              \
                          _mm256_setzero_si256()};                                                             \
        for (int32_t t0 = 0; t0 < g.kp / 2; t0 += (FLUSH)) {                                                   \
            const int32_t t1 = t0 + (FLUSH) < g.kp / 2 ? t0 + (FLUSH) : g.kp / 2;                              \
            __m256i lo = _mm256_setzero_si256(), hi = _mm256_setzero_si256();                                  \
            for (int32_t t = t0; t < t1; t++) {                                                                \
                const __m256i qa = VALS(g.r[2 * t] + off), qb = VALS(g.r[2 * t + 1] + off);                    \
                const __m256i zz = _mm256_set1_epi16(g.zp[t][b]);                                              \
                lo = _mm256_add_epi16(lo, _mm256_maddubs_epi16(_mm256_unpacklo_epi8(qa, qb), zz));             \
                hi = _mm256_add_epi16(hi, _mm256_maddubs_epi16(_mm256_unpackhi_epi8(qa, qb), zz));             \
            }                                                                                                  \
            s32[0] = _mm256_add_epi32(s32[0], _mm256_cvtepi16_epi32(_mm256_castsi256_si128(lo)));              \
            s32[1] = _mm256_add_epi32(s32[1], _mm256_cvtepi16_epi32(_mm256_castsi256_si128(hi)));              \
            s32[2] = _mm256_add_epi32(s32[2], _mm256_cvtepi16_epi32(_mm256_extracti128_si256(lo, 1)));         \
            s32[3] = _mm256_add_epi32(s32[3], _mm256_cvtepi16_epi32(_mm256_extracti128_si256(hi, 1)));         \
        }                                                                                                      \
        const __m256 S = _mm256_set1_ps(g.S[b]), M = _mm256_set1_ps(g.M[b]);                                   \
        float *yb = y + (b0 + b) * 32;                                                                         \
        for (int r = 0; r < 4; r++)                                                                            \
            _mm256_storeu_ps(yb + 8 * r, _mm256_add_ps(_mm256_loadu_ps(yb + 8 * r),                            \
                                                       _mm256_add_ps(_mm256_mul_ps(S, _mm256_cvtepi32_ps(s32[r])), M))); \
    } while (0)

/* the leading 32-bit words (d, m) of eight blocks bs bytes apart: dword l of a 32-byte load that starts 4·l bytes
 * before block l (inside the blocks before it), blended; no gather (vpgatherdd is slow on Zen 4) and no vector
 * built through the stack (a store-forwarding stall per step) */
AVX2 static inline __m256i dm_words(const uint8_t *q, size_t bs) {
#define DM_AT(l) _mm256_loadu_si256((const __m256i *)(q + (l) * bs - 4 * (l)))
    const __m256i a = _mm256_blend_epi32(DM_AT(0), DM_AT(1), 0x02), b = _mm256_blend_epi32(DM_AT(2), DM_AT(3), 0x08);
    const __m256i c = _mm256_blend_epi32(DM_AT(4), DM_AT(5), 0x20), d = _mm256_blend_epi32(DM_AT(6), DM_AT(7), 0x80);
#undef DM_AT
    return _mm256_blend_epi32(_mm256_blend_epi32(a, b, 0x0C), _mm256_blend_epi32(c, d, 0xC0), 0xF0);
}

/* qx1_prepare of blocks [b, b + 8) of the chunk (the same operations per block), every row in turn so that the
 * sums stay in registers and the kernel then finds these blocks' bytes in L1: d and m read as one 32-bit word
 * per block (dm_words), converted by F16C (exact, as pi2_fp16_to_f32). */
AVX2F16C static void qx1_prepare8_avx2(qx_group *g, size_t bs, const float *p, int32_t k, int64_t b0, int32_t b) {
    const __m256 sign = _mm256_set1_ps(-0.0f);
    __m256 M = _mm256_setzero_ps(), mx = _mm256_setzero_ps(), nan = _mm256_setzero_ps();
    for (int32_t i = 0; i < k; i++) {
        const __m256 pv = _mm256_set1_ps(p[i]);
        const uint8_t *q = g->r[i] + (size_t)(b0 + b) * bs;
        const __m256i w = dm_words(q, bs);
        const __m256i dm = _mm256_permute4x64_epi64(
            _mm256_packus_epi32(_mm256_and_si256(w, _mm256_set1_epi32(0xFFFF)), _mm256_srli_epi32(w, 16)), 0xD8);
        const __m256 d = _mm256_cvtph_ps(_mm256_castsi256_si128(dm)), m = _mm256_cvtph_ps(_mm256_extracti128_si256(dm, 1));
        const __m256 a = _mm256_mul_ps(pv, d);
        _mm256_storeu_ps(&g->a[i][b], a);
        M = _mm256_add_ps(M, _mm256_mul_ps(pv, m));
        mx = _mm256_max_ps(_mm256_andnot_ps(sign, a), mx);   /* NaN keeps mx, as v > mx does; nan marks it */
        nan = _mm256_or_ps(nan, _mm256_cmp_ps(a, a, _CMP_UNORD_Q));
    }
    _mm256_storeu_ps(&g->M[b], M);
    const __m256 ok = _mm256_andnot_ps(nan, _mm256_and_ps(_mm256_cmp_ps(mx, _mm256_set1_ps(1e-30f), _CMP_GE_OQ),
                                                          _mm256_cmp_ps(mx, _mm256_set1_ps(FLT_MAX), _CMP_LE_OQ)));
    const __m256 iS = _mm256_and_ps(ok, _mm256_div_ps(_mm256_set1_ps(127.0f), mx));
    _mm256_storeu_ps(&g->S[b], _mm256_and_ps(ok, _mm256_div_ps(mx, _mm256_set1_ps(127.0f))));
    const __m256i okm = _mm256_castps_si256(ok);
    for (int32_t t = 0; t < g->kp / 2; t++) {
        const __m256i z0 = _mm256_and_si256(okm, _mm256_cvtps_epi32(_mm256_mul_ps(_mm256_loadu_ps(&g->a[2 * t][b]), iS)));
        const __m256i z1 = 2 * t + 1 < k ? _mm256_and_si256(okm, _mm256_cvtps_epi32(_mm256_mul_ps(_mm256_loadu_ps(&g->a[2 * t + 1][b]), iS)))
                                         : _mm256_setzero_si256();
        const __m256i zp = _mm256_add_epi32(_mm256_slli_epi32(z1, 8), _mm256_and_si256(z0, _mm256_set1_epi32(0xFF)));
        const __m256i packed = _mm256_permute4x64_epi64(_mm256_packs_epi32(zp, zp), 0xD8);
        _mm_storeu_si128((__m128i *)&g->zp[t][b], _mm256_castsi256_si128(packed));
    }
}

/* the scalar passes for blocks [c0, nb) of the chunk */
static void qx1_prepare_tail(qx_group *g, size_t bs, const float *p, int32_t k, int64_t b0, int32_t c0, int32_t nb) {
    for (int32_t b = c0; b < nb; b++) g->M[b] = 0.0f, g->mx[b] = 0.0f, g->bad[b] = 0;
    for (int32_t i = 0; i < k; i++) qx1_pass1(g, bs, p[i], i, b0, c0, nb);
    qx1_pass2(g, k, c0, nb);
}

#define QX1_AVX2(NAME, BLK, VALS, FLUSH)                                                                       \
    AVX2F16C static void NAME(int64_t n, float *y, const void *rows, size_t rb, const int32_t *idx, const float *p, \
                          int32_t k) {                                                                         \
        if (k <= 0) return;                                                                                    \
        qx_group g;                                                                                            \
        qx1_rows(&g, rows, rb, idx, k);                                                                        \
        for (int64_t b0 = 0; b0 < n / 32; b0 += QX_CHUNK) {                                                    \
            const int32_t nb = n / 32 - b0 < QX_CHUNK ? (int32_t)(n / 32 - b0) : QX_CHUNK;                     \
            for (int32_t b = 0; b < nb; b++) {                                                                 \
                if (b % 8 == 0 && b + 8 <= nb) qx1_prepare8_avx2(&g, sizeof(BLK), p, k, b0, b);                \
                if (b == nb / 8 * 8) qx1_prepare_tail(&g, sizeof(BLK), p, k, b0, b, nb);                       \
                const size_t off = (size_t)(b0 + b) * sizeof(BLK);                                             \
                QX1_BLOCK_AVX2(VALS, FLUSH);                                                                   \
            }                                                                                                  \
        }                                                                                                      \
    }
QX1_AVX2(axpy_q4_1_avx2, blk_q4_1, q4_1_vals, 8)
QX1_AVX2(axpy_q5_1_avx2, blk_q5_1, q5_1_vals, 4)

void pi2_kernels_install_axpy_qx1(pi2_type_traits *tab, uint32_t isa) {
    if (isa & PI2_K_AVX2) {
        tab[PI2_T_Q4_1].axpy_group = axpy_q4_1_avx2;
        tab[PI2_T_Q5_1].axpy_group = axpy_q5_1_avx2;
    }
}

#else

void pi2_kernels_install_axpy_qx1(pi2_type_traits *tab, uint32_t isa) { (void)tab; (void)isa; }

#endif
