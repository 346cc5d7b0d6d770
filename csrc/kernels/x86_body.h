/* x86_body.h — the AVX2 kernel bodies, included twice by x86.c: once with X86_TARGET = AVX2,
 * once with AVX-512 VNNI, where the u8·s8 4-way dot becomes one vpdpbusd.
 * Needs: X86_TARGET (function attribute), X86_FN(name) (suffixes every name), X86_VNNI (0/1).
 * Does not: stand alone; every function is static and named through X86_FN.
 * Each kernel names its twin in ref.c (or ref_k.h). Q4_K, Q6_K, Q4_1, Q5_0 and Q8_0 compute in
 * the float order of pi2/qdot.py, the others differ from their twin by float summation order. */

static inline X86_TARGET float X86_FN(hsum)(__m256 v) {
    __m128 r = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    r = _mm_add_ps(r, _mm_movehl_ps(r, r));
    r = _mm_add_ss(r, _mm_movehdup_ps(r));
    return _mm_cvtss_f32(r);
}

static inline X86_TARGET float X86_FN(h2f)(pi2_fp16 h) { return _cvtsh_ss(h); }

/* 8 int32: sums of 4 adjacent u8·s8 products (u <= 128, so maddubs cannot saturate). */
static inline X86_TARGET __m256i X86_FN(dot_u8s8)(__m256i u, __m256i s) {
#if X86_VNNI
    return _mm256_dpbusd_epi32(_mm256_setzero_si256(), u, s);
#else
    return _mm256_madd_epi16(_mm256_maddubs_epi16(u, s), _mm256_set1_epi16(1));
#endif
}

/* 8 floats: sums of 4 adjacent s8·s8 products (|a| moved onto the unsigned side). */
static inline X86_TARGET __m256 X86_FN(dot_s8s8)(__m256i a, __m256i b) {
    return _mm256_cvtepi32_ps(X86_FN(dot_u8s8)(_mm256_sign_epi8(a, a), _mm256_sign_epi8(b, a)));
}

/* 16 nibble bytes -> 32 bytes: low nibbles in the low lane (values 0..15), high in the high. */
static inline X86_TARGET __m256i X86_FN(nibbles)(const uint8_t *qs) {
    const __m128i t = _mm_loadu_si128((const __m128i *)qs);
    return _mm256_and_si256(_mm256_set_m128i(_mm_srli_epi16(t, 4), t), _mm256_set1_epi8(0x0F));
}

/* 32 bits -> 32 bytes, byte j = 0xFF where bit j is set. */
static inline X86_TARGET __m256i X86_FN(bits_to_bytes)(const uint8_t *p) {
    uint32_t x32; memcpy(&x32, p, 4);
    const __m256i shuf = _mm256_set_epi64x(0x0303030303030303, 0x0202020202020202,
                                           0x0101010101010101, 0x0000000000000000);
    __m256i b = _mm256_shuffle_epi8(_mm256_set1_epi32((int)x32), shuf);
    b = _mm256_or_si256(b, _mm256_set1_epi64x(0x7fbfdfeff7fbfdfe));
    return _mm256_cmpeq_epi8(b, _mm256_set1_epi64x(-1));
}

/* twin: q4_0_vec_dot in ref.c */
static X86_TARGET void X86_FN(q4_0_vec_dot)(int64_t n, float *s, const void *w, const void *xq) {
    const blk_q4_0 *x = w; const blk_q8_0 *y = xq;
    __m256 acc = _mm256_setzero_ps();
    for (int64_t i = 0; i < n / 32; i++) {
        const __m256i q = _mm256_sub_epi8(X86_FN(nibbles)(x[i].qs), _mm256_set1_epi8(8));
        const __m256i v = _mm256_loadu_si256((const __m256i *)y[i].qs);
        const __m256 d = _mm256_set1_ps(X86_FN(h2f)(x[i].d) * X86_FN(h2f)(y[i].d));
        acc = _mm256_fmadd_ps(d, X86_FN(dot_s8s8)(q, v), acc);
    }
    *s = X86_FN(hsum)(acc);
}

