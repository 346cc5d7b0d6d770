/* attn_batch.c — a prompt batch's causal attention over the F16 cache (halves, flash attention off) on
 * AVX-512 (F, BW, VL; vcvtph2ps converts 16 halves exactly; AVX2 with F16C: attn_batch_avx2.c): the (token, head) queries that share a KV head, several tokens at a time, are scored and weighed
 * together, so each key or value vector loaded serves up to PI2_ATTN_ROWS queries; threads take (KV head,
 * head chunk, token block) tasks, the latest tokens (the most keys) first.
 * Numbers: those of attn.c's one-query path (tinyBLAS's order, pi2/reference/forward.py's attention): q.k term i goes
 * to lane i % 16 and p.V term j to lane j % 16 (absolute position), each lane summed in term order from zero, the
 * 16 lanes reduced as _mm512_reduce_add_ps (l8[i] = l[i] + l[8+i], l4[i] = l8[i] + l8[4+i], (l4[0] + l4[2]) +
 * (l4[1] + l4[3])). Here lanes l and l + 8 of every query run in registers at a time, and the tree's pending sums
 * wait in memory: lane pairs in the order 0, 4, 2, 6, 1, 5, 3, 7 meet their partners as a binary counter carries.
 * Products of F16 values are exact in float, so the FMA rounds as the product then the sum; a query's weights
 * outside its visible keys are +0 (adding +0 to a lane sum that starts at +0 changes nothing).
 * Does not: quantized K or V, flash attention, one-token steps, head sizes not a multiple of 16 (attn.c does). */
#include "ops.h"

#include <string.h>

#if defined(__x86_64__) && defined(__GNUC__)
#include <immintrin.h>

#define T512 __attribute__((target("avx512f,avx512bw,avx512vl")))
#define INLINE512 __attribute__((target("avx512f,avx512bw,avx512vl"), always_inline)) static inline

typedef struct {
    const pi2_attn *a;
    int32_t g, hpc, n_hc, tpb, n_tb;   /* heads per KV head, per chunk, chunks; tokens per block, blocks */
    int32_t wide;                      /* 1: the AVX-512 kernels below, 0: attn_batch_avx2.c's */
} batch_job;

/* The lane pair handled n-th (0..7): lanes PAIR[n] and PAIR[n] + 8. */
static const int PAIR[8] = {0, 4, 2, 6, 1, 5, 3, 7};

/* v = lanes PAIR[n] + PAIR[n] + 8 of every query; folds it into the pending sums stk [3][M]; 1 when v is final. */
#define FOLD(M, n, v, stk, done)                                                        \
    do {                                                                                \
        done = 0;                                                                       \
        if (!((n) & 1)) { for (int m = 0; m < M; m++) stk[0][m] = v[m]; break; }        \
        for (int m = 0; m < M; m++) v[m] = _mm512_add_ps(v[m], stk[0][m]);              \
        if (!((n) & 2)) { for (int m = 0; m < M; m++) stk[1][m] = v[m]; break; }        \
        for (int m = 0; m < M; m++) v[m] = _mm512_add_ps(v[m], stk[1][m]);              \
        if (!((n) & 4)) { for (int m = 0; m < M; m++) stk[2][m] = v[m]; break; }        \
        for (int m = 0; m < M; m++) v[m] = _mm512_add_ps(v[m], stk[2][m]);              \
        done = 1;                                                                       \
    } while (0)

/* s[m][jb..jb+16) (masked by mk) = scale · (qf[m] . key j) for M queries qf [M][hd] (F16 values) and the 16 keys
 * jb.. of kT (row i of the head's transposed keys at kT + i·ld); s rows ls floats apart. */
INLINE512 void score16(const int M, const float *qf, int32_t hd, const pi2_fp16 *kT, size_t ld, __mmask16 mk, float *s,
                       size_t ls, float scale) {
    __m512 stk[3][PI2_ATTN_ROWS];
#pragma GCC unroll 8
    for (int n = 0; n < 8; n++) {
        const int l = PAIR[n];
        __m512 c0[PI2_ATTN_ROWS], c1[PI2_ATTN_ROWS];
        for (int m = 0; m < M; m++) c0[m] = c1[m] = _mm512_setzero_ps();
        for (int32_t i = l; i < hd; i += 16) {
            const __m512 k0 = _mm512_cvtph_ps(_mm256_maskz_loadu_epi16(mk, kT + (size_t)i * ld));
            const __m512 k1 = _mm512_cvtph_ps(_mm256_maskz_loadu_epi16(mk, kT + (size_t)(i + 8) * ld));
            for (int m = 0; m < M; m++) {
                c0[m] = _mm512_fmadd_ps(_mm512_set1_ps(qf[m * hd + i]), k0, c0[m]);
                c1[m] = _mm512_fmadd_ps(_mm512_set1_ps(qf[m * hd + i + 8]), k1, c1[m]);
            }
        }
        for (int m = 0; m < M; m++) c0[m] = _mm512_add_ps(c0[m], c1[m]);
        int done;
        FOLD(M, n, c0, stk, done);
        if (done)
            for (int m = 0; m < M; m++) _mm512_mask_storeu_ps(s + m * ls, mk, _mm512_mul_ps(c0[m], _mm512_set1_ps(scale)));
    }
}

