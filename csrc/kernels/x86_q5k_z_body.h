/* x86_q5k_z_body.h — Q5_K's prompt kernel on 512-bit registers: 16 packed rows (two consecutive x8 groups of
 * pack_k.c) × up to 8 tokens, the tiled order (q5_K_tiled_dot in ref.c), bit for bit.
 * A zmm holds one 4-byte unit of 16 rows (the unit of group 0 in the low half, of group 1 in the high half): 4
 * codes of each row, decoded once per sub-block and multiplied with every token's 4 matching activation bytes
 * (vpdpbusd with a broadcast operand), so each instruction does 64 products where the ymm kernel
 * (q5_K_tiled_rows8) does 32. Per sub-block j, Σ code·q8 over its 8 units is one exact int32 chain per token
 * (|Σ| ≤ 32·31·128), times the scale (vpmulld) into the block's exact s1; s2 = Σ mn·(bsum pairs) by vpdpwssd;
 * then the same two float steps per block as ref.c. Register tile: 8 chains + 8 block sums + 8 float sums.
 * Included by x86.c in the AVX-512 VNNI pass only, after x86_pack_k_body.h and x86_q5k_body.h (PKK_Q5K_COL,
 * pkk_pick, pkk_ld32). Chosen for the zmm variants (zen4-zmm, zen5-zmm, intel-zmm, zmm). */

/* One 32-byte unit of group 0 at p and of group 1 at p + gs, as the low and high halves of a zmm. */
static inline X86_TARGET __m512i X86_FN(q5kz_ld2)(const uint8_t *p, size_t gs) {
    return _mm512_inserti64x4(_mm512_castsi256_si512(_mm256_loadu_si256((const __m256i *)p)),
                              _mm256_loadu_si256((const __m256i *)(p + gs)), 1);
}

/* pkk_scales_mins on 16 rows: sm[0] scales of sub-blocks 0-3, sm[1] of 4-7, sm[2] mins of 0-3, sm[3] of 4-7. */
static inline __attribute__((always_inline)) X86_TARGET void X86_FN(q5kz_scales_mins)(const uint8_t *b, size_t gs,
                                                                                      __m512i sm[4]) {
    const __m512i m4 = _mm512_set1_epi8(0x0F), m3f = _mm512_set1_epi8(0x3F), m30 = _mm512_set1_epi8(0x30);
    const __m512i u0 = X86_FN(q5kz_ld2)(b + 32, gs), u1 = X86_FN(q5kz_ld2)(b + 64, gs), u2 = X86_FN(q5kz_ld2)(b + 96, gs);
    sm[0] = _mm512_and_si512(u0, m3f);
    sm[1] = _mm512_or_si512(_mm512_and_si512(u2, m4), _mm512_and_si512(_mm512_srli_epi32(u0, 2), m30));
    sm[2] = _mm512_and_si512(u1, m3f);
    sm[3] = _mm512_or_si512(_mm512_and_si512(_mm512_srli_epi32(u2, 4), m4), _mm512_and_si512(_mm512_srli_epi32(u1, 2), m30));
}

/* The codes of sub-block j of one unit: low (j even) or high nibble of w, bit j of each qh byte as bit 4. */
static inline __attribute__((always_inline)) X86_TARGET __m512i X86_FN(q5kz_codes)(__m512i w, __m512i qh, int j) {
    const __m512i m4 = _mm512_set1_epi8(0x0F), m10 = _mm512_set1_epi8(0x10);
    const __m512i nib = j % 2 ? _mm512_srli_epi16(w, 4) : w;
    const __m512i hb = _mm512_and_si512(j <= 4 ? _mm512_slli_epi16(qh, 4 - j) : _mm512_srli_epi16(qh, j - 4), m10);
    return _mm512_ternarylogic_epi32(nib, hb, m4, 0xEC);   /* (nib & m4) | hb */
}

/* The codes of one block column of 16 rows, decoded once for every token of a call: q[j][c] = the zmm of
 * sub-block j's unit c (4 codes of each row); sc[j] = sub-block j's scale per row as an int32. */
