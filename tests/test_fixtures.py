"""test_fixtures.py — the synthetic models of fixtures.py are what they claim to be.

Owns: tensor sets and shapes per architecture (formats.md §5.2, §9.3), vocab invariants (unique
tokens, merges closed over the vocab, byte tokens, special ids), determinism, size and speed, and the
PWRI predictor's agreement with the gate it approximates.
"""
import time

import numpy as np
import pytest
from gguf import GGUFReader, TokenType
from gguf.quants import dequantize

from fixtures import ARCHS, bytes_to_unicode, corrupt_copy, write_model
from pi2.model.gguf_file import GGUFFile


def expected_tensors(arch, n_layer=2, tied=True, pwri=False):
    names = {"token_embd.weight", "output_norm.weight"} | (set() if tied else {"output.weight"})
    per = ["attn_norm", "attn_q", "attn_k", "attn_v", "attn_output", "ffn_norm", "ffn_gate", "ffn_up",
           "ffn_down_t" if pwri else "ffn_down"]
    if arch == "gemma3":
        per += ["attn_q_norm", "attn_k_norm", "post_attention_norm", "post_ffw_norm"]
    if pwri:
        per += ["fc1", "fc2"]
    names |= {f"blk.{i}.{t}.weight" for i in range(n_layer) for t in per}
    if arch == "qwen2":
        names |= {f"blk.{i}.attn_{x}.bias" for i in range(n_layer) for x in "qkv"}
    return names


@pytest.mark.parametrize("arch", ARCHS)
@pytest.mark.parametrize("tied", [True, False])
def test_tensor_set_and_shapes(tmp_path, arch, tied):
    p = write_model(tmp_path / "m.gguf", arch, tied=tied, n_layer=3)
    r = GGUFReader(p)
    ne = {t.name: tuple(int(d) for d in t.shape) for t in r.tensors}
    assert set(ne) == expected_tensors(arch, 3, tied or arch == "gemma3")
    kv = {k: f.contents() for k, f in r.fields.items()}
    n_embd, n_head, n_kv = kv[f"{arch}.embedding_length"], kv[f"{arch}.attention.head_count"], \
        kv[f"{arch}.attention.head_count_kv"]
    hd = kv[f"{arch}.rope.dimension_count"]
    n_vocab, n_ff = len(kv["tokenizer.ggml.tokens"]), kv[f"{arch}.feed_forward_length"]
    assert ne["token_embd.weight"] == (n_embd, n_vocab)
    assert ne["blk.1.attn_q.weight"] == (n_embd, n_head * hd)
    assert ne["blk.1.attn_k.weight"] == ne["blk.1.attn_v.weight"] == (n_embd, n_kv * hd)
    assert ne["blk.1.attn_output.weight"] == (n_head * hd, n_embd)
    assert ne["blk.1.ffn_gate.weight"] == ne["blk.1.ffn_up.weight"] == (n_embd, n_ff)
    assert ne["blk.1.ffn_down.weight"] == (n_ff, n_embd)
    for t in r.tensors:                              # norms and biases F32 1-D
        if t.name.endswith(".bias") or "norm" in t.name:
            assert t.tensor_type.name == "F32" and len(t.shape) == 1, t.name
    if arch == "gemma3":
        assert hd == kv["gemma3.attention.key_length"] == kv["gemma3.attention.value_length"]
        assert n_head * hd != n_embd                  # like gemma-3-270m
        assert ne["blk.0.attn_q_norm.weight"] == (hd,)
        assert kv["gemma3.attention.sliding_window"] == 8
    else:
        assert hd == n_embd // n_head
    assert kv[f"{arch}.rope.freq_base"] == (1e4 if arch in ("llama", "bamboo") else 1e6)


@pytest.mark.parametrize("wtype", ["F32", "F16", "BF16", "Q4_0", "Q4_1", "Q5_0", "Q5_1", "Q8_0"])
def test_weight_types(tmp_path, wtype):
    p = write_model(tmp_path / "m.gguf", wtype=wtype, embd_type="F16")
    types = {t.name: t.tensor_type.name for t in GGUFReader(p).tensors}
    assert types["token_embd.weight"] == "F16"
    assert types["blk.0.ffn_up.weight"] == types["blk.1.attn_q.weight"] == wtype
    assert types["blk.0.attn_norm.weight"] == "F32"


def test_k_quants_are_refused(tmp_path):
    with pytest.raises(ValueError, match="K-quant"):
        write_model(tmp_path / "m.gguf", wtype="Q4_K")


def test_bpe_vocab(tmp_path):
    for arch in ("llama", "qwen2"):
        kv = GGUFFile(write_model(tmp_path / f"{arch}.gguf", arch)).kv
        tokens, types = kv["tokenizer.ggml.tokens"], kv["tokenizer.ggml.token_type"]
        assert kv["tokenizer.ggml.model"] == "gpt2"
        assert kv["tokenizer.ggml.pre"] == ("qwen2" if arch == "qwen2" else "smollm")
        assert len(tokens) == len(set(tokens)) == 512
        assert set(bytes_to_unicode().values()) <= set(tokens)
        vocab = set(tokens)
        merges = kv["tokenizer.ggml.merges"]
        assert len(merges) > 200
        for m in merges:
            a, b = m.split(" ", 1)
            assert a in vocab and b in vocab and a + b in vocab, m
        ids = {t: i for i, t in enumerate(tokens)}
        for sp in ("<|im_start|>", "<|im_end|>", "<|endoftext|>"):
            assert types[ids[sp]] == TokenType.CONTROL
        assert kv["tokenizer.ggml.eos_token_id"] == ids["<|im_end|>"]
        assert "<|im_start|>" in kv["tokenizer.chat_template"]
        assert (ids["<|im_start|>"] < 3) == (arch == "llama")     # SmolLM2 vs Qwen layout


