"""(b) a ``socketserver.ThreadingTCPServer`` line protocol (``makefile`` +
``readline``), server and concurrent clients each in their own process; the
client's latencies (each request sent one at a time, each pipelined batch) must
show no stall."""

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

CLIENTS = 8
ROUNDS = 40


@pytest.mark.parametrize("transport", TRANSPORTS)
def test_threading_tcp_server_line_protocol(transport: str, tmp_path: Path) -> None:
    server_report = tmp_path / "server-report.json"
    client_report = tmp_path / "client-report.json"
    cmd = python_cmd(transport, server_report) + [program("line_server.py")]
    with running_server(cmd, tmp_path, "line_server", ready_port) as server:
        check_listener(transport, server.port)
        client = run_client(
            python_cmd(transport, client_report)
            + [
                program("line_client.py"),
                "127.0.0.1",
                str(server.port),
                "--clients",
                str(CLIENTS),
                "--rounds",
                str(ROUNDS),
            ],
            tmp_path,
        )
        assert server.stop() == 0, server.stderr()
    out, latencies = split_latencies(client.stdout)
    result = json.loads(out)
    # 4 small commands a round, SHA + BLOB every 5th round of the first half, NOPE, QUIT
    commands = CLIENTS * (4 * ROUNDS + 2 * len(range(0, ROUNDS // 2, 5)) + 2)
    # one at a time: the first half's rounds; then one pipelined batch a connection
    one_at_a_time = CLIENTS * (4 * (ROUNDS // 2) + 2 * len(range(0, ROUNDS // 2, 5)))
    assert {k: len(v) for k, v in latencies.items()} == {
        "request": one_at_a_time,
        "pipelined": CLIENTS,
    }
    check_no_stall(latencies, f"line_client.py over {transport}")
    assert result["connections"] == CLIENTS
    assert result["commands"] == commands
    assert server.stdout().splitlines()[-1] == f"SERVED {CLIENTS} {commands}"
    no_tracebacks(server.stderr(), "line_server")
    no_tracebacks(client.stderr, "line_client")
    if transport == "rsock":
        check_fast_path(transport, read_report(client_report), connect=CLIENTS)
        check_fast_path(transport, read_report(server_report), accept=CLIENTS)
