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
        unit_reads *reads = &pl->units[part];
        reads->layer = reads->early_layer = reads->flags_layer = reads->whole_ready = -1;
        reads->early = calloc((size_t)n_cl, 1);
        reads->delta = malloc((size_t)n_cl * sizeof *reads->delta);
        reads->reqs = malloc((size_t)n_cl * sizeof *reads->reqs);
        reads->group_pending = calloc((size_t)pl->n_groups, sizeof *reads->group_pending);
        if (!reads->early || !reads->delta || !reads->reqs || !reads->group_pending)
            return pi2_set_error(PI2_ERR_NOMEM, "out of memory for the read pipeline");
    }
    return PI2_OK;
}

void pi2_units_free(pi2_pipeline *pl) {
    for (int32_t part = 0; part < PI2_N_PARTS; part++) {
        unit_reads *reads = &pl->units[part];
        free(reads->early);
        free(reads->delta);
        free(reads->reqs);
        free(reads->group_pending);
    }
}

/* After an error, or reads of a layer never begun: wait for what is in flight, forget the clusters not read. */
static void drain(pi2_pipeline *pl, int32_t part) {
    unit_reads *reads = &pl->units[part];
    pi2_slots *slots = &pl->cache->part[part].slots;
    pi2_cache_reap_all(pl->cache);
    for (int32_t i = 0; i < reads->n_req; i++) {
        const int32_t slot = pi2_slots_holding(slots, reads->layer, (int32_t)reads->reqs[i].user);
        if (slot >= 0) pi2_slots_forget(slots, slot);
    }
    reads->n_req = reads->n_sub = reads->n_wait = 0;
    reads->early_layer = reads->flags_layer = -1;
}

/* Before a layer's unit reads start: the whole-region reads are settled (the slots are the clusters' again), and
 * reads another layer left unreaped (early reads whose layer never began, after an error or an abort) drained. */
static void settle(pi2_pipeline *pl, int32_t part, int32_t il) {
    unit_reads *reads = &pl->units[part];
    pi2_whole_settle(pl);
    reads->whole_ready = -1;
    if (reads->n_wait < reads->n_req && reads->early_layer != il) drain(pl, part);
}

void pi2_units_settle(pi2_pipeline *pl) {
    for (int32_t part = 0; part < pl->cache->n_parts; part++) {
        unit_reads *reads = &pl->units[part];
        if (reads->n_wait < reads->n_req) drain(pl, part);
    }
}

/* Queue the misses listed and not yet submitted (the queue may take fewer: next_ready tops it up). */
static pi2_status submit(pi2_pipeline *pl, int32_t part) {
    unit_reads *reads = &pl->units[part];
    int32_t accepted = 0;
    const pi2_status s = pi2_cache_submit(pl->cache, reads->reqs + reads->n_sub, reads->n_req - reads->n_sub, &accepted);
    reads->n_sub += accepted;
    if (s) drain(pl, part);
    return s;
}

/* List the read of cluster cl of layer il (file span [start, end)) into the least recently used slot; the slot. */
static int32_t list_read(pi2_pipeline *pl, int32_t part, int32_t il, int32_t cl, int64_t start, int64_t end) {
    pi2_part *cached = &pl->cache->part[part];
    unit_reads *reads = &pl->units[part];
    const int32_t slot = pi2_slots_take(&cached->slots, il, cl);
    reads->reqs[reads->n_req++] = (pi2_io_request){.offset = (uint64_t)start, .length = (uint64_t)(end - start),
                                           .dest = pi2_cache_slot(cached, slot), .user = (uint64_t)cl};
    return slot;
}

pi2_status pi2_units_early(pi2_pipeline *pl, int32_t il) {
    pi2_cache *cache = pl->cache;
    pi2_part *cached = &cache->part[PI2_PART_BUNDLES];
    unit_reads *reads = &pl->units[PI2_PART_BUNDLES];
    const pi2_region *region = &cached->layers[il];
    if (!region->early_cl) return PI2_OK;
    settle(pl, PI2_PART_BUNDLES, -2);
    reads->layer = reads->early_layer = reads->flags_layer = il;
    reads->n_req = reads->n_sub = reads->n_wait = 0;
    memset(reads->early, 0, (size_t)cache->n_cl);
    for (int32_t cl = region->hot_cl; cl < region->hot_cl + region->early_cl; cl++) {
        if (pi2_slots_find(&cached->slots, il, cl) >= 0) continue;   /* cached: the token's lookup counts it */
        int64_t start, end;
        pi2_cache_span(cache, region, cl, cl + 1, &start, &end, NULL);
        list_read(pl, PI2_PART_BUNDLES, il, cl, start, end);
        reads->early[cl] = 1;
    }
    cache->st.early_reads += reads->n_req;
    if (!reads->n_req) {
        reads->early_layer = -1;
        return PI2_OK;
    }
    reads->t_submit = pi2_now();
    return submit(pl, PI2_PART_BUNDLES);
}

