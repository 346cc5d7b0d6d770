/* neon_body.h — the NEON kernel bodies, included twice by neon.c: once for plain NEON (SDOT
 * emulated with vmull_s8 + pairwise adds), once with NEON_TARGET enabling dotprod (vdotq_s32).
 * Needs: NEON_TARGET (function attribute, may be empty), NEON_FN(name), NEON_DOTPROD (0/1).
 * Does not: stand alone; every function is static and named through NEON_FN.
 * Float order: x86's (x86_body.h), operation for operation, so results are bit-identical to the x86
 * kernels: its 8 float lanes are two float32x4_t (lanes 0-3, 4-7), each int32 lane holds the same
 * 4 byte products as x86's, FMAs are fused as vfmadd, and hsum8 adds in hsum_float_8's order.
 * Each kernel names its twin in ref.c / ref_k.h and its x86 counterpart of the same name. */

/* acc + lane l = the sum of the s8·s8 products of bytes 4l..4l+3 (x86's lanes; the emulation
 * forms pairs with vmull + vpaddlq, then adjacent pairs with vpaddq). Older clang hides vdotq_s32 unless the whole file is
 * built with +dotprod, so there the instruction is written out. */
static inline NEON_TARGET int32x4_t NEON_FN(dot)(int32x4_t acc, int8x16_t a, int8x16_t b) {
#if NEON_DOTPROD && defined(__clang__) && __clang_major__ < 18 && !defined(__ARM_FEATURE_DOTPROD)
    __asm__(".arch_extension dotprod\n\tsdot %0.4s, %1.16b, %2.16b" : "+w"(acc) : "w"(a), "w"(b));
    return acc;
#elif NEON_DOTPROD
    return vdotq_s32(acc, a, b);
#else
    const int32x4_t p = vpaddlq_s16(vmull_s8(vget_low_s8(a), vget_low_s8(b)));   /* bytes (2k, 2k+1) */
    const int32x4_t q = vpaddlq_s16(vmull_high_s8(a, b));                        /* bytes 8 + (2k, 2k+1) */
    return vaddq_s32(acc, vpaddq_s32(p, q));
#endif
}

static inline NEON_TARGET float NEON_FN(h2f)(pi2_fp16 h) { __fp16 f; memcpy(&f, &h, 2); return (float)f; }

/* 16 bytes, 0xFF where bit j (j = 0..15) of the 16-bit value is set. */
static inline NEON_TARGET uint8x16_t NEON_FN(bits16)(uint32_t v) {
    static const uint8_t sel[16] = {1, 2, 4, 8, 16, 32, 64, 128, 1, 2, 4, 8, 16, 32, 64, 128};
    return vtstq_u8(vcombine_u8(vdup_n_u8(v & 0xFF), vdup_n_u8((v >> 8) & 0xFF)), vld1q_u8(sel));
}

#define S8(u) vreinterpretq_s8_u8(u)

/* hsum_float_8 of x86_body.h on lanes lo = 0-3, hi = 4-7: (hi + lo), then (0+2, 1+3), then 0+1. */
static inline NEON_TARGET float NEON_FN(hsum8)(float32x4_t lo, float32x4_t hi) {
    const float32x4_t r = vaddq_f32(hi, lo);
    const float32x2_t h = vadd_f32(vget_low_f32(r), vget_high_f32(r));
    return vget_lane_f32(h, 0) + vget_lane_f32(h, 1);
}

/* One 32-value block of x86's 8-lane form: lanes of w0·y (values 0-15) and w1·y (16-31), converted
 * to float, acc = fma(d, lanes, acc). */
#define NEON_BLOCK32(acc0, acc1, w0, w1, yqs, d) do {                                              \
        const int32x4_t p0_ = NEON_FN(dot)(vdupq_n_s32(0), (w0), vld1q_s8(yqs));                   \
        const int32x4_t p1_ = NEON_FN(dot)(vdupq_n_s32(0), (w1), vld1q_s8((yqs) + 16));            \
        acc0 = vfmaq_n_f32(acc0, vcvtq_f32_s32(p0_), (d));                                          \
        acc1 = vfmaq_n_f32(acc1, vcvtq_f32_s32(p1_), (d));                                          \
    } while (0)

