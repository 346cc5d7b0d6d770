# convert — `pi2 convert`: turn an ordinary GGUF (or PowerInfer PWRI) model into a pi2 file.
# Owns: the conversion's phases (profile -> statistics -> order and layout -> write), the pi2.* metadata,
#       and the report of what was measured. The file format is described in DESIGN.md ("The pi2 file").
# Does not: run the sparse FFN (pi2/sparse.py) or decide the run-time keep allocation.
from __future__ import annotations

import hashlib
import os
import time
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
from tqdm import tqdm

from pi2.convert import layout, profile
from pi2.convert.writer import ConvertError, kv_types, write_gguf
from pi2.errors import UsageError
from pi2.model.gguf_file import GGML_TYPES, TYPE_IDS
from pi2.model.loader import load_model
from pi2.quants import dequantize

PI2_VERSION = 1
SCORE = "act"                       # ranking score of the thresholds: |act(gate)| (see profile.SCORES)
DEFAULT_CALIB_TOKENS = 2048
_SKIP_KEYS = ("general.alignment", "general.architecture")

__all__ = ["convert", "ConvertError", "ConvertReport", "default_output"]


@dataclass
class ConvertReport:
    output: str
    n_tokens: int
    layout: str
    down_types: list
    down_err: list                  # relative L2 error of the stored down rows vs the source, per layer
    keep_at_10pct: list             # per layer, keep fraction reaching 10 % FFN output error
    thresh: np.ndarray
    err: np.ndarray
    seconds: dict = field(default_factory=dict)


def default_output(src: Path) -> Path:
    name = src.name[:-5] if src.name.endswith(".gguf") else src.name
    return src.with_name(name + ".pi2.gguf")


def _same_file(a: Path, b: Path) -> bool:
    try:
        return b.exists() and os.path.samefile(a, b)
    except OSError:
        return False


def _sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 22), b""):
            h.update(block)
    return h.hexdigest()


def _copy(f, name):
    """(name, bytes shaped like the tensor with rows of bytes, type) for an unchanged tensor."""
    t = f.tensors[name]
    raw = f.raw(name).reshape(tuple(reversed(t.ne[1:])) + (t.row_bytes,))
    return (name, raw, t.type)


