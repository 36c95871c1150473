"""Threads on one socket: no deadlock, no crash, no lost wake-up.

* one thread sends while another receives, on both ends, both directions at
  once (checksummed); several senders and several receivers on one socket;
* several threads blocked in ``recv`` on one socket all get data or EOF;
* several threads ``select``/``poll`` on the same fds and all see readiness;
* ``shutdown()`` from another thread wakes a thread blocked in ``recv`` or
  ``sendall`` (both transports: TCP does);
* ``close()`` from another thread wakes a thread blocked in ``recv``,
  ``recv_into``, ``sendall`` or ``accept`` with ``OSError(EBADF)`` at once: this
  is rsock's promise (README); Linux TCP leaves such a thread blocked (the call
  holds its own reference to the file), which the ``tcp`` variant documents.
"""

from __future__ import annotations

import errno
import functools
import hashlib
import random
import select
import socket
import threading
import time
from types import ModuleType
from typing import Any

import pytest
from robust_peer import Snapshot, assert_no_leaks, pattern
from support import Background, MiB, connected_pair, recv_stream, send_stream

WAKE_LIMIT_S = 1.0


# --------------------------------------------------------------------------- data


def test_duplex_two_threads_per_end(sockmod: ModuleType, transport: str) -> None:
    """Four threads: each end sends in one thread and receives in another."""
    client, server = connected_pair(sockmod)
    total = 24 * MiB
    with client, server:
        for s in (client, server):
            s.settimeout(60)

        def sender(sock: Any, seed: int) -> tuple[int, str]:
            result = send_stream(sock, seed, total)
            sock.shutdown(socket.SHUT_WR)
            return result

        threads = {
            "c-send": Background(lambda: sender(client, 1), "c-send"),
            "s-send": Background(lambda: sender(server, 2), "s-send"),
            "c-recv": Background(lambda: recv_stream(client, 3), "c-recv"),
            "s-recv": Background(lambda: recv_stream(server, 4), "s-recv"),
        }
        r = {name: t.result(timeout=120) for name, t in threads.items()}
    assert r["c-send"][0] == total and r["s-send"][0] == total
    assert r["s-recv"] == r["c-send"]
    assert r["c-recv"] == r["s-send"]
    assert r["c-send"][1] != r["s-send"][1]


def byte_histogram(data: bytes) -> list[int]:
    return [data.count(bytes([v])) for v in range(256)]


def test_several_senders_and_receivers_on_one_socket(sockmod: ModuleType, transport: str) -> None:
    """3 threads sendall on one socket while 3 threads recv on its peer: whatever the
    interleaving, every byte arrives exactly once (byte histogram), and every
    receiver wakes for the EOF."""
    client, server = connected_pair(sockmod)
    with client, server:
        client.settimeout(60)
        server.settimeout(60)

        def send(k: int) -> bytes:
            rng = random.Random(k)
            out = []
            for _ in range(300):
                size = rng.randint(1, 16384)
                msg = bytes([40 * k + rng.randrange(40)]) * size
                client.sendall(msg)
                out.append(msg)
            return b"".join(out)

        def receive(k: int) -> bytes:
            # recv (rsock: zero-copy) and recv_into (a copy) both at once
            rng = random.Random(100 + k)
            buf = bytearray(65536)
            chunks = []
            while True:
                size = rng.randint(1, 65536)
                if rng.random() < 0.5:
                    data = server.recv(size)
                else:
                    data = bytes(buf[: server.recv_into(buf, size)])
                if not data:
                    return b"".join(chunks)
                chunks.append(data)

        receivers = [Background(lambda k=k: receive(k), f"recv{k}") for k in range(3)]
        senders = [Background(lambda k=k: send(k), f"send{k}") for k in range(3)]
        sent = b"".join(s.result(timeout=60) for s in senders)
        client.shutdown(socket.SHUT_WR)
        received = b"".join(r.result(timeout=30) for r in receivers)
    assert len(received) == len(sent)
    assert byte_histogram(received) == byte_histogram(sent)


