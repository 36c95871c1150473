"""(d) a ``selectors`` echo server (non-blocking sockets, no threads, no asyncio)
and its clients, each side in its own process."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from compat_support import (
    TRANSPORTS,
    check_fast_path,
    check_listener,
    check_no_stall,
    no_tracebacks,
    program,
    python_cmd,
    read_report,
    ready_port,
    run_client,
    running_server,
    split_latencies,
)

CLIENTS = 4
REQUEST_RESPONSE_BYTES = 480735  # the client's message sizes, 1 B .. 300 kB
MESSAGES = 9  # request/responses a connection, each timed


def run_echo(
    transport: str, tmp_path: Path, *client_args: str, exempt: tuple[str, ...] = ()
) -> dict[str, int]:
    """The server and its clients over ``transport``; the client's result, after
    the stall rule on its latencies (each request/response, each connection's bulk
    echo) but the ``exempt`` kinds."""
    server_report = tmp_path / "server-report.json"
    client_report = tmp_path / "client-report.json"
    cmd = python_cmd(transport, server_report) + [program("echo_server.py")]
    with running_server(cmd, tmp_path, "echo_server", ready_port) as server:
        check_listener(transport, server.port)
        client = run_client(
            python_cmd(transport, client_report)
            + [
                program("echo_client.py"),
                "127.0.0.1",
                str(server.port),
                "--clients",
                str(CLIENTS),
                *client_args,
            ],
            tmp_path,
        )
        assert server.stop() == 0, server.stderr()
    out, latencies = split_latencies(client.stdout)
    result = json.loads(out)
    assert {k: len(v) for k, v in latencies.items()} == {
        "request_response": CLIENTS * MESSAGES,
        "bulk": CLIENTS,
    }
    check_no_stall(latencies, f"echo_client.py over {transport}", exempt)
    assert result["connections"] == CLIENTS
    assert server.stdout().splitlines()[-1] == f"SERVED {CLIENTS} {result['bytes']}"
    no_tracebacks(server.stderr(), "echo_server")
    if transport == "rsock":
        check_fast_path(transport, read_report(client_report), connect=CLIENTS)
        check_fast_path(transport, read_report(server_report), accept=CLIENTS)
    return dict(result)


@pytest.mark.parametrize("transport", TRANSPORTS)
def test_selectors_echo(transport: str, tmp_path: Path) -> None:
    """Request/response, then 1 MiB full duplex a connection: the server's output
    never outruns its clients' reading by a whole ring."""
    result = run_echo(transport, tmp_path, "--bulk-mib", "1", "--timeout", "20")
    assert result["bytes"] == CLIENTS * ((1 << 20) + REQUEST_RESPONSE_BYTES)


@pytest.mark.parametrize("transport", TRANSPORTS)
def test_selectors_echo_slow_reader(transport: str, tmp_path: Path) -> None:
    """16 MiB sent before anything is read: the server must buffer, wait for
    EVENT_WRITE, and finish the echo after its clients half-closed.  Exempt from
    the stall rule (recorded): the bulk echoes, which hold the reader's deliberate
    second, and the request/responses, which run next to other connections' 16 MiB
    (the one server loop buffers them: ~45 ms behind them seen on TCP too)."""
    result = run_echo(
        transport,
        tmp_path,
        "--bulk-mib",
        "16",
        "--slow-reader",
        "1",
        "--timeout",
        "5",
        exempt=("bulk", "request_response"),
    )
    assert result["bytes"] == CLIENTS * ((16 << 20) + REQUEST_RESPONSE_BYTES)
