/* attn_batch_avx2.c — attn_batch.c's two kernels (the scores and the weighted values of up to PI2_ATTN_ROWS queries
 * sharing a KV head) on AVX2 with FMA and F16C, for CPUs without AVX-512 (or PI2_CPU_VARIANT=avx2).
 * Numbers: attn_batch.c's exactly. There a zmm holds 16 keys (scores) or 16 value dimensions (weighted values); each
 * of those is computed on its own, so here a ymm holds 8 of them and the same lanes are summed in the same order:
 * q.k term i to lane i % 16 and p.V term j to lane j % 16, each lane from zero in term order, lanes l and l + 8 added,
 * lane pairs in the order 0, 4, 2, 6, 1, 5, 3, 7 folded as a binary counter carries (the _mm512_reduce_add_ps tree).
 * 16 ymm registers hold two accumulators of at most ATTN8_ROWS queries: a task's queries go in chunks of that many,
 * each 8-key block (its keys stay in L1) or 8-dimension column serving every chunk before the next.
 * Does not: choose tasks or the softmax (attn_batch.c), keys not in F16. */
#include "ops.h"

#include <string.h>

#if defined(__x86_64__) && defined(__GNUC__)
#include <immintrin.h>

#define T256 __attribute__((target("avx2,fma,f16c")))
#define INLINE256 __attribute__((target("avx2,fma,f16c"), always_inline)) static inline
#define ATTN8_ROWS 6
#define MAX_HD 512          /* the head size whose last key block is copied on the stack */

/* The lane pair handled n-th (0..7): lanes PAIR[n] and PAIR[n] + 8 (attn_batch.c's order). */
static const int PAIR[8] = {0, 4, 2, 6, 1, 5, 3, 7};

/* v = lanes PAIR[n] + PAIR[n] + 8 of every query; folds it into the pending sums stk [3][M]; 1 when v is final. */
#define FOLD8(M, n, v, stk, done)                                                       \
    do {                                                                                \
        done = 0;                                                                       \
        if (!((n) & 1)) { for (int m = 0; m < M; m++) stk[0][m] = v[m]; break; }        \
        for (int m = 0; m < M; m++) v[m] = _mm256_add_ps(v[m], stk[0][m]);              \
        if (!((n) & 2)) { for (int m = 0; m < M; m++) stk[1][m] = v[m]; break; }        \
        for (int m = 0; m < M; m++) v[m] = _mm256_add_ps(v[m], stk[1][m]);              \
        if (!((n) & 4)) { for (int m = 0; m < M; m++) stk[2][m] = v[m]; break; }        \
        for (int m = 0; m < M; m++) v[m] = _mm256_add_ps(v[m], stk[2][m]);              \
        done = 1;                                                                       \
    } while (0)

/* s[m][0..nk) = scale · (qf[m] . key k) for M queries qf [M][hd] (F16 values) and the 8 keys of kT (row i of the
 * transposed keys at kT + i·ld, 8 halves readable); s rows ls floats apart. */
INLINE256 void score8(const int M, const float *qf, int32_t hd, const pi2_fp16 *kT, size_t ld, int nk, float *s,
                      size_t ls, float scale) {
    __m256 stk[3][ATTN8_ROWS];
#pragma GCC unroll 8
    for (int n = 0; n < 8; n++) {
        const int l = PAIR[n];
        __m256 c0[ATTN8_ROWS], c1[ATTN8_ROWS];
        for (int m = 0; m < M; m++) c0[m] = c1[m] = _mm256_setzero_ps();
        for (int32_t i = l; i < hd; i += 16) {
            const __m256 k0 = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(kT + (size_t)i * ld)));
            const __m256 k1 = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(kT + (size_t)(i + 8) * ld)));
            for (int m = 0; m < M; m++) {
                c0[m] = _mm256_fmadd_ps(_mm256_set1_ps(qf[m * hd + i]), k0, c0[m]);
                c1[m] = _mm256_fmadd_ps(_mm256_set1_ps(qf[m * hd + i + 8]), k1, c1[m]);
            }
        }
        for (int m = 0; m < M; m++) c0[m] = _mm256_add_ps(c0[m], c1[m]);
        int done;
        FOLD8(M, n, c0, stk, done);
        if (done)
            for (int m = 0; m < M; m++) {
                const __m256 r = _mm256_mul_ps(c0[m], _mm256_set1_ps(scale));
                if (nk == 8) {
                    _mm256_storeu_ps(s + m * ls, r);
                } else {
                    float t[8];
                    _mm256_storeu_ps(t, r);
                    memcpy(s + m * ls, t, (size_t)nk * sizeof *t);
                }
            }
    }
}