/* twin: q4_0_vec_dot in ref.c; x86: q4_0_vec_dot in x86_body.h */
static NEON_TARGET void NEON_FN(q4_0_vec_dot)(int64_t n, float *s, const void *w, const void *xq) {
    const blk_q4_0 *x = w; const blk_q8_0 *y = xq;
    float32x4_t acc0 = vdupq_n_f32(0), acc1 = vdupq_n_f32(0);
    for (int64_t i = 0; i < n / 32; i++) {
        const uint8x16_t b = vld1q_u8(x[i].qs);
        const int8x16_t lo = vsubq_s8(S8(vandq_u8(b, vdupq_n_u8(0x0F))), vdupq_n_s8(8));
        const int8x16_t hi = vsubq_s8(S8(vshrq_n_u8(b, 4)), vdupq_n_s8(8));
        NEON_BLOCK32(acc0, acc1, lo, hi, y[i].qs, NEON_FN(h2f)(x[i].d) * NEON_FN(h2f)(y[i].d));
    }
    *s = NEON_FN(hsum8)(acc0, acc1);
}

/* twin: q4_1_vec_dot in ref.c; x86: q4_1_vec_dot in x86_body.h */
static NEON_TARGET void NEON_FN(q4_1_vec_dot)(int64_t n, float *s, const void *w, const void *xq) {
    const blk_q4_1 *x = w; const blk_q8_1 *y = xq;
    float32x4_t acc0 = vdupq_n_f32(0), acc1 = vdupq_n_f32(0);
    float summs = 0;
    for (int64_t i = 0; i < n / 32; i++) {
        const uint8x16_t b = vld1q_u8(x[i].qs);
        NEON_BLOCK32(acc0, acc1, S8(vandq_u8(b, vdupq_n_u8(0x0F))), S8(vshrq_n_u8(b, 4)), y[i].qs,
                     NEON_FN(h2f)(x[i].d) * NEON_FN(h2f)(y[i].d));
        summs += NEON_FN(h2f)(x[i].m) * NEON_FN(h2f)(y[i].s);
    }
    *s = NEON_FN(hsum8)(acc0, acc1) + summs;
}

/* twin: q5_0_vec_dot in ref.c; x86: q5_0_vec_dot in x86_body.h. (q | h<<4) - 16 is q | (~h & 0xF0). */
static NEON_TARGET void NEON_FN(q5_0_vec_dot)(int64_t n, float *s, const void *w, const void *xq) {
    const blk_q5_0 *x = w; const blk_q8_0 *y = xq;
    float32x4_t acc0 = vdupq_n_f32(0), acc1 = vdupq_n_f32(0);
    for (int64_t i = 0; i < n / 32; i++) {
        uint32_t qh; memcpy(&qh, x[i].qh, 4);
        const uint8x16_t b = vld1q_u8(x[i].qs), f0 = vdupq_n_u8(0xF0);
        const uint8x16_t lo = vorrq_u8(vandq_u8(b, vdupq_n_u8(0x0F)), vbicq_u8(f0, NEON_FN(bits16)(qh)));
        const uint8x16_t hi = vorrq_u8(vshrq_n_u8(b, 4), vbicq_u8(f0, NEON_FN(bits16)(qh >> 16)));
        NEON_BLOCK32(acc0, acc1, S8(lo), S8(hi), y[i].qs, NEON_FN(h2f)(x[i].d) * NEON_FN(h2f)(y[i].d));
    }
    *s = NEON_FN(hsum8)(acc0, acc1);
}

/* twin: q5_1_vec_dot in ref.c; x86: q5_1_vec_dot in x86_body.h */
static NEON_TARGET void NEON_FN(q5_1_vec_dot)(int64_t n, float *s, const void *w, const void *xq) {
    const blk_q5_1 *x = w; const blk_q8_1 *y = xq;
    float32x4_t acc0 = vdupq_n_f32(0), acc1 = vdupq_n_f32(0);
    float summs = 0;
    for (int64_t i = 0; i < n / 32; i++) {
        uint32_t qh; memcpy(&qh, x[i].qh, 4);
        const uint8x16_t b = vld1q_u8(x[i].qs), b4 = vdupq_n_u8(0x10);
        const uint8x16_t lo = vorrq_u8(vandq_u8(b, vdupq_n_u8(0x0F)), vandq_u8(b4, NEON_FN(bits16)(qh)));
        const uint8x16_t hi = vorrq_u8(vshrq_n_u8(b, 4), vandq_u8(b4, NEON_FN(bits16)(qh >> 16)));
        NEON_BLOCK32(acc0, acc1, S8(lo), S8(hi), y[i].qs, NEON_FN(h2f)(x[i].d) * NEON_FN(h2f)(y[i].d));
        summs += NEON_FN(h2f)(x[i].m) * NEON_FN(h2f)(y[i].s);
    }
    *s = NEON_FN(hsum8)(acc0, acc1) + summs;
}

