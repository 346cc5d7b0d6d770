"""test_kv_ctx_check.py — the -c check and the planners size the K cache by its -ctk type: a context whose F16 keys
do not fit the memory this process may use is accepted with Q8_0 keys, and each error names the figure of the type
asked for (pi2_ctx_query's, as the C core allocates it)."""
import re

from clirun import assert_error, cli
from fixtures import write_model
from moe_files import write_moe
from pi2.engine import CModel
from pi2.model.loader import load_model
from pi2.plan import devices
from pi2.plan.budget import context_bytes, fmt

N_CTX = 2048


def test_q8_0_keys_fit_where_f16_do_not(tmp_path, monkeypatch):
    path = write_model(tmp_path / "m.gguf", n_embd=128, n_head=2, n_head_kv=2, head_dim=64, n_layer=4)
    cm = CModel.from_model(load_model(path))
    f16, q8 = (sum(context_bytes(cm, N_CTX, 1, type_k=t)) for t in (1, 8))
    assert q8 < f16
    limit = (q8 + f16) // 2
    monkeypatch.setattr(devices, "memory_limit", lambda: limit)
    args = ("run", path, "-p", "hi", "-n", "2", "-c", N_CTX)
    res = cli(*args, "-ctk", "q8_0")
    assert res.code == 0, res.err
    msg = assert_error(cli(*args, "-ctk", "f16"), 2, "for its KV cache and buffers")
    assert f"needs {fmt(f16)} for its KV cache" in msg
    monkeypatch.setattr(devices, "memory_limit", lambda: q8 // 2)
    msg = assert_error(cli(*args, "-ctk", "q8_0"), 2, "for its KV cache and buffers")
    assert f"needs {fmt(q8)} for its KV cache" in msg


def test_expert_plan_counts_q8_0_keys(tmp_path, monkeypatch):
    import pi2.plan.experts as experts
    monkeypatch.setattr(experts, "runtime_bounds", lambda model: (96 << 20, 96 << 20))
    path = write_moe(tmp_path / "moe.gguf", "qwen3moe", "Q4_K_M")
    cm = CModel.from_model(load_model(path))
    for ctk, t in (("f16", 1), ("q8_0", 8)):
        msg = assert_error(cli("plan", path, "-c", "256", "--memory-budget", "8M", "-ctk", ctk), 2,
                           "below what this model needs")
        assert re.search(r"KV cache ([0-9.]+ [KMG]iB)", msg)[1] == fmt(context_bytes(cm, 256, 1, type_k=t)[0])
