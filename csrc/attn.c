/* attn.c — causal multi-head attention over the F16 cache with flash attention off (ops.h's pi2_attention): one
 * (token, head) per task, softmax(scale · q.k) over the visible keys (ggml_order.softmax: v_expf, sums of 16 aligned
 * positions reduced in float and added into a double), weights rounded to F16, times V; the portable loops and
 * AVX-512 ones for batches, in ggml's float order (pi2/reference/forward.py's attention).
 * Does not: a prompt batch on AVX-512 or AVX2 (attn_batch.c), one token's loops on this CPU's half conversions
 * (attn_decode.c), flash attention (flash_attn.c), quantized keys (kv_quant.c). */
#include "ops.h"

#include "kv_quant.h"
#include "ops_lanes.h"

#include <math.h>
#include <string.h>

/* ggml's two F16 dot-product orders (ggml_order.dot_f16_vec, dot_f16_tinyblas): term i of a dot
 * product goes to lane i % 16 of accumulator (i % 64) / 16 (one token, ggml_vec_dot_f16) or of a
 * single accumulator (batches, tinyBLAS); accumulators add up in term order, then lanes are
 * combined ((0+2) + (1+3)) and reduced (reduce16). Terms are products of F16 values, exact in
 * float, so no FMA is involved. Here many dot products run side by side (keys for q.k, value
 * dimensions for p.V): each (accumulator, lane) is a row of `width` floats updated by an axpy. */
#define KEY_BLOCK 64   /* keys scored together */
#define ACC(vec, i) ((vec) ? ((i) & 63) >> 4 : 0)

/* out[k] = the dot products' results from acc [4][16][width] (only [0] when !vec). */
WIDE_CLONES static void lanes_reduce(float *out, float *acc, int64_t width, int vec) {
    float *a[4] = {acc, acc + 16 * width, acc + 32 * width, acc + 48 * width};
    if (vec)
        for (int l = 0; l < 16; l++)
            for (int64_t k = 0; k < width; k++)
                a[0][l * width + k] = (a[0][l * width + k] + a[2][l * width + k]) + (a[1][l * width + k] + a[3][l * width + k]);
    float *v = a[0];
    for (int i = 0; i < 8; i++)
        for (int64_t k = 0; k < width; k++) v[i * width + k] = v[(8 + i) * width + k] + v[i * width + k];
    for (int i = 0; i < 4; i++)
        for (int64_t k = 0; k < width; k++) v[i * width + k] = v[(4 + i) * width + k] + v[i * width + k];
    for (int64_t k = 0; k < width; k++) out[k] = (v[k] + v[2 * width + k]) + (v[width + k] + v[3 * width + k]);
}

/* w[i] = F16 rounding of w[i] * inv (the attention weights as ggml stores them) */
WIDE_CLONES static void scale_to_f16(float *w, int64_t n, float inv) {
    for (int64_t i = 0; i < n; i++) w[i] = f16_round(w[i] * inv);
}

int64_t pi2_attn_acc_floats(int32_t head_dim, int32_t head_dim_v) {
    (void)head_dim;
    return 64 * (int64_t)(KEY_BLOCK > head_dim_v ? KEY_BLOCK : head_dim_v);
}

/* s[j] = scale · (q . key j) for j in [j0, j1): q.k for a block of keys at a time. */
WIDE_CLONES static void score_keys(const pi2_attn *a, const float *q, const pi2_fp16 *kT, float *s, int32_t j0,
                                   int32_t j1, float *acc, int vec) {
    for (int32_t jb = j0; jb < j1; jb += KEY_BLOCK) {
        const int32_t nb = j1 - jb < KEY_BLOCK ? j1 - jb : KEY_BLOCK;
        memset(acc, 0, (size_t)(vec ? 64 : 16) * nb * sizeof *acc);
        for (int32_t i = 0; i < a->head_dim; i++) {
            float *row = acc + (size_t)(ACC(vec, i) * 16 + (i & 15)) * nb;
            const pi2_fp16 *kr = kT + (size_t)i * a->k_ld + jb;
            const float qi = q[i];
            for (int32_t k = 0; k < nb; k++) row[k] += qi * pi2_kv_h2f(kr[k]);
        }
        lanes_reduce(s + jb, acc, nb, vec);
        for (int32_t k = 0; k < nb; k++) s[jb + k] *= a->scale;
    }
}

