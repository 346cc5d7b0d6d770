/* x86_q5k_body.h — the Q5_K kernels: on plain rows and on the x8 layout (pack_k.c), in ggml's two float orders.
 * Q5_K has no CPU_REPACK layout on x86 in ggml: fewer than 8 tokens run ggml_vec_dot_q5_K_q8_K (8 int lanes by
 * value index mod 32 / 4, a float FMA chain per lane, hsum_float_8, plus a mins chain), 8 or more its tiled kernel
 * (one exact int sum per block and row, then two float steps). The integer sums are exact whatever their order, so
 * each kernel is bit for bit its ref.c twin:
 *   q5_K_vec_dot / q5_K_tiled_dot     one plain row (twins q5_K_vec_dot, q5_K_tiled_dot in ref.c);
 *   q5_K_dot_pack                     one token, 8 packed rows, vec_dot's order (lanes are rows, the 8 value
 *                                     lanes kept as 8 vectors of 8 rows, the same hsum tree lane-wise);
 *   q5_K_tiled_pack                   up to eight tokens (four per pass on AVX2), 8 packed rows, the tiled order.
 * Codes are u5 (the 5th bit from qh moved to bit 4); maddubs pairs them with the s8 activations (|pair| ≤
 * 2·31·128, exact in int16) and an int16 pair madd (vpdpwssd with VNNI) multiplies by the sub-block's scale.
 * Included by x86.c in the AVX2 pass and the AVX-512 VNNI pass (ymm). Needs: X86_TARGET, X86_FN, X86_VNNI, and
 * pkk_ld32 / pkk_wsum / pkk_pick of x86_pack_k_body.h (included before this file). */

/* Packed column: d at 0, dmin at 16, scales at 32 (3 units), then per c in 0..7 at 128 + 160c: qh unit c and the
 * qs units 8k + c (k = 0..3); unit c holds the codes of values 4c..4c+3 of every sub-block. */
#define PKK_Q5K_COL (8 * 176)
/* Unrolled fully: the sub-block index must be a constant (the 5th bit's shift) and the per-token registers must
 * not rotate through copies. */
#define Q5K_UNROLL _Pragma("GCC unroll 8")

/* Bit j of every byte of qh moved to bit 4 (the 5th bit of sub-block j's code), the other bits 0. */
static inline X86_TARGET __m256i X86_FN(q5k_hbit)(__m256i qh, int j) {
    const __m256i m10 = _mm256_set1_epi8(0x10);
    if (j <= 4) return _mm256_and_si256(_mm256_slli_epi16(qh, 4 - j), m10);
    return _mm256_and_si256(_mm256_srli_epi16(qh, j - 4), m10);
}

