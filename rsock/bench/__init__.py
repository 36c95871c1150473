"""``python -m rsock.bench``: rsock against TCP (and AF_UNIX) in one run.

Every case (transport x test x size) runs a server and a client in two fresh processes
(``_worker.py``, started by path so that only the rsock case imports ``rsock``), pinned
as ``--pin`` says.  The parent only starts them, enforces the timeout and reports.

Tests:

* stream: the client ``sendall``s messages of one size, the server ``recv_into``s them
  and verifies them against the known pattern, then acks with a crc32.  One fully
  verified warm-up, one calibration phase, then ``--reps`` repetitions of about
  ``--rep-time`` seconds each.  Throughput is client-timed (first send to ack) in
  GB/s = 10**9 bytes/s: median [min-max] over the repetitions.  CPU is user+sys of
  each process per 10**9 bytes.
* msgrate: the stream test with ``--msg-size`` (64 B) messages: the client writes them
  back to back, one ``sendall`` (asyncio: ``write``) each, the server checks every one
  against the pattern, then acks.  Warm-up of at most 20000 messages (--quick 5000),
  calibration, then ``--reps`` repetitions of ~``--rep-time``: messages/s, median
  [min-max].
* pingpong: the client sends ``--ping-size`` bytes, the server echoes them; each round
  trip is timed on its own: percentiles of the round-trip time (RTT, not RTT/2).
* connrate (sync api only): the client loops connect + 1-byte echo + close (the server
  closes first); a warm-up, then ``--reps`` phases of ~``--rep-time`` seconds each:
  connections/s, median [min-max].  For rsock this is its whole connection setup
  (rendezvous included), for tcp/unix the kernel's.

APIs (``--api``):

* sync: blocking sockets, as above.
* asyncio: both processes run an event loop (``--loop``: uvloop, the default when it
  is importable, or asyncio's own) with Protocols, not streams.  tcp/unix use the
  loop's ``create_server``/``create_connection`` (``create_unix_*``), rsock uses
  ``rsock.asyncio``'s.  Same wire protocol, warm-up, verification, ack and CPU
  accounting; the client ``write``s each message and waits while the transport has
  paused writing, the server is a BufferedProtocol that receives each header and
  message straight into a preallocated buffer and checks it as the sync server does.

This module never imports ``rsock`` itself (and ``rsock/__init__.py`` must not import
it), so ``--transport tcp,unix`` works without the native engine.
"""

from __future__ import annotations

import argparse
import datetime
import importlib.metadata
import importlib.util
import json
import math
import os
import platform
import re
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

WORKER = Path(__file__).resolve().with_name("_worker.py")
TRANSPORTS = ("rsock", "tcp", "unix")
TESTS = ("stream", "msgrate", "pingpong", "connrate")
SYNC_ONLY_TESTS = ("connrate",)
SWEEP_SIZES = [64, 256, 1 << 10, 4 << 10, 16 << 10, 64 << 10, 256 << 10, 1 << 20, 4 << 20, 8 << 20]
MSGRATE_WARMUP = (20000, 5000)  # max warm-up messages of msgrate: (normal, --quick)
APIS = ("sync", "asyncio")
LOOPS = ("asyncio", "uvloop")
BASELINE = "tcp"
EXIT_FAILED = 1
EXIT_VERIFY = 3

_UNITS = {
    "": 1,
    "B": 1,
    "K": 1 << 10,
    "KB": 1 << 10,
    "KIB": 1 << 10,
    "M": 1 << 20,
    "MB": 1 << 20,
    "MIB": 1 << 20,
    "G": 1 << 30,
    "GB": 1 << 30,
    "GIB": 1 << 30,
}


def parse_size(text: str) -> int:
    """``64K``, ``1M``, ``4096``, ``64KiB`` -> bytes (K/M/G are binary: 1024)."""
    m = re.fullmatch(r"\s*(\d+)\s*([A-Za-z]*)\s*", text)
    unit = m.group(2).upper() if m else ""
    if not m or unit not in _UNITS:
        raise argparse.ArgumentTypeError(f"bad size {text!r} (examples: 64K, 1M, 4096)")
    n = int(m.group(1)) * _UNITS[unit]
    if n <= 0:
        raise argparse.ArgumentTypeError(f"size must be positive: {text!r}")
    return n


def parse_sizes(text: str) -> list[int]:
    return [parse_size(part) for part in text.split(",") if part.strip()]


