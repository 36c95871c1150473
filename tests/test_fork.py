"""Accept-then-fork servers: the child serves the accepted connection, the
parent closes its copy, and neither side's exit breaks the other's
connections (socketserver.ForkingTCPServer, on both transports)."""

from __future__ import annotations

import os
import socket
import socketserver
import threading
from types import ModuleType
from typing import Any

import pytest
from support import recv_exact


class Upper(socketserver.StreamRequestHandler):
    def handle(self) -> None:
        for line in self.rfile:
            self.wfile.write(f"{os.getpid()} ".encode() + line.upper())
            self.wfile.flush()


def forking_server(sockmod: ModuleType) -> socketserver.ForkingTCPServer:
    srv = socketserver.ForkingTCPServer(("127.0.0.1", 0), Upper, bind_and_activate=False)
    srv.socket.close()
    srv.socket = sockmod.socket(srv.address_family, srv.socket_type)
    srv.server_bind()
    srv.server_activate()
    return srv


@pytest.mark.timeout_s(60)
def test_forking_tcp_server(sockmod: ModuleType, transport: str) -> None:
    srv = forking_server(sockmod)
    t = threading.Thread(target=srv.serve_forever, kwargs={"poll_interval": 0.05})
    t.start()
    clients: list[Any] = []
    try:
        pids = set()
        for i in range(4):
            c = sockmod.create_connection(srv.server_address, timeout=20)
            clients.append(c)
            if transport == "rsock":
                assert c.provider == "shm"
            c.sendall(b"hello %d\n" % i)
        for i, c in enumerate(clients):
            f = c.makefile("rb")
            pid, _, rest = f.readline().partition(b" ")
            assert rest == b"HELLO %d\n" % i
            pids.add(int(pid))
            # the parent closed its copy long ago: the child still talks
            c.sendall(b"again\n")
            assert f.readline().endswith(b"AGAIN\n")
            f.close()
        assert os.getpid() not in pids and len(pids) == 4  # each served by a child
        for c in clients:
            c.shutdown(1)  # SHUT_WR: the child sees EOF, answers with its own
            assert recv_exact(c, 0) == b""
            assert c.recv(16) == b""
    finally:
        for c in clients:
            c.close()
        srv.shutdown()
        t.join(20)
        srv.server_close()


@pytest.mark.timeout_s(60)
def test_child_serves_while_parent_watches(sockmod: ModuleType, transport: str) -> None:
    """The parent handed out the accepted connection's fileno() (rsock: the
    engine's watcher follows it) and keeps its copy open for a while after
    forking; data that arrives meanwhile must not make the parent the
    connection's user: the child serves it."""
    import time

    with sockmod.socket() as lst:
        lst.bind(("127.0.0.1", 0))
        lst.listen(1)
        client = sockmod.create_connection(lst.getsockname(), timeout=20)
        with client:
            conn, _ = lst.accept()
            conn.fileno()
            pid = os.fork()
            if pid == 0:  # the child: serve one line, then exit
                code = 1
                try:
                    conn.settimeout(20)
                    line = conn.makefile("rb").readline()
                    conn.sendall(b"child " + line.upper())
                    code = 0
                finally:
                    os._exit(code)
            try:
                client.sendall(b"ping\n")  # arrives while the parent holds its copy
                time.sleep(0.3)
                conn.close()
                f = client.makefile("rb")
                assert f.readline() == b"child PING\n"
                f.close()
            finally:
                _, status = os.waitpid(pid, 0)
            assert os.WIFEXITED(status) and os.WEXITSTATUS(status) == 0


@pytest.mark.timeout_s(60)
@pytest.mark.parametrize("shutdown", [False, True])
def test_child_polls_then_closes(sockmod: ModuleType, shutdown: bool) -> None:
    """rpyc's ForkingServer: the parent asks the accepted connection's
    fileno() (to log it), forks and closes its copy at once; the child waits
    in select() before each read, answers, and closes (with or without
    shutdown() first).  The request comes after the parent's close: the
    child's select() must see it (rsock's fileno() turned readable only
    while the parent held its copy), and the client must read the answer,
    then EOF (rsock's gave a reset when the child closed without
    shutdown())."""
    import select

    with sockmod.socket() as lst:
        lst.bind(("127.0.0.1", 0))
        lst.listen(1)
        client = sockmod.create_connection(lst.getsockname(), timeout=20)
        with client:
            conn, _ = lst.accept()
            conn.fileno()
            pid = os.fork()
            if pid == 0:  # the child: one request, then close and linger
                code = 1
                try:
                    lst.close()
                    r, _, _ = select.select([conn], [], [], 10)
                    if r:
                        conn.sendall(b"child " + conn.recv(10))
                        if shutdown:
                            conn.shutdown(socket.SHUT_RDWR)
                        conn.close()
                        code = 0
                finally:
                    os._exit(code)
            try:
                conn.close()
                client.sendall(b"ping")
                assert recv_exact(client, 10) == b"child ping"
                assert client.recv(10) == b""
            finally:
                _, status = os.waitpid(pid, 0)
            assert os.WIFEXITED(status) and os.WEXITSTATUS(status) == 0


