"""Soak: mixed request/response traffic across processes with random sizes, random
closes and reconnects, and every byte checked.

    python tests/soak.py [--seconds 600] [--transport rsock|tcp] [--clients 2]
                         [--threads 4] [--seed 1]

One server process (a thread per connection) and ``--clients`` client processes
(``--threads`` threads each, each client process with its own ring size) run for
``--seconds``.  A client thread connects, does a random number of exchanges and
ends the connection one of several ways, then reconnects:

  normal        close after the last response (the server reads EOF at a
                message boundary)
  server-close  the last request asks the server to close after responding
                (the client reads the response, then EOF)
  half-close    shutdown(SHUT_WR) after the last request, then read the
                response and EOF
  abort         close in the middle of sending a request (the server sees a
                truncated message)
  abandon       send a request and close without reading the response (the
                server's send may be reset, as with TCP)

Requests and responses are slices of a seeded pool at offsets derived from a
per-message seed (sizes log-uniform, 1 B .. 1 MiB); the receiver compares every
byte with what it must be.  Receives mix recv and recv_into with random sizes,
sockets are blocking or have a timeout.  At the end each process reports its
counters; the run fails on any mismatch, any unexpected error, a stall (socket
timeouts: 60 s), fds or rsock mappings left in the server or a client after
its connections closed, or a new /dev/shm entry.  The last line of stdout is
the summary as JSON; the exit status is 0 only if the run is clean.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import socket
import struct
import subprocess
import sys
import threading
import time
import traceback
from collections import Counter
from pathlib import Path
from typing import Any

TESTS_DIR = Path(__file__).resolve().parent
if str(TESTS_DIR) not in sys.path:
    sys.path.insert(0, str(TESTS_DIR))

from robust_peer import dev_shm, fd_count, rsock_maps  # noqa: E402
from support import load_sockmod, warm_thread  # noqa: E402

MiB = 1 << 20
POOL = random.Random(0x50A4).randbytes(9 * MiB)
REQ = struct.Struct("<IIIB")  # request length, response length, seed, flags
RESP = struct.Struct("<I")  # response length
F_CLOSE_AFTER = 1  # the server closes after this response
IO_TIMEOUT = 60.0
RING_SIZES = [65536, 262144, 4 * MiB]
ENDINGS = ["normal", "server-close", "half-close", "abort", "abandon"]
ENDING_WEIGHTS = [50, 15, 15, 10, 10]


def chunk_of(seed: int, n: int) -> memoryview:
    off = (seed * 2654435761) % (len(POOL) - n + 1)
    return memoryview(POOL)[off : off + n]


def resp_seed(seed: int) -> int:
    return seed ^ 0x5A5A5A5A


def log_size(rng: random.Random) -> int:
    return max(1, min(MiB, int(2 ** rng.uniform(0, 20))))


class Mismatch(Exception):
    pass


class Reader:
    """Reads exact amounts with a mix of recv and recv_into of random sizes."""

    def __init__(self, sock: Any, rng: random.Random) -> None:
        self.sock = sock
        self.rng = rng
        self.buf = bytearray(MiB)
        self.bytes = 0

    def exact(self, n: int) -> bytes | None:
        """n bytes, or None at EOF before the first byte (a clean end)."""
        out = bytearray()
        while len(out) < n:
            want = min(n - len(out), self.rng.choice([1, 7, 4096, 65536, MiB]))
            if self.rng.random() < 0.5:
                m = self.sock.recv_into(memoryview(self.buf)[:want])
                data = bytes(memoryview(self.buf)[:m])
            else:
                data = self.sock.recv(want)
            if not data:
                if not out:
                    return None
                raise EOFError(f"EOF after {len(out)} of {n} bytes")
            out += data
        self.bytes += n
        return bytes(out)

    def verify(self, n: int, seed: int, what: str) -> None:
        data = self.exact(n)
        if data is None:
            raise EOFError(f"EOF instead of a {what}")
        expected = chunk_of(seed, n)
        if data != expected:
            bad = next(i for i in range(n) if data[i] != expected[i])
            raise Mismatch(f"{what} of {n} bytes (seed {seed}) differs from byte {bad}")


# --------------------------------------------------------------------------- server


def serve_connection(conn: Any, stats: Counter[str], lock: threading.Lock, seed: int) -> None:
    rng = random.Random(seed)
    local: Counter[str] = Counter()
    reader = Reader(conn, rng)
    try:
        with conn:
            conn.settimeout(IO_TIMEOUT)
            conn.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)  # (no Nagle stalls)
            while True:
                try:
                    head = reader.exact(REQ.size)
                except (EOFError, ConnectionResetError) as e:
                    local["truncated" if isinstance(e, EOFError) else "reset-in-header"] += 1
                    break
                if head is None:
                    local["clean-eof"] += 1
                    break
                req_len, resp_len, mseed, flags = REQ.unpack(head)
                if req_len > MiB or resp_len > MiB:
                    raise Mismatch(f"bad header {req_len} {resp_len}")
                try:
                    reader.verify(req_len, mseed, "request")
                except (EOFError, ConnectionResetError):
                    local["truncated"] += 1
                    break
                local["requests"] += 1
                local["request-bytes"] += req_len
                try:
                    conn.sendall(RESP.pack(resp_len))
                    conn.sendall(chunk_of(resp_seed(mseed), resp_len))
                except (ConnectionResetError, BrokenPipeError):
                    local["reset-in-response"] += 1
                    break
                local["response-bytes"] += resp_len
                if flags & F_CLOSE_AFTER:
                    local["server-closes"] += 1
                    break
    except Mismatch as e:
        local["mismatches"] += 1
        print(f"server: MISMATCH {e}", file=sys.stderr, flush=True)
    except Exception as e:
        local["errors"] += 1
        print(f"server: unexpected {e!r}", file=sys.stderr, flush=True)
        traceback.print_exc()
    local["connections"] += 1
    with lock:
        stats.update(local)


def run_server(transport: str) -> int:
    mod = load_sockmod(transport)
    stats: Counter[str] = Counter()
    lock = threading.Lock()
    threads: list[threading.Thread] = []
    with mod.socket(mod.AF_INET, mod.SOCK_STREAM) as listener:
        listener.bind(("127.0.0.1", 0))
        listener.listen(128)
        fds0, maps0 = fd_count(), len(rsock_maps())
        print("PORT", listener.getsockname()[1], flush=True)
        stop = threading.Event()
        # stdin closing is the signal to stop
        threading.Thread(target=lambda: (sys.stdin.read(), stop.set()), daemon=True).start()
        listener.settimeout(0.2)
        n = 0
        while not stop.is_set():
            try:
                conn, _ = listener.accept()
            except TimeoutError:
                threads = [t for t in threads if t.is_alive()]
                continue
            n += 1
            t = threading.Thread(target=serve_connection, args=(conn, stats, lock, n), daemon=True)
            t.start()
            threads.append(t)
        for t in threads:
            t.join(IO_TIMEOUT + 10)
        stats["stuck-threads"] = sum(t.is_alive() for t in threads)
        stats["leaked-fds"] = settled_fds(fds0) - fds0
        stats["leaked-maps"] = len(rsock_maps()) - maps0
    print("RESULT", json.dumps(dict(stats), separators=(",", ":")), flush=True)
    return 0


# --------------------------------------------------------------------------- client


def client_connection(mod: Any, port: int, rng: random.Random, local: Counter[str]) -> None:
    sock = mod.socket(mod.AF_INET, mod.SOCK_STREAM)
    with sock:
        sock.settimeout(IO_TIMEOUT)
        sock.connect(("127.0.0.1", port))
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        if mod.__name__ == "rsock" and sock.provider != "shm":
            raise RuntimeError(f"took the {sock.provider} path")
        if rng.random() < 0.5:
            sock.settimeout(None)  # blocking; else keep the timeout
        local["connections"] += 1
        reader = Reader(sock, rng)
        ending = rng.choices(ENDINGS, ENDING_WEIGHTS)[0]
        exchanges = rng.randint(1, 12)
        for i in range(exchanges):
            last = i == exchanges - 1
            req_len, resp_len = log_size(rng), log_size(rng)
            mseed = rng.getrandbits(32)
            flags = F_CLOSE_AFTER if last and ending == "server-close" else 0
            head = REQ.pack(req_len, resp_len, mseed, flags)
            payload = chunk_of(mseed, req_len)
            if last and ending == "abort":
                sock.sendall(head)
                sock.sendall(payload[: rng.randrange(req_len)])
                local["aborts"] += 1
                return
            sock.sendall(head)
            sock.sendall(payload)
            local["request-bytes"] += req_len
            if last and ending == "abandon":
                local["abandons"] += 1
                return  # close with the response unread (or partly arrived)
            if last and ending == "half-close":
                sock.shutdown(socket.SHUT_WR)
            head = reader.exact(RESP.size)
            if head is None:
                raise EOFError("EOF instead of a response")
            (n,) = RESP.unpack(head)
            if n != resp_len:
                raise Mismatch(f"response length {n}, asked for {resp_len}")
            reader.verify(resp_len, resp_seed(mseed), "response")
            local["responses"] += 1
            local["response-bytes"] += resp_len
        if ending in ("server-close", "half-close"):
            if reader.exact(1) is not None:
                raise Mismatch("data after the last response")
            local[ending] += 1
        else:
            local["normal"] += 1


def client_thread(
    mod: Any, port: int, seed: int, end: float, stats: Counter[str], lock: threading.Lock
) -> None:
    rng = random.Random(seed)
    local: Counter[str] = Counter()
    while time.monotonic() < end:
        try:
            client_connection(mod, port, rng, local)
        except Mismatch as e:
            local["mismatches"] += 1
            print(f"client: MISMATCH {e}", file=sys.stderr, flush=True)
        except Exception as e:
            local["errors"] += 1
            print(f"client: unexpected {e!r}", file=sys.stderr, flush=True)
            traceback.print_exc()
    with lock:
        stats.update(local)


def settled_fds(fds0: int) -> int:
    """This process's fd count, given a moment to come back to fds0: a
    joined thread's OS thread may still be ending (the engine closes the
    thread's kick eventfd then)."""
    settle = time.monotonic() + 2
    while fd_count() > fds0 and time.monotonic() < settle:
        time.sleep(0.02)
    return fd_count()


