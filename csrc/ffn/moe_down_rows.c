/* moe_down_rows.c — down of experts stored as rows (a converted MoE file's up/down bundles, `pi2 convert`): each
 * routed row's output y = Σ_r h_r·down_row_r over its expert's neurons with h_r != 0, in groups of PI2_FFN_GROUP
 * neurons summed in ascending group order by the type's grouped row sum (traits axpy_group: float rows term by term
 * from +0, I8 rows in exact integers with p_r = h_r·scale_r, then y_j·colscale_j), as pi2.h gives for FFN_DOWN_ROWS
 * and pi2/reference/moe_bundles.py specifies. One task per routed row: its bits never depend on the thread count.
 * Rows are found through pi2_moe_expert_rows: the mapping, or the expert cache's copy of a streamed expert.
 * Does not: compute gate, up or the activation (moe.c, moe_relu.c), or read the bundles from flash. */
#include "ffn/moe.h"
#include "internal.h"

typedef struct {
    pi2_ctx *c;
    const pi2_layer *L;
    const pi2_type_traits *tr;
    const int32_t *ids;   /* the row ids to compute (task t: ids[t]), or NULL: task t is row t */
} down_job;

static void down_task(void *arg, int32_t task, int32_t thread) {
    (void)thread;
    const down_job *j = arg;
    const struct pi2_moe *moe = j->c->moe;
    const pi2_weight *w = &j->L->down_rows_exps;
    const int64_t E = w->n_in, F = w->n_out;
    const int32_t i = j->ids ? j->ids[task] : task, e = moe->sel[i];
    const float *h = moe->gate + (size_t)i * (size_t)F;
    const float *scale = j->L->down_scale_exps ? j->L->down_scale_exps + (size_t)e * (size_t)F : NULL;
    int x8;   /* down rows are never packed: the mapping, or the expert cache's copy while the layer streams */
    const uint8_t *rows = pi2_moe_expert_rows(moe, w, e, &x8);
    float *y = moe->down + (size_t)i * (size_t)E;
    for (int64_t o = 0; o < E; o++) y[o] = 0.0f;
    int32_t idx[PI2_FFN_GROUP];
    float p[PI2_FFN_GROUP];
    for (int64_t g0 = 0; g0 < F; g0 += PI2_FFN_GROUP) {
        const int64_t g1 = g0 + PI2_FFN_GROUP < F ? g0 + PI2_FFN_GROUP : F;
        int32_t k = 0;
        for (int64_t r = g0; r < g1; r++)
            if (h[r] != 0.0f) {
                idx[k] = (int32_t)r;
                p[k++] = scale ? h[r] * scale[r] : h[r];
            }
        if (k) j->tr->axpy_group(E, y, rows, w->row_bytes, idx, p, k);
    }
    if (j->L->down_colscale_exps) {
        const float *cs = j->L->down_colscale_exps + (size_t)e * (size_t)E;
        for (int64_t o = 0; o < E; o++) y[o] = y[o] * cs[o];
    }
}

void pi2_moe_down_rows(pi2_ctx *c, const pi2_layer *L, int32_t n) {
    down_job j = {c, L, pi2_traits(L->down_rows_exps.type, c->p.impl), NULL};
    const int32_t n_rows = n * c->moe->k;
    if (n_rows == 1) down_task(&j, 0, 0);
    else pi2_pool_run(c->pool, down_task, &j, n_rows);
}

void pi2_moe_down_rows_of(pi2_ctx *c, const pi2_layer *L, const int32_t *experts, int32_t n_experts, int32_t *ids) {
    const struct pi2_moe *moe = c->moe;
    int32_t n_rows = 0;
    for (int32_t a = 0; a < n_experts; a++)
        for (int32_t s = moe->start[experts[a]]; s < moe->start[experts[a] + 1]; s++) ids[n_rows++] = moe->list[s];
    down_job j = {c, L, pi2_traits(L->down_rows_exps.type, c->p.impl), ids};
    if (n_rows == 1) down_task(&j, 0, 0);
    else if (n_rows) pi2_pool_run(c->pool, down_task, &j, n_rows);
}
