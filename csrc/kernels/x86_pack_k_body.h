/* x86_pack_k_body.h — the kernels of the K-quants' x8 layout (pack_k.c): lanes are rows. A 32-byte load of a
 * 4-byte unit holds 4 codes of each of the 8 rows; the activation's 4 matching bytes are broadcast; the exact
 * integer sums then land in lane r for row r, and the float steps run on 8 rows at once with no horizontal sums.
 * Each kernel's outputs are bit for bit those of the plain kernels of the same table on the unpacked rows:
 *   q4_K_dot_pack   one token, the GEMV order (q4_K_vec_dot in ref_k.h), 8 rows per call;
 *   q4_K_gemm_pack  up to four tokens, the GEMM order (q4_K_gemm_dot), 8 rows;
 *   q6_K_dot_pack   one token, vec_dot_q6_K_q8_K's order (q6_K_vec_dot: 8 int lanes per row, kept as 8
 *                   vectors of 8 rows, the same hsum tree lane-wise);
 *   q6_K_tiled_pack up to four tokens, the tiled order (q6_K_tiled_dot).
 * Included by x86.c in the AVX2 pass (maddubs + madd) and the AVX-512 VNNI pass (vpdpbusd / vpdpwssd, ymm).
 * Needs: X86_TARGET, X86_FN, X86_VNNI. */

#define PKK_Q4K_COL (8 * 144)   /* bytes of one block column of a Q4_K group: d, dmin, scales at 32, qs at 128 */
#define PKK_Q6K_COL (8 * 210)   /* Q6_K: d at 0, scales at 16, then per (c, h) at 144 + 96·(2c + h): ql, ql, qh */

/* Prefetch the block column two columns ahead (the next group's when this one ends: groups are contiguous).
 * A Q4_K column's fields are read out of order, which the hardware stream prefetchers follow poorly (Q6_K's
 * units are stored in read order: one forward stream, no software prefetch). */
#define PKK_PREFETCH(b, col) \
    do { for (int o_ = 0; o_ < (col); o_ += 64) _mm_prefetch((const char *)(b) + 2 * (col) + o_, _MM_HINT_T0); } while (0)

#ifndef PKK_LD32
#define PKK_LD32
static inline int32_t pkk_ld32(const void *p) { int32_t v; memcpy(&v, p, 4); return v; }
#endif

/* acc + per lane p.lo·s.lo + p.hi·s.hi of int16 pairs (exact). */
static inline X86_TARGET __m256i X86_FN(pkk_wsum)(__m256i acc, __m256i p, __m256i s) {
#if X86_VNNI
    return _mm256_dpwssd_epi32(acc, p, s);
#else
    return _mm256_add_epi32(acc, _mm256_madd_epi16(p, s));
#endif
}

/* pshufb control taking byte j of each 32-bit lane to byte `at` of that lane, the other bytes 0 (at < 0: the
 * byte to bytes 0 and 2, an int16 pair). */
static inline X86_TARGET __m256i X86_FN(pkk_pick)(int j, int at) {
    uint8_t c[32];
    for (int l = 0; l < 8; l++)
        for (int b = 0; b < 4; b++)
            c[4 * l + b] = at < 0 ? (b == 1 || b == 3 ? 0x80 : (uint8_t)(4 * (l % 4) + j))
                                  : b == at ? (uint8_t)(4 * (l % 4) + j) : 0x80;
    return _mm256_loadu_si256((const __m256i *)c);
}

/* The 6-bit scales and mins of eight packed K-quant rows (Q4_K, Q5_K: 12 bytes per row at b + 32, interleaved),
 * one byte per sub-block: sm[0] scales of sub-blocks 0-3, sm[1] of 4-7, sm[2] mins of 0-3, sm[3] of 4-7. */
