/* kernel_selftest.c — checks every kernel of the C core against the scalar reference (kernels/ref.c)
 * (one file on purpose: one compiler command builds it natively and for aarch64 under qemu)
 * and plain double-precision math, without Python: built natively (gcc, and clang when present) and
 * cross-compiled for aarch64 under qemu by scripts/test_aarch64.sh.
 * Does: at the sizes 1, 7, 31, 32, 33, 255, 256, 4096+32 (values for F32/F16/BF16 rows and the ops;
 *       blocks per row for block types, at most 256 blocks of the 256-value types; output rows and
 *       batch tokens for pi2_matmul): vec_dot of every weight type in every table (ref, base SIMD,
 *       auto); the batch orders and the four-token / two-row kernels; pi2_matmul over a thread pool;
 *       dequantize and quantize_act bytes (a hash that must be the same on every CPU); RMSNorm, both
 *       RoPEs, SiLU/GELU/ReLU, attention with its softmax; the public API's argument checks; the low-bit
 *       predictor rows (kernels/lowbit.c: every table bit-identical to the reference, which is checked
 *       against double math at NMSE 1e-10).
 * Tolerances (NMSE = Σ(a−b)²/Σb²), stated per check below and in TOL_FAST:
 *   - every fast vec_dot equals x86_order_dot (a scalar emulation of the AVX2 kernels' float order)
 *     bit for bit, on x86-64 and on aarch64 alike (NEON follows x86's order); so does pi2_matmul
 *     in every table but the reference one, batch orders included; four-token kernels equal four
 *     one-token calls bit for bit;
 *   - fast vs ref: TOL_FAST[type] (integer sums per block are exact; only float order differs);
 *   - ref vs dequantized weights · dequantized activations in double: 1e-10 (1e-5 for Q4_1/Q5_1,
 *     whose Q8_1 activation stores d·Σq rounded to fp16);
 *   - ops vs double math: RMSNorm 1e-12, SiLU 1e-12, ReLU exact, RoPE 1e-9; GELU per value within
 *     one F16 ulp + 1e-6 of gelu(F16-rounded input) (ggml's F16 table, built in float; past ±10: 0 or x),
 *     attention 1e-5 (q and the softmax weights are rounded to F16, as ggml does);
 *   - hashes of every output above against goldens from x86-64: bit-identical results across CPUs.
 * Prints "N passed, M failed"; exit status 1 on failure.
 * Does not: compare with numpy (tests/test_kernels.py does) or time anything. */
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

static const int SIZES[] = {1, 7, 31, 32, 33, 255, 256, 4096 + 32};
static void test_axpy(int type, int size);
static void test_lowbit(int bits, int size);
static void test_packed(int type, pi2_pool *pool, int n_blocks, int n_out);
static void test_tiles_distinct(int type, int n_blocks);
static float *rand_floats(int64_t n, float scale);
#define N_SIZES (int)(sizeof SIZES / sizeof SIZES[0])
#define K_MAX_BLOCKS 256          /* 256-value block types: at most 256 blocks (65536 values) per row */

/* fast vs ref NMSE per type: quant types sum exact integers per block in both, so only the float32
 * order of the per-block terms differs; F32/F16 fast kernels sum in float32 lanes, the ref in double. */
static double tol_fast(int type) { return type == PI2_T_F32 || type == PI2_T_F16 || type == PI2_T_BF16 ? 1e-11 : 1e-10; }

static int n_pass, n_fail;
static uint64_t rng = 0x9E3779B97F4A7C15ull;
static uint64_t h_dots = 0xcbf29ce484222325ull, h_ops = 0xcbf29ce484222325ull;   /* cross-CPU hashes */

static uint32_t next_u32(void) {  /* xorshift64* */
    rng ^= rng >> 12; rng ^= rng << 25; rng ^= rng >> 27;
    return (uint32_t)((rng * 0x2545F4914F6CDD1Dull) >> 32);
}
static float next_f(void) { return (float)next_u32() / 4294967296.0f * 2.0f - 1.0f; }  /* [-1, 1) */

static void check(int ok, const char *what, const char *type, const char *impl, int size, double err) {
    if (ok) { n_pass++; return; }
    n_fail++;
    printf("FAIL %s %s impl=%s size=%d err=%.3g\n", what, type, impl, size, err);
}

static uint64_t fnv1a(uint64_t h, const void *p, size_t n) {
    for (size_t i = 0; i < n; i++) h = (h ^ ((const uint8_t *)p)[i]) * 0x100000001b3ull;
    return h;
}

static double nmse(const float *a, const float *b, int64_t n) {
    double num = 0, den = 0;
    for (int64_t i = 0; i < n; i++) { num += ((double)a[i] - b[i]) * ((double)a[i] - b[i]); den += (double)b[i] * b[i]; }
    return den > 0 ? num / den : num;
}

static double nmse_d(const float *a, const double *b, int64_t n) {
    double num = 0, den = 0;
    for (int64_t i = 0; i < n; i++) { num += (a[i] - b[i]) * (a[i] - b[i]); den += b[i] * b[i]; }
    return den > 0 ? num / den : num;
}

/* Random weight rows: random bytes, then sane fp16/f32 values in the scale (or value) fields. */
static void fill_weights(int type, uint8_t *w, int64_t n_blocks, int32_t ts) {
    for (int64_t i = 0; i < n_blocks * ts; i++) w[i] = (uint8_t)next_u32();
    for (int64_t b = 0; b < n_blocks; b++) {
        uint8_t *blk = w + b * ts;
        pi2_fp16 h1 = pi2_f32_to_fp16(next_f() * 0.01f), h2 = pi2_f32_to_fp16(next_f() * 0.01f);
        switch (type) {
        case PI2_T_F32: { float f = next_f(); memcpy(blk, &f, 4); break; }
        case PI2_T_F16: h1 = pi2_f32_to_fp16(next_f()); memcpy(blk, &h1, 2); break;
        case PI2_T_BF16: { pi2_bf16 v = pi2_f32_to_bf16(next_f()); memcpy(blk, &v, 2); break; }
        case PI2_T_Q6_K: memcpy(blk + 208, &h1, 2); break;
        case PI2_T_Q4_1: case PI2_T_Q5_1: case PI2_T_Q4_K: case PI2_T_Q5_K:
            memcpy(blk, &h1, 2); memcpy(blk + 2, &h2, 2); break;
        default: memcpy(blk, &h1, 2); break;   /* Q4_0, Q5_0, Q8_0 */
        }
    }
}

/* ---------------- x86's float order, in scalar C ---------------- */

/* hsum_float_8: (hi + lo), (0+2) + (1+3). */
static float hsum8(const float a[8]) {
    float r[4];
    for (int i = 0; i < 4; i++) r[i] = a[i + 4] + a[i];
    return (r[0] + r[2]) + (r[1] + r[3]);
}

static float h2f(const uint8_t *p) { pi2_fp16 h; memcpy(&h, p, 2); return pi2_fp16_to_f32(h); }

/* The 32 integer values of a Q4_0/Q4_1/Q5_0/Q5_1/Q8_0 block in value order, its d and (x_1 types) m. */
static void block32(int type, const uint8_t *blk, int v[32], float *d, float *m) {
    const uint8_t *qs = blk + 2;
    uint32_t qh = 0;
    int off = 0;
    *d = h2f(blk), *m = 0;
    switch (type) {
    case PI2_T_Q4_0: off = 8; break;
    case PI2_T_Q4_1: *m = h2f(blk + 2); qs = blk + 4; break;
    case PI2_T_Q5_0: memcpy(&qh, blk + 2, 4); qs = blk + 6; off = 16; break;
    case PI2_T_Q5_1: *m = h2f(blk + 2); memcpy(&qh, blk + 4, 4); qs = blk + 8; break;
    default: for (int j = 0; j < 32; j++) v[j] = (int8_t)blk[2 + j]; return;   /* Q8_0 */
    }
    for (int j = 0; j < 16; j++) {
        v[j] = ((qs[j] & 0xF) | (int)(((qh >> j) & 1) << 4)) - off;
        v[j + 16] = ((qs[j] >> 4) | (int)(((qh >> (j + 16)) & 1) << 4)) - off;
    }
}

static float val(int type, const uint8_t *p, int64_t i) {
    if (type == PI2_T_F32) { float f; memcpy(&f, p + 4 * i, 4); return f; }
    return h2f(p + 2 * i);
}

