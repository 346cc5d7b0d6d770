"""config_moe.py — the Mixture-of-Experts architectures' hyper-parameters and tensors, as llama.cpp reads them.

Owns: which architectures are MoE (qwen2moe, qwen3moe, olmoe, granitemoe, smallthinker, `llama` with
`expert_count`) or their dense relatives (qwen3, granitemoe without experts), the `{arch}.expert_*` keys and what
llama.cpp 0c1e570 does with each (most archs hard-code their gating and weight normalisation and ignore the keys),
the checks that give a bad MoE file one clear error, and the tensors each such layer reads.
Does not: read the common keys (config.py does, then calls `moe_fields`) or compute (reference/moe.py).
"""
from __future__ import annotations

from pi2.errors import ModelFormatError, UnsupportedError

MAX_EXPERTS = 1024                       # LLAMA_MAX_EXPERTS
GATING = {1: "softmax", 2: "sigmoid", 3: "softmax_weight", 4: "sqrt_softplus"}   # llama_expert_gating_func_type

# arch -> (gating, normalise the k weights, rope NEOX, expert activation); None: the file's expert_gating_func
_ARCHS = {
    "llama": ("softmax", True, False, "silu"),
    "qwen2moe": ("softmax", False, True, "silu"),
    "qwen3": ("", False, True, "silu"),
    "qwen3moe": ("softmax", True, True, "silu"),
    "olmoe": ("softmax", False, True, "silu"),
    "granitemoe": ("softmax", True, False, "silu"),
    "smallthinker": (None, True, True, "relu"),
}
MOE_ARCHS = tuple(a for a in _ARCHS if a != "llama")   # llama is MoE only with expert_count > 0
# tied output allowed (output.weight optional) unless listed here
_OUTPUT_REQUIRED = ("qwen2moe", "olmoe")
_NEED_EXPERTS = ("qwen2moe", "qwen3moe", "olmoe", "smallthinker")


def is_moe_file(arch: str, kv: dict) -> bool:
    """Files this module configures: the MoE archs and their dense kin, and llama with experts."""
    return arch in MOE_ARCHS or (arch == "llama" and int(kv.get("llama.expert_count", 0) or 0) > 0)


def moe_fields(arch: str, kv: dict, get, common: dict) -> dict:
    """ModelConfig fields of a MoE-family file, read as llama.cpp 0c1e570 reads them. `get(key, default)` reads
    `{arch}.key` (per-layer arrays must be uniform); `kv` is the whole metadata; `common` config.py's fields."""
    n_layer, n_ff = common["n_layer"], common["n_ff"]
    gating, norm_w, neox, act = _ARCHS[arch]
    n_expert = int(get("expert_count", 0) or 0)
    n_used = int(get("expert_used_count", 0) or 0)
    if n_expert > MAX_EXPERTS:
        raise ModelFormatError(f"{arch}.expert_count {n_expert} is above llama.cpp's limit of {MAX_EXPERTS}")
    if arch in _NEED_EXPERTS and n_expert == 0:
        raise ModelFormatError(f"{arch}.expert_count is missing or 0: a {arch} model needs experts")
    if n_expert and not 0 < n_used <= n_expert:
        raise ModelFormatError(f"{arch}.expert_used_count is {n_used}: it must be between 1 and "
                               f"expert_count ({n_expert})")
    if not n_expert and n_used:
        raise ModelFormatError(f"{arch}.expert_used_count is {n_used} but the model has no experts")
    if int(get("expert_group_count", 0) or 0) > 1:
        raise UnsupportedError(f"{arch}: expert groups (expert_group_count) are not supported")
    raw_gating = get("expert_gating_func", None)
    if raw_gating is not None and int(raw_gating) not in GATING:
        raise ModelFormatError(f"{arch}.expert_gating_func is {int(raw_gating)}, an unknown gating function "
                               f"(known: {', '.join(f'{k} {v}' for k, v in GATING.items())})")
    if gating is None:                   # smallthinker: the file says; llama.cpp aborts without the key
        if raw_gating is None:
            raise ModelFormatError(f"{arch}.expert_gating_func is missing (llama.cpp cannot run this file either)")
        gating = GATING[int(raw_gating)]
    f = dict(n_expert=n_expert, n_expert_used=n_used, expert_gating=gating if n_expert else "",
             expert_weights_norm=norm_w and bool(n_expert), expert_act=act, rope_neox=neox)
    # llama.cpp reads neither expert_weights_scale nor expert_weights_norm for these archs: both stay as above
    ff_exp = int(get("expert_feed_forward_length", 0) or 0)
    if arch in ("llama", "olmoe", "granitemoe"):
        ff_exp = n_ff                    # feed_forward_length is the per-expert width
    elif not ff_exp and n_expert and arch != "smallthinker":
        ff_exp = n_ff // n_used          # llama.cpp's fallback when the key is absent
    f["n_ff_exp"] = ff_exp if n_expert else 0
    if arch == "qwen2moe":
        f["n_ff_shexp"] = int(get("expert_shared_feed_forward_length", 0) or 0) or n_ff
        f["shexp_gate"] = True
    elif arch == "granitemoe":
        f["n_ff_shexp"] = int(get("expert_shared_feed_forward_length", 0) or 0) if n_expert else 0
        f["embd_scale"] = float(get("embedding_scale", 0.0) or 0.0) or 1.0
        f["residual_scale"] = float(get("residual_scale", 0.0) or 0.0)
        logit = get("logit_scale", None)
        if logit is None:
            raise ModelFormatError("required key granitemoe.logit_scale is missing")
        f["logit_scale"] = float(logit)
        attn = float(get("attention.scale", 0.0) or 0.0)
        if attn:
            f["attn_scale"] = attn
    if arch in ("qwen3", "qwen3moe"):
        f["qk_norm"] = True
    if arch == "olmoe":
        f["qk_norm_full"] = True
        if common["n_head_kv"] != common["n_head"]:     # its k norm is n_embd wide
            raise ModelFormatError(f"olmoe needs as many k/v heads as q heads (llama.cpp's attn_k_norm is n_embd "
                                   f"wide), this file has {common['n_head_kv']} and {common['n_head']}")
    if arch == "smallthinker":
        f.update(_smallthinker_layers(kv, get, n_layer))
        f["router_before_attn"] = True
    return f


