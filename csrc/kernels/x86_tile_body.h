/* x86_tile_body.h — four- and eight-token kernels, included by x86.c after each x86_body.h (same
 * macros): the weight block is unpacked once and multiplied with several activation rows, the lever for
 * prompt batches.
 * Does: for each token, exactly the float operations of its one-token twin, in the same order (token t
 *       keeps its own accumulators), so results are bit-identical to vec_dot calls; integer sums, exact,
 *       may be formed differently. Q5_0 also has two- and four-row kernels (pi2_kernels_dot4x2, dot4x4,
 *       dot8x4), each activation block loaded once for all rows; the eight-token one reads q8_0_wide rows.
 *       Q4_K and Q6_K have eight-token batch kernels (pi2_kernels_batch8).
 * Does not: stand alone, or pick which tokens use it (matmul.c, by traits.h's fields and x86.c's tables). */

#define X86_ACT(T, t, i) ((const T *)((const uint8_t *)xq + (t) * xq_stride) + (i))
#ifndef Q8_0_WIDE_BYTES
#define Q8_0_WIDE_BYTES 68   /* q8_0_wide: int32 start[8], int8 qs[32], float d */
#endif
#define X86_ZERO4 {_mm256_setzero_ps(), _mm256_setzero_ps(), _mm256_setzero_ps(), _mm256_setzero_ps()}

/* twin: q5_0_vec_dot in ref.c (x86 order: q5_0_vec_dot in x86_body.h), four tokens */
static X86_TARGET void X86_FN(q5_0_vec_dot4)(int64_t n, float *s, size_t s_stride, const void *w,
                                             const void *xq, size_t xq_stride) {
    const blk_q5_0 *x = w;
    __m256 acc[4] = X86_ZERO4;
    for (int64_t i = 0; i < n / 32; i++) {
        const __m256i hi = _mm256_andnot_si256(X86_FN(bits_to_bytes)(x[i].qh), _mm256_set1_epi8((char)0xF0));
        const __m256i q = _mm256_or_si256(X86_FN(nibbles)(x[i].qs), hi);
        const __m256i ax = _mm256_sign_epi8(q, q);
        const float dx = X86_FN(h2f)(x[i].d);
        for (int t = 0; t < 4; t++) {
            const blk_q8_0 *y = X86_ACT(blk_q8_0, t, i);
            const __m256i v = _mm256_sign_epi8(_mm256_loadu_si256((const __m256i *)y->qs), q);
            const __m256 d = _mm256_set1_ps(dx * X86_FN(h2f)(y->d));
            acc[t] = _mm256_fmadd_ps(d, _mm256_cvtepi32_ps(X86_FN(dot_u8s8)(ax, v)), acc[t]);
        }
    }
    for (int t = 0; t < 4; t++) s[t * s_stride] = X86_FN(hsum)(acc[t]);
}

/* twin: q5_0_vec_dot in ref.c (x86 order: q5_0_vec_dot in x86_body.h), two rows x four tokens:
 * each activation block and its scale are loaded once for both rows; output (k, t) keeps its own
 * accumulator and the one-token float order (dx·dy, one FMA per block, hsum). */
