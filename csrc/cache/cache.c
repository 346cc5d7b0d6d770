/* cache/cache.c — the neuron cache of a streamed context: per part (the bundles; the gate rows when they stream), a
 *       resident hot prefix per layer + an LRU of cold cluster slots (cache.h).
 * Does: find each layer's bundle region from its up and down row views and its gate region from the gate view;
 *       size and allocate each part's 4 KiB-aligned arena (hot prefixes, then slots); read the hot prefixes at
 *       creation; advise the kernel away from the streamed ranges of the mapping; the statistics.
 * Does not: decide what to read when (csrc/pipeline/), the LRU itself (slots.c), the reads (read.c), compute
 *       (csrc/ffn/) or choose sizes (the planner, in Python).
 * Invariants: each part has at least one layer's clusters of slots (a layer's needed clusters are never evicted
 *       while it runs, and a whole layer fits them); nothing is written back; bundle arena offsets < 2 GiB. */
#define _GNU_SOURCE
#include "cache/cache.h"
#include "io/io.h"

#include "kernels/traits.h"

#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>

/* Layer il's region of `part`, or UNSUPPORTED. Bundles: up and down rows interleaved in records of rec_bytes bytes, with
 * no gate rows among them; gate rows: packed rows (their stride is their size). */
static pi2_status layout(const pi2_model *m, int32_t part, int32_t il, pi2_region *out) {
    const pi2_layer *L = &m->layers[il];
    if (!L->down_rows.data)
        return pi2_set_error(PI2_ERR_UNSUPPORTED, "layer %d has no down rows: only pi2 bundles can be streamed",
                             (int)il);
    const int64_t up = L->up.data - m->map, down = L->down_rows.data - m->map, rec = (int64_t)L->up.row_bytes;
    const int64_t rec0 = up < down ? up : down;
    const int64_t gate = L->gate.data - m->map;
    if ((int64_t)L->down_rows.row_bytes != rec || down - up >= rec || up - down >= rec ||
        (int64_t)L->gate.row_bytes == rec || (gate > rec0 - rec && gate < rec0 + rec * m->hp.n_ff))
        return pi2_set_error(PI2_ERR_UNSUPPORTED, "layer %d: up and down rows are not one bundle region without "
                             "gate rows (bundle-ud layout)", (int)il);
    if (part == PI2_PART_BUNDLES) {
        *out = (pi2_region){.rec0 = rec0, .rec_bytes = rec, .row_off = {up, down}};
        return PI2_OK;
    }
    const pi2_type_traits *tr = pi2_traits(L->gate.type, PI2_IMPL_REF);
    if (!tr->block_size || (int64_t)L->gate.row_bytes != L->gate.n_in / tr->block_size * tr->type_size)
        return pi2_set_error(PI2_ERR_UNSUPPORTED, "layer %d: the gate rows are not packed rows", (int)il);
    *out = (pi2_region){.rec0 = gate, .rec_bytes = (int64_t)L->gate.row_bytes, .row_off = {gate, gate}};
    return PI2_OK;
}

static int64_t slot_need(int32_t cluster, int64_t rec_bytes) { return pi2_align_up(cluster * rec_bytes) + PI2_IO_ALIGN; }

