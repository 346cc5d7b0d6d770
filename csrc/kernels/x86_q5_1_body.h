/* x86_q5_1_body.h — the Q5_1 kernels beyond one row and one token: four tokens of one row (vec_dot4), two rows
 * of four tokens (AVX2), four rows of four or eight tokens (AVX-512 VNNI, two rows per zmm register), and eight
 * packed rows of one token (the x8 layout of pack.h: d[8], m[8], qh[8][4], qs[8][16] per block column).
 * llama.cpp has neither a repacked layout nor a batch kernel for Q5_1 on x86: every output is one
 * ggml_vec_dot_q5_1_q8_1, so each output here keeps that order (twin: q5_1_vec_dot in x86_body.h, the reference
 * pi2/reference/qdot.py dot_q4_1_q8_1): 8 int32 lanes of 4 u5·s8 products per block, acc = fma(d_x·d_y, lane,
 * acc), summs += m_x·s_y, then hsum_float_8(acc) + summs. The integer lanes are exact however they are formed.
 * Included by x86.c after x86_tile_body.h in both passes. Needs: X86_TARGET, X86_FN, X86_VNNI, x86_body.h's
 * helpers (nibbles, bits_to_bytes, dot_u8s8, hsum, h2f) and x86_pack_body.h's (pk_scales, pk_prefetch, PK_LANE). */

#define Q51_ACT(t, i) ((const blk_q8_1 *)((const uint8_t *)xq + (size_t)(t) * xq_stride) + (i))

/* The 32 unsigned 5-bit codes of one block, in value order (low nibbles, then high), the fifth bit from qh. */
static inline X86_TARGET __m256i X86_FN(q5_1_codes)(const uint8_t *qs, const uint8_t *qh) {
    return _mm256_or_si256(X86_FN(nibbles)(qs), _mm256_and_si256(X86_FN(bits_to_bytes)(qh), _mm256_set1_epi8(0x10)));
}

/* twin: q5_1_vec_dot (x86_body.h), four tokens */
static X86_TARGET void X86_FN(q5_1_vec_dot4)(int64_t n, float *s, size_t s_stride, const void *w,
                                             const void *xq, size_t xq_stride) {
    const blk_q5_1 *x = w;
    __m256 acc[4] = {_mm256_setzero_ps(), _mm256_setzero_ps(), _mm256_setzero_ps(), _mm256_setzero_ps()};
    float summs[4] = {0, 0, 0, 0};
    for (int64_t i = 0; i < n / 32; i++) {
        const __m256i q = X86_FN(q5_1_codes)(x[i].qs, x[i].qh);
        const float dx = X86_FN(h2f)(x[i].d), mx = X86_FN(h2f)(x[i].m);
        for (int t = 0; t < 4; t++) {
            const blk_q8_1 *y = Q51_ACT(t, i);
            const __m256i v = _mm256_loadu_si256((const __m256i *)y->qs);
            const __m256 d = _mm256_set1_ps(dx * X86_FN(h2f)(y->d));
            acc[t] = _mm256_fmadd_ps(d, _mm256_cvtepi32_ps(X86_FN(dot_u8s8)(q, v)), acc[t]);
            summs[t] += mx * X86_FN(h2f)(y->s);
        }
    }
    for (int t = 0; t < 4; t++) s[t * s_stride] = X86_FN(hsum)(acc[t]) + summs[t];
}

