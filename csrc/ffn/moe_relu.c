/* moe_relu.c — ReLU-family experts (smallthinker's ReGLU) with the gate first, under the context's FFN rule
 * PI2_FFN_RELU, for single tokens: gate rows are computed for every neuron, the up row of neuron r of expert e only
 * when the token routed to e has gate_r > 0, since h_r = gate_r > 0 ? gate_r·up_r : 0 (pi2_moe_activate) never
 * reads up_r otherwise. Each task (64 rows of one expert) computes its gate rows with the dense experts' kernels,
 * then the up rows they opened: its open 8-row groups whole by the dense kernel, or its open rows gathered eight at
 * a time when that costs less. Every computed row has the bits the dense product gives it: Q4_0 the x8 GEMV's
 * per-row arithmetic (exact integer block sums, then acc = (float)(isum·(d_w·d_x) + acc) in double) on eight
 * gathered rows of the packed or the file layout, F32 / F16 ggml_vec_dot per row; so the logits are the dense
 * experts' for any thread count. Other up types (and Q4_0 not in whole 8-row groups) compute every row. Down reads
 * h whole: a zero inside a quantized block of its input still counts in the block's scale, and only a block of all
 * zeros adds exactly nothing; random and trained neuron orders leave almost none (a hot-first order would).
 * Counts: ffn_active[il] += the (routed row, neuron) pairs with gate > 0, ffn_tokens += tokens (layer 0). */
#include "ffn/moe.h"
#include "kernels/ggml_order.h"
#include "kernels/ggml_x8.h"

#include <stdatomic.h>
#include <string.h>

enum { ROWS_PER_TASK = 64 };   /* as pi2_moe_experts: whole 8-row groups */
enum { UP_Q4_0, UP_F32, UP_F16, UP_DENSE };

static int up_kind(const pi2_weight *w) {
    if (w->type == PI2_T_Q4_0 && w->n_out % 8 == 0 && w->n_in / 32 <= PI2_X8_MAX_BLOCKS) return UP_Q4_0;
    if (w->type == PI2_T_F32) return UP_F32;
    if (w->type == PI2_T_F16) return UP_F16;
    return UP_DENSE;
}

int pi2_moe_relu_ok(const pi2_ctx *c, const pi2_layer *L, int32_t n) {
    return n == 1 && c->ffn.rule == PI2_FFN_RELU && c->m->hp.expert_act == PI2_ACT_RELU && c->ffn_active &&
           up_kind(&L->up_exps) != UP_DENSE;
}

/* ---------------------------------------------------------------- Q4_0 rows, eight at a time */

/* Row q of the eight: its block b's scale at dp[q] + b·bs, its 16 bytes of nibbles at qp[q] + b·bs; ys[b] = 8·Σ of
 * block b's activations (the nibbles' offset). */
typedef void (*gather8_fn)(int64_t n, const uint8_t *const *dp, const uint8_t *const *qp, size_t bs,
                           const blk_q8_0 *x, const int32_t *ys, float *s);

static void gather8_scalar(int64_t n, const uint8_t *const *dp, const uint8_t *const *qp, size_t bs,
                           const blk_q8_0 *x, const int32_t *ys, float *s) {
    (void)ys;
    for (int q = 0; q < 8; q++) {
        float acc = 0.0f;
        for (int64_t b = 0; b < n / 32; b++) {
            const uint8_t *w = qp[q] + (size_t)b * bs;
            int32_t isum = 0;
            for (int i = 0; i < 16; i++)
                isum += ((w[i] & 15) - 8) * x[b].qs[i] + ((w[i] >> 4) - 8) * x[b].qs[i + 16];
            pi2_fp16 d;
            memcpy(&d, dp[q] + (size_t)b * bs, sizeof d);
            acc = (float)((double)(float)isum * (double)(pi2_fp16_to_f32(d) * pi2_fp16_to_f32(x[b].d)) + (double)acc);
        }
        s[q] = acc;
    }
}

#if defined(__x86_64__) && defined(__GNUC__)
#include <immintrin.h>