/* out[d] = sum over j in [j0, j1) of p[j] · V[j][d]. */
WIDE_CLONES static void weigh_values(const pi2_attn *a, const float *p, const pi2_fp16 *v, float *out, int32_t j0,
                                     int32_t j1, float *acc, int vec) {
    const int32_t hdv = a->head_dim_v;
    const size_t vd = (size_t)a->n_head_kv * hdv;
    memset(acc, 0, (size_t)(vec ? 64 : 16) * hdv * sizeof *acc);
    for (int32_t j = j0; j < j1; j++) {
        float *row = acc + (size_t)(ACC(vec, j) * 16 + (j & 15)) * hdv;
        const pi2_fp16 *vr = v + (size_t)j * vd;
        const float pj = p[j];
        for (int32_t d = 0; d < hdv; d++) row[d] += pj * pi2_kv_h2f(vr[d]);
    }
    lanes_reduce(out, acc, hdv, vec);
}

#if defined(__x86_64__) && defined(__GNUC__)
#include <immintrin.h>
#define ATTN512 1
#define T512 __attribute__((target("avx512f,avx512bw,avx512vl")))

/* 16 halves at p (lanes outside m: +0) as floats. */
static inline T512 __m512 load_h16(__mmask16 m, const pi2_fp16 *p) {
    return _mm512_cvtph_ps(_mm256_maskz_loadu_epi16(m, p));
}

/* The sixteen lane sums l[0..15] of a batch dot product (one per vector lane: 16 keys or 16 value
 * dimensions) reduced as lanes_reduce does without vec: halves, halves, (0+2) + (1+3). */
static inline T512 __m512 reduce_lanes16(__m512 *l) {
    for (int i = 0; i < 8; i++) l[i] = _mm512_add_ps(l[8 + i], l[i]);
    for (int i = 0; i < 4; i++) l[i] = _mm512_add_ps(l[4 + i], l[i]);
    return _mm512_add_ps(_mm512_add_ps(l[0], l[2]), _mm512_add_ps(l[1], l[3]));
}

/* score_keys for a batch (tinyBLAS's order, one accumulator) with the 16 lane sums of 16 keys in
 * registers: term i goes to l[i % 16], added in term order; products of F16 values are exact in float,
 * so the FMA rounds like the separate product and sum. */
static T512 void score_keys_512(const pi2_attn *a, const float *q, const pi2_fp16 *kT, float *s, int32_t j0,
                                 int32_t j1) {
    const int32_t hd = a->head_dim;
    for (int32_t jb = j0; jb < j1; jb += 16) {
        const __mmask16 m = (__mmask16)(j1 - jb >= 16 ? 0xFFFF : (1u << (j1 - jb)) - 1);
        __m512 l[16];
        for (int k = 0; k < 16; k++) l[k] = _mm512_setzero_ps();
        for (int32_t i0 = 0; i0 < hd; i0 += 16) {
#pragma GCC unroll 16
            for (int k = 0; k < 16; k++)
                if (i0 + k < hd)
                    l[k] = _mm512_fmadd_ps(_mm512_set1_ps(q[i0 + k]),
                                           load_h16(m, kT + (size_t)(i0 + k) * a->k_ld + jb), l[k]);
        }
        _mm512_mask_storeu_ps(s + jb, m, _mm512_mul_ps(reduce_lanes16(l), _mm512_set1_ps(a->scale)));
    }
}

/* weigh_values for a batch: term j goes to l[j % 16] (absolute position, as ACC and the lane index
 * above), 16 value dimensions per pass. */
