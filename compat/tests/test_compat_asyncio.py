"""(e) an asyncio streams program: a line-based chat server
(``asyncio.start_server``) and its members (``asyncio.open_connection``), each
side in its own process, on asyncio's loop and on uvloop, over rsock and over
TCP; both runs must give the same result.

Under ``python -m rsock run`` the loops' ``create_server``/``create_connection``
go through ``rsock.asyncio`` (the patch reports ``asyncio:create_server`` /
``asyncio:create_connection`` and every connection per provider)."""

from __future__ import annotations

import importlib
import json
from pathlib import Path
from typing import Any

import pytest
from compat_support import (
    TRANSPORTS,
    check_fast_path,
    check_listener,
    no_tracebacks,
    program,
    python_cmd,
    read_report,
    ready_port,
    run_client,
    running_server,
)

CLIENTS = 4
MESSAGES = 100
BLOB_KIB = 4096
LOOPS = ["asyncio", "uvloop"]


def run_chat(transport: str, loop: str, workdir: Path) -> dict[str, Any]:
    workdir.mkdir()
    server_report = workdir / "server-report.json"
    client_report = workdir / "client-report.json"
    cmd = python_cmd(transport, server_report) + [program("aio_chat_server.py"), "--loop", loop]
    with running_server(cmd, workdir, "aio_chat_server", ready_port) as server:
        check_listener(transport, server.port)
        client = run_client(
            python_cmd(transport, client_report)
            + [
                program("aio_chat_client.py"),
                "127.0.0.1",
                str(server.port),
                "--clients",
                str(CLIENTS),
                "--messages",
                str(MESSAGES),
                "--blob-kib",
                str(BLOB_KIB),
                "--loop",
                loop,
            ],
            workdir,
        )
        assert server.stop() == 0, server.stderr()
    result: dict[str, Any] = json.loads(client.stdout)
    blob_bytes = CLIENTS * (1 + 1000 + 65536 + (1 << 20) + BLOB_KIB * 1024)
    assert result["connections"] == CLIENTS
    assert result["messages_received"] == CLIENTS * (CLIENTS - 1) * MESSAGES
    assert result["blob_bytes"] == blob_bytes
    assert server.stdout().splitlines()[-1] == f"SERVED {CLIENTS} {CLIENTS * MESSAGES} {blob_bytes}"
    no_tracebacks(server.stderr(), "aio_chat_server")
    no_tracebacks(client.stderr, "aio_chat_client")
    if transport == "rsock":
        creport = read_report(client_report)
        sreport = read_report(server_report)
        check_fast_path(transport, creport, connect=CLIENTS)
        check_fast_path(transport, sreport, accept=CLIENTS)
        # the loops' own TCP transports were never involved
        assert creport.get("asyncio:create_connection") == CLIENTS, creport
        assert creport.get("connect:shm") == CLIENTS, creport
        assert sreport.get("asyncio:create_server") == 1, sreport
        assert sreport.get("accept:shm") == CLIENTS, sreport
    return result


@pytest.mark.parametrize("loop", LOOPS)
def test_asyncio_streams_chat(loop: str, tmp_path: Path) -> None:
    if loop == "uvloop":
        importlib.import_module("uvloop")  # a test dependency: never skipped
    results = {t: run_chat(t, loop, tmp_path / t) for t in TRANSPORTS}
    assert results["rsock"] == results["tcp"]
