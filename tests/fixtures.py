"""fixtures.py — tiny synthetic GGUF models for tests, written with the `gguf` package.

Owns: `write_model` (llama / qwen2 / gemma3 / bamboo, BPE or SPM vocab, dense or PowerInfer `PWRI`),
the vocabularies behind it (`bpe_vocab`, `spm_vocab`, learned once per process from TEXT) and
`corrupt_copy` for damaged-file tests. Everything is deterministic from `seed`.
K-quants (Q2_K..Q6_K) cannot be written: `gguf.quants` has no K-quant quantizer, so K-quant
files come from `llama-quantize` (or the real models) instead.
"""
from __future__ import annotations

import functools
import shutil
from collections import Counter
from pathlib import Path

import numpy as np
import regex
from gguf import GGMLQuantizationType as QT
from gguf import GGUFWriter, TokenType
from gguf.quants import dequantize, quantize

TEXT = """\
The quick brown fox jumps over the lazy dog. A small model can still say hello to the world.
Once upon a time there was a little robot who liked to read books about the sea and the stars.
It asked questions: what is the weather today, where are my keys, and how do I make tea?
Sparse models skip neurons that are zero, so the phone reads less from flash and runs faster.
The cache keeps hot neurons in memory while cold ones are loaded when the predictor asks.
def fibonacci(n):
    a, b = 0, 1
    for i in range(n):
        a, b = b, a + b
    return a

class Tokenizer:
    def __init__(self, vocab, merges):
        self.vocab = vocab
        self.merges = merges

    def encode(self, text: str) -> list[int]:
        return [self.vocab[t] for t in text.split()]

for (int i = 0; i < n; i++) { sum += x[i] * w[i]; }
print("hello, world!")  # 1234567890 + 3.14 = 42
Hello there! How are you? I am fine, thank you. Let me write a function that returns the answer.
The user said: please summarize this text in one sentence. The assistant wrote a short reply.
"""

# ChatML (SmolLM2 / Qwen2.5 style) and a Gemma-style template
CHATML_TEMPLATE = (
    "{% for message in messages %}{{'<|im_start|>' + message['role'] + '\\n' + message['content']"
    " + '<|im_end|>' + '\\n'}}{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}")
GEMMA_TEMPLATE = (
    "{{ bos_token }}{% for message in messages %}{% set role = 'model' if message['role'] == 'assistant'"
    " else message['role'] %}{{ '<start_of_turn>' + role + '\\n' + message['content'] | trim + '<end_of_turn>\\n' }}"
    "{% endfor %}{% if add_generation_prompt %}{{ '<start_of_turn>model\\n' }}{% endif %}")

_GPT2_SPLIT = regex.compile(r"""'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+""")
WTYPES = {"F32": QT.F32, "F16": QT.F16, "BF16": QT.BF16, "Q4_0": QT.Q4_0, "Q4_1": QT.Q4_1,
          "Q5_0": QT.Q5_0, "Q5_1": QT.Q5_1, "Q8_0": QT.Q8_0}
FILE_TYPES = {"F32": 0, "F16": 1, "Q4_0": 2, "Q4_1": 3, "Q8_0": 7, "Q5_0": 8, "Q5_1": 9, "BF16": 32}
ARCHS = ("llama", "qwen2", "gemma3", "bamboo")
DEFAULT_VOCAB = 512


def bytes_to_unicode() -> dict[int, str]:
    """GPT-2's byte -> printable character map (space -> 'Ġ', newline -> 'Ċ'), in GPT-2's order."""
    bs = list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1)) + list(range(ord("®"), ord("ÿ") + 1))
    cs = bs[:]
    n = 0
    for b in range(256):
        if b not in bs:
            bs.append(b)
            cs.append(256 + n)
            n += 1
    return {b: chr(c) for b, c in zip(bs, cs)}


