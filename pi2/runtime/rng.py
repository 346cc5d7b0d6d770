"""rng.py — the random numbers llama.cpp's samplers draw: std::mt19937 and libstdc++'s distributions over it.

Owns: Mt19937 (the 32-bit Mersenne Twister, seeded as std::mt19937(seed)), and the three draws the samplers make:
uniform_double (std::uniform_real_distribution<double>(0, 1): generate_canonical<double, 53>, two words),
uniform_float (std::uniform_real_distribution<float>(0, 1): one word) and discrete (std::discrete_distribution over
float weights: double normalisation and partial sums, lower_bound; no draw for fewer than two weights). With these a
seed gives the tokens llama.cpp gives on the same logits.
"""
from __future__ import annotations

import numpy as np

_N, _M = 624, 397
_UPPER, _LOWER, _MATRIX = 0x80000000, 0x7FFFFFFF, 0x9908B0DF


class Mt19937:
    """std::mt19937: 624 words of state, tempered 32-bit outputs."""

    __slots__ = ("_mt", "_i")

    def __init__(self, seed: int):
        mt = [int(seed) & 0xFFFFFFFF]
        for i in range(1, _N):
            prev = mt[-1]
            mt.append((1812433253 * (prev ^ (prev >> 30)) + i) & 0xFFFFFFFF)
        self._mt, self._i = mt, _N

    def _twist(self) -> None:
        mt = self._mt
        for i in range(_N):
            y = (mt[i] & _UPPER) | (mt[(i + 1) % _N] & _LOWER)
            mt[i] = mt[(i + _M) % _N] ^ (y >> 1) ^ (_MATRIX if y & 1 else 0)
        self._i = 0

    def next_u32(self) -> int:
        if self._i >= _N:
            self._twist()
        y = self._mt[self._i]
        self._i += 1
        y ^= y >> 11
        y ^= (y << 7) & 0x9D2C5680
        y ^= (y << 15) & 0xEFC60000
        y ^= y >> 18
        return y & 0xFFFFFFFF

    def uniform_double(self) -> float:
        """generate_canonical<double, 53>: (w1 + w2 * 2^32) / 2^64 in double, kept below 1."""
        s = float(self.next_u32()) + float(self.next_u32()) * 4294967296.0
        r = s / 18446744073709551616.0
        return r if r < 1.0 else float(np.nextafter(1.0, 0.0))

    def uniform_float(self) -> np.float32:
        """generate_canonical<float, 24>: float(w) / 2^32 in float, kept below 1."""
        r = np.float32(self.next_u32()) / np.float32(4294967296.0)
        return r if r < 1 else np.nextafter(np.float32(1), np.float32(0))

    def discrete(self, weights: np.ndarray) -> int:
        """std::discrete_distribution<int>(weights)(rng): the index of the first partial sum (of the weights divided
        by their double sum, the last set to 1) that is >= a uniform double; 0 without a draw for < 2 weights."""
        w = np.asarray(weights, dtype=np.float64)
        if w.shape[0] < 2:
            return 0
        total = np.cumsum(w)[-1]
        cp = np.cumsum(w / total)
        cp[-1] = 1.0
        return int(np.searchsorted(cp, self.uniform_double(), side="left"))
