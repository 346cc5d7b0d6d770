/* ggml_x8.h — ggml's repacked Q4_0 product (pi2_go_dot_q4_0's float order) on weights in the x8 layout of pack.h:
 * eight rows per group, one to four activation rows per pass over the group's bytes (the Mixture-of-Experts
 * family's experts, repacked at load by ffn/moe_pack.c).
 * Every output is bit for bit pi2_go_dot_q4_0 of its plain row: per block, the exact integer sum, then
 * acc = fma(float(isum), d_w·d_x, acc) with the product and sum in double, rounded to float once. */
#ifndef PI2_KERNELS_GGML_X8_H
#define PI2_KERNELS_GGML_X8_H
#include <stdint.h>

#include "traits.h"

#define PI2_X8_MAX_TOK 4          /* activation rows per pass */
#define PI2_X8_MAX_BLOCKS 512     /* n / 32 at most (n ≤ 16384): wider rows stay plain */

/* For each group gi < n_groups (g + gi·8·(n/32)·18 bytes) and each activation row t < n_tok (n_tok ≤ 4):
 * s[t][8·gi + r] = row r of group gi · x[t]. */
typedef void (*pi2_go_x8_fn)(int64_t n, const uint8_t *g, int64_t n_groups, int32_t n_tok, const blk_q8_0 *const *x,
                             float *const *s);
/* The kernel for this CPU, or NULL (no AVX2/F16C/FMA, or not x86-64): then the experts stay plain. */
pi2_go_x8_fn pi2_go_q4_0_x8(void);

#endif
