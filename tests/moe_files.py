"""moe_files.py — synthetic Mixture-of-Experts GGUF files (and dense qwen3), written from a seed, byte for byte the
files llama.cpp was run on for tests/data/moe-oracle.json.

Owns: `write_moe(path, arch, wtype)` for qwen3, qwen3moe, llama (with experts), qwen2moe, olmoe, granitemoe and
smallthinker in F32, F16, Q8_0 and Q4_K_M; `quantized_type`, llama-quantize's choice of type per tensor; the shapes
(SPECS) and the scales that keep routing varied. The quantized files equal what `llama-quantize BASE.F32.gguf OUT
TYPE` writes from the F32 file (same metadata order, tensors in llama.cpp's order, pi2.reference.kquant / gguf.quants for the
blocks); tests/data/moe-oracle.json records each file's sha256, and the tests check it before comparing.
Weights: every tensor from its own generator (seed, crc32 of its name). Token embeddings σ `embd` plus an offset
`bias_mu` along one direction u that every router also reads with a per-expert weight (σ `bias_sigma`): some
experts are hot, as in trained models; other matrices σ 1/√n_in (attention q/k σ 0.2); norms 1 + N(0, 0.1).
"""
from __future__ import annotations

import zlib
from pathlib import Path

import numpy as np
from gguf import GGMLQuantizationType as QT
from gguf import GGUFWriter
from gguf.quants import quantize

from fixtures import _add_vocab
from pi2.engine import CModel
from pi2.model.loader import load_model
from pi2.reference.kquant import quantize_q4_k, quantize_q5_k, quantize_q6_k

ARCHS = ("qwen3", "qwen3moe", "llama", "qwen2moe", "olmoe", "granitemoe", "smallthinker")
WTYPES = ("F32", "F16", "Q8_0", "Q4_K_M")
FTYPE = {"F32": 0, "F16": 1, "Q8_0": 7, "Q4_K_M": 15}

# n_expert, n_expert_used, n_layer, n_head_kv, extras
SPECS = {
    "qwen3": dict(n_expert=0, k=0, n_layer=3, n_head_kv=2),
    "qwen3moe": dict(n_expert=16, k=4, n_layer=3, n_head_kv=2),
    "llama": dict(n_expert=8, k=2, n_layer=3, n_head_kv=2),          # Mixtral: 8 experts, so Q4_K_M has Q5_K
    "qwen2moe": dict(n_expert=12, k=4, n_layer=3, n_head_kv=2, n_ff_shexp=256),
    "olmoe": dict(n_expert=16, k=4, n_layer=3, n_head_kv=4),
    # granitemoe multiplies embeddings by 12 and its output is tied: smaller embeddings keep its logits sane
    "granitemoe": dict(n_expert=10, k=3, n_layer=3, n_head_kv=2, n_ff_shexp=256, embd=1 / 12, bias_mu=1 / 12),
    "smallthinker": dict(n_expert=12, k=3, n_layer=3, n_head_kv=2),
}
N_EMBD, N_HEAD, HEAD_DIM, N_FF_EXP, N_FF_DENSE, N_VOCAB, N_CTX = 256, 4, 64, 256, 512, 512, 4096
GRANITE = dict(embedding_scale=12.0, residual_scale=0.22, logit_scale=8.0, attention_scale=0.015625)


def _rng(seed: int, name: str) -> np.random.Generator:
    return np.random.default_rng([seed, zlib.crc32(name.encode())])


def tensor_order(names) -> list:
    """llama.cpp's weights_map order (llama_model_loader::weight_name_comparer), which llama-quantize writes in:
    tensors outside blocks first, then block by block, each group sorted by name."""
    def key(n):
        layer = int(n.split(".")[1]) if n.startswith("blk.") else -1
        return layer, n.encode()
    return sorted(names, key=key)


