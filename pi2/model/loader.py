"""loader.py — a model file opened for inference: GGUF container + ModelConfig + tokenizer + tensor checks.

Owns: which tensors each architecture needs, their expected shapes, and the supported weight types.
Does not: dequantize (quants.py) or compute (reference.py, the C engine).
"""
from __future__ import annotations

import os
from dataclasses import dataclass, field
from functools import cached_property

from pi2.errors import ModelFormatError, UnsupportedError
from pi2.model import pi2_keys
from pi2.model.config import ModelConfig
from pi2.model.config_moe import moe_tensors, optional_tensors, output_required
from pi2.model.gguf_file import GGML_TYPES, GGUFFile, TensorInfo
from pi2.model.gguf_split import open_gguf
from pi2.model.tokenizer import Tokenizer

# weight types the engines can compute with
SUPPORTED_TYPES = frozenset(("F32", "F16", "BF16", "Q4_0", "Q4_1", "Q5_0", "Q5_1", "Q8_0", "Q4_K", "Q5_K", "Q6_K"))


def expected_tensors(cfg: ModelConfig) -> dict[str, tuple]:
    """Every tensor an architecture reads, with its ggml `ne` (a None dimension matches any size)."""
    e, hd, hdv = cfg.n_embd, cfg.head_dim, cfg.head_dim_v
    q_out, k_out, v_out = cfg.n_head * hd, cfg.n_head_kv * hd, cfg.n_head_kv * hdv
    want = {"token_embd.weight": (e, cfg.n_vocab), "output_norm.weight": (e,)}
    for il in range(cfg.n_layer):
        b = f"blk.{il}."
        want.update({
            b + "attn_norm.weight": (e,), b + "attn_q.weight": (e, q_out), b + "attn_k.weight": (e, k_out),
            b + "attn_v.weight": (e, v_out), b + "attn_output.weight": (cfg.n_head * hdv, e),
            b + "ffn_norm.weight": (e,),
        })
        want.update(moe_tensors(cfg, b) if cfg.moe_family else _ffn_tensors(cfg, b))
        if cfg.qkv_bias:
            want.update({b + "attn_q.bias": (q_out,), b + "attn_k.bias": (k_out,), b + "attn_v.bias": (v_out,)})
        if cfg.qk_norm:
            want.update({b + "attn_q_norm.weight": (hd,), b + "attn_k_norm.weight": (hd,)})
        if cfg.qk_norm_full:      # olmoe: over the whole projection
            want.update({b + "attn_q_norm.weight": (e,), b + "attn_k_norm.weight": (e,)})
        if cfg.post_norms:
            want.update({b + "post_attention_norm.weight": (e,), b + "post_ffw_norm.weight": (e,)})
    return want


def _ffn_tensors(cfg: ModelConfig, b: str) -> dict[str, tuple]:
    """A layer's FFN tensors: dense GGUF, PowerInfer (`ffn_down_t`, predictors fc1/fc2 of any width r) or pi2
    (bundles and their statistics, see pi2/model/ffn_layout.py; gate rows in the bundles in `bundle-gud` layout)."""
    e, f = cfg.n_embd, cfg.n_ff
    if cfg.pi2:
        want = {b + "ffn_bundle.weight": (None, f), b + "ffn_perm.weight": (f,), b + "ffn_freq.weight": (f,),
                b + "ffn_thresh.weight": (None,), b + "ffn_err.weight": (None,)}
        if cfg.ffn_layout != "bundle-gud":
            want[b + "ffn_gate.weight"] = (e, f)
        return want
    want = {b + "ffn_gate.weight": (e, f), b + "ffn_up.weight": (e, f)}
    if cfg.sparse or cfg.ffn_down_t:
        want[b + "ffn_down_t.weight"] = (e, f)
    else:
        want[b + "ffn_down.weight"] = (f, e)
    if cfg.sparse:
        want.update({b + "fc1.weight": (e, None), b + "fc2.weight": (None, f)})
    return want


