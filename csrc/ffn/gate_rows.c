/* ffn/gate_rows.c — one token of the two predictor rules: the gate rows of a list of neurons, and the active set and
 *       scores from them (pi2_ffn_one_token). The gate rows: mapped rows in
 *       chunks of the list, or streamed rows (two-phase loading) group by group as the pipeline makes their clusters
 *       present, each row found through its cluster's delta (pi2_rows); the four-row kernel on four neighbours of one
 *       cluster (consecutive rows). Every value in vec_dot's order, whichever way its row was reached.
 * Does not: choose the list (ffn/predicted.c, ffn/pwri.c) or read (csrc/pipeline/). */
#include "ffn/gate_rows.h"

#include "context.h"
#include "ffn/sparse.h"
#include "internal.h"
#include "ops.h"
#include "pipeline/pipeline.h"

#include <math.h>
#include <string.h>

#define GATE_CHUNK 32   /* entries of the list per task (mapped rows) */

typedef struct {
    const pi2_ctx *c;
    const pi2_weight *w;
    pi2_rows rows;             /* where the gate rows are */
    int64_t row0;              /* file offset of gate row 0 */
    const int32_t *list, *groups;   /* groups: the pipeline's ready groups (streamed), or NULL: chunks */
    int32_t n;
    float *gate;
    const uint8_t *xq;
} gate_job;

/* One task: a chunk of the list, or one group's entries, cluster by cluster (mapped rows: one run). */
static void gate_task(void *arg, int32_t task, int32_t thread) {
    (void)thread;
    const gate_job *j = arg;
    int32_t k0 = task * GATE_CHUNK, k1 = k0 + GATE_CHUNK < j->n ? k0 + GATE_CHUNK : j->n;
    if (j->groups) {
        const int32_t group = j->groups[task];
        k0 = j->c->ffn_group_start[group];
        k1 = j->c->ffn_group_start[group + 1];
    }
    for (int32_t k = k0, end; k < k1; k = end) {
        const int32_t cl = j->list[k] / j->rows.cluster;
        for (end = k + 1; end < k1 && (!j->rows.delta || j->list[end] / j->rows.cluster == cl); end++) {}
        pi2_dot_row_list(j->w, j->c->p.impl, pi2_row_at(&j->rows, j->list[k], j->row0), j->list, k, end, j->gate,
                         j->xq);
    }
}

pi2_status pi2_ffn_gate_rows(pi2_ctx *c, const pi2_layer *L, int32_t il, const int32_t *list, int32_t n, float *gate,
                             uint8_t *xq) {
    const pi2_weight *w = &L->gate;
    pi2_traits(pi2_traits(w->type, c->p.impl)->vec_dot_type, c->p.impl)->quantize_act(c->xn, xq, w->n_in);
    gate_job j = {.c = c, .w = w, .rows = {.base = w->data, .cluster = PI2_FFN_GROUP}, .list = list, .n = n,
                  .gate = gate, .xq = xq};
    if (c->pipeline && pi2_pipeline_by_units(c->pipeline, PI2_PART_GATE)) {   /* phase 1 of two-phase loading */
        pi2_ffn_group_starts(c, list, n);
        j.rows = pi2_pipeline_rows(c->pipeline, PI2_PART_GATE);
        j.row0 = w->data - c->m->map;   /* the rows' file offset: mapped, never read through the mapping */
        j.groups = pi2_pipeline_groups(c->pipeline);
        const pi2_status s = pi2_pipeline_run(c->pipeline, c->pool, PI2_PART_GATE, il, list, n, c->ffn_group_start,
                                              gate_task, &j);
        if (s) return s;
    } else {
        pi2_pool_run(c->pool, gate_task, &j, (n + GATE_CHUNK - 1) / GATE_CHUNK);
    }
    if (c->trace) {   /* the gate values computed, zeros elsewhere */
        memset(c->gate, 0, (size_t)c->m->hp.n_ff * sizeof *c->gate);
        for (int32_t k = 0; k < n; k++) c->gate[list[k]] = gate[k];
    }
    return PI2_OK;
}

pi2_status pi2_ffn_one_token(pi2_ctx *c, const pi2_layer *L, int32_t il, const int32_t *list, int32_t n,
                             const float *threshold, float *gate, float *act, uint8_t *xq) {
    const pi2_status s = pi2_ffn_gate_rows(c, L, il, list, n, gate, xq);
    if (s) return s;
    pi2_ffn_act_values(act, gate, n, c->m->hp.ffn_act, c->m->gelu_table);
    if (!threshold) {
        for (int32_t k = 0; k < n; k++) c->ffn_score[list[k]] = act[k];
        return PI2_OK;
    }
    int32_t n_active = 0;
    for (int32_t k = 0; k < n; k++)
        if (fabsf(act[k]) > *threshold) {
            c->ffn_idx[n_active++] = list[k];
            c->ffn_score[list[k]] = act[k];
        }
    c->ffn_n_active[0] = n_active;
    return PI2_OK;
}
