"""Where a new HTTP connection's time goes, from a plain socket client's side:
``create_connection``, the reply (request sent to body read) and ``close``, one
connection per GET, against ``rsock/bench/apps/http_server.py`` (or any server
that answers ``GET /small`` with ``hello``).

    python rsock/bench/apps/http_server.py            # prints PORT <n>
    python tests/http_conn_phases.py PORT [COUNT]     # TCP
    python -m rsock run rsock/bench/apps/http_server.py
    python -m rsock run tests/http_conn_phases.py PORT [COUNT]   # rsock

Pin the server and the client to different CPUs (``taskset -c 0`` / ``-c 1``), as
``python -m rsock.bench apps`` does, and alternate the transports: one line per
run, the rate and each phase's median in µs after 300 connections of warm-up.  It
takes the requests client's Python out of the ``requests-newconn`` case: what is
left is the transport's and the server's part.
"""

from __future__ import annotations

import socket
import statistics
import sys
import time

REQUEST = b"GET /small HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n"


def one(port: int) -> tuple[int, int, int]:
    """One connection: the ns of its connect, its reply and its close."""
    clock = time.perf_counter_ns
    t0 = clock()
    s = socket.create_connection(("127.0.0.1", port))
    s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    t1 = clock()
    s.sendall(REQUEST)
    got = b""
    while not got.endswith(b"hello"):
        data = s.recv(65536)
        if not data:
            raise ConnectionError(f"closed before the body: {got!r}")
        got += data
    t2 = clock()
    s.close()
    return t1 - t0, t2 - t1, clock() - t2


def main(argv: list[str]) -> int:
    port = int(argv[0])
    count = int(argv[1]) if len(argv) > 1 else 3000
    for _ in range(300):
        one(port)
    start = time.perf_counter()
    phases = [one(port) for _ in range(count)]
    rate = count / (time.perf_counter() - start)
    connect, reply, close = (statistics.median(p) / 1000 for p in zip(*phases, strict=True))
    print(f"{rate:.0f} connections/s; medians: create_connection {connect:.1f} µs, "
          f"reply {reply:.1f} µs, close {close:.1f} µs")  # fmt: skip
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
