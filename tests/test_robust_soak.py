"""The short soak (``tests/soak.py``; the long one is ``make soak``): mixed
request/response traffic between processes, random sizes, random closes and
reconnects, every byte checked, no leaks.  The ``tcp`` run proves the soak."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
from support import TESTS_DIR

SECONDS = {"tcp": 4, "rsock": 10}


@pytest.mark.timeout_s(150)
def test_short_soak(transport: str) -> None:
    proc = subprocess.run(
        [
            sys.executable,
            str(TESTS_DIR / "soak.py"),
            "--transport",
            transport,
            "--seconds",
            str(SECONDS[transport]),
            "--seed",
            "7",
        ],
        capture_output=True,
        text=True,
        timeout=140,
    )
    lines = proc.stdout.strip().splitlines()
    print("\n" + (lines[-2] if len(lines) >= 2 else proc.stdout))
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    summary = json.loads(lines[-1])
    assert summary["problems"] == []
    client, server = summary["client"], summary["server"]
    assert client.get("mismatches", 0) == 0 and server.get("mismatches", 0) == 0
    assert client["connections"] >= 50 and client["responses"] >= 200
    for ending in ("normal", "server-close", "half-close", "aborts", "abandons"):
        assert client.get(ending, 0) > 0, f"no {ending} in this run"
