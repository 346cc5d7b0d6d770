/* x86_rows_body.h — the AVX-512 (BW) single-token K-quant kernels, included once by x86.c under the
 * VNNI target: Q4_K on four weight rows at once and Q6_K on one row, 64 values per instruction.
 * Does: the exact integer sums of ref_k.h computed 512 bits wide, then per output row the same float
 *       steps as the AVX2 kernels (convert, d_y·d_x, one FMA chain per row) in vector lanes.
 * Does not: stand alone (needs X86_TARGET / X86_FN of the VNNI pass, immintrin.h, traits.h), serve
 *       batches (the batch orders stay in x86_body.h / x86_tile_body.h).
 * Twins: q4_K_vec_dot and q6_K_vec_dot in ref_k.h. */

/* Fully unrolled: the per-row registers of these loops must not live in memory. */
#ifndef PI2_UNROLL
#define PI2_UNROLL _Pragma("GCC unroll 4")
#endif

/* Prefetch of the four-row kernels: the rows of a matrix are contiguous, so the group of four rows
 * PF_GROUPS groups on starts at w + 4·PF_GROUPS·w_stride; block i of a group prefetches that group's
 * bytes [i·4·bs, (i+1)·4·bs) (bs the block bytes), so the lines arrive before their group is reached. */
#define PF_GROUPS 2
static inline X86_TARGET void X86_FN(prefetch_group)(const uint8_t *row, size_t w_stride, int64_t i, size_t bs) {
    const uint8_t *p = row + 4 * PF_GROUPS * w_stride + (size_t)i * 4 * bs;
    for (size_t o = 0; o < 4 * bs; o += 64) _mm_prefetch((const char *)(p + o), _MM_HINT_T0);
}

/* The 8 six-bit scales and 8 mins of a Q4_K block (pi2_k4_scale_min, j = 0..7) as bytes of two u64. */
static inline void X86_FN(q4_K_scales8)(const uint8_t *q, uint64_t *sc, uint64_t *mn) {
    uint32_t a, b, c;
    memcpy(&a, q, 4); memcpy(&b, q + 4, 4); memcpy(&c, q + 8, 4);
    const uint32_t sc_hi = (c & 0x0f0f0f0fu) | ((a >> 2) & 0x30303030u);         /* j >= 4 */
    const uint32_t mn_hi = ((c >> 4) & 0x0f0f0f0fu) | ((b >> 2) & 0x30303030u);
    *sc = (a & 0x3f3f3f3fu) | (uint64_t)sc_hi << 32;
    *mn = (b & 0x3f3f3f3fu) | (uint64_t)mn_hi << 32;
}

/* One Q4_K block of one row against the prepared activations: 8 int32 lanes whose sum is Σ isb
 * (q4_K_block_sums), and 8 int32 lanes whose sum is Σ msb. ylo[c]/yhi[c] hold the Q8_K values that meet
 * the low / high nibbles of qs bytes 64c..64c+63; bsums the block's 16 bsums. */
