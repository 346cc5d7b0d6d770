"""info.py — `pi2 info`: a model's architecture, parameters, tensor groups (types and sizes), tokenizer
and context, printed with rich.
"""
from __future__ import annotations

import re
from collections import defaultdict

from rich.console import Console
from rich.table import Table

from pi2.model.loader import load_model

_GROUPS = [("embedding", r"^token_embd\."), ("output", r"^output\."), ("attention", r"\.attn_(q|k|v|output|qkv)\."),
           ("ffn", r"\.ffn_(gate|up|down|down_t)\."), ("predictor", r"\.fc[12]\."), ("norms", r"norm"),
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
        ("ffn", f"{c.ffn_act}-gated" + (f"; sliding window {c.sliding_window}" if c.sliding_window else "")),
        ("output", "tied to token_embd" if m.tied_output else "output.weight"),
        ("tokenizer", f"{kv.get('tokenizer.ggml.model')} (pre {kv.get('tokenizer.ggml.pre', '-')}), "
                      f"{tok.n_vocab} tokens, bos {tok.bos_id}, eos {tok.eos_id}, add_bos {tok.add_bos}"),
        ("chat template", "yes" if kv.get("tokenizer.chat_template") else "no"),
    ]
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
