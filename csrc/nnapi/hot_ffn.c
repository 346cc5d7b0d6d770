/* nnapi/hot_ffn.c — a context's single-token hot prefix on the NNAPI delegate (pi2_ctx_set_nnapi, PI2_NNAPI_HOT), as
 * PowerInfer-2 splits decode: the NPU computes the hot neurons of a layer densely while the CPU computes
 * the active cold ones sparsely; the CPU adds the two partial outputs.
 * Does: one hot-FFN graph per layer (nnapi/graph.c: F16 copies of gate, up and down rows of neurons
 *       0..n_hot-1, made once when attached); per token start it, take the hot neurons off the CPU's active
 *       list, wait and add its output; on a failure (compile at the first start, or a run) the CPU computes
 *       the layer as if no graph existed; counts runs and fallbacks.
 * Does not: choose n_hot (Python's planner, pi2/plan/npu_plan.py) or touch the CPU's own arithmetic: with
 *       nothing attached, ffn/sparse.c runs exactly as before. */
#include "nnapi/hot_ffn.h"

#include "internal.h"

#include <stdlib.h>
#include <string.h>

struct pi2_nnapi_hot {
    pi2_nnapi *d;
    int32_t n_layer;
    pi2_nnapi_graph **g;      /* [n_layer], NULL where n_hot is 0 */
    int32_t *n_hot;           /* [n_layer] */
    float *y;                 /* [n_embd] the pending run's output */
    int32_t *hot_idx;         /* [n_ff] the hot neurons taken off the active list */
    int32_t n_taken, layer;   /* layer: of the pending run, -1 when none */
    size_t own;               /* bytes of y and hot_idx */
    int64_t runs, fallbacks;
};

void pi2_nnapi_hot_free(struct pi2_nnapi_hot *f) {
    if (!f) return;
    for (int32_t il = 0; il < f->n_layer; il++) pi2_nnapi_graph_free(f->g ? f->g[il] : NULL);
    free(f->g);
    free(f->n_hot);
    free(f->y);
    free(f->hot_idx);
    free(f);
}

static pi2_nnapi_matrix matrix(const pi2_weight *w) {
    return (pi2_nnapi_matrix){w->data, w->type, w->n_out, w->n_in, w->row_bytes};
}

pi2_status pi2_nnapi_hot_set(pi2_ctx *c, pi2_nnapi *d, const int32_t *n_hot) {
    if (!c) return pi2_set_error(PI2_ERR_INVALID, "NULL context");
    if (atomic_load(&c->busy)) return pi2_set_error(PI2_ERR_INVALID, "a decode is running on this context");
    pi2_nnapi_hot_free(c->nnapi_hot);
    c->nnapi_hot = NULL;
    if (!d) return PI2_OK;
    const pi2_model_params *hp = &c->m->hp;
    if (!n_hot) return pi2_set_error(PI2_ERR_INVALID, "NULL hot counts");
    for (int32_t il = 0; il < hp->n_layer; il++) {
        if (n_hot[il] < 0 || n_hot[il] > hp->n_ff)
            return pi2_set_error(PI2_ERR_INVALID, "layer %d: hot count %d is outside 0..%d", (int)il, (int)n_hot[il],
                                 (int)hp->n_ff);
        if (n_hot[il] && !c->m->layers[il].down_rows.data)
            return pi2_set_error(PI2_ERR_INVALID, "layer %d has no FFN down rows (the hot prefix needs a pi2 file)",
                                 (int)il);
        if (n_hot[il] && c->m->layers[il].down_scale)
            return pi2_set_error(PI2_ERR_UNSUPPORTED, "layer %d: the hot prefix on NNAPI does not take int8 down rows",
                                 (int)il);
    }
    struct pi2_nnapi_hot *f = calloc(1, sizeof *f);
    if (f) {
        f->n_layer = hp->n_layer;
        f->g = calloc((size_t)hp->n_layer, sizeof *f->g);
        f->n_hot = malloc((size_t)hp->n_layer * sizeof *f->n_hot);
        f->y = malloc((size_t)hp->n_embd * sizeof *f->y);
        f->hot_idx = malloc((size_t)hp->n_ff * sizeof *f->hot_idx);
    }
    if (!f || !f->g || !f->n_hot || !f->y || !f->hot_idx) {
        pi2_nnapi_hot_free(f);
        return pi2_set_error(PI2_ERR_NOMEM, "out of memory");
    }
    f->d = d;
    f->layer = -1;
    f->own = (size_t)hp->n_embd * sizeof *f->y + (size_t)hp->n_ff * sizeof *f->hot_idx;
    memcpy(f->n_hot, n_hot, (size_t)hp->n_layer * sizeof *n_hot);
    for (int32_t il = 0; il < hp->n_layer; il++) {
        if (!n_hot[il]) continue;
        const pi2_layer *L = &c->m->layers[il];
        const pi2_nnapi_matrix gate = matrix(&L->gate), up = matrix(&L->up), down = matrix(&L->down_rows);
        pi2_status s = pi2_nnapi_ffn_create(d, hp->ffn_act, &gate, &up, &down, 1, n_hot[il], &f->g[il]);
        if (s) { pi2_nnapi_hot_free(f); return s; }
    }
    c->nnapi_hot = f;
    return PI2_OK;
}

