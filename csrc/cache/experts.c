/* cache/experts.c — the expert cache of a streamed MoE context (experts.h): each layer's expert slices in the file,
 *       the slot layout (three 4 KiB-aligned spans: gate, up, down), the cold slots' LRU and the hot records.
 * Does not: read (cache.c reads the hot records at creation; csrc/pipeline/experts.c the misses) or compute.
 * Invariants: a slice's span fits its place in every slot; a hot expert is never in a cold slot. */
#define _GNU_SOURCE
#include "cache/experts.h"
#include "cache/cache.h"

#include <stdlib.h>
#include <string.h>

static const pi2_weight *slice_weight(const pi2_layer *L, int32_t w) {
    return w == PI2_EXPERT_GATE ? &L->gate_exps : w == PI2_EXPERT_UP ? &L->up_exps : &L->down_exps;
}

/* Layer il's expert slices (bytes 0 when the layer has none), or UNSUPPORTED when only some of them exist. A converted
 * file's layer: the gate rows, and the bundle records (up_exps is a strided view of them: row_bytes = the record's
 * width, so expert e's records are n_out·row_bytes bytes from data + e·n_out·row_bytes; the down rows inside). */
static pi2_status region_of(const pi2_model *m, int32_t il, pi2_expert_region *r) {
    const pi2_layer *L = &m->layers[il];
    memset(r, 0, sizeof *r);
    if (L->down_rows_exps.data) {
        const pi2_weight *up = &L->up_exps, *down = &L->down_rows_exps;
        if (!L->gate_exps.data || !up->data || down->data < up->data || down->row_bytes != up->row_bytes ||
            down->n_out != up->n_out || (size_t)(down->data - up->data) >= up->row_bytes)
            return pi2_set_error(PI2_ERR_UNSUPPORTED, "layer %d's expert bundles are not one record per neuron",
                                 (int)il);
        for (int32_t w = 0; w < PI2_EXPERT_DOWN; w++) {
            const pi2_weight *t = slice_weight(L, w);
            r->off[w] = t->data - m->map;
            r->bytes[w] = t->n_out * (int64_t)t->row_bytes;
        }
        r->down_at = down->data - up->data;
        r->cl_bytes = (int64_t)PI2_EXPERT_CLUSTER * (int64_t)up->row_bytes;
        return PI2_OK;
    }
    int present = 0;
    for (int32_t w = 0; w < PI2_EXPERT_SLICES; w++) present += slice_weight(L, w)->data != NULL;
    if (!present) return PI2_OK;
    if (present < PI2_EXPERT_SLICES)
        return pi2_set_error(PI2_ERR_UNSUPPORTED, "layer %d has only some of ffn_{gate,up,down}_exps", (int)il);
    for (int32_t w = 0; w < PI2_EXPERT_SLICES; w++) {
        const pi2_weight *t = slice_weight(L, w);
        r->off[w] = t->data - m->map;
        r->bytes[w] = t->n_out * (int64_t)t->row_bytes;
    }
    return PI2_OK;
}

static int64_t span_room(int64_t bytes) { return pi2_align_up(bytes) + PI2_IO_ALIGN; }

pi2_status pi2_expert_slot_bytes(const pi2_model *m, int64_t *out) {
    *out = 0;
    if (m->hp.arch != PI2_ARCH_MOE || m->hp.n_expert <= 0)
        return pi2_set_error(PI2_ERR_UNSUPPORTED, "the model has no experts to stream");
    int64_t room[PI2_EXPERT_SLICES] = {0};
    for (int32_t il = 0; il < m->hp.n_layer; il++) {
        pi2_expert_region r;
        const pi2_status s = region_of(m, il, &r);
        if (s) return s;
        for (int32_t w = 0; w < PI2_EXPERT_SLICES; w++)
            if (r.bytes[w] && span_room(r.bytes[w]) > room[w]) room[w] = span_room(r.bytes[w]);
    }
    *out = room[0] + room[1] + room[2];
    if (!*out) return pi2_set_error(PI2_ERR_UNSUPPORTED, "the model has no expert tensors to stream");
    return PI2_OK;
}

void pi2_expert_span(const pi2_expert_cache *ec, int32_t il, int32_t e, int32_t w, int64_t *start, int64_t *end,
                     int64_t *need) {
    const pi2_expert_region *r = &ec->layers[il];
    const int64_t off = r->off[w] + (int64_t)e * r->bytes[w];
    *start = pi2_align_down(off);
    *end = pi2_align_up(off + r->bytes[w]);
    if (need) *need = off + r->bytes[w];
}

const uint8_t *pi2_expert_rows_in(const pi2_expert_cache *ec, const uint8_t *rec, int32_t il, int32_t e, int32_t w) {
    const pi2_expert_region *r = &ec->layers[il];
    if (!r->bytes[w] && r->down_at) return pi2_expert_rows_in(ec, rec, il, e, PI2_EXPERT_UP) + r->down_at;
    const int64_t off = r->off[w] + (int64_t)e * r->bytes[w];
    return rec + ec->span_at[w] + (off - pi2_align_down(off));
}

