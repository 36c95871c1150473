"""``python -m rsock.bench``: rsock against TCP (and AF_UNIX) in one run.

Every case (transport x test x size) runs a server and a client in two fresh processes
(``_worker.py``, started by path so that only the rsock case imports ``rsock``), placed
as ``--pin`` says (default: by the scheduler).  The parent only starts them, enforces
the timeout and reports.  The stream, msgrate and rate cases of one size (or rate) run
interleaved: every transport's pair is up at once and their clients take turns, phase by
phase (warm-up, calibration, each repetition), so a drift of the machine's speed falls
on all transports alike (``--sequential``: one case after the other).

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
* pingpong: the client sends ``--ping-size`` bytes (or each of ``--ping-sizes``; with
  ``--sweep`` the sweep sizes), the server echoes them; each round trip is timed on its
  own: percentiles of the round-trip time (RTT, not RTT/2).  Rounds at size S are
  min(--rounds, max(20, 256 MiB / S)) (--quick: 32 MiB), so large sizes stay bounded.
* connrate: the client loops connect + 1-byte echo + close (the server closes first;
  asyncio: ``create_connection`` and Protocols on both sides); a warm-up, then
  ``--reps`` phases of ~``--rep-time`` seconds each: connections/s, median [min-max].
  For rsock this is its whole connection setup (rendezvous included), for tcp/unix
  the kernel's.
* rate (when asked for: ``--tests rate``): fixed-rate (open-loop) load, ``_rate.py``.  The
  client sends 64 B requests on a schedule (request i at start + i/R, a periodic timerfd)
  whether or not earlier replies are back, the ping-pong server echoes them, and each
  latency is taken from the request's scheduled time (a client that falls behind shows
  the backlog as latency).  Points: ``--rate`` (messages/s) and ``--rate-frac`` (fractions
  of TCP's closed-loop maximum: round trips/s of this run's 64 B TCP ping-pong on the same
  api, else of a probe run for it).  Each point: a warm-up, then ``rate_time`` seconds
  in ``_rate.SLICES`` phases, the transports' phases in turn: achieved rate, latency
  percentiles, CPU per message of each side.
* idle (sync api only): ``--idle-conns`` connected pairs, both processes waiting for
  input on all of them with a selector for ``--idle-time`` seconds (one window on the
  shared monotonic clock): each process's CPU time per second of idle time, how many
  connections woke it up (expected 0), and for rsock the change of every counter.

rsock cases also report the engine's counters (``sock.stats()`` of both sides at the
end of the session: stalls, arms, notifies, spins, sleeps) per MB or per message, and
the provider actually used (``sock.provider``).  ``--mode spin|event|adaptive`` sets
RSOCK_SPIN_US and RSOCK_LOOP_POLL_US of both workers (1000000, 0, unset = the
defaults: spin up to 500 µs, loop polling up to 250 µs).
``ucxx`` (only when the ``ucxx`` package is importable) is a ping-pong reference on the
asyncio api over UCX's tag send/recv.

Progress goes to stderr (``--progress``, ``--no-progress``: tqdm or rich when
importable, else a ``\r`` status line; one line per case when stderr is not a
terminal), the table to stdout, ``--json`` and ``--plot`` (matplotlib) to files.

APIs (``--api``):

* sync: blocking sockets, as above.
* asyncio: both processes run an event loop (``--loop``: uvloop, the default when it
  is importable, or asyncio's own) with Protocols, not streams.  tcp/unix use the
  loop's ``create_server``/``create_connection`` (``create_unix_*``), rsock uses
  ``rsock.asyncio``'s.  Same wire protocol, warm-up, verification, ack and CPU
  accounting; the client ``write``s each message and waits while the transport has
  paused writing, the server is a BufferedProtocol that receives each header and
  message straight into a preallocated buffer and checks it as the sync server does.

``python -m rsock.bench apps ...`` is the application benchmark (``_apps.py``): the
unmodified framework programs of ``apps/`` with plain Python and under ``python -m rsock
run``.

This module never imports ``rsock`` itself (and ``rsock/__init__.py`` must not import
it), so ``--transport tcp,unix`` works without the native engine.
"""

from __future__ import annotations

import argparse
import importlib.metadata
import importlib.util
import json
import math
import os
import re
import select
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

if __package__:
    from rsock.bench import _env, _plot, _progress, _rate
else:  # `python rsock/bench/__init__.py`: the sibling modules are on sys.path[0]
    import _env  # type: ignore[import-not-found,no-redef]
    import _plot  # type: ignore[import-not-found,no-redef]
    import _progress  # type: ignore[import-not-found,no-redef]
    import _rate  # type: ignore[import-not-found,no-redef]

WORKER = Path(__file__).resolve().with_name("_worker.py")
TRANSPORTS = ("rsock", "rsock:shm", "rsock:verbs", "tcp", "unix", "ucxx")
RSOCK_PROVIDERS = ("shm", "verbs")
TESTS = ("stream", "msgrate", "pingpong", "connrate", "idle", "rate")
DEFAULT_TESTS = ("stream", "msgrate", "pingpong", "connrate", "idle")  # rate: when asked for
SYNC_ONLY_TESTS = ("idle",)
UCXX_TESTS = ("pingpong",)  # what the optional ucxx reference runs (asyncio api)
SWEEP_SIZES = [64, 256, 1 << 10, 4 << 10, 16 << 10, 64 << 10, 256 << 10, 1 << 20, 4 << 20, 8 << 20]
MSGRATE_WARMUP = (20000, 5000)  # max warm-up messages of msgrate: (normal, --quick)
# ping-pong rounds at size S: min(--rounds, max(PING_MIN_ROUNDS, budget / S)), so that
# large sizes (--sweep, --ping-sizes) stay bounded; budget: (normal, --quick) bytes
PING_BUDGET = (256 << 20, 32 << 20)
PING_MIN_ROUNDS = 20
# --mode -> RSOCK_SPIN_US and RSOCK_LOOP_POLL_US of both workers (None: unset, the
# defaults: a blocking call spins up to 500 µs, an event loop polls a busy connection up to
# 250 µs)
MODES: dict[str, int | None] = {"adaptive": None, "event": 0, "spin": 1_000_000}
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


def _parse_numbers(
    text: str,
    suffix: str,
    scale: float,
    what: str,
    examples: str,
    ok: Callable[[float], bool],
    rule: str,
) -> list[float]:
    """A comma list of numbers, each maybe ending in ``suffix`` (times
    ``scale``); empty or ``none``: none.  ``ok`` says which values are allowed."""
    out: list[float] = []
    for part in text.split(","):
        part = part.strip().lower()
        if not part or part == "none":
            continue
        times = scale if part.endswith(suffix) else 1.0
        try:
            value = float(part.removesuffix(suffix)) * times
        except ValueError:
            raise argparse.ArgumentTypeError(
                f"bad {what} {part!r} (examples: {examples})"
            ) from None
        if not (math.isfinite(value) and ok(value)):
            raise argparse.ArgumentTypeError(f"{what} must be {rule}: {part!r}")
        out.append(value)
    return out


def parse_rates(text: str) -> list[float]:
    """``200,2000,20k`` -> messages/s (k = 1000); empty or ``none``: no fixed rate."""
    return _parse_numbers(text, "k", 1000.0, "rate", "200, 2000, 20k", lambda v: v > 0, "positive")


def parse_fracs(text: str) -> list[float]:
    """``0.1,0.5,0.9`` or ``10%,50%,90%`` -> fractions; empty or ``none``: no fraction."""
    return _parse_numbers(
        text, "%", 0.01, "fraction", "0.5, 50%", lambda v: 0 < v <= 10, "in (0, 10]"
    )


