"""engine/model.py — a model handed to the C core: its hyper-parameters (pi2_model_params) and a flat descriptor
of every tensor the forward pass reads (pi2_tensor_desc), checked and mapped by pi2_model_load(_parts).

Owns: ROLES (pi2_tensor_role by name, read from the module), model_params, tensor_descs (pi2 bundles and
PowerInfer's ffn_down_t described as down rows), c_model_structs, CModel, and the C core's size queries of a model:
stream_sizes (the neuron cache) and ctx_sizes (what a context allocates).
Does not: read GGUF (pi2/model/) or decide anything about a run.
"""
from __future__ import annotations

import os
from dataclasses import dataclass, replace

from pi2.engine.kernels import impl_id
from pi2.engine.lib import check, enum, ffi, lib
from pi2.errors import UnsupportedError
from pi2.model import expert_bundles
from pi2.model.ffn_layout import bundle_layout, row_bytes
from pi2.model.gguf_split import file_parts

ARCHS = enum("PI2_ARCH_", ("llama", "qwen2", "gemma3", "bamboo", "moe"))
GATINGS = enum("PI2_GATING_", ("softmax", "sigmoid", "softmax_weight", "sqrt_softplus"))
ACTS = enum("PI2_ACT_", ("silu", "gelu", "relu", "drelu"))
ROLES = enum("PI2_TENSOR_", ("token_embd", "output_norm", "output", "rope_freqs", "attn_norm", "attn_q", "attn_k",
                             "attn_v", "attn_output", "attn_q_bias", "attn_k_bias", "attn_v_bias", "attn_q_norm",
                             "attn_k_norm", "post_attn_norm", "ffn_norm", "ffn_gate", "ffn_up", "ffn_down",
                             "post_ffw_norm", "ffn_down_rows", "ffn_gate_pred", "ffn_pred_fc1", "ffn_pred_fc2",
                             "ffn_down_scale", "ffn_down_colscale", "attn_output_bias", "ffn_gate_inp",
                             "ffn_gate_exps", "ffn_up_exps", "ffn_down_exps", "ffn_gate_shexp", "ffn_up_shexp",
                             "ffn_down_shexp", "ffn_gate_inp_shexp", "ffn_down_rows_exps", "ffn_down_scale_exps",
                             "ffn_down_colscale_exps"))
_LAYER_ROLES = {   # blk.{il}.<name> -> pi2_tensor_role, and the ModelConfig flag that makes it present
    "attn_norm.weight": (ROLES["attn_norm"], None), "attn_q.weight": (ROLES["attn_q"], None),
    "attn_k.weight": (ROLES["attn_k"], None), "attn_v.weight": (ROLES["attn_v"], None),
    "attn_output.weight": (ROLES["attn_output"], None), "attn_q.bias": (ROLES["attn_q_bias"], "qkv_bias"),
    "attn_k.bias": (ROLES["attn_k_bias"], "qkv_bias"), "attn_v.bias": (ROLES["attn_v_bias"], "qkv_bias"),
    "attn_q_norm.weight": (ROLES["attn_q_norm"], "qk_norm"), "attn_k_norm.weight": (ROLES["attn_k_norm"], "qk_norm"),
    "post_attention_norm.weight": (ROLES["post_attn_norm"], "post_norms"),
    "ffn_norm.weight": (ROLES["ffn_norm"], None), "ffn_gate.weight": (ROLES["ffn_gate"], None),
    "ffn_up.weight": (ROLES["ffn_up"], None), "ffn_down.weight": (ROLES["ffn_down"], None),
    "post_ffw_norm.weight": (ROLES["post_ffw_norm"], "post_norms"),
}


_LAYER_FLAGS: dict = {}   # per-layer flag arrays handed to pi2_model_load (which copies them), by content


