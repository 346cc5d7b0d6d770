/* ops.h — the element-wise and attention operations of the forward pass, as ggml's CPU backend
 * computes them (pi2/reference.py is the specification: rms_norm, rope_cache, rope, softmax_rows,
 * attention, gelu_f16, silu). */
#ifndef PI2_OPS_H
#define PI2_OPS_H
#include <stdint.h>

#include "kernels/traits.h"
#include "pi2.h"
#include "threadpool.h"

/* y = x / sqrt(mean(x^2) + eps) (float squares summed in double), times w when w is not NULL. y may be x. */
void pi2_rms_norm(float *y, const float *x, const float *w, int64_t n, float eps);

/* cs[2i], cs[2i+1] = cos, sin of angle i of position pos: theta_i = pos * base^(-2i/n_rot),
 * built by repeated float multiplication, divided by freq_factors[i] if given, times freq_scale. */
void pi2_rope_cache(float *cs /* [n_rot] */, int32_t pos, int32_t n_rot, float base, float freq_scale,
                    const float *freq_factors);

/* Rotate the first n_rot values of each of n_heads heads of x [n_heads][head_dim] in place:
 * NEOX pairs (i, i + n_rot/2), else NORM pairs (2i, 2i+1). */
void pi2_rope(float *x, int32_t n_heads, int32_t head_dim, int32_t n_rot, const float *cs, int32_t neox);

/* ggml's GELU table: out[h] = fp16(gelu(fp16 value h)) for every fp16 bit pattern h. */
void pi2_gelu_table(pi2_fp16 *table /* [65536] */);

/* a[i] = act(g[i]), the factor pi2_ffn_activate multiplies up[i] (pi2_ffn_up_factor of it) by, bit for bit
 * (PI2_ACT_DRELU: relu(g[i]), as PI2_ACT_RELU). */
void pi2_ffn_act_values(float *a, const float *g, int64_t n, int32_t act, const pi2_fp16 *gelu_table);

/* What up[i] enters h = act(gate)·up with: itself, or for PI2_ACT_DRELU relu(up) = up <= 0 ? 0 : up
 * (numpy's maximum(up, 0): +0 for -0, NaN kept). */
static inline float pi2_ffn_up_factor(float u, int32_t act) {
    return act == PI2_ACT_DRELU && u <= 0.0f ? 0.0f : u;
}

/* gate[i] = act(gate[i]) * up[i] (PI2_ACT_DRELU: relu(gate[i]) * relu(up[i])) for n values. gelu_table is
 * needed for PI2_ACT_GELU. */
void pi2_ffn_activate(float *gate, const float *up, int64_t n, int32_t act, const pi2_fp16 *gelu_table);

/* s[i] = ggml_v_expf(s[i] - max) (the AVX-512 polynomial), as ggml's softmax computes its groups of 16. */
void pi2_exp_shifted(float *s, int64_t n, float max);

/* Causal multi-head attention over one layer's cache of F16 values, with grouped K/V heads, in
 * ggml's float order (one token: ggml_vec_dot_f16; batches: tinyBLAS), as pi2/reference.py's
 * attention. The cache holds each value as an IEEE half (2 bytes, as llama.cpp's F16 cache), rounded
 * once when the token is stored; every loop converts it back exactly (vcvtph2ps, fcvtl, or the
 * scalar bit tricks), so the sums see the same float values whatever the CPU. */
typedef struct {
    const float *q;            /* [n_tok][n_head][head_dim], the queries at positions pos0.. */
    const pi2_fp16 *k;         /* [n_head_kv][head_dim][k_ld] (transposed) halves, positions 0..pos0+n_tok-1 filled */
    const pi2_fp16 *v;         /* [n_ctx][n_head_kv][head_dim_v] halves */
    float *out;                /* [n_tok][n_head][head_dim_v] */
    float *scores;             /* scratch [n_threads][n_ctx]: q.k, then the F16-rounded weights */
    float *qf;                 /* scratch [n_threads][head_dim]: a query head rounded to F16 */
    float *acc;                /* scratch [n_threads][pi2_attn_acc_floats()] lane accumulators */
    int32_t n_tok, pos0, n_ctx;
    int32_t k_ld;              /* halves from one row of k to the next, >= pos0 + n_tok (a context's k_ld: kv_rows.c) */
    int32_t n_head, n_head_kv, head_dim, head_dim_v;
    int32_t window;            /* 0, or: key j is visible from position p only if p - j < window */
    float scale;               /* applied to q.k before the softmax */
    const uint8_t *kq;         /* NULL, or quantized keys [n_ctx][k_cell_bytes] (kv_quant.h) instead of k */
    size_t k_cell_bytes;
    const pi2_type_traits *kt; /* their traits */
    int32_t flash;             /* 1: flash attention's numbers (flash_attn.c), which a quantized V needs */
    const uint8_t *vq;         /* NULL, or (flash only) quantized values [n_ctx][v_cell_bytes] instead of v */
    size_t v_cell_bytes;
    const pi2_type_traits *vt; /* their traits */
    int32_t rows;              /* score rows of n_ctx floats (and qf rows of head_dim) scores holds per thread:
                                * PI2_ATTN_ROWS lets a prompt batch take attn_batch.c's path, 0 or 1 does not */
} pi2_attn;

