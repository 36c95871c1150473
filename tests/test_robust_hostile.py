"""Hostile or broken clients of an rsock listener.

* Plain TCP clients: whatever bytes they send (random, NULs, something that
  looks like rsock's handshake) are just TCP data to the application; clients
  that connect and close at once (or reset), hundreds of times, cost the
  listener nothing, and it keeps serving rsock and TCP clients.
* The rendezvous (the abstract SEQPACKET Unix socket rsock clients dial): a
  client of the same uid that sends garbage, a truncated or malformed request,
  wrong or too many fds, fake segments (unsealed, too small, no magic) is
  dropped or refused (REJ), every fd it passed is closed, and the next real
  client is served at once.
"""

from __future__ import annotations

import array
import asyncio
import contextlib
import errno
import hashlib
import mmap
import os
import random
import socket
import struct
import threading
import time
from collections.abc import Callable
from typing import Any

import pytest
from robust_peer import Snapshot, assert_no_leaks
from support import Background, recv_all

import rsock

# what native/src/cm_local.c and prov_shm.c use on the wire
CM_MAGIC = 0x434B5352
CM_REQ, CM_REJ, CM_REQ_SLOT = 1, 3, 4
ARENA_MAGIC = 0x414E4552414B5352
ARENA_HDR = 65536
PROTO_VERSION = 3  # the local handshake's (cm.h: CM_LOCAL_VERSION)
SHM_MAGIC = 0x4B53525348534D31
SERVE_LIMIT_S = 0.5


def rsock_listener(backlog: int = 128) -> Any:
    srv = rsock.socket()
    srv.bind(("127.0.0.1", 0))
    srv.listen(backlog)
    return srv


def assert_serves_rsock_client(srv: Any) -> None:
    """A real rsock client is accepted promptly, on the fast path, and echoed."""
    port = srv.getsockname()[1]
    srv.settimeout(10)
    t0 = time.monotonic()
    with rsock.create_connection(("127.0.0.1", port), timeout=10) as c:
        conn, _ = srv.accept()
        elapsed = time.monotonic() - t0
        with conn:
            assert c.provider == "shm" and conn.provider == "shm"
            c.sendall(b"ping")
            assert conn.recv(4) == b"ping"
    assert elapsed < SERVE_LIMIT_S, f"a real client waited {elapsed:.3f} s for accept"


# --------------------------------------------------------------------------- plain TCP

GARBAGE: dict[str, bytes] = {
    "random-64k": random.Random(1).randbytes(65536),
    "nul-bytes": bytes(4096),
    "one-byte": b"\xff",
    "fake-rsock-req": struct.pack(
        "<IBBHIIII", CM_MAGIC, PROTO_VERSION, CM_REQ, 0, 65536, 16, 65536, 16
    )
    + bytes(56),
    "fake-shm-header": struct.pack("<QII", SHM_MAGIC, 4096, 16) + bytes(500),
    "http": b"GET / HTTP/1.1\r\nHost: x\r\n\r\n" * 10,
}


@pytest.mark.parametrize("name", sorted(GARBAGE))
def test_plain_tcp_garbage_is_just_data(name: str) -> None:
    data = GARBAGE[name]
    before = Snapshot()
    with rsock_listener() as srv:
        srv.settimeout(10)
        port = srv.getsockname()[1]
        with socket.create_connection(("127.0.0.1", port), timeout=10) as c:
            conn, _ = srv.accept()
            with conn:
                assert conn.provider == "tcp"
                conn.settimeout(10)
                c.sendall(data)
                c.shutdown(socket.SHUT_WR)
                got = recv_all(conn)
                assert got == data
                conn.sendall(hashlib.sha256(got).digest())
            assert recv_all(c) == hashlib.sha256(data).digest()
        assert_serves_rsock_client(srv)
    assert_no_leaks(before)


