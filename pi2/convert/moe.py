# moe.py — `pi2 convert` of a MoE file with ReLU-family experts (smallthinker's ReGLU): each expert's neurons in
# hot-first order with up/down bundles, the layout pi2/model/expert_bundles.py describes.
# Owns: the profile (the C engine routes the calibration text: rows per expert, the routing profile `pi2
#       profile-experts` keeps, and per expert how often each neuron's gate opened), each expert's permutation,
#       its bundles (layout.py's down rows and records, the dense pi2 file's), the pi2.experts.* metadata, the report.
# Does not: profile dense FFNs (__init__.py) or compute the converted file (reference/moe.py, csrc/ffn/).
from __future__ import annotations

import gc
import resource
import time
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
from tqdm import tqdm

from pi2.convert import layout, moe_budget, profile
from pi2.convert.writer import Later, kv_types, write_gguf
from pi2.engine import expert_clusters
from pi2.errors import UnsupportedError, UsageError
from pi2.model.expert_bundles import LAYOUT
from pi2.model.gguf_file import GGML_TYPES

VERSION = 1
_SKIP_KEYS = ("general.alignment", "general.architecture", "split.no", "split.count", "split.tensors.count")


@dataclass
class MoEConvertReport:
    output: str
    n_tokens: int
    layout: str
    down_types: list            # per expert layer
    down_err: list              # per expert layer: the largest relative L2 error of an expert's stored down rows
    open_share: list            # per expert layer: share of (routed row, neuron) pairs whose gate opened
    hot_share: list             # per expert layer: share of the opened pairs in each expert's first quarter
    seconds: dict = field(default_factory=dict)
    peak_rss_mb: dict = field(default_factory=dict)
    budget: int | None = None   # the budget the profile's experts streamed within (None: the file mapped whole)


def check(cfg) -> None:
    if cfg.expert_bundles:
        raise UsageError("the file is already converted")
    if not cfg.n_expert:
        raise UnsupportedError(f"pi2 convert does not convert {cfg.arch} models without experts yet (run the GGUF as "
                               "it is)")
    if cfg.expert_act != "relu":
        act = {"silu": "SwiGLU"}.get(cfg.expert_act, cfg.expert_act)
        raise UnsupportedError(f"pi2 convert converts MoE files whose experts are ReLU-family (smallthinker); this "
                               f"file's are {act}: run it as it is")


def profile_neurons(model, calib, n_tokens: int, n_threads: int, memory_budget=None) -> tuple:
    """Route the calibration text through the C engine (every row of a routed expert computed; the experts mapped,
    or streamed within memory_budget or what this process may use when the file does not fit: moe_budget.py):
    (rows routed per expert [n_layer][n_expert], open counts [n_layer][n_expert][n_ff_exp], tokens, calibration
    sha256, the budget or None)."""
    cfg = model.config
    chunks, sha, n_tok = profile.calib_tokens(model.tokenizer, calib, n_tokens)
    ctx, budget = moe_budget.profile_context(model, max(len(ch) for ch in chunks) + 1, n_threads, memory_budget)
    counts = np.zeros((cfg.n_layer, cfg.n_expert, cfg.n_ff_exp), np.int64)
    expert_clusters.count_neurons(ctx, counts)
    for ch in chunks:
        ctx.reset()
        ctx.decode(ch, all_logits=True)      # the last layer too computes every row
    expert_clusters.count_neurons(ctx, None)
    return ctx.expert_counts, counts, n_tok, sha, budget


def permutations(routed: np.ndarray, counts: np.ndarray) -> tuple:
    """(perm [n_expert][n_ff_exp] new index -> source neuron, by descending open frequency, ties in source order;
    freq in the new order) of one layer."""
    freq = (counts / np.maximum(routed, 1)[:, None]).astype(np.float32)
    perm = np.stack([layout.permutation(f) for f in freq]).astype(np.int32)
    return perm, np.take_along_axis(freq, perm, axis=1)