# pi2 files' raw tensors (everything else must be a weight type from SUPPORTED_TYPES)
_RAW_TYPES = {"ffn_bundle.weight": "I8", "ffn_perm.weight": "I32"}
_RAW_EXPERT_TYPES = {"ffn_bundle_exps.weight": "I8", "ffn_perm_exps.weight": "I32", "ffn_freq_exps.weight": "F32"}


@dataclass
class Model:
    """An opened model. `tensor(name)` is checked; `raw(name)` gives its bytes without copying."""

    path: str
    file: GGUFFile
    config: ModelConfig
    tied_output: bool
    rope_freqs: bool = False
    extra: list = field(default_factory=list)   # tensors present but not read (e.g. predictors)

    def tensor(self, name: str) -> TensorInfo:
        t = self.file.tensors.get(name)
        if t is None:
            raise ModelFormatError(f"{self.path}: tensor '{name}' is missing")
        return t

    def raw(self, name: str):
        return self.file.raw(name)

    @property
    def output_name(self) -> str:
        return "token_embd.weight" if self.tied_output else "output.weight"

    @cached_property
    def tokenizer(self):
        return Tokenizer.from_kv(self.file.kv)

    @property
    def n_params(self) -> int:
        return sum(t.n_elements for t in self.file.tensors.values())

    @property
    def n_bytes(self) -> int:
        return sum(t.nbytes for t in self.file.tensors.values())

    def close(self) -> None:
        self.file.close()


def load_model(path: str | os.PathLike) -> Model:
    """Open and check a GGUF/PWRI model file (given its first part, a split model's every part). Raises
    ModelFormatError / UnsupportedError with one-line messages."""
    f = open_gguf(path)
    try:
        cfg = ModelConfig.from_gguf(f.kv, f.tensors, f.magic)
        if cfg.pi2:
            pi2_keys.check(f.kv, f.path, cfg.n_layer)
        want = expected_tensors(cfg)
        tied = "output.weight" not in f.tensors
        if cfg.moe_family:
            want.update(optional_tensors(cfg, f.tensors))
            if tied and output_required(cfg.arch):
                raise ModelFormatError(f"{f.path}: tensor 'output.weight' is missing ({cfg.arch} does not tie it "
                                       "to token_embd)")
        if not tied:
            want["output.weight"] = (cfg.n_embd, cfg.n_vocab)
        rope_freqs = "rope_freqs.weight" in f.tensors
        if rope_freqs:
            want["rope_freqs.weight"] = (cfg.n_rot // 2,)
        for name, ne in want.items():
            t = f.tensors.get(name)
            if t is None:
                raise ModelFormatError(f"{f.path}: tensor '{name}' is missing")
            if len(t.ne) != len(ne) or any(w is not None and int(a) != w for a, w in zip(t.ne, ne)):
                shape = [w if w is not None else "*" for w in ne]
                raise ModelFormatError(f"{f.path}: tensor '{name}' has shape {list(t.ne)}, expected {shape}")
            raws = _RAW_TYPES if cfg.pi2 else _RAW_EXPERT_TYPES if cfg.expert_bundles else {}
            raw = raws.get(name.split(".", 2)[-1])
            if raw is not None:
                if t.type_name != raw:
                    raise ModelFormatError(f"{f.path}: tensor '{name}' has type {t.type_name}, expected {raw}")
                continue
            if t.type_name not in SUPPORTED_TYPES:
                raise UnsupportedError(f"{f.path}: tensor '{name}' has type {t.type_name}, which pi2 does not "
                                       f"support yet (supported: {', '.join(sorted(SUPPORTED_TYPES))})")
            if len(ne) == 1 and t.type_name != "F32":
                raise UnsupportedError(f"{f.path}: tensor '{name}' is {t.type_name}; 1-D tensors must be F32")
        extra = sorted(set(f.tensors) - set(want))
        return Model(str(path), f, cfg, tied, rope_freqs, extra)
    except Exception:
        f.close()
        raise


def type_name(type_id: int) -> str:
    return GGML_TYPES[type_id][0]