pi2_status pi2_pipeline_need(pi2_pipeline *pl, int32_t part, int32_t il, const int32_t *idx, int32_t n,
                             uint8_t *ready) {
    if (part == PI2_PART_EXPERTS) return pi2_experts_need(pl, il, idx, n, ready);
    pi2_cache *cache = pl->cache;
    pi2_part *cached = &cache->part[part];
    unit_reads *reads = &pl->units[part];
    const pi2_region *region = &cached->layers[il];
    const int32_t cluster = cache->cluster;
    memset(ready, 1, (size_t)pl->n_groups);
    memset(reads->group_pending, 0, (size_t)pl->n_groups * sizeof(int32_t));
    settle(pl, part, il);
    const int early = reads->early_layer == il;   /* this layer's early reads are in reads->reqs, maybe landed */
    reads->early_layer = -1;
    if (!early) {
        reads->n_req = reads->n_sub = reads->n_wait = 0;
        reads->flags_layer = -1;
    }
    reads->layer = il;
    if (il == 0 && part == PI2_PART_BUNDLES) cache->st.tokens++;
    for (int32_t i = 0; i < n;) {   /* each needed cluster once, ascending; the LRU's front is the needed set */
        const int32_t cl = idx[i] / cluster, group = cl * cluster / PI2_FFN_GROUP;
        while (i < n && idx[i] / cluster == cl) i++;
        if (cl < region->hot_cl) {
            reads->delta[cl] = region->hot_delta;
            cached->hot++;
            continue;
        }
        int64_t start, end;
        pi2_cache_span(cache, region, cl, cl + 1, &start, &end, NULL);
        int32_t slot = pi2_slots_find(&cached->slots, il, cl);
        if (early && reads->early[cl]) {   /* read early: its group waits for that read (reaped in next_ready) */
            reads->early[cl] = 2;
            cached->misses++;
            ready[group] = 0;
            reads->group_pending[group]++;
        } else if (slot >= 0) {
            cached->hits++;
        } else {   /* the LRU's tail was not used by this layer: the needed set is smaller than n_slots */
            slot = list_read(pl, part, il, cl, start, end);
            cached->misses++;
            ready[group] = 0;
            reads->group_pending[group]++;
        }
        reads->delta[cl] = pi2_cache_slot_delta(cached, slot, start);
    }
    if (early)
        for (int32_t cl = region->hot_cl; cl < region->hot_cl + region->early_cl; cl++)
            cache->st.early_unused += reads->early[cl] == 1;
    if (reads->n_sub == reads->n_req) return PI2_OK;
    if (!early) reads->t_submit = pi2_now();
    return submit(pl, part);
}

/* Check one completion of the current layer; forget its slot when it failed. */
static pi2_status check_done(pi2_pipeline *pl, int32_t part, const pi2_io_completion *c) {
    pi2_cache *cache = pl->cache;
    pi2_part *cached = &cache->part[part];
    unit_reads *reads = &pl->units[part];
    const int32_t cl = (int32_t)c->user;
    int64_t start, end, need;
    pi2_cache_span(cache, &cached->layers[reads->layer], cl, cl + 1, &start, &end, &need);
    cache->st.reads++;
    cached->bytes_read += end - start;
    if ((c->error && c->error != ENODATA) || c->nbytes < need - start) {
        const int32_t slot = pi2_slots_holding(&cached->slots, reads->layer, cl);
        if (slot >= 0) pi2_slots_forget(&cached->slots, slot);
        return pi2_set_io_error(c->error ? c->error : ENODATA, cache->path, "reading the %s of layer %d cluster %d at "
                                "offset %lld of %s: %s", cached->what, (int)reads->layer, (int)cl, (long long)start, cache->path,
                                c->error ? strerror(c->error) : "short read");
    }
    return PI2_OK;
}

pi2_status pi2_pipeline_next_ready(pi2_pipeline *pl, int32_t part, int32_t *groups, int32_t *n_groups) {
    if (part == PI2_PART_EXPERTS) return pi2_experts_next_ready(pl, groups, n_groups);
    pi2_cache *cache = pl->cache;
    unit_reads *reads = &pl->units[part];
    const int32_t cluster = cache->cluster;
    *n_groups = 0;
    pi2_io_completion done[64];
    while (!*n_groups && reads->n_wait < reads->n_req) {
        pi2_status s;
        if (reads->n_sub < reads->n_req && (s = submit(pl, part))) return s;   /* the queue was full at need: top it up */
        int32_t got = 0;
        if ((s = pi2_cache_reap(cache, done, 64, &got))) {
            drain(pl, part);
            return s;
        }
        for (int32_t i = 0; i < got; i++) {
            if ((s = check_done(pl, part, &done[i]))) {
                reads->n_wait += got;
                drain(pl, part);
                return s;
            }
            const int32_t cl = (int32_t)done[i].user, group = cl * cluster / PI2_FFN_GROUP;
            if (reads->flags_layer == reads->layer && reads->early[cl] == 1) continue;   /* read early, not needed */
            if (--reads->group_pending[group] == 0) groups[(*n_groups)++] = group;
        }
        reads->n_wait += got;
        if (reads->n_wait == reads->n_req) cache->st.read_s += pi2_now() - reads->t_submit;
    }
    return PI2_OK;
}