/* Q5_K, NT tokens, 8 packed rows: the tiled order (TILED) or vec_dot's. */
static inline __attribute__((always_inline)) X86_TARGET void X86_FN(q5_K_pack_rows)(
        int64_t n, float *s, size_t s_stride, const uint8_t *g, const void *xq, size_t xq_stride, const int NT,
        const int TILED) {
    const __m256i m4 = _mm256_set1_epi8(0x0F);
    __m256i pick[4], pair[2];
    for (int j = 0; j < 4; j++) pick[j] = X86_FN(pkk_pick)(j, -1);   /* scale byte j -> an int16 pair */
    for (int k = 0; k < 2; k++) {   /* bytes 2k, 2k+1 of a lane -> int16 pair */
        uint8_t c[32];
        for (int l = 0; l < 8; l++) {
            c[4 * l] = (uint8_t)(4 * (l % 4) + 2 * k); c[4 * l + 1] = 0x80;
            c[4 * l + 2] = (uint8_t)(4 * (l % 4) + 2 * k + 1); c[4 * l + 3] = 0x80;
        }
        pair[k] = _mm256_loadu_si256((const __m256i *)c);
    }
    __m256 acc[4], accv[8], summs = _mm256_setzero_ps();
    for (int t = 0; t < NT; t++) acc[t] = _mm256_setzero_ps();
    for (int m = 0; m < 8; m++) accv[m] = _mm256_setzero_ps();
    for (int64_t i = 0; i < n / QK_K; i++) {
        const uint8_t *b = g + (size_t)i * PKK_Q5K_COL;
        __m256i sm[4];
        X86_FN(pkk_scales_mins)(b, sm);
        const __m256i s_lo = sm[0], s_hi = sm[1], m_lo = sm[2], m_hi = sm[3];
        __m256i sc[8], mp[4];
        for (int j = 0; j < 4; j++) {
            sc[j] = _mm256_shuffle_epi8(s_lo, pick[j]);
            sc[j + 4] = _mm256_shuffle_epi8(s_hi, pick[j]);
        }
        mp[0] = _mm256_shuffle_epi8(m_lo, pair[0]); mp[1] = _mm256_shuffle_epi8(m_lo, pair[1]);
        mp[2] = _mm256_shuffle_epi8(m_hi, pair[0]); mp[3] = _mm256_shuffle_epi8(m_hi, pair[1]);
        const __m256 xd = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)b));
        const __m256 xm = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(b + 16)));
        const blk_q8_K *y[4];
        __m256i hs[4], isum[4][2];   /* Σ mn·bsum per row; Σ sc·Σ code·q8 (two chains per token, by k parity) */
        for (int t = 0; t < NT; t++) {
            y[t] = (const blk_q8_K *)((const uint8_t *)xq + (size_t)t * xq_stride) + i;
            hs[t] = _mm256_setzero_si256();
            for (int k = 0; k < 4; k++) {
                const int16_t *bs = y[t]->bsums + 4 * k;
                const uint32_t bp = (uint16_t)(int16_t)(bs[0] + bs[1]) | (uint32_t)(uint16_t)(int16_t)(bs[2] + bs[3]) << 16;
                hs[t] = X86_FN(pkk_wsum)(hs[t], mp[k], _mm256_set1_epi32((int32_t)bp));
            }
            isum[t][0] = isum[t][1] = _mm256_setzero_si256();
        }
        const __m256 dd = _mm256_mul_ps(_mm256_set1_ps(y[0]->d), xd);
        Q5K_UNROLL
        for (int c = 0; c < 8; c++) {
            const uint8_t *u = b + 128 + 160 * c;
            const __m256i qh = _mm256_loadu_si256((const __m256i *)u);
            __m256i part[2] = {_mm256_setzero_si256(), _mm256_setzero_si256()};
            Q5K_UNROLL
            for (int k = 0; k < 4; k++) {
                const __m256i w = _mm256_loadu_si256((const __m256i *)(u + 32 + 32 * k));
                const __m256i q[2] = {_mm256_or_si256(_mm256_and_si256(w, m4), X86_FN(q5k_hbit)(qh, 2 * k)),
                                      _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(w, 4), m4), X86_FN(q5k_hbit)(qh, 2 * k + 1))};
                for (int h = 0; h < 2; h++) {
                    const int j = 2 * k + h;
                    for (int t = 0; t < NT; t++) {
                        const __m256i yv = _mm256_set1_epi32(pkk_ld32(y[t]->qs + 32 * j + 4 * c));
                        const __m256i p = _mm256_maddubs_epi16(q[h], yv);
                        if (TILED) isum[t][h] = X86_FN(pkk_wsum)(isum[t][h], p, sc[j]);
                        else part[h] = X86_FN(pkk_wsum)(part[h], p, sc[j]);
                    }
                }
            }
            if (!TILED)   /* lane c of every row for this block: exact, then its float step */
                accv[c] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(_mm256_add_epi32(part[0], part[1])), dd, accv[c]);
        }
        if (TILED) {
            const __m256 nxm = _mm256_sub_ps(_mm256_setzero_ps(), xm);
            for (int t = 0; t < NT; t++) {
                const __m256 f1d = _mm256_mul_ps(_mm256_cvtepi32_ps(_mm256_add_epi32(isum[t][0], isum[t][1])), xd);
                const __m256 res = _mm256_fmadd_ps(nxm, _mm256_cvtepi32_ps(hs[t]), f1d);
                acc[t] = _mm256_fmadd_ps(res, _mm256_set1_ps(y[t]->d), acc[t]);
            }
        } else {
            const __m256 dm = _mm256_mul_ps(_mm256_set1_ps(-y[0]->d), xm);
            summs = _mm256_fmadd_ps(dm, _mm256_cvtepi32_ps(hs[0]), summs);
        }
    }
    if (TILED)
        for (int t = 0; t < NT; t++) _mm256_storeu_ps(s + (size_t)t * s_stride, acc[t]);
    else {   /* hsum_float_8 lane-wise: r[m] = a[m+4] + a[m]; ((r0 + r2) + (r1 + r3)) + summs */
        __m256 r[4];
        for (int m = 0; m < 4; m++) r[m] = _mm256_add_ps(accv[m + 4], accv[m]);
        _mm256_storeu_ps(s, _mm256_add_ps(_mm256_add_ps(_mm256_add_ps(r[0], r[2]), _mm256_add_ps(r[1], r[3])), summs));
    }
}

