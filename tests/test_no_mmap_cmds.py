"""test_no_mmap_cmds.py — --no-mmap beyond pi2 run: pi2 perplexity and pi2 serve (--no-mmap, -lm none), pi2 bench's
load-mode lists (-lm mmap,none, -mmp 0,1 / --mmap 0 as earlier llama-bench spells it, --no-mmap) and the Python API
(pi2.load(path, no_mmap=True)): each reads the model into memory (a later write to the file does not reach the
weights) and computes what a mapped run computes; refused with one line where the FFN streams."""
import json
import shutil

import numpy as np
import pytest

import pi2
from clirun import assert_error, cli
from fixtures import TEXT, write_model
from pi2.model.loader import load_model
from pi2.runtime import bench
from pi2.runtime import session as session_mod
from servefix import LiveServer
from test_no_mmap import scribble


@pytest.fixture(scope="module")
def path(tmp_path_factory):
    return write_model(tmp_path_factory.mktemp("no_mmap_cmds") / "m.gguf")


@pytest.fixture(scope="module")
def text(tmp_path_factory):
    p = tmp_path_factory.mktemp("ppl") / "t.txt"
    p.write_text(TEXT * 2)
    return p


def test_api_no_mmap_reads_the_model(path, tmp_path):
    p = tmp_path / "copy.gguf"
    shutil.copy(path, p)
    # repack=False: a repacked matrix is a copy either way; the mapped model then reads the file's pages
    mem, mapped = pi2.load(p, no_mmap=True, n_ctx=64, repack=False), pi2.load(p, n_ctx=64, repack=False)
    ids = [3, 17, 42, 99, 7, 256, 300, 11]
    logits = lambda m: m.sequence().session.ctx.decode(ids)  # noqa: E731
    want = logits(mem)
    assert np.array_equal(logits(mapped), want)
    assert mem.generate(ids, max_tokens=8, temp=0).text == mapped.generate(ids, max_tokens=8, temp=0).text
    scribble(p, load_model(p))
    assert np.array_equal(logits(mem), want)            # the weights were read at load
    assert not np.array_equal(logits(mapped), want)     # a mapping sees the file as it is now


def test_perplexity_no_mmap(path, text):
    want = cli("perplexity", path, "-f", text, "-c", "64")
    assert want.code == 0, want.err
    for flags in (["--no-mmap"], ["-lm", "none"], ["-lm", "dio"]):
        res = cli("perplexity", path, "-f", text, "-c", "64", *flags)
        assert res.code == 0 and res.out == want.out, (flags, res.err)
    res = cli("perplexity", path, "-f", text, "-c", "64", "-lm", "mlock")
    assert res.code == 0 and "--mlock not applied" in res.err
    assert_error(cli("perplexity", path, "-f", text, "-lm", "disk"), 2, "-lm")


def test_perplexity_really_reads(path, text, monkeypatch):
    seen = []
    real = session_mod.open_session
    monkeypatch.setattr("pi2.cli.commands.open_session", lambda m, cfg: seen.append(cfg.no_mmap) or real(m, cfg))
    assert cli("perplexity", path, "-f", text, "-c", "64", "--no-mmap").code == 0
    assert cli("perplexity", path, "-f", text, "-c", "64").code == 0
    assert seen == [True, False]


def test_bench_load_mode_lists(path):
    for flags, modes in ((["-mmp", "0,1"], ["none", "mmap"]), (["--mmap", "0"], ["none"]),
                         (["-lm", "mmap,none"], ["mmap", "none"]), (["--no-mmap"], ["none"]),
                         (["-lm", "auto", "-lm", "dio"], ["mmap", "none"]), ([], ["mmap"])):
        res = cli("bench", path, "-p", "8", "-n", "0", "-r", "1", "-t", "1", "-o", "jsonl", *flags)
        assert res.code == 0, (flags, res.err)
        assert [json.loads(line)["load_mode"] for line in res.out.splitlines()] == modes, flags
    md = cli("bench", path, "-p", "8", "-n", "0", "-r", "1", "-t", "1", "-mmp", "0")
    assert md.code == 0 and "|         lm |" in md.out and "|       none |" in md.out
    assert "| lm" not in cli("bench", path, "-p", "8", "-n", "0", "-r", "1", "-t", "1").out


def test_bench_opens_each_mode(path, monkeypatch):
    seen = []
    real = bench.open_session
    monkeypatch.setattr(bench, "open_session", lambda m, cfg: seen.append(cfg.no_mmap) or real(m, cfg))
    assert cli("bench", path, "-p", "8", "-n", "0", "-r", "1", "-t", "1", "-mmp", "1,0").code == 0
    assert seen == [False, True]


@pytest.mark.parametrize("flags, match", [(["-mmp", "2"], "-mmp"), (["--mmap", "yes"], "-mmp"),
                                          (["-lm", "mlock"], "pi2 run"), (["-lm", "x"], "-lm")])
def test_bench_bad_load_modes(path, flags, match):
    assert_error(cli("bench", path, "-p", "8", "-n", "0", "-r", "1", *flags), 2, match)


def test_serve_no_mmap(path):
    server = LiveServer(path, "-c", "64", "--no-mmap")
    try:
        body = json.dumps({"prompt": "hello", "max_tokens": 4, "temperature": 0}).encode()
        import urllib.request
        req = urllib.request.Request(server.url + "/v1/completions", body, {"Content-Type": "application/json"})
        with urllib.request.urlopen(req, timeout=60) as r:
            got = json.loads(r.read())["choices"][0]["text"]
    finally:
        server.stop()
    want = pi2.load(path, n_ctx=64).generate("hello", max_tokens=4, temp=0).text
    assert got == want


def test_no_mmap_refused_where_the_ffn_streams(tmp_path, path, text):
    from pi2file import convert_pi2
    pf = convert_pi2(path, tmp_path / "m.pi2.gguf", default_keep=0.5)
    for cmd in (["run", pf, "-p", "hi", "-n", "1"], ["perplexity", pf, "-f", text, "-c", "64"],
                ["bench", pf, "-p", "8", "-n", "0"]):
        res = cli(*cmd, "--no-mmap", "--memory-budget", "1G")
        assert_error(res, 2, "--no-mmap")
    res = cli("serve", pf, "--port", "0", "--no-mmap", "--memory-budget", "1G")
    assert_error(res, 2, "--no-mmap")
