/* cache_read.c — the neuron cache at work (cache_parts.h): per token and layer, look up a part's needed clusters,
 *       submit the misses (reads land in the part's slots) and reap them group by group; reading a range with
 *       large requests (hot prefixes, whole layers); the hits, misses, bytes and waits they add up to.
 * Does not: create or size the cache (cache.c), keep the LRU (cache_pool.c), read whole layers ahead
 *       (cache_layer.c) or compute (ffn_sparse.c, ffn_predict.c).
 * Invariants: one part's reads are in flight at a time (each layer's reads are reaped or drained before the next
 *       begin); a slot whose read failed holds nothing; early reads (pi2_cache_early) belong to the layer whose
 *       begin comes next, and are reaped with its other reads whether the token needs them or not. */
#define _GNU_SOURCE
#include "cache_parts.h"

#include "internal.h"

#include <errno.h>
#include <string.h>

pi2_status pi2_cache_check_read(pi2_cache *k, part_t *q, const pi2_io_request *r, const pi2_io_completion *c,
                                int64_t need, int report) {
    const int64_t want = (int64_t)r->offset + (int64_t)r->length <= need ? (int64_t)r->length
                                                                         : need - (int64_t)r->offset;
    k->st.reads++;
    q->bytes_read += (int64_t)r->length;
    if (!(c->error && c->error != ENODATA) && c->nbytes >= want) return PI2_OK;
    if (!report) return PI2_ERR_IO;
    return pi2_set_error(PI2_ERR_IO, "reading %lld bytes of %s at offset %lld: %s", (long long)r->length, q->what,
                         (long long)r->offset, c->error ? strerror(c->error) : "short read");
}

pi2_status pi2_cache_read_range(pi2_cache *k, part_t *q, int64_t s, int64_t e, int64_t need, uint8_t *dst) {
    enum { BATCH = 64 };
    pi2_io_request r[BATCH];
    pi2_io_completion c[BATCH];
    const double t0 = pi2_now();
    for (int64_t off = s; off < e;) {
        int32_t n = 0;
        for (; n < BATCH && off < e; n++, off += PI2_LOAD_CHUNK) {
            const int64_t len = e - off < PI2_LOAD_CHUNK ? e - off : PI2_LOAD_CHUNK;
            r[n] = (pi2_io_request){.offset = (uint64_t)off, .length = (uint64_t)len, .dest = dst + (off - s)};
        }
        pi2_status st = pi2_io_read_all(k->io, r, n, c);
        if (st) return st;
        for (int32_t i = 0; i < n; i++)
            if ((st = pi2_cache_check_read(k, q, &r[i], &c[i], need, 1))) return st;
    }
    const double dt = pi2_now() - t0;
    k->st.io_wait_s += dt;
    k->st.read_s += dt;
    return PI2_OK;
}

/* After an error: wait for what is still in flight, forget the clusters of the layer not read. */
static void drain(pi2_cache *k, part_t *q) {
    pi2_io_completion done[64];
    int32_t got;
    while (pi2_io_in_flight(k->io) > 0 && !pi2_io_reap(k->io, done, 64, 1, &got)) {}
    for (int32_t i = 0; i < q->n_req; i++) {
        const int32_t s = pi2_slots_holding(&q->slots, q->cur, (int32_t)q->reqs[i].user);
        if (s >= 0) pi2_slots_forget(&q->slots, s);
    }
    q->n_req = q->n_sub = q->n_wait = 0;
    q->early_layer = q->flags_layer = -1;
}

/* Before a layer's reads start: reads another layer left unreaped (early reads whose layer never began, after an
 * error or an abort) are waited for and their clusters forgotten. */
static void settle(pi2_cache *k, part_t *q, int32_t il) {
    pi2_cache_settle_ahead(k);
    q->ready = -1;   /* the slots are the clusters' again */
    if (q->n_wait < q->n_req && q->early_layer != il) drain(k, q);
}

void pi2_cache_settle_clusters(pi2_cache *k) {
    for (int32_t p = 0; p < k->n_parts; p++) {
        part_t *q = &k->part[p];
        if (q->n_wait < q->n_req) drain(k, q);
    }
}

pi2_status pi2_cache_early(pi2_cache *k, int32_t il) {
    part_t *q = &k->part[PI2_PART_BUNDLES];
    const region_t *l = &q->L[il];
    if (!l->early_cl) return PI2_OK;
    settle(k, q, -2);
    q->cur = q->early_layer = q->flags_layer = il;
    q->n_req = q->n_sub = q->n_wait = 0;
    memset(q->early, 0, (size_t)k->n_cl);
    for (int32_t cl = l->hot_cl; cl < l->hot_cl + l->early_cl; cl++) {
        if (pi2_slots_find(&q->slots, il, cl) >= 0) continue;   /* cached: the token's lookup counts it */
        int64_t fs, fe;
        span(k, l, cl, cl + 1, &fs, &fe, NULL);
        const int32_t s = pi2_slots_take(&q->slots, il, cl);
        q->reqs[q->n_req++] = (pi2_io_request){.offset = (uint64_t)fs, .length = (uint64_t)(fe - fs),
                                               .dest = q->arena + q->slots_off + (size_t)s * q->slot_bytes,
                                               .user = (uint64_t)cl};
        q->early[cl] = 1;
    }
    k->st.early_reads += q->n_req;
    if (!q->n_req) {
        q->early_layer = -1;
        return PI2_OK;
    }
    q->t_submit = pi2_now();
    int32_t acc = 0;
    pi2_status st = pi2_io_submit(k->io, q->reqs, q->n_req, &acc);
    q->n_sub = acc;
    if (st) drain(k, q);
    return st;
}

