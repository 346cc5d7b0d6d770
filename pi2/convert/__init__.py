# convert — `pi2 convert`: turn an ordinary GGUF (or PowerInfer PWRI) model into a pi2 file.
# Owns: the conversion's phases (profile, one layer at a time, with statistics and the optional pi2-made
#       predictor of each layer -> order and layout -> write), the pi2.* metadata, and the report of what was
#       measured (peak memory of the profile phase included).
#       The file format: DESIGN.md ("The pi2 file") and docs/pi2-file-format.md.
# Does not: run the sparse FFN (pi2/reference/sparse_ffn.py) or decide the run-time keep allocation
#       (pi2/runtime/ffn_rule.py).
from __future__ import annotations

import hashlib
import os
import resource
import shutil
import time
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
from tqdm import tqdm

from pi2.convert import layerwise, layout, moe, predictor, profile, writer
from pi2.convert.writer import ConvertError, Later, kv_types, write_gguf
from pi2.errors import FileError, UsageError
from pi2.model.gguf_file import GGML_TYPES, TYPE_IDS
from pi2.model.loader import load_model
from pi2.runtime.config import RunConfig

PI2_VERSION = 1
SCORE = "act"                       # ranking score of the thresholds: |act(gate)| (runtime.ffn_rule.SCORES)
DEFAULT_CALIB_TOKENS = 2048
_SKIP_KEYS = ("general.alignment", "general.architecture", "split.no", "split.count", "split.tensors.count")

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
    predictor: dict | None = None   # spec and per-layer held-out metrics when --predictor was given
    peak_rss_mb: dict = field(default_factory=dict)


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


def check_writable(src: Path, out: Path) -> None:
    """Before minutes of profiling: a file can be made beside `out` (the temporary file the write renames), and
    the file system has room for about the source's size."""
    tmp = writer.temp_path(out)
    try:
        with open(tmp, "xb"):
            pass
        os.unlink(tmp)
    except OSError as e:
        raise FileError(f"cannot write to {out.parent}: {e.strerror}", hint="choose another place with -o") from None
    try:
        need, free = src.stat().st_size, shutil.disk_usage(out.parent).free
    except OSError:
        return
    if free < need:
        raise FileError(f"{out.parent} has {free / 2**20:.1f} MiB free; the output needs about {need / 2**20:.1f} MiB",
                        hint="free some space or choose another place with -o")


