/* forward.h — what the forward steps share (internal): per-row work of a batch on the pool (forward_rows.c), the
 * small vector steps between the matrix products, and the context shift (kv_shift.c).
 * Used by forward.c (pi2_decode) and decode_multi.c (pi2_decode_multi). */
#ifndef PI2_FORWARD_H
#define PI2_FORWARD_H
#include "context.h"
#include "ops.h"

/* Per-row work of a prompt batch, split over the pool in tasks of whole rows (each row is computed
 * the same way whichever thread runs it); a single token's rows run inline (no pool job). */
typedef struct rows_job rows_job;
struct rows_job {
    void (*row)(const rows_job *j, int64_t r);
    pi2_ctx *c;
    const pi2_layer *L;
    float *y;
    const float *x, *w;
    int64_t n;                /* values per row (norms) */
    int32_t il;               /* layer (store_kv_row) */
    int64_t rows_per_task, n_rows;
};

/* j.row(r) for r < n_rows, of a batch of n_tok tokens (on the pool when n_tok > 1). */
void for_rows(pi2_ctx *c, int32_t n_tok, rows_job j, int64_t n_rows);
/* y[r] = rmsnorm(x[r]) * w for n_rows rows of n values (of a batch of n_tok tokens) */
void norm_rows(pi2_ctx *c, int32_t n_tok, float *y, const float *x, const float *w, int64_t n_rows, int64_t n);

static inline void add_rows(float *x, const float *b, int64_t n_rows, int64_t n) {   /* x[r] += b */
    for (int64_t r = 0; r < n_rows; r++)
        for (int64_t i = 0; i < n; i++) x[r * n + i] += b[i];
}

static inline void add(float *x, const float *y, int64_t n) {
    for (int64_t i = 0; i < n; i++) x[i] += y[i];
}

static inline void scale(float *x, int64_t n, float s) {
    for (int64_t i = 0; i < n; i++) x[i] *= s;
}

/* x[t] = row tokens[t] of token_embd, times embd_scale. */
void embed(pi2_ctx *c, const int32_t *tokens, int32_t n);
/* Row t of the cos/sin tables for both RoPE bases: position pos; rope_tables: rows 0..n-1, positions pos0... */
void rope_table_row(pi2_ctx *c, int32_t t, int32_t pos);
void rope_tables(pi2_ctx *c, int32_t pos0, int32_t n);
/* rows_job rows: token t's query and key heads rotated in place; token t's k and v stored at position n_past + t
 * of layer j->il; token t's FFN activation (gate = act(gate) * up). */
void rope_row(const rows_job *j, int64_t t);
void store_kv_row(const rows_job *j, int64_t t);
void activate_row(const rows_job *j, int64_t t);
/* One token's k and v at cell pos of layer il of c's cache. */
void store_kv(pi2_ctx *c, int32_t il, size_t pos, const float *kr, const float *vr);
/* The attention of n_tok queries q at positions pos0.. over layer il of context d's cache (F16 or quantized K, flash
 * attention and its V as d has them) into out, with c's scratch: d is c but in a multi-context step. .rows unset. */
pi2_attn attn_over(const pi2_ctx *c, const pi2_ctx *d, const pi2_layer *L, int32_t il, const float *q, float *out,
                   int32_t n_tok, int32_t pos0);

/* kv_shift.c: llama.cpp's context shift, positions n_keep .. n_keep+n_discard-1 dropped. */
void kv_shift(pi2_ctx *c, int32_t n_keep, int32_t n_discard);
/* kv_rows.c: the F16 keys' rows spaced for `need` positions (moved apart when they are closer: before a decode); back
 * to the closest spacing when the context is empty. */
void kv_rows_fit(pi2_ctx *c, int32_t need);
void kv_rows_reset(pi2_ctx *c);

#endif
