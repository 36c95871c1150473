"""Smoke test of ``python -m rsock.bench apps`` (one cheap case, tiny reps: an outcome
check, not a measurement).  Every run must be free of stalls (the stall rule on each
client run's latencies: a liveness check, not a timed test)."""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from rsock.bench import _apps

ROOT = Path(__file__).resolve().parents[1]


def run_apps(
    tmp_path: Path, cases: str, timeout: float = 30, limit: float = 120
) -> tuple[subprocess.CompletedProcess[str], Path]:
    """``python -m rsock.bench apps --quick`` of ``cases`` with tiny reps (one CPU:
    --pin none), without the caller's RSOCK_ variables; the process and its --json."""
    out = tmp_path / "apps.json"
    pin = ["--pin", "none"] if len(os.sched_getaffinity(0)) < 2 else []
    env = {k: v for k, v in os.environ.items() if not k.startswith("RSOCK_")}
    proc = subprocess.run(
        [sys.executable, "-m", "rsock.bench", "apps", "--quick", "--cases", cases,
         "--rep-time", "0.2", "--warmup", "0.1", "--timeout", str(timeout), "--json", str(out),
         *pin],
        cwd=tmp_path, capture_output=True, text=True, timeout=limit, env=env, check=False,
    )  # fmt: skip
    return proc, out


def check_no_stall(case: dict[str, Any]) -> None:
    """A case of the --json: every client run timed each of its requests, and the
    stall rule found nothing on either transport."""
    assert case["stall"] == {"tcp": False, "rsock": False}, case["stall"]
    for transport in ("tcp", "rsock"):
        for s in case["samples"][transport]:
            assert s["stall"] is None and s["latency"]["n"] == s["count"], s
            assert "latencies" not in s  # (a summary in the JSON, not every latency)


def connections_made(out: Path) -> dict[str, int]:
    """Per case of the --json at ``out``: the rsock connections its clients made,
    after checking that the case passed, every rep of both sides counted, no
    stall, and every connection of the server and the clients took shm (each
    made one accepted by the server, none on TCP)."""
    made: dict[str, int] = {}
    for case in json.loads(out.read_text())["cases"]:
        assert case["status"] == "ok" and case["fast_path"] is True, case
        check_no_stall(case)
        for transport in ("tcp", "rsock"):
            assert all(s["count"] > 0 for s in case["samples"][transport]), case
        clients = case["reports"]["client"]
        for counts in [case["reports"]["server"], *clients]:
            assert not [k for k in counts if k.endswith(":tcp")], counts
        n = sum(c.get("connect:shm", 0) for c in clients)
        assert case["reports"]["server"].get("accept:shm") == n, case["reports"]
        made[case["case"]] = n
    return made


@pytest.mark.timeout_s(150)
def test_apps_tornado_round_trips_both_sides_fast_path(tmp_path: Path) -> None:
    # make test installs the compat extra (tornado): never skipped
    assert importlib.util.find_spec("tornado") is not None
    proc, out = run_apps(tmp_path, "tornado-rtt")
    text = proc.stdout + proc.stderr
    assert proc.returncode == 0, text
    [row] = [line for line in proc.stdout.splitlines() if line.startswith("tornado ")]
    # case, unit, TCP "median [min-max]", rsock "median [min-max]", ratio, fast path, stall
    assert " RT/s " in row and row.count("[") == 2, row
    assert "x  " in row and "yes (2 conns)" in row and "FAILED" not in proc.stdout, row
    assert row.endswith("  no") and "STALL" not in text, row

    doc = json.loads(out.read_text())
    [case] = doc["cases"]
    assert case["case"] == "tornado-rtt" and case["status"] == "ok", case
    for transport in ("tcp", "rsock"):
        samples = case["samples"][transport]
        assert len(samples) == 2, samples  # --quick: 2 reps
        assert all(s["count"] > 0 and s["elapsed"] > 0 for s in samples), samples
        assert case["median"][transport] > 0
    assert case["ratio_rsock_tcp"] > 0
    assert case["fast_path"] is True
    check_no_stall(case)
    # each side's share of a rep on the CPU: the client's count of its loop,
    # the server's process tree sampled around it (a round-trip loop keeps
    # the client busy; the shares are fractions of the time, not above ~1)
    for transport in ("tcp", "rsock"):
        client, server = case["busy"][transport]["client"], case["busy"][transport]["server"]
        assert 0.05 < client["cpu"] < 1.2 and 0 <= server["cpu"] < 1.2, case["busy"]
        assert 0 < client["user"] <= client["cpu"] and server["user"] <= server["cpu"]
    assert all("rusage" in s and "server_cpu" in s for s in case["samples"]["tcp"]), case
    assert row.count("%") == 2, row  # the TCP busy and user columns
    # every rsock client run and the rsock server: connections on shm only, no TCP
    reports = [*case["reports"]["client"], case["reports"]["server"]]
    assert len(reports) == 3, reports
    for counts in reports:
        assert not [k for k in counts if k.endswith(":tcp")], counts
    assert [c.get("connect:shm") for c in case["reports"]["client"]] == [1, 1]
    assert case["reports"]["server"].get("accept:shm") == 2
    assert doc["config"]["rsock_fallback"] == "strict"
    assert doc["env"]["versions"]["tornado"]
    assert doc["env"]["cpu_model"] and doc["env"]["python"]