@pytest.mark.parametrize("call", ["settimeout", "setblocking"])
def test_timeout_calls_on_a_tcp_path_connection(call: str) -> None:
    """settimeout/setblocking on a connection that took the tcp path (a plain TCP
    client of an rsock listener).  (They raised EBADF: fixed in 9082a6b.)"""
    with rsock_listener() as srv:
        srv.settimeout(10)
        with socket.create_connection(srv.getsockname(), timeout=10):
            conn, _ = srv.accept()
            with conn:
                assert conn.provider == "tcp"
                if call == "settimeout":
                    conn.settimeout(5)
                    assert conn.gettimeout() == 5
                else:
                    conn.setblocking(False)
                    assert not conn.getblocking()
                    with pytest.raises(BlockingIOError):
                        conn.recv(1)


def test_connect_close_storm_from_plain_tcp_clients() -> None:
    """400 plain TCP clients connect and go away at once (half of them with a reset,
    some after a few bytes) while an accept loop serves; meanwhile rsock and TCP
    echo clients are served normally; afterwards nothing is left behind."""
    before = Snapshot()
    srv = rsock_listener(backlog=1024)
    port = srv.getsockname()[1]
    stop = time.monotonic() + 60
    served = {"tcp": 0, "shm": 0, "eof": 0, "reset": 0, "data": 0}

    def accept_loop() -> None:
        srv.settimeout(0.2)
        while time.monotonic() < stop:
            try:
                conn, _ = srv.accept()
            except TimeoutError:
                continue
            except OSError as e:
                if e.errno == errno.EBADF:
                    return  # the listener was closed: the end
                raise
            with conn:
                served[conn.provider] += 1
                conn.settimeout(5)
                try:
                    data = conn.recv(64)
                except ConnectionResetError:
                    served["reset"] += 1
                    continue
                if not data:
                    served["eof"] += 1
                    continue
                served["data"] += 1
                if data.startswith(b"echo"):
                    conn.sendall(data)
                    # and drain to the end, as an echo server would
                    while more := conn.recv(64):
                        conn.sendall(more)

    acceptor = Background(accept_loop, "accept-loop")

    def echo_client(mod: Any, i: int) -> None:
        with mod.create_connection(("127.0.0.1", port), timeout=10) as c:
            msg = b"echo %d" % i
            c.sendall(msg)
            got = b""
            while len(got) < len(msg):
                chunk = c.recv(64)
                assert chunk
                got += chunk
            assert got == msg

    rng = random.Random(3)
    for i in range(400):
        c = socket.socket()
        c.connect(("127.0.0.1", port))
        r = rng.random()
        if r < 0.5:
            c.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
        elif r < 0.7:
            c.send(rng.randbytes(rng.randint(1, 64)))
        c.close()
        if i % 20 == 0:
            echo_client(rsock, i)
            echo_client(socket, i)
    try:
        # everything queued is served: wait until the loop has seen every client
        deadline = time.monotonic() + 30
        while served["tcp"] + served["shm"] < 400 + 40 and time.monotonic() < deadline:
            time.sleep(0.01)
        print(f"\nserved: {served}")
        assert served["tcp"] == 400 + 20 and served["shm"] == 20
        srv.setblocking(True)
        assert_serves_rsock_client_from_thread(port)
    finally:
        srv.close()
        acceptor.result(timeout=10)
    assert_no_leaks(before)


def assert_serves_rsock_client_from_thread(port: int) -> None:
    """The accept loop is running: a client is echoed by it."""
    t0 = time.monotonic()
    with rsock.create_connection(("127.0.0.1", port), timeout=10) as c:
        assert c.provider == "shm"
        c.settimeout(10)
        c.sendall(b"echo again")
        assert c.recv(64) == b"echo again"
    assert time.monotonic() - t0 < 2.0


def test_connect_close_storm_from_rsock_clients() -> None:
    """300 rsock clients connect and close at once; the listener accepts them
    afterwards (each gives EOF) and leaks nothing."""
    before = Snapshot()
    with rsock_listener(backlog=512) as srv:
        port = srv.getsockname()[1]
        for _ in range(300):
            c = rsock.socket()
            c.connect(("127.0.0.1", port))
            c.close()
        srv.settimeout(5)
        for _ in range(300):
            conn, _ = srv.accept()
            with conn:
                assert conn.provider == "shm"
                conn.settimeout(5)
                assert conn.recv(10) == b""
        srv.setblocking(False)
        with pytest.raises(BlockingIOError):
            srv.accept()
        srv.setblocking(True)
        assert_serves_rsock_client(srv)
    assert_no_leaks(before)


