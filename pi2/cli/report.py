"""report.py — `--verbose`'s figures after run, chat and perplexity, on stderr: why NNAPI was not used, the
experts' active share and open clusters, and a streamed run's neuron or expert cache (its plan, hit rates, flash bytes
per token, I/O wait, peak RSS).
Does not: run anything (pi2/cli/run_chat.py, pi2/cli/commands.py call it with the session they ran).
"""
from __future__ import annotations

import sys

from pi2.engine import expert_clusters
from pi2.runtime.bench import peak_rss


def verbose_report(session) -> None:
    """--verbose: why NNAPI was not used, and a streamed run's neuron cache (its plan and figures, the peak RSS)."""
    for line in session.notes():
        print(f"pi2: npu: {line}", file=sys.stderr)
    share = session.ctx.expert_neurons_active() if hasattr(session.ctx, "expert_neurons_active") else None
    if share is not None:   # ReLU experts: the up rows of closed gates were skipped
        print(f"pi2: experts: {share:.1%} of the routed experts' neurons active per token (up rows of the others "
              f"skipped)", file=sys.stderr)
    cl = expert_clusters.stats(session.ctx) if hasattr(session.ctx, "cmodel") else {}
    if cl:   # a converted MoE file: what streaming only the open clusters would read
        print(f"pi2: experts: {cl['expert_open_clusters']:.1%} of the bundle clusters open per routed row: gate rows "
              f"+ open clusters {cl['expert_bytes_per_token_open_clusters'] / 2**20:.2f} MiB per token, whole experts "
              f"{cl['expert_bytes_per_token_whole'] / 2**20:.2f} MiB", file=sys.stderr)
    plan = session.cache
    if plan is None:
        return
    st = session.ctx.stream_stats()
    if getattr(plan, "kind", "") == "experts":   # a MoE file's expert cache
        slots = (f"{plan.cap / 2**20:.0f} MiB of LRU slots sized to what is read ({plan.n_slots} slots, holding "
                 f"{st['expert_held_bytes'] / 2**20:.0f} MiB now" if plan.cap else
                 f"{plan.n_slots} x {plan.slot_bytes // 1024} KiB LRU slots (")
        print(f"pi2: experts: budget {plan.budget / 2**20:.0f} MiB, {plan.n_hot} hot ({st['hot_bytes'] / 2**20:.1f} "
              f"MiB), {slots}; {st['experts_learned']} of them pinned for hot experts learned while running), "
              f"io {plan.io}", file=sys.stderr)
        print(f"pi2: experts: {st['experts_loaded_per_token']:.2f} per token and layer, hit rate "
              f"{st['expert_hit_rate']:.1%} (cold {st['cold_hit_rate']:.1%}; partial "
              f"{st['expert_partial_hit_rate']:.1%}: "
              f"found, clusters read; clusters found {st['cluster_hit_rate']:.1%}), flash "
              f"{st['flash_bytes_per_token'] / 2**20:.2f} MiB/token, read {st['read_mbps']:.0f} MB/s, I/O wait "
              f"{st['io_wait_share']:.1%} of decode, peak RSS {peak_rss() / 2**20:.0f} MiB"
              + (f", routing ahead {st['expert_ahead_hit_rate']:.1%} right" if plan.ahead else ""), file=sys.stderr)
        return
    print(f"pi2: cache: budget {plan.budget / 2**20:.0f} MiB, hot {st['hot_bytes'] / 2**20:.1f} MiB, "
          f"cold {plan.n_slots} x {plan.slot_bytes // 1024} KiB slots, cluster {plan.cluster}, io {plan.io}",
          file=sys.stderr)
    print(f"pi2: cache: hit rate {st['cache_hit_rate']:.1%} (cold {st['cold_hit_rate']:.1%}), "
          f"flash {st['flash_bytes_per_token'] / 2**20:.2f} MiB/token, read {st['read_mbps']:.0f} MB/s, "
          f"I/O wait {st['io_wait_share']:.1%} of decode, peak RSS {peak_rss() / 2**20:.0f} MiB", file=sys.stderr)
    cs = session.ctx.cache_stats()   # since the run began
    whole = cs["layer_loads"] + cs["gate_layer_loads"]
    if whole:
        print(f"pi2: cache: {whole} layer regions read whole (prompt batches{', gate rows' if plan.gate_whole else ''})"
              f", {cs['layer_loads_ahead'] / whole:.0%} of them submitted before their FFN", file=sys.stderr)
    if plan.gate_whole:   # below the floor with mapped gate rows: every layer's gate rows read whole per token
        print(f"pi2: cache: gate rows read whole each token, {plan.n_gate_slots} x {plan.gate_slot_bytes // 1024} "
              f"KiB slots, flash {st['gate_flash_bytes_per_token'] / 2**20:.2f} MiB/token (of the above)",
              file=sys.stderr)
    elif "gate_hit_rate" in st:   # two-phase loading: the gate rows' share of the figures above
        print(f"pi2: cache: gate rows hot {st['gate_hot_bytes'] / 2**20:.1f} MiB, {plan.n_gate_slots} x "
              f"{plan.gate_slot_bytes // 1024} KiB slots, hit rate {st['gate_hit_rate']:.1%}, flash "
              f"{st['gate_flash_bytes_per_token'] / 2**20:.2f} MiB/token (of the above)", file=sys.stderr)