/* twin: q4_1_vec_dot in ref.c */
static X86_TARGET void X86_FN(q4_1_vec_dot)(int64_t n, float *s, const void *w, const void *xq) {
    const blk_q4_1 *x = w; const blk_q8_1 *y = xq;
    __m256 acc = _mm256_setzero_ps();
    float summs = 0;
    for (int64_t i = 0; i < n / 32; i++) {
        const __m256i q = X86_FN(nibbles)(x[i].qs);
        const __m256i v = _mm256_loadu_si256((const __m256i *)y[i].qs);
        const __m256 d = _mm256_set1_ps(X86_FN(h2f)(x[i].d) * X86_FN(h2f)(y[i].d));
        acc = _mm256_fmadd_ps(d, _mm256_cvtepi32_ps(X86_FN(dot_u8s8)(q, v)), acc);
        summs += X86_FN(h2f)(x[i].m) * X86_FN(h2f)(y[i].s);
    }
    *s = X86_FN(hsum)(acc) + summs;
}

/* twin: q5_0_vec_dot in ref.c. (q | h<<4) - 16 is q | (~h & 0xF0) in two's complement. */
static X86_TARGET void X86_FN(q5_0_vec_dot)(int64_t n, float *s, const void *w, const void *xq) {
    const blk_q5_0 *x = w; const blk_q8_0 *y = xq;
    __m256 acc = _mm256_setzero_ps();
    for (int64_t i = 0; i < n / 32; i++) {
        const __m256i hi = _mm256_andnot_si256(X86_FN(bits_to_bytes)(x[i].qh),
                                               _mm256_set1_epi8((char)0xF0));
        const __m256i q = _mm256_or_si256(X86_FN(nibbles)(x[i].qs), hi);
        const __m256i v = _mm256_loadu_si256((const __m256i *)y[i].qs);
        const __m256 d = _mm256_set1_ps(X86_FN(h2f)(x[i].d) * X86_FN(h2f)(y[i].d));
        acc = _mm256_fmadd_ps(d, X86_FN(dot_s8s8)(q, v), acc);
    }
    *s = X86_FN(hsum)(acc);
}

/* twin: q5_1_vec_dot in ref.c */
static X86_TARGET void X86_FN(q5_1_vec_dot)(int64_t n, float *s, const void *w, const void *xq) {
    const blk_q5_1 *x = w; const blk_q8_1 *y = xq;
    __m256 acc = _mm256_setzero_ps();
    float summs = 0;
    for (int64_t i = 0; i < n / 32; i++) {
        const __m256i hi = _mm256_and_si256(X86_FN(bits_to_bytes)(x[i].qh), _mm256_set1_epi8(0x10));
        const __m256i q = _mm256_or_si256(X86_FN(nibbles)(x[i].qs), hi);
        const __m256i v = _mm256_loadu_si256((const __m256i *)y[i].qs);
        const __m256 d = _mm256_set1_ps(X86_FN(h2f)(x[i].d) * X86_FN(h2f)(y[i].d));
        acc = _mm256_fmadd_ps(d, _mm256_cvtepi32_ps(X86_FN(dot_u8s8)(q, v)), acc);
        summs += X86_FN(h2f)(x[i].m) * X86_FN(h2f)(y[i].s);
    }
    *s = X86_FN(hsum)(acc) + summs;
}

/* twin: q8_0_vec_dot in ref.c */
static X86_TARGET void X86_FN(q8_0_vec_dot)(int64_t n, float *s, const void *w, const void *xq) {
    const blk_q8_0 *x = w; const blk_q8_0 *y = xq;
    __m256 acc = _mm256_setzero_ps();
    for (int64_t i = 0; i < n / 32; i++) {
        const __m256i q = _mm256_loadu_si256((const __m256i *)x[i].qs);
        const __m256i v = _mm256_loadu_si256((const __m256i *)y[i].qs);
        const __m256 d = _mm256_set1_ps(X86_FN(h2f)(x[i].d) * X86_FN(h2f)(y[i].d));
        acc = _mm256_fmadd_ps(d, X86_FN(dot_s8s8)(q, v), acc);
    }
    *s = X86_FN(hsum)(acc);
}