/* twin: q5_K_vec_dot (ref.c) of each of the 8 rows */
static X86_TARGET void X86_FN(q5_K_dot_pack)(int64_t n, float *s, const void *grp, const void *xq) {
    X86_FN(q5_K_pack_rows)(n, s, 0, grp, xq, 0, 1, 0);
}

#if X86_VNNI
/* The tiled order on NT tokens with vpdpbusd: per pair k of sub-blocks, Σ code·q8 of sub-blocks 2k and 2k+1
 * (u5·s8, |Σ| ≤ 32·31·128) summed over the 8 units of each row, then times the two scales (vpmulld): fewer
 * instructions per token than maddubs + vpdpwssd per unit. The same exact s1 and s2, the same float steps. */
static inline __attribute__((always_inline)) X86_TARGET void X86_FN(q5_K_tiled_rows)(
        int64_t n, float *s, size_t s_stride, const uint8_t *g, const void *xq, size_t xq_stride, const int NT) {
    const __m256i m4 = _mm256_set1_epi8(0x0F);
    __m256i pick[4], pair[2];
    for (int j = 0; j < 4; j++) pick[j] = X86_FN(pkk_pick)(j, 0);   /* scale byte j -> an int32 */
    for (int k = 0; k < 2; k++) {
        uint8_t c[32];
        for (int l = 0; l < 8; l++) {
            c[4 * l] = (uint8_t)(4 * (l % 4) + 2 * k); c[4 * l + 1] = 0x80;
            c[4 * l + 2] = (uint8_t)(4 * (l % 4) + 2 * k + 1); c[4 * l + 3] = 0x80;
        }
        pair[k] = _mm256_loadu_si256((const __m256i *)c);
    }
    __m256 acc[4];
    for (int t = 0; t < NT; t++) acc[t] = _mm256_setzero_ps();
    for (int64_t i = 0; i < n / QK_K; i++) {
        const uint8_t *b = g + (size_t)i * PKK_Q5K_COL;
        __m256i sm[4];
        X86_FN(pkk_scales_mins)(b, sm);
        const __m256i s_lo = sm[0], s_hi = sm[1], m_lo = sm[2], m_hi = sm[3];
        const __m256i mp[4] = {_mm256_shuffle_epi8(m_lo, pair[0]), _mm256_shuffle_epi8(m_lo, pair[1]),
                               _mm256_shuffle_epi8(m_hi, pair[0]), _mm256_shuffle_epi8(m_hi, pair[1])};
        const blk_q8_K *y[4];
        __m256i hs[4], isum[4];
        for (int t = 0; t < NT; t++) {
            y[t] = (const blk_q8_K *)((const uint8_t *)xq + (size_t)t * xq_stride) + i;
            hs[t] = isum[t] = _mm256_setzero_si256();
            for (int k = 0; k < 4; k++) {
                const int16_t *bs = y[t]->bsums + 4 * k;
                const uint32_t bp = (uint16_t)(int16_t)(bs[0] + bs[1]) | (uint32_t)(uint16_t)(int16_t)(bs[2] + bs[3]) << 16;
                hs[t] = _mm256_dpwssd_epi32(hs[t], mp[k], _mm256_set1_epi32((int32_t)bp));
            }
        }
        Q5K_UNROLL
        for (int k = 0; k < 4; k++) {
            __m256i lo[4], hi[4];
            for (int t = 0; t < NT; t++) lo[t] = hi[t] = _mm256_setzero_si256();
            Q5K_UNROLL
            for (int c = 0; c < 8; c++) {
                const uint8_t *u = b + 128 + 160 * c;
                const __m256i qh = _mm256_loadu_si256((const __m256i *)u);
                const __m256i w = _mm256_loadu_si256((const __m256i *)(u + 32 + 32 * k));
                const __m256i q0 = _mm256_or_si256(_mm256_and_si256(w, m4), X86_FN(q5k_hbit)(qh, 2 * k));
                const __m256i q1 = _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(w, 4), m4), X86_FN(q5k_hbit)(qh, 2 * k + 1));
                for (int t = 0; t < NT; t++) {
                    lo[t] = _mm256_dpbusd_epi32(lo[t], q0, _mm256_set1_epi32(pkk_ld32(y[t]->qs + 64 * k + 4 * c)));
                    hi[t] = _mm256_dpbusd_epi32(hi[t], q1, _mm256_set1_epi32(pkk_ld32(y[t]->qs + 64 * k + 32 + 4 * c)));
                }
            }
            const __m256i sc0 = _mm256_shuffle_epi8(k < 2 ? s_lo : s_hi, pick[(2 * k) % 4]);
            const __m256i sc1 = _mm256_shuffle_epi8(k < 2 ? s_lo : s_hi, pick[(2 * k + 1) % 4]);
            for (int t = 0; t < NT; t++)
                isum[t] = _mm256_add_epi32(isum[t], _mm256_add_epi32(_mm256_mullo_epi32(lo[t], sc0), _mm256_mullo_epi32(hi[t], sc1)));
        }
        const __m256 xd = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)b));
        const __m256 nxm = _mm256_sub_ps(_mm256_setzero_ps(), _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(b + 16))));
        for (int t = 0; t < NT; t++) {
            const __m256 f1d = _mm256_mul_ps(_mm256_cvtepi32_ps(isum[t]), xd);
            acc[t] = _mm256_fmadd_ps(_mm256_fmadd_ps(nxm, _mm256_cvtepi32_ps(hs[t]), f1d), _mm256_set1_ps(y[t]->d), acc[t]);
        }
    }
    for (int t = 0; t < NT; t++) _mm256_storeu_ps(s + (size_t)t * s_stride, acc[t]);
}
#endif