def _learn_merges(words: Counter, n_new: int, have: set) -> list[tuple[str, str]]:
    """Plain BPE training over {word (tuple of symbols): count}; stops after `n_new` new tokens."""
    words = {tuple(w): c for w, c in words.items()}
    merges: list[tuple[str, str]] = []
    added = 0
    while added < n_new:
        pairs: Counter = Counter()
        for w, c in words.items():
            for a, b in zip(w, w[1:]):
                pairs[(a, b)] += c
        if not pairs:
            break
        (a, b), _ = min(pairs.items(), key=lambda kv: (-kv[1], kv[0]))
        merges.append((a, b))
        if a + b not in have:
            have.add(a + b)
            added += 1
        new = {}
        for w, c in words.items():
            out, i = [], 0
            while i < len(w):
                if i + 1 < len(w) and w[i] == a and w[i + 1] == b:
                    out.append(a + b)
                    i += 2
                else:
                    out.append(w[i])
                    i += 1
            new[tuple(out)] = new.get(tuple(out), 0) + c
        words = new
    return merges


@functools.lru_cache(maxsize=None)
def bpe_vocab(n_vocab: int = DEFAULT_VOCAB, specials_first: bool = True):
    """gpt2 byte-level vocab: (tokens, token_types, merges, special ids dict).

    Three ChatML control tokens at ids 0..2 (SmolLM2 layout) or at the end (Qwen layout), the 256
    byte-level symbols, then merged tokens learned on TEXT; `<|reserved_N|>` (UNUSED) pads if TEXT runs out.
    """
    specials = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
    if n_vocab < 256 + len(specials):
        raise ValueError(f"a bpe vocab needs at least {256 + len(specials)} tokens")
    b2u = bytes_to_unicode()
    base = list(b2u.values())
    words = Counter("".join(b2u[b] for b in piece.encode()) for piece in _GPT2_SPLIT.findall(TEXT))
    n_new = n_vocab - 256 - len(specials)
    merges = _learn_merges(Counter({tuple(w): c for w, c in words.items()}), n_new, set(base))
    seen, learned = set(base), []
    for a, b in merges:
        if a + b not in seen:
            seen.add(a + b)
            learned.append(a + b)
    pad = [f"<|reserved_{i}|>" for i in range(n_new - len(learned))]
    body = base + learned + pad
    types = [TokenType.NORMAL] * (len(base) + len(learned)) + [TokenType.UNUSED] * len(pad)
    if specials_first:
        tokens = specials + body
        types = [TokenType.CONTROL] * 3 + types
    else:
        tokens = body + specials
        types = types + [TokenType.CONTROL] * 3
    ids = {t: tokens.index(t) for t in specials}
    return tokens, types, [f"{a} {b}" for a, b in merges], ids


@functools.lru_cache(maxsize=None)
def spm_vocab(n_vocab: int = DEFAULT_VOCAB, gemma: bool = False):
    """SentencePiece (`llama` model) vocab: (tokens, scores, token_types, special ids dict).

    llama layout: `<unk>` `<s>` `</s>` at 0/1/2. Gemma layout: `<pad>` `<eos>` `<bos>` `<unk>` at 0..3 plus
    `<start_of_turn>`/`<end_of_turn>`. Then the 256 `<0xXX>` byte tokens, the characters of TEXT, and pieces
    (▁-prefixed words and sub-words) learned on TEXT, each scored by its merge rank (earlier = higher).
    """
    if gemma:
        head = ["<pad>", "<eos>", "<bos>", "<unk>", "<start_of_turn>", "<end_of_turn>"]
        head_types = [TokenType.CONTROL] * 3 + [TokenType.UNKNOWN] + [TokenType.CONTROL] * 2
    else:
        head = ["<unk>", "<s>", "</s>"]
        head_types = [TokenType.UNKNOWN, TokenType.CONTROL, TokenType.CONTROL]
    byte_toks = [f"<0x{b:02X}>" for b in range(256)]
    words = Counter("▁" + w for w in TEXT.split())
    chars = sorted({ch for w in words for ch in w})
    n_new = n_vocab - len(head) - 256 - len(chars)
    if n_new < 0:
        raise ValueError(f"an spm vocab needs at least {len(head) + 256 + len(chars)} tokens")
    merges = _learn_merges(Counter({tuple(w): c for w, c in words.items()}), n_new, set(chars))
    seen, learned = set(chars), []
    for a, b in merges:
        if a + b not in seen:
            seen.add(a + b)
            learned.append(a + b)
    pad = [f"<unused{i}>" for i in range(n_new - len(learned))]
    tokens = head + byte_toks + chars + learned + pad
    scores = ([0.0] * (len(head) + 256) + [-1e4 - i for i in range(len(chars))]
              + [-float(i) for i in range(len(learned))] + [-1e9] * len(pad))
    types = (head_types + [TokenType.BYTE] * 256 + [TokenType.NORMAL] * (len(chars) + len(learned))
             + [TokenType.UNUSED] * len(pad))
    ids = {t: i for i, t in enumerate(head)}
    return tokens, scores, types, ids