static inline X86_TARGET int32_t X86_FN(hsum_i32)(__m256i v) {
    __m128i r = _mm_add_epi32(_mm256_castsi256_si128(v), _mm256_extracti128_si256(v, 1));
    r = _mm_add_epi32(r, _mm_shuffle_epi32(r, 0x4E));
    r = _mm_add_epi32(r, _mm_shuffle_epi32(r, 0xB1));
    return _mm_cvtsi128_si32(r);
}

/* acc + madd(a, b) in int32 (exact: the K-quant sums never overflow): one vpdpwssd with VNNI. */
static inline X86_TARGET __m256i X86_FN(madd_add)(__m256i acc, __m256i a, __m256i b) {
#if X86_VNNI
    return _mm256_dpwssd_epi32(acc, a, b);
#else
    return _mm256_add_epi32(acc, _mm256_madd_epi16(a, b));
#endif
}

#if !X86_VNNI
/* Scalar vfmadd: a·b + c with one rounding. */
static inline X86_TARGET float X86_FN(fma1)(float a, float b, float c) {
    return _mm_cvtss_f32(_mm_fmadd_ss(_mm_set_ss(a), _mm_set_ss(b), _mm_set_ss(c)));
}

/* Q4_K block: isb[k] = Σ sc·Σ code·q8 and msb[k] = Σ mn·bsum pair over sub-blocks 2k, 2k+1
 * (q4_K_block_sums in ref_k.h), as 4 int32 each. maddubs pairs u4·s8, madd by the sub-block scale. */
static inline X86_TARGET void X86_FN(q4_K_sums)(const blk_q4_K *x, const blk_q8_K *y, __m128i *isb, __m128i *msb) {
    const __m256i m4 = _mm256_set1_epi8(0x0F);
    uint8_t sc[8], mn[8];
    for (int j = 0; j < 8; j++) pi2_k4_scale_min(j, x->scales, &sc[j], &mn[j]);
    __m256i s[4];
    for (int c = 0; c < 4; c++) {
        const __m256i bits = _mm256_loadu_si256((const __m256i *)(x->qs + 32 * c));
        const __m256i lo = _mm256_and_si256(bits, m4);
        const __m256i hi = _mm256_and_si256(_mm256_srli_epi16(bits, 4), m4);
        const __m256i y0 = _mm256_loadu_si256((const __m256i *)(y->qs + 64 * c));
        const __m256i y1 = _mm256_loadu_si256((const __m256i *)(y->qs + 64 * c + 32));
        const __m256i p0 = _mm256_madd_epi16(_mm256_maddubs_epi16(lo, y0), _mm256_set1_epi16(sc[2 * c]));
        const __m256i p1 = _mm256_madd_epi16(_mm256_maddubs_epi16(hi, y1), _mm256_set1_epi16(sc[2 * c + 1]));
        s[c] = _mm256_add_epi32(p0, p1);
    }
    const __m256i h = _mm256_hadd_epi32(_mm256_hadd_epi32(s[0], s[1]), _mm256_hadd_epi32(s[2], s[3]));
    *isb = _mm_add_epi32(_mm256_castsi256_si128(h), _mm256_extracti128_si256(h, 1));
    const __m256i mins = _mm256_set_epi16(mn[7], mn[7], mn[6], mn[6], mn[5], mn[5], mn[4], mn[4],
                                          mn[3], mn[3], mn[2], mn[2], mn[1], mn[1], mn[0], mn[0]);
    const __m256i mp = _mm256_madd_epi16(_mm256_loadu_si256((const __m256i *)y->bsums), mins);
    const __m256i mh = _mm256_hadd_epi32(mp, mp);
    *msb = _mm_unpacklo_epi64(_mm256_castsi256_si128(mh), _mm256_extracti128_si256(mh, 1));
}

