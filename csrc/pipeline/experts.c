/* pipeline/experts.c — a MoE layer's expert reads (pipeline/state.h, PI2_PART_EXPERTS): look up the needed experts
 *       (resident hot record, a cold slot, or three reads into the least recently used slot), submit the misses,
 *       reap them and say which experts are ready; drain the reads of a layer that failed or was left. Counts hot,
 *       hits, misses and bytes (cache/experts.h).
 * Does not: hold the slots or issue the reads (csrc/cache/), route or compute (csrc/ffn/moe*.c). */
#define _GNU_SOURCE
#include "pipeline/state.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>

pi2_status pi2_experts_init(pi2_pipeline *pl) {
    pi2_expert_cache *ec = pl->cache->experts;
    if (!ec) return PI2_OK;
    const size_t X = (size_t)ec->n_expert;
    expert_reads *ex = pl->experts = calloc(1, sizeof *ex);
    if (!ex) return pi2_set_error(PI2_ERR_NOMEM, "out of memory for the read pipeline");
    ex->layer = ex->ahead_layer = -1;
    ex->cap = (int32_t)(X * (size_t)(PI2_EXPERT_SLICES + ec->n_cl));
    ex->reqs = malloc((size_t)ex->cap * sizeof *ex->reqs);
    ex->req_e = malloc((size_t)ex->cap * sizeof *ex->req_e);
    ex->req_need = malloc((size_t)ex->cap * sizeof *ex->req_need);
    ex->pending = calloc(X, sizeof *ex->pending);
    ex->ahead = calloc(X, 1);
    ex->found = calloc(X, 1);
    int ok = ex->reqs && ex->req_e && ex->req_need && ex->pending && ex->ahead && ex->found;
    for (int32_t w = 0; w < PI2_EXPERT_SLICES; w++) ok = ok && (ex->rows[w] = calloc(X, sizeof *ex->rows[w]));
    return ok ? PI2_OK : pi2_set_error(PI2_ERR_NOMEM, "out of memory for the read pipeline");
}

void pi2_experts_free(pi2_pipeline *pl) {
    expert_reads *ex = pl->experts;
    if (!ex) return;
    if (ex->n_wait < ex->n_sub) pi2_cache_reap_all(pl->cache);
    free(ex->reqs);
    free(ex->req_e);
    free(ex->req_need);
    free(ex->pending);
    free(ex->ahead);
    free(ex->found);
    for (int32_t w = 0; w < PI2_EXPERT_SLICES; w++) free(ex->rows[w]);
    free(ex);
    pl->experts = NULL;
}

int pi2_pipeline_experts_ahead_on(const pi2_pipeline *pl) { return pl->experts && pl->experts->ahead_on; }

int32_t pi2_pipeline_expert_room(const pi2_pipeline *pl) { return pi2_expert_room(pl->cache->experts); }

const uint8_t *const *pi2_pipeline_expert_rows(const pi2_pipeline *pl, int32_t w) {
    return (const uint8_t *const *)pl->experts->rows[w];
}

void pi2_pipeline_expert_step(pi2_pipeline *pl, int32_t il, int32_t n_tok, const int32_t *experts,
                              const int32_t *rows, int32_t n) {
    pi2_expert_cache *ec = pl->cache->experts;
    int32_t first = 0;
    while (first < ec->n_layer && !pi2_expert_layer(ec, first)) first++;
    if (il == first) {
        pl->cache->st.tokens += n_tok;
        pi2_expert_learn_step(ec, n_tok);   /* no reads are in flight but maybe guesses of this layer: see need */
    }
    pi2_expert_learn_rows(ec, il, experts, rows, n);
    for (int32_t i = 0; i < n; i++) pl->cache->st.expert_rows += rows[experts[i]];
}

/* After an error, or reads of a layer left unreaped: wait for what is in flight, forget the experts listed. */
static void drain(pi2_pipeline *pl) {
    expert_reads *ex = pl->experts;
    pi2_expert_cache *ec = pl->cache->experts;
    pi2_cache_reap_all(pl->cache);
    for (int32_t i = 0; i < ex->n_req; i++) {
        const int32_t slot = pi2_slots_holding(&ec->slots, ex->layer, ex->req_e[i]);
        if (slot >= 0) pi2_expert_forget(ec, slot);
    }
    ex->n_req = ex->n_sub = ex->n_wait = ex->n_ahead = 0;
    ex->ahead_layer = -1;
}

static pi2_status submit(pi2_pipeline *pl) {
    expert_reads *ex = pl->experts;
    int32_t accepted = 0;
    const pi2_status s = pi2_cache_submit(pl->cache, ex->reqs + ex->n_sub, ex->n_req - ex->n_sub, &accepted);
    ex->n_sub += accepted;
    if (s) drain(pl);
    return s;
}

