"""hub.py — GGUF models from Hugging Face: `pi2 pull REPO[:QUANT|/FILE]` and `-hf` (as llama.cpp's -hf).

Owns: reading a reference (user/repo, user/repo:Q4_K_M, user/repo/file.gguf), choosing the GGUF a quant tag names
(a split GGUF's parts all together), the download (resumed from the `.incomplete` file an interrupted one left,
a progress bar, the hub's SHA-256 checked before the file is kept) into the hub's shared cache layout
(HF_HUB_CACHE/models--user--repo/{blobs,snapshots,refs}), and the one-line errors of an unknown repository, a
missing quant or no network (a file already cached is then used). huggingface_hub gives the repository's
listing, the cache's place and names, the endpoint (HF_ENDPOINT) and the token (HF_TOKEN); the transfer itself is
plain HTTP with Range requests so that it resumes with any huggingface_hub version.
"""
from __future__ import annotations

import fcntl
import hashlib
import http.client
import os
import re
import sys
import urllib.error
import urllib.parse
import urllib.request
from pathlib import Path
from typing import List, Optional, Tuple

from tqdm import tqdm

from pi2.errors import Pi2Error, UsageError

DEFAULT_QUANTS = ("Q4_K_M", "Q4_0", "Q8_0")      # llama.cpp's -hf picks Q4_K_M when no tag is given
_SPLIT = re.compile(r"-(\d{5})-of-(\d{5})\.gguf$", re.IGNORECASE)
_CHUNK = 1 << 20


class HubError(Pi2Error):
    """An unknown repository or file, no network, or a download that failed its checksum."""


def _hub():
    """huggingface_hub's API, its constants (endpoint, cache, offline) and its file naming."""
    try:
        from huggingface_hub import HfApi, constants, file_download, hf_hub_url, utils
    except ImportError:
        raise Pi2Error("pi2 pull needs huggingface_hub, which is not installed",
                       hint="pip install 'pi2[hub]'") from None
    return HfApi, constants, file_download, hf_hub_url, utils


def parse_ref(ref: str) -> Tuple[str, Optional[str], Optional[str]]:
    """(repo_id, quant tag, file) of REPO[:QUANT] or REPO/FILE."""
    ref = ref.strip()
    m = re.fullmatch(r"([\w.\-]+)/([\w.\-]+)(?::([\w.\-]+))?(?:/(.+\.gguf))?", ref, re.IGNORECASE)
    if not m or (m.group(3) and m.group(4)):
        raise UsageError(f"invalid model reference {ref!r}",
                         hint="write USER/REPO, USER/REPO:QUANT (e.g. :Q4_K_M) or USER/REPO/FILE.gguf")
    return f"{m.group(1)}/{m.group(2)}", m.group(3), m.group(4)


def _split_group(name: str) -> Optional[Tuple[str, int, int]]:
    m = _SPLIT.search(name)
    return (name[:m.start()], int(m.group(1)), int(m.group(2))) if m else None


def choose_files(files: List[str], repo: str, quant: Optional[str] = None, file: Optional[str] = None) -> List[str]:
    """The files to fetch: the one named, or the GGUF the quant tag names (default Q4_K_M, else the first); every
    part of a split GGUF, in order."""
    ggufs = sorted(f for f in files if f.lower().endswith(".gguf") and "mmproj" not in f.lower())
    if file is not None:
        if file not in files:
            raise HubError(f"{repo} has no file {file}")
        chosen = file
    else:
        if not ggufs:
            raise HubError(f"{repo} has no GGUF file")
        tags = [quant] if quant else list(DEFAULT_QUANTS)
        chosen = None
        for tag in tags:
            pat = re.compile(rf"(^|[\-_./]){re.escape(tag)}([\-_.]|$)", re.IGNORECASE)
            hits = [f for f in ggufs if pat.search(f)]
            if hits:
                chosen = hits[0]
                break
        if chosen is None:
            if quant:
                have = sorted({m.group(0) for f in ggufs
                               for m in [re.search(r"(?i)(IQ\d\w*|Q\d\w*|BF16|F16|F32)(?=[\-.]|$)",
                                                   _split_group(f)[0] + ".gguf" if _split_group(f) else f)] if m})
                raise HubError(f"{repo} has no {quant} GGUF", hint=f"it has: {', '.join(have) or ', '.join(ggufs)}")
            chosen = ggufs[0]
    split = _split_group(chosen)
    if split is None:
        return [chosen]
    stem, _, n = split
    parts = [f"{stem}-{i:05d}-of-{n:05d}.gguf" for i in range(1, n + 1)]
    missing = [p for p in parts if p not in files]
    if missing:
        raise HubError(f"{repo}: the split GGUF {parts[0]} lacks {len(missing)} of its {n} parts")
    return parts


def _storage(constants, file_download, repo: str, cache_dir: Optional[str]) -> Path:
    return Path(cache_dir or constants.HF_HUB_CACHE) / file_download.repo_folder_name(repo_id=repo, repo_type="model")


def _cached(storage: Path, revision: str, quant, file) -> Optional[str]:
    """The cached file for an offline run: the snapshot that refs/<revision> names, chosen as online."""
    ref = storage / "refs" / revision
    commit = ref.read_text().strip() if ref.is_file() else revision
    snap = storage / "snapshots" / commit
    if not snap.is_dir():
        return None
    files = [str(p.relative_to(snap)) for p in snap.rglob("*") if p.is_file()]
    try:
        parts = choose_files(files, "", quant, file)
    except HubError:
        return None
    return str(snap / parts[0])


