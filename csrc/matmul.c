/* matmul.c — the dense matrix products of the forward pass (matmul.h).
 * Does: quantize x once per activation format (rows in parallel for batches); split the output
 *       rows of a group of matrices into about TASKS_PER_THREAD tasks per thread; inside a task, walk token
 *       tiles of TILE_TOK so a weight row and a tile of activations stay in L1 (prompt batches), four
 *       or two rows at a time where the type has such a kernel; for eight-token kernels that read their
 *       own activation format, make those rows once per token beside the quantized ones.
 * Does not: choose kernels (kernels/traits.c) or skip rows (the sparse FFN will).
 * Determinism: every out[t][r] is one vec_dot of fixed inputs, whichever thread computes it; which
 *       float order (vec_dot or vec_dot_batch) depends on the batch size and t as in ggml. */
#include "matmul.h"
#include "kernels/pack.h"
#include "kernels/traits.h"

#define MAX_GROUP 4
#define TASKS_PER_THREAD 8   /* enough tasks to balance a busy core, few enough to keep the counter cold */
#define MIN_ROWS 8
#define TILE_TOK 16
#define PACK_TOK 256         /* tokens per unpacking of a packed group (its 8 rows stay in L1 for them) */
#define PACK_K_TOK 32        /* tokens per pass over a task's packed K-quant groups (their activations stay in L2) */
#define PACK_ONE_TOK 64      /* tokens per pass over a task's packed groups with the one-token kernel (activations in L2) */

typedef struct {
    const pi2_mm *mm;
    int32_t n_mm, n_tok;
    int32_t single_order;             /* pi2_matmul_env's: no batch kernels */
    const pi2_type_traits *tr[MAX_GROUP];
    pi2_vec_dot4x2_fn dot4x2[MAX_GROUP];   /* two rows x four tokens, or NULL */
    pi2_vec_dot4x2_fn dot4x4[MAX_GROUP];   /* four rows x four tokens, or NULL */
    pi2_vec_dot4x2_fn dot8x4[MAX_GROUP];   /* four rows x eight tokens, or NULL (only with dot4x4) */
    pi2_vec_dot4_fn batch8[MAX_GROUP];     /* vec_dot_batch on eight tokens, or NULL */
    const uint8_t *xw[MAX_GROUP];     /* dot8x4's activation rows for mm[i] (prep's format), or xq[i] */
    size_t xw_row[MAX_GROUP];
    pi2_act_prep_fn prep[MAX_GROUP];  /* fills xw from xq, in mm[i]'s first user of that type; or NULL */
    pi2_vec_dot_rows4_fn rows4[MAX_GROUP]; /* four rows x one token (used when n_tok == 1), or NULL */
    pi2_vec_dot_pack_fn pack[MAX_GROUP];   /* mm[i].w->packed's kernel, or NULL: the mapped rows */
    const uint8_t *xq[MAX_GROUP];     /* quantized x for mm[i] */
    size_t xq_row[MAX_GROUP];         /* bytes per quantized row */
    int32_t first_task[MAX_GROUP + 1];
    int64_t rows_per_task;
    /* quantization job */
    const float *x;
    int64_t n_in;
    const pi2_type_traits *qtr[MAX_GROUP];
    uint8_t *qdst[MAX_GROUP];
    int32_t n_formats;
} mm_job;

/* Whether token t is computed by the type's batch kernel (pi2_uses_batch_dot), never in single order. */
static inline int uses_batch(const mm_job *j, const pi2_type_traits *tr, int32_t t) {
    return !j->single_order && pi2_uses_batch_dot(tr, j->n_tok, t);
}

static size_t act_row_bytes(const pi2_type_traits *w, int64_t n_in, int32_t impl) {
    const pi2_type_traits *a = pi2_traits(w->vec_dot_type, impl);
    return (size_t)(n_in / a->block_size) * (size_t)a->type_size;
}

/* Bytes per token of dot8x4's own activation rows for mm[i], 0 when it reads the quantized rows or an
 * earlier matrix of the group (same type) already made them. */
