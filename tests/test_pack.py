"""test_pack.py — the x8 repacked layout and its kernels (csrc/kernels/pack.[ch], x86_pack_body.h,
neon_pack_body.h, csrc/model_pack.c) against the numpy lane.

Checks: pi2_repack_rows equals quants.pack_rows byte for byte and unpacks back; every table's packed kernel
equals that table's plain kernel bit for bit, and numpy's x86-order product (QuantLinear) for the types it
computes exactly; a model repacked at load decodes the same logits, bit for bit, prompt and single tokens, at
1 and 2 threads; unsupported types and shapes give errors; `pi2 devices` names the variant.
"""
import numpy as np
import pytest

from fixtures import write_model
from pi2 import engine
from pi2.reference import quants
from pi2.engine import CContext, CModel
from pi2.errors import EngineError, UnsupportedError
from pi2.model.loader import load_model

Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, Q4_K = 2, 3, 6, 7, 8, 12
PACKABLE = [Q4_0, Q4_1, Q5_0, Q5_1, Q8_0]
KERNELS = [Q4_1, Q5_0, Q8_0]     # types with packed kernels


def weights(qtype, n_rows, n_blocks, seed=0):
    rng = np.random.default_rng(seed)
    w = rng.standard_normal((n_rows, 32 * n_blocks)).astype(np.float32)
    w[0, :32] *= 40    # one loud block: scales far apart
    return quants.quantize_weight(w, qtype)


@pytest.mark.parametrize("qtype", PACKABLE)
@pytest.mark.parametrize("n_rows,n_blocks", [(8, 1), (16, 7), (24, 33)])
def test_pack_matches_numpy_and_unpacks(qtype, n_rows, n_blocks):
    raw = weights(qtype, n_rows, n_blocks)
    packed = engine.repack_rows(raw, qtype, 32 * n_blocks)
    assert np.array_equal(packed, quants.pack_rows(raw, qtype))
    assert not np.array_equal(packed, raw)
    assert np.array_equal(engine.repack_rows(packed, qtype, 32 * n_blocks, unpack=True), raw)


@pytest.mark.parametrize("impl", ["auto", "base"])
@pytest.mark.parametrize("qtype", KERNELS)
@pytest.mark.parametrize("n_blocks", [1, 7, 18, 33, 255])
def test_packed_kernel_is_bit_identical(qtype, n_blocks, impl):
    n = 32 * n_blocks
    raw = weights(qtype, 16, n_blocks, seed=n_blocks)
    x = np.random.default_rng(1).standard_normal(n).astype(np.float32) * 3
    xq = engine.quantize_act(x, quants.vec_dot_type(qtype))
    if not engine.kernel_info()["packed"] and impl == "auto":
        pytest.skip("no packed kernels on this CPU")
    got = engine.matvec_packed(engine.repack_rows(raw, qtype, n), qtype, n, xq, impl)
    assert np.array_equal(got, engine.matvec(raw, qtype, n, xq, impl))
    assert np.array_equal(got, quants.QuantLinear(raw, qtype, n)(x[None, :])[0])


def test_errors():
    raw = weights(Q8_0, 8, 1)
    with pytest.raises(EngineError, match="groups of 8"):
        engine.repack_rows(raw[:7], Q8_0, 32)
    with pytest.raises(UnsupportedError, match="no packed layout"):
        engine.repack_rows(np.zeros((8, 512), np.uint8), 1, 256)   # F16
    with pytest.raises(UnsupportedError, match="no packed Q8_0 kernel"):
        engine.matvec_packed(raw, Q8_0, 32, engine.quantize_act(np.ones(32, np.float32), Q8_0), "ref")


@pytest.mark.parametrize("wtype", ["Q4_1", "Q5_0", "Q8_0"])
def test_repacked_model_decodes_the_same_bits(tmp_path, wtype):
    path = tmp_path / f"m-{wtype}.gguf"
    write_model(path, arch="llama", wtype=wtype, n_layer=2)
    m = load_model(path)
    plain, packed = CModel.from_model(m), CModel.from_model(m)
    n_bytes = packed.repack(ffn=True)
    assert n_bytes > 0 and packed.repack(ffn=True) == n_bytes          # once only
    for threads in (1, 2):
        outs = []
        for cm in (plain, packed):
            c = CContext(cm, 64, n_threads=threads)
            outs.append((c.decode(list(range(1, 20)), all_logits=True), c.decode([5]), c.decode([7])))
        for a, b in zip(*outs):
            assert np.array_equal(a, b)


def test_devices_names_the_variant():
    info = engine.kernel_info()
    assert info["variant"] and info["variant_why"]
    from pi2.plan import devices
    cpu = devices.cpu_info()
    assert cpu["variant"] == info["variant"] and isinstance(cpu["packed"], list)