/* out row m [0..16) = sum over j in [jlo, jhi) of p[m][j] · v[j][0..16) for M weight rows p (ls floats apart),
 * value rows vd floats apart; out row m at (m / nh) · lt + (m % nh) · lh (token m / nh, head m % nh). */
INLINE512 void weigh16(const int M, const float *p, size_t ls, const pi2_fp16 *v, size_t vd, int32_t jlo, int32_t jhi,
                       float *out, int32_t nh, size_t lt, size_t lh) {
    __m512 stk[3][PI2_ATTN_ROWS];
#pragma GCC unroll 8
    for (int n = 0; n < 8; n++) {
        const int l = PAIR[n];
        __m512 c0[PI2_ATTN_ROWS], c1[PI2_ATTN_ROWS];
        for (int m = 0; m < M; m++) c0[m] = c1[m] = _mm512_setzero_ps();
        for (int32_t jb = jlo & ~15; jb < jhi; jb += 16) {
            const int32_t j = jb + l, j8 = j + 8;
            if (j >= jlo && j < jhi) {
                const __m512 v0 = _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)(v + (size_t)j * vd)));
                for (int m = 0; m < M; m++) c0[m] = _mm512_fmadd_ps(_mm512_set1_ps(p[m * ls + j]), v0, c0[m]);
            }
            if (j8 >= jlo && j8 < jhi) {
                const __m512 v1 = _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)(v + (size_t)j8 * vd)));
                for (int m = 0; m < M; m++) c1[m] = _mm512_fmadd_ps(_mm512_set1_ps(p[m * ls + j8]), v1, c1[m]);
            }
        }
        for (int m = 0; m < M; m++) c0[m] = _mm512_add_ps(c0[m], c1[m]);
        int done;
        FOLD(M, n, c0, stk, done);
        if (done)
            for (int m = 0; m < M; m++) _mm512_storeu_ps(out + (size_t)(m / nh) * lt + (size_t)(m % nh) * lh, c0[m]);
    }
}

/* The M-query kernels over a task's key range, one instantiation per M. */
#define KERNELS(M)                                                                                              \
    static T512 void scores_##M(const float *qf, int32_t hd, const pi2_fp16 *kT, size_t ld, int32_t jlo, int32_t jhi, \
                                float *s, size_t ls, float scale) {                                            \
        for (int32_t jb = jlo; jb < jhi; jb += 16) {                                                           \
            const __mmask16 mk = (__mmask16)(jhi - jb >= 16 ? 0xFFFF : (1u << (jhi - jb)) - 1);                \
            score16(M, qf, hd, kT + jb, ld, mk, s + jb, ls, scale);                                            \
        }                                                                                                      \
    }                                                                                                          \
    static T512 void weigh_##M(const float *p, size_t ls, const pi2_fp16 *v, size_t vd, int32_t hdv, int32_t jlo, \
                               int32_t jhi, float *out, int32_t nh, size_t lt) {                               \
        for (int32_t d0 = 0; d0 < hdv; d0 += 16)                                                               \
            weigh16(M, p, ls, v + d0, vd, jlo, jhi, out + d0, nh, lt, (size_t)hdv);                            \
    }
KERNELS(1) KERNELS(2) KERNELS(3) KERNELS(4) KERNELS(5) KERNELS(6) KERNELS(7)
KERNELS(8) KERNELS(9) KERNELS(10) KERNELS(11) KERNELS(12) KERNELS(13) KERNELS(14)

typedef void (*scores_fn)(const float *, int32_t, const pi2_fp16 *, size_t, int32_t, int32_t, float *, size_t, float);
typedef void (*weigh_fn)(const float *, size_t, const pi2_fp16 *, size_t, int32_t, int32_t, int32_t, float *, int32_t,
                         size_t);
static const scores_fn SCORES[PI2_ATTN_ROWS + 1] = {NULL, scores_1, scores_2, scores_3, scores_4, scores_5, scores_6,
    scores_7, scores_8, scores_9, scores_10, scores_11, scores_12, scores_13, scores_14};
