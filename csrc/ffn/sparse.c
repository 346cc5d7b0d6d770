/* ffn/sparse.c — the FFN of one layer when a token computes only its active neurons, or when the
 * layer's down projection is stored as rows (pi2 bundles, PowerInfer's ffn_down_t).
 * Does: gate rows for every neuron (one token under the predicted rule: of the predicted ones only,
 *       ffn/predicted.c; under PowerInfer's predictor: of the active ones only, ffn/pwri.c);
 *       the active set of each token by the context's rule (ffn/select.c);
 *       up rows of the active neurons only; h = act(gate)·up with zeros elsewhere;
 *       then down as the dense product of h, or as the grouped sum over down rows (pi2.h tells the
 *       float order; pi2/reference/sparse_ffn.py is the specification). Counts active neurons per layer.
 *       In a streamed context the read pipeline (csrc/pipeline/) brings the bytes: one token computes each
 *       group as its clusters become present (the same group task as mapped rows, with the rows' addressing
 *       passed in); a batch gets each layer's bundles read whole and runs the same code on them (and streamed
 *       gate rows, whenever all are needed). In memory, one token reads a pi2 file's copies instead where
 *       ffn/down_pack.c made them: Q4_1/Q5_1 down rows per group (kernels/axpy_qx1_pack.h), up rows back to back.
 * Does not: read or decide what to read (the pipeline); it only tells the pipeline which parts it reads unit by
 *       unit (pi2_ffn_unit_parts).
 * Determinism: every up value is computed in vec_dot's order (vec_dot, the four-row kernel, or the tiled
 *       product for batches, which keep it), every output element one fixed sequence of float operations,
 *       whichever thread runs it, wherever the bytes live. */
#include "ffn/sparse.h"

#include "context.h"
#include "ffn/gate_rows.h"
#include "ffn/predicted.h"
#include "ffn/pwri.h"
#include "ffn/select.h"
#include "internal.h"
#include "kernels/axpy_qx1_pack.h"
#include "nnapi/hot_ffn.h"
#include "ops.h"
#include "pipeline/pipeline.h"

#include <string.h>

#define UP_CHUNK 32      /* active up rows per task of a single token */
#define PREFETCH 4       /* neurons ahead whose rows a group task prefetches */
#define DOWN_SLICE 128   /* output values per task of a batch's down-row sums */

typedef struct {
    pi2_ctx *c;
    const pi2_layer *L;
    int32_t il, n_tok;
    int64_t n_ff, n_embd;
    const pi2_type_traits *up_tr;
    pi2_vec_dot_rows4_fn up_rows4;     /* four up rows x one token in vec_dot's order, or NULL */
    pi2_vec_dot_rows4p_fn up_rows4p;   /* the same on four rows anywhere: with the tight up rows, else NULL */
    size_t xq_row;
    int64_t slice;               /* down rows: output values per task */
    size_t up_bytes, down_bytes; /* bytes of one up row and one down row */
    /* one token over down rows: where the rows are (pi2_rows) and their file offsets of neuron 0 (0: at base) */
    pi2_rows up_rows, down_rows;
    int64_t up0, down0;
    const int32_t *groups;       /* the pipeline's ready groups (task -> group), or NULL: task = group */
    pi2_axpy_qx1p_fn down_qx1p;  /* mapped rows with a packed copy (L->down_qx1p): its kernel, else NULL */
    size_t qx1p_bytes;           /* bytes of one packed group */
    int64_t up_stride;           /* bytes from one up row to the next (the bundle's, or L->up_tight's) */
    int32_t prefix;              /* up values of neurons [0, prefix) already in c->up (L->up_x8, with the gate) */
} ffn_job;

/* ---- the active set (ffn/select.c) ---- */

static void select_task(void *arg, int32_t t, int32_t thread) {
    (void)thread;
    const ffn_job *j = arg;
    pi2_ffn_select(j->c, j->il, t);
}

/* ---- up rows of the active neurons ---- */

