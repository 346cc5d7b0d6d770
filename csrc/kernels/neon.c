/* neon.c — aarch64 vec_dot kernels: plain NEON, and a variant using SDOT (vdotq_s32) where the
 * CPU has it (getauxval(AT_HWCAP) & HWCAP_ASIMDDP), chosen at run time.
 * Does: compile neon_body.h twice, the second time with a dotprod function target attribute, so
 *       no global -march flag is needed; install the variant the CPU supports into a table.
 * Does not: quantize or dequantize (the reference does that, bit-exact); run on other CPUs
 *       (everything but a stub compiles away off aarch64).
 * Each kernel's reference twin is the function of the same name in ref.c (or ref_k.h).
 * Float order: x86's (x86.c), so aarch64 and x86-64 compute the same bits: the 8 float lanes of the
 * AVX2 kernels as two float32x4_t, the same int32 lane contents, fused FMAs and hsum_float_8's
 * order; Q4_K, Q5_K (neon_q5k_body.h) and Q6_K also in their batch orders (vec_dot_batch). F32/F16 too.
 * BF16 runs the reference on both. No four-token kernels yet (matmul.c then calls these per token). */
#include "pack.h"
#include "traits.h"

#include <stdio.h>

#if defined(__aarch64__)
#include <arm_neon.h>
#include <math.h>
#include <sys/auxv.h>
#ifndef HWCAP_ASIMDDP
#define HWCAP_ASIMDDP (1UL << 20)
#endif

#define NEON_TARGET
#define NEON_FN(name) name##_neon
#define NEON_DOTPROD 0
#include "neon_body.h"
#include "neon_q5k_body.h"
#include "neon_pack_body.h"
#undef NEON_TARGET
#undef NEON_FN
#undef NEON_DOTPROD

#if defined(__clang__)
#define NEON_TARGET __attribute__((target("dotprod")))
#else
#define NEON_TARGET __attribute__((target("arch=armv8.2-a+dotprod")))
#endif
#define NEON_FN(name) name##_dotprod
#define NEON_DOTPROD 1
#include "neon_body.h"
#include "neon_q5k_body.h"
#include "neon_pack_body.h"

static void set_dot(pi2_type_traits *t, int type, pi2_vec_dot_fn fn, const char *impl) {
    t[type].vec_dot = fn;
    t[type].vec_dot_impl = impl;
}

#ifndef HWCAP_CPUID
#define HWCAP_CPUID (1UL << 11)
#endif
#ifndef HWCAP2_I8MM
#define HWCAP2_I8MM (1UL << 13)
#endif

/* The variant: SDOT or not (HWCAP), and the core's implementer and part from MIDR_EL1 where the kernel
 * lets user space read it (HWCAP_CPUID), so a report names the core (0x41/0xd0b: Cortex-A76). */
/* PI2_CPU_VARIANT=neon (`want`) forces the NEON kernels (no SDOT) on a CPU with dotprod. */
int pi2_kernels_variant_neon(pi2_cpu_variant *v, const char *want) {
    const unsigned long hw = getauxval(AT_HWCAP), hw2 = getauxval(AT_HWCAP2);
    unsigned long midr = 0;
    if (hw & HWCAP_CPUID) __asm__("mrs %0, MIDR_EL1" : "=r"(midr));
    if (want && strcmp(want, "neon")) {
        snprintf(v->error, sizeof v->error, "PI2_CPU_VARIANT=%.40s: not a variant of this CPU (accepted: auto, neon)",
                 want);
        want = NULL;
    }
    if (want) v->allow_ext = 0;
    const int dp = !want && (hw & HWCAP_ASIMDDP) != 0;
    snprintf(v->name, sizeof v->name, "%s", dp ? "neon-dotprod" : "neon");
    snprintf(v->why, sizeof v->why, "implementer %#lx part %#lx%s: %s", (midr >> 24) & 0xFF, (midr >> 4) & 0xFFF,
             hw2 & HWCAP2_I8MM ? " (i8mm)" : "", want ? "PI2_CPU_VARIANT=neon: NEON kernels, no SDOT"
             : dp ? "SDOT kernels, x8 packed rows" : "NEON kernels, x8 packed rows");
    v->prefetch = 0;
    return 1;
}

#define SET(T, fn) set_dot(t, T, dp ? fn##_dotprod : fn##_neon, dp ? "dotprod" : "neon")

uint32_t pi2_kernels_install_neon(pi2_type_traits *t, int allow_ext) {
    const int dp = allow_ext && (getauxval(AT_HWCAP) & HWCAP_ASIMDDP) != 0;
    SET(PI2_T_Q4_0, q4_0_vec_dot);
    SET(PI2_T_Q4_1, q4_1_vec_dot);
    SET(PI2_T_Q5_0, q5_0_vec_dot);
    SET(PI2_T_Q5_1, q5_1_vec_dot);
    SET(PI2_T_Q8_0, q8_0_vec_dot);
    SET(PI2_T_Q4_K, q4_K_vec_dot);
    SET(PI2_T_Q6_K, q6_K_vec_dot);
    SET(PI2_T_Q5_K, q5_K_vec_dot);
    SET(PI2_T_F32, f32_vec_dot);
    SET(PI2_T_F16, f16_vec_dot);
    t[PI2_T_Q4_1].vec_dot_pack = dp ? q4_1_dot_pack_dotprod : q4_1_dot_pack_neon;   /* the x8 layout (pack.h) */
    t[PI2_T_Q5_0].vec_dot_pack = dp ? q5_0_dot_pack_dotprod : q5_0_dot_pack_neon;
    t[PI2_T_Q8_0].vec_dot_pack = dp ? q8_0_dot_pack_dotprod : q8_0_dot_pack_neon;
    t[PI2_T_Q4_K].vec_dot_batch = dp ? q4_K_gemm_dot_dotprod : q4_K_gemm_dot_neon;
    t[PI2_T_Q6_K].vec_dot_batch = dp ? q6_K_tiled_dot_dotprod : q6_K_tiled_dot_neon;
    t[PI2_T_Q5_K].vec_dot_batch = dp ? q5_K_tiled_dot_dotprod : q5_K_tiled_dot_neon;
    return PI2_K_NEON | (dp ? PI2_K_DOTPROD : 0);
}

#else

int pi2_kernels_variant_neon(pi2_cpu_variant *v, const char *want) {
    (void)v; (void)want;
    return 0;
}

uint32_t pi2_kernels_install_neon(pi2_type_traits *t, int allow_ext) {
    (void)t; (void)allow_ext;
    return 0;
}

#endif
