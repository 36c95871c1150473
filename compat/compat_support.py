"""Helpers for the compat suite: run unmodified programs over TCP or rsock.

A program runs over ``tcp`` as ``python prog ...`` (the oracle) and over ``rsock``
as ``python -m rsock run --report FILE prog ...``, whose report (the patch's
counters, written at exit) proves that its connections took rsock's fast path.

A client that makes requests or messages in a loop times each one and prints a
line ``LATENCIES {"kind": [seconds, ...], ...}``; the tests apply the stall rule
to each kind on both transports (``check_no_stall``): a stall is a bug, not a
speed figure.
"""

from __future__ import annotations

import contextlib
import io
import json
import os
import runpy
import signal
import subprocess
import sys
import time
from collections.abc import Collection, Iterator
from pathlib import Path
from typing import Any

# The stall rule, the one `python -m rsock.bench apps` applies: a list of latencies
# stalled when its slowest is above STALL_MAX_S while its median is below STALL_MEDIAN_S.
from rsock.bench._apps import (  # noqa: F401 - the rule, for the tests
    STALL_MAX_S,
    STALL_MEDIAN_S,
    latency_median,
    stall_problem,
    stalled,
)

COMPAT_DIR = Path(__file__).resolve().parent
PROGRAMS = COMPAT_DIR / "programs"
FAST_PROVIDER = os.environ.get("RSOCK_PROVIDER") or "shm"  # make test-rdma: "verbs"
TRANSPORTS = ["tcp", "rsock"]


def program(name: str) -> str:
    return str(PROGRAMS / name)


def python_cmd(transport: str, report: Path | None = None) -> list[str]:
    """The interpreter command line that runs a program over ``transport``."""
    if transport == "tcp":
        return [sys.executable]
    assert transport == "rsock", transport
    cmd = [sys.executable, "-m", "rsock", "run"]
    if report is not None:
        cmd += ["--report", str(report)]
    return cmd


def _child_env() -> dict[str, str]:
    env = dict(os.environ)
    env["PYTHONUNBUFFERED"] = "1"
    env["RSOCK_FALLBACK"] = "never"
    return env


def _restore_sigint() -> None:  # pragma: no cover - runs in the child
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def popen_kwargs() -> dict[str, Any]:
    # Python ignores SIGINT for good if it starts with SIGINT ignored (as a shell's
    # background job does): the servers are stopped with SIGINT, so give it back.
    if signal.getsignal(signal.SIGINT) == signal.SIG_IGN:
        return {"preexec_fn": _restore_sigint}
    return {}


