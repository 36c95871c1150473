"""Polling on an event loop (``RSOCK_LOOP_POLL_US``, rsock.asyncio's
``_LoopPoller``), on asyncio and uvloop.

While a connection is busy the loop looks at its ring itself, so a message
wakes nobody (the counters say so); once it has been idle for the budget
the loop sleeps on its fds again and burns no CPU, and is still woken by
what comes later.  Behaviour tests run over asyncio's own TCP too (the
oracle); the counter and hot-set checks are rsock's own.
"""

from __future__ import annotations

import asyncio
import socket
import threading
import time
from typing import Any

import pytest
from support import FAST_PROVIDER, hi_peer

import rsock
import rsock.asyncio as ra

HANG = 30  # every test's own limit (s)


class Echo(asyncio.Protocol):
    def connection_made(self, transport: Any) -> None:
        self.transport = transport

    def data_received(self, data: bytes) -> None:
        self.transport.write(data)


class Client(asyncio.Protocol):
    """Collects what comes; ``wait(n)`` until n bytes are there."""

    def __init__(self) -> None:
        self.buf = bytearray()
        self.event = asyncio.Event()
        self.lost: asyncio.Future[None] = asyncio.get_running_loop().create_future()

    def connection_made(self, transport: Any) -> None:
        self.transport = transport

    def data_received(self, data: bytes) -> None:
        self.buf += data
        self.event.set()

    def connection_lost(self, exc: Exception | None) -> None:
        if not self.lost.done():
            self.lost.set_result(None)

    async def wait(self, n: int) -> bytes:
        while len(self.buf) < n:
            self.event.clear()
            await self.event.wait()
        out = bytes(self.buf[:n])
        del self.buf[:n]
        return out


def entry_points(transport: str) -> tuple[Any, Any]:
    """(create_server, create_connection) of rsock.asyncio or of the running loop."""
    if transport == "rsock":
        return ra.create_server, ra.create_connection
    loop = asyncio.get_running_loop()
    return loop.create_server, loop.create_connection


async def start_server(transport: str, factory: Any = Echo) -> tuple[Any, int]:
    """A listening server on 127.0.0.1 and its port."""
    server = await entry_points(transport)[0](factory, "127.0.0.1", 0)
    return server, int(server.sockets[0].getsockname()[1])


async def open_pair(transport: str) -> tuple[Any, asyncio.Transport, Client]:
    server, port = await start_server(transport)
    tr, cp = await entry_points(transport)[1](Client, "127.0.0.1", port)
    if transport == "rsock":
        assert tr.get_extra_info("socket").provider == FAST_PROVIDER
    return server, tr, cp


def notifies(tr: asyncio.Transport) -> int:
    return int(tr.get_extra_info("socket").stats()["notifies_sent"])


@pytest.mark.parametrize("transport", ["tcp", "rsock"])
@pytest.mark.parametrize("poll_us", ["0", "3", "", "100000"])
def test_round_trips(transport: str, poll_us: str, run: Any, monkeypatch: Any) -> None:
    """Echoed round trips arrive intact with polling off, at its default and
    long, and with a budget too short to poll (3 µs: below the poller's
    5 µs floor; a connection started in polling mode then was never woken);
    over rsock, with polling the client's messages wake the server (on the
    same loop) at most a few times (when a poll ended between two of them),
    without it about once each."""
    monkeypatch.setenv("RSOCK_LOOP_POLL_US", poll_us)
    n = 400

    async def main() -> int:
        server, tr, cp = await open_pair(transport)
        async with server:
            before = notifies(tr) if transport == "rsock" else 0
            for i in range(n):
                msg = i.to_bytes(4, "big") * 16
                tr.write(msg)
                assert await cp.wait(64) == msg
            woke = notifies(tr) - before if transport == "rsock" else 0
            tr.close()
            await cp.lost
        return woke

    woke = run(main())
    if transport == "rsock" and FAST_PROVIDER == "shm":  # (verbs: not polled)
        if poll_us in ("0", "3"):
            assert woke >= n // 2, woke
        else:
            assert woke <= n // 20, woke