def parse_list(choices: tuple[str, ...]) -> Callable[[str], list[str]]:
    def parse(text: str) -> list[str]:
        items: list[str] = []
        for part in text.split(","):
            part = part.strip().lower()
            if part not in choices:
                raise argparse.ArgumentTypeError(
                    f"unknown {part!r}; choose from {', '.join(choices)}"
                )
            if part not in items:
                items.append(part)
        return items

    return parse


def fmt_size(n: int) -> str:
    for unit, scale in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if n >= scale and n % scale == 0:
            return f"{n // scale} {unit}"
    return f"{n} B"


# --------------------------------------------------------------------------- options


@dataclass
class Options:
    transports: list[str]
    apis: list[str]
    loop: str  # event loop of the asyncio api
    tests: list[str]
    sizes: list[int]
    msg_size: int
    ping_size: int
    reps: int
    rep_time: float
    warmup_bytes: int
    rounds: int
    warmup_rounds: int
    pin: str
    verify: str
    timeout: float
    quick: bool
    json_path: str | None
    fault: str
    cpus: tuple[int, int] = (-1, -1)  # (server, client); -1 = not pinned


def build_parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(
        prog="python -m rsock.bench",
        description="Stream throughput, message rate, ping-pong latency and connection "
        "setup rate of rsock vs TCP (and AF_UNIX), server and client in separate processes.",
    )
    ap.add_argument(
        "--transport",
        type=parse_list(TRANSPORTS),
        default=["rsock", "tcp"],
        metavar="LIST",
        help="comma list of rsock,tcp,unix (default rsock,tcp)",
    )
    ap.add_argument(
        "--api",
        type=parse_list(APIS),
        default=list(APIS),
        metavar="LIST",
        help="comma list of sync,asyncio (default both): blocking sockets, and/or an "
        "event loop with Protocols on both sides",
    )
    ap.add_argument(
        "--loop",
        choices=LOOPS,
        default=None,
        help="event loop of the asyncio api (default uvloop if importable, else asyncio)",
    )
    ap.add_argument(
        "--tests",
        type=parse_list(TESTS),
        default=list(TESTS),
        metavar="LIST",
        help="comma list of stream,msgrate,pingpong,connrate (default all; connrate "
        "runs with the sync api only)",
    )
    ap.add_argument(
        "--sizes",
        type=parse_sizes,
        default=None,
        metavar="LIST",
        help="stream message sizes, e.g. 64K,1M,4096 (default 64K,1M)",
    )
    ap.add_argument(
        "--sweep",
        action="store_true",
        help="stream sizes 64,256,1K,4K,16K,64K,256K,1M,4M,8M instead of --sizes",
    )
    ap.add_argument(
        "--msg-size",
        type=parse_size,
        default=64,
        metavar="SIZE",
        help="msgrate message size (default 64)",
    )
    ap.add_argument(
        "--ping-size",
        type=parse_size,
        default=64,
        metavar="SIZE",
        help="ping-pong message size (default 64)",
    )
    ap.add_argument(
        "--reps", type=int, default=None, help="stream repetitions (default 5, --quick 3)"
    )
    ap.add_argument(
        "--rep-time",
        type=float,
        default=None,
        metavar="SECONDS",
        help="target duration of one stream/msgrate/connrate repetition (default 1.0, --quick 0.2)",
    )
    ap.add_argument(
        "--warmup-bytes",
        type=parse_size,
        default=None,
        metavar="SIZE",
        help="fully verified stream warm-up volume (default 64M, --quick 16M)",
    )
    ap.add_argument(
        "--rounds",
        type=int,
        default=None,
        help="timed ping-pong round trips (default 20000, --quick 2000)",
    )
    ap.add_argument(
        "--warmup-rounds",
        type=int,
        default=None,
        help="ping-pong warm-up round trips (default 2000, --quick 200)",
    )
    ap.add_argument(
        "--pin",
        choices=("split", "same", "none"),
        default="split",
        help="split: server on the first CPU, client on the second (default); "
        "same: both on the first; none: leave placement to the scheduler",
    )
    ap.add_argument(
        "--verify",
        choices=("sample", "full"),
        default="sample",
        help="timed stream phases check every message's head, tail and one byte "
        "in 512 (sample, default) or every byte (full); warm-up is always full",
    )
    ap.add_argument(
        "--timeout",
        type=float,
        default=120.0,
        metavar="SECONDS",
        help="limit for each case (one server + client pair), default 120",
    )
    ap.add_argument(
        "--quick", action="store_true", help="short run: fewer/shorter repetitions and round trips"
    )
    ap.add_argument(
        "--json",
        dest="json_path",
        metavar="PATH",
        help="write environment, configuration and every sample as JSON",
    )
    ap.add_argument(
        "--fault", choices=("", "flip", "stale", "hang"), default="", help=argparse.SUPPRESS
    )  # self-test of verification and timeouts
    return ap