/* *s = row w · activation xq in the float order of x86_body.h's AVX2 kernels: 8 float lanes, lane l
 * of a 32-value block taking values 4l..4l+3, acc = fma(d_x·d_y, lane, acc), hsum_float_8 (+ the
 * mins sum for Q4_1/Q5_1); F32/F16: 4/2 accumulators of 8 lanes, the tail in double. Q4_K and Q6_K:
 * ref.c's kernels, written in that order (ref_k.h; Q5_K's in ref.c); BF16 runs the reference everywhere. */
static void x86_order_dot(const pi2_type_traits *ref, int type, int64_t n, float *s, const uint8_t *w, const uint8_t *xq) {
    float acc[8] = {0};
    if (type == PI2_T_F32 || type == PI2_T_F16) {
        const int step = type == PI2_T_F32 ? 32 : 16;
        float a4[4][8] = {{0}};
        int64_t i = 0;
        for (; i + step <= n; i += step)
            for (int k = 0; k < step / 8; k++)
                for (int l = 0; l < 8; l++)
                    a4[k][l] = fmaf(val(type, w, i + 8 * k + l), val(type, xq, i + 8 * k + l), a4[k][l]);
        for (int l = 0; l < 8; l++)
            acc[l] = step == 32 ? (a4[0][l] + a4[1][l]) + (a4[2][l] + a4[3][l]) : a4[0][l] + a4[1][l];
        double sum = hsum8(acc);
        for (; i < n; i++) sum += (double)(val(type, w, i) * val(type, xq, i));
        *s = (float)sum;
        return;
    }
    if (ref->block_size != 32) { ref->vec_dot(n, s, w, xq); return; }
    const int q81 = ref->vec_dot_type == PI2_T_Q8_1;
    const size_t xs = q81 ? sizeof(blk_q8_1) : sizeof(blk_q8_0);
    float summs = 0;
    for (int64_t b = 0; b < n / 32; b++) {
        int v[32];
        float d, m;
        block32(type, w + b * ref->type_size, v, &d, &m);
        const uint8_t *y = xq + b * xs;
        const int8_t *yq = (const int8_t *)(y + (q81 ? 4 : 2));
        const float dd = d * h2f(y);
        for (int l = 0; l < 8; l++) {
            int lane = 0;
            for (int j = 4 * l; j < 4 * l + 4; j++) lane += v[j] * yq[j];
            acc[l] = fmaf(dd, (float)lane, acc[l]);
        }
        if (q81) summs += m * h2f(y + 2);
    }
    *s = q81 ? hsum8(acc) + summs : hsum8(acc);
}

/* The batch order's x86 twin: ref.c's vec_dot_batch (Q4_K, Q6_K), else the one-token order. */
static void x86_order_batch(const pi2_type_traits *ref, int type, int64_t n, float *s, const uint8_t *w, const uint8_t *xq) {
    if (ref->vec_dot_batch) ref->vec_dot_batch(n, s, w, xq);
    else x86_order_dot(ref, type, n, s, w, xq);
}

static int same_bits(const float *a, const float *b, int64_t n) { return !memcmp(a, b, (size_t)n * sizeof *a); }

/* The four-token, two-row and four-row kernels against their one-token twins, bit for bit: four rows of
 * activations (the same quantized row at four places) through vec_dot4 / vec_dot4x2 / vec_dot4x4 / dot8x4 / batch8 /
 * vec_dot_batch4, and four weight rows with one token through the four-row kernel. */
static void test_multi_token(const pi2_type_traits *t, const pi2_type_traits *ref, const uint8_t *w, size_t row_bytes,
                             const uint8_t *xq, size_t xrow, int64_t n, int rows, int size, pi2_vec_dot4x2_fn d42,
                             pi2_vec_dot4x2_fn d44, pi2_vec_dot4x2_fn d84, pi2_act_prep_fn p84, size_t wrow,
                             pi2_vec_dot4_fn b8, pi2_vec_dot_rows4_fn rows4) {
    uint8_t *x4 = malloc(4 * xrow), *x8 = malloc(8 * xrow);
    for (int k = 0; k < 4; k++) memcpy(x4 + k * xrow, xq, xrow);
    for (int k = 0; k < 8; k++) memcpy(x8 + k * xrow, xq, xrow);
    for (int r = 0; r < rows; r++) {
        const uint8_t *row = w + r * row_bytes;
        float one, four[8], want;
        if (t->vec_dot4) {
            t->vec_dot(n, &one, row, xq);
            t->vec_dot4(n, four, 2, row, x4, xrow);
            check(same_bits(&four[0], &one, 1) && same_bits(&four[6], &one, 1), "dot4-vs-dot", ref->name, t->vec_dot_impl, size, 0);
        }
        if (d42 && r + 1 < rows) {   /* rows r, r+1 x four tokens: out[2t + k] */
            float two[2];
            t->vec_dot(n, &two[0], row, xq);
            t->vec_dot(n, &two[1], row + row_bytes, xq);
            d42(n, four, 2, row, row_bytes, x4, xrow);
            int same = 1;
            for (int k = 0; k < 8; k++) same &= same_bits(&four[k], &two[k % 2], 1);
            check(same, "dot4x2-vs-dot", ref->name, t->vec_dot_impl, size, 0);
        }
        if (d44 && r + 3 < rows) {   /* rows r..r+3 x four tokens: out[4t + k] */
            float one4[4], sixteen[16];
            for (int k = 0; k < 4; k++) t->vec_dot(n, &one4[k], row + k * row_bytes, xq);
            d44(n, sixteen, 4, row, row_bytes, x4, xrow);
            int same = 1;
            for (int k = 0; k < 16; k++) same &= same_bits(&sixteen[k], &one4[k % 4], 1);
            check(same, "dot4x4-vs-dot", ref->name, t->vec_dot_impl, size, 0);
        }
        if (d84 && r + 3 < rows) {   /* rows r..r+3 x eight tokens (the four activation rows twice) */
            float one4[4], out32[32];
            for (int k = 0; k < 4; k++) t->vec_dot(n, &one4[k], row + k * row_bytes, xq);
            if (p84) {   /* dot8x4 reads its own rows: eight copies of prep's row */
                uint8_t *w8 = malloc(8 * wrow);
                for (int k = 0; k < 8; k++) p84(xq, w8 + k * wrow, n);
                d84(n, out32, 4, row, row_bytes, w8, wrow);
                free(w8);
            } else
                d84(n, out32, 4, row, row_bytes, x8, xrow);
            int same = 1;
            for (int k = 0; k < 32; k++) same &= same_bits(&out32[k], &one4[k % 4], 1);
            check(same, "dot8x4-vs-dot", ref->name, t->vec_dot_impl, size, 0);
        }
        if (rows4 && r == 0 && rows >= 4) {   /* rows 0..3 x one token, each == its vec_dot */
            float got[4], want4[4];
            for (int k = 0; k < 4; k++) t->vec_dot(n, &want4[k], w + k * row_bytes, xq);
            rows4(n, got, w, row_bytes, xq);
            check(same_bits(got, want4, 4), "rows4-vs-dot", ref->name, t->vec_dot_impl, size, nmse(got, want4, 4));
            const pi2_vec_dot_rows4p_fn rows4p = pi2_kernels_dot_rows4p(PI2_T_Q4_K, PI2_K_IMPL_AUTO);
            if (rows4p && t == pi2_traits(PI2_T_Q4_K, PI2_K_IMPL_AUTO)) {   /* rows anywhere, in any order */
                const uint8_t *const at[4] = {w + 3 * row_bytes, w, w + 3 * row_bytes, w + 2 * row_bytes};
                float want_at[4];
                for (int k = 0; k < 4; k++) t->vec_dot(n, &want_at[k], at[k], xq);
                rows4p(n, got, at, xq);
                check(same_bits(got, want_at, 4), "rows4p-vs-dot", ref->name, t->vec_dot_impl, size, nmse(got, want_at, 4));
            }
        }
        if (t->vec_dot_batch && t->vec_dot_batch4) {
            t->vec_dot_batch(n, &want, row, xq);
            t->vec_dot_batch4(n, four, 2, row, x4, xrow);
            check(same_bits(&four[0], &want, 1) && same_bits(&four[6], &want, 1), "batch4-vs-batch", ref->name, t->vec_dot_impl, size, 0);
            if (b8) {
                float eight[16];
                b8(n, eight, 2, row, x8, xrow);
                int same = 1;
                for (int k = 0; k < 8; k++) same &= same_bits(&eight[2 * k], &want, 1);
                check(same, "batch8-vs-batch", ref->name, t->vec_dot_impl, size, 0);
            }
        }
    }
    free(x4); free(x8);
}