# --------------------------------------------------------------------------- rendezvous


def rendezvous(port: int) -> bytes:
    return b"\0rsock/4/127.0.0.1/%d" % port


def addr(port: int) -> bytes:
    return struct.pack("<HHII16s", socket.AF_INET, port, 0, 0, socket.inet_aton("127.0.0.1"))


def req(
    ring: int = 65536,
    q: int = 16,
    version: int = PROTO_VERSION,
    kind: int = CM_REQ,
    magic: int = CM_MAGIC,
) -> bytes:
    msg = struct.pack("<IBBHIIII", magic, version, kind, 0, ring, q, ring, q) + addr(1) + addr(2)
    assert len(msg) == 80
    return msg


def seg_size(ring: int, q: int) -> int:
    """prov_shm.c's segment size: header + CQ, page aligned, then the recv area."""
    area_off = (512 + q * 8 + 4095) & ~4095
    ctrl = (q * 16 + 63) & ~63
    return area_off + ctrl + ring


def fake_memfd(size: int, seals: int, magic: bool) -> int:
    fd = os.memfd_create("hostile", os.MFD_ALLOW_SEALING | os.MFD_CLOEXEC)
    os.ftruncate(fd, size)
    if magic:
        with mmap.mmap(fd, size) as m:
            m[:8] = struct.pack("<Q", SHM_MAGIC)
    if seals:
        import fcntl

        fcntl.fcntl(fd, fcntl.F_ADD_SEALS, seals)
    return fd


def sealed() -> int:
    import fcntl

    return int(fcntl.F_SEAL_SHRINK | fcntl.F_SEAL_GROW)


def pipe_fds(n: int) -> list[int]:
    fds: list[int] = []
    while len(fds) < n:
        fds.extend(os.pipe())
    for fd in fds[n:]:
        os.close(fd)
    return fds[:n]


def segment_fds(size: int, seals: int, magic: bool) -> list[int]:
    """REQ's two fds: the client's half and the server's."""
    return [fake_memfd(size, seals, magic), fake_memfd(size, seals, magic)]


GOOD_SIZE = seg_size(65536, 16)

# name -> (message, fds to pass); fds are made fresh per run
HANDSHAKES: dict[str, Callable[[], tuple[bytes, list[int]]]] = {
    "empty": lambda: (b"", []),
    "one-byte": lambda: (b"\x01", []),
    "short": lambda: (req()[:79], pipe_fds(2)),
    "long": lambda: (req() + b"x", pipe_fds(2)),
    "random-80": lambda: (random.Random(4).randbytes(80), []),
    "random-4k": lambda: (random.Random(5).randbytes(4096), pipe_fds(2)),
    "bad-magic": lambda: (req(magic=0xDEADBEEF), pipe_fds(2)),
    "req-without-fds": lambda: (req(), []),
    "req-with-1-fd": lambda: (req(), [fake_memfd(GOOD_SIZE, sealed(), True)]),
    "req-with-3-fds": lambda: (req(), [*segment_fds(GOOD_SIZE, sealed(), True), os.eventfd(0)]),
    "req-with-8-fds": lambda: (req(), pipe_fds(8)),
    "rej-kind": lambda: (req(kind=CM_REJ), []),
    "kind-99": lambda: (req(kind=99), pipe_fds(2)),
    "version-99": lambda: (req(version=99), pipe_fds(2)),
    # a REQ of version 1 (before the bells: four fds, eventfds among them)
    "version-1": lambda: (req(version=1), [*segment_fds(GOOD_SIZE, sealed(), True), *pipe_fds(2)]),
    "ring-not-pow2": lambda: (req(ring=65537), segment_fds(GOOD_SIZE, sealed(), True)),
    "ring-too-big": lambda: (req(ring=1 << 30), segment_fds(GOOD_SIZE, sealed(), True)),
    "qdepth-0": lambda: (req(q=0), segment_fds(GOOD_SIZE, sealed(), True)),
    "pipes-for-segments": lambda: (req(), pipe_fds(2)),
    "devnull-for-segments": lambda: (req(), [os.open("/dev/null", os.O_RDWR) for _ in range(2)]),
    "eventfds-for-segments": lambda: (req(), [os.eventfd(0), os.eventfd(0)]),
    "unsealed-memfds": lambda: (req(), segment_fds(GOOD_SIZE, 0, True)),
    "memfds-too-small": lambda: (req(), segment_fds(GOOD_SIZE - 4096, sealed(), True)),
    "memfds-without-magic": lambda: (req(), segment_fds(GOOD_SIZE, sealed(), False)),
    "memfds-claiming-256mib": lambda: (req(ring=1 << 28), segment_fds(GOOD_SIZE, sealed(), True)),
    # eventfd mode: the two memfds, then the client's and the server's eventfds
    "pipes-for-eventfds": lambda: (req(), [*segment_fds(GOOD_SIZE, sealed(), True), *pipe_fds(2)]),
    "memfds-for-eventfds": lambda: (
        req(),
        [*segment_fds(GOOD_SIZE, sealed(), True), *segment_fds(GOOD_SIZE, sealed(), True)],
    ),
    "pipe-for-the-servers-segment": lambda: (
        req(),
        [fake_memfd(GOOD_SIZE, sealed(), True), *pipe_fds(1)],
    ),
}