static void quantize_task(void *arg, int32_t t, int32_t thread) {
    (void)thread;
    const ffn_job *j = arg;
    const pi2_type_traits *a = pi2_traits(j->up_tr->vec_dot_type, j->c->p.impl);
    a->quantize_act(j->c->xn + (size_t)t * j->n_embd, j->c->ffn_xq + (size_t)t * j->xq_row, j->n_embd);
}

static void up_rows(const ffn_job *j, int32_t t, int32_t k0, int32_t k1) {
    const pi2_ctx *c = j->c;
    const pi2_weight *w = &j->L->up;
    const int32_t *idx = c->ffn_idx + (size_t)t * j->n_ff;
    const uint8_t *xq = c->ffn_xq + (size_t)t * j->xq_row;
    float *u = c->up + (size_t)t * j->n_ff;
    const pi2_vec_dot_fn dot = pi2_uses_batch_dot(j->up_tr, j->n_tok, t) ? j->up_tr->vec_dot_batch : j->up_tr->vec_dot;
    for (int32_t k = k0; k < k1; k++)
        dot(w->n_in, &u[idx[k]], w->data + (size_t)idx[k] * w->row_bytes, xq);
}

static void up_task_one(void *arg, int32_t task, int32_t thread) {   /* one token: chunks of its list */
    (void)thread;
    const ffn_job *j = arg;
    const int32_t n = j->c->ffn_n_active[0], k0 = task * UP_CHUNK;
    up_rows(j, 0, k0, k0 + UP_CHUNK < n ? k0 + UP_CHUNK : n);
}

/* h[t] = act(gate)·up on the active neurons, 0 elsewhere (into the gate buffer). */
static void combine_task(void *arg, int32_t t, int32_t thread) {
    (void)thread;
    const ffn_job *j = arg;
    pi2_ctx *c = j->c;
    const int64_t F = j->n_ff;
    const float *s = c->ffn_score + (size_t)t * F, *u = c->up + (size_t)t * F;
    const int32_t *idx = c->ffn_idx + (size_t)t * F;
    float *h = c->gate + (size_t)t * F;
    memset(h, 0, (size_t)F * sizeof *h);
    const int32_t n = c->ffn_n_active[t], act = c->m->hp.ffn_act;
    if (c->ffn.score_up)
        for (int32_t k = 0; k < n; k++) h[idx[k]] = s[idx[k]];
    else
        for (int32_t k = 0; k < n; k++) h[idx[k]] = s[idx[k]] * pi2_ffn_up_factor(u[idx[k]], act);
}

/* ---- down as rows: y = Σ over groups of (Σ over the group's active neurons of h_i·row_i) ---- */

/* int8 rows (I8) keep a float scale per row and per column outside the rows: their kernel takes
 * p_i = h_i·scale_i, and the summed output is multiplied by the column scales */
static inline void row_scales(const pi2_layer *L, float *hg, const int32_t *idx, int32_t k) {
    if (L->down_scale)
        for (int32_t i = 0; i < k; i++) hg[i] *= L->down_scale[idx[i]];
}

static void down_rows_task(void *arg, int32_t task, int32_t thread) {
    (void)thread;
    const ffn_job *j = arg;
    const pi2_ctx *c = j->c;
    const pi2_weight *w = &j->L->down_rows;
    const pi2_type_traits *tr = pi2_traits(w->type, c->p.impl);
    const int64_t j0 = task * j->slice, j1 = j0 + j->slice < j->n_embd ? j0 + j->slice : j->n_embd;
    const uint8_t *rows = w->data + (size_t)(j0 / tr->block_size) * (size_t)tr->type_size;
    float hg[PI2_FFN_GROUP];
    for (int32_t t = 0; t < j->n_tok; t++) {   /* every token over this slice: its rows' slice stays cached */
        const int32_t *idx = c->ffn_idx + (size_t)t * j->n_ff, n = c->ffn_n_active[t];
        const float *h = c->gate + (size_t)t * j->n_ff;
        float *y = c->o + (size_t)t * j->n_embd + j0;
        for (int64_t e = 0; e < j1 - j0; e++) y[e] = 0.0f;
        for (int32_t k = 0; k < n;) {   /* one group of neurons at a time */
            const int32_t group = idx[k] / PI2_FFN_GROUP, k0 = k;
            for (; k < n && idx[k] / PI2_FFN_GROUP == group; k++) hg[k - k0] = h[idx[k]];
            row_scales(j->L, hg, idx + k0, k - k0);
            tr->axpy_group(j1 - j0, y, rows, w->row_bytes, idx + k0, hg, k - k0);
        }
        if (j->L->down_colscale)
            for (int64_t e = 0; e < j1 - j0; e++) y[e] *= j->L->down_colscale[j0 + e];
    }
}