def _rows3(f, name: str) -> np.ndarray:
    """An expert tensor's bytes as (n_expert, rows, row_bytes)."""
    t = f.tensors[name]
    return f.raw(name).reshape(int(t.ne[2]), int(t.ne[1]), t.row_bytes)


def layer_specs(f, cfg, il: int, ffn_type: str) -> tuple:
    """Layer il's new expert tensors as write_gguf announces them [(name, shape, dtype, raw type or None)] before
    they are made (layer_tensors makes them in this order), and its down row type."""
    b, E, F, X = f"blk.{il}.", cfg.n_embd, cfg.n_ff_exp, cfg.n_expert
    gate, up, dn = (f.tensors[b + f"ffn_{n}_exps.weight"] for n in ("gate", "up", "down"))
    rtype = layout.down_row_type(dn.type, E, ffn_type, transposed=True)
    width = up.row_bytes + layout.row_bytes(rtype, E)
    specs = [(gate.name, (X, F, gate.row_bytes), np.uint8, gate.type),
             (b + "ffn_bundle_exps.weight", (X, F, -(-width // layout.BUNDLE_ALIGN) * layout.BUNDLE_ALIGN), np.int8,
              None),
             (b + "ffn_perm_exps.weight", (X, F), np.int32, None),
             (b + "ffn_freq_exps.weight", (X, F), np.float32, None),
             (b + "ffn_routed_exps.weight", (X,), np.float32, None)]
    if rtype == layout.I8:
        specs += [(b + "ffn_down_scale_exps.weight", (X, F), np.float32, None),
                  (b + "ffn_down_colscale_exps.weight", (X, E), np.float32, None)]
    return specs, rtype


def layer_tensors(f, cfg, il: int, perm: np.ndarray, freq: np.ndarray, routed: np.ndarray, rtype: int) -> tuple:
    """Layer il's new expert tensors' arrays in layer_specs' order (down rows of rtype, layer_specs' choice), and
    its largest down error."""
    b, E, F, X = f"blk.{il}.", cfg.n_embd, cfg.n_ff_exp, cfg.n_expert
    gate, up, dn = (f.tensors[b + f"ffn_{n}_exps.weight"] for n in ("gate", "up", "down"))
    p3 = perm[:, :, None]
    down_src = _rows3(f, dn.name)
    up_src = _rows3(f, up.name)
    bundles, scales, err = None, [], 0.0
    for e in range(X):               # one expert at a time: layout.py's re-quantization of its down columns
        drows, sc, derr = layout.down_rows(down_src[e], dn.type, E, F, perm[e], rtype, True)
        rec = layout.bundle([up_src[e][perm[e]], drows], F)
        if bundles is None:
            bundles = np.empty((X,) + rec.shape, rec.dtype)
        bundles[e] = rec
        scales.append(sc)
        err = max(err, derr)
    out = [np.take_along_axis(_rows3(f, gate.name), p3, axis=1), bundles, perm, freq.astype(np.float32),
           routed.astype(np.float32)]
    if scales[0] is not None:
        out += [np.stack([s[0] for s in scales]).astype(np.float32), np.stack([s[1] for s in scales]).astype(np.float32)]
    return out, err


def convert_moe(model, src: Path, out: Path, *, calib, calib_tokens: int, ffn_type: str, n_threads: int,
                progress: bool, source_sha: str, memory_budget=None) -> MoEConvertReport:
    """Profile, then write: each expert layer's new tensors are made when the writer reaches them and dropped
    after (with the source pages they read), so the peak is the profile's plus about one layer; the profile's is
    the file's size mapped, or memory_budget (moe_budget.py)."""
    f, cfg = model.file, model.config
    check(cfg)
    secs, t0 = {}, time.perf_counter()
    routed, counts, n_tok, calib_sha, budget = profile_neurons(model, calib, calib_tokens, n_threads, memory_budget)
    gc.collect()                     # the profiling context and its mapping of the file (or its expert cache)
    f.drop_pages()
    secs["profile"] = time.perf_counter() - t0
    rss = {"profile": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss // 1024}

    replaced, up_types, down_types, rep_types, errs, opened, hot = {}, [], [], [], [], [], []
    bar = tqdm(total=cfg.n_layer, desc="layout", unit="layer", disable=not progress)

    def maker(il: int, rtype: int):
        def make() -> list:
            perm, freq = permutations(routed[il], counts[il])
            arrays, err = layer_tensors(f, cfg, il, perm, freq, routed[il], rtype)
            errs.append(err)
            bar.update(1)
            return arrays
        return make

    for il in range(cfg.n_layer):
        b = f"blk.{il}."
        if b + "ffn_gate_exps.weight" not in f.tensors:
            up_types.append(0)
            down_types.append(0)
            continue
        specs, rtype = layer_specs(f, cfg, il, ffn_type)
        replaced[b + "ffn_gate_exps.weight"] = [Later(specs, maker(il, rtype))]
        replaced[b + "ffn_up_exps.weight"] = replaced[b + "ffn_down_exps.weight"] = []
        up_types.append(int(f.tensors[b + "ffn_up_exps.weight"].type))
        down_types.append(int(rtype))
        rep_types.append(GGML_TYPES[rtype][0])
        rows = max(int(routed[il].sum()), 1)
        opened.append(float(counts[il].sum()) / (rows * cfg.n_ff_exp))
        cs = np.sort(counts[il], axis=1)[:, ::-1]
        hot.append(float(cs[:, :max(1, cfg.n_ff_exp // 4)].sum()) / max(float(cs.sum()), 1.0))
    tensors = []
    for name in f.tensors:
        if name in replaced:
            tensors += replaced[name]
        else:
            t = f.tensors[name]
            tensors.append((name, f.raw(name).reshape(tuple(reversed(t.ne[1:])) + (t.row_bytes,)), t.type))
    types = kv_types(src)
    u32, s, arr = 4, 8, 9
    kvs = [(k, v, *types[k]) for k, v in f.kv.items() if k not in _SKIP_KEYS]
    kvs += [("pi2.experts.version", VERSION, u32, None),
            ("pi2.experts.layout", LAYOUT, s, None),
            ("pi2.experts.up_types", up_types, arr, u32),
            ("pi2.experts.down_types", down_types, arr, u32),
            ("pi2.source.sha256", source_sha, s, None),
            ("pi2.source.file", src.name, s, None),
            ("pi2.calib.sha256", calib_sha, s, None),
            ("pi2.calib.tokens", n_tok, u32, None)]
    t2 = time.perf_counter()
    write_gguf(out, cfg.arch, kvs, tensors, progress, check=f.check_io, release=f.drop_pages)
    bar.close()
    secs["layout+write"] = time.perf_counter() - t2
    secs["total"] = time.perf_counter() - t0
    rss["total"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss // 1024
    return MoEConvertReport(str(out), n_tok, LAYOUT, rep_types, errs, opened, hot, secs, rss, budget)


def summary(rep: MoEConvertReport) -> str:
    return "\n".join([
        f"wrote {rep.output}",
        f"calibration: {rep.n_tokens} tokens ({moe_budget.describe(rep.budget)}); experts in hot-first neuron order, layout {rep.layout}; down rows "
        f"{', '.join(sorted(set(rep.down_types)))} (relative error {max(rep.down_err):.4f} max)",
        f"open neurons per routed row: {np.mean(rep.open_share):.1%} mean (min {min(rep.open_share):.1%}, max "
        f"{max(rep.open_share):.1%}); each expert's first quarter takes {np.mean(rep.hot_share):.1%} of its opens",
        "time: " + ", ".join(f"{n} {v:.1f}s" for n, v in rep.seconds.items()),
        "peak memory: " + ", ".join(f"after {n} {v} MB" for n, v in rep.peak_rss_mb.items()),
    ])
