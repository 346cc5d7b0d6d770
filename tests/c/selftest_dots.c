/* selftest_dots.c — the C self-test's dot products: every weight type's vec_dot in every table (ref, base SIMD, auto)
 * against the reference, dequantized math in double and x86_order_dot (a scalar emulation of the AVX2 kernels' float
 * order); the batch orders, the four-token / two-row / four-row kernels against their one-token twins; pi2_matmul over
 * a thread pool. Tolerances: kernel_selftest.c's opening comment.
 * Does not: test the grouped row sums (selftest_axpy.c) or the packed layouts (selftest_packed.c). */
#include "selftest.h"

/* fast vs ref NMSE per type: quant types sum exact integers per block in both, so only the float32
 * order of the per-block terms differs; F32/F16 fast kernels sum in float32 lanes, the ref in double. */
static double tol_fast(int type) { return type == PI2_T_F32 || type == PI2_T_F16 || type == PI2_T_BF16 ? 1e-11 : 1e-10; }

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

void test_type(int type, pi2_pool *pool) {
    for (int s = 0; s < N_SIZES; s++) {
        test_vec_dot(type, SIZES[s]);
        test_matmul(type, pool, SIZES[s], 9, SIZES[s]);          /* rows at every size; 9 tokens: batch groups + rest */
        if (SIZES[s] <= 33) test_matmul(type, pool, 7, SIZES[s], SIZES[s]);   /* tokens 1..33 */
        const uint64_t keep = rng;   /* the cross-CPU hashes fix the random stream of the tests above */
        test_matmul(type, pool, SIZES[s], 1, SIZES[s]);          /* rows at every size, one token: four-row kernels */
        rng = keep;
    }
}
