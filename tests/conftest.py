"""Fixtures and guards for rsock's test suite.

Every behaviour test runs on two transports: ``tcp`` (the stdlib ``socket`` module,
the oracle) and ``rsock``.  A test counts only if it passes on ``tcp``.

Guards that apply to every test:

* a SIGALRM hang guard (60 s, or ``@pytest.mark.timeout_s(N)``) that fails the test
  with a traceback; if the main thread is stuck where the signal cannot get through,
  faulthandler dumps every thread and ends the run ``HARD_GRACE_S`` later instead of
  letting CI hang;
* child processes started through the ``peers`` fixture, and any ``multiprocessing``
  children, are killed at the end of the test.
"""

from __future__ import annotations

import faulthandler
import multiprocessing
import os
import signal
from collections.abc import Iterator
from types import FrameType, ModuleType
from typing import Any

import pytest

# rsock tests must prove the fast path: a connection that cannot take it is an error.
# Set before anything imports rsock; the peer processes inherit it.
os.environ["RSOCK_FALLBACK"] = "never"

from support import Peers, assert_fast_path, connected_pair, load_sockmod  # noqa: E402

DEFAULT_TIMEOUT_S = 60.0
HARD_GRACE_S = 30.0
TRANSPORTS = ["tcp", "rsock"]


# A duplicate of the real stderr, taken in pytest_configure (while output capture is
# suspended), so that the hang-guard backstop's thread dump is never captured away.
_stderr_fd: int | None = None


def pytest_configure(config: pytest.Config) -> None:
    global _stderr_fd
    _stderr_fd = os.dup(2)
    config.addinivalue_line(
        "markers",
        f"timeout_s(seconds): per-test hang guard (default {DEFAULT_TIMEOUT_S:g} s)",
    )


# --------------------------------------------------------------------------- guards


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
    # Backstop: a main thread blocked in C that never returns to Python never runs the
    # SIGALRM handler; dump every thread's stack and end the run rather than hang CI.
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
def _reap_multiprocessing_children() -> Iterator[None]:
    yield
    for child in multiprocessing.active_children():
        child.kill()
        child.join(10)


@pytest.fixture
def peers() -> Iterator[Peers]:
    manager = Peers()
    try:
        yield manager
    finally:
        manager.cleanup()


# --------------------------------------------------------------------------- transports


@pytest.fixture(params=TRANSPORTS)
def transport(request: pytest.FixtureRequest) -> str:
    return str(request.param)


@pytest.fixture
def sockmod(transport: str) -> ModuleType:
    """stdlib ``socket`` for ``tcp``, ``rsock`` for ``rsock`` (imported lazily)."""
    return load_sockmod(transport)


@pytest.fixture
def pair(sockmod: ModuleType, transport: str) -> Iterator[tuple[Any, Any]]:
    """A connected (client, server) pair in this process, closed at the end."""
    client, server = connected_pair(sockmod)
    try:
        assert_fast_path(transport, client, server)
        yield client, server
    finally:
        client.close()
        server.close()