static int64_t cols_for(const pi2_type_traits *ref, int size) {
    if (ref->block_size == 1) return size;
    return (int64_t)(ref->block_size == QK_K && size > K_MAX_BLOCKS ? K_MAX_BLOCKS : size) * ref->block_size;
}

static size_t act_bytes(const pi2_type_traits *ref, int64_t n) {
    const pi2_type_traits *a = pi2_traits(ref->vec_dot_type, PI2_K_IMPL_REF);
    return (size_t)(n / a->block_size) * (size_t)a->type_size;
}

/* vec_dot and vec_dot_batch of every table on 4 rows of size blocks (values for float types). */
static void test_vec_dot(int type, int size) {
    enum { ROWS = 4 };
    const pi2_type_traits *ref = pi2_traits(type, PI2_K_IMPL_REF);
    const pi2_type_traits *act = pi2_traits(ref->vec_dot_type, PI2_K_IMPL_REF);
    const int64_t n = cols_for(ref, size);
    const size_t row_bytes = (size_t)(n / ref->block_size) * ref->type_size, xrow = act_bytes(ref, n);
    uint8_t *w = malloc(row_bytes * ROWS), *xq = malloc(xrow);
    float *x = malloc(n * sizeof(float)), *wf = malloc(n * sizeof(float)), *xf = malloc(n * sizeof(float));
    fill_weights(type, w, (n / ref->block_size) * ROWS, ref->type_size);
    for (int64_t i = 0; i < n; i++) x[i] = next_f();
    ref->quantize_act(x, xq, n);
    act->to_float(xq, xf, n);
    float out_ref[ROWS], out_dq[ROWS], out_x86[ROWS], out_bx86[ROWS], out[ROWS];
    for (int r = 0; r < ROWS; r++) {
        ref->vec_dot(n, &out_ref[r], w + r * row_bytes, xq);
        x86_order_dot(ref, type, n, &out_x86[r], w + r * row_bytes, xq);
        x86_order_batch(ref, type, n, &out_bx86[r], w + r * row_bytes, xq);
        ref->to_float(w + r * row_bytes, wf, n);
        double acc = 0;
        for (int64_t i = 0; i < n; i++) acc += (double)wf[i] * xf[i];
        out_dq[r] = (float)acc;
    }
    h_dots = fnv1a(fnv1a(h_dots, out_x86, sizeof out_x86), out_bx86, sizeof out_bx86);
    const double tol_dq = ref->vec_dot_type == PI2_T_Q8_1 ? 1e-5 : 1e-10;
    double e = nmse(out_ref, out_dq, ROWS);
    check(e <= tol_dq, "ref-vs-dequant", ref->name, "ref", size, e);
    e = nmse(out_x86, out_ref, ROWS);
    check(e <= tol_fast(type), "x86-order-vs-ref", ref->name, "ref", size, e);
    for (int impl = PI2_K_IMPL_AUTO; impl <= PI2_K_IMPL_BASE; impl += 2) {
        const pi2_type_traits *t = pi2_traits(type, impl);
        for (int r = 0; r < ROWS; r++) t->vec_dot(n, &out[r], w + r * row_bytes, xq);
        e = nmse(out, out_ref, ROWS);
        check(e <= tol_fast(type), "fast-vs-ref", ref->name, t->vec_dot_impl, size, e);
        check(same_bits(out, out_x86, ROWS), "fast-vs-x86-order", ref->name, t->vec_dot_impl, size, nmse(out, out_x86, ROWS));
        if (t->vec_dot_batch) {
            for (int r = 0; r < ROWS; r++) t->vec_dot_batch(n, &out[r], w + r * row_bytes, xq);
            check(same_bits(out, out_bx86, ROWS), "batch-vs-x86-order", ref->name, t->vec_dot_impl, size, nmse(out, out_bx86, ROWS));
        }
        int32_t p84_bytes;
        const pi2_act_prep_fn p84 = pi2_kernels_dot8x4_prep(type, impl, &p84_bytes);
        test_multi_token(t, ref, w, row_bytes, xq, xrow, n, ROWS, size, pi2_kernels_dot4x2(type, impl),
                         pi2_kernels_dot4x4(type, impl), pi2_kernels_dot8x4(type, impl),
                         p84, (size_t)(n / 32) * (size_t)p84_bytes, pi2_kernels_batch8(type, impl),
                         pi2_kernels_dot_rows4(type, impl));
    }
    free(w); free(xq); free(x); free(wf); free(xf);
}

/* pi2_matmul (rows split over a 2-thread pool, token tiles, batch orders, four-token and two-row
 * kernels) on n_out rows x n_tok tokens: each output equals its one-token kernel of the same table
 * bit for bit, and x86's order in every fast table. */
static void test_matmul(int type, pi2_pool *pool, int n_out, int n_tok, int size) {
    const pi2_type_traits *ref = pi2_traits(type, PI2_K_IMPL_REF);
    const int64_t n_in = ref->block_size == 1 ? 33 : ref->block_size == 32 ? 96 : QK_K;
    const size_t row_bytes = (size_t)(n_in / ref->block_size) * ref->type_size, xrow = act_bytes(ref, n_in);
    uint8_t *w = malloc(row_bytes * n_out), *xq = malloc(xrow * n_tok);
    float *x = malloc(sizeof(float) * n_in * n_tok), *out = malloc(sizeof(float) * n_out * n_tok);
    float *want = malloc(sizeof(float) * n_out * n_tok), *want86 = malloc(sizeof(float) * n_out * n_tok);
    fill_weights(type, w, (n_in / ref->block_size) * n_out, ref->type_size);
    for (int64_t i = 0; i < n_in * n_tok; i++) x[i] = next_f();
    for (int t = 0; t < n_tok; t++) ref->quantize_act(x + t * n_in, xq + t * xrow, n_in);
    const pi2_weight wt = {w, type, n_in, n_out, row_bytes, NULL};
    const pi2_mm mm = {&wt, out};
    for (int impl = PI2_K_IMPL_AUTO; impl <= PI2_K_IMPL_BASE; impl++) {
        const pi2_type_traits *tr = pi2_traits(type, impl);
        uint8_t *scratch = malloc(pi2_matmul_scratch(&mm, 1, n_tok, impl));
        const pi2_matmul_env env = {pool, impl, scratch, NULL, NULL, 0};
        pi2_matmul(&env, x, n_tok, &mm, 1);
        for (int t = 0; t < n_tok; t++)
            for (int r = 0; r < n_out; r++) {
                const int batch = pi2_uses_batch_dot(tr, n_tok, t);
                const uint8_t *row = w + r * row_bytes, *xt = xq + t * xrow;
                (batch ? tr->vec_dot_batch : tr->vec_dot)(n_in, &want[t * n_out + r], row, xt);
                (batch ? x86_order_batch : x86_order_dot)(ref, type, n_in, &want86[t * n_out + r], row, xt);
            }
        check(same_bits(out, want, (int64_t)n_out * n_tok), "matmul-vs-dot", ref->name, tr->vec_dot_impl, size, 0);
        if (impl != PI2_K_IMPL_REF)
            check(same_bits(out, want86, (int64_t)n_out * n_tok), "matmul-vs-x86-order", ref->name, tr->vec_dot_impl, size,
                  nmse(out, want86, (int64_t)n_out * n_tok));
        else {
            const double e = nmse(out, want86, (int64_t)n_out * n_tok);
            check(e <= tol_fast(type), "matmul-ref-vs-x86-order", ref->name, "ref", size, e);
        }
        free(scratch);
    }
    free(w); free(xq); free(x); free(out); free(want); free(want86);
}

static void test_type(int type, pi2_pool *pool) {
    for (int s = 0; s < N_SIZES; s++) {
        test_vec_dot(type, SIZES[s]);
        test_matmul(type, pool, SIZES[s], 9, SIZES[s]);          /* rows at every size; 9 tokens: batch groups + rest */
        if (SIZES[s] <= 33) test_matmul(type, pool, 7, SIZES[s], SIZES[s]);   /* tokens 1..33 */
        const uint64_t keep = rng;   /* the cross-CPU hashes fix the random stream of the tests above */
        test_matmul(type, pool, SIZES[s], 1, SIZES[s]);          /* rows at every size, one token: four-row kernels */
        rng = keep;
    }
}