size_t pi2_nnapi_hot_bytes(const pi2_ctx *c) {
    const struct pi2_nnapi_hot *f = c ? c->nnapi_hot : NULL;
    if (!f) return 0;
    size_t n = f->own;
    for (int32_t il = 0; il < f->n_layer; il++) n += pi2_nnapi_graph_bytes(f->g[il]);
    return n;
}

int64_t pi2_nnapi_hot_runs(const pi2_ctx *c, int64_t *fallbacks) {
    const struct pi2_nnapi_hot *f = c ? c->nnapi_hot : NULL;
    if (fallbacks) *fallbacks = f ? f->fallbacks : 0;
    return f ? f->runs : 0;
}

int pi2_nnapi_hot_start(pi2_ctx *c, int32_t il) {
    struct pi2_nnapi_hot *f = c->nnapi_hot;
    if (!f || !f->g[il]) return 0;
    float *out[1] = {f->y};
    if (pi2_nnapi_start(f->g[il], c->xn, 1, out)) {   /* failed now or before: noted once by nnapi/graph.c */
        f->fallbacks++;
        return 0;
    }
    f->layer = il;
    f->n_taken = 0;
    return 1;
}

void pi2_nnapi_hot_take_hot(pi2_ctx *c) {
    struct pi2_nnapi_hot *f = c->nnapi_hot;
    const int32_t H = f->n_hot[f->layer], n = c->ffn_n_active[0];
    int32_t *idx = c->ffn_idx, k = 0;
    while (k < n && idx[k] < H) k++;   /* ascending: the hot neurons are a prefix of the list */
    memcpy(f->hot_idx, idx, (size_t)k * sizeof *idx);
    memmove(idx, idx + k, (size_t)(n - k) * sizeof *idx);
    c->ffn_n_active[0] = n - k;
    f->n_taken = k;
}

int pi2_nnapi_hot_finish(pi2_ctx *c, pi2_status s) {
    struct pi2_nnapi_hot *f = c->nnapi_hot;
    const pi2_status w = pi2_nnapi_wait(f->g[f->layer]);
    f->layer = -1;
    if (s) return 0;
    if (w) {   /* the run failed: the whole list again, for the CPU alone */
        const int32_t n = c->ffn_n_active[0], k = f->n_taken;
        memmove(c->ffn_idx + k, c->ffn_idx, (size_t)n * sizeof *c->ffn_idx);
        memcpy(c->ffn_idx, f->hot_idx, (size_t)k * sizeof *c->ffn_idx);
        c->ffn_n_active[0] = n + k;
        f->fallbacks++;
        return 1;
    }
    const int64_t E = c->m->hp.n_embd;
    for (int64_t e = 0; e < E; e++) c->o[e] += f->y[e];
    f->runs++;
    return 0;
}
