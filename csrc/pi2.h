/* pi2.h — the one public header of pi2's C core; the only header Python binds (cffi API mode).
 * Owns: status codes, the ABI version, error reporting and the kernel entry points.
 * Lines starting with '#' are stripped before ffi.cdef, so keep declarations free of macros. */
#ifndef PI2_H
#define PI2_H
#include <stdint.h>
#include <stddef.h>

typedef enum {
    PI2_OK = 0,
    PI2_ERR_INVALID = -1,     /* a bad argument */
    PI2_ERR_IO = -2,          /* a read failed */
    PI2_ERR_NOMEM = -3,       /* an allocation failed */
    PI2_ERR_FORMAT = -4,      /* malformed model data */
    PI2_ERR_UNSUPPORTED = -5  /* a type or feature this build does not support */
} pi2_status;

/* Bumped whenever a declaration in this header changes; checked by pi2/engine.py at import. */
uint32_t pi2_abi_version(void);

/* The message of the last error on this thread ("" when none). */
const char *pi2_last_error(void);

/* ---- kernels: ggml block types, dequantization, activation quantization, matvec ----
 * Types are ggml type ids (formats.md §2). Known: F32 0, F16 1, Q4_0 2, Q4_1 3, Q5_0 6, Q5_1 7,
 * Q8_0 8, Q8_1 9, Q4_K 12, Q5_K 13, Q6_K 14, Q8_K 15, BF16 30 (Q8_1 and Q8_K are activation-only).
 * A row of n_cols values of a type takes n_cols / block_size * type_size bytes. */

typedef enum {
    PI2_IMPL_AUTO = 0,   /* the fastest kernels this CPU supports */
    PI2_IMPL_REF = 1,    /* the scalar reference (kernels/ref.c) */
    PI2_IMPL_BASE = 2    /* baseline SIMD without optional extensions (AVX2 w/o VNNI, NEON w/o dotprod) */
} pi2_impl;

typedef enum {
    PI2_ISA_AVX2 = 1,        /* AVX2 + FMA + F16C */
    PI2_ISA_AVX512VNNI = 2,  /* AVX-512 VNNI (vpdpbusd) for the 32-value block types */
    PI2_ISA_NEON = 4,        /* aarch64 Advanced SIMD */
    PI2_ISA_DOTPROD = 8      /* aarch64 SDOT (vdotq_s32) */
} pi2_isa;

typedef struct {
    const char *name;          /* ggml's type name, "Q4_K" */
    int32_t block_size;        /* values per block */
    int32_t type_size;         /* bytes per block */
    int32_t vec_dot_type;      /* activation format rows of this type are multiplied with */
    int32_t has_vec_dot;       /* 1 for weight types pi2_matvec accepts, 0 for activation-only */
    const char *vec_dot_impl;  /* kernel pi2_matvec uses for `impl`: "ref", "avx2", "avx512vnni",
                                  "neon", "dotprod" (NULL when has_vec_dot is 0) */
} pi2_type_info;

/* Bit set of PI2_ISA_* the PI2_IMPL_AUTO kernels use on this CPU (0: reference only). */
uint32_t pi2_kernel_isa(void);

/* Facts about ggml type `type` under implementation `impl` (a pi2_impl).
 * PI2_ERR_UNSUPPORTED: unknown type; PI2_ERR_INVALID: bad impl or NULL out. */
pi2_status pi2_kernel_type_info(int32_t type, int32_t impl, pi2_type_info *out);

/* dst[r * n_cols + c] = value c of row r, for n_rows rows of `type` starting row_bytes apart in src
 * (row_bytes >= the row size; use the row size for contiguous data). Bit-exact with gguf.quants.
 * PI2_ERR_UNSUPPORTED: unknown type; PI2_ERR_INVALID: NULL pointer, n_cols <= 0 or not a multiple
 * of the block size, n_rows < 0, row_bytes too small, bad impl. */
pi2_status pi2_dequantize_rows(int32_t type, const void *src, size_t row_bytes, float *dst,
                               int64_t n_rows, int64_t n_cols, int32_t impl);

/* out = the n floats of x in activation format `vdt` (F32, F16, BF16, Q8_0, Q8_1 or Q8_K), the
 * bytes llama.cpp's x86 build writes, on every CPU (n / block_size * type_size of them).
 * PI2_ERR_UNSUPPORTED: vdt is not an activation format; PI2_ERR_INVALID: as above. */
pi2_status pi2_quantize_act(int32_t vdt, const float *x, int64_t n, void *out);

/* out[r] = row r of w (n_rows rows of `type`, row_bytes apart, n_cols values each) · x_q, where
 * x_q holds n_cols values already quantized to the type's vec_dot_type (pi2_quantize_act).
 * impl selects the kernels (pi2_impl). Errors as pi2_dequantize_rows; also activation-only type. */
pi2_status pi2_matvec(int32_t type, const void *w, size_t row_bytes, int64_t n_rows, int64_t n_cols,
                      const void *x_q, float *out, int32_t impl);

#endif