static size_t wide_row_bytes(const pi2_mm *mm, int32_t i, int32_t impl) {
    int32_t bb;
    if (!pi2_kernels_dot8x4(mm[i].w->type, impl) || !pi2_kernels_dot8x4_prep(mm[i].w->type, impl, &bb)) return 0;
    for (int32_t j = 0; j < i; j++)
        if (mm[j].w->type == mm[i].w->type) return 0;
    return (size_t)(mm[i].w->n_in / 32) * (size_t)bb;
}

size_t pi2_matmul_scratch(const pi2_mm *mm, int32_t n_mm, int32_t n_tok, int32_t impl) {
    size_t total = 0;
    for (int32_t i = 0; i < n_mm; i++) {
        const pi2_type_traits *t = pi2_traits(mm[i].w->type, impl);
        int shared = 0;
        for (int32_t j = 0; j < i; j++)
            shared |= pi2_traits(mm[j].w->type, impl)->vec_dot_type == t->vec_dot_type;
        if (!shared) total += (size_t)n_tok * act_row_bytes(t, mm[i].w->n_in, impl);
        if (n_tok >= 8) total += (size_t)n_tok * wide_row_bytes(mm, i, impl);
    }
    return total;
}

static void quantize_task(void *arg, int32_t t, int32_t thread) {
    (void)thread;
    mm_job *j = arg;
    for (int32_t f = 0; f < j->n_formats; f++) {
        const size_t rb = (size_t)(j->n_in / j->qtr[f]->block_size) * (size_t)j->qtr[f]->type_size;
        j->qtr[f]->quantize_act(j->x + (size_t)t * j->n_in, j->qdst[f] + (size_t)t * rb, j->n_in);
    }
    for (int32_t i = 0; i < j->n_mm; i++)
        if (j->prep[i]) j->prep[i](j->xq[i] + (size_t)t * j->xq_row[i], (uint8_t *)j->xw[i] + (size_t)t * j->xw_row[i], j->n_in);
}

/* Rows [r0, r1) of mm[i] for tokens [t0, t1); row r at base + (r - rbase)·row_bytes (the mapped rows, or one
 * packed group unpacked). Four or two rows at a time where the type has such kernels, the batch orders as ggml. */
static void tile_rows(const mm_job *j, int32_t i, const uint8_t *base, int64_t rbase, int64_t r0, int64_t r1,
                      int32_t t0, int32_t t1) {
    const pi2_weight *w = j->mm[i].w;
    const pi2_type_traits *tr = j->tr[i];
    float *out = j->mm[i].out;
#define ROW(r) (base + (size_t)((r) - rbase) * w->row_bytes)
    for (int64_t r = r0; r < r1; r++) {
        const uint8_t *row = ROW(r);
        const int rows = j->dot4x4[i] && r + 3 < r1 ? 4 : j->dot4x2[i] && r + 1 < r1 ? 2 : 1;
        if (rows > 1 && t1 - t0 >= 4) {   /* rows r .. r+rows-1: same orders as vec_dot */
            const pi2_vec_dot4x2_fn fn = rows == 4 ? j->dot4x4[i] : j->dot4x2[i];
            int32_t t = t0;
            if (rows == 4 && j->dot8x4[i])
                for (; t + 8 <= t1; t += 8)
                    j->dot8x4[i](w->n_in, &out[(size_t)t * w->n_out + r], (size_t)w->n_out, row,
                                 w->row_bytes, j->xw[i] + (size_t)t * j->xw_row[i], j->xw_row[i]);
            for (; t + 4 <= t1; t += 4)
                fn(w->n_in, &out[(size_t)t * w->n_out + r], (size_t)w->n_out, row,
                   w->row_bytes, j->xq[i] + (size_t)t * j->xq_row[i], j->xq_row[i]);
            for (; t < t1; t++)
                for (int64_t k = r; k < r + rows; k++)
                    tr->vec_dot(w->n_in, &out[(size_t)t * w->n_out + k], ROW(k), j->xq[i] + (size_t)t * j->xq_row[i]);
            r += rows - 1;
            continue;
        }
        for (int32_t t = t0; t < t1; t++) {
            float *o = &out[(size_t)t * w->n_out + r];
            const uint8_t *xq = j->xq[i] + (size_t)t * j->xq_row[i];
            const int batch = uses_batch(j, tr, t);
            const pi2_vec_dot4_fn dot4 = batch ? tr->vec_dot_batch4 : tr->vec_dot4;
            if (batch && j->batch8[i] && t + 8 <= t1 && uses_batch(j, tr, t + 7)) {
                j->batch8[i](w->n_in, o, (size_t)w->n_out, row, xq, j->xq_row[i]);   /* t..t+7, same orders */
                t += 7;
            } else if (dot4 && t + 4 <= t1 && uses_batch(j, tr, t + 3) == batch) {
                dot4(w->n_in, o, (size_t)w->n_out, row, xq, j->xq_row[i]);   /* t..t+3, same orders */
                t += 3;
            } else
                (uses_batch(j, tr, t) ? tr->vec_dot_batch : tr->vec_dot)(w->n_in, o, row, xq);
        }
    }
#undef ROW
}

