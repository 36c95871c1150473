"""Helpers shared by the tests and by ``peer.py`` (the child-process side).

No pytest imports here: ``peer.py`` runs as a plain script in a child process.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import random
import select
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from types import ModuleType
from typing import Any

TESTS_DIR = Path(__file__).resolve().parent
PEER_SCRIPT = TESTS_DIR / "peer.py"
FAST_PROVIDER = os.environ.get("RSOCK_PROVIDER") or "shm"  # make test-rdma: "verbs"
MiB = 1 << 20


_HI_PEER_SRC = (
    "import socket, sys, time\n"
    "mod = socket\n"
    "if sys.argv[1] == 'rsock':\n"
    "    import rsock as mod\n"
    "s = mod.socket(); s.bind(('127.0.0.1', 0)); s.listen(1)\n"
    "print(s.getsockname()[1], flush=True)\n"
    "c, _ = s.accept(); c.sendall(b'hi')\n"
    "time.sleep(60)\n"
)


@contextlib.contextmanager
def hi_peer(transport: str) -> Iterator[tuple[subprocess.Popen[str], int]]:
    """A peer process to kill: it listens on 127.0.0.1 (stdlib or rsock
    socket, by ``transport``), sends b"hi" to its first client, then sleeps.
    Yields (process, port); killed and reaped on the way out."""
    proc = subprocess.Popen(
        [sys.executable, "-c", _HI_PEER_SRC, transport], stdout=subprocess.PIPE, text=True
    )
    try:
        assert proc.stdout is not None
        yield proc, int(proc.stdout.readline())
    finally:
        proc.kill()
        proc.wait(10)
        if proc.stdout is not None:
            proc.stdout.close()


def load_sockmod(transport: str) -> ModuleType:
    """The module whose ``socket`` class a test uses: stdlib ``socket`` or ``rsock``."""
    if transport == "tcp":
        return socket
    if transport == "rsock":
        import rsock  # imported lazily: the tcp variants must not depend on it

        return rsock
    raise ValueError(f"unknown transport {transport!r}")


def provider_of(transport: str, sock: Any) -> str:
    """``sock.provider`` for rsock sockets, ``"tcp"`` for stdlib ones."""
    return str(sock.provider) if transport == "rsock" else "tcp"


def assert_fast_path(transport: str, *socks: Any) -> None:
    """On rsock, connected sockets must have taken the shared-memory fast path."""
    if transport == "rsock":
        for s in socks:
            assert s.provider == FAST_PROVIDER, f"{s!r} took {s.provider!r}"


_warm_threads: set[int] = set()


def warm_thread() -> None:
    """The engine keeps one kick eventfd per thread that ever waited on an rsock
    connection in bell mode (made at its first wait, closed when the thread
    ends: another thread's close or shutdown wakes the waiter through it).
    Makes the calling thread's now, so that a test that counts fds counts only
    its own."""
    tid = threading.get_ident()
    if tid in _warm_threads:
        return
    import rsock

    old = os.environ.get("RSOCK_WAKE")
    os.environ["RSOCK_WAKE"] = "bell"  # (read per connection)
    try:
        _wait_once(rsock, tid)
    finally:
        if old is None:
            del os.environ["RSOCK_WAKE"]
        else:
            os.environ["RSOCK_WAKE"] = old


def _wait_once(rsock: Any, tid: int) -> None:
    with rsock.socket() as listener:
        listener.bind(("127.0.0.1", 0))
        listener.listen()
        with rsock.create_connection(listener.getsockname(), timeout=10) as c:
            s, _ = listener.accept()
            with s:
                c.settimeout(0.01)
                try:
                    c.recv(1)
                except TimeoutError:
                    _warm_threads.add(tid)


def has_ipv6_loopback() -> bool:
    """True if a stdlib TCP connection over ::1 really works on this host."""
    if not socket.has_ipv6:
        return False
    try:
        with socket.socket(socket.AF_INET6, socket.SOCK_STREAM) as s:
            s.bind(("::1", 0))
            s.listen(1)
            with socket.create_connection(s.getsockname()[:2], timeout=5):
                pass
    except OSError:
        return False
    return True


def unused_port(family: int = socket.AF_INET, host: str = "127.0.0.1") -> int:
    """A port nobody listens on (bound by a stdlib socket, then released)."""
    with socket.socket(family, socket.SOCK_STREAM) as s:
        s.bind((host, 0))
        return int(s.getsockname()[1])


# --------------------------------------------------------------------------- threads


class Background:
    """Runs ``fn`` in a daemon thread; ``result()`` joins it and re-raises its exception."""

    def __init__(self, fn: Callable[[], Any], name: str = "bg") -> None:
        self._fn = fn
        self._value: Any = None
        self._error: BaseException | None = None
        self._thread = threading.Thread(target=self._run, name=name, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        try:
            self._value = self._fn()
        except BaseException as e:  # handed to the thread that calls result()
            self._error = e

    def done(self) -> bool:
        return not self._thread.is_alive()

    def result(self, timeout: float = 30.0) -> Any:
        self._thread.join(timeout)
        if self._thread.is_alive():
            raise TimeoutError(f"background thread {self._thread.name!r} still running")
        if self._error is not None:
            raise self._error
        return self._value


# --------------------------------------------------------------------------- socket pairs


def connected_pair(
    mod: ModuleType,
    family: int = socket.AF_INET,
    host: str = "127.0.0.1",
    timeout: float = 20.0,
) -> tuple[Any, Any]:
    """(client, server-side connection) through a fresh listener; accept runs in a thread."""
    listener = mod.socket(family, mod.SOCK_STREAM)
    try:
        listener.settimeout(timeout)
        listener.bind((host, 0))
        listener.listen(1)
        acceptor = Background(listener.accept, name="accept")
        client = mod.socket(family, mod.SOCK_STREAM)
        try:
            client.settimeout(timeout)
            client.connect(listener.getsockname())
            client.settimeout(None)
            conn, _ = acceptor.result(timeout)
        except BaseException:
            client.close()
            raise
        conn.settimeout(None)
        return client, conn
    finally:
        listener.close()


def recv_exact(sock: Any, n: int) -> bytes:
    chunks = []
    while n:
        data = sock.recv(min(n, MiB))
        if not data:
            raise EOFError(f"EOF with {n} bytes still expected")
        chunks.append(data)
        n -= len(data)
    return b"".join(chunks)


def recv_all(sock: Any, bufsize: int = 1 << 16) -> bytes:
    chunks = []
    while data := sock.recv(bufsize):
        chunks.append(data)
    return b"".join(chunks)


# --------------------------------------------------------------------------- streams


def log_uniform_size(rng: random.Random, max_bytes: int = MiB) -> int:
    """1 .. max_bytes, log-uniform: small and large sizes are both common."""
    return max(1, min(max_bytes, int(2 ** rng.uniform(0, max_bytes.bit_length() - 1))))


def send_stream(sock: Any, seed: int, total: int) -> tuple[int, str]:
    """Sends ``total`` seeded pseudo-random bytes in seeded random chunks (1 B .. 1 MiB).

    The bytes are slices at random offsets of a seeded random pool, so generating
    them costs nothing while every chunk still differs.  Returns (bytes, sha256).
    """
    rng = random.Random(seed)
    pool = memoryview(random.Random(seed ^ 0x5EED5EED).randbytes(4 * MiB))
    digest = hashlib.sha256()
    sent = 0
    while sent < total:
        size = min(total - sent, log_uniform_size(rng))
        offset = rng.randrange(len(pool) - size + 1)
        chunk = pool[offset : offset + size]
        digest.update(chunk)
        sock.sendall(chunk)
        sent += size
    return sent, digest.hexdigest()


def recv_stream(sock: Any, seed: int) -> tuple[int, str]:
    """Receives until EOF with seeded random sizes (1 B .. 1 MiB), mixing ``recv_into``
    and ``recv``.  Returns (bytes, sha256)."""
    rng = random.Random(seed)
    buf = memoryview(bytearray(MiB))
    digest = hashlib.sha256()
    received = 0
    while True:
        size = log_uniform_size(rng)
        if rng.random() < 0.75:
            n = sock.recv_into(buf[:size])
            assert 0 <= n <= size
            digest.update(buf[:n])
        else:
            data = sock.recv(size)
            n = len(data)
            assert n <= size
            digest.update(data)
        if n == 0:
            return received, digest.hexdigest()
        received += n


def duplex_stream(sock: Any, send_seed: int, recv_seed: int, total: int) -> dict[str, Any]:
    """Sends in one thread and receives in another, both at once; half-closes after sending."""

    def sender() -> tuple[int, str]:
        result = send_stream(sock, send_seed, total)
        sock.shutdown(socket.SHUT_WR)
        return result

    started = time.monotonic()
    tx = Background(sender, name="stream-send")
    rx_n, rx_sha = recv_stream(sock, recv_seed)
    tx_n, tx_sha = tx.result(timeout=600)
    return {
        "sent": tx_n,
        "sent_sha256": tx_sha,
        "received": rx_n,
        "received_sha256": rx_sha,
        "seconds": time.monotonic() - started,
    }


# --------------------------------------------------------------------------- peer processes


class Peer:
    """A ``tests/peer.py`` child process that reports on its stdout, one line per event."""

    def __init__(self, args: list[str]) -> None:
        self.args = args
        self.proc = subprocess.Popen(
            [sys.executable, str(PEER_SCRIPT), *args],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            cwd=TESTS_DIR,
        )
        self._buf = b""

    @property
    def pid(self) -> int:
        return self.proc.pid

    def readline(self, timeout: float = 30.0) -> str:
        assert self.proc.stdout is not None
        fd = self.proc.stdout.fileno()
        deadline = time.monotonic() + timeout
        while b"\n" not in self._buf:
            left = deadline - time.monotonic()
            if left <= 0:
                raise TimeoutError(f"peer {self.args} said nothing for {timeout:g} s")
            ready, _, _ = select.select([fd], [], [], left)
            if ready:
                data = os.read(fd, 65536)
                if not data:
                    code = self.proc.wait(10)
                    raise RuntimeError(f"peer {self.args} exited with {code} (see its stderr)")
                self._buf += data
        line, _, self._buf = self._buf.partition(b"\n")
        return line.decode()

    def expect(self, word: str, timeout: float = 30.0) -> list[str]:
        """Reads one line, checks that it starts with ``word``, returns the other fields."""
        line = self.readline(timeout)
        fields = line.split()
        if not fields or fields[0] != word:
            raise AssertionError(f"peer {self.args}: expected {word!r}, got {line!r}")
        return fields[1:]

    def release(self) -> None:
        """Closes the peer's stdin: a peer holding a connection then closes it and exits."""
        if self.proc.stdin is not None and not self.proc.stdin.closed:
            try:
                self.proc.stdin.close()
            except BrokenPipeError:
                pass

    def wait(self, timeout: float = 30.0) -> int:
        return self.proc.wait(timeout)

    def kill(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
        self.proc.wait(10)

    def cleanup(self) -> None:
        self.kill()
        self.release()
        if self.proc.stdout is not None:
            self.proc.stdout.close()


class Peers:
    """Starts ``tests/peer.py`` children and kills whatever is left of them."""

    def __init__(self) -> None:
        self._all: list[Peer] = []

    def start(self, *args: object) -> Peer:
        peer = Peer([str(a) for a in args])
        self._all.append(peer)
        return peer

    def cleanup(self) -> None:
        for peer in self._all:
            peer.cleanup()