# --- REQ_SLOT: a slot of an arena (PROTOCOL.md, section 6)


def arena_half(ring: int, q: int) -> int:
    return (seg_size(ring, q) + 4095) & ~4095


def slot_req(slot: int = 0, gen: int = 0, ring: int = 65536, q: int = 16) -> bytes:
    msg = struct.pack("<IBBHIIII", CM_MAGIC, PROTO_VERSION, CM_REQ_SLOT, 0, ring, q, slot, gen)
    return msg + addr(1) + addr(2)


def fake_arena(
    ring: int = 65536,
    q: int = 16,
    words: dict[int, int] | None = None,
    seals: int | None = None,
    size: int | None = None,
    half: int | None = None,
    magic: bool = True,
    halves: bool = True,
) -> int:
    """An arena as a client makes one, with one chunk (64 slots) and slot 0
    claimed (generation 0, bit C), or with the one defect asked for."""
    import fcntl

    h = arena_half(ring, q)
    fd = os.memfd_create("hostile", os.MFD_ALLOW_SEALING | os.MFD_CLOEXEC)
    os.ftruncate(fd, ARENA_HDR + 64 * 2 * h if size is None else size)
    half = h if half is None else half
    hdr = struct.pack("<QIIIIQ", ARENA_MAGIC if magic else 0, ring, q, 64, 0, half)
    os.pwrite(fd, hdr, 0)
    for i, w in ({0: 1} if words is None else words).items():
        os.pwrite(fd, struct.pack("<I", w), 64 + 4 * i)
    if halves:
        os.pwrite(fd, struct.pack("<QII", SHM_MAGIC, ring, q), ARENA_HDR)
        os.pwrite(fd, struct.pack("<QII", SHM_MAGIC, ring, q), ARENA_HDR + h)
    fcntl.fcntl(fd, fcntl.F_ADD_SEALS, fcntl.F_SEAL_SHRINK if seals is None else seals)
    return fd


def slot_fds(**kw: Any) -> list[int]:
    """REQ_SLOT's one fd: the arena."""
    return [fake_arena(**kw)]


ARENA_GOOD = ARENA_HDR + 64 * 2 * arena_half(65536, 16)