def _add_vocab(w: GGUFWriter, arch: str, vocab: str, n_vocab: int) -> None:
    if vocab == "bpe":
        tokens, types, merges, ids = bpe_vocab(n_vocab, specials_first=(arch != "qwen2"))
        w.add_tokenizer_model("gpt2")
        w.add_tokenizer_pre("qwen2" if arch == "qwen2" else "smollm")
        w.add_token_list(tokens)
        w.add_token_types([int(t) for t in types])
        w.add_token_merges(merges)
        if arch == "qwen2":
            w.add_bos_token_id(ids["<|endoftext|>"])
            w.add_pad_token_id(ids["<|endoftext|>"])
        else:
            w.add_bos_token_id(ids["<|im_start|>"])
        w.add_eos_token_id(ids["<|im_end|>"])
        w.add_add_bos_token(False)
        w.add_chat_template(CHATML_TEMPLATE)
    elif vocab == "spm":
        gemma = arch == "gemma3"
        tokens, scores, types, ids = spm_vocab(n_vocab, gemma=gemma)
        w.add_tokenizer_model("llama")
        w.add_token_list(tokens)
        w.add_token_scores(scores)
        w.add_token_types([int(t) for t in types])
        if gemma:
            w.add_bos_token_id(ids["<bos>"])
            w.add_eos_token_id(ids["<eos>"])
            w.add_unk_token_id(ids["<unk>"])
            w.add_pad_token_id(ids["<pad>"])
            w.add_eot_token_id(ids["<end_of_turn>"])
            w.add_add_space_prefix(False)
            w.add_chat_template(GEMMA_TEMPLATE)
        else:
            w.add_bos_token_id(1)
            w.add_eos_token_id(2)
            w.add_unk_token_id(0)
            w.add_add_space_prefix(True)
        w.add_add_bos_token(True)
        w.add_add_eos_token(False)
    else:
        raise ValueError(f"vocab must be 'bpe' or 'spm', not {vocab!r}")


def _store(w: GGUFWriter, name: str, a: np.ndarray, qtype: QT) -> np.ndarray:
    """Add a tensor of type `qtype`; returns the f32 values a reader will see (after quantization)."""
    a = np.ascontiguousarray(a, dtype=np.float32)
    if qtype == QT.F32:
        w.add_tensor(name, a)
        return a
    if qtype == QT.F16:
        h = a.astype(np.float16)
        w.add_tensor(name, h)
        return h.astype(np.float32)
    q = quantize(a, qtype)
    w.add_tensor(name, q, raw_dtype=qtype)
    return dequantize(q, qtype).reshape(a.shape)


