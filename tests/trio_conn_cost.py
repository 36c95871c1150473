"""What one trio connection costs in one process: ``trio.serve_tcp``'s echo
handler and ``trio.open_tcp_stream`` clients in one ``trio.run``, a new
connection per 64-byte round trip (connect, send, receive the echo, close), as
the bench's trio-newconn case runs them in two processes.

    python tests/trio_conn_cost.py [ALTERNATIONS] [ROUNDS]

Each side runs in a fresh interpreter (trio takes the socket class when it is
imported: rsock's side imports it after ``rsock.patch()``), the stdlib's TCP and
rsock alternately ALTERNATIONS times (default 3); each run prints the best of
ROUNDS (default 20) rounds of 200 connections, in µs per connection.  One
thread does both ends' work, so the figure is the CPU cost of a connection
(trio's, the socket layer's and the kernel's), without the wake-ups between two
processes.  Compare figures within one run only.  Exits 1 unless every rsock
connection took shm.
"""

from __future__ import annotations

import functools
import subprocess
import sys
import time

PER_ROUND = 200


async def _measure(rounds: int) -> float:
    import trio

    async def echo(stream: trio.SocketStream) -> None:
        try:
            while data := await stream.receive_some(65536):
                await stream.send_all(data)
        except trio.BrokenResourceError:
            pass

    best = float("inf")
    async with trio.open_nursery() as nursery:
        serve = functools.partial(trio.serve_tcp, echo, 0, host="127.0.0.1")
        listeners = await nursery.start(serve)
        port = listeners[0].socket.getsockname()[1]
        for _ in range(rounds):
            t0 = time.perf_counter_ns()
            for _ in range(PER_ROUND):
                async with await trio.open_tcp_stream("127.0.0.1", port) as stream:
                    await stream.send_all(b"x" * 64)
                    got = b""
                    while len(got) < 64:
                        got += await stream.receive_some(64)
            best = min(best, (time.perf_counter_ns() - t0) / PER_ROUND / 1000)
        nursery.cancel_scope.cancel()
    return best


def _child(kind: str, rounds: int) -> int:
    if kind == "rsock":
        import rsock

        rsock.patch()
    import trio

    print(f"{trio.run(_measure, rounds):.1f}")
    if kind == "rsock":
        from rsock import _patch

        counts = _patch.counters()
        if counts.get("connect:shm", 0) != rounds * PER_ROUND:
            print(f"not all on shm: {counts}", file=sys.stderr)
            return 1
    return 0


def main(argv: list[str]) -> int:
    if argv and argv[0] == "--child":
        return _child(argv[1], int(argv[2]))
    alternations = int(argv[0]) if argv else 3
    rounds = int(argv[1]) if len(argv) > 1 else 20
    print(f"{'µs per trio connection (best of rounds)':42} {'TCP':>8} {'rsock':>8}")
    for _ in range(alternations):
        got = []
        for kind in ("tcp", "rsock"):
            cmd = [sys.executable, __file__, "--child", kind, str(rounds)]
            proc = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
            if proc.returncode:
                print(proc.stdout + proc.stderr, file=sys.stderr)
                return 1
            got.append(float(proc.stdout.split()[0]))
        print(f"{'':42} {got[0]:8.1f} {got[1]:8.1f}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
