/* x86.c — AVX2+FMA+F16C vec_dot kernels, plus an AVX-512 VNNI (vpdpbusd) variant of the
 * 32-value block types and AVX-512BW one-token K-quant kernels, chosen at run time with __builtin_cpu_supports.
 * Does: compile x86_body.h and x86_tile_body.h twice (once per target) with function target attributes, so no
 *       global -march flag is needed; install the variants the CPU supports into a table.
 * Does not: quantize or dequantize (the reference does that, bit-exact); run on other CPUs
 *       (everything but a stub compiles away off x86-64).
 * Each kernel's reference twin is the function of the same name in ref.c. */
#include "pack.h"
#include "traits.h"

#include <stdio.h>

#if defined(__x86_64__)
#include <cpuid.h>
#include <immintrin.h>

/* Software prefetch distance of the packed kernels in bytes (0: none): set once by pi2_kernels_install_x86. */
static int32_t pk_prefetch;

#define X86_TARGET __attribute__((target("avx2,fma,f16c")))
#define X86_FN(name) name##_avx2
#define X86_VNNI 0
#include "x86_body.h"
#include "x86_tile_body.h"
#include "x86_q5_0_avx2_body.h"
#include "x86_pack_body.h"
#include "x86_pack_k_body.h"
#include "x86_pack_k_gemv_body.h"
#include "x86_q5k_body.h"
#include "x86_q6k_y16_body.h"
#include "x86_q5k_y16_body.h"
#include "x86_q5_1_body.h"
#undef X86_TARGET
#undef X86_FN
#undef X86_VNNI

#define X86_TARGET __attribute__((target("avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")))
#define X86_FN(name) name##_vnni
#define X86_VNNI 1
#include "x86_body.h"
#include "x86_tile_body.h"
#include "x86_rows_body.h"
#include "x86_pack_body.h"
#include "x86_pack_k_body.h"
#include "x86_pack_k_gemv_body.h"
#include "x86_q5k_body.h"
#include "x86_q5k_z_body.h"
#include "x86_q6k_z_body.h"
#include "x86_q5_1_body.h"

/* [allow_ext][type]: the base table's and the auto table's two-row kernels; written only while
 * pi2_traits fills its tables (once), read after. The auto table reads slot 0 when PI2_CPU_VARIANT made its
 * kernels the base ones (pack.h: allow_ext 0), since then both installs wrote slot 0. */
static pi2_vec_dot4x2_fn dot4x2[2][PI2_T_COUNT], dot4x4[2][PI2_T_COUNT], dot8x4[2][PI2_T_COUNT];
/* [allow_ext][type]: vec_dot_batch on eight tokens, likewise. */
static pi2_vec_dot4_fn batch8[2][PI2_T_COUNT];
/* [allow_ext][type]: the activation rows dot8x4 reads, made from vec_dot_type rows (NULL: those rows). */
static pi2_act_prep_fn prep8x4[2][PI2_T_COUNT];

static int slot(int32_t impl) { return impl == PI2_K_IMPL_AUTO && pi2_kernels_variant()->allow_ext; }

pi2_vec_dot4x2_fn pi2_kernels_dot4x2(int32_t type, int32_t impl) {
    if (!pi2_traits(type, impl) || impl == PI2_K_IMPL_REF) return NULL;   /* also fills the tables */
    return dot4x2[slot(impl)][type];
}

pi2_vec_dot4x2_fn pi2_kernels_dot4x4(int32_t type, int32_t impl) {
    if (!pi2_traits(type, impl) || impl == PI2_K_IMPL_REF) return NULL;
    return dot4x4[slot(impl)][type];
}

pi2_vec_dot4x2_fn pi2_kernels_dot8x4(int32_t type, int32_t impl) {
    if (!pi2_traits(type, impl) || impl == PI2_K_IMPL_REF) return NULL;
    return dot8x4[slot(impl)][type];
}

pi2_vec_dot4_fn pi2_kernels_batch8(int32_t type, int32_t impl) {
    if (!pi2_traits(type, impl) || impl == PI2_K_IMPL_REF) return NULL;
    return batch8[slot(impl)][type];
}

pi2_act_prep_fn pi2_kernels_dot8x4_prep(int32_t type, int32_t impl, int32_t *block_bytes) {
    *block_bytes = 0;
    if (!pi2_traits(type, impl) || impl == PI2_K_IMPL_REF) return NULL;
    const pi2_act_prep_fn f = prep8x4[slot(impl)][type];
    if (f) *block_bytes = Q8_0_WIDE_BYTES;
    return f;
}

