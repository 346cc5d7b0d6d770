/* selftest_packed.c — the C self-test's packed and low-bit rows: the low-bit predictor rows (kernels/lowbit.c) in
 * every table against the reference and double math; the x8 layout (kernels/pack.h) round trip, its packed kernels
 * and pi2_matmul on it; the multi-row x multi-token tiles on distinct rows and tokens.
 * Does not: test the plain-row kernels (selftest_dots.c). */
#include "selftest.h"

/* A low-bit row of `size` blocks (random scales and codes; the last block with every code at its largest and
 * x at ±127, the extreme integer sums) times Q8_0 x: every table equals the reference bit for bit, and the
 * reference equals Σ d·(2c − L)·d_x·q in double within NMSE 1e-10. */
void test_lowbit(int bits, int size) {
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
void test_packed(int type, pi2_pool *pool, int n_blocks, int n_out) {
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
void test_tiles_distinct(int type, int n_blocks) {
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