/* out[m][0..8) = sum over j in [jlo, jhi) of p[m][j] · v[j][0..8) for M weight rows p[m], value rows vd halves
 * apart. */
INLINE256 void weigh8(const int M, const float *const *p, const pi2_fp16 *v, size_t vd, int32_t jlo, int32_t jhi,
                      float *const *out) {
    __m256 stk[3][ATTN8_ROWS];
#pragma GCC unroll 8
    for (int n = 0; n < 8; n++) {
        const int l = PAIR[n];
        __m256 c0[ATTN8_ROWS], c1[ATTN8_ROWS];
        for (int m = 0; m < M; m++) c0[m] = c1[m] = _mm256_setzero_ps();
        for (int32_t jb = jlo & ~15; jb < jhi; jb += 16) {
            const int32_t j = jb + l, j8 = j + 8;
            if (j >= jlo && j < jhi) {
                const __m256 v0 = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(v + (size_t)j * vd)));
                for (int m = 0; m < M; m++) c0[m] = _mm256_fmadd_ps(_mm256_set1_ps(p[m][j]), v0, c0[m]);
            }
            if (j8 >= jlo && j8 < jhi) {
                const __m256 v1 = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(v + (size_t)j8 * vd)));
                for (int m = 0; m < M; m++) c1[m] = _mm256_fmadd_ps(_mm256_set1_ps(p[m][j8]), v1, c1[m]);
            }
        }
        for (int m = 0; m < M; m++) c0[m] = _mm256_add_ps(c0[m], c1[m]);
        int done;
        FOLD8(M, n, c0, stk, done);
        if (done)
            for (int m = 0; m < M; m++) _mm256_storeu_ps(out[m], c0[m]);
    }
}

#define KERNELS8(M)                                                                                             \
    static T256 void score8_##M(const float *qf, int32_t hd, const pi2_fp16 *kT, size_t ld, int nk, float *s,  \
                                size_t ls, float scale) {                                                      \
        score8(M, qf, hd, kT, ld, nk, s, ls, scale);                                                           \
    }                                                                                                          \
    static T256 void weigh8_##M(const float *const *p, const pi2_fp16 *v, size_t vd, int32_t jlo, int32_t jhi,   \
                                float *const *out) {                                                           \
        weigh8(M, p, v, vd, jlo, jhi, out);                                                                    \
    }
KERNELS8(1) KERNELS8(2) KERNELS8(3) KERNELS8(4) KERNELS8(5) KERNELS8(6)

typedef void (*score8_fn)(const float *, int32_t, const pi2_fp16 *, size_t, int, float *, size_t, float);
typedef void (*weigh8_fn)(const float *const *, const pi2_fp16 *, size_t, int32_t, int32_t, float *const *);
static const score8_fn SCORE8[ATTN8_ROWS + 1] = {NULL, score8_1, score8_2, score8_3, score8_4, score8_5, score8_6};
static const weigh8_fn WEIGH8[ATTN8_ROWS + 1] = {NULL, weigh8_1, weigh8_2, weigh8_3, weigh8_4, weigh8_5, weigh8_6};

