/* cache.c — the neuron cache of a streamed context: per part (the bundles; the gate rows when they stream), a
 *       resident hot prefix per layer + an LRU of cold cluster slots (cache_parts.h).
 * Does: find each layer's bundle region from its up and down row views and its gate region from the gate view;
 *       size and allocate each part's 4 KiB-aligned arena (hot prefixes, then slots); read the hot prefixes at
 *       creation; advise the kernel away from the streamed ranges of the mapping; the statistics.
 * Does not: per-token lookups and reads (cache_read.c), the LRU itself (cache_pool.c), compute (ffn_sparse.c,
 *       ffn_predict.c) or choose sizes (the planner, in Python).
 * Invariants: each part has at least one layer's clusters of slots (a layer's needed clusters are never evicted
 *       while it runs, and a whole layer fits them); nothing is written back; bundle arena offsets < 2 GiB. */
#define _GNU_SOURCE
#include "cache_parts.h"

#include "internal.h"
#include "kernels/traits.h"

#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>

#define A PI2_IO_ALIGN

/* Layer il's region of `part`, or UNSUPPORTED. Bundles: up and down rows interleaved in records of bb bytes, with
 * no gate rows among them; gate rows: packed rows (their stride is their size). */
static pi2_status layout(const pi2_model *m, int32_t part, int32_t il, region_t *out) {
    const pi2_layer *L = &m->layers[il];
    if (!L->down_rows.data)
        return pi2_set_error(PI2_ERR_UNSUPPORTED, "layer %d has no down rows: only pi2 bundles can be streamed",
                             (int)il);
    const int64_t up = L->up.data - m->map, down = L->down_rows.data - m->map, bb = (int64_t)L->up.row_bytes;
    const int64_t rec0 = up < down ? up : down;
    const int64_t gate = L->gate.data - m->map;
    if ((int64_t)L->down_rows.row_bytes != bb || down - up >= bb || up - down >= bb ||
        (int64_t)L->gate.row_bytes == bb || (gate > rec0 - bb && gate < rec0 + bb * m->hp.n_ff))
        return pi2_set_error(PI2_ERR_UNSUPPORTED, "layer %d: up and down rows are not one bundle region without "
                             "gate rows (bundle-ud layout)", (int)il);
    if (part == PI2_PART_BUNDLES) {
        *out = (region_t){.rec0 = rec0, .bb = bb, .row_off = {up, down}};
        return PI2_OK;
    }
    const pi2_type_traits *tr = pi2_traits(L->gate.type, PI2_IMPL_REF);
    if (!tr->block_size || (int64_t)L->gate.row_bytes != L->gate.n_in / tr->block_size * tr->type_size)
        return pi2_set_error(PI2_ERR_UNSUPPORTED, "layer %d: the gate rows are not packed rows", (int)il);
    *out = (region_t){.rec0 = gate, .bb = (int64_t)L->gate.row_bytes, .row_off = {gate, gate}};
    return PI2_OK;
}

static int64_t slot_need(int32_t C, int64_t bb) { return up_a(C * bb) + A; }

/* Bytes of the hot prefix of n_hot neurons (whole clusters) of region l, and of its whole region. */
static void region_bytes(const pi2_model *m, const region_t *l, int32_t C, int32_t n_hot, int64_t *hot, int64_t *all) {
    const int32_t F = m->hp.n_ff, hc = (n_hot < 0 ? 0 : n_hot > F ? F : n_hot) / C;
    const int64_t nh = (int64_t)hc * C < F ? (int64_t)hc * C : F;
    *hot = hc ? up_a(l->rec0 + nh * l->bb) - down_a(l->rec0) : 0;
    *all = up_a(l->rec0 + (int64_t)F * l->bb) - down_a(l->rec0);
}

