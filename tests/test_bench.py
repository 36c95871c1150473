"""Smoke tests of ``python -m rsock.bench`` (tiny volumes: seconds, not a measurement)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parents[1]
TINY = ["--quick", "--reps", "1", "--rep-time", "0.05", "--warmup-bytes", "1M",
        "--rounds", "200", "--warmup-rounds", "20", "--sizes", "64K", "--pin", "none"]  # fmt: skip


def bench(tmp_path: Path, *args: str, timeout: float = 50) -> tuple[int, str, dict[str, Any]]:
    out = tmp_path / "bench.json"
    proc = subprocess.run(
        [sys.executable, "-m", "rsock.bench", *TINY, "--json", str(out), *args],
        cwd=ROOT, capture_output=True, text=True, timeout=timeout, check=False,
    )  # fmt: skip
    doc = json.loads(out.read_text()) if out.exists() else {}
    return proc.returncode, proc.stdout + proc.stderr, doc


def test_tcp_unix_report_and_json(tmp_path: Path) -> None:
    rc, text, doc = bench(tmp_path, "--transport", "tcp,unix")
    assert rc == 0, text
    assert "unix vs tcp" in text and "RTT p50" in text and "GB/s" in text
    assert [c["status"] for c in doc["cases"]] == ["ok"] * 4
    stream = doc["cases"][0]
    assert stream["summary"]["gbps_median"] > 0
    assert len(doc["cases"][-1]["client"]["rtt_ns"]) == 200
    assert doc["env"]["pin"] == "none"


def test_rsock_takes_the_shm_path(tmp_path: Path) -> None:
    rc, text, doc = bench(tmp_path, "--transport", "rsock")
    assert rc == 0, text
    assert {c["client"].get("provider") for c in doc["cases"]} == {"shm"}, text


@pytest.mark.parametrize("fault", ["flip", "stale"])
def test_corrupt_data_fails_verification(tmp_path: Path, fault: str) -> None:
    rc, text, doc = bench(tmp_path, "--transport", "tcp", "--tests", "stream", "--fault", fault)
    assert rc == 3, text
    assert doc["cases"][0]["status"] == "verify"
    assert "FAILED (verify)" in text


def test_hung_peer_times_out_and_others_still_run(tmp_path: Path) -> None:
    rc, text, doc = bench(
        tmp_path, "--transport", "tcp", "--tests", "pingpong", "--fault", "hang", "--timeout", "2"
    )
    assert rc == 1, text
    assert doc["cases"][0]["status"] == "timeout"
