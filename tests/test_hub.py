"""test_hub.py — `pi2 pull` and `-hf` against a local stand-in for the Hugging Face hub (tests/hubstandin.py, at
HF_ENDPOINT): quant tags, explicit files, split GGUFs, the hub's cache layout, resume after an interrupted
download, a checksum mismatch refused, unknown repositories and no network as one line; `pi2 run -hf` on a real
model served by the stand-in."""
from __future__ import annotations

import hashlib
import os
import subprocess
import sys
from pathlib import Path

import pytest

from conftest import model_file
from hubstandin import COMMIT, Hub
from pi2.errors import UsageError
from pi2.hub import HubError, choose_files, parse_ref

pytest.importorskip("huggingface_hub")

BIG = os.urandom(3 << 20)        # three MiB: several reads, a cut in the middle
FILES = {"README.md": b"# test\n", "tiny-Q4_K_M.gguf": BIG, "tiny-Q8_0.gguf": b"GGUF" + os.urandom(5000),
         "tiny-F16.gguf": b"GGUF" + os.urandom(7000)}
SPLIT = {f"big-Q4_K_M-0000{i}-of-00003.gguf": b"GGUF" + os.urandom(3000 + i) for i in (1, 2, 3)}


def pull(hub_url: str, cache: Path, *args, env=None):
    e = {**os.environ, "HF_ENDPOINT": hub_url, "HF_HUB_CACHE": str(cache), "HF_HUB_DISABLE_TELEMETRY": "1",
         "HF_HUB_OFFLINE": "0", **(env or {})}
    e.pop("HF_TOKEN", None)
    return subprocess.run([sys.executable, "-m", "pi2", *args], capture_output=True, text=True, env=e, timeout=120)


def one_line_error(r) -> str:
    assert r.returncode == 1, r.stderr
    lines = [ln for ln in r.stderr.splitlines() if ln.startswith("pi2: error:")]
    assert len(lines) == 1 and "Traceback" not in r.stderr, r.stderr
    return lines[0]


@pytest.fixture
def hub():
    with Hub({"test/tiny": dict(FILES), "test/split": dict(SPLIT)}) as h:
        yield h


def test_parse_ref():
    assert parse_ref("u/r") == ("u/r", None, None)
    assert parse_ref("u/r:Q4_K_M") == ("u/r", "Q4_K_M", None)
    assert parse_ref("u/r/sub/x-q8_0.gguf") == ("u/r", None, "sub/x-q8_0.gguf")
    for bad in ("nope", "u/r:Q4:x", "u/r/notgguf.bin", "u/r:Q4_K_M/x.gguf"):
        with pytest.raises(UsageError):
            parse_ref(bad)


def test_choose_files_quant_tags():
    files = list(FILES) + list(SPLIT) + ["mmproj-Q8_0.gguf", "Q5_K_M/m-Q5_K_M.gguf"]
    assert choose_files(files, "r", "Q8_0") == ["tiny-Q8_0.gguf"]
    assert choose_files(files, "r", "q8_0") == ["tiny-Q8_0.gguf"]            # tags ignore case, mmproj skipped
    assert choose_files(files, "r", "f16") == ["tiny-F16.gguf"]
    assert choose_files(files, "r", "Q5_K_M") == ["Q5_K_M/m-Q5_K_M.gguf"]
    assert choose_files(list(FILES), "r") == ["tiny-Q4_K_M.gguf"]            # no tag: Q4_K_M
    assert choose_files(["a-Q6_K.gguf", "b-Q2_K.gguf"], "r") == ["a-Q6_K.gguf"]   # else the first
    assert choose_files(list(SPLIT), "r", "Q4_K_M") == sorted(SPLIT)         # every part, in order
    with pytest.raises(HubError, match="no Q3_K_S"):
        choose_files(files, "r", "Q3_K_S")
    with pytest.raises(HubError, match="lacks 1 of its 3 parts"):
        choose_files(sorted(SPLIT)[:2], "r", "Q4_K_M")
    with pytest.raises(HubError, match="no GGUF"):
        choose_files(["README.md"], "r")


def test_pull_quant_tag_into_the_hub_cache(hub, tmp_path):
    r = pull(hub.url, tmp_path, "pull", "test/tiny:Q8_0")
    assert r.returncode == 0, r.stderr
    path = Path(r.stdout.strip())
    storage = tmp_path / "models--test--tiny"
    assert path == storage / "snapshots" / COMMIT / "tiny-Q8_0.gguf"
    assert path.read_bytes() == FILES["tiny-Q8_0.gguf"]
    assert path.is_symlink() and path.resolve().parent == (storage / "blobs").resolve()
    assert path.resolve().name == hashlib.sha256(FILES["tiny-Q8_0.gguf"]).hexdigest()
    assert (storage / "refs" / "main").read_text() == COMMIT
    n = len(hub.ranges)
    r2 = pull(hub.url, tmp_path, "pull", "test/tiny/tiny-Q8_0.gguf")   # cached: the same path, nothing fetched
    assert r2.returncode == 0 and Path(r2.stdout.strip()) == path and len(hub.ranges) == n
    r3 = pull(hub.url, tmp_path, "pull", "test/tiny")                  # no tag: Q4_K_M
    assert Path(r3.stdout.strip()).name == "tiny-Q4_K_M.gguf"


