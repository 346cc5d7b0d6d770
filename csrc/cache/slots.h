/* cache/slots.h — the LRU of cold cluster slots (slots.c), one per part of the neuron cache: bundles, gate rows,
 * experts. A slot holds one cluster (layer, cluster) of one layer at a time; the pool never allocates after init.
 * A pinned slot (the expert cache's learned hot experts, cache/experts_learn.c) keeps its cluster and is out of
 * the LRU list: take never reuses it until it is unpinned (back at the list's tail) or forgotten. */
#ifndef PI2_CACHE_POOL_H
#define PI2_CACHE_POOL_H
#include <stdint.h>

#include "pi2.h"

typedef struct {
    int32_t n_slots, n_layer, n_cl;
    int32_t *s_layer, *s_cl;   /* [n_slots] the slot's cluster, or -1 when free */
    int32_t *prev, *next;      /* [n_slots] the LRU list: head = most recently used, tail = the next to reuse */
    int32_t head, tail;
    int32_t n_list;            /* slots in the LRU list: n_slots less the pinned ones */
    uint8_t *pinned;           /* [n_slots] 1: out of the list */
    int32_t *slot_of;          /* [n_layer * n_cl] the slot holding cluster cl of layer il, or -1 */
} pi2_slots;

/* Every slot free, in LRU order. PI2_ERR_NOMEM (the pool is then empty; pi2_slots_free is still fine). */
pi2_status pi2_slots_init(pi2_slots *pool, int32_t n_slots, int32_t n_layer, int32_t n_cl);
void pi2_slots_free(pi2_slots *pool);
/* The slot holding (il, cl), or -1; its place in the LRU stays. */
static inline int32_t pi2_slots_holding(const pi2_slots *pool, int32_t il, int32_t cl) {
    return pool->slot_of[(size_t)il * pool->n_cl + cl];
}
/* The slot holding (il, cl), moved to the front (a pinned one stays pinned), or -1. */
int32_t pi2_slots_find(pi2_slots *pool, int32_t il, int32_t cl);
/* The least recently used slot, forgotten by its cluster, now holding (il, cl) at the front. The caller keeps
 * the clusters it still needs at the front: fewer of them than n_slots, so none of them is taken. */
int32_t pi2_slots_take(pi2_slots *pool, int32_t il, int32_t cl);
/* The slot holds nothing (its bytes were not read, or were overwritten); its place in the LRU stays (a pinned
 * slot goes back to the list's tail). */
void pi2_slots_forget(pi2_slots *pool, int32_t slot);
/* Take the slot (it holds a cluster, unpinned) out of the LRU list: it keeps its cluster until unpinned. */
void pi2_slots_pin(pi2_slots *pool, int32_t slot);
/* Put a pinned slot back into the list at its tail (the next to reuse). */
void pi2_slots_unpin(pi2_slots *pool, int32_t slot);
/* Move an unpinned slot to the list's front (the last one take reuses) or to its tail (the next one). */
void pi2_slots_to_front(pi2_slots *pool, int32_t slot);
void pi2_slots_to_tail(pi2_slots *pool, int32_t slot);
/* Every slot holds nothing (none pinned). */
void pi2_slots_clear(pi2_slots *pool);
/* 0 when the invariants hold (one LRU list over every unpinned slot; pinned slots hold a cluster; slot_of and
 * the owners agree), else a code > 0 saying which failed. For tests. */
int32_t pi2_slots_check(const pi2_slots *pool);

#endif
