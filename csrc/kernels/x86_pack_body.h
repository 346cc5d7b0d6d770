/* x86_pack_body.h — the kernels of the x8 repacked layout (pack.h): eight output rows of one token per call,
 * s[r] = row r of the group · the activation row, each bit for bit the plain kernel's result (vec_dot of the
 * same table: the same exact integer lanes, the same per-block float products, FMAs and final sum per row).
 * Included by x86.c in the AVX2 pass (ymm kernels) and in the AVX-512 VNNI pass (ymm kernels with vpdpbusd,
 * and zmm kernels: two rows per register, the signed weights offset to unsigned and the offset's sum
 * taken off the int32 lanes, where AVX-512 has no vpsignb).
 * Needs: X86_TARGET, X86_FN, X86_VNNI and x86_body.h's helpers; pk_prefetch (bytes ahead, 0 none).
 * Twins: the plain vec_dot of the same table on pi2_unpack_group's rows (ref: q4_1/q5_0/q8_0_vec_dot in ref.c). */

static inline X86_TARGET void X86_FN(pk_prefetch)(const uint8_t *b, size_t col) {
    if (!pk_prefetch) return;
    for (size_t o = 0; o < col; o += 64) _mm_prefetch((const char *)(b + pk_prefetch + o), _MM_HINT_T0);
}

/* The 8 rows' d_x·d_y: one conversion of the 8 fp16 scales, one product each (as h2f(x.d)·h2f(y.d)). */
static inline X86_TARGET __m256 X86_FN(pk_scales)(const uint8_t *d8, pi2_fp16 yd) {
    return _mm256_mul_ps(_mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)d8)), _mm256_set1_ps(X86_FN(h2f)(yd)));
}

#define PK_LANE(dv, r) _mm256_permutevar8x32_ps((dv), _mm256_set1_epi32(r))

/* twin: q8_0_vec_dot of this table on the unpacked rows */
static X86_TARGET void X86_FN(q8_0_dot_pack)(int64_t n, float *s, const void *grp, const void *xq) {
    const uint8_t *g = grp; const blk_q8_0 *y = xq;
    __m256 acc[8];
    for (int r = 0; r < 8; r++) acc[r] = _mm256_setzero_ps();
    for (int64_t i = 0; i < n / 32; i++) {
        const uint8_t *b = g + (size_t)i * 8 * sizeof(blk_q8_0);
        X86_FN(pk_prefetch)(b, 8 * sizeof(blk_q8_0));
        const __m256i v = _mm256_loadu_si256((const __m256i *)y[i].qs);
        const __m256 dv = X86_FN(pk_scales)(b, y[i].d);
        for (int r = 0; r < 8; r++) {
            const __m256i q = _mm256_loadu_si256((const __m256i *)(b + 16 + 32 * r));
            acc[r] = _mm256_fmadd_ps(PK_LANE(dv, r), X86_FN(dot_s8s8)(q, v), acc[r]);
        }
    }
    for (int r = 0; r < 8; r++) s[r] = X86_FN(hsum)(acc[r]);
}

/* twin: q4_1_vec_dot of this table on the unpacked rows */
static X86_TARGET void X86_FN(q4_1_dot_pack)(int64_t n, float *s, const void *grp, const void *xq) {
    const uint8_t *g = grp; const blk_q8_1 *y = xq;
    __m256 acc[8], sm = _mm256_setzero_ps();
    for (int r = 0; r < 8; r++) acc[r] = _mm256_setzero_ps();
    for (int64_t i = 0; i < n / 32; i++) {
        const uint8_t *b = g + (size_t)i * 8 * sizeof(blk_q4_1);
        X86_FN(pk_prefetch)(b, 8 * sizeof(blk_q4_1));
        const __m256i v = _mm256_loadu_si256((const __m256i *)y[i].qs);
        const __m256 dv = X86_FN(pk_scales)(b, y[i].d);
        for (int r = 0; r < 8; r++) {
            const __m256i q = X86_FN(nibbles)(b + 32 + 16 * r);
            acc[r] = _mm256_fmadd_ps(PK_LANE(dv, r), _mm256_cvtepi32_ps(X86_FN(dot_u8s8)(q, v)), acc[r]);
        }
        sm = _mm256_add_ps(sm, X86_FN(pk_scales)(b + 16, y[i].s));   /* summs += h2f(m)·h2f(s) per row */
    }
    float m[8];
    _mm256_storeu_ps(m, sm);
    for (int r = 0; r < 8; r++) s[r] = X86_FN(hsum)(acc[r]) + m[r];
}

