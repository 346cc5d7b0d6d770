/* pipeline/whole.c — regions read whole (pipeline/state.h): a part's whole region of a layer read in large
 *       sequential requests into the part's slots, for prompt batches (the bundles, and the gate rows when they
 *       stream) and for single tokens that need every streamed gate row. The reads are submitted ahead of the FFN
 *       that needs them: before the layer's attention, and a batch's gate rows as soon as the previous layer's gate
 *       product is done with the gate slots (pi2_pipeline_release).
 * Does not: unit reads (units.c), sizing (csrc/cache/) or compute.
 * Invariants: the whole-region reads in flight are one layer's and never in flight with unit reads (every unit
 *       entry point settles them first, and these settle the units' first); a region read ahead is taken once, by
 *       its layer's load; a part's slots are not filled while an FFN reads them. */
#define _GNU_SOURCE
#include "pipeline/state.h"

#include <stdlib.h>

pi2_status pi2_whole_init(pi2_pipeline *pl) {
    pi2_cache *cache = pl->cache;
    whole_reads *whole = &pl->whole;
    whole->layer = -1;
    whole->cap = 0;
    for (int32_t part = 0; part < cache->n_parts; part++) {
        int64_t most = 0;
        for (int32_t il = 0; il < cache->n_layer; il++) {
            int64_t start, end;
            pi2_cache_span(cache, &cache->part[part].layers[il], 0, cache->n_cl, &start, &end, NULL);
            if (end - start > most) most = end - start;
        }
        whole->cap += (int32_t)((most + PI2_LOAD_CHUNK - 1) / PI2_LOAD_CHUNK);
    }
    whole->reqs = malloc((size_t)(whole->cap ? whole->cap : 1) * sizeof *whole->reqs);
    return whole->reqs ? PI2_OK : pi2_set_error(PI2_ERR_NOMEM, "out of memory for the read pipeline");
}

static pi2_status top_up(pi2_pipeline *pl) {
    whole_reads *whole = &pl->whole;
    int32_t accepted = 0;
    const pi2_status s = pi2_cache_submit(pl->cache, whole->reqs + whole->n_sub, whole->n_req - whole->n_sub, &accepted);
    whole->n_sub += accepted;
    return s;
}

/* Reap every read of the layer in flight (submitting the rest while the first error is not seen); the parts whose
 * reads all arrived become ready. The first error, after everything submitted is reaped. */
static pi2_status finish(pi2_pipeline *pl) {
    pi2_cache *cache = pl->cache;
    whole_reads *whole = &pl->whole;
    pi2_status err = PI2_OK;
    pi2_io_completion done[64];
    int32_t failed = 0;   /* bit p: part p lacks bytes */
    const double t0 = pi2_now();
    while (whole->n_wait < whole->n_req) {
        if (!err && (err = top_up(pl))) failed = ~0;
        if (whole->n_wait == whole->n_sub) break;   /* nothing in flight and nothing more submitted */
        int32_t got = 0;
        const pi2_status s = pi2_io_reap(cache->io, done, 64, 1, &got);
        if (s) {   /* the backend itself failed: what is in flight cannot be waited for */
            if (!err) err = s;
            failed = ~0;
            break;
        }
        for (int32_t i = 0; i < got; i++) {
            const pi2_io_request *req = &whole->reqs[(uint32_t)done[i].user];
            const int32_t part = (int32_t)(done[i].user >> 32);
            pi2_part *cached = &cache->part[part];
            int64_t start, end, need;
            pi2_cache_span(cache, &cached->layers[whole->layer], 0, cache->n_cl, &start, &end, &need);
            const pi2_status bad = pi2_cache_check_read(cache, cached, req, &done[i], need, !err);   /* the first message */
            if (bad) {
                failed |= 1 << part;
                if (!err) err = bad;
            }
        }
        whole->n_wait += got;
    }
    const double t1 = pi2_now();
    cache->st.io_wait_s += t1 - t0;
    cache->st.read_s += t1 - whole->t_submit;
    for (int32_t part = 0; part < cache->n_parts; part++)
        if (whole->parts >> part & 1 && !(failed >> part & 1)) {
            pl->units[part].whole_ready = whole->layer;
            cache->part[part].layer_loads++;
            cache->st.layer_loads_ahead++;
        }
    whole->layer = -1;
    whole->parts = 0;
    whole->n_req = whole->n_sub = whole->n_wait = 0;
    return err;
}

void pi2_whole_settle(pi2_pipeline *pl) {
    if (pl->whole.layer >= 0 && finish(pl)) pi2_clear_error();   /* parts not read are read again when needed */
}

