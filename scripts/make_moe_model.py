#!/usr/bin/env python3
"""make_moe_model.py — write the synthetic MoE benchmark files: Qwen3-MoE-shaped (default, ~2.5 GB) or
SmallThinker-4B-shaped, with random weights from a seed, streamed to disk one tensor at a time.

qwen3moe: n_embd 2048, 24 layers, 32 experts, 8 per token, expert FFN 768, 16 q / 4 kv heads of 128, vocab 32000
(untied output). smallthinker: n_embd 1536, 32 layers, 32 experts, 4 per token, expert FFN 768, 12 / 2 heads of 128,
sigmoid router on the layer input, ReGLU experts, sliding-window / no-RoPE layers, vocab 32000.
Types: experts Q4_0 (repacked by llama.cpp and, later, pi2), attention and embeddings Q8_0, router and norms F32.
Routing: as in tests/moe_files.py, token embeddings get an offset along one direction u that every router reads
with a per-expert weight (σ 1.5), so some experts are hot; embeddings are scaled up (σ 4) so that 24 random layers
do not wash the tokens out. Check what a file does with scripts/expert_working_set.py: its hit rates are worst
cases next to a trained model's.
--closed-gates F zeroes that share of each expert's gate rows (seeded): a zero gate is closed, so ReLU experts then
have F plus half the rest of their neurons inactive per token (random weights alone: half), near a trained ReLU
expert's ~85 % at 0.7, to measure what skipping inactive neurons gains (csrc/ffn/moe_relu.c).
Usage: python3 scripts/make_moe_model.py OUT.gguf [--arch qwen3moe|smallthinker] [--seed 0] [--layers N]
       [--closed-gates F]
"""
from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import numpy as np
from gguf import GGMLQuantizationType as QT
from gguf import GGUFWriter
from gguf.quants import quantize

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tests"))
from fixtures import _add_vocab  # noqa: E402
from moe_files import _rng, tensor_order  # noqa: E402

SHAPES = {
    "qwen3moe": dict(n_embd=2048, n_layer=24, n_expert=32, k=8, n_ff_exp=768, n_head=16, n_head_kv=4, head_dim=128),
    "smallthinker": dict(n_embd=1536, n_layer=32, n_expert=32, k=4, n_ff_exp=768, n_head=12, n_head_kv=2,
                         head_dim=128),
}
N_VOCAB, EMBD_SIGMA, BIAS_MU, BIAS_SIGMA = 32000, 4.0, 4.0, 1.5


def plan(arch: str, s: dict) -> dict:
    """name -> (numpy shape, type name, sigma or 'norm'/'router'/'embd')."""
    e, hd = s["n_embd"], s["head_dim"]
    q, kv, ff, E = s["n_head"] * hd, s["n_head_kv"] * hd, s["n_ff_exp"], s["n_expert"]
    t = {"token_embd.weight": ((N_VOCAB, e), "Q8_0", "embd"), "output_norm.weight": ((e,), "F32", "norm"),
         "output.weight": ((N_VOCAB, e), "Q8_0", e ** -0.5)}
    for il in range(s["n_layer"]):
        b = f"blk.{il}."
        t.update({b + "attn_norm.weight": ((e,), "F32", "norm"), b + "ffn_norm.weight": ((e,), "F32", "norm"),
                  b + "attn_q.weight": ((q, e), "Q8_0", 0.2), b + "attn_k.weight": ((kv, e), "Q8_0", 0.2),
                  b + "attn_v.weight": ((kv, e), "Q8_0", e ** -0.5), b + "attn_output.weight": ((e, q), "Q8_0", q ** -0.5),
                  b + "ffn_gate_inp.weight": ((E, e), "F32", "router"),
                  b + "ffn_gate_exps.weight": ((E, ff, e), "Q4_0", e ** -0.5),
                  b + "ffn_up_exps.weight": ((E, ff, e), "Q4_0", e ** -0.5),
                  b + "ffn_down_exps.weight": ((E, e, ff), "Q4_0", ff ** -0.5)})
        if arch == "qwen3moe":
            t.update({b + "attn_q_norm.weight": ((hd,), "F32", "norm"), b + "attn_k_norm.weight": ((hd,), "F32", "norm")})
    return t


