"""What one connection costs in-process: socket(), connect(), accept() and both
close() calls, timed one by one, as a program under ``python -m rsock run`` makes
them (the patched ``socket.socket``), against the stdlib's TCP.

    python tests/conn_cost.py [ROUNDS] [PER_ROUND]

One process, one thread: a listener, then PER_ROUND times (default 200) a client
socket that connects, the listener's accept, and both closes; each step's mean
over the round, and the best round of ROUNDS (default 30) per step, in µs.  The
stdlib first, then rsock (``rsock.patch()``), in the same process.  The best of
rounds, not the mean: this machine's slow spells fall on some rounds, and the
figure wanted is the code's cost.  Run it on an otherwise idle machine; compare
figures within one run only.
"""

from __future__ import annotations

import socket
import sys
import time

STEPS = ("socket", "connect", "accept", "client close", "server close")


def measure(rounds: int, per_round: int) -> list[float]:
    """Best-of-rounds mean µs of each step, with whatever socket.socket is now."""
    listener = socket.socket()
    listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    listener.bind(("127.0.0.1", 0))
    listener.listen(512)
    addr = listener.getsockname()
    clock = time.perf_counter_ns
    best = [float("inf")] * len(STEPS)
    with listener:
        for _ in range(rounds):
            spent = [0] * len(STEPS)
            for _ in range(per_round):
                t0 = clock()
                client = socket.socket()
                t1 = clock()
                client.connect(addr)
                t2 = clock()
                conn, _ = listener.accept()
                t3 = clock()
                client.close()
                t4 = clock()
                conn.close()
                t5 = clock()
                for i, d in enumerate((t1 - t0, t2 - t1, t3 - t2, t4 - t3, t5 - t4)):
                    spent[i] += d
            best = [min(b, s / per_round / 1000) for b, s in zip(best, spent, strict=True)]
    return best


def main(argv: list[str]) -> int:
    rounds = int(argv[0]) if argv else 30
    per_round = int(argv[1]) if len(argv) > 1 else 200
    tcp = measure(rounds, per_round)
    import rsock
    from rsock import _patch

    rsock.patch()
    try:
        ours = measure(rounds, per_round)
        fast = _patch.counters().get("connect:shm", 0)
    finally:
        rsock.unpatch()
    print(f"{'step (µs, best of rounds)':28} {'TCP':>8} {'rsock':>8}")
    for name, a, b in zip(STEPS, tcp, ours, strict=True):
        print(f"{name:28} {a:8.1f} {b:8.1f}")
    print(f"{'connection, all steps':28} {sum(tcp):8.1f} {sum(ours):8.1f}")
    print(f"rsock connections on shm: {fast} of {rounds * per_round}")
    return 0 if fast == rounds * per_round else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
