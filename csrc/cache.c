/* cache.c — the neuron cache of a streamed context: resident hot prefix per layer + LRU of cold cluster slots.
 * Does: find each layer's bundle region from its up and down row views; size and allocate one 4 KiB-aligned
 *       arena (hot prefixes, then slots); read the hot prefixes at creation; per token and layer, look up the
 *       needed clusters, submit the misses (reads land in the slots) and reap them; read whole layers for
 *       batches; advise the kernel away from the mapped bundle range; count hits, misses, bytes and waits.
 * Does not: keep the LRU of slots (cache_pool.c), compute (ffn_sparse.c) or choose sizes (the planner, in Python).
 * Invariants: slots in use by the current layer are never evicted (n_slots >= the largest layer's clusters);
 *       nothing is written back; arena offsets < 2 GiB. */
#define _GNU_SOURCE
#include "cache.h"

#include "cache_pool.h"
#include "internal.h"
#include "kernels/traits.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <time.h>

#define A PI2_IO_ALIGN
#define LOAD_CHUNK (1u << 20)   /* bytes per request of a whole-layer read */

typedef struct {
    int64_t up_off, down_off, rec0;  /* file offsets of neuron 0's up row, down row and record */
    int64_t bb;                      /* record stride */
    int32_t n_cl, hot_cl;            /* clusters; of which resident */
    int64_t hot_delta;               /* arena + hot_delta + file offset = the byte, for hot clusters */
} layer_t;

struct pi2_cache {
    const pi2_model *m;
    int32_t C, n_slots, n_layer, n_ff;
    size_t slot_bytes, slots_off, arena_bytes, hot_bytes;
    uint8_t *arena;
    pi2_io *io;
    layer_t *L;
    pi2_slots slots;                         /* which cold cluster each slot holds */
    int64_t *delta;                          /* [max n_cl] the current layer's cluster deltas */
    pi2_io_request *reqs;                    /* [max n_cl] the current layer's misses */
    int32_t n_req, n_sub, n_wait;            /* misses, of which submitted, of which reaped */
    int32_t *g_pending;                      /* [groups] the current layer's reads each group waits for */
    int32_t cur;                             /* current layer */
    double t_submit;
    pi2_cache_stats st;
};

static double now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

static int64_t down_a(int64_t x) { return x / A * A; }
static int64_t up_a(int64_t x) { return (x + A - 1) / A * A; }

/* The bundle region of layer il: (rec0, bb), or UNSUPPORTED. */
static pi2_status layout(const pi2_model *m, int32_t il, layer_t *out) {
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
    out->up_off = up;
    out->down_off = down;
    out->rec0 = rec0;
    out->bb = bb;
    return PI2_OK;
}

/* File span [*s, *e) of clusters [c0, c1) of a layer, 4 KiB-aligned. */
static void span(const pi2_cache *k, const layer_t *l, int32_t c0, int32_t c1, int64_t *s, int64_t *e) {
    const int64_t n1 = (int64_t)c1 * k->C < k->n_ff ? (int64_t)c1 * k->C : k->n_ff;
    *s = down_a(l->rec0 + (int64_t)c0 * k->C * l->bb);
    *e = up_a(l->rec0 + n1 * l->bb);
}

static int64_t slot_need(int32_t C, int64_t bb) { return up_a(C * bb) + A; }

