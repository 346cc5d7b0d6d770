/* attn_decode.c — one token's attention over the F16 cache (held as floats, flash attention off) on AVX-512: the
 * query heads that share a KV head are scored and weighed together, so each key or value vector loaded serves all
 * of them, with every lane sum in registers; threads take (KV head, head chunk) tasks.
 * Numbers: those of ops.c's one-query path for one token (ggml_vec_dot_f16, pi2/reference/forward.py's attention):
 * term i of q.k (and term j of p.V, j the absolute position) goes to lane i % 16 of accumulator (i % 64) / 16, each
 * (accumulator, lane) summed in term order from zero; per lane (a0 + a2) + (a1 + a3); the 16 lanes reduced as
 * _mm512_reduce_add_ps. As in attn_batch.c, lanes l and l + 8 are formed at a time and the pending sums of the
 * reduction tree wait in a stack: lane pairs in the order 0, 4, 2, 6, 1, 5, 3, 7 meet their partners as a binary
 * counter carries. Products of F16 values are exact in float, so the FMA rounds as the product then the sum.
 * Does not: quantized K or V, flash attention, prompt batches (attn_batch.c), head sizes not a multiple of 16. */
#include "ops.h"

#include "threadpool.h"

#if defined(__x86_64__) && defined(__GNUC__)
#include <immintrin.h>

#define T512 __attribute__((target("avx512f")))
#define INLINE512 __attribute__((target("avx512f"), always_inline)) static inline

enum { MAX_M = 4 };   /* queries per task: their accumulators stay in the 32 vector registers */

typedef struct {
    const pi2_attn *a;
    int32_t g, hpc, n_hc;   /* heads per KV head, per chunk, chunks */
} decode_job;

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

/* Lane l of the M queries' q.k over 16 keys: (a0 + a2) + (a1 + a3), accumulator a summing terms i ≡ 16a + l
 * (mod 64) in order. */
INLINE512 void score_lane(const int M, const float *qf, int32_t hd, const float *kT, size_t ld, __mmask16 mk, int l,
                          __m512 *c) {
    __m512 acc[4][MAX_M];
    for (int a = 0; a < 4; a++) {
        for (int m = 0; m < M; m++) acc[a][m] = _mm512_setzero_ps();
        for (int32_t i = 16 * a + l; i < hd; i += 64) {
            const __m512 k = _mm512_maskz_loadu_ps(mk, kT + (size_t)i * ld);
            for (int m = 0; m < M; m++) acc[a][m] = _mm512_fmadd_ps(_mm512_set1_ps(qf[m * hd + i]), k, acc[a][m]);
        }
    }
    for (int m = 0; m < M; m++)
        c[m] = _mm512_add_ps(_mm512_add_ps(acc[0][m], acc[2][m]), _mm512_add_ps(acc[1][m], acc[3][m]));
}

/* s[m][0..16) (masked by mk) = scale · (qf[m] . key j) for the 16 keys of kT (row i at kT + i·ld); rows ls apart. */
INLINE512 void score16(const int M, const float *qf, int32_t hd, const float *kT, size_t ld, __mmask16 mk, float *s,
                       size_t ls, float scale) {
    __m512 stk[3][MAX_M];
#pragma GCC unroll 8
    for (int n = 0; n < 8; n++) {
        __m512 c0[MAX_M], c1[MAX_M];
        score_lane(M, qf, hd, kT, ld, mk, PAIR[n], c0);
        score_lane(M, qf, hd, kT, ld, mk, PAIR[n] + 8, c1);
        for (int m = 0; m < M; m++) c0[m] = _mm512_add_ps(c1[m], c0[m]);
        int done;
        FOLD(M, n, c0, stk, done);
        if (done)
            for (int m = 0; m < M; m++) _mm512_mask_storeu_ps(s + m * ls, mk, _mm512_mul_ps(c0[m], _mm512_set1_ps(scale)));
    }
}

/* Lane l of the M weight rows' p.V over 16 value dimensions: accumulator a sums the positions j in [jlo, jhi) with
 * j ≡ 16a + l (mod 64), in order. */
INLINE512 void weigh_lane(const int M, const float *p, size_t ls, const float *v, size_t vd, int32_t jlo, int32_t jhi,
                          int l, __m512 *c) {
    __m512 acc[4][MAX_M];
    for (int a = 0; a < 4; a++) {
        const int32_t r = 16 * a + l;
        for (int m = 0; m < M; m++) acc[a][m] = _mm512_setzero_ps();
        for (int32_t j = (jlo & ~63) + r < jlo ? (jlo & ~63) + r + 64 : (jlo & ~63) + r; j < jhi; j += 64) {
            const __m512 x = _mm512_loadu_ps(v + (size_t)j * vd);
            for (int m = 0; m < M; m++) acc[a][m] = _mm512_fmadd_ps(_mm512_set1_ps(p[m * ls + j]), x, acc[a][m]);
        }
    }
    for (int m = 0; m < M; m++)
        c[m] = _mm512_add_ps(_mm512_add_ps(acc[0][m], acc[2][m]), _mm512_add_ps(acc[1][m], acc[3][m]));
}

