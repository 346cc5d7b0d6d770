/* moe_stream.c — a MoE layer's expert products when its experts stream (moe.h, pipeline/experts.c): the layer's
 *       active experts in chunks of at most the expert slots; per chunk the pipeline's need (hot and cached experts
 *       at once, misses read), gate and up of each expert as soon as its three reads have landed, the activation
 *       of its rows, then down (a converted file's: its down rows, moe_down_rows.c). Every product is the mapped run's kernel on the same bytes (moe_mm.c finds them
 *       through pi2_moe_expert_rows), each expert's rows together, so the results are the same bits.
 * Does not: route (moe.c), read (csrc/pipeline/, csrc/cache/) or choose the kernels (moe_mm.c). */
#include "ffn/moe.h"
#include "pipeline/pipeline.h"

#include <stdlib.h>
#include <string.h>

struct pi2_moe_stream {
    int32_t *all, *sub;   /* [X] the layer's active experts; the ones a pool run computes */
    uint8_t *ready;       /* [X] need's answer */
    int32_t *active;      /* moe->active while the chunks run */
    int32_t *ids;         /* [n_ids] a chunk's row ids (a converted file's down rows) */
    size_t n_ids;
};

void pi2_moe_stream_free(struct pi2_moe_stream *st) {
    if (!st) return;
    free(st->all);
    free(st->sub);
    free(st->ready);
    free(st->ids);
    free(st);
}

static pi2_status scratch(struct pi2_moe *moe) {
    if (moe->stream) return PI2_OK;
    struct pi2_moe_stream *st = calloc(1, sizeof *st);
    if (st) {
        st->all = malloc((size_t)moe->X * sizeof *st->all);
        st->sub = malloc((size_t)moe->X * sizeof *st->sub);
        st->ready = malloc((size_t)moe->X);
    }
    if (!st || !st->all || !st->sub || !st->ready) {
        pi2_moe_stream_free(st);
        return pi2_set_error(PI2_ERR_NOMEM, "out of memory for the streamed experts");
    }
    moe->stream = st;
    return PI2_OK;
}

/* gate and up of the experts sub[0..ns) for n tokens (their activations prepared in xa when the types agree). */
static void gate_up(pi2_ctx *c, const pi2_layer *L, int32_t n, const int32_t *sub, int32_t ns, int same) {
    struct pi2_moe *moe = c->moe;
    if (!ns) return;
    moe->active = (int32_t *)sub;
    moe->n_active = ns;
    const int64_t E = c->m->hp.n_embd;
    if (same) {
        pi2_moe_experts(c, (const pi2_weight *[]){&L->gate_exps, &L->up_exps}, (float *[]){moe->gate, moe->up}, 2, 1);
        return;
    }
    pi2_moe_prep(c, L->up_exps.type, c->xn, n, E);
    pi2_moe_experts(c, (const pi2_weight *[]){&L->up_exps}, (float *[]){moe->up}, 1, 1);
    pi2_moe_prep(c, L->gate_exps.type, c->xn, n, E);
    pi2_moe_experts(c, (const pi2_weight *[]){&L->gate_exps}, (float *[]){moe->gate}, 1, 1);
}

typedef struct {
    struct pi2_moe *moe;
    const int32_t *experts;
    int64_t F;
    int32_t act;
} act_job;

static void act_task(void *arg, int32_t task, int32_t thread) {
    (void)thread;
    const act_job *j = arg;
    const struct pi2_moe *moe = j->moe;
    const int32_t e = j->experts[task];
    for (int32_t i = moe->start[e]; i < moe->start[e] + moe->count[e]; i++) {
        const size_t id = (size_t)moe->list[i];
        pi2_moe_activate(moe->gate + id * (size_t)j->F, moe->up + id * (size_t)j->F, j->F, j->act);
    }
}

