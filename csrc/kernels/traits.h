/* traits.h — the kernel type-traits table: per ggml type, its block geometry and its kernels.
 * Does: declare ggml's block layouts (formats.md §3), fp16/bf16 conversions, the traits struct,
 *       the reference kernels (ref.c) and the per-ISA installers (x86.c, neon.c).
 * Does not: loop over rows or validate arguments (api.c does, for Python), own any state
 *       beyond the once-initialised dispatch table in traits.c.
 * Call sites see no #ifdef: they ask pi2_traits(type, force_ref) for a row of function pointers. */
#ifndef PI2_KERNELS_TRAITS_H
#define PI2_KERNELS_TRAITS_H
#include <stdint.h>
#include <stddef.h>
#include <string.h>

/* ggml type ids (formats.md §2) that the kernels know. */
enum {
    PI2_T_F32 = 0, PI2_T_F16 = 1, PI2_T_Q4_0 = 2, PI2_T_Q4_1 = 3, PI2_T_Q5_0 = 6, PI2_T_Q5_1 = 7,
    PI2_T_Q8_0 = 8, PI2_T_Q8_1 = 9, PI2_T_Q4_K = 12, PI2_T_Q5_K = 13, PI2_T_Q6_K = 14,
    PI2_T_Q8_K = 15, PI2_T_I8 = 24, PI2_T_BF16 = 30, PI2_T_COUNT = 31
};

#define QK4_0 32
#define QK8_0 32
#define QK_K 256

typedef uint16_t pi2_fp16;
typedef uint16_t pi2_bf16;

/* Block layouts, field order as in the file (formats.md §3). */
typedef struct { pi2_fp16 d; uint8_t qs[16]; } blk_q4_0;                               /* 18 B */
typedef struct { pi2_fp16 d, m; uint8_t qs[16]; } blk_q4_1;                            /* 20 B */
typedef struct { pi2_fp16 d; uint8_t qh[4]; uint8_t qs[16]; } blk_q5_0;                /* 22 B */
typedef struct { pi2_fp16 d, m; uint8_t qh[4]; uint8_t qs[16]; } blk_q5_1;             /* 24 B */
typedef struct { pi2_fp16 d; int8_t qs[32]; } blk_q8_0;                                /* 34 B */
typedef struct { pi2_fp16 d, s; int8_t qs[32]; } blk_q8_1;                             /* 36 B */
typedef struct { pi2_fp16 d, dmin; uint8_t scales[12]; uint8_t qs[128]; } blk_q4_K;    /* 144 B */
typedef struct { pi2_fp16 d, dmin; uint8_t scales[12]; uint8_t qh[32]; uint8_t qs[128]; } blk_q5_K; /* 176 B */
typedef struct { uint8_t ql[128]; uint8_t qh[64]; int8_t scales[16]; pi2_fp16 d; } blk_q6_K; /* 210 B */
typedef struct { float d; int8_t qs[256]; int16_t bsums[16]; } blk_q8_K;               /* 292 B */

_Static_assert(sizeof(blk_q4_0) == 18 && sizeof(blk_q4_1) == 20 && sizeof(blk_q5_0) == 22 &&
               sizeof(blk_q5_1) == 24 && sizeof(blk_q8_0) == 34 && sizeof(blk_q8_1) == 36 &&
               sizeof(blk_q4_K) == 144 && sizeof(blk_q5_K) == 176 && sizeof(blk_q6_K) == 210 &&
               sizeof(blk_q8_K) == 292, "ggml block sizes");

/* dst[0..n) = the n values of src (n a multiple of block_size). */
typedef void (*pi2_to_float_fn)(const void *src, float *dst, int64_t n);
/* *out = one weight row (n values) · one activation row already in vec_dot_type blocks. */
typedef void (*pi2_vec_dot_fn)(int64_t n, float *out, const void *w_row, const void *x_q);
/* out[t·out_stride] = one weight row · activation row t (x_q + t·x_stride bytes), for t < 4: four
 * tokens in vec_dot_batch's float order, the weight blocks unpacked once. */
typedef void (*pi2_vec_dot4_fn)(int64_t n, float *out, size_t out_stride, const void *w_row,
                                const void *x_q, size_t x_stride);
/* vec_dot4 on two weight rows (w and w + w_stride bytes): out[t·out_stride + k] = row k · token t,
 * each output in vec_dot's float order, each activation block loaded once for both rows. */
