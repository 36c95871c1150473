"""Helpers for the robustness tests (``test_robust_*.py``) and their child process.

Imported by the tests (process accounting: fds, rsock mappings, threads, RSS,
/dev/shm), and run as a script it is the other process of a robustness test:
``python robust_peer.py TRANSPORT MODE ARGS...``.  Like ``peer.py`` it reports on
stdout, one line per event, treats EOF on stdin as "let go", and dies with its
parent.

Modes (ROLE is ``server``: listen on 127.0.0.1:0, say ``PORT n``, accept one; or
``client``: connect to PORT):

  send-hold ROLE PORT NBYTES SEED
      sendall NBYTES seeded bytes, say ``SENT sha256``, then hold the connection
      without reading until stdin closes (or SIGKILL)
  send-exit ROLE PORT NBYTES SEED HOW
      sendall NBYTES seeded bytes, then exit without closing the socket: HOW is
      ``exit`` (normal interpreter exit) or ``_exit`` (os._exit: no cleanup at all)
  flood ROLE PORT SECONDS
      the sender of a stalled-consumer test: sends non-blocking until
      BlockingIOError, then keeps trying (non-blocking sends, and a blocking
      sendall in a thread) for SECONDS while sampling its own RSS; says
      ``STALLED json`` (accepted bytes, RSS samples); then waits for the reader
      to resume, finishes its sendall and says ``DONE json`` (bytes, sha256)
  hold-die ROLE PORT [NBYTES]
      say ``READY``, sendall NBYTES (default 0) seeded bytes (seed 5) and say
      ``SENT``, then read nothing and wait for one line on stdin: ``kill``
      (SIGKILL itself), ``_exit`` (os._exit), ``close`` (close the socket, then
      exit) or ``exit`` (interpreter exit with the socket still open)
  listen-die
      listen on 127.0.0.1:0 with backlog 8, say ``PORT n``, never accept; die
      by SIGKILL at a ``kill`` line on stdin
  hold-many PORT N [wait]
      (with ``wait``: first read a line from stdin) open N connections to PORT,
      send each its index as 4 bytes, say ``READY provider fds`` (fds: how many
      the N connections hold), hold them until stdin closes
"""

from __future__ import annotations

import hashlib
import json
import os
import random
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

from support import (
    TESTS_DIR,
    MiB,
    Peer,
    assert_fast_path,
    load_sockmod,
    provider_of,
    warm_thread,
)

SCRIPT = Path(__file__).resolve()

MEMFD_TAG = "/memfd:rsock"


# --------------------------------------------------------------------------- accounting


def trim(pid: int | str = "self") -> None:
    """In this process, drops the shared-memory arenas that no connection uses
    (rsk_trim): the engine keeps them a while for the next connections, a
    cache that fd and mapping counts leave out.  An arena a connection uses
    stays, and is counted."""
    if pid == "self" and "rsock._lowlevel" in sys.modules:
        sys.modules["rsock._lowlevel"].trim()


def fd_count(pid: int | str = "self") -> int:
    trim(pid)
    return len(os.listdir(f"/proc/{pid}/fd"))


def fd_links(pid: int | str = "self") -> dict[int, str]:
    trim(pid)
    out = {}
    for name in os.listdir(f"/proc/{pid}/fd"):
        try:
            out[int(name)] = os.readlink(f"/proc/{pid}/fd/{name}")
        except OSError:
            pass  # closed meanwhile
    return out


def rsock_maps(pid: int | str = "self") -> list[str]:
    """The mappings of rsock's shared-memory segments (memfds named ``rsock``)."""
    trim(pid)
    with open(f"/proc/{pid}/maps") as f:
        return [line.rstrip("\n") for line in f if MEMFD_TAG in line]


def shared_maps(pid: int | str = "self") -> list[str]:
    """Every shared (``s``) mapping of a process."""
    with open(f"/proc/{pid}/maps") as f:
        return [line.rstrip("\n") for line in f if line.split()[1].endswith("s")]


def thread_count(pid: int | str = "self") -> int:
    return len(os.listdir(f"/proc/{pid}/task"))


def thread_names(pid: int | str = "self") -> list[str]:
    """The names of a process's threads (to tell which one a leak is)."""
    names = []
    for t in os.listdir(f"/proc/{pid}/task"):
        try:
            with open(f"/proc/{pid}/task/{t}/comm") as f:
                names.append(f.read().strip())
        except (FileNotFoundError, ProcessLookupError):
            pass  # it ended meanwhile (between listdir and open, or the read)
    return sorted(names)