def _smallthinker_layers(kv: dict, get, n_layer: int) -> dict:
    """smallthinker's attention pattern: with a non-zero sliding_window key, llama.cpp sets the window to 4096
    (whatever the key says), makes layer il sliding unless il % n_pattern == 0 (sliding_window_pattern, default 4;
    or a per-layer bool array), gives those layers rope.freq_base_swa (default: rope.freq_base), and leaves
    layers il % 4 == 0 without RoPE; without the key every layer is full attention with RoPE."""
    window = int(get("attention.sliding_window", 0) or 0)
    if window <= 0:
        return {}
    pattern = kv.get("smallthinker.attention.sliding_window_pattern", 4)
    if hasattr(pattern, "__len__") and not isinstance(pattern, (str, bytes)):
        swa = tuple(bool(x) for x in pattern)[:n_layer]
        if len(swa) < n_layer:
            raise ModelFormatError(f"smallthinker.attention.sliding_window_pattern has {len(swa)} entries, "
                                   f"the model {n_layer} layers")
    else:
        n = int(pattern)
        swa = tuple(n == 0 or il % n != 0 for il in range(n_layer))
    nope = tuple(n_layer != 4 and il % 4 == 0 for il in range(n_layer))
    base_swa = get("rope.freq_base_swa", None)
    return dict(sliding_window=4096, swa_layers=swa, nope_layers=nope,
                rope_base_swa=float(base_swa) if base_swa is not None else 0.0)


def moe_tensors(cfg, b: str) -> dict[str, tuple]:
    """A MoE-family layer's FFN tensors (ggml ne; None matches any size), the router included."""
    e = cfg.n_embd
    if not cfg.n_expert:
        f = cfg.n_ff
        return {b + "ffn_gate.weight": (e, f), b + "ffn_up.weight": (e, f), b + "ffn_down.weight": (f, e)}
    x, fe = cfg.n_expert, cfg.n_ff_exp
    want = {b + "ffn_gate_inp.weight": (e, x), b + "ffn_gate_exps.weight": (e, fe, x)}
    if cfg.expert_bundles:          # a converted file: up and down rows in bundles (pi2/model/expert_bundles.py)
        want.update({b + "ffn_bundle_exps.weight": (None, fe, x), b + "ffn_perm_exps.weight": (fe, x),
                     b + "ffn_freq_exps.weight": (fe, x)})
    else:
        want.update({b + "ffn_up_exps.weight": (e, fe, x), b + "ffn_down_exps.weight": (fe, e, x)})
    if cfg.n_ff_shexp:
        s = cfg.n_ff_shexp
        want.update({b + "ffn_gate_shexp.weight": (e, s), b + "ffn_up_shexp.weight": (e, s),
                     b + "ffn_down_shexp.weight": (s, e)})
        if cfg.shexp_gate:
            want[b + "ffn_gate_inp_shexp.weight"] = (e,)
    return want


def output_required(arch: str) -> bool:
    return arch in _OUTPUT_REQUIRED


def optional_tensors(cfg, names) -> dict[str, tuple]:
    """Tensors llama.cpp reads when present: q/k/v biases (every arch here) and the attention output bias
    (llama, granitemoe)."""
    q_out, kv_out = cfg.n_head * cfg.head_dim, cfg.n_head_kv * cfg.head_dim
    want = {}
    for il in range(cfg.n_layer):
        b = f"blk.{il}."
        for n, size in (("q", q_out), ("k", kv_out), ("v", cfg.n_head_kv * cfg.head_dim_v)):
            if b + f"attn_{n}.bias" in names:
                want[b + f"attn_{n}.bias"] = (size,)
        if cfg.arch in ("llama", "granitemoe") and b + "attn_output.bias" in names:
            want[b + "attn_output.bias"] = (cfg.n_embd,)
    return want
