/* moe_mm.c — the products of a PI2_ARCH_MOE model, in the kernel ggml's x86 CPU backend runs for each
 * (pi2/reference/moe_matmul.py): dense weights (ggml_mul_mat) by pi2_moe_matmul, the experts (ggml_mul_mat_id) by
 * pi2_moe_experts, each expert's rows read once per step for all the rows routed to it.
 * Kernels: F32/F16 ggml_vec_dot for one token and every expert row, tinyBLAS for batches (kernels/ggml_order.c);
 * Q4_0 the repacked GEMV (experts copied at load into the x8 layout by moe_pack.c: its kernel, four rows of an
 * expert's batch per pass; experts in the file's layout: eight plain rows at a time); Q4_K, Q6_K and Q8_0 experts
 * repacked the same way: vec_dot's order on the packed groups (Q4_K four of an expert's batch rows per pass over an
 * 8-row group, kernels/x86_pack_k_gemv_body.h), in the file's layout vec_dot four rows at a time; Q6_K experts the
 * tiled kernel from 8 rows (packed: four rows per pass); every other type its vec_dot (pi2_matmul for dense
 * weights, which picks the batch kernels as ggml does). Threads split output rows only. */
#include "ffn/moe.h"
#include "kernels/ggml_order.h"
#include "kernels/ggml_x8.h"
#include "kernels/pack.h"

#include <string.h>

enum { KIND_F32, KIND_F16, KIND_Q4_0, KIND_VEC };
enum { ROWS_PER_TASK = 16 };   /* dense products; the experts' tasks are cut by pi2_moe_experts */

static int kind_of(const pi2_weight *w) {
    if (w->type == PI2_T_F32) return KIND_F32;
    if (w->type == PI2_T_F16) return KIND_F16;
    if (w->type == PI2_T_Q4_0 && w->n_out % 8 == 0) return KIND_Q4_0;
    return KIND_VEC;
}

typedef struct {
    pi2_ctx *c;
    const float *x;
    int32_t n;
    int64_t n_in;
    int32_t type;
} prep_job;

static void prep_task(void *arg, int32_t r, int32_t thread) {
    (void)thread;
    const prep_job *j = arg;
    struct pi2_moe *moe = j->c->moe;
    const float *x = j->x + (size_t)r * j->n_in;
    uint8_t *dst = moe->xa + (size_t)r * moe->xa_row;
    if (j->type == PI2_T_F32) {
        memcpy(dst, x, (size_t)j->n_in * sizeof(float));
    } else if (j->type == PI2_T_F16) {
        float *h = (float *)dst;
        for (int64_t i = 0; i < j->n_in; i++) h[i] = pi2_fp16_to_f32(pi2_f32_to_fp16(x[i]));
    } else {
        const pi2_type_traits *t = pi2_traits(j->type, j->c->p.impl);
        pi2_traits(t->vec_dot_type, j->c->p.impl)->quantize_act(x, dst, j->n_in);
    }
}

void pi2_moe_prep(pi2_ctx *c, int32_t type, const float *x, int32_t n_rows, int64_t n) {
    prep_job j = {c, x, n_rows, n, type};
    c->moe->xa_row = pi2_moe_act_bytes(type, n);   /* tight rows: moe.c sized xa for the widest prep */
    if (n_rows == 1) prep_task(&j, 0, 0);
    else pi2_pool_run(c->pool, prep_task, &j, n_rows);
}

/* ---------------------------------------------------------------- dense weights */

typedef struct {
    pi2_ctx *c;
    const pi2_weight *w;
    float *out;
    int32_t n_tok, kind, tiny;
    pi2_go_rows8_fn rows8;
} dense_job;

