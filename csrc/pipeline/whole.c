/* cache_layer.c — whole-layer reads of the neuron cache (cache_parts.h): a part's whole region of a layer read in
 *       large sequential requests into the part's slots, for prompt batches (the bundles, and the gate rows when
 *       they stream) and for single tokens that need every streamed gate row. The reads are submitted ahead of
 *       the FFN that needs them (pi2_cache_ahead): before the layer's attention, and a batch's gate rows as soon
 *       as the previous layer's gate product is done with the gate slots.
 * Does not: per-cluster reads (cache_read.c), sizing (cache.c) or compute.
 * Invariants: the whole-layer reads in flight are one layer's and never in flight with cluster reads (every
 *       cluster entry point settles them first, and these settle the clusters' first); a region read ahead is
 *       taken once, by its layer's load; a part's slots are not filled while an FFN reads them. */
#define _GNU_SOURCE
#include "cache_parts.h"

#include "internal.h"

#include <stdlib.h>

pi2_status pi2_cache_ahead_init(pi2_cache *k) {
    ahead_t *a = &k->ahead;
    a->layer = -1;
    a->cap = 0;
    for (int32_t p = 0; p < k->n_parts; p++) {
        part_t *q = &k->part[p];
        int64_t most = 0;
        for (int32_t il = 0; il < k->n_layer; il++) {
            int64_t fs, fe;
            span(k, &q->L[il], 0, k->n_cl, &fs, &fe, NULL);
            if (fe - fs > most) most = fe - fs;
        }
        q->ready = -1;
        a->cap += (int32_t)((most + PI2_LOAD_CHUNK - 1) / PI2_LOAD_CHUNK);
    }
    a->reqs = malloc((size_t)(a->cap ? a->cap : 1) * sizeof *a->reqs);
    return a->reqs ? PI2_OK : pi2_set_error(PI2_ERR_NOMEM, "out of memory for the neuron cache");
}

static pi2_status top_up(pi2_cache *k) {
    ahead_t *a = &k->ahead;
    int32_t acc = 0;
    const pi2_status s = a->n_sub < a->n_req ? pi2_io_submit(k->io, a->reqs + a->n_sub, a->n_req - a->n_sub, &acc)
                                             : PI2_OK;
    a->n_sub += acc;
    return s;
}

/* Reap every read of the layer in flight (submitting the rest while the first error is not seen); the parts
 * whose reads all arrived become ready. The first error, after everything submitted is reaped. */
static pi2_status finish(pi2_cache *k) {
    ahead_t *a = &k->ahead;
    pi2_status err = PI2_OK;
    pi2_io_completion done[64];
    int32_t failed = 0;   /* bit p: part p lacks bytes */
    const double t0 = pi2_now();
    while (a->n_wait < a->n_req) {
        if (!err && (err = top_up(k))) failed = ~0;
        if (a->n_wait == a->n_sub) break;   /* nothing in flight and nothing more submitted */
        int32_t got = 0;
        pi2_status s = pi2_io_reap(k->io, done, 64, 1, &got);
        if (s) {   /* the backend itself failed: what is in flight cannot be waited for */
            if (!err) err = s;
            failed = ~0;
            break;
        }
        for (int32_t i = 0; i < got; i++) {
            const pi2_io_request *r = &a->reqs[(uint32_t)done[i].user];
            const int32_t p = (int32_t)(done[i].user >> 32);
            part_t *q = &k->part[p];
            int64_t fs, fe, need;
            span(k, &q->L[a->layer], 0, k->n_cl, &fs, &fe, &need);
            const pi2_status bad = pi2_cache_check_read(k, q, r, &done[i], need, !err);   /* the first message stays */
            if (bad) {
                failed |= 1 << p;
                if (!err) err = bad;
            }
        }
        a->n_wait += got;
    }
    const double t1 = pi2_now();
    k->st.io_wait_s += t1 - t0;
    k->st.read_s += t1 - a->t_submit;
    for (int32_t p = 0; p < k->n_parts; p++)
        if (a->parts >> p & 1 && !(failed >> p & 1)) {
            k->part[p].ready = a->layer;
            k->part[p].layer_loads++;
            k->st.layer_loads_ahead++;
        }
    a->layer = -1;
    a->parts = 0;
    a->n_req = a->n_sub = a->n_wait = 0;
    return err;
}