/* List a read of [start, end) for expert e into `slot` at dest: its bytes held by the slot from now on. */
static void add_req(pi2_pipeline *pl, int32_t slot, int32_t e, int64_t start, int64_t end, int64_t need,
                    uint8_t *dest) {
    expert_reads *ex = pl->experts;
    pi2_expert_charge(pl->cache->experts, slot, dest, end - start);
    const int32_t i = ex->n_req++;
    ex->reqs[i] = (pi2_io_request){.offset = (uint64_t)start, .length = (uint64_t)(end - start), .dest = dest,
                                   .user = (uint64_t)i};
    ex->req_e[i] = e;
    ex->req_need[i] = need;
}

/* A converted file's expert e of layer il in `slot`: list reads of its clusters before `upto` with want[c] (NULL: all)
 * that are not present, adjacent ones merged into one 4 KiB-aligned read, and mark what they hold present; the reads
 * listed. `count`: the clusters wanted count in the cluster hit rate (not a prefetch's). */
static int32_t list_clusters(pi2_pipeline *pl, int32_t il, int32_t e, int32_t slot, const uint8_t *want, int32_t upto,
                             int count) {
    pi2_expert_cache *ec = pl->cache->experts;
    uint8_t *present = pi2_expert_present(ec, slot);
    int64_t s0, s1;
    pi2_expert_span(ec, il, e, PI2_EXPERT_UP, &s0, &s1, NULL);
    uint8_t *dest = pi2_expert_slot(ec, slot) + ec->span_at[PI2_EXPERT_UP] - s0;
    int32_t n = 0;
    for (int32_t c = 0; count && c < upto; c++)   /* the byte hit rate: clusters needed, of which present */
        if (!want || want[c]) {
            ec->cl_need++;
            ec->cl_found += present[c];
        }
    for (int32_t c = 0; c < upto;) {
        if (present[c] || (want && !want[c])) {
            c++;
            continue;
        }
        int32_t c1 = c + 1;   /* the run, and the runs whose aligned reads touch it */
        int64_t start, end, need;
        int32_t f0, f1;
        for (;;) {
            while (c1 < upto && !present[c1] && (!want || want[c1])) c1++;
            pi2_expert_cluster_span(ec, il, e, c, c1, &start, &end, &need, &f0, &f1);
            int32_t next = c1;
            while (next < upto && (present[next] || (want && !want[next]))) next++;
            if (next >= upto) break;
            int64_t ns, ne, nn;
            int32_t g0, g1;
            pi2_expert_cluster_span(ec, il, e, next, next + 1, &ns, &ne, &nn, &g0, &g1);
            if (ns > end) break;
            c1 = next + 1;
        }
        add_req(pl, slot, e, start, end, need, dest + start);
        for (int32_t q = f0 < c ? f0 : c; q < (f1 > c1 ? f1 : c1); q++) present[q] = 1;
        n++;
        c = c1;
    }
    return n;
}

/* List the reads of expert e of layer il into the least recently used slot (three slices, or a converted file's gate
 * rows and bundles; under `partial` only the gate rows of a converted file's expert), marked in use by step `mark`;
 * the slot. */
static int32_t list_reads(pi2_pipeline *pl, int32_t il, int32_t e, int64_t mark) {
    pi2_expert_cache *ec = pl->cache->experts;
    expert_reads *ex = pl->experts;
    const int32_t slot = pi2_expert_take(ec, il, e);
    ec->mark[slot] = mark;
    const int bundled = ec->layers[il].down_at != 0;
    int32_t n = 0;
    if (bundled) memset(pi2_expert_present(ec, slot), 0, (size_t)ec->n_cl);
    for (int32_t w = 0; w < PI2_EXPERT_SLICES; w++) {
        if (!pi2_expert_has_slice(ec, il, w) || (bundled && w == PI2_EXPERT_UP)) continue;
        int64_t start, end, need;
        pi2_expert_span(ec, il, e, w, &start, &end, &need);
        add_req(pl, slot, e, start, end, need, pi2_expert_slot(ec, slot) + ec->span_at[w]);
        n++;
    }
    if (bundled && !ex->partial) n += list_clusters(pl, il, e, slot, NULL, ec->n_cl, 1);
    else if (bundled && ec->pre) n += list_clusters(pl, il, e, slot, NULL, ec->pre[(size_t)il * ec->n_expert + e], 0);
    ex->pending[e] = n;
    return slot;
}

