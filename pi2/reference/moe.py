"""moe.py — the numpy forward pass of the Mixture-of-Experts family (qwen3moe, llama with experts,
qwen2moe, olmoe, granitemoe, smallthinker) and of dense qwen3: the specification the C engine must equal.

It computes what llama.cpp 0c1e570's x86 CPU backend computes (repack on, flash attention off), float order
included: every product through moe_matmul (the kernel ggml picks for that type and batch), the router's math
through moe_routing, the shared pieces (RMSNorm, RoPE, F16 KV cache, attention) from reference.py. Like
llama.cpp's graph, the last layer computes its FFN only for the rows whose logits are asked for (inp_out_ids),
which changes those rows' batch and so, for some kernels, their bits. docs/moe.md writes the math out.
The layer, in order (llama.cpp names in quotes; the trace hook sees them):
  router logits on the layer input ("ffn_moe_logits", smallthinker only) · "attn_norm" · q, k, v (+ biases)
  · olmoe: RMSNorm of q and k over the whole projection · qwen3/qwen3moe: per-head RMSNorm · RoPE (not on
  smallthinker's no-RoPE layers) · attention · output projection (+ bias) · [last layer: keep the output rows]
  · granite: ×residual_scale · "ffn_inp" = + layer input · "ffn_norm" · FFN (dense, or MoE + shared expert)
  · granite: ×residual_scale · "l_out" = + ffn_inp.
"""
from __future__ import annotations

import numpy as np

from pi2.reference import ggml_order as go
from pi2.errors import UsageError
from pi2.model import expert_bundles
from pi2.model.info_moe import active_params, ffn_bytes_per_token
from pi2.model.loader import Model
from pi2.reference.moe_down_rows import DownRows
from pi2.reference.moe_matmul import ExpertLinear, Linear, group_by_expert
from pi2.reference.moe_routing import expf, route
from pi2.reference.forward import attention, rms_norm, rope, rope_cache

F16, F32 = np.float16, np.float32


def swiglu(g: np.ndarray, u: np.ndarray) -> np.ndarray:
    """ggml_vec_swiglu_f32: ggml_v_silu(g)·u 16 values at a time, the n % 16 tail as g/(1+expf(−g))·u (libm)."""
    n = g.shape[-1]
    n16 = n - n % 16
    out = np.empty_like(g)
    out[..., :n16] = go.swiglu(g[..., :n16], u[..., :n16])
    if n16 < n:
        t = g[..., n16:]
        out[..., n16:] = (t / (F32(1) + expf(-t))) * u[..., n16:]
    return out


def reglu(g: np.ndarray, u: np.ndarray) -> np.ndarray:
    """ggml_vec_reglu_f32: g > 0 ? g·u : 0."""
    return np.where(g > 0, g * u, F32(0)).astype(F32)


class MoEWeights:
    """A MoE-family model's tensors: norms and biases as float32, 2-D weights as moe_matmul.Linear, expert
    tensors as ExpertLinear (each expert's slice decoded when first used)."""

    def __init__(self, model: Model):
        cfg = self.cfg = model.config
        names = model.file.tensors

        def vec(name):
            return np.asarray(model.raw(name).view(np.float32).reshape(-1))

        def lin(name):
            t = model.tensor(name)
            return Linear(model.raw(name), t.type, t.ne[0])

        def opt(name, make):
            return make(name) if name in names else None

        self.token_embd = lin("token_embd.weight")
        self.output = self.token_embd if model.tied_output else lin("output.weight")
        self.output_norm = vec("output_norm.weight")
        self.layers = []
        for il in range(cfg.n_layer):
            b = f"blk.{il}."
            L = {n: lin(b + n + ".weight") for n in ("attn_q", "attn_k", "attn_v", "attn_output")}
            L["attn_norm"], L["ffn_norm"] = vec(b + "attn_norm.weight"), vec(b + "ffn_norm.weight")
            for n in ("q", "k", "v", "output"):
                L[f"b{n}"] = opt(b + f"attn_{n}.bias", vec)
            if cfg.qk_norm or cfg.qk_norm_full:
                L["q_norm"], L["k_norm"] = vec(b + "attn_q_norm.weight"), vec(b + "attn_k_norm.weight")
            if not cfg.n_expert:
                L.update({n: lin(b + n + ".weight") for n in ("ffn_gate", "ffn_up", "ffn_down")})
            else:
                L["router"] = lin(b + "ffn_gate_inp.weight")
                for n in ("gate",) if cfg.expert_bundles else ("gate", "up", "down"):
                    t = model.tensor(b + f"ffn_{n}_exps.weight")
                    L[f"{n}_exps"] = ExpertLinear(model.raw(t.name), t.type, t.ne[0], t.ne[1], t.ne[2])
                if cfg.expert_bundles:   # a converted file: up rows and down rows from the bundles
                    raw, qtype = expert_bundles.up_rows(model, il)
                    L["up_exps"] = ExpertLinear(raw, qtype, cfg.n_embd, cfg.n_ff_exp, cfg.n_expert)
                    L["down_exps"] = DownRows(model, il)
                if cfg.n_ff_shexp:
                    L.update({f"{n}_shexp": lin(b + f"ffn_{n}_shexp.weight") for n in ("gate", "up", "down")})
                    if cfg.shexp_gate:
                        L["gate_inp_shexp"] = lin(b + "ffn_gate_inp_shexp.weight")
            self.layers.append(L)