/* ---- one token over down rows: each group's up rows, h and partial sum together, then the sum ---- */

/* One group of the token's active neurons: up rows, h, then the group's partial sum. Rows are found through
 * j->up_rows / j->down_rows, mapped or in the neuron cache's slots (the four-row kernel on four neighbours of one
 * cluster: consecutive records); streamed rows go to axpy_group as byte offsets from the arena (row_bytes 1), so
 * one call still covers the whole group in the same order. */
static void group_task(void *arg, int32_t task, int32_t thread) {
    (void)thread;
    const ffn_job *j = arg;
    const pi2_ctx *c = j->c;
    const int32_t g = j->groups ? j->groups[task] : task;
    const int32_t k0 = c->ffn_group_start[g], k = c->ffn_group_start[g + 1] - k0;
    if (!k) return;
    const pi2_weight *up = &j->L->up, *down = &j->L->down_rows;
    const pi2_rows *ur = &j->up_rows, *dr = &j->down_rows;
    const int32_t *idx = c->ffn_idx + k0, cluster = ur->cluster;
    const int64_t us = j->up_stride, ds = (int64_t)down->row_bytes;
    const float *s = c->ffn_score;
    const int32_t act = c->m->hp.ffn_act;
    float hg[PI2_FFN_GROUP], *part = c->ffn_part + (size_t)g * j->n_embd;
    int32_t off[PI2_FFN_GROUP], i0 = 0;
    for (; i0 < k && idx[i0] < j->prefix; i0++)   /* the dense prefix's up values: computed with the gate rows */
        hg[i0] = s[idx[i0]] * pi2_ffn_up_factor(c->up[idx[i0]], act);
    for (int32_t i = i0, pf = i0; i < k;) {   /* up row, then h, as up_rows and combine_task compute them */
        const int four = j->up_rows4 && i + 4 <= k && idx[i + 3] == idx[i] + 3 && idx[i] / cluster == idx[i + 3] / cluster;
        const int any4 = !four && j->up_rows4p && i + 4 <= k, step = four || any4 ? 4 : 1;
        for (const int32_t end = i + step + PREFETCH < k ? i + step + PREFETCH : k; pf < end; pf++) {
            const uint8_t *u = pi2_row_at(ur, idx[pf], j->up0 + idx[pf] * us);      /* scattered rows defeat the */
            const uint8_t *d = pi2_row_at(dr, idx[pf], j->down0 + idx[pf] * ds);    /* hardware prefetcher: ask */
            for (size_t o = 0; o < j->up_bytes; o += 64) __builtin_prefetch(u + o);   /* PREFETCH ahead */
            for (size_t o = 0; o < j->down_bytes && !j->down_qx1p; o += 64) __builtin_prefetch(d + o);
        }
        const uint8_t *row = pi2_row_at(ur, idx[i], j->up0 + idx[i] * us);
        if (dr->delta) off[i] = (int32_t)(pi2_row_at(dr, idx[i], j->down0 + idx[i] * ds) - dr->base);
        if (four) {   /* four neighbours: the four-row kernel */
            float u4[4];
            j->up_rows4(up->n_in, u4, row, (size_t)us, c->ffn_xq);
            for (int r = 0; r < 4; r++, i++) {
                hg[i] = s[idx[i]] * pi2_ffn_up_factor(u4[r], act);
                if (dr->delta) off[i] = off[i - r] + (int32_t)(r * ds);
            }
            continue;
        }
        if (any4) {   /* four active neurons anywhere in the tight copy: the four-row kernel on their rows */
            const uint8_t *at[4];
            float u4[4];
            for (int r = 0; r < 4; r++) at[r] = pi2_row_at(ur, idx[i + r], j->up0 + idx[i + r] * us);
            j->up_rows4p(up->n_in, u4, at, c->ffn_xq);
            for (int r = 0; r < 4; r++, i++) hg[i] = s[idx[i]] * pi2_ffn_up_factor(u4[r], act);
            continue;
        }
        float u;
        j->up_tr->vec_dot(up->n_in, &u, row, c->ffn_xq);
        hg[i] = s[idx[i]] * pi2_ffn_up_factor(u, act);
        i++;
    }
    memset(part, 0, (size_t)j->n_embd * sizeof *part);
    if (j->down_qx1p) {   /* the packed copy: rows by their place in the group */
        for (int32_t i = 0; i < k; i++) off[i] = idx[i] - g * PI2_FFN_GROUP;
        j->down_qx1p(j->n_embd, part, j->L->down_qx1p + (size_t)g * j->qx1p_bytes, off, hg, k);
        return;
    }
    row_scales(j->L, hg, idx, k);
    const pi2_type_traits *dt = pi2_traits(down->type, c->p.impl);
    if (dr->delta) dt->axpy_group(j->n_embd, part, dr->base, 1, off, hg, k);
    else dt->axpy_group(j->n_embd, part, dr->base + j->down0, down->row_bytes, idx, hg, k);
}

