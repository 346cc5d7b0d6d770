"""engine/context_stats.py — what a CContext reports of itself: the FFN's active and predicted neurons per layer,
routed rows per expert and the neurons open in them, the streamed FFN's read and cache figures (per token, since
the last call), and the bench's summary of them.

Does not: decode or configure anything (context.py: CContext inherits this class and owns the handle it reads).
"""
from __future__ import annotations

import numpy as np

from pi2.engine import expert_clusters
from pi2.engine.lib import check, ffi, lib
from pi2.model.ffn_layout import bytes_touched, layer_bytes, predictor_bytes
from pi2.model.info_moe import active_params, ffn_bytes_per_token


class ContextStats:
    """The statistics half of CContext (self._h, self.cfg, self.cmodel and the stream settings are CContext's)."""

    def stats(self) -> dict:
        """pi2_ctx_get_stats as a dict: ffn_tokens, ffn_active and ffn_predicted (per layer, arrays), and the NNAPI
        delegate's nnapi_runs / nnapi_fallbacks / nnapi_bytes and hot_runs / hot_fallbacks / hot_bytes."""
        active, predicted = np.zeros(self.cfg.n_layer, np.int64), np.zeros(self.cfg.n_layer, np.int64)
        st = ffi.new("pi2_ctx_stats *", {"size": ffi.sizeof("pi2_ctx_stats")})
        st.ffn_active = ffi.from_buffer("int64_t[]", active, require_writable=True)
        st.ffn_predicted = ffi.from_buffer("int64_t[]", predicted, require_writable=True)
        check(lib.pi2_ctx_get_stats(self._h, st, ffi.NULL))
        out = {k: getattr(st, k) for k in ("ffn_tokens", "nnapi_runs", "nnapi_fallbacks", "nnapi_bytes", "hot_runs",
                                           "hot_fallbacks", "hot_bytes")}
        return {**out, "ffn_active": active, "ffn_predicted": predicted}

    @property
    def expert_counts(self) -> np.ndarray:
        """(n_layer, n_expert) rows routed to each expert since the context was made (the MoE family; as
        reference.moe.MoEContext.expert_counts)."""
        cfg = self.cfg
        out = np.zeros((cfg.n_layer, max(cfg.n_expert, 1)), np.int64)
        if cfg.n_expert:
            st = ffi.new("pi2_ctx_stats *", {"size": ffi.sizeof("pi2_ctx_stats")})
            st.expert_rows = ffi.from_buffer("int64_t[]", out, require_writable=True)
            check(lib.pi2_ctx_get_stats(self._h, st, ffi.NULL))
        return out

    def ffn_counts(self) -> tuple:
        """(tokens through the FFN, active neurons per layer summed over them) since set_ffn."""
        st = self.stats()
        return int(st["ffn_tokens"]), st["ffn_active"]

    def ffn_predicted(self) -> np.ndarray:
        """Predicted neurons (|P|) per layer summed over the tokens since set_ffn (zeros but for rule predicted)."""
        return self.stats()["ffn_predicted"]

    def bench_stats(self) -> dict:
        """Mean keep-fraction over (token, layer) and FFN weight bytes read per token (as SparseFFN.stats); for a
        streamed context also the neuron cache's figures since the previous call (stream_stats). The MoE family
        computes its selected experts whole: its figures are the file's routing (experts per token, their share,
        the bytes a token reads)."""
        if self.cfg.moe_family:
            c, model = self.cfg, self.cmodel.model
            if not c.n_expert:
                return {}
            share = self.expert_neurons_active()
            return {"experts_per_token": c.n_expert_used, "ffn_keep": c.n_expert_used / c.n_expert,
                    "ffn_bytes_per_token": ffn_bytes_per_token(model), "active_bytes_per_token": active_params(model)[1],
                    **({"expert_neurons_active": round(share, 4)} if share is not None else {}),
                    **expert_clusters.stats(self), **self.stream_stats()}
        return {**self._ffn_stats(), **self.stream_stats()}

    def expert_neurons_active(self) -> float | None:
        """ReLU experts under the relu rule (csrc/ffn/moe_relu.c): the share of a single token's routed experts'
        neurons whose gate opened (their up rows computed) since set_ffn, over the layers before the last (a prompt's
        last layer computes one row like a single token); None when nothing was counted."""
        c = self.cfg
        tokens, active = self.ffn_counts()
        if not (c.moe_family and c.n_expert and tokens and c.n_layer > 1):
            return None
        return float(active[:-1].sum() / (tokens * (c.n_layer - 1) * c.n_expert_used * c.n_ff_exp))

    def stream_stats(self) -> dict:
        """Streamed contexts: cache_hit_rate (needed bundle clusters found hot or cached), cold_hit_rate, flash bytes
        per token decoded (gate rows included), io_wait_share (of decode time), read_mbps (bytes read / time reads
        were outstanding), since the previous call; with streamed gate rows also gate_hit_rate (P's gate clusters
        found hot or cached), gate_flash_bytes_per_token, gate_cache_bytes and gate_hot_bytes; whole_layer_reads
        (regions read whole: batches, gate rows read whole) and whole_reads_ahead (the share submitted before
        their FFN). {} when not streamed."""
        st = self.cache_stats()
        if not st:
            return {}
        st["decode_s"], st["decoded"] = getattr(self, "_decode_s", 0.0), getattr(self, "_decoded", 0)
        prev = getattr(self, "_stream_prev", None) or {k: 0 for k in st}
        self._stream_prev = dict(st)
        d = {k: st[k] - prev[k] for k in st if not k.endswith(("arena_bytes", "hot_bytes", "_pinned"))}
        if self.cfg.moe_family:
            return self._expert_stats(st, d)
        need, cold = d["hot"] + d["hits"] + d["misses"], d["hits"] + d["misses"]
        whole = d["layer_loads"] + d["gate_layer_loads"]   # regions read whole (batches, gate rows read whole)
        out = {"cache_hit_rate": round((d["hot"] + d["hits"]) / need, 4) if need else 1.0,
               "cold_hit_rate": round(d["hits"] / cold, 4) if cold else 1.0,
               "flash_bytes_per_token": int(d["bytes_read"] / d["decoded"]) if d["decoded"] else 0,
               "io_wait_share": round(d["io_wait_s"] / d["decode_s"], 4) if d["decode_s"] > 0 else 0.0,
               "read_mbps": round(d["bytes_read"] / d["read_s"] / 1e6, 1) if d["read_s"] > 0 else 0.0,
               "early_reads_per_token": round(d["early_reads"] / d["decoded"], 1) if d["decoded"] else 0.0,
               "early_unused": round(d["early_unused"] / d["early_reads"], 4) if d["early_reads"] else 0.0,
               "whole_layer_reads": whole,
               "whole_reads_ahead": round(d["layer_loads_ahead"] / whole, 4) if whole else 0.0,
               "cache_bytes": st["arena_bytes"], "hot_bytes": st["hot_bytes"],
               "memory_budget": getattr(getattr(self, "plan", None), "budget", 0)}
        if self.stream.get("stream_gate"):   # two-phase loading: the gate rows' share (included above)
            gneed = d["gate_hot"] + d["gate_hits"] + d["gate_misses"]
            out.update(gate_hit_rate=round((d["gate_hot"] + d["gate_hits"]) / gneed, 4) if gneed else 1.0,
                       gate_flash_bytes_per_token=int(d["gate_bytes_read"] / d["decoded"]) if d["decoded"] else 0,
                       gate_cache_bytes=st["gate_arena_bytes"], gate_hot_bytes=st["gate_hot_bytes"])
        return out

    def _expert_stats(self, st: dict, d: dict) -> dict:
        """stream_stats of a MoE file's expert cache: expert_hit_rate (needed experts, per layer and step, found
        resident or in a slot), experts_loaded_per_token (distinct experts a step needed per token and layer), the
        routing-ahead hit rate (guessed experts the routing then needed), experts_learned (slots pinned now for hot
        experts learned while running) and learned_hit_share (of the needed experts, found in one of them), and the
        figures every streamed run has."""
        need = d["expert_hot"] + d["expert_hits"] + d["expert_misses"]
        layers = sum(1 for il in range(self.cfg.n_layer) if self.cmodel.model.file.tensors.get(
            f"blk.{il}.ffn_gate_exps.weight") is not None) or 1
        hit = round((d["expert_hot"] + d["expert_hits"]) / need, 4) if need else 1.0
        return {"cache_hit_rate": hit, "expert_hit_rate": hit,
                "cold_hit_rate": round(d["expert_hits"] / (d["expert_hits"] + d["expert_misses"]), 4)
                if d["expert_hits"] + d["expert_misses"] else 1.0,
                "experts_loaded_per_token": round(need / d["tokens"] / layers, 2) if d["tokens"] else 0.0,
                "expert_ahead_hit_rate": round(d["expert_ahead_used"] / d["expert_ahead"], 4)
                if d["expert_ahead"] else 0.0,
                "experts_learned": st["expert_pinned"],
                "learned_hit_share": round(d["expert_pinned_hits"] / need, 4) if need else 0.0,
                "expert_partial_hit_rate": round(d["expert_partial_hits"] / need, 4) if need else 0.0,
                "cluster_hit_rate": round(d["expert_cl_found"] / d["expert_cl_need"], 4)
                if d["expert_cl_need"] else 0.0,
                "expert_held_bytes": st["expert_held_bytes"], "experts_held": st["expert_slots_held"],
                "experts_evicted": d["expert_evicted"],
                "flash_bytes_per_token": int(d["bytes_read"] / d["decoded"]) if d["decoded"] else 0,
                "io_wait_share": round(d["io_wait_s"] / d["decode_s"], 4) if d["decode_s"] > 0 else 0.0,
                "read_mbps": round(d["bytes_read"] / d["read_s"] / 1e6, 1) if d["read_s"] > 0 else 0.0,
                "cache_bytes": st["arena_bytes"], "hot_bytes": st["hot_bytes"],
                "memory_budget": getattr(getattr(self, "plan", None), "budget", 0)}

    def _ffn_stats(self) -> dict:
        """As SparseFFN.stats: ffn_keep, ffn_bytes_per_token, and ffn_predicted under the predicted rule."""
        spec = getattr(self, "ffn_spec", None)
        model = getattr(self.cmodel, "model", None)
        if spec is None or model is None:
            return {}
        n, active = self.ffn_counts()
        predicted = spec.rule == "predicted"
        if not n:
            out = {"ffn_keep": 1.0 if spec.rule == "dense" else 0.0, "ffn_bytes_per_token": 0}
            return {**out, "ffn_predicted": 0.0} if predicted else out
        lbs = [layer_bytes(model, il) for il in range(self.cfg.n_layer)]
        n_pred = self.ffn_predicted() if predicted else [None] * len(lbs)
        if predicted:   # the predictor's own bytes, per token
            lbs = [(predictor_bytes(model, il, spec.pred_kind),) + lb[1:] for il, lb in enumerate(lbs)]
        total = sum(lb[3] for lb in lbs) * n
        out = {"ffn_keep": round(int(active.sum()) / total, 6),
               "ffn_bytes_per_token": int(round(sum(bytes_touched(spec.rule, lb, n, int(a), None if p is None else int(p))
                                                    for lb, a, p in zip(lbs, active, n_pred)) / n))}
        if predicted:
            out["ffn_predicted"] = round(int(np.sum(n_pred)) / total, 6)
        return out

    _CACHE_STATS = ("tokens", "hot", "hits", "misses", "reads", "bytes_read", "layer_loads", "io_wait_s", "read_s",
                    "arena_bytes", "hot_bytes", "gate_hot", "gate_hits", "gate_misses", "gate_bytes_read",
                    "gate_layer_loads", "gate_arena_bytes", "gate_hot_bytes", "early_reads", "early_unused",
                    "layer_loads_ahead", "expert_hot", "expert_hits", "expert_misses", "expert_ahead",
                    "expert_ahead_used", "expert_rows", "expert_pinned", "expert_pinned_hits", "expert_partial_hits",
                    "expert_cl_need", "expert_cl_found", "expert_held_bytes", "expert_evicted",
                    "expert_slots_held")

    def cache_stats(self) -> dict:
        """The neuron cache's counters (pi2_cache_stats as a dict); {} when the context is not streamed."""
        if not getattr(self, "stream", None):
            return {}
        st = ffi.new("pi2_cache_stats *", {"size": ffi.sizeof("pi2_cache_stats")})
        check(lib.pi2_ctx_get_stats(self._h, ffi.NULL, st))
        return {k: getattr(st, k) for k in self._CACHE_STATS}
