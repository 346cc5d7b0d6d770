"""pagecache.py — which pages of a file are in the page cache (mincore(2) on a fresh mapping), for the tests that
check streamed ranges stay out of it, and the clean on-disk copy of a pi2 file those tests start from."""
from __future__ import annotations

import os


def resident_pages(path, start: int, end: int) -> int:
    """Pages of path's [start, end) (4 KiB-aligned) in the page cache, by mincore(2) on a fresh mapping."""
    import ctypes
    import mmap
    libc = ctypes.CDLL(None, use_errno=True)
    libc.mmap.restype = ctypes.c_void_p
    libc.mmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int, ctypes.c_int, ctypes.c_int, ctypes.c_long]
    libc.mincore.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_char_p]
    libc.munmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t]
    fd = os.open(path, os.O_RDONLY)
    try:
        n = end - start
        addr = libc.mmap(None, n, mmap.PROT_READ, mmap.MAP_SHARED, fd, start)
        vec = ctypes.create_string_buffer(n // 4096)
        assert libc.mincore(addr, n, vec) == 0, ctypes.get_errno()
        libc.munmap(addr, n)
        return sum(b & 1 for b in vec.raw)
    finally:
        os.close(fd)


def cold_copy(src, tmp_path, tensor: str):
    """A copy of pi2 file src in tmp_path whose pages are clean (fsync), loaded, with the 4 KiB pages wholly inside
    each layer's `blk.L.<tensor>.weight`: (path, model, [(start, end)] per layer). Skips on tmpfs, where the page
    cache is the file."""
    import shutil
    import subprocess

    import pytest

    from pi2.model.loader import load_model
    if subprocess.run(["stat", "-f", "-c", "%T", str(tmp_path)], capture_output=True, text=True).stdout.strip() in (
            "tmpfs", "ramfs"):
        pytest.skip("on tmpfs the page cache is the file")
    p = tmp_path / "cold.pi2.gguf"
    shutil.copy(src, p)
    fd = os.open(p, os.O_RDONLY)
    os.fsync(fd)                                           # clean pages, so that they can be dropped
    os.close(fd)
    m = load_model(p)
    ranges = []
    for il in range(m.config.n_layer):
        t = m.tensor(f"blk.{il}.{tensor}.weight")
        ranges.append((-(-t.offset // 4096) * 4096, (t.offset + t.nbytes) // 4096 * 4096))
    return p, m, ranges