/* Bytes of the hot prefix of n_hot neurons (whole clusters) of region r, and of its whole region. */
static void region_bytes(const pi2_model *m, const pi2_region *r, int32_t cluster, int32_t n_hot, int64_t *hot,
                         int64_t *all) {
    const int32_t n_ff = m->hp.n_ff, hot_cl = (n_hot < 0 ? 0 : n_hot > n_ff ? n_ff : n_hot) / cluster;
    const int64_t hot_neurons = (int64_t)hot_cl * cluster < n_ff ? (int64_t)hot_cl * cluster : n_ff;
    *hot = hot_cl ? pi2_align_up(r->rec0 + hot_neurons * r->rec_bytes) - pi2_align_down(r->rec0) : 0;
    *all = pi2_align_up(r->rec0 + (int64_t)n_ff * r->rec_bytes) - pi2_align_down(r->rec0);
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
        pi2_region bundles, gate;
        pi2_status s = layout(m, PI2_PART_BUNDLES, il, &bundles);
        if (s) return s;
        gate_ok = gate_ok && !layout(m, PI2_PART_GATE, il, &gate);
        if (slot_need(cluster, bundles.rec_bytes) > out->slot_bytes) out->slot_bytes = slot_need(cluster, bundles.rec_bytes);
        if (gate_ok && slot_need(cluster, gate.rec_bytes) > out->gate_slot_bytes)
            out->gate_slot_bytes = slot_need(cluster, gate.rec_bytes);
        if (il == layer) {
            region_bytes(m, &bundles, cluster, n_hot, &out->hot_bytes, &out->layer_bytes);
            out->bundle_bytes = bundles.rec_bytes;
        }
        if (il == layer && gate_ok) {
            region_bytes(m, &gate, cluster, n_hot, &out->gate_hot_bytes, &out->gate_layer_bytes);
            out->gate_row_bytes = gate.rec_bytes;
        }
    }
    if (!gate_ok) {   /* not an error of the query: the message was layout()'s */
        out->gate_slot_bytes = out->gate_hot_bytes = out->gate_row_bytes = out->gate_layer_bytes = 0;
        pi2_clear_error();
    }
    out->min_slots = (m->hp.n_ff + cluster - 1) / cluster;
    return PI2_OK;
}

static void part_free(pi2_part *part) {
    pi2_slots_free(&part->slots);
    free(part->layers);
    free(part->arena);
    memset(part, 0, sizeof *part);
}

void pi2_cache_free(pi2_cache *cache) {
    if (!cache) return;
    pi2_io_close(cache->io);
    if (cache->experts) pi2_expert_cache_free(cache->experts);
    free(cache->experts);
    for (int i = 0; i < PI2_N_PARTS; i++) part_free(&cache->part[i]);
    free(cache->path);
    free(cache);
}

/* Part `which`'s regions, hot prefixes of n_hot[il] neurons (NULL: none), early clusters of n_early[il] (NULL:
 * none), n_slots slots of slot_bytes, its arena. */
static pi2_status part_init(pi2_cache *cache, int32_t which, const int32_t *n_hot, int32_t n_slots,
                            int64_t slot_bytes, const int32_t *n_early) {
    pi2_part *part = &cache->part[which];
    const int32_t n_ff = cache->n_ff, n_cl = cache->n_cl;
    part->what = which == PI2_PART_BUNDLES ? "bundles" : "gate rows";
    part->slot_bytes = (size_t)slot_bytes;
    part->layers = calloc((size_t)cache->n_layer, sizeof *part->layers);
    if (!part->layers) return pi2_set_error(PI2_ERR_NOMEM, "out of memory for the neuron cache");
    pi2_status s = pi2_slots_init(&part->slots, n_slots, cache->n_layer, n_cl);
    if (s) return s;
    size_t off = 0;
    for (int32_t il = 0; il < cache->n_layer; il++) {
        pi2_region *region = &part->layers[il];
        if ((s = layout(cache->m, which, il, region))) return s;
        const int32_t hot = n_hot ? n_hot[il] : 0;
        if (hot < 0 || hot > n_ff)
            return pi2_set_error(PI2_ERR_INVALID, "layer %d: %d hot neurons of %d (%s)", (int)il, (int)hot, (int)n_ff,
                                 part->what);
        region->hot_cl = hot == n_ff ? n_cl : hot / cache->cluster;
        const int32_t early = n_early ? n_early[il] : 0;
        if (early < 0) return pi2_set_error(PI2_ERR_INVALID, "layer %d: %d early clusters", (int)il, (int)early);
        region->early_cl = early < n_cl - region->hot_cl ? early : n_cl - region->hot_cl;
        if (region->hot_cl) {
            int64_t start, end;
            pi2_cache_span(cache, region, 0, region->hot_cl, &start, &end, NULL);
            region->hot_delta = (int64_t)off - start;
            off += (size_t)(end - start);
        }
    }
    part->hot_bytes = part->slots_off = off;
    part->arena_bytes = off + (size_t)n_slots * part->slot_bytes;
    if (which == PI2_PART_BUNDLES && part->arena_bytes >= (size_t)1 << 31)
        return pi2_set_error(PI2_ERR_INVALID, "a neuron cache of %zu bytes of bundles: at most 2 GiB", part->arena_bytes);
    if (posix_memalign((void **)&part->arena, PI2_IO_ALIGN, part->arena_bytes)) {
        part->arena = NULL;
        return pi2_set_error(PI2_ERR_NOMEM, "out of memory for the neuron cache (%zu bytes of %s)", part->arena_bytes,
                             part->what);
    }
    return PI2_OK;
}

