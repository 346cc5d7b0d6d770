"""test_cache_pool.py — the LRU of cold cluster slots of the neuron cache (csrc/cache/slots.c), through the
test entry points (csrc/pi2_test.h): under a random trace of lookups, reads into the least recently used slot, failed
reads and whole-layer reads (and pins: the expert cache's learned hot experts), the pool matches a list model of
the LRU and keeps its invariants."""
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


def test_pinned_slots_stay_out_of_the_lru():
    """pin takes a slot holding a cluster out of the LRU list (take never reuses it, find leaves it pinned), unpin
    puts it back at the tail, forget and clear unpin; under a random trace the pool matches a list model."""
    S, L, N = 6, 3, 5
    p = cinternal.Slots(S, L, N)
    rng = np.random.default_rng(11)
    order, held, pinned = list(range(S)), [None] * S, set()
    for step in range(4000):
        op, il, cl = rng.integers(0, 12), int(rng.integers(0, L)), int(rng.integers(0, N))
        if op < 6:
            s = p.find(il, cl)
            assert s == (held.index((il, cl)) if (il, cl) in held else -1)
            if s < 0 and len(order) > 0:
                s = p.take(il, cl)
                assert s == order[-1] and s not in pinned
                held[s] = (il, cl)
            if s >= 0 and s not in pinned:
                order.remove(s)
                order.insert(0, s)
        elif op < 8:                             # pin a slot that holds a cluster, keeping one in the list
            s = int(rng.integers(0, S))
            if held[s] is not None and s not in pinned and len(order) > 1:
                p.pin(s)
                pinned.add(s)
                order.remove(s)
        elif op < 10:
            s = int(rng.integers(0, S))
            p.unpin(s)
            if s in pinned:
                pinned.discard(s)
                order.append(s)
        elif op < 11:
            s = int(rng.integers(0, S))
            p.forget(s)
            held[s] = None
            if s in pinned:
                pinned.discard(s)
                order.append(s)
        else:
            p.clear()
            held = [None] * S
            order += sorted(pinned)
            pinned.clear()
        assert p.check() == 0, step
        st = p.state()
        assert st["walk"] == order and st["held"] == held
        assert all(held[s] is not None for s in pinned)