#if X86_VNNI
/* The tiled order on 8 tokens with vpdpbusd, one sub-block j at a time: Σ code·q8 of sub-block j over the 8
 * units of each row (one int32 chain per token), times its scale (vpmulld), into the block's exact s1; s2
 * after the codes. Each code vector is decoded once for 8 tokens, and the live registers (8 chains, 8 block
 * sums, 8 float accumulators) fit AVX-512VL's 32. The same exact s1 and s2, the same float steps. */
static X86_TARGET void X86_FN(q5_K_tiled_rows8)(int64_t n, float *s, size_t s_stride, const uint8_t *g, const void *xq,
                                                size_t xq_stride) {
    enum { NT = 8 };
    const __m256i m4 = _mm256_set1_epi8(0x0F);
    __m256i pick[4], pair[2];
    for (int j = 0; j < 4; j++) pick[j] = X86_FN(pkk_pick)(j, 0);   /* scale byte j -> an int32 */
    for (int k = 0; k < 2; k++) {
        uint8_t c[32];
        for (int l = 0; l < 8; l++) {
            c[4 * l] = (uint8_t)(4 * (l % 4) + 2 * k); c[4 * l + 1] = 0x80;
            c[4 * l + 2] = (uint8_t)(4 * (l % 4) + 2 * k + 1); c[4 * l + 3] = 0x80;
        }
        pair[k] = _mm256_loadu_si256((const __m256i *)c);
    }
    __m256 acc[NT];
    for (int t = 0; t < NT; t++) acc[t] = _mm256_setzero_ps();
    for (int64_t i = 0; i < n / QK_K; i++) {
        const uint8_t *b = g + (size_t)i * PKK_Q5K_COL;
        const blk_q8_K *y[NT];
        __m256i isum[NT], sm[4];
        X86_FN(pkk_scales_mins)(b, sm);
        for (int t = 0; t < NT; t++) {
            y[t] = (const blk_q8_K *)((const uint8_t *)xq + (size_t)t * xq_stride) + i;
            isum[t] = _mm256_setzero_si256();
        }
        Q5K_UNROLL
        for (int j = 0; j < 8; j++) {
            __m256i lo[NT];
            for (int t = 0; t < NT; t++) lo[t] = _mm256_setzero_si256();
            Q5K_UNROLL
            for (int c = 0; c < 8; c++) {
                const uint8_t *u = b + 128 + 160 * c;
                const __m256i qh = _mm256_loadu_si256((const __m256i *)u);
                const __m256i w = _mm256_loadu_si256((const __m256i *)(u + 32 + 32 * (j / 2)));
                const __m256i nib = j % 2 ? _mm256_srli_epi16(w, 4) : w;
                const __m256i q = _mm256_or_si256(_mm256_and_si256(nib, m4), X86_FN(q5k_hbit)(qh, j));
                for (int t = 0; t < NT; t++)
                    lo[t] = _mm256_dpbusd_epi32(lo[t], q, _mm256_set1_epi32(pkk_ld32(y[t]->qs + 32 * j + 4 * c)));
            }
            const __m256i sc = _mm256_shuffle_epi8(j < 4 ? sm[0] : sm[1], pick[j % 4]);
            for (int t = 0; t < NT; t++) isum[t] = _mm256_add_epi32(isum[t], _mm256_mullo_epi32(lo[t], sc));
        }
        const __m256i mp[4] = {_mm256_shuffle_epi8(sm[2], pair[0]), _mm256_shuffle_epi8(sm[2], pair[1]),
                               _mm256_shuffle_epi8(sm[3], pair[0]), _mm256_shuffle_epi8(sm[3], pair[1])};
        const __m256 xd = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)b));
        const __m256 nxm = _mm256_sub_ps(_mm256_setzero_ps(), _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(b + 16))));
        for (int t = 0; t < NT; t++) {
            __m256i hs = _mm256_setzero_si256();
            for (int k = 0; k < 4; k++) {
                const int16_t *bs = y[t]->bsums + 4 * k;
                const uint32_t bp = (uint16_t)(int16_t)(bs[0] + bs[1]) | (uint32_t)(uint16_t)(int16_t)(bs[2] + bs[3]) << 16;
                hs = _mm256_dpwssd_epi32(hs, mp[k], _mm256_set1_epi32((int32_t)bp));
            }
            const __m256 f1d = _mm256_mul_ps(_mm256_cvtepi32_ps(isum[t]), xd);
            acc[t] = _mm256_fmadd_ps(_mm256_fmadd_ps(nxm, _mm256_cvtepi32_ps(hs), f1d), _mm256_set1_ps(y[t]->d), acc[t]);
        }
    }
    for (int t = 0; t < NT; t++) _mm256_storeu_ps(s + (size_t)t * s_stride, acc[t]);
}
#endif