def make(name: str, shape: tuple, how, u: np.ndarray, seed: int) -> np.ndarray:
    rng = _rng(seed, name)
    if how == "norm":
        return (1.0 + 0.1 * rng.standard_normal(shape, dtype=np.float32)).astype(np.float32)
    if how == "embd":
        return rng.standard_normal(shape, dtype=np.float32) * np.float32(EMBD_SIGMA) + np.float32(BIAS_MU) * u
    if how == "router":
        w = rng.standard_normal(shape, dtype=np.float32) * np.float32(2.0 * shape[1] ** -0.5)
        c = _rng(seed, name + "-bias").standard_normal(shape[0]).astype(np.float32) * np.float32(BIAS_SIGMA)
        return w + c[:, None] * u[None, :]
    out = np.empty(shape, np.float32)
    for i in range(shape[0]):                       # expert by expert: bounded temporaries
        out[i] = rng.standard_normal(shape[1:], dtype=np.float32) * np.float32(how)
    return out


def write(path: Path, arch: str, seed: int, n_layer: int | None, closed: float = 0.0) -> None:
    s = dict(SHAPES[arch])
    if n_layer:
        s["n_layer"] = n_layer
    tensors = plan(arch, s)
    names = tensor_order(tensors)
    u = _rng(seed, "router-direction").standard_normal(s["n_embd"]).astype(np.float32)
    u /= np.linalg.norm(u)
    w = GGUFWriter(str(path), arch)
    w.add_name(f"pi2-moe-bench-{arch}")
    w.add_file_type(2)                              # MOSTLY_Q4_0: the experts' type
    w.add_quantization_version(2)
    w.add_context_length(4096)
    w.add_embedding_length(s["n_embd"])
    w.add_block_count(s["n_layer"])
    w.add_feed_forward_length(s["n_ff_exp"])
    w.add_head_count(s["n_head"])
    w.add_head_count_kv(s["n_head_kv"])
    w.add_key_length(s["head_dim"])
    w.add_value_length(s["head_dim"])
    w.add_rope_dimension_count(s["head_dim"])
    w.add_rope_freq_base(1e6)
    w.add_layer_norm_rms_eps(1e-6)
    w.add_expert_count(s["n_expert"])
    w.add_expert_used_count(s["k"])
    w.add_expert_feed_forward_length(s["n_ff_exp"])
    if arch == "smallthinker":
        w.add_uint32("smallthinker.expert_gating_func", 2)
        w.add_sliding_window(4096)
    _add_vocab(w, "qwen2", "bpe", N_VOCAB)
    qt = {"F32": None, "Q8_0": QT.Q8_0, "Q4_0": QT.Q4_0}
    for n in names:
        shape, tname, _ = tensors[n]
        raw = qt[tname]
        if raw is None:
            w.add_tensor_info(n, shape, np.dtype(np.float32), int(np.prod(shape)) * 4)
        else:
            bs, ts = {QT.Q8_0: (32, 34), QT.Q4_0: (32, 18)}[raw]
            byte_shape = (*shape[:-1], shape[-1] // bs * ts)
            w.add_tensor_info(n, byte_shape, np.dtype(np.uint8), int(np.prod(byte_shape)), raw_dtype=raw)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_ti_data_to_file()
    t0 = time.time()
    for i, n in enumerate(names):
        shape, tname, how = tensors[n]
        a = make(n, shape, how, u, seed)
        if closed and n.endswith("ffn_gate_exps.weight"):
            a *= (_rng(seed, n + "-closed").random(shape[:-1]) >= closed)[..., None]
        w.write_tensor_data(a if qt[tname] is None else quantize(a, qt[tname]))
        if i % 20 == 0:
            print(f"  {i + 1}/{len(names)} tensors, {time.time() - t0:.0f} s", file=sys.stderr, flush=True)
    w.close()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("out", type=Path)
    ap.add_argument("--arch", choices=sorted(SHAPES), default="qwen3moe")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--layers", type=int, default=None, help="fewer layers (a small file of the same shape)")
    ap.add_argument("--closed-gates", type=float, default=0.0, metavar="F",
                    help="zero this share of each expert's gate rows (ReLU experts: inactive neurons)")
    a = ap.parse_args()
    if not 0.0 <= a.closed_gates < 1.0:
        ap.error("--closed-gates is a share in [0, 1)")
    tmp = a.out.with_name(a.out.name + ".tmp")
    write(tmp, a.arch, a.seed, a.layers, a.closed_gates)
    tmp.replace(a.out)
    print(f"{a.out}: {a.out.stat().st_size / 2 ** 30:.2f} GiB", file=sys.stderr)


if __name__ == "__main__":
    main()
