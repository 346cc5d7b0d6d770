/* nnapi/batches.c — a context's dense prompt-batch products on the NNAPI delegate (pi2_ctx_set_nnapi, PI2_NNAPI_BATCHES).
 * Does: make one FULLY_CONNECTED graph per product group of every layer (q/k/v, attn_output, gate/up,
 *       down), with weight copies, when attached; in pi2_matmul, run a group of a batch of at least
 *       min_batch tokens on it (start, then wait), else leave it to the CPU; count runs and fallbacks.
 * Does not: build or run NNAPI models (nnapi.c) or choose when to attach (Python's policy).
 * A group whose graph fails once stays on the CPU (nnapi.c marks the graph failed). Also pi2_ctx_set_nnapi, which
 * attaches either use (batches here, the hot prefix in hot_ffn.c). */
#include "context.h"
#include "internal.h"
#include "nnapi/batches.h"
#include "nnapi/hot_ffn.h"

#include <stdlib.h>

typedef struct {
    const pi2_weight *w[4];   /* the group's matrices, as pi2_matmul receives them */
    int32_t n_mm;
    pi2_nnapi_graph *g;
} npu_group;

struct pi2_npu {
    pi2_nnapi *d;
    int32_t min_batch;
    int32_t n_groups;
    npu_group *groups;        /* [4 * n_layer] */
    size_t bytes;
    int64_t runs, fallbacks;
};

void pi2_nnapi_batches_free(struct pi2_npu *npu) {
    if (!npu) return;
    for (int32_t i = 0; i < npu->n_groups; i++) pi2_nnapi_graph_free(npu->groups[i].g);
    free(npu->groups);
    free(npu);
}

static pi2_status add_group(struct pi2_npu *npu, const pi2_weight *const *w, int32_t n) {
    pi2_nnapi_matrix m[4];
    npu_group *gr = &npu->groups[npu->n_groups];
    for (int32_t i = 0; i < n; i++) {
        m[i] = (pi2_nnapi_matrix){w[i]->data, w[i]->type, w[i]->n_out, w[i]->n_in, w[i]->row_bytes};
        gr->w[i] = w[i];
    }
    gr->n_mm = n;
    pi2_status s = pi2_nnapi_fc_create(npu->d, m, n, &gr->g);
    if (s) return s;
    npu->bytes += pi2_nnapi_graph_bytes(gr->g);
    npu->n_groups++;
    return PI2_OK;
}

pi2_status pi2_nnapi_batches_set(pi2_ctx *c, pi2_nnapi *d, int32_t min_batch) {
    if (!c) return pi2_set_error(PI2_ERR_INVALID, "NULL context");
    pi2_nnapi_batches_free(c->mm.npu);
    c->mm.npu = NULL;
    if (!d) return PI2_OK;
    const pi2_model *m = c->m;
    struct pi2_npu *npu = calloc(1, sizeof *npu);
    if (npu) npu->groups = calloc((size_t)m->hp.n_layer * 4, sizeof *npu->groups);
    if (!npu || !npu->groups) { free(npu); return pi2_set_error(PI2_ERR_NOMEM, "out of memory"); }
    npu->d = d;
    npu->min_batch = min_batch > 1 ? min_batch : 2;   /* a single token is a matrix-vector product: CPU */
    pi2_status s = PI2_OK;
    for (int32_t il = 0; il < m->hp.n_layer && !s; il++) {
        const pi2_layer *L = &m->layers[il];
        if (!(s = add_group(npu, (const pi2_weight *[]){&L->q, &L->k, &L->v}, 3)) &&
            !(s = add_group(npu, (const pi2_weight *[]){&L->o}, 1)) &&
            !(s = add_group(npu, (const pi2_weight *[]){&L->gate, &L->up}, 2)))
            s = add_group(npu, (const pi2_weight *[]){&L->down}, 1);
    }
    if (s) { pi2_nnapi_batches_free(npu); return s; }
    c->mm.npu = npu;
    c->mm.npu_matmul = pi2_nnapi_batches_matmul;
    return PI2_OK;
}

size_t pi2_nnapi_batches_bytes(const pi2_ctx *c) { return c && c->mm.npu ? c->mm.npu->bytes : 0; }

int64_t pi2_nnapi_batches_runs(const pi2_ctx *c, int64_t *fallbacks) {
    const struct pi2_npu *npu = c ? c->mm.npu : NULL;
    if (fallbacks) *fallbacks = npu ? npu->fallbacks : 0;
    return npu ? npu->runs : 0;
}

int pi2_nnapi_batches_matmul(struct pi2_npu *npu, const float *x, int32_t n_tok, const pi2_mm *mm, int32_t n_mm) {
    if (n_tok < npu->min_batch || n_mm > 4) return 1;
    for (int32_t i = 0; i < npu->n_groups; i++) {
        npu_group *gr = &npu->groups[i];
        if (gr->w[0] != mm[0].w || gr->n_mm != n_mm) continue;
        float *out[4];
        for (int32_t k = 0; k < n_mm; k++) {
            if (gr->w[k] != mm[k].w) return 1;
            out[k] = mm[k].out;
        }
        if (pi2_nnapi_start(gr->g, x, n_tok, out) || pi2_nnapi_wait(gr->g)) {
            npu->fallbacks++;
            return 1;
        }
        npu->runs++;
        return 0;
    }
    return 1;
}

pi2_status pi2_ctx_set_nnapi(pi2_ctx *c, int32_t use, pi2_nnapi *d, int32_t min_batch, const int32_t *n_hot) {
    switch (use) {
    case PI2_NNAPI_BATCHES: return pi2_nnapi_batches_set(c, d, min_batch);
    case PI2_NNAPI_HOT: return pi2_nnapi_hot_set(c, d, n_hot);
    default: return pi2_set_error(PI2_ERR_INVALID, "unknown NNAPI use %d", (int)use);
    }
}