/* ---------------- grouped row sums (axpy_group) against their definition ---------------- */

/* Q4_1 and Q5_1 rows (axpy_qx1.c), written out per block b: a_i = p_i·d_ib, M = ((+0 + p_0·m_0b) + ...),
 * mx = max|a_i|, z_i = nearbyint(a_i·(127/mx)), y[j] = y[j] + ((mx/127)·(float)Σ z_i·q_ij + M); blocks with mx
 * outside [1e-30, FLT_MAX] add M alone. */
static void axpy_qx1_model(int type, int64_t n, float *y, const uint8_t *rows, size_t rb, const int32_t *idx,
                           const float *p, int32_t k) {
    const size_t bs = type == PI2_T_Q5_1 ? 24 : 20;
    for (int64_t b = 0; b < n / 32; b++) {
        float a[64], M = 0.0f, mx = 0.0f;
        int32_t acc[32] = {0};
        for (int32_t i = 0; i < k; i++) {
            const uint8_t *blk = rows + (size_t)idx[i] * rb + (size_t)b * bs;
            pi2_fp16 d, m;
            memcpy(&d, blk, 2);
            memcpy(&m, blk + 2, 2);
            a[i] = p[i] * pi2_fp16_to_f32(d);
            M = M + p[i] * pi2_fp16_to_f32(m);
            mx = fabsf(a[i]) > mx ? fabsf(a[i]) : mx;
        }
        const int ok = mx >= 1e-30f && mx <= FLT_MAX;
        for (int32_t i = 0; i < k && ok; i++) {
            const uint8_t *blk = rows + (size_t)idx[i] * rb + (size_t)b * bs;
            const int32_t z = (int32_t)nearbyintf(a[i] * (127.0f / mx));
            uint32_t qh = 0;
            if (type == PI2_T_Q5_1) memcpy(&qh, blk + 4, 4);
            const uint8_t *qs = blk + (type == PI2_T_Q5_1 ? 8 : 4);
            for (int j = 0; j < 32; j++) {
                const int32_t q = (j < 16 ? qs[j] & 15 : qs[j - 16] >> 4) | (int32_t)((qh >> j) & 1u) << 4;
                acc[j] += z * q;
            }
        }
        for (int j = 0; j < 32; j++) y[b * 32 + j] = y[b * 32 + j] + ((ok ? mx / 127.0f : 0.0f) * (float)acc[j] + M);
    }
}

/* Every table's axpy_group equals the term-by-term definition on the row values (to_float), bit for
 * bit: y += (((+0 + h0·v0) + h1·v1) + ...), rows picked by idx from a strided matrix, starting at a
 * block boundary of the row; Q4_1 and Q5_1 rows equal axpy_qx1_model instead, also with 64 rows of only the
 * largest values and equal h (every z = 127: the widest int16 sums), all h = 0, and k = 0, and stay within the
 * 8-bit activations' error of the float sum (NMSE ≤ 1e-3). */
static void test_axpy(int type, int size) {
    const pi2_type_traits *ref = pi2_traits(type, PI2_K_IMPL_REF);
    const int qx1 = type == PI2_T_Q4_1 || type == PI2_T_Q5_1;
    const int64_t bs = ref->block_size, n = cols_for(ref, size), skip = bs < 64 ? 64 : bs;
    const int32_t n_rows = 80, ks[] = {1, 7, 64, 64, 7, 0};
    const int n_cases = qx1 ? 6 : 3;
    const size_t rb = (size_t)((n + skip) / bs) * (size_t)ref->type_size + 8;   /* + padding, like a bundle */
    uint8_t *w = calloc(rb, n_rows + 64);
    for (int32_t r = 0; r < n_rows; r++) fill_weights(type, w + (size_t)r * rb, (n + skip) / bs, ref->type_size);
    for (int32_t r = n_rows; r < n_rows + 64 && qx1; r++) {   /* every value the largest, d = 1, m = 0.5 */
        fill_weights(type, w + (size_t)r * rb, (n + skip) / bs, ref->type_size);
        for (int64_t b = 0; b < (n + skip) / bs; b++) {
            uint8_t *blk = w + (size_t)r * rb + (size_t)b * (size_t)ref->type_size;
            const pi2_fp16 one = pi2_f32_to_fp16(1.0f), half = pi2_f32_to_fp16(0.5f);
            memcpy(blk, &one, 2);
            memcpy(blk + 2, &half, 2);
            memset(blk + 4, 0xFF, (size_t)ref->type_size - 4);
        }
    }
    const size_t off = (size_t)(skip / bs) * (size_t)ref->type_size;
    float *y0 = rand_floats(n, 1.0f), *want = malloc(sizeof(float) * n), *got = malloc(sizeof(float) * n);
    float *v = malloc(sizeof(float) * n), *p = malloc(sizeof(float) * n), h[64];
    int32_t idx[64];
    for (int c = 0; c < n_cases; c++) {
        const int32_t k = ks[c];
        for (int32_t i = 0; i < k; i++) {
            idx[i] = c == 3 ? n_rows + i : (int32_t)(i * n_rows / k + (int32_t)(next_u32() % (uint32_t)(n_rows / k)));
            h[i] = c == 3 ? -2.0f : c == 4 ? 0.0f : next_f();
        }
        for (int64_t j = 0; j < n; j++) p[j] = 0.0f;
        for (int32_t i = 0; i < k; i++) {
            ref->to_float(w + (size_t)idx[i] * rb + off, v, n);
            for (int64_t j = 0; j < n; j++) p[j] += h[i] * v[j];
        }
        for (int64_t j = 0; j < n; j++) want[j] = y0[j] + p[j];
        if (qx1) {
            for (int64_t j = 0; j < n; j++) p[j] = want[j];   /* the float sum, for the error bound */
            memcpy(want, y0, sizeof(float) * n);
            axpy_qx1_model(type, n, want, w + off, rb, idx, h, k);
            if (c >= 4) check(same_bits(want, y0, n), "axpy_group-qx1-unchanged", ref->name, "model", size * 100 + c, 0);
            check(nmse(want, p, n) <= 1e-3 || c == 3, "axpy_group-qx1-vs-float", ref->name, "model", size * 100 + c,
                  nmse(want, p, n));
        }
        for (int impl = PI2_K_IMPL_AUTO; impl <= PI2_K_IMPL_BASE; impl++) {
            memcpy(got, y0, sizeof(float) * n);
            pi2_traits(type, impl)->axpy_group(n, got, w + off, rb, idx, h, k);
            check(same_bits(got, want, n), "axpy_group", ref->name, impl == 0 ? "auto" : impl == 1 ? "ref" : "base",
                  size * 100 + c, nmse(got, want, n));
        }
    }
    free(w); free(y0); free(want); free(got); free(v); free(p);
}

/* The per-group layout's kernel (axpy_qx1_pack.c, where this CPU has one) equals the reference table's axpy_group
 * of the same plain rows bit for bit: one group of n_rows ≤ 64 rows (a short last group too), active rows ascending
 * (1, 3, 4 of one quad, 51 scattered, all 64), random h, all h = 0, h of inf and ~1e-35 (blocks whose largest
 * a_i is out of range: M alone), the largest values with equal h (every z = 127), k = 0; y starts random. */