static inline X86_TARGET void X86_FN(q4_K_row_lanes)(const blk_q4_K *x, const __m512i ylo[2], const __m512i yhi[2],
                                                      __m256i bsums, __m256i *isum, __m256i *msum) {
    const __m512i m4 = _mm512_set1_epi8(0x0F);
    /* word = scale byte k of the u64 in 128-bit lane order: lo01 {0,0,2,2}, hi01 {1,1,3,3}, lo23 {4,4,6,6}, hi23 {5,5,7,7} */
#define Q4K_PICK(a, b) _mm512_set_epi64(Q4K_W(b), Q4K_W(b), Q4K_W(b), Q4K_W(b), Q4K_W(a), Q4K_W(a), Q4K_W(a), Q4K_W(a))
#define Q4K_W(k) ((long long)(0x8000800080008000ull | (0x0001000100010001ull * (k))))
    const __m512i pick[4] = {Q4K_PICK(0, 2), Q4K_PICK(1, 3), Q4K_PICK(4, 6), Q4K_PICK(5, 7)};
#undef Q4K_PICK
#undef Q4K_W
    uint64_t sc, mn;
    X86_FN(q4_K_scales8)(x->scales, &sc, &mn);
    const __m512i scb = _mm512_set1_epi64((long long)sc);
    __m512i acc = _mm512_setzero_si512();
    PI2_UNROLL
    for (int c = 0; c < 2; c++) {
        const __m512i bits = _mm512_loadu_si512((const void *)(x->qs + 64 * c));
        const __m512i lo = _mm512_and_si512(bits, m4);
        const __m512i hi = _mm512_and_si512(_mm512_srli_epi16(bits, 4), m4);
        const __m512i plo = _mm512_madd_epi16(_mm512_maddubs_epi16(lo, ylo[c]), _mm512_shuffle_epi8(scb, pick[2 * c]));
        const __m512i phi = _mm512_madd_epi16(_mm512_maddubs_epi16(hi, yhi[c]), _mm512_shuffle_epi8(scb, pick[2 * c + 1]));
        acc = _mm512_add_epi32(acc, _mm512_add_epi32(plo, phi));
    }
    *isum = _mm256_add_epi32(_mm512_castsi512_si256(acc), _mm512_extracti64x4_epi64(acc, 1));
    const __m128i m8 = _mm_cvtsi64_si128((long long)mn);
    *msum = _mm256_madd_epi16(bsums, _mm256_cvtepu8_epi16(_mm_unpacklo_epi8(m8, m8)));   /* mn_j·bsum 2j, 2j+1 */
}

/* twin: q4_K_vec_dot in ref_k.h, on rows w, w + w_stride, w + 2·w_stride, w + 3·w_stride: s[k] = row k ·
 * the activation row. Lane k of the accumulators is row k's acc (lanes 0-3) and accm (lanes 4-7): per
 * 256-block acc = fma((float)Σ isb, d_y·d_x, acc), accm likewise with dmin; s[k] = acc − accm. */
static X86_TARGET void X86_FN(q4_K_vec_dot_rows4)(int64_t n, float *s, const void *w, size_t w_stride, const void *xq) {
    const blk_q8_K *y = xq;
    const uint8_t *row = w;
    __m256 acc = _mm256_setzero_ps();
    for (int64_t i = 0; i < n / QK_K; i++) {
        const __m512i ya = _mm512_loadu_si512((const void *)y[i].qs), yb = _mm512_loadu_si512((const void *)(y[i].qs + 64));
        const __m512i yc = _mm512_loadu_si512((const void *)(y[i].qs + 128)), yd = _mm512_loadu_si512((const void *)(y[i].qs + 192));
        const __m512i ylo[2] = {_mm512_shuffle_i64x2(ya, yb, 0x44), _mm512_shuffle_i64x2(yc, yd, 0x44)};
        const __m512i yhi[2] = {_mm512_shuffle_i64x2(ya, yb, 0xEE), _mm512_shuffle_i64x2(yc, yd, 0xEE)};
        const __m256i bsums = _mm256_loadu_si256((const __m256i *)y[i].bsums);
        X86_FN(prefetch_group)(row, w_stride, i, sizeof(blk_q4_K));
        __m256i is[4], ms[4];
        uint32_t dmin[4];
        PI2_UNROLL
        for (int k = 0; k < 4; k++) {
            const blk_q4_K *x = (const blk_q4_K *)(row + k * w_stride) + i;
            X86_FN(q4_K_row_lanes)(x, ylo, yhi, bsums, &is[k], &ms[k]);
            memcpy(&dmin[k], &x->d, 4);   /* d, dmin */
        }
        const __m256i hi_ = _mm256_hadd_epi32(_mm256_hadd_epi32(is[0], is[1]), _mm256_hadd_epi32(is[2], is[3]));
        const __m256i hm = _mm256_hadd_epi32(_mm256_hadd_epi32(ms[0], ms[1]), _mm256_hadd_epi32(ms[2], ms[3]));
        const __m256i sums = _mm256_add_epi32(_mm256_permute2x128_si256(hi_, hm, 0x20),
                                              _mm256_permute2x128_si256(hi_, hm, 0x31));   /* [Σisb k, Σmsb k] */
        const __m128i dd16 = _mm_set_epi32((int)dmin[3], (int)dmin[2], (int)dmin[1], (int)dmin[0]);
        /* [d0 d1 d2 d3 dmin0 .. dmin3] as fp16 words */
        const __m128i order = _mm_set_epi8(15, 14, 11, 10, 7, 6, 3, 2, 13, 12, 9, 8, 5, 4, 1, 0);
        const __m256 dd = _mm256_mul_ps(_mm256_set1_ps(y[i].d), _mm256_cvtph_ps(_mm_shuffle_epi8(dd16, order)));
        acc = _mm256_fmadd_ps(_mm256_cvtepi32_ps(sums), dd, acc);
    }
    _mm_storeu_ps(s, _mm_sub_ps(_mm256_castps256_ps128(acc), _mm256_extractf128_ps(acc, 1)));
}