/* Packed rows [r0, r1) of a type whose packed kernels take batches (the K-quants): per tile of PACK_K_TOK tokens,
 * each group computed on up to pack_batch_tok (four by default) tokens at a time where they are in the batch
 * order, one at a time otherwise. */
static void packed_rows_batch(const mm_job *j, int32_t i, int64_t r0, int64_t r1) {
    const pi2_weight *w = j->mm[i].w;
    const pi2_type_traits *tr = j->tr[i];
    float *out = j->mm[i].out;
    const int32_t max_tok = tr->pack_batch_tok ? tr->pack_batch_tok : 4;
    for (int32_t s0 = 0; s0 < j->n_tok; s0 += PACK_K_TOK) {
        const int32_t s1 = s0 + PACK_K_TOK < j->n_tok ? s0 + PACK_K_TOK : j->n_tok;
        for (int64_t r = r0; r < r1;) {
            const uint8_t *g = w->packed + (size_t)r * w->row_bytes;
            const int two = tr->vec_dot_pack_batch16 && r + 2 * PI2_PACK_ROWS <= r1;   /* 16 rows per call */
            const pi2_vec_dot_pack4_fn fn = two ? tr->vec_dot_pack_batch16 : tr->vec_dot_pack_batch;
            for (int32_t t = s0; t < s1;) {
                const uint8_t *xq = j->xq[i] + (size_t)t * j->xq_row[i];
                if (uses_batch(j, tr, t)) {   /* up to pack_batch_tok tokens, all in the batch order */
                    int32_t nt = 1;
                    while (nt < max_tok && t + nt < s1 && uses_batch(j, tr, t + nt)) nt++;
                    fn(w->n_in, &out[(size_t)t * w->n_out + r], (size_t)w->n_out, g, xq, j->xq_row[i], nt);
                    t += nt;
                } else {
                    for (int k = 0; k <= two; k++)
                        j->pack[i](w->n_in, &out[(size_t)t * w->n_out + r + k * PI2_PACK_ROWS],
                                   g + (size_t)k * PI2_PACK_ROWS * w->row_bytes, xq);
                    t++;
                }
            }
            r += two ? 2 * PI2_PACK_ROWS : PI2_PACK_ROWS;
        }
    }
}

/* Packed rows [r0, r1) (whole groups): eight rows per call of the one-token kernel for every token when none takes
 * the batch order (vec_dot's order, as that kernel's; a group stays in L1 for PACK_ONE_TOK tokens) and the type has
 * no eight-token kernel or the batch is below eight; else each group unpacked once per PACK_TOK tokens into a stack
 * buffer and computed as plain rows (the same kernels, the same results). Unpacked, SmolLM2's Q4_1 prompt ran 310
 * tokens/s at -t 1 (550 with the one-token kernel), and a batch of 2 or 3 tokens, one row at a time, cost twice
 * their decodes one by one; Qwen's Q5_0 prompt is faster on its eight-token kernel (dot8x4). */
