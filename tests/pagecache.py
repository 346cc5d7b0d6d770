"""pagecache.py — which pages of a file are in the page cache (mincore(2) on a fresh mapping), for the tests that
check streamed ranges stay out of it."""
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
