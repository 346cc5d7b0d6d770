/* axpy_qx1_pack.c — Q4_1 and Q5_1 down rows in the per-group layout of axpy_qx1_pack.h: the packing and the
 * AVX-512 VNNI group sum over it.
 * Numerics: axpy_qx1.c's (pi2/reference/down_qx1.py): per 32-column block, a_i = p_i·d_ib,
 *   M_b = ((+0 + p_0·m_0b) + p_1·m_1b) + … in the order of the active rows, mx = max|a_i|, z_i = nearbyint(a_i·127/mx)
 *   (blocks whose mx is not in [1e-30, FLT_MAX] or has a NaN a_i: z = 0, S = 0), y += S·(float)Σ z_i·q_ij + M_b.
 *   The sum is exact in int32, so summing whole quads (rows that are not active weigh 0) changes no bit.
 * Does: pack a group; the kernel (16 blocks' scales and 8-bit weights at a time, then per block every active quad
 *       with two vpdpbusd on one 64-byte load).
 * Does not: choose rows or groups (ffn/sparse.c) or own the packed copies (ffn/down_pack.c). */
#include "axpy_qx1_pack.h"

#include "traits.h"

#include <string.h>

static size_t unit_bytes(int32_t type) { return type == PI2_T_Q4_1 ? 64 : type == PI2_T_Q5_1 ? 80 : 0; }

size_t pi2_qx1p_group_bytes(int32_t type, int64_t nb) {
    const size_t u = unit_bytes(type);
    return u ? (size_t)nb * (PI2_QX1P_ROWS / 4 * u + PI2_QX1P_ROWS * 4) : 0;
}

/* the start of chunk c0's scales; its values follow them */
static size_t chunk_at(size_t u, int64_t c0) { return (size_t)c0 * (PI2_QX1P_ROWS * 4 + PI2_QX1P_ROWS / 4 * u); }

void pi2_qx1p_pack_group(int32_t type, const uint8_t *rows, size_t rb, int32_t n_rows, int64_t nb, uint8_t *dst) {
    const size_t u = unit_bytes(type), bs = type == PI2_T_Q5_1 ? sizeof(blk_q5_1) : sizeof(blk_q4_1);
    const int five = type == PI2_T_Q5_1;
    memset(dst, 0, pi2_qx1p_group_bytes(type, nb));
    for (int32_t r = 0; r < n_rows; r++)
        for (int64_t b = 0; b < nb; b++) {
            const int64_t c0 = b / 16 * 16, nc = nb - c0 < 16 ? nb - c0 : 16;
            uint8_t *dm = dst + chunk_at(u, c0), *vals = dm + PI2_QX1P_ROWS * 4 * (size_t)nc;
            const uint8_t *blk = rows + (size_t)r * rb + (size_t)b * bs, *qs = blk + (five ? 8 : 4);
            uint8_t *ds = dm + (size_t)r * (size_t)nc * 4 + (size_t)(b - c0) * 2;
            memcpy(ds, blk, 2);                    /* d */
            memcpy(ds + (size_t)nc * 2, blk + 2, 2);   /* m */
            uint8_t *v = vals + ((size_t)(b - c0) * (PI2_QX1P_ROWS / 4) + (size_t)(r / 4)) * u;
            for (int j = 0; j < 16; j++) v[4 * j + r % 4] = qs[j];
            if (!five) continue;
            uint32_t qh;
            uint64_t mask[2];
            memcpy(&qh, blk + 4, 4);
            memcpy(mask, v + 64, 16);
            for (int j = 0; j < 32; j++)
                if ((qh >> j) & 1u) mask[j / 16] |= 1ull << (4 * (j % 16) + r % 4);
            memcpy(v + 64, mask, 16);
        }
}

#if defined(__x86_64__)
#include <float.h>
#include <immintrin.h>

#define VNNI __attribute__((target("avx2,f16c,avx512f,avx512bw,avx512vl,avx512vnni")))
#define QX1P_AHEAD 8192   /* bytes of a group prefetched ahead of its sums */