/* [allow_ext][type]: the four-row one-token kernels, filled like dot4x2. */
static pi2_vec_dot_rows4_fn dot_rows4[2][PI2_T_COUNT];

pi2_vec_dot_rows4_fn pi2_kernels_dot_rows4(int32_t type, int32_t impl) {
    if (!pi2_traits(type, impl) || impl == PI2_K_IMPL_REF) return NULL;
    return dot_rows4[slot(impl)][type];
}

static pi2_vec_dot_rows4p_fn dot_rows4p[2][PI2_T_COUNT];

pi2_vec_dot_rows4p_fn pi2_kernels_dot_rows4p(int32_t type, int32_t impl) {
    if (!pi2_traits(type, impl) || impl == PI2_K_IMPL_REF) return NULL;
    return dot_rows4p[slot(impl)][type];
}

/* [allow_ext][type]: the packed one-token order on up to four tokens (x86_pack_k_gemv_body.h), filled like dot4x2. */
static pi2_vec_dot_pack4_fn dot_pack_n[2][PI2_T_COUNT];

pi2_vec_dot_pack4_fn pi2_kernels_dot_pack_n(int32_t type, int32_t impl) {
    if (!pi2_traits(type, impl) || impl == PI2_K_IMPL_REF) return NULL;
    return dot_pack_n[slot(impl)][type];
}

static void set_dot(pi2_type_traits *t, int type, pi2_vec_dot_fn fn, pi2_vec_dot4_fn fn4, const char *impl) {
    t[type].vec_dot = fn;
    t[type].vec_dot4 = fn4;
    t[type].vec_dot_impl = impl;
}

/* F16C from CPUID leaf 1 (clang 14's __builtin_cpu_supports does not know "f16c"). */
static int has_f16c(void) {
    unsigned a, b, c, d;
    return __get_cpuid(1, &a, &b, &c, &d) && (c & bit_F16C);
}

/* The CPU's vendor, family and model from CPUID leaves 0 and 1 (family and model with their extended fields). */
static void cpu_id(char vendor[13], unsigned *family, unsigned *model) {
    unsigned a = 0, b = 0, c = 0, d = 0;
    __get_cpuid(0, &a, &b, &c, &d);
    memcpy(vendor, &b, 4); memcpy(vendor + 4, &d, 4); memcpy(vendor + 8, &c, 4);
    vendor[12] = 0;
    __get_cpuid(1, &a, &b, &c, &d);
    const unsigned base = (a >> 8) & 0xF;
    *family = base + (base == 0xF ? (a >> 20) & 0xFF : 0);
    *model = ((a >> 4) & 0xF) | (base >= 6 ? ((a >> 16) & 0xF) << 4 : 0);
}

/* Which packed kernels and prefetch this CPU gets (the reasons are the `why` strings below):
 * - AMD Zen 4/5 (family 19h/1Ah with AVX-512): zmm kernels. Zen 4 runs 512-bit ops as two 256-bit halves at
 *   the full clock, so a zmm kernel issues half the instructions of a ymm one for the same work; its
 *   stream prefetchers follow the packed groups' single stream across pages: no software prefetch.
 * - Intel Skylake-SP / Cascade Lake / Cooper Lake (family 6 model 55h): ymm kernels with VNNI. 512-bit
 *   instructions move these cores to a lower clock licence for every thread of the core.
 * - Other Intel with AVX-512 VNNI (Ice Lake, Sapphire/Emerald/Granite Rapids): zmm kernels, and software
 *   prefetch 1 KiB ahead: their L2 streamer stops at each 4 KiB page and restarts slowly, and a matrix
 *   task is one long stream crossing a page every ~20 block columns.
 * - Everything else with AVX2: ymm kernels (AVX2, no VNNI).
 * PI2_CPU_VARIANT=avx2 (`want`) gives every CPU with AVX2 the last choice: the base table's kernels, no AVX-512
 * loop anywhere (a VM that advertises AVX-512 it runs slowly; comparisons with AVX2-only builds). */
