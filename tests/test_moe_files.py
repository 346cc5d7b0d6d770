"""test_moe_files.py — reading MoE-family files: the hyper-parameters ModelConfig takes from them (as llama.cpp
0c1e570 reads them), one clear error for each kind of bad MoE file, `pi2 info`, `pi2 tokenize` and `pi2 run`
on them, and the K-quant quantizers on awkward blocks."""
import numpy as np
import pytest

from clirun import assert_error, cli
from moe_files import write_moe
from pi2.reference.kquant import quantize_q4_k, quantize_q5_k, quantize_q6_k
from pi2.model.loader import load_model
from pi2.reference.quants import Q4_K, Q5_K, Q6_K, dequantize


@pytest.fixture(scope="module")
def d(tmp_path_factory):
    return tmp_path_factory.mktemp("moe_files")


@pytest.mark.parametrize("arch,want", [
    ("qwen3moe", dict(n_expert=16, n_expert_used=4, n_ff_exp=256, expert_gating="softmax", expert_weights_norm=True,
                      qk_norm=True, rope_neox=True, expert_act="silu")),
    ("llama", dict(n_expert=8, n_expert_used=2, n_ff_exp=256, expert_weights_norm=True, rope_neox=False)),
    ("qwen2moe", dict(n_expert=12, expert_weights_norm=False, n_ff_shexp=256, shexp_gate=True)),
    ("olmoe", dict(n_expert=16, expert_weights_norm=False, qk_norm_full=True, qk_norm=False)),
    ("granitemoe", dict(n_expert=10, n_expert_used=3, embd_scale=12.0, residual_scale=0.22, logit_scale=8.0,
                        attn_scale=0.015625, n_ff_shexp=256, shexp_gate=False, rope_neox=False)),
    ("smallthinker", dict(expert_gating="sigmoid", expert_act="relu", router_before_attn=True, sliding_window=4096,
                          swa_layers=(False, True, True), nope_layers=(True, False, False), rope_base_swa=10000.0)),
    ("qwen3", dict(n_expert=0, qk_norm=True, n_ff=512)),
])
def test_config_reads_the_keys_as_llama_cpp(d, arch, want):
    m = load_model(write_moe(d / f"{arch}.gguf", arch))
    c = m.config
    assert c.moe_family and c.expert_weights_scale == 0.0
    for k, v in want.items():
        got = getattr(c, k)
        assert got == pytest.approx(v) if isinstance(v, float) else got == v, k
    assert c.layer_rope_base(1) == (10000.0 if arch == "smallthinker" else c.rope_base)
    m.close()


BAD = {
    "no experts used": (dict(arch="qwen3moe", k=0), r"expert_used_count is 0"),
    "more used than experts": (dict(arch="qwen3moe", k=17), r"expert_used_count is 17.*between 1 and.*16"),
    "missing router": (dict(arch="olmoe", drop=("blk.1.ffn_gate_inp.weight",)), r"blk\.1\.ffn_gate_inp\.weight.*missing"),
    "expert tensor of the wrong shape": (dict(arch="llama", alter={"blk.0.ffn_up_exps.weight": lambda a: a[:3]}),
                                         r"ffn_up_exps\.weight' has shape \[256, 256, 3\], expected \[256, 256, 8\]"),
    "unknown gating": (dict(arch="smallthinker", gating=9), r"expert_gating_func is 9, an unknown gating function"),
    "no gating key": (dict(arch="smallthinker", gating=None), r"expert_gating_func is missing"),
    "missing shared expert": (dict(arch="qwen2moe", drop=("blk.2.ffn_down_shexp.weight",)), r"ffn_down_shexp.*missing"),
    "olmoe with GQA": (dict(arch="olmoe", n_head_kv=2, alter={f"blk.{i}.attn_{n}.weight": (lambda a: a[:128])
                                                               for i in range(3) for n in "kv"}),
                       r"olmoe needs as many k/v heads"),
}


@pytest.mark.parametrize("kind", BAD)
@pytest.mark.parametrize("command", ["run", "info", "tokenize"])
def test_bad_moe_file_gets_one_line(d, kind, command):
    spec, pattern = BAD[kind]
    path = d / f"bad-{kind.replace(' ', '-')}.gguf"
    if not path.exists():
        write_moe(path, spec["arch"], **{k: v for k, v in spec.items() if k != "arch"})
    args = {"run": ["run", path, "-p", "hi", "-n", "1"], "info": ["info", path],
            "tokenize": ["tokenize", path, "-p", "hi"]}[command]
    assert_error(cli(*args), 1, pattern)


def test_info_shows_experts(d):
    r = cli("info", write_moe(d / "qwen3moe.gguf", "qwen3moe"))
    assert r.code == 0, r.err
    out = " ".join(r.out.split())            # rich wraps long rows at spaces
    assert "16 per layer, 4 per token (softmax, weights normalised); expert FFN 256 (SwiGLU)" in out
    assert "active/token" in out and "expert bytes" in out and "│ experts" in out and "│ router" in out


def test_tokenize_and_run_on_the_reference(d):
    path = write_moe(d / "smallthinker.gguf", "smallthinker")
    r = cli("tokenize", path, "-p", "A lighthouse keeper", "--ids")
    assert r.code == 0 and r.out.startswith("[")
    r = cli("run", path, "-p", "A lighthouse keeper", "-n", "4", "--temp", "0", "--engine", "reference", timeout=120)
    assert r.code == 0, r.err
    assert r.out.startswith("A lighthouse keeper") and len(r.out) > len("A lighthouse keeper")


def test_c_engine_runs_moe_by_default(d):
    path = write_moe(d / "qwen3moe.gguf", "qwen3moe")
    ref = cli("run", path, "-p", "hi", "-n", "4", "--temp", "0", "--engine", "reference", timeout=120)
    r = cli("run", path, "-p", "hi", "-n", "4", "--temp", "0", timeout=120)       # auto: the C engine, no note
    assert r.code == 0 and "note" not in r.err and r.out == ref.out
    assert_error(cli("run", path, "-p", "hi", "-n", "1", "--keep", "0.5"), 2, r"--keep does not apply")


@pytest.mark.parametrize("quant,qtype,tol", [(quantize_q4_k, Q4_K, 0.08), (quantize_q5_k, Q5_K, 0.04),
                                             (quantize_q6_k, Q6_K, 0.02)])
def test_kquant_blocks_decode_close(quant, qtype, tol):
    """Zero, constant, one-spike and random blocks: decoded values stay within tol of the input's scale."""
    rng = np.random.default_rng(0)
    x = np.zeros((4, 512), np.float32)
    x[1] = 0.75
    x[2, 300] = -5.0
    x[3] = rng.standard_normal(512).astype(np.float32)
    y = dequantize(quant(x), qtype, 512)
    assert (y[0] == 0).all()
    for r in range(1, 4):
        assert np.abs(y[r] - x[r]).max() <= tol * np.abs(x[r]).max() + 1e-6, r


def test_convert_refuses_moe_files(d, tmp_path):
    path = write_moe(d / "qwen3moe.gguf", "qwen3moe")
    assert_error(cli("convert", path, "-o", tmp_path / "out.pi2.gguf"), 1, r"ReLU-family .*SwiGLU")
    assert not (tmp_path / "out.pi2.gguf").exists()