pi2_status pi2_cache_begin(pi2_cache *k, int32_t part, int32_t il, const int32_t *idx, int32_t n, uint8_t *ready) {
    part_t *q = &k->part[part];
    const region_t *l = &q->L[il];
    const int32_t n_groups = (k->n_ff + PI2_FFN_GROUP - 1) / PI2_FFN_GROUP;
    memset(ready, 1, (size_t)n_groups);
    memset(q->g_pending, 0, (size_t)n_groups * sizeof(int32_t));
    settle(k, q, il);
    const int early = q->early_layer == il;   /* this layer's early reads are in q->reqs, maybe landed */
    q->early_layer = -1;
    if (!early) {
        q->n_req = q->n_sub = q->n_wait = 0;
        q->flags_layer = -1;
    }
    q->cur = il;
    if (il == 0 && part == PI2_PART_BUNDLES) k->st.tokens++;
    for (int32_t i = 0; i < n;) {   /* each needed cluster once, ascending; the LRU's front is the needed set */
        const int32_t cl = idx[i] / k->C;
        while (i < n && idx[i] / k->C == cl) i++;
        if (cl < l->hot_cl) { q->delta[cl] = l->hot_delta; q->hot++; continue; }
        int64_t fs, fe;
        span(k, l, cl, cl + 1, &fs, &fe, NULL);
        int32_t s = pi2_slots_find(&q->slots, il, cl);
        if (early && q->early[cl]) {   /* read early: its group waits for that read (reaped in next) */
            q->early[cl] = 2;
            q->misses++;
            ready[cl * k->C / PI2_FFN_GROUP] = 0;
            q->g_pending[cl * k->C / PI2_FFN_GROUP]++;
        } else if (s >= 0) {
            q->hits++;
        } else {   /* the LRU's tail was not used by this layer: the needed set is smaller than n_slots */
            s = pi2_slots_take(&q->slots, il, cl);
            q->misses++;
            q->reqs[q->n_req++] = (pi2_io_request){.offset = (uint64_t)fs, .length = (uint64_t)(fe - fs),
                                                   .dest = q->arena + q->slots_off + (size_t)s * q->slot_bytes,
                                                   .user = (uint64_t)cl};
            ready[cl * k->C / PI2_FFN_GROUP] = 0;
            q->g_pending[cl * k->C / PI2_FFN_GROUP]++;
        }
        q->delta[cl] = (int64_t)(q->slots_off + (size_t)s * q->slot_bytes) - fs;
    }
    if (early)
        for (int32_t cl = l->hot_cl; cl < l->hot_cl + l->early_cl; cl++) k->st.early_unused += q->early[cl] == 1;
    if (q->n_sub == q->n_req) return PI2_OK;
    if (!early) q->t_submit = pi2_now();
    int32_t acc = 0;
    pi2_status st = pi2_io_submit(k->io, q->reqs + q->n_sub, q->n_req - q->n_sub, &acc);
    q->n_sub += acc;
    if (st) drain(k, q);
    return st;
}

/* Check one completion of the current layer; forget its slot when it failed. */
static pi2_status check_done(pi2_cache *k, part_t *q, const pi2_io_completion *c) {
    const int32_t cl = (int32_t)c->user;
    int64_t fs, fe, need;
    span(k, &q->L[q->cur], cl, cl + 1, &fs, &fe, &need);
    k->st.reads++;
    q->bytes_read += fe - fs;
    if ((c->error && c->error != ENODATA) || c->nbytes < need - fs) {
        const int32_t s = pi2_slots_holding(&q->slots, q->cur, cl);
        if (s >= 0) pi2_slots_forget(&q->slots, s);
        return pi2_set_error(PI2_ERR_IO, "reading the %s of layer %d cluster %d at offset %lld: %s", q->what,
                             (int)q->cur, (int)cl, (long long)fs, c->error ? strerror(c->error) : "short read");
    }
    return PI2_OK;
}

pi2_status pi2_cache_next(pi2_cache *k, int32_t part, int32_t *groups, int32_t *n_groups) {
    part_t *q = &k->part[part];
    *n_groups = 0;
    pi2_io_completion done[64];
    while (!*n_groups && q->n_wait < q->n_req) {
        if (q->n_sub < q->n_req) {   /* the queue was full at begin: top it up */
            int32_t acc = 0;
            pi2_status s = pi2_io_submit(k->io, q->reqs + q->n_sub, q->n_req - q->n_sub, &acc);
            q->n_sub += acc;
            if (s) { drain(k, q); return s; }
        }
        int32_t got = 0;
        const double t0 = pi2_now();
        pi2_status s = pi2_io_reap(k->io, done, 64, 1, &got);
        k->st.io_wait_s += pi2_now() - t0;
        if (s) { drain(k, q); return s; }
        for (int32_t i = 0; i < got; i++) {
            if ((s = check_done(k, q, &done[i]))) { q->n_wait += got; drain(k, q); return s; }
            const int32_t cl = (int32_t)done[i].user, g = cl * k->C / PI2_FFN_GROUP;
            if (q->flags_layer == q->cur && q->early[cl] == 1) continue;   /* read early, not needed */
            if (--q->g_pending[g] == 0) groups[(*n_groups)++] = g;
        }
        q->n_wait += got;
        if (q->n_wait == q->n_req) k->st.read_s += pi2_now() - q->t_submit;
    }
    return PI2_OK;
}

const uint8_t *pi2_cache_arena(const pi2_cache *k, int32_t part) { return k->part[part].arena; }
int64_t pi2_cache_delta(const pi2_cache *k, int32_t part, int32_t cl) { return k->part[part].delta[cl]; }
int32_t pi2_cache_cluster(const pi2_cache *k) { return k->C; }
