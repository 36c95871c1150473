"""Slow and stalled consumers.

* A sender to a reader that stopped reading blocks (``BlockingIOError`` when
  non-blocking); while it keeps trying, its memory (RSS, measured in the sender
  process) does not grow: what it can have in flight is bounded by the ring
  (rsock: at most the ring size is accepted).  When the reader resumes, every
  byte arrives (checksummed).
* Messages sized around the credit-return thresholds (ring/4, ring/2, ring,
  each +-1, with a 64 KiB ring; and many tiny messages with 16 message credits)
  never stall, one-way or ping-pong.
"""

from __future__ import annotations

import hashlib
import json
import threading
import time
from types import ModuleType
from typing import Any

import pytest
from robust_peer import RobustPeers, pattern
from support import Background, MiB, assert_fast_path, connected_pair, provider_of

SMALL_RING = 65536


# --------------------------------------------------------------------------- stalled


@pytest.mark.timeout_s(90)
@pytest.mark.parametrize("ring", [SMALL_RING, 4 * MiB], ids=["ring64k", "ring4m"])
def test_stalled_reader_bounds_sender_memory_then_resumes(
    sockmod: ModuleType, transport: str, rpeers: RobustPeers, ring: int
) -> None:
    env = {"RSOCK_RING_SIZE": str(ring)}  # the client (the sender) sizes both rings
    with sockmod.socket(sockmod.AF_INET, sockmod.SOCK_STREAM) as listener:
        listener.settimeout(30)
        listener.bind(("127.0.0.1", 0))
        listener.listen(1)
        peer = rpeers.start(transport, "flood", "client", listener.getsockname()[1], 2, env=env)
        conn, _ = listener.accept()
    with conn:
        assert_fast_path(transport, conn)
        assert peer.expect("READY") == [provider_of(transport, conn)]
        if transport == "rsock":
            assert conn.rsock_opts()["ring_size"] == ring
        # we read nothing until the sender says it is stalled
        (stalled_json,) = peer.expect("STALLED", timeout=60)
        stalled = json.loads(stalled_json)
        rss = stalled["rss"]
        growth = max(rss) - rss[0]
        print(
            f"\n{transport} ring {ring}: sender accepted {stalled['accepted']} bytes before "
            f"stalling, {stalled['eagain']} BlockingIOErrors, RSS {rss[0] >> 10} KiB, "
            f"growth while stalled {growth >> 10} KiB over {len(rss)} samples"
        )
        assert stalled["eagain"] > 0, "non-blocking sends never raised BlockingIOError"
        assert stalled["blocked"], "sendall did not block although nobody reads"
        assert growth < 4 * MiB, f"the stalled sender's RSS grew by {growth} bytes"
        if transport == "rsock":
            assert stalled["accepted"] <= ring
        # resume: every byte arrives, in order
        conn.settimeout(60)
        digest = hashlib.sha256()
        total = 0
        buf = bytearray(MiB)
        while n := conn.recv_into(buf):
            digest.update(memoryview(buf)[:n])
            total += n
        (done_json,) = peer.expect("DONE", timeout=60)
        done = json.loads(done_json)
        assert (total, digest.hexdigest()) == (done["bytes"], done["sha256"])


def test_slow_reader_with_pauses(sockmod: ModuleType, transport: str, monkeypatch: Any) -> None:
    """A reader that keeps pausing: the sender blocks and resumes many times;
    every byte arrives in order, and (rsock) the sender really stalled on space."""
    monkeypatch.setenv("RSOCK_RING_SIZE", str(SMALL_RING))
    data = pattern(31, 4 * MiB + 3)
    client, server = connected_pair(sockmod)
    with client, server:
        client.settimeout(30)
        server.settimeout(30)
        sender = Background(lambda: client.sendall(data), name="sendall")
        got = bytearray()
        while len(got) < len(data):
            # bursts of reads, then a pause
            for _ in range(8):
                chunk = server.recv(min(16384, len(data) - len(got)))
                assert chunk
                got += chunk
                if len(got) == len(data):
                    break
            time.sleep(0.002)
        sender.result()
        assert got == data
        if transport == "rsock":
            assert client.stats()["space_stalls"] > 0


# --------------------------------------------------------------------------- thresholds

THRESHOLD_SIZES = {
    "1": 1,
    "ring/4-1": SMALL_RING // 4 - 1,
    "ring/4": SMALL_RING // 4,
    "ring/4+1": SMALL_RING // 4 + 1,
    "ring/2-1": SMALL_RING // 2 - 1,
    "ring/2": SMALL_RING // 2,
    "ring/2+1": SMALL_RING // 2 + 1,
    "3ring/4+1": 3 * SMALL_RING // 4 + 1,
    "ring-1": SMALL_RING - 1,
    "ring": SMALL_RING,
    "ring+1": SMALL_RING + 1,
    "2ring+1": 2 * SMALL_RING + 1,
}


def recv_exact_into(sock: Any, buf: memoryview) -> None:
    got = 0
    while got < len(buf):
        n = sock.recv_into(buf[got:])
        if n == 0:
            raise EOFError(f"EOF after {got} of {len(buf)} bytes")
        got += n


