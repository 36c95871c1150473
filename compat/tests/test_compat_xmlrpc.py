"""(c) an ``xmlrpc.server`` server (its own process) and an ``xmlrpc.client``
client (in this process, patched over rsock); the client times each HTTP request,
and the stall rule applies to them per method."""

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
    run_in_process,
    running_server,
    split_latencies,
)

REPEAT = 5
CALLS_PER_SESSION = 9  # HTTP requests: a multicall is one


@pytest.mark.parametrize("transport", TRANSPORTS)
def test_xmlrpc(transport: str, tmp_path: Path) -> None:
    report = tmp_path / "server-report.json"
    cmd = python_cmd(transport, report) + [program("xmlrpc_server.py")]
    with running_server(cmd, tmp_path, "xmlrpc_server", ready_port) as server:
        check_listener(transport, server.port)
        code, out, counts = run_in_process(
            transport,
            program("xmlrpc_client.py"),
            [f"http://127.0.0.1:{server.port}/RPC2", "--repeat", str(REPEAT)],
        )
        assert server.stop() == 0, server.stderr()
    assert code == 0, out
    out, latencies = split_latencies(out)
    calls = REPEAT * CALLS_PER_SESSION
    assert json.loads(out)["calls"] == calls
    assert sum(len(v) for v in latencies.values()) == calls, latencies
    assert len(latencies["echo"]) == 2 * REPEAT and len(latencies["blob"]) == REPEAT
    check_no_stall(latencies, f"xmlrpc_client.py over {transport}")
    assert server.stdout().splitlines()[-1] == f"SERVED {calls}"
    no_tracebacks(server.stderr(), "xmlrpc_server")
    if transport == "rsock":
        check_fast_path(transport, counts, connect=calls)
        check_fast_path(transport, read_report(report), accept=calls)
