"""``python -m rsock.bench apps``: unmodified framework programs, TCP against rsock.

Each case runs one server program and one client program of ``rsock/bench/apps``
(written as the framework's documentation shows, no rsock import) twice: with plain
Python (TCP) and under ``python -m rsock run --report`` with ``RSOCK_FALLBACK=strict``
(rsock).  Both servers of a case are started first (pinned to the server CPU); then the
clients (pinned to the client CPU) run one after the other, TCP rep, rsock rep, TCP rep,
..., so a slow spell of the machine falls on both alike.  Each client process runs its
loop for a warm-up, then for ``--rep-time`` seconds, and prints one JSON line with its
count, bytes and elapsed time; the figure of a rep is count/elapsed (requests, round
trips or messages per second) or bytes/elapsed (MB/s, 10**6 bytes).  The table shows
the median over the reps [min-max] and rsock/TCP of the medians (> 1: rsock is better).

Each client also times every request (round trip, message) of its timed loop and prints
those latencies in its JSON line; the stall rule (``stalled``: the slowest above 100 ms
while the median is below 10 ms) is applied to each run.  A stall is a bug, not a speed
figure: the table's stall column and the JSON (``stall`` per case and transport, and per
sample) show it, and the case FAILS.

The rsock side must prove the fast path: every client report and the server's report
must count connections on a fast provider (``connect:shm``/``accept:shm``, or verbs)
and no ``:tcp`` key at all (under ``strict`` a plain TCP connection is refused, so none
can hide); otherwise the case FAILS and the table says why.

A case whose framework is not importable is skipped with one line.  Every process has a
timeout; servers are stopped by closing their standard input (uvicorn: SIGINT), then
killed if they do not exit.  This module never imports rsock.
"""

from __future__ import annotations

import argparse
import importlib.metadata
import importlib.util
import json
import os
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

if __package__:
    from rsock.bench import _env
else:  # run from rsock/bench/ itself: the sibling modules are on sys.path[0]
    import _env  # type: ignore[import-not-found,no-redef]

APPS = Path(__file__).resolve().with_name("apps")
BOOT = Path(__file__).resolve().parents[1] / "_boot"  # rsock run's start-up hook directory
TRANSPORTS = ("tcp", "rsock")
FRAMEWORKS = ("aiohttp", "uvicorn", "uvloop", "httpx", "h11", "httptools", "tornado",
              "trio", "websockets", "requests", "distributed", "numpy")  # fmt: skip
FAST = ("shm", "verbs")
EXIT_FAILED = 1


@dataclass(frozen=True)
class AppCase:
    name: str
    title: str
    unit: str  # "req/s", "RT/s", "msg/s", "conn/s" (count / s) or "MB/s" (bytes / s)
    modules: tuple[str, ...]  # must be importable, else the case is skipped
    server: tuple[str, ...]  # a program of apps/ and its arguments, or ("-m", "uvicorn", ...)
    client: str
    mode: str

    def figure(self, sample: dict[str, Any]) -> float:
        n = sample["bytes"] / 1e6 if self.unit == "MB/s" else sample["count"]
        return float(n) / float(sample["elapsed"])


UVICORN = ("-m", "uvicorn", "asgi_app:app", "--loop", "uvloop", "--no-access-log",
           "--log-level", "info")  # fmt: skip

