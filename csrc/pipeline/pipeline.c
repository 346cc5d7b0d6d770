/* ffn_groups.c — one token's neurons by groups of PI2_FFN_GROUP, and running a task per group as the neuron
 * cache makes its clusters present (the streamed bundles of ffn_sparse.c, the streamed gate rows of
 * ffn_predict.c).
 * Does not: compute (the callers' tasks) or read (cache_read.c). */
#include "ffn_groups.h"

#include "cache.h"
#include "context.h"

int32_t pi2_ffn_group_starts(pi2_ctx *c, const int32_t *idx, int32_t n) {
    const int32_t n_groups = (int32_t)((c->m->hp.n_ff + PI2_FFN_GROUP - 1) / PI2_FFN_GROUP);
    for (int32_t g = 0, k = 0; g <= n_groups; g++) {
        while (k < n && idx[k] < g * PI2_FFN_GROUP) k++;
        c->ffn_group_start[g] = k;
    }
    return n_groups;
}

pi2_status pi2_ffn_stream_groups(pi2_ctx *c, int32_t part, int32_t il, const int32_t *idx, int32_t n,
                                 pi2_task_fn fn, void *arg) {
    const int32_t n_groups = (int32_t)((c->m->hp.n_ff + PI2_FFN_GROUP - 1) / PI2_FFN_GROUP);
    pi2_status s = pi2_cache_begin(c->cache, part, il, idx, n, c->ffn_ready);
    if (s) return s;
    int32_t now = 0;   /* groups with entries whose clusters are all present already */
    for (int32_t g = 0; g < n_groups; g++)
        if (c->ffn_group_start[g + 1] > c->ffn_group_start[g] && c->ffn_ready[g]) c->ffn_task_group[now++] = g;
    pi2_pool_run(c->pool, fn, arg, now);
    for (int32_t ready; !(s = pi2_cache_next(c->cache, part, c->ffn_task_group, &ready)) && ready;)
        pi2_pool_run(c->pool, fn, arg, ready);   /* each group as soon as its reads are in */
    return s;
}
