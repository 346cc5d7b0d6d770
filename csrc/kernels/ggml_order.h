/* ggml_order.h — dot products in the float order of ggml's x86 AVX-512 kernels for the weight types the dense path
 * computes in other orders: F32 and F16 (ggml_vec_dot_f32/_f16 for one token and every expert row, llamafile's
 * tinyBLAS for batches) and Q4_0 (the repacked q4_0_8x8 GEMV and GEMM). pi2/reference/fdot.py is the specification; the
 * Mixture-of-Experts family (PI2_ARCH_MOE) multiplies with these so that it equals pi2/reference/moe.py.
 * FMAs are computed as fdot.py emulates them: the exact product and the sum in double, rounded to float once. */
#ifndef PI2_KERNELS_GGML_ORDER_H
#define PI2_KERNELS_GGML_ORDER_H
#include <stdint.h>

#include "traits.h"

/* ggml_vec_dot_f32: four 16-lane accumulators over steps of 64, (0+2)+(1+3), the lane sum, a scalar tail. */
float pi2_go_dot_f32(int64_t n, const float *w, const float *x);
/* tinyBLAS<16> on F32 (n % 16 == 0): one 16-lane accumulator, the lane sum. */
float pi2_go_tinyblas_f32(int64_t n, const float *w, const float *x);
/* ggml_vec_dot_f16 on F16 weights and an activation already rounded to F16 (xh: its values as floats); the
 * n % 64 last values go into the lanes as if padded with zeros. */
float pi2_go_dot_f16(int64_t n, const pi2_fp16 *w, const float *xh);
/* tinyBLAS<16> on F16 (n % 16 == 0). */
float pi2_go_tinyblas_f16(int64_t n, const pi2_fp16 *w, const float *xh);
/* The repacked Q4_0 GEMV (and GEMM, same math): per block acc = fma(float(Σ q_w·q_x), d_w·d_x, acc). */
float pi2_go_dot_q4_0(int64_t n, const blk_q4_0 *w, const blk_q8_0 *x);
/* The same on four rows (w + k·w_stride bytes) and one activation row. */
void pi2_go_dot_q4_0_rows4(int64_t n, float *s, const uint8_t *w, size_t w_stride, const blk_q8_0 *x);

/* The same on eight rows at once (s[k] = row k), bit for bit; NULL when the CPU has no fast path for it. */
typedef void (*pi2_go_rows8_fn)(int64_t n, float *s, const uint8_t *w, size_t w_stride, const blk_q8_0 *x);
pi2_go_rows8_fn pi2_go_q4_0_rows8(void);

/* Whether llamafile's tinyBLAS takes an F32/F16 product of n_tok tokens (fdot.tinyblas_ok). */
static inline int pi2_go_tinyblas_ok(int32_t n_tok, int64_t n_out, int64_t k) {
    return n_tok >= 2 && k % 16 == 0 && n_out % 4 == 0;
}

#endif
