"""Third-party frameworks, unmodified, over rsock: the programs in
``compat/frameworks`` (written as each library's documentation shows, no rsock
import) run as separate server and client processes, once with plain Python
(the oracle) and once each under ``python -m rsock run --report`` with
``RSOCK_FALLBACK=strict``; results are checked by the programs (checksums), exits
must be clean, and both reports must show every connection on shm.  Every client
times each request or message and prints the latencies: the stall rule applies to
them on both transports (``compat_support.check_no_stall``).

The frameworks are the test-only extra ``compat`` (pinned in pyproject.toml;
``make test`` installs it)."""

from __future__ import annotations

import contextlib
import importlib
import importlib.util
import json
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from compat_support import check_no_stall, popen_kwargs, split_latencies

FW = Path(__file__).resolve().parent.parent / "frameworks"

CASES = {
    "aiohttp": ("aiohttp", "aiohttp_server.py", "aiohttp_client.py", ["64"]),
    "requests+http.server": ("requests", "http_server.py", "requests_client.py", []),
    "tornado": ("tornado", "tornado_server.py", "tornado_client.py", []),
    "trio+anyio": ("trio", "trio_server.py", "trio_client.py", []),
    "pyftpdlib+ftplib": ("pyftpdlib", "ftp_server.py", "ftp_client.py", []),
    "websockets": ("websockets", "websockets_server.py", "websockets_client.py", []),
}
# what each client times: how many requests (or messages) of each kind
TIMED = {
    "aiohttp": {"keepalive": 200, "get_1mib": 5, "post_1mib": 5, "stream": 1, "newconn": 20},
    "requests+http.server": {"get": 10, "post": 10, "oneoff": 5},
    "tornado": {"get": 5, "post": 5, "line": 500},
    "trio+anyio": {
        "round_trip": 200,
        "echo_4mib": 1,
        "newconn": 20,
        "low_level": 1,
        "anyio_newconn": 20,
    },
    "pyftpdlib+ftplib": {"command": 10, "transfer": 4},
    "websockets": {"small": 500, "1mib": 5},
}
HTTPX_TIMED = {"keepalive": 100, "get_1mib": 5, "post_1mib": 5, "oneoff": 10}


def check_client_output(
    stdout: str, who: str, timed: dict[str, int], exempt: tuple[str, ...] = ()
) -> None:
    """A client's output: its latencies (as many of each kind as ``timed`` says,
    and no stall but in the ``exempt`` kinds), then OK."""
    rest, latencies = split_latencies(stdout)
    assert rest.split() == ["OK"], stdout[-3000:]
    assert {k: len(v) for k, v in latencies.items()} == timed, latencies
    check_no_stall(latencies, who, exempt)


def _env(transport: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("RSOCK_")}
    if transport == "rsock":
        env["RSOCK_FALLBACK"] = "strict"
    return env


def _cmd(transport: str, report: Path, *args: str) -> list[str]:
    if transport == "rsock":
        return [sys.executable, "-m", "rsock", "run", "--report", str(report), *args]
    return [sys.executable, *args]


def _check_report(path: Path, side: str) -> dict[str, int]:
    counts: dict[str, int] = json.loads(path.read_text())
    assert not [k for k in counts if k.endswith(":tcp")], counts
    key = "connect:shm" if side == "client" else "accept:shm"
    assert counts.get(key, 0) > 0, counts
    return counts


@pytest.fixture(params=["tcp", "rsock"])
def transport(request: pytest.FixtureRequest) -> str:
    return str(request.param)


