"""config.py — ModelConfig: the one place that reads a model's `{arch}.*` hyper-parameters.

Owns: architecture support checks and the per-architecture deltas (RoPE variant, biases, extra norms,
FFN activation, embedding scale, sliding-window layers). Does not: read tensors or the tokenizer.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

from pi2.errors import ModelFormatError, UnsupportedError
from pi2.model.config_moe import MOE_ARCHS, is_moe_file, moe_fields

SUPPORTED_ARCHS = ("llama", "qwen2", "gemma3", "bamboo") + MOE_ARCHS


def layers_in(tensors: dict) -> int:
    """1 + the highest layer index among the tensors named `blk.N.*` (0 when there are none)."""
    n = 0
    for name in tensors:
        if name.startswith("blk."):
            idx = name[4:].split(".", 1)[0]
            if idx.isdigit() and len(idx) < 10:
                n = max(n, int(idx) + 1)
    return n


@dataclass(frozen=True)
class ModelConfig:
    arch: str
    n_vocab: int
    n_ctx_train: int
    n_embd: int
    n_layer: int
    n_ff: int
    n_head: int
    n_head_kv: int
    head_dim: int                  # key length per head
    head_dim_v: int                # value length per head
    n_rot: int                     # rotated dimensions per head
    rms_eps: float
    rope_base: float
    rope_neox: bool                # NEOX (half split) rope, else NORM (adjacent pairs)
    rope_freq_scale: float = 1.0   # 1 / linear scaling factor
    rope_base_local: float = 0.0   # gemma3: base of the sliding-window layers
    qkv_bias: bool = False
    qk_norm: bool = False          # gemma3 per-head RMSNorm of q and k
    post_norms: bool = False       # gemma3 post-attention and post-FFN norms
    ffn_act: str = "silu"          # silu | gelu (tanh approximation) | relu | drelu (relu(gate)·relu(up))
    embd_scale: float = 1.0        # gemma3: sqrt(n_embd)
    attn_scale: float = 0.0        # scale of q·k; 1/sqrt(head_dim) unless the architecture says otherwise
    q_prescale: bool = False       # gemma3 scales q before the K·Q product instead of inside the softmax
    logit_softcap: float = 0.0     # logits = c·tanh(logits/c) when set
    sliding_window: int = 0        # 0 = full attention on every layer
    swa_period: int = 0            # gemma3: layer il is global when il % swa_period == swa_period - 1
    sparse: bool = False           # a PowerInfer PWRI file (or a pi2 file converted from one)
    ffn_down_t: bool = False       # down stored transposed as ffn_down_t (PowerInfer files)
    pi2: bool = False              # a pi2 file (pi2.version): FFN in bundles, see pi2/model/ffn_layout.py
    ffn_layout: str = ""           # pi2 files: pi2.ffn.layout (bundle-ud | bundle-gud)
    # Mixture-of-Experts and the other archs of config_moe.py (qwen3, qwen3moe, qwen2moe, olmoe, granitemoe,
    # smallthinker, llama with experts); reference/moe.py computes them
    moe_family: bool = False       # the model is run by reference/moe.py
    n_expert: int = 0              # experts per layer (0: a dense FFN)
    n_expert_used: int = 0         # experts each token uses (top-k)
    n_ff_exp: int = 0              # one expert's FFN width
    expert_bundles: bool = False   # a converted MoE file (pi2.experts.layout): see pi2/model/expert_bundles.py
    n_ff_shexp: int = 0            # the shared expert's FFN width (0: none)
    shexp_gate: bool = False       # qwen2moe: the shared expert is scaled by sigmoid(ffn_gate_inp_shexp · x)
    expert_gating: str = ""        # softmax | sigmoid | softmax_weight | sqrt_softplus
    expert_weights_norm: bool = False   # the k weights are divided by their sum (clamped below at 2^-14)
    expert_weights_scale: float = 0.0   # the k weights are multiplied by it unless 0 or 1 (none of these archs)
    expert_act: str = "silu"       # silu (SwiGLU) | relu (ReGLU: smallthinker)
    router_before_attn: bool = False    # smallthinker: the router reads the layer input, before attn_norm
    qk_norm_full: bool = False     # olmoe: q and k RMS-normed over the whole projection, not per head
    residual_scale: float = 0.0    # granitemoe: attention and FFN outputs ×scale before the residual add
    logit_scale: float = 0.0       # granitemoe: logits ×(1/scale)
    swa_layers: tuple = ()         # per-layer sliding-window flags (smallthinker); () = swa_period's rule
    nope_layers: tuple = ()        # per-layer flags: no RoPE on this layer (smallthinker)
    rope_base_swa: float = 0.0     # smallthinker: RoPE base of the sliding-window layers (0 = rope_base)

    def is_swa_layer(self, il: int) -> bool:
        """True when layer il attends only over the last `sliding_window` positions."""
        if self.swa_layers:
            return bool(self.sliding_window) and self.swa_layers[il]
        return bool(self.sliding_window) and bool(self.swa_period) and il % self.swa_period != self.swa_period - 1

    def layer_rope_base(self, il: int) -> float:
        if self.swa_layers:
            return self.rope_base_swa or self.rope_base if self.is_swa_layer(il) else self.rope_base
        return self.rope_base_local if self.rope_base_local and self.is_swa_layer(il) else self.rope_base

    @classmethod
    def from_gguf(cls, kv: dict, tensors: dict, magic: str = "GGUF") -> "ModelConfig":
        arch = kv.get("general.architecture")
        if not isinstance(arch, str):
            raise ModelFormatError("general.architecture is missing")
        if arch not in SUPPORTED_ARCHS:
            raise UnsupportedError(f"architecture '{arch}' is not supported (supported: {', '.join(SUPPORTED_ARCHS)})")

        def get(key, default=None, required=False):
            v = kv.get(f"{arch}.{key}", default)
            if v is None and required:
                raise ModelFormatError(f"required key {arch}.{key} is missing")
            if hasattr(v, "shape"):  # per-layer arrays: pi2 needs them uniform
                if len(set(int(x) for x in v)) > 1:
                    raise UnsupportedError(f"{arch}.{key} varies per layer, which is not supported")
                v = type(v[0].item())(v[0]) if len(v) else default
            return v

        n_embd = int(get("embedding_length", required=True))
        n_layer = int(get("block_count", required=True))
        n_head = int(get("attention.head_count", required=True))
        n_head_kv = int(get("attention.head_count_kv", n_head))
        if n_embd <= 0 or n_layer <= 0 or n_head <= 0 or n_head_kv <= 0 or n_head % n_head_kv:
            raise ModelFormatError(f"inconsistent hyper-parameters: n_embd {n_embd}, n_layer {n_layer}, "
                                   f"n_head {n_head}, n_head_kv {n_head_kv}")
        n_blk = layers_in(tensors)
        if n_layer > n_blk:     # checked before anything loops over the layers: 2^31 of them would never end
            raise ModelFormatError(f"{arch}.block_count is {n_layer} but the file holds tensors for {n_blk} layers")
        head_dim = int(get("attention.key_length", n_embd // n_head))
        head_dim_v = int(get("attention.value_length", head_dim))
        n_rot = int(get("rope.dimension_count", head_dim))
        if n_rot > head_dim or n_rot % 2:
            raise ModelFormatError(f"rope.dimension_count {n_rot} does not fit head_dim {head_dim}")
        moe = is_moe_file(arch, kv)
        if (arch == "llama" or moe) and n_rot != head_dim:
            raise ModelFormatError(f"{arch}.rope.dimension_count {n_rot} must equal head_dim {head_dim}")
        emb = tensors.get("token_embd.weight")
        if emb is None:
            raise ModelFormatError("tensor token_embd.weight is missing")
        n_vocab = int(get("vocab_size", 0) or len(kv.get("tokenizer.ggml.tokens", [])) or emb.ne[1])
        n_ff = get("feed_forward_length")
        if n_ff is None:
            gate = tensors.get("blk.0.ffn_up.weight")
            n_ff = gate.ne[1] if gate is not None else 0
        eps = get("attention.layer_norm_rms_epsilon", required=(arch == "llama"))
        scaling = get("rope.scaling.type", "none")
        factor = float(get("rope.scaling.factor", 0.0) or 0.0)
        if scaling not in ("none", "linear") and factor not in (0.0, 1.0):
            raise UnsupportedError(f"rope scaling '{scaling}' is not supported yet (linear is)")
        freq_scale = 1.0 / factor if scaling == "linear" and factor > 0 else 1.0

        common = dict(arch=arch, n_vocab=n_vocab, n_ctx_train=int(get("context_length", required=True)),
                      n_embd=n_embd, n_layer=n_layer, n_ff=int(n_ff), n_head=n_head, n_head_kv=n_head_kv,
                      head_dim=head_dim, head_dim_v=head_dim_v, n_rot=n_rot,
                      rms_eps=float(eps if eps is not None else 1e-6),
                      rope_base=float(get("rope.freq_base", 10000.0)), rope_freq_scale=freq_scale,
                      attn_scale=1.0 / math.sqrt(head_dim))
        is_pi2 = "pi2.version" in kv
        # a pi2 file converted from a PowerInfer file: pi2.source.magic, or the copied PowerInfer key
        pwri = (kv.get("pi2.source.magic", "PWRI" if "powerinfer.sparse_threshold" in kv else "GGUF")
                if is_pi2 else magic) == "PWRI"
        common.update(sparse=pwri, pi2=is_pi2, ffn_down_t=not is_pi2 and "blk.0.ffn_down_t.weight" in tensors,
                      ffn_layout=str(kv.get("pi2.ffn.layout", "bundle-ud")) if is_pi2 else "")
        if is_pi2 and common["ffn_layout"] not in ("bundle-ud", "bundle-gud"):
            raise UnsupportedError(f"pi2.ffn.layout '{common['ffn_layout']}' is not supported (bundle-ud, bundle-gud)")
        if moe:
            bundles = "pi2.experts.layout" in kv
            if bundles and kv["pi2.experts.layout"] != "bundle-ud":
                raise UnsupportedError(f"pi2.experts.layout '{kv['pi2.experts.layout']}' is not supported (bundle-ud)")
            return cls(moe_family=True, expert_bundles=bundles, **{**common, **moe_fields(arch, kv, get, common)})
        if arch in ("llama", "bamboo"):
            act = ("drelu" if pwri else "relu") if arch == "bamboo" else ("relu" if pwri else "silu")
            return cls(rope_neox=False, ffn_act=act, **common)
        if arch == "qwen2":
            return cls(rope_neox=True, qkv_bias=True, **common)
        # gemma3
        common["logit_softcap"] = float(get("final_logit_softcapping", 0.0) or 0.0)
        window = int(get("attention.sliding_window", 0) or 0)
        if window < 0:
            raise ModelFormatError(f"{arch}.attention.sliding_window is {window}")
        return cls(rope_neox=True, qk_norm=True, post_norms=True, ffn_act="gelu", embd_scale=math.sqrt(n_embd),
                   q_prescale=True,    # a window wider than any context (2^24, the C side's int32) sees everything
                   sliding_window=min(window, 1 << 24), swa_period=6,
                   rope_base_local=10000.0, **common)