static pi2_status read_hot(pi2_cache *cache, pi2_part *part) {
    for (int32_t il = 0; il < cache->n_layer; il++) {
        const pi2_region *region = &part->layers[il];
        int64_t start, end, need;
        if (!region->hot_cl) continue;
        pi2_cache_span(cache, region, 0, region->hot_cl, &start, &end, &need);
        pi2_status s = pi2_cache_read_range(cache, part, start, end, need, part->arena + (start + region->hot_delta));
        if (s) return s;
    }
    return PI2_OK;
}

static void willneed(const pi2_model *m, const pi2_weight *w) {
    if (!w->data) return;
    const int64_t start = pi2_align_down(w->data - m->map);
    const int64_t end = pi2_align_up((w->data - m->map) + w->n_out * (int64_t)w->row_bytes);
    madvise((void *)(m->map + start), (size_t)((end < (int64_t)m->map_size ? end : (int64_t)m->map_size) - start),
            MADV_WILLNEED);
}

/* The fixed region's matrices read ahead: output, attention, and the mapped gate (gate) or the router (router). */
static void willneed_fixed(const pi2_cache *cache, int gate, int router) {
    const pi2_model *m = cache->m;
    willneed(m, &m->output);
    for (int32_t il = 0; il < cache->n_layer; il++) {
        const pi2_layer *L = &m->layers[il];
        willneed(m, &L->q);
        willneed(m, &L->k);
        willneed(m, &L->v);
        willneed(m, &L->o);
        if (gate) willneed(m, &L->gate);
        if (router) willneed(m, &L->router);
    }
}

/* Keep the streamed parts out of the page cache: no read-ahead anywhere in the mapping (a fault in the fixed region
 * would read the neighbouring bundles), the streamed ranges dropped from it, the file's cached pages that no
 * mapping holds dropped (what reading the file's tables left), then the fixed region's matrices read ahead. */
static void advise(pi2_cache *cache) {
    const pi2_model *m = cache->m;
    madvise((void *)m->map, m->map_size, MADV_RANDOM);
    for (int32_t which = 0; which < cache->n_parts; which++)
        for (int32_t il = 0; il < cache->n_layer; il++) {
            int64_t start, end;
            pi2_cache_span(cache, &cache->part[which].layers[il], 0, cache->n_cl, &start, &end, NULL);
            const int64_t inner0 = pi2_align_up(start), inner1 = pi2_align_down(end);   /* pages wholly inside */
            if (inner1 > inner0) madvise((void *)(m->map + inner0), (size_t)(inner1 - inner0), MADV_DONTNEED);
        }
    pi2_io_drop_cache(cache->io);
    willneed_fixed(cache, cache->n_parts < 2, 0);
}

/* A MoE file: no read-ahead in the mapping, the expert tensors' pages dropped from it and from the page cache, the
 * fixed region's matrices read ahead. */
static void advise_experts(pi2_cache *cache) {
    const pi2_model *m = cache->m;
    const pi2_expert_cache *ec = cache->experts;
    madvise((void *)m->map, m->map_size, MADV_RANDOM);
    for (int32_t il = 0; il < ec->n_layer; il++)
        for (int32_t w = 0; w < PI2_EXPERT_SLICES && pi2_expert_layer(ec, il); w++) {
            const int64_t off = ec->layers[il].off[w], end = off + ec->layers[il].bytes[w] * ec->n_expert;
            const int64_t inner0 = pi2_align_up(off), inner1 = pi2_align_down(end);
            if (inner1 > inner0) madvise((void *)(m->map + inner0), (size_t)(inner1 - inner0), MADV_DONTNEED);
        }
    pi2_io_drop_cache(cache->io);
    willneed_fixed(cache, 0, 1);
}

