# setup.py — only wires the cffi extension build (csrc/ffi_build.py); metadata lives in pyproject.toml.
from setuptools import setup

setup(cffi_modules=["csrc/ffi_build.py:ffi"])