static X86_TARGET void X86_FN(q5_0_vec_dot4x2)(int64_t n, float *s, size_t s_stride, const void *w,
                                               size_t w_stride, const void *xq, size_t xq_stride) {
    const blk_q5_0 *x0 = w, *x1 = (const blk_q5_0 *)((const uint8_t *)w + w_stride);
#if X86_VNNI
    /* 512-bit: row 0 in the low 8 lanes, row 1 in the high 8; lane for lane the same operations. */
    __m512 acc[4] = {_mm512_setzero_ps(), _mm512_setzero_ps(), _mm512_setzero_ps(), _mm512_setzero_ps()};
    for (int64_t i = 0; i < n / 32; i++) {
        const __m256i f0 = _mm256_set1_epi8((char)0xF0);
        const __m256i q0 = _mm256_or_si256(X86_FN(nibbles)(x0[i].qs), _mm256_andnot_si256(X86_FN(bits_to_bytes)(x0[i].qh), f0));
        const __m256i q1 = _mm256_or_si256(X86_FN(nibbles)(x1[i].qs), _mm256_andnot_si256(X86_FN(bits_to_bytes)(x1[i].qh), f0));
        const __m512i q = _mm512_inserti64x4(_mm512_castsi256_si512(q0), q1, 1);
        const __m512i a = _mm512_abs_epi8(q);
        const __mmask64 neg = _mm512_movepi8_mask(q);
        const __m256i d0 = _mm256_castps_si256(_mm256_set1_ps(X86_FN(h2f)(x0[i].d)));
        const __m256i d1 = _mm256_castps_si256(_mm256_set1_ps(X86_FN(h2f)(x1[i].d)));
        const __m512 dx = _mm512_castsi512_ps(_mm512_inserti64x4(_mm512_castsi256_si512(d0), d1, 1));
        for (int t = 0; t < 4; t++) {
            const blk_q8_0 *y = X86_ACT(blk_q8_0, t, i);
            const __m512i yv = _mm512_broadcast_i64x4(_mm256_loadu_si256((const __m256i *)y->qs));
            const __m512i v = _mm512_mask_sub_epi8(yv, neg, _mm512_setzero_si512(), yv);
            const __m512i p = _mm512_dpbusd_epi32(_mm512_setzero_si512(), a, v);
            const __m512 d = _mm512_mul_ps(dx, _mm512_set1_ps(X86_FN(h2f)(y->d)));
            acc[t] = _mm512_fmadd_ps(d, _mm512_cvtepi32_ps(p), acc[t]);
        }
    }
    for (int t = 0; t < 4; t++) {
        s[t * s_stride] = X86_FN(hsum)(_mm512_castps512_ps256(acc[t]));
        s[t * s_stride + 1] = X86_FN(hsum)(_mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(acc[t]), 1)));
    }
#else
    __m256 acc0[4] = X86_ZERO4, acc1[4] = X86_ZERO4;
    for (int64_t i = 0; i < n / 32; i++) {
        const __m256i f0 = _mm256_set1_epi8((char)0xF0);
        const __m256i q0 = _mm256_or_si256(X86_FN(nibbles)(x0[i].qs), _mm256_andnot_si256(X86_FN(bits_to_bytes)(x0[i].qh), f0));
        const __m256i q1 = _mm256_or_si256(X86_FN(nibbles)(x1[i].qs), _mm256_andnot_si256(X86_FN(bits_to_bytes)(x1[i].qh), f0));
        const __m256i a0 = _mm256_sign_epi8(q0, q0), a1 = _mm256_sign_epi8(q1, q1);
        const float d0 = X86_FN(h2f)(x0[i].d), d1 = X86_FN(h2f)(x1[i].d);
        for (int t = 0; t < 4; t++) {
            const blk_q8_0 *y = X86_ACT(blk_q8_0, t, i);
            const __m256i yv = _mm256_loadu_si256((const __m256i *)y->qs);
            const float dy = X86_FN(h2f)(y->d);
            const __m256i p0 = X86_FN(dot_u8s8)(a0, _mm256_sign_epi8(yv, q0));
            const __m256i p1 = X86_FN(dot_u8s8)(a1, _mm256_sign_epi8(yv, q1));
            acc0[t] = _mm256_fmadd_ps(_mm256_set1_ps(d0 * dy), _mm256_cvtepi32_ps(p0), acc0[t]);
            acc1[t] = _mm256_fmadd_ps(_mm256_set1_ps(d1 * dy), _mm256_cvtepi32_ps(p1), acc1[t]);
        }
    }
    for (int t = 0; t < 4; t++) {
        s[t * s_stride] = X86_FN(hsum)(acc0[t]);
        s[t * s_stride + 1] = X86_FN(hsum)(acc1[t]);
    }
#endif
}

#if X86_VNNI
/* Q5_0 rows a and b, one block each: the unsigned 5-bit codes q + 16 (0..31) of a in bytes 0..31 and
 * of b in bytes 32..63, value order as nibbles() (low nibbles, then high), the fifth bit from qh. */