def ping_pong(client: Any, server: Any, size: int, rounds: int) -> None:
    """Each side sends ``size`` bytes and waits for the other's ``size`` bytes."""

    def echo() -> None:
        buf = memoryview(bytearray(size))
        for _ in range(rounds):
            recv_exact_into(server, buf)
            server.sendall(buf)

    echoer = Background(echo, name="echo")
    buf = memoryview(bytearray(size))
    for r in range(rounds):
        msg = pattern(r, size) if size > 1 else bytes([r & 0xFF])
        client.sendall(msg)
        recv_exact_into(client, buf)
        assert buf == msg, f"round {r}: echo differs"
    echoer.result()


def one_way(client: Any, server: Any, size: int, count: int, read_size: int) -> None:
    """``count`` messages of ``size`` back to back; the reader reads ``read_size``
    at a time (misaligned with the messages when they differ)."""
    total = size * count
    stream = pattern(size, total)
    digest = hashlib.sha256()

    def send() -> None:
        for i in range(count):
            client.sendall(stream[i * size : (i + 1) * size])

    sender = Background(send, name="send")
    buf = memoryview(bytearray(read_size))
    got = 0
    while got < total:
        n = server.recv_into(buf[: min(read_size, total - got)])
        assert n > 0
        digest.update(buf[:n])
        got += n
    sender.result()
    assert digest.hexdigest() == hashlib.sha256(stream).hexdigest()