def run_client(transport: str, port: int, seconds: float, threads: int, seed: int) -> int:
    mod = load_sockmod(transport)
    warm_thread()  # (a finalizer may wait in this thread: its kick eventfd stays)
    fds0, maps0 = fd_count(), len(rsock_maps())
    stats: Counter[str] = Counter()
    lock = threading.Lock()
    end = time.monotonic() + seconds
    ts = [
        threading.Thread(target=client_thread, args=(mod, port, seed * 1000 + k, end, stats, lock))
        for k in range(threads)
    ]
    for t in ts:
        t.start()
    for t in ts:
        t.join()
    stats["leaked-fds"] = settled_fds(fds0) - fds0
    stats["leaked-maps"] = len(rsock_maps()) - maps0
    print("RESULT", json.dumps(dict(stats), separators=(",", ":")), flush=True)
    return 0


# --------------------------------------------------------------------------- orchestrator


def child(args: list[str], env: dict[str, str] | None = None) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, str(Path(__file__).resolve()), *args],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
        env={**os.environ, **(env or {})},
        preexec_fn=die_with_parent,
    )


def die_with_parent() -> None:
    import ctypes
    import signal

    ctypes.CDLL(None).prctl(1, signal.SIGKILL, 0, 0, 0)  # PR_SET_PDEATHSIG