static void dense_task(void *arg, int32_t task, int32_t thread) {
    (void)thread;
    const dense_job *j = arg;
    const pi2_weight *w = j->w;
    const struct pi2_moe *moe = j->c->moe;
    const int64_t r0 = (int64_t)task * ROWS_PER_TASK, r1 = r0 + ROWS_PER_TASK < w->n_out ? r0 + ROWS_PER_TASK : w->n_out;
    for (int32_t t = 0; t < j->n_tok; t++) {
        const uint8_t *xa = moe->xa + (size_t)t * moe->xa_row;
        float *o = j->out + (size_t)t * w->n_out;
        int64_t r = r0;
        if (j->kind == KIND_Q4_0 && j->rows8)
            for (; r + 8 <= r1; r += 8)
                j->rows8(w->n_in, &o[r], w->data + (size_t)r * w->row_bytes, w->row_bytes, (const blk_q8_0 *)xa);
        for (; r < r1; r++) {
            const uint8_t *row = w->data + (size_t)r * w->row_bytes;
            if (j->kind == KIND_F32)
                o[r] = j->tiny ? pi2_go_tinyblas_f32(w->n_in, (const float *)row, (const float *)xa)
                               : pi2_go_dot_f32(w->n_in, (const float *)row, (const float *)xa);
            else if (j->kind == KIND_F16)
                o[r] = j->tiny ? pi2_go_tinyblas_f16(w->n_in, (const pi2_fp16 *)row, (const float *)xa)
                               : pi2_go_dot_f16(w->n_in, (const pi2_fp16 *)row, (const float *)xa);
            else
                o[r] = pi2_go_dot_q4_0(w->n_in, (const blk_q4_0 *)row, (const blk_q8_0 *)xa);
        }
    }
}

void pi2_moe_matmul(pi2_ctx *c, const float *x, int32_t n_tok, const pi2_mm *mm, int32_t n_mm) {
    pi2_mm rest[4];
    int32_t n_rest = 0;
    for (int32_t i = 0; i < n_mm; i++) {
        const pi2_weight *w = mm[i].w;
        const int kind = kind_of(w);
        if (kind == KIND_VEC) {
            rest[n_rest++] = mm[i];
            continue;
        }
        pi2_moe_prep(c, w->type, x, n_tok, w->n_in);
        dense_job j = {c, w, mm[i].out, n_tok, kind, pi2_go_tinyblas_ok(n_tok, w->n_out, w->n_in),
                       kind == KIND_Q4_0 ? pi2_go_q4_0_rows8() : NULL};
        const int32_t n_tasks = (int32_t)((w->n_out + ROWS_PER_TASK - 1) / ROWS_PER_TASK);
        if (n_tasks == 1) dense_task(&j, 0, 0);
        else pi2_pool_run(c->pool, dense_task, &j, n_tasks);
    }
    if (n_rest) pi2_matmul(&c->mm, x, n_tok, rest, n_rest);
}

/* ---------------------------------------------------------------- experts */

typedef struct {
    pi2_ctx *c;
    const pi2_weight *const *w;
    float *const *out;
    int32_t n_w, by_token, tasks_per_expert;
    pi2_go_x8_fn x8;
} expert_job;

/* Rows r0..r1 (whole 8-row groups) of an x8 expert for its cnt rows of the batch, four at a time. */
static void expert_x8(const struct pi2_moe *moe, pi2_go_x8_fn x8, const pi2_weight *w, const uint8_t *base,
                      int64_t r0, int64_t r1, const int32_t *ids, int32_t cnt, int32_t by_token, float *out) {
    const blk_q8_0 *x[PI2_X8_MAX_TOK];
    float *s[PI2_X8_MAX_TOK];
    for (int32_t i = 0; i < cnt; i += PI2_X8_MAX_TOK) {
        const int32_t nt = cnt - i < PI2_X8_MAX_TOK ? cnt - i : PI2_X8_MAX_TOK;
        for (int32_t t = 0; t < nt; t++) {
            const int32_t id = ids[i + t];
            x[t] = (const blk_q8_0 *)(moe->xa + (size_t)(by_token ? id / moe->k : id) * moe->xa_row);
            s[t] = out + (size_t)id * w->n_out + r0;
        }
        x8(w->n_in, base + (size_t)r0 * w->row_bytes, (r1 - r0) / PI2_PACK_ROWS, nt, x, s);
    }
}