@pytest.mark.timeout_s(60)
@pytest.mark.parametrize("waiter", ["select", "poll", "selectors"])
@pytest.mark.parametrize("child", ["exits", "lives"])
def test_parent_polling_after_fork_sees_new_data(
    sockmod: ModuleType, pair: tuple[Any, Any], waiter: str, child: str
) -> None:
    """A process polls a connection, forks a child that does nothing with it
    (exits at once, or lives on, as a pool worker does), and goes on
    polling: data and EOF that arrive after the fork wake it."""
    import select
    import selectors
    import signal
    import time

    a, b = pair

    def readable(timeout: float) -> bool:
        if waiter == "select":
            return bool(select.select([a], [], [], timeout)[0])
        if waiter == "poll":
            p = select.poll()
            p.register(a, select.POLLIN)
            return bool(p.poll(timeout * 1000))
        with selectors.DefaultSelector() as sel:
            sel.register(a, selectors.EVENT_READ)
            return bool(sel.select(timeout))

    assert not readable(0.05)  # watched since before the fork
    pid = os.fork()
    if pid == 0:
        if child == "lives":
            time.sleep(30)
        os._exit(0)
    try:
        if child == "exits":
            os.waitpid(pid, 0)
        for round_ in range(3):
            b.sendall(b"after fork %d" % round_)
            assert readable(5), f"round {round_}: the data never woke the parent"
            assert recv_exact(a, 12) == b"after fork %d" % round_
        b.shutdown(socket.SHUT_WR)
        assert readable(5)
        assert a.recv(10) == b""
    finally:
        if child == "lives":
            os.kill(pid, signal.SIGKILL)
            os.waitpid(pid, 0)


@pytest.mark.timeout_s(60)
@pytest.mark.parametrize("data", ["before-fork", "after-fork"])
def test_first_poll_after_fork_sees_data(
    sockmod: ModuleType, pair: tuple[Any, Any], data: str
) -> None:
    """A connection whose fd is first polled after a fork (a client whose server
    thread forked a handler in between, as ForkingTCPServer's tests do): the peer's
    data wakes select(), whether it came before or after the fork.  (rsock: the
    poll came after the fork, so it only noted what to watch and nobody told the
    watcher; select() then waited out its whole timeout, seen in CPython's
    test_socketserver.test_ForkingTCPServer.)"""
    import select

    a, b = pair
    if data == "before-fork":
        b.sendall(b"hello")
    pid = os.fork()
    if pid == 0:
        os._exit(0)
    os.waitpid(pid, 0)
    if data == "after-fork":
        threading.Timer(0.2, b.sendall, (b"hello",)).start()
    r, _, _ = select.select([a], [], [], 10)
    assert r == [a], "the data never made the fd readable"
    assert recv_exact(a, 5) == b"hello"
    b.shutdown(socket.SHUT_WR)
    assert select.select([a], [], [], 10)[0] == [a]
    assert a.recv(10) == b""


@pytest.mark.timeout_s(60)
@pytest.mark.parametrize("conn", ["inherited", "new"])
def test_a_fork_childs_signal_ends_its_blocking_call(
    sockmod: ModuleType, transport: str, conn: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """In a fork child, a signal whose handler raises ends a blocking
    ``recv`` at once, on a connection inherited from the parent and on one
    the child made, while the call busy-polls (a spin of up to 1 s here:
    only the signal wakeup pipe can tell the engine): the child's pipe is
    its own, not the parent's, which keeps waiting on its own connection."""
    import signal
    import time

    monkeypatch.setenv("RSOCK_SPIN_US", "1000000")
    with sockmod.socket() as listener:
        listener.bind(("127.0.0.1", 0))
        listener.listen()
        a = sockmod.create_connection(listener.getsockname(), timeout=20)
        b, _ = listener.accept()
        pid = os.fork()
        if pid == 0:  # the child: exit status 0 when the signal ended recv in time
            code = 1
            try:

                def alarm(signum: int, frame: Any) -> None:
                    raise TimeoutError("alarm")

                signal.signal(signal.SIGALRM, alarm)
                if conn == "new":
                    c = sockmod.create_connection(listener.getsockname(), timeout=20)
                    d, _ = listener.accept()
                else:
                    c, d = a, b  # noqa: F841 (d: kept open)
                c.settimeout(None)
                start = time.monotonic()
                signal.setitimer(signal.ITIMER_REAL, 0.2)
                try:
                    c.recv(1)
                except TimeoutError as e:
                    took = time.monotonic() - start
                    code = 0 if str(e) == "alarm" and took < 1.0 else 2
            finally:
                os._exit(code)
        try:
            # the parent: its own wait on its own connection goes on, undisturbed
            peer = sockmod.create_connection(listener.getsockname(), timeout=20)
            mine, _ = listener.accept()
            with peer, mine:
                mine.settimeout(20)
                threading.Timer(0.5, peer.sendall, (b"!",)).start()
                assert mine.recv(1) == b"!"
        finally:
            status = _reap(pid, 20)
            a.close()
            b.close()
    assert os.waitstatus_to_exitcode(status) == 0


def _reap(pid: int, timeout: float) -> int:
    """The child's wait status; killed if it is still there after ``timeout`` s."""
    import signal
    import time

    end = time.monotonic() + timeout
    while time.monotonic() < end:
        done, status = os.waitpid(pid, os.WNOHANG)
        if done:
            return status
        time.sleep(0.02)
    os.kill(pid, signal.SIGKILL)
    return os.waitpid(pid, 0)[1]