pi2_status pi2_stream_query(const pi2_model *m, int32_t cluster, int32_t layer, int32_t n_hot, pi2_stream_sizes *out) {
    if (!m || !out) return pi2_set_error(PI2_ERR_INVALID, "NULL model or output");
    if (cluster <= 0 || PI2_FFN_GROUP % cluster || cluster < 8)
        return pi2_set_error(PI2_ERR_INVALID, "cluster size %d does not divide %d (8, 16, 32 or 64)", (int)cluster,
                             (int)PI2_FFN_GROUP);
    if (layer < 0 || layer >= m->hp.n_layer) return pi2_set_error(PI2_ERR_INVALID, "no layer %d", (int)layer);
    memset(out, 0, sizeof *out);
    int gate_ok = 1;   /* gate figures only when every layer's gate rows can stream (0 otherwise) */
    for (int32_t il = 0; il < m->hp.n_layer; il++) {
        region_t b, g;
        pi2_status s = layout(m, PI2_PART_BUNDLES, il, &b);
        if (s) return s;
        gate_ok = gate_ok && !layout(m, PI2_PART_GATE, il, &g);
        if (slot_need(cluster, b.bb) > out->slot_bytes) out->slot_bytes = slot_need(cluster, b.bb);
        if (gate_ok && slot_need(cluster, g.bb) > out->gate_slot_bytes) out->gate_slot_bytes = slot_need(cluster, g.bb);
        if (il == layer) {
            region_bytes(m, &b, cluster, n_hot, &out->hot_bytes, &out->layer_bytes);
            out->bundle_bytes = b.bb;
        }
        if (il == layer && gate_ok) {
            region_bytes(m, &g, cluster, n_hot, &out->gate_hot_bytes, &out->gate_layer_bytes);
            out->gate_row_bytes = g.bb;
        }
    }
    if (!gate_ok) {   /* not an error of the query: the message was layout()'s */
        out->gate_slot_bytes = out->gate_hot_bytes = out->gate_row_bytes = out->gate_layer_bytes = 0;
        pi2_clear_error();
    }
    out->min_slots = (m->hp.n_ff + cluster - 1) / cluster;
    return PI2_OK;
}

static void part_free(part_t *q) {
    pi2_slots_free(&q->slots);
    void *bufs[] = {q->L, q->delta, q->reqs, q->g_pending, q->early, q->arena};
    for (size_t i = 0; i < sizeof bufs / sizeof bufs[0]; i++) free(bufs[i]);
    memset(q, 0, sizeof *q);
}

void pi2_cache_free(pi2_cache *k) {
    if (!k) return;
    if (k->io) pi2_cache_settle_ahead(k);
    pi2_io_close(k->io);
    for (int i = 0; i < 2; i++) part_free(&k->part[i]);
    free(k->ahead.reqs);
    free(k);
}

