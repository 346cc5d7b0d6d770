#!/usr/bin/env python3
"""make_vocab_goldens.py — record llama.cpp's own answers on its tokenizer test vocabularies.

Runs llama.cpp's `test-tokenizer-0` (add_special = false, parse_special = false) on every
`models/ggml-vocab-*.gguf` of a llama.cpp tree and writes tests/data/llama-vocab-suite.json:
  - for the vocabularies that come with `.inp`/`.out` cases: the detokenized text llama.cpp prints for
    each case (`common_detokenize`, special tokens shown), after checking its ids against `.out`;
  - for those without cases: the ids and text llama.cpp gives on the cases of `--cases-from`;
  - for all of them: the ids and text llama.cpp gives on HARD, texts that stress Unicode handling.
The ids of the cases themselves are not copied: the test reads them from the `.out` files.

Usage: make_vocab_goldens.py --llama /work/llama/build/bin/test-tokenizer-0 --models DIR [--out FILE]
"""
import argparse
import datetime
import json
import re
import shutil
import subprocess
import tempfile
from pathlib import Path

from tokenizer_suite import read_inputs   # the inputs as test-tokenizer-0 splits them

HARD = ["a~b ~~ ~", "e\u0301 x\u0301y \u0301", "ab'S 'LL 'll 're", "\u00a0\u2003x\u3000 \u0085y", "1234567 12 3 1234",
        "Hello\r\n\r\nWorld  \n ", "日本語テキスト 中文 한국어", "Ꮳ ǅ ǈ ώ ι Ω K", "x\u200by\ufeffz", "\U0001F600\U0001F600",
        "ABCdefGHI aBC", "don't I'M we'VE", "مرحبا بالعالم", "हिन्दी भाषा", "\t\tfoo\t", "\u1C89 \U00016D40 \u2FFC",
        "ab\u1C89cd x\U00016D40y \u2FFCz q\uA7CBr",
        "a\n\n\nb\n", "  \n\n  ", "$+<=>^`|~ !\"#%&'()*,-./:;?@[\\]_{}", "Ⅻ ½ ² ٣", "İstanbul ǅx ÅΣ ﬁ 𝔘",
        "a\u0301\u0300b \u00e9\u00e8", "x12345y 1٣٣٣٣", "<s> </s> <unk> [CLS] <|endoftext|>", "▁a ▁▁b"]
# text that is not valid UTF-8 (held as surrogateescape str): stray, truncated, overlong, encoded surrogates
HARD += [b.decode("utf-8", "surrogateescape") for b in (
    b"a\xffb", b"\xe4\xb8", b"x\xc1\xbfy", b"\xed\xa0\x80z", b"caf\xc3 ok", b"\xff\xc3\xa9xyz \xe4\xb8\xad\xe6 q",
    b"ab\xe4\xb8\xadc \xc3", b"\x80\x80 hi")]


