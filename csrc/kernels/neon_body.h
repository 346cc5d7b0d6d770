/* neon_body.h — the NEON kernel bodies, included twice by neon.c: once for plain NEON (SDOT
 * emulated with vmull_s8 + vpadalq_s16), once with NEON_TARGET enabling dotprod (vdotq_s32).
 * Needs: NEON_TARGET (function attribute, may be empty), NEON_FN(name), NEON_DOTPROD (0/1).
 * Does not: stand alone; every function is static and named through NEON_FN.
 * Each kernel names its twin in ref.c; results differ from it only by float summation order. */

/* acc + the sums of 4 adjacent s8·s8 products (the emulation groups differently; only the
 * total over the vector is ever used). Older clang hides vdotq_s32 unless the whole file is
 * built with +dotprod, so there the instruction is written out. */
static inline NEON_TARGET int32x4_t NEON_FN(dot)(int32x4_t acc, int8x16_t a, int8x16_t b) {
#if NEON_DOTPROD && defined(__clang__) && __clang_major__ < 18 && !defined(__ARM_FEATURE_DOTPROD)
    __asm__(".arch_extension dotprod\n\tsdot %0.4s, %1.16b, %2.16b" : "+w"(acc) : "w"(a), "w"(b));
    return acc;
#elif NEON_DOTPROD
    return vdotq_s32(acc, a, b);
#else
    acc = vpadalq_s16(acc, vmull_s8(vget_low_s8(a), vget_low_s8(b)));
    return vpadalq_s16(acc, vmull_high_s8(a, b));
#endif
}

static inline NEON_TARGET float NEON_FN(h2f)(pi2_fp16 h) { __fp16 f; memcpy(&f, &h, 2); return (float)f; }

/* 16 bytes, 0xFF where bit j (j = 0..15) of the 16-bit value is set. */
static inline NEON_TARGET uint8x16_t NEON_FN(bits16)(uint32_t v) {
    static const uint8_t sel[16] = {1, 2, 4, 8, 16, 32, 64, 128, 1, 2, 4, 8, 16, 32, 64, 128};
    return vtstq_u8(vcombine_u8(vdup_n_u8(v & 0xFF), vdup_n_u8((v >> 8) & 0xFF)), vld1q_u8(sel));
}

#define S8(u) vreinterpretq_s8_u8(u)

/* twin: q4_0_vec_dot in ref.c */
static NEON_TARGET void NEON_FN(q4_0_vec_dot)(int64_t n, float *s, const void *w, const void *xq) {
    const blk_q4_0 *x = w; const blk_q8_0 *y = xq;
    float32x4_t acc = vdupq_n_f32(0);
    for (int64_t i = 0; i < n / 32; i++) {
        const uint8x16_t b = vld1q_u8(x[i].qs);
        const int8x16_t lo = vsubq_s8(S8(vandq_u8(b, vdupq_n_u8(0x0F))), vdupq_n_s8(8));
        const int8x16_t hi = vsubq_s8(S8(vshrq_n_u8(b, 4)), vdupq_n_s8(8));
        int32x4_t p = NEON_FN(dot)(vdupq_n_s32(0), lo, vld1q_s8(y[i].qs));
        p = NEON_FN(dot)(p, hi, vld1q_s8(y[i].qs + 16));
        acc = vfmaq_n_f32(acc, vcvtq_f32_s32(p), NEON_FN(h2f)(x[i].d) * NEON_FN(h2f)(y[i].d));
    }
    *s = vaddvq_f32(acc);
}

/* twin: q4_1_vec_dot in ref.c */
static NEON_TARGET void NEON_FN(q4_1_vec_dot)(int64_t n, float *s, const void *w, const void *xq) {
    const blk_q4_1 *x = w; const blk_q8_1 *y = xq;
    float32x4_t acc = vdupq_n_f32(0);
    float summs = 0;
    for (int64_t i = 0; i < n / 32; i++) {
        const uint8x16_t b = vld1q_u8(x[i].qs);
        int32x4_t p = NEON_FN(dot)(vdupq_n_s32(0), S8(vandq_u8(b, vdupq_n_u8(0x0F))), vld1q_s8(y[i].qs));
        p = NEON_FN(dot)(p, S8(vshrq_n_u8(b, 4)), vld1q_s8(y[i].qs + 16));
        acc = vfmaq_n_f32(acc, vcvtq_f32_s32(p), NEON_FN(h2f)(x[i].d) * NEON_FN(h2f)(y[i].d));
        summs += NEON_FN(h2f)(x[i].m) * NEON_FN(h2f)(y[i].s);
    }
    *s = vaddvq_f32(acc) + summs;
}