typedef void (*pi2_vec_dot4x2_fn)(int64_t n, float *out, size_t out_stride, const void *w,
                                  size_t w_stride, const void *x_q, size_t x_stride);
/* vec_dot on four weight rows (w + k·w_stride bytes, k < 4) and one activation row: s[k] = row k · x_q,
 * each in vec_dot's float order, each activation block loaded once for the four rows. */
typedef void (*pi2_vec_dot_rows4_fn)(int64_t n, float *s, const void *w, size_t w_stride, const void *x_q);
/* the same on four rows anywhere: s[k] = rows[k] · x_q */
typedef void (*pi2_vec_dot_rows4p_fn)(int64_t n, float *s, const uint8_t *const *rows, const void *x_q);
/* The grouped row sum of the sparse FFN (axpy.c): y[j] += (((+0 + h[0]·v_0[j]) + h[1]·v_1[j]) + ...) for
 * j < n, v_i the values of the row at rows + idx[i]·row_bytes (to_float's), one product and one sum per
 * term. n is a multiple of the block size; rows may point into the middle of a row at a block boundary.
 * I8 rows sum differently: an int8 weight per row and exact integer sums, k ≤ 64 (axpy_i8.c); Q4_1 and Q5_1
 * rows too: 8-bit activations per block and exact integer sums (axpy_qx1.c). */
typedef void (*pi2_axpy_group_fn)(int64_t n, float *y, const void *rows, size_t row_bytes, const int32_t *idx,
                                  const float *h, int32_t k);
/* s[r] = row r of one x8 packed group (pack.h) · x_q for r < 8, each bit for bit vec_dot's result on that row. */
typedef void (*pi2_vec_dot_pack_fn)(int64_t n, float *s, const void *group, const void *x_q);
/* s[t·s_stride + r] = row r of one x8 packed group · token t (x_q + t·x_stride bytes), r < 8, t < n_tok (≤ 4):
 * tokens in vec_dot_batch's order, each bit for bit vec_dot_batch's result on that row. */
typedef void (*pi2_vec_dot_pack4_fn)(int64_t n, float *s, size_t s_stride, const void *group, const void *x_q,
                                     size_t x_stride, int32_t n_tok);
/* dst = the n floats of x as vec_dot_type blocks, bit-exact with pi2/quants.py quantize_act. */
typedef void (*pi2_quantize_fn)(const float *x, void *dst, int64_t n);

typedef struct {
    const char *name;              /* ggml's name, "Q4_K" */
    int32_t block_size, type_size; /* values and bytes per block; 0 = type unknown */
    int32_t vec_dot_type;          /* activation format rows of this type are multiplied with */
    pi2_to_float_fn to_float;
    pi2_vec_dot_fn vec_dot;        /* NULL for activation-only types (Q8_1, Q8_K) and I8 */
    pi2_quantize_fn quantize_act;  /* float row -> vec_dot_type blocks (NULL for I8) */
    const char *vec_dot_impl;      /* "ref", "avx2", "avx512vnni", "neon", "dotprod" */
    pi2_vec_dot_fn vec_dot_batch;  /* the float order of ggml's batch kernel (NULL: vec_dot's) */
    int32_t batch_group, batch_min;/* which tokens of a batch use it: pi2_uses_batch_dot */
    pi2_vec_dot4_fn vec_dot_batch4;/* vec_dot_batch on 4 tokens at once (NULL: none) */
    pi2_vec_dot4_fn vec_dot4;      /* vec_dot on 4 tokens at once (NULL: none) */
    pi2_axpy_group_fn axpy_group;  /* NULL for activation-only types */
    pi2_vec_dot_pack_fn vec_dot_pack; /* rows in the x8 layout of pack.h (NULL: this table reads plain rows only) */
    pi2_vec_dot_pack4_fn vec_dot_pack_batch; /* packed rows, up to pack_batch_tok tokens in the batch order (NULL: batches unpack) */
    int32_t pack_batch_tok;        /* most tokens per vec_dot_pack_batch call (0: four) */
    pi2_vec_dot_pack4_fn vec_dot_pack_batch16; /* vec_dot_pack_batch on 16 rows (two consecutive groups, r < 16),
                                                  up to pack_batch_tok tokens; NULL: none */
} pi2_type_traits;

