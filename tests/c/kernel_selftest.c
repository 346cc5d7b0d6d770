/* kernel_selftest.c — checks every fast vec_dot against the scalar reference on generated data,
 * without Python: built natively and cross-compiled for aarch64 (scripts/test_aarch64.sh).
 * Does: for each weight type and each table (base SIMD, auto), rows of 1, 3, 7 and 33 blocks;
 *       the reference against dequantized weights · dequantized activations in double; a hash
 *       of dequantized and quantized bytes that must be the same on every CPU (the golden comes
 *       from x86-64, where tests/test_kernels.py checks the bytes against numpy); the argument
 *       checks of the public API; batch orders and four-token kernels bit for bit (test_orders). Prints "N passed, M failed"; exit status 1 on failure.
 * Does not: compare with numpy (tests/test_kernels.py does) or time anything. */
#include "../../csrc/pi2.h"
#include "../../csrc/kernels/traits.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>

static int n_pass, n_fail;
static uint64_t rng = 0x9E3779B97F4A7C15ull;

static uint32_t next_u32(void) {  /* xorshift64* */
    rng ^= rng >> 12; rng ^= rng << 25; rng ^= rng >> 27;
    return (uint32_t)((rng * 0x2545F4914F6CDD1Dull) >> 32);
}
static float next_f(void) { return (float)next_u32() / 4294967296.0f * 2.0f - 1.0f; }  /* [-1, 1) */