/* one active quad of block `c` into the sums (lo: columns 0..15, hi: 16..31) */
#define QX1P_QUAD(T, LO, HI)                                                                                   \
    do {                                                                                                       \
        const uint8_t *v_ = q + (size_t)(T) * u;                                                               \
        const __m512i x_ = _mm512_loadu_si512(v_);                                                             \
        __m512i l_ = _mm512_and_si512(x_, m4), h_ = _mm512_and_si512(_mm512_srli_epi16(x_, 4), m4);            \
        if (five) {                                                                                            \
            uint64_t k_[2];                                                                                    \
            memcpy(k_, v_ + 64, 16);                                                                           \
            l_ = _mm512_mask_add_epi8(l_, (__mmask64)k_[0], l_, c16);   /* bit 4 is clear: + is | */           \
            h_ = _mm512_mask_add_epi8(h_, (__mmask64)k_[1], h_, c16);                                          \
        }                                                                                                      \
        const __m512i z_ = _mm512_set1_epi32(zq[T][c]);                                                        \
        LO = _mm512_dpbusd_epi32(LO, l_, z_);                                                                  \
        HI = _mm512_dpbusd_epi32(HI, h_, z_);                                                                  \
    } while (0)

VNNI static void qx1p_vnni(int five, int64_t n, float *y, const uint8_t *grp, const int32_t *loc, const float *p,
                           int32_t k) {
    if (k <= 0) return;
    const int64_t nb = n / 32;
    const size_t u = five ? 80 : 64;
    int32_t quads[PI2_QX1P_ROWS / 4], nq = 0;   /* quads with an active row, ascending (loc is) */
    for (int32_t i = 0; i < k; i++)
        if (!nq || quads[nq - 1] != loc[i] / 4) quads[nq++] = loc[i] / 4;
    float a[PI2_QX1P_ROWS][16], S[16], M[16];
    int32_t zq[PI2_QX1P_ROWS / 4][16];
    const __m512i m4 = _mm512_set1_epi8(0x0F), c16 = _mm512_set1_epi8(0x10);
    /* the group is one forward stream, but its active rows' scale lines and active quads are not read in a
     * run the hardware prefetcher follows (and each load's miss stalls the next step): ask QX1P_AHEAD bytes
     * ahead, a block's quads at a time (past the group's end: the next group, usually the next one summed) */
    const size_t bq = PI2_QX1P_ROWS / 4 * u;
    for (size_t o = 0; o < QX1P_AHEAD; o += 64) __builtin_prefetch(grp + o);
    for (int64_t c0 = 0; c0 < nb; c0 += 16) {
        const int32_t nc = nb - c0 < 16 ? (int32_t)(nb - c0) : 16;
        const __mmask16 lanes = (__mmask16)((1u << nc) - 1u);
        const uint8_t *dm = grp + chunk_at(u, c0), *vals = dm + PI2_QX1P_ROWS * 4 * (size_t)nc;
        __m512 Mv = _mm512_setzero_ps(), mx = _mm512_setzero_ps();
        __mmask16 nan = 0;
        for (int32_t i = 0; i < k; i++) {   /* a, M and mx of 16 blocks, row by row in the active order */
            const uint8_t *ds = dm + (size_t)loc[i] * (size_t)nc * 4;
            const __m512 d = _mm512_cvtph_ps(nc == 16 ? _mm256_loadu_si256((const void *)ds)
                                                      : _mm256_maskz_loadu_epi16(lanes, ds));
            const __m512 m = _mm512_cvtph_ps(nc == 16 ? _mm256_loadu_si256((const void *)(ds + 32))
                                                      : _mm256_maskz_loadu_epi16(lanes, ds + (size_t)nc * 2));
            const __m512 pv = _mm512_set1_ps(p[i]), av = _mm512_mul_ps(pv, d);
            _mm512_storeu_ps(a[i], av);
            Mv = _mm512_add_ps(Mv, _mm512_mul_ps(pv, m));
            mx = _mm512_max_ps(_mm512_abs_ps(av), mx);   /* a NaN keeps mx, as `v > mx` does; nan marks it */
            nan |= _mm512_cmp_ps_mask(av, av, _CMP_UNORD_Q);
        }
        const __mmask16 ok = (__mmask16)(~nan & _mm512_cmp_ps_mask(mx, _mm512_set1_ps(1e-30f), _CMP_GE_OQ) &
                                         _mm512_cmp_ps_mask(mx, _mm512_set1_ps(FLT_MAX), _CMP_LE_OQ));
        const __m512 iS = _mm512_maskz_div_ps(ok, _mm512_set1_ps(127.0f), mx);
        _mm512_storeu_ps(S, _mm512_maskz_div_ps(ok, mx, _mm512_set1_ps(127.0f)));
        _mm512_storeu_ps(M, Mv);
        for (int32_t t = 0; t < nq; t++) _mm512_storeu_si512(zq[quads[t]], _mm512_setzero_si512());
        for (int32_t i = 0; i < k; i++) {   /* z of each row into its byte of its quad's weight words */
            const __m512i z = _mm512_maskz_cvtps_epi32(ok, _mm512_mul_ps(_mm512_loadu_ps(a[i]), iS));
            const __m128i sh = _mm_cvtsi32_si128(8 * (loc[i] % 4));
            int32_t *zt = zq[loc[i] / 4];   /* zt | (z << sh & 0xFF << sh) */
            _mm512_storeu_si512(zt, _mm512_ternarylogic_epi32(_mm512_loadu_si512(zt), _mm512_sll_epi32(z, sh),
                                                              _mm512_sll_epi32(_mm512_set1_epi32(0xFF), sh), 0xF8));
        }
        for (int32_t c = 0; c < nc; c++) {   /* every active quad of each block; two chains per half */
            const uint8_t *q = vals + (size_t)c * bq;
            for (size_t o = 0; o < bq; o += 64) __builtin_prefetch(q + QX1P_AHEAD + o);
            __m512i lo0 = _mm512_setzero_si512(), hi0 = lo0, lo1 = lo0, hi1 = lo0;
            int32_t t = 0;
            for (; t + 2 <= nq; t += 2) {
                QX1P_QUAD(quads[t], lo0, hi0);
                QX1P_QUAD(quads[t + 1], lo1, hi1);
            }
            if (t < nq) QX1P_QUAD(quads[t], lo0, hi0);
            const __m512 Sv = _mm512_set1_ps(S[c]), Mb = _mm512_set1_ps(M[c]);
            float *yb = y + (c0 + c) * 32;
            const __m512 s0 = _mm512_cvtepi32_ps(_mm512_add_epi32(lo0, lo1)), s1 = _mm512_cvtepi32_ps(_mm512_add_epi32(hi0, hi1));
            _mm512_storeu_ps(yb, _mm512_add_ps(_mm512_loadu_ps(yb), _mm512_add_ps(_mm512_mul_ps(Sv, s0), Mb)));
            _mm512_storeu_ps(yb + 16, _mm512_add_ps(_mm512_loadu_ps(yb + 16), _mm512_add_ps(_mm512_mul_ps(Sv, s1), Mb)));
        }
    }
}

VNNI static void axpy_q4_1p_vnni(int64_t n, float *y, const uint8_t *grp, const int32_t *loc, const float *p, int32_t k) {
    qx1p_vnni(0, n, y, grp, loc, p, k);
}

VNNI static void axpy_q5_1p_vnni(int64_t n, float *y, const uint8_t *grp, const int32_t *loc, const float *p, int32_t k) {
    qx1p_vnni(1, n, y, grp, loc, p, k);
}

pi2_axpy_qx1p_fn pi2_kernels_axpy_qx1p(int32_t type, int32_t impl) {
    if (impl != PI2_K_IMPL_AUTO || !(pi2_kernels_isa() & PI2_K_AVX512VNNI)) return NULL;
    return type == PI2_T_Q4_1 ? axpy_q4_1p_vnni : type == PI2_T_Q5_1 ? axpy_q5_1p_vnni : NULL;
}

#else

pi2_axpy_qx1p_fn pi2_kernels_axpy_qx1p(int32_t type, int32_t impl) {
    (void)type;
    (void)impl;
    return NULL;
}

#endif
