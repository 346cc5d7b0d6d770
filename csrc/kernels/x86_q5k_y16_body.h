/* x86_q5k_y16_body.h — Q5_K's prompt kernel on 256-bit registers (AVX2): 16 packed rows (two consecutive x8 groups
 * of pack_k.c) × up to 32 tokens, the tiled order (q5_K_tiled_dot in ref.c), bit for bit.
 * Per block column the u5 codes of both groups are decoded once into q5ky_col (a ymm per group, sub-block and 4-byte
 * unit: 4 codes of each of 8 rows, 4 KiB in all, from L1 after) with the scales as int16 pairs and the mins as
 * pairs; then every token of the call runs on them, four at a time: each unit's 4 activation bytes are broadcast
 * once for both groups, maddubs (pairs ≤ 2·31·128), four units' pairs of a sub-block added in int16 (≤ 8·31·128 <
 * 2^15: exact), one madd by the scale pair into the block's exact s1 per token and group (8 accumulators); s2 =
 * Σ mn·(bsum pairs) by madd. Then ref.c's two float steps per block: acc = (s1·d − dmin·s2)·y.d + acc (FMAs).
 * Where q5_K_tiled_pack (x86_q5k_body.h) decodes each block column again for every four tokens and spends a madd and
 * an add per unit, this decodes it once per call and spends them once per four units.
 * Included by x86.c in the AVX2 pass only, after x86_pack_k_body.h and x86_q5k_body.h (PKK_Q5K_COL, pkk_ld32,
 * pkk_pick, pkk_scales_mins, q5k_hbit, Q5K_UNROLL). Chosen for the ymm variant without VNNI (avx2). */

/* One block column of 16 rows: q[j][c][g] the codes of sub-block j, unit c (values 32j + 4c..+3) of group g;
 * sc[j][g] sub-block j's scale as an int16 pair per row; mp[k][g] the mins of sub-blocks 2k, 2k+1 as an int16 pair;
 * xd[g] = d, nxm[g] = −dmin. */
typedef struct {
    __m256i q[8][8][2], sc[8][2], mp[4][2];
    __m256 xd[2], nxm[2];
} q5ky_col;

static inline __attribute__((always_inline)) X86_TARGET void X86_FN(q5ky_decode)(const uint8_t *b, size_t gs,
                                                                                 q5ky_col *col) {
    const __m256i m4 = _mm256_set1_epi8(0x0F);
    __m256i pair[2];
    for (int k = 0; k < 2; k++) {   /* bytes 2k, 2k+1 of a lane -> int16 pair */
        uint8_t c[32];
        for (int l = 0; l < 8; l++) {
            c[4 * l] = (uint8_t)(4 * (l % 4) + 2 * k); c[4 * l + 1] = 0x80;
            c[4 * l + 2] = (uint8_t)(4 * (l % 4) + 2 * k + 1); c[4 * l + 3] = 0x80;
        }
        pair[k] = _mm256_loadu_si256((const __m256i *)c);
    }
    for (int g = 0; g < 2; g++) {
        const uint8_t *bg = b + (size_t)g * gs;
        __m256i sm[4];
        X86_FN(pkk_scales_mins)(bg, sm);
        for (int j = 0; j < 8; j++) col->sc[j][g] = _mm256_shuffle_epi8(sm[j / 4], X86_FN(pkk_pick)(j % 4, -1));
        for (int k = 0; k < 4; k++) col->mp[k][g] = _mm256_shuffle_epi8(sm[2 + k / 2], pair[k % 2]);
        Q5K_UNROLL
        for (int c = 0; c < 8; c++) {
            const uint8_t *u = bg + 128 + 160 * c;
            const __m256i qh = _mm256_loadu_si256((const __m256i *)u);
            Q5K_UNROLL
            for (int k = 0; k < 4; k++) {
                const __m256i w = _mm256_loadu_si256((const __m256i *)(u + 32 + 32 * k));
                col->q[2 * k][c][g] = _mm256_or_si256(_mm256_and_si256(w, m4), X86_FN(q5k_hbit)(qh, 2 * k));
                col->q[2 * k + 1][c][g] = _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(w, 4), m4),
                                                          X86_FN(q5k_hbit)(qh, 2 * k + 1));
            }
        }
        col->xd[g] = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)bg));
        col->nxm[g] = _mm256_sub_ps(_mm256_setzero_ps(), _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(bg + 16))));
    }
}

