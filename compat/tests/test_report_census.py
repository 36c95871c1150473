"""``python -m rsock run --report`` and ``RSOCK_FALLBACK=strict`` see the
kernel TCP connections made outside Python's ``socket`` module (a C
extension's: grpcio, pyzmq; here ``_socket.socket`` used directly and
libc's ``socket``/``connect`` through ctypes), which the patch cannot reach:
``unseen:tcp`` (rsock._census).  rsock's own connections, and the kernel
sockets it makes or hands to the stdlib (counted under their own keys),
are never counted there."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

# a kernel TCP connection with both ends made by the C socket type (the
# patch replaces socket.socket, never _socket.socket); the rsock listener
# and connection beside it are rsock's
C_PAIR = """
    import _socket, socket, sys, time
    ls = _socket.socket(_socket.AF_INET, _socket.SOCK_STREAM)
    ls.bind(("127.0.0.1", 0))
    ls.listen()
    c = _socket.socket(_socket.AF_INET, _socket.SOCK_STREAM)
    c.connect(ls.getsockname())
    a = _socket.socket(fileno=ls._accept()[0])
    srv = socket.create_server(("127.0.0.1", 0))
    cli = socket.create_connection(srv.getsockname())
    conn, _ = srv.accept()
    c.send(b"hello")
    print(a.recv(5).decode(), flush=True)
    time.sleep(float(sys.argv[1]))
    if sys.argv[2] == "close":
        c.close()
        a.close()
    sys.exit(3)
"""

# libc's socket() and connect() through ctypes, to an rsock listener: a plain
# TCP client to it (accept:tcp on the listener's side, whose kernel socket
# rsock made); the client's end is nobody's
CTYPES_CLIENT = """
    import ctypes, socket, struct, time
    srv = socket.create_server(("127.0.0.1", 0))
    host, port = srv.getsockname()
    libc = ctypes.CDLL(None, use_errno=True)
    fd = libc.socket(socket.AF_INET, socket.SOCK_STREAM, 0)
    addr = struct.pack("=H", socket.AF_INET) + struct.pack("!H", port) + socket.inet_aton(host)
    addr += bytes(8)
    assert libc.connect(fd, addr, len(addr)) == 0, ctypes.get_errno()
    conn, _ = srv.accept()
    assert libc.send(fd, b"hello", 5, 0) == 5
    print(conn.recv(5).decode(), flush=True)
    time.sleep(2.5)
    libc.close(fd)
    conn.close()
"""

# rsock's connections and every kernel socket rsock makes or hands to the
# stdlib, held longer than the census's period, in the top process and in a
# fork child that inherits them: a shm connection (and one whose client bound
# first), the kernel listener beside an rsock listener, multiprocessing.
# connection's kernel sockets (kernel:tcp), a subclass's (kernel:tcp, its
# client accepted over TCP: accept:tcp), a TCP fallback to a plain Python
# server (connect:tcp) and a dup of it by fromfd
RSOCK_ONLY = """
    import os, socket, subprocess, sys, time
    from multiprocessing.connection import Client, Listener
    srv = socket.create_server(("127.0.0.1", 0))
    pairs = [(socket.create_connection(srv.getsockname()), srv.accept()[0])]
    b = socket.socket()
    b.bind(("127.0.0.1", 0))
    b.connect(srv.getsockname())
    pairs.append((b, srv.accept()[0]))
    lst = Listener(("127.0.0.1", 0))
    mp = (Client(lst.address), lst.accept())
    tcp = sys.argv[1] == "tcp"  # (RSOCK_FALLBACK=strict refuses both of these)
    if tcp:
        class Sub(socket.socket):
            pass
        sub = Sub()
        sub.connect(srv.getsockname())
        pairs.append((sub, srv.accept()[0]))
        plain = {k: v for k, v in os.environ.items() if k != "RSOCK_RUN"}
        serve = (
            "import socket; s = socket.create_server(('127.0.0.1', 0)); "
            "print(s.getsockname()[1], flush=True); c, _ = s.accept(); c.recv(1)"
        )
        child = subprocess.Popen(
            [sys.executable, "-c", serve], env=plain, stdout=subprocess.PIPE, text=True
        )
        fb = socket.create_connection(("127.0.0.1", int(child.stdout.readline())))
        dup = socket.fromfd(fb.fileno(), socket.AF_INET, socket.SOCK_STREAM)
    for c, a in pairs:
        c.sendall(b"x")
        assert a.recv(1) == b"x"
    mp[0].send("x")
    assert mp[1].recv() == "x"
    time.sleep(2.5)
    pid = os.fork()
    if pid == 0:
        time.sleep(1.5)
        os._exit(0)
    os.waitpid(pid, 0)
    if tcp:
        fb.sendall(b"x")
        child.wait()
    print("ok")
"""

# connections in a fork child: the parent's pair (2), counted before the
# fork, comes along and is not counted again; the child's own pair (2) is
# counted at its os._exit, before the sampler looks
FORKED = """
    import _socket, os, time
    def pair():
        ls = _socket.socket()
        ls.bind(("127.0.0.1", 0))
        ls.listen()
        c = _socket.socket()
        c.connect(ls.getsockname())
        return ls, c, ls._accept()[0]
    mine = pair()
    time.sleep(2.5)
    pid = os.fork()
    if pid == 0:
        theirs = pair()
        os._exit(0)
    os.waitpid(pid, 0)
    print("ok")
