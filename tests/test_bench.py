"""test_bench.py — `pi2 bench` on tiny fixtures: llama-bench's markdown columns, JSON / JSONL / CSV fields,
skipped tests, thread lists and ranges, llama-bench's model names, and exit status 2 for bad flags."""
from __future__ import annotations

import csv
import io
import json
import re

import pytest
from clirun import assert_error, cli
from fixtures import write_model

from pi2.runtime import bench
from pi2.runtime import bench_report
from pi2.errors import UsageError

LLAMA_FIELDS = ("build_commit", "cpu_info", "model_filename", "model_type", "model_size", "model_n_params",
                "n_batch", "n_threads", "n_prompt", "n_gen", "test_time", "avg_ns", "stddev_ns", "avg_ts",
                "stddev_ts")
MD_HEADER = ("| model                          |       size |     params | backend    | threads |"
             "            test |                  t/s |")
ROW = re.compile(r"^\| (?P<model>.{30}) \| +(?P<size>\d+\.\d\d [MG]iB) \| +(?P<params>\d+\.\d\d [MB]) \| "
                 r"CPU {8}\| +(?P<threads>\d+) \|(?: (?P<extra>[^|]+) \|)? +(?P<test>\S+) \| +"
                 r"(?P<ts>\d+\.\d\d) ± (?P<sd>\d+\.\d\d) \|$")
FAST = ("-p", "16", "-n", "8", "-r", "2")


@pytest.fixture(scope="module")
def model(tmp_path_factory):
    return write_model(tmp_path_factory.mktemp("bench") / "tiny.gguf", n_layer=1, n_embd=32, n_ff=64)


def rows(out: str) -> list:
    return [m.groupdict() for m in map(ROW.match, out.splitlines()) if m]


def records(res, fmt: str) -> list:
    assert res.code == 0, res.err
    if fmt == "json":
        return json.loads(res.out)
    if fmt == "jsonl":
        return [json.loads(line) for line in res.out.splitlines()]
    return list(csv.DictReader(io.StringIO(res.out)))


def test_markdown_table(model):
    res = cli("bench", "-m", model, *FAST, "-t", "1", "-o", "md")
    assert res.code == 0, res.err
    lines = res.out.splitlines()
    assert lines[0] == MD_HEADER
    assert lines[1] == ("| ------------------------------ | ---------: | ---------: | ---------- | ------: |"
                        " --------------: | -------------------: |")
    got = rows(res.out)
    assert [r["test"] for r in got] == ["pp16", "tg8"]
    assert all(r["model"].rstrip() == "llama ?B Q8_0" and r["threads"] == "1" and r["extra"] is None for r in got)
    assert all(float(r["ts"]) > 0 for r in got)
    assert re.fullmatch(r"build: \S+ \(pi2 \d+\.\d+\.\d+\S*\)", lines[-1]), lines[-1]
    assert lines[-2] == ""
    assert len(lines) == 2 + len(got) + 2
    assert "pi2 bench:" in res.err            # diagnostics on stderr only


@pytest.mark.parametrize("fmt", ["json", "jsonl", "csv"])
def test_records(model, fmt):
    recs = records(cli("bench", "-m", model, *FAST, "-t", "1", "-o", fmt), fmt)
    assert len(recs) == 2
    for r in recs:
        for k in LLAMA_FIELDS + ("pi2_engine", "pi2_peak_rss"):
            assert k in r, k
        assert r["model_type"] == "llama ?B Q8_0"
        assert int(r["n_threads"]) == 1 and int(r["n_batch"]) == 2048
        assert int(r["pi2_peak_rss"]) > 1 << 20
        assert r["pi2_engine"] in ("reference", "c")
        assert float(r["avg_ts"]) > 0 and float(r["stddev_ts"]) >= 0 and int(r["avg_ns"]) > 0
    assert [(int(r["n_prompt"]), int(r["n_gen"])) for r in recs] == [(16, 0), (0, 8)]
    if fmt != "csv":
        for r in recs:
            n_tok = r["n_prompt"] + r["n_gen"]
            assert len(r["samples_ns"]) == len(r["samples_ts"]) == 2
            assert r["samples_ts"] == pytest.approx([1e9 * n_tok / ns for ns in r["samples_ns"]], rel=1e-3)
            assert r["avg_ts"] == pytest.approx(sum(r["samples_ts"]) / 2, rel=1e-3)
    else:
        assert "samples_ns" not in recs[0]


def test_skips_and_pg(model):
    res = cli("bench", "-m", model, "-p", "0", "-n", "4", "-r", "1", "-t", "1")
    assert [r["test"] for r in rows(res.out)] == ["tg4"]
    res = cli("bench", "-m", model, "-p", "8", "-n", "0", "-pg", "8,4", "-r", "1", "-t", "1", "--no-warmup")
    assert [r["test"] for r in rows(res.out)] == ["pp8", "pp8+tg4"]
    res = cli("bench", "-m", model, "-p", "4,8", "-n", "0", "-b", "3", "-r", "1", "-t", "1", "-o", "jsonl")
    recs = records(res, "jsonl")
    assert [(r["n_prompt"], r["n_batch"]) for r in recs] == [(4, 3), (8, 3)]