/* Rows r0..r1 (whole 8-row groups) of a packed Q4_K, Q6_K or Q8_0 expert for its cnt rows of the batch, each row
 * in the order ggml's mul_mat_id gives it: Q6_K from 8 rows the tiled order (`batch`, pi2_uses_batch_dot: up to
 * four rows per pass by the table's vec_dot_pack_batch), else vec_dot's order; Q4_K up to PACK_N rows of the batch
 * per pass over a group (pack_n); else the table's one-token packed kernel. Rows computed PACK_N at a time have
 * their activations copied side by side. Where the table has no packed kernel (the reference table) each group is
 * unpacked once and its rows read by vec_dot (or vec_dot_batch). */
enum { PACK_N = 4, PACK_N_ACT = PI2_PACK_MAX_ROW_BYTES / sizeof(blk_q4_K) * sizeof(blk_q8_K) };

static void expert_packed(const struct pi2_moe *moe, const pi2_type_traits *tr, pi2_vec_dot_pack4_fn pack_n,
                          const pi2_weight *w, const uint8_t *base, int64_t r0, int64_t r1, const int32_t *ids,
                          int32_t cnt, int32_t by_token, float *out) {
#define XA(id) (moe->xa + (size_t)(by_token ? (id) / moe->k : (id)) * moe->xa_row)
    const pi2_type_traits *a = pi2_traits(tr->vec_dot_type, PI2_K_IMPL_REF);
    const size_t xr = (size_t)(w->n_in / a->block_size) * (size_t)a->type_size;
    const int batch = w->type != PI2_T_Q4_K && pi2_uses_batch_dot(tr, cnt, 0);   /* Q4_K: the GEMV only */
    const pi2_vec_dot_pack4_fn n_fn = batch ? tr->vec_dot_pack_batch : pack_n;
    if (n_fn && cnt > 1 && xr <= PACK_N_ACT) {
        uint8_t xs[PACK_N * PACK_N_ACT];
        float s[PACK_N][PI2_PACK_ROWS];
        for (int32_t i = 0; i < cnt; i += PACK_N) {
            const int32_t nt = cnt - i < PACK_N ? cnt - i : PACK_N;
            for (int32_t t = 0; t < nt; t++) memcpy(xs + (size_t)t * xr, XA(ids[i + t]), xr);
            for (int64_t r = r0; r < r1; r += PI2_PACK_ROWS) {
                n_fn(w->n_in, &s[0][0], PI2_PACK_ROWS, base + (size_t)r * w->row_bytes, xs, xr, nt);
                for (int32_t t = 0; t < nt; t++) memcpy(out + (size_t)ids[i + t] * w->n_out + r, s[t], sizeof s[t]);
            }
        }
        return;
    }
    const pi2_vec_dot_fn dot = batch ? tr->vec_dot_batch : tr->vec_dot;
    const pi2_vec_dot_pack_fn one = batch ? NULL : tr->vec_dot_pack;
    uint8_t buf[PI2_PACK_ROWS * PI2_PACK_MAX_ROW_BYTES];
    for (int64_t r = r0; r < r1; r += PI2_PACK_ROWS) {
        const uint8_t *g = base + (size_t)r * w->row_bytes;
        if (!one) pi2_unpack_group(w->type, g, w->n_in / tr->block_size, buf, w->row_bytes);
        for (int32_t i = 0; i < cnt; i++) {
            float *o = out + (size_t)ids[i] * w->n_out + r;
            if (one) one(w->n_in, o, g, XA(ids[i]));
            else
                for (int q = 0; q < PI2_PACK_ROWS; q++) dot(w->n_in, &o[q], buf + (size_t)q * w->row_bytes, XA(ids[i]));
        }
    }
#undef XA
}