static inline __attribute__((always_inline)) X86_TARGET void X86_FN(pkk_scales_mins)(const uint8_t *b, __m256i sm[4]) {
    const __m256i m4 = _mm256_set1_epi8(0x0F), m3f = _mm256_set1_epi8(0x3F), m30 = _mm256_set1_epi8(0x30);
    const __m256i u0 = _mm256_loadu_si256((const __m256i *)(b + 32)), u1 = _mm256_loadu_si256((const __m256i *)(b + 64)),
                  u2 = _mm256_loadu_si256((const __m256i *)(b + 96));
    sm[0] = _mm256_and_si256(u0, m3f);
    sm[1] = _mm256_or_si256(_mm256_and_si256(u2, m4), _mm256_and_si256(_mm256_srli_epi32(u0, 2), m30));
    sm[2] = _mm256_and_si256(u1, m3f);
    sm[3] = _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi32(u2, 4), m4), _mm256_and_si256(_mm256_srli_epi32(u1, 2), m30));
}

/* Q4_K, NT tokens, 8 rows: the GEMM order (GEMM) or the GEMV order. */
static inline __attribute__((always_inline)) X86_TARGET void X86_FN(q4_K_pack_rows)(
        int64_t n, float *s, size_t s_stride, const uint8_t *g, const void *xq, size_t xq_stride, const int NT,
        const int GEMM) {
    const __m256i m4 = _mm256_set1_epi8(0x0F);
    __m256i pick[4], pair[2];
    for (int j = 0; j < 4; j++) pick[j] = X86_FN(pkk_pick)(j, X86_VNNI ? 0 : -1);
    for (int k = 0; k < 2; k++) {   /* bytes 2k, 2k+1 of a lane -> int16 pair */
        uint8_t c[32];
        for (int l = 0; l < 8; l++) {
            c[4 * l] = (uint8_t)(4 * (l % 4) + 2 * k); c[4 * l + 1] = 0x80;
            c[4 * l + 2] = (uint8_t)(4 * (l % 4) + 2 * k + 1); c[4 * l + 3] = 0x80;
        }
        pair[k] = _mm256_loadu_si256((const __m256i *)c);
    }
    __m256 acc[4], accm[4];
    for (int t = 0; t < NT; t++) acc[t] = accm[t] = _mm256_setzero_ps();
    for (int64_t i = 0; i < n / QK_K; i++) {
        const uint8_t *b = g + (size_t)i * PKK_Q4K_COL;
        PKK_PREFETCH(b, PKK_Q4K_COL);
        __m256i sm[4];
        X86_FN(pkk_scales_mins)(b, sm);
        const __m256i s_lo = sm[0], s_hi = sm[1], m_lo = sm[2], m_hi = sm[3];
        __m256i sc[8], mp[4];   /* VNNI: scale as an int32 per lane; AVX2: as an int16 pair */
        for (int j = 0; j < 4; j++) {
            sc[j] = _mm256_shuffle_epi8(s_lo, pick[j]);
            sc[j + 4] = _mm256_shuffle_epi8(s_hi, pick[j]);
        }
        mp[0] = _mm256_shuffle_epi8(m_lo, pair[0]); mp[1] = _mm256_shuffle_epi8(m_lo, pair[1]);
        mp[2] = _mm256_shuffle_epi8(m_hi, pair[0]); mp[3] = _mm256_shuffle_epi8(m_hi, pair[1]);
        const __m256 xd = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)b));
        const __m256 xm = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(b + 16)));
        const blk_q8_K *y[4];
        __m256 dd[4], dm[4];
        __m256i isum[4], msum[4];
        for (int t = 0; t < NT; t++) {
            y[t] = (const blk_q8_K *)((const uint8_t *)xq + (size_t)t * xq_stride) + i;
            dd[t] = _mm256_mul_ps(_mm256_set1_ps(y[t]->d), xd);
            dm[t] = _mm256_mul_ps(_mm256_set1_ps(y[t]->d), xm);
            isum[t] = msum[t] = _mm256_setzero_si256();
        }
        for (int k = 0; k < 4; k++) {
            __m256i lo[4], hi[4];
            for (int t = 0; t < NT; t++) lo[t] = hi[t] = _mm256_setzero_si256();
            for (int c = 0; c < 8; c++) {
                const __m256i w = _mm256_loadu_si256((const __m256i *)(b + 128 + 32 * (8 * k + c)));
                const __m256i wl = _mm256_and_si256(w, m4), wh = _mm256_and_si256(_mm256_srli_epi16(w, 4), m4);
                for (int t = 0; t < NT; t++) {
                    const __m256i y0 = _mm256_set1_epi32(pkk_ld32(y[t]->qs + 64 * k + 4 * c));
                    const __m256i y1 = _mm256_set1_epi32(pkk_ld32(y[t]->qs + 64 * k + 32 + 4 * c));
#if X86_VNNI
                    lo[t] = _mm256_dpbusd_epi32(lo[t], wl, y0);
                    hi[t] = _mm256_dpbusd_epi32(hi[t], wh, y1);
#else   /* the sub-block's pair sums in int16: |Σ| ≤ 8·2·15·128 < 2^15, exact; one madd by the scale after */
                    lo[t] = _mm256_add_epi16(lo[t], _mm256_maddubs_epi16(wl, y0));
                    hi[t] = _mm256_add_epi16(hi[t], _mm256_maddubs_epi16(wh, y1));
#endif
                }
            }
            for (int t = 0; t < NT; t++) {
#if X86_VNNI
                const __m256i is = _mm256_add_epi32(_mm256_mullo_epi32(lo[t], sc[2 * k]), _mm256_mullo_epi32(hi[t], sc[2 * k + 1]));
#else
                const __m256i is = _mm256_add_epi32(_mm256_madd_epi16(lo[t], sc[2 * k]), _mm256_madd_epi16(hi[t], sc[2 * k + 1]));
#endif
                const int16_t *bs = y[t]->bsums + 4 * k;
                const uint32_t bp = (uint16_t)(int16_t)(bs[0] + bs[1]) | (uint32_t)(uint16_t)(int16_t)(bs[2] + bs[3]) << 16;
                const __m256i ms = _mm256_madd_epi16(mp[k], _mm256_set1_epi32((int32_t)bp));
                if (GEMM) {
                    acc[t] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(is), dd[t], acc[t]);
                    accm[t] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(ms), dm[t], accm[t]);
                } else {
                    isum[t] = _mm256_add_epi32(isum[t], is);
                    msum[t] = _mm256_add_epi32(msum[t], ms);
                }
            }
        }
        if (!GEMM)
            for (int t = 0; t < NT; t++) {
                acc[t] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(isum[t]), dd[t], acc[t]);
                accm[t] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(msum[t]), dm[t], accm[t]);
            }
    }
    for (int t = 0; t < NT; t++) _mm256_storeu_ps(s + (size_t)t * s_stride, _mm256_sub_ps(acc[t], accm[t]));
}