/* twin: q4_K_vec_dot in ref_k.h (the repacked GEMV order: one FMA per 256-block) */
static X86_TARGET void X86_FN(q4_K_vec_dot)(int64_t n, float *s, const void *w, const void *xq) {
    const blk_q4_K *x = w; const blk_q8_K *y = xq;
    float acc = 0, accm = 0;
    for (int64_t i = 0; i < n / QK_K; i++) {
        __m128i isb, msb;
        X86_FN(q4_K_sums)(&x[i], &y[i], &isb, &msb);
        __m128i t = _mm_hadd_epi32(isb, msb);
        t = _mm_hadd_epi32(t, t);                      /* [Σ isb, Σ msb, ...] */
        const float dd = y[i].d * X86_FN(h2f)(x[i].d), dm = y[i].d * X86_FN(h2f)(x[i].dmin);
        acc = X86_FN(fma1)((float)_mm_cvtsi128_si32(t), dd, acc);
        accm = X86_FN(fma1)((float)_mm_extract_epi32(t, 1), dm, accm);
    }
    *s = acc - accm;
}

/* twin: q4_K_gemm_dot in ref_k.h (the repacked GEMM order: one FMA per 64 values) */
static X86_TARGET void X86_FN(q4_K_gemm_dot)(int64_t n, float *s, const void *w, const void *xq) {
    const blk_q4_K *x = w; const blk_q8_K *y = xq;
    float acc = 0, accm = 0;
    for (int64_t i = 0; i < n / QK_K; i++) {
        __m128i isb, msb;
        X86_FN(q4_K_sums)(&x[i], &y[i], &isb, &msb);
        float fi[4], fm[4];
        _mm_storeu_ps(fi, _mm_cvtepi32_ps(isb));
        _mm_storeu_ps(fm, _mm_cvtepi32_ps(msb));
        const float dd = y[i].d * X86_FN(h2f)(x[i].d), dm = y[i].d * X86_FN(h2f)(x[i].dmin);
        for (int k = 0; k < 4; k++) {
            acc = X86_FN(fma1)(fi[k], dd, acc);
            accm = X86_FN(fma1)(fm[k], dm, accm);
        }
    }
    *s = acc - accm;
}

/* Q6_K block: int32 lane m = Σ scale·code·q8 over values with index mod 32 in [4m, 4m+4), minus
 * 32·Σ scale·bsum of 32-value chunk m (q6_K_vec_dot's lanes in ref_k.h). maddubs pairs u6·s8. */
static inline X86_TARGET __m256i X86_FN(q6_K_lanes)(const blk_q6_K *x, const blk_q8_K *y) {
    const __m256i m4 = _mm256_set1_epi8(0x0F), m2 = _mm256_set1_epi8(3);
    __m256i sumi = _mm256_setzero_si256();
    for (int h = 0; h < 2; h++) {
        const uint8_t *ql = x->ql + 64 * h;
        const int8_t *sc = x->scales + 8 * h, *q8 = y->qs + 128 * h;
        const __m256i qh = _mm256_loadu_si256((const __m256i *)(x->qh + 32 * h));
        const __m256i l0 = _mm256_loadu_si256((const __m256i *)ql);
        const __m256i l1 = _mm256_loadu_si256((const __m256i *)(ql + 32));
        __m256i q[4];
        q[0] = _mm256_and_si256(l0, m4);
        q[1] = _mm256_and_si256(l1, m4);
        q[2] = _mm256_and_si256(_mm256_srli_epi16(l0, 4), m4);
        q[3] = _mm256_and_si256(_mm256_srli_epi16(l1, 4), m4);
        for (int k = 0; k < 4; k++) {
            const __m256i hb = _mm256_and_si256(_mm256_srli_epi16(qh, 2 * k), m2);
            const __m256i qk = _mm256_or_si256(q[k], _mm256_slli_epi16(hb, 4));
            const __m256i v = _mm256_loadu_si256((const __m256i *)(q8 + 32 * k));
            const __m256i scv = _mm256_set_m128i(_mm_set1_epi16(sc[2 * k + 1]), _mm_set1_epi16(sc[2 * k]));
            sumi = _mm256_add_epi32(sumi, _mm256_madd_epi16(_mm256_maddubs_epi16(qk, v), scv));
        }
    }
    const __m256i scales = _mm256_cvtepi8_epi16(_mm_loadu_si128((const __m128i *)x->scales));
    const __m256i corr = _mm256_madd_epi16(_mm256_loadu_si256((const __m256i *)y->bsums), scales);
    return _mm256_sub_epi32(sumi, _mm256_slli_epi32(corr, 5));
}

