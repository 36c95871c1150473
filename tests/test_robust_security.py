"""Security properties of rsock's shared memory and rendezvous (README: threat model).

* Shared memory never appears in /dev/shm: segments are memfds (mapped as
  ``/memfd:rsock (deleted)``), before, during and after connections, including
  one whose peer was SIGKILLed.
* Each segment is mode 0600, owned by us, sealed against shrinking and growing
  (and further sealing); no memfd stays open as an fd once mapped.
* The rendezvous is an abstract Unix socket: no file is created anywhere.
* Another uid (when the tests run as root: uid 65534) cannot connect to our
  listener, cannot get a forged request accepted, and cannot open our segments
  through /proc.
"""

from __future__ import annotations

import errno
import fcntl
import json
import os
import signal
import socket
import stat
import struct
from collections.abc import Callable

import pytest
import test_robust_hostile as h  # (imported here: the uid-65534 child cannot read the stdlib)
from robust_peer import RobustPeers, dev_shm, fd_links, rsock_maps, shared_maps
from support import Background, Peers, connected_pair, has_ipv6_loopback
from test_socket_behaviour import connect_to_holding_peer

import rsock

NOBODY = 65534


def foreign_dev_shm_entries(before: set[str]) -> set[str]:
    """New /dev/shm entries, except multiprocessing's semaphores (other test runs
    on this machine may create those at any time)."""
    return {n for n in dev_shm() - before if not n.startswith("sem.")}


def assert_no_dev_shm_mappings(pid: int | str = "self") -> None:
    for line in shared_maps(pid):
        fields = line.split(maxsplit=5)
        path = fields[5] if len(fields) > 5 else ""
        assert not path.startswith("/dev/shm"), line


# --------------------------------------------------------------------------- /dev/shm


def test_no_shared_memory_in_dev_shm(peers: Peers) -> None:
    before = dev_shm()
    pairs = [connected_pair(rsock) for _ in range(20)]
    held = [connect_to_holding_peer(rsock, "rsock", peers, role) for role in ("server", "client")]
    try:
        for c, s in pairs:
            c.sendall(b"x" * 100000)
            assert len(s.recv(100000)) > 0
        # while they are open: every rsock segment is a memfd, here and in the
        # peers (the pairs' halves are slots of arenas: each end maps an arena's
        # header and a chunk of 64 slots)
        assert len(rsock_maps()) >= 4
        assert_no_dev_shm_mappings()
        for _, peer in held:
            assert len(rsock_maps(peer.pid)) == 2
            assert_no_dev_shm_mappings(peer.pid)
        assert not foreign_dev_shm_entries(before)
        # one peer is SIGKILLed, the other lets go normally
        held[0][1].kill()
        held[1][1].release()
        assert held[1][1].wait() == 0
    finally:
        for c, s in pairs:
            c.close()
            s.close()
        for sock, _ in held:
            sock.close()
    assert not foreign_dev_shm_entries(before)
    assert rsock_maps() == []


# --------------------------------------------------------------------------- segments


def map_file(pid: int, line: str) -> str:
    return f"/proc/{pid}/map_files/{line.split()[0]}"