static void test_axpy_qx1p(int type, int size) {
    const pi2_axpy_qx1p_fn fn = pi2_kernels_axpy_qx1p(type, PI2_K_IMPL_AUTO);
    if (!fn || size < 1) return;
    const pi2_type_traits *ref = pi2_traits(type, PI2_K_IMPL_REF);
    const int64_t nb = size > 160 ? 160 : size, n = nb * 32;
    const size_t rb = (size_t)nb * (size_t)ref->type_size + 8;   /* + padding, like a bundle */
    for (int32_t n_rows = 64; n_rows >= 37; n_rows -= 27) {
        uint8_t *w = calloc(rb, 64), *grp = malloc(pi2_qx1p_group_bytes(type, nb));
        for (int32_t r = 0; r < n_rows; r++) fill_weights(type, w + (size_t)r * rb, nb, ref->type_size);
        pi2_qx1p_pack_group(type, w, rb, n_rows, nb, grp);
        float *y0 = rand_floats(n, 1.0f), *want = malloc(sizeof(float) * n), *got = malloc(sizeof(float) * n), h[64];
        int32_t idx[64];
        for (int c = 0; c < 9; c++) {
            int32_t k = 0;
            for (int32_t r = 0; r < n_rows; r++) {
                const int take = c == 0 ? r == n_rows / 2 : c == 1 ? r % 19 == 5 : c == 2 ? r / 4 == 3 :
                                 c == 8 ? 0 : c >= 3 && c <= 4 ? next_u32() % 5 != 0 : 1;
                if (take) idx[k++] = r;
            }
            for (int32_t i = 0; i < k; i++)
                h[i] = c == 5 ? 0.0f : c == 6 ? (i == 1 ? INFINITY : -3.0f) : c == 7 ? 1e-35f * (float)(i + 1) : next_f();
            if (c == 4)   /* every value the largest, d = 1: z = ±127 on every row */
                for (int32_t i = 0; i < k; i++) h[i] = i % 2 ? 2.0f : -2.0f;
            memcpy(want, y0, sizeof(float) * n);
            memcpy(got, y0, sizeof(float) * n);
            ref->axpy_group(n, want, w, rb, idx, h, k);
            fn(n, got, grp, idx, h, k);
            check(same_bits(got, want, n), "axpy_qx1p", ref->name, "auto", (int)(size * 1000 + n_rows * 10 + c),
                  nmse(got, want, n));
        }
        free(w); free(grp); free(y0); free(want); free(got);
    }
}

/* ---------------- I8 rows: the integer grouped row sum (axpy_i8.c) against a direct model ---------------- */

/* The scheme written out: m = max|p_i|, z_i = nearbyint(p_i·(32767/m)), y[j] = y[j] + (m/32767)·(float)Σ z_i·q_i[j]. */
static void axpy_i8_model(int64_t n, float *y, const int8_t *rows, size_t rb, const int32_t *idx, const float *p,
                          int32_t k) {
    float m = 0.0f;
    for (int32_t i = 0; i < k; i++) m = fabsf(p[i]) > m ? fabsf(p[i]) : m;
    if (k == 0 || !(m >= 1e-30f && m <= FLT_MAX)) return;
    const float iS = 32767.0f / m, S = m / 32767.0f;
    for (int64_t j = 0; j < n; j++) {
        int32_t acc = 0;
        for (int32_t i = 0; i < k; i++) acc += (int32_t)nearbyintf(p[i] * iS) * rows[(size_t)idx[i] * rb + (size_t)j];
        y[j] = y[j] + S * (float)acc;
    }
}

/* Every table's I8 axpy_group equals the model bit for bit: k in {1, 3, 7, 64} (and 0), n values starting
 * at column 37 of rows with 5 bytes of padding (odd offsets: unaligned loads), p with negatives and a 0,
 * rows holding ±127; half-way ties (m = 32767, so p·32767/m = p exactly); all p = 0 and k = 0 leave y as it
 * was; 64 rows of only ±127 (the first column all +127, the second all -127) with p all equal and with
 * random p, so |Σ z·q| reaches 64·32767·127 and the int32 → float rounding of sums above 2^24 is exercised.
 * Also: the scheme is within quantization error of Σ p_i·q_i[j] (NMSE ≤ 1e-8), and to_float. */
static void test_axpy_i8(int size) {
    const pi2_type_traits *ref = pi2_traits(PI2_T_I8, PI2_K_IMPL_REF);
    const int64_t n = size, off = 37;
    const int32_t n_rows = 80, n_pm = 64, ks[] = {1, 3, 7, 64, 7, 7, 0, 64, 64};
    const size_t rb = (size_t)(off + n + 5);
    int8_t *w = malloc(rb * (size_t)(n_rows + n_pm));
    for (size_t i = 0; i < rb * n_rows; i++) w[i] = (int8_t)((int32_t)(next_u32() % 255) - 127);
    for (size_t i = rb * n_rows; i < rb * (size_t)(n_rows + n_pm); i++) w[i] = next_u32() % 2 ? 127 : -127;
    for (int32_t r = n_rows; r < n_rows + n_pm; r++) {
        w[(size_t)r * rb + (size_t)off] = 127;
        if (n > 1) w[(size_t)r * rb + (size_t)off + 1] = -127;
    }
    w[off] = 127, w[rb + off] = -127;
    float *y0 = rand_floats(n, 1.0f), *want = malloc(sizeof(float) * n), *got = malloc(sizeof(float) * n);
    double *dsum = malloc(sizeof(double) * n);
    float p[64];
    int32_t idx[64];
    for (int c = 0; c < (int)(sizeof ks / sizeof ks[0]); c++) {
        const int32_t k = ks[c];
        for (int32_t i = 0; i < k; i++) {
            idx[i] = c == 0 ? 1 : c >= 7 ? n_rows + i : (int32_t)(i * n_rows / k + (int32_t)(next_u32() % (uint32_t)(n_rows / k)));
            p[i] = c == 7 ? 0.75f : next_f() * (c == 2 ? 1e-3f : 3.0f);
        }
        if (k >= 3 && c < 7) p[1] = 0.0f;
        if (c == 4) {   /* ties: m = 32767, so z = nearbyint(p) exactly, halves to even */
            static const float tie[7] = {-32767.0f, 2.5f, -3.5f, 0.5f, -0.5f, 1.5f, 32766.5f};
            memcpy(p, tie, sizeof tie);
        }
        if (c == 5) for (int32_t i = 0; i < k; i++) p[i] = 0.0f;   /* y unchanged */
        memcpy(want, y0, sizeof(float) * n);
        axpy_i8_model(n, want, w + off, rb, idx, p, k);
        for (int impl = PI2_K_IMPL_AUTO; impl <= PI2_K_IMPL_BASE; impl++) {
            memcpy(got, y0, sizeof(float) * n);
            pi2_traits(PI2_T_I8, impl)->axpy_group(n, got, w + off, rb, idx, p, k);
            check(same_bits(got, want, n), "axpy_group-i8", "I8", impl == 0 ? "auto" : impl == 1 ? "ref" : "base",
                  size * 100 + c, nmse(got, want, n));
        }
        if (c == 5 || c == 6) {
            check(same_bits(want, y0, n), "axpy_group-i8-unchanged", "I8", "model", size * 100 + c, 0);
            continue;
        }
        double num = 0, den = 0;
        for (int64_t j = 0; j < n; j++) {
            dsum[j] = 0;
            for (int32_t i = 0; i < k; i++) dsum[j] += (double)p[i] * w[(size_t)idx[i] * rb + (size_t)(off + j)];
            num += (want[j] - y0[j] - dsum[j]) * (want[j] - y0[j] - dsum[j]);
            den += dsum[j] * dsum[j];
        }
        check(num <= 1e-8 * den, "axpy_group-i8-vs-float", "I8", "model", size * 100 + c, den > 0 ? num / den : num);
    }
    ref->to_float(w + off, got, n);
    int ok = 1;
    for (int64_t j = 0; j < n; j++) ok &= got[j] == (float)w[off + j];
    check(ok, "to_float", "I8", "ref", size, 0);
    free(w); free(y0); free(want); free(got); free(dsum);
}

/* ---------------- ops (ops.h) against double-precision math ---------------- */

static float *rand_floats(int64_t n, float scale) {
    float *x = malloc(sizeof(float) * (n ? n : 1));
    for (int64_t i = 0; i < n; i++) x[i] = next_f() * scale;
    return x;
}