def _norm(x: np.ndarray) -> np.float32:
    """|x| of a float32 vector in one fixed order (8 lanes of fused multiply-adds, then halves added pairwise), the
    value the oracle's files were written with. Not np.linalg.norm: BLAS's float32 dot rounds by CPU (one ulp apart
    on Zen 4 and Zen 5), and the files' bytes must not depend on the machine."""
    acc = np.zeros(8, np.float64)
    for i in range(0, len(x), 8):
        v = x[i:i + 8].astype(np.float64)
        acc[:len(v)] = (acc[:len(v)] + v * v).astype(np.float32)
    acc = acc.astype(np.float32)
    while len(acc) > 1:
        acc = acc[:len(acc) // 2] + acc[len(acc) // 2:]
    return np.sqrt(acc[0])


def base_tensors(arch: str, seed: int = 0, n_embd: int = N_EMBD, bias_sigma: float = 1.5, **spec) -> dict:
    """name -> float32 array (numpy shape, rows first) of a synthetic model."""
    s = {**SPECS[arch], **spec}
    embd, bias_mu = s.get("embd", 1.0), s.get("bias_mu", 1.0)
    E, n_layer, hkv = s["n_expert"], s["n_layer"], s["n_head_kv"]
    q_out, kv_out = N_HEAD * HEAD_DIM, hkv * HEAD_DIM
    u = _rng(seed, "router-direction").standard_normal(n_embd).astype(np.float32)
    u /= _norm(u)
    t = {}

    def mat(name, n_out, n_in, sigma=None, lead=()):
        r = _rng(seed, name).standard_normal((*lead, n_out, n_in), dtype=np.float32)
        t[name] = r * np.float32(sigma if sigma is not None else n_in ** -0.5)

    def norm(name, n):
        t[name] = (1.0 + 0.1 * _rng(seed, name).standard_normal(n, dtype=np.float32)).astype(np.float32)

    mat("token_embd.weight", N_VOCAB, n_embd, embd)
    t["token_embd.weight"] += np.float32(bias_mu) * u
    norm("output_norm.weight", n_embd)
    if arch != "granitemoe":              # granitemoe keeps the tied output (token_embd) path covered
        mat("output.weight", N_VOCAB, n_embd)
    for il in range(n_layer):
        b = f"blk.{il}."
        norm(b + "attn_norm.weight", n_embd)
        mat(b + "attn_q.weight", q_out, n_embd, 0.2)
        mat(b + "attn_k.weight", kv_out, n_embd, 0.2)
        mat(b + "attn_v.weight", kv_out, n_embd)
        mat(b + "attn_output.weight", n_embd, q_out)
        if arch == "qwen2moe":
            for n, size in (("q", q_out), ("k", kv_out), ("v", kv_out)):
                t[b + f"attn_{n}.bias"] = 0.1 * _rng(seed, b + n).standard_normal(size, dtype=np.float32)
        if arch in ("qwen3", "qwen3moe"):
            norm(b + "attn_q_norm.weight", HEAD_DIM)
            norm(b + "attn_k_norm.weight", HEAD_DIM)
        if arch == "olmoe":
            norm(b + "attn_q_norm.weight", n_embd)
            norm(b + "attn_k_norm.weight", n_embd)
        norm(b + "ffn_norm.weight", n_embd)
        if not E:
            mat(b + "ffn_gate.weight", N_FF_DENSE, n_embd)
            mat(b + "ffn_up.weight", N_FF_DENSE, n_embd)
            mat(b + "ffn_down.weight", n_embd, N_FF_DENSE)
            continue
        mat(b + "ffn_gate_inp.weight", E, n_embd, 2.0 * n_embd ** -0.5)
        c = _rng(seed, b + "router-bias").standard_normal(E).astype(np.float32) * np.float32(bias_sigma)
        t[b + "ffn_gate_inp.weight"] += c[:, None] * u[None, :]
        mat(b + "ffn_gate_exps.weight", N_FF_EXP, n_embd, lead=(E,))
        mat(b + "ffn_up_exps.weight", N_FF_EXP, n_embd, lead=(E,))
        mat(b + "ffn_down_exps.weight", n_embd, N_FF_EXP, lead=(E,))
        sh = s.get("n_ff_shexp", 0)
        if sh:
            mat(b + "ffn_gate_shexp.weight", sh, n_embd)
            mat(b + "ffn_up_shexp.weight", sh, n_embd)
            mat(b + "ffn_down_shexp.weight", n_embd, sh)
            if arch == "qwen2moe":
                t[b + "ffn_gate_inp_shexp.weight"] = (_rng(seed, b + "shexp-gate").standard_normal(
                    n_embd, dtype=np.float32) * np.float32(n_embd ** -0.5))
    return t


def _keys(w: GGUFWriter, arch: str, wtype: str, n_embd: int, s: dict) -> None:
    w.add_name(f"pi2-moe-{arch}")
    if wtype == "F32":                     # llama-quantize sets these two again: they move to the end
        w.add_file_type(FTYPE[wtype])
        w.add_quantization_version(2)
    w.add_context_length(N_CTX)
    w.add_embedding_length(n_embd)
    w.add_block_count(s["n_layer"])
    w.add_feed_forward_length(N_FF_DENSE if not s["n_expert"] else N_FF_EXP)
    w.add_head_count(N_HEAD)
    w.add_head_count_kv(s["n_head_kv"])
    w.add_layer_norm_rms_eps(1e-5 if arch in ("llama", "granitemoe") else 1e-6)
    w.add_rope_freq_base(10000.0 if arch in ("llama", "granitemoe") else 1e6)
    w.add_rope_dimension_count(HEAD_DIM)
    if arch in ("qwen3", "qwen3moe", "smallthinker"):
        w.add_key_length(HEAD_DIM)
        w.add_value_length(HEAD_DIM)
    if s["n_expert"]:
        w.add_expert_count(s["n_expert"])
        w.add_expert_used_count(s["k"])
    if arch in ("qwen3moe", "qwen2moe", "smallthinker"):
        w.add_expert_feed_forward_length(N_FF_EXP)
    if s.get("n_ff_shexp"):
        w.add_expert_shared_feed_forward_length(s["n_ff_shexp"])
    if arch == "granitemoe":
        w.add_embedding_scale(GRANITE["embedding_scale"])
        w.add_residual_scale(GRANITE["residual_scale"])
        w.add_logit_scale(GRANITE["logit_scale"])
        w.add_attention_scale(GRANITE["attention_scale"])
    if arch == "smallthinker":
        if s.get("gating", 2) is not None:
            w.add_uint32("smallthinker.expert_gating_func", s.get("gating", 2))   # 2 sigmoid, as PowerInfer's
        w.add_sliding_window(4096)
        w.add_float32("smallthinker.rope.freq_base_swa", 10000.0)
    _add_vocab(w, "qwen2" if arch.startswith("qwen") else "llama", "bpe", N_VOCAB)
    if wtype != "F32":
        w.add_quantization_version(2)
        w.add_file_type(FTYPE[wtype])


def _category(name: str) -> str:
    if name == "output.weight":
        return "output"
    if name == "token_embd.weight":
        return "token_embd"
    for part in ("attn_v.weight", "attn_k.weight", "attn_q.weight", "attn_output.weight", "ffn_up", "ffn_gate",
                 "ffn_down"):
        if part in name:
            return part.split(".")[0]
    return "other"


def _use_more_bits(i: int, n: int) -> bool:
    return i < n // 8 or i >= 7 * n // 8 or (i - n // 8) % 3 == 2


_BLOCK = {"F16": 1, "Q8_0": 32, "Q5_0": 32, "Q4_K": 256, "Q5_K": 256, "Q6_K": 256}
_FALLBACK = {"Q4_K": "Q5_0", "Q5_K": "Q5_1", "Q6_K": "Q8_0"}


def quantized_type(wtype: str, names: list, shapes: dict, n_layer: int, n_expert: int) -> dict:
    """llama-quantize's type for every tensor (llama_tensor_get_type, no imatrix, no overrides), in its order."""
    out, i_wv = {}, 0
    tied = "output.weight" not in shapes
    for name in names:
        shape = shapes[name]
        if wtype == "F32" or len(shape) < 2 or not name.endswith("weight") or "_norm.weight" in name \
                or "ffn_gate_inp.weight" in name:
            out[name] = "F32"
            continue
        if wtype in ("F16", "Q8_0"):
            out[name] = wtype
            continue
        cat, ne0 = _category(name), shape[-1]
        t = "Q4_K"
        if cat == "output" or (tied and cat == "token_embd"):
            t = "Q8_0" if ne0 % 256 else "Q6_K"
        elif cat == "attn_v":
            t = "Q6_K" if _use_more_bits(i_wv, n_layer) else "Q4_K"
            t = "Q8_0" if n_expert == 8 else t
            i_wv += 1
        elif cat == "attn_k" and n_expert == 8:
            t = "Q8_0"
        elif cat == "ffn_down":
            t = "Q6_K" if _use_more_bits(int(name.split(".")[1]), n_layer) else "Q4_K"
        elif cat == "attn_output" and n_expert == 8:
            t = "Q5_K"
        if ne0 % _BLOCK[t]:
            t = _FALLBACK[t]
        out[name] = t
    return out


def _encode(a: np.ndarray, t: str):
    """float32 array -> (array to store, raw ggml type or None)."""
    rows = a.reshape(-1, a.shape[-1])
    if t == "F32":
        return a, None
    if t == "F16":
        return a.astype(np.float16), None
    if t in ("Q4_K", "Q5_K", "Q6_K"):
        q = {"Q4_K": quantize_q4_k, "Q5_K": quantize_q5_k, "Q6_K": quantize_q6_k}[t](rows)
        return q.reshape(*a.shape[:-1], -1), QT[t]
    return quantize(a, QT[t]), QT[t]


def write_moe(path, arch: str, wtype: str = "F32", seed: int = 0, drop=(), alter=None, exp_type=None, **spec) -> Path:
    """Write the synthetic `arch` model as `wtype` (F32, F16, Q8_0, Q4_K_M) and return its path; exp_type (e.g.
    "Q4_0", the benchmark files' type) overrides the routed experts' type. For damaged-file
    tests: `drop` leaves tensors out, `alter` maps a tensor name to a function of its array, `k`/`n_expert` set the
    keys (the tensors follow n_expert), `gating` sets smallthinker's gating key (None: no key)."""
    if arch not in SPECS:
        raise ValueError(f"arch must be one of {ARCHS}")
    if wtype not in FTYPE:
        raise ValueError(f"wtype must be one of {WTYPES}")
    s = {**SPECS[arch], **{k: v for k, v in spec.items() if k in SPECS[arch] or k in ("n_ff_shexp", "gating", "embd", "bias_mu")}}
    tensors = base_tensors(arch, seed, **{k: v for k, v in spec.items() if k != "gating"})
    for name in drop:
        del tensors[name]
    for name, fn in (alter or {}).items():
        tensors[name] = np.ascontiguousarray(fn(tensors[name]), np.float32)
    names = tensor_order(tensors)
    types = quantized_type(wtype, names, {n: a.shape for n, a in tensors.items()}, s["n_layer"], s["n_expert"])
    types.update({n: exp_type for n in names if exp_type and n.endswith("_exps.weight")})
    path = Path(path)
    w = GGUFWriter(str(path), arch)
    _keys(w, arch, wtype, tensors["token_embd.weight"].shape[1], s)
    for name in names:
        data, raw = _encode(tensors[name], types[name])
        w.add_tensor(name, data, raw_dtype=raw)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path


def loaded_moe(tmp_path_factory, files: dict, arch: str, wtype: str) -> tuple:
    """(path, loaded model, CModel) of the synthetic `arch` file in `wtype`, written once per `files` (a test
    module's own cache: a module that repacks its models keeps them to itself)."""
    key = (arch, wtype)
    if key not in files:
        path = write_moe(tmp_path_factory.mktemp("moe") / f"{arch}.{wtype}.gguf", arch, wtype)
        m = load_model(path)
        files[key] = (path, m, CModel.from_model(m))
    return files[key]
