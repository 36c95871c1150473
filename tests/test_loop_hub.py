"""The fds an event loop watches for rsock connections (``_readiness._Hub``).

A loop watches one epoll fd of rsock's for all its rsock connections
(their notify and liveness fds are registered there, one ``epoll_ctl``
each), not one reader per fd: a new connection costs the loop no
registration of its own.  The behaviour (many connections open at once,
each echoing its own bytes, some closed by the peer while others stay
busy, a callback that raises) is checked over asyncio's own TCP too (the
oracle); the count of the loop's registrations is rsock's own.
"""

from __future__ import annotations

import asyncio
import hashlib
from typing import Any

import pytest
from test_loop_polling import Client, entry_points, start_server

import rsock.asyncio as ra
from rsock import _readiness

HANG = 60


def loop_fds() -> int | None:
    """How many fds the running loop's selector watches (asyncio's loops;
    None on others)."""
    sel = getattr(asyncio.get_running_loop(), "_selector", None)
    return None if sel is None else len(sel.get_map())


@pytest.mark.parametrize("transport", ["tcp", "rsock"])
@pytest.mark.parametrize("poll_us", ["0", ""])
def test_many_connections_one_registration(
    transport: str, poll_us: str, run: Any, monkeypatch: Any
) -> None:
    """60 connections open at once on one loop, each echoing 20 messages of
    its own, interleaved; then every other one is closed by the client and
    the rest keep echoing.  Every byte comes back in order (sha256 per
    connection).  Over rsock the loop's selector watches a handful of fds
    (listener, hub, the loop's own) however many connections are open, where
    TCP's holds one per connection end."""
    monkeypatch.setenv("RSOCK_LOOP_POLL_US", poll_us)
    n, rounds = 60, 20

    async def main() -> tuple[int | None, int | None]:
        server, port = await start_server(transport)
        before = loop_fds()
        async with server:
            pairs = [
                await entry_points(transport)[1](Client, "127.0.0.1", port) for _ in range(n)
            ]
            sent = [hashlib.sha256() for _ in range(n)]
            got = [hashlib.sha256() for _ in range(n)]
            for r in range(rounds):
                for i, (tr, _cp) in enumerate(pairs):
                    msg = (i * 1000 + r).to_bytes(4, "big") * (1 + (i + r) % 50)
                    sent[i].update(msg)
                    tr.write(msg)
                for i, (_tr, cp) in enumerate(pairs):
                    size = 4 * (1 + (i + r) % 50)
                    got[i].update(await cp.wait(size))
            during = loop_fds()
            for tr, cp in pairs[::2]:
                tr.close()
                await cp.lost
            for i, (tr, cp) in list(enumerate(pairs))[1::2]:
                tr.write(b"again %d" % i)
                assert await cp.wait(len(b"again %d" % i)) == b"again %d" % i
            assert [s.hexdigest() for s in sent] == [g.hexdigest() for g in got]
            for tr, cp in pairs[1::2]:
                tr.close()
                await cp.lost
        return (None, None) if before is None or during is None else (before, during)

    before, during = run(main())
    if before is None or during is None:
        return  # uvloop: nothing to count from here
    if transport == "tcp":
        assert during - before >= 2 * n  # (the oracle: one per connection end)
    else:
        assert during - before <= 2, (before, during)


def test_a_raising_callback_goes_to_the_exception_handler(run: Any) -> None:
    """A protocol whose data_received raises on one connection is reported
    through the loop's exception handler (as from the loop's own reader)
    and closes that transport (asyncio's fatal error); the connections
    dispatched by the same hub keep working."""

    class Bad(Client):
        def data_received(self, data: bytes) -> None:
            raise RuntimeError("boom")

    async def main() -> list[str]:
        loop = asyncio.get_running_loop()
        seen: list[str] = []
        loop.set_exception_handler(lambda _l, ctx: seen.append(str(ctx.get("exception"))))
        server, port = await start_server("rsock")
        async with server:
            good_tr, good = await ra.create_connection(Client, "127.0.0.1", port)
            bad_tr, bad = await ra.create_connection(Bad, "127.0.0.1", port)
            bad_tr.write(b"x")
            await bad.lost
            for i in range(50):
                good_tr.write(b"%04d" % i)
                assert await good.wait(4) == b"%04d" % i
            good_tr.close()
            await good.lost
        return seen

    seen = run(main())
    assert any("boom" in s for s in seen), seen


def test_hub_of_a_forked_process_is_not_reused() -> None:
    """An epoll instance is shared across fork(): a child looking up the
    hub of a loop object it inherited gets a new one, never its parent's."""
    import os

    async def main() -> None:
        loop = asyncio.get_running_loop()
        hub = _readiness._hub(loop)
        assert _readiness._hub(loop) is hub
        r, w = os.pipe()
        pid = os.fork()
        if pid == 0:  # pragma: no cover (the child reports through the pipe)
            try:
                other = _readiness._hub(loop)
                os.write(w, b"1" if other is not hub else b"0")
            finally:
                os._exit(0)
        os.close(w)
        try:
            assert os.read(r, 1) == b"1"
        finally:
            os.close(r)
            os.waitpid(pid, 0)

    asyncio.run(asyncio.wait_for(main(), HANG))


def test_without_a_hub_the_loop_readers_serve(run: Any, monkeypatch: Any) -> None:
    """When no hub can be made (``epoll_create`` fails: out of fds), the
    transports fall back to the loop's own readers and still work: echoed
    round trips, and the peer's close is seen."""

    def no_epoll() -> Any:
        raise OSError(24, "Too many open files")

    monkeypatch.setattr(_readiness.select, "epoll", no_epoll)

    async def main() -> None:
        assert not hasattr(asyncio.get_running_loop(), "_rsock_hub")
        server, port = await start_server("rsock")
        async with server:
            tr, cp = await ra.create_connection(Client, "127.0.0.1", port)
            for i in range(100):
                tr.write(b"%05d" % i)
                assert await cp.wait(5) == b"%05d" % i
            assert not hasattr(asyncio.get_running_loop(), "_rsock_hub")
            tr.close()
            await cp.lost

    run(main())