static T512 void weigh_values_512(const pi2_attn *a, const float *p, const pi2_fp16 *v, float *out, int32_t j0,
                                   int32_t j1) {
    const int32_t hdv = a->head_dim_v;
    const size_t vd = (size_t)a->n_head_kv * hdv;
    for (int32_t d0 = 0; d0 < hdv; d0 += 16) {
        const __mmask16 m = (__mmask16)(hdv - d0 >= 16 ? 0xFFFF : (1u << (hdv - d0)) - 1);
        __m512 l[16];
        for (int k = 0; k < 16; k++) l[k] = _mm512_setzero_ps();
        for (int32_t jb = j0 & ~15; jb < j1; jb += 16) {
#pragma GCC unroll 16
            for (int k = 0; k < 16; k++)
                if (jb + k >= j0 && jb + k < j1)
                    l[k] = _mm512_fmadd_ps(_mm512_set1_ps(p[jb + k]),
                                           load_h16(m, v + (size_t)(jb + k) * vd + d0), l[k]);
        }
        _mm512_mask_storeu_ps(out + d0, m, reduce_lanes16(l));
    }
}
#else
#define ATTN512 0
#endif

#if ATTN512
/* The largest of s[j0..pos] as the loop below finds it: lanes keep x when x > their max (NaN never), then the
 * lanes the same way; only the sign of a zero maximum can differ, which s - max and v_expf do not see. */
static T512 float row_max_512(const float *s, int32_t j0, int32_t pos) {
    const __m512 ninf = _mm512_set1_ps(-INFINITY);
    __m512 mx = ninf;
    for (int32_t j = j0; j <= pos; j += 16) {
        const __mmask16 m = (__mmask16)(pos + 1 - j >= 16 ? 0xFFFF : (1u << (pos + 1 - j)) - 1);
        const __m512 x = _mm512_mask_loadu_ps(ninf, m, s + j);
        mx = _mm512_mask_mov_ps(mx, _mm512_cmp_ps_mask(x, mx, _CMP_GT_OQ), x);
    }
    float l[16], max = -INFINITY;
    _mm512_storeu_ps(l, mx);
    for (int i = 0; i < 16; i++) max = l[i] > max ? l[i] : max;
    return max;
}

/* The sum below: each aligned block of 16 positions (zero outside j0..pos) reduced as reduce16, in double. */
static T512 double row_sum_512(const float *s, int32_t j0, int32_t pos) {
    double sum = 0.0;
    for (int32_t b = j0 & ~15; b <= pos; b += 16) {
        const uint32_t lo = b < j0 ? 0xFFFFu << (j0 - b) : 0xFFFFu, hi = pos + 1 - b >= 16 ? 0xFFFFu : (1u << (pos + 1 - b)) - 1;
        const __m512 x = _mm512_maskz_loadu_ps((__mmask16)(lo & hi), s + b);
        const __m256 r8 = _mm256_add_ps(_mm512_castps512_ps256(x), _mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(x), 1)));
        const __m128 r4 = _mm_add_ps(_mm256_castps256_ps128(r8), _mm256_extractf128_ps(r8, 1));
        const __m128 t = _mm_add_ps(r4, _mm_movehl_ps(r4, r4));    /* r4[0] + r4[2], r4[1] + r4[3] */
        sum += (double)_mm_cvtss_f32(_mm_add_ss(t, _mm_shuffle_ps(t, t, 1)));
    }
    return sum;
}
#endif

