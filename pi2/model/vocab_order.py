# vocab_order.py — the order in which llama.cpp visits its token_to_id map (a libstdc++
# std::unordered_map<std::string, int> filled with ids 0..n-1). llama.cpp picks e.g. the EOT token as the
# first matching text it meets there, so SmolLM2 gets <|endoftext|> and Qwen2.5 gets <|im_end|>.
# Does: std::hash<std::string> (64-bit _Hash_bytes, seed 0xc70f6907), the prime rehash schedule
#       (max load factor 1, growth x2) and the node-list order that insertion and rehashing produce.
# Does not: anything else; only called when several candidate texts are present.
from __future__ import annotations

import numpy as np

_MUL = np.uint64(0xC6A4A7935BD1E995)
_SEED = 0xC70F6907
# bucket counts libstdc++ grows through (_Prime_rehash_policy::_M_next_bkt(12), then >= 2x each time)
_BUCKETS = (13, 29, 59, 127, 257, 541, 1109, 2357, 5087, 10273, 20753, 42043, 85229, 172933, 351061,
            712697, 1427581, 2862509, 5741273)


def _shift_mix(v):
    return v ^ (v >> np.uint64(47))


def string_hashes(tokens: list) -> np.ndarray:
    """std::hash<std::string> of every token (UTF-8 bytes), vectorized per byte length."""
    raw = [t.encode("utf-8", "surrogatepass") for t in tokens]
    lens = np.fromiter((len(b) for b in raw), dtype=np.int64, count=len(raw))
    out = np.zeros(len(raw), dtype=np.uint64)
    with np.errstate(over="ignore"):
        for length in np.unique(lens).tolist():
            idx = np.nonzero(lens == length)[0]
            data = np.frombuffer(b"".join(raw[i] for i in idx.tolist()), dtype=np.uint8).reshape(len(idx), length)
            h = np.full(len(idx), _SEED, dtype=np.uint64) ^ (np.uint64(length) * _MUL)
            full = length // 8
            if full:
                words = np.ascontiguousarray(data[:, :8 * full]).view("<u8")
                for j in range(full):
                    h ^= _shift_mix(words[:, j] * _MUL) * _MUL
                    h *= _MUL
            if length % 8:
                tail = np.zeros(len(idx), dtype=np.uint64)
                for j in range(length % 8):
                    tail |= data[:, 8 * full + j].astype(np.uint64) << np.uint64(8 * j)
                h ^= tail
                h *= _MUL
            h = _shift_mix(_shift_mix(h) * _MUL)
            out[idx] = h
    return out


def iteration_order(tokens: list) -> np.ndarray:
    """Token ids in the order llama.cpp's token_to_id map iterates them."""
    h = string_hashes(tokens)
    n = len(tokens)
    order = np.zeros(0, dtype=np.int64)
    start = 0
    for b_count in _BUCKETS:
        # rehash (before inserting element `start`), then insert up to the next resize point
        bk = (h[order] % np.uint64(b_count)).astype(np.int64)
        pos = np.arange(len(order))
        if len(order):
            uniq, first = np.unique(bk, return_index=True)
            firstpos = first[np.searchsorted(uniq, bk)]
            order = order[np.lexsort((-pos, -firstpos))]
            bk = bk[np.lexsort((-pos, -firstpos))]
        stop = min(n, b_count)
        new = np.arange(start, stop)
        nb = (h[new] % np.uint64(b_count)).astype(np.int64)
        # group of every element: existing group (rank by first position) or new (by creation time)
        old_groups, old_first = np.unique(bk, return_index=True)
        new_groups, created = np.unique(nb, return_index=True)
        in_old = np.isin(nb, old_groups)
        g1 = np.concatenate([np.ones(len(order), np.int64), np.where(in_old, 1, 0)])
        g2_old = old_first[np.searchsorted(old_groups, bk)] if len(order) else np.zeros(0, np.int64)
        g2_new = np.where(in_old, old_first[np.clip(np.searchsorted(old_groups, nb), 0, max(len(old_groups) - 1, 0))]
                          if len(old_groups) else 0, -created[np.searchsorted(new_groups, nb)])
        g2 = np.concatenate([g2_old, g2_new])
        i1 = np.concatenate([np.ones(len(order), np.int64), np.zeros(len(new), np.int64)])
        i2 = np.concatenate([np.arange(len(order)), -np.arange(len(new))])
        order = np.concatenate([order, new])[np.lexsort((i2, i1, g2, g1))]
        start = stop
        if start >= n:
            return order
    raise ValueError("vocabulary too large for the bucket schedule")


def map_order(tokens: list, ids: list) -> list:
    """`ids` sorted by when llama.cpp's map iteration reaches them."""
    order = iteration_order(tokens)
    where = np.empty(len(tokens), dtype=np.int64)
    where[order] = np.arange(len(order))
    return sorted(ids, key=lambda i: where[i])