/* Part `part`'s regions, hot prefixes of n_hot[il] neurons (NULL: none), n_slots slots of slot_bytes, its arena. */
static pi2_status part_init(pi2_cache *k, int32_t part, const int32_t *n_hot, int32_t n_slots, int64_t slot_bytes,
                            const int32_t *n_early) {
    part_t *q = &k->part[part];
    const int32_t F = k->n_ff, n_cl = k->n_cl;
    q->what = part == PI2_PART_BUNDLES ? "bundles" : "gate rows";
    q->slot_bytes = (size_t)slot_bytes;
    q->cur = q->early_layer = q->flags_layer = q->ready = -1;
    q->L = calloc((size_t)k->n_layer, sizeof *q->L);
    q->early = calloc((size_t)n_cl, 1);
    q->delta = malloc((size_t)n_cl * sizeof(int64_t));
    q->reqs = malloc((size_t)n_cl * sizeof(pi2_io_request));
    q->g_pending = calloc((size_t)F / PI2_FFN_GROUP + 1, sizeof(int32_t));
    if (!q->L || !q->delta || !q->reqs || !q->g_pending || !q->early)
        return pi2_set_error(PI2_ERR_NOMEM, "out of memory for the neuron cache");
    pi2_status s = pi2_slots_init(&q->slots, n_slots, k->n_layer, n_cl);
    if (s) return s;
    size_t off = 0;
    for (int32_t il = 0; il < k->n_layer; il++) {
        region_t *l = &q->L[il];
        if ((s = layout(k->m, part, il, l))) return s;
        const int32_t h = n_hot ? n_hot[il] : 0;
        if (h < 0 || h > F)
            return pi2_set_error(PI2_ERR_INVALID, "layer %d: %d hot neurons of %d (%s)", (int)il, (int)h, (int)F,
                                 q->what);
        l->hot_cl = h == F ? n_cl : h / k->C;
        const int32_t e = n_early ? n_early[il] : 0;
        if (e < 0)
            return pi2_set_error(PI2_ERR_INVALID, "layer %d: %d early clusters", (int)il, (int)e);
        l->early_cl = e < n_cl - l->hot_cl ? e : n_cl - l->hot_cl;
        if (l->hot_cl) {
            int64_t fs, fe;
            span(k, l, 0, l->hot_cl, &fs, &fe, NULL);
            l->hot_delta = (int64_t)off - fs;
            off += (size_t)(fe - fs);
        }
    }
    q->hot_bytes = q->slots_off = off;
    q->arena_bytes = off + (size_t)n_slots * q->slot_bytes;
    if (part == PI2_PART_BUNDLES && q->arena_bytes >= (size_t)1 << 31)
        return pi2_set_error(PI2_ERR_INVALID, "a neuron cache of %zu bytes of bundles: at most 2 GiB", q->arena_bytes);
    if (posix_memalign((void **)&q->arena, A, q->arena_bytes)) {
        q->arena = NULL;
        return pi2_set_error(PI2_ERR_NOMEM, "out of memory for the neuron cache (%zu bytes of %s)", q->arena_bytes,
                             q->what);
    }
    return PI2_OK;
}

static pi2_status read_hot(pi2_cache *k, part_t *q) {
    for (int32_t il = 0; il < k->n_layer; il++) {
        const region_t *l = &q->L[il];
        int64_t fs, fe, need;
        if (!l->hot_cl) continue;
        span(k, l, 0, l->hot_cl, &fs, &fe, &need);
        pi2_status s = pi2_cache_read_range(k, q, fs, fe, need, q->arena + (fs + l->hot_delta));
        if (s) return s;
    }
    return PI2_OK;
}

static void willneed(const pi2_model *m, const pi2_weight *w) {
    if (!w->data) return;
    const int64_t s = down_a(w->data - m->map), e = up_a((w->data - m->map) + w->n_out * (int64_t)w->row_bytes);
    madvise((void *)(m->map + s), (size_t)((e < (int64_t)m->map_size ? e : (int64_t)m->map_size) - s), MADV_WILLNEED);
}

/* Keep the streamed parts out of the page cache: no read-ahead anywhere in the mapping (a fault in the fixed region
 * would read the neighbouring bundles), the streamed ranges dropped from it, the file's cached pages that no
 * mapping holds dropped (what reading the file's tables left), then the fixed region's matrices read ahead. */
static void advise(pi2_cache *k) {
    const pi2_model *m = k->m;
    madvise((void *)m->map, m->map_size, MADV_RANDOM);
    for (int32_t part = 0; part < k->n_parts; part++)
        for (int32_t il = 0; il < k->n_layer; il++) {
            int64_t fs, fe;
            span(k, &k->part[part].L[il], 0, k->n_cl, &fs, &fe, NULL);
            const int64_t ms = up_a(fs), me = down_a(fe);   /* pages wholly inside the region */
            if (me > ms) madvise((void *)(m->map + ms), (size_t)(me - ms), MADV_DONTNEED);
        }
    pi2_io_drop_cache(k->io);
    willneed(m, &m->output);
    for (int32_t il = 0; il < k->n_layer; il++) {
        const pi2_layer *L = &m->layers[il];
        willneed(m, &L->q);
        willneed(m, &L->k);
        willneed(m, &L->v);
        willneed(m, &L->o);
        if (k->n_parts < 2) willneed(m, &L->gate);
    }
}

