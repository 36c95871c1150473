from setuptools import Extension, setup

setup(
    cffi_modules=["native/build_ffi.py:ffibuilder"],
    # the per-message calls of rsock.socket, without cffi's conversions
    # (it calls the engine through addresses rsock._lowlevel gives it)
    ext_modules=[
        Extension(
            "rsock._fastcall",
            ["native/py/fastcall.c"],
            include_dirs=["native/include"],  # (rsock.h's flags only)
            extra_compile_args=["-O2", "-Wall", "-Wextra", "-Werror"],
        )
    ],
)