CASES = (
    AppCase("aiohttp-keepalive", "aiohttp keep-alive small GET", "req/s", ("aiohttp",),
            ("aiohttp_server.py",), "aiohttp_client.py", "keepalive"),
    AppCase("aiohttp-newconn", "aiohttp new-connection small GET", "req/s", ("aiohttp",),
            ("aiohttp_server.py",), "aiohttp_client.py", "newconn"),
    AppCase("aiohttp-1mib", "aiohttp 1 MiB GET", "MB/s", ("aiohttp",),
            ("aiohttp_server.py",), "aiohttp_client.py", "big"),
    AppCase("aiohttp-stream", "aiohttp streamed 64 MiB body", "MB/s", ("aiohttp",),
            ("aiohttp_server.py",), "aiohttp_client.py", "stream"),
    AppCase("aiohttp-file", "aiohttp 32 MiB file (FileResponse)", "MB/s", ("aiohttp",),
            ("aiohttp_server.py",), "aiohttp_client.py", "file"),
    AppCase("uvicorn-keepalive", "uvicorn(uvloop)+httpx keep-alive small GET", "req/s",
            ("uvicorn", "uvloop", "httpx"), UVICORN, "httpx_client.py", "keepalive"),
    AppCase("uvicorn-newconn", "uvicorn(uvloop)+httpx new-connection small GET", "req/s",
            ("uvicorn", "uvloop", "httpx"), UVICORN, "httpx_client.py", "newconn"),
    AppCase("uvicorn-1mib", "uvicorn(uvloop)+httpx 1 MiB GET", "MB/s",
            ("uvicorn", "uvloop", "httpx"), UVICORN, "httpx_client.py", "big"),
    AppCase("requests-keepalive", "http.server (threads) + requests keep-alive small GET",
            "req/s", ("requests",), ("http_server.py",), "requests_client.py", "keepalive"),
    AppCase("requests-newconn", "http.server (threads) + requests new-connection small GET",
            "req/s", ("requests",), ("http_server.py",), "requests_client.py", "newconn"),
    AppCase("requests-1mib", "http.server (threads) + requests 1 MiB GET", "MB/s",
            ("requests",), ("http_server.py",), "requests_client.py", "big"),
    AppCase("tornado-rtt", "tornado TCPServer/IOStream 64 B round trips", "RT/s",
            ("tornado",), ("tornado_server.py",), "tornado_client.py", "rtt"),
    AppCase("tornado-newconn", "tornado new connection per 64 B round trip", "conn/s",
            ("tornado",), ("tornado_server.py",), "tornado_client.py", "newconn"),
    AppCase("trio-rtt", "trio serve_tcp/open_tcp_stream 64 B round trips", "RT/s",
            ("trio",), ("trio_server.py",), "trio_client.py", "rtt"),
    AppCase("trio-newconn", "trio new connection per 64 B round trip", "conn/s",
            ("trio",), ("trio_server.py",), "trio_client.py", "newconn"),
    AppCase("selectors-rtt", "selectors echo server + socket client 64 B round trips",
            "RT/s", (), ("selectors_server.py",), "socket_client.py", "rtt"),
    AppCase("selectors-newconn", "selectors echo server, new connection per 64 B round trip",
            "conn/s", (), ("selectors_server.py",), "socket_client.py", "newconn"),
    AppCase("websockets-64b", "websockets 64 B messages (echoed)", "msg/s", ("websockets",),
            ("websockets_server.py",), "websockets_client.py", "small"),
    AppCase("websockets-1mib", "websockets 1 MiB echo", "MB/s", ("websockets",),
            ("websockets_server.py",), "websockets_client.py", "big"),
    AppCase("websockets-1mib-raw", "websockets 1 MiB echo, compression=None", "MB/s",
            ("websockets",), ("websockets_server.py", "raw"), "websockets_client.py", "bigraw"),
    AppCase("websockets-newconn", "websockets new connection per 64 B message", "conn/s",
            ("websockets",), ("websockets_server.py",), "websockets_client.py", "newconn"),
    AppCase("dask-scatter", "dask.distributed scatter of 64 MB to a worker", "MB/s",
            ("distributed", "numpy"), ("dask_server.py",), "dask_client.py", "scatter"),
    AppCase("dask-w2w", "dask.distributed 64 MB from worker to worker", "MB/s",
            ("distributed", "numpy"), ("dask_server.py",), "dask_client.py", "w2w"),
)  # fmt: skip
BY_NAME = {c.name: c for c in CASES}


@dataclass
class Options:
    cases: list[AppCase]
    reps: int
    rep_time: float
    warmup: float
    pin: str
    cpus: tuple[int, int]  # (server, client); -1: not pinned
    timeout: float
    quick: bool
    json_path: str | None
    plot_path: str | None = None
    tcp_heap_hint: bool = False


def parse_cases(text: str) -> list[AppCase]:
    out: list[AppCase] = []
    for part in text.split(","):
        part = part.strip()
        if part not in BY_NAME:
            raise argparse.ArgumentTypeError(
                f"unknown case {part!r}; choose from {', '.join(BY_NAME)}"
            )
        if BY_NAME[part] not in out:
            out.append(BY_NAME[part])
    return out


