"""expert_clusters.py — what reading only the open clusters of a converted MoE file's expert bundles would cost: the C
engine counts, per routed row, the clusters of CLUSTER neurons (in the file's hot-first order) with an open gate
(csrc/ffn/moe_neurons.c); this turns the counts into bytes per token against reading whole experts, for `--verbose`
and `pi2 bench -o json` (pi2_expert_open_clusters, pi2_expert_bytes_per_token_{whole,open_clusters}).
Under --memory-budget a decoded token does read this (csrc/pipeline/experts.c, two phases); the measured bytes are the
cache's (pi2_flash_bytes_per_token). Does not: read anything.
"""
from __future__ import annotations

import numpy as np

from pi2.engine.lib import check, ffi, lib
from pi2.model import expert_bundles

CLUSTER = 8     # neurons per cluster: the dense pi2 file's default read unit


def count_neurons(ctx, counts: np.ndarray | None, clusters: np.ndarray | None = None, cluster: int = CLUSTER) -> None:
    """From now on, add to counts (int64 [n_layer][n_expert][n_ff_exp], the caller's zeros) the routed rows of a
    CContext whose gate opened each expert neuron (`pi2 convert`'s profile), and to clusters (int64 [n_layer]) the
    runs of `cluster` neurons each routed row opens; None: not counted (pi2_ctx_count_expert_neurons)."""
    ctx._neuron_counts = (counts, clusters)      # the C side writes into them while the context lives
    buf = [ffi.NULL if a is None else ffi.from_buffer("int64_t[]", a, require_writable=True)
           for a in (counts, clusters)]
    check(lib.pi2_ctx_count_expert_neurons(ctx._h, buf[0], buf[1], cluster))


def start(ctx) -> None:
    """Count open clusters from now on (a converted file's context)."""
    ctx._open_clusters = np.zeros(ctx.cfg.n_layer, np.int64)
    count_neurons(ctx, None, ctx._open_clusters, CLUSTER)


def stats(ctx) -> dict:
    """{expert_open_clusters: share of the clusters a routed row opens, expert_bytes_per_token_whole: gate rows and
    bundles of a token's experts, expert_bytes_per_token_open_clusters: gate rows and the open clusters' bundles};
    {} when nothing was counted."""
    clusters = getattr(ctx, "_open_clusters", None)
    if clusters is None:
        return {}
    cfg, model = ctx.cfg, ctx.cmodel.model
    rows = ctx.expert_counts.sum(axis=1)
    n_cl = -(-cfg.n_ff_exp // CLUSTER)
    whole = opened = 0.0
    for il in range(cfg.n_layer):
        if not expert_bundles.has_bundles(model, il) or not rows[il]:
            continue
        gate = model.tensor(f"blk.{il}.ffn_gate_exps.weight").row_bytes * cfg.n_ff_exp
        width = expert_bundles.layout(model, il)["width"]
        whole += cfg.n_expert_used * (gate + cfg.n_ff_exp * width)
        opened += cfg.n_expert_used * (gate + clusters[il] / rows[il] * CLUSTER * width)
    if not rows.sum():
        return {}
    return {"expert_open_clusters": round(float(clusters.sum() / (rows.sum() * n_cl)), 4),
            "expert_bytes_per_token_whole": int(round(whole)),
            "expert_bytes_per_token_open_clusters": int(round(opened))}