def test_threads_blocked_in_recv_all_wake(sockmod: ModuleType, transport: str) -> None:
    """6 threads block in recv(1): 6 bytes sent one at a time wake one thread each
    (no lost wake-up); then 6 more threads block, and the peer's close wakes them
    all with EOF."""
    client, server = connected_pair(sockmod)
    with client, server:
        server.settimeout(30)
        got: list[bytes] = []
        lock = threading.Lock()

        def recv_one() -> None:
            data = server.recv(1)
            with lock:
                got.append(data)

        first = [Background(recv_one, f"r{i}") for i in range(6)]
        time.sleep(0.1)
        for i in range(6):
            client.sendall(bytes([65 + i]))
            deadline = time.monotonic() + WAKE_LIMIT_S
            while len(got) < i + 1:
                assert time.monotonic() < deadline, f"byte {i} woke no thread"
                time.sleep(0.001)
        for t in first:
            t.result(timeout=5)
        assert sorted(got) == [bytes([65 + i]) for i in range(6)]
        got.clear()
        second = [Background(recv_one, f"e{i}") for i in range(6)]
        time.sleep(0.1)
        t0 = time.monotonic()
        client.close()
        for t in second:
            t.result(timeout=5)
        assert time.monotonic() - t0 < WAKE_LIMIT_S
        assert got == [b""] * 6


@pytest.mark.parametrize("call", ["recv", "recv_into"])
def test_threads_in_recv_all_see_eof(sockmod: ModuleType, transport: str, call: str) -> None:
    """Two threads read one socket until EOF while the peer sends 200 small messages
    and closes: both threads must see the EOF (30 rounds).  (With recv(), rsock's
    zero-copy receive used to leave the other thread asleep as fd waiter after
    rsk_recv_done: a lost wake-up, fixed in 9082a6b.)"""
    for rnd in range(30):
        client, server = connected_pair(sockmod)
        with client, server:
            got = [0, 0]

            def reader(k: int, server: Any = server, got: list[int] = got) -> None:
                buf = bytearray(100)
                while True:
                    n = len(server.recv(100)) if call == "recv" else server.recv_into(buf)
                    if not n:
                        return
                    got[k] += n

            threads = [Background(lambda k=k: reader(k), f"reader{k}") for k in range(2)]
            for _ in range(200):
                client.sendall(b"m" * 50)
            client.close()
            for t in threads:
                t._thread.join(3)
            stuck = [t._thread.name for t in threads if not t.done()]
            if stuck:
                server.close()  # wakes them (EBADF) so that nothing is left behind
                for t in threads:
                    t._thread.join(5)
            assert not stuck, f"round {rnd}: {stuck} still in {call} 3 s after the EOF"
            assert sum(got) == 200 * 50


# --------------------------------------------------------------------------- readiness


def select_readable(socks: list[Any], timeout: float) -> list[Any]:
    r, _, _ = select.select(socks, [], [], timeout)
    return r


def poll_readable(socks: list[Any], timeout: float) -> list[Any]:
    p = select.poll()
    by_fd = {s.fileno(): s for s in socks}
    for fd in by_fd:
        p.register(fd, select.POLLIN)
    return [by_fd[fd] for fd, _ in p.poll(timeout * 1000)]


@pytest.mark.parametrize("wait", [select_readable, poll_readable], ids=["select", "poll"])
def test_several_threads_selecting_on_the_same_fds(
    sockmod: ModuleType, transport: str, wait: Any
) -> None:
    """4 threads wait on the same two sockets; 60 times one byte arrives on one of
    them: every thread sees that socket (and only it) readable, promptly."""
    pairs = [connected_pair(sockmod) for _ in range(2)]
    try:
        servers = [p[1] for p in pairs]
        nthreads, rounds = 4, 60
        start = threading.Barrier(nthreads + 1, timeout=20)
        seen = threading.Barrier(nthreads + 1, timeout=20)
        results: list[list[Any]] = [[] for _ in range(nthreads)]
        waits: list[float] = [0.0] * nthreads

        def watcher(k: int) -> None:
            for _ in range(rounds):
                start.wait()
                t0 = time.monotonic()
                results[k] = wait(servers, 5.0)
                waits[k] = max(waits[k], time.monotonic() - t0)
                seen.wait()

        threads = [Background(lambda k=k: watcher(k), f"w{k}") for k in range(nthreads)]
        rng = random.Random(5)
        for r in range(rounds):
            start.wait()
            time.sleep(rng.uniform(0, 0.003))
            which = rng.randrange(2)
            pairs[which][0].sendall(b"x")
            seen.wait()
            for k in range(nthreads):
                assert results[k] == [servers[which]], f"round {r} thread {k}: {results[k]}"
            servers[which].settimeout(5)
            assert servers[which].recv(1) == b"x"
        for t in threads:
            t.result(timeout=10)
        assert max(waits) < WAKE_LIMIT_S, f"slowest wake-up {max(waits):.3f} s"
    finally:
        for c, s in pairs:
            c.close()
            s.close()


