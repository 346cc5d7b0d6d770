"""sampler_goldens.py — writes tests/data/sampler_goldens.json: llama.cpp's samplers (libllama, through ctypes) run
on fixed logits, so tests/test_samplers_llamacpp.py can check pi2's chain token for token without llama.cpp.

Usage: python3 scripts/sampler_goldens.py /path/to/libllama.so [OUT.json]
Each case is a chain (llama.cpp's sampler names and parameters, in order, as common/sampling.cpp builds it), a seed,
prompt tokens accepted first, and steps: each step's logits come from numpy's default_rng(case seed) (normal, scale 3,
float32); the chain is applied to all n_vocab candidates (unsorted), the selected token is recorded, then accepted
by every sampler. For chains without a final draw, the surviving candidates (ids, logits) are recorded instead.
"""
from __future__ import annotations

import ctypes as C
import json
import sys
import time

import numpy as np


class TokenData(C.Structure):
    _fields_ = [("id", C.c_int32), ("logit", C.c_float), ("p", C.c_float)]


class TokenDataArray(C.Structure):
    _fields_ = [("data", C.POINTER(TokenData)), ("size", C.c_size_t), ("selected", C.c_int64), ("sorted", C.c_bool)]


def _lib(path):
    lib = C.CDLL(path)
    P = C.c_void_p
    sig = {
        "llama_sampler_init_dist": ([C.c_uint32], P), "llama_sampler_init_top_k": ([C.c_int32], P),
        "llama_sampler_init_top_p": ([C.c_float, C.c_size_t], P), "llama_sampler_init_min_p": ([C.c_float, C.c_size_t], P),
        "llama_sampler_init_typical": ([C.c_float, C.c_size_t], P), "llama_sampler_init_temp": ([C.c_float], P),
        "llama_sampler_init_temp_ext": ([C.c_float, C.c_float, C.c_float], P),
        "llama_sampler_init_xtc": ([C.c_float, C.c_float, C.c_size_t, C.c_uint32], P),
        "llama_sampler_init_top_n_sigma": ([C.c_float], P),
        "llama_sampler_init_mirostat": ([C.c_int32, C.c_uint32, C.c_float, C.c_float, C.c_int32], P),
        "llama_sampler_init_mirostat_v2": ([C.c_uint32, C.c_float, C.c_float], P),
        "llama_sampler_init_penalties": ([C.c_int32, C.c_int32, C.c_float, C.c_float, C.c_float], P),
        "llama_sampler_init_dry": ([P, C.c_float, C.c_float, C.c_int32, C.c_int32, P, C.c_size_t], P),
        "llama_sampler_apply": ([P, C.POINTER(TokenDataArray)], None), "llama_sampler_accept": ([P, C.c_int32], None),
        "llama_sampler_free": ([P], None),
    }
    for name, (args, res) in sig.items():
        f = getattr(lib, name)
        f.argtypes, f.restype = args, res
    return lib


def make(lib, n_vocab, seed, spec):
    name, a = spec[0], spec[1]
    if name == "dist":
        return lib.llama_sampler_init_dist(seed)
    if name == "top_k":
        return lib.llama_sampler_init_top_k(a["k"])
    if name == "top_p":
        return lib.llama_sampler_init_top_p(a["p"], a.get("min_keep", 0))
    if name == "min_p":
        return lib.llama_sampler_init_min_p(a["p"], a.get("min_keep", 0))
    if name == "typ_p":
        return lib.llama_sampler_init_typical(a["p"], a.get("min_keep", 0))
    if name == "temperature":
        return lib.llama_sampler_init_temp_ext(a["temp"], a.get("delta", 0.0), a.get("exponent", 1.0))
    if name == "temp":
        return lib.llama_sampler_init_temp(a["temp"])
    if name == "xtc":
        return lib.llama_sampler_init_xtc(a["p"], a["t"], a.get("min_keep", 0), seed)
    if name == "top_n_sigma":
        return lib.llama_sampler_init_top_n_sigma(a["n"])
    if name == "mirostat":
        return lib.llama_sampler_init_mirostat(n_vocab, seed, a["tau"], a["eta"], 100)
    if name == "mirostat_v2":
        return lib.llama_sampler_init_mirostat_v2(seed, a["tau"], a["eta"])
    if name == "penalties":
        return lib.llama_sampler_init_penalties(n_vocab, a["last_n"], a["repeat"], a["freq"], a["present"])
    if name == "dry":   # token-level breakers are not reachable through the C API; none here
        return lib.llama_sampler_init_dry(None, a["multiplier"], a["base"], a["allowed_length"], a["last_n"], None, 0)
    raise ValueError(name)