/* twin: q5_K_tiled_dot (ref.c), 8 rows x any number of tokens: s[t·s_stride + r] */
static X86_TARGET void X86_FN(q5_K_tiled_pack)(int64_t n, float *s, size_t s_stride, const void *grp, const void *xq,
                                               size_t xq_stride, int32_t n_tok) {
    const uint8_t *x = xq;
    int32_t t = 0;
#if X86_VNNI
    for (; t + 8 <= n_tok; t += 8)
        X86_FN(q5_K_tiled_rows8)(n, s + (size_t)t * s_stride, s_stride, grp, x + (size_t)t * xq_stride, xq_stride);
    for (; t + 4 <= n_tok; t += 4)
        X86_FN(q5_K_tiled_rows)(n, s + (size_t)t * s_stride, s_stride, grp, x + (size_t)t * xq_stride, xq_stride, 4);
    for (; t < n_tok; t++)
        X86_FN(q5_K_tiled_rows)(n, s + (size_t)t * s_stride, 0, grp, x + (size_t)t * xq_stride, 0, 1);
    return;
#endif
    for (; t + 4 <= n_tok; t += 4)   /* 16 ymm registers: four tokens per pass */
        X86_FN(q5_K_pack_rows)(n, s + (size_t)t * s_stride, s_stride, grp, x + (size_t)t * xq_stride, xq_stride, 4, 1);
    for (; t < n_tok; t++)
        X86_FN(q5_K_pack_rows)(n, s + (size_t)t * s_stride, 0, grp, x + (size_t)t * xq_stride, 0, 1, 1);
}

/* ---- plain rows ---- */

/* One Q5_K block of one plain row: 8 int32 lanes, lane m = Σ_j sc_j·Σ code·q8 over values 4m..4m+3 of every
 * sub-block j (q5_K_vec_dot's lanes in ref.c), and *hs = Σ_j mn_j·(bsums[2j] + bsums[2j+1]). */