void pi2_attn_softmax_row(float *s, int32_t j0, int32_t pos) {
#if ATTN512
    const int wide = pi2_cpu_avx512_half();
#else
    const int wide = 0;
#endif
    float max = -INFINITY;
    if (!wide)
        for (int32_t j = j0; j <= pos; j++) max = s[j] > max ? s[j] : max;
#if ATTN512
    else max = row_max_512(s, j0, pos);
#endif
    pi2_exp_shifted(s + j0, pos + 1 - j0, max);
    double sum = 0.0;
    if (!wide)
        for (int32_t b = j0 & ~15; b <= pos; b += 16) {
            float lane[16] = {0};
            for (int32_t j = b > j0 ? b : j0; j < b + 16 && j <= pos; j++) lane[j & 15] = s[j];
            sum += (double)reduce16(lane);
        }
#if ATTN512
    else sum = row_sum_512(s, j0, pos);
#endif
    scale_to_f16(s + j0, pos + 1 - j0, (float)(1.0 / sum));
}

WIDE_CLONES static void round_f16(float *y, const float *x, int64_t n) {
    for (int64_t i = 0; i < n; i++) y[i] = f16_round(x[i]);
}

void pi2_f16_round_row(float *y, const float *x, int64_t n) { round_f16(y, x, n); }

/* One (token, head): softmax(scale · q.k) over the visible keys (ggml_order.softmax: v_expf, sums of
 * 16 aligned positions reduced in float and added into a double), weights rounded to F16, times V.
 * Keys and values come from the cache. */
static void attn_task(void *arg, int32_t task, int32_t thread) {
    const pi2_attn *a = arg;
    const int32_t t = task / a->n_head, h = task % a->n_head, hkv = h / (a->n_head / a->n_head_kv);
    const int32_t pos = a->pos0 + t, vec = a->n_tok == 1, hd = a->head_dim, hdv = a->head_dim_v;
    const int32_t j0 = a->window && pos - a->window + 1 > 0 ? pos - a->window + 1 : 0;
    float *s = a->scores + (size_t)thread * a->n_ctx, *qf = a->qf + (size_t)thread * hd;
    float *acc = a->acc + (size_t)thread * pi2_attn_acc_floats(hd, hdv);
    const float *q = a->q + ((size_t)t * a->n_head + h) * hd;
#if ATTN512
    const int wide = !vec && pi2_cpu_avx512_half();
#endif
    const pi2_fp16 *kT = a->k + (size_t)hkv * hd * a->k_ld, *v = a->v + (size_t)hkv * hdv;
    float *out = a->out + ((size_t)t * a->n_head + h) * hdv;
    if (a->kq)   /* quantized keys: the query quantized to their dot product's format (qf as scratch) */
        pi2_kv_scores(a->kt, a->kq, a->k_cell_bytes, hkv, hd, q, a->scale, s, j0, pos + 1, qf);
    else {
        for (int32_t d = 0; d < hd; d++) qf[d] = f16_round(q[d]);
#if ATTN512
        if (wide) score_keys_512(a, qf, kT, s, j0, pos + 1);
        else
#endif
        if (!vec || !pi2_attn_dec_scores(qf, kT, (size_t)a->k_ld, hd, a->scale, s, j0, pos + 1, acc))
            score_keys(a, qf, kT, s, j0, pos + 1, acc, vec);
    }
    pi2_attn_softmax_row(s, j0, pos);
#if ATTN512
    if (wide) weigh_values_512(a, s, v, out, j0, pos + 1);
    else
#endif
    if (!vec || !pi2_attn_dec_values(s, v, (size_t)a->n_head_kv * hdv, hdv, out, j0, pos + 1, acc))
        weigh_values(a, s, v, out, j0, pos + 1, acc, vec);
}

void pi2_attention(pi2_pool *pool, pi2_attn *a) {
    if (a->flash) pi2_flash_attention(pool, a);
    else if (!pi2_attn_batch(pool, a)) pi2_pool_run(pool, attn_task, a, a->n_tok * a->n_head);
}

void pi2_attn_scores_vec(const pi2_attn *a, const float *qf, const pi2_fp16 *kT, float *s, int32_t j0, int32_t j1,
                         float *acc) {
    if (!pi2_attn_dec_scores(qf, kT, (size_t)a->k_ld, a->head_dim, a->scale, s, j0, j1, acc))
        score_keys(a, qf, kT, s, j0, j1, acc, 1);
}
