/* cache/slots.h — the LRU of cold cluster slots (slots.c), one per part of the neuron cache: bundles, gate rows.
 * A slot holds one cluster (layer, cluster) of one layer at a time; the pool never allocates after init. */
#ifndef PI2_CACHE_POOL_H
#define PI2_CACHE_POOL_H
#include <stdint.h>

#include "pi2.h"

typedef struct {
    int32_t n_slots, n_layer, n_cl;
    int32_t *s_layer, *s_cl;   /* [n_slots] the slot's cluster, or -1 when free */
    int32_t *prev, *next;      /* [n_slots] the LRU list: head = most recently used, tail = the next to reuse */
    int32_t head, tail;
    int32_t *slot_of;          /* [n_layer * n_cl] the slot holding cluster cl of layer il, or -1 */
} pi2_slots;

/* Every slot free, in LRU order. PI2_ERR_NOMEM (the pool is then empty; pi2_slots_free is still fine). */
pi2_status pi2_slots_init(pi2_slots *pool, int32_t n_slots, int32_t n_layer, int32_t n_cl);
void pi2_slots_free(pi2_slots *pool);
/* The slot holding (il, cl), or -1; its place in the LRU stays. */
static inline int32_t pi2_slots_holding(const pi2_slots *pool, int32_t il, int32_t cl) {
    return pool->slot_of[(size_t)il * pool->n_cl + cl];
}
/* The slot holding (il, cl), moved to the front, or -1. */
int32_t pi2_slots_find(pi2_slots *pool, int32_t il, int32_t cl);
/* The least recently used slot, forgotten by its cluster, now holding (il, cl) at the front. The caller keeps
 * the clusters it still needs at the front: fewer of them than n_slots, so none of them is taken. */
int32_t pi2_slots_take(pi2_slots *pool, int32_t il, int32_t cl);
/* The slot holds nothing (its bytes were not read, or were overwritten); its place in the LRU stays. */
void pi2_slots_forget(pi2_slots *pool, int32_t slot);
/* Every slot holds nothing. */
void pi2_slots_clear(pi2_slots *pool);
/* 0 when the invariants hold (one LRU list over every slot; slot_of and the owners agree), else a code > 0
 * saying which failed. For tests. */
int32_t pi2_slots_check(const pi2_slots *pool);

#endif