def _digest(path: Path, algo: str, size: int):
    """SHA-256 of an LFS file, or the git blob id (SHA-1 of "blob SIZE\\0" and the bytes) of a plain one."""
    h = hashlib.sha256() if algo == "sha256" else hashlib.sha1(b"blob %d\0" % size)
    with open(path, "rb") as f:
        while True:
            b = f.read(_CHUNK)
            if not b:
                return h
            h.update(b)


def _download(url: str, headers: dict, part: Path, size: Optional[int], name: str, progress: bool) -> None:
    """Append the rest of `url` to `part`, resuming from its length."""
    have = part.stat().st_size if part.exists() else 0
    if size is not None and have > size:
        part.unlink()
        have = 0
    req = urllib.request.Request(url, headers={**headers, **({"Range": f"bytes={have}-"} if have else {})})
    try:
        resp = urllib.request.urlopen(req, timeout=60)
    except urllib.error.HTTPError as e:
        if e.code == 416 and have and have == size:      # complete already
            return
        raise
    with resp:
        if have and resp.status != 206:      # the server ignored Range: start over
            part.unlink()
            have = 0
        with open(part, "ab") as f, tqdm(total=size, initial=have, unit="B", unit_scale=True, unit_divisor=1024,
                                         desc=name, file=sys.stderr, disable=not progress, leave=True) as bar:
            while True:
                b = resp.read(_CHUNK)
                if not b:
                    break
                f.write(b)
                bar.update(len(b))
            if size is not None and f.tell() < size:     # the connection closed early
                raise http.client.IncompleteRead(b"", size - f.tell())


def _fetch(storage: Path, commit: str, sib, url: str, headers: dict, progress: bool) -> Path:
    """One file into blobs/ (verified) and its snapshot link; the snapshot path."""
    name = sib.rfilename
    lfs = sib.lfs
    algo, want = ("sha256", lfs.sha256 if hasattr(lfs, "sha256") else lfs["sha256"]) if lfs else ("sha1", sib.blob_id)
    size = (lfs.size if hasattr(lfs, "size") else lfs["size"]) if lfs else sib.size
    if not want:
        raise HubError(f"the hub gives no checksum for {name}")
    blob = storage / "blobs" / want
    link = storage / "snapshots" / commit / name
    if not blob.exists():
        blob.parent.mkdir(parents=True, exist_ok=True)
        part = blob.with_name(want + ".incomplete")
        with open(str(blob) + ".lock", "w") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)     # another pull of the same file waits, then finds it
            if not blob.exists():
                try:
                    _download(url, headers, part, size, name, progress)
                except (urllib.error.URLError, http.client.HTTPException, OSError) as e:
                    got = part.stat().st_size if part.exists() else 0
                    raise HubError(f"the download of {name} was interrupted at {got} of {size or '?'} bytes: "
                                   f"{getattr(e, 'reason', e)}", hint="run the same command again to resume") from None
                got_size = part.stat().st_size
                digest = _digest(part, algo, got_size).hexdigest()
                if digest != want or (size is not None and got_size != size):
                    part.unlink()
                    raise HubError(f"{name}: checksum mismatch ({algo} {digest[:16]}…, the hub says {want[:16]}…); "
                                   f"the download was deleted")
                os.replace(part, blob)
    link.parent.mkdir(parents=True, exist_ok=True)
    if not link.exists():
        try:
            os.symlink(os.path.relpath(blob, link.parent), link)
        except OSError:         # no symlinks here (some Android storage): the snapshot holds the file itself
            os.replace(blob, link)
    return link


def pull(ref: str, revision: Optional[str] = None, progress: bool = True, cache_dir: Optional[str] = None) -> str:
    """Download the GGUF `ref` names (unless cached) and return the path of its file (a split GGUF's first part)."""
    HfApi, constants, file_download, hf_hub_url, utils = _hub()
    repo, quant, file = parse_ref(ref)
    rev = revision or "main"
    storage = _storage(constants, file_download, repo, cache_dir)
    if constants.HF_HUB_OFFLINE:
        hit = _cached(storage, rev, quant, file)
        if hit is None:
            raise HubError(f"{ref} is not in the cache and HF_HUB_OFFLINE is set")
        return hit
    try:
        info = HfApi().model_info(repo, revision=rev, files_metadata=True)
    except Exception as e:     # noqa: BLE001 — the hub's errors and the network's
        kind = type(e).__name__
        if kind in ("RepositoryNotFoundError", "GatedRepoError"):
            raise HubError(f"no repository {repo} on {constants.ENDPOINT} (or it is private or gated)",
                           hint="check the name; set HF_TOKEN for a private or gated one") from None
        if kind == "RevisionNotFoundError":
            raise HubError(f"{repo} has no revision {rev}") from None
        hit = _cached(storage, rev, quant, file)
        if hit is not None:
            print(f"pi2: note: {constants.ENDPOINT} unreachable; using the cached {Path(hit).name}", file=sys.stderr)
            return hit
        raise HubError(f"cannot reach {constants.ENDPOINT} ({kind}: {str(e).splitlines()[0] if str(e) else ''})",
                       hint="check the network, or set HF_HUB_OFFLINE=1 to use cached models") from None
    sibs = {s.rfilename: s for s in info.siblings or []}
    parts = choose_files(list(sibs), repo, quant, file)
    commit = info.sha or rev
    headers = utils.build_hf_headers()
    paths = [_fetch(storage, commit, sibs[p], hf_hub_url(repo, p, revision=commit), headers, progress)
             for p in parts]
    if revision is None or revision != commit:
        (storage / "refs").mkdir(parents=True, exist_ok=True)
        (storage / "refs" / rev).write_text(commit)
    return str(paths[0])
