/* cache/experts_held.c — the bytes the expert cache's cold slots hold (experts.h): what each slot's reads filled,
 *       a cap on their sum, and the experts dropped (least recently used first, pages given back) to keep it, so a
 *       converted file's slots — gate rows and only the clusters tokens opened — hold as many experts as their read
 *       bytes allow instead of as many as whole slots fit.
 * Does not: decide what to read (csrc/pipeline/experts.c) or choose the cap (pi2/plan/experts.py).
 * Invariants: held_total = the sum of held[]; a slot whose mark is the current step (epoch) or the next one (guesses
 *       read ahead) is never dropped here (its rows are being read or computed), so the cap may be passed by the
 *       bytes of one step's experts; a dropped slot holds nothing and is the LRU's next to take. */
#define _GNU_SOURCE
#include "cache/experts.h"

#include <sys/mman.h>

/* The slot's expert dropped: its pages given back (under a cap) and its bytes no longer held. */
static void release(pi2_expert_cache *ec, int32_t slot) {
    if (ec->held[slot] && ec->cap) madvise(pi2_expert_slot(ec, slot), ec->slot_bytes, MADV_DONTNEED);
    ec->held_total -= ec->held[slot];
    ec->held[slot] = 0;
}

void pi2_expert_set_cap(pi2_expert_cache *ec, int64_t cap) {
    ec->cap = cap > 0 ? cap : 0;
#ifdef MADV_NOHUGEPAGE
    if (ec->cap) madvise(ec->arena, (size_t)ec->slots.n_slots * ec->slot_bytes, MADV_NOHUGEPAGE);   /* 4 KiB pages */
#endif
}

int32_t pi2_expert_take(pi2_expert_cache *ec, int32_t il, int32_t e) {
    const int32_t tail = ec->slots.tail;
    if (tail >= 0 && ec->slots.s_layer[tail] >= 0) release(ec, tail);
    const int32_t slot = pi2_slots_take(&ec->slots, il, e);
    ec->held[slot] = 0;
    return slot;
}

void pi2_expert_forget(pi2_expert_cache *ec, int32_t slot) {
    release(ec, slot);
    pi2_slots_forget(&ec->slots, slot);
}

/* Drop slot's expert to keep the cap: forgotten, then the next one taken. */
static void drop(pi2_expert_cache *ec, int32_t slot) {
    pi2_expert_forget(ec, slot);
    pi2_slots_to_tail(&ec->slots, slot);
    ec->evicted++;
}

void pi2_expert_charge(pi2_expert_cache *ec, int32_t slot, int64_t bytes) {
    ec->held[slot] += bytes;
    ec->held_total += bytes;
    if (!ec->cap || ec->held_total <= ec->cap) return;
    pi2_slots *slots = &ec->slots;
    for (int32_t s = slots->tail; s >= 0 && ec->held_total > ec->cap;) {   /* the LRU from its tail */
        const int32_t prev = slots->prev[s];
        if (slots->s_layer[s] >= 0 && ec->held[s] && ec->mark[s] < ec->epoch) drop(ec, s);
        s = prev;
    }
    for (int32_t s = 0; s < slots->n_slots && ec->held_total > ec->cap; s++)   /* then learned hot experts */
        if (slots->pinned[s] && ec->mark[s] < ec->epoch) drop(ec, s);
}

int32_t pi2_expert_room(const pi2_expert_cache *ec) {
    const int32_t n = ec->slots.n_list;
    if (!ec->cap) return n;
    const int64_t whole = ec->cap / (int64_t)ec->slot_bytes;
    return whole < 1 ? 1 : whole < n ? (int32_t)whole : n;
}