/* twin: q8_0_vec_dot in ref.c; x86: q8_0_vec_dot in x86_body.h */
static NEON_TARGET void NEON_FN(q8_0_vec_dot)(int64_t n, float *s, const void *w, const void *xq) {
    const blk_q8_0 *x = w; const blk_q8_0 *y = xq;
    float32x4_t acc0 = vdupq_n_f32(0), acc1 = vdupq_n_f32(0);
    for (int64_t i = 0; i < n / 32; i++)
        NEON_BLOCK32(acc0, acc1, vld1q_s8(x[i].qs), vld1q_s8(x[i].qs + 16), y[i].qs,
                     NEON_FN(h2f)(x[i].d) * NEON_FN(h2f)(y[i].d));
    *s = NEON_FN(hsum8)(acc0, acc1);
}

/* Q4_K block: isb[c] = sc[2c]·Σ lo·q8 + sc[2c+1]·Σ hi·q8 over 64-value chunk c, msb[c] = the mins
 * term of the same sub-blocks (q4_K_block_sums in ref_k.h); exact integers. */
static inline NEON_TARGET void NEON_FN(q4_K_sums)(const blk_q4_K *x, const blk_q8_K *y, int32_t isb[4], int32_t msb[4]) {
    const uint8x16_t m4 = vdupq_n_u8(0x0F);
    uint8_t sc[8], mn[8];
    for (int j = 0; j < 8; j++) pi2_k4_scale_min(j, x->scales, &sc[j], &mn[j]);
    for (int c = 0; c < 4; c++) {
        const uint8x16_t b0 = vld1q_u8(x->qs + 32 * c), b1 = vld1q_u8(x->qs + 32 * c + 16);
        const int8_t *q8 = y->qs + 64 * c;
        int32x4_t pl = NEON_FN(dot)(vdupq_n_s32(0), S8(vandq_u8(b0, m4)), vld1q_s8(q8));
        pl = NEON_FN(dot)(pl, S8(vandq_u8(b1, m4)), vld1q_s8(q8 + 16));
        int32x4_t ph = NEON_FN(dot)(vdupq_n_s32(0), S8(vshrq_n_u8(b0, 4)), vld1q_s8(q8 + 32));
        ph = NEON_FN(dot)(ph, S8(vshrq_n_u8(b1, 4)), vld1q_s8(q8 + 48));
        isb[c] = vaddvq_s32(vmlaq_n_s32(vmulq_n_s32(pl, sc[2 * c]), ph, sc[2 * c + 1]));
        msb[c] = mn[2 * c] * (y->bsums[4 * c] + y->bsums[4 * c + 1]) + mn[2 * c + 1] * (y->bsums[4 * c + 2] + y->bsums[4 * c + 3]);
    }
}

/* twin: q4_K_vec_dot in ref_k.h; x86: q4_K_vec_dot (one FMA per 256-block) */
static NEON_TARGET void NEON_FN(q4_K_vec_dot)(int64_t n, float *s, const void *w, const void *xq) {
    const blk_q4_K *x = w; const blk_q8_K *y = xq;
    float acc = 0, accm = 0;
    for (int64_t i = 0; i < n / QK_K; i++) {
        int32_t isb[4], msb[4];
        NEON_FN(q4_K_sums)(&x[i], &y[i], isb, msb);
        const float dd = y[i].d * NEON_FN(h2f)(x[i].d), dm = y[i].d * NEON_FN(h2f)(x[i].dmin);
        acc = fmaf((float)(isb[0] + isb[1] + isb[2] + isb[3]), dd, acc);
        accm = fmaf((float)(msb[0] + msb[1] + msb[2] + msb[3]), dm, accm);
    }
    *s = acc - accm;
}