/* out row m [0..16) = sum over j in [jlo, jhi) of p[m][j] · v[j][0..16); out rows lh floats apart. */
INLINE512 void weigh16(const int M, const float *p, size_t ls, const float *v, size_t vd, int32_t jlo, int32_t jhi,
                       float *out, size_t lh) {
    __m512 stk[3][MAX_M];
#pragma GCC unroll 8
    for (int n = 0; n < 8; n++) {
        __m512 c0[MAX_M], c1[MAX_M];
        weigh_lane(M, p, ls, v, vd, jlo, jhi, PAIR[n], c0);
        weigh_lane(M, p, ls, v, vd, jlo, jhi, PAIR[n] + 8, c1);
        for (int m = 0; m < M; m++) c0[m] = _mm512_add_ps(c1[m], c0[m]);
        int done;
        FOLD(M, n, c0, stk, done);
        if (done)
            for (int m = 0; m < M; m++) _mm512_storeu_ps(out + (size_t)m * lh, c0[m]);
    }
}

/* The M-query kernels over a task's keys, one instantiation per M. */
#define KERNELS(M)                                                                                              \
    static T512 void scores_##M(const float *qf, int32_t hd, const float *kT, size_t ld, int32_t jlo, int32_t jhi, \
                                float *s, size_t ls, float scale) {                                            \
        for (int32_t jb = jlo; jb < jhi; jb += 16) {                                                           \
            const __mmask16 mk = (__mmask16)(jhi - jb >= 16 ? 0xFFFF : (1u << (jhi - jb)) - 1);                \
            score16(M, qf, hd, kT + jb, ld, mk, s + jb, ls, scale);                                            \
        }                                                                                                      \
    }                                                                                                          \
    static T512 void weigh_##M(const float *p, size_t ls, const float *v, size_t vd, int32_t hdv, int32_t jlo,  \
                               int32_t jhi, float *out) {                                                      \
        for (int32_t d0 = 0; d0 < hdv; d0 += 16) weigh16(M, p, ls, v + d0, vd, jlo, jhi, out + d0, (size_t)hdv); \
    }
KERNELS(1) KERNELS(2) KERNELS(3) KERNELS(4)

typedef void (*scores_fn)(const float *, int32_t, const float *, size_t, int32_t, int32_t, float *, size_t, float);
typedef void (*weigh_fn)(const float *, size_t, const float *, size_t, int32_t, int32_t, int32_t, float *);
static const scores_fn SCORES[MAX_M + 1] = {NULL, scores_1, scores_2, scores_3, scores_4};
static const weigh_fn WEIGH[MAX_M + 1] = {NULL, weigh_1, weigh_2, weigh_3, weigh_4};

/* One (KV head, head chunk): its queries rounded to F16, scored against the visible keys, softmax per query,
 * weights times the values into a->out. */
static void decode_task(void *arg, int32_t task, int32_t thread) {
    const decode_job *b = arg;
    const pi2_attn *a = b->a;
    const int32_t hkv = task / b->n_hc, hc = task % b->n_hc;
    const int32_t h0 = hkv * b->g + hc * b->hpc, M = b->g - hc * b->hpc < b->hpc ? b->g - hc * b->hpc : b->hpc;
    const int32_t hd = a->head_dim, hdv = a->head_dim_v, pos = a->pos0;
    const int32_t j0 = a->window && pos - a->window + 1 > 0 ? pos - a->window + 1 : 0;
    const size_t ls = (size_t)a->n_ctx;
    float *s = a->scores + (size_t)thread * a->rows * ls, *qf = a->qf + (size_t)thread * a->rows * hd;
    pi2_f16_round_row(qf, a->q + (size_t)h0 * hd, (int64_t)M * hd);
    SCORES[M](qf, hd, a->k + (size_t)hkv * hd * ls, ls, j0, pos + 1, s, ls, a->scale);
    for (int32_t m = 0; m < M; m++) pi2_attn_softmax_row(s + (size_t)m * ls, j0, pos);
    WEIGH[M](s, ls, a->v + (size_t)hkv * hdv, (size_t)a->n_head_kv * hdv, hdv, j0, pos + 1, a->out + (size_t)h0 * hdv);
}

int pi2_attn_decode(pi2_pool *pool, const pi2_attn *a) {
    if (a->flash || a->kq || a->n_tok != 1 || a->rows < 1 || a->head_dim % 16 || a->head_dim_v % 16 ||
        !__builtin_cpu_supports("avx512f"))
        return 0;
    const int32_t threads = pi2_pool_n_threads(pool), max_m = a->rows < MAX_M ? a->rows : MAX_M;
    decode_job b = {.a = a, .g = a->n_head / a->n_head_kv};
    b.n_hc = (b.g + max_m - 1) / max_m;
    /* an uneven split of KV heads over the threads: one more chunk per KV head if it evens the tasks out */
    if (threads > 1 && (a->n_head_kv * b.n_hc) % threads && b.n_hc < b.g &&
        (a->n_head_kv * (b.n_hc + 1)) % threads == 0)
        b.n_hc++;
    b.hpc = (b.g + b.n_hc - 1) / b.n_hc;
    b.n_hc = (b.g + b.hpc - 1) / b.hpc;
    pi2_pool_run(pool, decode_task, &b, a->n_head_kv * b.n_hc);
    return 1;
}

#else
int pi2_attn_decode(pi2_pool *pool, const pi2_attn *a) {
    (void)pool;
    (void)a;
    return 0;
}
#endif