#if !X86_VNNI
/* twin: q5_1_vec_dot (x86_body.h), two rows x four tokens: each activation block loaded once for both rows. */
static X86_TARGET void X86_FN(q5_1_vec_dot4x2)(int64_t n, float *s, size_t s_stride, const void *w,
                                               size_t w_stride, const void *xq, size_t xq_stride) {
    const blk_q5_1 *x0 = w, *x1 = (const blk_q5_1 *)((const uint8_t *)w + w_stride);
    __m256 acc0[4], acc1[4];
    float sm0[4] = {0, 0, 0, 0}, sm1[4] = {0, 0, 0, 0};
    for (int t = 0; t < 4; t++) acc0[t] = acc1[t] = _mm256_setzero_ps();
    for (int64_t i = 0; i < n / 32; i++) {
        const __m256i q0 = X86_FN(q5_1_codes)(x0[i].qs, x0[i].qh), q1 = X86_FN(q5_1_codes)(x1[i].qs, x1[i].qh);
        const float d0 = X86_FN(h2f)(x0[i].d), d1 = X86_FN(h2f)(x1[i].d);
        const float m0 = X86_FN(h2f)(x0[i].m), m1 = X86_FN(h2f)(x1[i].m);
        X86_FN(x1_step4x2)(q0, q1, d0, m0, d1, m1, xq, xq_stride, i, acc0, acc1, sm0, sm1);
    }
    X86_FN(x1_store4x2)(s, s_stride, acc0, acc1, sm0, sm1);
}
#endif

#if X86_VNNI
/* Q5_1 rows a and b, one block each: the codes of a in bytes 0..31 and of b in bytes 32..63 (q5_1_codes' order). */
static inline X86_TARGET __m512i X86_FN(q5_1_codes2)(const blk_q5_1 *a, const blk_q5_1 *b) {
    const __m256i qs = _mm256_inserti128_si256(_mm256_castsi128_si256(_mm_loadu_si128((const __m128i *)a->qs)),
                                               _mm_loadu_si128((const __m128i *)b->qs), 1);
    const __m512i z = _mm512_castsi256_si512(qs);
    const __m512i dup = _mm512_shuffle_i64x2(z, z, 0x50);                 /* [a.qs, a.qs, b.qs, b.qs] */
    const __m512i nib = _mm512_and_si512(_mm512_mask_srli_epi16(dup, 0xFF00FF00u, dup, 4), _mm512_set1_epi8(0x0F));
    uint32_t ha, hb;
    memcpy(&ha, a->qh, 4);
    memcpy(&hb, b->qh, 4);
    const __mmask64 h = _cvtu64_mask64((uint64_t)ha | (uint64_t)hb << 32);
    return _mm512_mask_add_epi8(nib, h, nib, _mm512_set1_epi8(16));
}

/* Four rows x NT tokens; rows (0, 1) and (2, 3) share a zmm register, 8 lanes each, and the four rows' summs
 * share an xmm register per token (lane r: row r's own chain). */
static inline __attribute__((always_inline)) X86_TARGET void X86_FN(q5_1_rows4)(
        int64_t n, float *s, size_t s_stride, const void *w, size_t w_stride, const void *xq, size_t xq_stride,
        const int NT) {
    const blk_q5_1 *x[4];
    for (int k = 0; k < 4; k++) x[k] = (const blk_q5_1 *)((const uint8_t *)w + k * w_stride);
    __m512 acc[2][8];
    __m128 sm[8];
    for (int t = 0; t < NT; t++) {
        acc[0][t] = acc[1][t] = _mm512_setzero_ps();
        sm[t] = _mm_setzero_ps();
    }
    for (int64_t i = 0; i < n / 32; i++) {
        const __m512i c[2] = {X86_FN(q5_1_codes2)(&x[0][i], &x[1][i]), X86_FN(q5_1_codes2)(&x[2][i], &x[3][i])};
        __m512 dx[2];
        for (int p = 0; p < 2; p++) {
            const __m256 d0 = _mm256_set1_ps(X86_FN(h2f)(x[2 * p][i].d)), d1 = _mm256_set1_ps(X86_FN(h2f)(x[2 * p + 1][i].d));
            dx[p] = _mm512_castpd_ps(_mm512_insertf64x4(_mm512_castpd256_pd512(_mm256_castps_pd(d0)), _mm256_castps_pd(d1), 1));
        }
        const __m128 mx = _mm_setr_ps(X86_FN(h2f)(x[0][i].m), X86_FN(h2f)(x[1][i].m), X86_FN(h2f)(x[2][i].m),
                                      X86_FN(h2f)(x[3][i].m));
        for (int t = 0; t < NT; t++) {
            const blk_q8_1 *y = Q51_ACT(t, i);
            const __m512i yv = _mm512_broadcast_i64x4(_mm256_loadu_si256((const __m256i *)y->qs));
            const __m512 dy = _mm512_set1_ps(X86_FN(h2f)(y->d));
            for (int p = 0; p < 2; p++) {
                const __m512i q = _mm512_dpbusd_epi32(_mm512_setzero_si512(), c[p], yv);
                acc[p][t] = _mm512_fmadd_ps(_mm512_mul_ps(dx[p], dy), _mm512_cvtepi32_ps(q), acc[p][t]);
            }
            sm[t] = _mm_add_ps(sm[t], _mm_mul_ps(mx, _mm_set1_ps(X86_FN(h2f)(y->s))));
        }
    }
    for (int t = 0; t < NT; t++) {
        float m[4];
        _mm_storeu_ps(m, sm[t]);
        for (int p = 0; p < 2; p++) {
            s[t * s_stride + 2 * p] = X86_FN(hsum)(_mm512_castps512_ps256(acc[p][t])) + m[2 * p];
            s[t * s_stride + 2 * p + 1] =
                X86_FN(hsum)(_mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(acc[p][t]), 1))) + m[2 * p + 1];
        }
    }
}

