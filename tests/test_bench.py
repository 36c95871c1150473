"""Smoke tests of ``python -m rsock.bench`` (tiny volumes: seconds, not a measurement)."""

from __future__ import annotations

import importlib.util
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
    rc, text, doc = bench(tmp_path, "--transport", "tcp,unix", "--api", "sync")
    assert rc == 0, text
    assert "unix vs tcp" in text and "RTT p50" in text and "GB/s" in text
    assert "stream 64 KiB [sync]" in text and "asyncio" not in text
    assert [c["status"] for c in doc["cases"]] == ["ok"] * 4
    assert {c["api"] for c in doc["cases"]} == {"sync"}
    stream = doc["cases"][0]
    assert stream["summary"]["gbps_median"] > 0
    assert len(doc["cases"][-1]["client"]["rtt_ns"]) == 200
    assert doc["env"]["pin"] == "none"


LOOPS = ["asyncio", "uvloop"] if importlib.util.find_spec("uvloop") else ["asyncio"]


@pytest.mark.parametrize("loop", LOOPS)
def test_asyncio_api_every_transport(tmp_path: Path, loop: str) -> None:
    rc, text, doc = bench(
        tmp_path, "--api", "asyncio", "--loop", loop, "--transport", "rsock,tcp,unix"
    )
    assert rc == 0, text
    assert f"stream 64 KiB [asyncio/{loop}]" in text and "[sync]" not in text
    assert f"pingpong 64 B [asyncio/{loop}]" in text and "rsock vs tcp" in text
    assert [(c["transport"], c["status"]) for c in doc["cases"]] == [
        (t, "ok") for _ in ("stream", "pingpong") for t in ("rsock", "tcp", "unix")
    ]
    for c in doc["cases"]:
        assert (c["api"], c["loop"]) == ("asyncio", loop)
        for side in (c["client"], c["server"]):
            assert side["api"] == "asyncio" and side["loop"] == loop, side
            assert side["loop_class"].startswith("uvloop" if loop == "uvloop" else "asyncio")
        if c["test"] == "stream":  # warm-up fully verified, then sampled, all acked
            assert [p["kind"] for p in c["client"]["phases"]] == ["warmup", "calibrate", "rep"]
            assert all(p["ack_crc_ok"] for p in c["client"]["phases"])
            assert [p["full_verify"] for p in c["server"]["phases"]] == [True, False, False]
            assert c["summary"]["gbps_median"] > 0
        else:
            assert len(c["client"]["rtt_ns"]) == 200
    assert {c["client"].get("provider") for c in doc["cases"] if c["transport"] == "rsock"} == {
        "shm"
    }
    assert doc["env"]["asyncio_loop"] == loop


def test_default_runs_both_apis(tmp_path: Path) -> None:
    rc, text, doc = bench(tmp_path, "--transport", "tcp", "--tests", "pingpong")
    assert rc == 0, text
    assert [c["api"] for c in doc["cases"]] == ["sync", "asyncio"]
    assert doc["env"]["asyncio_loop"] == LOOPS[-1]  # uvloop when importable


def test_rsock_takes_the_shm_path(tmp_path: Path) -> None:
    rc, text, doc = bench(tmp_path, "--transport", "rsock")
    assert rc == 0, text
    assert {c["client"].get("provider") for c in doc["cases"]} == {"shm"}, text


@pytest.mark.parametrize("api", ["sync", "asyncio"])
@pytest.mark.parametrize("fault", ["flip", "stale"])
def test_corrupt_data_fails_verification(tmp_path: Path, fault: str, api: str) -> None:
    rc, text, doc = bench(
        tmp_path, "--transport", "tcp", "--tests", "stream", "--api", api, "--fault", fault
    )
    assert rc == 3, text
    assert doc["cases"][0]["status"] == "verify"
    assert "corrupt message" in doc["cases"][0]["server"]["verify_error"]
    assert "FAILED (verify)" in text


def test_hung_peer_times_out_and_others_still_run(tmp_path: Path) -> None:
    rc, text, doc = bench(
        tmp_path, "--transport", "tcp", "--tests", "pingpong", "--fault", "hang", "--timeout", "2"
    )
    assert rc == 1, text
    assert [(c["api"], c["status"]) for c in doc["cases"]] == [
        ("sync", "timeout"),
        ("asyncio", "timeout"),
    ]