static inline X86_TARGET __m512i X86_FN(q5_0_codes2)(const blk_q5_0 *a, const blk_q5_0 *b) {
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

/* twin: q5_0_vec_dot in ref.c (x86 order: q5_0_vec_dot in x86_body.h), four rows x NT tokens. Rows
 * (0, 1) and (2, 3) share a 512-bit register, 8 lanes each. A lane's int32 is Σ code·y − 16·Σ y over its
 * four values, which is Σ q·y exactly (the −16·Σ y start is computed once per token for all rows); the
 * float steps per output are vec_dot's: dx·dy, one FMA per block into its own 8 lanes, hsum. */
static inline __attribute__((always_inline)) X86_TARGET void X86_FN(q5_0_rows4)(
        int64_t n, float *s, size_t s_stride, const void *w, size_t w_stride, const void *xq, size_t xq_stride,
        const int NT, const int WIDE) {
    const blk_q5_0 *x[4];
    for (int k = 0; k < 4; k++) x[k] = (const blk_q5_0 *)((const uint8_t *)w + k * w_stride);
    __m512 acc[2][8];
    for (int p = 0; p < 2; p++)
        for (int t = 0; t < NT; t++) acc[p][t] = _mm512_setzero_ps();
    const __m512i c16 = _mm512_set1_epi8(16);
    for (int64_t i = 0; i < n / 32; i++) {
        const __m512i c[2] = {X86_FN(q5_0_codes2)(&x[0][i], &x[1][i]), X86_FN(q5_0_codes2)(&x[2][i], &x[3][i])};
        __m512 dx[2];
        for (int p = 0; p < 2; p++) {
            const __m256 d0 = _mm256_set1_ps(X86_FN(h2f)(x[2 * p][i].d)), d1 = _mm256_set1_ps(X86_FN(h2f)(x[2 * p + 1][i].d));
            dx[p] = _mm512_castpd_ps(_mm512_insertf64x4(_mm512_castpd256_pd512(_mm256_castps_pd(d0)), _mm256_castps_pd(d1), 1));
        }
        for (int t = 0; t < NT; t++) {
            __m512i yv, start;
            __m512 dy;
            if (WIDE) {   /* q8_0_wide blocks: start, qs, dy ready */
                const uint8_t *yb = (const uint8_t *)xq + t * xq_stride + i * Q8_0_WIDE_BYTES;
                float d;
                memcpy(&d, yb + 64, 4);
                start = _mm512_broadcast_i64x4(_mm256_loadu_si256((const __m256i *)yb));
                yv = _mm512_broadcast_i64x4(_mm256_loadu_si256((const __m256i *)(yb + 32)));
                dy = _mm512_set1_ps(d);
            } else {
                const blk_q8_0 *y = X86_ACT(blk_q8_0, t, i);
                yv = _mm512_broadcast_i64x4(_mm256_loadu_si256((const __m256i *)y->qs));
                start = _mm512_sub_epi32(_mm512_setzero_si512(), _mm512_dpbusd_epi32(_mm512_setzero_si512(), c16, yv));
                dy = _mm512_set1_ps(X86_FN(h2f)(y->d));
            }
            for (int p = 0; p < 2; p++) {
                const __m512i q = _mm512_dpbusd_epi32(start, c[p], yv);
                acc[p][t] = _mm512_fmadd_ps(_mm512_mul_ps(dx[p], dy), _mm512_cvtepi32_ps(q), acc[p][t]);
            }
        }
    }
    for (int t = 0; t < NT; t++)
        for (int p = 0; p < 2; p++) {
            s[t * s_stride + 2 * p] = X86_FN(hsum)(_mm512_castps512_ps256(acc[p][t]));
            s[t * s_stride + 2 * p + 1] = X86_FN(hsum)(_mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(acc[p][t]), 1)));
        }
}

/* q5_0_rows4 on four tokens of Q8_0 rows, and on eight tokens of q8_0_wide rows (each weight block
 * unpacked once for all eight, the per-token steps done once per matrix by q8_0_wide). */
static X86_TARGET void X86_FN(q5_0_vec_dot4x4)(int64_t n, float *s, size_t s_stride, const void *w,
                                               size_t w_stride, const void *xq, size_t xq_stride) {
    X86_FN(q5_0_rows4)(n, s, s_stride, w, w_stride, xq, xq_stride, 4, 0);
}

