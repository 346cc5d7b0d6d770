"""pi2.engine — the binding of pi2's C core (csrc/pi2.h): the only package that imports the compiled extension.

Modules: lib (loading it, the ABI check, errors), kernels (type facts and kernel wrappers), model (CModel and the
tensor descriptors), context (CContext: decode, the sparse FFN rule, streaming, statistics), multi (several contexts in one step), nnapi (the NNAPI
delegate), flash_io (the I/O backends, the probe, FlashFile). This module re-exports what the rest of pi2 uses.
"""
from pi2.engine.context import CContext, default_threads
from pi2.engine.kernels import (IMPLS, TypeInfo, dequantize, kernel_info, matvec, matvec_packed, quantize_act, repack_rows,
                                type_info)
from pi2.engine.lib import ABI_VERSION, check, check_mapping, ffi, guard_mapping, lib, unguard_mapping
from pi2.engine.multi import decode_multi
from pi2.engine.model import ROLES, CModel, RowView, c_model_structs, ctx_sizes, model_params, stream_sizes, tensor_descs

__all__ = ["ABI_VERSION", "CContext", "CModel", "IMPLS", "ROLES", "RowView", "TypeInfo", "c_model_structs", "check",
           "check_mapping", "ctx_sizes", "decode_multi", "default_threads", "dequantize", "ffi", "guard_mapping", "kernel_info", "lib",
           "matvec", "matvec_packed", "model_params", "quantize_act", "repack_rows", "stream_sizes", "tensor_descs",
           "type_info", "unguard_mapping"]