/* twin: q5_0_vec_dot of this table on the unpacked rows */
static X86_TARGET void X86_FN(q5_0_dot_pack)(int64_t n, float *s, const void *grp, const void *xq) {
    const uint8_t *g = grp; const blk_q8_0 *y = xq;
    __m256 acc[8];
    for (int r = 0; r < 8; r++) acc[r] = _mm256_setzero_ps();
    for (int64_t i = 0; i < n / 32; i++) {
        const uint8_t *b = g + (size_t)i * 8 * sizeof(blk_q5_0);
        X86_FN(pk_prefetch)(b, 8 * sizeof(blk_q5_0));
        const __m256i v = _mm256_loadu_si256((const __m256i *)y[i].qs);
        const __m256 dv = X86_FN(pk_scales)(b, y[i].d);
        for (int r = 0; r < 8; r++) {
            const __m256i hi = _mm256_andnot_si256(X86_FN(bits_to_bytes)(b + 16 + 4 * r), _mm256_set1_epi8((char)0xF0));
            const __m256i q = _mm256_or_si256(X86_FN(nibbles)(b + 48 + 16 * r), hi);
            acc[r] = _mm256_fmadd_ps(PK_LANE(dv, r), X86_FN(dot_s8s8)(q, v), acc[r]);
        }
    }
    for (int r = 0; r < 8; r++) s[r] = X86_FN(hsum)(acc[r]);
}

#if X86_VNNI
/* ---- zmm: rows 2p and 2p+1 in the low and high halves of one register ---- */

/* Row pair p's scales: [d_2p ×8, d_2p+1 ×8]. */
static inline X86_TARGET __m512 X86_FN(pk_pair)(__m256 dv, int p) {
    const __m512i idx = _mm512_inserti64x4(_mm512_set1_epi32(2 * p), _mm256_set1_epi32(2 * p + 1), 1);
    return _mm512_permutexvar_ps(idx, _mm512_castps256_ps512(dv));
}

/* 32 nibble bytes of rows a, b (16 each) -> [a lo, a hi | b lo, b hi] as bytes 0..15. */
static inline X86_TARGET __m512i X86_FN(pk_nibbles2)(const uint8_t *qs) {
    const __m512i z = _mm512_permutexvar_epi64(_mm512_set_epi64(3, 2, 3, 2, 1, 0, 1, 0),
                                               _mm512_castsi256_si512(_mm256_loadu_si256((const __m256i *)qs)));
    return _mm512_and_si512(_mm512_srlv_epi64(z, _mm512_set_epi64(4, 4, 0, 0, 4, 4, 0, 0)), _mm512_set1_epi8(0x0F));
}

/* Row r's result: the plain kernel's hsum of its 8 lanes. */
static inline X86_TARGET void X86_FN(pk_finish)(const __m512 acc[4], float *s) {
    for (int p = 0; p < 4; p++) {
        s[2 * p] = X86_FN(hsum)(_mm512_castps512_ps256(acc[p]));
        s[2 * p + 1] = X86_FN(hsum)(_mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(acc[p]), 1)));
    }
}

/* −k·Σ(4 adjacent activation bytes) per int32 lane: what offsetting the weights by +k adds to vpdpbusd's lanes. */
static inline X86_TARGET __m512i X86_FN(pk_bias)(__m512i v, int shift) {
    const __m512i s4 = _mm512_dpbusd_epi32(_mm512_setzero_si512(), _mm512_set1_epi8(1), v);
    return _mm512_sub_epi32(_mm512_setzero_si512(), _mm512_slli_epi32(s4, shift));
}

static inline X86_TARGET __m512i X86_FN(pk_act)(const int8_t *qs) {
    return _mm512_broadcast_i64x4(_mm256_loadu_si256((const __m256i *)qs));
}

