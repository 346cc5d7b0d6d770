/* cache/experts_held.c — the bytes the expert cache's cold slots hold (experts.h): which 4 KiB pages of each slot
 *       reads have filled, a cap on their sum, and the pages of the least routed experts' slots (the least recently
 *       used of equals) given back to keep it, so a
 *       converted file's slots — gate rows and only the clusters tokens opened — hold as many experts as their read
 *       bytes allow instead of as many as whole slots fit.
 * Does not: decide what to read (csrc/pipeline/experts.c) or choose the cap (pi2/plan/experts.py).
 * Invariants: held[s] = 4 KiB × the pages set in slot s's bitmap, held_total their sum; a page not in the bitmap was
 *       never written since the slot's pages were last given back (so it is not resident); a slot whose mark is the
 *       current step (epoch) or the next one (guesses read ahead) keeps its pages (its rows are being read or
 *       computed), so the cap may be passed by the bytes of one step's experts; a slot that gave its pages back holds
 *       no expert and goes to the LRU's front (taken last: a slot with pages is reused first, without faults); take
 *       never reuses a slot in use. */
#define _GNU_SOURCE
#include "cache/experts.h"
#include "cache/cache.h"

#include <string.h>
#include <sys/mman.h>

/* The slot's pages given back (under a cap; without one they are the slot's for good) and no longer held. */
static void release(pi2_expert_cache *ec, int32_t slot) {
    if (!ec->cap || !ec->held[slot]) return;
    madvise(pi2_expert_slot(ec, slot), ec->slot_bytes, MADV_DONTNEED);
    memset(ec->pages + (size_t)slot * (size_t)ec->page_words, 0, (size_t)ec->page_words);
    ec->held_total -= ec->held[slot];
    ec->held[slot] = 0;
    ec->n_resident--;
}

void pi2_expert_set_cap(pi2_expert_cache *ec, int64_t cap) {
    ec->cap = cap > 0 ? cap : 0;
#ifdef MADV_NOHUGEPAGE
    if (ec->cap) madvise(ec->arena, (size_t)ec->slots.n_slots * ec->slot_bytes, MADV_NOHUGEPAGE);   /* 4 KiB pages */
#endif
}

/* The slot whose pages go first: of the LRU's slots with pages not in use, the one whose expert was routed least
 * (decayed counts: experts_learn.c), the least recently used of equals; a slot holding no expert first; -1: none.
 * An LRU alone forgets an expert routed often but not in the last few tokens before one routed once. */
static int32_t victim(const pi2_expert_cache *ec) {
    const pi2_slots *slots = &ec->slots;
    int32_t pick = -1;
    float best = 0.0f;
    for (int32_t s = slots->tail, i = 0; s >= 0 && i < slots->n_slots; s = slots->prev[s], i++) {
        if (!ec->held[s] || (slots->s_layer[s] >= 0 && ec->mark[s] >= ec->epoch)) continue;   /* no pages, in use */
        const float score = slots->s_layer[s] < 0 ? -1.0f
                          : ec->score ? ec->score[(size_t)slots->s_layer[s] * ec->n_expert + slots->s_cl[s]] : 0.0f;
        if (pick < 0 || score < best) {
            pick = s;
            best = score;
            if (!ec->score || score < 0) break;
        }
    }
    return pick;
}

int32_t pi2_expert_take(pi2_expert_cache *ec, int32_t il, int32_t e) {
    pi2_slots *slots = &ec->slots;
    /* a slot without pages while the slots with pages hold room for one more of their average, else one with pages */
    const int empty = !ec->cap || !ec->n_resident || ec->held_total + ec->held_total / ec->n_resident <= ec->cap;
    int32_t pick = -1, any = -1;
    for (int32_t s = slots->tail, prev, i = 0; s >= 0 && i < slots->n_slots; s = prev, i++) {   /* each slot once */
        prev = slots->prev[s];
        if (slots->s_layer[s] >= 0 && ec->mark[s] >= ec->epoch) continue;   /* in use */
        if (any < 0) any = s;
        if (!ec->cap || (ec->held[s] == 0) == empty) {
            pick = s;
            break;
        }
        if (!ec->held[s] && slots->s_layer[s] < 0) pi2_slots_to_front(slots, s);   /* unused: out of the scans' way */
    }
    if (pick < 0) pick = any;
    if (ec->cap && pick >= 0 && ec->held[pick]) {   /* reusing a slot's pages: the least routed expert's */
        const int32_t v = victim(ec);
        if (v >= 0) pick = v;
    }
    if (pick >= 0) pi2_slots_to_tail(slots, pick);
    ec->evicted += slots->tail >= 0 && slots->s_layer[slots->tail] >= 0;   /* its expert replaced */
    return pi2_slots_take(slots, il, e);
}

void pi2_expert_forget(pi2_expert_cache *ec, int32_t slot) { pi2_slots_forget(&ec->slots, slot); }

/* Give back slot's pages to keep the cap: its expert forgotten, the slot the last one taken. */
static void drop(pi2_expert_cache *ec, int32_t slot) {
    ec->evicted += ec->slots.s_layer[slot] >= 0;
    release(ec, slot);
    pi2_slots_forget(&ec->slots, slot);
    pi2_slots_to_front(&ec->slots, slot);
}

void pi2_expert_charge(pi2_expert_cache *ec, int32_t slot, const uint8_t *dest, int64_t len) {
    const int64_t at = dest - pi2_expert_slot(ec, slot);
    uint8_t *bits = ec->pages + (size_t)slot * (size_t)ec->page_words;
    int64_t fresh = 0;
    for (int64_t p = at / PI2_IO_ALIGN; p < (at + len + PI2_IO_ALIGN - 1) / PI2_IO_ALIGN; p++)
        if (!(bits[p >> 3] & (1u << (p & 7)))) {
            bits[p >> 3] |= (uint8_t)(1u << (p & 7));
            fresh++;
        }
    ec->n_resident += fresh && !ec->held[slot];
    ec->held[slot] += fresh * PI2_IO_ALIGN;
    ec->held_total += fresh * PI2_IO_ALIGN;
    if (!ec->cap || ec->held_total <= ec->cap) return;
    pi2_slots *slots = &ec->slots;
    for (int32_t s; ec->held_total > ec->cap && (s = victim(ec)) >= 0;) drop(ec, s);   /* the least routed first */
    for (int32_t s = 0; s < slots->n_slots && ec->held_total > ec->cap; s++)   /* then learned hot experts */
        if (slots->pinned[s] && ec->mark[s] < ec->epoch) drop(ec, s);
}

int32_t pi2_expert_room(const pi2_expert_cache *ec) {
    const int32_t n = ec->slots.n_list;
    if (!ec->cap) return n;
    const int64_t whole = ec->cap / (int64_t)ec->slot_bytes;
    return whole < 1 ? 1 : whole < n ? (int32_t)whole : n;
}