def build_parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(
        prog="python -m rsock.bench apps",
        description="Unmodified framework programs (rsock/bench/apps) with plain Python "
        "(TCP) and under `python -m rsock run` with RSOCK_FALLBACK=strict (rsock), "
        "interleaved rep by rep, placed by the scheduler (--pin split: pinned to two CPUs); "
        "prints the median "
        "of each side and rsock/TCP (> 1: rsock is better).  A case whose connections did "
        "not all take the fast path fails.",
    )
    ap.add_argument(
        "--cases",
        type=parse_cases,
        default=list(CASES),
        help=f"comma list (default all): {', '.join(BY_NAME)}",
    )
    ap.add_argument(
        "--reps",
        type=int,
        default=None,
        help="client runs per transport and case (default 5, --quick 2)",
    )
    ap.add_argument(
        "--rep-time",
        type=float,
        default=None,
        metavar="SECONDS",
        help="timed loop of each client run (default 2, --quick 0.5)",
    )
    ap.add_argument(
        "--warmup",
        type=float,
        default=None,
        metavar="SECONDS",
        help="each client run's loop before the timed one (default 0.5, --quick 0.2)",
    )
    ap.add_argument(
        "--pin",
        choices=("split", "none"),
        default="none",
        help="none: leave placement to the scheduler (default: the placement a user "
        "gets); split: servers on the first CPU, clients on the second",
    )
    ap.add_argument(
        "--timeout",
        type=float,
        default=60.0,
        metavar="SECONDS",
        help="limit for each process beyond its warm-up and timed loop, and "
        "for a server to start or stop (default 60)",
    )
    ap.add_argument("--quick", action="store_true", help="2 reps of 0.5 s")
    ap.add_argument(
        "--tcp-heap-hint",
        action="store_true",
        help="run the TCP programs after the change rsock's first socket makes "
        "to glibc's malloc (its mmap threshold raised, see the README), to "
        "show what that change alone is worth",
    )
    ap.add_argument(
        "--json",
        dest="json_path",
        metavar="PATH",
        help="write the environment, the configuration and every sample as JSON",
    )
    ap.add_argument(
        "--plot",
        dest="plot_path",
        metavar="PATH.png",
        help="draw rsock/TCP per case (bar: ratio of the medians, dots: each "
        "rep's rsock figure over the same rep's TCP figure); needs matplotlib "
        "(pip install 'rsock[bench]')",
    )
    return ap  # fmt: skip


def parse_options(argv: list[str]) -> Options:
    ap = build_parser()
    a = ap.parse_args(argv)
    q = bool(a.quick)
    reps = a.reps if a.reps is not None else (2 if q else 5)
    rep_time = a.rep_time if a.rep_time is not None else (0.5 if q else 2.0)
    warmup = a.warmup if a.warmup is not None else (0.2 if q else 0.5)
    if reps < 1 or rep_time <= 0 or warmup < 0 or a.timeout <= 0:
        ap.error("--reps must be >= 1, --rep-time and --timeout > 0, --warmup >= 0")
    cpus = (-1, -1)
    if a.pin == "split":
        have = sorted(os.sched_getaffinity(0))
        if len(have) < 2:
            ap.error(f"--pin split needs 2 CPUs, only {have} available (use --pin none)")
        cpus = (have[0], have[1])
    for flag, path in (("--json", a.json_path), ("--plot", a.plot_path)):
        if path and not Path(path).resolve().parent.is_dir():
            ap.error(f"{flag}: directory {Path(path).resolve().parent} does not exist")
    if a.plot_path and importlib.util.find_spec("matplotlib") is None:
        ap.error("--plot needs matplotlib, which is not installed: pip install 'rsock[bench]' "
                 "(or: pip install matplotlib)")  # fmt: skip
    return Options(a.cases, reps, rep_time, warmup, a.pin, cpus, a.timeout, q, a.json_path,
                   a.plot_path, bool(a.tcp_heap_hint))  # fmt: skip


# --------------------------------------------------------------------------- environment


def environment(opts: Options) -> dict[str, Any]:
    return {
        **_env.host(opts.pin, opts.cpus),
        "rsock": _env.package_version("rsock"),
        "versions": {name: _env.package_version(name) for name in FRAMEWORKS},
        "rsock_env": {k: v for k, v in sorted(os.environ.items()) if k.startswith("RSOCK_")},
    }


def missing_modules(case: AppCase) -> list[str]:
    return [m for m in case.modules if importlib.util.find_spec(m) is None]


# --------------------------------------------------------------------------- processes