HANDSHAKES.update(
    {
        "slot-beyond-the-file": lambda: (slot_req(slot=64), slot_fds(words={64: 1})),
        "slot-huge-index": lambda: (slot_req(slot=1 << 31), slot_fds()),
        "slot-of-another-generation": lambda: (slot_req(gen=16), slot_fds()),
        "slot-not-claimed": lambda: (slot_req(), slot_fds(words={0: 0})),
        "slot-held-by-a-server": lambda: (slot_req(), slot_fds(words={0: 3})),
        "slot-gen-with-state-bits": lambda: (slot_req(gen=1), slot_fds()),
        "slot-unsealed-arena": lambda: (slot_req(), slot_fds(seals=0)),
        "slot-arena-chunk-cut-short": lambda: (slot_req(), slot_fds(size=ARENA_GOOD - 4096)),
        "slot-arena-header-only": lambda: (slot_req(), slot_fds(size=ARENA_HDR)),
        "slot-arena-wrong-half": lambda: (slot_req(), slot_fds(half=12345)),
        "slot-arena-shrinkable": lambda: (slot_req(), slot_fds(seals=sealed() & ~0x2)),
        "slot-arena-without-magic": lambda: (slot_req(), slot_fds(magic=False)),
        "slot-arena-ring-not-pow2": lambda: (slot_req(ring=65537), slot_fds(ring=65537)),
        "slot-halves-without-magic": lambda: (slot_req(), slot_fds(halves=False)),
        "slot-geometry-not-the-arenas": lambda: (slot_req(ring=131072), slot_fds()),
        "slot-pipe-for-arena": lambda: (slot_req(), pipe_fds(1)),
        "slot-segment-for-arena": lambda: (slot_req(), [fake_memfd(GOOD_SIZE, sealed(), True)]),
        "slot-with-4-fds": lambda: (slot_req(), [*slot_fds(), *(os.eventfd(0) for _ in range(3))]),
        "slot-pipes-for-eventfds": lambda: (slot_req(), [fake_arena(), *pipe_fds(2)]),
        "slot-with-2-fds": lambda: (slot_req(), [fake_arena(), os.eventfd(0)]),
        "slot-without-fds": lambda: (slot_req(), []),
    }
)


def send_handshake(sock: socket.socket, msg: bytes, fds: list[int]) -> None:
    anc = [(socket.SOL_SOCKET, socket.SCM_RIGHTS, array.array("i", fds).tobytes())] if fds else []
    sock.sendmsg([msg], anc)


@pytest.mark.parametrize("name", sorted(HANDSHAKES))
def test_rendezvous_garbage_is_dropped(name: str) -> None:
    before = Snapshot()
    with rsock_listener() as srv:
        port = srv.getsockname()[1]
        msg, fds = HANDSHAKES[name]()
        with socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET) as u:
            u.connect(rendezvous(port))
            send_handshake(u, msg, fds)
            for fd in fds:
                os.close(fd)
            # the listener drops or refuses it and serves the next client at once
            assert_serves_rsock_client(srv)
            u.settimeout(5)
            answer, anc, _flags, _ = u.recvmsg(256, 256)
            assert not anc, "the listener passed fds back"
            if answer:
                magic, _version, kind, reason = struct.unpack_from("<IBBH", answer)
                assert (len(answer), magic, kind) == (80, CM_MAGIC, CM_REJ), answer
                assert reason in (
                    errno.EPROTO,
                    errno.EPROTONOSUPPORT,
                    errno.EINVAL,
                    errno.ECONNRESET,  # REQ_SLOT: not the slot's generation
                ), reason
                assert u.recv(256) == b""  # then it hangs up
        srv.setblocking(False)
        with pytest.raises(BlockingIOError):
            srv.accept()
    assert_no_leaks(before)


def forge_segment_connection(port: int) -> socket.socket:
    """A hand-made REQ client with well-formed segments of its own (bell mode:
    no eventfds), its handshake sent."""
    u = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    u.connect(rendezvous(port))
    fds = segment_fds(GOOD_SIZE, sealed(), True)
    try:
        send_handshake(u, req(), fds)
    finally:
        for fd in fds:
            os.close(fd)
    return u


def test_forged_valid_handshake_is_accepted() -> None:
    """The control for the cases above: the same hand-made request with well-formed
    segments is accepted (so each refusal above is due to its one defect), and
    when the forger goes away the connection is reset, leaking nothing."""
    before = Snapshot()
    with rsock_listener() as srv:
        port = srv.getsockname()[1]
        with forge_segment_connection(port):
            srv.settimeout(5)
            conn, _ = srv.accept()
        with conn:
            assert conn.provider == "shm"
            assert conn.rsock_opts()["ring_size"] == 65536
            conn.settimeout(5)
            with pytest.raises(ConnectionResetError):
                conn.recv(10)
        assert_serves_rsock_client(srv)
    assert_no_leaks(before)


