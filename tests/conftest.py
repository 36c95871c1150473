"""Fixtures and guards for rsock's test suite.

Every behaviour test runs on two transports: ``tcp`` (the stdlib ``socket`` module,
the oracle) and ``rsock``.  A test counts only if it passes on ``tcp``.

Guards that apply to every test:

* the hang guard of the top-level ``conftest.py`` (shared with ``compat/``);
* child processes started through the ``peers`` fixture, and any ``multiprocessing``
  children, are killed at the end of the test.
"""

from __future__ import annotations

import asyncio
import multiprocessing
import os
from collections.abc import Callable, Coroutine, Iterator
from types import ModuleType
from typing import Any, TypeVar

import pytest

# rsock tests must prove the fast path: a connection that cannot take it is an error.
# Set before anything imports rsock; the peer processes inherit it.
os.environ["RSOCK_FALLBACK"] = "never"

from robust_peer import RobustPeers  # noqa: E402
from support import Peers, assert_fast_path, connected_pair, load_sockmod  # noqa: E402

TRANSPORTS = ["tcp", "rsock"]


@pytest.fixture(autouse=True, scope="session")
def _rsock_process_state() -> None:
    """What rsock keeps for the life of a process (the signal wakeup pipe
    it gives Python with the main thread's first socket) exists before any
    test counts this process's fds."""
    import rsock

    rsock.socket().close()


@pytest.fixture(autouse=True)
def _reap_multiprocessing_children() -> Iterator[None]:
    yield
    for child in multiprocessing.active_children():
        child.kill()
        child.join(10)


@pytest.fixture
def rpeers() -> Iterator[RobustPeers]:
    """``robust_peer.py`` children, killed at the end of the test."""
    manager = RobustPeers()
    try:
        yield manager
    finally:
        manager.cleanup()


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


T = TypeVar("T")
LOOP_HANG = 30  # s: the limit of every coroutine the ``run`` fixture runs


@pytest.fixture(params=["asyncio", "uvloop"])
def run(request: pytest.FixtureRequest) -> Callable[[Coroutine[Any, Any, T]], T]:
    """Runs a coroutine to completion on a new asyncio or uvloop loop,
    within ``LOOP_HANG`` seconds (a module's own ``run`` takes precedence)."""

    def runner(coro: Coroutine[Any, Any, T]) -> T:
        if request.param == "uvloop":
            import uvloop

            return uvloop.run(asyncio.wait_for(coro, LOOP_HANG))  # type: ignore[no-any-return]
        return asyncio.run(asyncio.wait_for(coro, LOOP_HANG))

    return runner