static void test_norm_act(int n) {
    float *x = rand_floats(n, 3.0f), *w = rand_floats(n, 1.0f), *y = malloc(sizeof(float) * n), *g = malloc(sizeof(float) * n);
    double *want = malloc(sizeof(double) * n);
    double ss = 0;
    for (int i = 0; i < n; i++) ss += (double)x[i] * x[i];
    for (int i = 0; i < n; i++) want[i] = x[i] / sqrt(ss / n + 1e-6) * w[i];
    pi2_rms_norm(y, x, w, n, 1e-6f);
    double e = nmse_d(y, want, n);
    check(e <= 1e-12, "rms_norm", "F32", "-", n, e);
    h_ops = fnv1a(h_ops, y, sizeof(float) * n);
    static pi2_fp16 gelu[65536];
    static int have_gelu;
    if (!have_gelu) { pi2_gelu_table(gelu); have_gelu = 1; }
    for (int act = 0; act < 3; act++) {
        int ok = 1;
        for (int i = 0; i < n; i++) {
            const float a = x[i] * 4.0f;   /* gate in [-12, 12): both GELU cut-offs too */
            const double h = pi2_fp16_to_f32(pi2_f32_to_fp16(a));   /* GELU's table input */
            g[i] = a;
            want[i] = act == 0 ? a / (1 + exp(-(double)a)) * w[i]
                    : act == 1 ? 0.5 * h * (1 + tanh(0.7978845608028654 * (h + 0.044715 * h * h * h))) * w[i]
                    : (double)((a > 0 ? a : 0.0f) * w[i]);
        }
        pi2_ffn_activate(g, w, n, act, gelu);
        double worst = 0;   /* GELU: one F16 ulp of the value, plus float cancellation in 1 + tanhf near -1 */
        for (int i = 0; i < n && act == 1; i++) {
            const double err = fabs(g[i] - want[i]) - fabs(want[i]) * 0x1p-10;
            worst = err > worst ? err : worst;
        }
        ok = worst <= 1e-6;
        e = act == 1 ? worst : nmse_d(g, want, n);
        static const char *names[] = {"silu", "gelu", "relu"};
        check(act == 1 ? ok : act == 0 ? e <= 1e-12 : e == 0, names[act], "F32", "-", n, e);
        h_ops = fnv1a(h_ops, g, sizeof(float) * n);
    }
    free(x); free(w); free(y); free(g); free(want);
}

static void test_rope(int size) {
    const int n_rot = size + (size & 1), hd = n_rot + 2, n_heads = 3, pos = 7;
    float *cs = malloc(sizeof(float) * n_rot), *x = rand_floats((int64_t)n_heads * hd, 1.0f), *y = malloc(sizeof(float) * n_heads * hd);
    double *want = malloc(sizeof(double) * n_heads * hd);
    pi2_rope_cache(cs, pos, n_rot, 10000.0f, 1.0f, NULL);
    h_ops = fnv1a(h_ops, cs, sizeof(float) * n_rot);
    for (int neox = 0; neox < 2; neox++) {
        memcpy(y, x, sizeof(float) * n_heads * hd);
        for (int i = 0; i < n_heads * hd; i++) want[i] = x[i];
        for (int h = 0; h < n_heads; h++)
            for (int i = 0; i < n_rot / 2; i++) {
                const int a = h * hd + (neox ? i : 2 * i), b = a + (neox ? n_rot / 2 : 1);
                const double th = pos * pow(10000.0, -2.0 * i / n_rot);
                want[a] = x[a] * cos(th) - x[b] * sin(th);
                want[b] = x[a] * sin(th) + x[b] * cos(th);
            }
        pi2_rope(y, n_heads, hd, n_rot, cs, neox);
        const double e = nmse_d(y, want, (int64_t)n_heads * hd);
        check(e <= 1e-9, neox ? "rope-neox" : "rope-norm", "F32", "-", size, e);
        h_ops = fnv1a(h_ops, y, sizeof(float) * n_heads * hd);
    }
    free(cs); free(x); free(y); free(want);
}

/* Causal GQA attention (and its softmax) over n_ctx = size cached positions, the last n_tok
 * queries: one token (ggml_vec_dot_f16's order) and three (tinyBLAS's). */
static void test_attention(pi2_pool *pool, int size, int n_tok) {
    enum { NH = 4, NKV = 2, HD = 64 };
    if (n_tok > size) return;
    const int n_ctx = size, pos0 = size - n_tok, nt = pi2_pool_n_threads(pool);
    float *q = rand_floats((int64_t)n_tok * NH * HD, 2.0f), *k = rand_floats((int64_t)NKV * HD * n_ctx, 1.0f);
    float *v = rand_floats((int64_t)n_ctx * NKV * HD, 1.0f), *out = malloc(sizeof(float) * n_tok * NH * HD);
    pi2_fp16 *kh = malloc(sizeof(pi2_fp16) * NKV * HD * n_ctx), *vh = malloc(sizeof(pi2_fp16) * NKV * HD * n_ctx);
    for (int64_t i = 0; i < (int64_t)NKV * HD * n_ctx; i++) {   /* the cache holds F16 values (halves) */
        kh[i] = pi2_f32_to_fp16(k[i]);
        vh[i] = pi2_f32_to_fp16(v[i]);
        k[i] = pi2_fp16_to_f32(kh[i]);
        v[i] = pi2_fp16_to_f32(vh[i]);
    }
    float *scores = malloc(sizeof(float) * nt * PI2_ATTN_ROWS * n_ctx), *qf = malloc(sizeof(float) * nt * PI2_ATTN_ROWS * HD);
    float *acc = malloc(sizeof(float) * nt * pi2_attn_acc_floats(HD, HD));
    pi2_attn a = {.q = q, .k = kh, .v = vh, .out = out, .scores = scores, .qf = qf, .acc = acc, .n_tok = n_tok,
                  .pos0 = pos0, .n_ctx = n_ctx, .k_ld = n_ctx, .n_head = NH, .n_head_kv = NKV, .head_dim = HD, .head_dim_v = HD,
                  .window = 0, .scale = 0.125f, .rows = PI2_ATTN_ROWS};   /* batches: attn_batch.c on AVX-512 */
    pi2_attention(pool, &a);
    double *want = calloc((size_t)n_tok * NH * HD, sizeof(double)), *p = malloc(sizeof(double) * n_ctx);
    for (int t = 0; t < n_tok; t++)
        for (int h = 0; h < NH; h++) {
            const int hk = h / (NH / NKV), pos = pos0 + t;
            double mx = -INFINITY, sum = 0;
            for (int j = 0; j <= pos; j++) {
                double s = 0;
                for (int d = 0; d < HD; d++) s += (double)q[(t * NH + h) * HD + d] * k[((int64_t)hk * HD + d) * n_ctx + j];
                p[j] = s * 0.125;
                mx = p[j] > mx ? p[j] : mx;
            }
            for (int j = 0; j <= pos; j++) sum += (p[j] = exp(p[j] - mx));
            for (int j = 0; j <= pos; j++)
                for (int d = 0; d < HD; d++) want[(t * NH + h) * HD + d] += p[j] / sum * v[((int64_t)j * NKV + hk) * HD + d];
        }
    const double e = nmse_d(out, want, (int64_t)n_tok * NH * HD);
    check(e <= 1e-5, n_tok == 1 ? "attention-1" : "attention-batch", "F16", "-", size, e);
    h_ops = fnv1a(h_ops, out, sizeof(float) * n_tok * NH * HD);
    free(q); free(k); free(v); free(kh); free(vh); free(out); free(scores); free(qf); free(acc); free(want); free(p);
}

/* Bit-exactness across CPUs: dequantize every type and quantize every activation format. */
static void test_portable_bytes(uint64_t golden) {
    enum { N = 512 };
    static const int types[] = {PI2_T_F32, PI2_T_F16, PI2_T_BF16, PI2_T_Q4_0, PI2_T_Q4_1, PI2_T_Q5_0, PI2_T_Q5_1,
                                PI2_T_Q8_0, PI2_T_Q4_K, PI2_T_Q5_K, PI2_T_Q6_K, PI2_T_Q8_1, PI2_T_Q8_K};
    static uint8_t buf[N * 4];
    static float x[N], y[N];
    uint64_t h = 0xcbf29ce484222325ull;
    rng = 12345;
    for (size_t t = 0; t < sizeof types / sizeof types[0]; t++) {
        const pi2_type_traits *tr = pi2_traits(types[t], PI2_K_IMPL_REF);
        for (int i = 0; i < N; i++) x[i] = next_f() * (i % 3 ? 1.0f : 300.0f);
        for (int i = 0; i < 32; i++) x[i] = (float)(i - 16) + 0.5f;   /* exact ties */
        x[0] = 127.0f;
        tr->quantize_act(x, buf, N);
        h = fnv1a(h, buf, (size_t)(N / pi2_traits(tr->vec_dot_type, 1)->block_size) * pi2_traits(tr->vec_dot_type, 1)->type_size);
        if (types[t] == PI2_T_Q8_1 || types[t] == PI2_T_Q8_K) continue;
        fill_weights(types[t], buf, N / tr->block_size, tr->type_size);
        tr->to_float(buf, y, N);
        h = fnv1a(h, y, sizeof y);
    }
    if (h != golden) printf("portable bytes hash %016llx, expected %016llx\n", (unsigned long long)h, (unsigned long long)golden);
    check(h == golden, "portable-bytes", "all", "ref", 0, 0);
}