pi2_status pi2_stream_query(const pi2_model *m, int32_t cluster, int32_t layer, int32_t n_hot, pi2_stream_sizes *out) {
    if (!m || !out) return pi2_set_error(PI2_ERR_INVALID, "NULL model or output");
    if (cluster <= 0 || PI2_FFN_GROUP % cluster || cluster < 8)
        return pi2_set_error(PI2_ERR_INVALID, "cluster size %d does not divide %d (8, 16, 32 or 64)", (int)cluster,
                             (int)PI2_FFN_GROUP);
    if (layer < 0 || layer >= m->hp.n_layer) return pi2_set_error(PI2_ERR_INVALID, "no layer %d", (int)layer);
    memset(out, 0, sizeof *out);
    const int32_t n_cl = (m->hp.n_ff + cluster - 1) / cluster;
    for (int32_t il = 0; il < m->hp.n_layer; il++) {
        layer_t l = {0};
        pi2_status s = layout(m, il, &l);
        if (s) return s;
        if (slot_need(cluster, l.bb) > out->slot_bytes) out->slot_bytes = slot_need(cluster, l.bb);
        if (il == layer) {
            const int32_t hc = (n_hot < 0 ? 0 : n_hot > m->hp.n_ff ? m->hp.n_ff : n_hot) / cluster;
            const int64_t nh = (int64_t)hc * cluster < m->hp.n_ff ? (int64_t)hc * cluster : m->hp.n_ff;
            out->hot_bytes = hc ? up_a(l.rec0 + nh * l.bb) - down_a(l.rec0) : 0;
            out->bundle_bytes = l.bb;
            out->layer_bytes = up_a(l.rec0 + (int64_t)m->hp.n_ff * l.bb) - down_a(l.rec0);
        }
    }
    out->min_slots = n_cl;
    return PI2_OK;
}

void pi2_cache_free(pi2_cache *k) {
    if (!k) return;
    pi2_io_close(k->io);
    pi2_slots_free(&k->slots);
    void *bufs[] = {k->L, k->delta, k->reqs, k->g_pending};
    for (size_t i = 0; i < sizeof bufs / sizeof bufs[0]; i++) free(bufs[i]);
    free(k->arena);
    free(k);
}

/* Read [s, e) of the file into dst in requests of at most LOAD_CHUNK; the bytes up to `need` must arrive. */
static pi2_status read_range(pi2_cache *k, int64_t s, int64_t e, int64_t need, uint8_t *dst) {
    enum { BATCH = 64 };
    pi2_io_request r[BATCH];
    pi2_io_completion c[BATCH];
    const double t0 = now();
    for (int64_t off = s; off < e;) {
        int32_t n = 0;
        for (; n < BATCH && off < e; n++, off += LOAD_CHUNK) {
            const int64_t len = e - off < LOAD_CHUNK ? e - off : LOAD_CHUNK;
            r[n] = (pi2_io_request){.offset = (uint64_t)off, .length = (uint64_t)len, .dest = dst + (off - s)};
        }
        pi2_status st = pi2_io_read_all(k->io, r, n, c);
        if (st) return st;
        for (int32_t i = 0; i < n; i++) {
            const int64_t want = (int64_t)r[i].offset + (int64_t)r[i].length <= need ? (int64_t)r[i].length
                                                                                      : need - (int64_t)r[i].offset;
            k->st.reads++;
            k->st.bytes_read += (int64_t)r[i].length;
            if ((c[i].error && c[i].error != ENODATA) || c[i].nbytes < want)
                return pi2_set_error(PI2_ERR_IO, "reading %lld bytes of bundles at offset %lld: %s",
                                     (long long)r[i].length, (long long)r[i].offset,
                                     c[i].error ? strerror(c[i].error) : "short read");
        }
    }
    const double dt = now() - t0;
    k->st.io_wait_s += dt;
    k->st.read_s += dt;
    return PI2_OK;
}

static void willneed(const pi2_model *m, const pi2_weight *w) {
    if (!w->data) return;
    const int64_t s = down_a(w->data - m->map), e = up_a((w->data - m->map) + w->n_out * (int64_t)w->row_bytes);
    madvise((void *)(m->map + s), (size_t)((e < (int64_t)m->map_size ? e : (int64_t)m->map_size) - s), MADV_WILLNEED);
}

/* Keep the bundles out of the page cache: no read-ahead anywhere in the mapping (a fault in the fixed region
 * would read the neighbouring bundles), the bundle ranges dropped from it, the file's cached pages that no
 * mapping holds dropped (what reading the file's tables left), then the fixed region's matrices read ahead. */