static inline X86_TARGET __m256i X86_FN(q5_K_lanes)(const blk_q5_K *x, const blk_q8_K *y, int32_t *hs) {
    const __m256i m4 = _mm256_set1_epi8(0x0F);
    uint8_t sc[8], mn[8];
    for (int j = 0; j < 8; j++) pi2_k4_scale_min(j, x->scales, &sc[j], &mn[j]);
    const __m256i qh = _mm256_loadu_si256((const __m256i *)x->qh);
    __m256i sumi[2] = {_mm256_setzero_si256(), _mm256_setzero_si256()};
    Q5K_UNROLL
    for (int k = 0; k < 4; k++) {
        const __m256i bits = _mm256_loadu_si256((const __m256i *)(x->qs + 32 * k));
        const __m256i q[2] = {_mm256_or_si256(_mm256_and_si256(bits, m4), X86_FN(q5k_hbit)(qh, 2 * k)),
                              _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(bits, 4), m4), X86_FN(q5k_hbit)(qh, 2 * k + 1))};
        for (int h = 0; h < 2; h++) {
            const __m256i v = _mm256_loadu_si256((const __m256i *)(y->qs + 64 * k + 32 * h));
            sumi[h] = X86_FN(pkk_wsum)(sumi[h], _mm256_maddubs_epi16(q[h], v), _mm256_set1_epi16(sc[2 * k + h]));
        }
    }
    const __m256i mins = _mm256_set_epi16(mn[7], mn[7], mn[6], mn[6], mn[5], mn[5], mn[4], mn[4],
                                          mn[3], mn[3], mn[2], mn[2], mn[1], mn[1], mn[0], mn[0]);
    const __m256i mp = _mm256_madd_epi16(_mm256_loadu_si256((const __m256i *)y->bsums), mins);
    __m128i r = _mm_add_epi32(_mm256_castsi256_si128(mp), _mm256_extracti128_si256(mp, 1));
    r = _mm_add_epi32(r, _mm_shuffle_epi32(r, 0x4E));
    r = _mm_add_epi32(r, _mm_shuffle_epi32(r, 0xB1));
    *hs = _mm_cvtsi128_si32(r);
    return _mm256_add_epi32(sumi[0], sumi[1]);
}

/* Scalar vfmadd: a·b + c with one rounding. */
static inline X86_TARGET float X86_FN(q5k_fma1)(float a, float b, float c) {
    return _mm_cvtss_f32(_mm_fmadd_ss(_mm_set_ss(a), _mm_set_ss(b), _mm_set_ss(c)));
}

/* twin: q5_K_vec_dot in ref.c (ggml_vec_dot_q5_K_q8_K's 8 lanes, hsum_float_8, the mins chain) */
static X86_TARGET void X86_FN(q5_K_vec_dot)(int64_t n, float *s, const void *w, const void *xq) {
    const blk_q5_K *x = w; const blk_q8_K *y = xq;
    __m256 acc = _mm256_setzero_ps();
    float summs = 0;
    for (int64_t i = 0; i < n / QK_K; i++) {
        int32_t hs;
        const __m256i lane = X86_FN(q5_K_lanes)(&x[i], &y[i], &hs);
        const float d = y[i].d * _cvtsh_ss(x[i].d), dmin = -y[i].d * _cvtsh_ss(x[i].dmin);
        acc = _mm256_fmadd_ps(_mm256_cvtepi32_ps(lane), _mm256_set1_ps(d), acc);
        summs = X86_FN(q5k_fma1)(dmin, (float)hs, summs);
    }
    __m128 r = _mm_add_ps(_mm256_castps256_ps128(acc), _mm256_extractf128_ps(acc, 1));
    r = _mm_add_ps(r, _mm_movehl_ps(r, r));
    r = _mm_add_ss(r, _mm_movehdup_ps(r));
    *s = _mm_cvtss_f32(r) + summs;
}

/* twin: q5_K_tiled_dot in ref.c (the tiled kernel: exact s1, s2 per block, two float steps) */
static X86_TARGET void X86_FN(q5_K_tiled_dot)(int64_t n, float *s, const void *w, const void *xq) {
    const blk_q5_K *x = w; const blk_q8_K *y = xq;
    float acc = 0;
    for (int64_t i = 0; i < n / QK_K; i++) {
        int32_t hs;
        const __m256i lane = X86_FN(q5_K_lanes)(&x[i], &y[i], &hs);
        __m128i r = _mm_add_epi32(_mm256_castsi256_si128(lane), _mm256_extracti128_si256(lane, 1));
        r = _mm_add_epi32(r, _mm_shuffle_epi32(r, 0x4E));
        r = _mm_add_epi32(r, _mm_shuffle_epi32(r, 0xB1));
        const float f1d = (float)_mm_cvtsi128_si32(r) * _cvtsh_ss(x[i].d);
        const float res = X86_FN(q5k_fma1)(-_cvtsh_ss(x[i].dmin), (float)hs, f1d);
        acc = X86_FN(q5k_fma1)(res, y[i].d, acc);
    }
    *s = acc;
}