/* twin: q5_0_vec_dot in ref.c. (q | h<<4) - 16 is q | (~h & 0xF0) in two's complement. */
static NEON_TARGET void NEON_FN(q5_0_vec_dot)(int64_t n, float *s, const void *w, const void *xq) {
    const blk_q5_0 *x = w; const blk_q8_0 *y = xq;
    float32x4_t acc = vdupq_n_f32(0);
    for (int64_t i = 0; i < n / 32; i++) {
        uint32_t qh; memcpy(&qh, x[i].qh, 4);
        const uint8x16_t b = vld1q_u8(x[i].qs), f0 = vdupq_n_u8(0xF0);
        const uint8x16_t lo = vorrq_u8(vandq_u8(b, vdupq_n_u8(0x0F)), vbicq_u8(f0, NEON_FN(bits16)(qh)));
        const uint8x16_t hi = vorrq_u8(vshrq_n_u8(b, 4), vbicq_u8(f0, NEON_FN(bits16)(qh >> 16)));
        int32x4_t p = NEON_FN(dot)(vdupq_n_s32(0), S8(lo), vld1q_s8(y[i].qs));
        p = NEON_FN(dot)(p, S8(hi), vld1q_s8(y[i].qs + 16));
        acc = vfmaq_n_f32(acc, vcvtq_f32_s32(p), NEON_FN(h2f)(x[i].d) * NEON_FN(h2f)(y[i].d));
    }
    *s = vaddvq_f32(acc);
}

/* twin: q5_1_vec_dot in ref.c */
static NEON_TARGET void NEON_FN(q5_1_vec_dot)(int64_t n, float *s, const void *w, const void *xq) {
    const blk_q5_1 *x = w; const blk_q8_1 *y = xq;
    float32x4_t acc = vdupq_n_f32(0);
    float summs = 0;
    for (int64_t i = 0; i < n / 32; i++) {
        uint32_t qh; memcpy(&qh, x[i].qh, 4);
        const uint8x16_t b = vld1q_u8(x[i].qs), b4 = vdupq_n_u8(0x10);
        const uint8x16_t lo = vorrq_u8(vandq_u8(b, vdupq_n_u8(0x0F)), vandq_u8(b4, NEON_FN(bits16)(qh)));
        const uint8x16_t hi = vorrq_u8(vshrq_n_u8(b, 4), vandq_u8(b4, NEON_FN(bits16)(qh >> 16)));
        int32x4_t p = NEON_FN(dot)(vdupq_n_s32(0), S8(lo), vld1q_s8(y[i].qs));
        p = NEON_FN(dot)(p, S8(hi), vld1q_s8(y[i].qs + 16));
        acc = vfmaq_n_f32(acc, vcvtq_f32_s32(p), NEON_FN(h2f)(x[i].d) * NEON_FN(h2f)(y[i].d));
        summs += NEON_FN(h2f)(x[i].m) * NEON_FN(h2f)(y[i].s);
    }
    *s = vaddvq_f32(acc) + summs;
}

/* twin: q8_0_vec_dot in ref.c */
static NEON_TARGET void NEON_FN(q8_0_vec_dot)(int64_t n, float *s, const void *w, const void *xq) {
    const blk_q8_0 *x = w; const blk_q8_0 *y = xq;
    float32x4_t acc = vdupq_n_f32(0);
    for (int64_t i = 0; i < n / 32; i++) {
        int32x4_t p = NEON_FN(dot)(vdupq_n_s32(0), vld1q_s8(x[i].qs), vld1q_s8(y[i].qs));
        p = NEON_FN(dot)(p, vld1q_s8(x[i].qs + 16), vld1q_s8(y[i].qs + 16));
        acc = vfmaq_n_f32(acc, vcvtq_f32_s32(p), NEON_FN(h2f)(x[i].d) * NEON_FN(h2f)(y[i].d));
    }
    *s = vaddvq_f32(acc);
}

