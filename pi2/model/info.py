"""info.py — `pi2 info`: a model's architecture, parameters, tensor groups (types and sizes), tokenizer
and context, printed with rich.
"""
from __future__ import annotations

import os
import re
from collections import Counter, defaultdict

import numpy as np
from rich.console import Console
from rich.table import Table

from pi2.errors import ModelFormatError
from pi2.model.gguf_file import GGML_TYPES
from pi2.model.gguf_split import file_parts
from pi2.model.info_moe import GROUPS, moe_rows
from pi2.model.loader import load_model

_GROUPS = [*GROUPS, ("embedding", r"^token_embd\."), ("output", r"^output\."), ("attention", r"\.attn_(q|k|v|output|qkv)\."),
           ("ffn", r"\.ffn_(gate|up|down|down_t|bundle|down_scale|down_colscale)\."),
           ("pi2 statistics", r"\.ffn_(perm|freq|thresh|err)\."),
           ("predictor", r"\.(fc[12]|ffn_gate_pred|ffn_pred_margin)\."), ("norms", r"norm"),
           ("other", r".")]


def group_of(name: str) -> str:
    return next(g for g, pat in _GROUPS if re.search(pat, name))


def human_bytes(n: float) -> str:
    for unit in ("B", "KiB", "MiB", "GiB"):
        if n < 1024 or unit == "GiB":
            return f"{n:.2f} {unit}" if unit != "B" else f"{int(n)} B"
        n /= 1024


def human_count(n: int) -> str:
    return f"{n / 1e9:.2f} B" if n >= 1e9 else f"{n / 1e6:.2f} M"


def _pi2_rows(m) -> list:
    """Sparse metadata of a pi2 file: layout, calibration, down types, keep for 10 % FFN error, hot skew."""
    kv, f = m.file.kv, m.file
    if "pi2.version" not in kv:
        return []
    grid = np.asarray(kv.get("pi2.ffn.keep_grid", []), np.float32)
    keep10, hot80 = [], []
    for il in range(m.config.n_layer):
        err = f.raw(f"blk.{il}.ffn_err.weight").view(np.float32).ravel()
        if err.size != grid.size:
            raise ModelFormatError(f"{m.path}: blk.{il}.ffn_err needs {grid.size} values (pi2.ffn.keep_grid)")
        ok = np.nonzero(err <= 0.10)[0]
        keep10.append(float(grid[ok[0]]) if ok.size else 1.0)
        fr = np.sort(f.raw(f"blk.{il}.ffn_freq.weight").view(np.float32).ravel())[::-1]
        cum = np.cumsum(fr) / max(float(fr.sum()), 1e-30)
        hot80.append((int(np.searchsorted(cum, 0.8)) + 1) / fr.size)
    types = sorted({GGML_TYPES[int(t)][0] for t in kv.get("pi2.ffn.down_types", [])})
    k = np.asarray(keep10)
    pred = []
    if "pi2.predictor.kind" in kv:   # a pi2-made predictor: its kind and held-out recall per layer
        rec = np.asarray(kv.get("pi2.predictor.recall", []), np.float64)
        kind = str(kv["pi2.predictor.kind"])
        size = f"{int(kv.get('pi2.predictor.bits', 0))}-bit gate copy" if kind == "lowbit" else \
            f"rank {int(kv.get('pi2.predictor.rank', 0))}"
        pred = [("predictor", f"{kind} ({size}, input {kv.get('pi2.predictor.input')}), target recall "
                              f"{float(kv.get('pi2.predictor.target_recall', 0)):.2f}"
                              + (f"; held-out recall at keep {float(kv.get('pi2.ffn.default_keep', 0)):.2f}: mean "
                                 f"{rec.mean():.3f}, min {rec.min():.3f}" if rec.size else "")
                              + " (used with --predictor)")]
    return [
        ("pi2 file", f"v{kv['pi2.version']}, layout {kv.get('pi2.ffn.layout')}, down rows {', '.join(types)}, "
                     f"score {kv.get('pi2.ffn.score')}, default keep {kv.get('pi2.ffn.default_keep', 0):.2f}"),
        ("calibration", f"{kv.get('pi2.calib.tokens')} tokens (sha256 {str(kv.get('pi2.calib.sha256'))[:12]}), "
                        f"from {kv.get('pi2.source.file')}"),
        ("keep @10% err", f"mean {k.mean():.2f} (layers {k.min():.2f}..{k.max():.2f}): "
                          + " ".join(f"{x:.2f}" for x in k)),
        ("keep by layer", f"uniform: every layer at the run's --keep (default {kv.get('pi2.ffn.default_keep', 0):.2f})"),
        ("hot80", f"{np.mean(hot80):.2f} of neurons carry 80% of activations (uniform 0.80)"),
    ] + pred


