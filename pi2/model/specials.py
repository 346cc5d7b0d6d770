# specials.py — which tokens are special, as llama_vocab::impl::load decides after reading the vocabulary:
# token attributes from tokenizer.ggml.token_type, the special ids (defaults per tokenizer model, GGUF
# overrides), text-based detection of EOT/EOM/FIM tokens, "unused" control tokens, the EOG set and the
# per-model attribute fixes (lstrip/rstrip, gpt-oss and gemma4 exceptions).
# Does not: tokenize or detokenize (tokenizer.py, detokenize.py).
from __future__ import annotations

import numpy as np

from pi2.errors import ModelFormatError
from pi2.model.vocab_order import map_order

# llama_token_attr bits
UNDEFINED, UNKNOWN, UNUSED, NORMAL, CONTROL, USER_DEFINED, BYTE = 0, 1, 2, 4, 8, 16, 32
LSTRIP, RSTRIP = 128, 256
_TYPE_ATTR = np.array([UNDEFINED, NORMAL, UNKNOWN, CONTROL, USER_DEFINED, UNUSED, BYTE], dtype=np.int32)

K = "tokenizer.ggml."
_EOT_TEXTS = ("<|eot_id|>", "<|im_end|>", "<|end|>", "<end_of_turn>", "<|endoftext|>", "<|end_of_text|>",
              "<EOT>", "_<EOT>", "[EOT]", "<｜end▁of▁sentence｜>", "<end_of_utterance>")
_FIM_TEXTS = {
    "fim_pre": ("<|fim_prefix|>", "<fim-prefix>", "<fim_prefix>", "<｜fim▁begin｜>", "<PRE>", "▁<PRE>",
                "<|code_prefix|>", "<|prefix|>"),
    "fim_suf": ("<|fim_suffix|>", "<fim-suffix>", "<fim_suffix>", "<｜fim▁hole｜>", "<SUF>", "▁<SUF>",
                "<|code_suffix|>", "<|suffix|>"),
    "fim_mid": ("<|fim_middle|>", "<fim-middle>", "<fim_middle>", "<｜fim▁end｜>", "<MID>", "▁<MID>",
                "<|code_middle|>", "<|middle|>"),
    "fim_pad": ("<|fim_pad|>", "<fim-pad>", "<fim_pad>", "<PAD>", "[PAD]"),
    "fim_rep": ("<|fim_repo|>", "<|repo_name|>", "<fim-repo>", "<REPO>", "<reponame>"),
    "fim_sep": ("<|file_sep|>",),
}
_EOG_TEXTS = frozenset(("<|eot_id|>", "<|im_end|>", "<|end|>", "<|return|>", "<|call|>", "<|flush|>",
                        "<|calls|>", "<end_of_turn>", "<|endoftext|>", "</s>", "<|eom_id|>", "<EOT>", "_<EOT>",
                        "[EOT]", "[EOS]", "<|end_of_text|>", "<end_of_utterance>", "<eos>", "<turn|>",
                        "<|tool_response>", "<｜end▁of▁sentence｜>", "[e~["))
ID_KEYS = (("bos", "bos_token_id"), ("eos", "eos_token_id"), ("eot", "eot_token_id"), ("eom", "eom_token_id"),
           ("unk", "unknown_token_id"), ("sep", "seperator_token_id"), ("pad", "padding_token_id"),
           ("mask", "mask_token_id"), ("fim_pre", "fim_pre_token_id"), ("fim_suf", "fim_suf_token_id"),
           ("fim_mid", "fim_mid_token_id"), ("fim_pad", "fim_pad_token_id"), ("fim_rep", "fim_rep_token_id"),
           ("fim_sep", "fim_sep_token_id"), ("fim_pre", "prefix_token_id"), ("fim_suf", "suffix_token_id"),
           ("fim_mid", "middle_token_id"))


def token_attrs(kv: dict, n: int) -> np.ndarray:
    """llama_token_attr of every token from tokenizer.ggml.token_type (NORMAL when absent)."""
    types = kv.get(K + "token_type")
    if types is None:
        return np.full(n, NORMAL, dtype=np.int32)
    types = np.asarray(types, dtype=np.int64)
    if len(types) < n:
        raise ModelFormatError(f"tokenizer.ggml.token_type has {len(types)} entries for {n} tokens")
    types = types[:n]
    ok = (types >= 0) & (types < len(_TYPE_ATTR))
    return np.where(ok, _TYPE_ATTR[np.where(ok, types, 0)], UNDEFINED).astype(np.int32)