@pytest.mark.parametrize("transport", ["tcp", "rsock"])
def test_idle_loop_sleeps_and_still_wakes(transport: str, run: Any) -> None:
    """After a burst of round trips the loop goes idle: it burns no CPU
    while a thread's client stays quiet (polling ended), and what the
    client sends after that still wakes it."""
    mod: Any = rsock if transport == "rsock" else socket
    got: list[bytes] = []

    async def main() -> float:
        server, port = await start_server(transport)
        go = threading.Event()

        def client() -> None:
            with mod.create_connection(("127.0.0.1", port), timeout=HANG) as c:
                for i in range(200):
                    c.sendall(b"%08d" % i)
                    got.append(c.recv(8))
                go.wait(HANG)
                c.sendall(b"late....")
                got.append(c.recv(8))

        async with server:
            t = threading.Thread(target=client, daemon=True)
            t.start()
            while len(got) < 200:
                await asyncio.sleep(0.01)
            await asyncio.sleep(0.05)  # polling ends (its budget is 50 µs)
            c0 = time.process_time()
            await asyncio.sleep(0.5)
            cpu = time.process_time() - c0
            go.set()
            while t.is_alive():
                await asyncio.sleep(0.01)
            return cpu

    cpu = run(main())
    assert got == [b"%08d" % i for i in range(200)] + [b"late...."]
    assert cpu < 0.1, f"the idle loop burned {cpu:.3f} s of CPU in 0.5 s"


def test_only_busy_connections_are_polled(run: Any) -> None:
    """Of 50 connections on one loop only the one that talks is polled; it
    leaves the poll set when idle, and closing it leaves no trace."""
    if FAST_PROVIDER != "shm":
        pytest.skip("the loop polls shm connections only")

    async def main() -> None:
        server = await ra.create_server(Echo, "127.0.0.1", 0)
        port = server.sockets[0].getsockname()[1]
        async with server:
            pairs = [await ra.create_connection(Client, "127.0.0.1", port) for _ in range(50)]
            await asyncio.sleep(0.05)
            loop = asyncio.get_running_loop()
            poller = loop._rsock_poller  # type: ignore[attr-defined]
            assert poller._hot == []
            tr, cp = pairs[7]
            for _ in range(20):
                tr.write(b"x" * 64)
                assert await cp.wait(64) == b"x" * 64
            hot = list(poller._hot)
            # the client's transport and the server's of that connection
            assert tr in hot and len(hot) == 2, hot
            await asyncio.sleep(0.05)
            assert poller._hot == []
            tr.write(b"again")  # a cooled connection wakes through its fd
            assert await cp.wait(5) == b"again"
            for tr, cp in pairs:
                tr.close()
                await cp.lost
            await asyncio.sleep(0.05)
            assert poller._hot == [] and not poller._running

    run(main())


@pytest.mark.parametrize("transport", ["tcp", "rsock"])
def test_timers_and_callbacks_run_while_polling(transport: str, run: Any) -> None:
    """A connection kept busy by a thread's client does not starve the
    loop's timers and callbacks: a 20 ms timer fires, and a chain of 2,000
    call_soon callbacks completes, while the round trips go on."""
    mod: Any = rsock if transport == "rsock" else socket
    stop = threading.Event()
    count = [0]

    async def main() -> tuple[float, float]:
        loop = asyncio.get_running_loop()
        server, port = await start_server(transport)

        def client() -> None:
            with mod.create_connection(("127.0.0.1", port), timeout=HANG) as c:
                while not stop.is_set():
                    c.sendall(b"ping")
                    if c.recv(4) != b"ping":
                        return
                    count[0] += 1

        async with server:
            t = threading.Thread(target=client, daemon=True)
            t.start()
            while count[0] < 100:
                await asyncio.sleep(0.001)
            fired = loop.create_future()
            t0 = loop.time()
            loop.call_later(0.02, lambda: fired.set_result(loop.time()))
            late = await fired - t0 - 0.02
            chain = loop.create_future()

            def step(i: int) -> None:
                if i:
                    loop.call_soon(step, i - 1)
                else:
                    chain.set_result(loop.time())

            t1 = loop.time()
            loop.call_soon(step, 2000)
            took = await chain - t1
            stop.set()
            while t.is_alive():
                await asyncio.sleep(0.01)
        return late, took

    late, took = run(main())
    assert late < 0.5 and took < 2.0, (late, took)
    assert count[0] >= 100


