/* kernel_selftest.c — checks every kernel of the C core against the scalar reference (kernels/ref.c)
 * (its areas in selftest_dots.c, selftest_axpy.c, selftest_ops.c, selftest_packed.c; selftest.h shares the helpers)
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
 * Tolerances (NMSE = Σ(a−b)²/Σb²), stated per check in the area files and in tol_fast (selftest_dots.c):
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
#include "selftest.h"

const int SIZES[N_SIZES] = {1, 7, 31, 32, 33, 255, 256, 4096 + 32};

int n_pass, n_fail;
uint64_t rng = 0x9E3779B97F4A7C15ull;
uint64_t h_dots = 0xcbf29ce484222325ull, h_ops = 0xcbf29ce484222325ull;   /* cross-CPU hashes */

uint32_t next_u32(void) {  /* xorshift64* */
    rng ^= rng >> 12; rng ^= rng << 25; rng ^= rng >> 27;
    return (uint32_t)((rng * 0x2545F4914F6CDD1Dull) >> 32);
}
float next_f(void) { return (float)next_u32() / 4294967296.0f * 2.0f - 1.0f; }  /* [-1, 1) */

void check(int ok, const char *what, const char *type, const char *impl, int size, double err) {
    if (ok) { n_pass++; return; }
    n_fail++;
    printf("FAIL %s %s impl=%s size=%d err=%.3g\n", what, type, impl, size, err);
}

uint64_t fnv1a(uint64_t h, const void *p, size_t n) {
    for (size_t i = 0; i < n; i++) h = (h ^ ((const uint8_t *)p)[i]) * 0x100000001b3ull;
    return h;
}

double nmse(const float *a, const float *b, int64_t n) {
    double num = 0, den = 0;
    for (int64_t i = 0; i < n; i++) { num += ((double)a[i] - b[i]) * ((double)a[i] - b[i]); den += (double)b[i] * b[i]; }
    return den > 0 ? num / den : num;
}

double nmse_d(const float *a, const double *b, int64_t n) {
    double num = 0, den = 0;
    for (int64_t i = 0; i < n; i++) { num += (a[i] - b[i]) * (a[i] - b[i]); den += b[i] * b[i]; }
    return den > 0 ? num / den : num;
}

/* Random weight rows: random bytes, then sane fp16/f32 values in the scale (or value) fields. */
void fill_weights(int type, uint8_t *w, int64_t n_blocks, int32_t ts) {
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

float *rand_floats(int64_t n, float scale) {
    float *x = malloc(sizeof(float) * (n ? n : 1));
    for (int64_t i = 0; i < n; i++) x[i] = next_f() * scale;
    return x;
}

int64_t cols_for(const pi2_type_traits *ref, int size) {
    if (ref->block_size == 1) return size;
    return (int64_t)(ref->block_size == QK_K && size > K_MAX_BLOCKS ? K_MAX_BLOCKS : size) * ref->block_size;
}

size_t act_bytes(const pi2_type_traits *ref, int64_t n) {
    const pi2_type_traits *a = pi2_traits(ref->vec_dot_type, PI2_K_IMPL_REF);
    return (size_t)(n / a->block_size) * (size_t)a->type_size;
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