typedef struct {
    __m512i q[8][8], sc[8], mp[4];
    __m512 xd, nxm;
} q5kz_col;

static inline __attribute__((always_inline)) X86_TARGET void X86_FN(q5kz_decode)(const uint8_t *b, size_t gs,
                                                                                 q5kz_col *col) {
    __m512i sm[4];
    X86_FN(q5kz_scales_mins)(b, gs, sm);
    for (int j = 0; j < 8; j++)
        col->sc[j] = _mm512_shuffle_epi8(j < 4 ? sm[0] : sm[1], _mm512_broadcast_i64x4(X86_FN(pkk_pick)(j % 4, 0)));
    for (int k = 0; k < 2; k++) {   /* min bytes 2k, 2k+1 of a lane -> an int16 pair */
        uint8_t c[16];
        for (int l = 0; l < 4; l++) {
            c[4 * l] = (uint8_t)(4 * l + 2 * k); c[4 * l + 1] = 0x80;
            c[4 * l + 2] = (uint8_t)(4 * l + 2 * k + 1); c[4 * l + 3] = 0x80;
        }
        const __m512i pair = _mm512_broadcast_i32x4(_mm_loadu_si128((const __m128i *)c));
        col->mp[k] = _mm512_shuffle_epi8(sm[2], pair);
        col->mp[k + 2] = _mm512_shuffle_epi8(sm[3], pair);
    }
    Q5K_UNROLL
    for (int c = 0; c < 8; c++) {
        const uint8_t *u = b + 128 + 160 * c;
        const __m512i qh = X86_FN(q5kz_ld2)(u, gs);
        Q5K_UNROLL
        for (int k = 0; k < 4; k++) {
            const __m512i w = X86_FN(q5kz_ld2)(u + 32 + 32 * k, gs);
            col->q[2 * k][c] = X86_FN(q5kz_codes)(w, qh, 2 * k);
            col->q[2 * k + 1][c] = X86_FN(q5kz_codes)(w, qh, 2 * k + 1);
        }
    }
    col->xd = _mm512_cvtph_ps(_mm256_inserti128_si256(
        _mm256_castsi128_si256(_mm_loadu_si128((const __m128i *)b)), _mm_loadu_si128((const __m128i *)(b + gs)), 1));
    const __m512 xm = _mm512_cvtph_ps(_mm256_inserti128_si256(
        _mm256_castsi128_si256(_mm_loadu_si128((const __m128i *)(b + 16))),
        _mm_loadu_si128((const __m128i *)(b + gs + 16)), 1));
    col->nxm = _mm512_sub_ps(_mm512_setzero_ps(), xm);
}

/* One block column (block i of NT tokens' rows y[t]) into acc[t] (16 floats per token, in memory): two int32
 * chains per token and sub-block (units of even and odd c), so 16 independent dpbusd chains are in flight. */