def logits_for(case_seed, n_steps, n_vocab):
    rng = np.random.default_rng(case_seed)
    return [(rng.standard_normal(n_vocab) * 3).astype(np.float32) for _ in range(n_steps)]


def run_case(lib, case):
    n_vocab, seed = case["n_vocab"], case["seed"]
    chain = [make(lib, n_vocab, seed, s) for s in case["chain"]]
    for t in case.get("prompt", []):
        for s in chain:
            lib.llama_sampler_accept(s, t)
    out = []
    for step, logits in enumerate(logits_for(case["case_seed"], case["steps"], n_vocab)):
        if "force" in case:   # repetitive histories for penalties and DRY: some steps' logits favour a given token
            f = case["force"][step % len(case["force"])]
            if f >= 0:
                logits[f] += 12.0
        buf = (TokenData * n_vocab)(*[TokenData(i, float(v), 0.0) for i, v in enumerate(logits)])
        arr = TokenDataArray(buf, n_vocab, -1, False)
        for s in chain:
            lib.llama_sampler_apply(s, C.byref(arr))
        if arr.selected >= 0:
            tok = arr.data[arr.selected].id
            out.append(int(tok))
        else:
            cand = [(arr.data[i].id, arr.data[i].logit) for i in range(arr.size)]
            out.append({"ids": [int(i) for i, _ in cand], "logits": [float(v) for _, v in cand]})
            tok = int(np.argmax(logits))
        for s in chain:
            lib.llama_sampler_accept(s, tok)
    for s in chain:
        lib.llama_sampler_free(s)
    return out


