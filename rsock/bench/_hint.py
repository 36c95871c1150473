"""``python -m rsock.bench._hint SCRIPT ARGS...`` (or ``-m MODULE ARGS...``): runs a
program as ``python`` would, after doing to glibc's malloc what rsock's first socket
does (``rsock._lowlevel.hint_heap``), without making any rsock socket: the TCP side of
``python -m rsock.bench apps --tcp-heap-hint``, to show what that hint alone is worth."""

from __future__ import annotations

import os
import runpy
import sys

from rsock import _lowlevel


def main(argv: list[str]) -> None:
    if not argv or argv == ["-m"]:
        sys.exit("usage: python -m rsock.bench._hint SCRIPT|-m MODULE [ARGS...]")
    _lowlevel.hint_heap()
    if argv[0] == "-m":
        sys.argv = [argv[1], *argv[2:]]
        runpy.run_module(argv[1], run_name="__main__", alter_sys=True)
    else:
        sys.argv = list(argv)
        sys.path[0] = os.path.dirname(argv[0]) or "."
        runpy.run_path(argv[0], run_name="__main__")


if __name__ == "__main__":
    main(sys.argv[1:])