/* q4_K_vec_dot_rows4 on four rows anywhere (rows[k]: one token's scattered active neurons), no prefetch (the
 * caller knows which rows come next): s[k] = rows[k] · the activation row, each bit for bit its vec_dot. */
static X86_TARGET void X86_FN(q4_K_vec_dot_rows4p)(int64_t n, float *s, const uint8_t *const *rows, const void *xq) {
    const blk_q8_K *y = xq;
    __m256 acc = _mm256_setzero_ps();
    for (int64_t i = 0; i < n / QK_K; i++) {
        const __m512i ya = _mm512_loadu_si512((const void *)y[i].qs), yb = _mm512_loadu_si512((const void *)(y[i].qs + 64));
        const __m512i yc = _mm512_loadu_si512((const void *)(y[i].qs + 128)), yd = _mm512_loadu_si512((const void *)(y[i].qs + 192));
        const __m512i ylo[2] = {_mm512_shuffle_i64x2(ya, yb, 0x44), _mm512_shuffle_i64x2(yc, yd, 0x44)};
        const __m512i yhi[2] = {_mm512_shuffle_i64x2(ya, yb, 0xEE), _mm512_shuffle_i64x2(yc, yd, 0xEE)};
        const __m256i bsums = _mm256_loadu_si256((const __m256i *)y[i].bsums);
        __m256i is[4], ms[4];
        uint32_t dmin[4];
        PI2_UNROLL
        for (int k = 0; k < 4; k++) {
            const blk_q4_K *x = (const blk_q4_K *)rows[k] + i;
            X86_FN(q4_K_row_lanes)(x, ylo, yhi, bsums, &is[k], &ms[k]);
            memcpy(&dmin[k], &x->d, 4);   /* d, dmin */
        }
        const __m256i hi_ = _mm256_hadd_epi32(_mm256_hadd_epi32(is[0], is[1]), _mm256_hadd_epi32(is[2], is[3]));
        const __m256i hm = _mm256_hadd_epi32(_mm256_hadd_epi32(ms[0], ms[1]), _mm256_hadd_epi32(ms[2], ms[3]));
        const __m256i sums = _mm256_add_epi32(_mm256_permute2x128_si256(hi_, hm, 0x20),
                                              _mm256_permute2x128_si256(hi_, hm, 0x31));
        const __m128i dd16 = _mm_set_epi32((int)dmin[3], (int)dmin[2], (int)dmin[1], (int)dmin[0]);
        const __m128i order = _mm_set_epi8(15, 14, 11, 10, 7, 6, 3, 2, 13, 12, 9, 8, 5, 4, 1, 0);
        const __m256 dd = _mm256_mul_ps(_mm256_set1_ps(y[i].d), _mm256_cvtph_ps(_mm_shuffle_epi8(dd16, order)));
        acc = _mm256_fmadd_ps(_mm256_cvtepi32_ps(sums), dd, acc);
    }
    _mm_storeu_ps(s, _mm_sub_ps(_mm256_castps256_ps128(acc), _mm256_extractf128_ps(acc, 1)));
}