/* twin: q4_K_vec_dot in ref.c */
static NEON_TARGET void NEON_FN(q4_K_vec_dot)(int64_t n, float *s, const void *w, const void *xq) {
    const blk_q4_K *x = w; const blk_q8_K *y = xq;
    const uint8x16_t m4 = vdupq_n_u8(0x0F);
    float sumf = 0;
    for (int64_t i = 0; i < n / QK_K; i++) {
        uint8_t sc[8], mn[8];
        int32_t msum = 0;
        for (int j = 0; j < 8; j++) {
            pi2_k4_scale_min(j, x[i].scales, &sc[j], &mn[j]);
            msum += mn[j] * (y[i].bsums[2 * j] + y[i].bsums[2 * j + 1]);
        }
        int32x4_t isum = vdupq_n_s32(0);
        for (int c = 0; c < 4; c++) {
            const uint8x16_t b0 = vld1q_u8(x[i].qs + 32 * c), b1 = vld1q_u8(x[i].qs + 32 * c + 16);
            const int8_t *q8 = y[i].qs + 64 * c;
            int32x4_t pl = NEON_FN(dot)(vdupq_n_s32(0), S8(vandq_u8(b0, m4)), vld1q_s8(q8));
            pl = NEON_FN(dot)(pl, S8(vandq_u8(b1, m4)), vld1q_s8(q8 + 16));
            int32x4_t ph = NEON_FN(dot)(vdupq_n_s32(0), S8(vshrq_n_u8(b0, 4)), vld1q_s8(q8 + 32));
            ph = NEON_FN(dot)(ph, S8(vshrq_n_u8(b1, 4)), vld1q_s8(q8 + 48));
            isum = vmlaq_n_s32(isum, pl, sc[2 * c]);
            isum = vmlaq_n_s32(isum, ph, sc[2 * c + 1]);
        }
        const float d = NEON_FN(h2f)(x[i].d) * y[i].d, dmin = NEON_FN(h2f)(x[i].dmin) * y[i].d;
        sumf += d * vaddvq_s32(isum) - dmin * msum;
    }
    *s = sumf;
}

/* twin: q6_K_vec_dot in ref.c */
static NEON_TARGET void NEON_FN(q6_K_vec_dot)(int64_t n, float *s, const void *w, const void *xq) {
    const blk_q6_K *x = w; const blk_q8_K *y = xq;
    const uint8x16_t m4 = vdupq_n_u8(0x0F), m3 = vdupq_n_u8(3);
    float sumf = 0;
    for (int64_t i = 0; i < n / QK_K; i++) {
        int32x4_t isum = vdupq_n_s32(0);
        for (int h = 0; h < 2; h++) {
            const uint8_t *ql = x[i].ql + 64 * h, *qh = x[i].qh + 32 * h;
            const int8_t *sc = x[i].scales + 8 * h, *q8 = y[i].qs + 128 * h;
            const uint8x16_t h0 = vld1q_u8(qh), h1 = vld1q_u8(qh + 16);
            const uint8x16_t l0 = vld1q_u8(ql), l1 = vld1q_u8(ql + 16);
            const uint8x16_t l2 = vld1q_u8(ql + 32), l3 = vld1q_u8(ql + 48);
            const uint8x16_t base[4][2] = {
                {vandq_u8(l0, m4), vandq_u8(l1, m4)}, {vandq_u8(l2, m4), vandq_u8(l3, m4)},
                {vshrq_n_u8(l0, 4), vshrq_n_u8(l1, 4)}, {vshrq_n_u8(l2, 4), vshrq_n_u8(l3, 4)}};
            for (int k = 0; k < 4; k++) {
                const int8x16_t shift = vdupq_n_s8((int8_t)(-2 * k));
                const uint8x16_t hb0 = vshlq_n_u8(vandq_u8(vshlq_u8(h0, shift), m3), 4);
                const uint8x16_t hb1 = vshlq_n_u8(vandq_u8(vshlq_u8(h1, shift), m3), 4);
                const int8x16_t q0 = vsubq_s8(S8(vorrq_u8(base[k][0], hb0)), vdupq_n_s8(32));
                const int8x16_t q1 = vsubq_s8(S8(vorrq_u8(base[k][1], hb1)), vdupq_n_s8(32));
                const int32x4_t p0 = NEON_FN(dot)(vdupq_n_s32(0), q0, vld1q_s8(q8 + 32 * k));
                const int32x4_t p1 = NEON_FN(dot)(vdupq_n_s32(0), q1, vld1q_s8(q8 + 32 * k + 16));
                isum = vmlaq_n_s32(isum, p0, sc[2 * k]);
                isum = vmlaq_n_s32(isum, p1, sc[2 * k + 1]);
            }
        }
        sumf += NEON_FN(h2f)(x[i].d) * y[i].d * vaddvq_s32(isum);
    }
    *s = sumf;
}

#undef S8
