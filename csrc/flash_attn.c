/* flash_attn.c — attention with flash attention on (pi2_attn.flash): the C twin of pi2/reference/flash_attn.py,
 * bit for bit, which is llama.cpp 0c1e570's ggml_compute_forward_flash_attn_ext_f16 on x86.
 * Fewer than 64 tokens, or a quantized K or V: one row at a time, K·q by the keys' vec_dot (F16: ggml_vec_dot_f16
 * on q rounded to F16), an online softmax in cache order with libm expf, the accumulator F16 for an F16 V (every
 * step rounded) and F32 for a quantized V (rows converted to float). 64 tokens or more with F16 K and V: tiles of 64
 * cells, K·q an FMA chain on the F32 query, the tile's maximum rescaling the F32 accumulator, weights by
 * ggml_v_expf summed in groups of 16 into a double, then an FMA chain over the tile.
 * Every (token, head) row is one task whose numbers depend on nothing else: any thread count gives the same result.
 * The F16 cache holds halves (ops.h), converted exactly where they are read.
 * Does not: store the cache (forward.c, kv_quant.c) or attention with flash attention off (attn.c). */
#include "ops.h"

#include "kv_quant.h"
#include "ops_lanes.h"

#include <math.h>
#include <string.h>

#define FA_TILE_Q 64    /* GGML_FA_TILE_Q: batches of this many tokens or more take the tiled loop */
#define FA_TILE_KV 64   /* GGML_FA_TILE_KV */

static inline float r16(float x) { return pi2_fp16_to_f32(pi2_f32_to_fp16(x)); }

/* p[t] = the FMA chain over d of kT[d·ld + t]·q[d] for t in [t0, t1) (simd_gemm's order), times scale. */
WIDE_CLONES static void score_tile(float *p, const pi2_fp16 *kT, int32_t ld, const float *q, int32_t hd, int32_t t0,
                                   int32_t t1, float scale) {
    for (int32_t t = t0; t < t1; t++) p[t] = 0.0f;
    for (int32_t d = 0; d < hd; d++) {
        const pi2_fp16 *kr = kT + (size_t)d * ld;
        const float qd = q[d];
        for (int32_t t = t0; t < t1; t++) p[t] = fma32(pi2_kv_h2f(kr[t]), qd, p[t]);
    }
    for (int32_t t = t0; t < t1; t++) p[t] *= scale;
}

/* acc[d] = fma(v[d], w, acc[d]) */
WIDE_CLONES static void mad_f32(float *acc, const float *v, float w, int32_t n) {
    for (int32_t d = 0; d < n; d++) acc[d] = fma32(v[d], w, acc[d]);
}

/* The same over F16 values (halves). */
WIDE_CLONES static void mad_f16(float *acc, const pi2_fp16 *v, float w, int32_t n) {
    for (int32_t d = 0; d < n; d++) acc[d] = fma32(pi2_kv_h2f(v[d]), w, acc[d]);
}

int pi2_flash_tiled(const pi2_attn *a) { return a->n_tok >= FA_TILE_Q && !a->kq && !a->vq; }

/* The one-row loop over keys j0..j1-1 with scores s (scaled): out[hdv]. acc: scratch of 2·hdv floats. */
static void one_row(const pi2_attn *a, int32_t hkv, const float *s, int32_t j0, int32_t j1, float *out, float *acc) {
    const int32_t hdv = a->head_dim_v;
    const size_t vd = (size_t)a->n_head_kv * hdv;
    float *vrow = acc + hdv, M = -INFINITY, S = 0.0f;
    const int f16 = a->vq == NULL;
    const size_t head_bytes = f16 ? 0 : (size_t)hdv / (size_t)a->vt->block_size * (size_t)a->vt->type_size;
    memset(acc, 0, (size_t)hdv * sizeof *acc);
    for (int32_t j = j0; j < j1; j++) {
        const float sj = s[j];
        float ms = 1.0f, vs = 1.0f;
        if (sj > M) {
            ms = expf(M - sj);
            M = sj;
            if (f16)
                for (int32_t d = 0; d < hdv; d++) acc[d] = r16(acc[d] * ms);
            else
                for (int32_t d = 0; d < hdv; d++) acc[d] *= ms;
        } else {
            vs = expf(sj - M);
        }
        if (f16) {
            const pi2_fp16 *v = a->v + (size_t)j * vd + (size_t)hkv * hdv;
            for (int32_t d = 0; d < hdv; d++) acc[d] = r16(fma32(pi2_kv_h2f(v[d]), vs, acc[d]));
        } else {
            a->vt->to_float(a->vq + (size_t)j * a->v_cell_bytes + (size_t)hkv * head_bytes, vrow, hdv);
            mad_f32(acc, vrow, vs, hdv);
        }
        S = fma32(S, ms, vs);
    }
    const float inv = S == 0.0f ? 0.0f : 1.0f / S;
    for (int32_t d = 0; d < hdv; d++) out[d] = acc[d] * inv;
}

