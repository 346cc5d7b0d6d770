/* x86_q6k_z_body.h — Q6_K's prompt kernel on 512-bit registers: 16 packed rows (two consecutive x8 groups of
 * pack_k.c) × up to 32 tokens, the tiled order (q6_K_tiled_dot in ref_k.h), bit for bit.
 * Per block column the 6-bit codes of the 16 rows are decoded once (u6, a zmm per 4-byte unit: 4 codes of each
 * row) and every token's matching activation bytes are broadcast into vpdpbusd: per 16-value sub-block m an
 * exact int32 chain of 4 units (|Σ| ≤ 16·63·128), times its signed scale (vpmulld) into the block's exact sum;
 * the -32 of every code is -32·Σ_m sc_m·bsum_m (vpdpwssd on scale pairs). Then ref_k.h's one float step per
 * block: acc = ((float)isum·d)·y.d + acc (an FMA).
 * Included by x86.c in the AVX-512 VNNI pass only, after x86_pack_k_body.h (PKK_Q6K_COL, pkk_ld32) and
 * x86_q5k_z_body.h (q5kz_ld2, KZ_PACK16_BODY). Chosen for the zmm variants. */

/* One block column of 16 rows: q[h][k][c] the codes of values 128h + 32k + 4c..+3 of every row; sc[m] sub-block
 * m's scale per row (int32); sp[p] scale pairs (int16) of sub-blocks (4a + e, 4a + e + 2), p = 2a + e; xd = d. */
typedef struct {
    __m512i q[2][4][8], sc[16], sp[8];
    __m512 xd;
} q6kz_col;

static inline __attribute__((always_inline)) X86_TARGET void X86_FN(q6kz_decode)(const uint8_t *b, size_t gs,
                                                                                 q6kz_col *col) {
    const __m512i m4 = _mm512_set1_epi8(0x0F), m30 = _mm512_set1_epi8(0x30);
    for (int a = 0; a < 4; a++) {
        const __m512i u = X86_FN(q5kz_ld2)(b + 16 + 32 * a, gs);   /* scale bytes 4a..4a+3 of every row */
        for (int j = 0; j < 4; j++) col->sc[4 * a + j] = _mm512_srai_epi32(_mm512_slli_epi32(u, 24 - 8 * j), 24);
        col->sp[2 * a] = _mm512_srai_epi16(_mm512_slli_epi16(u, 8), 8);   /* bytes 0 and 2 */
        col->sp[2 * a + 1] = _mm512_srai_epi16(u, 8);                      /* bytes 1 and 3 */
    }
    Q5K_UNROLL
    for (int c = 0; c < 8; c++)
        for (int h = 0; h < 2; h++) {
            const uint8_t *u = b + 144 + 96 * (2 * c + h);
            const __m512i l0 = X86_FN(q5kz_ld2)(u, gs), l1 = X86_FN(q5kz_ld2)(u + 32, gs), qh = X86_FN(q5kz_ld2)(u + 64, gs);
            /* (x & m4) | (y & m30): one ternary op (B & C) | A on A = y & m30, B = x, C = m4 */
            col->q[h][0][c] = _mm512_ternarylogic_epi32(_mm512_and_si512(_mm512_slli_epi16(qh, 4), m30), l0, m4, 0xF8);
            col->q[h][1][c] = _mm512_ternarylogic_epi32(_mm512_and_si512(_mm512_slli_epi16(qh, 2), m30), l1, m4, 0xF8);
            col->q[h][2][c] = _mm512_ternarylogic_epi32(_mm512_and_si512(qh, m30), _mm512_srli_epi16(l0, 4), m4, 0xF8);
            col->q[h][3][c] = _mm512_ternarylogic_epi32(_mm512_and_si512(_mm512_srli_epi16(qh, 2), m30),
                                                        _mm512_srli_epi16(l1, 4), m4, 0xF8);
        }
    col->xd = _mm512_cvtph_ps(_mm256_inserti128_si256(
        _mm256_castsi128_si256(_mm_loadu_si128((const __m128i *)b)), _mm_loadu_si128((const __m128i *)(b + gs)), 1));
}