/* twin: q4_K_gemm_dot in ref_k.h; x86: q4_K_gemm_dot (one FMA per 64 values) */
static NEON_TARGET void NEON_FN(q4_K_gemm_dot)(int64_t n, float *s, const void *w, const void *xq) {
    const blk_q4_K *x = w; const blk_q8_K *y = xq;
    float acc = 0, accm = 0;
    for (int64_t i = 0; i < n / QK_K; i++) {
        int32_t isb[4], msb[4];
        NEON_FN(q4_K_sums)(&x[i], &y[i], isb, msb);
        const float dd = y[i].d * NEON_FN(h2f)(x[i].d), dm = y[i].d * NEON_FN(h2f)(x[i].dmin);
        for (int k = 0; k < 4; k++) {
            acc = fmaf((float)isb[k], dd, acc);
            accm = fmaf((float)msb[k], dm, accm);
        }
    }
    *s = acc - accm;
}

/* Q6_K block as x86's q6_K_lanes: lane m (lo = 0-3, hi = 4-7) = Σ scale·code·q8 over the values whose
 * index mod 32 is in [4m, 4m+4) (unsigned 6-bit codes), minus 32·Σ scale·bsum of 32-value chunk m. */
static inline NEON_TARGET void NEON_FN(q6_K_lanes)(const blk_q6_K *x, const blk_q8_K *y, int32x4_t *lo, int32x4_t *hi) {
    const uint8x16_t m4 = vdupq_n_u8(0x0F), m3 = vdupq_n_u8(3);
    int32x4_t l0 = vdupq_n_s32(0), l1 = vdupq_n_s32(0);
    for (int h = 0; h < 2; h++) {
        const uint8_t *ql = x->ql + 64 * h, *qh = x->qh + 32 * h;
        const int8_t *sc = x->scales + 8 * h, *q8 = y->qs + 128 * h;
        const uint8x16_t h0 = vld1q_u8(qh), h1 = vld1q_u8(qh + 16);
        const uint8x16_t b0 = vld1q_u8(ql), b1 = vld1q_u8(ql + 16), b2 = vld1q_u8(ql + 32), b3 = vld1q_u8(ql + 48);
        const uint8x16_t base[4][2] = {
            {vandq_u8(b0, m4), vandq_u8(b1, m4)}, {vandq_u8(b2, m4), vandq_u8(b3, m4)},
            {vshrq_n_u8(b0, 4), vshrq_n_u8(b1, 4)}, {vshrq_n_u8(b2, 4), vshrq_n_u8(b3, 4)}};
        for (int k = 0; k < 4; k++) {
            const int8x16_t shift = vdupq_n_s8((int8_t)(-2 * k));
            const uint8x16_t q0 = vorrq_u8(base[k][0], vshlq_n_u8(vandq_u8(vshlq_u8(h0, shift), m3), 4));
            const uint8x16_t q1 = vorrq_u8(base[k][1], vshlq_n_u8(vandq_u8(vshlq_u8(h1, shift), m3), 4));
            l0 = vmlaq_n_s32(l0, NEON_FN(dot)(vdupq_n_s32(0), S8(q0), vld1q_s8(q8 + 32 * k)), sc[2 * k]);
            l1 = vmlaq_n_s32(l1, NEON_FN(dot)(vdupq_n_s32(0), S8(q1), vld1q_s8(q8 + 32 * k + 16)), sc[2 * k + 1]);
        }
    }
    const int16x8_t s0 = vmovl_s8(vld1_s8(x->scales)), s1 = vmovl_s8(vld1_s8(x->scales + 8));
    const int16x8_t bs0 = vld1q_s16(y->bsums), bs1 = vld1q_s16(y->bsums + 8);
    const int32x4_t c0 = vpaddq_s32(vmull_s16(vget_low_s16(bs0), vget_low_s16(s0)), vmull_high_s16(bs0, s0));
    const int32x4_t c1 = vpaddq_s32(vmull_s16(vget_low_s16(bs1), vget_low_s16(s1)), vmull_high_s16(bs1, s1));
    *lo = vsubq_s32(l0, vshlq_n_s32(c0, 5));
    *hi = vsubq_s32(l1, vshlq_n_s32(c1, 5));
}

