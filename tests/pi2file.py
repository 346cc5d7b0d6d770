"""pi2file.py — pi2 files for the tests, made as users make them: `pi2 convert` (pi2.convert.convert) on a small
calibration text (the fixtures' own text, a few hundred tokens); and writer_like, a GGUF copy of a file's keys for
tests that write altered files. The one pi2 file written without the converter is the oracle test's
(tests/test_sparse.py: test_pi2_file_keep_one).
"""
from __future__ import annotations

from pathlib import Path

from fixtures import TEXT
from gguf import GGUFReader, GGUFValueType, GGUFWriter

from pi2.convert import convert

CALIB_TOKENS = 256


def convert_pi2(src, dst, *, down_type: str = "F32", layout: str = "bundle-ud", default_keep: float = 1.0,
                pred=None) -> Path:
    """`pi2 convert src -o dst --ffn-type <down_type> --layout <layout>` with the file's default keep set, on a
    calibration text written beside dst."""
    calib = Path(dst).parent / "calib.txt"
    if not calib.exists():
        calib.write_text(TEXT * 3)
    rep = convert(src, dst, calib=calib, calib_tokens=CALIB_TOKENS, ffn_layout=layout, ffn_type=down_type.lower(),
                  default_keep=default_keep, progress=False, pred=pred)
    return Path(rep.output)


def writer_like(r: GGUFReader, dst) -> GGUFWriter:
    """A GGUFWriter to dst (alignment 4096) holding every key of the file r reads, tensors still to add."""
    arch = bytes(r.fields["general.architecture"].parts[-1]).decode()
    w = GGUFWriter(str(dst), arch)
    w.add_custom_alignment(4096)
    for f in r.fields.values():
        if f.name.startswith("GGUF.") or f.name in ("general.architecture", "general.alignment"):
            continue
        vt = f.types[0]
        w.add_key_value(f.name, f.contents(), vt, f.types[-1] if vt == GGUFValueType.ARRAY else None)
    return w