def run(binary: str, vocab: Path, cases: list) -> dict:
    """text -> (ids, detokenized text) for the unique cases, parsed from test-tokenizer-0's stdout."""
    r = subprocess.run([binary, str(vocab)], capture_output=True)
    if r.returncode not in (0, 3):                                     # 3: some case differs from .out
        raise RuntimeError(r.stderr.decode("utf-8", "replace")[-300:])
    stdout = r.stdout
    keys = sorted(set(cases), key=lambda s: s.encode("utf-8", "surrogateescape"))   # std::map<std::string> order
    got, pos = {}, 0
    for s in keys:
        head = b"\nsrc: '" + s.encode("utf-8", "surrogateescape") + b"'\nres: '"
        if not stdout.startswith(head, pos):
            raise SystemExit(f"{vocab.name}: unexpected output at byte {pos}")
        pos += len(head)
        end = stdout.index(b"'\ntok: ", pos)
        detok = stdout[pos:end].decode("utf-8", "surrogateescape")
        pos = end + len(b"'\ntok: ")
        eol = stdout.index(b"\n", pos)
        got[s] = ([int(x) for x in stdout[pos:eol].split()], detok)
        pos = eol + 1
    return got


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--llama", required=True, help="path of llama.cpp's test-tokenizer-0")
    ap.add_argument("--models", required=True, type=Path, help="llama.cpp's models/ directory")
    ap.add_argument("--cases-from", default="gpt-2", help="vocabulary whose cases the case-less ones get")
    ap.add_argument("--out", type=Path,
                    default=Path(__file__).resolve().parent.parent / "tests/data/llama-vocab-suite.json")
    a = ap.parse_args()
    commit = subprocess.run(["git", "-C", str(a.models), "rev-parse", "--short", "HEAD"], capture_output=True,
                            text=True).stdout.strip() or "0c1e570 (vendor/llama.cpp of llama-cpp-python==0.3.36)"
    doc = {"generator": {"llama.cpp": commit, "binary": "test-tokenizer-0 (add_special=false, parse_special=false)",
                         "command": "python3 scripts/make_vocab_goldens.py --llama .../test-tokenizer-0 "
                                    f"--models .../models --cases-from {a.cases_from}",
                         "date": datetime.date.today().isoformat()},
           "with_cases": {}, "without_cases": {}, "hard": {}}
    extra_cases = read_inputs(a.models / f"ggml-vocab-{a.cases_from}.gguf.inp")
    for vocab in sorted(a.models.glob("ggml-vocab-*.gguf")):
        name = vocab.name[len("ggml-vocab-"):-len(".gguf")]
        inp = vocab.with_name(vocab.name + ".inp")
        if inp.exists():
            cases = read_inputs(inp)
            outs = vocab.with_name(vocab.name + ".out").read_text(encoding="utf-8").splitlines()
            want = {s: [int(x) for x in o.split()] for s, o in zip(cases, outs)}
            got = run(a.llama, vocab, cases)
            bad = [s for s in want if got[s][0] != want[s]]
            if bad:
                raise SystemExit(f"{name}: llama.cpp itself fails {len(bad)} cases")
            doc["with_cases"][name] = {"n_cases": len(want), "detok": {s: got[s][1] for s in sorted(got)}}
        else:
            with tempfile.TemporaryDirectory() as d:
                tmp = Path(d) / vocab.name
                shutil.copy(vocab, tmp)
                shutil.copy(a.models / f"ggml-vocab-{a.cases_from}.gguf.inp", str(tmp) + ".inp")
                Path(str(tmp) + ".out").write_text("0\n" * len(extra_cases))
                try:
                    got = run(a.llama, tmp, extra_cases)
                except RuntimeError as e:
                    doc["without_cases"][name] = {"loads": False, "llama.cpp": str(e)}
                    continue
            doc["without_cases"][name] = {"loads": True, "cases": {s: {"ids": got[s][0], "detok": got[s][1]}
                                                                    for s in sorted(got)}}
        with tempfile.TemporaryDirectory() as d:
            tmp = Path(d) / vocab.name
            shutil.copy(vocab, tmp)
            Path(str(tmp) + ".inp").write_bytes(SEP.join(HARD).encode("utf-8", "surrogateescape"))
            Path(str(tmp) + ".out").write_text("0\n" * len(HARD))
            try:
                got = run(a.llama, tmp, HARD)
                doc["hard"][name] = {s: {"ids": got[s][0], "detok": got[s][1]} for s in sorted(got)}
            except RuntimeError:
                pass
        print(name, "ok")
    text = json.dumps(doc, ensure_ascii=False, indent=1)
    text = re.sub("[\ud800-\udfff]", lambda m: f"\\u{ord(m.group()):04x}", text)    # lone surrogates as escapes
    a.out.write_text(text + "\n", encoding="utf-8")


if __name__ == "__main__":
    main()