def parse_options(argv: list[str]) -> Options:
    ap = build_parser()
    a = ap.parse_args(argv)
    q = bool(a.quick)

    def pick(value: Any, normal: Any, quick: Any) -> Any:
        return value if value is not None else (quick if q else normal)

    have_uvloop = importlib.util.find_spec("uvloop") is not None
    if a.sweep and a.sizes is not None:
        ap.error("--sweep and --sizes exclude each other")
    if a.loop == "uvloop" and not have_uvloop:
        ap.error("--loop uvloop: uvloop is not importable (pip install uvloop)")
    opts = Options(
        transports=a.transport,
        apis=a.api,
        loop=a.loop or ("uvloop" if have_uvloop else "asyncio"),
        tests=a.tests,
        sizes=list(SWEEP_SIZES) if a.sweep else (a.sizes or [64 << 10, 1 << 20]),
        msg_size=a.msg_size,
        ping_size=a.ping_size,
        reps=pick(a.reps, 5, 3),
        rep_time=pick(a.rep_time, 1.0, 0.2),
        warmup_bytes=pick(a.warmup_bytes, 64 << 20, 16 << 20),
        rounds=pick(a.rounds, 20000, 2000),
        warmup_rounds=pick(a.warmup_rounds, 2000, 200),
        pin=a.pin,
        verify=a.verify,
        timeout=a.timeout,
        quick=q,
        json_path=a.json_path,
        fault=a.fault,
    )
    if opts.reps < 1 or opts.rounds < 1 or opts.rep_time <= 0 or opts.timeout <= 0:
        ap.error("--reps and --rounds must be >= 1, --rep-time and --timeout > 0")
    if not opts.sizes:
        ap.error("--sizes is empty")
    if opts.pin != "none":
        cpus = sorted(os.sched_getaffinity(0))
        if opts.pin == "split":
            if len(cpus) < 2:
                ap.error(f"--pin split needs 2 CPUs, only {cpus} available (use same or none)")
            opts.cpus = (cpus[0], cpus[1])
        else:
            opts.cpus = (cpus[0], cpus[0])
    return opts


def pin_text(opts: Options) -> str:
    if opts.pin == "none":
        return "pin=none (unpinned)"
    return f"pin={opts.pin} (server cpu{opts.cpus[0]}, client cpu{opts.cpus[1]})"


# --------------------------------------------------------------------------- environment


def cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown"


def git_commit() -> str | None:
    root = Path(__file__).resolve().parents[2]
    if not (root / ".git").exists():
        return None
    try:
        out = subprocess.run(
            ["git", "-C", str(root), "rev-parse", "--short", "HEAD"],
            capture_output=True,
            text=True,
            timeout=10,
            check=False,
        )
    except (OSError, subprocess.SubprocessError):
        return None
    return out.stdout.strip() or None if out.returncode == 0 else None


def uvloop_version() -> str | None:
    try:
        return importlib.metadata.version("uvloop")
    except importlib.metadata.PackageNotFoundError:
        return None


def environment(opts: Options) -> dict[str, Any]:
    return {
        "date": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
        "python": platform.python_version(),
        "implementation": platform.python_implementation(),
        "executable": sys.executable,
        "cpu_model": cpu_model(),
        "cpu_count": os.cpu_count(),
        "kernel": f"{platform.system()} {platform.release()}",
        "machine": platform.machine(),
        "pin": opts.pin,
        "pin_cpus": {"server": opts.cpus[0], "client": opts.cpus[1]},
        "apis": opts.apis,
        "asyncio_loop": opts.loop,
        "uvloop_version": uvloop_version(),
        "git_commit": git_commit(),
        "rsock_env": {k: v for k, v in sorted(os.environ.items()) if k.startswith("RSOCK_")},
    }


# --------------------------------------------------------------------------- running


def api_tag(api: str, loop: str) -> str:
    return f"{api}/{loop}" if api == "asyncio" else api


