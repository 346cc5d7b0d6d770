# moe_budget.py — the C context `pi2 convert` routes a MoE file's calibration text through, within the memory the
# conversion may hold: the file mapped whole when it fits (no --memory-budget, and the file fits in what this process
# may use), otherwise the streamed engine `pi2 run --memory-budget` uses (the fixed region mapped, every expert read
# from flash into the expert cache, pi2/plan/experts.py's split of the budget). A file larger than memory is then
# profiled with the budget's peak instead of the file's. The counts are the same: the streamed layer counts each
# chunk of experts' gate rows (csrc/ffn/moe_stream.c, whole experts: every row of a routed expert) as the mapped one
# counts them all (csrc/ffn/moe.c), and the gate rows are the same bits.
# Does not: count or order neurons (moe.py), or decide the budget's split (pi2/runtime/plan.py, pi2/plan/experts.py).
from __future__ import annotations

import sys

from pi2.engine import CContext, CModel, default_threads
from pi2.errors import UsageError
from pi2.plan.budget import fmt
from pi2.runtime.config import RunConfig
from pi2.runtime.plan import plan_run
from pi2.runtime.session import open_session


def profile_context(model, n_ctx: int, n_threads: int, memory_budget) -> tuple:
    """(a C context of n_ctx tokens on model, the budget its experts stream within or None when mapped).
    memory_budget: bytes, a size such as '500M', or None (what this process may use: devices.memory_limit)."""
    cfg = RunConfig(n_ctx=n_ctx, n_threads=n_threads, memory_budget=memory_budget, repack=False,
                    expert_profile=False, npu="off")
    try:
        p = plan_run(model, cfg)
    except UsageError as e:           # a budget below the streamed engine's minimum
        if memory_budget is None:     # ... of the automatic kind: mapped, the kernel re-reading evicted pages
            print(f"pi2: note: the file does not fit in what this process may use, and that is too little to "
                  f"stream its experts ({str(e).split(' is below ', 1)[-1]}): the profile maps the file, re-reading "
                  f"evicted pages (slow)", file=sys.stderr)
            return CContext(CModel.from_model(model), n_ctx, n_threads or default_threads()), None
        e.hint = e.hint.replace(", or a smaller -c", "")   # the context's size is not the user's to choose
        raise
    if p.budget is None:
        return CContext(p.cmodel, n_ctx, p.n_threads), None
    return open_session(model, p).ctx, p.budget      # its notes: a file that does not fit streams within the limit


def describe(budget: int | None) -> str:
    """The summary's words for where the profile's experts came from."""
    if budget is None:
        return "experts mapped"
    return f"experts streamed within a {fmt(budget)} budget"
