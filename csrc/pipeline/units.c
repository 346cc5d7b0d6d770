/* pipeline/units.c — a token's unit reads (pipeline/state.h): per part and layer, look up the clusters holding the
 *       needed neurons (hot prefix, a slot, or a read into the least recently used slot), submit the misses, reap
 *       them and say which groups are ready; the early reads of a layer's nearly-always-needed clusters; draining
 *       the reads of a layer that failed or was never begun. Counts hits, misses, early reads and unused ones.
 * Does not: read whole regions (whole.c), hold the slots or issue the reads (csrc/cache/), or compute. */
#define _GNU_SOURCE
#include "pipeline/state.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>

pi2_status pi2_units_init(pi2_pipeline *pl) {
    const int32_t n_cl = pl->cache->n_cl;
    for (int32_t part = 0; part < pl->cache->n_parts; part++) {
        unit_reads *u = &pl->units[part];
        u->layer = u->early_layer = u->flags_layer = u->whole_ready = -1;
        u->early = calloc((size_t)n_cl, 1);
        u->delta = malloc((size_t)n_cl * sizeof *u->delta);
        u->reqs = malloc((size_t)n_cl * sizeof *u->reqs);
        u->group_pending = calloc((size_t)pl->n_groups, sizeof *u->group_pending);
        if (!u->early || !u->delta || !u->reqs || !u->group_pending)
            return pi2_set_error(PI2_ERR_NOMEM, "out of memory for the read pipeline");
    }
    return PI2_OK;
}

void pi2_units_free(pi2_pipeline *pl) {
    for (int32_t part = 0; part < PI2_N_PARTS; part++) {
        unit_reads *u = &pl->units[part];
        free(u->early);
        free(u->delta);
        free(u->reqs);
        free(u->group_pending);
    }
}

/* After an error, or reads of a layer never begun: wait for what is in flight, forget the clusters not read. */
static void drain(pi2_pipeline *pl, int32_t part) {
    unit_reads *u = &pl->units[part];
    pi2_slots *slots = &pl->cache->part[part].slots;
    pi2_cache_reap_all(pl->cache);
    for (int32_t i = 0; i < u->n_req; i++) {
        const int32_t slot = pi2_slots_holding(slots, u->layer, (int32_t)u->reqs[i].user);
        if (slot >= 0) pi2_slots_forget(slots, slot);
    }
    u->n_req = u->n_sub = u->n_wait = 0;
    u->early_layer = u->flags_layer = -1;
}

/* Before a layer's unit reads start: the whole-region reads are settled (the slots are the clusters' again), and
 * reads another layer left unreaped (early reads whose layer never began, after an error or an abort) drained. */
static void settle(pi2_pipeline *pl, int32_t part, int32_t il) {
    unit_reads *u = &pl->units[part];
    pi2_whole_settle(pl);
    u->whole_ready = -1;
    if (u->n_wait < u->n_req && u->early_layer != il) drain(pl, part);
}

void pi2_units_settle(pi2_pipeline *pl) {
    for (int32_t part = 0; part < pl->cache->n_parts; part++) {
        unit_reads *u = &pl->units[part];
        if (u->n_wait < u->n_req) drain(pl, part);
    }
}

/* Queue the misses listed and not yet submitted (the queue may take fewer: next_ready tops it up). */
static pi2_status submit(pi2_pipeline *pl, int32_t part) {
    unit_reads *u = &pl->units[part];
    int32_t accepted = 0;
    const pi2_status s = pi2_cache_submit(pl->cache, u->reqs + u->n_sub, u->n_req - u->n_sub, &accepted);
    u->n_sub += accepted;
    if (s) drain(pl, part);
    return s;
}

/* List the read of cluster cl of layer il (file span [start, end)) into the least recently used slot; the slot. */
static int32_t list_read(pi2_pipeline *pl, int32_t part, int32_t il, int32_t cl, int64_t start, int64_t end) {
    pi2_part *p = &pl->cache->part[part];
    unit_reads *u = &pl->units[part];
    const int32_t slot = pi2_slots_take(&p->slots, il, cl);
    u->reqs[u->n_req++] = (pi2_io_request){.offset = (uint64_t)start, .length = (uint64_t)(end - start),
                                           .dest = pi2_cache_slot(p, slot), .user = (uint64_t)cl};
    return slot;
}

pi2_status pi2_units_early(pi2_pipeline *pl, int32_t il) {
    pi2_cache *cache = pl->cache;
    pi2_part *p = &cache->part[PI2_PART_BUNDLES];
    unit_reads *u = &pl->units[PI2_PART_BUNDLES];
    const pi2_region *region = &p->layers[il];
    if (!region->early_cl) return PI2_OK;
    settle(pl, PI2_PART_BUNDLES, -2);
    u->layer = u->early_layer = u->flags_layer = il;
    u->n_req = u->n_sub = u->n_wait = 0;
    memset(u->early, 0, (size_t)cache->n_cl);
    for (int32_t cl = region->hot_cl; cl < region->hot_cl + region->early_cl; cl++) {
        if (pi2_slots_find(&p->slots, il, cl) >= 0) continue;   /* cached: the token's lookup counts it */
        int64_t start, end;
        pi2_cache_span(cache, region, cl, cl + 1, &start, &end, NULL);
        list_read(pl, PI2_PART_BUNDLES, il, cl, start, end);
        u->early[cl] = 1;
    }
    cache->st.early_reads += u->n_req;
    if (!u->n_req) {
        u->early_layer = -1;
        return PI2_OK;
    }
    u->t_submit = pi2_now();
    return submit(pl, PI2_PART_BUNDLES);
}