static inline __attribute__((always_inline)) X86_TARGET void X86_FN(q5kz_tokens)(const q5kz_col *col,
        const blk_q8_K *const *y, float *acc, const int NT) {
    __m512i isum[8];
    for (int t = 0; t < NT; t++) isum[t] = _mm512_setzero_si512();
    _Pragma("GCC unroll 1")   /* a runtime loop: unrolled, GCC interleaves the sub-blocks and spills every chain */
    for (int j = 0; j < 8; j++) {
        __m512i lo[8], hi[8];
        for (int t = 0; t < NT; t++) lo[t] = hi[t] = _mm512_setzero_si512();
        Q5K_UNROLL
        for (int c = 0; c < 8; c += 2) {
            const __m512i q0 = col->q[j][c], q1 = col->q[j][c + 1];
            for (int t = 0; t < NT; t++) {
                lo[t] = _mm512_dpbusd_epi32(lo[t], q0, _mm512_set1_epi32(pkk_ld32(y[t]->qs + 32 * j + 4 * c)));
                hi[t] = _mm512_dpbusd_epi32(hi[t], q1, _mm512_set1_epi32(pkk_ld32(y[t]->qs + 32 * j + 4 * c + 4)));
            }
        }
        for (int t = 0; t < NT; t++)
            isum[t] = _mm512_add_epi32(isum[t], _mm512_mullo_epi32(_mm512_add_epi32(lo[t], hi[t]), col->sc[j]));
    }
    for (int t = 0; t < NT; t++) {
        __m512i hs = _mm512_setzero_si512();
        for (int k = 0; k < 4; k++) {
            const int16_t *bs = y[t]->bsums + 4 * k;
            const uint32_t bp = (uint16_t)(int16_t)(bs[0] + bs[1]) | (uint32_t)(uint16_t)(int16_t)(bs[2] + bs[3]) << 16;
            hs = _mm512_dpwssd_epi32(hs, col->mp[k], _mm512_set1_epi32((int32_t)bp));
        }
        const __m512 f1d = _mm512_mul_ps(_mm512_cvtepi32_ps(isum[t]), col->xd);
        const __m512 res = _mm512_fmadd_ps(col->nxm, _mm512_cvtepi32_ps(hs), f1d);
        _mm512_store_ps(acc + 16 * t, _mm512_fmadd_ps(res, _mm512_set1_ps(y[t]->d), _mm512_load_ps(acc + 16 * t)));
    }
}

#define Q5KZ_MAX_TOK 32   /* most tokens per call: the decoded column (4 KiB) serves them all from L1 */

/* The body of a zmm K-quant prompt kernel, this file's and x86_q6k_z_body.h's, over the kernel's parameters (n, s,
 * s_stride, grp, xq, xq_stride, n_tok): per block column (COL_BYTES of each of the two groups) the codes are decoded
 * once (DECODE) into registers' spill area (col, a COL_T), then every token runs its dpbusd chains on them (TOKENS:
 * 8, 4, then 1 token at a time); the float sums stay per token in acc, copied to s at the end. n_tok <= MAX_TOK. */
#define KZ_PACK16_BODY(COL_T, COL_BYTES, MAX_TOK, DECODE, TOKENS)                                            \
    const uint8_t *g = grp, *x = xq;                                                                        \
    const size_t gs = (size_t)(n / QK_K) * (COL_BYTES);   /* bytes of one group */                           \
    COL_T col;                                                                                               \
    __attribute__((aligned(64))) float acc[(MAX_TOK) * 16];                                                  \
    memset(acc, 0, sizeof(float) * 16 * (size_t)n_tok);                                                      \
    for (int64_t i = 0; i < n / QK_K; i++) {                                                                 \
        DECODE(g + (size_t)i * (COL_BYTES), gs, &col);                                                       \
        const blk_q8_K *y[MAX_TOK];                                                                          \
        for (int32_t t = 0; t < n_tok; t++) y[t] = (const blk_q8_K *)(x + (size_t)t * xq_stride) + i;        \
        int32_t t = 0;                                                                                       \
        for (; t + 8 <= n_tok; t += 8) TOKENS(&col, y + t, acc + 16 * t, 8);                                 \
        for (; t + 4 <= n_tok; t += 4) TOKENS(&col, y + t, acc + 16 * t, 4);                                 \
        for (; t < n_tok; t++) TOKENS(&col, y + t, acc + 16 * t, 1);                                         \
    }                                                                                                        \
    for (int32_t t = 0; t < n_tok; t++) memcpy(s + (size_t)t * s_stride, acc + 16 * t, 16 * sizeof(float))

/* twin: q5_K_tiled_dot (ref.c), 16 rows (two consecutive packed groups at grp) x up to Q5KZ_MAX_TOK tokens:
 * s[t·s_stride + r], r < 16. */
static X86_TARGET void X86_FN(q5_K_tiled_pack16)(int64_t n, float *s, size_t s_stride, const void *grp, const void *xq,
                                                 size_t xq_stride, int32_t n_tok) {
    KZ_PACK16_BODY(q5kz_col, PKK_Q5K_COL, Q5KZ_MAX_TOK, X86_FN(q5kz_decode), X86_FN(q5kz_tokens));
}