class MoEContext:
    """A sequence being evaluated by the MoE-family reference: F16 KV cache, position, per-expert counters."""

    engine = "reference"

    def __init__(self, model: Model, n_ctx: int, weights: MoEWeights | None = None):
        cfg = self.cfg = model.config
        self.model, self.n_ctx = model, n_ctx
        self.w = weights or MoEWeights(model)
        self.k = np.zeros((cfg.n_layer, n_ctx, cfg.n_head_kv, cfg.head_dim), F16)
        self.v = np.zeros((cfg.n_layer, n_ctx, cfg.n_head_kv, cfg.head_dim_v), F16)
        self.n_past = 0
        self.trace = None        # optional callable(name, layer, array)
        self.expert_counts = np.zeros((cfg.n_layer, max(cfg.n_expert, 1)), np.int64)   # rows routed per expert

    def reset(self) -> None:
        self.n_past = 0

    def truncate(self, n_keep: int) -> None:
        """Keep the first n_keep cached positions (0 <= n_keep <= n_past) and forget the rest."""
        if not 0 <= n_keep <= self.n_past:
            raise UsageError(f"cannot keep {n_keep} of {self.n_past} cached positions")
        self.n_past = int(n_keep)

    def bench_stats(self) -> dict:
        """pi2 bench's extra fields: experts per token, the share of expert neurons a token computes, the FFN
        bytes a token reads (its k experts' slices, the router, the shared expert) and all weight bytes it reads."""
        c = self.cfg
        if not c.n_expert:
            return {}
        return {"experts_per_token": c.n_expert_used, "ffn_keep": c.n_expert_used / c.n_expert,
                "ffn_bytes_per_token": ffn_bytes_per_token(self.model), "active_bytes_per_token": active_params(self.model)[1]}

    def _cb(self, name, il, x):
        if self.trace is not None:
            self.trace(name, il, x)

    def decode(self, tokens, all_logits: bool = False, out_from: int | None = None) -> np.ndarray:
        """Evaluate `tokens` after the cached ones. Logits of the last token (n_vocab,), of every token when
        all_logits, or of tokens out_from.. (what llama-perplexity asks for) as (rows, n_vocab)."""
        cfg, w = self.cfg, self.w
        n = len(tokens)
        if n == 0:
            raise UsageError("nothing to decode")
        if self.n_past + n > self.n_ctx:
            raise UsageError(f"context full: {self.n_past} + {n} tokens > n_ctx {self.n_ctx}")
        out = np.arange(out_from, n) if out_from is not None else np.arange(n) if all_logits else np.array([n - 1])
        pos = np.arange(self.n_past, self.n_past + n)
        x = w.token_embd.rows(np.asarray(tokens))
        if cfg.embd_scale != 1.0:
            x = x * F32(cfg.embd_scale)
        for il, L in enumerate(w.layers):
            x = self._layer(il, L, x, pos, out if il == cfg.n_layer - 1 else None)
        self.n_past += n
        x = rms_norm(x, w.output_norm, cfg.rms_eps)
        self._cb("result_norm", -1, x)
        logits = w.output(x)
        if cfg.logit_scale:
            logits = logits * (F32(1) / F32(cfg.logit_scale))
        self._cb("result_output", -1, logits)
        return logits if (all_logits or out_from is not None) else logits[0]

    def decode_from(self, tokens, first: int) -> np.ndarray:
        """A fresh chunk with logits for positions first.. only, as llama-perplexity evaluates it."""
        self.reset()
        return self.decode(tokens, out_from=first)

    def _layer(self, il: int, L: dict, x: np.ndarray, pos: np.ndarray, out) -> np.ndarray:
        cfg = self.cfg
        n = len(pos)
        r_logits = None
        if cfg.router_before_attn:
            r_logits = L["router"](x)
            self._cb("ffn_moe_logits", il, r_logits)
        h = rms_norm(x, L["attn_norm"], cfg.rms_eps)
        self._cb("attn_norm", il, h)
        q, k, v = L["attn_q"](h), L["attn_k"](h), L["attn_v"](h)
        if L["bq"] is not None:
            q = q + L["bq"]
        if L["bk"] is not None:
            k = k + L["bk"]
        if L["bv"] is not None:
            v = v + L["bv"]
        if cfg.qk_norm_full:
            q, k = rms_norm(q, L["q_norm"], cfg.rms_eps), rms_norm(k, L["k_norm"], cfg.rms_eps)
        q = q.reshape(n, cfg.n_head, cfg.head_dim)
        k = k.reshape(n, cfg.n_head_kv, cfg.head_dim)
        if cfg.qk_norm:
            q, k = rms_norm(q, L["q_norm"], cfg.rms_eps), rms_norm(k, L["k_norm"], cfg.rms_eps)
        if not (cfg.nope_layers and cfg.nope_layers[il]):
            cos, sin = rope_cache(pos, cfg.n_rot, cfg.layer_rope_base(il), cfg.rope_freq_scale)
            q, k = rope(q, cos, sin, cfg.n_rot, cfg.rope_neox), rope(k, cos, sin, cfg.n_rot, cfg.rope_neox)
        self._cb("Qcur", il, q)
        self._cb("Kcur", il, k)
        self._cb("Vcur", il, v)
        self.k[il, pos] = k.astype(F16)
        self.v[il, pos] = v.reshape(n, cfg.n_head_kv, cfg.head_dim_v).astype(F16)
        window = cfg.sliding_window if cfg.is_swa_layer(il) else 0
        a = attention(q, self.k[il], self.v[il], pos, self.n_past + n, cfg.attn_scale, window)
        self._cb("kqv_out", il, a)
        a = L["attn_output"](a)
        if L["boutput"] is not None:
            a = a + L["boutput"]
        if out is not None:               # the last layer: only the rows whose logits are wanted
            a, x = a[out], x[out]
            r_logits = r_logits[out] if r_logits is not None else None
        if cfg.residual_scale:
            a = a * F32(cfg.residual_scale)
        self._cb("attn_out", il, a)
        x = a + x
        self._cb("ffn_inp", il, x)
        h = rms_norm(x, L["ffn_norm"], cfg.rms_eps)
        self._cb("ffn_norm", il, h)
        f = self._moe(il, L, h, r_logits) if cfg.n_expert else self._dense(L, h, "ffn_gate", "ffn_up", "ffn_down")
        if cfg.residual_scale:
            f = f * F32(cfg.residual_scale)
        self._cb("ffn_out", il, f)
        x = f + x
        self._cb("l_out", il, x)
        return x

    @staticmethod
    def _dense(L, h, gate, up, down):
        """build_ffn(up, gate, down, SILU, PAR): down(swiglu(gate·h, up·h))."""
        return L[down](swiglu(L[gate](h), L[up](h)))

    def _moe(self, il: int, L: dict, h: np.ndarray, logits) -> np.ndarray:
        """build_moe_ffn, then the shared expert (qwen2moe: times sigmoid(gate_inp_shexp·h); granitemoe: plain)."""
        cfg = self.cfg
        if logits is None:
            logits = L["router"](h)
            self._cb("ffn_moe_logits", il, logits)
        k = cfg.n_expert_used
        selected, weights = route(logits, k, cfg.expert_gating, cfg.expert_weights_norm, cfg.expert_weights_scale)
        self._cb("ffn_moe_topk", il, selected)
        self._cb("ffn_moe_weights", il, weights)
        n, ff = h.shape[0], cfg.n_ff_exp
        gate = np.zeros((n, k, ff), F32)
        up = np.zeros((n, k, ff), F32)
        groups = group_by_expert(selected, cfg.n_expert)
        for e, toks, slots in groups:                  # ggml_mul_mat_id: experts in index order
            up[toks, slots] = L["up_exps"](e, h[toks])
            gate[toks, slots] = L["gate_exps"](e, h[toks])
            self.expert_counts[il, e] += len(toks)
        act = reglu(gate, up) if cfg.expert_act == "relu" else swiglu(gate, up)
        down = np.zeros((n, k, cfg.n_embd), F32)
        for e, toks, slots in groups:
            down[toks, slots] = L["down_exps"](e, act[toks, slots])
        experts = down * weights[:, :, None]           # ggml_mul by the weights, then the adds in slot order
        moe = experts[:, 0]
        for j in range(1, k):
            moe = moe + experts[:, j]
        self._cb("ffn_moe_out", il, moe)
        if cfg.n_ff_shexp:
            sh = self._dense(L, h, "gate_shexp", "up_shexp", "down_shexp")
            if cfg.shexp_gate:
                g = L["gate_inp_shexp"](h)                         # (n, 1): ggml_vec_dot_f32 per token
                sh = sh * ((g / (F32(1) + expf(-g))) / g)          # ggml_silu's scalar path, then ggml_div
            self._cb("ffn_shexp", il, sh)
            moe = moe + sh
        return moe
