"""test_cache_pool.py — the LRU of cold cluster slots of the neuron cache (csrc/cache/slots.c), through the
test entry points (csrc/pi2_test.h): under a random trace of lookups, reads into the least recently used slot, failed
reads and whole-layer reads, the pool matches a list model of the LRU and keeps its invariants."""
from __future__ import annotations

import numpy as np

import cinternal


def test_slot_pool_invariants_under_a_random_trace():
    """slots.c through the test entry points: find/take/forget/clear under a random trace keep one LRU list over
    every slot, owners and slot_of agreeing, never more clusters held than slots; a taken slot is the least recently
    used one."""
    S, L, N = 7, 3, 5
    p = cinternal.Slots(S, L, N)
    assert p.check() == 0
    rng = np.random.default_rng(7)
    order, held = list(range(S)), [None] * S     # the model: slots most recent first; what each slot holds
    for step in range(3000):
        op, il, cl = rng.integers(0, 10), int(rng.integers(0, L)), int(rng.integers(0, N))
        if op < 6:                               # a needed cluster: found, or read into the least recent slot
            s = p.find(il, cl)
            assert s == (held.index((il, cl)) if (il, cl) in held else -1)
            if s < 0:
                s = p.take(il, cl)
                assert s == order[-1]
                held[s] = (il, cl)
            order.remove(s)
            order.insert(0, s)
        elif op < 9:                             # a failed read: the slot holds nothing, keeps its place
            s = int(rng.integers(0, S))
            p.forget(s)
            held[s] = None
        else:                                    # a whole layer read over the slots
            p.clear()
            held = [None] * S
        assert p.check() == 0, step
        st = p.state()
        assert st["walk"] == order and st["tail"] == order[-1]
        assert st["held"] == held
        assert sum(st["slot_of"] >= 0) == sum(h is not None for h in held) <= S
    k = next(k for k in range(L * N) if p.state()["slot_of"][k] < 0)
    p.poke(k, 0)                                 # a broken table is caught
    assert p.check() != 0