def test_pull_resumes_an_interrupted_download(hub, tmp_path):
    hub.cut["tiny-Q4_K_M.gguf"] = 1 << 20
    err = one_line_error(pull(hub.url, tmp_path, "pull", "test/tiny:Q4_K_M"))
    assert "interrupted" in err
    sha = hashlib.sha256(BIG).hexdigest()
    part = tmp_path / "models--test--tiny" / "blobs" / f"{sha}.incomplete"
    assert part.stat().st_size == 1 << 20
    r = pull(hub.url, tmp_path, "pull", "test/tiny:Q4_K_M")
    assert r.returncode == 0, r.stderr
    assert hub.ranges[-1] == ("tiny-Q4_K_M.gguf", f"bytes={1 << 20}-")   # only the rest was asked for
    assert Path(r.stdout.strip()).read_bytes() == BIG and not part.exists()


def test_pull_refuses_a_checksum_mismatch(hub, tmp_path):
    hub.bad_sha.add("tiny-Q8_0.gguf")
    err = one_line_error(pull(hub.url, tmp_path, "pull", "test/tiny:Q8_0"))
    assert "checksum mismatch" in err
    storage = tmp_path / "models--test--tiny"
    assert not list((storage / "blobs").glob("*[0-9a-f]")) and not list((storage / "blobs").glob("*.incomplete"))
    assert not (storage / "snapshots").exists()


def test_pull_fetches_a_split_gguf_whole(hub, tmp_path):
    r = pull(hub.url, tmp_path, "pull", "test/split:Q4_K_M")
    assert r.returncode == 0, r.stderr
    first = Path(r.stdout.strip())
    assert first.name == "big-Q4_K_M-00001-of-00003.gguf"
    for name, data in SPLIT.items():
        assert (first.parent / name).read_bytes() == data


def test_pull_errors_are_one_line(hub, tmp_path):
    assert "no repository test/nope" in one_line_error(pull(hub.url, tmp_path, "pull", "test/nope"))
    assert "has no Q2_K GGUF" in one_line_error(pull(hub.url, tmp_path, "pull", "test/tiny:Q2_K"))
    assert "has no file" in one_line_error(pull(hub.url, tmp_path, "pull", "test/tiny/other.gguf"))
    r = pull(hub.url, tmp_path, "pull", "not a repo")
    assert r.returncode == 2 and "invalid model reference" in r.stderr


def test_pull_offline(hub, tmp_path):
    dead = "http://127.0.0.1:9"       # the discard port: nothing listens
    assert "cannot reach http://127.0.0.1:9" in one_line_error(pull(dead, tmp_path, "pull", "test/tiny:Q8_0"))
    assert pull(hub.url, tmp_path, "pull", "test/tiny:Q8_0").returncode == 0
    r = pull(dead, tmp_path, "pull", "test/tiny:Q8_0")                 # cached: used, with a note
    assert r.returncode == 0 and r.stdout.strip().endswith("tiny-Q8_0.gguf") and "unreachable" in r.stderr
    r = pull(dead, tmp_path, "pull", "test/tiny:Q8_0", env={"HF_HUB_OFFLINE": "1"})
    assert r.returncode == 0 and r.stdout.strip().endswith("tiny-Q8_0.gguf")
    assert "not in the cache" in one_line_error(pull(dead, tmp_path, "pull", "test/tiny:F16",
                                                     env={"HF_HUB_OFFLINE": "1"}))


@pytest.mark.model
def test_run_hf_downloads_then_runs(tmp_path):
    data = model_file("smollm2-135m").read_bytes()
    with Hub({"test/smol": {"SmolLM2-135M-Instruct-Q4_1.gguf": data}}) as h:
        r = pull(h.url, tmp_path, "run", "-hf", "test/smol:Q4_1", "-p", "Hello", "-n", "4", "--temp", "0",
                 "--no-display-prompt")
    assert r.returncode == 0, r.stderr
    local = subprocess.run([sys.executable, "-m", "pi2", "run", str(model_file("smollm2-135m")), "-p", "Hello",
                            "-n", "4", "--temp", "0", "--no-display-prompt"], capture_output=True, text=True)
    assert r.stdout == local.stdout and r.stdout.strip()