/* twin: q8_0_vec_dot of this table on the unpacked rows (w + 128 unsigned, 128·Σx taken off) */
static X86_TARGET void X86_FN(q8_0_dot_pack_z)(int64_t n, float *s, const void *grp, const void *xq) {
    const uint8_t *g = grp; const blk_q8_0 *y = xq;
    __m512 acc[4] = {_mm512_setzero_ps(), _mm512_setzero_ps(), _mm512_setzero_ps(), _mm512_setzero_ps()};
    for (int64_t i = 0; i < n / 32; i++) {
        const uint8_t *b = g + (size_t)i * 8 * sizeof(blk_q8_0);
        X86_FN(pk_prefetch)(b, 8 * sizeof(blk_q8_0));
        const __m512i v = X86_FN(pk_act)(y[i].qs), bias = X86_FN(pk_bias)(v, 7);
        const __m256 dv = X86_FN(pk_scales)(b, y[i].d);
        for (int p = 0; p < 4; p++) {
            const __m512i q = _mm512_xor_si512(_mm512_loadu_si512((const void *)(b + 16 + 64 * p)), _mm512_set1_epi8((char)0x80));
            acc[p] = _mm512_fmadd_ps(X86_FN(pk_pair)(dv, p), _mm512_cvtepi32_ps(_mm512_dpbusd_epi32(bias, q, v)), acc[p]);
        }
    }
    X86_FN(pk_finish)(acc, s);
}

/* twin: q4_1_vec_dot of this table on the unpacked rows */
static X86_TARGET void X86_FN(q4_1_dot_pack_z)(int64_t n, float *s, const void *grp, const void *xq) {
    const uint8_t *g = grp; const blk_q8_1 *y = xq;
    __m512 acc[4] = {_mm512_setzero_ps(), _mm512_setzero_ps(), _mm512_setzero_ps(), _mm512_setzero_ps()};
    __m256 sm = _mm256_setzero_ps();
    for (int64_t i = 0; i < n / 32; i++) {
        const uint8_t *b = g + (size_t)i * 8 * sizeof(blk_q4_1);
        X86_FN(pk_prefetch)(b, 8 * sizeof(blk_q4_1));
        const __m512i v = X86_FN(pk_act)(y[i].qs);
        const __m256 dv = X86_FN(pk_scales)(b, y[i].d);
        for (int p = 0; p < 4; p++) {
            const __m512i q = X86_FN(pk_nibbles2)(b + 32 + 32 * p);
            acc[p] = _mm512_fmadd_ps(X86_FN(pk_pair)(dv, p), _mm512_cvtepi32_ps(_mm512_dpbusd_epi32(_mm512_setzero_si512(), q, v)),
                                     acc[p]);
        }
        sm = _mm256_add_ps(sm, X86_FN(pk_scales)(b + 16, y[i].s));
    }
    float f[8], m[8];
    X86_FN(pk_finish)(acc, f);
    _mm256_storeu_ps(m, sm);
    for (int r = 0; r < 8; r++) s[r] = f[r] + m[r];
}

/* twin: q5_0_vec_dot of this table on the unpacked rows (the 5-bit value unsigned, 16·Σx taken off) */
static X86_TARGET void X86_FN(q5_0_dot_pack_z)(int64_t n, float *s, const void *grp, const void *xq) {
    const uint8_t *g = grp; const blk_q8_0 *y = xq;
    __m512 acc[4] = {_mm512_setzero_ps(), _mm512_setzero_ps(), _mm512_setzero_ps(), _mm512_setzero_ps()};
    for (int64_t i = 0; i < n / 32; i++) {
        const uint8_t *b = g + (size_t)i * 8 * sizeof(blk_q5_0);
        X86_FN(pk_prefetch)(b, 8 * sizeof(blk_q5_0));
        const __m512i v = X86_FN(pk_act)(y[i].qs), bias = X86_FN(pk_bias)(v, 4);
        const __m256 dv = X86_FN(pk_scales)(b, y[i].d);
        for (int p = 0; p < 4; p++) {
            uint64_t hb;
            memcpy(&hb, b + 16 + 8 * p, 8);
            const __m512i nib = X86_FN(pk_nibbles2)(b + 48 + 32 * p);
            const __m512i q = _mm512_mask_add_epi8(nib, _cvtu64_mask64(hb), nib, _mm512_set1_epi8(0x10));
            acc[p] = _mm512_fmadd_ps(X86_FN(pk_pair)(dv, p), _mm512_cvtepi32_ps(_mm512_dpbusd_epi32(bias, q, v)), acc[p]);
        }
    }
    X86_FN(pk_finish)(acc, s);
}
#endif
