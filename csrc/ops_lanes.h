/* ops_lanes.h — the float helpers ops.c, attn.c and flash_attn.c share (internal): ggml_order's emulated FMA, the
 * integer-mask selects and F16 rounding their vectorised loops use, _mm512_reduce_add_ps's order on 16 lanes, and
 * WIDE_CLONES, which builds a loop of plain float operations for AVX-512, AVX2 and the baseline. */
#ifndef PI2_OPS_LANES_H
#define PI2_OPS_LANES_H
#include <math.h>
#include <stdint.h>

#include "kernels/traits.h"

/* a·b + c with one rounding of the exact product's sum, as ggml_order.fma32 emulates FMA: the product
 * of two floats is exact in double (no libm call, no FMA instruction needed). */
static inline float fma32(float a, float b, float c) { return (float)((double)a * (double)b + (double)c); }

/* The lane loops of these files are plain float (or exact double) operations, equal per element at any
 * vector width: on x86-64 GCC build them also for AVX2 and AVX-512 and pick at load. */
#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__)
#define WIDE_CLONES __attribute__((target_clones("avx512f", "avx2", "default")))
#else
#define WIDE_CLONES
#endif

/* Selects on integer masks (all ones or zero): GCC will not if-convert float selects under its
 * default trapping-math rules, and these loops must vectorise. */
static inline uint32_t mask_if(int cond) { return (uint32_t)0 - (uint32_t)(cond != 0); }
static inline float select_f(uint32_t mask, float a, float b) {
    return pi2_f32_from_bits((mask & pi2_f32_to_bits(a)) | (~mask & pi2_f32_to_bits(b)));
}

/* pi2_fp16_to_f32(pi2_f32_to_fp16(x)) (traits.h's FP16-library bit tricks), with integer selects. */
static inline float f16_round(float f) {
    const uint32_t w = pi2_f32_to_bits(f), shl1_w = w + w, sign = w & 0x80000000u;
    uint32_t bias = shl1_w & 0xFF000000u;
    bias = bias < 0x71000000u ? 0x71000000u : bias;
    const float base = pi2_f32_from_bits((bias >> 1) + 0x07800000u) + (fabsf(f) * 0x1.0p+112f) * 0x1.0p-110f;
    const uint32_t bb = pi2_f32_to_bits(base), nonsign = ((bb >> 13) & 0x7C00u) + (bb & 0x0FFFu);
    const uint32_t is_nan = mask_if(shl1_w > 0xFF000000u);
    const uint32_t h = ((sign >> 16) | (is_nan & 0x7E00u) | (~is_nan & nonsign)) & 0xFFFFu;
    const uint32_t w2 = h << 16, two_w = w2 + w2;
    const float normalized = pi2_f32_from_bits((two_w >> 4) + (0xE0u << 23)) * 0x1.0p-112f;
    const float denormalized = pi2_f32_from_bits((two_w >> 17) | (126u << 23)) - 0.5f;
    return pi2_f32_from_bits((w2 & 0x80000000u) | pi2_f32_to_bits(select_f(mask_if(two_w < (1u << 27)), denormalized, normalized)));
}

/* Horizontal sum of 16 lanes as GCC expands _mm512_reduce_add_ps (ggml_order.reduce16): halves, halves,
 * (0+2, 1+3), 0+1. */
static inline float reduce16(const float *v) {
    float r8[8], r4[4];
    for (int i = 0; i < 8; i++) r8[i] = v[8 + i] + v[i];
    for (int i = 0; i < 4; i++) r4[i] = r8[4 + i] + r8[i];
    return (r4[0] + r4[2]) + (r4[1] + r4[3]);
}

#endif
