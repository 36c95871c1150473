"""Figures of issue 14 against TCP, in one run (not a test; run from tests/):

    python measure_reliability.py [death] [signals]

death:   a child holding N connections to us (N = 100, 1000) is SIGKILLed while an
         unrelated connection makes select-driven round trips: time until the last
         end was seen, and the worst round trip meanwhile.
signals: SIGUSR1 0.3 s into a blocked call of the main thread, other threads
         blocked on the same socket or not, busy-polling or not: time until the
         Python handler ran.
"""

from __future__ import annotations

import os
import signal
import sys
import threading
import time
from typing import Any

os.environ.setdefault("RSOCK_FALLBACK", "never")

from robust_peer import RobustPeers  # noqa: E402
from support import connected_pair, load_sockmod  # noqa: E402
from test_robust_reliability import death_of_many  # noqa: E402

TRANSPORTS = ("tcp", "rsock")
ARRANGEMENTS = (
    "recv",
    "recv+thread-recv",
    "sendall+thread-recv",
    "sendall",
    "recv-spinning",
    "sendall-spinning+thread-recv",
)


def death() -> None:
    for n in (100, 1000):
        for transport in TRANSPORTS:
            peers = RobustPeers()
            try:
                ended, worst, count = death_of_many(load_sockmod(transport), transport, peers, n)
            finally:
                peers.cleanup()
            print(
                f"death of a peer with {n} connections, {transport}: last end after "
                f"{ended * 1e3:.1f} ms, worst unrelated round trip {worst * 1e3:.1f} ms "
                f"({count} round trips)",
                flush=True,
            )


def signal_latency(transport: str, arrangement: str) -> str:
    mod: Any = load_sockmod(transport)
    a, b = connected_pair(mod)
    try:
        if "spinning" in arrangement and transport == "rsock":
            a.setsockopt(mod.SOL_RSOCK, mod.RSOCK_SPIN_US, 1_000_000)
        helper = threading.Thread(target=a.recv, args=(10,), daemon=True)
        if "thread-recv" in arrangement:
            helper.start()
            time.sleep(0.1)
        ran: list[float] = []
        sent: list[float] = []

        def handler(signum: int, frame: Any) -> None:
            ran.append(time.monotonic())
            raise KeyboardInterrupt

        def poke() -> None:
            sent.append(time.monotonic())
            os.kill(os.getpid(), signal.SIGUSR1)

        old = signal.signal(signal.SIGUSR1, handler)
        timer = threading.Timer(0.3, poke)
        timer.start()
        a.settimeout(5.0)
        try:
            if arrangement.startswith("sendall"):
                a.sendall(b"z" * (64 << 20))
            else:
                a.recv(10)
        except (KeyboardInterrupt, TimeoutError):
            pass
        finally:
            timer.join()
            signal.signal(signal.SIGUSR1, old)
        b.sendall(b"!" * 10)  # lets the helper thread go
        if helper.is_alive():
            helper.join(10)
        if ran and ran[0] - sent[0] < 4.5:
            return f"{(ran[0] - sent[0]) * 1e3:.2f} ms"
        return "never (5 s timeout)"
    finally:
        a.close()
        b.close()


def signals() -> None:
    for arrangement in ARRANGEMENTS:
        cells = "  ".join(f"{t}: {signal_latency(t, arrangement):>20s}" for t in TRANSPORTS)
        print(f"signal during {arrangement:30s} {cells}", flush=True)


def main(argv: list[str]) -> int:
    what = argv or ["death", "signals"]
    if "death" in what:
        death()
    if "signals" in what:
        signals()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
