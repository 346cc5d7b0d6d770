/* lowbit.h — the 1-/2-bit gate copy of pi2-made predictors (PI2_T_LOWBIT1/2 rows) times Q8_0 activations.
 * The arithmetic is pi2/convert/predictor.py's: per 32-value block an exact integer sum
 * sumi = Σ_j (2c_j − (2^bits − 1))·q_j, then ĝ = Σ over blocks in order, from 0.0f, of
 * (float)sumi · (d_w · d_x), one float product and one float sum per block (no FMA). */
#ifndef PI2_KERNELS_LOWBIT_H
#define PI2_KERNELS_LOWBIT_H
#include <stddef.h>
#include <stdint.h>

/* *out = one row of n values (n a multiple of 32) · x_q (n / 32 Q8_0 blocks). */
typedef void (*pi2_lowbit_dot_fn)(int64_t n, float *out, const void *row, const void *x_q);

/* Bits per weight of a PI2_T_LOWBIT1/2 type id, 0 for any other id. */
int32_t pi2_lowbit_bits(int32_t type);
/* Bytes of one row of n values at `bits` (2 + 4·bits per 32 values). */
size_t pi2_lowbit_row_bytes(int32_t bits, int64_t n);
/* The kernel for `bits` (1 or 2) in table `impl` (pi2_impl: the reference for PI2_IMPL_REF or a CPU without
 * AVX2, else the AVX2 kernel); NULL for other bits. Every kernel gives the reference's bits. */
pi2_lowbit_dot_fn pi2_lowbit_dot(int32_t bits, int32_t impl);

#endif