static void advise(pi2_cache *k) {
    const pi2_model *m = k->m;
    madvise((void *)m->map, m->map_size, MADV_RANDOM);
    for (int32_t il = 0; il < k->n_layer; il++) {
        int64_t fs, fe;
        span(k, &k->L[il], 0, k->L[il].n_cl, &fs, &fe);
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
        willneed(m, &L->gate);
    }
}

pi2_status pi2_cache_create(const pi2_model *m, const pi2_stream_params *p, pi2_cache **out) {
    *out = NULL;
    const pi2_model_params *hp = &m->hp;
    pi2_stream_sizes q;
    pi2_status s = pi2_stream_query(m, p->cluster, 0, 0, &q);
    if (s) return s;
    if (!p->path) return pi2_set_error(PI2_ERR_INVALID, "streaming needs the model's path");
    if (p->n_slots < q.min_slots || p->n_slots > (1 << 24))
        return pi2_set_error(PI2_ERR_INVALID, "%d cluster slots: streaming needs at least %lld (one layer's clusters)",
                             (int)p->n_slots, (long long)q.min_slots);
    pi2_cache *k = calloc(1, sizeof *k);
    if (!k) return pi2_set_error(PI2_ERR_NOMEM, "out of memory for the neuron cache");
    k->m = m;
    k->C = p->cluster;
    k->n_slots = p->n_slots;
    k->n_layer = hp->n_layer;
    k->n_ff = hp->n_ff;
    k->slot_bytes = (size_t)q.slot_bytes;
    k->cur = -1;
    const int32_t n_cl = (hp->n_ff + k->C - 1) / k->C, S = k->n_slots;
    k->L = calloc((size_t)hp->n_layer, sizeof *k->L);
    k->delta = malloc((size_t)n_cl * sizeof(int64_t));
    k->reqs = malloc((size_t)n_cl * sizeof(pi2_io_request));
    k->g_pending = calloc((size_t)hp->n_ff / PI2_FFN_GROUP + 1, sizeof(int32_t));
    if (!k->g_pending || !k->L || !k->delta || !k->reqs || pi2_slots_init(&k->slots, S, hp->n_layer, n_cl)) goto nomem;
    size_t off = 0;
    for (int32_t il = 0; il < hp->n_layer; il++) {
        layer_t *l = &k->L[il];
        layout(m, il, l);
        l->n_cl = n_cl;
        const int32_t h = p->n_hot ? p->n_hot[il] : 0;
        if (h < 0 || h > hp->n_ff) {
            pi2_cache_free(k);
            return pi2_set_error(PI2_ERR_INVALID, "layer %d: %d hot neurons of %d", (int)il, (int)h, (int)hp->n_ff);
        }
        l->hot_cl = h == hp->n_ff ? n_cl : h / k->C;
        if (l->hot_cl) {
            int64_t fs, fe;
            span(k, l, 0, l->hot_cl, &fs, &fe);
            l->hot_delta = (int64_t)off - fs;
            off += (size_t)(fe - fs);
        }
    }
    k->hot_bytes = off;
    k->slots_off = off;
    k->arena_bytes = off + (size_t)S * k->slot_bytes;
    if (k->arena_bytes >= (size_t)1 << 31) {
        pi2_cache_free(k);
        return pi2_set_error(PI2_ERR_INVALID, "a neuron cache of %zu bytes: at most 2 GiB", k->arena_bytes);
    }
    if (posix_memalign((void **)&k->arena, A, k->arena_bytes)) { k->arena = NULL; goto nomem; }
    pi2_io_params iop = pi2_io_default_params();
    iop.backend = p->backend;
    iop.queue_depth = p->queue_depth;
    iop.direct = p->direct;
    if ((s = pi2_io_open(p->path, &iop, &k->io))) { pi2_cache_free(k); return s; }
    pi2_io_info info;
    pi2_io_get_info(k->io, &info);
    if ((size_t)info.file_size != m->map_size) {
        pi2_cache_free(k);
        return pi2_set_error(PI2_ERR_INVALID, "%s has %lld bytes, the loaded model %zu: not the same file", p->path,
                             (long long)info.file_size, m->map_size);
    }
    for (int32_t il = 0; il < hp->n_layer; il++) {   /* hot prefixes */
        layer_t *l = &k->L[il];
        int64_t fs, fe;
        if (l->hot_cl) {
            span(k, l, 0, l->hot_cl, &fs, &fe);
            const int64_t nh = (int64_t)l->hot_cl * k->C < k->n_ff ? (int64_t)l->hot_cl * k->C : k->n_ff;
            if ((s = read_range(k, fs, fe, l->rec0 + nh * l->bb, k->arena + (fs + l->hot_delta)))) {
                pi2_cache_free(k);
                return s;
            }
        }
    }
    advise(k);
    k->st.arena_bytes = (int64_t)k->arena_bytes;

    k->st.hot_bytes = (int64_t)k->hot_bytes;
    k->st.io_wait_s = k->st.read_s = 0;
    k->st.reads = k->st.bytes_read = 0;
    *out = k;
    return PI2_OK;
nomem:
    pi2_cache_free(k);
    return pi2_set_error(PI2_ERR_NOMEM, "out of memory for the neuron cache");
}