/* twin: q4_K_vec_dot (ref_k.h) of each of the 8 rows */
static X86_TARGET void X86_FN(q4_K_dot_pack)(int64_t n, float *s, const void *grp, const void *xq) {
    X86_FN(q4_K_pack_rows)(n, s, 0, grp, xq, 0, 1, 0);
}

/* twin: q4_K_gemm_dot (ref_k.h), 8 rows x 4 tokens: s[t·s_stride + r] */
static X86_TARGET void X86_FN(q4_K_gemm_pack)(int64_t n, float *s, size_t s_stride, const void *grp, const void *xq,
                                              size_t xq_stride, int32_t n_tok) {
    if (n_tok == 4) X86_FN(q4_K_pack_rows)(n, s, s_stride, grp, xq, xq_stride, 4, 1);
    else
        for (int32_t t = 0; t < n_tok; t++)
            X86_FN(q4_K_pack_rows)(n, s + (size_t)t * s_stride, 0, grp, (const uint8_t *)xq + (size_t)t * xq_stride, 0, 1, 1);
}

/* Q6_K, NT tokens, 8 rows: the tiled order (TILED) or vec_dot_q6_K_q8_K's. Each unit's codes (u8, 0..63)
 * times y by maddubs (pairs ≤ 2·63·128, exact in int16), then times the sub-block's scale as an int16 pair. */
