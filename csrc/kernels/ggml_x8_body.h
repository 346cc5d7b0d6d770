/* ggml_x8_body.h — the body of one x8 Q4_0 kernel (ggml_x8.c includes it once per instruction set).
 * Needs: X8_FN (its name), X8_TARGET, X8_DOT(acc, weights, y) adding 4-byte groups of u8 × s8 into int32 lanes,
 * X8_ZMM (1: the eight rows' double accumulators in one 512-bit register).
 * A group's column b: d[8] (fp16), then qs[8][16]; rows 2p and 2p+1 share one 256-bit load [row 2p | row 2p+1].
 * The body is instantiated for 1..4 activation rows (NT a constant): the accumulators stay in registers.
 * The float steps: acc = float(isum·scale + acc), the product exact in double (|isum| < 2^15, scale a float), so
 * one double FMA is the double product then sum, rounded to float once. */

#define X8_CAT2(a, b) a##b
#define X8_CAT(a, b) X8_CAT2(a, b)
#define X8_BODY X8_CAT(X8_FN, _nt)

static inline __attribute__((always_inline)) X8_TARGET void X8_BODY(int64_t n, const uint8_t *g, int64_t n_groups,
                                                                    const int32_t NT, const blk_q8_0 *const *x,
                                                                    float *const *s) {
    const int64_t nb = n / 32;
    const __m256i m4 = _mm256_set1_epi8(0xF);
    const __m256i order = _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7);
    /* 8 · Σ y of every block of every activation row: the nibbles' offset, taken off once per block */
    int32_t ys[PI2_X8_MAX_TOK][PI2_X8_MAX_BLOCKS];
    for (int32_t t = 0; t < NT; t++)
        for (int64_t b = 0; b < nb; b++) {
            int32_t sum = 0;
            for (int i = 0; i < 32; i++) sum += x[t][b].qs[i];
            ys[t][b] = 8 * sum;
        }
    for (int64_t gi = 0; gi < n_groups; gi++) {
        const uint8_t *grp = g + (size_t)gi * (size_t)nb * 8 * sizeof(blk_q4_0);
#if X8_ZMM
        __m512d acc[PI2_X8_MAX_TOK];
        for (int32_t t = 0; t < NT; t++) acc[t] = _mm512_setzero_pd();
#else
        __m256d acc_lo[PI2_X8_MAX_TOK], acc_hi[PI2_X8_MAX_TOK];
        for (int32_t t = 0; t < NT; t++) acc_lo[t] = acc_hi[t] = _mm256_setzero_pd();
#endif
        for (int64_t b = 0; b < nb; b++) {
            const uint8_t *col = grp + (size_t)b * 8 * sizeof(blk_q4_0);
            __m256i lo[4], hi[4];
            for (int p = 0; p < 4; p++) {
                const __m256i q = _mm256_loadu_si256((const __m256i *)(col + 16 + 32 * p));
                lo[p] = _mm256_and_si256(q, m4);
                hi[p] = _mm256_and_si256(_mm256_srli_epi16(q, 4), m4);
            }
            const __m256 dw = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)col));
            for (int32_t t = 0; t < NT; t++) {
                const blk_q8_0 *xb = x[t] + b;
                const __m256i ylo = _mm256_broadcastsi128_si256(_mm_loadu_si128((const __m128i *)xb->qs));
                const __m256i yhi = _mm256_broadcastsi128_si256(_mm_loadu_si128((const __m128i *)(xb->qs + 16)));
                __m256i a[4];
                for (int p = 0; p < 4; p++) {
                    a[p] = _mm256_setzero_si256();
                    X8_DOT(a[p], lo[p], ylo);
                    X8_DOT(a[p], hi[p], yhi);
                }
                const __m256i h = _mm256_hadd_epi32(_mm256_hadd_epi32(a[0], a[1]), _mm256_hadd_epi32(a[2], a[3]));
                const __m256i tot = _mm256_permutevar8x32_epi32(h, order);   /* [r0 r2 r4 r6 | r1 r3 r5 r7] */
                const __m256 isum = _mm256_cvtepi32_ps(_mm256_sub_epi32(tot, _mm256_set1_epi32(ys[t][b])));
                const __m256 scale = _mm256_mul_ps(dw, _mm256_set1_ps(_cvtsh_ss(xb->d)));
#if X8_ZMM
                const __m512d sum = _mm512_fmadd_pd(_mm512_cvtps_pd(isum), _mm512_cvtps_pd(scale), acc[t]);
                acc[t] = _mm512_cvtps_pd(_mm512_cvtpd_ps(sum));   /* rounded to float every block */
#else
                const __m256d i_lo = _mm256_cvtps_pd(_mm256_castps256_ps128(isum));
                const __m256d i_hi = _mm256_cvtps_pd(_mm256_extractf128_ps(isum, 1));
                const __m256d s_lo = _mm256_cvtps_pd(_mm256_castps256_ps128(scale));
                const __m256d s_hi = _mm256_cvtps_pd(_mm256_extractf128_ps(scale, 1));
                acc_lo[t] = _mm256_cvtps_pd(_mm256_cvtpd_ps(_mm256_fmadd_pd(i_lo, s_lo, acc_lo[t])));
                acc_hi[t] = _mm256_cvtps_pd(_mm256_cvtpd_ps(_mm256_fmadd_pd(i_hi, s_hi, acc_hi[t])));
#endif
            }
        }
        for (int32_t t = 0; t < NT; t++) {
#if X8_ZMM
            _mm256_storeu_ps(s[t] + 8 * gi, _mm512_cvtpd_ps(acc[t]));
#else
            _mm_storeu_ps(s[t] + 8 * gi, _mm256_cvtpd_ps(acc_lo[t]));
            _mm_storeu_ps(s[t] + 8 * gi + 4, _mm256_cvtpd_ps(acc_hi[t]));
#endif
        }
    }
}

static X8_TARGET void X8_FN(int64_t n, const uint8_t *g, int64_t n_groups, int32_t n_tok, const blk_q8_0 *const *x,
                            float *const *s) {
    switch (n_tok) {
    case 1: X8_BODY(n, g, n_groups, 1, x, s); break;
    case 2: X8_BODY(n, g, n_groups, 2, x, s); break;
    case 3: X8_BODY(n, g, n_groups, 3, x, s); break;
    default: X8_BODY(n, g, n_groups, 4, x, s); break;
    }
}

#undef X8_BODY
#undef X8_CAT
#undef X8_CAT2
