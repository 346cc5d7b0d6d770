# ffi_build.py — the cffi API-mode build of pi2's C core into the extension module pi2._pi2.
# Reads csrc/pi2.h (minus preprocessor lines) as the cdef and compiles every C source directly.
import os
import re
from pathlib import Path

from cffi import FFI

HERE = Path(__file__).resolve().parent

SOURCES = ["pi2.c", "kernels/traits.c", "kernels/ref.c", "kernels/x86.c", "kernels/neon.c", "kernels/axpy.c", "kernels/axpy_i8.c",
           "kernels/api.c", "kernels/pack.c", "threadpool.c", "matmul.c", "ops.c", "model.c", "model_pack.c", "context.c", "forward.c", "ffn_sparse.c", "ffn_predict.c",
           "ffn_pwri.c", "ffn_select.c", "ffn_groups.c", "kernels/lowbit.c", "cache.c", "cache_read.c", "cache_layer.c", "cache_pool.c",
           "nnapi.c", "nnapi_graph.c", "npu.c", "npu_ffn.c",
           "io/io.c", "io/uring.c", "io/aio.c", "io/pread_pool.c", "io/mmap.c", "io/bench.c", "io/probe.c", "io/map_guard.c"]


def _cdef(header: str) -> str:
    return "\n".join(line for line in header.splitlines() if not line.lstrip().startswith("#"))


# PI2_SANITIZE=address,undefined (any -fsanitize= list): an instrumented build for scripts/sanitize.sh, which loads
# the sanitizer runtime with LD_PRELOAD (python itself is not instrumented). Every report aborts the process.
SANITIZE = os.environ.get("PI2_SANITIZE", "")
SAN_FLAGS = [f"-fsanitize={SANITIZE}", "-fno-sanitize-recover=all", "-fno-omit-frame-pointer", "-g"] if SANITIZE else []

ffi = FFI()
ffi.cdef(_cdef((HERE / "pi2.h").read_text()))
ffi.set_source(
    "pi2._pi2",
    '#include "pi2.h"',
    sources=[os.path.relpath(HERE / s) for s in SOURCES],
    include_dirs=[os.path.relpath(HERE)],
    extra_compile_args=["-O3", "-std=c11", "-ffp-contract=off", "-Wall", "-Wno-unused-function", "-pthread"] + SAN_FLAGS,
    extra_link_args=["-pthread"] + SAN_FLAGS,
    libraries=["m", "dl"],   # dl: nnapi.c opens libneuralnetworks.so at run time
)

if __name__ == "__main__":   # [DIR]: build pi2/_pi2*.so under DIR (default: the source tree)
    import sys
    ffi.compile(tmpdir=sys.argv[1] if len(sys.argv) > 1 else str(HERE.parent), verbose=True)