def child_env(transport: str, tmp: Path) -> dict[str, str]:
    """TCP: no RSOCK_ variable and no rsock start-up hook (in case this bench itself runs
    under ``rsock run``); rsock: the caller's RSOCK_ variables with RSOCK_FALLBACK=strict.
    Both: the apps directory on PYTHONPATH (uvicorn imports ``asgi_app`` from it), and
    TMPDIR the case's directory (removed afterwards, with what a killed process left)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("RSOCK_")}
    env["TMPDIR"] = str(tmp)
    paths = [p for p in env.get("PYTHONPATH", "").split(os.pathsep)
             if p and Path(p).resolve() != BOOT]  # fmt: skip
    env["PYTHONPATH"] = os.pathsep.join([str(APPS), *paths])
    if transport == "rsock":
        env.update({k: v for k, v in os.environ.items() if k.startswith("RSOCK_")})
        env.pop("RSOCK_RUN", None)
        env.pop("RSOCK_RUN_REPORT", None)
        env["RSOCK_FALLBACK"] = "strict"
    return env


def command(opts: Options, transport: str, report: Path, args: list[str]) -> list[str]:
    if args[0] != "-m":
        args = [str(APPS / args[0]), *args[1:]]
    if transport == "rsock":
        return [sys.executable, "-m", "rsock", "run", "--report", str(report), *args]
    if opts.tcp_heap_hint:
        return [sys.executable, "-m", "rsock.bench._hint", *args]
    return [sys.executable, *args]


def pinner(cpu: int) -> Callable[[], None] | None:
    if cpu < 0:
        return None

    def pin() -> None:  # in the child, between fork and exec
        os.sched_setaffinity(0, {cpu})

    return pin


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@dataclass
class Server:
    transport: str
    proc: subprocess.Popen[bytes]
    out: Path
    err: Path
    report: Path
    uvicorn: bool
    port: int = 0


def tail(path: Path, lines: int = 8) -> str:
    try:
        text = path.read_bytes().decode(errors="replace")
    except OSError:
        return ""
    return " | ".join(text.strip().splitlines()[-lines:])


def start_server(opts: Options, case: AppCase, transport: str, tmp: Path) -> Server:
    args = list(case.server)
    uvicorn = args[:2] == ["-m", "uvicorn"]
    port = 0
    if uvicorn:
        port = free_port()
        args += ["--host", "127.0.0.1", "--port", str(port)]
    out, err = tmp / f"{transport}-server.out", tmp / f"{transport}-server.err"
    report = tmp / f"{transport}-server.json"
    with open(out, "wb") as so, open(err, "wb") as se:
        proc = subprocess.Popen(
            command(opts, transport, report, args), stdin=subprocess.PIPE, stdout=so, stderr=se,
            env=child_env(transport, tmp), cwd=tmp, preexec_fn=pinner(opts.cpus[0]),
        )  # fmt: skip
    server = Server(transport, proc, out, err, report, uvicorn, port)
    try:
        deadline = time.monotonic() + opts.timeout
        while time.monotonic() < deadline:
            if uvicorn:
                if "Application startup complete" in err.read_bytes().decode(errors="replace"):
                    return server
            else:
                for line in out.read_bytes().decode(errors="replace").splitlines():
                    words = line.split()
                    if words[:1] == ["PORT"] and len(words) > 1:
                        server.port = int(words[1])
                        return server
            if proc.poll() is not None:
                raise RuntimeError(f"{transport} server exited ({proc.returncode}): {tail(err)}")
            time.sleep(0.01)
        raise RuntimeError(f"{transport} server not ready after {opts.timeout:g} s: {tail(err)}")
    except BaseException:
        proc.kill()
        proc.wait()
        if proc.stdin is not None:
            proc.stdin.close()
        raise


def stop_server(server: Server, grace: float) -> str | None:
    """Close its standard input (uvicorn: SIGINT), wait, then kill; an error, or None."""
    proc = server.proc
    if proc.poll() is None:
        try:
            if server.uvicorn:
                proc.send_signal(signal.SIGINT)
            if proc.stdin is not None:
                proc.stdin.close()
        except OSError:
            pass
        try:
            proc.wait(grace)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
            return f"{server.transport} server did not stop within {grace:g} s: killed"
    elif proc.stdin is not None:
        proc.stdin.close()
    if proc.returncode != 0:
        return f"{server.transport} server exit status {proc.returncode}: {tail(server.err)}"
    return None


def run_client(
    opts: Options, case: AppCase, transport: str, port: int, report: Path, tmp: Path
) -> dict[str, Any]:
    args = [case.client, str(port), case.mode, str(opts.rep_time), str(opts.warmup)]
    limit = opts.rep_time + opts.warmup + opts.timeout
    try:
        proc = subprocess.run(
            command(opts, transport, report, args), stdin=subprocess.DEVNULL, capture_output=True,
            env=child_env(transport, tmp), cwd=tmp, timeout=limit,
            preexec_fn=pinner(opts.cpus[1]),
        )  # fmt: skip
    except subprocess.TimeoutExpired:
        raise RuntimeError(f"{transport} client did not finish within {limit:g} s") from None
    err = proc.stderr.decode(errors="replace").strip().splitlines()
    if proc.returncode != 0:
        raise RuntimeError(f"{transport} client exit status {proc.returncode}: "
                           + " | ".join(err[-8:]))  # fmt: skip
    return client_sample(case, transport, proc.stdout.decode(errors="replace"))


def client_sample(case: AppCase, transport: str, output: str) -> dict[str, Any]:
    """A client run's sample from its output's last line; its latencies replaced by
    their summary (``latency``) and the stall rule's finding (``stall``: a sentence,
    or None)."""
    lines = output.strip().splitlines()
    try:
        sample: dict[str, Any] = json.loads(lines[-1])
        float(sample["count"]), float(sample["bytes"]), float(sample["elapsed"])
        latencies = [float(x) for x in sample.pop("latencies")]
    except (IndexError, ValueError, KeyError, TypeError):
        raise RuntimeError(f"{transport} client printed no result: {lines[-3:]}") from None
    if len(latencies) != sample["count"]:
        raise RuntimeError(f"{transport} client timed {len(latencies)} of {sample['count']}")
    # the rule on this run's timed loop; the JSON keeps a summary, not every latency
    sample["latency"] = latency_summary(latencies)
    sample["stall"] = stall_problem(latencies, f"{case.name} {transport} rep")
    return sample


_TICK = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100


def tree_cpu(pid: int) -> tuple[float, float] | None:
    """CPU seconds of ``pid`` and its descendants so far, (user + system, user)
    (Linux ``/proc``; children that exited and were reaped count in their
    parent's own children's totals, so those are added too), or None without
    ``/proc``."""
    total = user = 0
    todo, seen = [pid], set()
    while todo:
        p = todo.pop()
        if p in seen:
            continue
        seen.add(p)
        try:
            stat = Path(f"/proc/{p}/stat").read_text()
            kids = " ".join(t.read_text() for t in Path(f"/proc/{p}/task").glob("*/children"))
        except OSError:
            if p == pid:
                return None
            continue  # (gone meanwhile)
        utime, stime, cutime, cstime = map(int, stat[stat.rindex(")") + 2 :].split()[11:15])
        total += utime + stime + cutime + cstime
        user += utime + cutime
        todo += [int(k) for k in kids.split()]
    return total / _TICK, user / _TICK


def busy(sample: dict[str, Any], side: str, warmup: float) -> tuple[float, float] | None:
    """The shares of a rep's time ``side`` spent on the CPU, (user + system, user):
    the client's own count (``getrusage`` around its timed loop) over the loop's
    time, the server's (its process tree, sampled around the client's run) over
    warm-up + loop (it idles while the client starts and exits)."""
    elapsed = float(sample["elapsed"])
    if side == "client":
        r = sample.get("rusage")
        if not r or elapsed <= 0:
            return None
        return (r[2] - r[0] + r[3] - r[1]) / elapsed, (r[2] - r[0]) / elapsed
    cpu = sample.get("server_cpu")
    if not cpu:
        return None
    return cpu[0] / (elapsed + warmup), cpu[1] / (elapsed + warmup)


def read_report(path: Path) -> dict[str, int]:
    try:
        counts: dict[str, int] = json.loads(path.read_text())
    except (OSError, ValueError) as e:
        raise RuntimeError(f"no rsock run --report from {path.name}: {e}") from None
    return counts


def fast_path_problem(counts: dict[str, int], side: str) -> str | None:
    """Why ``counts`` (a --report) does not prove the fast path for ``side``, or None."""
    tcp = {k: v for k, v in counts.items() if k.endswith(":tcp")}
    if tcp:
        return f"{side} report counts TCP: {tcp}"
    kind = "connect" if side == "client" else "accept"
    if not any(counts.get(f"{kind}:{p}", 0) > 0 for p in FAST):
        return f"{side} report counts no {kind} on {'/'.join(FAST)}: {counts}"
    return None


# --------------------------------------------------------------------------- stall rule

# A stall is a bug, not a speed figure: a loop of requests (or messages) whose typical
# one takes well under STALL_MEDIAN_S and whose slowest takes over STALL_MAX_S waited
# for something (a missed wake-up, a poll's timeout) that no checksum shows.  The rule
# is a liveness check, not a timed test; the compat suite applies it too.
STALL_MAX_S = 0.100
STALL_MEDIAN_S = 0.010


def latency_median(latencies: Sequence[float]) -> float:
    """The median of a rule: the lower one of an even count (when exactly every
    second request waits, the mean of the middle two would hide it)."""
    return statistics.median_low(latencies)


def stalled(latencies: Sequence[float]) -> bool:
    """The stall rule: the slowest above 100 ms while the median is below 10 ms."""
    if not latencies:
        return False
    return max(latencies) > STALL_MAX_S and latency_median(latencies) < STALL_MEDIAN_S


def latency_summary(latencies: Sequence[float], slowest: int = 5) -> dict[str, Any]:
    """Count, median, max (seconds) and the ``slowest`` largest as [index, seconds]."""
    top = sorted(range(len(latencies)), key=lambda i: latencies[i], reverse=True)[:slowest]
    return {
        "n": len(latencies),
        "median": latency_median(latencies) if latencies else None,
        "max": max(latencies) if latencies else None,
        "slowest": [[i, latencies[i]] for i in top],
    }


def stall_problem(latencies: Sequence[float], what: str) -> str | None:
    """A sentence on the stall of ``what`` (count, median, max and the slowest few
    by index), or None if the rule does not fire."""
    if not stalled(latencies):
        return None
    s = latency_summary(latencies)
    slow = ", ".join(f"#{i} {1e3 * v:.1f} ms" for i, v in s["slowest"])
    return (
        f"stall in {what}: {s['n']} latencies, median {1e3 * s['median']:.3f} ms "
        f"(< {1e3 * STALL_MEDIAN_S:g} ms) but max {1e3 * s['max']:.1f} ms "
        f"(> {1e3 * STALL_MAX_S:g} ms); slowest: {slow}"
    )


# --------------------------------------------------------------------------- one case


@dataclass
class Result:
    case: AppCase
    status: str = "ok"  # ok | skipped | failed
    reason: str = ""
    samples: dict[str, list[dict[str, Any]]] = field(
        default_factory=lambda: {t: [] for t in TRANSPORTS}
    )
    reports: dict[str, Any] = field(default_factory=lambda: {"client": [], "server": None})
    fast_path: bool | None = None  # rsock side: every connection on shm/verbs
    seconds: float = 0.0
    warmup: float = 0.0  # each client's warm-up (s), for the server's busy share

    def figures(self, transport: str) -> list[float]:
        return [self.case.figure(s) for s in self.samples[transport]]

    def median(self, transport: str) -> float | None:
        f = self.figures(transport)
        return statistics.median(f) if f else None

    def busy(self, transport: str, side: str) -> dict[str, float] | None:
        """The medians over the reps of ``side``'s shares of the time on the CPU."""
        got = [b for s in self.samples[transport] if (b := busy(s, side, self.warmup)) is not None]
        if not got:
            return None
        return {"cpu": statistics.median(b[0] for b in got),
                "user": statistics.median(b[1] for b in got)}  # fmt: skip

    def stalls(self, transport: str) -> list[str]:
        """The stall rule's findings on ``transport``'s reps (one per rep that stalled)."""
        return [s["stall"] for s in self.samples[transport] if s.get("stall")]

    def ratio(self) -> float | None:
        tcp, rs = self.median("tcp"), self.median("rsock")
        return rs / tcp if tcp and rs is not None else None

    def fail(self, reason: str) -> None:
        if self.status != "failed":
            self.status, self.reason = "failed", reason

    def to_json(self) -> dict[str, Any]:
        return {
            "case": self.case.name,
            "title": self.case.title,
            "unit": self.case.unit,
            "status": self.status,
            "reason": self.reason,
            "fast_path": self.fast_path,
            "stall": {t: bool(self.stalls(t)) for t in TRANSPORTS},
            "seconds": round(self.seconds, 3),
            "samples": self.samples,
            "figures": {t: self.figures(t) for t in TRANSPORTS},
            "median": {t: self.median(t) for t in TRANSPORTS},
            "ratio_rsock_tcp": self.ratio(),
            "busy": {
                t: {side: self.busy(t, side) for side in ("client", "server")} for t in TRANSPORTS
            },  # fmt: skip
            "reports": self.reports,
        }


