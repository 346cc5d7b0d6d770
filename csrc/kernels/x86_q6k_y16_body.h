/* x86_q6k_y16_body.h — Q6_K's prompt kernel on 256-bit registers (AVX2): 16 packed rows (two consecutive x8 groups
 * of pack_k.c) × up to 32 tokens, the tiled order (q6_K_tiled_dot in ref_k.h), bit for bit.
 * Per block column the 6-bit codes of both groups are decoded once into q6ky_col (a ymm per group and 4-byte unit:
 * 4 codes of each of 8 rows, 4 KiB in all, from L1 after), with the scales as int16 pairs; then every token of the
 * call runs on them, four at a time: per unit the activation's 4 matching bytes are broadcast once for both groups,
 * maddubs (pairs ≤ 2·63·128), the pairs of two units of one sub-block added in int16 (≤ 4·63·128 < 2^15: exact),
 * then one madd with the sub-block's scale pair into one exact int32 sum per token and group (8 accumulators): three
 * multiplies per two units and group where the 8-row kernel has four. The -32 of every code is -32·Σ_m sc_m·bsum_m (madd on scale pairs).
 * Then ref_k.h's one float step per block: acc = ((float)isum·d)·y.d + acc (an FMA), the float sums in memory.
 * Where q6_K_tiled_pack (x86_pack_k_body.h) decodes each block column again for every four tokens, this decodes it
 * once per call and shares each broadcast between two groups.
 * Included by x86.c in the AVX2 pass only, after x86_pack_k_body.h (PKK_Q6K_COL, pkk_ld32). Chosen for the ymm
 * variant without VNNI (avx2). */

/* One block column of 16 rows: q[u][g] the codes of unit u = 32h + 8k + c (values 128h + 32k + 4c..+3) of group g;
 * sc[m][g] sub-block m's scale as an int16 pair per row; sp[p][g] the scale pairs (sc_2p, sc_2p+1); xd[g] = d. */
typedef struct {
    __m256i q[64][2], sc[16][2], sp[8][2];
    __m256 xd[2];
} q6ky_col;

static inline __attribute__((always_inline)) X86_TARGET void X86_FN(q6ky_decode)(const uint8_t *b, size_t gs,
                                                                                 q6ky_col *col) {
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
    for (int g = 0; g < 2; g++) {
        const uint8_t *bg = b + (size_t)g * gs;
        for (int a = 0; a < 4; a++) {
            const __m256i u = _mm256_loadu_si256((const __m256i *)(bg + 16 + 32 * a));
            for (int j = 0; j < 4; j++) col->sc[4 * a + j][g] = _mm256_srai_epi16(_mm256_shuffle_epi8(u, pick16[j]), 8);
        }
        for (int m = 0; m < 8; m++) col->sp[m][g] = _mm256_blend_epi16(col->sc[2 * m][g], col->sc[2 * m + 1][g], 0xAA);
        Q5K_UNROLL
        for (int c = 0; c < 8; c++)
            for (int h = 0; h < 2; h++) {
                const uint8_t *u = bg + 144 + 96 * (2 * c + h);
                const __m256i l0 = _mm256_loadu_si256((const __m256i *)u);
                const __m256i l1 = _mm256_loadu_si256((const __m256i *)(u + 32));
                const __m256i qh = _mm256_loadu_si256((const __m256i *)(u + 64));
                const __m256i q[4] = {   /* unit 32h + 8k + c */
                    _mm256_or_si256(_mm256_and_si256(l0, m4), _mm256_and_si256(_mm256_slli_epi16(qh, 4), m30)),
                    _mm256_or_si256(_mm256_and_si256(l1, m4), _mm256_and_si256(_mm256_slli_epi16(qh, 2), m30)),
                    _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(l0, 4), m4), _mm256_and_si256(qh, m30)),
                    _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(l1, 4), m4),
                                    _mm256_and_si256(_mm256_srli_epi16(qh, 2), m30))};
                for (int k = 0; k < 4; k++) col->q[32 * h + 8 * k + c][g] = q[k];
            }
        col->xd[g] = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)bg));
    }
}

