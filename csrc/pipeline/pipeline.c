/* pipeline/pipeline.c — the read/compute pipeline's entry points (pipeline.h): creating it over the neuron cache,
 *       each layer's plan (which parts are read whole, which unit by unit, what starts before attention), the
 *       layer's whole parts handed to the FFN as a view, the release that lets a batch's next layer read ahead,
 *       and the runs of ready groups on the pool as the units' reads land.
 * Does not: the reads' state machines (units.c, whole.c), the slots and reads (csrc/cache/), or compute. */
#include "pipeline/state.h"

#include <stdlib.h>

pi2_status pi2_pipeline_create(const pi2_model *m, const pi2_stream_params *params, pi2_pipeline **out) {
    *out = NULL;
    pi2_pipeline *pl = calloc(1, sizeof *pl);
    if (!pl) return pi2_set_error(PI2_ERR_NOMEM, "out of memory for the read pipeline");
    pl->layer = -1;
    pl->whole.layer = -1;
    pl->n_groups = (m->hp.n_ff + PI2_FFN_GROUP - 1) / PI2_FFN_GROUP;
    if (m->hp.arch == PI2_ARCH_MOE) pl->n_groups = m->hp.n_expert > 0 ? m->hp.n_expert : 1;   /* a group per expert */
    pi2_status s = pi2_cache_create(m, params, &pl->cache);
    if (!s && !(s = pi2_units_init(pl)) && !(s = pi2_whole_init(pl)) && !(s = pi2_experts_init(pl))) {
        pl->ready = calloc((size_t)pl->n_groups, 1);
        pl->groups = calloc((size_t)pl->n_groups, sizeof *pl->groups);
        if (!pl->ready || !pl->groups) s = pi2_set_error(PI2_ERR_NOMEM, "out of memory for the read pipeline");
    }
    if (s) {
        pi2_pipeline_free(pl);
        return s;
    }
    if (pl->experts) pl->experts->ahead_on = params->expert_ahead;
    *out = pl;
    return PI2_OK;
}

void pi2_pipeline_free(pi2_pipeline *pl) {
    if (!pl) return;
    if (pl->cache && pl->whole.reqs) pi2_whole_settle(pl);
    pi2_units_free(pl);
    pi2_experts_free(pl);
    free(pl->whole.reqs);
    free(pl->ready);
    free(pl->groups);
    pi2_cache_free(pl->cache);   /* closing the file waits for the reads in flight */
    free(pl);
}

void pi2_pipeline_stats(const pi2_pipeline *pl, pi2_cache_stats *out) { pi2_cache_get_stats(pl->cache, out); }

int pi2_pipeline_streams(const pi2_pipeline *pl, int32_t part) {
    return part == PI2_PART_EXPERTS ? pl->experts != NULL : part < pl->cache->n_parts;
}

int pi2_pipeline_by_units(const pi2_pipeline *pl, int32_t part) {
    return pi2_pipeline_streams(pl, part) && !(pl->whole_parts >> part & 1);
}

pi2_status pi2_pipeline_begin_layer(pi2_pipeline *pl, int32_t il, int32_t n_tok, uint32_t unit_parts) {
    const uint32_t streamed = (1u << pl->cache->n_parts) - 1;
    pl->layer = il;
    pl->n_tok = n_tok;
    pl->whole_parts = streamed & ~unit_parts;
    if (pl->experts) return PI2_OK;   /* a MoE file: its experts are read when routed (experts.c) */
    if (pl->whole_parts) return pi2_whole_ahead(pl, il, pl->whole_parts);   /* they land during attention */
    if (unit_parts >> PI2_PART_BUNDLES & 1 && !pi2_pipeline_streams(pl, PI2_PART_GATE))
        return pi2_units_early(pl, il);   /* the clusters nearly every token needs, during attention */
    return PI2_OK;
}

pi2_status pi2_pipeline_whole(pi2_pipeline *pl, int32_t il, pi2_layer *view) {
    for (int32_t part = 0; part < pl->cache->n_parts; part++) {
        const pi2_status s = pl->whole_parts >> part & 1 ? pi2_whole_load(pl, part, il, view) : PI2_OK;
        if (s) return s;
    }
    return PI2_OK;
}

pi2_status pi2_pipeline_release(pi2_pipeline *pl, int32_t part, int32_t il) {
    /* a batch's gate product is done with the gate slots: the next layer's gate rows come meanwhile */
    if (part == PI2_PART_GATE && pl->layer == il && pl->n_tok > 1 && pl->whole_parts >> PI2_PART_GATE & 1 &&
        il + 1 < pl->cache->n_layer)
        return pi2_whole_ahead(pl, il + 1, 1u << PI2_PART_GATE);
    return PI2_OK;
}

pi2_status pi2_pipeline_run(pi2_pipeline *pl, pi2_pool *pool, int32_t part, int32_t il, const int32_t *idx, int32_t n,
                            const int32_t *group_start, pi2_task_fn fn, void *arg) {
    pi2_status s = pi2_pipeline_need(pl, part, il, idx, n, pl->ready);
    if (s) return s;
    int32_t now = 0;   /* groups with entries whose units are all present already */
    for (int32_t g = 0; g < pl->n_groups; g++)
        if (group_start[g + 1] > group_start[g] && pl->ready[g]) pl->groups[now++] = g;
    pi2_pool_run(pool, fn, arg, now);
    for (int32_t ready; !(s = pi2_pipeline_next_ready(pl, part, pl->groups, &ready)) && ready;)
        pi2_pool_run(pool, fn, arg, ready);   /* each group as soon as its reads are in */
    return s;
}

const int32_t *pi2_pipeline_groups(const pi2_pipeline *pl) { return pl->groups; }

pi2_rows pi2_pipeline_rows(const pi2_pipeline *pl, int32_t part) {
    return (pi2_rows){.base = pl->cache->part[part].arena, .delta = pl->units[part].delta,
                      .cluster = pl->cache->cluster};
}