def run_case(opts: Options, case: AppCase, say: Callable[[str], None]) -> Result:
    result = Result(case, warmup=opts.warmup)
    missing = missing_modules(case)
    if missing:
        result.status = "skipped"
        result.reason = f"{', '.join(missing)} not importable (pip install 'rsock[compat]')"
        return result
    t0 = time.monotonic()
    tmp = Path(tempfile.mkdtemp(prefix="rsock-bench-apps-"))
    servers: dict[str, Server] = {}
    try:
        for transport in TRANSPORTS:
            servers[transport] = start_server(opts, case, transport, tmp)
        for rep in range(opts.reps):
            for transport in TRANSPORTS:
                report = tmp / f"{transport}-client-{rep}.json"
                server = servers[transport]
                cpu0 = tree_cpu(server.proc.pid)
                sample = run_client(opts, case, transport, server.port, report, tmp)
                cpu1 = tree_cpu(server.proc.pid)
                if cpu0 is not None and cpu1 is not None:
                    spent = zip(cpu0, cpu1, strict=True)
                    sample["server_cpu"] = [round(b - a, 3) for a, b in spent]
                result.samples[transport].append(sample)
                say(f"  {case.name} rep {rep + 1}/{opts.reps} {transport}: "
                    f"{case.figure(sample):.1f} {case.unit}")  # fmt: skip
                if sample["stall"]:
                    say("  " + sample["stall"].replace("stall", "STALL", 1))
                if transport == "rsock":
                    counts = read_report(report)
                    result.reports["client"].append(counts)
                    problem = fast_path_problem(counts, "client")
                    if problem:
                        raise RuntimeError(f"rsock not on the fast path: {problem}")
        for transport in TRANSPORTS:  # (the reps ran on: the figures stay complete)
            stalls = result.stalls(transport)
            if stalls:
                result.fail(stalls[0] + (f" (and {len(stalls) - 1} more reps)"
                                         if len(stalls) > 1 else ""))  # fmt: skip
    except RuntimeError as e:
        result.fail(str(e))
    except BaseException:  # interrupted: stop the servers (finally), leave no files
        for server in servers.values():
            stop_server(server, opts.timeout)
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    finally:
        for server in servers.values():
            problem = stop_server(server, opts.timeout)
            if problem:
                result.fail(problem)
        result.seconds = time.monotonic() - t0
    if "rsock" in servers:
        try:
            counts = read_report(servers["rsock"].report)
            result.reports["server"] = counts
            problem = fast_path_problem(counts, "server")
        except RuntimeError as e:
            problem = str(e)
        if problem:
            result.fail(f"rsock not on the fast path: {problem}")
    clients_ok = len(result.reports["client"]) == opts.reps
    result.fast_path = (
        clients_ok and result.reports["server"] is not None and "fast path" not in result.reason
    )
    if result.status == "ok":
        _cleanup(tmp)
    else:
        result.reason += f" (files kept in {tmp})"
    return result