/* The expert cache of a MoE file: slots, hot records read now (in large requests), the mapping advised. */
static pi2_status experts_create(pi2_cache *cache, const pi2_stream_params *p) {
    pi2_part *acct = &cache->part[PI2_PART_BUNDLES];   /* counts the hot records' reads (messages say "experts") */
    acct->what = "experts";
    if (!(cache->experts = calloc(1, sizeof *cache->experts)))
        return pi2_set_error(PI2_ERR_NOMEM, "out of memory for the expert cache");
    pi2_expert_cache *ec = cache->experts;
    pi2_status s = pi2_expert_cache_init(ec, cache->m, p->n_expert_slots, p->expert_hot);
    if (!s) pi2_expert_set_cap(ec, p->expert_cold_bytes);
    if (!s && p->expert_pre && ec->n_cl) {   /* leading clusters read with the gate rows */
        const size_t N = (size_t)ec->n_layer * (size_t)ec->n_expert;
        if (!(ec->pre = malloc(N * sizeof *ec->pre)))
            return pi2_set_error(PI2_ERR_NOMEM, "out of memory for the expert cache");
        for (size_t i = 0; i < N; i++)
            ec->pre[i] = p->expert_pre[i] < 0 ? 0 : p->expert_pre[i] > ec->n_cl ? ec->n_cl : p->expert_pre[i];
    }
    if (s || (s = pi2_expert_learn_init(ec, cache->m->hp.n_expert_used, p->expert_learn))) return s;
    pi2_io_params iop = io_default_params();
    iop.backend = p->backend;
    iop.queue_depth = p->queue_depth;
    iop.direct = p->direct;
    pi2_io_info info;
    if ((s = pi2_io_open(p->path, &iop, &cache->io, &info))) return s;
    if ((size_t)info.file_size != cache->m->map_size)
        return pi2_set_error(PI2_ERR_INVALID, "%s has %lld bytes, the loaded model %zu: not the same file", p->path,
                             (long long)info.file_size, cache->m->map_size);
    for (int32_t i = 0; i < ec->n_layer * ec->n_expert; i++) {
        if (ec->hot_of[i] < 0) continue;
        const int32_t il = i / ec->n_expert, e = i % ec->n_expert;
        for (int32_t w = 0; w < PI2_EXPERT_SLICES; w++) {
            if (!pi2_expert_has_slice(ec, il, w)) continue;   /* a converted file: down is in the bundles */
            int64_t start, end, need;
            pi2_expert_span(ec, il, e, w, &start, &end, &need);
            if ((s = pi2_cache_read_range(cache, acct, start, end, need,
                                          pi2_expert_hot_rec(ec, ec->hot_of[i]) + ec->span_at[w])))
                return s;
        }
    }
    advise_experts(cache);
    acct->bytes_read = 0;
    cache->st.io_wait_s = cache->st.read_s = 0;
    cache->st.reads = 0;
    return PI2_OK;
}