pi2_status pi2_moe_stream_experts(pi2_ctx *c, const pi2_layer *L, int32_t il, int32_t n) {
    struct pi2_moe *moe = c->moe;
    pi2_pipeline *pl = c->pipeline;
    pi2_status s = scratch(moe);
    if (s) return s;
    struct pi2_moe_stream *st = moe->stream;
    const pi2_model_params *hp = &c->m->hp;
    const int64_t E = hp->n_embd, F = hp->n_ff_exp;
    const int32_t n_active = moe->n_active;
    const int same = L->gate_exps.type == L->up_exps.type;
    const int bundled = L->down_rows_exps.data != NULL;   /* a converted file: down rows inside the bundles */
    if (bundled && st->n_ids < (size_t)n * (size_t)moe->k) {
        free(st->ids);
        st->n_ids = 0;
        if (!(st->ids = malloc((size_t)n * (size_t)moe->k * sizeof *st->ids)))
            return pi2_set_error(PI2_ERR_NOMEM, "out of memory for the streamed experts");
        st->n_ids = (size_t)n * (size_t)moe->k;
    }
    memcpy(st->all, moe->active, (size_t)n_active * sizeof *st->all);
    st->active = moe->active;
    moe->stream_w[0] = &L->gate_exps;
    moe->stream_w[1] = &L->up_exps;
    moe->stream_w[2] = bundled ? &L->down_rows_exps : &L->down_exps;
    for (int32_t w = 0; w < 3; w++) moe->stream_rows[w] = pi2_pipeline_expert_rows(pl, w);
    pi2_pipeline_expert_step(pl, il, n, st->all, moe->count, n_active);
    for (int32_t i0 = 0; i0 < n_active && !s;) {
        const int32_t room = pi2_pipeline_expert_room(pl);   /* the LRU's slots: learned hot experts pinned shrink it */
        const int32_t nc = n_active - i0 < room ? n_active - i0 : room;
        const int32_t *chunk = st->all + i0;
        if ((s = pi2_pipeline_need(pl, PI2_PART_EXPERTS, il, chunk, nc, st->ready))) break;
        if (same) pi2_moe_prep(c, L->gate_exps.type, c->xn, n, E);
        int32_t ns = 0;
        for (int32_t j = 0; j < nc; j++)
            if (st->ready[chunk[j]]) st->sub[ns++] = chunk[j];
        gate_up(c, L, n, st->sub, ns, same);   /* resident and cached experts while the misses are read */
        while (!(s = pi2_pipeline_next_ready(pl, PI2_PART_EXPERTS, st->sub, &ns)) && ns)
            gate_up(c, L, n, st->sub, ns, same);   /* each expert as soon as its slices are in */
        if (s) break;
        moe->active = (int32_t *)chunk;
        moe->n_active = nc;
        if (moe->neuron_counts || moe->cluster_counts) pi2_moe_count_neurons(c, il);   /* before the activation */
        act_job aj = {moe, chunk, F, hp->expert_act};
        if (nc == 1) act_task(&aj, 0, 0);
        else pi2_pool_run(c->pool, act_task, &aj, nc);
        if (bundled) {
            pi2_moe_down_rows_of(c, L, chunk, nc, st->ids);
        } else {
            pi2_moe_prep(c, L->down_exps.type, moe->gate, n * moe->k, F);
            pi2_moe_experts(c, (const pi2_weight *[]){&L->down_exps}, (float *[]){moe->down}, 1, 0);
        }
        i0 += nc;
    }
    moe->active = st->active;
    moe->n_active = n_active;
    memset(moe->stream_w, 0, sizeof moe->stream_w);
    return s;
}

pi2_status pi2_moe_stream_ahead(pi2_ctx *c, const pi2_layer *L, int32_t il, const float *x) {
    struct pi2_moe *moe = c->moe;
    if (!c->pipeline || !moe || !pi2_pipeline_experts_ahead_on(c->pipeline) || !L->gate_exps.data || !L->router.data)
        return PI2_OK;
    pi2_status s = scratch(moe);
    if (s) return s;
    if (x) {   /* the router of layer il on x · ffn_norm (the norm's positive scale leaves the order) */
        const int64_t E = c->m->hp.n_embd;
        for (int64_t i = 0; i < E; i++) moe->sh[i] = x[i] * (L->ffn_norm ? L->ffn_norm[i] : 1.0f);
        pi2_moe_matmul(c, moe->sh, 1, &(pi2_mm){&L->router, moe->logits}, 1);
    }
    const int32_t X = moe->X, k = moe->k;   /* the k largest logits (gating keeps their order) */
    uint8_t *taken = moe->stream->ready;
    memset(taken, 0, (size_t)X);
    for (int32_t j = 0; j < k; j++) {
        int32_t best = -1;
        for (int32_t e = 0; e < X; e++)
            if (!taken[e] && (best < 0 || moe->logits[e] > moe->logits[best])) best = e;
        taken[best] = 1;
        moe->stream->sub[j] = best;
    }
    return pi2_pipeline_experts_ahead(c->pipeline, il, moe->stream->sub, k);
}