def test_segments_are_private_sealed_memfds(rpeers: RobustPeers) -> None:
    """A child holds a live connection; from outside, each of its rsock mappings (the
    header and the first chunk of the arena this process made for the pair) is a
    0600 regular file owned by our uid, sealed against shrinking, and the child
    keeps no memfd as an fd; this process keeps one, the arena's, to hand to the
    child with the pair's next connections."""
    peer = rpeers.start("rsock", "send-hold", "server", 0, 10, 1)
    port = int(peer.expect("PORT")[0])
    with rsock.create_connection(("127.0.0.1", port), timeout=10) as sock:
        peer.expect("READY")
        peer.expect("SENT")
        maps = rsock_maps(peer.pid)
        assert len(maps) == 2, maps  # the arena's header and its first chunk
        assert_no_dev_shm_mappings(peer.pid)
        for line in maps:
            assert " rw-s " in line and line.endswith("/memfd:rsock-arena (deleted)"), line
            try:
                st = os.stat(map_file(peer.pid, line))
            except PermissionError:
                pytest.skip("/proc/PID/map_files needs CAP_SYS_ADMIN (not root)")
            assert stat.S_ISREG(st.st_mode)
            assert stat.S_IMODE(st.st_mode) == 0o600, oct(st.st_mode)
            assert st.st_uid == os.geteuid()
            lo, hi = (int(x, 16) for x in line.split()[0].split("-"))
            assert st.st_size >= hi - lo
            fd = os.open(map_file(peer.pid, line), os.O_RDONLY)
            try:
                seals = fcntl.fcntl(fd, fcntl.F_GET_SEALS)
            finally:
                os.close(fd)
            # it grows a chunk at a time, so no F_SEAL_GROW; it never shrinks
            need = fcntl.F_SEAL_SHRINK | fcntl.F_SEAL_SEAL
            assert seals & need == need, hex(seals)
        # the child closed the memfd once mapped: only sockets, eventfds, epoll, pipes
        for fd, link in fd_links(peer.pid).items():
            assert "memfd" not in link, (fd, link)
        # this process keeps its arena's, 0600 and sealed the same way
        mine = [fd for fd, link in fd_links().items() if "memfd:rsock" in link]
        assert len(mine) == 1, fd_links()
        st = os.fstat(mine[0])
        assert stat.S_IMODE(st.st_mode) == 0o600 and st.st_uid == os.geteuid()
        seals = fcntl.fcntl(mine[0], fcntl.F_GET_SEALS)
        assert seals & need == need, hex(seals)
        sock.settimeout(10)
        assert len(sock.recv(10)) > 0  # the connection is live: the peer's data


# --------------------------------------------------------------------------- rendezvous


def unix_names() -> list[str]:
    """Bound names of every Unix socket in this network namespace (``@`` = abstract)."""
    names = []
    with open("/proc/net/unix") as f:
        next(f)
        for line in f:
            fields = line.split()
            if len(fields) >= 8:
                names.append(fields[7])
    return names


def test_rendezvous_is_abstract(tmp_path: os.PathLike[str]) -> None:
    cwd = os.getcwd()
    before_tmp = set(os.listdir("/tmp"))
    before_cwd = set(os.listdir(cwd))
    with rsock.socket() as srv:
        srv.bind(("127.0.0.1", 0))
        srv.listen()
        port = srv.getsockname()[1]
        names = unix_names()
        assert f"@rsock/4/127.0.0.1/{port}" in names
        assert not [n for n in names if "rsock" in n and not n.startswith("@")]
        with rsock.create_connection(("127.0.0.1", port), timeout=10) as c:
            conn, _ = srv.accept()
            conn.close()
            assert c.provider == "shm"
    assert f"@rsock/4/127.0.0.1/{port}" not in unix_names()
    assert {n for n in set(os.listdir("/tmp")) - before_tmp if "rsock" in n} == set()
    assert set(os.listdir(cwd)) - before_cwd == set()


@pytest.mark.skipif(not has_ipv6_loopback(), reason="no IPv6 loopback")
def test_dualstack_rendezvous_is_abstract() -> None:
    with rsock.create_server(("::", 0), family=socket.AF_INET6, dualstack_ipv6=True) as srv:
        port = srv.getsockname()[1]
        names = unix_names()
        assert f"@rsock/6/::/{port}" in names
        assert f"@rsock/4/0.0.0.0/{port}" in names
        assert not [n for n in names if "rsock" in n and not n.startswith("@")]


# --------------------------------------------------------------------------- other users

needs_root = pytest.mark.skipif(
    os.geteuid() != 0, reason="needs root to run a child as another uid"
)