/* twin: q6_K_vec_dot in ref_k.h; x86: q6_K_vec_dot (8 lanes, hsum_float_8) */
static NEON_TARGET void NEON_FN(q6_K_vec_dot)(int64_t n, float *s, const void *w, const void *xq) {
    const blk_q6_K *x = w; const blk_q8_K *y = xq;
    float32x4_t acc0 = vdupq_n_f32(0), acc1 = vdupq_n_f32(0);
    for (int64_t i = 0; i < n / QK_K; i++) {
        int32x4_t lo, hi;
        NEON_FN(q6_K_lanes)(&x[i], &y[i], &lo, &hi);
        const float d = y[i].d * NEON_FN(h2f)(x[i].d);
        acc0 = vfmaq_n_f32(acc0, vcvtq_f32_s32(lo), d);
        acc1 = vfmaq_n_f32(acc1, vcvtq_f32_s32(hi), d);
    }
    *s = NEON_FN(hsum8)(acc0, acc1);
}

/* twin: q6_K_tiled_dot in ref_k.h; x86: q6_K_tiled_dot (one FMA per block) */
static NEON_TARGET void NEON_FN(q6_K_tiled_dot)(int64_t n, float *s, const void *w, const void *xq) {
    const blk_q6_K *x = w; const blk_q8_K *y = xq;
    float acc = 0;
    for (int64_t i = 0; i < n / QK_K; i++) {
        int32x4_t lo, hi;
        NEON_FN(q6_K_lanes)(&x[i], &y[i], &lo, &hi);
        const float t = (float)vaddvq_s32(vaddq_s32(lo, hi)) * NEON_FN(h2f)(x[i].d);
        acc = fmaf(t, y[i].d, acc);
    }
    *s = acc;
}

/* twin: f32_vec_dot in ref.c (double sum); x86: f32_vec_dot (4 accumulators of 8 lanes per 32
 * values, (a0 + a1) + (a2 + a3), hsum_float_8, the tail added in double) */
static NEON_TARGET void NEON_FN(f32_vec_dot)(int64_t n, float *s, const void *w, const void *xq) {
    const float *a = w, *b = xq;
    float32x4_t acc[8];
    for (int k = 0; k < 8; k++) acc[k] = vdupq_n_f32(0);
    int64_t i = 0;
    for (; i + 32 <= n; i += 32)
        for (int k = 0; k < 8; k++) acc[k] = vfmaq_f32(acc[k], vld1q_f32(a + i + 4 * k), vld1q_f32(b + i + 4 * k));
    const float32x4_t lo = vaddq_f32(vaddq_f32(acc[0], acc[2]), vaddq_f32(acc[4], acc[6]));
    const float32x4_t hi = vaddq_f32(vaddq_f32(acc[1], acc[3]), vaddq_f32(acc[5], acc[7]));
    double sum = NEON_FN(hsum8)(lo, hi);
    for (; i < n; i++) sum += (double)(a[i] * b[i]);
    *s = (float)sum;
}

/* twin: f16_vec_dot in ref.c; x86: f16_vec_dot (2 accumulators of 8 lanes per 16 values) */
static NEON_TARGET void NEON_FN(f16_vec_dot)(int64_t n, float *s, const void *w, const void *xq) {
    const pi2_fp16 *a = w, *b = xq;
    float32x4_t acc[4];
    for (int k = 0; k < 4; k++) acc[k] = vdupq_n_f32(0);
    int64_t i = 0;
    for (; i + 16 <= n; i += 16)
        for (int k = 0; k < 4; k++) {
            const float32x4_t va = vcvt_f32_f16(vreinterpret_f16_u16(vld1_u16(a + i + 4 * k)));
            const float32x4_t vb = vcvt_f32_f16(vreinterpret_f16_u16(vld1_u16(b + i + 4 * k)));
            acc[k] = vfmaq_f32(acc[k], va, vb);
        }
    double sum = NEON_FN(hsum8)(vaddq_f32(acc[0], acc[2]), vaddq_f32(acc[1], acc[3]));
    for (; i < n; i++) sum += (double)(NEON_FN(h2f)(a[i]) * NEON_FN(h2f)(b[i]));
    *s = (float)sum;
}

/* NEON_BLOCK32 and S8 stay defined for neon_pack_body.h, which undefines them. */
