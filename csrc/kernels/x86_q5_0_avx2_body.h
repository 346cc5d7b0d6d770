/* x86_q5_0_avx2_body.h — Q5_0's prompt kernels on AVX2 without VNNI: four rows × four tokens (two calls of the
 * two-row kernel) and four rows × eight tokens on q8_0_wide activation rows, the one-token float order of
 * q5_0_vec_dot (x86_body.h) per output, bit for bit.
 * The eight-token kernel takes one row at a time: its 5-bit codes unsigned (q + 16, 0..31: no sign trick per
 * token), decoded once for eight tokens; a lane's int32 is Σ code·y over its four values (maddubs pairs ≤
 * 2·31·128, exact) plus the row-independent −16·Σ y that q8_0_wide stored once per matrix, which is Σ q·y exactly;
 * dy is there as a float, and per output a block costs maddubs, madd, add, cvt, mul, FMA with its operands loaded
 * from memory (8 accumulators, no spills) where the two-row kernel also signs y and converts its scale.
 * Included by x86.c in the AVX2 pass after x86_body.h and x86_tile_body.h (nibbles, bits_to_bytes, h2f, hsum,
 * q5_0_vec_dot4x2, Q8_0_WIDE_BYTES); the AVX-512 VNNI pass has its own (x86_tile_body.h). */

/* twin: q5_0_vec_dot in ref.c (x86 order: q5_0_vec_dot in x86_body.h), four rows x four tokens: rows (0, 1) and
 * (2, 3) by the two-row kernel. */
static X86_TARGET void X86_FN(q5_0_vec_dot4x4)(int64_t n, float *s, size_t s_stride, const void *w,
                                               size_t w_stride, const void *xq, size_t xq_stride) {
    X86_FN(q5_0_vec_dot4x2)(n, s, s_stride, w, w_stride, xq, xq_stride);
    X86_FN(q5_0_vec_dot4x2)(n, s + 2, s_stride, (const uint8_t *)w + 2 * w_stride, w_stride, xq, xq_stride);
}

/* twin: q5_0_vec_dot in ref.c (x86 order: q5_0_vec_dot in x86_body.h), four rows x eight tokens of q8_0_wide
 * rows (xq, xq_stride): out (k, t) at s[t·s_stride + k], one row at a time. */
static X86_TARGET void X86_FN(q5_0_vec_dot8x4)(int64_t n, float *s, size_t s_stride, const void *w,
                                               size_t w_stride, const void *xq, size_t xq_stride) {
    const __m256i ones = _mm256_set1_epi16(1), m10 = _mm256_set1_epi8(0x10);
    for (int k = 0; k < 4; k++) {
        const blk_q5_0 *x = (const blk_q5_0 *)((const uint8_t *)w + k * w_stride);
        __m256 acc[8];
        for (int t = 0; t < 8; t++) acc[t] = _mm256_setzero_ps();
        for (int64_t i = 0; i < n / 32; i++) {
            const __m256i c = _mm256_or_si256(X86_FN(nibbles)(x[i].qs), _mm256_and_si256(X86_FN(bits_to_bytes)(x[i].qh), m10));
            const __m256 dx = _mm256_set1_ps(X86_FN(h2f)(x[i].d));
            for (int t = 0; t < 8; t++) {
                const uint8_t *yb = (const uint8_t *)xq + t * xq_stride + i * Q8_0_WIDE_BYTES;
                const __m256i p = _mm256_madd_epi16(_mm256_maddubs_epi16(c, _mm256_loadu_si256((const __m256i *)(yb + 32))), ones);
                const __m256i lane = _mm256_add_epi32(p, _mm256_loadu_si256((const __m256i *)yb));
                const __m256 d = _mm256_mul_ps(dx, _mm256_broadcast_ss((const float *)(yb + 64)));   /* dx·dy */
                acc[t] = _mm256_fmadd_ps(d, _mm256_cvtepi32_ps(lane), acc[t]);
            }
        }
        for (int t = 0; t < 8; t++) s[t * s_stride + k] = X86_FN(hsum)(acc[t]);
    }
}

/* One Q8_0 row (n values) as q8_0_wide blocks of Q8_0_WIDE_BYTES: the eight int32 −16·Σ y over each four values
 * (q5_0_vec_dot8x4's start), the 32 int8 values, and d as float; the bytes of the VNNI pass's q8_0_wide. */
static X86_TARGET void X86_FN(q8_0_wide)(const void *xq, void *dst, int64_t n) {
    const blk_q8_0 *y = xq;
    uint8_t *o = dst;
    for (int64_t i = 0; i < n / 32; i++, o += Q8_0_WIDE_BYTES) {
        const __m256i yv = _mm256_loadu_si256((const __m256i *)y[i].qs);
        const __m256i s16 = _mm256_madd_epi16(_mm256_maddubs_epi16(_mm256_set1_epi8(16), yv), _mm256_set1_epi16(1));
        const __m256i start = _mm256_sub_epi32(_mm256_setzero_si256(), s16);
        const float d = X86_FN(h2f)(y[i].d);
        _mm256_storeu_si256((__m256i *)o, start);
        _mm256_storeu_si256((__m256i *)(o + 32), yv);
        memcpy(o + 64, &d, 4);
    }
}
