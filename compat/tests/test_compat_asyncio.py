"""(e) an asyncio streams program: a line-based chat server
(``asyncio.start_server``) and its members (``asyncio.open_connection``), each
side in its own process, on asyncio's loop and on uvloop, over rsock and over
TCP; both runs must give the same result.  The members time each command that
has a reply; the stall rule applies to those that run before the large blobs
(the others are recorded: see ``BUSY``).

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
MESSAGES = 100
BLOB_KIB = 4096
LOOPS = ["asyncio", "uvloop"]
BLOB_SIZES = [1, 1000, 65536, 1 << 20, BLOB_KIB * 1024]  # the client's, in order
# Exempt from the stall rule: commands that run while other members' blobs of
# 1-4 MiB hold the one server loop and the one client loop (hashed, reversed,
# compared), so that a member's 64 KiB blob or QUIT may wait ~50-100 ms behind
# another's 4 MiB one: head-of-line work, not a stall.  Recorded all the same.
BUSY = ("BLOB 65536", f"BLOB {1 << 20}", f"BLOB {BLOB_KIB * 1024}", "QUIT")


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
    out, latencies = split_latencies(client.stdout)
    result: dict[str, Any] = json.loads(out)
    # each member's NICK, barriers, blobs (timed per size: 1 B .. 4 MiB) and QUIT
    kinds = ["NICK", "SYNC 1", "SYNC 2", *(f"BLOB {n}" for n in BLOB_SIZES), "QUIT"]
    assert {k: len(v) for k, v in latencies.items()} == dict.fromkeys(kinds, CLIENTS)
    check_no_stall(latencies, f"aio_chat_client.py ({loop}) over {transport}", BUSY)
    blob_bytes = CLIENTS * sum(BLOB_SIZES)
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