@pytest.mark.timeout_s(180)
@pytest.mark.parametrize("case", sorted(CASES))
def test_framework(case: str, transport: str, tmp_path: Path) -> None:
    module, server_py, client_py, client_args = CASES[case]
    importlib.import_module(module)  # make test installs the extra: never skipped
    env = _env(transport)
    server = subprocess.Popen(
        _cmd(transport, tmp_path / "server.json", str(FW / server_py)),
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
        env=env,
        cwd=tmp_path,
    )
    try:
        assert server.stdout is not None and server.stdin is not None
        line = server.stdout.readline().split()
        assert line and line[0] == "PORT", line
        client = subprocess.run(
            _cmd(transport, tmp_path / "client.json", str(FW / client_py), *line[1:], *client_args),
            capture_output=True,
            text=True,
            env=env,
            cwd=tmp_path,
            timeout=150,
        )
        assert client.returncode == 0, client.stderr[-3000:]
        check_client_output(client.stdout, f"{client_py} over {transport}", TIMED[case])
        server.stdin.close()
        assert server.wait(30) == 0
    finally:
        if server.poll() is None:
            server.kill()
            server.wait()
        if server.stdout is not None:
            server.stdout.close()
    if transport == "rsock":
        _check_report(tmp_path / "client.json", "client")
        _check_report(tmp_path / "server.json", "server")


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _fw_env(transport: str) -> dict[str, str]:
    """The environment of a server run with ``-m``: its app module found in
    compat/frameworks."""
    env = _env(transport)
    env["PYTHONPATH"] = str(FW) + (os.pathsep + env["PYTHONPATH"] if "PYTHONPATH" in env else "")
    return env


