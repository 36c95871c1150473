from setuptools import setup

setup(cffi_modules=["native/build_ffi.py:ffibuilder"])