@pytest.mark.parametrize("arch", ["llama", "gemma3"])
def test_spm_vocab(tmp_path, arch):
    kv = GGUFFile(write_model(tmp_path / "m.gguf", arch, vocab="spm")).kv
    tokens, types, scores = kv["tokenizer.ggml.tokens"], kv["tokenizer.ggml.token_type"], kv["tokenizer.ggml.scores"]
    assert kv["tokenizer.ggml.model"] == "llama" and "tokenizer.ggml.merges" not in kv
    assert len(tokens) == len(set(tokens)) == len(scores) == len(types)
    ids = {t: i for i, t in enumerate(tokens)}
    for b in range(256):
        assert types[ids[f"<0x{b:02X}>"]] == TokenType.BYTE
    if arch == "gemma3":
        assert (kv["tokenizer.ggml.bos_token_id"], kv["tokenizer.ggml.eos_token_id"]) == (2, 1)
        assert kv["tokenizer.ggml.add_space_prefix"] is False
        assert "<start_of_turn>" in kv["tokenizer.chat_template"]
    else:
        assert tokens[:3] == ["<unk>", "<s>", "</s>"]
        assert kv["tokenizer.ggml.add_space_prefix"] is True
    assert kv["tokenizer.ggml.add_bos_token"] is True
    normal = [t for t, ty in zip(tokens, types) if ty == TokenType.NORMAL]
    assert "▁the" in ids and scores[ids["▁the"]] > scores[ids[normal[-1]]]      # earlier merge, higher score
    assert sum(t.startswith("▁") for t in normal) > 40
    for t in normal:                                 # every multi-char piece is reachable by pair merges
        if len(t) > 1:
            assert any(t[:i] in ids and t[i:] in ids for i in range(1, len(t))), t


def test_deterministic_small_and_fast(tmp_path):
    t = time.perf_counter()
    a = write_model(tmp_path / "a.gguf", "qwen2", seed=3)
    assert time.perf_counter() - t < 1.0
    b = write_model(tmp_path / "b.gguf", "qwen2", seed=3)
    c = write_model(tmp_path / "c.gguf", "qwen2", seed=4)
    assert a.read_bytes() == b.read_bytes() != c.read_bytes()
    assert 50_000 < a.stat().st_size < 1_000_000


def test_weight_scales(tmp_path):
    g = GGUFFile(write_model(tmp_path / "m.gguf", wtype="F32"))

    def arr(name):
        t = g.tensors[name]
        return g.raw(name).view(np.float32).reshape(t.shape)

    assert abs(arr("blk.0.attn_q.weight").std() - 0.2) < 0.02
    assert abs(arr("blk.0.ffn_up.weight").std() - 64 ** -0.5) < 0.02
    assert abs(arr("blk.0.attn_norm.weight").mean() - 1.0) < 0.05
    g2 = GGUFFile(write_model(tmp_path / "s.gguf", wtype="F32", weight_scale=0.01))
    assert g2.raw("blk.0.attn_q.weight").view(np.float32).std() < 0.012


def _deq(g, name):
    t = g.tensors[name]
    return dequantize(np.array(g.raw(name)), t.type).reshape(t.shape)


@pytest.mark.parametrize("wtype", ["F16", "Q4_0"])
def test_pwri_file(tmp_path, wtype):
    p = write_model(tmp_path / "s.gguf", pwri=True, wtype=wtype)
    assert p.read_bytes()[:4] == b"PWRI"
    g = GGUFFile(p)
    names = list(g.tensors)
    assert set(names) == expected_tensors("llama", pwri=True)
    first_fc = min(i for i, n in enumerate(names) if ".fc" in n)
    assert all(".fc" in n for n in names[first_fc:])            # predictors after all model tensors
    assert g.tensors["blk.0.ffn_down_t.weight"].ne == (64, 128)
    assert g.tensors["blk.0.fc1.weight"].ne[0] == 64 and g.tensors["blk.0.fc2.weight"].ne[1] == 128
    assert g.kv["general.name"].endswith("relu-pwri")
    # full-rank predictor: its score has the sign of the gate pre-activation on ffn_norm(x)
    rng = np.random.default_rng(0)
    x = rng.standard_normal((200, 64)).astype(np.float32)
    fc1, fc2 = _deq(g, "blk.1.fc1.weight"), _deq(g, "blk.1.fc2.weight")
    gate, wn = _deq(g, "blk.1.ffn_gate.weight"), np.array(g.raw("blk.1.ffn_norm.weight")).view(np.float32)
    score = np.maximum(x @ fc1.T, 0) @ fc2.T
    xn = x / np.sqrt((x * x).mean(1, keepdims=True) + 1e-5) * wn
    pre = xn @ gate.T
    agree = ((score >= 0) == (pre > 0)).mean()
    assert agree > (0.99 if wtype == "F16" else 0.9)
    dense = GGUFFile(corrupt_copy(p, tmp_path / "d.gguf", "magic", data=b"GGUF"))
    assert dense.magic == "GGUF" and len(GGUFReader(dense.path).tensors) == len(names)


def test_low_rank_predictor_is_smaller(tmp_path):
    g = GGUFFile(write_model(tmp_path / "s.gguf", pwri=True, pred_rank=8))
    assert g.tensors["blk.0.fc1.weight"].ne == (64, 32) and g.tensors["blk.0.fc2.weight"].ne == (32, 128)