def _cleanup(tmp: Path) -> None:
    shutil.rmtree(tmp, ignore_errors=True)


# --------------------------------------------------------------------------- table


def fmt_num(x: float) -> str:
    return f"{x:.0f}" if x >= 100 else f"{x:.1f}"


def cell(result: Result, transport: str) -> str:
    f = result.figures(transport)
    if not f:
        return "-"
    return f"{fmt_num(statistics.median(f))} [{fmt_num(min(f))}-{fmt_num(max(f))}]"


def busy_text(result: Result, kind: str) -> str:
    """TCP's client/server shares of ``kind`` ("cpu", "user") as percentages."""
    got = [result.busy("tcp", side) for side in ("client", "server")]
    return "/".join("-" if b is None else f"{100 * b[kind]:.0f}" for b in got) + "%"


def fast_text(result: Result) -> str:
    if result.fast_path:
        conns = sum(v for r in result.reports["client"] for k, v in r.items()
                    if k.startswith("connect:"))  # fmt: skip
        return f"yes ({conns} conns)"
    return "NO" if result.reports["client"] or result.reports["server"] else "-"


def stall_text(result: Result) -> str:
    """The stall column: "no", or "STALL" and the transports whose reps stalled."""
    if not any(result.samples[t] for t in TRANSPORTS):
        return "-"
    stalled_on = [("TCP" if t == "tcp" else t) for t in TRANSPORTS if result.stalls(t)]
    return f"STALL {'+'.join(stalled_on)}" if stalled_on else "no"