def test_thread_lists_expand(model):
    res = cli("bench", "-m", model, "-p", "4", "-n", "2", "-r", "1", "-t", "1,2", "-t", "3")
    got = rows(res.out)
    assert [(r["threads"], r["test"]) for r in got] == [("1", "pp4"), ("1", "tg2"), ("2", "pp4"), ("2", "tg2"),
                                                        ("3", "pp4"), ("3", "tg2")]
    recs = records(cli("bench", "-m", model, "-p", "0", "-n", "2", "-r", "1", "-t", "1-4*2", "-o", "jsonl"), "jsonl")
    assert [r["n_threads"] for r in recs] == [1, 2, 4]


def test_engine_column_and_models(model, tmp_path):
    q2 = write_model(tmp_path / "q.gguf", arch="qwen2", wtype="Q4_0", n_layer=1, n_embd=32, n_ff=64)
    res = cli("bench", "-m", model, "-m", q2, "-p", "4", "-n", "0", "-r", "1", "-t", "1", "--engine", "reference")
    assert res.code == 0, res.err
    assert "| engine     |" in res.out.splitlines()[0]
    got = rows(res.out)
    assert [(r["model"].rstrip(), r["extra"].strip()) for r in got] == [("llama ?B Q8_0", "reference"),
                                                                        ("qwen2 ?B Q4_0", "reference")]


@pytest.mark.parametrize("args, match", [
    (("-p", "x"), "-p"), (("-n", "-1"), "-n"), (("-t", "0"), "-t"), (("-t", "4-2+0"), "-t"),
    (("-t", "1,,2"), "-t"), (("-r", "0"), "-r"), (("-o", "sql"), "output"), (("-pg", "8"), "-pg"),
    (("-b", "0"), "-b"), (("--engine", "gpu"), "engine"), (("-p", "0", "-n", "0"), "nothing to run"),
])
def test_bad_values_exit_2(model, args, match):
    assert_error(cli("bench", "-m", model, *args), code=2, match=match)


def test_no_model_and_unknown_flag():
    assert_error(cli("bench", "-p", "4"), code=2, match="no model")
    assert cli("bench", "--bogus").code == 2


def test_parse_int_range_like_llama_bench():
    assert bench.parse_int_range("1,2,4", "-t") == [1, 2, 4]
    assert bench.parse_int_range("1-4", "-t") == [1, 2, 3, 4]
    assert bench.parse_int_range("1-16*2", "-t") == [1, 2, 4, 8, 16]
    assert bench.parse_int_range("2-10+4,32", "-p") == [2, 6, 10, 32]
    for bad in ("", "a", "1-", "1-3*1", "-1"):
        with pytest.raises(UsageError):
            bench.parse_int_range(bad, "-t")


def test_stats_are_sample_stddev():
    s = bench_report.summarize([1_000_000_000, 2_000_000_000], 10)
    assert s["samples_ts"] == [10.0, 5.0] and s["avg_ts"] == 7.5
    assert s["stddev_ts"] == pytest.approx(3.535534, abs=1e-6)
    assert bench_report.summarize([5], 1)["stddev_ns"] == 0


def test_ftype_guess_like_llama_cpp():
    class T:
        def __init__(self, t):
            self.type_name = t
    tensors = {"token_embd.weight": T("Q6_K"), "blk.0.attn_q.weight": T("Q4_K"), "blk.0.ffn_down.weight": T("Q6_K"),
               "blk.1.attn_q.weight": T("Q4_K")}
    assert bench_report.ftype_name({}, tensors) == "(guessed) Q6_K"    # Q6_K reaches 2 first
    assert bench_report.ftype_name({"general.file_type": 15}, tensors) == "Q4_K - Medium"


def test_missing_model_prints_nothing(model, tmp_path):
    assert_error(cli("bench", "-m", tmp_path / "nope.gguf", "-p", "4", "-n", "0", "-r", "1"), code=1)
    res = cli("bench", "-m", model, "-m", tmp_path / "nope.gguf", "-p", "4", "-n", "0", "-r", "1", "-t", "1",
              "-o", "json")
    assert res.code == 1 and "pi2: error:" in res.err
    assert [r["n_prompt"] for r in json.loads(res.out)] == [4]    # the first model's results, a closed array


def test_each_row_is_printed_when_its_test_finishes(model, monkeypatch):
    """As llama-bench: the pp row is on stdout before the tg test starts (not all rows at the end)."""
    import sys
    seen = []
    real = bench._Runner.warmup

    def warmup(self, t):
        seen.append((t.name, len(rows(sys.stdout.buffer.getvalue().decode()))))
        return real(self, t)
    monkeypatch.setattr(bench._Runner, "warmup", warmup)
    res = cli("bench", model, *FAST)
    assert res.code == 0, res.err
    assert seen == [("pp16", 0), ("tg8", 1)] and len(rows(res.out)) == 2