@pytest.mark.parametrize("value", ["abc", "-1", "2000000"])
def test_bad_budget_is_a_clear_error(value: str, run: Any, monkeypatch: Any) -> None:
    """A bad RSOCK_LOOP_POLL_US: create_server and create_connection raise
    ValueError naming it, before anything is made."""

    async def main() -> None:
        server = await ra.create_server(Echo, "127.0.0.1", 0)
        async with server:
            monkeypatch.setenv("RSOCK_LOOP_POLL_US", value)
            with pytest.raises(ValueError, match="RSOCK_LOOP_POLL_US"):
                await ra.create_connection(Client, "127.0.0.1", server.sockets[0].getsockname()[1])
            with pytest.raises(ValueError, match="RSOCK_LOOP_POLL_US"):
                await ra.create_server(Echo, "127.0.0.1", 0)
            monkeypatch.delenv("RSOCK_LOOP_POLL_US")

    run(main())


@pytest.mark.parametrize("transport", ["tcp", "rsock"])
def test_closed_transport_is_garbage_at_once(transport: str, run: Any) -> None:
    """A transport closed while hot is not kept alive by the poller (asyncio's
    own leak tests check this through weak references)."""
    import gc
    import weakref

    async def main() -> None:
        loop = asyncio.get_running_loop()
        served: list[Echo] = []
        gone = loop.create_future()

        class Served(Echo):
            def connection_made(self, transport: Any) -> None:
                super().connection_made(transport)
                served.append(self)

            def connection_lost(self, exc: Exception | None) -> None:
                gone.set_result(None)

        server, port = await start_server(transport, Served)
        async with server:
            tr, cp = await entry_points(transport)[1](Client, "127.0.0.1", port)
            for _ in range(20):
                tr.write(b"y" * 64)
                assert await cp.wait(64) == b"y" * 64
            # both ends, each with its transport (a protocol holds its transport)
            refs = [weakref.ref(tr), weakref.ref(cp), weakref.ref(served[0])]
            tr.close()
            await cp.lost
            await gone  # the server's end saw the EOF and closed
            del tr, cp, served[:]
            for _ in range(3):
                await asyncio.sleep(0)
            gc.collect()
            assert [r() for r in refs] == [None, None, None]

    run(main())