def _moe_params(cfg, qkv_bias: bool) -> dict:
    """pi2_model_params' PI2_ARCH_MOE fields (the MoE family and dense qwen3) from a ModelConfig."""
    flags = None
    if cfg.swa_layers or cfg.nope_layers:
        key = tuple((lib.PI2_LAYER_SWA if cfg.is_swa_layer(il) else 0)
                    | (lib.PI2_LAYER_NOPE if cfg.nope_layers and cfg.nope_layers[il] else 0)
                    | (lib.PI2_LAYER_ROPE_LOCAL if cfg.is_swa_layer(il) and cfg.rope_base_swa else 0)
                    for il in range(cfg.n_layer))
        flags = _LAYER_FLAGS.setdefault(key, ffi.new("uint8_t[]", list(key)))
    return dict(arch=ARCHS["moe"], qkv_bias=int(qkv_bias), qk_norm=int(cfg.qk_norm), ffn_act=ACTS["silu"],
                n_expert=cfg.n_expert, n_expert_used=cfg.n_expert_used, n_ff_exp=cfg.n_ff_exp, n_ff_shexp=cfg.n_ff_shexp,
                expert_gating=GATINGS[cfg.expert_gating] if cfg.n_expert else 0,
                expert_weights_norm=int(cfg.expert_weights_norm), expert_weights_scale=cfg.expert_weights_scale,
                expert_act=ACTS[cfg.expert_act], shexp_gate=int(cfg.shexp_gate),
                router_before_attn=int(cfg.router_before_attn), qk_norm_full=int(cfg.qk_norm_full),
                residual_scale=cfg.residual_scale, logit_scale=cfg.logit_scale,
                rope_base_local=cfg.rope_base_swa, swa_period=0, layer_flags=flags if flags is not None else ffi.NULL)


def model_params(cfg, qkv_bias: bool | None = None) -> dict:
    """pi2_model_params fields from a ModelConfig (qkv_bias: whether the MoE family's file has q/k/v biases)."""
    if cfg.moe_family:
        base = model_params(replace(cfg, arch="llama", moe_family=False))
        return {**base, **_moe_params(cfg, bool(qkv_bias))}
    if cfg.arch not in ARCHS:
        raise UnsupportedError(f"the C engine does not run {cfg.arch} models yet")
    return dict(arch=ARCHS[cfg.arch], n_vocab=cfg.n_vocab, n_embd=cfg.n_embd, n_layer=cfg.n_layer, n_ff=cfg.n_ff,
                n_head=cfg.n_head, n_head_kv=cfg.n_head_kv, head_dim=cfg.head_dim, head_dim_v=cfg.head_dim_v,
                n_rot=cfg.n_rot, rms_eps=cfg.rms_eps, rope_base=cfg.rope_base, rope_base_local=cfg.rope_base_local,
                rope_freq_scale=cfg.rope_freq_scale, rope_neox=int(cfg.rope_neox), qkv_bias=int(cfg.qkv_bias),
                qk_norm=int(cfg.qk_norm), post_norms=int(cfg.post_norms), ffn_act=ACTS[cfg.ffn_act],
                embd_scale=cfg.embd_scale, attn_scale=cfg.attn_scale, q_prescale=int(cfg.q_prescale),
                logit_softcap=cfg.logit_softcap, sliding_window=cfg.sliding_window, swa_period=cfg.swa_period)


_PRED_ROLES = {"ffn_gate_pred.weight": ROLES["ffn_gate_pred"], "fc1.weight": ROLES["ffn_pred_fc1"],
               "fc2.weight": ROLES["ffn_pred_fc2"]}   # predictors (pi2-made, or PowerInfer's fc1/fc2)
_LOWBIT_TYPES = {1: lib.PI2_T_LOWBIT1, 2: lib.PI2_T_LOWBIT2}     # pi2.h's type ids of low-bit gate rows


@dataclass(frozen=True)
class RowView:
    """Rows of one type inside a larger tensor (pi2 bundles): what a pi2_tensor_desc with a row stride says."""
    type: int
    ne: tuple
    offset: int
    nbytes: int
    row_stride: int