class Server:
    """A server program in a child process; ``port`` once it said READY."""

    def __init__(self, cmd: list[str], workdir: Path, name: str, ready: str = "READY") -> None:
        self.cmd = cmd
        self.out_path = workdir / f"{name}.stdout"
        self.err_path = workdir / f"{name}.stderr"
        self._out = open(self.out_path, "wb")  # noqa: SIM115 - closed in stop()
        self._err = open(self.err_path, "wb")  # noqa: SIM115
        self.proc = subprocess.Popen(
            cmd,
            stdin=subprocess.DEVNULL,
            stdout=self._out,
            stderr=self._err,
            cwd=workdir,
            env=_child_env(),
            **popen_kwargs(),
        )
        self.ready = ready
        self.port = 0
        self.returncode: int | None = None

    def wait_ready(self, parse: Any, timeout: float = 30.0) -> int:
        """Waits for the READY line; ``parse(line)`` returns the port or None."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            for line in self.out_path.read_text(errors="replace").splitlines():
                port = parse(line)
                if port:
                    self.port = int(port)
                    return self.port
            if self.proc.poll() is not None:
                raise RuntimeError(
                    f"server {self.cmd} exited with {self.proc.returncode} before it was "
                    f"ready:\n{self.stderr()}"
                )
            time.sleep(0.02)
        raise TimeoutError(f"server {self.cmd} not ready after {timeout:g} s:\n{self.stderr()}")

    def stop(self, timeout: float = 20.0) -> int:
        """SIGINT (what a user's Ctrl-C sends), then the exit status."""
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGINT)
        try:
            self.returncode = self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait(10)
            raise AssertionError(f"server {self.cmd} ignored SIGINT for {timeout:g} s") from None
        finally:
            self._out.close()
            self._err.close()
        return self.returncode

    def kill(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(10)
        self._out.close()
        self._err.close()

    def stdout(self) -> str:
        return self.out_path.read_text(errors="replace")

    def stderr(self) -> str:
        return self.err_path.read_text(errors="replace")


@contextlib.contextmanager
def running_server(cmd: list[str], workdir: Path, name: str, parse: Any) -> Iterator[Server]:
    server = Server(cmd, workdir, name)
    try:
        server.wait_ready(parse)
        yield server
    finally:
        server.kill()


def ready_port(line: str) -> int | None:
    """``READY <host> <port>``, as the programs under programs/ print it."""
    fields = line.split()
    if len(fields) == 3 and fields[0] == "READY":
        return int(fields[2])
    return None


def run_client(
    cmd: list[str], workdir: Path, timeout: float = 40.0
) -> subprocess.CompletedProcess[str]:
    proc = subprocess.run(
        cmd,
        cwd=workdir,
        env=_child_env(),
        stdin=subprocess.DEVNULL,
        capture_output=True,
        text=True,
        timeout=timeout,
        **popen_kwargs(),
    )
    if proc.returncode != 0:
        raise AssertionError(
            f"client {cmd} exited with {proc.returncode}\nstdout:\n{proc.stdout}\n"
            f"stderr:\n{proc.stderr}"
        )
    return proc


def run_in_process(transport: str, path: str, args: list[str]) -> tuple[int, str, dict[str, int]]:
    """Runs a program as ``__main__`` in this process (patched for ``rsock``).

    Returns (exit status, its stdout, the patch counters it caused)."""
    import rsock
    from rsock import _patch

    saved_argv = sys.argv[:]
    out = io.StringIO()
    before = _patch.counters()
    code = 0
    if transport == "rsock":
        rsock.patch()
    try:
        sys.argv = [path, *args]
        with contextlib.redirect_stdout(out):
            runpy.run_path(path, run_name="__main__")
    except SystemExit as e:
        code = e.code if isinstance(e.code, int) else (0 if e.code is None else 1)
    finally:
        sys.argv = saved_argv
        if transport == "rsock":
            rsock.unpatch()
    after = _patch.counters()
    delta = {k: after.get(k, 0) - before.get(k, 0) for k in after}
    return code, out.getvalue(), {k: v for k, v in delta.items() if v}


def read_report(path: Path) -> dict[str, int]:
    return dict(json.loads(path.read_text()))


def check_fast_path(
    transport: str, report: dict[str, int] | None, *, connect: int = 0, accept: int = 0
) -> None:
    """On rsock: every connection the program made or accepted took the fast path
    (at least ``connect``/``accept`` of them), and nothing took any other."""
    if transport != "rsock":
        return
    assert report is not None, "no patch report"
    # rsock sockets made by the patched class, or asyncio calls it routed to rsock.asyncio
    routed = sum(v for k, v in report.items() if k.startswith("asyncio:"))
    assert report.get("rsock", 0) + routed >= 1, report
    others = {
        k: v
        for k, v in report.items()
        if k.startswith(("connect:", "accept:")) and not k.endswith(":" + FAST_PROVIDER)
    }
    assert not others, f"connections off the fast path: {report}"
    assert report.get(f"connect:{FAST_PROVIDER}", 0) >= connect, report
    assert report.get(f"accept:{FAST_PROVIDER}", 0) >= accept, report


def kernel_tcp_sockets(port: int, state: str) -> int:
    """How many kernel TCP sockets (v4 and v6) on local ``port`` are in
    ``state`` (/proc/net/tcp codes: 0A listen, 01 established)."""
    n = 0
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        try:
            lines = Path(table).read_text().splitlines()[1:]
        except OSError:
            continue
        for line in lines:
            fields = line.split()
            local, st = fields[1], fields[3]
            if st == state and int(local.rsplit(":", 1)[1], 16) == port:
                n += 1
    return n


def check_listener(transport: str, port: int) -> None:
    """Both kinds of server have a kernel TCP listener on their port (an
    rsock listener serves plain TCP clients too), but over rsock no kernel
    TCP connection to that port exists: the bytes cannot have gone through
    TCP.  Call it while the clients are still connected."""
    assert kernel_tcp_sockets(port, "0A") >= 1, f"no kernel TCP listener on port {port}"
    if transport == "rsock":
        established = kernel_tcp_sockets(port, "01")
        assert established == 0, f"{established} kernel TCP connections on port {port}"


LATENCIES = "LATENCIES"


def split_latencies(output: str) -> tuple[str, dict[str, list[float]]]:
    """A program's output without its ``LATENCIES {...}`` line, and that line's
    latencies (seconds, per kind of request or message, in order)."""
    rest: list[str] = []
    found: dict[str, list[float]] | None = None
    for line in output.splitlines(keepends=True):
        if line.startswith(LATENCIES + " "):
            assert found is None, f"two {LATENCIES} lines:\n{output[-3000:]}"
            kinds = json.loads(line[len(LATENCIES) + 1 :])
            found = {str(k): [float(x) for x in v] for k, v in kinds.items()}
        else:
            rest.append(line)
    assert found is not None, f"no {LATENCIES} line in the output:\n{output[-3000:]}"
    return "".join(rest), found


def check_no_stall(
    latencies: dict[str, list[float]], who: str, exempt: Collection[str] = ()
) -> None:
    """The stall rule on each kind of ``latencies`` but the ``exempt`` ones (a
    handful of huge transfers, a deliberate wait: recorded, not judged); every
    kind must have been timed at least once."""
    assert set(exempt) <= set(latencies), (sorted(exempt), sorted(latencies))
    problems = []
    for kind, values in latencies.items():
        assert values, f"{who}: no {kind!r} latency"
        if kind not in exempt:
            problem = stall_problem(values, f"{who}, {kind!r}")
            if problem:
                problems.append(problem)
    assert not problems, "\n".join(problems)


def no_tracebacks(text: str, who: str) -> None:
    assert "Traceback" not in text, f"{who} printed a traceback:\n{text}"
