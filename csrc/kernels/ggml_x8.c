/* ggml_x8.c — the x8 Q4_0 kernels of ggml_x8.h: AVX-512 VNNI (vpdpbusd on 256-bit vectors, the eight rows' double
 * accumulators in one zmm) and AVX2 (maddubs + madd), one body (ggml_x8_body.h). Both compute the same exact
 * integer sums and the same float steps.
 * Twin: pi2_go_dot_q4_0 (ggml_order.c) on the unpacked rows; pi2/reference/fdot.py dot_q4_0_repack. */
#include "ggml_x8.h"
#include "pack.h"

#if defined(__x86_64__) && defined(__GNUC__)
#include <immintrin.h>

#define X8_FN q4_0_x8_vnni
#define X8_TARGET __attribute__((target("avx2,fma,f16c,avx512f,avx512vl,avx512vnni")))
#define X8_DOT(acc, w, y) ((acc) = _mm256_dpbusd_epi32((acc), (w), (y)))
#define X8_ZMM 1
#include "ggml_x8_body.h"
#undef X8_FN
#undef X8_TARGET
#undef X8_DOT
#undef X8_ZMM

/* maddubs of nibbles (≤ 15) and int8 pairs stays within int16 (≤ 3810), and so does the sum of two */
#define X8_FN q4_0_x8_avx2
#define X8_TARGET __attribute__((target("avx2,fma,f16c")))
#define X8_DOT(acc, w, y) \
    ((acc) = _mm256_add_epi32((acc), _mm256_madd_epi16(_mm256_maddubs_epi16((w), (y)), _mm256_set1_epi16(1))))
#define X8_ZMM 0
#include "ggml_x8_body.h"
#undef X8_FN
#undef X8_TARGET
#undef X8_DOT
#undef X8_ZMM

#ifdef __clang__
#define CPU_F16C 1
#else
#define CPU_F16C __builtin_cpu_supports("f16c")
#endif

pi2_go_x8_fn pi2_go_q4_0_x8(void) {
    if (!__builtin_cpu_supports("avx2") || !__builtin_cpu_supports("fma") || !CPU_F16C) return NULL;
    if (__builtin_cpu_supports("avx512vnni") && __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("avx512f") &&
        pi2_kernels_variant()->allow_ext)   /* PI2_CPU_VARIANT=avx2: not (pack.h) */
        return q4_0_x8_vnni;
    return q4_0_x8_avx2;
}
#else
pi2_go_x8_fn pi2_go_q4_0_x8(void) { return NULL; }
#endif
