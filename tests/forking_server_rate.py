"""``socketserver.ForkingTCPServer`` under ``python -m rsock run`` against
plain Python: new connections per second, one request each, and the CPU each
connection costs the server's process tree and the client.

    python tests/forking_server_rate.py [ROUNDS] [CONNECTIONS]

Each round runs this file as a program twice, plain and under
``python -m rsock run`` (alternately, which first changes every round), with
CONNECTIONS (default 300) connections: the client connects, sends 5 bytes,
reads the echo and closes; the server forks a child per connection (the
accept-then-fork shape, as the socketserver documentation shows it).  Prints
each round's rates and the medians; CPU is user+system in µs per connection
(the server's tree: itself and its reaped children; the client).  Compare
figures within one run only.
"""

from __future__ import annotations

import os
import resource
import socket
import socketserver
import statistics
import subprocess
import sys
import time


class _Echo(socketserver.BaseRequestHandler):
    def handle(self) -> None:
        self.request.sendall(self.request.recv(100))


def _cpu(who: int) -> float:
    r = resource.getrusage(who)
    return r.ru_utime + r.ru_stime


def program(n: int) -> None:
    """One run: a forking server in a child process, the client here; prints
    'rate server_us client_us'."""
    server = socketserver.ForkingTCPServer(("127.0.0.1", 0), _Echo)
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:
        os.close(r)
        start = _cpu(resource.RUSAGE_SELF) + _cpu(resource.RUSAGE_CHILDREN)
        for _ in range(n):
            server.handle_request()
        while server.active_children:
            server.collect_children(blocking=True)
        spent = _cpu(resource.RUSAGE_SELF) + _cpu(resource.RUSAGE_CHILDREN) - start
        os.write(w, b"%f" % spent)
        os._exit(0)
    os.close(w)
    addr = server.server_address
    server.socket.close()
    for _ in range(3):  # (the server's first accept may be slower: not timed)
        with socket.create_connection(addr) as c:
            c.sendall(b"hello")
            c.recv(100)
    n -= 3
    cpu0, t0 = _cpu(resource.RUSAGE_SELF), time.perf_counter()
    for _ in range(n):
        with socket.create_connection(addr) as c:
            c.sendall(b"hello")
            if c.recv(100) != b"hello":
                raise SystemExit("wrong echo")
    elapsed, client = time.perf_counter() - t0, _cpu(resource.RUSAGE_SELF) - cpu0
    os.waitpid(pid, 0)
    server_cpu = float(os.read(r, 100))
    print(f"{n / elapsed:.1f} {server_cpu / (n + 3) * 1e6:.1f} {client / n * 1e6:.1f}")


def main() -> None:
    rounds = int(sys.argv[1]) if len(sys.argv) > 1 else 5
    n = sys.argv[2] if len(sys.argv) > 2 else "300"
    runs = {"tcp": [sys.executable, __file__, "--program", n]}
    runs["rsock"] = [sys.executable, "-m", "rsock", "run", __file__, "--program", n]
    got: dict[str, list[list[float]]] = {"tcp": [], "rsock": []}
    for i in range(rounds):
        order = ["tcp", "rsock"] if i % 2 == 0 else ["rsock", "tcp"]
        for kind in order:
            out = subprocess.run(
                runs[kind], capture_output=True, text=True, check=True, timeout=300
            )
            got[kind].append([float(x) for x in out.stdout.split()])
        t, s = got["tcp"][-1], got["rsock"][-1]
        print(f"round {i + 1}: tcp {t[0]:.0f}/s, rsock {s[0]:.0f}/s ({s[0] / t[0]:.2f}x)")
    print("median       conn/s  server CPU us/conn  client CPU us/conn")
    for kind in ("tcp", "rsock"):
        cols = [statistics.median(r[j] for r in got[kind]) for j in range(3)]
        print(f"{kind:8s} {cols[0]:10.0f} {cols[1]:19.0f} {cols[2]:19.0f}")
    ratio = statistics.median(got["rsock"][i][0] / got["tcp"][i][0] for i in range(rounds))
    print(f"rsock/tcp (median of the rounds' ratios): {ratio:.2f}x")


if __name__ == "__main__":
    if len(sys.argv) > 2 and sys.argv[1] == "--program":
        program(int(sys.argv[2]))
    else:
        main()
