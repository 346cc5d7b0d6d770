"""test_expert_profile_save.py — which commands add a streamed MoE run's routing to the file's routing profile:
`pi2 serve` at shutdown (its slots' routing added together, once; --no-expert-profile: neither learns nor saves),
and `pi2 bench` never (so each bench starts as the last did; --no-expert-profile there turns learning off: a plain
LRU). `pi2 run`'s saving is tested in tests/test_moe_stream.py.
"""
from __future__ import annotations

import json
import re
import threading
import urllib.request

import numpy as np
from clirun import cli
from moe_files import loaded_moe
from servefix import LiveServer

import pi2.plan.expert_profile as experts

_files: dict = {}
ARGS = ("-c", "256", "--memory-budget", "1G", "-t", "1")


def completion(srv: LiveServer, n: int) -> dict:
    body = {"prompt": "hello world", "max_tokens": n, "ignore_eos": True, "temperature": 0}
    req = urllib.request.Request(srv.url + "/v1/completions", data=json.dumps(body).encode(),
                                 headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=120) as r:
        return json.loads(r.read())


def test_serve_saves_the_slots_routing_at_shutdown(tmp_path_factory, tmp_path):
    path, m, _ = loaded_moe(tmp_path_factory, _files, "qwen2moe", "Q4_K_M")
    env = {"HOME": str(tmp_path)}
    prof = tmp_path / ".cache" / "pi2" / "experts" / experts.profile_path(m).name
    srv = LiveServer(path, *ARGS, "--no-expert-profile", env=env)
    assert completion(srv, 80)["usage"]["completion_tokens"] == 80
    code, err = srv.stop()
    assert code == 130 and "Traceback" not in err and not prof.exists()
    # two slots, each routing fewer tokens than a run needs to be kept (64), kept because together they do
    srv = LiveServer(path, *ARGS, "-np", "2", env=env)
    done = []
    jobs = [threading.Thread(target=lambda: done.append(completion(srv, 40))) for _ in range(2)]
    for j in jobs:
        j.start()
    for j in jobs:
        j.join()
    code, err = srv.stop()
    assert len(done) == 2 and code == 130 and "Traceback" not in err, err
    d = json.loads(prof.read_text())
    counts = np.array(d["expert_rows"])
    assert counts.shape == (m.config.n_layer, m.config.n_expert)
    assert experts.MIN_RUN_TOKENS <= d["tokens"] <= 2 * (40 + 2)     # both slots' tokens, counted once
    assert counts.sum(axis=1).max() == d["tokens"] * m.config.n_expert_used
    assert [p.name for p in prof.parent.iterdir()] == [prof.name]   # no temporary file left behind


def test_bench_never_saves(tmp_path_factory, tmp_path, monkeypatch):
    monkeypatch.setenv("HOME", str(tmp_path))
    path, m, _ = loaded_moe(tmp_path_factory, _files, "qwen2moe", "Q4_K_M")
    args = ("bench", str(path), "-p", "0", "-n", "100", "-r", "1", "-t", "1", "--memory-budget", "1G", "-o", "json")
    learned = cli(*args)
    lru = cli(*args, "--no-expert-profile")
    assert learned.code == 0 and lru.code == 0, learned.err + lru.err
    assert json.loads(learned.out)[0]["pi2_expert_hit_rate"] > 0
    assert json.loads(lru.out)[0]["pi2_experts_learned"] == 0
    assert not (tmp_path / ".cache" / "pi2" / "experts").exists()
    words = " ".join(re.sub("[│╭╮╰╯─]", " ", cli("bench", "--help").out).split())
    assert "never adds its routing to the routing profile" in words
