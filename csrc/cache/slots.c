/* cache_pool.c — the LRU of cold cluster slots of the neuron cache (cache_pool.h).
 * Does: which slot holds which cluster of which layer; find, take (the least recently used), forget; an
 *       invariant check for tests.
 * Does not: own the slots' bytes or read them (cache.c, cache_read.c).
 * Invariants: the LRU list holds every slot once; slot_of[il][cl] == s exactly when slot s holds (il, cl). */
#include "cache/slots.h"

#include "internal.h"

#include <stdlib.h>

pi2_status pi2_slots_init(pi2_slots *p, int32_t n_slots, int32_t n_layer, int32_t n_cl) {
    *p = (pi2_slots){.n_slots = n_slots, .n_layer = n_layer, .n_cl = n_cl, .head = -1, .tail = -1};
    const size_t S = (size_t)(n_slots > 0 ? n_slots : 1), N = (size_t)n_layer * (size_t)n_cl;
    p->s_layer = malloc(S * sizeof(int32_t));
    p->s_cl = malloc(S * sizeof(int32_t));
    p->prev = malloc(S * sizeof(int32_t));
    p->next = malloc(S * sizeof(int32_t));
    p->slot_of = malloc((N ? N : 1) * sizeof(int32_t));
    if (!p->s_layer || !p->s_cl || !p->prev || !p->next || !p->slot_of) {
        pi2_slots_free(p);
        return pi2_set_error(PI2_ERR_NOMEM, "out of memory for %d cluster slots", (int)n_slots);
    }
    for (size_t i = 0; i < N; i++) p->slot_of[i] = -1;
    for (int32_t i = 0; i < n_slots; i++) {
        p->s_layer[i] = p->s_cl[i] = -1;
        p->prev[i] = i - 1;
        p->next[i] = i + 1 < n_slots ? i + 1 : -1;
    }
    p->head = n_slots ? 0 : -1;
    p->tail = n_slots - 1;
    return PI2_OK;
}

void pi2_slots_free(pi2_slots *p) {
    void *bufs[] = {p->s_layer, p->s_cl, p->prev, p->next, p->slot_of};
    for (size_t i = 0; i < sizeof bufs / sizeof bufs[0]; i++) free(bufs[i]);
    *p = (pi2_slots){.head = -1, .tail = -1};
}

static void unlink_slot(pi2_slots *p, int32_t i) {
    if (p->prev[i] >= 0) p->next[p->prev[i]] = p->next[i]; else p->head = p->next[i];
    if (p->next[i] >= 0) p->prev[p->next[i]] = p->prev[i]; else p->tail = p->prev[i];
}

static void to_front(pi2_slots *p, int32_t i) {
    unlink_slot(p, i);
    p->prev[i] = -1;
    p->next[i] = p->head;
    if (p->head >= 0) p->prev[p->head] = i; else p->tail = i;
    p->head = i;
}

int32_t pi2_slots_find(pi2_slots *p, int32_t il, int32_t cl) {
    const int32_t s = p->slot_of[(size_t)il * p->n_cl + cl];
    if (s >= 0) to_front(p, s);
    return s;
}

void pi2_slots_forget(pi2_slots *p, int32_t s) {
    if (p->s_layer[s] >= 0) p->slot_of[(size_t)p->s_layer[s] * p->n_cl + p->s_cl[s]] = -1;
    p->s_layer[s] = p->s_cl[s] = -1;
}

int32_t pi2_slots_take(pi2_slots *p, int32_t il, int32_t cl) {
    const int32_t s = p->tail;
    pi2_slots_forget(p, s);
    to_front(p, s);
    p->s_layer[s] = il;
    p->s_cl[s] = cl;
    p->slot_of[(size_t)il * p->n_cl + cl] = s;
    return s;
}

void pi2_slots_clear(pi2_slots *p) {
    for (int32_t i = 0; i < p->n_slots; i++) pi2_slots_forget(p, i);
}

int32_t pi2_slots_check(const pi2_slots *p) {
    int32_t n = 0, last = -1;
    for (int32_t i = p->head; i >= 0; last = i, i = p->next[i]) {
        if (++n > p->n_slots || p->prev[i] != last) return 1;   /* a cycle, or a broken back link */
        if (p->s_layer[i] >= 0 && p->slot_of[(size_t)p->s_layer[i] * p->n_cl + p->s_cl[i]] != i) return 2;
    }
    if (n != p->n_slots || p->tail != last) return 3;            /* a slot missing from the list */
    int32_t held = 0;
    for (size_t k = 0; k < (size_t)p->n_layer * (size_t)p->n_cl; k++) {
        const int32_t s = p->slot_of[k];
        if (s < -1 || s >= p->n_slots) return 4;
        if (s >= 0 && ((size_t)p->s_layer[s] * p->n_cl + p->s_cl[s] != k)) return 2;
        held += s >= 0;
    }
    return held <= p->n_slots ? 0 : 5;
}