/* twin: q6_K_vec_dot in ref_k.h (vec_dot_q6_K_q8_K's 8 lanes and hsum_float_8) */
static X86_TARGET void X86_FN(q6_K_vec_dot)(int64_t n, float *s, const void *w, const void *xq) {
    const blk_q6_K *x = w; const blk_q8_K *y = xq;
    __m256 acc = _mm256_setzero_ps();
    for (int64_t i = 0; i < n / QK_K; i++) {
        const float d = y[i].d * X86_FN(h2f)(x[i].d);
        acc = _mm256_fmadd_ps(_mm256_cvtepi32_ps(X86_FN(q6_K_lanes)(&x[i], &y[i])), _mm256_set1_ps(d), acc);
    }
    *s = X86_FN(hsum)(acc);
}

/* twin: q6_K_tiled_dot in ref_k.h (the tiled kernel: one FMA per block) */
static X86_TARGET void X86_FN(q6_K_tiled_dot)(int64_t n, float *s, const void *w, const void *xq) {
    const blk_q6_K *x = w; const blk_q8_K *y = xq;
    float acc = 0;
    for (int64_t i = 0; i < n / QK_K; i++) {
        const float t = (float)X86_FN(hsum_i32)(X86_FN(q6_K_lanes)(&x[i], &y[i])) * X86_FN(h2f)(x[i].d);
        acc = X86_FN(fma1)(t, y[i].d, acc);
    }
    *s = acc;
}

/* twin: f32_vec_dot in ref.c (which sums in double; this one in float, 4 accumulators) */
static X86_TARGET void X86_FN(f32_vec_dot)(int64_t n, float *s, const void *w, const void *xq) {
    const float *a = w, *b = xq;
    __m256 acc[4] = {_mm256_setzero_ps(), _mm256_setzero_ps(), _mm256_setzero_ps(), _mm256_setzero_ps()};
    int64_t i = 0;
    for (; i + 32 <= n; i += 32)
        for (int k = 0; k < 4; k++)
            acc[k] = _mm256_fmadd_ps(_mm256_loadu_ps(a + i + 8 * k), _mm256_loadu_ps(b + i + 8 * k), acc[k]);
    double sum = X86_FN(hsum)(_mm256_add_ps(_mm256_add_ps(acc[0], acc[1]), _mm256_add_ps(acc[2], acc[3])));
    for (; i < n; i++) sum += (double)(a[i] * b[i]);
    *s = (float)sum;
}

/* twin: f16_vec_dot in ref.c */
static X86_TARGET void X86_FN(f16_vec_dot)(int64_t n, float *s, const void *w, const void *xq) {
    const pi2_fp16 *a = w, *b = xq;
    __m256 acc[2] = {_mm256_setzero_ps(), _mm256_setzero_ps()};
    int64_t i = 0;
    for (; i + 16 <= n; i += 16)
        for (int k = 0; k < 2; k++) {
            const __m256 va = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(a + i + 8 * k)));
            const __m256 vb = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(b + i + 8 * k)));
            acc[k] = _mm256_fmadd_ps(va, vb, acc[k]);
        }
    double sum = X86_FN(hsum)(_mm256_add_ps(acc[0], acc[1]));
    for (; i < n; i++) sum += (double)(X86_FN(h2f)(a[i]) * X86_FN(h2f)(b[i]));
    *s = (float)sum;
}
#endif