def render(env: dict[str, Any], opts: Options, results: list[Result]) -> str:
    vers = ", ".join(f"{k} {v}" for k, v in env["versions"].items() if v)
    pin = ("pin=none" if opts.pin == "none"
           else f"server cpu{opts.cpus[0]}, client cpu{opts.cpus[1]}")  # fmt: skip
    lines = [
        f"env: {env['cpu_model']} x{env['cpu_count']} | Python {env['python']} | "
        f"{env['kernel']} | rsock {env['rsock']} | {pin} | {vers}",
        f"{opts.reps} reps x {opts.rep_time:g} s (after {opts.warmup:g} s warm-up) per "
        "transport, interleaved; median [min-max]; rsock = `python -m rsock run` with "
        "RSOCK_FALLBACK=strict"
        + ("; TCP with rsock's heap hint (--tcp-heap-hint)" if opts.tcp_heap_hint else ""),
        "",
    ]
    head = [
        "case",
        "unit",
        "TCP",
        "rsock",
        "rsock/TCP",
        "TCP busy c/s",
        "user c/s",
        "rsock fast path",
        "stall",
    ]
    rows: list[list[str]] = []
    notes: list[str] = []
    for r in results:
        if r.status == "skipped":
            notes.append(f"SKIPPED {r.case.name}: {r.reason}")
            continue
        ratio = r.ratio()
        ratio_s = f"{ratio:.2f}x" if ratio is not None else "-"
        if r.status == "failed":
            ratio_s += " FAILED"
            notes.append(f"FAILED {r.case.name}: {r.reason}")
        rows.append([r.case.title, r.case.unit, cell(r, "tcp"), cell(r, "rsock"), ratio_s,
                     busy_text(r, "cpu"), busy_text(r, "user"), fast_text(r),
                     stall_text(r)])  # fmt: skip
    widths = [max(len(x) for x in col) for col in zip(head, *rows, strict=True)]

    def line(cells: list[str]) -> str:
        pairs = enumerate(zip(cells, widths, strict=True))
        return "  ".join(c.ljust(w) if i < 2 else c.rjust(w) for i, (c, w) in pairs).rstrip()

    lines += [line(head), line(["-" * w for w in widths]), *map(line, rows)]
    if notes:
        lines += ["", *notes]
    lines += [
        "",
        "rsock/TCP > 1: rsock is better (more per second).",
        f"stall: a rep whose median request took < {1e3 * STALL_MEDIAN_S:g} ms and whose "
        f"slowest took > {1e3 * STALL_MAX_S:g} ms (the",
        "clients time each request, round trip or message of their timed loop): a bug, and the",
        "case fails.",
        "TCP busy c/s: the share of a TCP rep the client / the server spent on the CPU (user +",
        "system); user c/s: its user-space part, the programs' own work (with an event loop's",
        "own work per wake-up, which rsock's polling skips).  A blocking client busy near 100%",
        "in user space, or a request-response loop whose sides' user shares add up to near",
        "100%, leaves any transport little to take away (rsock's own shares are in the JSON:",
        "its busy-polling counts there).",
    ]
    return "\n".join(lines)