def describe(path, list_tensors: bool = False, console: Console | None = None) -> None:
    console = console or Console()
    m = load_model(path)
    c, kv = m.config, m.file.kv
    tok = m.tokenizer
    head = Table.grid(padding=(0, 2))
    rows = [
        ("file", f"{path} ({m.file.magic} v{m.file.version}{', sparse PowerInfer file' if c.sparse else ''})"),
        ("name", str(kv.get("general.name", "?"))),
        ("architecture", c.arch),
        ("parameters", human_count(m.n_params)),
        ("size", human_bytes(m.n_bytes)),
        ("context", f"{c.n_ctx_train} (training)"),
        ("layers", f"{c.n_layer}; n_embd {c.n_embd}, n_ff {c.n_ff}, heads {c.n_head} (kv {c.n_head_kv}), head_dim {c.head_dim}"),
        ("rope", f"{'neox' if c.rope_neox else 'norm'}, base {c.rope_base:g}, n_rot {c.n_rot}"
                 + (f", local base {c.rope_base_local:g}" if c.rope_base_local else "")
                 + (", rope_freqs" if m.rope_freqs else "")),
        ("ffn", ("Mixture-of-Experts" if c.n_expert else f"{c.ffn_act}-gated")
         + (f"; sliding window {c.sliding_window}" if c.sliding_window else "")),
        ("output", "tied to token_embd" if m.tied_output else "output.weight"),
        ("tokenizer", f"{kv.get('tokenizer.ggml.model')} (pre {kv.get('tokenizer.ggml.pre', '-')}), "
                      f"{tok.n_vocab} tokens, bos {tok.bos_id}, eos {tok.eos_id}, add_bos {tok.add_bos}"),
        ("chat template", "yes" if kv.get("tokenizer.chat_template") else "no"),
    ]
    parts = file_parts(m.file)
    if len(parts) > 1:     # a split model (gguf-split): each part, its size and how many tensors it holds
        held = Counter(m.file.part_of(name) for name in m.file.tensors)
        rows.insert(1, ("parts", "\n".join(f"{os.path.basename(p)}  {human_bytes(size)}, {held[k]} tensors"
                                           for k, (p, _, size) in enumerate(parts))))
    rows += moe_rows(m)
    try:
        rows += _pi2_rows(m)
    except (TypeError, ValueError, KeyError, IndexError) as e:   # a damaged value: a key of the wrong type
        if isinstance(e, ModelFormatError):
            raise
        raise ModelFormatError(f"{m.path}: damaged pi2 metadata ({type(e).__name__}: {e})") from None
    for k, v in rows:
        head.add_row(f"[bold]{k}[/]", v)
    console.print(head)

    groups: dict = defaultdict(lambda: [0, 0, defaultdict(int)])
    for t in m.file.tensors.values():
        g = groups[group_of(t.name)]
        g[0] += t.n_elements
        g[1] += t.nbytes
        g[2][t.type_name] += 1
    table = Table(title="tensor groups")
    for col in ("group", "params", "size", "share", "types"):
        table.add_column(col, justify="right" if col in ("params", "size", "share") else "left")
    for name, (n, b, types) in sorted(groups.items(), key=lambda kv_: -kv_[1][1]):
        table.add_row(name, human_count(n), human_bytes(b), f"{100 * b / m.n_bytes:.1f}%",
                      ", ".join(f"{t}×{k}" for t, k in sorted(types.items(), key=lambda x: -x[1])))
    console.print(table)
    if list_tensors:
        tt = Table(title="tensors")
        for col in ("name", "type", "ne", "size"):
            tt.add_column(col)
        for t in m.file.tensors.values():
            tt.add_row(t.name, t.type_name, str(list(t.ne)), human_bytes(t.nbytes))
        console.print(tt)
    m.close()