/* Chunk c of M queries cut into n_ch nearly equal chunks: its first query and size. */
static void chunk(int32_t M, int32_t n_ch, int32_t c, int32_t *m0, int32_t *mc) {
    const int32_t base = M / n_ch, extra = M % n_ch;
    *m0 = c * base + (c < extra ? c : extra);
    *mc = base + (c < extra);
}

int pi2_attn_batch_scores_avx2(int32_t M, const float *qf, int32_t hd, const pi2_fp16 *kT, size_t ld, int32_t jlo,
                               int32_t jhi, float *s, size_t ls, float scale) {
    if (M < 1 || M > PI2_ATTN_ROWS || hd % 16 || hd > MAX_HD || !pi2_cpu_avx2_half()) return 0;
    const int32_t n_ch = (M + ATTN8_ROWS - 1) / ATTN8_ROWS;
    for (int32_t jb = jlo; jb < jhi; jb += 8) {
        const int nk = jhi - jb < 8 ? jhi - jb : 8;
        const pi2_fp16 *k = kT + jb;
        size_t kld = ld;
        pi2_fp16 tail[MAX_HD * 8];   /* the last block's keys, zero-padded: no read past the cache */
        if (nk < 8) {
            memset(tail, 0, (size_t)hd * 8 * sizeof *tail);
            for (int32_t i = 0; i < hd; i++) memcpy(tail + (size_t)i * 8, kT + (size_t)i * ld + jb, (size_t)nk * 2);
            k = tail;
            kld = 8;
        }
        for (int32_t c = 0; c < n_ch; c++) {
            int32_t m0, mc;
            chunk(M, n_ch, c, &m0, &mc);
            SCORE8[mc](qf + (size_t)m0 * hd, hd, k, kld, nk, s + (size_t)m0 * ls + jb, ls, scale);
        }
    }
    return 1;
}

int pi2_attn_batch_weigh_avx2(int32_t M, const float *p, size_t ls, const pi2_fp16 *v, size_t vd, int32_t hdv,
                              int32_t jlo, int32_t jhi, float *out, int32_t nh, size_t lt) {
    if (M < 1 || M > PI2_ATTN_ROWS || hdv % 8 || !pi2_cpu_avx2_half()) return 0;
    const int32_t n_ch = (M + ATTN8_ROWS - 1) / ATTN8_ROWS;
    const float *pr[PI2_ATTN_ROWS];
    float *orow[PI2_ATTN_ROWS];
    for (int32_t d0 = 0; d0 < hdv; d0 += 8) {
        for (int32_t m = 0; m < M; m++) {
            pr[m] = p + (size_t)m * ls;
            orow[m] = out + (size_t)(m / nh) * lt + (size_t)(m % nh) * (size_t)hdv + d0;
        }
        for (int32_t c = 0; c < n_ch; c++) {
            int32_t m0, mc;
            chunk(M, n_ch, c, &m0, &mc);
            WEIGH8[mc](pr + m0, v + d0, vd, jlo, jhi, orow + m0);
        }
    }
    return 1;
}

#else
int pi2_attn_batch_scores_avx2(int32_t M, const float *qf, int32_t hd, const pi2_fp16 *kT, size_t ld, int32_t jlo,
                               int32_t jhi, float *s, size_t ls, float scale) {
    (void)M; (void)qf; (void)hd; (void)kT; (void)ld; (void)jlo; (void)jhi; (void)s; (void)ls; (void)scale;
    return 0;
}

int pi2_attn_batch_weigh_avx2(int32_t M, const float *p, size_t ls, const pi2_fp16 *v, size_t vd, int32_t hdv,
                              int32_t jlo, int32_t jhi, float *out, int32_t nh, size_t lt) {
    (void)M; (void)p; (void)ls; (void)v; (void)vd; (void)hdv; (void)jlo; (void)jhi; (void)out; (void)nh; (void)lt;
    return 0;
}
#endif