def _bundle_views(model, il: int) -> dict:
    """A pi2 file's gate (bundle-gud only), up and down rows of layer il as strided views of ffn_bundle."""
    cfg, t = model.config, model.tensor(f"blk.{il}.ffn_bundle.weight")
    lay, e, n = bundle_layout(model, il), cfg.n_embd, cfg.n_ff
    view = lambda qt, off: RowView(qt, (e, n), t.offset + off, (n - 1) * lay["width"] + row_bytes(qt, e),  # noqa: E731
                                   lay["width"])
    out = {"ffn_up.weight": view(lay["up_type"], lay["up_offset"]),
           "ffn_down_rows": view(lay["down_type"], lay["down_offset"])}
    if lay["gate_type"] is not None:
        out["ffn_gate.weight"] = view(lay["gate_type"], 0)
    return out


def _predictor_descs(model, il: int) -> list:
    """A pi2 file's pi2-made predictor tensors of layer il that are present: the low-bit gate copy (stored as I8
    rows, described with its PI2_T_LOWBIT type over n_embd values) or fc1/fc2."""
    kv, tensors, out = model.file.kv, model.file.tensors, []
    kind = kv.get("pi2.predictor.kind")
    names = ("ffn_gate_pred.weight",) if kind == "lowbit" else ("fc1.weight", "fc2.weight") if kind == "lowrank" else ()
    for name in names:
        t = tensors.get(f"blk.{il}.{name}")
        if t is None:
            continue
        if name == "ffn_gate_pred.weight":
            bits = int(kv.get("pi2.predictor.bits", 0))
            t = RowView(_LOWBIT_TYPES.get(bits, -1), (model.config.n_embd, t.ne[1]), t.offset, t.nbytes, 0)
        out.append((_PRED_ROLES[name], il, t))
    return out


_MOE_LAYER = {"ffn_gate_inp.weight": "ffn_gate_inp", "ffn_gate_exps.weight": "ffn_gate_exps",
              "ffn_up_exps.weight": "ffn_up_exps", "ffn_down_exps.weight": "ffn_down_exps",
              "ffn_gate_shexp.weight": "ffn_gate_shexp", "ffn_up_shexp.weight": "ffn_up_shexp",
              "ffn_down_shexp.weight": "ffn_down_shexp", "ffn_gate_inp_shexp.weight": "ffn_gate_inp_shexp",
              "attn_output.bias": "attn_output_bias", "ffn_gate.weight": "ffn_gate", "ffn_up.weight": "ffn_up",
              "ffn_down.weight": "ffn_down", "attn_q_norm.weight": "attn_q_norm", "attn_k_norm.weight": "attn_k_norm",
              "attn_q.bias": "attn_q_bias", "attn_k.bias": "attn_k_bias", "attn_v.bias": "attn_v_bias"}
_MOE_ALWAYS = ("attn_norm.weight", "attn_q.weight", "attn_k.weight", "attn_v.weight", "attn_output.weight",
               "ffn_norm.weight")


def moe_qkv_bias(model) -> bool:
    """Whether a MoE-family file's layers have q, k and v biases (llama.cpp reads them when present)."""
    return all(f"blk.0.attn_{n}.bias" in model.file.tensors for n in "qkv")


def _moe_descs(model) -> list:
    """The MoE family's layer tensors: attention (biases and q/k norms when present), and the dense FFN or the
    router, the 3-D expert tensors and the shared expert."""
    cfg, names, out = model.config, model.file.tensors, []
    bias = moe_qkv_bias(model)
    for il in range(cfg.n_layer):
        b = f"blk.{il}."
        for name in _MOE_ALWAYS:
            out.append((_LAYER_ROLES[name][0], il, model.tensor(b + name)))
        for name, role in _MOE_LAYER.items():
            if b + name not in names or (name.startswith("attn_") and name[5] in "qkv" and name.endswith(".bias")
                                         and not bias):
                continue
            if name.startswith("ffn_gate.") or name.startswith("ffn_up.") or name.startswith("ffn_down."):
                if cfg.n_expert:
                    continue
            if "shexp" in name and not cfg.n_ff_shexp or name == "ffn_gate_inp_shexp.weight" and not cfg.shexp_gate:
                continue
            out.append((ROLES[role], il, model.tensor(b + name)))
        if cfg.expert_bundles and expert_bundles.has_bundles(model, il):   # a converted file's up and down rows
            out += expert_bundles.descs(model, il, ROLES)
    return out