def test_threads_asking_a_new_connection_fileno_at_once(
    sockmod: ModuleType, transport: str
) -> None:
    """4 threads ask a fresh connection's ``fileno()`` for the first time at
    the same moment and poll it: each one wakes when a byte arrives.  (The
    engine used to give a thread that came in between another's switching
    on the exact fd a stand-in fd, swapped under it a moment later: its poll
    then slept to its timeout.)"""
    nthreads, conns = 4, 150
    rng = random.Random(7)
    for n in range(conns):
        client, server = connected_pair(sockmod)
        with client, server:
            start = threading.Barrier(nthreads + 1, timeout=20)

            def poller(start: threading.Barrier, server: Any) -> tuple[list[Any], float]:
                start.wait()
                t0 = time.monotonic()
                got = poll_readable([server], 3.0)
                return got, time.monotonic() - t0

            threads = [
                Background(functools.partial(poller, start, server), f"p{k}")
                for k in range(nthreads)
            ]
            start.wait()
            time.sleep(rng.uniform(0, 0.002))
            client.sendall(b"x")
            for k, t in enumerate(threads):
                got, took = t.result(timeout=10)
                assert got == [server], f"connection {n} thread {k}: {got}"
                assert took < WAKE_LIMIT_S, f"connection {n} thread {k} woke after {took:.3f} s"
            assert server.recv(1) == b"x"


# --------------------------------------------------------------------------- shutdown


def blocked_sendall(sock: Any) -> tuple[str, float]:
    t0 = time.monotonic()
    chunk = b"\x33" * MiB
    try:
        while True:
            sock.sendall(chunk)
    except OSError as e:
        return type(e).__name__, time.monotonic() - t0


def test_shutdown_rd_from_another_thread_wakes_recv(sockmod: ModuleType, transport: str) -> None:
    for how in (socket.SHUT_RD, socket.SHUT_RDWR):
        client, server = connected_pair(sockmod)
        with client, server:
            client.settimeout(10)
            blocked = Background(lambda c=client: c.recv(10), "recv")
            time.sleep(0.2)
            t0 = time.monotonic()
            client.shutdown(how)
            assert blocked.result(timeout=15) == b""
            assert time.monotonic() - t0 < WAKE_LIMIT_S


@pytest.mark.parametrize("how", [socket.SHUT_WR, socket.SHUT_RDWR], ids=["SHUT_WR", "SHUT_RDWR"])
def test_shutdown_wr_from_another_thread_wakes_sendall(
    sockmod: ModuleType, transport: str, how: int
) -> None:
    """shutdown(SHUT_WR) fails a sendall blocked in another thread at once with EPIPE,
    as TCP does.  (rsock's used to leave it blocked: fixed in 9082a6b.)"""
    client, server = connected_pair(sockmod)
    with client, server:
        client.settimeout(5)  # a lost wake-up ends as TimeoutError, not a hang
        blocked = Background(lambda: blocked_sendall(client), "sendall")
        time.sleep(0.3)  # the rings fill: sendall blocks
        assert not blocked.done()
        t0 = time.monotonic()
        client.shutdown(how)
        name, _ = blocked.result(timeout=15)
        woke_after = time.monotonic() - t0
        if transport == "tcp":
            assert name == "BrokenPipeError"
        assert name == "BrokenPipeError" and woke_after < WAKE_LIMIT_S, (name, woke_after)


# --------------------------------------------------------------------------- close


# Linux TCP leaves a call blocked when another thread closes the socket
# (test_tcp_close_... documents it); rsock wakes it: these run on rsock only.
RSOCK_ONLY = pytest.mark.parametrize("transport", ["rsock"])


@pytest.mark.parametrize("transport", ["tcp"])
def test_tcp_close_from_another_thread_does_not_wake_recv(
    sockmod: ModuleType, transport: str
) -> None:
    """The oracle's behaviour, for the record: on Linux a thread blocked in recv stays
    blocked after another thread closes the socket (the peer does not even see
    EOF); only shutdown() wakes it.  rsock deliberately differs (README)."""
    client, server = connected_pair(sockmod)
    with server:
        blocked = Background(lambda: client.recv(10), "recv")
        time.sleep(0.2)
        client.close()
        time.sleep(0.3)
        assert not blocked.done()
        server.settimeout(0.2)
        with pytest.raises(TimeoutError):
            server.recv(10)  # no EOF: the socket is not really closed yet
        server.sendall(b"x")  # data is what ends the blocked call
        assert blocked.result(timeout=5) == b"x"
        server.settimeout(5)
        assert server.recv(10) == b""  # and now the close completes