static void test_api(void) {
    float x[64] = {0}, out[2];
    uint8_t q[2 * 34] = {0};
    check(pi2_matvec(11, q, 34, 1, 32, q, out, PI2_IMPL_AUTO) == PI2_ERR_UNSUPPORTED, "api-unknown-type", "Q3_K", "-", 0, 0);
    check(pi2_matvec(PI2_T_Q8_0, q, 34, 1, 48, q, out, PI2_IMPL_AUTO) == PI2_ERR_INVALID, "api-bad-cols", "Q8_0", "-", 0, 0);
    check(pi2_matvec(PI2_T_Q8_0, q, 30, 1, 32, q, out, PI2_IMPL_AUTO) == PI2_ERR_INVALID, "api-short-row", "Q8_0", "-", 0, 0);
    check(pi2_matvec(PI2_T_Q8_0, q, 34, 1, 32, q, out, 7) == PI2_ERR_INVALID, "api-bad-impl", "Q8_0", "-", 0, 0);
    check(pi2_matvec(PI2_T_Q8_K, q, 292, 1, 256, q, out, PI2_IMPL_AUTO) == PI2_ERR_UNSUPPORTED, "api-act-type", "Q8_K", "-", 0, 0);
    check(pi2_quantize_act(PI2_T_Q4_0, x, 64, q) == PI2_ERR_UNSUPPORTED, "api-not-act", "Q4_0", "-", 0, 0);
    check(pi2_quantize_act(PI2_T_Q8_0, x, 64, q) == PI2_OK, "api-ok", "Q8_0", "-", 0, 0);
    check(pi2_matvec(PI2_T_I8, q, 32, 1, 32, q, out, PI2_IMPL_AUTO) == PI2_ERR_UNSUPPORTED, "api-no-vec-dot", "I8", "-", 0, 0);
    check(pi2_quantize_act(PI2_T_I8, x, 64, q) == PI2_ERR_UNSUPPORTED, "api-no-act", "I8", "-", 0, 0);
    check(pi2_dequantize_rows(PI2_T_I8, q, 32, x, 2, 32, PI2_IMPL_AUTO) == PI2_OK, "api-dequant", "I8", "-", 0, 0);
}

int main(void) {
    static const int types[] = {PI2_T_F32, PI2_T_F16, PI2_T_BF16, PI2_T_Q4_0, PI2_T_Q4_1, PI2_T_Q5_0,
                                PI2_T_Q5_1, PI2_T_Q8_0, PI2_T_Q4_K, PI2_T_Q5_K, PI2_T_Q6_K};
    const uint32_t isa = pi2_kernels_isa();
    printf("kernel ISA:%s%s%s%s%s\n", isa & PI2_K_AVX2 ? " avx2" : "", isa & PI2_K_AVX512VNNI ? " avx512vnni" : "",
           isa & PI2_K_NEON ? " neon" : "", isa & PI2_K_DOTPROD ? " dotprod" : "", isa ? "" : " (reference only)");
    pi2_pool *pool;
    if (pi2_pool_create(2, &pool) != PI2_OK) { printf("cannot start a thread pool\n"); return 1; }
    for (size_t i = 0; i < sizeof types / sizeof types[0]; i++) test_type(types[i], pool);
    for (int s = 0; s < N_SIZES; s++) {
        test_norm_act(SIZES[s]);
        test_rope(SIZES[s]);
        test_attention(pool, SIZES[s], 1);
        test_attention(pool, SIZES[s], 3);
    }
    pi2_pool_free(pool);
    /* Goldens from x86-64 (AVX-512 VNNI and AVX2 tables alike): equal hashes = the same bits. */
    printf("hashes: dots %016llx ops %016llx\n", (unsigned long long)h_dots, (unsigned long long)h_ops);
    check(h_dots == 0x7a925bc9729afe7eull, "cross-cpu-dots", "all", "-", 0, 0);
    check(h_ops == 0xe997281a3cd67fdbull, "cross-cpu-ops", "all", "-", 0, 0);
    test_portable_bytes(0xbbe1e1d40fa12f83ull);  /* from x86-64 */
    test_api();
    for (size_t i = 0; i < sizeof types / sizeof types[0]; i++)   /* after the hashes: they fix the random stream */
        for (int s = 0; s < N_SIZES; s++) test_axpy(types[i], SIZES[s]);
    for (int s = 0; s < N_SIZES; s++) test_axpy_i8(SIZES[s]);
    for (int bits = 1; bits <= 2; bits++)
        for (int s = 0; s < N_SIZES; s++) test_lowbit(bits, SIZES[s]);
    if (pi2_pool_create(2, &pool) != PI2_OK) { printf("cannot start a thread pool\n"); return 1; }
    static const int packed[] = {PI2_T_Q4_0, PI2_T_Q4_1, PI2_T_Q5_0, PI2_T_Q5_1, PI2_T_Q8_0};
    for (size_t i = 0; i < sizeof packed / sizeof packed[0]; i++)
        for (int s = 0; s < N_SIZES && SIZES[s] <= 256; s++) test_packed(packed[i], pool, SIZES[s], SIZES[s] < 32 ? 8 : 24);
    static const int packed_k[] = {PI2_T_Q4_K, PI2_T_Q5_K, PI2_T_Q6_K};   /* 256-value blocks: fewer of them */
    for (size_t i = 0; i < sizeof packed_k / sizeof packed_k[0]; i++)
        for (int nb = 1; nb <= 7; nb += 3) test_packed(packed_k[i], pool, nb, nb < 4 ? 8 : 24);
    pi2_pool_free(pool);
    for (int nb = 1; nb <= 9; nb += 4) {   /* every token and row its own: a swapped lane, row or token fails */
        test_tiles_distinct(PI2_T_Q5_0, 8 * nb - 1);
        test_tiles_distinct(PI2_T_Q5_K, nb);
        test_tiles_distinct(PI2_T_Q6_K, nb);
    }
    for (int s = 0; s < N_SIZES; s++) {
        test_axpy_qx1p(PI2_T_Q4_1, SIZES[s]);
        test_axpy_qx1p(PI2_T_Q5_1, SIZES[s]);
    }
    printf("%d passed, %d failed\n", n_pass, n_fail);
    return n_fail != 0;
}

/* A low-bit row of `size` blocks (random scales and codes; the last block with every code at its largest and
 * x at ±127, the extreme integer sums) times Q8_0 x: every table equals the reference bit for bit, and the
 * reference equals Σ d·(2c − L)·d_x·q in double within NMSE 1e-10. */
static void test_lowbit(int bits, int size) {
    const int64_t n = (int64_t)size * 32;
    const int32_t L = (1 << bits) - 1, per = 2 + 4 * bits;
    const size_t rb = pi2_lowbit_row_bytes(bits, n);
    uint8_t *w = malloc(rb), *xq = malloc((size_t)size * sizeof(blk_q8_0));
    float *x = rand_floats(n, 2.0f);
    for (int64_t b = 0; b < size; b++) {
        const pi2_fp16 d = pi2_f32_to_fp16(0.01f + 0.1f * (next_f() + 1.0f));
        memcpy(w + b * per, &d, 2);
        for (int k = 0; k < per - 2; k++) w[b * per + 2 + k] = b == size - 1 ? 0xFF : (uint8_t)next_u32();
    }
    for (int64_t j = n - 32; j < n; j++) x[j] = j % 2 ? 1.0f : -1.0f;
    pi2_traits(PI2_T_Q8_0, PI2_K_IMPL_REF)->quantize_act(x, xq, n);
    float want, got;
    pi2_lowbit_dot(bits, PI2_K_IMPL_REF)(n, &want, w, xq);
    const char *name = bits == 1 ? "LOWBIT1" : "LOWBIT2";
    const int impls[] = {PI2_K_IMPL_BASE, PI2_K_IMPL_AUTO};
    for (int i = 0; i < 2; i++) {
        pi2_lowbit_dot(bits, impls[i])(n, &got, w, xq);
        check(pi2_f32_to_bits(got) == pi2_f32_to_bits(want), "lowbit-vs-ref", name, i ? "auto" : "base", size, got - want);
    }
    double exact = 0.0;
    const blk_q8_0 *xb = (const blk_q8_0 *)xq;
    for (int64_t b = 0; b < size; b++) {
        pi2_fp16 d;
        memcpy(&d, w + b * per, 2);
        for (int j = 0; j < 32; j++) {
            const int c = (w[b * per + 2 + j * bits / 8] >> (j * bits % 8)) & L;
            exact += (double)pi2_fp16_to_f32(d) * (2 * c - L) * pi2_fp16_to_f32(xb[b].d) * xb[b].qs[j];
        }
    }
    const double err = (want - exact) * (want - exact) / (exact * exact + 1e-30);
    check(err <= 1e-10, "lowbit-vs-double", name, "ref", size, err);
    free(w);
    free(xq);
    free(x);
}