def result_of(proc: subprocess.Popen[str], timeout: float) -> dict[str, int]:
    out, _ = proc.communicate(timeout=timeout)  # closes its stdin: the server's stop signal
    lines = [line for line in out.splitlines() if line.startswith("RESULT ")]
    if proc.returncode != 0 or not lines:
        raise RuntimeError(f"{proc.args} exited with {proc.returncode}")
    return dict(json.loads(lines[-1].split(" ", 1)[1]))


def run(args: argparse.Namespace) -> int:
    shm_before = dev_shm()
    started = time.monotonic()
    os.environ.setdefault("RSOCK_FALLBACK", "never")
    server = child(["--role", "server", "--transport", args.transport])
    procs = [server]
    try:
        assert server.stdout is not None
        port = int(server.stdout.readline().split()[1])
        clients = []
        for i in range(args.clients):
            env = {"RSOCK_RING_SIZE": str(RING_SIZES[i % len(RING_SIZES)])}
            c = child(
                [
                    "--role", "client", "--transport", args.transport, "--port", str(port),
                    "--seconds", str(args.seconds), "--threads", str(args.threads),
                    "--seed", str(args.seed * 100 + i),
                ],
                env,
            )  # fmt: skip
            clients.append(c)
            procs.append(c)
        client_results = [result_of(c, args.seconds + IO_TIMEOUT * 2) for c in clients]
        server_result = result_of(server, IO_TIMEOUT * 2)
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait()
    total: Counter[str] = Counter()
    for r in client_results:
        total.update(r)
    new_shm = {n for n in dev_shm() - shm_before if not n.startswith("sem.")}
    summary: dict[str, Any] = {
        "transport": args.transport,
        "seconds": round(time.monotonic() - started, 1),
        "clients": args.clients,
        "threads": args.threads,
        "client": dict(total),
        "server": server_result,
        "verified-bytes": total["response-bytes"] + server_result.get("request-bytes", 0),
        "new-dev-shm": sorted(new_shm),
    }
    problems = []
    for side, r in (("client", total), ("server", server_result)):
        for key in ("mismatches", "errors", "leaked-fds", "leaked-maps", "stuck-threads"):
            if r.get(key, 0):
                problems.append(f"{side} {key}={r[key]}")
    # every early end the server saw was one the clients chose
    early = sum(
        server_result.get(k, 0) for k in ("truncated", "reset-in-header", "reset-in-response")
    )
    if early > total["aborts"] + total["abandons"]:
        problems.append(
            f"server saw {early} early ends, clients made {total['aborts'] + total['abandons']}"
        )
    if server_result.get("connections", 0) != total["connections"]:
        problems.append(
            f"server served {server_result.get('connections')} of "
            f"{total['connections']} connections"
        )
    if total["responses"] == 0:
        problems.append("no traffic")
    if new_shm:
        problems.append(f"new /dev/shm entries {sorted(new_shm)}")
    summary["problems"] = problems
    print(
        f"soak {args.transport}: {summary['seconds']} s, {total['connections']} connections, "
        f"{total['responses']} exchanges, {summary['verified-bytes'] / MiB:.1f} MiB verified, "
        f"endings: normal {total['normal']} server-close {total['server-close']} "
        f"half-close {total['half-close']} abort {total['aborts']} abandon {total['abandons']}; "
        f"{'CLEAN' if not problems else 'PROBLEMS: ' + '; '.join(problems)}"
    )
    print(json.dumps(summary, separators=(",", ":")), flush=True)
    return 0 if not problems else 1


def main() -> int:
    p = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument("--seconds", type=float, default=float(os.environ.get("SOAK_SECONDS", 600)))
    p.add_argument("--transport", choices=["rsock", "tcp"], default="rsock")
    p.add_argument("--clients", type=int, default=3)
    p.add_argument("--threads", type=int, default=3)
    p.add_argument("--seed", type=int, default=1)
    p.add_argument(
        "--role", choices=["main", "server", "client"], default="main", help=argparse.SUPPRESS
    )
    p.add_argument("--port", type=int, default=0, help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.role == "server":
        return run_server(args.transport)
    if args.role == "client":
        return run_client(args.transport, args.port, args.seconds, args.threads, args.seed)
    return run(args)


if __name__ == "__main__":
    sys.exit(main())