static X86_TARGET void X86_FN(q5_0_vec_dot8x4)(int64_t n, float *s, size_t s_stride, const void *w,
                                               size_t w_stride, const void *xq, size_t xq_stride) {
    X86_FN(q5_0_rows4)(n, s, s_stride, w, w_stride, xq, xq_stride, 8, 1);
}

/* One Q8_0 row (n values) as q8_0_wide blocks of Q8_0_WIDE_BYTES: the eight int32 −16·Σ y over each
 * four values (q5_0_rows4's start), the 32 int8 values, and d as float. */
static X86_TARGET void X86_FN(q8_0_wide)(const void *xq, void *dst, int64_t n) {
    const blk_q8_0 *y = xq;
    uint8_t *o = dst;
    for (int64_t i = 0; i < n / 32; i++, o += Q8_0_WIDE_BYTES) {
        const __m256i yv = _mm256_loadu_si256((const __m256i *)y[i].qs);
        const __m256i start = _mm256_sub_epi32(_mm256_setzero_si256(),
                                               _mm256_dpbusd_epi32(_mm256_setzero_si256(), _mm256_set1_epi8(16), yv));
        const float d = X86_FN(h2f)(y[i].d);
        _mm256_storeu_si256((__m256i *)o, start);
        _mm256_storeu_si256((__m256i *)(o + 32), yv);
        memcpy(o + 64, &d, 4);
    }
}
#endif

/* twin: q8_0_vec_dot in ref.c (x86 order: q8_0_vec_dot in x86_body.h), four tokens */
static X86_TARGET void X86_FN(q8_0_vec_dot4)(int64_t n, float *s, size_t s_stride, const void *w,
                                             const void *xq, size_t xq_stride) {
    const blk_q8_0 *x = w;
    __m256 acc[4] = X86_ZERO4;
    for (int64_t i = 0; i < n / 32; i++) {
        const __m256i q = _mm256_loadu_si256((const __m256i *)x[i].qs);
        const __m256i ax = _mm256_sign_epi8(q, q);
        const float dx = X86_FN(h2f)(x[i].d);
        for (int t = 0; t < 4; t++) {
            const blk_q8_0 *y = X86_ACT(blk_q8_0, t, i);
            const __m256i v = _mm256_sign_epi8(_mm256_loadu_si256((const __m256i *)y->qs), q);
            const __m256 d = _mm256_set1_ps(dx * X86_FN(h2f)(y->d));
            acc[t] = _mm256_fmadd_ps(d, _mm256_cvtepi32_ps(X86_FN(dot_u8s8)(ax, v)), acc[t]);
        }
    }
    for (int t = 0; t < 4; t++) s[t * s_stride] = X86_FN(hsum)(acc[t]);
}

/* twin: q4_1_vec_dot in ref.c (x86 order: q4_1_vec_dot in x86_body.h), four tokens */
static X86_TARGET void X86_FN(q4_1_vec_dot4)(int64_t n, float *s, size_t s_stride, const void *w,
                                             const void *xq, size_t xq_stride) {
    const blk_q4_1 *x = w;
    __m256 acc[4] = X86_ZERO4;
    float summs[4] = {0, 0, 0, 0};
    for (int64_t i = 0; i < n / 32; i++) {
        const __m256i q = X86_FN(nibbles)(x[i].qs);
        const float dx = X86_FN(h2f)(x[i].d), mx = X86_FN(h2f)(x[i].m);
        for (int t = 0; t < 4; t++) {
            const blk_q8_1 *y = X86_ACT(blk_q8_1, t, i);
            const __m256i v = _mm256_loadu_si256((const __m256i *)y->qs);
            const __m256 d = _mm256_set1_ps(dx * X86_FN(h2f)(y->d));
            acc[t] = _mm256_fmadd_ps(d, _mm256_cvtepi32_ps(X86_FN(dot_u8s8)(q, v)), acc[t]);
            summs[t] += mx * X86_FN(h2f)(y->s);
        }
    }
    for (int t = 0; t < 4; t++) s[t * s_stride] = X86_FN(hsum)(acc[t]) + summs[t];
}

#if !X86_VNNI
/* Block column i of a two-row x four-token dot of rows with a minimum (Q4_1, Q5_1 in x86_q5_1_body.h): the rows'
 * codes q0, q1 (unsigned) with their d and m, the tokens' Q8_1 blocks at xq + t·xq_stride; output (k, t) keeps its
 * own accumulator and its own sum of m·s, in the one-token float order. */