@dataclass
class Case:
    transport: str
    test: str
    size: int
    api: str = "sync"
    loop: str = ""  # the asyncio api's event loop
    status: str = "ok"  # ok | verify | timeout | error
    error: str = ""
    seconds: float = 0.0
    server: dict[str, Any] = field(default_factory=dict)
    client: dict[str, Any] = field(default_factory=dict)
    server_stderr: str = ""
    client_stderr: str = ""
    summary: dict[str, Any] = field(default_factory=dict)

    @property
    def name(self) -> str:
        size = "" if self.test == "connrate" else f" {fmt_size(self.size)}"
        return f"{self.transport} {self.test}{size} [{self.tag}]"

    @property
    def tag(self) -> str:
        return api_tag(self.api, self.loop)

    def to_json(self) -> dict[str, Any]:
        return {
            "transport": self.transport,
            "api": self.api,
            "loop": self.loop if self.api == "asyncio" else None,
            "test": self.test,
            "size": self.size,
            "status": self.status,
            "error": self.error,
            "seconds": round(self.seconds, 3),
            "summary": self.summary,
            "server": self.server,
            "client": self.client,
            "server_stderr": self.server_stderr[-20000:],
            "client_stderr": self.client_stderr[-20000:],
        }


def worker_args(opts: Options, case: Case) -> list[str]:
    return [
        "--transport",
        case.transport,
        "--test",
        case.test,
        "--size",
        str(case.size),
        "--api",
        case.api,
        "--loop",
        case.loop or "asyncio",
        "--timeout",
        str(opts.timeout),
    ]