/* One block column (block i of NT tokens' rows y[t]) into acc[t] (16 floats per token, group 0's rows first). */
static inline __attribute__((always_inline)) X86_TARGET void X86_FN(q6ky_tokens)(const q6ky_col *col,
        const blk_q8_K *const *y, float *acc, const int NT) {
    __m256i isum[4][2];
    for (int t = 0; t < NT; t++) {   /* -32·Σ_m sc_m·bsum_m */
        __m256i off[2] = {_mm256_setzero_si256(), _mm256_setzero_si256()};
        for (int p = 0; p < 8; p++) {
            const int16_t *bs = y[t]->bsums + 2 * p;
            const __m256i bp = _mm256_set1_epi32((int32_t)((uint16_t)bs[0] | (uint32_t)(uint16_t)bs[1] << 16));
            for (int g = 0; g < 2; g++) off[g] = _mm256_add_epi32(off[g], _mm256_madd_epi16(col->sp[p][g], bp));
        }
        for (int g = 0; g < 2; g++) isum[t][g] = _mm256_sub_epi32(_mm256_setzero_si256(), _mm256_slli_epi32(off[g], 5));
    }
    _Pragma("GCC unroll 1")   /* a runtime loop: fully unrolled, GCC hoists the loads and spills */
    for (int hk = 0; hk < 8; hk++) {   /* h = hk / 4, k = hk % 4: sub-blocks 2hk (c < 4) and 2hk + 1 */
        Q5K_UNROLL
        for (int c = 0; c < 8; c += 2) {   /* units c, c + 1: the same sub-block */
            const int u = 32 * (hk / 4) + 8 * (hk % 4) + c;
            const __m256i *scv = col->sc[2 * hk + (c >= 4)];
            for (int t = 0; t < NT; t++) {
                const int8_t *yq = y[t]->qs + 128 * (hk / 4) + 32 * (hk % 4) + 4 * c;
                const __m256i y0 = _mm256_set1_epi32(pkk_ld32(yq)), y1 = _mm256_set1_epi32(pkk_ld32(yq + 4));
                for (int g = 0; g < 2; g++) {   /* two units' pairs summed in int16: |Σ| ≤ 4·63·128 < 2^15 */
                    const __m256i p = _mm256_add_epi16(_mm256_maddubs_epi16(col->q[u][g], y0),
                                                       _mm256_maddubs_epi16(col->q[u + 1][g], y1));
                    isum[t][g] = _mm256_add_epi32(isum[t][g], _mm256_madd_epi16(p, scv[g]));
                }
            }
        }
    }
    for (int t = 0; t < NT; t++)
        for (int g = 0; g < 2; g++)
            _mm256_storeu_ps(acc + 16 * t + 8 * g,
                             _mm256_fmadd_ps(_mm256_mul_ps(_mm256_cvtepi32_ps(isum[t][g]), col->xd[g]),
                                             _mm256_set1_ps(y[t]->d), _mm256_loadu_ps(acc + 16 * t + 8 * g)));
}

/* The 16-row call of both AVX2 K-quant kernels (Q5_K uses it too): each block column decoded once into COL_T, then
 * every token of the call on it, four at a time; the float sums in acc, copied out at the end. */
#define KY_PACK16_BODY(COL_T, COL_BYTES, MAX_TOK, DECODE, TOKENS)                                            \
    const uint8_t *g = grp, *x = xq;                                                                        \
    const size_t gs = (size_t)(n / QK_K) * (COL_BYTES);   /* bytes of one group */                           \
    COL_T col;                                                                                               \
    __attribute__((aligned(32))) float acc[(MAX_TOK) * 16];                                                  \
    memset(acc, 0, sizeof(float) * 16 * (size_t)n_tok);                                                      \
    for (int64_t i = 0; i < n / QK_K; i++) {                                                                 \
        DECODE(g + (size_t)i * (COL_BYTES), gs, &col);                                                       \
        const blk_q8_K *y[MAX_TOK];                                                                          \
        for (int32_t t = 0; t < n_tok; t++) y[t] = (const blk_q8_K *)(x + (size_t)t * xq_stride) + i;        \
        int32_t t = 0;                                                                                       \
        for (; t + 4 <= n_tok; t += 4) TOKENS(&col, y + t, acc + 16 * t, 4);                                 \
        for (; t < n_tok; t++) TOKENS(&col, y + t, acc + 16 * t, 1);                                         \
    }                                                                                                        \
    for (int32_t t = 0; t < n_tok; t++) memcpy(s + (size_t)t * s_stride, acc + 16 * t, 16 * sizeof(float))

#define Q6KY_MAX_TOK 32   /* most tokens per call: the decoded column (5.1 KiB) serves them all from L1 */

/* twin: q6_K_tiled_dot (ref_k.h), 16 rows (two consecutive packed groups at grp) x up to Q6KY_MAX_TOK tokens:
 * s[t·s_stride + r], r < 16. */
static X86_TARGET void X86_FN(q6_K_tiled_pack16)(int64_t n, float *s, size_t s_stride, const void *grp, const void *xq,
                                                 size_t xq_stride, int32_t n_tok) {
    KY_PACK16_BODY(q6ky_col, PKK_Q6K_COL, Q6KY_MAX_TOK, X86_FN(q6ky_decode), X86_FN(q6ky_tokens));
}
