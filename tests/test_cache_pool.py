"""test_cache_pool.py — the LRU of cold cluster slots of the neuron cache (csrc/cache_pool.c), through the
extension's exported symbols: under a random trace of lookups, reads into the least recently used slot, failed
reads and whole-layer reads, the pool matches a list model of the LRU and keeps its invariants."""
from __future__ import annotations

import numpy as np
from cffi import FFI

from pi2 import _pi2


def test_slot_pool_invariants_under_a_random_trace():
    """cache_pool.c through its exported symbols: find/take/forget/clear under a random trace keep one LRU list over
    every slot, owners and slot_of agreeing, never more clusters held than slots; a taken slot is the least recently
    used one."""
    f = FFI()
    f.cdef("""typedef struct { int32_t n_slots, n_layer, n_cl; int32_t *s_layer, *s_cl; int32_t *prev, *next;
              int32_t head, tail; int32_t *slot_of; } pi2_slots;
              int pi2_slots_init(pi2_slots *p, int32_t n_slots, int32_t n_layer, int32_t n_cl);
              void pi2_slots_free(pi2_slots *p);
              int32_t pi2_slots_find(pi2_slots *p, int32_t il, int32_t cl);
              int32_t pi2_slots_take(pi2_slots *p, int32_t il, int32_t cl);
              void pi2_slots_forget(pi2_slots *p, int32_t s);
              void pi2_slots_clear(pi2_slots *p);
              int32_t pi2_slots_check(const pi2_slots *p);""")
    c = f.dlopen(_pi2.__file__)
    rng = np.random.default_rng(7)
    S, L, N = 7, 3, 5
    p = f.new("pi2_slots *")
    assert c.pi2_slots_init(p, S, L, N) == 0 and c.pi2_slots_check(p) == 0
    order, held = list(range(S)), [None] * S     # the model: slots most recent first; what each slot holds
    for step in range(3000):
        op, il, cl = rng.integers(0, 10), int(rng.integers(0, L)), int(rng.integers(0, N))
        if op < 6:                               # a needed cluster: found, or read into the least recent slot
            s = c.pi2_slots_find(p, il, cl)
            assert s == (held.index((il, cl)) if (il, cl) in held else -1)
            if s < 0:
                s = c.pi2_slots_take(p, il, cl)
                assert s == order[-1]
                held[s] = (il, cl)
            order.remove(s)
            order.insert(0, s)
        elif op < 9:                             # a failed read: the slot holds nothing, keeps its place
            s = int(rng.integers(0, S))
            c.pi2_slots_forget(p, s)
            held[s] = None
        else:                                    # a whole layer read over the slots
            c.pi2_slots_clear(p)
            held = [None] * S
        assert c.pi2_slots_check(p) == 0, step
        walk, i = [], p.head
        while i >= 0 and len(walk) <= S:
            walk.append(i)
            i = p.next[i]
        assert walk == order and p.tail == order[-1]
        assert [(p.s_layer[i], p.s_cl[i]) if p.s_layer[i] >= 0 else None for i in range(S)] == held
        assert sum(p.slot_of[k] >= 0 for k in range(L * N)) == sum(h is not None for h in held) <= S
    k = next(k for k in range(L * N) if p.slot_of[k] < 0)
    p.slot_of[k] = 0                             # a broken table is caught
    assert c.pi2_slots_check(p) != 0
    c.pi2_slots_free(p)