def status_kib(field: str, pid: int | str = "self") -> int:
    """A ``kB`` field of /proc/PID/status (VmRSS, RssAnon, RssShmem, ...)."""
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith(field + ":"):
                return int(line.split()[1])
    raise KeyError(field)


def rss_bytes(pid: int | str = "self") -> int:
    return status_kib("VmRSS", pid) * 1024


def dev_shm() -> set[str]:
    try:
        return set(os.listdir("/dev/shm"))
    except FileNotFoundError:
        return set()


class Snapshot:
    """fds, rsock mappings and threads of this process, to compare before/after."""

    def __init__(self) -> None:
        warm_thread()  # (its kick eventfd is the thread's, not a leak)
        self.fds = fd_links()
        self.maps = len(rsock_maps())
        self.threads = thread_count()

    def leaks(self, other: Snapshot) -> list[str]:
        out = []
        new_fds = {fd: link for fd, link in other.fds.items() if self.fds.get(fd) != link}
        if len(other.fds) > len(self.fds):
            out.append(f"fds {len(self.fds)} -> {len(other.fds)}: new {new_fds}")
        if other.maps > self.maps:
            out.append(f"rsock mappings {self.maps} -> {other.maps}")
        if other.threads > self.threads:
            out.append(f"threads {self.threads} -> {other.threads}: {thread_names()}")
        return out


def assert_no_leaks(before: Snapshot, settle_s: float = 2.0) -> None:
    """Compares with a fresh snapshot; threads that are finishing get ``settle_s``."""
    deadline = time.monotonic() + settle_s
    while True:
        leaks = before.leaks(Snapshot())
        if not leaks or time.monotonic() >= deadline:
            break
        time.sleep(0.02)
    assert not leaks, "; ".join(leaks)


# --------------------------------------------------------------------------- parent side


class RobustPeer(Peer):
    """A ``robust_peer.py`` child (``support.Peer``'s line protocol), with an
    optional environment (e.g. ``RSOCK_RING_SIZE``)."""

    def __init__(self, args: list[str], env: dict[str, str] | None = None) -> None:
        self.args = args
        self.proc = subprocess.Popen(
            [sys.executable, str(SCRIPT), *args],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            cwd=TESTS_DIR,
            env=None if env is None else {**os.environ, **env},
        )
        self._buf = b""


class RobustPeers:
    """Starts ``robust_peer.py`` children and kills whatever is left of them."""

    def __init__(self) -> None:
        self._all: list[RobustPeer] = []

    def start(self, *args: object, env: dict[str, str] | None = None) -> RobustPeer:
        peer = RobustPeer([str(a) for a in args], env)
        self._all.append(peer)
        return peer

    def cleanup(self) -> None:
        for peer in self._all:
            peer.cleanup()


# --------------------------------------------------------------------------- data


def recv_index(conn: Any) -> int:
    """The 4-byte index a ``hold-many`` connection sends first."""
    idx = b""
    while len(idx) < 4:
        chunk = conn.recv(4 - len(idx))
        assert chunk, "the connection ended before its index"
        idx += chunk
    return int.from_bytes(idx, "big")


def pattern(seed: int, n: int) -> bytes:
    return random.Random(seed).randbytes(n)


