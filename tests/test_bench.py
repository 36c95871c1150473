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
    rc, text, doc = bench(
        tmp_path, "--transport", "tcp,unix", "--api", "sync", "--tests", "stream,pingpong"
    )
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
        tmp_path,
        "--api",
        "asyncio",
        "--loop",
        loop,
        "--transport",
        "rsock,tcp,unix",
        "--tests",
        "stream,pingpong",
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


def test_msgrate_and_connrate(tmp_path: Path) -> None:
    rc, text, doc = bench(tmp_path, "--transport", "rsock,tcp,unix", "--tests", "msgrate,connrate")
    assert rc == 0, text
    assert "msgrate 64 B [sync]  msg/s" in text and "connrate [sync]  conn/s" in text
    assert "msgrate 64 B [asyncio/" in text and "connrate [asyncio" not in text
    cases = [(c["api"], c["test"], c["transport"], c["status"]) for c in doc["cases"]]
    ts = ("rsock", "tcp", "unix")
    assert cases == [
        *[("sync", "msgrate", t, "ok") for t in ts],
        *[("sync", "connrate", t, "ok") for t in ts],
        *[("asyncio", "msgrate", t, "ok") for t in ts],
    ]
    for c in doc["cases"]:
        if c["test"] == "msgrate":  # 64 B messages: every one fully verified
            assert c["size"] == 64 and c["summary"]["msg_per_s_median"] > 0
            assert all(p["full_verify"] for p in c["server"]["phases"])
            assert all(p["ack_crc_ok"] for p in c["client"]["phases"])
        else:
            assert c["summary"]["conn_per_s_median"] > 0
            assert c["server"]["connections"] == c["client"]["connections"] > 0
            assert c["server"]["nbad"] == 0
        if c["transport"] == "rsock":
            assert c["client"].get("provider") == "shm", c


def test_sweep_sizes(tmp_path: Path) -> None:
    rc, text, _ = bench(tmp_path, "--sweep", "--transport", "unix")
    assert rc == 2 and "--sweep and --sizes exclude each other" in text  # TINY has --sizes
    out = tmp_path / "sweep.json"
    tiny = [a for a in TINY if a not in ("--sizes", "64K")]
    proc = subprocess.run(
        [sys.executable, "-m", "rsock.bench", *tiny, "--sweep", "--transport", "unix",
         "--api", "sync", "--tests", "stream,pingpong", "--warmup-bytes", "64K",
         "--json", str(out)],
        cwd=ROOT, capture_output=True, text=True, timeout=60, check=False,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stdout + proc.stderr
    cases = [(c["test"], c["size"], c["status"]) for c in json.loads(out.read_text())["cases"]]
    sizes = [64, 256, 1 << 10, 4 << 10, 16 << 10, 64 << 10, 256 << 10, 1 << 20, 4 << 20, 8 << 20]
    assert cases == [*(("stream", n, "ok") for n in sizes), ("pingpong", 64, "ok")]
    assert "stream 8 MiB [sync]" in proc.stdout and "stream 64 B [sync]" in proc.stdout


@pytest.mark.parametrize("api", ["sync", "asyncio"])
@pytest.mark.parametrize("fault", ["flip", "stale"])
@pytest.mark.parametrize("test", ["stream", "msgrate"])
def test_corrupt_data_fails_verification(tmp_path: Path, fault: str, api: str, test: str) -> None:
    rc, text, doc = bench(
        tmp_path, "--transport", "tcp", "--tests", test, "--api", api, "--fault", fault
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