/* Layer il's region of a part in its slots, or PI2_ERR_INVALID. */
static pi2_status fits(const pi2_cache *cache, const pi2_part *cached, int32_t il, int64_t *start, int64_t *end,
                       int64_t *need) {
    pi2_cache_span(cache, &cached->layers[il], 0, cache->n_cl, start, end, need);
    if ((size_t)(*end - *start) > (size_t)cached->slots.n_slots * cached->slot_bytes)
        return pi2_set_error(PI2_ERR_INVALID, "layer %d's %s (%lld bytes) do not fit the cluster slots", (int)il,
                             cached->what, (long long)(*end - *start));
    return PI2_OK;
}

pi2_status pi2_whole_ahead(pi2_pipeline *pl, int32_t il, uint32_t parts) {
    pi2_cache *cache = pl->cache;
    whole_reads *whole = &pl->whole;
    if (whole->layer >= 0 && whole->layer != il) pi2_whole_settle(pl);
    pi2_units_settle(pl);
    const int32_t first = whole->n_req;
    uint32_t add = 0;
    for (int32_t part = 0; part < cache->n_parts; part++) {
        const pi2_part *cached = &cache->part[part];
        int64_t start, end, need;
        if (!(parts >> part & 1) || cached->layers[il].hot_cl == cache->n_cl || pl->units[part].whole_ready == il ||
            (whole->parts >> part & 1))
            continue;
        const pi2_status s = fits(cache, cached, il, &start, &end, &need);
        if (s) return s;
        add |= 1u << part;
    }
    for (int32_t part = 0; part < cache->n_parts; part++) {
        pi2_part *cached = &cache->part[part];
        if (!(add >> part & 1)) continue;
        int64_t start, end;
        pi2_cache_span(cache, &cached->layers[il], 0, cache->n_cl, &start, &end, NULL);
        pi2_slots_clear(&cached->slots);   /* the slots hold a whole layer now */
        pl->units[part].whole_ready = -1;
        uint8_t *dst = pi2_cache_slot(cached, 0);
        for (int64_t off = start; off < end; off += PI2_LOAD_CHUNK) {
            const int64_t len = end - off < PI2_LOAD_CHUNK ? end - off : PI2_LOAD_CHUNK;
            whole->reqs[whole->n_req] = (pi2_io_request){.offset = (uint64_t)off, .length = (uint64_t)len,
                                                 .dest = dst + (off - start),
                                                 .user = (uint64_t)part << 32 | (uint32_t)whole->n_req};
            whole->n_req++;
        }
        whole->parts |= 1u << part;
    }
    if (whole->n_req == first) return PI2_OK;
    if (!first) whole->t_submit = pi2_now();
    whole->layer = il;
    const pi2_status s = top_up(pl);
    if (s) pi2_whole_settle(pl);
    return s;
}

/* Point view's rows of `part` at the region's bytes, at arena + delta + file offset. */
static void point(pi2_layer *view, int32_t part, const pi2_region *region, const uint8_t *arena, int64_t delta) {
    if (part == PI2_PART_GATE) {
        view->gate.data = arena + (delta + region->row_off[0]);
        return;
    }
    view->up.data = arena + (delta + region->row_off[0]);
    view->down_rows.data = arena + (delta + region->row_off[1]);
}

pi2_status pi2_whole_load(pi2_pipeline *pl, int32_t part, int32_t il, pi2_layer *view) {
    pi2_cache *cache = pl->cache;
    pi2_part *cached = &cache->part[part];
    whole_reads *whole = &pl->whole;
    const pi2_region *region = &cached->layers[il];
    if (region->hot_cl == cache->n_cl) {   /* all resident: the hot region is the layer's whole region */
        point(view, part, region, cached->arena, region->hot_delta);
        return PI2_OK;
    }
    pi2_status s;
    if (whole->layer == il && whole->parts >> part & 1 && (s = finish(pl))) return s;   /* read ahead: wait for it */
    int64_t start, end, need;
    if ((s = fits(cache, cached, il, &start, &end, &need))) return s;
    if (pl->units[part].whole_ready != il) {   /* not read ahead: read it now */
        pi2_whole_settle(pl);
        pi2_units_settle(pl);
        pi2_slots_clear(&cached->slots);
        if ((s = pi2_cache_read_range(cache, cached, start, end, need, pi2_cache_slot(cached, 0)))) return s;
        cached->layer_loads++;
    }
    pl->units[part].whole_ready = -1;
    point(view, part, region, cached->arena, (int64_t)cached->slots_off - start);
    return PI2_OK;
}