@pytest.mark.parametrize("transport", ["tcp", "rsock"])
@pytest.mark.parametrize("size", [5, 8 << 20])
def test_write_and_close_in_connection_made(transport: str, size: int, run: Any) -> None:
    """A server whose protocol writes and closes in ``connection_made`` (before
    the new transport ever polled): the client gets every byte, then EOF; 8 MiB
    does not fit the ring, so the rest waits in the transport's buffer and
    is flushed as the client reads."""
    blob = bytes(range(256)) * (size // 256) if size > 256 else b"hello"[:size]

    class Greeter(asyncio.Protocol):
        def connection_made(self, transport: Any) -> None:
            transport.write(blob)
            transport.close()

    async def main() -> bytes:
        server, port = await start_server(transport, Greeter)
        async with server:
            tr, cp = await entry_points(transport)[1](Client, "127.0.0.1", port)
            await cp.lost
            got = bytes(cp.buf)
            tr.close()
        return got

    got = run(main())
    assert len(got) == len(blob) and got == blob


@pytest.mark.parametrize("transport", ["tcp", "rsock"])
def test_first_bytes_reach_a_paused_server_only_on_resume(transport: str) -> None:
    """A server protocol that pauses reading in ``connection_made`` gets the
    client's first bytes (sent with the connect) only once it resumes, then
    all of them, in order.  On asyncio's loop (the oracle): uvloop's own TCP
    transport starts reading after ``connection_made`` whatever it asked."""
    events: list[str] = []

    class Paused(asyncio.Protocol):
        def connection_made(self, transport: Any) -> None:
            self.transport = transport
            transport.pause_reading()
            asyncio.get_running_loop().call_later(0.05, self.resume)

        def resume(self) -> None:
            events.append("resume")
            self.transport.resume_reading()

        def data_received(self, data: bytes) -> None:
            events.append(data.decode())
            if "".join(e for e in events if e != "resume").endswith("end"):
                self.transport.write(b"ok")
                self.transport.close()

    async def main() -> bytes:
        server, port = await start_server(transport, Paused)
        async with server:
            tr, cp = await entry_points(transport)[1](Client, "127.0.0.1", port)
            tr.write(b"first-end")
            await cp.lost
            got = bytes(cp.buf)
            tr.close()
        return got

    assert asyncio.run(asyncio.wait_for(main(), HANG)) == b"ok"
    assert events[0] == "resume" and "".join(events[1:]) == "first-end", events


@pytest.mark.parametrize("transport", ["tcp", "rsock"])
def test_empty_writes(transport: str, run: Any) -> None:
    """``write(b"")`` sends nothing and buffers nothing; between two real
    writes the peer gets exactly their bytes; after ``write_eof()`` it is
    the RuntimeError asyncio raises (also once aborted)."""

    async def main() -> None:
        server, tr, cp = await open_pair(transport)
        async with server:
            tr.write(b"")
            tr.write(bytearray())
            assert tr.get_write_buffer_size() == 0
            tr.write(b"ab")
            tr.write(b"")
            tr.write(b"cd")
            assert await cp.wait(4) == b"abcd"
            tr.write_eof()
            with pytest.raises(RuntimeError):
                tr.write(b"")
            tr.abort()
            with pytest.raises(RuntimeError):
                tr.write(b"")
            await cp.lost

    run(main())


@pytest.mark.parametrize("transport", ["tcp", "rsock"])
def test_peer_death_while_polled(transport: str, run: Any, monkeypatch: Any) -> None:
    """A peer killed while the connection is hot (polled, its liveness fd
    not watched yet): connection_lost once the poller cools it, within its
    budget (0.5 s here) and the second of peer-death detection.  Over TCP:
    the kernel's reset, at once."""
    import os
    import signal

    budget = 0.5
    monkeypatch.setenv("RSOCK_LOOP_POLL_US", str(int(budget * 1e6)))
    with hi_peer(transport) as (proc, port):

        async def main() -> float:
            tr, cp = await entry_points(transport)[1](Client, "127.0.0.1", port)
            assert await cp.wait(2) == b"hi"
            if transport == "rsock" and FAST_PROVIDER == "shm":  # (verbs: not polled)
                watch = tr._watch  # type: ignore[attr-defined]
                # hot from its start: the liveness fd is not watched yet
                assert tr._polled and not watch._live  # type: ignore[attr-defined]
            killed = time.monotonic()
            os.kill(proc.pid, signal.SIGKILL)
            await asyncio.wait_for(cp.lost, budget + 5)
            return time.monotonic() - killed

        elapsed = run(asyncio.wait_for(main(), HANG))
        assert elapsed < budget + 1.0 + 0.25


def test_liveness_fd_watched_once_cool(run: Any) -> None:
    """A connection polled from its start registers its liveness fd only
    when the poller cools it (a short connection never does); from then on
    it stays watched, hot or not."""
    if FAST_PROVIDER != "shm":
        pytest.skip("the loop polls shm connections only")

    async def main() -> None:
        server, tr, cp = await open_pair("rsock")
        async with server:
            watch = tr._watch  # type: ignore[attr-defined]
            loop = asyncio.get_running_loop()

            def watched(fd: int) -> bool:  # by the loop's hub (made at its first fd)
                hub = getattr(loop, "_rsock_hub", None)
                return hub is not None and fd in hub._cbs

            tr.write(b"x" * 64)
            assert await cp.wait(64) == b"x" * 64
            assert tr._polled  # type: ignore[attr-defined]
            assert not watch._live and not watched(watch.live_fd)
            deadline = time.monotonic() + 5
            while tr._polled and time.monotonic() < deadline:  # type: ignore[attr-defined]
                await asyncio.sleep(0.01)
            assert watch._live and watched(watch.live_fd)
            tr.write(b"y" * 64)  # hot again: still watched
            assert await cp.wait(64) == b"y" * 64
            assert tr._polled and watched(watch.live_fd)  # type: ignore[attr-defined]
            tr.close()
            await cp.lost
            live_fd = watch.live_fd
            assert live_fd >= 0 and not watched(live_fd)

    run(main())


def test_polling_budget_follows_the_peer(run: Any, monkeypatch: Any) -> None:
    """A connection whose peer talks only after quiet spells longer than
    twice the budget (a synchronous client thinking between requests) is
    polled for less and less after each from the second on, then not at all (the loop's
    reader wakes it; no CPU burnt on it); when the peer talks quickly
    again it is polled again."""
    if FAST_PROVIDER != "shm":
        pytest.skip("the loop polls shm connections only")
    budget_us = 2000
    monkeypatch.setenv("RSOCK_LOOP_POLL_US", str(budget_us))

    async def main() -> None:
        loop = asyncio.get_running_loop()
        got: list[Any] = []

        class Server(Echo):
            def connection_made(self, transport: Any) -> None:
                super().connection_made(transport)
                got.append(transport)

        server, port = await start_server("rsock", Server)
        async with server:
            tr, cp = await ra.create_connection(Client, "127.0.0.1", port)
            poller = loop._rsock_poller  # type: ignore[attr-defined]
            tr.write(b"hello")
            assert await cp.wait(5) == b"hello"
            st = got[0]
            budgets = []
            for _ in range(12):  # quiet spells of 10 ms, 5x the budget
                await asyncio.sleep(0.010)
                tr.write(b"x")
                assert await cp.wait(1) == b"x"
                budgets.append(st._poll_budget)
            # one long spell is not a tempo (a handshake's slow answer)
            assert budgets[0] == budget_us * 1000 > budgets[1], budgets
            assert all(b2 <= b1 for b1, b2 in zip(budgets, budgets[1:], strict=False)), budgets
            assert budgets[-1] < 5_000, budgets
            await asyncio.sleep(0.010)
            tr.write(b"y")
            assert await cp.wait(1) == b"y"
            assert st not in poller._hot  # woken by its reader, not polled
            for _ in range(20):  # quick round trips: the spells are short again
                tr.write(b"z")
                assert await cp.wait(1) == b"z"
            assert st._poll_budget >= 5_000 and st in poller._hot
            tr.close()
            await cp.lost

    run(main())


def _loop_sleeps() -> int:
    """Voluntary context switches of the calling thread (the loop's) so far."""
    with open(f"/proc/self/task/{threading.get_native_id()}/status") as f:
        return int(f.read().split("voluntary_ctxt_switches:")[1].split()[0])


_NEW_CONNECTIONS = """
import socket, sys, time
{imp}
for i in range({n}):
    time.sleep(0.001)
    c = {mod}.socket()
    c.settimeout(10)
    c.connect(("127.0.0.1", int(sys.argv[1])))
    c.sendall(b"%03d" % i)
    assert c.recv(3) == b"%03d" % i
    c.close()
"""


@pytest.mark.parametrize("transport", ["tcp", "rsock"])
@pytest.mark.parametrize("poll_us", ["0", "200000"])
def test_server_polls_for_the_next_connection(
    transport: str, poll_us: str, run: Any, monkeypatch: Any
) -> None:
    """A server whose client makes a new connection 1 ms after each one it
    closed (connect, request, echo, close): with the budget longer than
    that gap the loop, its last hot connection gone, goes on looking at
    its fds without sleeping for what was left of that connection's budget,
    and takes the next connection without being put to sleep and woken;
    with polling off it sleeps for each.  Every echo arrives (TCP: the
    oracle)."""
    import subprocess
    import sys

    monkeypatch.setenv("RSOCK_LOOP_POLL_US", poll_us)
    n = 60

    async def main() -> tuple[int, float]:
        closed = 0
        done = asyncio.get_running_loop().create_future()

        class Counted(Echo):
            def connection_lost(self, exc: Exception | None) -> None:
                nonlocal closed
                closed += 1
                if closed == n and not done.done():
                    done.set_result(None)

        server, port = await start_server(transport, Counted)
        imp, mod = ("import rsock", "rsock") if transport == "rsock" else ("", "socket")
        code = _NEW_CONNECTIONS.format(imp=imp, mod=mod, n=n)
        async with server:
            client = subprocess.Popen([sys.executable, "-c", code, str(port)])
            try:
                while closed < 1:
                    await asyncio.sleep(0.0005)
                before = _loop_sleeps()
                await asyncio.wait_for(done, HANG)
                slept = _loop_sleeps() - before
                wait = asyncio.get_running_loop().run_in_executor(None, client.wait, HANG)
                assert await wait == 0
                # nothing comes any more: the polling ends within its budget
                cpu = time.process_time()
                await asyncio.sleep(0.6)
                idle_cpu = time.process_time() - cpu
            finally:
                if client.poll() is None:
                    client.kill()
                    client.wait()
        return slept, idle_cpu

    slept, idle_cpu = run(main())
    assert idle_cpu < 0.4, f"{idle_cpu:.2f} s of CPU in 0.6 s with nothing to do"
    if transport == "rsock" and FAST_PROVIDER == "shm":  # (verbs: not polled)
        if poll_us == "0":
            assert slept >= 30, slept
        else:
            assert slept <= 6, slept