/* One block column (block i of NT tokens' rows y[t]) into acc[t] (16 floats per token, group 0's rows first). */
static inline __attribute__((always_inline)) X86_TARGET void X86_FN(q5ky_tokens)(const q5ky_col *col,
        const blk_q8_K *const *y, float *acc, const int NT) {
    __m256i isum[4][2];
    for (int t = 0; t < NT; t++) isum[t][0] = isum[t][1] = _mm256_setzero_si256();
    _Pragma("GCC unroll 1")   /* a runtime loop: fully unrolled, GCC hoists the loads and spills */
    for (int j = 0; j < 8; j++) {
        Q5K_UNROLL
        for (int c0 = 0; c0 < 8; c0 += 4) {   /* units c0..c0+3 of sub-block j */
            for (int t = 0; t < NT; t++) {
                __m256i p[2];
                for (int c = c0; c < c0 + 4; c++) {
                    const __m256i yv = _mm256_set1_epi32(pkk_ld32(y[t]->qs + 32 * j + 4 * c));
                    for (int g = 0; g < 2; g++) {
                        const __m256i m = _mm256_maddubs_epi16(col->q[j][c][g], yv);
                        p[g] = c == c0 ? m : _mm256_add_epi16(p[g], m);
                    }
                }
                for (int g = 0; g < 2; g++) isum[t][g] = _mm256_add_epi32(isum[t][g], _mm256_madd_epi16(p[g], col->sc[j][g]));
            }
        }
    }
    for (int t = 0; t < NT; t++) {
        __m256i hs[2] = {_mm256_setzero_si256(), _mm256_setzero_si256()};
        for (int k = 0; k < 4; k++) {
            const int16_t *bs = y[t]->bsums + 4 * k;
            const uint32_t bp = (uint16_t)(int16_t)(bs[0] + bs[1]) | (uint32_t)(uint16_t)(int16_t)(bs[2] + bs[3]) << 16;
            for (int g = 0; g < 2; g++)
                hs[g] = _mm256_add_epi32(hs[g], _mm256_madd_epi16(col->mp[k][g], _mm256_set1_epi32((int32_t)bp)));
        }
        for (int g = 0; g < 2; g++) {
            const __m256 f1d = _mm256_mul_ps(_mm256_cvtepi32_ps(isum[t][g]), col->xd[g]);
            const __m256 res = _mm256_fmadd_ps(col->nxm[g], _mm256_cvtepi32_ps(hs[g]), f1d);
            _mm256_storeu_ps(acc + 16 * t + 8 * g,
                             _mm256_fmadd_ps(res, _mm256_set1_ps(y[t]->d), _mm256_loadu_ps(acc + 16 * t + 8 * g)));
        }
    }
}

#define Q5KY_MAX_TOK 32   /* most tokens per call: the decoded column (4.6 KiB) serves them all from L1 */

/* twin: q5_K_tiled_dot (ref.c), 16 rows (two consecutive packed groups at grp) x up to Q5KY_MAX_TOK tokens:
 * s[t·s_stride + r], r < 16. */
static X86_TARGET void X86_FN(q5_K_tiled_pack16)(int64_t n, float *s, size_t s_stride, const void *grp, const void *xq,
                                                 size_t xq_stride, int32_t n_tok) {
    KY_PACK16_BODY(q5ky_col, PKK_Q5K_COL, Q5KY_MAX_TOK, X86_FN(q5ky_decode), X86_FN(q5ky_tokens));
}