@contextlib.contextmanager
def _served(cmd: list[str], env: dict[str, str], cwd: Path) -> Iterator[subprocess.Popen[str]]:
    """A server command (its log on stderr) in a session of its own: on the
    way out whatever is left of it (workers, a new master) is killed."""
    server = subprocess.Popen(
        cmd,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
        env=env,
        cwd=cwd,
        start_new_session=True,
        **popen_kwargs(),  # (SIGINT stops the servers: not ignored)
    )
    try:
        yield server
    finally:
        try:
            os.killpg(server.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        server.wait()
        if server.stderr is not None:
            server.stderr.close()


def _wait_for(server: subprocess.Popen[str], what: str, count: int, seen: list[str]) -> None:
    """Reads the server's log into ``seen`` until ``what`` was said ``count``
    times (a minute at most)."""
    assert server.stderr is not None
    deadline = time.monotonic() + 60
    while sum(what in s for s in seen) < count and time.monotonic() < deadline:
        line = server.stderr.readline()
        if not line:
            break
        seen.append(line)
    assert sum(what in s for s in seen) >= count, "".join(seen)


def _httpx_client(transport: str, tmp_path: Path, env: dict[str, str], port: int) -> None:
    client = subprocess.run(
        _cmd(transport, tmp_path / "client.json", str(FW / "httpx_client.py"), str(port)),
        capture_output=True,
        text=True,
        env=env,
        cwd=tmp_path,
        timeout=150,
    )
    assert client.returncode == 0, client.stderr[-3000:]
    check_client_output(client.stdout, f"httpx_client.py over {transport}", HTTPX_TIMED)


@pytest.mark.timeout_s(180)
@pytest.mark.parametrize(
    "options",
    [["--loop", "asyncio"], ["--loop", "uvloop"], ["--workers", "2"]],
    ids=["asyncio", "uvloop", "workers"],
)
def test_uvicorn_with_httpx(transport: str, tmp_path: Path, options: list[str]) -> None:
    """uvicorn serving a plain ASGI app (asyncio and uvloop loops, and two
    worker processes, which get the master's bound socket by spawn and
    pickling), driven by httpx; uvicorn is stopped with SIGINT, as from a
    terminal."""
    importlib.import_module("uvicorn")
    importlib.import_module("httpx")
    env = _fw_env(transport)
    port = _free_port()
    cmd = _cmd(
        transport,
        tmp_path / "server.json",
        "-m",
        "uvicorn",
        "asgi_app:app",
        "--host",
        "127.0.0.1",
        "--port",
        str(port),
        "--log-level",
        "info",
        *options,
    )
    with _served(cmd, env, tmp_path) as server:
        seen: list[str] = []
        # with workers: each says it started, then the app starts up
        _wait_for(server, "Application startup complete", 2 if "--workers" in options else 1, seen)
        _wait_for(server, "Uvicorn running on", 1, seen)  # (before or after those)
        _httpx_client(transport, tmp_path, env, port)
        server.send_signal(signal.SIGINT)
        assert server.wait(30) == 0
    if transport == "rsock":
        _check_report(tmp_path / "client.json", "client")
        _check_report(tmp_path / "server.json", "server")


GUNICORN_WORKERS = {
    "sync": "wsgi_app:app",
    "uvicorn.workers.UvicornWorker": "asgi_app:app",  # (uvloop: its default loop)
    "aiohttp.GunicornWebWorker": "aiohttp_app:my_web_app",
}


@pytest.mark.timeout_s(180)
@pytest.mark.parametrize("worker", sorted(GUNICORN_WORKERS))
def test_gunicorn(transport: str, tmp_path: Path, worker: str) -> None:
    """gunicorn's pre-fork server, as its documentation (and uvicorn's and
    aiohttp's deployment pages) shows: the master binds the listener, forks
    two workers that both accept on it; driven by httpx; stopped by SIGTERM.
    The listener a worker's event loop gets is gunicorn's proxy of it."""
    for module in ("gunicorn", "httpx", worker.split(".")[0] if "." in worker else "gunicorn"):
        importlib.import_module(module)  # make test installs the extra: never skipped
    env = _fw_env(transport)
    port = _free_port()
    cmd = _cmd(
        transport,
        tmp_path / "server.json",
        "-m",
        "gunicorn",
        "--workers",
        "2",
        "--worker-class",
        worker,
        "--bind",
        f"127.0.0.1:{port}",
        "--control-socket",
        str(tmp_path / "gunicorn.ctl"),
        GUNICORN_WORKERS[worker],
    )
    with _served(cmd, env, tmp_path) as server:
        seen: list[str] = []
        _wait_for(server, "Booting worker", 2, seen)
        assert any("Listening at" in s for s in seen), "".join(seen)
        _httpx_client(transport, tmp_path, env, port)
        server.send_signal(signal.SIGTERM)
        assert server.wait(30) == 0
        assert server.stderr is not None
        rest = server.stderr.read()
        assert "Traceback" not in rest and "Exception in worker" not in rest, rest[-3000:]
    if transport == "rsock":
        _check_report(tmp_path / "client.json", "client")
        counts = _check_report(tmp_path / "server.json", "server")
        assert counts["processes"] == 3, counts  # the master and its two workers
        if worker != "sync":
            # each worker's event loop serves the listener through rsock.asyncio
            assert counts.get("asyncio:create_server") == 2, counts


@pytest.mark.timeout_s(180)
def test_gunicorn_upgrade_on_usr2(transport: str, tmp_path: Path) -> None:
    """gunicorn's binary upgrade ("Upgrading to a new binary on the fly"):
    USR2 makes the master start a new master by fork and exec, which adopts
    the listener from the fds it inherited (GUNICORN_FD, socket.fromfd);
    then TERM to the old master leaves the new one serving the same port."""
    for module in ("gunicorn", "httpx"):
        importlib.import_module(module)
    env = _fw_env(transport)
    port = _free_port()
    cmd = _cmd(
        transport,
        tmp_path / "server.json",
        "-m",
        "gunicorn",
        "--workers",
        "1",
        "--bind",
        f"127.0.0.1:{port}",
        "--control-socket",
        str(tmp_path / "g.ctl"),
        "wsgi_app:app",
    )
    with _served(cmd, env, tmp_path) as server:  # (the new master joins its session)
        seen: list[str] = []
        _wait_for(server, "Booting worker", 1, seen)
        _httpx_client(transport, tmp_path, env, port)
        server.send_signal(signal.SIGUSR2)
        _wait_for(server, "Booting worker", 2, seen)  # the new master's worker
        starts = [s for s in seen if "Starting gunicorn" in s]
        assert len(starts) == 2, "".join(seen)
        new_master = int(starts[1].split("[")[2].split("]")[0])
        assert new_master != server.pid
        server.send_signal(signal.SIGTERM)  # the old master and its worker go
        assert server.wait(30) == 0
        _wait_for(server, "Master has been promoted", 1, seen)
        _httpx_client(transport, tmp_path, env, port)
        os.kill(new_master, signal.SIGTERM)
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            try:
                with open(f"/proc/{new_master}/stat") as f:
                    if f.read().rsplit(")", 1)[1].split()[0] == "Z":
                        break  # (exited; its new parent reaps it)
            except FileNotFoundError:
                break
            time.sleep(0.05)
        else:
            raise AssertionError("the new master did not stop")
        assert "Traceback" not in "".join(seen)
    if transport == "rsock":
        _check_report(tmp_path / "client.json", "client")


@pytest.mark.timeout_s(180)
def test_flask_debug_server(transport: str, tmp_path: Path) -> None:
    """``flask run --debug``: werkzeug's reloader binds the listener, makes
    it inheritable and starts the command line again in a child, which
    adopts the fd (socket.fromfd) and serves; driven by httpx; stopped with
    SIGINT, as from a terminal."""
    for module in ("flask", "httpx"):
        importlib.import_module(module)  # make test installs the extra: never skipped
    env = _fw_env(transport)
    port = _free_port()
    cmd = _cmd(
        transport,
        tmp_path / "server.json",
        "-m",
        "flask",
        "--app",
        "flask_app",
        "run",
        "--debug",
        "--port",
        str(port),
    )
    with _served(cmd, env, tmp_path) as server:
        seen: list[str] = []
        _wait_for(server, "Debugger is active", 1, seen)  # (the child, once it serves)
        _httpx_client(transport, tmp_path, env, port)
        os.killpg(server.pid, signal.SIGINT)  # (Ctrl-C reaches both processes)
        server.wait(30)
        assert server.stderr is not None
        rest = server.stderr.read()
        assert "Traceback" not in rest, rest[-3000:]
    if transport == "rsock":
        _check_report(tmp_path / "client.json", "client")
        counts = _check_report(tmp_path / "server.json", "server")
        assert counts["processes"] == 2, counts  # the reloader and its server child


@pytest.mark.timeout_s(240)
@pytest.mark.parametrize("method", ["spawn", "fork"])
def test_dask_local_cluster(transport: str, method: str, tmp_path: Path) -> None:
    """dask.distributed's LocalCluster(processes=True) with workers started
    by spawn (dask's default) and by fork: the scheduler and nannies in the
    program's process, each worker in its own; under ``rsock run`` the
    workers inherit the patch, and the one report (aggregated over the
    process tree) must show every connection, made and accepted, on shm."""
    # installed (make test installs the extra), not imported: importing
    # distributed adds import finders to this process
    assert importlib.util.find_spec("distributed") is not None
    env = _env(transport)
    proc = subprocess.run(
        _cmd(transport, tmp_path / "report.json", str(FW / "dask_cluster.py"), method),
        capture_output=True,
        text=True,
        env=env,
        cwd=tmp_path,
        timeout=200,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    # a handful of 64 MB transfers and task round trips, each legitimately slow:
    # recorded, exempt from the stall rule
    timed = {"scatter": 1, "worker_to_worker": 3, "map": 1}
    check_client_output(proc.stdout, f"dask_cluster.py over {transport}", timed, tuple(timed))
    if transport == "rsock":
        counts = _check_report(tmp_path / "report.json", "client")
        _check_report(tmp_path / "report.json", "server")
        assert counts["connect:shm"] == counts["accept:shm"], counts
        assert counts["processes"] >= 3, counts  # the program and two workers