static void packed_rows(const mm_job *j, int32_t i, int64_t r0, int64_t r1) {
    const pi2_weight *w = j->mm[i].w;
    if (!uses_batch(j, j->tr[i], 0) && !j->dot8x4[i]) {   /* token 0 is the first to take the batch order, if any */
        for (int32_t s0 = 0; s0 < j->n_tok; s0 += PACK_ONE_TOK) {
            const int32_t s1 = s0 + PACK_ONE_TOK < j->n_tok ? s0 + PACK_ONE_TOK : j->n_tok;
            for (int64_t r = r0; r < r1; r += PI2_PACK_ROWS)
                for (int32_t t = s0; t < s1; t++)
                    j->pack[i](w->n_in, &j->mm[i].out[(size_t)t * w->n_out + r], w->packed + (size_t)r * w->row_bytes,
                               j->xq[i] + (size_t)t * j->xq_row[i]);
        }
        return;
    }
    if (j->tr[i]->vec_dot_pack_batch) {
        packed_rows_batch(j, i, r0, r1);
        return;
    }
    uint8_t buf[PI2_PACK_ROWS * PI2_PACK_MAX_ROW_BYTES];
    const int64_t nb = w->n_in / j->tr[i]->block_size;
    for (int32_t s0 = 0; s0 < j->n_tok; s0 += PACK_TOK) {
        const int32_t s1 = s0 + PACK_TOK < j->n_tok ? s0 + PACK_TOK : j->n_tok;
        for (int64_t r = r0; r < r1; r += PI2_PACK_ROWS) {
            pi2_unpack_group(w->type, w->packed + (size_t)r * w->row_bytes, nb, buf, w->row_bytes);
            for (int32_t t0 = s0; t0 < s1; t0 += TILE_TOK)
                tile_rows(j, i, buf, r, r, r + PI2_PACK_ROWS, t0, t0 + TILE_TOK < s1 ? t0 + TILE_TOK : s1);
        }
    }
}

static void dot_task(void *arg, int32_t task, int32_t thread) {
    (void)thread;
    mm_job *j = arg;
    int32_t i = 0;
    while (task >= j->first_task[i + 1]) i++;
    const pi2_weight *w = j->mm[i].w;
    const int64_t r0 = (int64_t)(task - j->first_task[i]) * j->rows_per_task;
    const int64_t r1 = r0 + j->rows_per_task < w->n_out ? r0 + j->rows_per_task : w->n_out;
    float *out = j->mm[i].out;
    if (j->pack[i]) {
        packed_rows(j, i, r0, r1);
        return;
    }
    if (j->n_tok == 1 && j->rows4[i]) {   /* one token: four rows at a time, vec_dot's order per row */
        int64_t r = r0;
        for (; r + 4 <= r1; r += 4)
            j->rows4[i](w->n_in, &out[r], w->data + (size_t)r * w->row_bytes, w->row_bytes, j->xq[i]);
        for (; r < r1; r++) j->tr[i]->vec_dot(w->n_in, &out[r], w->data + (size_t)r * w->row_bytes, j->xq[i]);
        return;
    }
    for (int32_t t0 = 0; t0 < j->n_tok; t0 += TILE_TOK)
        tile_rows(j, i, w->data, 0, r0, r1, t0, t0 + TILE_TOK < j->n_tok ? t0 + TILE_TOK : j->n_tok);
}