static inline __attribute__((always_inline)) X86_TARGET void X86_FN(q6_K_pack_rows)(
        int64_t n, float *s, size_t s_stride, const uint8_t *g, const void *xq, size_t xq_stride, const int NT,
        const int TILED) {
    const __m256i m4 = _mm256_set1_epi8(0x0F), m30 = _mm256_set1_epi8(0x30);
    __m256i pick16[4];   /* byte j of a lane -> the high byte of both int16 halves */
    for (int j = 0; j < 4; j++) {
        uint8_t c[32];
        for (int l = 0; l < 8; l++) {
            c[4 * l] = c[4 * l + 2] = 0x80;
            c[4 * l + 1] = c[4 * l + 3] = (uint8_t)(4 * (l % 4) + j);
        }
        pick16[j] = _mm256_loadu_si256((const __m256i *)c);
    }
    __m256 acc[4], accv[8];
    for (int t = 0; t < NT; t++) acc[t] = _mm256_setzero_ps();
    for (int m = 0; m < 8; m++) accv[m] = _mm256_setzero_ps();
    for (int64_t i = 0; i < n / QK_K; i++) {
        const uint8_t *b = g + (size_t)i * PKK_Q6K_COL;
        __m256i sc[16];   /* sub-block scale, sign-extended, as an int16 pair per lane */
        for (int a = 0; a < 4; a++) {
            const __m256i u = _mm256_loadu_si256((const __m256i *)(b + 16 + 32 * a));
            for (int j = 0; j < 4; j++) sc[4 * a + j] = _mm256_srai_epi16(_mm256_shuffle_epi8(u, pick16[j]), 8);
        }
        const __m256 xd = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)b));
        const blk_q8_K *y[4];
        __m256i isum[4][2], lane[8];   /* two partial sums per token (by h): shorter dependency chains */
        for (int t = 0; t < NT; t++) {
            y[t] = (const blk_q8_K *)((const uint8_t *)xq + (size_t)t * xq_stride) + i;
            __m256i off = _mm256_setzero_si256();   /* Σ scale·bsum per row */
            for (int m = 0; m < 8; m++) {
                const int16_t *bs = y[t]->bsums + 2 * m;
                const uint32_t bp = (uint16_t)bs[0] | (uint32_t)(uint16_t)bs[1] << 16;
                const __m256i sp = _mm256_blend_epi16(sc[2 * m], sc[2 * m + 1], 0xAA);   /* (sc[2m], sc[2m+1]) */
                const __m256i o = _mm256_madd_epi16(sp, _mm256_set1_epi32((int32_t)bp));
                if (TILED) off = _mm256_add_epi32(off, o);
                else lane[m] = _mm256_sub_epi32(_mm256_setzero_si256(), _mm256_slli_epi32(o, 5));
            }
            if (TILED) {
                isum[t][0] = _mm256_sub_epi32(_mm256_setzero_si256(), _mm256_slli_epi32(off, 5));
                isum[t][1] = _mm256_setzero_si256();
            }
        }
        const __m256 dd = _mm256_mul_ps(_mm256_set1_ps(y[0]->d), xd);
        for (int c = 0; c < 8; c++) {
            __m256i part[2] = {_mm256_setzero_si256(), _mm256_setzero_si256()};
            for (int h = 0; h < 2; h++) {
                const uint8_t *u = b + 144 + 96 * (2 * c + h);
                const __m256i l0 = _mm256_loadu_si256((const __m256i *)u);
                const __m256i l1 = _mm256_loadu_si256((const __m256i *)(u + 32));
                const __m256i qh = _mm256_loadu_si256((const __m256i *)(u + 64));
                const __m256i q[4] = {
                    _mm256_or_si256(_mm256_and_si256(l0, m4), _mm256_and_si256(_mm256_slli_epi16(qh, 4), m30)),
                    _mm256_or_si256(_mm256_and_si256(l1, m4), _mm256_and_si256(_mm256_slli_epi16(qh, 2), m30)),
                    _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(l0, 4), m4), _mm256_and_si256(qh, m30)),
                    _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(l1, 4), m4), _mm256_and_si256(_mm256_srli_epi16(qh, 2), m30))};
                for (int k = 0; k < 4; k++) {
                    const __m256i scv = sc[8 * h + 2 * k + (c >= 4)];
                    for (int t = 0; t < NT; t++) {
                        const __m256i yv = _mm256_set1_epi32(pkk_ld32(y[t]->qs + 128 * h + 32 * k + 4 * c));
                        const __m256i p = _mm256_maddubs_epi16(q[k], yv);
                        if (TILED) isum[t][h] = X86_FN(pkk_wsum)(isum[t][h], p, scv);
                        else part[h] = X86_FN(pkk_wsum)(part[h], p, scv);
                    }
                }
            }
            if (!TILED) {   /* lane c of every row for this block: exact, then its float step */
                const __m256i l = _mm256_add_epi32(lane[c], _mm256_add_epi32(part[0], part[1]));
                accv[c] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(l), dd, accv[c]);
            }
        }
        if (TILED)
            for (int t = 0; t < NT; t++) {
                const __m256i is = _mm256_add_epi32(isum[t][0], isum[t][1]);
                acc[t] = _mm256_fmadd_ps(_mm256_mul_ps(_mm256_cvtepi32_ps(is), xd), _mm256_set1_ps(y[t]->d), acc[t]);
            }
    }
    if (TILED)
        for (int t = 0; t < NT; t++) _mm256_storeu_ps(s + (size_t)t * s_stride, acc[t]);
    else {   /* hsum_float_8 lane-wise: r[m] = a[m+4] + a[m]; (r0 + r2) + (r1 + r3) */
        __m256 r[4];
        for (int m = 0; m < 4; m++) r[m] = _mm256_add_ps(accv[m + 4], accv[m]);
        _mm256_storeu_ps(s, _mm256_add_ps(_mm256_add_ps(r[0], r[2]), _mm256_add_ps(r[1], r[3])));
    }
}

/* twin: q6_K_vec_dot (ref_k.h) of each of the 8 rows */
static X86_TARGET void X86_FN(q6_K_dot_pack)(int64_t n, float *s, const void *grp, const void *xq) {
    X86_FN(q6_K_pack_rows)(n, s, 0, grp, xq, 0, 1, 0);
}

/* twin: q6_K_tiled_dot (ref_k.h), 8 rows x any number of tokens (four per pass): s[t·s_stride + r] */
static X86_TARGET void X86_FN(q6_K_tiled_pack)(int64_t n, float *s, size_t s_stride, const void *grp, const void *xq,
                                               size_t xq_stride, int32_t n_tok) {
    int32_t t = 0;
    for (; t + 4 <= n_tok; t += 4)
        X86_FN(q6_K_pack_rows)(n, s + (size_t)t * s_stride, s_stride, grp, (const uint8_t *)xq + (size_t)t * xq_stride,
                               xq_stride, 4, 1);
    for (; t < n_tok; t++)
        X86_FN(q6_K_pack_rows)(n, s + (size_t)t * s_stride, 0, grp, (const uint8_t *)xq + (size_t)t * xq_stride, 0, 1, 1);
}
