"""cffi (API mode) build script for the ``rsock._native`` extension.

The cdef is never hand-copied: it is the region of ``native/include/rsock.h``
between the lines containing ``RSK_CDEF_BEGIN`` and ``RSK_CDEF_END``, so the
header stays the one contract between C and Python.

setuptools picks this file up through ``setup.py``
(``cffi_modules=["native/build_ffi.py:ffibuilder"]``) and runs it with the repo
root as the working directory (pip guarantees that).  Paths handed to
setuptools are therefore relative to the working directory; they are computed
from this file's location.

``python native/build_ffi.py`` (from anywhere) builds without pip: it compiles in
``native/build/ffi/`` and copies the extension into ``rsock/``, replacing any other
``rsock/_native*.so`` (pip's editable build names it ``_native.abi3.so``, a direct
build ``_native.cpython-3XX-....so``, and the import system would prefer a stale
second one).
"""

from __future__ import annotations

import glob
import os
import re

from cffi import FFI

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
HEADER = os.path.join(HERE, "include", "rsock.h")

CDEF_BEGIN = "RSK_CDEF_BEGIN"
CDEF_END = "RSK_CDEF_END"

# A marker line starts with the marker, optionally inside a comment: "/* RSK_CDEF_BEGIN */".
# (Prose that merely mentions a marker, such as the header's introduction, is not one.)
_MARKER_RE = r"^\s*(?:/\*|//)?\s*{}\b"
_COMMENT_RE = re.compile(r"/\*.*?\*/|//[^\n]*", re.DOTALL)


# Run by setuptools (cffi_modules) unless executed directly.
STANDALONE = __name__ == "__main__"


def _rel(path: str) -> str:
    """Relative to the working directory for setuptools (it wants relative sources);
    absolute for a stand-alone build, which compiles in another directory."""
    return path if STANDALONE else os.path.relpath(path, os.getcwd())


def read_cdef(header: str = HEADER) -> str:
    """The declarations between the RSK_CDEF_BEGIN/END marker lines, comments stripped."""
    with open(header, encoding="utf-8") as f:
        lines = f.read().splitlines()
    begin_re = re.compile(_MARKER_RE.format(CDEF_BEGIN))
    end_re = re.compile(_MARKER_RE.format(CDEF_END))
    begin = [i for i, line in enumerate(lines) if begin_re.match(line)]
    end = [i for i, line in enumerate(lines) if end_re.match(line)]
    if len(begin) != 1 or len(end) != 1 or begin[0] >= end[0]:
        raise RuntimeError(
            f"{header}: expected exactly one {CDEF_BEGIN} line followed by one {CDEF_END} line"
        )
    text = "\n".join(lines[begin[0] + 1 : end[0]]) + "\n"
    # Keep newlines inside block comments so cffi's error line numbers stay meaningful.
    text = _COMMENT_RE.sub(lambda m: "\n" * m.group(0).count("\n") or " ", text)
    if not text.strip():
        raise RuntimeError(f"{header}: the cdef region is empty")
    return text


def _sources() -> list[str]:
    return [_rel(p) for p in sorted(glob.glob(os.path.join(HERE, "src", "*.c")))]


def _depends() -> list[str]:
    # Headers are not compiled on their own; listing them makes setuptools rebuild on change.
    found = sorted(glob.glob(os.path.join(HERE, "src", "*.h")))
    return [_rel(p) for p in [HEADER, *found]]


ffibuilder = FFI()
ffibuilder.cdef(read_cdef())
ffibuilder.set_source(
    "rsock._native",
    '#include "rsock.h"',
    sources=_sources(),
    depends=_depends(),
    include_dirs=[_rel(os.path.join(HERE, "include")), _rel(os.path.join(HERE, "src"))],
    # -fvisibility=hidden: the engine's symbols (rsk_*, eng_*, cm_*, shm_*, ring_*)
    # stay inside the extension; only PyInit__native is exported (rsock._fastcall
    # gets the entry points it calls as addresses, from rsock._lowlevel)
    extra_compile_args=[
        "-O2", "-Wall", "-Wextra", "-Werror", "-std=gnu11", "-D_GNU_SOURCE",
        "-fvisibility=hidden",
    ],
    libraries=["pthread", "dl"],
)


def build_in_place() -> str:
    """Compiles in native/build/ffi and installs the extension into rsock/."""
    import shutil

    scratch = os.path.join(HERE, "build", "ffi")
    os.makedirs(scratch, exist_ok=True)
    built = ffibuilder.compile(tmpdir=scratch, verbose=True)
    package = os.path.join(ROOT, "rsock")
    for old in glob.glob(os.path.join(package, "_native*.so")):
        os.remove(old)
    target = os.path.join(package, os.path.basename(built))
    shutil.copy2(built, target)
    return target


if STANDALONE:
    print("installed", build_in_place())