void pi2_expert_cluster_span(const pi2_expert_cache *ec, int32_t il, int32_t e, int32_t c0, int32_t c1, int64_t *start,
                             int64_t *end, int64_t *need, int32_t *full0, int32_t *full1) {
    const pi2_expert_region *r = &ec->layers[il];
    const int64_t base = r->off[PI2_EXPERT_UP] + (int64_t)e * r->bytes[PI2_EXPERT_UP], top = base + r->bytes[PI2_EXPERT_UP];
    const int64_t cb = r->cl_bytes, a = base + (int64_t)c0 * cb, b = base + (int64_t)c1 * cb < top ? base + (int64_t)c1 * cb : top;
    *start = pi2_align_down(a);
    *end = pi2_align_up(b);
    *need = b;
    /* the clusters wholly inside [start, end) (the last one of an expert may be short: it ends at top) */
    *full0 = (int32_t)(*start > base ? (*start - base + cb - 1) / cb : 0);
    *full1 = *end >= top ? ec->n_cl : (int32_t)((*end - base) / cb);
}

void pi2_expert_cache_free(pi2_expert_cache *ec) {
    pi2_slots_free(&ec->slots);
    free(ec->present);
    free(ec->layers);
    free(ec->hot_of);
    free(ec->hot_arena);
    free(ec->arena);
    free(ec->score);
    free(ec->want);
    free(ec->order);
    free(ec->held);
    free(ec->mark);
    free(ec->pages);
    free(ec->pre);
    memset(ec, 0, sizeof *ec);
}

pi2_status pi2_expert_cache_init(pi2_expert_cache *ec, const pi2_model *m, int32_t n_slots, const uint8_t *hot) {
    memset(ec, 0, sizeof *ec);
    int64_t slot_bytes;
    pi2_status s = pi2_expert_slot_bytes(m, &slot_bytes);
    if (s) return s;
    const int32_t L = m->hp.n_layer, X = m->hp.n_expert;
    if (n_slots < 1 || n_slots > (1 << 24))
        return pi2_set_error(PI2_ERR_INVALID, "%d expert slots: streaming experts needs at least 1", (int)n_slots);
    ec->n_layer = L;
    ec->n_expert = X;
    ec->slot_bytes = (size_t)slot_bytes;
    ec->layers = calloc((size_t)L, sizeof *ec->layers);
    ec->hot_of = malloc((size_t)L * (size_t)X * sizeof *ec->hot_of);
    if (!ec->layers || !ec->hot_of) return pi2_set_error(PI2_ERR_NOMEM, "out of memory for the expert cache");
    for (int32_t il = 0; il < L; il++)
        if ((s = region_of(m, il, &ec->layers[il]))) return s;
    int64_t at = 0;
    for (int32_t w = 0; w < PI2_EXPERT_SLICES; w++) {
        int64_t room = 0;
        for (int32_t il = 0; il < L; il++)
            if (ec->layers[il].bytes[w] && span_room(ec->layers[il].bytes[w]) > room) room = span_room(ec->layers[il].bytes[w]);
        ec->span_at[w] = at;
        at += room;
    }
    for (int32_t i = 0; i < L * X; i++) {
        const int is_hot = hot && hot[i] && pi2_expert_layer(ec, i / X);
        ec->hot_of[i] = is_hot ? ec->n_hot++ : -1;
    }
    if ((s = pi2_slots_init(&ec->slots, n_slots, L, X))) return s;
    ec->held = calloc((size_t)n_slots, sizeof *ec->held);
    ec->mark = calloc((size_t)n_slots, sizeof *ec->mark);
    ec->page_words = (int32_t)((ec->slot_bytes / PI2_IO_ALIGN + 7) / 8);
    ec->pages = calloc((size_t)n_slots, (size_t)ec->page_words);
    if (!ec->held || !ec->mark || !ec->pages) return pi2_set_error(PI2_ERR_NOMEM, "out of memory for the expert cache");
    ec->epoch = 1;
    if (posix_memalign((void **)&ec->arena, PI2_IO_ALIGN, (size_t)n_slots * ec->slot_bytes)) {
        ec->arena = NULL;
        return pi2_set_error(PI2_ERR_NOMEM, "out of memory for %d expert slots of %zu bytes", (int)n_slots,
                             ec->slot_bytes);
    }
    for (int32_t il = 0; il < L; il++)   /* a converted file: which clusters of each slot are present */
        if (ec->layers[il].down_at) ec->n_cl = (int32_t)((m->hp.n_ff_exp + PI2_EXPERT_CLUSTER - 1) / PI2_EXPERT_CLUSTER);
    if (ec->n_cl && !(ec->present = calloc((size_t)n_slots * (size_t)ec->n_cl, 1)))
        return pi2_set_error(PI2_ERR_NOMEM, "out of memory for the expert slots' clusters");
    if (ec->n_hot && posix_memalign((void **)&ec->hot_arena, PI2_IO_ALIGN, (size_t)ec->n_hot * ec->slot_bytes)) {
        ec->hot_arena = NULL;
        return pi2_set_error(PI2_ERR_NOMEM, "out of memory for %d hot experts of %zu bytes", (int)ec->n_hot,
                             ec->slot_bytes);
    }
    return PI2_OK;
}