@RSOCK_ONLY
@pytest.mark.parametrize("op", ["recv", "recv_into", "recv_timeout", "sendall", "accept"])
def test_close_from_another_thread_wakes_blocked_call(
    sockmod: ModuleType, transport: str, op: str
) -> None:
    before = Snapshot()
    client, server = connected_pair(sockmod)
    listener = sockmod.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen()
    try:
        if op == "recv_timeout":
            client.settimeout(10)

        def call() -> Any:
            if op in ("recv", "recv_timeout"):
                return client.recv(10)
            if op == "recv_into":
                return client.recv_into(bytearray(10))
            if op == "sendall":
                return blocked_sendall(client)
            return listener.accept()

        def run() -> Any:
            try:
                return call()
            except OSError as e:
                return e

        blocked = Background(run, op)
        time.sleep(0.3)
        assert not blocked.done()
        t0 = time.monotonic()
        (listener if op == "accept" else client).close()
        result = blocked.result(timeout=10)
        assert time.monotonic() - t0 < WAKE_LIMIT_S
        if op == "sendall":
            assert result[0] == "OSError", result
        else:
            assert isinstance(result, OSError) and result.errno == errno.EBADF, result
        if op != "accept":
            # the close went through: the peer sees the end (data first, for sendall)
            server.settimeout(10)
            while data := server.recv(MiB):
                assert op == "sendall" and set(data) == {0x33}
    finally:
        client.close()
        server.close()
        listener.close()
    assert_no_leaks(before)


@RSOCK_ONLY
def test_close_racing_blocked_calls(sockmod: ModuleType, transport: str) -> None:
    """200 races of close() against a recv, send or recv_into starting in another
    thread at a random moment: every call ends promptly (data, EOF or an OSError),
    nothing crashes, nothing leaks."""
    before = Snapshot()
    rng = random.Random(9)
    outcomes: dict[str, int] = {}
    for i in range(200):
        client, server = connected_pair(sockmod)
        try:
            kind = rng.choice(["recv", "recv_into", "send", "sendall-big"])
            if rng.random() < 0.3:
                server.sendall(pattern(i, rng.randint(1, 5000)))

            def call(kind: str = kind, client: Any = client) -> str:
                try:
                    if kind == "recv":
                        return "data" if client.recv(4096) else "eof"
                    if kind == "recv_into":
                        return "data" if client.recv_into(bytearray(4096)) else "eof"
                    if kind == "send":
                        client.send(b"x" * 1000)
                        return "sent"
                    client.sendall(b"y" * (8 * MiB))
                    return "sent"
                except OSError as e:
                    return errno.errorcode.get(e.errno or 0, str(e.errno))

            t = Background(call, "racer")
            time.sleep(rng.uniform(0, 0.002))
            client.close()
            outcome = t.result(timeout=WAKE_LIMIT_S + 4)
            outcomes[f"{kind}:{outcome}"] = outcomes.get(f"{kind}:{outcome}", 0) + 1
        finally:
            client.close()
            server.close()
    print(f"\nclose races: {dict(sorted(outcomes.items()))}")
    assert_no_leaks(before)


def test_checksummed_traffic_survives_concurrent_close_of_other_sockets(
    sockmod: ModuleType, transport: str
) -> None:
    """While one connection streams 16 MiB (checksummed), other threads create and
    close connections in a tight loop: the stream is unaffected."""
    client, server = connected_pair(sockmod)
    stop = threading.Event()

    def churn() -> int:
        n = 0
        while not stop.is_set():
            c, s = connected_pair(sockmod)
            c.sendall(b"hi")
            c.close()
            s.close()
            n += 1
        return n

    churners = [Background(churn, f"churn{k}") for k in range(2)]
    try:
        data = pattern(77, 16 * MiB)
        sender = Background(lambda: client.sendall(data), "send")
        digest = hashlib.sha256()
        got = 0
        server.settimeout(30)
        while got < len(data):
            chunk = server.recv(MiB)
            assert chunk
            digest.update(chunk)
            got += len(chunk)
        sender.result(timeout=30)
        assert digest.hexdigest() == hashlib.sha256(data).hexdigest()
    finally:
        stop.set()
        churned = sum(c.result(timeout=30) for c in churners)
        client.close()
        server.close()
    assert churned > 0