def convert(src, out=None, *, calib=None, calib_tokens: int = DEFAULT_CALIB_TOKENS, ffn_layout: str = "bundle-ud",
            ffn_type: str = "auto", default_keep: float = profile.DEFAULT_KEEP, n_threads: int = 0,
            progress: bool = True) -> ConvertReport:
    src = Path(src)
    out = Path(out) if out is not None else default_output(src)
    if ffn_layout not in layout.LAYOUTS:
        raise UsageError(f"unknown layout '{ffn_layout}' (choose from {', '.join(layout.LAYOUTS)})")
    if ffn_type not in layout.FFN_TYPES:
        raise UsageError(f"unknown --ffn-type '{ffn_type}' (choose from {', '.join(layout.FFN_TYPES)})")
    if out.resolve() == src.resolve() or _same_file(src, out):
        raise UsageError(f"the output {out} is the input; choose another name with -o")
    if out.is_dir():
        raise UsageError(f"the output {out} is a directory")
    if not out.parent.is_dir():
        raise UsageError(f"the output directory {out.parent} does not exist")
    secs, t0 = {}, time.perf_counter()
    model = load_model(src)
    f, cfg = model.file, model.config
    if "pi2.version" in f.kv:
        raise UsageError(f"{src} is already a pi2 file")
    chunks, calib_sha, n_tok = profile.calib_tokens(model.tokenizer, calib, calib_tokens)
    layers = profile.run_profile(model, chunks, n_threads, progress)
    secs["profile"] = time.perf_counter() - t0

    down_t = f"blk.0.ffn_down_t.weight" in f.tensors
    n_embd, n_ff = cfg.n_embd, cfg.n_ff

    def down_name(il):
        return f"blk.{il}.ffn_down_t.weight" if down_t else f"blk.{il}.ffn_down.weight"

    def down_matrix(il):
        t = f.tensors[down_name(il)]
        if down_t:
            return np.ascontiguousarray(dequantize(f.raw(t.name), t.type, n_embd).T)
        return dequantize(f.raw(t.name), t.type, n_ff)

    t1 = time.perf_counter()
    prof = profile.summarize(layers, down_matrix, calib_sha, n_tok, default_keep, progress)
    secs["statistics"] = time.perf_counter() - t1

    t2 = time.perf_counter()
    replaced, down_types, down_err = {}, [], []
    for il in tqdm(range(cfg.n_layer), desc="layout", unit="layer", disable=not progress):
        p = f"blk.{il}."
        perm = layout.permutation(prof.freq[il])
        gate, up, dn = f.tensors[p + "ffn_gate.weight"], f.tensors[p + "ffn_up.weight"], f.tensors[down_name(il)]
        rtype = layout.down_row_type(dn.type, n_embd, ffn_type, transposed=not down_t)
        drows, _, derr = layout.down_rows(f.raw(dn.name), dn.type, n_embd, n_ff, perm, rtype, not down_t)
        down_types.append(rtype)
        down_err.append(derr)
        gate_rows = np.ascontiguousarray(f.raw(gate.name)[perm])
        up_rows = f.raw(up.name)[perm]
        parts = [gate_rows, up_rows, drows] if ffn_layout == "bundle-gud" else [up_rows, drows]
        new = [] if ffn_layout == "bundle-gud" else [(p + "ffn_gate.weight", gate_rows, gate.type)]
        new += [(p + "ffn_bundle.weight", layout.bundle(parts, n_ff), None),
                (p + "ffn_perm.weight", perm, None),
                (p + "ffn_freq.weight", prof.freq[il][perm].astype(np.float32), None),
                (p + "ffn_thresh.weight", prof.thresh[il].astype(np.float32), None),
                (p + "ffn_err.weight", prof.err[il].astype(np.float32), None)]
        replaced[gate.name] = new
        replaced[up.name] = replaced[dn.name] = []
        if p + "fc2.weight" in f.tensors:
            fc2 = f.tensors[p + "fc2.weight"]
            replaced[fc2.name] = [(fc2.name, np.ascontiguousarray(f.raw(fc2.name)[perm]), fc2.type)]

    tensors = []
    for name in f.tensors:
        tensors += replaced[name] if name in replaced else [_copy(f, name)]
    types = kv_types(src)
    kvs = [(k, v, *types[k]) for k, v in f.kv.items() if k not in _SKIP_KEYS]
    u32, f32, s, arr = 4, 6, 8, 9
    kvs += [("pi2.version", PI2_VERSION, u32, None),
            ("pi2.source.sha256", _sha256(src), s, None),
            ("pi2.source.file", src.name, s, None),
            ("pi2.calib.sha256", calib_sha, s, None),
            ("pi2.calib.tokens", n_tok, u32, None),
            ("pi2.ffn.layout", ffn_layout, s, None),
            ("pi2.ffn.down_types", [int(t) for t in down_types], arr, u32),
            ("pi2.ffn.keep_grid", [float(k) for k in profile.KEEP_GRID], arr, f32),
            ("pi2.ffn.default_keep", float(default_keep), f32, None),
            ("pi2.ffn.score", SCORE, s, None)]
    secs["layout"] = time.perf_counter() - t2

    t3 = time.perf_counter()
    write_gguf(out, cfg.arch, kvs, tensors, progress)
    secs["write"] = time.perf_counter() - t3
    secs["total"] = time.perf_counter() - t0
    model.close()
    keep10 = [profile.keep_for_error(e, 0.10) for e in prof.err]
    return ConvertReport(str(out), n_tok, ffn_layout, [GGML_TYPES[t][0] for t in down_types], down_err, keep10,
                         prof.thresh, prof.err, secs)


def summary(rep: ConvertReport) -> str:
    """A few lines for the terminal."""
    k = np.asarray(rep.keep_at_10pct)
    types = sorted(set(rep.down_types))
    return "\n".join([
        f"wrote {rep.output}",
        f"calibration: {rep.n_tokens} tokens; layout {rep.layout}; down rows {', '.join(types)} "
        f"(relative error {max(rep.down_err):.4f} max, {float(np.mean(rep.down_err)):.4f} mean)",
        f"keep for 10% FFN error per layer: mean {k.mean():.2f}, min {k.min():.2f}, max {k.max():.2f}",
        "time: " + ", ".join(f"{n} {v:.1f}s" for n, v in rep.seconds.items()),
    ])