def sha256(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


# --------------------------------------------------------------------------- child side


def say(*fields: object) -> None:
    print(*fields, flush=True)


def wait_for_release() -> None:
    sys.stdin.buffer.read()


def establish(mod: Any, role: str, port: int) -> Any:
    if role == "server":
        with mod.socket(mod.AF_INET, mod.SOCK_STREAM) as listener:
            listener.bind(("127.0.0.1", 0))
            listener.listen(1)
            say("PORT", listener.getsockname()[1])
            listener.settimeout(60)
            sock, _ = listener.accept()
    else:
        sock = mod.socket(mod.AF_INET, mod.SOCK_STREAM)
        sock.settimeout(60)
        sock.connect(("127.0.0.1", port))
    sock.settimeout(None)
    return sock


def flood(sock: Any, seconds: float) -> None:
    chunk = pattern(7, MiB)
    digest = hashlib.sha256()
    # 1. non-blocking: fill whatever the connection holds
    sock.setblocking(False)
    accepted = 0
    while True:
        try:
            n = sock.send(chunk)
        except BlockingIOError:
            break
        digest.update(chunk[:n])
        accepted += n
    # 2. keep trying for a while, sampling our RSS: non-blocking sends, then a
    #    blocking sendall in a thread
    tail = chunk * 8
    rss = [rss_bytes()]
    eagain = 0
    end = time.monotonic() + seconds / 2
    while time.monotonic() < end:
        try:
            n = sock.send(chunk)
            digest.update(chunk[:n])
            accepted += n
        except BlockingIOError:
            eagain += 1
        if eagain % 64 == 0:
            rss.append(rss_bytes())
        time.sleep(0.0005)
    sock.setblocking(True)
    sent_in_thread = threading.Event()

    def blocked_sendall() -> None:
        sock.sendall(tail)
        sent_in_thread.set()

    t = threading.Thread(target=blocked_sendall, daemon=True)
    t.start()
    end = time.monotonic() + seconds / 2
    while time.monotonic() < end:
        rss.append(rss_bytes())
        time.sleep(0.02)
    say(
        "STALLED",
        json.dumps(
            {
                "accepted": accepted,
                "eagain": eagain,
                "rss": rss,
                "blocked": not sent_in_thread.is_set(),
            },
            separators=(",", ":"),
        ),
    )
    t.join(120)
    assert sent_in_thread.is_set()
    digest.update(tail)
    sock.shutdown(socket.SHUT_WR)
    say(
        "DONE",
        json.dumps(
            {"bytes": accepted + len(tail), "sha256": digest.hexdigest()}, separators=(",", ":")
        ),
    )


def die(how: str, sock: Any) -> None:
    """End this process as ``how`` says (see hold-die)."""
    if how == "kill":
        os.kill(os.getpid(), 9)
    if how == "_exit":
        os._exit(0)
    if how == "close":
        sock.close()
        return
    if how == "exit":
        globals()["kept"] = sock  # still open when the interpreter exits
        return
    raise SystemExit(f"robust_peer.py: unknown way to die {how!r}")


def main(argv: list[str]) -> int:
    from peer import die_with_parent

    die_with_parent()
    transport, mode, *args = argv
    mod = load_sockmod(transport)

    if mode == "send-hold":
        role, port, nbytes, seed = args[0], int(args[1]), int(args[2]), int(args[3])
        sock = establish(mod, role, port)
        with sock:
            assert_fast_path(transport, sock)
            say("READY", provider_of(transport, sock))
            data = pattern(seed, nbytes)
            sock.sendall(data)
            say("SENT", sha256(data))
            wait_for_release()
        return 0

    if mode == "send-exit":
        role, port, nbytes, seed, how = args[0], int(args[1]), int(args[2]), int(args[3]), args[4]
        sock = establish(mod, role, port)
        assert_fast_path(transport, sock)
        say("READY", provider_of(transport, sock))
        sock.sendall(pattern(seed, nbytes))
        if how == "_exit":
            os._exit(0)
        globals()["kept"] = sock  # still open when the interpreter exits
        return 0

    if mode == "flood":
        role, port, seconds = args[0], int(args[1]), float(args[2])
        sock = establish(mod, role, port)
        with sock:
            assert_fast_path(transport, sock)
            say("READY", provider_of(transport, sock))
            flood(sock, seconds)
            wait_for_release()
        return 0

    if mode == "hold-die":
        role, port = args[0], int(args[1])
        nbytes = int(args[2]) if len(args) > 2 else 0
        sock = establish(mod, role, port)
        assert_fast_path(transport, sock)
        say("READY", provider_of(transport, sock))
        sock.sendall(pattern(5, nbytes))
        say("SENT")
        die(sys.stdin.readline().strip(), sock)
        return 0

    if mode == "listen-die":
        listener = mod.socket(mod.AF_INET, mod.SOCK_STREAM)
        listener.bind(("127.0.0.1", 0))
        listener.listen(8)
        say("PORT", listener.getsockname()[1])
        die(sys.stdin.readline().strip(), listener)
        return 0

    if mode == "hold-many":
        port, n = int(args[0]), int(args[1])
        if len(args) > 2 and args[2] == "wait":
            sys.stdin.readline()  # the go-ahead
        socks = []
        fds0 = fd_count()
        try:
            for i in range(n):
                s = establish(mod, "client", port)
                socks.append(s)
                assert_fast_path(transport, s)
                s.sendall(i.to_bytes(4, "big"))
            say("READY", provider_of(transport, socks[0]), fd_count() - fds0)
            wait_for_release()
        finally:
            for s in socks:
                s.close()
        return 0

    raise SystemExit(f"robust_peer.py: unknown mode {mode!r}")


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