CASES = [
    # each sampler alone, candidates kept (no draw)
    {"name": "typical", "chain": [["typ_p", {"p": 0.7}]], "n_vocab": 300, "steps": 3},
    {"name": "typical_min_keep", "chain": [["typ_p", {"p": 0.2, "min_keep": 5}]], "n_vocab": 300, "steps": 2},
    {"name": "top_n_sigma", "chain": [["top_n_sigma", {"n": 1.5}]], "n_vocab": 300, "steps": 3},
    {"name": "dynatemp", "chain": [["temperature", {"temp": 0.9, "delta": 0.4, "exponent": 1.3}]], "n_vocab": 200,
     "steps": 2},
    {"name": "penalties", "chain": [["penalties", {"last_n": 16, "repeat": 1.3, "freq": 0.25, "present": 0.5}]],
     "n_vocab": 100, "steps": 6, "prompt": [3, 5, 5, 7, 9, 9, 9]},
    {"name": "dry", "chain": [["dry", {"multiplier": 0.8, "base": 1.75, "allowed_length": 2, "last_n": 32}]],
     "n_vocab": 50, "steps": 6, "prompt": [1, 2, 3, 4, 1, 2, 3, 4, 1, 2, 3, 9, 1, 2]},
    {"name": "top_p_large", "chain": [["top_p", {"p": 0.9}]], "n_vocab": 3000, "steps": 2},
    # draws: seeded, several steps
    {"name": "dist", "chain": [["dist", {}]], "n_vocab": 500, "steps": 40},
    {"name": "default_chain", "chain": [["penalties", {"last_n": 64, "repeat": 1.1, "freq": 0.1, "present": 0.2}],
                                        ["top_k", {"k": 40}], ["top_p", {"p": 0.95}], ["min_p", {"p": 0.05}],
                                        ["temperature", {"temp": 0.8}], ["dist", {}]],
     "n_vocab": 1500, "steps": 40, "prompt": [1, 2, 3]},
    {"name": "xtc", "chain": [["top_k", {"k": 60}], ["xtc", {"p": 0.6, "t": 0.05}], ["dist", {}]],
     "n_vocab": 400, "steps": 40},
    {"name": "xtc_candidates", "chain": [["xtc", {"p": 1.0, "t": 0.02, "min_keep": 1}]], "n_vocab": 100, "steps": 3},
    {"name": "typical_chain", "chain": [["top_k", {"k": 100}], ["typ_p", {"p": 0.8}], ["temperature", {"temp": 1.2}],
                                        ["dist", {}]], "n_vocab": 700, "steps": 30},
    {"name": "nsigma_chain", "chain": [["top_n_sigma", {"n": 1.0}], ["top_k", {"k": 40}],
                                       ["temperature", {"temp": 0.7}], ["dist", {}]], "n_vocab": 600, "steps": 30},
    {"name": "reordered", "chain": [["temperature", {"temp": 1.5}], ["min_p", {"p": 0.1}], ["top_k", {"k": 20}],
                                    ["dist", {}]], "n_vocab": 400, "steps": 30},
    {"name": "dry_chain", "chain": [["penalties", {"last_n": 64, "repeat": 1.0, "freq": 0.0, "present": 0.0}],
                                    ["dry", {"multiplier": 1.5, "base": 1.75, "allowed_length": 2, "last_n": -1}],
                                    ["top_k", {"k": 30}], ["dist", {}]],
     "n_vocab": 60, "steps": 30, "prompt": [4, 8, 15, 16, 23, 42, 4, 8, 15], "force": [16, 23, 42, 4, 8, -1]},
    {"name": "mirostat", "chain": [["temp", {"temp": 0.8}], ["mirostat", {"tau": 5.0, "eta": 0.1}]],
     "n_vocab": 800, "steps": 30},
    {"name": "mirostat_v2", "chain": [["temp", {"temp": 0.8}], ["mirostat_v2", {"tau": 4.0, "eta": 0.2}]],
     "n_vocab": 800, "steps": 30},
    # the usual chain on a real vocabulary's size: top-k comes first and cuts the whole row (csrc/sample.c)
    {"name": "default_chain_large", "chain": [["top_k", {"k": 40}], ["top_p", {"p": 0.95}], ["min_p", {"p": 0.05}],
                                              ["temperature", {"temp": 0.8}], ["dist", {}]],
     "n_vocab": 49152, "steps": 24},
    {"name": "top_k_large", "chain": [["top_k", {"k": 100}], ["temperature", {"temp": 1.3}], ["dist", {}]],
     "n_vocab": 151936, "steps": 12},
    {"name": "top_k_above_c", "chain": [["top_k", {"k": 300}], ["min_p", {"p": 0.02}], ["dist", {}]],
     "n_vocab": 20000, "steps": 12},
]


def main():
    lib = _lib(sys.argv[1])
    out_path = sys.argv[2] if len(sys.argv) > 2 else "tests/data/sampler_goldens.json"
    cases = []
    for i, case in enumerate(CASES):
        case = {"seed": 1234 + i, "case_seed": 99 + i, **case}
        if case["name"] == "dry_chain":
            case["chain"][1][1]["last_n"] = 40   # common_init: -1 becomes the context size; a fixed window here
        case["expected"] = run_case(lib, case)
        cases.append(case)
    doc = {"provenance": {"llama.cpp": "0c1e57098bba43ac29e6e3b677cdceebdd22334f", "library": "libllama.so (build/bin)",
                          "command": "python3 scripts/sampler_goldens.py build/bin/libllama.so",
                          "date": time.strftime("%Y-%m-%d")},
           "cases": cases}
    with open(out_path, "w") as f:
        json.dump(doc, f, indent=1)
    print(f"wrote {out_path}: {len(cases)} cases")


if __name__ == "__main__":
    main()