/* Q6_K block, 64 values per step: the 8 int32 lanes of q6_K_lanes (x86_body.h), bit for bit. */
static inline X86_TARGET __m256i X86_FN(q6_K_lanes512)(const blk_q6_K *x, const blk_q8_K *y) {
    const __m512i m4 = _mm512_set1_epi8(0x0F), m30 = _mm512_set1_epi8(0x30);
    /* per 256-bit half: move the 2 high bits of chunk k to bits 4, 5 (k = 0, 1 left by 4, 2; k = 2, 3 right by 0, 2) */
    const __m512i shl = _mm512_inserti64x4(_mm512_set1_epi16(4), _mm256_set1_epi16(2), 1);
    const __m512i shr = _mm512_inserti64x4(_mm512_setzero_si512(), _mm256_set1_epi16(2), 1);
    const __m512i sc16 = _mm512_castsi256_si512(_mm256_cvtepi8_epi16(_mm_loadu_si128((const __m128i *)x->scales)));
    __m512i sumi = _mm512_setzero_si512();
    PI2_UNROLL
    for (int h = 0; h < 2; h++) {
        const __m512i l = _mm512_loadu_si512((const void *)(x->ql + 64 * h));
        const __m512i qh = _mm512_broadcast_i64x4(_mm256_loadu_si256((const __m256i *)(x->qh + 32 * h)));
        /* A | (B & C) */
        const __m512i qlo = _mm512_ternarylogic_epi64(_mm512_and_si512(l, m4), _mm512_sllv_epi16(qh, shl), m30, 0xF8);
        const __m512i qhi = _mm512_ternarylogic_epi64(_mm512_and_si512(_mm512_srli_epi16(l, 4), m4),
                                                      _mm512_srlv_epi16(qh, shr), m30, 0xF8);
        const __m512i ylo = _mm512_loadu_si512((const void *)(y->qs + 128 * h));
        const __m512i yhi = _mm512_loadu_si512((const void *)(y->qs + 128 * h + 64));
        /* 128-bit lane L of the low (high) nibble vector takes scale 8h + L (8h + 4 + L) */
        const __m512i idx_lo = _mm512_set_epi64(0x0003000300030003 + 0x0008000800080008 * h, 0x0003000300030003 + 0x0008000800080008 * h,
                                                0x0002000200020002 + 0x0008000800080008 * h, 0x0002000200020002 + 0x0008000800080008 * h,
                                                0x0001000100010001 + 0x0008000800080008 * h, 0x0001000100010001 + 0x0008000800080008 * h,
                                                0x0000000000000000 + 0x0008000800080008 * h, 0x0000000000000000 + 0x0008000800080008 * h);
        const __m512i idx_hi = _mm512_add_epi16(idx_lo, _mm512_set1_epi16(4));
        sumi = _mm512_add_epi32(sumi, _mm512_madd_epi16(_mm512_maddubs_epi16(qlo, ylo), _mm512_permutexvar_epi16(idx_lo, sc16)));
        sumi = _mm512_add_epi32(sumi, _mm512_madd_epi16(_mm512_maddubs_epi16(qhi, yhi), _mm512_permutexvar_epi16(idx_hi, sc16)));
    }
    const __m256i s8 = _mm256_add_epi32(_mm512_castsi512_si256(sumi), _mm512_extracti64x4_epi64(sumi, 1));
    const __m256i corr = _mm256_madd_epi16(_mm256_loadu_si256((const __m256i *)y->bsums), _mm512_castsi512_si256(sc16));
    return _mm256_sub_epi32(s8, _mm256_slli_epi32(corr, 5));
}

/* twin: q6_K_vec_dot in ref_k.h (the AVX2 kernel's float steps, its integer lanes 512 bits wide) */
static X86_TARGET void X86_FN(q6_K_vec_dot512)(int64_t n, float *s, const void *w, const void *xq) {
    const blk_q6_K *x = w; const blk_q8_K *y = xq;
    __m256 acc = _mm256_setzero_ps();
    for (int64_t i = 0; i < n / QK_K; i++) {
        const float d = y[i].d * _cvtsh_ss(x[i].d);
        acc = _mm256_fmadd_ps(_mm256_cvtepi32_ps(X86_FN(q6_K_lanes512)(&x[i], &y[i])), _mm256_set1_ps(d), acc);
    }
    __m128 r = _mm_add_ps(_mm256_castps256_ps128(acc), _mm256_extractf128_ps(acc, 1));
    r = _mm_add_ps(r, _mm_movehl_ps(r, r));
    r = _mm_add_ss(r, _mm_movehdup_ps(r));
    *s = _mm_cvtss_f32(r);
}