def convert(src, out=None, *, calib=None, calib_tokens: int = DEFAULT_CALIB_TOKENS, ffn_layout: str = "bundle-ud",
            ffn_type: str = "auto", default_keep: float = profile.DEFAULT_KEEP, n_threads: int = 0,
            progress: bool = True, pred: "predictor.Spec | None" = None, memory_budget=None) -> ConvertReport:
    """Convert src to a pi2 file (out, default MODEL.pi2.gguf). memory_budget (bytes or a size such as '500M', MoE
    files only): the memory the profile's experts stream within (moe_budget.py); None: the file mapped when it fits
    in what this process may use, otherwise streamed within that."""
    src = Path(src)
    out = Path(out) if out is not None else default_output(src)
    if memory_budget is not None:       # a bad value is an error before anything is read
        memory_budget = RunConfig(memory_budget=memory_budget).memory_budget
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
    check_writable(src, out)
    secs, t0 = {}, time.perf_counter()
    model = load_model(src)
    f, cfg = model.file, model.config
    if "pi2.version" in f.kv:
        raise UsageError(f"{src} is already a pi2 file")
    if cfg.moe_family:   # experts in hot-first neuron order with up/down bundles (moe.py)
        try:
            if pred is not None or ffn_layout != "bundle-ud":
                raise UsageError("--predictor and --layout bundle-gud are for dense models")
            moe.check(cfg)
            return moe.convert_moe(model, src, out, calib=calib, calib_tokens=calib_tokens, ffn_type=ffn_type,
                                   n_threads=n_threads, progress=progress, source_sha=_sha256(src),
                                   memory_budget=memory_budget)
        finally:
            model.close()
    if memory_budget is not None:
        model.close()
        raise UsageError("--memory-budget is for MoE files: a dense file's profile holds one layer at a time")
    if pred is not None:
        _check_spec(pred, cfg, f)
    chunks, calib_sha, n_tok = profile.calib_tokens(model.tokenizer, calib, calib_tokens)
    down_t = "blk.0.ffn_down_t.weight" in f.tensors
    n_embd, n_ff = cfg.n_embd, cfg.n_ff

    def down_name(il):
        return f"blk.{il}.ffn_down_t.weight" if down_t else f"blk.{il}.ffn_down.weight"

    # profile + statistics (+ predictor), one layer at a time: nothing of a layer is kept but its summaries
    n = cfg.n_layer
    thresh = np.zeros((n, len(profile.KEEP_GRID)), np.float32)
    err = np.zeros((n, len(profile.KEEP_GRID)), np.float32)
    freq, built = [], []
    stride = max(1, n_tok // profile.ERR_TOKENS)
    bounds = np.cumsum([0] + [len(c) for c in chunks])
    act = profile.act_fn(cfg.ffn_act)
    for lp in layerwise.run_layers(model, chunks, progress):
        st = profile.LayerStats(n_ff)
        for c0, c1 in zip(bounds[:-1], bounds[1:]):
            st.add(lp.act[c0:c1], lp.up[c0:c1], stride)
        thresh[lp.il], fq, err[lp.il] = profile.layer_summary(st, lp.down, default_keep)
        freq.append(fq)
        if pred is not None:
            W = lp.weights
            dn = W["down_rows"] if "down_rows" in W else W["ffn_down"]
            built.append(predictor.build(pred, lp, act, thresh[lp.il], profile.KEEP_GRID, default_keep,
                                         (W["ffn_up"].raw.nbytes + dn.raw.nbytes) / n_ff,
                                         W["ffn_gate"].raw.nbytes / n_ff))
        del lp, st
    if any(not np.isfinite(t).all() for t in thresh):
        raise ConvertError("the profile produced non-finite thresholds (a broken model?)")
    prof = profile.Profile([], calib_sha, n_tok, thresh, freq, err)
    secs["profile"] = time.perf_counter() - t0
    rss = {"profile": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss // 1024}

    t2 = time.perf_counter()
    replaced, down_types, down_err = {}, [], []
    bar = tqdm(total=cfg.n_layer, desc="layout", unit="layer", disable=not progress)

    def maker(il: int, perm: np.ndarray, rtype: int, gud: bool, gate, up, dn):
        def make() -> list:       # layer il's new tensors, in the order _layer_specs announced them
            p = f"blk.{il}."
            drows, dscale, derr = layout.down_rows(f.raw(dn.name), dn.type, n_embd, n_ff, perm, rtype, not down_t)
            down_err.append(derr)
            gate_rows = np.ascontiguousarray(f.raw(gate.name)[perm])
            up_rows = f.raw(up.name)[perm]
            out = [] if gud else [gate_rows]
            out += [layout.bundle([gate_rows, up_rows, drows] if gud else [up_rows, drows], n_ff), perm,
                    prof.freq[il][perm].astype(np.float32), prof.thresh[il].astype(np.float32),
                    prof.err[il].astype(np.float32)]
            if dscale is not None:
                out += [dscale[0], dscale[1]]
            if pred is not None:
                out += [a for _, a, _ in _predictor_tensors(p, built[il], perm)]
            bar.update(1)
            return out
        return make

    for il in range(cfg.n_layer):
        p = f"blk.{il}."
        perm = layout.permutation(prof.freq[il])
        gate, up, dn = f.tensors[p + "ffn_gate.weight"], f.tensors[p + "ffn_up.weight"], f.tensors[down_name(il)]
        rtype = layout.down_row_type(dn.type, n_embd, ffn_type, transposed=not down_t)
        down_types.append(rtype)
        gud = ffn_layout == "bundle-gud"
        specs = _layer_specs(f, p, gate, up, rtype, n_embd, n_ff, gud, None if pred is None else built[il])
        replaced[gate.name] = [Later(specs, maker(il, perm, rtype, gud, gate, up, dn))]
        replaced[up.name] = replaced[dn.name] = []
        if p + "fc2.weight" in f.tensors:      # the predictor's second matrix, rows in the new order, in its place
            fc2 = f.tensors[p + "fc2.weight"]
            replaced[fc2.name] = [Later([(fc2.name, (int(fc2.n_elements // fc2.ne[0]), fc2.row_bytes), np.uint8,
                                          fc2.type)],
                                        lambda name=fc2.name, perm=perm: [np.ascontiguousarray(f.raw(name)[perm])])]

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
    if pred is not None:
        kvs += [("pi2.predictor.kind", pred.kind, s, None),
                ("pi2.predictor.input", pred.input, s, None),
                ("pi2.predictor.rank", int(pred.rank if pred.kind == "lowrank" else 0), u32, None),
                ("pi2.predictor.bits", int(pred.bits if pred.kind == "lowbit" else 0), u32, None),
                ("pi2.predictor.target_recall", float(pred.target), f32, None),
                ("pi2.predictor.recall", [float(b.metrics["recall"]) for b in built], arr, f32)]
    write_gguf(out, cfg.arch, kvs, tensors, progress, check=f.check_io,   # no output from a source that failed
               release=f.drop_pages)
    bar.close()
    secs["layout+write"] = time.perf_counter() - t2
    secs["total"] = time.perf_counter() - t0
    rss["total"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss // 1024
    model.close()
    keep10 = [profile.keep_for_error(e, 0.10) for e in prof.err]
    pinfo = None if pred is None else {"spec": pred, "metrics": [b.metrics for b in built],
                                       "bytes": [b.nbytes for b in built], "keep": default_keep}
    return ConvertReport(str(out), n_tok, ffn_layout, [GGML_TYPES[t][0] for t in down_types], down_err, keep10,
                         prof.thresh, prof.err, secs, pinfo, rss)


def _check_spec(spec, cfg, f) -> None:
    if cfg.sparse or "blk.0.fc1.weight" in f.tensors:
        raise UsageError("this model ships its own predictor (fc1/fc2); --predictor is for models without one")
    if cfg.ffn_act not in ("silu", "gelu"):
        raise UsageError(f"--predictor needs a SiLU or GELU gate (this model's FFN activation is {cfg.ffn_act})")
    if spec.kind not in predictor.KINDS:
        raise UsageError(f"unknown --predictor '{spec.kind}' (choose from {', '.join(predictor.KINDS)})")
    if spec.input not in predictor.INPUTS:
        raise UsageError(f"unknown --predictor-input '{spec.input}' (choose from {', '.join(predictor.INPUTS)})")
    if not 0.5 <= spec.target < 1.0:
        raise UsageError(f"--predictor-recall must be in [0.5, 1) (got {spec.target:g})")
    if spec.kind == "lowrank" and (spec.rank <= 0 or spec.rank % predictor.BLOCK or spec.rank > cfg.n_embd):
        raise UsageError(f"--predictor-rank must be a positive multiple of {predictor.BLOCK} up to n_embd "
                         f"{cfg.n_embd} (got {spec.rank})")
    if spec.kind == "lowbit" and spec.bits not in (1, 2):
        raise UsageError(f"--predictor-bits must be 1 or 2 (got {spec.bits})")
    if cfg.n_embd % predictor.BLOCK:
        raise UsageError(f"a pi2 predictor needs n_embd divisible by {predictor.BLOCK} (got {cfg.n_embd})")


def _layer_specs(f, p: str, gate, up, rtype: int, n_embd: int, n_ff: int, gud: bool, built) -> list:
    """A dense layer's new tensors as the writer announces them before they are made: [(name, shape, dtype,
    raw type or None)] in the order convert()'s make() returns them."""
    width = (gate.row_bytes if gud else 0) + up.row_bytes + layout.row_bytes(rtype, n_embd)
    specs = [] if gud else [(gate.name, (n_ff, gate.row_bytes), np.uint8, gate.type)]
    n_grid = len(profile.KEEP_GRID)
    specs += [(p + "ffn_bundle.weight", (n_ff, -(-width // layout.BUNDLE_ALIGN) * layout.BUNDLE_ALIGN), np.int8, None),
              (p + "ffn_perm.weight", (n_ff,), np.int32, None),
              (p + "ffn_freq.weight", (n_ff,), np.float32, None),
              (p + "ffn_thresh.weight", (n_grid,), np.float32, None),
              (p + "ffn_err.weight", (n_grid,), np.float32, None)]
    if rtype == layout.I8:
        specs += [(p + "ffn_down_scale.weight", (n_ff,), np.float32, None),
                  (p + "ffn_down_colscale.weight", (n_embd,), np.float32, None)]
    if built is not None:
        specs += [(name, a.shape, a.dtype, raw) for name, a, raw in _predictor_tensors(p, built)]
    return specs


def _predictor_tensors(p: str, b, perm: np.ndarray | None = None) -> list:
    """The layer's predictor tensors in the new neuron order (rows per neuron follow perm; fc1 does not); without
    perm, in the profile's order (their shapes, for the writer's announcement)."""
    out = []
    for name, (raw, qtype) in b.tensors.items():
        rows = raw if name == "fc1" or perm is None else np.ascontiguousarray(raw[perm])
        out.append((f"{p}{name}.weight", rows.view(np.int8) if qtype is None else rows, qtype))
    return out + [(p + "ffn_pred_margin.weight", b.margin.astype(np.float32), None)]


def summary(rep: ConvertReport) -> str:
    """A few lines for the terminal."""
    if isinstance(rep, moe.MoEConvertReport):
        return moe.summary(rep)
    k = np.asarray(rep.keep_at_10pct)
    types = sorted(set(rep.down_types))
    return "\n".join([
        f"wrote {rep.output}",
        f"calibration: {rep.n_tokens} tokens; layout {rep.layout}; down rows {', '.join(types)} "
        f"(relative error {max(rep.down_err):.4f} max, {float(np.mean(rep.down_err)):.4f} mean)",
        f"keep for 10% FFN error per layer: mean {k.mean():.2f}, min {k.min():.2f}, max {k.max():.2f}",
    ] + _predictor_lines(rep) + [
        "time: " + ", ".join(f"{n} {v:.1f}s" for n, v in rep.seconds.items()),
        "peak memory: " + ", ".join(f"after {n} {v} MB" for n, v in rep.peak_rss_mb.items()),
    ])


def _predictor_lines(rep: ConvertReport) -> list:
    if not rep.predictor:
        return []
    sp, ms = rep.predictor["spec"], rep.predictor["metrics"]
    r = np.array([m["recall"] for m in ms])
    what = f"rank {sp.rank}" if sp.kind == "lowrank" else f"{sp.bits}-bit"
    ratio = sum(m["bytes_tok"] for m in ms) / sum(m["bytes_tok_gate"] for m in ms)
    return [f"predictor {sp.kind} ({what}, input {sp.input}, target recall {sp.target:g}): held-out recall "
            f"mean {r.mean():.3f}, min {r.min():.3f}; predicted {np.mean([m['predicted'] for m in ms]):.3f} of "
            f"neurons ({np.mean([m['added'] for m in ms]):.3f} added); {sum(rep.predictor['bytes']) / 2**20:.2f} MiB; "
            f"FFN bytes/token {ratio:.3f}x the gate rule's at keep {rep.predictor.get('keep', 0.5):g}"]
