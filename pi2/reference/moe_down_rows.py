"""moe_down_rows.py — the down rows of a converted MoE file's experts (pi2/model/expert_bundles.py says where they
are) summed as the reference sums a dense pi2 file's down rows: groups of 64 neurons in order, I8 rows in exact
integers (down_i8.py), quantized rows by sparse_ffn.py's grouped row sums."""
from __future__ import annotations

import numpy as np

from pi2.model import expert_bundles as eb
from pi2.model.ffn_layout import row_bytes
from pi2.reference.down_i8 import I8Rows, axpy_rows_i8
from pi2.reference.quants import QuantLinear
from pi2.reference.sparse_ffn import GROUP, axpy_rows


class DownRows:
    """Layer il's down rows per expert as the reference sums them: `__call__(e, h)` for h (m, n_ff_exp) rows of
    activations routed to expert e -> (m, n_embd), by pi2/reference/sparse_ffn.py's grouped row sums."""

    def __init__(self, model, il: int):
        cfg, lay = model.config, eb.layout(model, il)
        self.f, self.e = cfg.n_ff_exp, cfg.n_embd
        rec = model.raw(f"blk.{il}.ffn_bundle_exps.weight").view(np.uint8).reshape(cfg.n_expert, self.f, -1)
        nd = row_bytes(lay["down_type"], self.e)
        rows = rec[:, :, lay["down_offset"]:lay["down_offset"] + nd]
        sc = {n: model.raw(t.name).view(np.float32).reshape(cfg.n_expert, -1) for n, t in eb.scales(model, il)}
        if lay["down_type"] == eb.I8:
            self._make = lambda x: I8Rows(np.ascontiguousarray(rows[x]), sc["ffn_down_scale_exps"][x],  # noqa: E731
                                          sc["ffn_down_colscale_exps"][x])
        else:
            self._make = lambda x: QuantLinear.from_raw(np.ascontiguousarray(rows[x]), lay["down_type"],  # noqa: E731
                                                        self.e)
        self._experts: dict = {}

    def __call__(self, x: int, h: np.ndarray) -> np.ndarray:
        if x not in self._experts:
            self._experts[x] = self._make(x)
        rows = self._experts[x]
        h = np.asarray(h, np.float32).reshape(-1, self.f)
        return axpy_rows_i8(h, rows, GROUP) if isinstance(rows, I8Rows) else axpy_rows(h, rows)
