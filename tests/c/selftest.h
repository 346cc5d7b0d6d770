/* selftest.h — what the C self-test's files (kernel_selftest.c and its selftest_*.c areas) share: the sizes, the
 * counters and the random stream, the helpers every area checks with, and each area's entry points.
 * Does not: check anything itself; main (kernel_selftest.c) calls the areas in a fixed order, which fixes the random
 * stream and so the cross-CPU hashes. */
#ifndef PI2_SELFTEST_H
#define PI2_SELFTEST_H
#include "../../csrc/pi2.h"
#include "../../csrc/pi2_test.h"
#include "../../csrc/kernels/axpy_qx1_pack.h"
#include "../../csrc/kernels/lowbit.h"
#include "../../csrc/kernels/pack.h"
#include "../../csrc/kernels/traits.h"
#include "../../csrc/matmul.h"
#include "../../csrc/ops.h"
#include "../../csrc/threadpool.h"

#include <float.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>

enum { N_SIZES = 8 };
extern const int SIZES[N_SIZES];   /* 1, 7, 31, 32, 33, 255, 256, 4096 + 32 */
#define K_MAX_BLOCKS 256          /* 256-value block types: at most 256 blocks (65536 values) per row */

extern int n_pass, n_fail;
extern uint64_t rng;              /* xorshift64* state: every area draws from this one stream */
extern uint64_t h_dots, h_ops;    /* cross-CPU hashes */

uint32_t next_u32(void);
float next_f(void);               /* [-1, 1) */
void check(int ok, const char *what, const char *type, const char *impl, int size, double err);
uint64_t fnv1a(uint64_t h, const void *p, size_t n);
double nmse(const float *a, const float *b, int64_t n);
double nmse_d(const float *a, const double *b, int64_t n);
/* Random weight rows: random bytes, then sane fp16/f32 values in the scale (or value) fields. */
void fill_weights(int type, uint8_t *w, int64_t n_blocks, int32_t ts);
float *rand_floats(int64_t n, float scale);
/* Values per row at `size` (blocks for block types, at most K_MAX_BLOCKS of the 256-value ones), and the bytes of
 * such a row in the type's activation format. */
int64_t cols_for(const pi2_type_traits *ref, int size);
size_t act_bytes(const pi2_type_traits *ref, int64_t n);
static inline int same_bits(const float *a, const float *b, int64_t n) { return !memcmp(a, b, (size_t)n * sizeof *a); }

/* selftest_dots.c: vec_dot, the batch orders, the multi-token kernels and pi2_matmul of one type at every size. */
void test_type(int type, pi2_pool *pool);
/* selftest_axpy.c: the grouped row sums. */
void test_axpy(int type, int size);
void test_axpy_qx1p(int type, int size);
void test_axpy_i8(int size);
/* selftest_ops.c: RMSNorm, the activations, RoPE, attention. */
void test_norm_act(int n);
void test_rope(int size);
void test_attention(pi2_pool *pool, int size, int n_tok);
/* selftest_packed.c: the low-bit rows, the x8 layout and the multi-row tiles. */
void test_lowbit(int bits, int size);
void test_packed(int type, pi2_pool *pool, int n_blocks, int n_out);
void test_tiles_distinct(int type, int n_blocks);

#endif
