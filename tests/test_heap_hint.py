"""rsock's first socket teaches glibc's malloc a larger mmap threshold (issue
18.1; rsock/_lowlevel.py, HEAP_HINT), so that a receiver holding a few MiB
of message chunks at the heap's top does not get its heap trimmed and grown
again around every message.

Whether a given program's heap churns depends on where its other objects
happen to sit, so the outcome cannot be tested deterministically; the
mechanism can: after the first rsock socket, a block of twice the old
threshold comes from the heap (brk), not from a mapping of its own; in the
same fresh interpreter without rsock, or with rsock imported but no socket
made, it does not (the oracle that this test can fail)."""

from __future__ import annotations

import os
import platform
import subprocess
import sys

import pytest

pytestmark = pytest.mark.skipif(
    platform.libc_ver()[0] != "glibc", reason="glibc's dynamic mmap threshold only"
)

PROBE = r"""
import sys
if sys.argv[1] != "none":
    import rsock
    if sys.argv[1] == "socket":
        rsock.socket().close()
bytes(1 << 20)  # a joined 1 MiB body, freed: glibc learns a ~1 MiB threshold
block = b"\x01" * (2 << 20)
heap = []
with open("/proc/self/maps") as f:
    for line in f:
        if line.rstrip().endswith("[heap]"):
            lo, hi = (int(x, 16) for x in line.split()[0].split("-"))
            heap.append((lo, hi))
print("heap" if any(lo <= id(block) < hi for lo, hi in heap) else "mmap")
"""


def _where(mode: str, **env: str) -> str:
    clean = {k: v for k, v in os.environ.items() if not k.startswith("MALLOC_")}
    clean.update(env)
    out = subprocess.run(
        [sys.executable, "-c", PROBE, mode],
        env=clean,
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    )
    return out.stdout.strip()


@pytest.mark.timeout_s(120)
def test_first_socket_raises_the_mmap_threshold() -> None:
    assert _where("none") == "mmap"
    assert _where("import") == "mmap"  # importing rsock changes nothing
    assert _where("socket") == "heap"


@pytest.mark.timeout_s(120)
def test_user_malloc_tuning_wins() -> None:
    # glibc turns its dynamic thresholds off once the user sets one
    assert _where("socket", MALLOC_MMAP_THRESHOLD_="131072") == "mmap"