/* The tiled loop for query q (F32) over keys j0..j1-1 (cache cells, tiles aligned to cell 0): out[hdv].
 * acc: scratch of hdv + FA_TILE_KV floats. */
static void tiled_row(const pi2_attn *a, int32_t hkv, const float *q, int32_t j0, int32_t j1, float *out,
                      float *acc) {
    const int32_t hd = a->head_dim, hdv = a->head_dim_v;
    const size_t vd = (size_t)a->n_head_kv * hdv;
    const pi2_fp16 *kT = a->k + (size_t)hkv * hd * a->k_ld, *v = a->v + (size_t)hkv * hdv;
    float *p = acc + hdv, M = -INFINITY, S = 0.0f;
    memset(acc, 0, (size_t)hdv * sizeof *acc);
    for (int32_t ic = j0 / FA_TILE_KV * FA_TILE_KV; ic < j1; ic += FA_TILE_KV) {
        const int32_t lo = ic > j0 ? ic : j0, hi = ic + FA_TILE_KV < j1 ? ic + FA_TILE_KV : j1;
        float tmax = -INFINITY;
        score_tile(p, kT + ic, a->k_ld, q, hd, lo - ic, hi - ic, a->scale);
        for (int32_t t = 0; t < FA_TILE_KV; t++) {
            const int32_t j = ic + t;
            if (j < lo || j >= hi) p[t] = -INFINITY;
            else tmax = p[t] > tmax ? p[t] : tmax;
        }
        if (tmax == -INFINITY) continue;
        if (tmax > M) {
            const float ms = expf(M - tmax);
            for (int32_t d = 0; d < hdv; d++) acc[d] *= ms;
            S *= ms;
            M = tmax;
        }
        pi2_exp_shifted(p, FA_TILE_KV, M);
        double sum = 0.0;
        for (int g = 0; g < FA_TILE_KV; g += 16) sum += (double)reduce16(p + g);
        S = (float)((double)S + sum);
        for (int32_t j = lo; j < hi; j++) mad_f16(acc, v + (size_t)j * vd, p[j - ic], hdv);
    }
    const float inv = S == 0.0f ? 0.0f : 1.0f / S;
    for (int32_t d = 0; d < hdv; d++) out[d] = acc[d] * inv;
}

static void flash_task(void *arg, int32_t task, int32_t thread) {
    const pi2_attn *a = arg;
    const int32_t t = task / a->n_head, h = task % a->n_head, hkv = h / (a->n_head / a->n_head_kv);
    const int32_t pos = a->pos0 + t, hd = a->head_dim, hdv = a->head_dim_v;
    const int32_t j0 = a->window && pos - a->window + 1 > 0 ? pos - a->window + 1 : 0;
    float *s = a->scores + (size_t)thread * a->n_ctx, *qf = a->qf + (size_t)thread * hd;
    float *acc = a->acc + (size_t)thread * pi2_attn_acc_floats(hd, hdv);
    const float *q = a->q + ((size_t)t * a->n_head + h) * hd;
    float *out = a->out + ((size_t)t * a->n_head + h) * hdv;
    if (pi2_flash_tiled(a)) {
        tiled_row(a, hkv, q, j0, pos + 1, out, acc);
        return;
    }
    if (a->kq)
        pi2_kv_scores(a->kt, a->kq, a->k_cell_bytes, hkv, hd, q, a->scale, s, j0, pos + 1, qf);
    else {
        for (int32_t d = 0; d < hd; d++) qf[d] = r16(q[d]);
        pi2_attn_scores_vec(a, qf, a->k + (size_t)hkv * hd * a->k_ld, s, j0, pos + 1, acc);
    }
    one_row(a, hkv, s, j0, pos + 1, out, acc);
}

void pi2_flash_attention(pi2_pool *pool, pi2_attn *a) { pi2_pool_run(pool, flash_task, a, a->n_tok * a->n_head); }
