/* moe_stream.c — a MoE layer's expert products when its experts stream (moe.h, pipeline/experts.c): the layer's
 *       active experts in chunks of at most the expert slots; per chunk the pipeline's need (hot and cached experts
 *       at once, misses read), gate and up of each expert as soon as its reads have landed, the activation of its
 *       rows, then down (a converted file's: its down rows, moe_down_rows.c). A converted file's single token under
 *       the relu rule goes in two phases: an expert's gate rows first, then only the bundle clusters holding an open
 *       neuron are read, then its open up rows. Every product is the mapped run's kernel on the same bytes (moe_mm.c
 *       and moe_relu.c find them through pi2_moe_expert_rows), each expert's rows together: the same bits.
 * Does not: route (moe.c), read (csrc/pipeline/, csrc/cache/) or choose the kernels (moe_mm.c). */
#include "cache/experts.h"
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
    int32_t *up, *got;    /* [X] two phases: the experts whose up rows a pool run computes; next_ready's answer */
    uint8_t *gated;       /* [X] two phases: 1 once the expert's gate rows are computed */
    uint8_t *want;        /* [clusters per expert] two phases: the clusters with an open neuron */
};

void pi2_moe_stream_free(struct pi2_moe_stream *st) {
    if (!st) return;
    free(st->all);
    free(st->sub);
    free(st->ready);
    free(st->ids);
    free(st->up);
    free(st->got);
    free(st->gated);
    free(st->want);
    free(st);
}

