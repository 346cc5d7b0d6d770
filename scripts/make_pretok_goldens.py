#!/usr/bin/env python3
"""make_pretok_goldens.py — record how llama.cpp cuts texts with each pre-tokenizer's regex list.

Reads llama.cpp's own regex lists and `tokenizer.ggml.pre` names out of src/llama-vocab.cpp, runs them
through llama.cpp's unicode_regex_split (scripts/pretok_oracle.cpp, linked against libllama) on the texts
of the tokenizer test suite plus a few harder ones, and writes tests/data/llama-pretok-splits.json: for
every name, its pre-tokenizer type; for every type, the pieces' lengths (code points) of every text.

Usage: make_pretok_goldens.py --llama-src DIR --oracle PATH [--out FILE]
"""
import argparse
import datetime
import json
import re
import subprocess
from pathlib import Path

SEP = "\n__ggml_vocab_test__\n"
EXTRA = ["a~b ~~ ~", "e\u0301 x\u0301y \u0301", "ab'S 'LL 'll 're", "\u00a0\u2003x\u3000 \u0085y",
         "1234567 12 3 1234", "Hello\r\n\r\nWorld  \n ", "日本語テキスト 中文 한국어", "Ꮳ ǅ ǈ ώ ι", "x\u200by",
         "\U0001F600\U0001F600", "ABCdefGHI aBC", "don't I'M we'VE", "مرحبا بالعالم", "हिन्दी भाषा", "\t\tfoo\t",
         "\u1C89 \U00016D40 \u2FFC", "ab\u1C89cd x\U00016D40y \u2FFCz q\uA7CBr",
         "<sentinel:12>IMGIMGABZ x", "a\n\n\nb\n", "  \n\n  ",
         "$+<=>^`|~ !\"#%&'()*,-./:;?@[\\]_{}", "Ⅻ ½ ² ٣", "a/b/c\r\n", "ÀÖØöøƺ", "12,345,678.90", "   leading",
         "trailing   ", "x12345y 1٣٣٣٣"]


def c_unescape(s: str) -> str:
    out, i = [], 0
    while i < len(s):
        if s[i] != "\\":
            out.append(s[i])
            i += 1
            continue
        n = s[i + 1]
        if n == "x":
            j = i + 2
            while j < len(s) and s[j] in "0123456789abcdefABCDEF":
                j += 1
            out.append(chr(int(s[i + 2:j], 16)))
            i = j
            continue
        out.append({"n": "\n", "r": "\r", "t": "\t", "0": "\0"}.get(n, n))
        i += 2
    return "".join(out)


def llama_lists(src: str) -> tuple:
    """({pre type: [regex...]}, {name: pre type}) as llama-vocab.cpp spells them."""
    start = src.index("struct llm_tokenizer_bpe : llm_tokenizer {")
    body = src[start:src.index("std::vector<std::string> regex_exprs;", start)]
    lists, labels = {}, []
    for part in re.split(r"(case LLAMA_VOCAB_PRE_TYPE_\w+:|default:)", body):
        m = re.match(r"case LLAMA_VOCAB_PRE_TYPE_(\w+):", part)
        if m or part == "default:":
            labels.append(m.group(1) if m else "DEFAULT")
        elif "regex_exprs = {" in part and labels:
            blk = part[part.index("regex_exprs = {"):]
            blk = "\n".join(ln for ln in blk[:blk.index("};")].split("\n") if not ln.strip().startswith("//"))
            for lab in labels:
                lists[lab] = [c_unescape(x) for x in re.findall(r'"((?:[^"\\]|\\.)*)"', blk)]
            labels = []
    chain = src[src.index('tokenizer_pre == "default"') - 200:src.index("unknown pre-tokenizer type")]
    names = {}
    for m in re.finditer(r"if\s*\((.*?)\)\s*\{\s*pre_type = LLAMA_VOCAB_PRE_TYPE_(\w+);", chain, re.S):
        for n in re.findall(r'tokenizer_pre == "([^"]+)"', m.group(1)):
            names[n] = m.group(2)
    names["gemma4"] = "GEMMA4"
    return lists, names


def oracle(binary: str, regexes: list, texts: list) -> list:
    inp = f"{len(regexes)}\n" + "".join(r.encode().hex() + "\n" for r in regexes)
    inp += "".join(t.encode().hex() + "\n" for t in texts)
    lines = subprocess.run([binary], input=inp.encode(), capture_output=True, check=True).stdout.decode().split("\n")
    out = []
    for line in lines[:len(texts)]:
        if line.startswith("ERROR"):
            raise SystemExit(f"llama.cpp: {line}")
        pieces = [bytes.fromhex(p).decode("utf-8") for p in line.split()]
        out.append(" ".join(str(len(p)) for p in pieces if p))
    return out


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--llama-src", required=True, type=Path, help="llama.cpp source tree")
    ap.add_argument("--oracle", required=True, help="pretok_oracle built against that tree's libllama")
    ap.add_argument("--out", type=Path,
                    default=Path(__file__).resolve().parent.parent / "tests/data/llama-pretok-splits.json")
    a = ap.parse_args()
    lists, names = llama_lists((a.llama_src / "src/llama-vocab.cpp").read_text(encoding="utf-8"))
    texts = set(EXTRA)
    for inp in (a.llama_src / "models").glob("ggml-vocab-*.gguf.inp"):
        texts.update(t for t in inp.read_text(encoding="utf-8").split(SEP) if t)
    texts = sorted(texts)
    doc = {"generator": {"llama.cpp": "0c1e570 (vendor/llama.cpp of llama-cpp-python==0.3.36)",
                         "how": "src/llama-vocab.cpp's regex lists through unicode_regex_split (byte_encode=false), "
                                "empty pieces dropped; each text's pieces as lengths in code points",
                         "command": "python3 scripts/make_pretok_goldens.py --llama-src ... --oracle ...",
                         "date": datetime.date.today().isoformat()},
           "names": dict(sorted(names.items())), "texts": texts, "splits": {}}
    for t in sorted(set(names.values())):
        doc["splits"][t] = oracle(a.oracle, lists[t], texts)
        print(t, "ok")
    a.out.write_text(json.dumps(doc, ensure_ascii=False, indent=0) + "\n", encoding="utf-8")


if __name__ == "__main__":
    main()