@pytest.mark.timeout_s(150)
def test_apps_dask_worker_to_worker_every_connection_on_shm(tmp_path: Path) -> None:
    """The dask cases: a LocalCluster (scheduler, nannies, two spawned
    workers) under ``rsock run`` and a Client per rep; a 64 MB array made on
    one worker crosses to the other (checked by checksum in the program).
    Every connection of the process tree, made and accepted, is on shm."""
    # make test installs the compat extra (distributed, numpy): never skipped
    assert importlib.util.find_spec("distributed") is not None
    proc, out = run_apps(tmp_path, "dask-w2w", timeout=60, limit=140)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    [case] = json.loads(out.read_text())["cases"]
    assert case["case"] == "dask-w2w" and case["status"] == "ok", case
    check_no_stall(case)  # (64 MB transfers: a median far above 10 ms never stalls)
    for transport in ("tcp", "rsock"):
        samples = case["samples"][transport]
        assert len(samples) == 2, samples
        assert all(s["count"] > 0 and s["bytes"] == s["count"] * (64 << 20) for s in samples)
    assert case["fast_path"] is True
    server, clients = case["reports"]["server"], case["reports"]["client"]
    for counts in [server, *clients]:
        assert not [k for k in counts if k.endswith(":tcp")], counts
    assert server["processes"] >= 3, server  # the scheduler's process and two workers
    made = server.get("connect:shm", 0) + sum(c.get("connect:shm", 0) for c in clients)
    assert all(c.get("connect:shm", 0) > 0 for c in clients), clients
    assert server.get("accept:shm", 0) == made, (server, clients)


@pytest.mark.timeout_s(150)
def test_apps_requests_thread_per_connection_server(tmp_path: Path) -> None:
    """http.server's ThreadingHTTPServer (blocking sockets, a thread per
    connection) and requests, keep-alive and a new connection per request:
    both sides of every rsock rep on shm, the bodies checked by the client."""
    assert importlib.util.find_spec("requests") is not None  # the compat extra
    proc, out = run_apps(tmp_path, "requests-keepalive,requests-newconn", limit=140)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    made = connections_made(out)
    assert sorted(made) == ["requests-keepalive", "requests-newconn"]
    assert made["requests-keepalive"] == 2, made  # one connection per client run
    assert made["requests-newconn"] > 20, made  # one per request


@pytest.mark.timeout_s(150)
def test_apps_selectors_echo_server(tmp_path: Path) -> None:
    """The selectors documentation's echo server (epoll, non-blocking accept and
    recv in one thread) and a blocking socket client, round trips on one
    connection and a new connection per round trip: stdlib only, so never
    skipped; both sides of every rsock rep on shm."""
    proc, out = run_apps(tmp_path, "selectors-rtt,selectors-newconn", limit=140)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    made = connections_made(out)
    assert sorted(made) == ["selectors-newconn", "selectors-rtt"]
    assert made["selectors-rtt"] == 2 and made["selectors-newconn"] > 20, made


# 0.3 s of CPU, in user space (the clock is asked between runs of a plain loop:
# CLOCK_PROCESS_CPUTIME_ID is a system call)
BURN = (
    "import time\nt = time.process_time()\n"
    "while time.process_time() - t < 0.3:\n    for _ in range(100_000): pass\n"
)