/* Reap every read in flight, keeping what lands (the experts read ahead become cached ones). */
static pi2_status finish(pi2_pipeline *pl) {
    expert_reads *ex = pl->experts;
    int32_t got = 0;
    while (ex->n_wait < ex->n_req) {
        pi2_status s = pi2_experts_next_ready(pl, pl->groups, &got);
        if (s) return s;
    }
    return PI2_OK;
}

pi2_status pi2_pipeline_experts_ahead(pi2_pipeline *pl, int32_t il, const int32_t *experts, int32_t n) {
    pi2_expert_cache *ec = pl->cache->experts;
    expert_reads *ex = pl->experts;
    const int32_t X = ec->n_expert;
    if (il < 0 || il >= ec->n_layer || !pi2_expert_layer(ec, il) || ex->n_wait < ex->n_req) return PI2_OK;
    if (2 * n > pi2_expert_room(ec)) return PI2_OK;   /* the guesses and the token's other misses must both fit */
    ex->n_req = ex->n_sub = ex->n_wait = ex->n_ahead = 0;
    ex->layer = il;
    memset(ex->ahead, 0, (size_t)X);
    for (int32_t i = 0; i < n; i++) {
        const int32_t e = experts[i];
        if (ec->hot_of[(size_t)il * X + e] >= 0 || pi2_slots_holding(&ec->slots, il, e) >= 0) continue;
        list_reads(pl, il, e, ec->epoch + 1);   /* in use from the next step on */
        ex->n_ahead++;
        ex->ahead[e] = 1;
        pl->cache->st.expert_ahead++;
    }
    if (!ex->n_req) return PI2_OK;
    ex->ahead_layer = il;
    ex->t_submit = pi2_now();
    return submit(pl);
}

pi2_status pi2_experts_need(pi2_pipeline *pl, int32_t il, const int32_t *experts, int32_t n, uint8_t *ready) {
    pi2_expert_cache *ec = pl->cache->experts;
    expert_reads *ex = pl->experts;
    const int32_t X = ec->n_expert;
    if (il < 0 || il >= ec->n_layer || !pi2_expert_layer(ec, il))
        return pi2_set_error(PI2_ERR_INVALID, "layer %d has no streamed experts", (int)il);
    int ahead = ex->ahead_layer == il;   /* this layer's guessed experts are in reqs, maybe landed */
    if (ex->n_wait < ex->n_req && !ahead) drain(pl);   /* another layer's reads, left after an error or an abort */
    /* Takes reuse the LRU's tail. The slots this need uses and the guesses in flight are at the list's front (pinning
     * takes one of them out of it, unpinning puts a slot at its tail), so the tail is neither while n plus the
     * guesses fit the list; else the guesses land first. */
    const int32_t room = pi2_expert_room(ec);
    if (ahead && n + ex->n_ahead > room) {
        const pi2_status s = finish(pl);
        if (s) return s;
    }
    ex->ahead_layer = -1;
    if (ex->layer != il) memset(ex->ahead, 0, (size_t)X);   /* guesses of another layer */
    if (!ahead || ex->n_wait == ex->n_req) {   /* nothing in flight: the list starts anew */
        ex->n_req = ex->n_sub = ex->n_wait = ex->n_ahead = 0;
        ahead = 0;
    }
    const int whole = ec->layers[il].down_at && !ex->partial;   /* a converted file's experts, all clusters needed */
    ex->layer = il;
    ec->epoch++;   /* a new step: the slots it uses are marked in use (ones guessed for it already are) */
    memset(ready, 1, (size_t)X);
    memset(ex->found, 0, (size_t)X);
    int32_t cold = 0;
    for (int32_t i = 0; i < n; i++) {
        const int32_t e = experts[i], h = ec->hot_of[(size_t)il * X + e];
        if (h >= 0) {
            for (int32_t w = 0; w < PI2_EXPERT_SLICES; w++)
                ex->rows[w][e] = pi2_expert_rows_in(ec, pi2_expert_hot_rec(ec, h), il, e, w);
            ec->hot++;
            continue;
        }
        int32_t slot = pi2_slots_holding(&ec->slots, il, e);
        const int pinned = slot >= 0 && ec->slots.pinned[slot];
        if (!pinned && ++cold > room) {
            drain(pl);
            return pi2_set_error(PI2_ERR_INVALID, "layer %d needs more experts at once than the %d expert slots",
                                 (int)il, (int)room);
        }
        slot = pi2_slots_find(&ec->slots, il, e);
        if (slot >= 0) ec->mark[slot] = ec->epoch;
        if (slot >= 0 && ex->ahead[e] == 1) {   /* guessed right: its reads are in flight or landed */
            ex->ahead[e] = 2;
            ec->misses++;
            pl->cache->st.expert_ahead_used++;
            if (whole) ex->pending[e] += list_clusters(pl, il, e, slot, NULL, ec->n_cl, 1);   /* guessed: partial */
            ready[e] = ex->pending[e] == 0;
        } else if (slot >= 0) {
            ec->hits++;
            ec->pinned_hits += pinned;
            ex->found[e] = 1;
            ex->pending[e] = whole ? list_clusters(pl, il, e, slot, NULL, ec->n_cl, 1) : 0;   /* a partial read's */
            ec->partial_hits += ex->pending[e] > 0;
            ready[e] = ex->pending[e] == 0;
        } else {
            slot = list_reads(pl, il, e, ec->epoch);
            ec->misses++;
            ready[e] = 0;
        }
        pi2_expert_learn_use(ec, slot, il, e);
        for (int32_t w = 0; w < PI2_EXPERT_SLICES; w++)
            ex->rows[w][e] = pi2_expert_rows_in(ec, pi2_expert_slot(ec, slot), il, e, w);
    }
    if (ex->n_sub == ex->n_req) return PI2_OK;
    if (!ahead || !ex->n_sub) ex->t_submit = pi2_now();
    return submit(pl);
}

