"""The report of ``python -m rsock run --report FILE``: every patched
process's counts summed into FILE, as JSON.

Its processes count into files of a directory of their own (``rsock._inherit``);
``write`` sums them.  The top process writes the report at exit; when it dies
without its exit handlers (a signal, ``os._exit``), a watcher writes it:
this file, run as a script by its path in an interpreter of its own
(``python -I -S .../rsock/_report.py --write FILE --for PID``, its command
line telling ``ps`` what it is), which waits on a pidfd of the top process.
Standard library only: the watcher imports nothing of rsock's.
"""

from __future__ import annotations

import os
import sys
from collections import Counter


def tally(directory: str) -> tuple[Counter[str], int]:
    """The counts of every process that recorded into ``directory``, and how
    many processes did."""
    total: Counter[str] = Counter()
    processes = 0
    for name in os.listdir(directory):
        try:
            with open(os.path.join(directory, name), encoding="utf-8") as f:
                lines = f.read().split("\0", 1)[0].split("\n")  # (then zeros)
        except OSError:
            continue
        processes += 1
        total.update(line for line in lines if line)
    return total, processes


def write(path: str, directory: str, top: int) -> None:
    """The report into ``path`` (it appears whole), the count directory
    removed; only in the process ``top`` (a fork child leaving by
    sys.exit() runs its parent's exit handlers too)."""
    if os.getpid() != top:
        return
    import json  # (here: a process that never writes a report does not carry them)
    import shutil

    counts, processes = tally(directory)
    report: dict[str, int] = dict(counts)
    report["processes"] = processes
    part = f"{path}.{os.getpid()}.part"  # then renamed: the file appears whole
    with open(part, "w", encoding="utf-8") as f:
        json.dump(report, f, sort_keys=True)
        f.write("\n")
    os.replace(part, path)
    shutil.rmtree(directory, ignore_errors=True)


def _watch(argv: list[str]) -> None:
    """``--write FILE --for PID --counts DIR --pidfd FD``: wait until the
    pidfd turns readable (the process is gone), then write the report if
    the top process did not (its directory is still there)."""
    opts = dict(zip(argv[::2], argv[1::2], strict=False))
    import select

    poller = select.poll()
    poller.register(int(opts["--pidfd"]), select.POLLIN)
    while not poller.poll():
        pass
    if os.path.isdir(opts["--counts"]):
        write(opts["--write"], opts["--counts"], os.getpid())


if __name__ == "__main__":
    try:
        _watch(sys.argv[1:])
    except BaseException:
        pass
    os._exit(0)