pi2_status pi2_cache_create(const pi2_model *m, const pi2_stream_params *p, pi2_cache **out) {
    *out = NULL;
    if (m->hp.arch == PI2_ARCH_MOE) {
        if (!p->path) return pi2_set_error(PI2_ERR_INVALID, "streaming needs the model's path");
        pi2_cache *cache = calloc(1, sizeof *cache);
        if (!cache || !(cache->path = strdup(p->path))) {
            free(cache);
            return pi2_set_error(PI2_ERR_NOMEM, "out of memory for the expert cache");
        }
        cache->m = m;
        cache->n_layer = m->hp.n_layer;
        cache->cluster = 1;
        const pi2_status s = experts_create(cache, p);
        if (s) {
            pi2_cache_free(cache);
            return s;
        }
        *out = cache;
        return PI2_OK;
    }
    pi2_stream_sizes sizes;
    pi2_status s = pi2_stream_query(m, p->cluster, 0, 0, &sizes);
    if (s) return s;
    if (!p->path) return pi2_set_error(PI2_ERR_INVALID, "streaming needs the model's path");
    if (p->n_slots < sizes.min_slots || p->n_slots > (1 << 24))
        return pi2_set_error(PI2_ERR_INVALID, "%d cluster slots: streaming needs at least %lld (one layer's clusters)",
                             (int)p->n_slots, (long long)sizes.min_slots);
    if (p->stream_gate && (p->n_gate_slots < sizes.min_slots || p->n_gate_slots > (1 << 24)))
        return pi2_set_error(PI2_ERR_INVALID, "%d gate-cluster slots: streaming gate rows needs at least %lld (one "
                             "layer's clusters)", (int)p->n_gate_slots, (long long)sizes.min_slots);
    pi2_cache *cache = calloc(1, sizeof *cache);
    if (!cache || !(cache->path = strdup(p->path))) {
        free(cache);
        return pi2_set_error(PI2_ERR_NOMEM, "out of memory for the neuron cache");
    }
    cache->m = m;
    cache->cluster = p->cluster;
    cache->n_layer = m->hp.n_layer;
    cache->n_ff = m->hp.n_ff;
    cache->n_cl = (cache->n_ff + cache->cluster - 1) / cache->cluster;
    cache->n_parts = p->stream_gate ? 2 : 1;
    if ((s = part_init(cache, PI2_PART_BUNDLES, p->n_hot, p->n_slots, sizes.slot_bytes,
                       p->stream_gate ? NULL : p->n_early)) ||
        (p->stream_gate &&
         (s = part_init(cache, PI2_PART_GATE, p->n_gate_hot, p->n_gate_slots, sizes.gate_slot_bytes, NULL))))
        goto fail;
    pi2_io_params iop = io_default_params();
    iop.backend = p->backend;
    iop.queue_depth = p->queue_depth;
    iop.direct = p->direct;
    pi2_io_info info;
    if ((s = pi2_io_open(p->path, &iop, &cache->io, &info))) goto fail;
    if ((size_t)info.file_size != m->map_size) {
        s = pi2_set_error(PI2_ERR_INVALID, "%s has %lld bytes, the loaded model %zu: not the same file", p->path,
                          (long long)info.file_size, m->map_size);
        goto fail;
    }
    for (int32_t which = 0; which < cache->n_parts; which++)
        if ((s = read_hot(cache, &cache->part[which]))) goto fail;
    advise(cache);
    for (int32_t which = 0; which < cache->n_parts; which++) cache->part[which].bytes_read = 0;
    cache->st.io_wait_s = cache->st.read_s = 0;
    cache->st.reads = 0;
    *out = cache;
    return PI2_OK;
fail:
    pi2_cache_free(cache);
    return s;
}

void pi2_cache_get_stats(const pi2_cache *cache, pi2_cache_stats *out) {
    const pi2_part *bundles = &cache->part[PI2_PART_BUNDLES], *gate = &cache->part[PI2_PART_GATE];
    *out = cache->st;
    out->size = (uint32_t)sizeof *out;
    out->hot = bundles->hot;
    out->hits = bundles->hits;
    out->misses = bundles->misses;
    out->layer_loads = bundles->layer_loads;
    out->gate_hot = gate->hot;
    out->gate_hits = gate->hits;
    out->gate_misses = gate->misses;
    out->gate_layer_loads = gate->layer_loads;
    out->gate_bytes_read = gate->bytes_read;
    out->bytes_read = bundles->bytes_read + gate->bytes_read;
    out->gate_arena_bytes = (int64_t)gate->arena_bytes;
    out->gate_hot_bytes = (int64_t)gate->hot_bytes;
    out->arena_bytes = (int64_t)(bundles->arena_bytes + gate->arena_bytes);
    out->hot_bytes = (int64_t)(bundles->hot_bytes + gate->hot_bytes);
    const pi2_expert_cache *ec = cache->experts;
    if (ec) {
        out->expert_hot = ec->hot;
        out->expert_hits = ec->hits;
        out->expert_misses = ec->misses;
        out->expert_pinned = ec->slots.n_slots - ec->slots.n_list;
        out->expert_pinned_hits = ec->pinned_hits;
        out->expert_partial_hits = ec->partial_hits;
        out->expert_cl_need = ec->cl_need;
        out->expert_cl_found = ec->cl_found;
        out->expert_held_bytes = ec->held_total;
        out->expert_evicted = ec->evicted;
        out->expert_slots_held = 0;
        for (int32_t i = 0; i < ec->slots.n_slots; i++) out->expert_slots_held += ec->slots.s_layer[i] >= 0;
        out->bytes_read += ec->bytes_read;
        out->hot_bytes += (int64_t)((size_t)ec->n_hot * ec->slot_bytes);
        out->arena_bytes += (int64_t)((size_t)ec->n_hot * ec->slot_bytes) +
                            (ec->cap ? ec->cap : (int64_t)((size_t)ec->slots.n_slots * ec->slot_bytes));
    }
}