def tensor_descs(model) -> list:
    """(role, layer, TensorInfo or RowView) of every tensor the forward pass reads; a tied output reuses
    token_embd; pi2 files describe their FFN rows inside the bundles, and their pi2-made predictor; PowerInfer
    files (and pi2 files made from them) their ffn_down_t as down rows and their predictor fc1/fc2."""
    cfg = model.config
    out = [(ROLES["token_embd"], -1, model.tensor("token_embd.weight")),
           (ROLES["output_norm"], -1, model.tensor("output_norm.weight")),
           (ROLES["output"], -1, model.tensor(model.output_name))]
    if model.rope_freqs:
        out.append((ROLES["rope_freqs"], -1, model.tensor("rope_freqs.weight")))
    if cfg.moe_family:
        return out + _moe_descs(model)
    for il in range(cfg.n_layer):
        views = _bundle_views(model, il) if cfg.pi2 else {}
        for name, (role, flag) in _LAYER_ROLES.items():
            if cfg.ffn_down_t and name == "ffn_down.weight":          # PowerInfer: [n_ff] rows of n_embd
                out.append((ROLES["ffn_down_rows"], il, model.tensor(f"blk.{il}.ffn_down_t.weight")))
            elif cfg.pi2 and name == "ffn_down.weight":
                out.append((ROLES["ffn_down_rows"], il, views["ffn_down_rows"]))
                for suffix, role in (("scale", ROLES["ffn_down_scale"]), ("colscale", ROLES["ffn_down_colscale"])):
                    name = f"blk.{il}.ffn_down_{suffix}.weight"          # int8 rows' scales
                    if name in model.file.tensors:
                        out.append((role, il, model.tensor(name)))
            elif name in views:
                out.append((role, il, views[name]))
            elif flag is None or getattr(cfg, flag):
                out.append((role, il, model.tensor(f"blk.{il}.{name}")))
        if cfg.sparse:                                                 # PowerInfer's predictor
            out += [(_PRED_ROLES[n], il, model.file.tensors[f"blk.{il}.{n}"]) for n in ("fc1.weight", "fc2.weight")
                    if f"blk.{il}.{n}" in model.file.tensors]
        elif cfg.pi2:
            out += _predictor_descs(model, il)
    return out


def c_model_structs(model, descs: list | None = None) -> tuple:
    """The pi2_model_params and pi2_tensor_desc[] (cffi cdata) that pi2_model_load takes for `model`;
    `descs` overrides tensor_descs(model). Also serialised by tests for the aarch64 forward driver."""
    descs = tensor_descs(model) if descs is None else descs
    params = ffi.new("pi2_model_params *", model_params(model.config, moe_qkv_bias(model)))
    arr = ffi.new("pi2_tensor_desc[]", max(len(descs), 1))
    for i, (role, layer, t) in enumerate(descs):
        ne = list(t.ne) + [1] * (4 - len(t.ne))
        arr[i] = {"role": role, "layer": layer, "type": t.type, "ne": ne, "offset": t.offset, "nbytes": t.nbytes,
                  "row_stride": getattr(t, "row_stride", 0)}
    return params, arr


