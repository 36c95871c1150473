"""Client for echo_server.py: request/response, then full-duplex bulk (stdlib only).

    python echo_client.py HOST PORT [--clients N] [--bulk-mib N] [--slow-reader S]
                          [--timeout S]

Each connection first sends messages of growing size and reads each echo back,
then streams --bulk-mib MiB from one thread while another reads the echo, and
half-closes.  With --slow-reader S it sends all of the bulk data first,
half-closes, and only starts reading S seconds later (the server has to buffer
what it cannot send and wait until the socket is writable again).  Prints the
latencies (``LATENCIES`` and a JSON object: the seconds of each request/response
and of each connection's bulk echo), then one JSON line (connections, bytes,
SHA-256 of everything echoed) and exits 1 if anything differs.
"""

import argparse
import contextlib
import hashlib
import json
import socket
import sys
import threading
import time

SIZES = [1, 2, 100, 1000, 4096, 10000, 65536, 100000, 300000]

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


def recv_exact(sock, n):
    buf = bytearray()
    while len(buf) < n:
        chunk = sock.recv(min(n - len(buf), 1 << 20))
        if not chunk:
            raise EOFError(f"EOF after {len(buf)} of {n} bytes")
        buf += chunk
    return bytes(buf)


def run_client(host, port, client, bulk, slow_reader, timeout, out):
    sock = socket.create_connection((host, port), timeout=timeout)
    digest = hashlib.sha256()
    with sock:
        for k, size in enumerate(SIZES):
            msg = pattern(size, client * 100 + k)
            with timed("request_response"):
                sock.sendall(msg)
                back = recv_exact(sock, size)
            if back != msg:
                raise AssertionError(f"client {client}: echo of {size} bytes differs")
            digest.update(back)
        data = pattern(bulk, client)
        errors = []

        def send_all():
            try:
                view = memoryview(data)
                for start in range(0, len(view), 50000):
                    sock.sendall(view[start : start + 50000])
                sock.shutdown(socket.SHUT_WR)
            except BaseException as e:  # reported by the reader
                errors.append(e)

        with timed("bulk"):
            sender = threading.Thread(target=send_all)
            sender.start()
            if slow_reader is not None:
                sender.join()
                time.sleep(slow_reader)
            echoed = bytearray()
            while True:
                chunk = sock.recv(1 << 16)
                if not chunk:
                    break
                echoed += chunk
            sender.join()
        if errors:
            raise errors[0]
        if echoed != data:
            raise AssertionError(f"client {client}: bulk echo {len(echoed)} of {len(data)} bytes")
        digest.update(echoed)
    out[client] = (sum(SIZES) + bulk, digest.hexdigest())


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("host")
    parser.add_argument("port", type=int)
    parser.add_argument("--clients", type=int, default=4)
    parser.add_argument("--bulk-mib", type=float, default=8)
    parser.add_argument("--slow-reader", type=float, default=None)
    parser.add_argument("--timeout", type=float, default=20)
    args = parser.parse_args()
    bulk = int(args.bulk_mib * (1 << 20))
    out = {}
    errors = []

    def worker(i):
        try:
            run_client(args.host, args.port, i, bulk, args.slow_reader, args.timeout, out)
        except BaseException as e:  # reported below
            errors.append(f"client {i}: {type(e).__name__}: {e}")

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
                "bytes": sum(n for n, _ in out.values()),
                "sha256": total.hexdigest(),
            },
            sort_keys=True,
        ),
        flush=True,
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