void pi2_matmul(const pi2_matmul_env *env, const float *x, int32_t n_tok, const pi2_mm *mm, int32_t n_mm) {
    if (env->npu && env->npu_matmul(env->npu, x, n_tok, mm, n_mm) == 0) return;   /* the NNAPI delegate did it */
    mm_job j = {.mm = mm, .n_mm = n_mm, .n_tok = n_tok, .single_order = env->single_order, .x = x,
                .n_in = mm[0].w->n_in};
    uint8_t *free_xq = env->xq;
    int64_t rows = 0;
    for (int32_t i = 0; i < n_mm; i++) rows += mm[i].w->n_out;
    const int64_t n_split = (int64_t)pi2_pool_n_threads(env->pool) * TASKS_PER_THREAD;
    j.rows_per_task = (rows + n_split - 1) / n_split;
    j.rows_per_task = j.rows_per_task < MIN_ROWS ? MIN_ROWS : (j.rows_per_task + MIN_ROWS - 1) / MIN_ROWS * MIN_ROWS;
    j.first_task[0] = 0;
    for (int32_t i = 0; i < n_mm; i++) {
        j.tr[i] = pi2_traits(mm[i].w->type, env->impl);
        j.dot4x2[i] = j.tr[i]->vec_dot_batch ? NULL : pi2_kernels_dot4x2(mm[i].w->type, env->impl);
        j.dot4x4[i] = j.tr[i]->vec_dot_batch ? NULL : pi2_kernels_dot4x4(mm[i].w->type, env->impl);
        j.dot8x4[i] = j.dot4x4[i] && n_tok >= 8 ? pi2_kernels_dot8x4(mm[i].w->type, env->impl) : NULL;
        j.batch8[i] = j.tr[i]->vec_dot_batch4 ? pi2_kernels_batch8(mm[i].w->type, env->impl) : NULL;
        j.rows4[i] = pi2_kernels_dot_rows4(mm[i].w->type, env->impl);
        j.pack[i] = mm[i].w->packed ? j.tr[i]->vec_dot_pack : NULL;
        j.xq_row[i] = act_row_bytes(j.tr[i], j.n_in, env->impl);
        int32_t f = 0;
        while (f < j.n_formats && j.qtr[f]->vec_dot_type != j.tr[i]->vec_dot_type) f++;
        if (f == j.n_formats) {   /* a format not quantized yet in this group */
            j.qtr[f] = pi2_traits(j.tr[i]->vec_dot_type, env->impl);
            j.qdst[f] = free_xq;
            free_xq += (size_t)n_tok * j.xq_row[i];
            j.n_formats++;
        }
        j.xq[i] = j.qdst[f];
        j.first_task[i + 1] = j.first_task[i] + (int32_t)((mm[i].w->n_out + j.rows_per_task - 1) / j.rows_per_task);
    }
    for (int32_t i = 0; i < n_mm; i++) {   /* dot8x4's own rows, after all quantized rows */
        j.xw[i] = j.xq[i];
        j.xw_row[i] = j.xq_row[i];
        if (!j.dot8x4[i]) continue;
        int32_t bb;
        if (!pi2_kernels_dot8x4_prep(mm[i].w->type, env->impl, &bb)) continue;
        int32_t k = 0;
        while (k < i && mm[k].w->type != mm[i].w->type) k++;
        j.xw_row[i] = (size_t)(j.n_in / 32) * (size_t)bb;
        if (k < i) { j.xw[i] = j.xw[k]; continue; }   /* made for mm[k] */
        j.prep[i] = pi2_kernels_dot8x4_prep(mm[i].w->type, env->impl, &bb);
        j.xw[i] = free_xq;
        free_xq += (size_t)n_tok * j.xw_row[i];
    }
    if (n_tok == 1) quantize_task(&j, 0, 0);
    else pi2_pool_run(env->pool, quantize_task, &j, n_tok);
    pi2_pool_run(env->pool, dot_task, &j, j.first_task[n_mm]);
}

void pi2_dot_row_list(const pi2_weight *w, int32_t impl, const uint8_t *base, const int32_t *idx, int32_t k0,
                      int32_t k1, float *out, const void *xq) {
    const pi2_type_traits *tr = pi2_traits(w->type, impl);
    const pi2_vec_dot_rows4_fn rows4 = pi2_kernels_dot_rows4(w->type, impl);   /* vec_dot's order */
    for (int32_t k = k0; k < k1;) {
        const uint8_t *row = base + (size_t)idx[k] * w->row_bytes;
        if (rows4 && k + 4 <= k1 && idx[k + 3] == idx[k] + 3) {
            rows4(w->n_in, &out[k], row, w->row_bytes, xq);
            k += 4;
        } else {
            tr->vec_dot(w->n_in, &out[k], row, xq);
            k++;
        }
    }
}