/* kernels/ggml_x8_body.h for one activation row, the eight rows' bytes gathered instead of one packed group's. */
__attribute__((target("avx2,fma,f16c"))) static void gather8_avx2(int64_t n, const uint8_t *const *dp,
                                                                  const uint8_t *const *qp, size_t bs,
                                                                  const blk_q8_0 *x, const int32_t *ys, float *s) {
    const __m256i m4 = _mm256_set1_epi8(0xF), ones = _mm256_set1_epi16(1);
    const __m256i order = _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7);
    __m256d acc_lo = _mm256_setzero_pd(), acc_hi = _mm256_setzero_pd();
    for (int64_t b = 0; b < n / 32; b++) {
        const size_t off = (size_t)b * bs;
        const blk_q8_0 *xb = x + b;
        const __m256i ylo = _mm256_broadcastsi128_si256(_mm_loadu_si128((const __m128i *)xb->qs));
        const __m256i yhi = _mm256_broadcastsi128_si256(_mm_loadu_si128((const __m128i *)(xb->qs + 16)));
        __m256i a[4];
        for (int p = 0; p < 4; p++) {
            const __m256i q = _mm256_loadu2_m128i((const __m128i *)(qp[2 * p + 1] + off),
                                                  (const __m128i *)(qp[2 * p] + off));
            const __m256i lo = _mm256_and_si256(q, m4), hi = _mm256_and_si256(_mm256_srli_epi16(q, 4), m4);
            a[p] = _mm256_add_epi32(_mm256_madd_epi16(_mm256_maddubs_epi16(lo, ylo), ones),
                                    _mm256_madd_epi16(_mm256_maddubs_epi16(hi, yhi), ones));
        }
        const __m256i h = _mm256_hadd_epi32(_mm256_hadd_epi32(a[0], a[1]), _mm256_hadd_epi32(a[2], a[3]));
        const __m256i tot = _mm256_permutevar8x32_epi32(h, order);   /* rows 0..7 */
        const __m256 isum = _mm256_cvtepi32_ps(_mm256_sub_epi32(tot, _mm256_set1_epi32(ys[b])));
        pi2_fp16 d[8];
        for (int q = 0; q < 8; q++) memcpy(&d[q], dp[q] + off, sizeof d[q]);
        const __m256 dw = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)d));
        const __m256 scale = _mm256_mul_ps(dw, _mm256_set1_ps(pi2_fp16_to_f32(xb->d)));
        const __m256d i_lo = _mm256_cvtps_pd(_mm256_castps256_ps128(isum));
        const __m256d i_hi = _mm256_cvtps_pd(_mm256_extractf128_ps(isum, 1));
        const __m256d s_lo = _mm256_cvtps_pd(_mm256_castps256_ps128(scale));
        const __m256d s_hi = _mm256_cvtps_pd(_mm256_extractf128_ps(scale, 1));
        acc_lo = _mm256_cvtps_pd(_mm256_cvtpd_ps(_mm256_add_pd(_mm256_mul_pd(i_lo, s_lo), acc_lo)));
        acc_hi = _mm256_cvtps_pd(_mm256_cvtpd_ps(_mm256_add_pd(_mm256_mul_pd(i_hi, s_hi), acc_hi)));
    }
    _mm_storeu_ps(s, _mm256_cvtpd_ps(acc_lo));
    _mm_storeu_ps(s + 4, _mm256_cvtpd_ps(acc_hi));
}

static gather8_fn pick_gather8(int32_t impl) {
    if (impl != PI2_IMPL_REF && pi2_go_q4_0_x8())   /* the x8 kernels' CPU: AVX2, FMA and F16C */
        return gather8_avx2;
    return gather8_scalar;
}
#else
static gather8_fn pick_gather8(int32_t impl) {
    (void)impl;
    return gather8_scalar;
}
#endif

/* ---------------------------------------------------------------- up rows of the active neurons */

typedef struct {
    pi2_ctx *c;
    const pi2_weight *w;
    const pi2_weight *gate;     /* gate computed in the same task, before its up rows (NULL: computed already) */
    int32_t kind, tasks_per_expert;
    gather8_fn gather8;
    pi2_go_x8_fn x8;            /* the dense kernels of whole groups: packed layout */
    pi2_go_rows8_fn rows8;      /* file layout */
    _Atomic int64_t active;
} up_job;

/* Rows r0..r1 of an expert of w (base, x8: packed layout; w of an up kind) for activation xa into o, by the kernels
 * pi2_moe_experts runs for one token: Q4_0 x8 on the packed layout, else rows8, rows4, then single rows. */