/* The x8 layout (kernels/pack.h) of n_out rows of n_blocks blocks: unpack(pack(w)) == w byte for byte; every
 * table's packed kernel equals that table's vec_dot on the plain rows bit for bit; pi2_matmul on the packed
 * copy (one token: the packed kernel; batches: groups unpacked, or the K-quants' packed batch kernels in the
 * batch orders) equals pi2_matmul on the plain rows. */
static void test_packed(int type, pi2_pool *pool, int n_blocks, int n_out) {
    const pi2_type_traits *ref = pi2_traits(type, PI2_K_IMPL_REF);
    const int64_t n = (int64_t)n_blocks * ref->block_size;
    const size_t rb = (size_t)n_blocks * ref->type_size, xrow = act_bytes(ref, n);
    enum { MAX_TOK = 259 };   /* past PACK_TOK (256): a group unpacked twice */
    uint8_t *w = malloc(rb * n_out), *pk = malloc(rb * n_out), *back = malloc(rb * n_out), *xq = malloc(xrow * MAX_TOK);
    float *x = malloc(sizeof(float) * n * MAX_TOK), *a = malloc(sizeof(float) * n_out * MAX_TOK);
    float *b = malloc(sizeof(float) * n_out * MAX_TOK);
    fill_weights(type, w, (int64_t)n_blocks * n_out, ref->type_size);
    for (int64_t i = 0; i < n * MAX_TOK; i++) x[i] = next_f();
    for (int t = 0; t < MAX_TOK; t++) ref->quantize_act(x + t * n, xq + t * xrow, n);
    pi2_pack_rows(type, w, n_out, n_blocks, pk);
    for (int g = 0; g < n_out / PI2_PACK_ROWS; g++) pi2_unpack_group(type, pk + g * PI2_PACK_ROWS * rb, n_blocks, back + g * PI2_PACK_ROWS * rb, rb);
    check(!memcmp(w, back, rb * n_out), "pack-unpack", ref->name, "-", n_blocks, 0);
    for (int impl = PI2_K_IMPL_AUTO; impl <= PI2_K_IMPL_BASE; impl += 2) {
        const pi2_type_traits *t = pi2_traits(type, impl);
        if (!t->vec_dot_pack) continue;
        for (int g = 0; g < n_out / PI2_PACK_ROWS; g++) {
            t->vec_dot_pack(n, a + g * PI2_PACK_ROWS, pk + g * PI2_PACK_ROWS * rb, xq);
            for (int r = 0; r < PI2_PACK_ROWS; r++) t->vec_dot(n, &b[g * PI2_PACK_ROWS + r], w + (g * PI2_PACK_ROWS + r) * rb, xq);
        }
        check(same_bits(a, b, n_out), "packed-vs-vec-dot", ref->name, t->vec_dot_impl, n_blocks, nmse(a, b, n_out));
        static const int toks[] = {1, 7, 9, MAX_TOK};   /* Q4_K: GEMM groups of 4 + GEMV; Q6_K: tiled from 8 */
        for (int k = 0; k < 4; k++) {
            const pi2_weight plain = {w, type, n, n_out, rb, NULL}, packed = {w, type, n, n_out, rb, pk};
            const pi2_mm ma = {&packed, a}, mb = {&plain, b};
            uint8_t *scratch = malloc(pi2_matmul_scratch(&ma, 1, toks[k], impl));
            const pi2_matmul_env env = {pool, impl, scratch, NULL, NULL, 0};
            pi2_matmul(&env, x, toks[k], &ma, 1);
            pi2_matmul(&env, x, toks[k], &mb, 1);
            check(same_bits(a, b, (int64_t)n_out * toks[k]), "packed-matmul", ref->name, t->vec_dot_impl, toks[k],
                  nmse(a, b, (int64_t)n_out * toks[k]));
            free(scratch);
        }
    }
    free(w); free(pk); free(back); free(xq); free(x); free(a); free(b);
}

/* The multi-row x multi-token kernels on distinct rows and distinct tokens, in both fast tables, against their
 * one-output twins bit for bit: Q5_0's four-row kernels (dot4x4 on four tokens, dot8x4 on eight tokens of its own
 * activation rows) against vec_dot; the 16-row packed kernels (vec_dot_pack_batch16, 1 to pack_batch_tok tokens)
 * against vec_dot_batch on the plain rows. */
static void test_tiles_distinct(int type, int n_blocks) {
    enum { ROWS = 16, TOK = 33 };
    const pi2_type_traits *ref = pi2_traits(type, PI2_K_IMPL_REF);
    const int64_t n = (int64_t)n_blocks * ref->block_size;
    const size_t rb = (size_t)n_blocks * ref->type_size, xrow = act_bytes(ref, n);
    uint8_t *w = malloc(rb * ROWS), *pk = malloc(rb * ROWS), *xq = malloc(xrow * TOK);
    float *x = malloc(sizeof(float) * n), got[TOK * ROWS], want[TOK * ROWS];
    fill_weights(type, w, (int64_t)n_blocks * ROWS, ref->type_size);
    for (int t = 0; t < TOK; t++) {
        for (int64_t i = 0; i < n; i++) x[i] = next_f() * (float)(t + 1);
        ref->quantize_act(x, xq + t * xrow, n);
    }
    pi2_pack_rows(type, w, ROWS, n_blocks, pk);
    for (int impl = PI2_K_IMPL_AUTO; impl <= PI2_K_IMPL_BASE; impl += 2) {
        const pi2_type_traits *t = pi2_traits(type, impl);
        const pi2_vec_dot4x2_fn d44 = pi2_kernels_dot4x4(type, impl), d84 = pi2_kernels_dot8x4(type, impl);
        int32_t wb = 0;
        const pi2_act_prep_fn prep = pi2_kernels_dot8x4_prep(type, impl, &wb);
        for (int tok = 0; tok < TOK; tok++)
            for (int r = 0; r < 4; r++) t->vec_dot(n, &want[tok * 4 + r], w + r * rb, xq + tok * xrow);
        if (d44) {
            d44(n, got, 4, w, rb, xq, xrow);
            check(same_bits(got, want, 16), "dot4x4-distinct", ref->name, t->vec_dot_impl, n_blocks, nmse(got, want, 16));
        }
        if (d84) {
            const size_t wrow = prep ? (size_t)(n / 32) * (size_t)wb : xrow;
            uint8_t *xw = prep ? malloc(8 * wrow) : NULL;
            for (int tok = 0; prep && tok < 8; tok++) prep(xq + tok * xrow, xw + tok * wrow, n);
            d84(n, got, 4, w, rb, prep ? xw : xq, wrow);
            check(same_bits(got, want, 32), "dot8x4-distinct", ref->name, t->vec_dot_impl, n_blocks, nmse(got, want, 32));
            free(xw);
        }
        if (!t->vec_dot_pack_batch16) continue;
        const int max_tok = t->pack_batch_tok ? t->pack_batch_tok : 4;
        for (int nt = 1; nt <= max_tok && nt <= TOK; nt += nt < 8 ? 1 : 5) {
            for (int tok = 0; tok < nt; tok++)
                for (int r = 0; r < ROWS; r++) t->vec_dot_batch(n, &want[tok * ROWS + r], w + r * rb, xq + tok * xrow);
            t->vec_dot_pack_batch16(n, got, ROWS, pk, xq, xrow, nt);
            check(same_bits(got, want, (int64_t)nt * ROWS), "pack16-distinct", ref->name, t->vec_dot_impl, nt,
                  nmse(got, want, (int64_t)nt * ROWS));
        }
    }
    free(w); free(pk); free(xq); free(x);
}
