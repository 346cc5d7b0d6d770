"""info_moe.py — what `pi2 info` says about a Mixture-of-Experts model: experts, routing, active parameters and
expert bytes. Does not: print (info.py)."""
from __future__ import annotations

import re

EXPERT = re.compile(r"\.ffn_(gate|up|down|bundle|down_scale|down_colscale)_exps\.")   # bundle...: converted files
GROUPS = [("experts", r"\.ffn_(gate|up|down|bundle|down_scale|down_colscale)_exps\."), ("router", r"\.ffn_gate_inp\."),
          ("shared expert", r"\.ffn_(gate|up|down|gate_inp)_shexp\.")]


def _size(n: float) -> str:
    for unit in ("B", "KiB", "MiB", "GiB"):
        if n < 1024 or unit == "GiB":
            return f"{n:.2f} {unit}" if unit != "B" else f"{int(n)} B"
        n /= 1024


def active_params(model) -> tuple[int, int]:
    """(parameters, bytes) a token reads: everything but the experts it is not routed to (k of n per layer)."""
    c = model.config
    p = b = 0
    for name, t in model.file.tensors.items():
        share = c.n_expert_used / c.n_expert if c.n_expert and EXPERT.search(name) else 1.0
        p += t.n_elements * share
        b += t.nbytes * share
    return int(round(p)), int(round(b))


def ffn_bytes_per_token(model) -> int:
    """FFN weight bytes one token reads: k of n experts' slices, the routers, the shared experts."""
    c = model.config
    total = 0.0
    for name, t in model.file.tensors.items():
        if EXPERT.search(name):
            total += t.nbytes * c.n_expert_used / c.n_expert
        elif re.search(r"\.ffn_(gate_inp|(gate|up|down|gate_inp)_shexp)\.", name):
            total += t.nbytes
    return int(round(total))


def moe_rows(model) -> list:
    """(label, text) rows for `pi2 info`; none for a dense model."""
    c = model.config
    if not c.n_expert:
        return []
    ex = [t for n, t in model.file.tensors.items() if EXPERT.search(n)]
    ex_bytes = sum(t.nbytes for t in ex)
    per_expert = ex_bytes / (c.n_layer * c.n_expert)
    p, b = active_params(model)
    how = c.expert_gating + (", weights normalised" if c.expert_weights_norm else "")
    act = "ReGLU" if c.expert_act == "relu" else "SwiGLU"
    rows = [("experts", f"{c.n_expert} per layer, {c.n_expert_used} per token ({how}); expert FFN {c.n_ff_exp} "
                        f"({act})" + (f"; shared expert FFN {c.n_ff_shexp}" + (" (sigmoid-gated)" if c.shexp_gate else "")
                                      if c.n_ff_shexp else "")
                        + ("; router on the layer input" if c.router_before_attn else "")),
            ("active/token", f"{p / 1e6:.2f} M parameters, {_size(b)} of {_size(model.n_bytes)}"),
            ("expert bytes", f"{_size(ex_bytes)} ({_size(per_expert)} per expert and layer, types "
                             f"{', '.join(sorted({t.type_name for t in ex}))})")]
    return rows