"""


def env(**extra: str) -> dict[str, str]:
    out = {k: v for k, v in os.environ.items() if not k.startswith("RSOCK_")}
    out.update(extra)
    return out


def run(
    code: str, *args: str, report: Path | None = None, rsock: bool = True, **extra: str
) -> subprocess.CompletedProcess[str]:
    cmd = [sys.executable]
    if rsock:
        cmd += ["-m", "rsock", "run"]
        if report is not None:
            cmd += ["--report", str(report)]
    cmd += ["-c", textwrap.dedent(code), *args]
    return subprocess.run(
        cmd, capture_output=True, text=True, timeout=60, env=env(**extra),
        cwd=report.parent if report is not None else None,
    )  # fmt: skip


@pytest.mark.timeout_s(60)
@pytest.mark.parametrize("end", ["close", "exit"])
def test_connections_made_in_c_count_as_unseen(tmp_path: Path, end: str) -> None:
    """Both ends of a connection made by the C socket type count, once each:
    closed after a while (the sampler saw it) or open at exit (the last
    look); the rsock connection beside it does not.  The program's output
    and exit status are plain Python's."""
    oracle = run(C_PAIR, "2.5", end, rsock=False)
    assert (oracle.returncode, oracle.stdout, oracle.stderr) == (3, "hello\n", "")
    report = tmp_path / "r.json"
    hold = "2.5" if end == "close" else "0"
    proc = run(C_PAIR, hold, end, report=report)
    assert (proc.returncode, proc.stdout, proc.stderr) == (3, "hello\n", "")
    assert json.loads(report.read_text()) == {
        "rsock": 2,
        "connect:shm": 1,
        "accept:shm": 1,
        "unseen:tcp": 2,
        "processes": 1,
    }


@pytest.mark.timeout_s(60)
def test_a_ctypes_client_of_an_rsock_listener(tmp_path: Path) -> None:
    """libc's connect() to an rsock listener: the listener's end is rsock's
    (accept:tcp), the client's counts as unseen:tcp."""
    oracle = run(CTYPES_CLIENT, rsock=False)
    assert (oracle.returncode, oracle.stdout) == (0, "hello\n"), oracle.stderr
    report = tmp_path / "r.json"
    proc = run(CTYPES_CLIENT, report=report)
    assert (proc.returncode, proc.stdout) == (0, "hello\n"), proc.stderr
    counts = json.loads(report.read_text())
    assert counts["accept:tcp"] == 1 and counts["unseen:tcp"] == 1, counts


@pytest.mark.timeout_s(90)
def test_rsock_and_its_kernel_sockets_are_not_unseen(tmp_path: Path) -> None:
    """Nothing rsock makes, or hands to the stdlib, counts as unseen:tcp,
    in the process or in a fork child that inherits it, with a report and
    under RSOCK_FALLBACK=strict (which then says nothing)."""
    oracle = run(RSOCK_ONLY, "tcp", rsock=False)
    assert (oracle.returncode, oracle.stdout) == (0, "ok\n"), oracle.stderr
    report = tmp_path / "r.json"
    proc = run(RSOCK_ONLY, "tcp", report=report)
    assert (proc.returncode, proc.stdout, proc.stderr) == (0, "ok\n", "")
    counts = json.loads(report.read_text())
    assert "unseen:tcp" not in counts, counts
    assert counts["connect:shm"] == 2 and counts["kernel:tcp"] >= 3, counts
    assert counts["connect:tcp"] == 1 and counts["accept:tcp"] == 1, counts
    assert counts["processes"] == 2, counts  # (the plain server is not patched)
    strict = run(RSOCK_ONLY, "strict", report=report, RSOCK_FALLBACK="strict")
    assert (strict.returncode, strict.stdout, strict.stderr) == (0, "ok\n", "")
    counts = json.loads(report.read_text())
    assert "unseen:tcp" not in counts and counts["kernel:tcp"] >= 2, counts


@pytest.mark.timeout_s(60)
def test_a_fork_child_counts_its_own(tmp_path: Path) -> None:
    report = tmp_path / "r.json"
    proc = run(FORKED, report=report)
    assert (proc.returncode, proc.stdout) == (0, "ok\n"), proc.stderr
    assert json.loads(report.read_text()) == {"unseen:tcp": 4, "processes": 2}


@pytest.mark.timeout_s(60)
def test_strict_says_so_once() -> None:
    """RSOCK_FALLBACK=strict (no report): one message on stderr, with both
    ends' addresses; the exit status stays the program's."""
    proc = run(C_PAIR, "2.5", "close", RSOCK_FALLBACK="strict")
    assert (proc.returncode, proc.stdout) == (3, "hello\n"), proc.stderr
    lines = proc.stderr.splitlines()
    assert len(lines) == 1, proc.stderr
    msg = lines[0]
    assert msg.startswith("rsock: RSOCK_FALLBACK=strict: process "), msg
    assert "2 kernel TCP connections that rsock did not make (127.0.0.1:" in msg, msg
    assert "made outside Python's socket module" in msg and "rsock cannot carry" in msg, msg
    assert msg.count(" -> 127.0.0.1:") == 2, msg


@pytest.mark.timeout_s(60)
def test_strict_says_so_at_exit_too() -> None:
    """A connection still open when the process exits, made after the
    sampler's last look: the look at exit says so."""
    proc = run(C_PAIR, "0", "exit", RSOCK_FALLBACK="strict")
    assert proc.returncode == 3
    assert proc.stderr.count("rsock did not make") == 1, proc.stderr


def test_nothing_looks_without_report_or_strict() -> None:
    code = """
        import threading
        from rsock import _patch
        print(_patch.census, [t.name for t in threading.enumerate()])
    """
    proc = run(code)
    assert (proc.returncode, proc.stdout) == (0, "None ['MainThread']\n"), proc.stderr
    proc = run(code, RSOCK_FALLBACK="strict")
    assert proc.returncode == 0, proc.stderr
    assert "rsock-census" in proc.stdout and "_made" in proc.stdout, proc.stdout