static inline __attribute__((always_inline)) X86_TARGET void X86_FN(x1_step4x2)(
        __m256i q0, __m256i q1, float d0, float m0, float d1, float m1, const void *xq, size_t xq_stride, int64_t i,
        __m256 acc0[4], __m256 acc1[4], float sm0[4], float sm1[4]) {
    for (int t = 0; t < 4; t++) {
        const blk_q8_1 *y = X86_ACT(blk_q8_1, t, i);
        const __m256i v = _mm256_loadu_si256((const __m256i *)y->qs);
        const float dy = X86_FN(h2f)(y->d), sy = X86_FN(h2f)(y->s);
        acc0[t] = _mm256_fmadd_ps(_mm256_set1_ps(d0 * dy), _mm256_cvtepi32_ps(X86_FN(dot_u8s8)(q0, v)), acc0[t]);
        acc1[t] = _mm256_fmadd_ps(_mm256_set1_ps(d1 * dy), _mm256_cvtepi32_ps(X86_FN(dot_u8s8)(q1, v)), acc1[t]);
        sm0[t] += m0 * sy;
        sm1[t] += m1 * sy;
    }
}

/* s[t·s_stride + k] of x1_step4x2's sums. */
static inline __attribute__((always_inline)) X86_TARGET void X86_FN(x1_store4x2)(
        float *s, size_t s_stride, const __m256 acc0[4], const __m256 acc1[4], const float sm0[4], const float sm1[4]) {
    for (int t = 0; t < 4; t++) {
        s[t * s_stride] = X86_FN(hsum)(acc0[t]) + sm0[t];
        s[t * s_stride + 1] = X86_FN(hsum)(acc1[t]) + sm1[t];
    }
}

/* twin: q4_1_vec_dot in ref.c (x86 order: q4_1_vec_dot in x86_body.h), two rows x four tokens (AVX2): each
 * activation block and its two scales are loaded and converted once for both rows; output (k, t) keeps its own
 * accumulator, its own sum of m·s and the one-token float order. */
static X86_TARGET void X86_FN(q4_1_vec_dot4x2)(int64_t n, float *s, size_t s_stride, const void *w,
                                               size_t w_stride, const void *xq, size_t xq_stride) {
    const blk_q4_1 *x0 = w, *x1 = (const blk_q4_1 *)((const uint8_t *)w + w_stride);
    __m256 acc0[4] = X86_ZERO4, acc1[4] = X86_ZERO4;
    float sm0[4] = {0, 0, 0, 0}, sm1[4] = {0, 0, 0, 0};
    for (int64_t i = 0; i < n / 32; i++) {
        const __m256i q0 = X86_FN(nibbles)(x0[i].qs), q1 = X86_FN(nibbles)(x1[i].qs);
        const float d0 = X86_FN(h2f)(x0[i].d), m0 = X86_FN(h2f)(x0[i].m);
        const float d1 = X86_FN(h2f)(x1[i].d), m1 = X86_FN(h2f)(x1[i].m);
        X86_FN(x1_step4x2)(q0, q1, d0, m0, d1, m1, xq, xq_stride, i, acc0, acc1, sm0, sm1);
    }
    X86_FN(x1_store4x2)(s, s_stride, acc0, acc1, sm0, sm1);
}
#endif

/* twin: q4_K_gemm_dot in ref_k.h, NT (4 or 8) tokens at once: the weight block is unpacked once, and
 * each token's FMA chain runs in one lane of a 4-float vector per group of four tokens (lane t: the same
 * operations, same order). */