static pi2_status scratch(pi2_ctx *c) {
    struct pi2_moe *moe = c->moe;
    if (moe->stream) return PI2_OK;
    struct pi2_moe_stream *st = calloc(1, sizeof *st);
    if (st) {
        st->all = malloc((size_t)moe->X * sizeof *st->all);
        st->sub = malloc((size_t)moe->X * sizeof *st->sub);
        st->ready = malloc((size_t)moe->X);
        st->up = malloc((size_t)moe->X * sizeof *st->up);
        st->got = malloc((size_t)moe->X * sizeof *st->got);
        st->gated = malloc((size_t)moe->X);
        st->want = malloc((size_t)((c->m->hp.n_ff_exp + PI2_EXPERT_CLUSTER - 1) / PI2_EXPERT_CLUSTER + 1));
    }
    if (!st || !st->all || !st->sub || !st->ready || !st->up || !st->got || !st->gated || !st->want) {
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

/* The experts chunk[0..nc) whole: gate and up of the present ones while the misses are read, then of each miss as
 * soon as its slices are in. */
static pi2_status one_phase(pi2_ctx *c, const pi2_layer *L, int32_t n, const int32_t *chunk, int32_t nc, int same) {
    struct pi2_moe_stream *st = c->moe->stream;
    if (same) pi2_moe_prep(c, L->gate_exps.type, c->xn, n, c->m->hp.n_embd);
    int32_t ns = 0;
    for (int32_t j = 0; j < nc; j++)
        if (st->ready[chunk[j]]) st->sub[ns++] = chunk[j];
    gate_up(c, L, n, st->sub, ns, same);
    pi2_status s;
    while (!(s = pi2_pipeline_next_ready(c->pipeline, PI2_PART_EXPERTS, st->sub, &ns)) && ns)
        gate_up(c, L, n, st->sub, ns, same);
    return s;
}

/* A single token's experts of a converted file under the relu rule, two phases: each expert's gate rows as soon as
 * they are present (hot, cached, or landed), then its clusters with an open neuron that its slot lacks are read,
 * then its open up rows (moe_relu.c) as soon as those land. Gate and up rows have the in-memory products' bits. */
static pi2_status two_phase(pi2_ctx *c, const pi2_layer *L, int32_t il, const int32_t *chunk, int32_t nc) {
    struct pi2_moe *moe = c->moe;
    struct pi2_moe_stream *st = moe->stream;
    pi2_pipeline *pl = c->pipeline;
    const int64_t F = c->m->hp.n_ff_exp, n_cl = (F + PI2_EXPERT_CLUSTER - 1) / PI2_EXPERT_CLUSTER;
    int32_t ng = 0, nu = 0, got = 0;
    for (int32_t j = 0; j < nc; j++) {
        st->gated[chunk[j]] = 0;
        if (st->ready[chunk[j]]) st->sub[ng++] = chunk[j];
    }
    for (;;) {
        if (ng) {   /* gate rows */
            moe->active = st->sub;
            moe->n_active = ng;
            pi2_moe_prep(c, L->gate_exps.type, c->xn, 1, c->m->hp.n_embd);
            pi2_moe_experts(c, (const pi2_weight *[]){&L->gate_exps}, (float *[]){moe->gate}, 1, 1);
            for (int32_t a = 0; a < ng; a++) {
                const int32_t e = st->sub[a];
                st->gated[e] = 1;
                memset(st->want, 0, (size_t)n_cl);
                for (int32_t i = moe->start[e]; i < moe->start[e + 1]; i++) {
                    const float *g = moe->gate + (size_t)moe->list[i] * (size_t)F;
                    for (int64_t r = 0; r < F; r++) st->want[r / PI2_EXPERT_CLUSTER] |= g[r] > 0.0f;
                }
                int ready;
                const pi2_status s = pi2_pipeline_expert_clusters(pl, il, e, st->want, &ready);
                if (s) return s;
                if (ready) st->up[nu++] = e;
            }
            ng = 0;
        }
        if (nu) {   /* open up rows */
            moe->active = st->up;
            moe->n_active = nu;
            pi2_moe_relu_up(c, L, il, 1);
            nu = 0;
        }
        const pi2_status s = pi2_pipeline_next_ready(pl, PI2_PART_EXPERTS, st->got, &got);
        if (s) return s;
        if (!got) return PI2_OK;
        for (int32_t a = 0; a < got; a++) {
            const int32_t e = st->got[a];
            if (st->gated[e]) st->up[nu++] = e;
            else st->sub[ng++] = e;
        }
    }
}

pi2_status pi2_moe_stream_experts(pi2_ctx *c, const pi2_layer *L, int32_t il, int32_t n) {
    struct pi2_moe *moe = c->moe;
    pi2_pipeline *pl = c->pipeline;
    pi2_status s = scratch(c);
    if (s) return s;
    struct pi2_moe_stream *st = moe->stream;
    const pi2_model_params *hp = &c->m->hp;
    const int64_t F = hp->n_ff_exp;
    const int32_t n_active = moe->n_active;
    const int same = L->gate_exps.type == L->up_exps.type;
    const int bundled = L->down_rows_exps.data != NULL;   /* a converted file: down rows inside the bundles */
    const int partial = bundled && pi2_moe_relu_ok(c, L, n);   /* ... read in two phases: gate, then open clusters */
    pi2_pipeline_experts_partial(pl, partial);
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
        if ((s = partial ? two_phase(c, L, il, chunk, nc) : one_phase(c, L, n, chunk, nc, same))) break;
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
    if (partial && il == 0) c->ffn_tokens += n;
    return s;
}

pi2_status pi2_moe_stream_ahead(pi2_ctx *c, const pi2_layer *L, int32_t il, const float *x) {
    struct pi2_moe *moe = c->moe;
    if (!c->pipeline || !moe || !pi2_pipeline_experts_ahead_on(c->pipeline) || !L->gate_exps.data || !L->router.data)
        return PI2_OK;
    pi2_status s = scratch(c);
    if (s) return s;
    pi2_pipeline_experts_partial(c->pipeline, L->down_rows_exps.data && pi2_moe_relu_ok(c, L, 1));
    if (x) {   /* the router of layer il on x · ffn_norm (the norm's positive scale leaves the order) */
        const int64_t E = c->m->hp.n_embd;
        for (int64_t i = 0; i < E; i++) moe->sh[i] = x[i] * (L->ffn_norm ? L->ffn_norm[i] : 1.0f);
        pi2_moe_matmul(c, moe->sh, 1, &(pi2_mm){&L->router, moe->logits}, 1);
    }
    /* the experts pi2_moe_route selects from these logits (sigmoid gating saturates: its ties are broken as route's) */
    pi2_moe_select(&c->m->hp, moe->logits, moe->probs, moe->stream->got, moe->stream->sub);
    return pi2_pipeline_experts_ahead(c->pipeline, il, moe->stream->sub, moe->k);
}
