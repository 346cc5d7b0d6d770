/* neon_q5k_body.h — the Q5_K kernels on plain rows, included by neon.c after neon_body.h, once per pass (NEON,
 * dotprod). x86's orders (x86_q5k_body.h), so aarch64 and x86-64 compute the same bits: ggml_vec_dot_q5_K_q8_K's
 * 8 int lanes (lane m = values 4m..4m+3 of every 32-value sub-block, lanes 0-3 and 4-7 as two int32x4_t), one
 * fused FMA per lane and block, hsum_float_8 and the mins chain; the tiled kernel's exact s1, s2 per block and its
 * two float steps. Twins: q5_K_vec_dot and q5_K_tiled_dot in ref.c.
 * Needs: NEON_TARGET, NEON_FN, NEON_FN(dot), NEON_FN(h2f), NEON_FN(hsum8) and S8 of neon_body.h. */

/* One Q5_K block: lanes lo (0-3) and hi (4-7) of Σ_j sc_j·Σ code·q8, and Σ_j mn_j·(bsums[2j] + bsums[2j+1]). */
static inline NEON_TARGET int32_t NEON_FN(q5_K_lanes)(const blk_q5_K *x, const blk_q8_K *y, int32x4_t *lo, int32x4_t *hi) {
    const uint8x16_t m4 = vdupq_n_u8(0x0F), m10 = vdupq_n_u8(0x10);
    uint8_t sc[8], mn[8];
    for (int j = 0; j < 8; j++) pi2_k4_scale_min(j, x->scales, &sc[j], &mn[j]);
    const uint8x16_t h0 = vld1q_u8(x->qh), h1 = vld1q_u8(x->qh + 16);
    int32x4_t l0 = vdupq_n_s32(0), l1 = vdupq_n_s32(0);
    int32_t hs = 0;
    for (int j = 0; j < 8; j++) {
        const uint8_t *qs = x->qs + 32 * (j / 2);
        const uint8x16_t b0 = vld1q_u8(qs), b1 = vld1q_u8(qs + 16);
        const int8x16_t shift = vdupq_n_s8((int8_t)(4 - j));   /* bit j of qh to bit 4 (negative: right) */
        const uint8x16_t n0 = j & 1 ? vshrq_n_u8(b0, 4) : vandq_u8(b0, m4);
        const uint8x16_t n1 = j & 1 ? vshrq_n_u8(b1, 4) : vandq_u8(b1, m4);
        const uint8x16_t q0 = vorrq_u8(n0, vandq_u8(vshlq_u8(h0, shift), m10));
        const uint8x16_t q1 = vorrq_u8(n1, vandq_u8(vshlq_u8(h1, shift), m10));
        const int8_t *q8 = y->qs + 32 * j;
        l0 = vmlaq_n_s32(l0, NEON_FN(dot)(vdupq_n_s32(0), S8(q0), vld1q_s8(q8)), sc[j]);
        l1 = vmlaq_n_s32(l1, NEON_FN(dot)(vdupq_n_s32(0), S8(q1), vld1q_s8(q8 + 16)), sc[j]);
        hs += mn[j] * (y->bsums[2 * j] + y->bsums[2 * j + 1]);
    }
    *lo = l0;
    *hi = l1;
    return hs;
}

/* twin: q5_K_vec_dot in ref.c; x86: q5_K_vec_dot (8 lanes, hsum_float_8, + the mins chain) */
static NEON_TARGET void NEON_FN(q5_K_vec_dot)(int64_t n, float *s, const void *w, const void *xq) {
    const blk_q5_K *x = w; const blk_q8_K *y = xq;
    float32x4_t acc0 = vdupq_n_f32(0), acc1 = vdupq_n_f32(0);
    float summs = 0;
    for (int64_t i = 0; i < n / QK_K; i++) {
        int32x4_t lo, hi;
        const int32_t hs = NEON_FN(q5_K_lanes)(&x[i], &y[i], &lo, &hi);
        const float d = y[i].d * NEON_FN(h2f)(x[i].d), dmin = -y[i].d * NEON_FN(h2f)(x[i].dmin);
        acc0 = vfmaq_n_f32(acc0, vcvtq_f32_s32(lo), d);
        acc1 = vfmaq_n_f32(acc1, vcvtq_f32_s32(hi), d);
        summs = fmaf(dmin, (float)hs, summs);
    }
    *s = NEON_FN(hsum8)(acc0, acc1) + summs;
}

/* twin: q5_K_tiled_dot in ref.c; x86: q5_K_tiled_dot (exact s1, s2 per block, two float steps) */
static NEON_TARGET void NEON_FN(q5_K_tiled_dot)(int64_t n, float *s, const void *w, const void *xq) {
    const blk_q5_K *x = w; const blk_q8_K *y = xq;
    float acc = 0;
    for (int64_t i = 0; i < n / QK_K; i++) {
        int32x4_t lo, hi;
        const int32_t hs = NEON_FN(q5_K_lanes)(&x[i], &y[i], &lo, &hi);
        const float f1d = (float)vaddvq_s32(vaddq_s32(lo, hi)) * NEON_FN(h2f)(x[i].d);
        acc = fmaf(fmaf(-NEON_FN(h2f)(x[i].dmin), (float)hs, f1d), y[i].d, acc);
    }
    *s = acc;
}