@pytest.mark.timeout_s(30)
def test_tree_cpu_counts_the_descendants() -> None:
    """The server's CPU the bench samples is its whole process tree's (dask's
    workers, a server started through a launcher): a parent and its child
    each burn 0.3 s of CPU, then stay alive; the parent's tree counts both."""
    child = f"{BURN}print('burnt', flush=True)\nimport sys\nsys.stdin.read()\n"
    parent = (
        f"import subprocess, sys\n{BURN}"
        f"c = subprocess.Popen([sys.executable, '-c', {child!r}], stdout=subprocess.PIPE,"
        " stdin=subprocess.PIPE)\n"
        "assert c.stdout.readline() == b'burnt\\n'\nprint('ready', flush=True)\n"
        "sys.stdin.read()\nc.stdin.close()\nc.wait()\n"
    )
    with subprocess.Popen(
        [sys.executable, "-c", parent], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True
    ) as proc:
        try:
            assert proc.stdout is not None and proc.stdout.readline() == "ready\n"
            cpu = _apps.tree_cpu(proc.pid)
            own = _apps.tree_cpu(os.getpid())
        finally:
            assert proc.stdin is not None
            proc.stdin.close()
            proc.wait(10)
    # both burns (each >= 0.3 s), nearly all of it in user space
    assert cpu is not None and 0.55 <= cpu[0] < 5 and 0.5 <= cpu[1] <= cpu[0], cpu
    assert own is not None and own[0] >= cpu[0], (own, cpu)  # this process's tree holds it
    assert _apps.tree_cpu(proc.pid) is None  # gone: no /proc entry


def client_output(latencies: list[float]) -> str:
    """What a client of apps/ prints: its result as one JSON line."""
    return json.dumps(
        {"count": len(latencies), "bytes": 64 * len(latencies), "elapsed": sum(latencies),
         "latencies": latencies}
    ) + "\n"  # fmt: skip


def test_a_client_run_that_stalls() -> None:
    """The rule on one client run's latencies: 50 fast round trips and one of
    200 ms stall (the sample says where), 50 fast ones and one of 20 ms do not."""
    case = _apps.BY_NAME["selectors-rtt"]
    fast = [0.0001] * 50
    ok = _apps.client_sample(case, "tcp", "warming up\n" + client_output([*fast, 0.02]))
    assert ok["stall"] is None and "latencies" not in ok
    assert ok["latency"]["n"] == 51 and ok["latency"]["max"] == 0.02
    stalled = _apps.client_sample(case, "rsock", client_output([*fast[:10], 0.2, *fast[10:]]))
    assert stalled["stall"].startswith("stall in selectors-rtt rsock rep: 51 latencies, ")
    assert "max 200.0 ms" in stalled["stall"] and "slowest: #10 200.0 ms" in stalled["stall"]
    assert stalled["latency"]["slowest"][0] == [10, 0.2]
    with pytest.raises(RuntimeError, match="timed 50 of 51"):
        line = json.loads(client_output(fast))
        _apps.client_sample(case, "tcp", json.dumps({**line, "count": 51}))


@pytest.mark.timeout_s(30)
def test_a_stall_fails_the_case_and_shows_in_the_table(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A case whose rsock runs stall (one request of 200 ms among fast ones)
    fails, with the stall as its reason; the JSON says which transport stalled
    and the table's stall column shows it.  No process is started."""
    case = _apps.BY_NAME["selectors-rtt"]
    opts = _apps.parse_options(["--cases", case.name, "--reps", "2", "--pin", "none"])

    def client(opts: object, case: _apps.AppCase, transport: str, *rest: object) -> Any:
        slow = 0.2 if transport == "rsock" else 0.002
        return _apps.client_sample(case, transport, client_output([0.0001] * 50 + [slow]))

    fake = SimpleNamespace(pid=-1)  # (tree_cpu: no such process, no figure)
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    monkeypatch.setattr(_apps, "start_server", lambda o, c, transport, tmp: _apps.Server(
        transport, fake, tmp / "out", tmp / "err", tmp / "report", False))  # fmt: skip
    monkeypatch.setattr(_apps, "stop_server", lambda server, grace: None)
    monkeypatch.setattr(_apps, "run_client", client)
    monkeypatch.setattr(_apps, "read_report", lambda path: {"connect:shm": 1, "accept:shm": 1})
    said: list[str] = []
    result = _apps.run_case(opts, case, said.append)
    assert result.status == "failed", result.reason
    assert result.reason.startswith("stall in selectors-rtt rsock rep: 51 latencies"), result.reason
    assert "(and 1 more reps)" in result.reason, result.reason
    assert sum(line.startswith("  STALL in selectors-rtt rsock rep") for line in said) == 2, said
    doc = result.to_json()
    assert doc["stall"] == {"tcp": False, "rsock": True}
    assert [s["stall"] is None for s in doc["samples"]["tcp"]] == [True, True]
    assert doc["median"]["rsock"] > 0  # the figures stay
    table = _apps.render(_apps.environment(opts), opts, [result])
    [row] = [line for line in table.splitlines() if line.startswith(case.title)]
    assert row.endswith("STALL rsock") and "FAILED" in row, row
    assert f"FAILED {case.name}: stall in selectors-rtt rsock rep" in table, table
