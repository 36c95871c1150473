"""Guards for the compat suite (unmodified TCP programs run over rsock).

* ``RSOCK_FALLBACK=never``: a connection that cannot take rsock's fast path is
  an error, here and in every child process;
* the hang guard of the top-level ``conftest.py`` (shared with ``tests/``);
* ``socket.socket`` is the stdlib's again after every test, and so are the
  event loop classes ``rsock.patch()`` touches and ``sys.meta_path`` (a test
  that leaves the patch applied fails).
"""

from __future__ import annotations

import asyncio.base_events
import asyncio.selector_events
import os
import socket
import sys
from collections.abc import Iterator
from typing import Any

import pytest

os.environ["RSOCK_FALLBACK"] = "never"

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
