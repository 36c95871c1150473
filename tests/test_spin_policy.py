"""The blocking calls' spin: what rsock spends waiting for a peer before it
sleeps.  It follows the tempo of the waits a program sees (the rule next to
``eng_spin_adapt`` in ``native/src/conn.c``); these tests watch its CPU
through the connection's own counters (polls of its completion queue), not
through time."""

from __future__ import annotations

import threading
import time

import pytest

import rsock


def _first_wait_polls(listener: rsock.socket, delay: float) -> int:
    """A new connection whose first recv waits ``delay`` s for the peer's
    answer: the completion-queue polls that wait made."""
    client = rsock.create_connection(listener.getsockname(), timeout=10)
    server, _ = listener.accept()
    with client, server:
        answer = threading.Timer(delay, server.sendall, (b"x",))
        answer.start()
        before = client.stats()["cq_polls"]
        assert client.recv(1) == b"x"
        answer.join()
        return client.stats()["cq_polls"] - before


@pytest.mark.timeout_s(60)
def test_new_connections_start_from_the_processs_tempo(monkeypatch: pytest.MonkeyPatch) -> None:
    """A program that opens a connection per request, each answered after
    5 ms (more than any spin may last): the first waits spin, then each new
    connection starts from what the last ones learnt and sleeps at once (it
    spun its whole budget on every new connection: a CPU taken from the
    peer for nothing).  A connection whose answers come quickly spins
    again at once."""
    monkeypatch.setenv("RSOCK_SPIN_US", "500")
    with rsock.socket() as listener:
        listener.bind(("127.0.0.1", 0))
        listener.listen()
        polls = [_first_wait_polls(listener, 0.005) for _ in range(14)]
        assert polls[0] > 20, polls  # (the cap, spun: many polls)
        assert max(polls[-3:]) < 10, polls
        # a quick peer (a thread that answers after ~0.2 ms, well within
        # a spin): the first wait sleeps, then the spin catches the answers
        client = rsock.create_connection(listener.getsockname(), timeout=10)
        server, _ = listener.accept()
        with client, server:
            echo = threading.Thread(target=_echo, args=(server, 200))
            echo.start()
            before = client.stats()["sleeps"]
            for _ in range(200):
                client.sendall(b"y")
                assert client.recv(1) == b"y"
            echo.join(10)
            sleeps = client.stats()["sleeps"] - before
            assert sleeps <= 20, f"{sleeps} of 200 waits slept"


def _echo(sock: rsock.socket, n: int) -> None:
    for _ in range(n):
        data = sock.recv(1)
        time.sleep(0.0002)
        sock.sendall(data)