/* y = the groups' partial sums added in group order (a slice of the columns per task) */
static void reduce_task(void *arg, int32_t task, int32_t thread) {
    (void)thread;
    const ffn_job *j = arg;
    const pi2_ctx *c = j->c;
    const int64_t j0 = task * j->slice, j1 = j0 + j->slice < j->n_embd ? j0 + j->slice : j->n_embd;
    const int32_t n_groups = (int32_t)((j->n_ff + PI2_FFN_GROUP - 1) / PI2_FFN_GROUP);
    float *y = c->o;
    for (int64_t e = j0; e < j1; e++) y[e] = 0.0f;
    for (int32_t g = 0; g < n_groups; g++) {
        if (c->ffn_group_start[g + 1] == c->ffn_group_start[g]) continue;
        const float *p = c->ffn_part + (size_t)g * j->n_embd;
        for (int64_t e = j0; e < j1; e++) y[e] += p[e];
    }
    if (j->L->down_colscale)   /* int8 rows: their column scales, once the groups are summed */
        for (int64_t e = j0; e < j1; e++) y[e] *= j->L->down_colscale[e];
}

int32_t pi2_ffn_group_starts(pi2_ctx *c, const int32_t *idx, int32_t n) {
    const int32_t n_groups = (int32_t)((c->m->hp.n_ff + PI2_FFN_GROUP - 1) / PI2_FFN_GROUP);
    for (int32_t g = 0, k = 0; g <= n_groups; g++) {
        while (k < n && idx[k] < g * PI2_FFN_GROUP) k++;
        c->ffn_group_start[g] = k;
    }
    return n_groups;
}

