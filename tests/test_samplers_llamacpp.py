"""test_samplers_llamacpp.py — pi2's sampler chain against llama.cpp's on the same logits and seed: the candidates
each stage leaves, and the tokens a seeded chain draws step after step (tests/data/sampler_goldens.json, written by
scripts/sampler_goldens.py from libllama 0c1e570)."""
import json
import warnings
from pathlib import Path

import numpy as np
import pytest

from pi2.runtime.config import SamplerParams
from pi2.runtime.rng import Mt19937
from pi2.runtime.sampling import Sampler

DOC = json.loads((Path(__file__).parent / "data" / "sampler_goldens.json").read_text())
CASES = {c["name"]: c for c in DOC["cases"]}
OFF = dict(top_k=0, top_p=1.0, min_p=0.0, temp=1.0, repeat_penalty=1.0)


def params_for(case) -> SamplerParams:
    """The SamplerParams whose chain is the case's llama.cpp chain."""
    kw, order = dict(OFF, seed=case["seed"], dry_sequence_breakers=()), []
    for name, a in case["chain"]:
        if name == "dist":
            continue
        if name in ("mirostat", "mirostat_v2"):
            kw.update(mirostat=1 if name == "mirostat" else 2, mirostat_tau=a["tau"], mirostat_eta=a["eta"])
            continue
        if name == "temp":
            kw["temp"] = a["temp"]
            continue
        order.append(name)
        if name == "top_k":
            kw["top_k"] = a["k"]
        elif name in ("top_p", "min_p", "typ_p"):
            kw[name] = a["p"]
        elif name == "temperature":
            kw.update(temp=a["temp"], dynatemp_range=a.get("delta", 0.0), dynatemp_exponent=a.get("exponent", 1.0))
        elif name == "xtc":
            kw.update(xtc_probability=a["p"], xtc_threshold=a["t"])
        elif name == "top_n_sigma":
            kw["top_n_sigma"] = a["n"]
        elif name == "penalties":
            kw.update(repeat_last_n=a["last_n"], repeat_penalty=a["repeat"], frequency_penalty=a["freq"],
                      presence_penalty=a["present"])
        elif name == "dry":
            kw.update(dry_multiplier=a["multiplier"], dry_base=a["base"], dry_allowed_length=a["allowed_length"],
                      dry_penalty_last_n=a["last_n"])
        if "min_keep" in a:
            kw["min_keep"] = a["min_keep"]
    return SamplerParams(**kw, samplers=tuple(order))


def logits_for(case):
    rng = np.random.default_rng(case["case_seed"])
    out = [(rng.standard_normal(case["n_vocab"]) * 3).astype(np.float32) for _ in range(case["steps"])]
    for step, x in enumerate(out):
        if "force" in case:
            f = case["force"][step % len(case["force"])]
            if f >= 0:
                x[f] += np.float32(12.0)
    return out


@pytest.mark.parametrize("name", sorted(CASES))
def test_chain_matches_llama_cpp(name):
    case = CASES[name]
    s = Sampler(params_for(case), case["n_vocab"], n_ctx=4096)
    for t in case.get("prompt", []):
        s.accept(t)
    with warnings.catch_warnings():
        warnings.simplefilter("error")      # no numpy warning may reach the terminal
        for step, (logits, want) in enumerate(zip(logits_for(case), case["expected"])):
            if isinstance(want, dict):
                ids, lv = s.candidates(logits)
                assert ids.tolist() == want["ids"], f"step {step}"
                if name == "dynatemp":   # the dynamic temperature differs from llama.cpp's by an ulp or two
                    np.testing.assert_allclose(lv, np.float32(want["logits"]), rtol=1e-6, err_msg=f"step {step}")
                else:
                    np.testing.assert_array_equal(lv, np.float32(want["logits"]), err_msg=f"step {step}")
                tok = int(np.argmax(logits))
            else:
                tok = s.sample(logits)
                assert tok == want, f"step {step}"
            s.accept(tok)


def test_mt19937_is_std_mt19937():
    g = Mt19937(5489)
    for _ in range(9999):
        g.next_u32()
    assert g.next_u32() == 4123659995     # the C++ standard's check value


def test_provenance():
    assert DOC["provenance"]["llama.cpp"].startswith("0c1e570")


SAMPLED = json.loads((Path(__file__).parent / "data" / "smollm2-135m.sampled.json").read_text())


@pytest.mark.model
@pytest.mark.parametrize("case", SAMPLED["cases"], ids=lambda c: " ".join(c["flags"]) or "default")
def test_seeded_runs_give_llama_cpps_text(case):
    """SmolLM2's logits are llama.cpp's bit for bit and the chain draws as llama.cpp's: with the same seed and
    sampler flags `pi2 run` writes llama-completion's text (tests/data/smollm2-135m.sampled.json)."""
    from clirun import cli
    from conftest import model_file
    res = cli("run", model_file("smollm2-135m"), "-p", SAMPLED["prompt"], "-n", SAMPLED["n_predict"], "-s",
              SAMPLED["seed"], "-t", "1", "-c", "256", *case["flags"], timeout=300)
    assert res.code == 0, res.err
    assert res.out.rstrip("\n") == case["text"]
