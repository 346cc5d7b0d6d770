/* selftest_axpy.c — the C self-test's grouped row sums: axpy_group of every table against its term-by-term
 * definition, Q4_1 / Q5_1's 8-bit-activation scheme (axpy_qx1.c) and its per-group layout (axpy_qx1_pack.c), and I8's
 * integer scheme (axpy_i8.c), each against a direct model, bit for bit.
 * Does not: test the dot products (selftest_dots.c). */
#include "selftest.h"

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
void test_axpy(int type, int size) {
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
void test_axpy_qx1p(int type, int size) {
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
void test_axpy_i8(int size) {
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
