/* neon_pack_body.h — the NEON kernels of the x8 repacked layout (pack.h), included by neon.c after neon_body.h
 * in both passes (plain NEON and dotprod): eight rows of one token per call, each row's result bit for bit
 * its plain kernel's (x86's float order: the same NEON_BLOCK32 steps per row), the eight fp16 scales of a
 * block column converted by two vcvt and multiplied once.
 * Twins: q4_1/q5_0/q8_0_vec_dot of the same table on pi2_unpack_group's rows. */

/* d[r] = h2f(row r's d) · h2f(yd), r < 8. */
static inline NEON_TARGET void NEON_FN(pk_scales)(const uint8_t *d8, pi2_fp16 yd, float d[8]) {
    const float16x8_t h = vreinterpretq_f16_u16(vld1q_u16((const uint16_t *)d8));
    const float y = NEON_FN(h2f)(yd);
    vst1q_f32(d, vmulq_n_f32(vcvt_f32_f16(vget_low_f16(h)), y));
    vst1q_f32(d + 4, vmulq_n_f32(vcvt_high_f32_f16(h), y));
}

/* twin: q8_0_vec_dot on the unpacked rows */
static NEON_TARGET void NEON_FN(q8_0_dot_pack)(int64_t n, float *s, const void *grp, const void *xq) {
    const uint8_t *g = grp; const blk_q8_0 *y = xq;
    float32x4_t a0[8], a1[8];
    for (int r = 0; r < 8; r++) a0[r] = a1[r] = vdupq_n_f32(0);
    for (int64_t i = 0; i < n / 32; i++) {
        const uint8_t *b = g + (size_t)i * 8 * sizeof(blk_q8_0);
        float d[8];
        NEON_FN(pk_scales)(b, y[i].d, d);
        for (int r = 0; r < 8; r++) {
            const int8_t *q = (const int8_t *)(b + 16 + 32 * r);
            NEON_BLOCK32(a0[r], a1[r], vld1q_s8(q), vld1q_s8(q + 16), y[i].qs, d[r]);
        }
    }
    for (int r = 0; r < 8; r++) s[r] = NEON_FN(hsum8)(a0[r], a1[r]);
}

/* twin: q4_1_vec_dot on the unpacked rows */
static NEON_TARGET void NEON_FN(q4_1_dot_pack)(int64_t n, float *s, const void *grp, const void *xq) {
    const uint8_t *g = grp; const blk_q8_1 *y = xq;
    float32x4_t a0[8], a1[8], sm0 = vdupq_n_f32(0), sm1 = vdupq_n_f32(0);
    for (int r = 0; r < 8; r++) a0[r] = a1[r] = vdupq_n_f32(0);
    for (int64_t i = 0; i < n / 32; i++) {
        const uint8_t *b = g + (size_t)i * 8 * sizeof(blk_q4_1);
        float d[8], m[8];
        NEON_FN(pk_scales)(b, y[i].d, d);
        NEON_FN(pk_scales)(b + 16, y[i].s, m);   /* summs += h2f(m)·h2f(s) per row */
        sm0 = vaddq_f32(sm0, vld1q_f32(m));
        sm1 = vaddq_f32(sm1, vld1q_f32(m + 4));
        for (int r = 0; r < 8; r++) {
            const uint8x16_t q = vld1q_u8(b + 32 + 16 * r);
            NEON_BLOCK32(a0[r], a1[r], S8(vandq_u8(q, vdupq_n_u8(0x0F))), S8(vshrq_n_u8(q, 4)), y[i].qs, d[r]);
        }
    }
    float m[8];
    vst1q_f32(m, sm0);
    vst1q_f32(m + 4, sm1);
    for (int r = 0; r < 8; r++) s[r] = NEON_FN(hsum8)(a0[r], a1[r]) + m[r];
}

/* twin: q5_0_vec_dot on the unpacked rows */
static NEON_TARGET void NEON_FN(q5_0_dot_pack)(int64_t n, float *s, const void *grp, const void *xq) {
    const uint8_t *g = grp; const blk_q8_0 *y = xq;
    float32x4_t a0[8], a1[8];
    for (int r = 0; r < 8; r++) a0[r] = a1[r] = vdupq_n_f32(0);
    for (int64_t i = 0; i < n / 32; i++) {
        const uint8_t *b = g + (size_t)i * 8 * sizeof(blk_q5_0);
        float d[8];
        NEON_FN(pk_scales)(b, y[i].d, d);
        for (int r = 0; r < 8; r++) {
            uint32_t qh; memcpy(&qh, b + 16 + 4 * r, 4);
            const uint8x16_t q = vld1q_u8(b + 48 + 16 * r), f0 = vdupq_n_u8(0xF0);
            const uint8x16_t lo = vorrq_u8(vandq_u8(q, vdupq_n_u8(0x0F)), vbicq_u8(f0, NEON_FN(bits16)(qh)));
            const uint8x16_t hi = vorrq_u8(vshrq_n_u8(q, 4), vbicq_u8(f0, NEON_FN(bits16)(qh >> 16)));
            NEON_BLOCK32(a0[r], a1[r], S8(lo), S8(hi), y[i].qs, d[r]);
        }
    }
    for (int r = 0; r < 8; r++) s[r] = NEON_FN(hsum8)(a0[r], a1[r]);
}

#undef NEON_BLOCK32
#undef S8