static void drain(pi2_cache *k, pi2_status why);

pi2_status pi2_cache_begin(pi2_cache *k, int32_t il, const int32_t *idx, int32_t n, uint8_t *ready) {
    layer_t *l = &k->L[il];
    const int32_t n_groups = (k->n_ff + PI2_FFN_GROUP - 1) / PI2_FFN_GROUP;
    memset(ready, 1, (size_t)n_groups);
    memset(k->g_pending, 0, (size_t)n_groups * sizeof(int32_t));
    k->cur = il;
    k->n_req = k->n_sub = k->n_wait = 0;
    if (il == 0) k->st.tokens++;
    for (int32_t i = 0; i < n;) {   /* each needed cluster once, ascending; the LRU's front is the needed set */
        const int32_t cl = idx[i] / k->C;
        while (i < n && idx[i] / k->C == cl) i++;
        if (cl < l->hot_cl) { k->delta[cl] = l->hot_delta; k->st.hot++; continue; }
        int32_t s = pi2_slots_find(&k->slots, il, cl);
        if (s >= 0) {
            k->st.hits++;
        } else {   /* the LRU's tail was not used by this layer: the needed set is smaller than n_slots */
            s = pi2_slots_take(&k->slots, il, cl);
            k->st.misses++;
            int64_t fs, fe;
            span(k, l, cl, cl + 1, &fs, &fe);
            k->reqs[k->n_req++] = (pi2_io_request){.offset = (uint64_t)fs, .length = (uint64_t)(fe - fs),
                                                   .dest = k->arena + k->slots_off + (size_t)s * k->slot_bytes,
                                                   .user = (uint64_t)cl};
            ready[cl * k->C / PI2_FFN_GROUP] = 0;
            k->g_pending[cl * k->C / PI2_FFN_GROUP]++;
        }
        int64_t fs, fe;
        span(k, l, cl, cl + 1, &fs, &fe);
        k->delta[cl] = (int64_t)(k->slots_off + (size_t)s * k->slot_bytes) - fs;
    }
    if (!k->n_req) return PI2_OK;
    k->t_submit = now();
    int32_t acc = 0;
    pi2_status st = pi2_io_submit(k->io, k->reqs, k->n_req, &acc);
    k->n_sub = acc;
    if (st) drain(k, st);
    return st;
}

/* Check one completion of the current layer; forget its slot when it failed. */
static pi2_status check_done(pi2_cache *k, const pi2_io_completion *c) {
    const layer_t *l = &k->L[k->cur];
    const int32_t cl = (int32_t)c->user;
    int64_t fs, fe;
    span(k, l, cl, cl + 1, &fs, &fe);
    const int64_t n1 = (int64_t)(cl + 1) * k->C < k->n_ff ? (int64_t)(cl + 1) * k->C : k->n_ff;
    const int64_t need = l->rec0 + n1 * l->bb - fs;
    k->st.reads++;
    k->st.bytes_read += fe - fs;
    if ((c->error && c->error != ENODATA) || c->nbytes < need) {
        const int32_t s = pi2_slots_holding(&k->slots, k->cur, cl);
        if (s >= 0) pi2_slots_forget(&k->slots, s);
        return pi2_set_error(PI2_ERR_IO, "reading the bundles of layer %d cluster %d at offset %lld: %s", (int)k->cur,
                             (int)cl, (long long)fs, c->error ? strerror(c->error) : "short read");
    }
    return PI2_OK;
}