def forge_slot_connection(port: int, arena: int, slot: int, gen: int) -> socket.socket:
    """A hand-made REQ_SLOT client on slot ``slot`` of ``arena`` (fd kept)."""
    u = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    u.connect(rendezvous(port))
    send_handshake(u, slot_req(slot=slot, gen=gen), [arena])
    return u


def test_forged_valid_slot_handshake_and_a_rewritten_arena_header() -> None:
    """A hand-made REQ_SLOT on a well-formed arena is accepted (the control for the
    slot cases above); then the forger rewrites the arena's header to claim another
    ring size and asks for a slot of that size, and for a slot past the end of the
    file: the server goes by the header it read when it first mapped the arena and
    by the file's size, and refuses both.  When the forger goes away the server's
    end clears its bit.  Nothing leaks."""
    before = Snapshot()
    with rsock_listener() as srv:
        port = srv.getsockname()[1]
        arena = fake_arena(words={0: 1, 1: 1, 100: 1})
        try:
            u = forge_slot_connection(port, arena, 0, 0)
            srv.settimeout(5)
            conn, _ = srv.accept()
            with conn, u:
                assert conn.provider == "shm"
                assert conn.rsock_opts()["ring_size"] == 65536
                # the slot is the server's too now: bits C and S
                assert struct.unpack("<I", os.pread(arena, 4, 64))[0] == 3
                os.pwrite(arena, struct.pack("<I", 131072), 8)  # ring_size
                for slot, ring in ((1, 131072), (100, 65536)):
                    u2 = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
                    with u2:
                        u2.connect(rendezvous(port))
                        send_handshake(u2, slot_req(slot=slot, ring=ring), [arena])
                        # accept() refuses it, and serves the next client
                        assert_serves_rsock_client(srv)
                        u2.settimeout(5)
                        answer = u2.recv(256)
                        assert struct.unpack_from("<IBBH", answer)[2:] == (CM_REJ, errno.EPROTO)
                        assert u2.recv(256) == b""
            # the forger went away and the server closed first: its bit S is
            # replaced by D (done), which tells the client's end to free the slot
            assert struct.unpack("<I", os.pread(arena, 4, 64))[0] == 1 | 8
        finally:
            os.close(arena)
    assert_no_leaks(before)


def test_rendezvous_client_that_hangs_up_at_once() -> None:
    before = Snapshot()
    with rsock_listener() as srv:
        port = srv.getsockname()[1]
        for _ in range(50):
            with socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET) as u:
                u.connect(rendezvous(port))
        assert_serves_rsock_client(srv)
    assert_no_leaks(before)


def test_silent_rendezvous_client_does_not_stall_accept() -> None:
    """Clients that connected to the rendezvous but send no request do not hold up
    accept(): a non-blocking accept returns at once, a real client behind them is
    served at once.  (accept() used to wait up to 1 s for each: fixed in 9082a6b.)"""
    with rsock_listener() as srv:
        port = srv.getsockname()[1]
        silent = []
        try:
            for _ in range(3):
                u = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
                silent.append(u)
                u.connect(rendezvous(port))
            srv.setblocking(False)
            t0 = time.monotonic()
            with pytest.raises(BlockingIOError):
                srv.accept()
            elapsed = time.monotonic() - t0
            assert elapsed < 0.2, f"a non-blocking accept took {elapsed:.3f} s"
            srv.setblocking(True)
            assert_serves_rsock_client(srv)
        finally:
            for u in silent:
                u.close()


