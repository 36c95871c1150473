"""Guards for the compat suite (unmodified TCP programs run over rsock).

* ``RSOCK_FALLBACK=never``: a connection that cannot take rsock's fast path is
  an error, here and in every child process;
* a SIGALRM hang guard per test (60 s, or ``@pytest.mark.timeout_s(N)``), backed
  by faulthandler ending the run if the main thread is stuck in C;
* ``socket.socket`` is the stdlib's again after every test, and so are the
  event loop classes ``rsock.patch()`` touches and ``sys.meta_path`` (a test
  that leaves the patch applied fails).
"""

from __future__ import annotations

import asyncio.base_events
import asyncio.selector_events
import faulthandler
import os
import signal
import socket
import sys
from collections.abc import Iterator
from types import FrameType
from typing import Any

import pytest

os.environ["RSOCK_FALLBACK"] = "never"

DEFAULT_TIMEOUT_S = 60.0
HARD_GRACE_S = 30.0
_STD_SOCKET = socket.socket
try:
    import uvloop
except ImportError:  # pragma: no cover - a test dependency
    uvloop = None
_LOOP_CLASSES: list[type] = [
    asyncio.base_events.BaseEventLoop,
    asyncio.selector_events.BaseSelectorEventLoop,
]
if uvloop is not None:
    _LOOP_CLASSES.append(uvloop.Loop)


def loop_state() -> list[Any]:
    """What ``rsock.patch()`` may change besides ``socket.socket``: the loop
    classes' own attributes and the import finders (by identity)."""
    state: list[Any] = [[id(f) for f in sys.meta_path]]
    for cls in _LOOP_CLASSES:
        state.append(sorted((k, id(v)) for k, v in vars(cls).items()))
    return state


_LOOP_STATE = loop_state()
_stderr_fd: int | None = None


def pytest_configure(config: pytest.Config) -> None:
    global _stderr_fd
    if _stderr_fd is None:
        _stderr_fd = os.dup(2)
    config.addinivalue_line(
        "markers",
        f"timeout_s(seconds): per-test hang guard (default {DEFAULT_TIMEOUT_S:g} s)",
    )


class HangGuardTimeout(Exception):
    """Raised in the main thread when a test outlives its hang guard."""


@pytest.fixture(autouse=True)
def hang_guard(request: pytest.FixtureRequest) -> Iterator[None]:
    marker = request.node.get_closest_marker("timeout_s")
    seconds = float(marker.args[0]) if marker else DEFAULT_TIMEOUT_S

    def on_alarm(signum: int, frame: FrameType | None) -> None:
        raise HangGuardTimeout(f"test still running after {seconds:g} s (hang guard)")

    previous = signal.signal(signal.SIGALRM, on_alarm)
    signal.setitimer(signal.ITIMER_REAL, seconds)
    faulthandler.dump_traceback_later(
        seconds + HARD_GRACE_S, exit=True, file=_stderr_fd if _stderr_fd is not None else 2
    )
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        faulthandler.cancel_dump_traceback_later()
        signal.signal(signal.SIGALRM, previous)


@pytest.fixture(autouse=True)
def _unpatched() -> Iterator[None]:
    assert socket.socket is _STD_SOCKET, "socket.socket is patched before the test"
    yield
    rsock = sys.modules.get("rsock")
    if socket.socket is not _STD_SOCKET or (rsock is not None and rsock._patch.is_patched()):
        if rsock is not None:
            rsock.unpatch()
        socket.socket = _STD_SOCKET  # type: ignore[misc]
        pytest.fail("the test left socket.socket patched")
    assert loop_state() == _LOOP_STATE, "the event loop classes or sys.meta_path changed"