/* Check one completion of the current layer; forget its slot when it failed. */
static pi2_status check_done(pi2_pipeline *pl, const pi2_io_completion *c) {
    pi2_cache *cache = pl->cache;
    pi2_expert_cache *ec = cache->experts;
    expert_reads *ex = pl->experts;
    const int32_t i = (int32_t)c->user, e = ex->req_e[i];
    const int64_t start = (int64_t)ex->reqs[i].offset, need = ex->req_need[i];
    cache->st.reads++;
    ec->bytes_read += (int64_t)ex->reqs[i].length;
    if ((c->error && c->error != ENODATA) || c->nbytes < need - start) {
        const int32_t slot = pi2_slots_holding(&ec->slots, ex->layer, e);
        if (slot >= 0) pi2_expert_forget(ec, slot);
        return pi2_set_io_error(c->error ? c->error : ENODATA, cache->path, "reading expert %d of layer %d at offset "
                                "%lld of %s: %s", (int)e, (int)ex->layer, (long long)start, cache->path,
                                c->error ? strerror(c->error) : "short read");
    }
    return PI2_OK;
}

pi2_status pi2_experts_next_ready(pi2_pipeline *pl, int32_t *groups, int32_t *n_groups) {
    expert_reads *ex = pl->experts;
    *n_groups = 0;
    pi2_io_completion done[64];
    while (!*n_groups && ex->n_wait < ex->n_req) {
        pi2_status s;
        if (ex->n_sub < ex->n_req && (s = submit(pl))) return s;   /* the queue was full at need: top it up */
        int32_t got = 0;
        if ((s = pi2_cache_reap(pl->cache, done, 64, &got))) {
            drain(pl);
            return s;
        }
        for (int32_t i = 0; i < got; i++) {
            if ((s = check_done(pl, &done[i]))) {
                ex->n_wait += got;
                drain(pl);
                return s;
            }
            const int32_t e = ex->req_e[done[i].user];
            if (--ex->pending[e] == 0 && ex->ahead[e] != 1) groups[(*n_groups)++] = e;
        }
        ex->n_wait += got;
        if (ex->n_wait == ex->n_req) pl->cache->st.read_s += pi2_now() - ex->t_submit;
    }
    return PI2_OK;
}

void pi2_pipeline_experts_partial(pi2_pipeline *pl, int on) {
    if (pl->experts) pl->experts->partial = on && pl->cache->experts->n_cl > 0;
}

int pi2_pipeline_experts_partial_on(const pi2_pipeline *pl) { return pl->experts && pl->experts->partial; }

pi2_status pi2_pipeline_expert_clusters(pi2_pipeline *pl, int32_t il, int32_t e, const uint8_t *want, int *ready) {
    pi2_expert_cache *ec = pl->cache->experts;
    expert_reads *ex = pl->experts;
    *ready = 1;
    const int32_t slot = ec->hot_of[(size_t)il * ec->n_expert + e] >= 0 ? -1 : pi2_slots_holding(&ec->slots, il, e);
    if (slot < 0 || !ec->layers[il].down_at || ex->layer != il) return PI2_OK;   /* resident: every cluster is */
    if (ex->n_wait == ex->n_req) ex->t_submit = pi2_now();
    const int32_t n = list_clusters(pl, il, e, slot, want, ec->n_cl, 1);
    if (!n) return PI2_OK;
    ec->partial_hits += ex->found[e];   /* found, but lacking clusters the token opened */
    ex->found[e] = 0;
    ex->pending[e] += n;
    *ready = 0;
    return submit(pl);
}