def test_silent_rendezvous_client_does_not_freeze_asyncio_server() -> None:
    """The same for an asyncio server: its loop keeps running."""
    import rsock.asyncio as ra

    async def main() -> float:
        async def handle(r: asyncio.StreamReader, w: asyncio.StreamWriter) -> None:
            w.close()

        server = await ra.start_server(handle, "127.0.0.1", 0)
        port = server.sockets[0].getsockname()[1]
        worst = 0.0
        u = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        try:
            u.connect(rendezvous(port))
            for _ in range(30):
                t0 = time.monotonic()
                await asyncio.sleep(0.01)
                worst = max(worst, time.monotonic() - t0 - 0.01)
        finally:
            u.close()
            server.close()
            await server.wait_closed()
        return worst

    worst = asyncio.run(asyncio.wait_for(main(), 20))
    assert worst < 0.2, f"the event loop froze for {worst:.3f} s"


def test_peer_that_turns_our_eventfd_blocking_cannot_hang_us() -> None:
    """The client makes the server's notify eventfd and keeps a copy: the file's
    flags are shared, so it can turn O_NONBLOCK back off after the handshake
    (which set it).  Reading that eventfd (the engine acknowledges a wake-up when
    an event loop starts watching, with nothing to read) must still never block:
    watch().start() returns at once, and the connection serves on."""
    before = Snapshot()
    with rsock_listener() as srv:
        port = srv.getsockname()[1]
        arena = fake_arena()
        ev_client, ev_server = os.eventfd(0), os.eventfd(0)
        try:
            with socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET) as u:
                u.connect(rendezvous(port))
                send_handshake(u, slot_req(), [arena, ev_client, ev_server])
                srv.settimeout(5)
                conn, _ = srv.accept()
                with conn:
                    os.set_blocking(ev_server, True)  # the server's copy too
                    done = threading.Event()

                    def start() -> None:
                        conn.watch().start()
                        done.set()

                    t = threading.Thread(target=start, daemon=True)
                    t.start()
                    assert done.wait(5), "reading the peer's blocking eventfd hung"
                assert_serves_rsock_client(srv)
        finally:
            for fd in (arena, ev_client, ev_server):
                os.close(fd)
    assert_no_leaks(before)


def send_records(u: socket.socket, what: str) -> None:
    """What a hostile peer puts on the liveness channel (the rendezvous socket,
    which carries bells: records of one zero byte) after its handshake."""
    if what == "bell-flood":  # as many bells as the socket takes
        u.setblocking(False)
        with contextlib.suppress(BlockingIOError):
            while True:
                u.send(b"\0")
        u.setblocking(True)
    elif what == "bell-with-an-fd":
        ev = os.eventfd(0)
        try:
            send_handshake(u, b"\0", [ev])
        finally:
            os.close(ev)
    elif what == "other-byte":
        u.send(b"\1")
    elif what == "junk-record":
        u.send(b"abc")
    elif what == "empty-record":
        u.send(b"")
    elif what == "second-request":
        send_handshake(u, req(), [])


@pytest.mark.parametrize(
    "what",
    [
        "bell-flood",
        "bell-with-an-fd",
        "other-byte",
        "junk-record",
        "empty-record",
        "second-request",
    ],
)
def test_liveness_channel_records(what: str) -> None:
    """A forged peer's records on the liveness channel after the handshake.  Bells,
    however many, only wake the connection (a blocking recv still waits for data,
    and times out); anything else (a bell with an fd attached, another byte, a
    longer record, an empty one) ends it with ECONNRESET; no fd passed along is
    ever installed, nothing hangs or leaks."""
    before = Snapshot()
    with rsock_listener() as srv:
        port = srv.getsockname()[1]
        with forge_segment_connection(port) as u:
            srv.settimeout(5)
            conn, _ = srv.accept()
            with conn:
                send_records(u, what)
                t0 = time.monotonic()
                if what == "bell-flood":
                    conn.settimeout(0.3)
                    with pytest.raises(TimeoutError):
                        conn.recv(10)
                    assert time.monotonic() - t0 < 3
                    u.close()  # then it goes: a reset (no FIN came)
                conn.settimeout(5)
                with pytest.raises(ConnectionResetError):
                    conn.recv(10)
                assert time.monotonic() - t0 < 4
        assert_serves_rsock_client(srv)
    assert_no_leaks(before)