/* After an error: wait for what is still in flight, forget the clusters of the layer not read. */
static void drain(pi2_cache *k, pi2_status why) {
    (void)why;
    pi2_io_completion done[64];
    int32_t got;
    while (pi2_io_in_flight(k->io) > 0 && !pi2_io_reap(k->io, done, 64, 1, &got)) {}
    for (int32_t i = 0; i < k->n_req; i++) {
        const int32_t s = pi2_slots_holding(&k->slots, k->cur, (int32_t)k->reqs[i].user);
        if (s >= 0) pi2_slots_forget(&k->slots, s);
    }
    k->n_req = k->n_sub = k->n_wait = 0;
}

pi2_status pi2_cache_next(pi2_cache *k, int32_t *groups, int32_t *n_groups) {
    *n_groups = 0;
    pi2_io_completion done[64];
    while (!*n_groups && k->n_wait < k->n_req) {
        if (k->n_sub < k->n_req) {   /* the queue was full at begin: top it up */
            int32_t acc = 0;
            pi2_status s = pi2_io_submit(k->io, k->reqs + k->n_sub, k->n_req - k->n_sub, &acc);
            k->n_sub += acc;
            if (s) { drain(k, s); return s; }
        }
        int32_t got = 0;
        const double t0 = now();
        pi2_status s = pi2_io_reap(k->io, done, 64, 1, &got);
        k->st.io_wait_s += now() - t0;
        if (s) { drain(k, s); return s; }
        for (int32_t i = 0; i < got; i++) {
            if ((s = check_done(k, &done[i]))) { k->n_wait += got; drain(k, s); return s; }
            const int32_t g = (int32_t)done[i].user * k->C / PI2_FFN_GROUP;
            if (--k->g_pending[g] == 0) groups[(*n_groups)++] = g;
        }
        k->n_wait += got;
        if (k->n_wait == k->n_req) k->st.read_s += now() - k->t_submit;
    }
    return PI2_OK;
}

const uint8_t *pi2_cache_arena(const pi2_cache *k) { return k->arena; }
int64_t pi2_cache_delta(const pi2_cache *k, int32_t cl) { return k->delta[cl]; }
int32_t pi2_cache_cluster(const pi2_cache *k) { return k->C; }

pi2_status pi2_cache_load_layer(pi2_cache *k, int32_t il, pi2_layer *view) {
    const layer_t *l = &k->L[il];
    int64_t fs, fe;
    span(k, l, 0, l->n_cl, &fs, &fe);
    if (l->hot_cl == l->n_cl) {   /* all resident: the hot region is the layer's bundle region */
        view->up.data = k->arena + l->hot_delta + l->up_off;
        view->down_rows.data = k->arena + l->hot_delta + l->down_off;
        return PI2_OK;
    }
    pi2_slots_clear(&k->slots);
    if ((size_t)(fe - fs) > (size_t)k->n_slots * k->slot_bytes)
        return pi2_set_error(PI2_ERR_INVALID, "layer %d's bundles (%lld bytes) do not fit the cluster slots", (int)il,
                             (long long)(fe - fs));
    uint8_t *dst = k->arena + k->slots_off;
    pi2_status s = read_range(k, fs, fe, l->rec0 + (int64_t)k->n_ff * l->bb, dst);
    if (s) return s;
    k->st.layer_loads++;
    view->up.data = dst + (l->up_off - fs);
    view->down_rows.data = dst + (l->down_off - fs);
    return PI2_OK;
}

void pi2_cache_get_stats(const pi2_cache *k, pi2_cache_stats *out) { *out = k->st; }
