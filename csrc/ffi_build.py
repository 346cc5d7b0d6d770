# ffi_build.py — the cffi API-mode build of pi2's C core into the extension module pi2._pi2.
# The cdef is csrc/pi2.h (the API) and csrc/pi2_test.h (the test entry points), minus preprocessor lines and the
# PI2_API marks; every C source is compiled directly with hidden visibility, so the module exports only the
# functions pi2.h marks PI2_API (and Python's init). cffi checks the enum values and struct layouts against C.
import os
from pathlib import Path

from cffi import FFI

HERE = Path(__file__).resolve().parent

SOURCES = ["pi2.c", "test_api.c", "model.c", "model_check.c", "model_map.c", "context.c", "forward.c", "forward_rows.c", "kv_shift.c", "kv_rows.c", "decode_multi.c", "kv_quant.c", "kv_mem.c", "ops.c", "attn.c", "attn_batch.c", "attn_batch_avx2.c", "attn_decode.c", "flash_attn.c", "threadpool.c", "matmul.c",
           "kernels/traits.c", "kernels/ref.c", "kernels/ref_convert.c", "kernels/x86.c", "kernels/neon.c", "kernels/axpy.c", "kernels/axpy_i8.c", "kernels/axpy_qx1.c", "kernels/axpy_qx1_pack.c",
           "kernels/lowbit.c", "kernels/api.c", "kernels/pack.c", "model_pack.c", "kernels/ggml_order.c", "kernels/ggml_x8.c",
           "ffn/sparse.c", "ffn/gate_rows.c", "ffn/predicted.c", "ffn/pwri.c", "ffn/select.c", "ffn/moe.c", "ffn/moe_route.c",
           "ffn/moe_mm.c", "ffn/moe_stream.c", "ffn/moe_pack.c", "ffn/moe_relu.c", "ffn/down_pack.c", "ffn/moe_neurons.c",
           "ffn/moe_down_rows.c",
           "kernels/pack_k.c", "sample.c",
           "pipeline/pipeline.c", "pipeline/units.c", "pipeline/whole.c", "pipeline/experts.c",
           "cache/cache.c", "cache/read.c", "cache/slots.c", "cache/experts.c", "cache/experts_learn.c",
           "cache/experts_held.c",
           "nnapi/nnapi.c", "nnapi/graph.c", "nnapi/bench.c", "nnapi/batches.c", "nnapi/hot_ffn.c",
           "io/io.c", "io/uring.c", "io/aio.c", "io/pread_pool.c", "io/mmap.c", "io/bench.c", "io/probe.c", "io/map_guard.c"]


HEADERS = ["pi2.h", "pi2_test.h"]


def _cdef(header: str) -> str:
    lines = (line for line in header.splitlines() if not line.lstrip().startswith("#"))
    return "\n".join(line.replace("PI2_API ", "") for line in lines)


# PI2_SANITIZE=address,undefined (any -fsanitize= list): an instrumented build for scripts/sanitize.sh, which loads
# the sanitizer runtime with LD_PRELOAD (python itself is not instrumented). Every report aborts the process.
SANITIZE = os.environ.get("PI2_SANITIZE", "")
SAN_FLAGS = [f"-fsanitize={SANITIZE}", "-fno-sanitize-recover=all", "-fno-omit-frame-pointer", "-g"] if SANITIZE else []

ffi = FFI()
ffi.cdef("\n".join(_cdef((HERE / h).read_text()) for h in HEADERS))
ffi.set_source(
    "pi2._pi2",
    "".join(f'#include "{h}"\n' for h in HEADERS),
    sources=[os.path.relpath(HERE / s) for s in SOURCES],
    include_dirs=[os.path.relpath(HERE)],
    extra_compile_args=["-O3", "-std=c11", "-ffp-contract=off", "-Wall", "-Wno-unused-function", "-pthread",
                        "-fvisibility=hidden"] + SAN_FLAGS,
    extra_link_args=["-pthread", "-Wl,--version-script=" + os.path.relpath(HERE / "exports.map")] + SAN_FLAGS,
    libraries=["m", "dl"],   # dl: nnapi.c opens libneuralnetworks.so at run time
)

if __name__ == "__main__":   # [DIR]: build pi2/_pi2*.so under DIR (default: the source tree)
    import sys
    ffi.compile(tmpdir=sys.argv[1] if len(sys.argv) > 1 else str(HERE.parent), verbose=True)
