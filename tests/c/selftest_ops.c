/* selftest_ops.c — the C self-test's ops (ops.h) against double-precision math: RMSNorm, SiLU / GELU / ReLU, both
 * RoPEs, causal GQA attention with its softmax; their outputs go into the cross-CPU hash h_ops.
 * Does not: test the kernels (selftest_dots.c, selftest_axpy.c, selftest_packed.c). */
#include "selftest.h"

/* ---------------- ops (ops.h) against double-precision math ---------------- */

void test_norm_act(int n) {
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

void test_rope(int size) {
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
void test_attention(pi2_pool *pool, int size, int n_tok) {
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