static inline __attribute__((always_inline)) X86_TARGET void X86_FN(q4_K_gemm_rows)(
        int64_t n, float *s, size_t s_stride, const void *w, const void *xq, size_t xq_stride, const int NT) {
    const blk_q4_K *x = w;
    const __m256i m4 = _mm256_set1_epi8(0x0F);
    __m128 acc[2] = {_mm_setzero_ps(), _mm_setzero_ps()}, accm[2] = {_mm_setzero_ps(), _mm_setzero_ps()};
    for (int64_t i = 0; i < n / QK_K; i++) {
        uint8_t sc[8], mn[8];
        for (int j = 0; j < 8; j++) pi2_k4_scale_min(j, x[i].scales, &sc[j], &mn[j]);
        const __m256i mins = _mm256_set_epi16(mn[7], mn[7], mn[6], mn[6], mn[5], mn[5], mn[4], mn[4],
                                              mn[3], mn[3], mn[2], mn[2], mn[1], mn[1], mn[0], mn[0]);
        __m256i q[8], scv[8];
        for (int c = 0; c < 4; c++) {
            const __m256i bits = _mm256_loadu_si256((const __m256i *)(x[i].qs + 32 * c));
            q[2 * c] = _mm256_and_si256(bits, m4);
            q[2 * c + 1] = _mm256_and_si256(_mm256_srli_epi16(bits, 4), m4);
        }
        for (int j = 0; j < 8; j++) scv[j] = _mm256_set1_epi16(sc[j]);
        const float xd = X86_FN(h2f)(x[i].d), xdmin = X86_FN(h2f)(x[i].dmin);
        for (int g = 0; g < NT / 4; g++) {
            __m128 fi[4], fm[4];
            float dy[4];
            for (int t = 0; t < 4; t++) {
                const blk_q8_K *y = (const blk_q8_K *)((const uint8_t *)xq + (4 * g + t) * xq_stride) + i;
                __m256i sv[4];
                for (int c = 0; c < 4; c++) {
                    const __m256i p0 = _mm256_madd_epi16(_mm256_maddubs_epi16(q[2 * c], _mm256_loadu_si256((const __m256i *)(y->qs + 64 * c))), scv[2 * c]);
                    sv[c] = X86_FN(madd_add)(p0, _mm256_maddubs_epi16(q[2 * c + 1], _mm256_loadu_si256((const __m256i *)(y->qs + 64 * c + 32))), scv[2 * c + 1]);
                }
                const __m256i h = _mm256_hadd_epi32(_mm256_hadd_epi32(sv[0], sv[1]), _mm256_hadd_epi32(sv[2], sv[3]));
                fi[t] = _mm_cvtepi32_ps(_mm_add_epi32(_mm256_castsi256_si128(h), _mm256_extracti128_si256(h, 1)));
                const __m256i mp = _mm256_madd_epi16(_mm256_loadu_si256((const __m256i *)y->bsums), mins);
                const __m256i mh = _mm256_hadd_epi32(mp, mp);
                fm[t] = _mm_cvtepi32_ps(_mm_unpacklo_epi64(_mm256_castsi256_si128(mh), _mm256_extracti128_si256(mh, 1)));
                dy[t] = y->d;
            }
            _MM_TRANSPOSE4_PS(fi[0], fi[1], fi[2], fi[3]);          /* fi[k] lane t: token t's 64-value sum k */
            _MM_TRANSPOSE4_PS(fm[0], fm[1], fm[2], fm[3]);
            const __m128 vy = _mm_loadu_ps(dy);
            const __m128 dd = _mm_mul_ps(vy, _mm_set1_ps(xd));
            const __m128 dm = _mm_mul_ps(vy, _mm_set1_ps(xdmin));
            for (int k = 0; k < 4; k++) {
                acc[g] = _mm_fmadd_ps(fi[k], dd, acc[g]);
                accm[g] = _mm_fmadd_ps(fm[k], dm, accm[g]);
            }
        }
    }
    for (int g = 0; g < NT / 4; g++) {
        float r[4];
        _mm_storeu_ps(r, _mm_sub_ps(acc[g], accm[g]));
        for (int t = 0; t < 4; t++) s[(4 * g + t) * s_stride] = r[t];
    }
}

static X86_TARGET void X86_FN(q4_K_gemm_dot4)(int64_t n, float *s, size_t s_stride, const void *w,
                                              const void *xq, size_t xq_stride) {
    X86_FN(q4_K_gemm_rows)(n, s, s_stride, w, xq, xq_stride, 4);
}

static X86_TARGET void X86_FN(q4_K_gemm_dot8)(int64_t n, float *s, size_t s_stride, const void *w,
                                              const void *xq, size_t xq_stride) {
    X86_FN(q4_K_gemm_rows)(n, s, s_stride, w, xq, xq_stride, 8);
}