def warmup_bytes(opts: Options, case: Case) -> int:
    if case.test != "msgrate":
        return opts.warmup_bytes
    cap = MSGRATE_WARMUP[1 if opts.quick else 0]
    return case.size * max(4, min(opts.warmup_bytes // case.size, cap))


def client_args(opts: Options, case: Case) -> list[str]:
    return [
        "--reps",
        str(opts.reps),
        "--rep-time",
        str(opts.rep_time),
        "--warmup-bytes",
        str(warmup_bytes(opts, case)),
        "--verify",
        opts.verify,
        "--rounds",
        str(opts.rounds),
        "--warmup-rounds",
        str(opts.warmup_rounds),
        "--fault",
        opts.fault,
    ]


def read_result(path: Path) -> dict[str, Any] | None:
    result: dict[str, Any] | None = None
    for line in path.read_bytes().decode(errors="replace").splitlines():
        if line.startswith("RESULT "):
            try:
                result = json.loads(line[7:])
            except ValueError:
                result = None
    return result


def wait_ready(proc: subprocess.Popen[bytes], out: Path, deadline: float) -> str | None:
    while time.monotonic() < deadline:
        for line in out.read_bytes().decode(errors="replace").splitlines():
            if line.startswith("READY "):
                return line[6:].strip()
        if proc.poll() is not None:
            return None
        time.sleep(0.005)
    return None


def stop(proc: subprocess.Popen[bytes], grace: float) -> bool:
    """Wait up to ``grace`` seconds, then kill. True if it had to be killed."""
    try:
        proc.wait(timeout=max(grace, 0.0))
        return False
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()
        return True


def run_case(opts: Options, case: Case) -> None:
    start = time.monotonic()
    deadline = start + opts.timeout + 10.0  # the workers stop themselves at opts.timeout
    tmp = Path(tempfile.mkdtemp(prefix="rsock-bench-"))
    procs: list[subprocess.Popen[bytes]] = []
    killed = {"server": False, "client": False}
    try:
        files = {n: tmp / n for n in ("server.out", "server.err", "client.out", "client.err")}
        base = [sys.executable, str(WORKER)]
        addr = str(tmp / "sock") if case.transport == "unix" else ""
        with open(files["server.out"], "wb") as so, open(files["server.err"], "wb") as se:
            server = subprocess.Popen(
                [
                    *base,
                    "serve",
                    *worker_args(opts, case),
                    "--cpu",
                    str(opts.cpus[0]),
                    "--addr",
                    addr,
                ],
                stdin=subprocess.DEVNULL,
                stdout=so,
                stderr=se,
            )
        procs.append(server)
        ready = wait_ready(server, files["server.out"], deadline)
        if ready is not None:
            with open(files["client.out"], "wb") as co, open(files["client.err"], "wb") as ce:
                client = subprocess.Popen(
                    [
                        *base,
                        "client",
                        *worker_args(opts, case),
                        "--cpu",
                        str(opts.cpus[1]),
                        "--addr",
                        ready,
                        *client_args(opts, case),
                    ],
                    stdin=subprocess.DEVNULL,
                    stdout=co,
                    stderr=ce,
                )
            procs.append(client)
            killed["client"] = stop(client, deadline - time.monotonic())
            grace = 10.0 if client.returncode == 0 else 2.0
            killed["server"] = stop(server, min(grace, deadline - time.monotonic()))
        else:
            killed["server"] = stop(server, 0.0 if server.poll() is None else 1.0)
        case.server = read_result(files["server.out"]) or {}
        case.server_stderr = files["server.err"].read_bytes().decode(errors="replace")
        if ready is not None:
            case.client = read_result(files["client.out"]) or {}
            case.client_stderr = files["client.err"].read_bytes().decode(errors="replace")
        classify(case, ready is not None, killed)
    except Exception as exc:  # noqa: BLE001 - one broken case must not stop the others
        case.status, case.error = "error", f"bench harness: {type(exc).__name__}: {exc}"
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait()
        shutil.rmtree(tmp, ignore_errors=True)
        case.seconds = time.monotonic() - start
    if case.status == "ok":
        try:
            case.summary = summarize(case)
        except (KeyError, IndexError, TypeError, ValueError, ZeroDivisionError) as exc:
            case.status, case.error = "error", f"incomplete results: {exc!r}"


def stderr_tail(text: str, lines: int = 6) -> str:
    tail = [ln for ln in text.strip().splitlines() if ln.strip()][-lines:]
    return "\n".join("    " + ln for ln in tail)


def classify(case: Case, started_client: bool, killed: dict[str, bool]) -> None:
    sides = [("server", case.server, case.server_stderr)]
    if started_client:
        sides.insert(0, ("client", case.client, case.client_stderr))
    verify = [f"{n}: {r['verify_error']}" for n, r, _ in sides if r.get("verify_error")]
    if verify:
        case.status, case.error = "verify", "; ".join(verify)
        return
    timed_out = [n for n, r, err in sides if killed[n] or (not r and "Timeout (" in err)]
    if timed_out:
        case.status = "timeout"
        case.error = f"{' and '.join(timed_out)} did not finish within --timeout"
        tails = [f"  {n} stderr:\n{stderr_tail(err)}" for n, _, err in sides if err.strip()]
        case.error += ("\n" + "\n".join(tails)) if tails else ""
        return
    errors = []
    for n, r, err in sides:
        if r.get("ok"):
            continue
        msg = r.get("error") or "exited without a result"
        errors.append(f"{n}: {msg}" + (f"\n{stderr_tail(err)}" if err.strip() else ""))
    if not started_client and not errors:
        errors.append("server never became ready")
    if errors:
        case.status, case.error = "error", "\n  ".join(errors)


# --------------------------------------------------------------------------- statistics


def percentile(sorted_values: list[float], p: float) -> float:
    """Nearest-rank percentile (p in 0..100) of an ascending list."""
    if not sorted_values:
        raise ValueError("no samples")
    rank = math.ceil(p * len(sorted_values) / 100 - 1e-9)
    return sorted_values[min(max(rank, 1), len(sorted_values)) - 1]


def median(values: list[float]) -> float:
    s = sorted(values)
    n = len(s)
    return s[n // 2] if n % 2 else (s[n // 2 - 1] + s[n // 2]) / 2


def summarize(case: Case) -> dict[str, Any]:
    cph = case.client["phases"]
    if case.test == "connrate":
        rates = [c["count"] / c["ns"] * 1e9 for c in cph if c["kind"] == "rep"]
        total = case.server["connections"]
        if total != case.client["connections"]:
            raise ValueError(
                f"client made {case.client['connections']} connections, server saw {total}"
            )
        return {
            "conn_per_s_median": median(rates),
            "conn_per_s_min": min(rates),
            "conn_per_s_max": max(rates),
            "conn_per_s": rates,
            "connections": total,
            "client_cpu_us_per_conn": median(
                [c["cpu_s"] / c["count"] * 1e6 for c in cph if c["kind"] == "rep"]
            ),
            "server_cpu_us_per_conn": case.server["cpu_s"] / max(total, 1) * 1e6,
        }
    sph = case.server["phases"]
    if len(cph) != len(sph):
        raise ValueError(f"client ran {len(cph)} phases, server {len(sph)}")
    reps = [(c, s) for c, s in zip(cph, sph, strict=True) if c["kind"] == "rep"]
    if case.test == "msgrate":
        rates = [c["count"] / c["ns"] * 1e9 for c, _ in reps]
        return {
            "msg_per_s_median": median(rates),
            "msg_per_s_min": min(rates),
            "msg_per_s_max": max(rates),
            "msg_per_s": rates,
            "server_msg_per_s": [c["count"] / s["ns"] * 1e9 for c, s in reps],
            "msgs_per_rep": reps[0][0]["count"],
            "client_cpu_ns_per_msg": median([c["cpu_s"] / c["count"] * 1e9 for c, _ in reps]),
            "server_cpu_ns_per_msg": median([s["cpu_s"] / c["count"] * 1e9 for c, s in reps]),
        }
    if case.test == "stream":
        gbps = [c["bytes"] / c["ns"] for c, _ in reps]
        ccpu = [c["cpu_s"] / (c["bytes"] / 1e9) for c, _ in reps]
        scpu = [s["cpu_s"] / (c["bytes"] / 1e9) for c, s in reps]
        return {
            "gbps_median": median(gbps),
            "gbps_min": min(gbps),
            "gbps_max": max(gbps),
            "gbps": gbps,
            "server_gbps": [c["bytes"] / s["ns"] for c, s in reps],
            "bytes_per_rep": reps[0][0]["bytes"],
            "client_cpu_s_per_gb": median(ccpu),
            "server_cpu_s_per_gb": median(scpu),
        }
    rtt = sorted(x / 1000.0 for x in case.client["rtt_ns"])
    c, s = reps[-1]
    return {
        "rtt_us_p50": percentile(rtt, 50),
        "rtt_us_p90": percentile(rtt, 90),
        "rtt_us_p99": percentile(rtt, 99),
        "rtt_us_p99_9": percentile(rtt, 99.9),
        "rtt_us_min": rtt[0],
        "rtt_us_max": rtt[-1],
        "rtt_us_mean": sum(rtt) / len(rtt),
        "rounds": len(rtt),
        "client_cpu_us_per_rt": c["cpu_s"] / c["count"] * 1e6,
        "server_cpu_us_per_rt": s["cpu_s"] / s["count"] * 1e6,
    }


# --------------------------------------------------------------------------- report


def micro() -> str:
    try:
        "µ".encode(sys.stdout.encoding or "ascii")
        return "µs"
    except (UnicodeEncodeError, LookupError):
        return "us"


@dataclass
class Row:
    label: str
    key: str  # summary key compared across transports
    higher_better: bool
    digits: int
    first: bool = False  # first row of a case: shows the failure status
    spread: bool = False  # append [min-max] from "<key minus _median>_min/_max"

    def cell(self, summary: dict[str, Any]) -> str:
        text = f"{summary[self.key]:.{self.digits}f}"
        if self.spread:
            base = self.key.removesuffix("_median")
            lo, hi = summary[base + "_min"], summary[base + "_max"]
            text += f" [{lo:.{self.digits}f}-{hi:.{self.digits}f}]"
        return text


def rows_for(test: str, size: int, tag: str) -> list[Row]:
    us = micro()
    if test == "stream":
        return [
            Row(
                f"stream {fmt_size(size)} [{tag}]  GB/s",
                "gbps_median",
                True,
                3,
                first=True,
                spread=True,
            ),
            Row("  cpu client s/GB", "client_cpu_s_per_gb", False, 3),
            Row("  cpu server s/GB", "server_cpu_s_per_gb", False, 3),
        ]
    if test == "msgrate":
        return [
            Row(
                f"msgrate {fmt_size(size)} [{tag}]  msg/s",
                "msg_per_s_median",
                True,
                0,
                first=True,
                spread=True,
            ),
            Row("  cpu client ns/msg", "client_cpu_ns_per_msg", False, 0),
            Row("  cpu server ns/msg", "server_cpu_ns_per_msg", False, 0),
        ]
    if test == "connrate":
        return [
            Row(f"connrate [{tag}]  conn/s", "conn_per_s_median", True, 0, first=True, spread=True),
            Row(f"  cpu client {us}/conn", "client_cpu_us_per_conn", False, 1),
            Row(f"  cpu server {us}/conn", "server_cpu_us_per_conn", False, 1),
        ]
    return [
        Row(f"pingpong {fmt_size(size)} [{tag}]  RTT p50 {us}", "rtt_us_p50", False, 1, first=True),
        Row(f"  RTT p90 {us}", "rtt_us_p90", False, 1),
        Row(f"  RTT p99 {us}", "rtt_us_p99", False, 1),
        Row(f"  RTT p99.9 {us}", "rtt_us_p99_9", False, 1),
        Row(f"  cpu client {us}/RT", "client_cpu_us_per_rt", False, 1),
        Row(f"  cpu server {us}/RT", "server_cpu_us_per_rt", False, 1),
    ]


def comparison(transports: list[str]) -> tuple[str, str] | None:
    if BASELINE not in transports or len(transports) < 2:
        return None
    subject = "rsock" if "rsock" in transports else next(t for t in transports if t != BASELINE)
    return subject, BASELINE


def ratio_text(row: Row, a: dict[str, Any], b: dict[str, Any]) -> str:
    x, y = a.get(row.key), b.get(row.key)
    if not isinstance(x, (int, float)) or not isinstance(y, (int, float)) or x <= 0 or y <= 0:
        return "-"
    adv = x / y if row.higher_better else y / x  # > 1: the subject is better
    return f"{adv:.2f}x better" if adv >= 1 else f"{1 / adv:.2f}x worse"


def env_line(env: dict[str, Any], opts: Options, cases: list[Case]) -> str:
    parts = [
        f"Python {env['python']}",
        f"{env['cpu_model']} x{env['cpu_count']}",
        env["kernel"],
        pin_text(opts),
        f"commit {env['git_commit'] or 'n/a'}",
    ]
    providers = sorted(
        {
            str(side.get("provider"))
            for c in cases
            if c.transport == "rsock"
            for side in (c.client, c.server)
            if side.get("provider") is not None
        }
    )
    if "asyncio" in opts.apis:
        loop = opts.loop
        if loop == "uvloop":
            loop += f" {env.get('uvloop_version') or '?'}"
        parts.append(f"asyncio loop={loop}")
    if "rsock" in opts.transports:
        parts.append(f"rsock provider={','.join(providers) or 'n/a'}")
        versions = {c.client.get("rsock_version") for c in cases if c.transport == "rsock"}
        versions.discard(None)
        if versions:
            parts.append(f"rsock {','.join(sorted(map(str, versions)))}")
    rsock_env = env["rsock_env"]
    parts.append(" ".join(f"{k}={v}" for k, v in rsock_env.items()) or "no RSOCK_* env")
    return " | ".join(parts)


def render(opts: Options, env: dict[str, Any], cases: list[Case]) -> str:
    by_key = {(c.transport, c.api, c.test, c.size): c for c in cases}
    cmp = comparison(opts.transports)
    header = ["test", *opts.transports]
    if cmp:
        header.append(f"{cmp[0]} vs {cmp[1]}")
    table: list[list[str]] = []
    for api in opts.apis:
        for test, size in plan_tests(opts, api):
            for row in rows_for(test, size, api_tag(api, opts.loop)):
                line = [row.label]
                for t in opts.transports:
                    c = by_key[(t, api, test, size)]
                    if c.status == "ok":
                        line.append(row.cell(c.summary))
                    else:
                        line.append(f"FAILED ({c.status})" if row.first else "-")
                if cmp:
                    a, b = by_key[(cmp[0], api, test, size)], by_key[(cmp[1], api, test, size)]
                    ok = a.status == "ok" and b.status == "ok"
                    line.append(ratio_text(row, a.summary, b.summary) if ok else "-")
                table.append(line)
    widths = [max(len(r[i]) for r in [header, *table]) for i in range(len(header))]

    def fmt_line(cells: list[str]) -> str:
        first = cells[0].ljust(widths[0])
        rest = [c.rjust(w) for c, w in zip(cells[1:], widths[1:], strict=True)]
        return "  ".join([first, *rest]).rstrip()

    out = [
        f"env: {env_line(env, opts, cases)}",
        "",
        fmt_line(header),
        fmt_line(["-" * w for w in widths]),
        *map(fmt_line, table),
        "",
    ]
    tests = {test for api in opts.apis for test, _ in plan_tests(opts, api)}
    if "stream" in tests:
        out.append(
            "GB/s = 10^9 bytes/s, client-timed from first send to ack, median [min-max] of "
            f"{opts.reps} reps of ~{opts.rep_time:g} s; verify={opts.verify} "
            "(warm-up: every byte)."
        )
    if "msgrate" in tests:
        out.append(
            f"msg/s = {fmt_size(opts.msg_size)} messages written back to back (one sendall/"
            "write each), every one checked by the server; client-timed to the ack, median "
            f"[min-max] of {opts.reps} reps of ~{opts.rep_time:g} s."
        )
    if "pingpong" in tests:
        out.append(
            f"RTT = full round-trip time of one {fmt_size(opts.ping_size)} message echoed by "
            f"the server, {opts.rounds} samples after {opts.warmup_rounds} warm-up."
        )
    if "connrate" in tests:
        out.append(
            "conn/s = connect + 1-byte echo + close (server closes first) in a loop, sync "
            f"api only, median [min-max] of {opts.reps} reps of ~{opts.rep_time:g} s."
        )
    out.append(
        "cpu = user+sys of that process (median over reps) per 10^9 bytes, message, RT or "
        "connection (connrate server: whole session)."
    )
    if "asyncio" in opts.apis:
        out.append(
            f"[asyncio/{opts.loop}]: both sides on a {opts.loop} event loop with Protocols "
            "(default write-buffer limits; the client waits while writing is paused, the "
            "server is a BufferedProtocol); tcp/unix: the loop's own create_server/"
            "create_connection, rsock: rsock.asyncio."
        )
    if cmp:
        out.append(
            f"'{cmp[0]} vs {cmp[1]}': how many times better {cmp[0]} is than {cmp[1]} on that "
            "row, same api and size (throughput and rates: higher is better; RTT and cpu: lower "
            "is better)."
        )
    failed = [c for c in cases if c.status != "ok"]
    if failed:
        out.append("")
        out.extend(f"FAILED {c.name} ({c.status}): {c.error}" for c in failed)
    return "\n".join(out)


def plan_tests(opts: Options, api: str) -> list[tuple[str, int]]:
    plan: list[tuple[str, int]] = []
    if "stream" in opts.tests:
        plan.extend(("stream", s) for s in opts.sizes)
    if "msgrate" in opts.tests:
        plan.append(("msgrate", opts.msg_size))
    if "pingpong" in opts.tests:
        plan.append(("pingpong", opts.ping_size))
    if "connrate" in opts.tests and api == "sync":
        plan.append(("connrate", 1))
    return plan


def progress(case: Case) -> str:
    s = case.summary
    if case.status != "ok":
        return f"FAILED ({case.status}): {case.error.splitlines()[0] if case.error else ''}"
    if case.test == "stream":
        return f"{s['gbps_median']:.3f} GB/s [{s['gbps_min']:.3f}-{s['gbps_max']:.3f}]"
    if case.test in ("msgrate", "connrate"):
        key, unit = ("msg_per_s", "msg/s") if case.test == "msgrate" else ("conn_per_s", "conn/s")
        lo, hi = s[key + "_min"], s[key + "_max"]
        return f"{s[key + '_median']:.0f} {unit} [{lo:.0f}-{hi:.0f}]"
    return f"RTT p50 {s['rtt_us_p50']:.1f} {micro()}, p99 {s['rtt_us_p99']:.1f} {micro()}"


def main(argv: list[str] | None = None) -> int:
    opts = parse_options(sys.argv[1:] if argv is None else argv)
    env = environment(opts)
    plan = [
        (t, api, test, size)
        for api in opts.apis
        for test, size in plan_tests(opts, api)
        for t in opts.transports
    ]
    print(
        f"rsock.bench: {len(plan)} cases, {pin_text(opts)}{', quick' if opts.quick else ''}",
        file=sys.stderr,
        flush=True,
    )
    cases: list[Case] = []
    t0 = time.monotonic()
    for i, (transport, api, test, size) in enumerate(plan, 1):
        case = Case(transport, test, size, api, opts.loop if api == "asyncio" else "")
        print(f"[{i}/{len(plan)}] {case.name} ...", end=" ", file=sys.stderr, flush=True)
        run_case(opts, case)
        print(f"{progress(case)} ({case.seconds:.1f} s)", file=sys.stderr, flush=True)
        cases.append(case)
    total = time.monotonic() - t0
    print(render(opts, env, cases))
    print(f"total {total:.1f} s", file=sys.stderr)
    if opts.json_path:
        doc = {
            "env": env,
            "config": {k: v for k, v in vars(opts).items() if k != "json_path"},
            "seconds": round(total, 3),
            "cases": [c.to_json() for c in cases],
        }
        Path(opts.json_path).write_text(json.dumps(doc, indent=1, default=str) + "\n")
    if any(c.status == "verify" for c in cases):
        return EXIT_VERIFY
    return EXIT_FAILED if any(c.status != "ok" for c in cases) else 0


if __name__ == "__main__":  # `python rsock/bench/__init__.py`: runs without importing rsock
    sys.exit(main())