static void check(int ok, const char *what, const char *type, const char *impl, int nb, double err) {
    if (ok) { n_pass++; return; }
    n_fail++;
    printf("FAIL %s %s impl=%s blocks=%d err=%.3g\n", what, type, impl, nb, err);
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

static double nmse(const float *a, const float *b, int n) {
    double num = 0, den = 0;
    for (int i = 0; i < n; i++) { num += ((double)a[i] - b[i]) * ((double)a[i] - b[i]); den += (double)b[i] * b[i]; }
    return den > 0 ? num / den : num;
}

/* The batch orders and four-token kernels against their one-token twins, bit for bit: four rows of
 * activations (the same quantized row at four places) through vec_dot4 / vec_dot4x2 / vec_dot_batch4, the batch
 * dot of a fast table against the reference's. On x86-64 the fast single-token and batch kernels of
 * Q4_K and Q6_K compute in the reference's float order, so those must match bit for bit too. */
static void test_orders(const pi2_type_traits *t, const pi2_type_traits *ref, const uint8_t *w, size_t row_bytes,
                        const uint8_t *xq, int64_t n, int nb, pi2_vec_dot4x2_fn d42) {
    const size_t xrow = (size_t)(n / pi2_traits(ref->vec_dot_type, 1)->block_size) * pi2_traits(ref->vec_dot_type, 1)->type_size;
    uint8_t *x4 = malloc(4 * xrow);
    for (int k = 0; k < 4; k++) memcpy(x4 + k * xrow, xq, xrow);
    for (int r = 0; r < 4; r++) {
        const uint8_t *row = w + r * row_bytes;
        float one, four[8], want;
        if (t->vec_dot4) {
            t->vec_dot(n, &one, row, xq);
            t->vec_dot4(n, four, 2, row, x4, xrow);
            check(!memcmp(&four[0], &one, 4) && !memcmp(&four[6], &one, 4), "dot4-vs-dot", ref->name, t->vec_dot_impl, nb, 0);
        }
        if (d42 && r + 1 < 4) {   /* rows r, r+1 x four tokens: out[2t + k] */
            float two[2];
            t->vec_dot(n, &two[0], row, xq);
            t->vec_dot(n, &two[1], row + row_bytes, xq);
            d42(n, four, 2, row, row_bytes, x4, xrow);
            int same = 1;
            for (int k = 0; k < 8; k++) same &= !memcmp(&four[k], &two[k % 2], 4);
            check(same, "dot4x2-vs-dot", ref->name, t->vec_dot_impl, nb, 0);
        }
        if (!ref->vec_dot_batch) continue;
        ref->vec_dot_batch(n, &want, row, xq);
        if (t->vec_dot_batch) {
            t->vec_dot_batch(n, &one, row, xq);
            check(!memcmp(&one, &want, 4), "batch-vs-ref", ref->name, t->vec_dot_impl, nb, 0);
        }
        if (t->vec_dot_batch4) {
            t->vec_dot_batch4(n, four, 2, row, x4, xrow);
            check(!memcmp(&four[0], &want, 4) && !memcmp(&four[6], &want, 4), "batch4-vs-ref", ref->name, t->vec_dot_impl, nb, 0);
        }
#if defined(__x86_64__)
        if (t->vec_dot != ref->vec_dot) {
            t->vec_dot(n, &one, row, xq);
            ref->vec_dot(n, &want, row, xq);
            check(!memcmp(&one, &want, 4), "x86-order", ref->name, t->vec_dot_impl, nb, 0);
        }
#endif
    }
    free(x4);
}

static void test_type(int type) {
    enum { ROWS = 4 };
    static const int blocks[] = {1, 3, 7, 33};
    const pi2_type_traits *ref = pi2_traits(type, PI2_K_IMPL_REF);
    const pi2_type_traits *act = pi2_traits(ref->vec_dot_type, PI2_K_IMPL_REF);
    for (size_t bi = 0; bi < sizeof blocks / sizeof blocks[0]; bi++) {
        /* F32/F16/BF16 "blocks" are single values: use the same awkward counts of 32-value runs */
        const int nb = blocks[bi];
        const int64_t n = (int64_t)nb * (ref->block_size == 1 ? 33 : ref->block_size);
        const size_t row_bytes = (size_t)(n / ref->block_size) * ref->type_size;
        uint8_t *w = malloc(row_bytes * ROWS);
        float *x = malloc(n * sizeof(float)), *wf = malloc(n * sizeof(float)), *xf = malloc(n * sizeof(float));
        uint8_t *xq = malloc((size_t)(n / act->block_size) * act->type_size);
        fill_weights(type, w, (n / ref->block_size) * ROWS, ref->type_size);
        for (int64_t i = 0; i < n; i++) x[i] = next_f();
        ref->quantize_act(x, xq, n);
        act->to_float(xq, xf, n);
        float out_ref[ROWS], out_dq[ROWS], out_fast[ROWS];
        for (int r = 0; r < ROWS; r++) {
            ref->vec_dot(n, &out_ref[r], w + r * row_bytes, xq);
            ref->to_float(w + r * row_bytes, wf, n);
            double acc = 0;
            for (int64_t i = 0; i < n; i++) acc += (double)wf[i] * xf[i];
            out_dq[r] = (float)acc;
        }
        /* Q8_1 stores s = d·Σq rounded to fp16, so the min term of Q4_1/Q5_1 is off by ~1e-3 relative */
        const double tol_dq = ref->vec_dot_type == PI2_T_Q8_1 ? 1e-5 : 1e-10;
        double e = nmse(out_ref, out_dq, ROWS);
        check(e <= tol_dq, "ref-vs-dequant", ref->name, "ref", nb, e);
        for (int impl = PI2_K_IMPL_AUTO; impl <= PI2_K_IMPL_BASE; impl += 2) {
            const pi2_type_traits *t = pi2_traits(type, impl);
            test_orders(t, ref, w, row_bytes, xq, n, nb, pi2_kernels_dot4x2(type, impl));
            if (t->vec_dot == ref->vec_dot) continue;
            for (int r = 0; r < ROWS; r++) t->vec_dot(n, &out_fast[r], w + r * row_bytes, xq);
            e = nmse(out_fast, out_ref, ROWS);
            check(e <= 1e-10, "fast-vs-ref", ref->name, t->vec_dot_impl, nb, e);
        }
        free(w); free(x); free(wf); free(xf); free(xq);
    }
}

static uint64_t fnv1a(uint64_t h, const void *p, size_t n) {
    for (size_t i = 0; i < n; i++) h = (h ^ ((const uint8_t *)p)[i]) * 0x100000001b3ull;
    return h;
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
}

int main(void) {
    static const int types[] = {PI2_T_F32, PI2_T_F16, PI2_T_BF16, PI2_T_Q4_0, PI2_T_Q4_1, PI2_T_Q5_0,
                                PI2_T_Q5_1, PI2_T_Q8_0, PI2_T_Q4_K, PI2_T_Q5_K, PI2_T_Q6_K};
    const uint32_t isa = pi2_kernels_isa();
    printf("kernel ISA:%s%s%s%s%s\n", isa & PI2_K_AVX2 ? " avx2" : "", isa & PI2_K_AVX512VNNI ? " avx512vnni" : "",
           isa & PI2_K_NEON ? " neon" : "", isa & PI2_K_DOTPROD ? " dotprod" : "", isa ? "" : " (reference only)");
    for (size_t i = 0; i < sizeof types / sizeof types[0]; i++) test_type(types[i]);
    test_portable_bytes(0xbbe1e1d40fa12f83ull);  /* from x86-64 */
    test_api();
    printf("%d passed, %d failed\n", n_pass, n_fail);
    return n_fail != 0;
}