pi2_status pi2_cache_create(const pi2_model *m, const pi2_stream_params *p, pi2_cache **out) {
    *out = NULL;
    pi2_stream_sizes q;
    pi2_status s = pi2_stream_query(m, p->cluster, 0, 0, &q);
    if (s) return s;
    if (!p->path) return pi2_set_error(PI2_ERR_INVALID, "streaming needs the model's path");
    if (p->n_slots < q.min_slots || p->n_slots > (1 << 24))
        return pi2_set_error(PI2_ERR_INVALID, "%d cluster slots: streaming needs at least %lld (one layer's clusters)",
                             (int)p->n_slots, (long long)q.min_slots);
    if (p->stream_gate && (p->n_gate_slots < q.min_slots || p->n_gate_slots > (1 << 24)))
        return pi2_set_error(PI2_ERR_INVALID, "%d gate-cluster slots: streaming gate rows needs at least %lld (one "
                             "layer's clusters)", (int)p->n_gate_slots, (long long)q.min_slots);
    pi2_cache *k = calloc(1, sizeof *k);
    if (!k) return pi2_set_error(PI2_ERR_NOMEM, "out of memory for the neuron cache");
    k->m = m;
    k->C = p->cluster;
    k->n_layer = m->hp.n_layer;
    k->n_ff = m->hp.n_ff;
    k->n_cl = (k->n_ff + k->C - 1) / k->C;
    k->n_parts = p->stream_gate ? 2 : 1;
    k->ahead.layer = -1;
    if ((s = part_init(k, PI2_PART_BUNDLES, p->n_hot, p->n_slots, q.slot_bytes, p->stream_gate ? NULL : p->n_early)) ||
        (p->stream_gate &&
         (s = part_init(k, PI2_PART_GATE, p->n_gate_hot, p->n_gate_slots, q.gate_slot_bytes, NULL))))
        goto fail;
    if ((s = pi2_cache_ahead_init(k))) goto fail;
    pi2_io_params iop = pi2_io_default_params();
    iop.backend = p->backend;
    iop.queue_depth = p->queue_depth;
    iop.direct = p->direct;
    if ((s = pi2_io_open(p->path, &iop, &k->io))) goto fail;
    pi2_io_info info;
    pi2_io_get_info(k->io, &info);
    if ((size_t)info.file_size != m->map_size) {
        s = pi2_set_error(PI2_ERR_INVALID, "%s has %lld bytes, the loaded model %zu: not the same file", p->path,
                          (long long)info.file_size, m->map_size);
        goto fail;
    }
    for (int32_t part = 0; part < k->n_parts; part++)
        if ((s = read_hot(k, &k->part[part]))) goto fail;
    advise(k);
    for (int32_t part = 0; part < k->n_parts; part++) k->part[part].bytes_read = 0;
    k->st.io_wait_s = k->st.read_s = 0;
    k->st.reads = k->st.layer_loads_ahead = 0;
    *out = k;
    return PI2_OK;
fail:
    pi2_cache_free(k);
    return s;
}

int pi2_cache_streams_gate(const pi2_cache *k) { return k->n_parts == 2; }

void pi2_cache_get_stats(const pi2_cache *k, pi2_cache_stats *out) {
    const part_t *b = &k->part[PI2_PART_BUNDLES], *g = &k->part[PI2_PART_GATE];
    *out = k->st;
    out->hot = b->hot;
    out->hits = b->hits;
    out->misses = b->misses;
    out->layer_loads = b->layer_loads;
    out->gate_hot = g->hot;
    out->gate_hits = g->hits;
    out->gate_misses = g->misses;
    out->gate_layer_loads = g->layer_loads;
    out->gate_bytes_read = g->bytes_read;
    out->bytes_read = b->bytes_read + g->bytes_read;
    out->gate_arena_bytes = (int64_t)g->arena_bytes;
    out->gate_hot_bytes = (int64_t)g->hot_bytes;
    out->arena_bytes = (int64_t)(b->arena_bytes + g->arena_bytes);
    out->hot_bytes = (int64_t)(b->hot_bytes + g->hot_bytes);
}
