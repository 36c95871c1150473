"""Client for line_server.py: concurrent connections, makefile() + readline().

    python line_client.py HOST PORT [--clients N] [--rounds N]

Every reply is checked; prints the latencies (``LATENCIES`` and a JSON object: the
seconds of each request sent one at a time, and of each connection's pipelined
batch), then one JSON line (connections, commands, SHA-256 of all replies in a fixed
order) and exits 1 on the first wrong reply.
"""

import argparse
import contextlib
import hashlib
import json
import socket
import sys
import threading
import time

LATENCIES = {}  # seconds, per kind of request, in order of completion


@contextlib.contextmanager
def timed(kind):
    """Times what runs in the block: one request (or message) of ``kind``."""
    start = time.perf_counter()
    yield
    LATENCIES.setdefault(kind, []).append(time.perf_counter() - start)


def pattern(n, seed):
    unit = hashlib.sha256(b"%d" % seed).digest() * 64
    return (unit * (n // len(unit) + 1))[:n]


def conversation(client, rounds):
    """[(request bytes, expected reply line without its newline)], and how many of
    them to send one at a time (the rest are small and go pipelined)."""
    steps = []
    half = 0
    for r in range(rounds):
        if r == rounds // 2:
            half = len(steps)
        word = b"client%d-round%d-" % (client, r) + b"x" * ((client * 131 + r * 17) % 300)
        steps.append((b"ECHO " + word + b"\n", word))
        steps.append((b"UPPER " + word + b"\n", word.upper()))
        steps.append((b"REV " + word + b"\n", word[::-1]))
        nums = [client, r, r * r, 1000 + client]
        steps.append((b"SUM " + b" ".join(b"%d" % n for n in nums) + b"\n", b"%d" % sum(nums)))
        if r % 5 == 0 and r < rounds // 2:
            size = 1000 + 70000 * (r // 5) + client
            payload = pattern(size, client + r)
            steps.append(
                (b"SHA %d\n" % size + payload, hashlib.sha256(payload).hexdigest().encode())
            )
            blob = 200000 + 1000 * r + client
            steps.append((b"BLOB %d %d\n" % (blob, r), pattern(blob, r)))
    steps.append((b"NOPE\n", b"ERR unknown command"))
    steps.append((b"QUIT\n", b"BYE"))
    return steps, half


def run_client(host, port, client, rounds, out):
    if client % 2:
        sock = socket.create_connection((host, port), timeout=30)
    else:
        sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        sock.settimeout(30)
        sock.connect((host, port))
    digest = hashlib.sha256()
    steps, half = conversation(client, rounds)
    with sock, sock.makefile("rwb") as f:
        # one request at a time, then the small ones pipelined (small, so that
        # neither side can fill its buffers while the other is not reading)
        for request, expected in steps[:half]:
            with timed("request"):
                f.write(request)
                f.flush()
                check(f, expected, digest, client)
        with timed("pipelined"):
            for request, _ in steps[half:]:
                f.write(request)
            f.flush()
            for _, expected in steps[half:]:
                check(f, expected, digest, client)
        if f.read(1) != b"":
            raise AssertionError(f"client {client}: data after BYE")
    out[client] = (len(steps), digest.hexdigest())


def check(f, expected, digest, client):
    # raw replies (BLOB) may hold newlines: read those by length
    line = f.read(len(expected) + 1) if b"\n" in expected else f.readline()
    if line != expected + b"\n":
        raise AssertionError(
            f"client {client}: expected {expected[:60]!r}... got {line[:60]!r}... "
            f"({len(line)} bytes)"
        )
    digest.update(line)


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("host")
    parser.add_argument("port", type=int)
    parser.add_argument("--clients", type=int, default=8)
    parser.add_argument("--rounds", type=int, default=40)
    args = parser.parse_args()
    out = {}
    errors = []

    def worker(i):
        try:
            run_client(args.host, args.port, i, args.rounds, out)
        except BaseException as e:  # reported below
            errors.append(f"{type(e).__name__}: {e}")

    threads = [threading.Thread(target=worker, args=(i,)) for i in range(args.clients)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    if errors:
        print("\n".join(errors), file=sys.stderr)
        return 1
    total = hashlib.sha256()
    for i in range(args.clients):
        total.update(out[i][1].encode())
    print("LATENCIES", json.dumps(LATENCIES), flush=True)
    print(
        json.dumps(
            {
                "connections": len(out),
                "commands": sum(n for n, _ in out.values()),
                "sha256": total.hexdigest(),
            },
            sort_keys=True,
        ),
        flush=True,
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
