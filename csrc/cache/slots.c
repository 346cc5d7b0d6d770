/* cache/slots.c — the LRU of cold cluster slots of the neuron cache (slots.h).
 * Does: which slot holds which cluster of which layer; find, take (the least recently used), forget; pin and
 *       unpin (a slot out of the list keeps its cluster); an invariant check for tests.
 * Does not: own the slots' bytes or read them (cache.c, read.c; the pipeline decides what to read), choose what
 *       to pin (cache/experts_learn.c).
 * Invariants: the LRU list holds every unpinned slot once (n_list of them); a pinned slot holds a cluster;
 *       slot_of[il][cl] == slot exactly when that slot holds (il, cl). */
#include "cache/slots.h"

#include "internal.h"

#include <stdlib.h>

pi2_status pi2_slots_init(pi2_slots *pool, int32_t n_slots, int32_t n_layer, int32_t n_cl) {
    *pool = (pi2_slots){.n_slots = n_slots, .n_layer = n_layer, .n_cl = n_cl, .head = -1, .tail = -1,
                        .n_list = n_slots};
    const size_t S = (size_t)(n_slots > 0 ? n_slots : 1), N = (size_t)n_layer * (size_t)n_cl;
    pool->s_layer = malloc(S * sizeof(int32_t));
    pool->s_cl = malloc(S * sizeof(int32_t));
    pool->prev = malloc(S * sizeof(int32_t));
    pool->next = malloc(S * sizeof(int32_t));
    pool->slot_of = malloc((N ? N : 1) * sizeof(int32_t));
    pool->pinned = calloc(S, 1);
    if (!pool->s_layer || !pool->s_cl || !pool->prev || !pool->next || !pool->slot_of || !pool->pinned) {
        pi2_slots_free(pool);
        return pi2_set_error(PI2_ERR_NOMEM, "out of memory for %d cluster slots", (int)n_slots);
    }
    for (size_t i = 0; i < N; i++) pool->slot_of[i] = -1;
    for (int32_t i = 0; i < n_slots; i++) {
        pool->s_layer[i] = pool->s_cl[i] = -1;
        pool->prev[i] = i - 1;
        pool->next[i] = i + 1 < n_slots ? i + 1 : -1;
    }
    pool->head = n_slots ? 0 : -1;
    pool->tail = n_slots - 1;
    return PI2_OK;
}

void pi2_slots_free(pi2_slots *pool) {
    void *bufs[] = {pool->s_layer, pool->s_cl, pool->prev, pool->next, pool->slot_of, pool->pinned};
    for (size_t i = 0; i < sizeof bufs / sizeof bufs[0]; i++) free(bufs[i]);
    *pool = (pi2_slots){.head = -1, .tail = -1};
}

static void unlink_slot(pi2_slots *pool, int32_t slot) {
    if (pool->prev[slot] >= 0) pool->next[pool->prev[slot]] = pool->next[slot]; else pool->head = pool->next[slot];
    if (pool->next[slot] >= 0) pool->prev[pool->next[slot]] = pool->prev[slot]; else pool->tail = pool->prev[slot];
}

static void to_front(pi2_slots *pool, int32_t slot) {
    unlink_slot(pool, slot);
    pool->prev[slot] = -1;
    pool->next[slot] = pool->head;
    if (pool->head >= 0) pool->prev[pool->head] = slot; else pool->tail = slot;
    pool->head = slot;
}

int32_t pi2_slots_find(pi2_slots *pool, int32_t il, int32_t cl) {
    const int32_t slot = pool->slot_of[(size_t)il * pool->n_cl + cl];
    if (slot >= 0 && !pool->pinned[slot]) to_front(pool, slot);
    return slot;
}

void pi2_slots_pin(pi2_slots *pool, int32_t slot) {
    if (pool->pinned[slot] || pool->s_layer[slot] < 0) return;
    unlink_slot(pool, slot);
    pool->prev[slot] = pool->next[slot] = -1;
    pool->pinned[slot] = 1;
    pool->n_list--;
}

void pi2_slots_unpin(pi2_slots *pool, int32_t slot) {
    if (!pool->pinned[slot]) return;
    pool->pinned[slot] = 0;
    pool->n_list++;
    pool->prev[slot] = pool->tail;
    pool->next[slot] = -1;
    if (pool->tail >= 0) pool->next[pool->tail] = slot; else pool->head = slot;
    pool->tail = slot;
}

void pi2_slots_forget(pi2_slots *pool, int32_t slot) {
    if (pool->s_layer[slot] >= 0) pool->slot_of[(size_t)pool->s_layer[slot] * pool->n_cl + pool->s_cl[slot]] = -1;
    pool->s_layer[slot] = pool->s_cl[slot] = -1;
    pi2_slots_unpin(pool, slot);
}

void pi2_slots_to_front(pi2_slots *pool, int32_t slot) {
    if (!pool->pinned[slot]) to_front(pool, slot);
}

void pi2_slots_to_tail(pi2_slots *pool, int32_t slot) {
    if (pool->pinned[slot] || pool->tail == slot) return;
    unlink_slot(pool, slot);
    pool->prev[slot] = pool->tail;
    pool->next[slot] = -1;
    if (pool->tail >= 0) pool->next[pool->tail] = slot; else pool->head = slot;
    pool->tail = slot;
}

int32_t pi2_slots_take(pi2_slots *pool, int32_t il, int32_t cl) {
    const int32_t slot = pool->tail;
    pi2_slots_forget(pool, slot);
    to_front(pool, slot);
    pool->s_layer[slot] = il;
    pool->s_cl[slot] = cl;
    pool->slot_of[(size_t)il * pool->n_cl + cl] = slot;
    return slot;
}

void pi2_slots_clear(pi2_slots *pool) {
    for (int32_t i = 0; i < pool->n_slots; i++) pi2_slots_forget(pool, i);
}

int32_t pi2_slots_check(const pi2_slots *pool) {
    int32_t n = 0, last = -1;
    for (int32_t i = pool->head; i >= 0; last = i, i = pool->next[i]) {
        if (++n > pool->n_slots || pool->prev[i] != last) return 1;   /* a cycle, or a broken back link */
        if (pool->pinned[i]) return 6;                                 /* a pinned slot in the list */
        if (pool->s_layer[i] >= 0 && pool->slot_of[(size_t)pool->s_layer[i] * pool->n_cl + pool->s_cl[i]] != i) return 2;
    }
    int32_t n_pinned = 0;
    for (int32_t i = 0; i < pool->n_slots; i++) {
        if (!pool->pinned[i]) continue;
        n_pinned++;
        if (pool->s_layer[i] < 0) return 7;                            /* a pinned slot that holds nothing */
        if (pool->slot_of[(size_t)pool->s_layer[i] * pool->n_cl + pool->s_cl[i]] != i) return 2;
    }
    if (n != pool->n_list || n + n_pinned != pool->n_slots || pool->tail != last) return 3;   /* a slot missing */
    int32_t held = 0;
    for (size_t key = 0; key < (size_t)pool->n_layer * (size_t)pool->n_cl; key++) {
        const int32_t slot = pool->slot_of[key];
        if (slot < -1 || slot >= pool->n_slots) return 4;
        if (slot >= 0 && ((size_t)pool->s_layer[slot] * pool->n_cl + pool->s_cl[slot] != key)) return 2;
        held += slot >= 0;
    }
    return held <= pool->n_slots ? 0 : 5;
}