@pytest.mark.parametrize("qdepth", [16, 256])
@pytest.mark.parametrize("size_name", sorted(THRESHOLD_SIZES, key=THRESHOLD_SIZES.__getitem__))
def test_threshold_sizes_never_stall(
    sockmod: ModuleType, transport: str, monkeypatch: Any, size_name: str, qdepth: int
) -> None:
    size = THRESHOLD_SIZES[size_name]
    monkeypatch.setenv("RSOCK_RING_SIZE", str(SMALL_RING))
    monkeypatch.setenv("RSOCK_QDEPTH", str(qdepth))
    client, server = connected_pair(sockmod)
    with client, server:
        if transport == "rsock":
            opts = client.rsock_opts()
            assert (opts["ring_size"], opts["qdepth"]) == (SMALL_RING, qdepth)
        # a stall would show as a timeout, not a hang
        client.settimeout(10)
        server.settimeout(10)
        rounds = 300 if size < 1024 else 24
        ping_pong(client, server, size, rounds)
        count = max(3, min(600, (8 * SMALL_RING) // size))
        one_way(client, server, size, count, read_size=size)
        one_way(client, server, size, count, read_size=max(1, size - 1))
        one_way(client, server, size, count, read_size=size + 1)


def test_many_tiny_messages_with_few_credits(
    sockmod: ModuleType, transport: str, monkeypatch: Any
) -> None:
    """5000 one-byte sends against 16 message credits, read one byte at a time and
    in bulk, and a reader thread that also sends: no credit deadlock."""
    monkeypatch.setenv("RSOCK_RING_SIZE", str(SMALL_RING))
    monkeypatch.setenv("RSOCK_QDEPTH", "16")
    client, server = connected_pair(sockmod)
    with client, server:
        client.settimeout(10)
        server.settimeout(10)
        n = 5000
        stop = threading.Event()

        def chatter() -> int:
            # the reader also writes one byte per 50 it reads: credits both ways
            got = 0
            while got < n:
                b = server.recv(1 if got % 2 else 64)
                assert b
                for byte in b:
                    assert byte == got & 0xFF, (byte, got)
                    got += 1
                    if got % 50 == 0:
                        server.send(b"!")
            stop.set()
            return got

        reader = Background(chatter, name="reader")
        for i in range(n):
            client.send(bytes([i & 0xFF]))
        assert reader.result() == n
        acks = b""
        while len(acks) < n // 50:
            acks += client.recv(n)
        assert acks == b"!" * (n // 50)


# --------------------------------------------------------------------------- no busy-polling


@pytest.mark.parametrize("blocked_in", ["recv", "sendall", "accept", "asyncio-idle"])
def test_blocked_calls_do_not_burn_cpu(
    sockmod: ModuleType, transport: str, blocked_in: str
) -> None:
    """A thread blocked for a second (in recv with nothing to read, in sendall to a
    reader that stopped, in accept, or an asyncio loop with an idle connection)
    costs (almost) no CPU: rsock spins only RSOCK_SPIN_US before sleeping."""
    client, server = connected_pair(sockmod)
    listener = sockmod.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen()
    try:
        for s in (client, server, listener):
            s.settimeout(1.0)

        def block() -> float:
            """The blocked call's own CPU time (this thread's only)."""
            cpu0 = time.thread_time()
            if blocked_in == "recv":
                with pytest.raises(TimeoutError):
                    client.recv(10)
            elif blocked_in == "sendall":
                with pytest.raises(TimeoutError):
                    while True:
                        client.sendall(b"s" * MiB)
            elif blocked_in == "accept":
                with pytest.raises(TimeoutError):
                    listener.accept()
            else:
                asyncio_idle(transport)
            return time.thread_time() - cpu0

        t0 = time.monotonic()
        cpu = Background(block, blocked_in).result(timeout=20)
        wall = time.monotonic() - t0
        print(f"\n{transport} blocked in {blocked_in}: {cpu * 1000:.1f} ms CPU in {wall:.2f} s")
        # sendall first fills the ring (copies), the rest is sleeping
        assert cpu < 0.15 + (0.1 if blocked_in == "sendall" else 0), f"{cpu:.3f} s CPU"
    finally:
        client.close()
        server.close()
        listener.close()


@pytest.mark.timeout_s(60)
def test_blocking_spin_follows_the_peer(monkeypatch: pytest.MonkeyPatch) -> None:
    """A blocking recv spins at most RSOCK_SPIN_US before it sleeps, and less on a
    connection whose answers take longer than that: no spin the budget
    allows catches them, so from the second
    such wait on, each halves the spin, until the call sleeps at once (no CPU
    burnt while it waits for a slow peer); answers that come within the budget
    again make it spin again, and the spin then catches them.  (rsock only: a
    kernel socket never spins.)"""
    import rsock

    monkeypatch.setenv("RSOCK_SPIN_US", "20000")  # 20 ms: a spin's CPU time shows
    client, server = connected_pair(rsock)
    delays = {b"s": 0.030, b"m": 0.004, b"q": 0.0}

    def serve() -> None:
        while True:
            b = server.recv(1)
            if not b:
                return
            time.sleep(delays[b])
            server.sendall(b)

    peer = Background(serve, "answer")
    try:

        def wait(kind: bytes) -> float:
            """One request; the CPU time of the wait for its answer."""
            client.sendall(kind)
            cpu0 = time.thread_time()
            assert client.recv(1) == kind
            return time.thread_time() - cpu0

        slow = [wait(b"s") for _ in range(14)]  # answers after 30 ms: 1.5x the budget
        print("\nCPU ms per slow wait:", [round(c * 1000, 1) for c in slow])
        # the first two spin the whole budget (one slow answer is not a tempo),
        # then each spins half the one before; the last sleeps at once
        assert slow[0] > 0.012 and slow[1] > 0.012, slow
        assert 0.002 < slow[2] < 0.016 and slow[6] < slow[2], slow
        assert slow[-1] < 0.002, slow
        for _ in range(20):  # quick answers: waits far shorter than the budget
            wait(b"q")
        medium = [wait(b"m") for _ in range(2)]  # answers after 4 ms
        sleeps = client.stats()["sleeps"]
        medium += [wait(b"m") for _ in range(4)]
        print("CPU ms per 4 ms wait:", [round(c * 1000, 1) for c in medium])
        # the budget grew to twice such a wait: the spin catches the answer
        # (it spins until it comes, and the call does not sleep)
        assert client.stats()["sleeps"] - sleeps <= 1
        assert sum(c > 0.002 for c in medium[2:]) >= 3, medium
    finally:
        client.close()
        peer.result(timeout=10)
        server.close()


def asyncio_idle(transport: str) -> None:
    import asyncio

    async def main() -> None:
        done = asyncio.Event()

        async def handle(r: asyncio.StreamReader, w: asyncio.StreamWriter) -> None:
            await r.read()
            w.close()
            done.set()

        if transport == "rsock":
            import rsock.asyncio as ra

            start_server, open_connection = ra.start_server, ra.open_connection
        else:
            start_server, open_connection = asyncio.start_server, asyncio.open_connection
        server = await start_server(handle, "127.0.0.1", 0)
        port = server.sockets[0].getsockname()[1]
        _r, w = await open_connection("127.0.0.1", port)
        await asyncio.sleep(1.0)  # idle: nothing to read or write on either side
        w.close()
        await w.wait_closed()
        await asyncio.wait_for(done.wait(), 5)
        server.close()
        await server.wait_closed()

    asyncio.run(main())


@pytest.mark.timeout_s(60)
def test_blocking_spin_stops_for_answers_a_little_slower_than_its_budget(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Answers that come a little after the spin budget (23 ms against 20 ms:
    requests at a fixed rate slightly slower than the cap): after the
    first few, a wait sleeps at once instead of spinning all of its budget
    and then sleeping anyway.  (rsock only.)"""
    import rsock

    monkeypatch.setenv("RSOCK_SPIN_US", "20000")
    client, server = connected_pair(rsock)

    def serve() -> None:
        while b := server.recv(1):
            time.sleep(0.023)
            server.sendall(b)

    peer = Background(serve, "answer")
    try:
        cpu = []
        for _ in range(14):
            client.sendall(b"x")
            cpu0 = time.thread_time()
            assert client.recv(1) == b"x"
            cpu.append(time.thread_time() - cpu0)
        print("\nCPU ms per wait:", [round(c * 1000, 1) for c in cpu])
        assert cpu[0] > 0.012, cpu  # (the first spins its budget)
        assert max(cpu[-3:]) < 0.004, cpu
    finally:
        client.close()
        peer.result(timeout=10)
        server.close()