def special_ids(kv: dict, n: int, defaults: dict) -> dict:
    """The special ids: the tokenizer model's defaults (disabled outside the vocabulary), then GGUF keys."""
    ids = {k: None for k, _ in ID_KEYS}
    ids.update(defaults)
    for k, _ in ID_KEYS:
        if ids[k] is not None and ids[k] >= n:
            ids[k] = None
    for k, key in ID_KEYS:
        v = kv.get(K + key)
        if v is not None and 0 <= int(v) < n:
            ids[k] = int(v)
    return ids


def detect(tokens: list, token_to_id: dict, ids: dict, attrs) -> tuple:
    """Text-based detection of EOT/EOM/FIM ids, 'unused' control tokens and the EOG set.
    -> (eog ids, EOT candidates to resolve later or None). Updates `ids` and `attrs` in place."""
    present = lambda texts: [token_to_id[t] for t in texts if t in token_to_id]   # noqa: E731
    eot_candidates = None
    groups = [("eot", _EOT_TEXTS), ("eom", ("<|eom_id|>",))] + list(_FIM_TEXTS.items())
    for name, texts in groups:
        if ids[name] is None:
            found = present(texts)
            if len(found) > 1 and name == "eot" and all(tokens[i] in _EOG_TEXTS for i in found):
                eot_candidates = found        # resolved on first use: the choice changes nothing else
            elif found:
                # llama.cpp takes the first hit while iterating its unordered_map
                ids[name] = found[0] if len(found) == 1 else map_order(tokens, found)[0]
                attrs[ids[name]] |= CONTROL
    for i in np.nonzero(attrs & CONTROL)[0].tolist():
        if "unused" in tokens[i]:
            attrs[i] |= UNUSED
    eog = {ids[k] for k in ("fim_pad", "fim_rep", "fim_sep") if ids[k] is not None}
    for i in present(_EOG_TEXTS):
        eog.add(i)
        attrs[i] |= CONTROL
    for i in present(("<|channel|>", "<|message|>", "<|start|>", "<|constrain|>")):
        attrs[i] = USER_DEFINED
    eog |= {ids[k] for k in ("eos", "eot", "eom") if ids[k] is not None}
    eog |= set(eot_candidates or ())
    texts = {tokens[i]: i for i in eog}
    has_call = "<|call|>" in texts or "<|calls|>" in texts
    if "<|end|>" in texts and has_call and ("<|return|>" in texts or "<|flush|>" in texts):
        eog.discard(texts["<|end|>"])
        attrs[texts["<|end|>"]] = USER_DEFINED
    if ("<|tool_response>" in texts or "<|plamo:eos|>" in texts) and "</s>" in texts:
        eog.discard(texts["</s>"])
        attrs[texts["</s>"]] = NORMAL
    return eog, eot_candidates


def name_attrs(kv: dict, token_to_id: dict, attrs) -> None:
    """lstrip/rstrip attributes llama.cpp sets by model name and pre-tokenizer."""
    name = str(kv.get("general.name", "")).lower()
    pre, arch = str(kv.get(K + "pre", "")), str(kv.get("general.architecture", ""))
    t2i = token_to_id
    if any(s in pre for s in ("jina-v2-de", "jina-v2-es", "jina-v2-code")) or \
            any(s in arch for s in ("nomic-bert-moe", "jina-bert-v3")):
        if "<mask>" in t2i:
            attrs[t2i["<mask>"]] |= LSTRIP
    elif "phi-3" in name or "phi3" in name:
        special = np.nonzero(attrs & (CONTROL | USER_DEFINED | UNKNOWN))[0]
        attrs[special] |= RSTRIP
        if "</s>" in t2i:
            attrs[t2i["</s>"]] |= RSTRIP
        for t in ("<unk>", "<s>", "<|endoftext|>"):
            if t in t2i:
                attrs[t2i[t]] &= ~RSTRIP
    elif "modern-bert" in name and "[MASK]" in t2i:
        attrs[t2i["[MASK]"]] |= LSTRIP
