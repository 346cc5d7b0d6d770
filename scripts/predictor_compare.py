#!/usr/bin/env python3
# predictor_compare.py — measure pi2-made predictor candidates on a model without writing a file.
# Owns: one layer-at-a-time pass over the calibration tokens; per layer and candidate (kind, input, bits/rank),
#       recall of the truly active pairs, pairs added, predictor bytes and estimated FFN bytes per token at a keep,
#       on held-out calibration tokens (pi2/convert/predictor.py's `build(measure=True)`); a markdown summary.
# Usage: python3 scripts/predictor_compare.py MODEL.gguf [--keep 0.5] [--calib-tokens 2048] [--every N] [--per-layer]
import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import numpy as np  # noqa: E402

from pi2.convert import layerwise, predictor, profile  # noqa: E402
from pi2.model.loader import load_model  # noqa: E402

# (kind, input, bits, rank, target recall)
CANDIDATES = [("lowbit", "ffn_norm", 1, 0, 0.95), ("lowbit", "ffn_norm", 2, 0, 0.99),
              ("lowbit", "ffn_norm", 2, 0, 0.95), ("lowbit", "ffn_norm", 2, 0, 0.90),
              ("lowbit", "attn_input", 2, 0, 0.95),
              ("lowrank", "ffn_norm", 0, 64, 0.95), ("lowrank", "attn_input", 0, 64, 0.95),
              ("lowrank", "attn_input", 0, 128, 0.90)]


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("model")
    ap.add_argument("--keep", type=float, default=0.5)
    ap.add_argument("--calib-tokens", type=int, default=2048)
    ap.add_argument("--per-layer", action="store_true")
    ap.add_argument("--every", type=int, default=1, help="measure every N-th layer (the pass runs them all)")
    a = ap.parse_args()
    model = load_model(a.model)
    cfg = model.config
    chunks, _, n_tok = profile.calib_tokens(model.tokenizer, None, a.calib_tokens)
    act = profile.act_fn(cfg.ffn_act)
    grid = profile.KEEP_GRID
    rows = {c: [] for c in CANDIDATES}
    stride = max(1, n_tok // profile.ERR_TOKENS)
    bounds = np.cumsum([0] + [len(c) for c in chunks])
    for lp in layerwise.run_layers(model, chunks, progress=True):
        if lp.il % a.every:
            continue
        st = profile.LayerStats(cfg.n_ff)
        for c0, c1 in zip(bounds[:-1], bounds[1:]):
            st.add(lp.act[c0:c1], lp.up[c0:c1], stride)
        thresh = np.array([st.threshold(k) for k in grid], np.float32)
        W = lp.weights
        gate_b = W["ffn_gate"].raw.nbytes / cfg.n_ff
        down = W["down_rows"] if "down_rows" in W else W["ffn_down"]
        ud_b = (W["ffn_up"].raw.nbytes + down.raw.nbytes) / cfg.n_ff
        for c in CANDIDATES:
            spec = predictor.Spec(c[0], c[1], bits=c[2] or 2, rank=c[3] or 64, target=c[4])
            m = predictor.build(spec, lp, act, thresh, grid, a.keep, ud_b, gate_b).metrics
            rows[c].append(m)
            if a.per_layer:
                print(f"L{lp.il:02d} {c}: recall {m['recall']:.4f} keep {m['keep']:.3f} predicted {m['predicted']:.3f} "
                      f"bytes/tok {m['bytes_tok']/1e3:.0f}k vs {m['bytes_tok_gate']/1e3:.0f}k "
                      f"err {m['err_pred']:.4f} vs "
                      f"{m['err_gate']:.4f}", flush=True)
    print(f"\n{Path(a.model).name}: {n_tok} calibration tokens ({predictor.HOLDOUT:.0%} held out), keep {a.keep}\n")
    print("| kind | input | bits/rank | target | recall mean (min) | predicted / n_ff | added / n_ff | "
          "predictor KiB/layer | FFN bytes/token ÷ gate rule | FFN error mean: predicted (gate rule) |")
    print("|---|---|---|---|---|---|---|---|---|---|")
    for c, ms in rows.items():
        r = np.array([m["recall"] for m in ms])
        pb = np.mean([m["pred_bytes"] for m in ms]) / 1024
        bt = sum(m["bytes_tok"] for m in ms) / sum(m["bytes_tok_gate"] for m in ms)
        print(f"| {c[0]} | {c[1]} | {c[2] or c[3]} | {c[4]} | {r.mean():.4f} ({r.min():.4f}) | "
              f"{np.mean([m['predicted'] for m in ms]):.3f} | {np.mean([m['added'] for m in ms]):.3f} | {pb:.0f} | "
              f"{bt:.3f} | {np.mean([m['err_pred'] for m in ms]):.4f} ({np.mean([m['err_gate'] for m in ms]):.4f}) |")
    print(f"\n(truly active / n_ff at this keep: {np.mean([m['keep'] for m in rows[CANDIDATES[0]]]):.3f}; "
          f"gate KiB/layer {cfg.n_ff * gate_b / 1024:.0f})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