/* An F16 cache value as the float it stands for (exact): the hardware conversion on AArch64, else the FP16
 * library's bit tricks (which x86 compilers vectorise). */
static inline float pi2_kv_h2f(pi2_fp16 h) {
#if defined(__aarch64__)
    __fp16 f;
    __builtin_memcpy(&f, &h, 2);
    return (float)f;
#else
    return pi2_fp16_to_f32(h);
#endif
}

/* Score rows per thread a context allocates: attn_batch.c scores up to this many (token, head) queries of one
 * KV head together. */
#define PI2_ATTN_ROWS 14
/* The rows a context of batches of n_batch tokens gives pi2_attn (one-token contexts need one). */
static inline int32_t pi2_attn_rows(int32_t n_batch) { return n_batch > 1 ? PI2_ATTN_ROWS : 1; }

/* Attention as above, or with flash attention on when a->flash (pi2_flash_attention). */
void pi2_attention(pi2_pool *pool, pi2_attn *a);
/* Attention with llama.cpp's flash attention numbers (flash_attn.c, pi2/reference/flash_attn.py). */
void pi2_flash_attention(pi2_pool *pool, pi2_attn *a);
/* Whether pi2_flash_attention takes ggml's tiled loop for a (64 tokens or more, F16 keys and values). */
int pi2_flash_tiled(const pi2_attn *a);
/* s[j] = scale · (qf · key j) for j in [j0, j1), ggml_vec_dot_f16's order; qf already F16-valued, kT the KV head's
 * transposed keys; acc: scratch of pi2_attn_acc_floats. */
void pi2_attn_scores_vec(const pi2_attn *a, const float *qf, const pi2_fp16 *kT, float *s, int32_t j0, int32_t j1,
                         float *acc);
/* The one-token loops of attn.c's attention on this CPU's half conversions (attn_decode.c), the same sums in the same
 * order: s[j] = scale · (qf · key j) for j in [j0, j1) (kT: the KV head's keys, rows ld halves apart), and out[d] =
 * sum over j in [j0, j1) of p[j] · v[j·vd + d] for d < hdv. 1 when done, 0 when this CPU has no such loop (the caller
 * computes it). acc: scratch of pi2_attn_acc_floats. */
int pi2_attn_dec_scores(const float *qf, const pi2_fp16 *kT, size_t ld, int32_t hd, float scale, float *s, int32_t j0,
                        int32_t j1, float *acc);
int pi2_attn_dec_values(const float *p, const pi2_fp16 *v, size_t vd, int32_t hdv, float *out, int32_t j0, int32_t j1,
                        float *acc);
/* Whether this x86-64 CPU converts halves in AVX-512 with 16-bit masks (AVX512F, BW, VL): attn_batch.c's and
 * attn.c's wide loops need it. */
int pi2_cpu_avx512_half(void);
/* Whether this x86-64 CPU has AVX2, FMA and F16C (attn_decode.c's and attn_batch_avx2.c's loops need them). */
int pi2_cpu_avx2_half(void);
/* One query's softmax over its visible keys j0..pos of s (scaled scores in, F16-rounded weights out): v_expf of
 * s - max, sums of 16 aligned positions reduced in float and added into a double, weights times 1/sum rounded. */
void pi2_attn_softmax_row(float *s, int32_t j0, int32_t pos);
/* y[i] = the F16 rounding of x[i] (as a float). */
void pi2_f16_round_row(float *y, const float *x, int64_t n);
/* A prompt batch's attention with F16 keys and values (attn_batch.c) if this CPU and a's shapes allow it and
 * a->rows does: 1 when done, 0 when the caller computes it. */
int pi2_attn_batch(pi2_pool *pool, const pi2_attn *a);
/* attn_batch.c's two kernels on AVX2 (attn_batch_avx2.c), the same numbers; 1 when done, 0 when this CPU or the
 * shapes do not allow it. Scores: s[m·ls + j] = scale · (qf[m] . key j), j in [jlo, jhi), M ≤ PI2_ATTN_ROWS queries
 * qf [M][hd] (hd a multiple of 16), kT the KV head's transposed keys (rows ld halves apart). Values: for d < hdv (a
 * multiple of 8), out[(m / nh)·lt + (m % nh)·hdv + d] = sum over j in [jlo, jhi) of p[m·ls + j] · v[j·vd + d]. */
int pi2_attn_batch_scores_avx2(int32_t M, const float *qf, int32_t hd, const pi2_fp16 *kT, size_t ld, int32_t jlo,
                               int32_t jhi, float *s, size_t ls, float scale);
int pi2_attn_batch_weigh_avx2(int32_t M, const float *p, size_t ls, const pi2_fp16 *v, size_t vd, int32_t hdv,
                              int32_t jlo, int32_t jhi, float *out, int32_t nh, size_t lt);
/* Floats of accumulator scratch one attention thread needs. */
int64_t pi2_attn_acc_floats(int32_t head_dim, int32_t head_dim_v);

#endif