int pi2_kernels_variant_x86(pi2_cpu_variant *v, const char *want) {
    __builtin_cpu_init();
    if (!(__builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") && has_f16c())) {
        if (want) snprintf(v->error, sizeof v->error, "PI2_CPU_VARIANT=%.40s: this CPU has no AVX2 kernels "
                           "(accepted: auto)", want);
        return 0;
    }
    char vendor[13];
    unsigned fam, mod;
    cpu_id(vendor, &fam, &mod);
    const int vnni = __builtin_cpu_supports("avx512vnni") && __builtin_cpu_supports("avx512vl") &&
                     __builtin_cpu_supports("avx512bw");
    const int amd = !strcmp(vendor, "AuthenticAMD") || !strcmp(vendor, "HygonGenuine"), intel = !strcmp(vendor, "GenuineIntel");
    const char *name, *why;
    v->prefetch = 0;
    if (want && strcmp(want, "avx2")) {
        snprintf(v->error, sizeof v->error, "PI2_CPU_VARIANT=%.40s: not a variant of this CPU (accepted: auto, avx2)",
                 want);
        want = NULL;
    }
    if (want) {
        name = "avx2";
        why = vnni ? "PI2_CPU_VARIANT=avx2: ymm kernels, AVX-512 and VNNI not used"
                   : "PI2_CPU_VARIANT=avx2: ymm kernels (no AVX-512 VNNI)";
        v->allow_ext = 0;
    } else if (vnni && amd) {
        name = fam >= 0x1A ? "zen5-zmm" : "zen4-zmm";
        why = "512-bit ops at full clock: zmm kernels, hardware prefetch";
    } else if (vnni && intel && fam == 6 && mod == 0x55) {
        name = "intel-skx-ymm";
        why = "AVX-512 lowers this core's clock: ymm kernels with VNNI";
    } else if (vnni) {
        name = intel ? "intel-zmm" : "zmm";
        why = intel ? "zmm kernels, software prefetch 1 KiB ahead (the L2 streamer restarts at every 4 KiB page)"
                    : "zmm kernels";
        v->prefetch = intel ? 1024 : 0;
    } else {
        name = "avx2";
        why = "ymm kernels (no AVX-512 VNNI)";
    }
    snprintf(v->name, sizeof v->name, "%s", name);
    snprintf(v->why, sizeof v->why, "%s family %Xh model %Xh: %s", vendor, fam, mod, why);
    return 1;
}

static int use_zmm(void) {
    const char *n = pi2_kernels_variant()->name;
    return strstr(n, "zmm") != NULL;
}

uint32_t pi2_kernels_install_x86(pi2_type_traits *t, int allow_ext) {
    __builtin_cpu_init();
    if (!(__builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") && has_f16c()))
        return 0;
    const int vnni = allow_ext && __builtin_cpu_supports("avx512vnni") &&
                     __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("avx512bw");
    if (vnni) {
        set_dot(t, PI2_T_Q4_0, q4_0_vec_dot_vnni, NULL, "avx512vnni");
        set_dot(t, PI2_T_Q4_1, q4_1_vec_dot_vnni, q4_1_vec_dot4_vnni, "avx512vnni");
        set_dot(t, PI2_T_Q5_0, q5_0_vec_dot_vnni, q5_0_vec_dot4_vnni, "avx512vnni");
        dot4x2[allow_ext != 0][PI2_T_Q5_0] = q5_0_vec_dot4x2_vnni;
        dot4x4[allow_ext != 0][PI2_T_Q5_0] = q5_0_vec_dot4x4_vnni;
        dot8x4[allow_ext != 0][PI2_T_Q5_0] = q5_0_vec_dot8x4_vnni;
        prep8x4[allow_ext != 0][PI2_T_Q5_0] = q8_0_wide_vnni;
        set_dot(t, PI2_T_Q5_1, q5_1_vec_dot_vnni, q5_1_vec_dot4_vnni, "avx512vnni");
        dot4x4[allow_ext != 0][PI2_T_Q5_1] = q5_1_vec_dot4x4_vnni;
        dot8x4[allow_ext != 0][PI2_T_Q5_1] = q5_1_vec_dot8x4_vnni;
        set_dot(t, PI2_T_Q8_0, q8_0_vec_dot_vnni, q8_0_vec_dot4_vnni, "avx512vnni");
    } else {
        set_dot(t, PI2_T_Q4_0, q4_0_vec_dot_avx2, NULL, "avx2");
        set_dot(t, PI2_T_Q4_1, q4_1_vec_dot_avx2, q4_1_vec_dot4_avx2, "avx2");
        dot4x2[allow_ext != 0][PI2_T_Q4_1] = q4_1_vec_dot4x2_avx2;
        set_dot(t, PI2_T_Q5_0, q5_0_vec_dot_avx2, q5_0_vec_dot4_avx2, "avx2");
        dot4x2[allow_ext != 0][PI2_T_Q5_0] = q5_0_vec_dot4x2_avx2;
        dot4x4[allow_ext != 0][PI2_T_Q5_0] = q5_0_vec_dot4x4_avx2;   /* x86_q5_0_avx2_body.h */
        dot8x4[allow_ext != 0][PI2_T_Q5_0] = q5_0_vec_dot8x4_avx2;
        prep8x4[allow_ext != 0][PI2_T_Q5_0] = q8_0_wide_avx2;
        set_dot(t, PI2_T_Q5_1, q5_1_vec_dot_avx2, q5_1_vec_dot4_avx2, "avx2");
        dot4x2[allow_ext != 0][PI2_T_Q5_1] = q5_1_vec_dot4x2_avx2;
        set_dot(t, PI2_T_Q8_0, q8_0_vec_dot_avx2, q8_0_vec_dot4_avx2, "avx2");
    }
    /* The x8 repacked layout (pack.h): eight rows per call, scales converted eight at a time. */
    const int zmm = vnni && use_zmm();
    if (allow_ext) pk_prefetch = pi2_kernels_variant()->prefetch;
    t[PI2_T_Q4_1].vec_dot_pack = zmm ? q4_1_dot_pack_z_vnni : vnni ? q4_1_dot_pack_vnni : q4_1_dot_pack_avx2;
    t[PI2_T_Q5_0].vec_dot_pack = zmm ? q5_0_dot_pack_z_vnni : vnni ? q5_0_dot_pack_vnni : q5_0_dot_pack_avx2;
    t[PI2_T_Q5_1].vec_dot_pack = vnni ? q5_1_dot_pack_vnni : q5_1_dot_pack_avx2;   /* x86_q5_1_body.h */
    t[PI2_T_Q8_0].vec_dot_pack = zmm ? q8_0_dot_pack_z_vnni : vnni ? q8_0_dot_pack_vnni : q8_0_dot_pack_avx2;
    /* K-quants in their x8 layout (pack_k.c): lanes are rows, batches computed on the packed groups. */
    t[PI2_T_Q4_K].vec_dot_pack = vnni ? q4_K_dot_pack_vnni : q4_K_dot_pack_avx2;
    t[PI2_T_Q4_K].vec_dot_pack_batch = vnni ? q4_K_gemm_pack_vnni : q4_K_gemm_pack_avx2;
    t[PI2_T_Q6_K].vec_dot_pack = vnni ? q6_K_dot_pack_vnni : q6_K_dot_pack_avx2;
    t[PI2_T_Q6_K].vec_dot_pack_batch = vnni ? q6_K_tiled_pack_vnni : q6_K_tiled_pack_avx2;
    /* 16 rows: x86_q6k_z_body.h on zmm, x86_q6k_y16_body.h on AVX2 (the ymm VNNI variant keeps 8 rows) */
    t[PI2_T_Q6_K].vec_dot_pack_batch16 = zmm ? q6_K_tiled_pack16_vnni : vnni ? NULL : q6_K_tiled_pack16_avx2;
    t[PI2_T_Q6_K].pack_batch_tok = zmm ? Q6KZ_MAX_TOK : vnni ? 4 : Q6KY_MAX_TOK;
    /* K-quants scale int16 pair sums: VNNI's vpdpwssd fuses the batch kernels' madd + add, and AVX-512BW
     * halves the instructions of the one-token kernels (x86_rows_body.h). */
    set_dot(t, PI2_T_Q4_K, q4_K_vec_dot_avx2, NULL, "avx2");
    set_dot(t, PI2_T_Q6_K, vnni ? q6_K_vec_dot512_vnni : q6_K_vec_dot_avx2, NULL, vnni ? "avx512vnni" : "avx2");
    dot_rows4[allow_ext != 0][PI2_T_Q4_K] = vnni ? q4_K_vec_dot_rows4_vnni : NULL;
    dot_rows4p[allow_ext != 0][PI2_T_Q4_K] = vnni ? q4_K_vec_dot_rows4p_vnni : NULL;
    dot_pack_n[allow_ext != 0][PI2_T_Q4_K] = vnni ? q4_K_dot_pack_n_vnni : q4_K_dot_pack_n_avx2;
    t[PI2_T_Q4_K].vec_dot_batch = q4_K_gemm_dot_avx2;
    t[PI2_T_Q6_K].vec_dot_batch = q6_K_tiled_dot_avx2;
    /* The batch kernels' int sums fuse madd and add into vpdpwssd with VNNI (same exact ints). */
    t[PI2_T_Q4_K].vec_dot_batch4 = vnni ? q4_K_gemm_dot4_vnni : q4_K_gemm_dot4_avx2;
    t[PI2_T_Q6_K].vec_dot_batch4 = vnni ? q6_K_tiled_dot4_vnni : q6_K_tiled_dot4_avx2;
    batch8[allow_ext != 0][PI2_T_Q4_K] = vnni ? q4_K_gemm_dot8_vnni : q4_K_gemm_dot8_avx2;
    batch8[allow_ext != 0][PI2_T_Q6_K] = vnni ? q6_K_tiled_dot8_vnni : q6_K_tiled_dot8_avx2;
    /* Q5_K (x86_q5k_body.h): ggml's vec_dot order below 8 tokens, its tiled order from 8, plain and packed. */
    set_dot(t, PI2_T_Q5_K, vnni ? q5_K_vec_dot_vnni : q5_K_vec_dot_avx2, NULL, vnni ? "avx512vnni" : "avx2");
    t[PI2_T_Q5_K].vec_dot_batch = vnni ? q5_K_tiled_dot_vnni : q5_K_tiled_dot_avx2;
    t[PI2_T_Q5_K].vec_dot_pack = vnni ? q5_K_dot_pack_vnni : q5_K_dot_pack_avx2;
    t[PI2_T_Q5_K].vec_dot_pack_batch = vnni ? q5_K_tiled_pack_vnni : q5_K_tiled_pack_avx2;
    /* 16 rows: x86_q5k_z_body.h on zmm, x86_q5k_y16_body.h on AVX2 (the ymm VNNI variant keeps 8 rows) */
    t[PI2_T_Q5_K].vec_dot_pack_batch16 = zmm ? q5_K_tiled_pack16_vnni : vnni ? NULL : q5_K_tiled_pack16_avx2;
    /* eight per pass with VNNI (x86_q5k_body.h); the 16-row kernels decode a block column once for up to 32 tokens */
    t[PI2_T_Q5_K].pack_batch_tok = zmm ? Q5KZ_MAX_TOK : vnni ? 8 : Q5KY_MAX_TOK;
    set_dot(t, PI2_T_F32, f32_vec_dot_avx2, NULL, "avx2");
    set_dot(t, PI2_T_F16, f16_vec_dot_avx2, NULL, "avx2");
    return PI2_K_AVX2 | (vnni ? PI2_K_AVX512VNNI : 0);
}

#else

int pi2_kernels_variant_x86(pi2_cpu_variant *v, const char *want) {
    (void)v; (void)want;
    return 0;
}

uint32_t pi2_kernels_install_x86(pi2_type_traits *t, int allow_ext) {
    (void)t; (void)allow_ext;
    return 0;
}

pi2_vec_dot4x2_fn pi2_kernels_dot4x2(int32_t type, int32_t impl) {
    (void)type; (void)impl;
    return NULL;
}

pi2_vec_dot_rows4_fn pi2_kernels_dot_rows4(int32_t type, int32_t impl) {
    (void)type; (void)impl;
    return NULL;
}

pi2_vec_dot_rows4p_fn pi2_kernels_dot_rows4p(int32_t type, int32_t impl) {
    (void)type; (void)impl;
    return NULL;
}

pi2_vec_dot_pack4_fn pi2_kernels_dot_pack_n(int32_t type, int32_t impl) {
    (void)type; (void)impl;
    return NULL;
}

pi2_vec_dot4x2_fn pi2_kernels_dot4x4(int32_t type, int32_t impl) {
    (void)type; (void)impl;
    return NULL;
}

pi2_vec_dot4x2_fn pi2_kernels_dot8x4(int32_t type, int32_t impl) {
    (void)type; (void)impl;
    return NULL;
}

pi2_vec_dot4_fn pi2_kernels_batch8(int32_t type, int32_t impl) {
    (void)type; (void)impl;
    return NULL;
}

pi2_act_prep_fn pi2_kernels_dot8x4_prep(int32_t type, int32_t impl, int32_t *block_bytes) {
    (void)type; (void)impl;
    *block_bytes = 0;
    return NULL;
}

#endif