static const weigh_fn WEIGH[PI2_ATTN_ROWS + 1] = {NULL, weigh_1, weigh_2, weigh_3, weigh_4, weigh_5, weigh_6, weigh_7,
    weigh_8, weigh_9, weigh_10, weigh_11, weigh_12, weigh_13, weigh_14};

/* Visible keys of position pos start here (a sliding window or 0). */
static int32_t first_key(const pi2_attn *a, int32_t pos) {
    return a->window && pos - a->window + 1 > 0 ? pos - a->window + 1 : 0;
}

/* One (KV head, head chunk, token block): its queries rounded to F16, scored against the keys the block sees,
 * softmax per query, weights times the values into a->out. */
static void batch_task(void *arg, int32_t task, int32_t thread) {
    const batch_job *b = arg;
    const pi2_attn *a = b->a;
    const int32_t per_block = a->n_head_kv * b->n_hc;
    const int32_t tb = b->n_tb - 1 - task / per_block, hkv = task % per_block / b->n_hc, hc = task % b->n_hc;
    const int32_t t0 = tb * b->tpb, nt = a->n_tok - t0 < b->tpb ? a->n_tok - t0 : b->tpb;
    const int32_t h0 = hkv * b->g + hc * b->hpc, nh = b->g - hc * b->hpc < b->hpc ? b->g - hc * b->hpc : b->hpc;
    const int32_t M = nt * nh, hd = a->head_dim, hdv = a->head_dim_v;
    const size_t ls = (size_t)a->n_ctx;
    float *s = a->scores + (size_t)thread * PI2_ATTN_ROWS * ls, *qf = a->qf + (size_t)thread * PI2_ATTN_ROWS * hd;
    for (int32_t m = 0; m < M; m++)
        pi2_f16_round_row(qf + (size_t)m * hd, a->q + ((size_t)(t0 + m / nh) * a->n_head + h0 + m % nh) * hd, hd);
    const int32_t jlo = first_key(a, a->pos0 + t0), jhi = a->pos0 + t0 + nt;
    const size_t ld = (size_t)a->k_ld;
    if (b->wide) SCORES[M](qf, hd, a->k + (size_t)hkv * hd * ld, ld, jlo, jhi, s, ls, a->scale);
    else pi2_attn_batch_scores_avx2(M, qf, hd, a->k + (size_t)hkv * hd * ld, ld, jlo, jhi, s, ls, a->scale);
    for (int32_t m = 0; m < M; m++) {
        float *row = s + (size_t)m * ls;
        const int32_t pos = a->pos0 + t0 + m / nh, j0 = first_key(a, pos);
        pi2_attn_softmax_row(row, j0, pos);
        memset(row + jlo, 0, (size_t)(j0 - jlo) * sizeof *row);
        memset(row + pos + 1, 0, (size_t)(jhi - pos - 1) * sizeof *row);
    }
    float *out = a->out + ((size_t)t0 * a->n_head + h0) * hdv;
    if (b->wide) WEIGH[M](s, ls, a->v + (size_t)hkv * hdv, (size_t)a->n_head_kv * hdv, hdv, jlo, jhi, out, nh,
                          (size_t)a->n_head * hdv);
    else pi2_attn_batch_weigh_avx2(M, s, ls, a->v + (size_t)hkv * hdv, (size_t)a->n_head_kv * hdv, hdv, jlo, jhi, out,
                                   nh, (size_t)a->n_head * hdv);
}

int pi2_attn_batch(pi2_pool *pool, const pi2_attn *a) {
    const int wide = pi2_cpu_avx512_half();
    if (a->flash || a->kq || a->n_tok < 2 || a->rows < PI2_ATTN_ROWS || a->head_dim % 16 || a->head_dim_v % 16 ||
        !(wide || (pi2_cpu_avx2_half() && a->head_dim <= 512)))
        return 0;
    batch_job b = {.a = a, .g = a->n_head / a->n_head_kv, .wide = wide};
    b.hpc = b.g < PI2_ATTN_ROWS ? b.g : PI2_ATTN_ROWS;
    b.n_hc = (b.g + b.hpc - 1) / b.hpc;
    b.tpb = PI2_ATTN_ROWS / b.hpc;
    b.n_tb = (a->n_tok + b.tpb - 1) / b.tpb;
    pi2_pool_run(pool, batch_task, &b, b.n_tb * a->n_head_kv * b.n_hc);
    return 1;
}

#else
int pi2_attn_batch(pi2_pool *pool, const pi2_attn *a) {
    (void)pool;
    (void)a;
    return 0;
}
#endif
