#!/usr/bin/env python3
"""bench_kernels.py — single-thread matvec speed of pi2's C kernels, reference vs fast, in GB/s of
weight bytes read (one row · one quantized activation per output, like a batch-1 decode step).

Usage: scripts/bench_kernels.py [--rows 896] [--cols 4864] [--reps 20] [--types Q4_0,Q4_K,...]
Does not: check results (tests/test_kernels.py does) or use threads (the C entry point has none).
"""
import argparse
import time

import numpy as np

from pi2 import engine

TYPES = {"F32": 0, "F16": 1, "BF16": 30, "Q4_0": 2, "Q4_1": 3, "Q5_0": 6, "Q5_1": 7, "Q8_0": 8,
         "Q4_K": 12, "Q5_K": 13, "Q6_K": 14}
SCALE_OFFSETS = {2: (0,), 3: (0, 2), 6: (0,), 7: (0, 2), 8: (0,), 12: (0, 2), 13: (0, 2), 14: (208,)}


def random_rows(qtype, rows, cols, rng):
    if qtype in (0, 1, 30):
        x = rng.standard_normal((rows, cols), dtype=np.float32)
        return engine.quantize_act(x.reshape(-1), qtype).reshape(rows, -1)
    ti = engine.type_info(qtype)
    nb = rows * cols // ti.block_size
    b = rng.integers(0, 256, (nb, ti.type_size), dtype=np.uint8)
    for off in SCALE_OFFSETS[qtype]:
        b[:, off:off + 2] = (rng.standard_normal(nb) * 0.01).astype(np.float16).view(np.uint8).reshape(nb, 2)
    return b.reshape(rows, -1)


def best_seconds(fn, reps):
    fn()
    times = []
    for _ in range(reps):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return min(times)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rows", type=int, default=896)
    ap.add_argument("--cols", type=int, default=4864)
    ap.add_argument("--reps", type=int, default=20)
    ap.add_argument("--types", default=",".join(TYPES))
    a = ap.parse_args()
    info = engine.kernel_info()
    print(f"kernel ISA: {' '.join(info['isa']) or 'reference only'}; matrix {a.rows} x {a.cols}, 1 thread")
    print(f"| type | MiB | ref GB/s | base GB/s (kernel) | auto GB/s (kernel) | auto/ref |")
    print(f"|---|---|---|---|---|---|")
    rng = np.random.default_rng(0)
    for name in a.types.split(","):
        qtype = TYPES[name]
        raw = random_rows(qtype, a.rows, a.cols, rng)
        xq = engine.quantize_act(rng.standard_normal(a.cols, dtype=np.float32), engine.type_info(qtype).vec_dot_type)
        gbs = {}
        for impl in ("ref", "base", "auto"):
            s = best_seconds(lambda: engine.matvec(raw, qtype, a.cols, xq, impl=impl), a.reps)
            gbs[impl] = raw.nbytes / s / 1e9
        k = {impl: engine.type_info(qtype, impl).vec_dot_impl for impl in ("base", "auto")}
        print(f"| {name} | {raw.nbytes / 2**20:.1f} | {gbs['ref']:.2f} | {gbs['base']:.2f} ({k['base']}) | "
              f"{gbs['auto']:.2f} ({k['auto']}) | {gbs['auto'] / gbs['ref']:.1f}x |")


if __name__ == "__main__":
    main()
