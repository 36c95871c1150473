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
from pathlib import Path

import pytest

pytestmark = pytest.mark.skipif(
    platform.libc_ver()[0] != "glibc", reason="glibc's dynamic mmap threshold only"
)

PROBE = r"""
import sys
from pathlib import Path
if sys.argv[1] != "none":
    import rsock
    if sys.argv[1] == "socket":
        rsock.socket().close()
    if sys.argv[1] == "hint":
        from rsock import _lowlevel
        _lowlevel.hint_heap()
bytes(1 << 20)  # a joined 1 MiB body, freed: glibc learns a ~1 MiB threshold
block = b"\x01" * (8 << 20)  # 20 such bodies waiting for the cyclic GC: still heap
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
    assert _where("hint") == "heap"  # the bench's --tcp-heap-hint does the same


@pytest.mark.timeout_s(120)
def test_user_malloc_tuning_wins() -> None:
    # glibc turns its dynamic thresholds off once the user sets one
    assert _where("socket", MALLOC_MMAP_THRESHOLD_="131072") == "mmap"


@pytest.mark.timeout_s(120)
def test_bench_hint_launcher_runs_scripts_and_modules(tmp_path: Path) -> None:
    """``python -m rsock.bench._hint``, the TCP side of ``rsock.bench apps
    --tcp-heap-hint``: the program runs as ``python`` would run it (its argv,
    its directory on sys.path, ``-m`` modules), with the threshold raised."""
    (tmp_path / "helper_mod.py").write_text("VALUE = 42\n")
    script = tmp_path / "probe.py"
    script.write_text(
        PROBE.replace('if sys.argv[1] != "none":', "if False:")
        + "import helper_mod\nprint(helper_mod.VALUE, sys.argv[1:])\n"
    )
    env = {k: v for k, v in os.environ.items() if not k.startswith("MALLOC_")}
    for args in ([str(script)], ["-m", "probe"]):
        out = subprocess.run(
            [sys.executable, "-m", "rsock.bench._hint", *args, "x", "--flag"],
            cwd=tmp_path if args[0] == "-m" else "/",
            env={**env, "PYTHONPATH": str(tmp_path)} if args[0] == "-m" else env,
            capture_output=True, text=True, timeout=60, check=True,
        )  # fmt: skip
        assert out.stdout.split("\n")[:2] == ["heap", "42 ['x', '--flag']"], out
    # and the plain interpreter, the oracle: the same script's block is mapped
    plain = subprocess.run([sys.executable, str(script), "x"], env=env, cwd="/",
                           capture_output=True, text=True, timeout=60, check=True)  # fmt: skip
    assert plain.stdout.split("\n")[0] == "mmap", plain


def test_bench_uses_the_launcher_only_when_asked(tmp_path: Path) -> None:
    from rsock.bench import _apps

    opts = _apps.parse_options(["--pin", "none"])
    plain = _apps.command(opts, "tcp", tmp_path / "r.json", ["aiohttp_server.py"])
    assert plain == [sys.executable, str(_apps.APPS / "aiohttp_server.py")]
    opts = _apps.parse_options(["--pin", "none", "--tcp-heap-hint"])
    hinted = _apps.command(opts, "tcp", tmp_path / "r.json", ["-m", "uvicorn", "a:app"])
    assert hinted == [sys.executable, "-m", "rsock.bench._hint", "-m", "uvicorn", "a:app"]
    rs = _apps.command(opts, "rsock", tmp_path / "r.json", ["-m", "uvicorn", "a:app"])
    assert rs[1:4] == ["-m", "rsock", "run"]