static void dense_rows(const up_job *j, const pi2_weight *w, const uint8_t *base, int x8, int64_t r0, int64_t r1,
                       const uint8_t *xa, float *o) {
    if (w->type == PI2_T_Q4_0) {
        const blk_q8_0 *x = (const blk_q8_0 *)xa;
        if (x8) {
            float *out = o + r0;
            j->x8(w->n_in, base + (size_t)r0 * w->row_bytes, (r1 - r0) / 8, 1, &x, &out);
            return;
        }
        int64_t r = r0;
        if (j->rows8)
            for (; r + 8 <= r1; r += 8) j->rows8(w->n_in, &o[r], base + (size_t)r * w->row_bytes, w->row_bytes, x);
        for (; r + 4 <= r1; r += 4)
            pi2_go_dot_q4_0_rows4(w->n_in, &o[r], base + (size_t)r * w->row_bytes, w->row_bytes, x);
        for (; r < r1; r++) o[r] = pi2_go_dot_q4_0(w->n_in, (const blk_q4_0 *)(base + (size_t)r * w->row_bytes), x);
        return;
    }
    for (int64_t r = r0; r < r1; r++) {
        const uint8_t *row = base + (size_t)r * w->row_bytes;
        o[r] = w->type == PI2_T_F32 ? pi2_go_dot_f32(w->n_in, (const float *)row, (const float *)xa)
                                    : pi2_go_dot_f16(w->n_in, (const pi2_fp16 *)row, (const float *)xa);
    }
}

/* Q4_0 rows r0..r1 of expert e (base, x8: packed layout) for activation xa into o: open[g] says which 8-row groups
 * have an open neuron, rows[0..n_rows) are those neurons. Either each open group whole by the dense kernel (x8 on the
 * packed layout, rows8 on the file's: one contiguous stream) or the open rows gathered eight at a time (eight
 * streams, GATHER_COST times a group's work): whichever costs less. */
enum { GATHER_COST = 2 };

static void q4_0_rows(const up_job *j, const uint8_t *base, int x8, int64_t r0, int64_t r1, const uint8_t *open,
                      const int32_t *rows, int32_t n_rows, const blk_q8_0 *xa, float *o) {
    const pi2_weight *w = j->w;
    int32_t n_open = 0;
    for (int64_t g = r0 / 8; g < (r1 + 7) / 8; g++) n_open += open[g - r0 / 8];
    if (GATHER_COST * ((n_rows + 7) / 8) >= n_open) {
        for (int64_t g = r0 / 8; g < (r1 + 7) / 8; g++) {
            if (!open[g - r0 / 8]) continue;
            int64_t run = 1;   /* consecutive open groups: one call */
            while (g + run < (r1 + 7) / 8 && open[g + run - r0 / 8]) run++;
            const int64_t a = 8 * g, b = 8 * (g + run) < r1 ? 8 * (g + run) : r1;
            dense_rows(j, w, base, x8, a, b, (const uint8_t *)xa, o);
            g += run - 1;
        }
        return;
    }
    int32_t ys[PI2_X8_MAX_BLOCKS];   /* 8·Σ of each block's activations: the nibbles' offset */
    for (int64_t b = 0; b < w->n_in / 32; b++) {
        int32_t sum = 0;
        for (int q = 0; q < 32; q++) sum += xa[b].qs[q];
        ys[b] = 8 * sum;
    }
    for (int32_t s = 0; s < n_rows; s += 8) {
        const uint8_t *dp[8], *qp[8];
        for (int q = 0; q < 8; q++) {
            const int64_t r = rows[s + q < n_rows ? s + q : n_rows - 1];   /* a short tail repeats its last row */
            if (x8) {   /* group r/8, column b at b·8 blocks: d[8], then qs[8][16] */
                const uint8_t *g = base + (size_t)(r / 8) * 8 * w->row_bytes;
                dp[q] = g + 2 * (r % 8);
                qp[q] = g + 16 + 16 * (r % 8);
            } else {
                dp[q] = base + (size_t)r * w->row_bytes;
                qp[q] = dp[q] + 2;
            }
        }
        float out[8];
        j->gather8(w->n_in, dp, qp, x8 ? 8 * sizeof(blk_q4_0) : sizeof(blk_q4_0), xa, ys, out);
        for (int32_t q = 0; q < 8 && s + q < n_rows; q++) o[rows[s + q]] = out[q];
    }
}