def run_as_nobody(fn: Callable[..., dict[str, object]], *args: object) -> dict[str, object]:
    """Runs ``fn(*args)`` in a forked child that switched to uid/gid 65534 (the
    interpreter may not be executable by that uid, so no exec); returns its result."""
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: never returns into pytest
        code = 1
        try:
            signal.alarm(20)  # a stuck child ends (the inherited hang-guard handler raises)
            os.close(r)
            os.setgroups([])
            os.setgid(NOBODY)
            os.setuid(NOBODY)
            out = fn(*args)
            code = 0
        except BaseException as e:
            out = {"child-error": repr(e)}
        finally:
            os.write(w, json.dumps(out).encode())
            os._exit(code)
    os.close(w)
    try:
        with os.fdopen(r, "rb") as f:
            data = f.read()
    finally:
        _, status = os.waitpid(pid, 0)
    result: dict[str, object] = json.loads(data)
    assert os.waitstatus_to_exitcode(status) == 0, result
    return result


def nobody_connects(port: int) -> dict[str, object]:
    try:
        with rsock.create_connection(("127.0.0.1", port), timeout=5) as c:
            return {"connected": c.provider}
    except OSError as e:
        return {"error": type(e).__name__, "errno": e.errno, "msg": str(e)}


def nobody_forges(port: int) -> dict[str, object]:
    fds = h.segment_fds(h.GOOD_SIZE, h.sealed(), True)
    with socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET) as u:
        u.connect(h.rendezvous(port))
        try:
            h.send_handshake(u, h.req(), fds)
        except BrokenPipeError:
            pass  # refused (and hung up on) before it could even send
        u.settimeout(5)
        try:
            answer = u.recv(256)
        except ConnectionResetError:
            # the listener hung up without reading our request: Linux may report
            # that reset before the REJ queued ahead of it
            return {"kind": "reset"}
    if not answer:
        return {"kind": None}
    _magic, _version, kind, reason = struct.unpack_from("<IBBH", answer)
    return {"kind": kind, "reason": reason}


def nobody_opens(*paths: str) -> dict[str, object]:
    out: dict[str, object] = {}
    for p in paths:
        try:
            open(p, "rb").close()
            out[p] = "opened"
        except OSError as e:
            out[p] = type(e).__name__
    return out


@needs_root
def test_other_uid_cannot_connect() -> None:
    with rsock.socket() as srv:
        srv.bind(("127.0.0.1", 0))
        srv.listen()
        port = srv.getsockname()[1]
        result = run_as_nobody(nobody_connects, port)
        # RSOCK_FALLBACK=never (conftest): refused, not quietly sent over TCP
        assert result.get("error") == "ConnectionRefusedError", result
        srv.setblocking(False)
        with pytest.raises(BlockingIOError):
            srv.accept()


@needs_root
def test_other_uid_forged_request_is_refused() -> None:
    """Another uid dials the rendezvous directly with a well-formed request (the one
    test_robust_hostile's control gets accepted): REJ EACCES, nothing accepted."""
    with rsock.socket() as srv:
        srv.bind(("127.0.0.1", 0))
        srv.listen()
        port = srv.getsockname()[1]

        def accept_nothing() -> None:
            srv.settimeout(3)
            with pytest.raises(TimeoutError):
                srv.accept()  # (meanwhile it answers the forger)

        acceptor = Background(accept_nothing, "accept")
        result = run_as_nobody(nobody_forges, port)
        acceptor.result(timeout=10)
        assert result in ({"kind": 3, "reason": errno.EACCES}, {"kind": "reset"}), result


@needs_root
def test_other_uid_cannot_open_our_segments() -> None:
    client, server = connected_pair(rsock)
    try:
        maps = rsock_maps()
        assert maps
        paths = [map_file(os.getpid(), line) for line in maps]
        result = run_as_nobody(nobody_opens, *paths)
        assert set(result.values()) == {"PermissionError"}, result
    finally:
        client.close()
        server.close()