/* twin: q6_K_tiled_dot in ref_k.h, NT (4 or 8) tokens at once (codes and scales unpacked once; token
 * t's chain in lane t % 4 of group t / 4). */
static inline __attribute__((always_inline)) X86_TARGET void X86_FN(q6_K_tiled_rows)(
        int64_t n, float *s, size_t s_stride, const void *w, const void *xq, size_t xq_stride, const int NT) {
    const blk_q6_K *x = w;
    const __m256i m4 = _mm256_set1_epi8(0x0F), m2 = _mm256_set1_epi8(3);
    __m128 acc[2] = {_mm_setzero_ps(), _mm_setzero_ps()};
    for (int64_t i = 0; i < n / QK_K; i++) {
        __m256i q[8], scv[8];
        for (int h = 0; h < 2; h++) {
            const uint8_t *ql = x[i].ql + 64 * h;
            const int8_t *sc = x[i].scales + 8 * h;
            const __m256i qh = _mm256_loadu_si256((const __m256i *)(x[i].qh + 32 * h));
            const __m256i l0 = _mm256_loadu_si256((const __m256i *)ql);
            const __m256i l1 = _mm256_loadu_si256((const __m256i *)(ql + 32));
            const __m256i lo4[4] = {_mm256_and_si256(l0, m4), _mm256_and_si256(l1, m4),
                                    _mm256_and_si256(_mm256_srli_epi16(l0, 4), m4),
                                    _mm256_and_si256(_mm256_srli_epi16(l1, 4), m4)};
            for (int k = 0; k < 4; k++) {
                const __m256i hb = _mm256_and_si256(_mm256_srli_epi16(qh, 2 * k), m2);
                q[4 * h + k] = _mm256_or_si256(lo4[k], _mm256_slli_epi16(hb, 4));
                scv[4 * h + k] = _mm256_set_m128i(_mm_set1_epi16(sc[2 * k + 1]), _mm_set1_epi16(sc[2 * k]));
            }
        }
        const __m256i scales = _mm256_cvtepi8_epi16(_mm_loadu_si128((const __m128i *)x[i].scales));
        const __m128 xd = _mm_set1_ps(X86_FN(h2f)(x[i].d));
        for (int g = 0; g < NT / 4; g++) {
            int32_t tot[4];
            float dy[4];
            for (int t = 0; t < 4; t++) {
                const blk_q8_K *y = (const blk_q8_K *)((const uint8_t *)xq + (4 * g + t) * xq_stride) + i;
                __m256i sumi = _mm256_slli_epi32(_mm256_madd_epi16(_mm256_loadu_si256((const __m256i *)y->bsums), scales), 5);
                sumi = _mm256_sub_epi32(_mm256_setzero_si256(), sumi);
                for (int c = 0; c < 8; c++)
                    sumi = X86_FN(madd_add)(sumi, _mm256_maddubs_epi16(q[c], _mm256_loadu_si256((const __m256i *)(y->qs + 32 * c))), scv[c]);
                tot[t] = X86_FN(hsum_i32)(sumi);
                dy[t] = y->d;
            }
            const __m128 r = _mm_mul_ps(_mm_cvtepi32_ps(_mm_loadu_si128((const __m128i *)tot)), xd);
            acc[g] = _mm_fmadd_ps(r, _mm_loadu_ps(dy), acc[g]);
        }
    }
    for (int g = 0; g < NT / 4; g++) {
        float r[4];
        _mm_storeu_ps(r, acc[g]);
        for (int t = 0; t < 4; t++) s[(4 * g + t) * s_stride] = r[t];
    }
}

static X86_TARGET void X86_FN(q6_K_tiled_dot4)(int64_t n, float *s, size_t s_stride, const void *w,
                                               const void *xq, size_t xq_stride) {
    X86_FN(q6_K_tiled_rows)(n, s, s_stride, w, xq, xq_stride, 4);
}

static X86_TARGET void X86_FN(q6_K_tiled_dot8)(int64_t n, float *s, size_t s_stride, const void *w,
                                               const void *xq, size_t xq_stride) {
    X86_FN(q6_K_tiled_rows)(n, s, s_stride, w, xq, xq_stride, 8);
}


#undef X86_ACT
#undef X86_ZERO4