static pi2_status one_token_rows(pi2_ctx *c, ffn_job *j) {
    const int32_t n = c->ffn_n_active[0], *idx = c->ffn_idx;
    const int32_t n_groups = pi2_ffn_group_starts(c, idx, n);   /* where each group's active neurons start */
    const pi2_weight *up = &j->L->up, *down = &j->L->down_rows;
    quantize_task(j, 0, 0);
    const pi2_type_traits *ut = pi2_traits(up->type, c->p.impl), *dt = pi2_traits(down->type, c->p.impl);
    j->up_bytes = (size_t)(j->n_embd / ut->block_size) * (size_t)ut->type_size;
    j->down_bytes = (size_t)(j->n_embd / dt->block_size) * (size_t)dt->type_size;
    j->up_rows = (pi2_rows){.base = up->data, .cluster = PI2_FFN_GROUP};
    j->down_rows = (pi2_rows){.base = down->data, .cluster = PI2_FFN_GROUP};
    j->up0 = j->down0 = 0;
    j->groups = NULL;
    j->down_qx1p = j->L->down_qx1p ? pi2_kernels_axpy_qx1p(down->type, c->p.impl) : NULL;
    j->qx1p_bytes = pi2_qx1p_group_bytes(down->type, j->n_embd / 32);
    j->up_stride = (int64_t)up->row_bytes;
    j->up_rows4p = NULL;
    if (j->down_qx1p && j->L->up_tight) {   /* in memory: the copies (ffn/down_pack.c) */
        j->up_rows.base = j->L->up_tight;
        j->up_stride = (int64_t)j->up_bytes;
        j->up_rows4p = pi2_kernels_dot_rows4p(up->type, c->p.impl);
    }
    if (!j->down_qx1p || !j->L->up_tight) j->prefix = 0;   /* (only the copies have one) */
    if (c->pipeline && pi2_pipeline_by_units(c->pipeline, PI2_PART_BUNDLES)) {
        j->down_qx1p = NULL;   /* rows in the neuron cache's slots */
        j->prefix = 0;
        j->up_rows4p = NULL;
        j->up_stride = (int64_t)up->row_bytes;
        /* hits and the hot prefix while the misses are read, then groups as their reads land */
        j->up_rows = j->down_rows = pi2_pipeline_rows(c->pipeline, PI2_PART_BUNDLES);
        j->up0 = up->data - c->m->map;   /* file offsets: the mapping's bundles are never read */
        j->down0 = down->data - c->m->map;
        j->groups = pi2_pipeline_groups(c->pipeline);
        const pi2_status s = pi2_pipeline_run(c->pipeline, c->pool, PI2_PART_BUNDLES, j->il, idx, n,
                                              c->ffn_group_start, group_task, j);
        if (s) return s;
    } else {
        pi2_pool_run(c->pool, group_task, j, n_groups);
    }
    const int32_t tasks = pi2_pool_n_threads(c->pool);
    j->slice = (j->n_embd + tasks - 1) / tasks;
    pi2_pool_run(c->pool, reduce_task, j, (int32_t)((j->n_embd + j->slice - 1) / j->slice));
    return PI2_OK;
}

/* One token over bundles: one pass over its active neurons' bundles (one_token_rows). */
static int one_rows_of(const pi2_ctx *c, const pi2_layer *L, int32_t n) {
    return n == 1 && L->down_rows.data && !c->ffn.score_up;
}

uint32_t pi2_ffn_unit_parts(const pi2_ctx *c, const pi2_layer *L, int32_t n) {
    return (one_rows_of(c, L, n) ? 1u << PI2_PART_BUNDLES : 0u) |
           (c->ffn.rule == PI2_FFN_PREDICTED_GATE && n == 1 ? 1u << PI2_PART_GATE : 0u);
}