static void expert_task(void *arg, int32_t task, int32_t thread) {
    (void)thread;
    const expert_job *j = arg;
    const struct pi2_moe *moe = j->c->moe;
    const int32_t e = moe->active[task / j->tasks_per_expert], first = moe->start[e], cnt = moe->count[e];
    const int32_t k = moe->k;
    for (int32_t m = 0; m < j->n_w; m++) {
        const pi2_weight *w = j->w[m];
        const int kind = kind_of(w);
        const pi2_type_traits *tr = pi2_traits(w->type, j->c->p.impl);
        const pi2_vec_dot_fn dot = kind == KIND_VEC && tr->vec_dot_batch && w->type != PI2_T_Q4_K &&
                                   pi2_uses_batch_dot(tr, cnt, 0) ? tr->vec_dot_batch : tr->vec_dot;
        const pi2_vec_dot_rows4_fn rows4 = dot == tr->vec_dot ? pi2_kernels_dot_rows4(w->type, j->c->p.impl) : NULL;
        const pi2_go_rows8_fn rows8 = kind == KIND_Q4_0 ? pi2_go_q4_0_rows8() : NULL;
        const int64_t n_out = w->n_out;
        const int64_t ti = task % j->tasks_per_expert, tpe = j->tasks_per_expert;   /* range ti of tpe, whole groups */
        const int64_t r0 = n_out / 8 * ti / tpe * 8, r1 = ti + 1 == tpe ? n_out : n_out / 8 * (ti + 1) / tpe * 8;
        int x8;
        const uint8_t *base = pi2_moe_expert_rows(moe, w, e, &x8);
        float *out = j->out[m];
        if (x8 && w->type == PI2_T_Q4_0) {
            expert_x8(moe, j->x8, w, base, r0, r1, moe->list + first, cnt, j->by_token, out);
            continue;
        }
        if (x8) {
            expert_packed(moe, tr, pi2_kernels_dot_pack_n(w->type, j->c->p.impl), w, base, r0, r1, moe->list + first,
                          cnt, j->by_token, out);
            continue;
        }
        for (int32_t i = 0; i < cnt; i++) {
            const int32_t id = moe->list[first + i];
            const uint8_t *xa = moe->xa + (size_t)(j->by_token ? id / k : id) * moe->xa_row;
            float *o = out + (size_t)id * n_out;
            int64_t r = r0;
            if (kind == KIND_Q4_0 && rows8)
                for (; r + 8 <= r1; r += 8)
                    rows8(w->n_in, &o[r], base + (size_t)r * w->row_bytes, w->row_bytes, (const blk_q8_0 *)xa);
            if (kind == KIND_Q4_0)
                for (; r + 4 <= r1; r += 4)
                    pi2_go_dot_q4_0_rows4(w->n_in, &o[r], base + (size_t)r * w->row_bytes, w->row_bytes, (const blk_q8_0 *)xa);
            else if (rows4)
                for (; r + 4 <= r1; r += 4) rows4(w->n_in, &o[r], base + (size_t)r * w->row_bytes, w->row_bytes, xa);
            for (; r < r1; r++) {
                const uint8_t *row = base + (size_t)r * w->row_bytes;
                if (kind == KIND_F32) o[r] = pi2_go_dot_f32(w->n_in, (const float *)row, (const float *)xa);
                else if (kind == KIND_F16) o[r] = pi2_go_dot_f16(w->n_in, (const pi2_fp16 *)row, (const float *)xa);
                else if (kind == KIND_Q4_0) o[r] = pi2_go_dot_q4_0(w->n_in, (const blk_q4_0 *)row, (const blk_q8_0 *)xa);
                else dot(w->n_in, &o[r], row, xa);
            }
        }
    }
}

/* Each expert's rows are cut into one contiguous range per thread (whole 8-row groups), claimed like any task: a
 * thread streams long runs of an expert's bytes, as ggml's mul_mat_id splits them, and a step claims few tasks. Small
 * tasks (64 rows) interleaved the threads' reads and cost a shared line's round trip per claim: decode at -t 2 ran
 * about a quarter slower. The tasks stay dynamic, so a thread kept off its core still only delays its own range. */
void pi2_moe_experts(pi2_ctx *c, const pi2_weight *const *w, float *const *out, int32_t n_w, int32_t by_token) {
    const int64_t n_groups = w[0]->n_out / 8 > 0 ? w[0]->n_out / 8 : 1;
    const int32_t n_threads = pi2_pool_n_threads(c->pool);
    expert_job j = {c, w, out, n_w, by_token, (int32_t)(n_threads < n_groups ? n_threads : n_groups), pi2_go_q4_0_x8()};
    pi2_pool_run(c->pool, expert_task, &j, c->moe->n_active * j.tasks_per_expert);
}