/* Whether token t of an n_tok batch is computed by vec_dot_batch: ggml multiplies repacked Q4_K in
 * whole groups of 4 tokens by its GEMM (the rest by its GEMV), and Q6_K batches of 8 or more by
 * its tiled kernel, each with its own float order. */
static inline int pi2_uses_batch_dot(const pi2_type_traits *t, int32_t n_tok, int32_t tok) {
    return t->vec_dot_batch && n_tok >= t->batch_min && tok < n_tok - n_tok % t->batch_group;
}

/* ISA bits (same values as PI2_ISA_* in pi2.h). */
enum { PI2_K_AVX2 = 1, PI2_K_AVX512VNNI = 2, PI2_K_NEON = 4, PI2_K_DOTPROD = 8 };

/* Which table (same values as PI2_IMPL_* in pi2.h): auto = the best the CPU has; ref = the
 * scalar reference; base = the baseline SIMD level without optional extensions (AVX2 without
 * VNNI, NEON without dotprod), so that every fast path can be tested on one machine. */
enum { PI2_K_IMPL_AUTO = 0, PI2_K_IMPL_REF = 1, PI2_K_IMPL_BASE = 2 };

/* The traits of `type` in table `impl`, or NULL if the type or impl is unknown.
 * The first call fills the tables from CPU features (thread-safe, once). */
const pi2_type_traits *pi2_traits(int32_t type, int32_t impl);
/* ISA bits the auto table uses on this CPU. */
uint32_t pi2_kernels_isa(void);

/* Per-ISA installers: overwrite vec_dot entries of `tab` they have fast paths for, using optional
 * extensions only if allow_ext; return the ISA bits used (0 when the CPU or build lacks the ISA).
 * Defined in x86.c and neon.c; each is a no-op returning 0 on the other architecture. */
uint32_t pi2_kernels_install_x86(pi2_type_traits *tab, int allow_ext);
uint32_t pi2_kernels_install_neon(pi2_type_traits *tab, int allow_ext);
/* The two-row four-token kernel of `type` in table `impl` (x86.c), NULL where there is none (the
 * reference table, other ISAs, other types). Kept beside the table, read-only after the first call. */
pi2_vec_dot4x2_fn pi2_kernels_dot4x2(int32_t type, int32_t impl);
/* The same with four weight rows (w + k·w_stride, k < 4): out[t·out_stride + k], each output in vec_dot's
 * float order; NULL where there is none. */
pi2_vec_dot4x2_fn pi2_kernels_dot4x4(int32_t type, int32_t impl);
/* dot4x4 on eight tokens (t < 8), the weight blocks unpacked once for all eight; NULL where there is none.
 * Its activation rows are those of pi2_kernels_dot8x4_prep where that is not NULL. */
pi2_vec_dot4x2_fn pi2_kernels_dot8x4(int32_t type, int32_t impl);
/* dst = one vec_dot_type row of n values in the format dot8x4 reads (per-token steps done once). */
typedef void (*pi2_act_prep_fn)(const void *xq, void *dst, int64_t n);
/* dot8x4's row format maker and its bytes per 32-value block, or NULL (and 0): plain vec_dot_type rows. */
pi2_act_prep_fn pi2_kernels_dot8x4_prep(int32_t type, int32_t impl, int32_t *block_bytes);
/* vec_dot_batch4 on eight tokens (t < 8, all in the batch order); NULL where there is none. */
pi2_vec_dot4_fn pi2_kernels_batch8(int32_t type, int32_t impl);
/* The four-row one-token kernel of `type` in table `impl` (x86.c), NULL where there is none; kept like
 * pi2_kernels_dot4x2. */
pi2_vec_dot_rows4_fn pi2_kernels_dot_rows4(int32_t type, int32_t impl);
/* The four-row kernel on rows anywhere (x86.c: where dot_rows4 exists), or NULL. */
pi2_vec_dot_rows4p_fn pi2_kernels_dot_rows4p(int32_t type, int32_t impl);
/* vec_dot_pack's order (each token's result bit for bit vec_dot_pack's) on up to four tokens per pass over a packed
 * group: s[t·s_stride + r], tokens x_q + t·x_stride; NULL where there is none (x86.c: Q4_K). */
pi2_vec_dot_pack4_fn pi2_kernels_dot_pack_n(int32_t type, int32_t impl);
/* The grouped row sums (axpy.c): the reference for every weight type, and the AVX2 kernels (install
 * only on a CPU where pi2_kernels_install_x86 found AVX2; a no-op off x86-64). */