pi2_status pi2_pipeline_need(pi2_pipeline *pl, int32_t part, int32_t il, const int32_t *idx, int32_t n,
                             uint8_t *ready) {
    pi2_cache *cache = pl->cache;
    pi2_part *p = &cache->part[part];
    unit_reads *u = &pl->units[part];
    const pi2_region *region = &p->layers[il];
    const int32_t cluster = cache->cluster;
    memset(ready, 1, (size_t)pl->n_groups);
    memset(u->group_pending, 0, (size_t)pl->n_groups * sizeof(int32_t));
    settle(pl, part, il);
    const int early = u->early_layer == il;   /* this layer's early reads are in u->reqs, maybe landed */
    u->early_layer = -1;
    if (!early) {
        u->n_req = u->n_sub = u->n_wait = 0;
        u->flags_layer = -1;
    }
    u->layer = il;
    if (il == 0 && part == PI2_PART_BUNDLES) cache->st.tokens++;
    for (int32_t i = 0; i < n;) {   /* each needed cluster once, ascending; the LRU's front is the needed set */
        const int32_t cl = idx[i] / cluster, group = cl * cluster / PI2_FFN_GROUP;
        while (i < n && idx[i] / cluster == cl) i++;
        if (cl < region->hot_cl) {
            u->delta[cl] = region->hot_delta;
            p->hot++;
            continue;
        }
        int64_t start, end;
        pi2_cache_span(cache, region, cl, cl + 1, &start, &end, NULL);
        int32_t slot = pi2_slots_find(&p->slots, il, cl);
        if (early && u->early[cl]) {   /* read early: its group waits for that read (reaped in next_ready) */
            u->early[cl] = 2;
            p->misses++;
            ready[group] = 0;
            u->group_pending[group]++;
        } else if (slot >= 0) {
            p->hits++;
        } else {   /* the LRU's tail was not used by this layer: the needed set is smaller than n_slots */
            slot = list_read(pl, part, il, cl, start, end);
            p->misses++;
            ready[group] = 0;
            u->group_pending[group]++;
        }
        u->delta[cl] = pi2_cache_slot_delta(p, slot, start);
    }
    if (early)
        for (int32_t cl = region->hot_cl; cl < region->hot_cl + region->early_cl; cl++)
            cache->st.early_unused += u->early[cl] == 1;
    if (u->n_sub == u->n_req) return PI2_OK;
    if (!early) u->t_submit = pi2_now();
    return submit(pl, part);
}

/* Check one completion of the current layer; forget its slot when it failed. */
static pi2_status check_done(pi2_pipeline *pl, int32_t part, const pi2_io_completion *c) {
    pi2_cache *cache = pl->cache;
    pi2_part *p = &cache->part[part];
    unit_reads *u = &pl->units[part];
    const int32_t cl = (int32_t)c->user;
    int64_t start, end, need;
    pi2_cache_span(cache, &p->layers[u->layer], cl, cl + 1, &start, &end, &need);
    cache->st.reads++;
    p->bytes_read += end - start;
    if ((c->error && c->error != ENODATA) || c->nbytes < need - start) {
        const int32_t slot = pi2_slots_holding(&p->slots, u->layer, cl);
        if (slot >= 0) pi2_slots_forget(&p->slots, slot);
        return pi2_set_io_error(c->error ? c->error : ENODATA, cache->path, "reading the %s of layer %d cluster %d at "
                                "offset %lld of %s: %s", p->what, (int)u->layer, (int)cl, (long long)start, cache->path,
                                c->error ? strerror(c->error) : "short read");
    }
    return PI2_OK;
}

pi2_status pi2_pipeline_next_ready(pi2_pipeline *pl, int32_t part, int32_t *groups, int32_t *n_groups) {
    pi2_cache *cache = pl->cache;
    unit_reads *u = &pl->units[part];
    const int32_t cluster = cache->cluster;
    *n_groups = 0;
    pi2_io_completion done[64];
    while (!*n_groups && u->n_wait < u->n_req) {
        pi2_status s;
        if (u->n_sub < u->n_req && (s = submit(pl, part))) return s;   /* the queue was full at need: top it up */
        int32_t got = 0;
        if ((s = pi2_cache_reap(cache, done, 64, &got))) {
            drain(pl, part);
            return s;
        }
        for (int32_t i = 0; i < got; i++) {
            if ((s = check_done(pl, part, &done[i]))) {
                u->n_wait += got;
                drain(pl, part);
                return s;
            }
            const int32_t cl = (int32_t)done[i].user, group = cl * cluster / PI2_FFN_GROUP;
            if (u->flags_layer == u->layer && u->early[cl] == 1) continue;   /* read early, not needed */
            if (--u->group_pending[group] == 0) groups[(*n_groups)++] = group;
        }
        u->n_wait += got;
        if (u->n_wait == u->n_req) cache->st.read_s += pi2_now() - u->t_submit;
    }
    return PI2_OK;
}