def write_model(path, arch="llama", *, vocab=None, n_vocab=None, n_embd=64, n_layer=2, n_head=4, n_head_kv=2,
                n_ff=128, n_ctx=256, wtype="Q8_0", embd_type=None, tied=True, seed=0, act=None, pwri=False,
                rope_base=None, sliding_window=None, weight_scale=None, head_dim=None, pred_rank=None,
                eps=None) -> Path:
    """Write a tiny random model and return its path.

    vocab: "bpe" (default for llama/qwen2; pre "smollm"/"qwen2", ChatML template) or "spm" (default for
      gemma3, Gemma layout and add_space_prefix false, Gemma chat template; llama spm has no template).
      n_vocab defaults to 512.
    wtype / embd_type: type of the 2-D weights / of token_embd (and output): F32 F16 BF16 Q4_0 Q4_1 Q5_0
      Q5_1 Q8_0. Norms and qwen2 biases are F32.
    Weights: Q/K σ 0.2 (RoPE conventions stay visible), other matrices σ 1/√n_in, embeddings σ 0.5;
      `weight_scale` sets one σ for all 2-D weights. Norm weights 1 + N(0, 0.1).
    rope_base: default 1e4 (llama), 1e6 (qwen2, gemma3 global layers). gemma3: head_dim defaults to
      2·n_embd/n_head (so n_head·head_dim != n_embd, like gemma-3-270m), sliding_window to 8, always tied;
      with n_layer >= 6 layer 5 is a global layer.
    act: "silu" or "relu" (default relu with pwri): only recorded in `general.name`, since the GGUF keys
      are the same either way (a llama file is ReGLU only when its magic is PWRI).
    arch "bamboo" (PowerInfer's Bamboo / TurboSparse-Mistral): llama's tensors, keys and defaults under `bamboo.*`;
      its FFN is dReLU, relu(gate)·relu(up), in a PWRI file and ReLU-gated otherwise (act defaults to that). pwri=True: `ffn_down_t` replaces `ffn_down`, predictors fc1/fc2 follow all model
      tensors, `powerinfer.sparse_threshold` = 0.0, and bytes 0..3 become `PWRI`. The predictor is
      fc1 = [M; -M], fc2 = [B, -B] (r = 2·pred_rank rounded up to 32) with B·M the rank-`pred_rank` SVD of
      gate·diag(ffn_norm.weight); at the default full rank (n_embd) the score fc2·relu(fc1·x) equals
      rms(x)·(gate·ffn_norm(x)), so it predicts exactly (up to quantization) which gate outputs are > 0.
    """
    if arch not in ARCHS:
        raise ValueError(f"arch must be one of {ARCHS}")
    if wtype not in WTYPES or (embd_type or wtype) not in WTYPES:
        raise ValueError(f"wtype must be one of {sorted(WTYPES)} (K-quants cannot be written by gguf)")
    if arch == "bamboo":
        want = "drelu" if pwri else "relu"          # how ModelConfig reads a bamboo file
        if act not in (None, want):
            raise ValueError(f"a bamboo {'PWRI' if pwri else 'GGUF'} file is {want}, not {act}")
        act = want
    act = act or ("relu" if pwri else "silu")
    if act not in ("silu", "relu", "drelu"):
        raise ValueError("act must be 'silu' or 'relu' ('drelu' for bamboo)")
    gemma = arch == "gemma3"
    vocab = vocab or ("spm" if gemma else "bpe")
    n_vocab = n_vocab or DEFAULT_VOCAB
    head_dim = head_dim or (2 * n_embd // n_head if gemma else n_embd // n_head)
    if rope_base is None:
        rope_base = 10000.0 if arch in ("llama", "bamboo") else 1e6
    eps = eps if eps is not None else (1e-5 if arch in ("llama", "bamboo") else 1e-6)
    tied = True if gemma else tied
    qt, et = WTYPES[wtype], WTYPES[embd_type or wtype]
    rng = np.random.default_rng(seed)
    path = Path(path)

    w = GGUFWriter(str(path), arch)
    w.add_name(f"pi2-fixture-{arch}{'' if act == 'silu' else '-' + act}{'-pwri' if pwri else ''}")
    w.add_file_type(FILE_TYPES[wtype])
    w.add_quantization_version(2)
    w.add_context_length(n_ctx)
    w.add_embedding_length(n_embd)
    w.add_block_count(n_layer)
    w.add_feed_forward_length(n_ff)
    w.add_head_count(n_head)
    w.add_head_count_kv(n_head_kv)
    w.add_layer_norm_rms_eps(eps)
    w.add_rope_freq_base(rope_base)
    w.add_rope_dimension_count(head_dim)
    if gemma:
        w.add_key_length(head_dim)
        w.add_value_length(head_dim)
        w.add_sliding_window(sliding_window or 8)
    if pwri:
        w.add_float32("powerinfer.sparse_threshold", 0.0)
    _add_vocab(w, arch, vocab, n_vocab)

    def mat(n_out, n_in, sigma=None):
        s = weight_scale if weight_scale is not None else (sigma if sigma is not None else n_in ** -0.5)
        return rng.standard_normal((n_out, n_in), dtype=np.float32) * np.float32(s)

    def norm(n):
        return 1.0 + 0.1 * rng.standard_normal(n, dtype=np.float32)

    _store(w, "token_embd.weight", mat(n_vocab, n_embd, 0.5), et)
    w.add_tensor("output_norm.weight", norm(n_embd))
    if not tied:
        _store(w, "output.weight", mat(n_vocab, n_embd, 0.5), et)
    q_out, kv_out = n_head * head_dim, n_head_kv * head_dim
    gates = []
    for il in range(n_layer):
        p = f"blk.{il}."
        w.add_tensor(p + "attn_norm.weight", norm(n_embd))
        _store(w, p + "attn_q.weight", mat(q_out, n_embd, 0.2), qt)
        _store(w, p + "attn_k.weight", mat(kv_out, n_embd, 0.2), qt)
        _store(w, p + "attn_v.weight", mat(kv_out, n_embd), qt)
        if arch == "qwen2":
            for nm, n in (("q", q_out), ("k", kv_out), ("v", kv_out)):
                w.add_tensor(p + f"attn_{nm}.bias", 0.1 * rng.standard_normal(n, dtype=np.float32))
        if gemma:
            w.add_tensor(p + "attn_q_norm.weight", norm(head_dim))
            w.add_tensor(p + "attn_k_norm.weight", norm(head_dim))
        _store(w, p + "attn_output.weight", mat(n_embd, q_out), qt)
        if gemma:
            w.add_tensor(p + "post_attention_norm.weight", norm(n_embd))
        ffn_norm = norm(n_embd)
        w.add_tensor(p + "ffn_norm.weight", ffn_norm)
        gate = _store(w, p + "ffn_gate.weight", mat(n_ff, n_embd), qt)
        gates.append(gate * ffn_norm[None, :])
        _store(w, p + "ffn_up.weight", mat(n_ff, n_embd), qt)
        down = mat(n_embd, n_ff)
        if pwri:
            _store(w, p + "ffn_down_t.weight", down.T, qt)
        else:
            _store(w, p + "ffn_down.weight", down, qt)
        if gemma:
            w.add_tensor(p + "post_ffw_norm.weight", norm(n_embd))
    if pwri:
        k = pred_rank or n_embd
        for il, g in enumerate(gates):
            u, s, vt = np.linalg.svd(g.astype(np.float64), full_matrices=False)
            M = (np.sqrt(s[:k])[:, None] * vt[:k]).astype(np.float32)          # (k, n_embd)
            B = (u[:, :k] * np.sqrt(s[:k])[None, :]).astype(np.float32)        # (n_ff, k)
            r = -(-2 * k // 32) * 32                                           # fc2 rows need whole blocks
            fc1 = np.zeros((r, n_embd), np.float32)
            fc2 = np.zeros((n_ff, r), np.float32)
            fc1[:k], fc1[k:2 * k], fc2[:, :k], fc2[:, k:2 * k] = M, -M, B, -B
            _store(w, f"blk.{il}.fc1.weight", fc1, qt)
            _store(w, f"blk.{il}.fc2.weight", fc2, qt)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    if pwri:
        with open(path, "r+b") as f:
            f.write(b"PWRI")
    return path


def corrupt_copy(src, dst, how, *, at: int | None = None, data: bytes | None = None) -> Path:
    """Copy `src` to `dst` and damage it: how = "truncate" (keep `at` bytes), "patch" (write `data` at
    `at`), "magic" (bytes 0..3 = `data`, default b"GGML") or "append" (add `data`)."""
    src, dst = Path(src), Path(dst)
    shutil.copyfile(src, dst)
    if how == "truncate":
        with open(dst, "r+b") as f:
            f.truncate(at)
    elif how in ("patch", "magic"):
        with open(dst, "r+b") as f:
            f.seek(0 if how == "magic" else at)
            f.write(data if data is not None else b"GGML")
    elif how == "append":
        with open(dst, "ab") as f:
            f.write(data or b"\0")
    else:
        raise ValueError(f"unknown corruption {how!r}")
    return dst