/* twin: q5_1_vec_dot (x86_body.h), four rows x four tokens */
static X86_TARGET void X86_FN(q5_1_vec_dot4x4)(int64_t n, float *s, size_t s_stride, const void *w,
                                               size_t w_stride, const void *xq, size_t xq_stride) {
    X86_FN(q5_1_rows4)(n, s, s_stride, w, w_stride, xq, xq_stride, 4);
}

/* twin: q5_1_vec_dot (x86_body.h), four rows x eight tokens (each weight block decoded once for all eight) */
static X86_TARGET void X86_FN(q5_1_vec_dot8x4)(int64_t n, float *s, size_t s_stride, const void *w,
                                               size_t w_stride, const void *xq, size_t xq_stride) {
    X86_FN(q5_1_rows4)(n, s, s_stride, w, w_stride, xq, xq_stride, 8);
}
#endif

/* twin: q5_1_vec_dot of this table on the unpacked rows (the x8 layout, one token) */
static X86_TARGET void X86_FN(q5_1_dot_pack)(int64_t n, float *s, const void *grp, const void *xq) {
    const uint8_t *g = grp; const blk_q8_1 *y = xq;
    __m256 acc[8], sm = _mm256_setzero_ps();
    for (int r = 0; r < 8; r++) acc[r] = _mm256_setzero_ps();
    for (int64_t i = 0; i < n / 32; i++) {
        const uint8_t *b = g + (size_t)i * 8 * sizeof(blk_q5_1);
        X86_FN(pk_prefetch)(b, 8 * sizeof(blk_q5_1));
        const __m256i v = _mm256_loadu_si256((const __m256i *)y[i].qs);
        const __m256 dv = X86_FN(pk_scales)(b, y[i].d);
        for (int r = 0; r < 8; r++) {
            const __m256i q = X86_FN(q5_1_codes)(b + 64 + 16 * r, b + 32 + 4 * r);
            acc[r] = _mm256_fmadd_ps(PK_LANE(dv, r), _mm256_cvtepi32_ps(X86_FN(dot_u8s8)(q, v)), acc[r]);
        }
        sm = _mm256_add_ps(sm, X86_FN(pk_scales)(b + 16, y[i].s));   /* summs += h2f(m)·h2f(s) per row */
    }
    float m[8];
    _mm256_storeu_ps(m, sm);
    for (int r = 0; r < 8; r++) s[r] = X86_FN(hsum)(acc[r]) + m[r];
}

#undef Q51_ACT