def fmt_rate(rate: float) -> str:
    """A rate as the table shows it: 200, 2000, 13712 (whole messages/s)."""
    return f"{rate:.0f}"


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
    ping_sizes: list[int] = field(default_factory=lambda: [64])
    mode: str = "adaptive"  # spin | event | adaptive | env (RSOCK_SPIN_US from the environment)
    spin_us: int | None = None  # RSOCK_SPIN_US given to the workers (None: not set)
    idle_conns: int = 100
    msgrate_recv: str = "bulk"  # msgrate server: bulk reads | one recv_into per message
    idle_time: float = 2.0
    plot_path: str | None = None
    progress: str = "auto"
    rsock_provider: str = ""  # RSOCK_PROVIDER of this run ("" = unset: shm)
    interleave: bool = True  # stream/msgrate/rate: the transports' phases in turn (run_group)
    cpus: tuple[int, int] = (-1, -1)  # (server, client); -1 = not pinned
    rates: list[float] = field(default_factory=lambda: list(_rate.DEFAULT_RATES))  # msg/s
    rate_fracs: list[float] = field(default_factory=lambda: list(_rate.DEFAULT_FRACS))
    rate_time: float = 2.0  # timed seconds per rate point


def build_parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(
        prog="python -m rsock.bench",
        description="Stream throughput, message rate, ping-pong latency, connection setup "
        "rate and idle cost of rsock vs TCP (and AF_UNIX), server and client in separate "
        "processes.  `python -m rsock.bench apps --help`: the application benchmark "
        "(unmodified aiohttp, uvicorn+httpx, tornado and websockets programs, TCP against "
        "`python -m rsock run`).",
    )
    ap.add_argument(
        "--transport",
        type=parse_list(TRANSPORTS),
        default=None,
        metavar="LIST",
        help="comma list of rsock,rsock:shm,rsock:verbs,tcp,unix,ucxx: rsock uses "
        "RSOCK_PROVIDER (default shm), rsock:P sets it to P for that transport (default "
        "rsock,tcp, plus rsock:verbs when an RDMA device is usable and RSOCK_PROVIDER is "
        "unset, plus ucxx when the ucxx package is importable: a ping-pong reference on "
        "the asyncio api)",
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
        default=list(DEFAULT_TESTS),
        metavar="LIST",
        help="comma list of stream,msgrate,pingpong,connrate,idle,rate (default all but "
        "rate; idle runs with the sync api only)",
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
        help="stream and ping-pong sizes 64,256,1K,4K,16K,64K,256K,1M,4M,8M instead of "
        "--sizes (ping-pong: unless --ping-sizes is given)",
    )
    ap.add_argument(
        "--msg-size",
        type=parse_size,
        default=64,
        metavar="SIZE",
        help="msgrate message size (default 64)",
    )
    ap.add_argument(
        "--msgrate-recv",
        choices=("bulk", "message"),
        default="bulk",
        help="msgrate server reads: bulk = whatever has arrived, up to 64 KiB per "
        "recv_into, every byte checked (netperf TCP_STREAM -m style, default); "
        "message = one recv_into per message (bound by the receiving Python loop)",
    )
    ap.add_argument(
        "--ping-size",
        type=parse_size,
        default=64,
        metavar="SIZE",
        help="ping-pong message size (default 64)",
    )
    ap.add_argument(
        "--ping-sizes",
        type=parse_sizes,
        default=None,
        metavar="LIST",
        help="ping-pong message sizes, e.g. 64,4K,64K (default: --ping-size; --sweep: the "
        "sweep sizes); rounds per size are capped at 256 MiB (--quick 32 MiB) / size, "
        f"at least {PING_MIN_ROUNDS}",
    )
    ap.add_argument(
        "--rate",
        dest="rates",
        type=parse_rates,
        default=None,
        metavar="R[,R...]",
        help="rate test: fixed rates in messages/s, e.g. 200,2000,20k (default 200,2000,20000 "
        "when --rate-frac is not given either, else none)",
    )
    ap.add_argument(
        "--rate-frac",
        dest="rate_fracs",
        type=parse_fracs,
        default=None,
        metavar="F[,F...]",
        help="rate test: rates that are fractions of TCP's closed-loop maximum (round trips/s "
        "of a 64 B ping-pong over TCP on the same api, from this run's pingpong case or a "
        "probe of --rounds round trips), e.g. 0.1,0.5,0.9 or 10%%,50%% (default 0.1,0.5,0.9 "
        "when --rate is not given either, else none)",
    )
    ap.add_argument(
        "--mode",
        choices=tuple(MODES),
        default=None,
        help="rsock completion mode of both sides, through RSOCK_SPIN_US (blocking calls) "
        "and RSOCK_LOOP_POLL_US (event loops): event = 0 (arm and sleep at once), adaptive "
        "= the defaults (spin up to 500 µs or poll up to 250 µs, then sleep), spin = 1000000 "
        "(up to 1 s, then sleep); default adaptive, or the two variables as set",
    )
    ap.add_argument(
        "--idle-conns",
        type=int,
        default=None,
        metavar="N",
        help="connections held open by the idle test (default 100, --quick 20)",
    )
    ap.add_argument(
        "--idle-time",
        type=float,
        default=None,
        metavar="SECONDS",
        help="idle window of the idle test (default 2, --quick 1)",
    )
    ap.add_argument(
        "--plot",
        dest="plot_path",
        metavar="PATH.png",
        help="draw ping-pong latency and stream bandwidth against size (needs matplotlib: "
        "pip install 'rsock[bench]')",
    )
    ap.add_argument(
        "--progress",
        choices=_progress.STYLES,
        default="auto",
        help="progress display on stderr: a tqdm or rich bar when importable, else a "
        "one-line text status (auto, the default, on a terminal; a plain line per case "
        "otherwise)",
    )
    ap.add_argument(
        "--no-progress",
        dest="progress",
        action="store_const",
        const="off",
        help="no progress output at all (stdout, the table, is unchanged)",
    )
    ap.add_argument(
        "--reps", type=int, default=None, help="stream repetitions (default 5, --quick 3)"
    )
    ap.add_argument(
        "--sequential",
        dest="interleave",
        action="store_false",
        help="run each transport's stream/msgrate/rate case to the end before the next one "
        "starts (default: all transports' worker pairs are up at once and take turns, "
        "phase by phase, so a drift of the machine's speed falls on all of them alike)",
    )
    ap.add_argument(
        "--rep-time",
        type=float,
        default=None,
        metavar="SECONDS",
        help="target duration of one stream/msgrate/connrate repetition (default 1.0, --quick "
        "0.2); the rate test's timed duration per rate point when given (default 2, --quick "
        "0.5)",
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
        choices=("none", "split", "same"),
        default="none",
        help="none: leave placement to the scheduler (default); split: server on the first "
        "CPU, client on the second (every wake-up then crosses CPUs); same: both on the first",
    )
    ap.add_argument(
        "--verify",
        choices=("sample", "full"),
        default="sample",
        help="timed stream phases check every message's first and last 16 bytes and "
        "one 128-byte block, a different one each message so that every offset is "
        "checked once per size/128 messages (sample, default), or every byte (full); "
        "warm-up is always full",
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
    have_ucxx = importlib.util.find_spec("ucxx") is not None
    if a.sweep and a.sizes is not None:
        ap.error("--sweep and --sizes exclude each other")
    if a.loop == "uvloop" and not have_uvloop:
        ap.error("--loop uvloop: uvloop is not importable (pip install uvloop)")
    transports = a.transport
    if transports is None:
        verbs = not os.environ.get("RSOCK_PROVIDER") and verbs_usable()
        transports = [
            "rsock",
            *(["rsock:verbs"] if verbs else []),
            "tcp",
            *(["ucxx"] if have_ucxx else []),
        ]
    if "ucxx" in transports:
        if not have_ucxx:
            ap.error(
                "--transport ucxx: the ucxx package (UCX's Python bindings) is not importable "
                "in this interpreter; it is an optional reference that rsock does not install"
            )
        if "asyncio" not in a.api or "pingpong" not in a.tests:
            ap.error("--transport ucxx runs the pingpong test on the asyncio api only")
    if a.progress in ("tqdm", "rich") and not _progress.available(a.progress):
        ap.error(f"--progress {a.progress}: {a.progress} is not importable")
    if a.plot_path:
        if not _plot.have_matplotlib():
            ap.error(f"--plot needs matplotlib, which is not installed: {_plot.INSTALL_HINT}")
        if "stream" not in a.tests and "pingpong" not in a.tests:
            ap.error("--plot needs the stream and/or pingpong tests")
        parent = Path(a.plot_path).resolve().parent
        if not parent.is_dir():
            ap.error(f"--plot: directory {parent} does not exist")
    if a.ping_sizes is not None and not a.ping_sizes:
        ap.error("--ping-sizes is empty")
    if (a.rates is not None or a.rate_fracs is not None) and "rate" not in a.tests:
        ap.error("--rate and --rate-frac are points of the rate test: add --tests rate")
    if a.rates is None and a.rate_fracs is None:
        rates, fracs = list(_rate.DEFAULT_RATES), list(_rate.DEFAULT_FRACS)
    else:
        rates, fracs = a.rates or [], a.rate_fracs or []
    if "rate" in a.tests and not rates and not fracs:
        ap.error("the rate test has no point: --rate and --rate-frac are both empty")
    env_spin = os.environ.get("RSOCK_SPIN_US") or os.environ.get("RSOCK_LOOP_POLL_US")
    if a.mode is not None:
        mode, spin_us = a.mode, MODES[a.mode]
    elif env_spin:
        mode, spin_us = "env", None  # the workers inherit both variables as they are
    else:
        mode, spin_us = "adaptive", None
    opts = Options(
        transports=transports,
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
        ping_sizes=a.ping_sizes or (list(SWEEP_SIZES) if a.sweep else [a.ping_size]),
        mode=mode,
        spin_us=spin_us,
        idle_conns=pick(a.idle_conns, 100, 20),
        msgrate_recv=a.msgrate_recv,
        idle_time=pick(a.idle_time, 2.0, 1.0),
        plot_path=a.plot_path,
        progress=a.progress,
        rsock_provider=os.environ.get("RSOCK_PROVIDER", ""),
        interleave=a.interleave,
        rates=rates,
        rate_fracs=fracs,
        rate_time=pick(a.rep_time, 2.0, 0.5),
    )
    if opts.reps < 1 or opts.rounds < 1 or opts.rep_time <= 0 or opts.timeout <= 0:
        ap.error("--reps and --rounds must be >= 1, --rep-time and --timeout > 0")
    if opts.idle_conns < 1 or opts.idle_time <= 0:
        ap.error("--idle-conns must be >= 1 and --idle-time > 0")
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


def environment(opts: Options) -> dict[str, Any]:
    return {
        **_env.host(opts.pin, opts.cpus),
        "apis": opts.apis,
        "asyncio_loop": opts.loop,
        "uvloop_version": package_version("uvloop"),
        "git_commit": git_commit(),
        "rsock_env": {k: v for k, v in sorted(os.environ.items()) if k.startswith("RSOCK_")},
        "mode": opts.mode,
        "spin_us": opts.spin_us if opts.mode != "env" else os.environ.get("RSOCK_SPIN_US"),
        "rsock_provider_env": os.environ.get("RSOCK_PROVIDER"),
        "rsock_providers_used": None,  # filled in after the run, from the workers
        "ucxx_version": ucxx_version() if "ucxx" in opts.transports else None,
        # UCXX's progress mode (UCXPY_PROGRESS_MODE: thread, its default; polling;
        # blocking; thread-polling), which the workers inherit
        "ucxx_progress_mode": os.environ.get("UCXPY_PROGRESS_MODE") or "thread (default)",
    }


package_version = _env.package_version


def is_rsock(transport: str) -> bool:
    return transport == "rsock" or transport.startswith("rsock:")


def wanted_provider(opts: Options, transport: str) -> str:
    """The provider an rsock transport asks for: its own, else RSOCK_PROVIDER's."""
    return transport.partition(":")[2] or opts.rsock_provider or "shm"


def verbs_usable() -> bool:
    """An RDMA device is there (libibverbs loads and lists one)."""
    from rsock._paths import verbs_available

    return verbs_available()[0] > 0


def transport_label(opts: Options, transport: str) -> str:
    """rsock(verbs) for rsock:verbs, or for rsock when RSOCK_PROVIDER asks for
    another provider than shm."""
    if transport.startswith("rsock:"):
        return f"rsock({transport[6:]})"
    if transport == "rsock" and opts.rsock_provider not in ("", "shm"):
        return f"rsock({opts.rsock_provider})"
    return transport


def ucxx_version() -> str | None:
    """The installed UCXX: its wheels are named for their CUDA (ucxx-cu12)."""
    for dist in ("ucxx", "ucxx-cu12", "ucxx-cu13", "ucxx-cu11"):
        v = package_version(dist)
        if v is not None:
            return f"{v} ({dist})"
    return None


def mode_text(opts: Options) -> str:
    if opts.mode == "env":
        return (
            f"mode=RSOCK_SPIN_US={os.environ.get('RSOCK_SPIN_US')} "
            f"RSOCK_LOOP_POLL_US={os.environ.get('RSOCK_LOOP_POLL_US')} (from the environment)"
        )
    spin = "default: at most 500 and 250" if opts.spin_us is None else str(opts.spin_us)
    return f"mode={opts.mode} (RSOCK_SPIN_US and RSOCK_LOOP_POLL_US {spin} {micro()})"


def worker_env(opts: Options, transport: str = "") -> dict[str, str]:
    """The workers' environment: RSOCK_SPIN_US and RSOCK_LOOP_POLL_US as
    --mode says (both sides), RSOCK_PROVIDER as an rsock:P transport says."""
    env = dict(os.environ)
    if transport.startswith("rsock:"):
        env["RSOCK_PROVIDER"] = transport[6:]
    if opts.mode == "env":
        return env
    for var in ("RSOCK_SPIN_US", "RSOCK_LOOP_POLL_US"):
        env.pop(var, None)
        if opts.spin_us is not None:
            env[var] = str(opts.spin_us)
    return env


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
    label: str = ""  # transport as the table shows it (rsock(verbs))
    point: int = -1  # rate: index of the rate point (rate_points)
    rate: float = 0.0  # rate: target messages/s (0: a fraction not resolved yet)
    rate_frac: float | None = None  # rate: the fraction of TCP's closed-loop maximum
    tcp_max: float | None = None  # rate: that maximum (round trips/s), once known

    @property
    def slot(self) -> int:
        """What tells the cases of one test apart: the size, or the rate point."""
        return self.point if self.test == "rate" else self.size

    @property
    def name(self) -> str:
        if self.test == "connrate":
            size = ""
        elif self.test == "idle":
            size = f" {self.size} conns"
        elif self.test == "rate":
            size = f" {rate_label(self.rate, self.rate_frac)}"
        else:
            size = f" {fmt_size(self.size)}"
        return f"{self.label or self.transport} {self.test}{size} [{self.tag}]"

    @property
    def tag(self) -> str:
        return api_tag(self.api, self.loop)

    def to_json(self) -> dict[str, Any]:
        return {
            "transport": self.transport,
            "label": self.label or self.transport,
            "api": self.api,
            "loop": self.loop if self.api == "asyncio" else None,
            "test": self.test,
            "size": self.size,
            "status": self.status,
            "error": self.error,
            "seconds": round(self.seconds, 3),
            **(
                {
                    "rate_point": {
                        "index": self.point,
                        "target_per_s": self.rate or None,
                        "frac_of_tcp_max": self.rate_frac,
                        "tcp_max_per_s": self.tcp_max,
                    }
                }
                if self.test == "rate"
                else {}
            ),
            "summary": self.summary,
            "server": self.server,
            "client": self.client,
            "server_stderr": self.server_stderr[-20000:],
            "client_stderr": self.client_stderr[-20000:],
        }


def worker_args(opts: Options, case: Case) -> list[str]:
    return [
        "--transport",
        "rsock" if is_rsock(case.transport) else case.transport,
        "--test",
        case.test,
        "--size",
        str(case.size),
        "--api",
        case.api,
        "--loop",
        case.loop or "asyncio",
        "--idle-time",
        str(opts.idle_time),
        "--msgrate-recv",
        opts.msgrate_recv,
    ]


def ping_rounds(opts: Options, size: int) -> tuple[int, int]:
    """(timed, warm-up) ping-pong rounds at ``size``: bounded volume for large sizes."""
    budget = PING_BUDGET[1 if opts.quick else 0]
    rounds = min(opts.rounds, max(PING_MIN_ROUNDS, budget // size))
    warmup = min(opts.warmup_rounds, max(PING_MIN_ROUNDS // 4, rounds // 10))
    return rounds, warmup


def warmup_bytes(opts: Options, case: Case) -> int:
    if case.test != "msgrate":
        return opts.warmup_bytes
    cap = MSGRATE_WARMUP[1 if opts.quick else 0]
    return case.size * max(4, min(opts.warmup_bytes // case.size, cap))


def rate_points(opts: Options) -> list[tuple[float, float | None]]:
    """The rate test's points: (fixed rate, None) for each --rate, then (0,
    fraction) for each --rate-frac (its rate known once TCP's maximum is)."""
    return [(r, None) for r in opts.rates] + [(0.0, f) for f in opts.rate_fracs]


def rate_label(rate: float, frac: float | None) -> str:
    """200/s; 50% tcp max = 9305/s (or 50% tcp max before the maximum is known)."""
    if frac is None:
        return f"{fmt_rate(rate)}/s"
    text = f"{frac * 100:g}% tcp max"
    return f"{text} = {fmt_rate(rate)}/s" if rate > 0 else text


def client_args(opts: Options, case: Case) -> list[str]:
    rounds, warmup_rounds = ping_rounds(opts, case.size)
    return [
        "--rate",
        repr(case.rate or 1.0),
        "--rate-time",
        str(opts.rate_time),
        "--reps",
        str(opts.reps),
        "--rep-time",
        str(opts.rep_time),
        "--warmup-bytes",
        str(warmup_bytes(opts, case)),
        "--verify",
        opts.verify,
        "--rounds",
        str(rounds),
        "--warmup-rounds",
        str(warmup_rounds),
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


def stop(
    proc: subprocess.Popen[bytes], grace: float, tick: Callable[[], None] | None = None
) -> bool:
    """Wait up to ``grace`` seconds (calling ``tick`` every 0.25 s), then kill.

    True if it had to be killed."""
    end = time.monotonic() + max(grace, 0.0)
    while True:
        try:
            proc.wait(timeout=max(min(0.25, end - time.monotonic()), 0.0))
            return False
        except subprocess.TimeoutExpired:
            if time.monotonic() >= end:
                break
            if tick is not None:
                tick()
    proc.kill()
    proc.wait()
    return True


@dataclass
class Launched:
    """One case's worker pair, started; ``finish`` collects it."""

    case: Case
    tmp: Path
    files: dict[str, Path]
    start: float
    deadline: float
    server: subprocess.Popen[bytes]
    client: subprocess.Popen[bytes] | None = None
    go_w: int = -1  # interleaved: the go pipe's write end, the done pipe's read end
    done_r: int = -1


def launch(opts: Options, case: Case, gated: bool = False, span: int = 1) -> Launched:
    """Start the server, wait for it, start the client.

    ``gated``: the client waits for a go byte before each phase and answers
    with a done byte (``Gate``); ``span`` cases share the time, so the
    workers' own timeout and the deadline scale with it."""
    start = time.monotonic()
    timeout = opts.timeout * span
    deadline = start + timeout + 10.0  # the workers stop themselves at timeout
    tmp = Path(tempfile.mkdtemp(prefix="rsock-bench-"))
    env = worker_env(opts, case.transport)
    files = {n: tmp / n for n in ("server.out", "server.err", "client.out", "client.err")}
    base = [sys.executable, str(WORKER)]
    args = [*worker_args(opts, case), "--timeout", str(timeout)]
    addr = str(tmp / "sock") if case.transport == "unix" else ""
    try:
        with open(files["server.out"], "wb") as so, open(files["server.err"], "wb") as se:
            server = subprocess.Popen(
                [*base, "serve", *args, "--cpu", str(opts.cpus[0]), "--addr", addr],
                stdin=subprocess.DEVNULL,
                stdout=so,
                stderr=se,
                env=env,
            )
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    run = Launched(case, tmp, files, start, deadline, server)
    try:
        start_client(opts, run, args, gated)
    except BaseException:
        abandon(run)
        raise
    return run


def start_client(opts: Options, run: Launched, args: list[str], gated: bool) -> None:
    """``launch``'s second half: the client, once the server is ready."""
    case, files = run.case, run.files
    ready = wait_ready(run.server, files["server.out"], run.deadline)
    if ready is None:
        return
    gate: list[str] = []
    child_fds: tuple[int, ...] = ()
    if gated:
        go_r, run.go_w = os.pipe()
        run.done_r, done_w = os.pipe()
        child_fds = (go_r, done_w)
        gate = ["--gate", f"{go_r},{done_w}"]
    try:
        with open(files["client.out"], "wb") as co, open(files["client.err"], "wb") as ce:
            run.client = subprocess.Popen(
                [
                    sys.executable,
                    str(WORKER),
                    "client",
                    *args,
                    "--cpu",
                    str(opts.cpus[1]),
                    "--addr",
                    ready,
                    *client_args(opts, case),
                    *gate,
                ],
                stdin=subprocess.DEVNULL,
                stdout=co,
                stderr=ce,
                env=worker_env(opts, case.transport),
                pass_fds=child_fds,
            )
    finally:
        for fd in child_fds:  # the client's ends: its exit is then our EOF
            os.close(fd)


def close_gate(run: Launched) -> None:
    """Our ends of the gate pipes: a client still waiting for its turn sees EOF."""
    for fd in (run.go_w, run.done_r):
        if fd >= 0:
            os.close(fd)
    run.go_w = run.done_r = -1


def abandon(run: Launched) -> None:
    """Undo a ``launch`` that failed half-way: close, kill, remove."""
    close_gate(run)
    for p in (run.server, run.client):
        if p is not None and p.poll() is None:
            p.kill()
            p.wait()
    shutil.rmtree(run.tmp, ignore_errors=True)


def finish(opts: Options, run: Launched, tick: Callable[[], None] | None = None) -> None:
    """Wait for (or kill) the workers of ``launch``, read and judge their results."""
    case = run.case
    killed = {"server": False, "client": False}
    try:
        close_gate(run)
        if run.client is not None:
            killed["client"] = stop(run.client, run.deadline - time.monotonic(), tick)
            grace = 10.0 if run.client.returncode == 0 else 2.0
            killed["server"] = stop(run.server, min(grace, run.deadline - time.monotonic()))
        else:
            killed["server"] = stop(run.server, 0.0 if run.server.poll() is None else 1.0)
        files = run.files
        case.server = read_result(files["server.out"]) or {}
        case.server_stderr = files["server.err"].read_bytes().decode(errors="replace")
        if run.client is not None:
            case.client = read_result(files["client.out"]) or {}
            case.client_stderr = files["client.err"].read_bytes().decode(errors="replace")
        classify(case, run.client is not None, killed)
    except Exception as exc:  # noqa: BLE001 - one broken case must not stop the others
        case.status, case.error = "error", f"bench harness: {type(exc).__name__}: {exc}"
    finally:
        abandon(run)  # whatever still runs: killed
        case.seconds = time.monotonic() - run.start
    if case.status == "ok":
        try:
            case.summary = summarize(case)
        except (KeyError, IndexError, TypeError, ValueError, ZeroDivisionError) as exc:
            case.status, case.error = "error", f"incomplete results: {exc!r}"


def run_case(opts: Options, case: Case, tick: Callable[[], None] | None = None) -> None:
    try:
        run = launch(opts, case)
    except Exception as exc:  # noqa: BLE001 - one broken case must not stop the others
        case.status, case.error = "error", f"bench harness: {type(exc).__name__}: {exc}"
        return
    finish(opts, run, tick)


def take_turn(run: Launched, tick: Callable[[], None] | None) -> bool:
    """Let ``run``'s client do its next phase and wait until it has.

    False when it has no more phases (it closed the done pipe: finished or
    died) or missed its deadline; ``finish`` then judges it."""
    try:
        os.write(run.go_w, b"g")
    except BrokenPipeError:
        return False
    while True:
        left = run.deadline - time.monotonic()
        if left <= 0:
            return False
        r, _, _ = select.select([run.done_r], [], [], min(left, 0.25))
        if r:
            return bool(os.read(run.done_r, 1))
        if tick is not None:
            tick()


def run_group(opts: Options, cases: list[Case], tick: Callable[[], None] | None = None) -> None:
    """The cases of one test and size, one per transport, phase by phase in turn.

    Every worker pair is up at once, but only one moves data: the others wait
    for their turn (blocked in a read, no CPU).  A drift of the machine's speed
    during the run (other guests on the host) then falls on every transport
    alike instead of on whichever ran during it, and the ratios compare phases
    taken seconds, not minutes, apart."""
    runs: list[Launched] = []
    try:
        for case in cases:
            try:
                runs.append(launch(opts, case, gated=True, span=len(cases)))
            except Exception as exc:  # noqa: BLE001 - as in run_case
                case.status, case.error = "error", f"bench harness: {type(exc).__name__}: {exc}"
        turn = [r for r in runs if r.client is not None]
        while turn:
            turn = [r for r in turn if take_turn(r, tick)]
    finally:
        for r in runs:
            finish(opts, r, tick)


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


percentile = _rate.percentile  # nearest rank, p in 0..100, of an ascending list


def median(values: list[float]) -> float:
    s = sorted(values)
    n = len(s)
    return s[n // 2] if n % 2 else (s[n // 2 - 1] + s[n // 2]) / 2


COUNTER_KEYS = ("credit_stalls", "space_stalls", "arms", "notifies_sent", "spins", "sleeps")


def side_counters(test: str, stats: dict[str, Any]) -> dict[str, Any]:
    """One side's engine counters of a session, per MB (stream) or per message."""
    if test == "stream":
        per, amount = "MB", max(stats["tx_bytes"], stats["rx_bytes"]) / 1e6
    else:
        per, amount = "msg", max(stats["tx_msgs"], stats["rx_msgs"])
    return {
        "per": per,
        "amount": amount,
        **{k: stats[k] / amount if amount else 0.0 for k in COUNTER_KEYS},
    }


def counters(case: Case) -> dict[str, Any] | None:
    """rsock's counters of both sides, normalised (None: not an rsock case, or no stats).

    stream, msgrate, pingpong: whole session (warm-up included); connrate: the last
    connection only (raw counts); idle: the change during the idle window, summed over
    all connections (raw counts, all 0 when nothing happens)."""
    if not is_rsock(case.transport):
        return None
    out: dict[str, Any] = {}
    for side, result in (("client", case.client), ("server", case.server)):
        if case.test == "idle":
            stats = result.get("idle_counters")
            if stats:
                out[side] = {"per": "window", "amount": 1, **stats}
            continue
        stats = result.get("stats")
        if not stats:
            continue
        if case.test == "connrate":
            out[side] = {"per": "conn", "amount": 1, **stats}
        else:
            out[side] = side_counters(case.test, stats)
    return out or None


def summarize(case: Case) -> dict[str, Any]:
    summary = summarize_test(case)
    ctr = counters(case)
    if ctr is not None:
        summary["counters"] = ctr
    return summary


def summarize_test(case: Case) -> dict[str, Any]:
    if case.test == "rate":
        return _rate.summarize(case.client, case.server)
    if case.test == "idle":
        c, s = case.client, case.server
        if c["connections"] != s["connections"]:
            raise ValueError(
                f"client held {c['connections']} connections, server {s['connections']}"
            )
        return {
            "connections": c["connections"],
            "idle_s": c["idle_ns"] / 1e9,
            "client_cpu_us_per_s": c["idle_cpu_s"] / (c["idle_ns"] / 1e9) * 1e6,
            "server_cpu_us_per_s": s["idle_cpu_s"] / (s["idle_ns"] / 1e9) * 1e6,
            "wakeups": c["wakeups"] + s["wakeups"],
            "client_setup_ms": c["setup_ns"] / 1e6,
        }
    cph = case.client["phases"]
    if case.test == "connrate":
        rates = [c["count"] / c["ns"] * 1e9 for c in cph if c["kind"] == "rep"]
        total = case.server["connections"]
        if total != case.client["connections"]:
            raise ValueError(
                f"client made {case.client['connections']} connections, server saw {total}"
            )
        conn_c = median([c["cpu_s"] / c["count"] * 1e6 for c in cph if c["kind"] == "rep"])
        conn_s = case.server["cpu_s"] / max(total, 1) * 1e6
        return {
            "conn_per_s_median": median(rates),
            "conn_per_s_min": min(rates),
            "conn_per_s_max": max(rates),
            "conn_per_s": rates,
            "connections": total,
            "client_cpu_us_per_conn": conn_c,
            "server_cpu_us_per_conn": conn_s,
            "cpu_us_per_conn": conn_c + conn_s,
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
            "cpu_ns_per_msg": median(
                [(c["cpu_s"] + s["cpu_s"]) / c["count"] * 1e9 for c, s in reps]
            ),
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
            "cpu_s_per_gb": median([a + b for a, b in zip(ccpu, scpu, strict=True)]),
        }
    rtt = sorted(x / 1000.0 for x in case.client["rtt_ns"])
    c, s = reps[-1]
    return {
        **_rate.spread(rtt, "rtt_us"),
        "rounds": len(rtt),
        "client_cpu_us_per_rt": c["cpu_s"] / c["count"] * 1e6,
        "server_cpu_us_per_rt": s["cpu_s"] / s["count"] * 1e6,
        "cpu_us_per_rt": c["cpu_s"] / c["count"] * 1e6 + s["cpu_s"] / s["count"] * 1e6,
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


def _cpu_rows(per: str, key: str, digits: int) -> list[Row]:
    """A case's CPU rows: the client's, the server's and both (JSON keys
    ``client_<key>``, ``server_<key>`` and ``<key>``)."""
    return [
        Row(f"  cpu {side} {per}", f"{side}_{key}" if side != "both" else key, False, digits)
        for side in ("client", "server", "both")
    ]


def rows_for(test: str, size: int, tag: str, point: str = "") -> list[Row]:
    """The table's rows of a case (``point``: the rate test's point, as labelled)."""
    us = micro()
    if test == "rate":
        return [
            Row(f"rate {point} [{tag}]  achieved msg/s", "achieved_per_s", True, 0, first=True),
            Row(f"  latency p50 {us}", "lat_us_p50", False, 1),
            Row(f"  latency p99 {us}", "lat_us_p99", False, 1),
            Row(f"  latency p99.9 {us}", "lat_us_p99_9", False, 1),
            Row(f"  send lag p50 {us}", "send_lag_us_p50", False, 1),
            *_cpu_rows(f"{us}/msg", "cpu_us_per_msg", 2),
        ]
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
            *_cpu_rows("s/GB", "cpu_s_per_gb", 3),
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
            *_cpu_rows("ns/msg", "cpu_ns_per_msg", 0),
        ]
    if test == "idle":
        return [
            Row(f"idle {size} conns [{tag}]  cpu client {us}/s", "client_cpu_us_per_s", False, 1,
                first=True),
            Row(f"  cpu server {us}/s", "server_cpu_us_per_s", False, 1),
            Row("  wake-ups (both sides)", "wakeups", False, 0),
        ]  # fmt: skip
    if test == "connrate":
        return [
            Row(f"connrate [{tag}]  conn/s", "conn_per_s_median", True, 0, first=True, spread=True),
            *_cpu_rows(f"{us}/conn", "cpu_us_per_conn", 1),
        ]
    return [
        Row(f"pingpong {fmt_size(size)} [{tag}]  RTT p50 {us}", "rtt_us_p50", False, 1, first=True),
        Row(f"  RTT p90 {us}", "rtt_us_p90", False, 1),
        Row(f"  RTT p99 {us}", "rtt_us_p99", False, 1),
        Row(f"  RTT p99.9 {us}", "rtt_us_p99_9", False, 1),
        *_cpu_rows(f"{us}/RT", "cpu_us_per_rt", 1),
    ]


def fmt_counter(x: float) -> str:
    """Two significant digits, never in exponent notation (0.00005, 0.71, 12, 340)."""
    if x == 0:
        return "0"
    if x >= 100 or float(x).is_integer():
        return f"{x:.0f}"
    text = f"{x:.2g}"
    if "e" in text:
        digits = 1 - math.floor(math.log10(abs(x)))
        text = f"{x:.{digits}f}".rstrip("0")
    return text


def counters_line(case: Case) -> str | None:
    """The compact counters line printed under an rsock case."""
    ctr = case.summary.get("counters")
    if case.status != "ok" or not ctr:
        return None
    label = case.label or case.transport
    if case.test == "idle" and all(
        v == 0 for c in ctr.values() for k, v in c.items() if k not in ("per", "amount")
    ):
        return f"  {label} counters idle window: all 0 on both sides (no messages, arms, wake-ups)"
    sides = []
    per = ""
    for side in ("client", "server"):
        c = ctr.get(side)
        if not c:
            continue
        per = c["per"]
        f = fmt_counter
        sides.append(
            f"{side} stalls {f(c['credit_stalls'])}/{f(c['space_stalls'])} "
            f"arms {f(c['arms'])} notifies {f(c['notifies_sent'])} "
            f"spins/sleeps {f(c['spins'])}/{f(c['sleeps'])}"
        )
    where = {
        "MB": "per MB",
        "msg": "per msg",
        "conn": "last conn",
        "window": "idle window",
    }[per]
    return f"  {label} counters {where}: " + "; ".join(sides)


def comparison(transports: list[str]) -> list[tuple[str, str]]:
    """(subject, baseline) of each ratio column: every rsock transport against
    tcp (or the first other transport when there is no rsock one)."""
    if BASELINE not in transports or len(transports) < 2:
        return []
    subjects = [t for t in transports if is_rsock(t)]
    if not subjects:
        subjects = [next(t for t in transports if t != BASELINE)]
    return [(t, BASELINE) for t in subjects]


def ratio_text(row: Row, a: dict[str, Any], b: dict[str, Any]) -> str:
    x, y = a.get(row.key), b.get(row.key)
    if not isinstance(x, (int, float)) or not isinstance(y, (int, float)) or x <= 0 or y <= 0:
        return "-"
    adv = x / y if row.higher_better else y / x  # > 1: the subject is better
    return f"{adv:.2f}x better" if adv >= 1 else f"{1 / adv:.2f}x worse"


def providers_used(cases: list[Case]) -> list[str]:
    """The providers the rsock workers report (``sock.provider`` when connected)."""
    return sorted(
        {
            str(side.get("provider"))
            for c in cases
            if is_rsock(c.transport)
            for side in (c.client, c.server)
            if side.get("provider") is not None
        }
    )


def env_line(env: dict[str, Any], opts: Options, cases: list[Case]) -> str:
    parts = [
        f"Python {env['python']}",
        f"{env['cpu_model']} x{env['cpu_count']}",
        env["kernel"],
        pin_text(opts),
        f"commit {env['git_commit'] or 'n/a'}",
    ]
    providers = providers_used(cases)
    if "asyncio" in opts.apis:
        loop = opts.loop
        if loop == "uvloop":
            loop += f" {env.get('uvloop_version') or '?'}"
        parts.append(f"asyncio loop={loop}")
    if any(map(is_rsock, opts.transports)):
        parts.append(mode_text(opts))
        requested = f" (RSOCK_PROVIDER={opts.rsock_provider})" if opts.rsock_provider else ""
        parts.append(f"rsock provider={','.join(providers) or 'n/a'}{requested}")
        versions = {c.client.get("rsock_version") for c in cases if is_rsock(c.transport)}
        versions.discard(None)
        if versions:
            parts.append(f"rsock {','.join(sorted(map(str, versions)))}")
    if "ucxx" in opts.transports:
        parts.append(
            f"ucxx {env.get('ucxx_version') or '?'} "
            f"(UCXPY_PROGRESS_MODE={env.get('ucxx_progress_mode')})"
        )
    rsock_env = env["rsock_env"]
    parts.append(" ".join(f"{k}={v}" for k, v in rsock_env.items()) or "no RSOCK_* env")
    return " | ".join(parts)


def render(opts: Options, env: dict[str, Any], cases: list[Case]) -> str:
    by_key = {(c.transport, c.api, c.test, c.slot): c for c in cases}
    cmp = comparison(opts.transports)
    rsock_ts = [t for t in opts.transports if is_rsock(t)]
    labels = [transport_label(opts, t) for t in opts.transports]
    header = [f"test [{opts.mode}]" if rsock_ts else "test", *labels]
    header.extend(f"{transport_label(opts, x)} vs {y}" for x, y in cmp)
    table: list[list[str] | str] = []  # a str: a free line (counters), not in the columns
    for api in opts.apis:
        for test, size in plan_tests(opts, api):
            point = ""
            if test == "rate":
                known = [c for t in opts.transports if (c := by_key.get((t, api, test, size)))]
                fixed, frac = rate_points(opts)[size]
                point = rate_label(known[0].rate if known else fixed, frac)
            for row in rows_for(test, size, api_tag(api, opts.loop), point):
                line = [row.label]
                for t in opts.transports:
                    c = by_key.get((t, api, test, size))
                    if c is None:
                        line.append("n/a" if row.first else "")
                    elif c.status == "ok":
                        line.append(row.cell(c.summary))
                    else:
                        line.append(f"FAILED ({c.status})" if row.first else "-")
                for x, y in cmp:
                    a, b = by_key.get((x, api, test, size)), by_key.get((y, api, test, size))
                    ok = a is not None and b is not None and a.status == b.status == "ok"
                    line.append(ratio_text(row, a.summary, b.summary) if a and b and ok else "-")
                table.append(line)
            for t in rsock_ts:
                rsock_case = by_key.get((t, api, test, size))
                extra = counters_line(rsock_case) if rsock_case is not None else None
                if extra:
                    table.append(extra)
    cells = [r for r in table if isinstance(r, list)]
    widths = [max(len(r[i]) for r in [header, *cells]) for i in range(len(header))]

    def fmt_line(cells: list[str] | str) -> str:
        if isinstance(cells, str):
            return cells
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
            "(warm-up: every byte); "
            + (
                "the transports' reps in turn (interleaved)."
                if opts.interleave
                else "each transport's reps in one go (--sequential)."
            )
        )
    if "msgrate" in tests:
        out.append(
            f"msg/s = {fmt_size(opts.msg_size)} messages written back to back (one sendall/"
            "write each), every byte checked by the server, which reads "
            + (
                "whatever has arrived, up to 64 KiB per recv_into (--msgrate-recv bulk)"
                if opts.msgrate_recv == "bulk"
                else "one message per recv_into (--msgrate-recv message)"
            )
            + f"; client-timed to the ack, median [min-max] of {opts.reps} reps of "
            f"~{opts.rep_time:g} s."
        )
    if "pingpong" in tests:
        rounds = ", ".join(
            f"{fmt_size(n)}: {r} after {w}"
            for n in opts.ping_sizes
            for r, w in [ping_rounds(opts, n)]
        )
        out.append(
            "RTT = full round-trip time of one message echoed by the server; samples after "
            f"warm-up rounds: {rounds}."
        )
    if "connrate" in tests:
        out.append(
            "conn/s = connect + 1-byte echo + close (server closes first) in a loop "
            "(asyncio: create_connection, Protocols on both sides), "
            f"median [min-max] of {opts.reps} reps of ~{opts.rep_time:g} s."
        )
    if "rate" in tests:
        out.append(
            f"rate = {_rate.SIZE} B requests sent on a fixed schedule (request i at start + "
            "i/rate, a periodic timerfd; sync: a sending and a receiving thread, asyncio: the "
            "timer as a reader of the loop) whether or not earlier replies came back, echoed "
            "by the server; latency = reply arrival - scheduled send time, so a client that "
            "falls behind shows it as latency; send lag = how late the sender woke for a "
            "request (in the latency, the same for every transport); achieved = replies/s "
            f"between each phase's first and last reply; {opts.rate_time:g} s per point in "
            f"{_rate.SLICES} timed phases after a warm-up at the rate; cpu = user+sys of that "
            "process over the timed phases / messages; fractions are of TCP's closed-loop "
            "maximum (64 B ping-pong round trips/s, same api)."
        )
    if "idle" in tests:
        out.append(
            f"idle = {opts.idle_conns} connected pairs, both processes waiting for input on all "
            f"of them (selectors, {opts.idle_time:g} s window, sync api): CPU time of each "
            f"process per second of idle time ({micro()}/s, lower is better; all threads); "
            "wake-ups = connections reported readable during the window (expected 0)."
        )
    if rsock_ts:
        out.append(
            "rsock counters (sock.stats() of both sides): stalls = sends that waited for "
            "credits / for ring space, arms = notification arms, notifies = eventfd writes "
            "to the peer, spins/sleeps = waits ended while spinning / after sleeping; per MB "
            "(stream) or data message (msgrate, pingpong: ~per RT) over the whole session, "
            "warm-up included; connrate: the last connection; idle: change during the window."
        )
        out.append(
            f"{mode_text(opts)}: how long a blocking wait spins (sync api) and an event "
            "loop polls a busy connection (asyncio api) before sleeping."
        )
    out.append(
        "cpu = user+sys of that process (median over reps) per 10^9 bytes, message, RT or "
        "connection (connrate server: whole session); cpu both = client + server."
    )
    if "asyncio" in opts.apis:
        out.append(
            f"[asyncio/{opts.loop}]: both sides on a {opts.loop} event loop with Protocols "
            "(default write-buffer limits; the client waits while writing is paused, the "
            "server is a BufferedProtocol); tcp/unix: the loop's own create_server/"
            "create_connection, rsock: rsock.asyncio."
        )
    for x, y in cmp:
        xl = transport_label(opts, x)
        out.append(
            f"'{xl} vs {y}': how many times better {xl} is than {y} on that "
            "row, same api and size (throughput and rates: higher is better; RTT and cpu: lower "
            "is better)."
        )
    for t in rsock_ts:
        used = providers_used([c for c in cases if c.transport == t])
        wanted = wanted_provider(opts, t)
        if used and used != [wanted]:
            out.append(
                f"WARNING: {transport_label(opts, t)} asks for provider {wanted}, "
                f"the workers used {','.join(used)}"
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
        plan.extend(("pingpong", s) for s in opts.ping_sizes)
    if "connrate" in opts.tests:
        plan.append(("connrate", 1))
    if "idle" in opts.tests and api == "sync":
        plan.append(("idle", opts.idle_conns))
    if "rate" in opts.tests:
        plan.extend(("rate", i) for i in range(len(rate_points(opts))))
    return plan


def runs(transport: str, api: str, test: str) -> bool:
    """Whether the transport has this case (ucxx: ping-pong on the asyncio api only)."""
    return transport != "ucxx" or (api == "asyncio" and test in UCXX_TESTS)


def case_plan(opts: Options) -> list[tuple[str, str, str, int]]:
    return [
        (t, api, test, size)
        for api in opts.apis
        for test, size in plan_tests(opts, api)
        for t in opts.transports
        if runs(t, api, test)
    ]


INTERLEAVED = ("stream", "msgrate", "rate")  # the tests whose clients take turns (Gate)


def case_groups(
    opts: Options, plan: list[tuple[str, str, str, int]]
) -> list[list[tuple[str, str, str, int]]]:
    """The plan cut into what runs together: the transports of one interleaved
    (api, test, size), else one case at a time, in the plan's order."""
    groups: list[list[tuple[str, str, str, int]]] = []
    for item in plan:
        _, api, test, size = item
        prev = groups[-1][-1] if groups else None
        if (
            opts.interleave
            and test in INTERLEAVED
            and prev is not None
            and prev[1:] == (api, test, size)
        ):
            groups[-1].append(item)
        else:
            groups.append([item])
    return groups


def progress(case: Case) -> str:
    s = case.summary
    if case.status != "ok":
        return f"FAILED ({case.status}): {case.error.splitlines()[0] if case.error else ''}"
    if case.test == "stream":
        return f"{s['gbps_median']:.3f} GB/s [{s['gbps_min']:.3f}-{s['gbps_max']:.3f}]"
    if case.test == "idle":
        return (
            f"cpu client {s['client_cpu_us_per_s']:.1f} {micro()}/s, server "
            f"{s['server_cpu_us_per_s']:.1f} {micro()}/s, {s['wakeups']} wake-ups"
        )
    if case.test == "rate":
        us = micro()
        return (
            f"{s['achieved_per_s']:.0f} msg/s, latency p50 {s['lat_us_p50']:.1f} {us} p99 "
            f"{s['lat_us_p99']:.1f} {us}, cpu {s['client_cpu_us_per_msg']:.1f}+"
            f"{s['server_cpu_us_per_msg']:.1f} {us}/msg"
        )
    if case.test in ("msgrate", "connrate"):
        key, unit = ("msg_per_s", "msg/s") if case.test == "msgrate" else ("conn_per_s", "conn/s")
        lo, hi = s[key + "_min"], s[key + "_max"]
        return f"{s[key + '_median']:.0f} {unit} [{lo:.0f}-{hi:.0f}]"
    return f"RTT p50 {s['rtt_us_p50']:.1f} {micro()}, p99 {s['rtt_us_p99']:.1f} {micro()}"


def new_case(opts: Options, transport: str, api: str, test: str, slot: int) -> Case:
    """The case of a plan item (a rate point: its fixed rate or its fraction)."""
    loop = opts.loop if api == "asyncio" else ""
    if test == "rate":
        fixed, frac = rate_points(opts)[slot]
        case = Case(transport, test, _rate.SIZE, api, loop, point=slot, rate=fixed, rate_frac=frac)
    else:
        case = Case(transport, test, slot, api, loop)
    case.label = transport_label(opts, transport)
    return case


def tcp_max(opts: Options, api: str, cases: list[Case], bar: _progress.Progress) -> dict[str, Any]:
    """TCP's closed-loop maximum on ``api``: round trips/s of this run's 64 B TCP
    ping-pong case when there is one, else of a probe (the same ping-pong, not in the
    table; ``rate_tcp_max`` of the JSON)."""
    for c in cases:
        if (c.transport, c.api, c.test, c.size, c.status) == ("tcp", api, "pingpong", 64, "ok"):
            return {
                "msg_per_s": _rate.closed_loop_rate(c.client),
                "source": "pingpong case",
                "rtt_us_p50": c.summary["rtt_us_p50"],
            }
    probe = new_case(opts, "tcp", api, "pingpong", _rate.SIZE)
    rounds, warmup = ping_rounds(opts, _rate.SIZE)
    bar.message(
        f"rate: TCP's closed-loop maximum [{probe.tag}]: a 64 B ping-pong of {rounds} round "
        f"trips after {warmup}"
    )
    run_case(opts, probe, bar.tick)
    found: dict[str, Any] = {"msg_per_s": None, "source": "probe", "case": probe.to_json()}
    if probe.status == "ok":
        found["msg_per_s"] = _rate.closed_loop_rate(probe.client)
        found["rtt_us_p50"] = probe.summary["rtt_us_p50"]
    else:
        found["error"] = f"{probe.status}: {probe.error}"
    bar.message(
        f"rate: TCP's closed-loop maximum [{probe.tag}]: "
        + (f"{found['msg_per_s']:.0f}/s" if probe.status == "ok" else f"FAILED ({probe.status})")
    )
    return found


def resolve_rates(
    opts: Options,
    batch: list[Case],
    cases: list[Case],
    probes: dict[str, dict[str, Any]],
    bar: _progress.Progress,
) -> None:
    """The target rate of the rate cases of one point: a fraction needs TCP's
    closed-loop maximum on that api (found or probed once per api); without
    it the cases fail and say why."""
    for case in batch:
        if case.rate_frac is None:
            continue
        if case.api not in probes:
            probes[case.api] = tcp_max(opts, case.api, cases, bar)
        found = probes[case.api]
        if found["msg_per_s"]:
            case.tcp_max = found["msg_per_s"]
            case.rate = _rate.frac_rates(found["msg_per_s"], [case.rate_frac])[0]
        else:
            case.status = "error"
            case.error = f"no TCP closed-loop maximum to take {case.rate_frac:g} of: " + str(
                found.get("error")
            )


def rate_ratios(opts: Options, cases: list[Case]) -> None:
    """Each rate case of a compared transport gets ``summary['vs_<baseline>']``:
    its CPU per message and latency over the baseline's (< 1: less)."""
    by_key = {(c.transport, c.api, c.test, c.slot): c for c in cases}
    for x, y in comparison(opts.transports):
        for c in cases:
            if c.transport != x or c.test != "rate" or c.status != "ok":
                continue
            base = by_key.get((y, c.api, c.test, c.slot))
            if base is not None and base.status == "ok":
                c.summary[f"vs_{y}"] = _rate.ratios(c.summary, base.summary)


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    if args[:1] == ["apps"]:  # the application benchmark (_apps.py)
        if __package__:
            from rsock.bench import _apps
        else:
            import _apps  # type: ignore[import-not-found,no-redef]
        return _apps.main(args[1:])
    opts = parse_options(args)
    env = environment(opts)
    plan = case_plan(opts)
    bar = _progress.make(opts.progress, len(plan))
    extra = f", {mode_text(opts)}" if any(map(is_rsock, opts.transports)) else ""
    bar.message(
        f"rsock.bench: {len(plan)} cases, {pin_text(opts)}{extra}{', quick' if opts.quick else ''}"
    )
    cases: list[Case] = []
    probes: dict[str, dict[str, Any]] = {}  # rate: TCP's closed-loop maximum, by api
    t0 = time.monotonic()
    try:
        for group in case_groups(opts, plan):
            first = len(cases) + 1
            for transport, api, test, size in group:
                case = new_case(opts, transport, api, test, size)
                cases.append(case)
            batch = cases[first - 1 :]
            if batch[0].test == "rate":
                resolve_rates(opts, batch, cases, probes, bar)
            todo = [c for c in batch if not c.error]  # (a rate point without its maximum)
            if len(todo) == 1:
                bar.start(first, todo[0].name)
                run_case(opts, todo[0], bar.tick)
            elif todo:
                names = " | ".join(c.label or c.transport for c in todo)
                bar.start(first, f"{todo[0].name} with {names} in turn")
                run_group(opts, todo, bar.tick)
            for i, case in enumerate(batch, first):
                if i > first:
                    bar.start(i, case.name)
                bar.done(f"{progress(case)} ({case.seconds:.1f} s)")
    finally:
        bar.close()
    total = time.monotonic() - t0
    rate_ratios(opts, cases)
    env["rsock_providers_used"] = (
        providers_used(cases) if any(map(is_rsock, opts.transports)) else None
    )
    print(render(opts, env, cases), flush=True)
    bar.message(f"total {total:.1f} s")
    plot_failed = False
    if opts.plot_path:
        try:
            _plot.write_plot(opts.plot_path, plot_data(opts, env, cases), micro())
            bar.message(f"plot written to {opts.plot_path}")
        except Exception as exc:  # noqa: BLE001 - the table is out; report and fail
            print(f"rsock.bench: --plot failed: {type(exc).__name__}: {exc}", file=sys.stderr)
            plot_failed = True
    if opts.json_path:
        doc = {
            "env": env,
            "config": {k: v for k, v in vars(opts).items() if k != "json_path"},
            "seconds": round(total, 3),
            "cases": [c.to_json() for c in cases],
            "rate_tcp_max": probes,
        }
        Path(opts.json_path).write_text(json.dumps(doc, indent=1, default=str) + "\n")
    if any(c.status == "verify" for c in cases):
        return EXIT_VERIFY
    return EXIT_FAILED if plot_failed or any(c.status != "ok" for c in cases) else 0


def plot_data(opts: Options, env: dict[str, Any], cases: list[Case]) -> _plot.PlotData:
    """The --plot series: ping-pong p50 (min-p90) and stream GB/s (min-max) by size."""
    latency: dict[tuple[str, str], _plot.Series] = {}
    bandwidth: dict[tuple[str, str], _plot.Series] = {}
    for c in cases:
        if c.status != "ok" or c.test not in ("pingpong", "stream"):
            continue
        key = (c.transport, c.api)
        name = f"{c.label or c.transport} [{c.tag}]"
        s = c.summary
        if c.test == "pingpong":
            series = latency.setdefault(key, _plot.Series(name, c.transport, c.api))
            series.points.append((c.size, s["rtt_us_p50"], s["rtt_us_min"], s["rtt_us_p90"]))
        else:
            series = bandwidth.setdefault(key, _plot.Series(name, c.transport, c.api))
            series.points.append((c.size, s["gbps_median"], s["gbps_min"], s["gbps_max"]))
    title = (
        f"rsock.bench {env['date']}, commit {env['git_commit'] or 'n/a'}: "
        f"{env['cpu_model']} x{env['cpu_count']}, Python {env['python']}\n{pin_text(opts)}"
        + (f", {mode_text(opts)}" if any(map(is_rsock, opts.transports)) else "")
        + (", quick" if opts.quick else "")
    )
    return _plot.PlotData(title, list(latency.values()), list(bandwidth.values()))


if __name__ == "__main__":  # `python rsock/bench/__init__.py`: runs without importing rsock
    sys.exit(main())