static void up_task(void *arg, int32_t task, int32_t thread) {
    (void)thread;
    up_job *j = arg;
    const struct pi2_moe *moe = j->c->moe;
    const pi2_weight *w = j->w;
    const int64_t F = w->n_out;
    const int32_t e = moe->active[task / j->tasks_per_expert], cnt = moe->count[e];
    const int32_t *ids = moe->list + moe->start[e];
    const int64_t r0 = (int64_t)(task % j->tasks_per_expert) * ROWS_PER_TASK;
    const int64_t r1 = r0 + ROWS_PER_TASK < F ? r0 + ROWS_PER_TASK : F;
    int32_t rows[ROWS_PER_TASK], n_rows = 0;
    uint8_t open[ROWS_PER_TASK / 8] = {0};
    int64_t active = 0;
    if (j->gate) {   /* this task's gate rows first: the same kernels as the dense experts' */
        int x8g;
        const uint8_t *gb = pi2_moe_expert_rows(moe, j->gate, e, &x8g);
        for (int32_t i = 0; i < cnt; i++)
            dense_rows(j, j->gate, gb, x8g, r0, r1, moe->xa + (size_t)(ids[i] / moe->k) * moe->xa_row,
                       moe->gate + (size_t)ids[i] * F);
    }
    for (int64_t r = r0; r < r1; r++) {
        int any = 0;
        for (int32_t i = 0; i < cnt; i++)
            if (moe->gate[(size_t)ids[i] * F + r] > 0.0f) any = 1, active++;
        if (any) rows[n_rows++] = (int32_t)r, open[(r - r0) / 8] = 1;
    }
    atomic_fetch_add_explicit(&j->active, active, memory_order_relaxed);
    if (!n_rows) return;
    int x8;
    const uint8_t *base = pi2_moe_expert_rows(moe, w, e, &x8);
    for (int32_t i = 0; i < cnt; i++) {
        const uint8_t *xa = moe->xa + (size_t)(ids[i] / moe->k) * moe->xa_row;
        float *o = moe->up + (size_t)ids[i] * F;
        if (j->kind == UP_Q4_0) {
            q4_0_rows(j, base, x8, r0, r1, open, rows, n_rows, (const blk_q8_0 *)xa, o);
            continue;
        }
        for (int32_t q = 0; q < n_rows; q++) {
            const uint8_t *row = base + (size_t)rows[q] * w->row_bytes;
            o[rows[q]] = j->kind == UP_F32 ? pi2_go_dot_f32(w->n_in, (const float *)row, (const float *)xa)
                                           : pi2_go_dot_f16(w->n_in, (const pi2_fp16 *)row, (const float *)xa);
        }
    }
}

void pi2_moe_relu_gate_up(pi2_ctx *c, const pi2_layer *L, int32_t il, int32_t n) {
    struct pi2_moe *moe = c->moe;
    const int64_t E = c->m->hp.n_embd;
    /* gate and up of one type: each task computes its gate rows, then the up rows they opened (one pass, as the
     * dense experts); else every gate first */
    const int fused = L->gate_exps.type == L->up_exps.type;
    pi2_moe_prep(c, L->gate_exps.type, c->xn, n, E);
    if (!fused) {
        pi2_moe_experts(c, (const pi2_weight *[]){&L->gate_exps}, (float *[]){moe->gate}, 1, 1);
        pi2_moe_prep(c, L->up_exps.type, c->xn, n, E);
    }
    up_job j = {c, &L->up_exps, fused ? &L->gate_exps : NULL, up_kind(&L->up_exps),
                (int32_t)((L->up_exps.n_out + ROWS_PER_TASK - 1) / ROWS_PER_TASK), pick_gather8(c->p.impl),
                pi2_go_q4_0_x8(), pi2_go_q4_0_rows8(), 0};
    pi2_pool_run(c->pool, up_task, &j, moe->n_active * j.tasks_per_expert);
    c->ffn_active[il] += atomic_load(&j.active);
    if (il == 0) c->ffn_tokens += n;
}

void pi2_moe_relu_up(pi2_ctx *c, const pi2_layer *L, int32_t il, int32_t n) {
    struct pi2_moe *moe = c->moe;
    pi2_moe_prep(c, L->up_exps.type, c->xn, n, c->m->hp.n_embd);
    up_job j = {c, &L->up_exps, NULL, up_kind(&L->up_exps),
                (int32_t)((L->up_exps.n_out + ROWS_PER_TASK - 1) / ROWS_PER_TASK), pick_gather8(c->p.impl),
                pi2_go_q4_0_x8(), pi2_go_q4_0_rows8(), 0};
    pi2_pool_run(c->pool, up_task, &j, moe->n_active * j.tasks_per_expert);
    c->ffn_active[il] += atomic_load(&j.active);
}