void pi2_kernels_fill_axpy_ref(pi2_type_traits *tab);
void pi2_kernels_install_axpy_x86(pi2_type_traits *tab, int allow_ext);
/* I8 rows (axpy_i8.c): fill puts the type's reference row in `tab`; install puts the fast grouped row sum
 * that `isa` (PI2_K_* bits the table's other kernels use) allows. */
void pi2_kernels_fill_axpy_i8(pi2_type_traits *tab);
void pi2_kernels_install_axpy_i8(pi2_type_traits *tab, uint32_t isa);
/* Q4_1 and Q5_1 rows (axpy_qx1.c): the integer grouped row sum with 8-bit activations; fill puts the scalar
 * kernel in `tab`, install the fast ones `isa` allows. */
void pi2_kernels_fill_axpy_qx1(pi2_type_traits *tab);
void pi2_kernels_install_axpy_qx1(pi2_type_traits *tab, uint32_t isa);
/* Fill `tab` (PI2_T_COUNT entries) with the reference kernels (ref.c). */
void pi2_kernels_fill_ref(pi2_type_traits *tab);
/* Put the reference to_float and quantize_act of every type into `tab` (ref_convert.c; pi2_kernels_fill_ref calls it). */
void pi2_kernels_fill_ref_convert(pi2_type_traits *tab);

/* ---- scalar conversions, exact (the fp16 ones follow the FP16 library's bit tricks) ---- */
static inline float pi2_f32_from_bits(uint32_t w) { float f; memcpy(&f, &w, 4); return f; }
static inline uint32_t pi2_f32_to_bits(float f) { uint32_t w; memcpy(&w, &f, 4); return w; }

static inline float pi2_fp16_to_f32(pi2_fp16 h) {
    const uint32_t w = (uint32_t)h << 16, sign = w & 0x80000000u, two_w = w + w;
    const float normalized = pi2_f32_from_bits((two_w >> 4) + (0xE0u << 23)) * 0x1.0p-112f;
    const float denormalized = pi2_f32_from_bits((two_w >> 17) | (126u << 23)) - 0.5f;
    const uint32_t r = sign | (two_w < (1u << 27) ? pi2_f32_to_bits(denormalized)
                                                   : pi2_f32_to_bits(normalized));
    return pi2_f32_from_bits(r);
}

static inline pi2_fp16 pi2_f32_to_fp16(float f) {  /* round to nearest even, like numpy */
    float base = (__builtin_fabsf(f) * 0x1.0p+112f) * 0x1.0p-110f;
    const uint32_t w = pi2_f32_to_bits(f), shl1_w = w + w, sign = w & 0x80000000u;
    uint32_t bias = shl1_w & 0xFF000000u;
    if (bias < 0x71000000u) bias = 0x71000000u;
    base = pi2_f32_from_bits((bias >> 1) + 0x07800000u) + base;
    const uint32_t bits = pi2_f32_to_bits(base);
    const uint32_t nonsign = ((bits >> 13) & 0x7C00u) + (bits & 0x0FFFu);
    return (pi2_fp16)((sign >> 16) | (shl1_w > 0xFF000000u ? 0x7E00u : nonsign));
}

static inline float pi2_bf16_to_f32(pi2_bf16 h) { return pi2_f32_from_bits((uint32_t)h << 16); }

static inline pi2_bf16 pi2_f32_to_bf16(float f) {  /* ggml: nearest even, NaN quieted */
    const uint32_t u = pi2_f32_to_bits(f);
    if ((u & 0x7fffffffu) > 0x7f800000u) return (pi2_bf16)((u >> 16) | 64);
    return (pi2_bf16)((u + (0x7fffu + ((u >> 16) & 1))) >> 16);
}

/* Q4_K/Q5_K 6-bit scale and min of sub-block j (formats.md §3.1). */
static inline void pi2_k4_scale_min(int j, const uint8_t *q, uint8_t *sc, uint8_t *mn) {
    if (j < 4) { *sc = q[j] & 63; *mn = q[j + 4] & 63; }
    else { *sc = (q[j + 4] & 0xF) | ((q[j - 4] >> 6) << 4); *mn = (q[j + 4] >> 4) | ((q[j] >> 6) << 4); }
}

#endif