def write_plot(path: str, env: dict[str, Any], opts: Options, results: list[Result]) -> None:
    """One horizontal bar per case measured: rsock/TCP of the medians; dots: per rep."""
    mpl: Any = importlib.import_module("matplotlib")
    mpl.use("Agg")
    plt: Any = importlib.import_module("matplotlib.pyplot")
    shown = [r for r in results if r.ratio() is not None]
    fig, ax = plt.subplots(figsize=(9, 1.2 + 0.45 * max(len(shown), 1)))
    right = 1.0
    try:
        for y, r in enumerate(shown):
            ratio = r.ratio() or 0.0
            color = "tab:gray" if r.status != "ok" else (
                "tab:blue" if ratio >= 1 else "tab:orange")  # fmt: skip
            ax.barh(y, ratio, color=color, height=0.6)
            reps = [a / b for a, b in zip(r.figures("rsock"), r.figures("tcp"), strict=False)
                    if b > 0]  # fmt: skip
            ax.plot(reps, [y] * len(reps), "k.", markersize=4)
            label = f"{ratio:.2f}x" + (" FAILED" if r.status != "ok" else "")
            ax.text(max([ratio, *reps]), y, f"  {label}", va="center", fontsize=8)
            right = max([right, ratio, *reps])
        ax.axvline(1.0, color="black", linewidth=1)
        ax.set_xlim(0, right * 1.2)
        ax.set_yticks(range(len(shown)))
        ax.set_yticklabels([f"{r.case.title} ({r.case.unit})" for r in shown], fontsize=8)
        ax.invert_yaxis()
        ax.set_xlabel("rsock / TCP (> 1: rsock is better); dots: each rep")
        ax.set_title(
            f"python -m rsock.bench apps, {env['date']}\n{env['cpu_model']} "
            f"x{env['cpu_count']}, Python {env['python']}, {opts.reps} reps x "
            f"{opts.rep_time:g} s, server/client pin: {opts.pin}",
            fontsize=9,
        )
        ax.grid(True, axis="x", alpha=0.3)
        fig.tight_layout()
        fig.savefig(path, dpi=110)
    finally:
        plt.close(fig)


def _terminated(signum: int, frame: object) -> None:
    raise KeyboardInterrupt(f"signal {signum}")  # unwinds run_case: servers are stopped


def main(argv: list[str]) -> int:
    opts = parse_options(argv)
    signal.signal(signal.SIGTERM, _terminated)
    env = environment(opts)

    def say(msg: str) -> None:
        print(msg, file=sys.stderr, flush=True)

    say(f"rsock.bench apps: {len(opts.cases)} cases, {opts.reps} reps x {opts.rep_time:g} s "
        f"per transport{', quick' if opts.quick else ''}")  # fmt: skip
    t0 = time.monotonic()
    results: list[Result] = []
    for case in opts.cases:
        result = run_case(opts, case, say)
        results.append(result)
        if result.status == "skipped":
            say(f"SKIPPED {case.name}: {result.reason}")
        elif result.status == "failed":
            say(f"FAILED {case.name}: {result.reason}")
        else:
            ratio = result.ratio()
            say(f"{case.name}: rsock/TCP {ratio:.2f}x ({result.seconds:.1f} s)"
                if ratio is not None else f"{case.name}: done")  # fmt: skip
    total = time.monotonic() - t0
    print(render(env, opts, results), flush=True)
    say(f"total {total:.1f} s")
    if opts.json_path:
        doc = {
            "env": env,
            "config": {
                "cases": [c.name for c in opts.cases],
                "reps": opts.reps,
                "rep_time": opts.rep_time,
                "warmup": opts.warmup,
                "pin": opts.pin,
                "timeout": opts.timeout,
                "quick": opts.quick,
                "tcp_heap_hint": opts.tcp_heap_hint,
                "rsock_fallback": "strict",
            },
            "seconds": round(total, 3),
            "cases": [r.to_json() for r in results],
        }
        Path(opts.json_path).write_text(json.dumps(doc, indent=1) + "\n")
    plot_failed = False
    if opts.plot_path:
        try:
            write_plot(opts.plot_path, env, opts, results)
            say(f"plot written to {opts.plot_path}")
        except Exception as exc:  # noqa: BLE001 - the table is out; report and fail
            say(f"rsock.bench apps: --plot failed: {type(exc).__name__}: {exc}")
            plot_failed = True
    failed = plot_failed or any(r.status == "failed" for r in results)
    return EXIT_FAILED if failed else 0