/* One block column (block i of NT tokens' rows y[t]) into acc[t] (16 floats per token, in memory). */
static inline __attribute__((always_inline)) X86_TARGET void X86_FN(q6kz_tokens)(const q6kz_col *col,
        const blk_q8_K *const *y, float *acc, const int NT) {
    __m512i isum[8];
    for (int t = 0; t < NT; t++) {   /* -32·Σ_m sc_m·bsum_m */
        __m512i off = _mm512_setzero_si512();
        for (int a = 0; a < 4; a++)
            for (int e = 0; e < 2; e++) {
                const int16_t *bs = y[t]->bsums + 4 * a + e;
                const uint32_t bp = (uint16_t)bs[0] | (uint32_t)(uint16_t)bs[2] << 16;
                off = _mm512_dpwssd_epi32(off, col->sp[2 * a + e], _mm512_set1_epi32((int32_t)bp));
            }
        isum[t] = _mm512_sub_epi32(_mm512_setzero_si512(), _mm512_slli_epi32(off, 5));
    }
    _Pragma("GCC unroll 1")   /* runtime loops: unrolled, GCC interleaves the sub-blocks and spills the chains */
    for (int h = 0; h < 2; h++) {
        _Pragma("GCC unroll 1")
        for (int k = 0; k < 4; k++) {
            __m512i lo[8], hi[8];   /* sub-blocks 8h + 2k (c < 4) and 8h + 2k + 1 (c ≥ 4) */
            for (int t = 0; t < NT; t++) lo[t] = hi[t] = _mm512_setzero_si512();
            Q5K_UNROLL
            for (int c = 0; c < 4; c++) {
                const __m512i q0 = col->q[h][k][c], q1 = col->q[h][k][c + 4];
                for (int t = 0; t < NT; t++) {
                    const int8_t *yq = y[t]->qs + 128 * h + 32 * k + 4 * c;
                    lo[t] = _mm512_dpbusd_epi32(lo[t], q0, _mm512_set1_epi32(pkk_ld32(yq)));
                    hi[t] = _mm512_dpbusd_epi32(hi[t], q1, _mm512_set1_epi32(pkk_ld32(yq + 16)));
                }
            }
            const __m512i s0 = col->sc[8 * h + 2 * k], s1 = col->sc[8 * h + 2 * k + 1];
            for (int t = 0; t < NT; t++)
                isum[t] = _mm512_add_epi32(isum[t], _mm512_add_epi32(_mm512_mullo_epi32(lo[t], s0), _mm512_mullo_epi32(hi[t], s1)));
        }
    }
    for (int t = 0; t < NT; t++)
        _mm512_store_ps(acc + 16 * t, _mm512_fmadd_ps(_mm512_mul_ps(_mm512_cvtepi32_ps(isum[t]), col->xd),
                                                      _mm512_set1_ps(y[t]->d), _mm512_load_ps(acc + 16 * t)));
}

#define Q6KZ_MAX_TOK 32   /* most tokens per call: the decoded column (4 KiB) serves them all from L1 */

/* twin: q6_K_tiled_dot (ref_k.h), 16 rows (two consecutive packed groups at grp) x up to Q6KZ_MAX_TOK tokens:
 * s[t·s_stride + r], r < 16. */
static X86_TARGET void X86_FN(q6_K_tiled_pack16)(int64_t n, float *s, size_t s_stride, const void *grp, const void *xq,
                                                 size_t xq_stride, int32_t n_tok) {
    KZ_PACK16_BODY(q6kz_col, PKK_Q6K_COL, Q6KZ_MAX_TOK, X86_FN(q6kz_decode), X86_FN(q6kz_tokens));
}
