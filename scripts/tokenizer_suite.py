#!/usr/bin/env python3
"""tokenizer_suite.py — llama.cpp's tokenizer test suite (test-tokenizer-0) run on pi2's tokenizer.

For every `ggml-vocab-*.gguf` with `.inp`/`.out` cases in DIR (default: the vocabularies that
`scripts/fetch_models.py llama-vocabs` extracts), tokenizes each case as test-tokenizer-0 does
(add_special = false, parse_special = false) and prints one line per vocabulary: cases passed / cases.
Exit status 1 if any case differs. Usage: tokenizer_suite.py [DIR] [-v]
"""
import sys
from pathlib import Path

SEP = "\n__ggml_vocab_test__\n"


def read_inputs(inp: Path) -> list:
    """The inputs as test-tokenizer-0 splits them (a final separator ends the list)."""
    raw, out, pos = inp.read_bytes().decode("utf-8", "surrogateescape"), [], 0
    while pos < len(raw):
        nxt = raw.find(SEP, pos)
        if nxt < 0:
            out.append(raw[pos:])
            break
        out.append(raw[pos:nxt])
        pos = nxt + len(SEP)
    return out


def read_cases(vocab: Path) -> dict:
    """text -> expected ids; like test-tokenizer-0's std::map, a repeated input keeps its last line."""
    inputs = read_inputs(Path(str(vocab) + ".inp"))
    lines = Path(str(vocab) + ".out").read_text(encoding="utf-8").split("\n")
    if lines and lines[-1] == "":
        lines.pop()                          # std::getline: a final newline ends the last line
    if len(inputs) != len(lines):
        raise ValueError(f"{vocab.name}: {len(inputs)} inputs, {len(lines)} outputs")
    return {s: [int(x) for x in o.split()] for s, o in zip(inputs, lines)}


def main() -> int:
    from pi2.errors import Pi2Error
    from pi2.model.gguf_file import GGUFFile
    from pi2.model.tokenizer import Tokenizer
    args = [a for a in sys.argv[1:] if a != "-v"]
    if args:
        d = Path(args[0])
    else:
        sys.path.insert(0, str(Path(__file__).resolve().parent))
        from fetch_models import vocab_dir
        d = vocab_dir()
    vocabs = sorted(p.with_suffix("") for p in d.glob("ggml-vocab-*.gguf.inp"))
    if not vocabs:
        print(f"no ggml-vocab-*.gguf.inp files in {d}", file=sys.stderr)
        return 1
    failed = total = 0
    for vocab in vocabs:
        cases = read_cases(vocab)
        total += len(cases)
        f = GGUFFile(vocab)
        try:
            tok = Tokenizer.from_kv(f.kv)
        except Pi2Error as e:
            print(f"{vocab.name[11:-5]:16s} 0/{len(cases)}  ({e})")
            failed += len(cases)
            continue
        finally:
            f.close()
        wrong = [s for s, ids in cases.items() if tok.encode(s, add_special=False, parse_special=False) != ids]
        failed += len(wrong)
        print(f"{vocab.name[11:-5]:16s} {len(cases) - len(wrong)}/{len(cases)}")
        if "-v" in sys.argv:
            for s in wrong:
                print(f"    {s[:60]!r}")
    print(f"{'all':16s} {total - failed}/{total} cases of {len(vocabs)} vocabularies")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