class CModel:
    """A model loaded by the C core: the file mapped read-only in C, tensors checked against it."""

    def __init__(self, handle, config, path: str, n_bytes: int):
        self._h, self.config, self.path = handle, config, path
        self.n_bytes = n_bytes   # bytes of the tensors one token reads

    @classmethod
    def from_model(cls, model, descs: list | None = None, no_mmap: bool = False) -> "CModel":
        """Describe `model` (a loader.Model) to C. `descs` overrides tensor_descs(model) (tests). no_mmap: C reads the
        whole file into memory instead of mapping it (--no-mmap)."""
        descs = tensor_descs(model) if descs is None else descs
        params, arr = c_model_structs(model, descs)
        params.no_mmap = int(no_mmap)
        out = ffi.new("pi2_model **")
        parts = file_parts(model.file)
        if len(parts) == 1:
            check(lib.pi2_model_load(str(model.path).encode(), params, arr, len(descs), out))
        else:     # a split model: every part mapped at its base (pi2/model/gguf_split.py)
            names = [ffi.new("char[]", os.fsencode(p)) for p, _, _ in parts]
            check(lib.pi2_model_load_parts(ffi.new("char *[]", names), ffi.new("uint64_t[]", [b for _, b, _ in parts]),
                                           len(parts), params, arr, len(descs), out))
        cm = cls(ffi.gc(out[0], lib.pi2_model_free), model.config, str(model.path),
                 sum(t.nbytes for _, _, t in descs))
        cm.model = model     # the file's tables: FFN rules and byte counts
        return cm

    def ffn_prefix(self, n_dense) -> None:
        """pi2_model_ffn_prefix: each layer's first n_dense[il] up rows (a pi2 file's hottest neurons) go into the x8
        layout with the next repack(ffn=True), and one token computes them with its gate rows. Before that repack."""
        check(lib.pi2_model_ffn_prefix(self._h, ffi.new("int32_t[]", [int(n) for n in n_dense]), len(n_dense)))

    def repack(self, ffn: bool = False, impl: str = "auto") -> int:
        """pi2_model_repack: the dense matrices (attention and output; the FFN too with ffn) copied into the
        packed kernels' layout, where table `impl` has packed kernels; the bytes all copies hold."""
        out = ffi.new("int64_t *")
        check(lib.pi2_model_repack(self._h, impl_id(impl), int(ffn), out))
        self.repacked = int(out[0])
        return self.repacked


def stream_sizes(cmodel: CModel, cluster: int, layer: int = 0, n_hot: int = 0) -> dict:
    """pi2_stream_query: slot_bytes, min_slots, and layer's hot_bytes (n_hot neurons), bundle_bytes, layer_bytes; the
    same for its gate rows: gate_slot_bytes, gate_hot_bytes, gate_row_bytes, gate_layer_bytes."""
    out = ffi.new("pi2_stream_sizes *")
    check(lib.pi2_stream_query(cmodel._h, cluster, layer, n_hot, out))
    return {k: getattr(out, k) for k in ("slot_bytes", "min_slots", "hot_bytes", "bundle_bytes", "layer_bytes",
                                         "gate_slot_bytes", "gate_hot_bytes", "gate_row_bytes", "gate_layer_bytes")}


def ctx_sizes(cmodel: CModel, n_ctx: int, n_threads: int, n_batch: int = 512, type_k: int = 1,
              type_v: int = 1) -> tuple:
    """(KV cache bytes, other buffers' bytes) a C context of these params allocates (pi2_ctx_query); type_k, type_v:
    the K and V caches' ggml types (a quantized V is counted with flash attention, which it needs)."""
    p = lib.pi2_ctx_default_params()
    p.n_ctx, p.n_threads, p.n_batch, p.type_k = n_ctx, max(n_threads, 1), n_batch, type_k
    p.type_v, p.flash_attn = type_v, int(type_v != 1)
    out = ffi.new("pi2_ctx_sizes *", {"size": ffi.sizeof("pi2_ctx_sizes")})
    check(lib.pi2_ctx_query(cmodel._h, ffi.new("pi2_ctx_params *", p), out))
    return out.kv_bytes, out.scratch_bytes