pi2_status pi2_ffn_sparse(pi2_ctx *c, const pi2_layer *L, int32_t il, int32_t n) {
    const pi2_model_params *hp = &c->m->hp;
    const int one_rows = one_rows_of(c, L, n);
    pi2_layer view = *L;
    if (c->pipeline) {   /* the parts the layer's plan reads whole (ahead, during attention): then as if mapped */
        const pi2_status s = pi2_pipeline_whole(c->pipeline, il, &view);
        if (s) return s;
        L = &view;
    }
    /* batches compute every up row with the tiled product (the same value per row and token as one row's
     * kernel) rather than fetch each token's rows again */
    const int full_up = !one_rows && (n > 1 || c->ffn.rule == PI2_FFN_DENSE || c->ffn.score_up);
    const int32_t threads = pi2_pool_n_threads(c->pool);
    ffn_job j = {.c = c, .L = L, .il = il, .n_tok = n, .n_ff = hp->n_ff, .n_embd = hp->n_embd,
                 .up_tr = pi2_traits(L->up.type, c->p.impl), .up_rows4 = pi2_kernels_dot_rows4(L->up.type, c->p.impl)};
    const pi2_type_traits *a = pi2_traits(j.up_tr->vec_dot_type, c->p.impl);
    j.xq_row = (size_t)(j.n_embd / a->block_size) * (size_t)a->type_size;
    const int npu = one_rows && pi2_nnapi_hot_start(c, il);   /* the hot prefix on NNAPI meanwhile (nnapi/hot_ffn.c) */

    /* gate rows of every neuron (and every up row when the rule needs them); one token under the predicted
     * rule or PowerInfer's predictor: its active set first, and the gate rows of its chosen neurons only */
    int chosen = 0;
    if (c->ffn.rule == PI2_FFN_PREDICTED_GATE) {
        const pi2_status s = pi2_ffn_predict(c, L, il, n, &chosen);
        if (s) {
            if (npu) pi2_nnapi_hot_finish(c, s);
            return s;
        }
    } else if (c->ffn.rule == PI2_FFN_PWRI_PREDICTOR) {
        const pi2_status s = pi2_ffn_pwri(c, L, il, n, &chosen);
        if (s) {
            if (npu) pi2_nnapi_hot_finish(c, s);
            return s;
        }
    }
    /* one token over the in-memory copies: the dense prefix's up rows in the same product as the gate rows */
    j.prefix = one_rows && !npu && !chosen && !c->pipeline && L->down_qx1p && L->up_tight &&   /* (one act format) */
               j.up_tr->vec_dot_type == pi2_traits(L->gate.type, c->p.impl)->vec_dot_type ? (int32_t)L->up_x8.n_out : 0;
    if (full_up)
        pi2_matmul(&c->mm, c->xn, n, (pi2_mm[]){{&L->gate, c->gate}, {&L->up, c->up}}, 2);
    else if (j.prefix)
        pi2_matmul(&c->mm, c->xn, n, (pi2_mm[]){{&L->gate, c->gate}, {&L->up_x8, c->up}}, 2);
    else if (!chosen)
        pi2_matmul(&c->mm, c->xn, n, &(pi2_mm){&L->gate, c->gate}, 1);
    if (c->trace) c->trace("ffn_gate", il, c->gate, (int64_t)n * hp->n_ff, c->trace_user);
    if (c->pipeline) {   /* done with these gate rows: a batch's next layer's come meanwhile */
        const pi2_status s = pi2_pipeline_release(c->pipeline, PI2_PART_GATE, il);
        if (s) return s;
    }

    /* the active set, then the up rows it needs, then h */
    if (!chosen) pi2_pool_run(c->pool, select_task, &j, n);
    if (one_rows) {
        c->ffn_active[il] += c->ffn_n_active[0];
        if (il == 0) c->ffn_tokens += 1;
        if (!npu) return one_token_rows(c, &j);
        pi2_nnapi_hot_take_hot(c);
        const pi2_status s = one_token_rows(c, &j);
        return pi2_nnapi_hot_finish(c, s) ? one_token_rows(c, &j) : s;
    }
    if (!full_up) {   /* a single token (plain files' down) */
        quantize_task(&j, 0, 0);
        pi2_pool_run(c->pool, up_task_one, &j, (c->ffn_n_active[0] + UP_CHUNK - 1) / UP_CHUNK);
    }
    pi2_pool_run(c->pool, combine_task, &j, n);
    int64_t active = 0;
    for (int32_t t = 0; t < n; t++) active += c->ffn_n_active[t];
    c->ffn_active[il] += active;
    if (il == 0) c->ffn_tokens += n;

    /* down */
    if (!L->down_rows.data) {
        pi2_matmul(&c->mm, c->gate, n, &(pi2_mm){&L->down, c->o}, 1);
        return PI2_OK;
    }
    int64_t bs = pi2_traits(L->down_rows.type, c->p.impl)->block_size;
    if (bs < 64) bs = 64;   /* column slices in whole SIMD chunks (int8 rows have one-value "blocks") */
    const int64_t blocks = (j.n_embd + bs - 1) / bs;
    int64_t want = n == 1 ? 2 * (int64_t)threads : (j.n_embd + DOWN_SLICE - 1) / DOWN_SLICE;
    if (want < threads) want = threads;
    if (want > blocks) want = blocks;
    j.slice = (blocks + want - 1) / want * bs;
    pi2_pool_run(c->pool, down_rows_task, &j, (int32_t)((j.n_embd + j.slice - 1) / j.slice));
    return PI2_OK;
}
