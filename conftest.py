"""Guards shared by every test under this tree (tests/ and compat/).

A per-test SIGALRM hang guard (60 s, or ``@pytest.mark.timeout_s(N)``) fails the
test with a traceback; if the main thread is stuck where the signal cannot get
through (blocked in C), faulthandler dumps every thread and ends the run
``HARD_GRACE_S`` later instead of letting CI hang.
"""

from __future__ import annotations

import faulthandler
import os
import signal
from collections.abc import Iterator
from types import FrameType

import pytest

DEFAULT_TIMEOUT_S = 60.0
HARD_GRACE_S = 30.0

# A duplicate of stderr taken before pytest's capture, so that the backstop's
# thread dump is never captured away.
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
