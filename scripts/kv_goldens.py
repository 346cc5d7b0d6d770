#!/usr/bin/env python3
"""kv_goldens.py — llama.cpp's outputs with a quantized K cache (-ctk TYPE -fa off), or with flash attention on
(-fa on, any -ctk / -ctv), on the real test models, for tests/test_kv_cache.py, tests/test_kv_types.py and
tests/test_flash_attn.py: greedy continuations (llama-completion's text) and llama-perplexity's chunk figures.

    python3 scripts/kv_goldens.py LLAMA_BIN_DIR [OUT.json] [--ctk TYPE] [--fa on --ctv TYPE]

LLAMA_BIN_DIR holds llama-completion and llama-perplexity of llama.cpp 0c1e570 (CPU backend). Models come from
~/.cache/pi2/models (scripts/fetch_models.py). TYPE: q8_0 (the default; writes tests/data/kvcache-llamacpp.json),
q4_0, q4_1, q5_0 or q5_1 (tests/data/kvcache-llamacpp-TYPE.json); with --fa on also f16, written to
tests/data/fa-llamacpp-CTK-CTV.json.
"""
from __future__ import annotations

import datetime
import json
import re
import subprocess
import sys
from pathlib import Path

MODELS = {"smollm2-135m": "SmolLM2-135M-Instruct.Q4_1.gguf", "qwen2.5-coder-0.5b": "qwen2.5-coder-0.5b-q4_k_m.gguf"}
PROMPTS = ["Tom and his sister Mia found an old map in the attic. The map showed",
           "The three most important rules of writing clean code are"]
N_PREDICT = 48
PPL = ["-c", "128", "--chunks", "3"]


def main() -> int:
    args = sys.argv[1:]
    opts = {"--ctk": "q8_0", "--ctv": "f16", "--fa": "off"}
    for flag in opts:
        if flag in args:
            i = args.index(flag)
            opts[flag] = args[i + 1]
            del args[i:i + 2]
    ctk, ctv, fa = opts["--ctk"], opts["--ctv"], opts["--fa"]
    if not args or (fa == "off" and ctv != "f16"):
        print(__doc__, file=sys.stderr)
        return 2
    common = ["-ctk", ctk, "-fa", fa, "-t", "1"] + (["-ctv", ctv] if fa == "on" else [])
    bins = Path(args[0])
    root = Path(__file__).resolve().parent.parent
    name = "kvcache-llamacpp.json" if ctk == "q8_0" else f"kvcache-llamacpp-{ctk}.json"
    if fa == "on":
        name = f"fa-llamacpp-{ctk}-{ctv}.json"
    out = Path(args[1]) if len(args) > 1 else root / "tests" / "data" / name
    text_file = root / "tests" / "data" / "moe-text.txt"
    models = Path.home() / ".cache" / "pi2" / "models"
    data = {"provenance": {
        "llama.cpp": "0c1e570 (llama-cpp-python 0.3.36 sdist, CPU backend)",
        "greedy": f"llama-completion -m MODEL -p PROMPT -n {N_PREDICT} --temp 0 -no-cnv -c 256 {' '.join(common)} "
                  "(stdout, trailing newlines removed)",
        "perplexity": f"llama-perplexity -m MODEL -f tests/data/moe-text.txt {' '.join(PPL + common)} "
                      "([1]a,[2]b,... chunk figures as printed)",
        "date": datetime.date.today().isoformat(), "script": "scripts/kv_goldens.py"}, "models": {}}
    for key, name in MODELS.items():
        path = models / name
        entry = {"file": name, "greedy": [], "ppl": None}
        for prompt in PROMPTS:
            r = subprocess.run([str(bins / "llama-completion"), "-m", str(path), "-p", prompt, "-n", str(N_PREDICT),
                                "--temp", "0", "-no-cnv", "-c", "256", *common],
                               capture_output=True, text=True, check=True, stdin=subprocess.DEVNULL)
            entry["greedy"].append({"prompt": prompt, "text": r.stdout.rstrip("\n")})
        r = subprocess.run([str(bins / "llama-perplexity"), "-m", str(path), "-f", str(text_file), *PPL, *common],
                           capture_output=True, text=True, check=True, stdin=subprocess.DEVNULL)
        chunks = re.findall(r"\[\d+\]([0-9.]+)", r.stdout + r.stderr)
        entry["ppl"] = [float(c) for c in chunks]
        entry["ppl_text"] = chunks
        data["models"][key] = entry
        print(key, entry["ppl_text"], file=sys.stderr)
    out.write_text(json.dumps(data, indent=1, ensure_ascii=False) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