void pi2_cache_settle_ahead(pi2_cache *k) {
    if (k->ahead.layer >= 0 && finish(k)) pi2_clear_error();   /* parts not read are read again when needed */
}

/* Space for layer il's region of part q in its buffer, or PI2_ERR_INVALID. */
static pi2_status fits(const pi2_cache *k, const part_t *q, int32_t il, int64_t *fs, int64_t *fe, int64_t *need) {
    span(k, &q->L[il], 0, k->n_cl, fs, fe, need);
    if ((size_t)(*fe - *fs) > (size_t)q->slots.n_slots * q->slot_bytes)
        return pi2_set_error(PI2_ERR_INVALID, "layer %d's %s (%lld bytes) do not fit the cluster slots", (int)il,
                             q->what, (long long)(*fe - *fs));
    return PI2_OK;
}

pi2_status pi2_cache_ahead(pi2_cache *k, int32_t il, uint32_t parts) {
    ahead_t *a = &k->ahead;
    if (a->layer >= 0 && a->layer != il) pi2_cache_settle_ahead(k);
    pi2_cache_settle_clusters(k);
    const int32_t first = a->n_req;
    uint32_t add = 0;
    for (int32_t p = 0; p < k->n_parts; p++) {
        const part_t *q = &k->part[p];
        int64_t fs, fe, need;
        if (!(parts >> p & 1) || q->L[il].hot_cl == k->n_cl || q->ready == il || (a->parts >> p & 1)) continue;
        const pi2_status s = fits(k, q, il, &fs, &fe, &need);
        if (s) return s;
        add |= 1u << p;
    }
    for (int32_t p = 0; p < k->n_parts; p++) {
        part_t *q = &k->part[p];
        if (!(add >> p & 1)) continue;
        int64_t fs, fe;
        span(k, &q->L[il], 0, k->n_cl, &fs, &fe, NULL);
        pi2_slots_clear(&q->slots);   /* the slots hold a whole layer now */
        q->ready = -1;
        uint8_t *dst = q->arena + q->slots_off;
        for (int64_t off = fs; off < fe; off += PI2_LOAD_CHUNK) {
            const int64_t len = fe - off < PI2_LOAD_CHUNK ? fe - off : PI2_LOAD_CHUNK;
            a->reqs[a->n_req] = (pi2_io_request){.offset = (uint64_t)off, .length = (uint64_t)len,
                                                 .dest = dst + (off - fs),
                                                 .user = (uint64_t)p << 32 | (uint32_t)a->n_req};
            a->n_req++;
        }
        a->parts |= 1u << p;
    }
    if (a->n_req == first) return PI2_OK;
    if (!first) a->t_submit = pi2_now();
    a->layer = il;
    const pi2_status s = top_up(k);
    if (s) pi2_cache_settle_ahead(k);
    return s;
}

static void point(pi2_layer *view, int32_t part, const region_t *l, const uint8_t *arena, int64_t delta) {
    if (part == PI2_PART_GATE) {
        view->gate.data = arena + (delta + l->row_off[0]);
        return;
    }
    view->up.data = arena + (delta + l->row_off[0]);
    view->down_rows.data = arena + (delta + l->row_off[1]);
}

pi2_status pi2_cache_load_layer(pi2_cache *k, int32_t part, int32_t il, pi2_layer *view) {
    part_t *q = &k->part[part];
    ahead_t *a = &k->ahead;
    const region_t *l = &q->L[il];
    if (l->hot_cl == k->n_cl) {   /* all resident: the hot region is the layer's whole region */
        point(view, part, l, q->arena, l->hot_delta);
        return PI2_OK;
    }
    pi2_status s;
    if (a->layer == il && a->parts >> part & 1 && (s = finish(k))) return s;   /* read ahead: wait for it */
    int64_t fs, fe, need;
    if ((s = fits(k, q, il, &fs, &fe, &need))) return s;
    if (q->ready != il) {   /* not read ahead: read it now */
        pi2_cache_settle_ahead(k);
        pi2_cache_settle_clusters(k);
        pi2_slots_clear(&q->slots);
        if ((s = pi2_cache_read_range(k, q, fs, fe, need, q->arena + q->slots_off))) return s;
        q->layer_loads++;
    }
    q->ready = -1;
    point(view, part, l, q->arena, (int64_t)q->slots_off - fs);
    return PI2_OK;
}
