"""Smoke tests of ``python -m rsock.bench`` (tiny volumes: seconds, not a measurement)."""

from __future__ import annotations

import importlib.util
import json
import os
import pty
import random
import struct
import subprocess
import sys
import threading
from pathlib import Path
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parents[1]
TINY = ["--quick", "--reps", "1", "--rep-time", "0.05", "--warmup-bytes", "1M",
        "--rounds", "200", "--warmup-rounds", "20", "--sizes", "64K", "--pin", "none",
        "--idle-conns", "4", "--idle-time", "0.2"]  # fmt: skip


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


LOOPS = ["asyncio", "uvloop"]  # uvloop is a test dependency (make test installs it)


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
    tests = {c["test"] for c in doc["cases"]}
    assert tests == {"stream", "msgrate", "pingpong", "connrate", "idle"}
    assert {c["client"].get("provider") for c in doc["cases"]} == {"shm"}, text
    assert {c["server"].get("provider") for c in doc["cases"]} == {"shm"}, text
    assert doc["env"]["rsock_providers_used"] == ["shm"]
    assert doc["env"]["rsock_provider_env"] is None
    assert "rsock provider=shm" in text and "WARNING" not in text


def test_msgrate_and_connrate(tmp_path: Path) -> None:
    rc, text, doc = bench(tmp_path, "--transport", "rsock,tcp,unix", "--tests", "msgrate,connrate")
    assert rc == 0, text
    assert "msgrate 64 B [sync]  msg/s" in text and "connrate [sync]  conn/s" in text
    assert "msgrate 64 B [asyncio/" in text and "connrate [asyncio/" in text
    cases = [(c["api"], c["test"], c["transport"], c["status"]) for c in doc["cases"]]
    ts = ("rsock", "tcp", "unix")
    assert cases == [
        *[("sync", "msgrate", t, "ok") for t in ts],
        *[("sync", "connrate", t, "ok") for t in ts],
        *[("asyncio", "msgrate", t, "ok") for t in ts],
        *[("asyncio", "connrate", t, "ok") for t in ts],
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
    doc = json.loads(out.read_text())
    cases = [(c["test"], c["size"], c["status"]) for c in doc["cases"]]
    sizes = [64, 256, 1 << 10, 4 << 10, 16 << 10, 64 << 10, 256 << 10, 1 << 20, 4 << 20, 8 << 20]
    assert cases == [*(("stream", n, "ok") for n in sizes), *(("pingpong", n, "ok") for n in sizes)]
    assert "stream 8 MiB [sync]" in proc.stdout and "stream 64 B [sync]" in proc.stdout
    assert "pingpong 8 MiB [sync]" in proc.stdout and "pingpong 256 B [sync]" in proc.stdout
    # ping-pong rounds are bounded by volume (--quick: 32 MiB / size, at least 20)
    rtts = {c["size"]: len(c["client"]["rtt_ns"]) for c in doc["cases"] if c["test"] == "pingpong"}
    assert rtts[64] == rtts[64 << 10] == 200  # TINY's --rounds
    assert (rtts[1 << 20], rtts[4 << 20], rtts[8 << 20]) == (32, 20, 20)


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


@pytest.mark.parametrize("api", ["sync", "asyncio"])
def test_transports_take_turns(tmp_path: Path, api: str) -> None:
    """Interleaved (the default): the stream and msgrate phases of the
    transports of one size alternate and never overlap in time; with
    --sequential each case's phases come in one block."""
    args = ["--transport", "rsock,tcp,unix", "--tests", "stream,msgrate", "--api", api]
    for extra, interleaved in (([], True), (["--sequential"], False)):
        rc, text, doc = bench(tmp_path, *args, "--reps", "2", *extra)
        assert rc == 0, text
        assert doc["config"]["interleave"] is interleaved
        assert ("(interleaved)" in text) is interleaved
        for test in ("stream", "msgrate"):
            spans = sorted(
                (*ph["mono_ns"], c["transport"])
                for c in doc["cases"]
                if c["test"] == test
                for ph in c["client"]["phases"]
            )
            order = [t for _, _, t in spans]
            assert len(order) == 3 * 4  # warm-up, calibration, 2 reps each
            for (_, end, _), (start, _, _) in zip(spans, spans[1:], strict=False):
                assert end <= start, spans  # one transport moves data at a time
            if interleaved:
                assert order == ["rsock", "tcp", "unix"] * 4, order
            else:
                assert order == ["rsock"] * 4 + ["tcp"] * 4 + ["unix"] * 4, order


def test_hung_client_in_a_group_times_out(tmp_path: Path) -> None:
    """A client that never takes its turn fails its own case by the timeout
    and the group's other cases still end (here all hang: all time out)."""
    rc, text, doc = bench(
        tmp_path, "--transport", "tcp,unix", "--tests", "stream", "--api", "sync",
        "--fault", "hang", "--timeout", "1",
    )  # fmt: skip
    assert rc == 1, text
    assert [(c["transport"], c["status"]) for c in doc["cases"]] == [
        ("tcp", "timeout"),
        ("unix", "timeout"),
    ]


def test_hung_peer_times_out_and_others_still_run(tmp_path: Path) -> None:
    rc, text, doc = bench(
        tmp_path, "--transport", "tcp", "--tests", "pingpong", "--fault", "hang", "--timeout", "2"
    )
    assert rc == 1, text
    assert [(c["api"], c["status"]) for c in doc["cases"]] == [
        ("sync", "timeout"),
        ("asyncio", "timeout"),
    ]


# --------------------------------------------------------------------------- new options


def run_raw(
    args: list[str], env: dict[str, str] | None = None, timeout: float = 50
) -> subprocess.CompletedProcess[str]:
    """Run the bench; stdout and stderr decoded as they are (a \r stays a \r)."""
    proc = subprocess.run(
        [sys.executable, "-m", "rsock.bench", *args],
        cwd=ROOT, capture_output=True, timeout=timeout, check=False, env=env,
    )  # fmt: skip
    return subprocess.CompletedProcess(
        proc.args, proc.returncode, proc.stdout.decode(), proc.stderr.decode()
    )


PING_ONLY = [*TINY, "--transport", "tcp", "--api", "sync", "--tests", "pingpong"]


@pytest.mark.parametrize("style", ["text", "log", "off", "tqdm", "rich"])
def test_progress_goes_to_stderr_only(style: str) -> None:
    proc = run_raw([*PING_ONLY, "--ping-sizes", "64,128", "--progress", style])
    if style in ("tqdm", "rich") and importlib.util.find_spec(style) is None:
        assert proc.returncode == 2
        assert f"--progress {style}: {style} is not importable" in proc.stderr
        return
    assert proc.returncode == 0, proc.stderr
    out, err = proc.stdout, proc.stderr
    assert out.startswith("env: ") and "pingpong 128 B [sync]" in out
    assert "\r" not in out and "[1/2]" not in out and "total " not in out  # nothing leaks
    if style == "off":
        assert err == ""
        return
    assert "[1/2] tcp pingpong 64 B [sync] ... RTT p50" in err
    assert "[2/2] tcp pingpong 128 B [sync] ... RTT p50" in err and "total " in err
    if style == "log":
        assert "\r" not in err
    elif style == "text":
        assert "\r[1/2   0%] tcp pingpong 64 B [sync]" in err
        assert "\r[2/2  50%] tcp pingpong 128 B [sync]" in err
    elif style == "tqdm":
        assert "/2 [" in err and "\r" in err  # tqdm's bar: n/total [elapsed<remaining]


def test_progress_auto_on_a_terminal() -> None:
    """On a terminal, auto draws a bar (tqdm/rich when importable, else the \\r text)."""
    master, slave = pty.openpty()
    chunks: list[bytes] = []

    def drain() -> None:
        while True:
            try:
                data = os.read(master, 65536)
            except OSError:  # EIO: the slave side is closed
                return
            if not data:
                return
            chunks.append(data)

    reader = threading.Thread(target=drain, daemon=True)
    reader.start()
    try:
        proc = subprocess.run(
            [sys.executable, "-m", "rsock.bench", *PING_ONLY],
            cwd=ROOT, stdout=subprocess.PIPE, stderr=slave, text=True, timeout=50, check=False,
        )  # fmt: skip
    finally:
        os.close(slave)
    reader.join(10)
    os.close(master)
    err = b"".join(chunks).decode(errors="replace")
    assert proc.returncode == 0, err
    assert "\r" not in proc.stdout and proc.stdout.startswith("env: ")
    assert "\r" in err, err  # a bar or status line, redrawn in place
    assert "[1/1] tcp pingpong 64 B [sync] ... RTT p50" in err


def test_plot(tmp_path: Path) -> None:
    """--plot draws with matplotlib when it is installed, else fails at once, clearly."""
    png = tmp_path / "bench.png"
    args = [*TINY, "--transport", "tcp,unix", "--api", "sync", "--tests", "stream,pingpong",
            "--sizes", "4K,64K", "--ping-sizes", "64,4K", "--plot", str(png)]  # fmt: skip
    proc = run_raw(args)
    if importlib.util.find_spec("matplotlib") is None:
        assert proc.returncode == 2, proc.stderr
        assert "--plot needs matplotlib, which is not installed" in proc.stderr
        assert "pip install 'rsock[bench]'" in proc.stderr
        assert proc.stdout == "" and not png.exists()  # refused before running anything
        return
    assert proc.returncode == 0, proc.stderr
    assert f"plot written to {png}" in proc.stderr
    data = png.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n" and len(data) > 20000
    width, height = struct.unpack(">II", data[16:24])
    assert width > 1000 and height > 400


def test_plot_needs_stream_or_pingpong(tmp_path: Path) -> None:
    proc = run_raw([*TINY, "--tests", "connrate", "--plot", str(tmp_path / "x.png")])
    assert proc.returncode == 2
    assert "--plot" in proc.stderr


def test_ping_sizes(tmp_path: Path) -> None:
    rc, text, doc = bench(
        tmp_path, "--transport", "tcp", "--api", "sync", "--tests", "pingpong",
        "--ping-sizes", "64,1M",
    )  # fmt: skip
    assert rc == 0, text
    sizes = [(c["test"], c["size"]) for c in doc["cases"]]
    assert sizes == [("pingpong", 64), ("pingpong", 1 << 20)]
    small, big = doc["cases"]
    assert len(small["client"]["rtt_ns"]) == 200  # --rounds
    assert len(big["client"]["rtt_ns"]) == 32  # capped: 32 MiB (--quick) / 1 MiB
    assert [p["count"] for p in big["client"]["phases"]] == [5, 32]  # warm-up, timed
    assert "pingpong 1 MiB [sync]  RTT p50" in text
    assert "64 B: 200 after 20, 1 MiB: 32 after 5" in text
    assert doc["config"]["ping_sizes"] == [64, 1 << 20]


def counter_line(text: str, after: str) -> str:
    """The line of the table that follows the rows of the case whose label is ``after``."""
    lines = text.splitlines()
    i = next(k for k, ln in enumerate(lines) if ln.startswith(after))
    return next(ln for ln in lines[i + 1 :] if not ln.startswith("  ") or "counters" in ln)


def test_rsock_counters(tmp_path: Path) -> None:
    rc, text, doc = bench(
        tmp_path, "--transport", "rsock,tcp", "--api", "sync", "--tests", "stream,pingpong,idle"
    )
    assert rc == 0, text
    line = counter_line(text, "stream 64 KiB [sync]")
    assert line.startswith("  rsock counters per MB: client stalls ") and "; server stalls" in line
    assert "arms " in line and "notifies " in line and "spins/sleeps " in line
    line = counter_line(text, "pingpong 64 B [sync]")
    assert line.startswith("  rsock counters per msg: client stalls ")
    line = counter_line(text, "idle 4 conns [sync]")
    assert line == "  rsock counters idle window: all 0 on both sides (no messages, arms, wake-ups)"
    for c in doc["cases"]:
        if c["transport"] != "rsock":
            assert "counters" not in c["summary"]
            continue
        ctr = c["summary"]["counters"]
        assert set(ctr) == {"client", "server"}
        if c["test"] == "stream":
            cs, ss = c["client"]["stats"], c["server"]["stats"]
            assert cs["tx_bytes"] == ss["rx_bytes"] > 1 << 20 and cs["tx_msgs"] == ss["rx_msgs"]
            assert ctr["client"]["per"] == "MB"
            assert ctr["client"]["amount"] == pytest.approx(cs["tx_bytes"] / 1e6)
            assert ctr["client"]["arms"] == pytest.approx(cs["arms"] / (cs["tx_bytes"] / 1e6))
        elif c["test"] == "pingpong":
            cs = c["client"]["stats"]
            assert cs["tx_msgs"] >= 220 and ctr["client"]["per"] == "msg"  # 200 + 20 warm-up
            assert ctr["server"]["notifies_sent"] == pytest.approx(
                c["server"]["stats"]["notifies_sent"] / ctr["server"]["amount"]
            )
        else:
            assert ctr["client"]["per"] == "window"
            assert all(v == 0 for k, v in c["client"]["idle_counters"].items())


@pytest.mark.parametrize("mode,spin_us", [("event", 0), ("spin", 1_000_000), ("adaptive", 500)])
def test_mode(tmp_path: Path, mode: str, spin_us: int) -> None:
    rc, text, doc = bench(
        tmp_path, "--transport", "rsock", "--api", "sync", "--tests", "pingpong", "--mode", mode
    )
    assert rc == 0, text
    assert doc["env"]["mode"] == mode and doc["config"]["mode"] == mode
    assert text.count(f"test [{mode}]") == 1 and f"mode={mode} (RSOCK_SPIN_US" in text
    (case,) = doc["cases"]
    stats = [case[side]["stats"] for side in ("client", "server")]
    for side in ("client", "server"):  # both workers got it
        assert case[side]["rsock_opts"]["spin_us"] == spin_us, case[side]
    sleeps = sum(st["sleeps"] for st in stats)
    if mode == "event":  # never spins: every wait that is not already over arms and sleeps
        assert [st["spins"] for st in stats] == [0, 0], stats
        assert sleeps >= 100, stats  # 220 round trips: at least one side waits on most
    elif mode == "spin":  # 1 s of spinning covers every wait of a ping-pong
        assert sleeps <= 4 and sum(st["arms"] for st in stats) <= 4, stats


def test_mode_from_environment(tmp_path: Path) -> None:
    env = {**os.environ, "RSOCK_SPIN_US": "7"}
    out = tmp_path / "b.json"
    proc = run_raw(
        [*TINY, "--transport", "rsock", "--api", "sync", "--tests", "pingpong", "--json", str(out)],
        env=env,
    )
    assert proc.returncode == 0, proc.stderr
    doc = json.loads(out.read_text())
    assert doc["env"]["mode"] == "env" and doc["env"]["spin_us"] == "7"
    assert doc["cases"][0]["server"]["rsock_opts"]["spin_us"] == 7
    assert "mode=RSOCK_SPIN_US=7 RSOCK_LOOP_POLL_US=None (from the environment)" in proc.stdout
    # an explicit --mode wins over the environment, for both workers
    proc = run_raw(
        [*TINY, "--transport", "rsock", "--api", "sync", "--tests", "pingpong", "--json", str(out),
         "--mode", "event"], env=env,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    doc = json.loads(out.read_text())
    assert [doc["cases"][0][s]["rsock_opts"]["spin_us"] for s in ("client", "server")] == [0, 0]


@pytest.mark.parametrize("mode", ["spin", "adaptive"])
def test_idle(tmp_path: Path, mode: str) -> None:
    rc, text, doc = bench(
        tmp_path, "--transport", "rsock,tcp", "--tests", "idle", "--idle-conns", "12",
        "--idle-time", "0.5", "--mode", mode,
    )  # fmt: skip
    assert rc == 0, text
    assert [(c["api"], c["test"], c["transport"]) for c in doc["cases"]] == [
        ("sync", "idle", "rsock"),
        ("sync", "idle", "tcp"),
    ]  # sync api only
    assert "idle 12 conns [sync]  cpu client" in text and "wake-ups (both sides)" in text
    for c in doc["cases"]:
        s = c["summary"]
        assert s["connections"] == c["server"]["connections"] == 12
        assert s["wakeups"] == 0
        for side in ("client", "server"):
            r = c[side]
            assert 0.3e9 <= r["idle_ns"] <= 0.5e9 + 0.4e9  # measured from the wake-up
            # nothing may spin while idle (even in spin mode: nobody waits in the engine);
            # a spinning process would show ~10^6 µs/s, the wake-up at the end ~10^2
            assert s[f"{side}_cpu_us_per_s"] < 50_000, (side, s)
        if c["transport"] == "rsock":
            assert c["client"]["provider"] == "shm"
            for side in ("client", "server"):
                assert set(c[side]["idle_counters"].values()) == {0}, c[side]["idle_counters"]


def test_provider_label_and_record(tmp_path: Path) -> None:
    """RSOCK_PROVIDER=verbs: labelled rsock(verbs); recorded; whatever the host can do."""
    env = {**os.environ, "RSOCK_PROVIDER": "verbs"}
    out = tmp_path / "b.json"
    proc = run_raw(
        [*TINY, "--transport", "rsock,tcp", "--api", "sync", "--tests", "pingpong",
         "--timeout", "20", "--json", str(out)], env=env,
    )  # fmt: skip
    doc = json.loads(out.read_text())
    assert doc["env"]["rsock_provider_env"] == "verbs"
    assert doc["env"]["rsock_env"]["RSOCK_PROVIDER"] == "verbs"
    header = proc.stdout.splitlines()[2].split()
    assert header[:4] == ["test", "[adaptive]", "rsock(verbs)", "tcp"], proc.stdout
    assert "rsock(verbs) vs tcp" in proc.stdout
    rsock_case = doc["cases"][0]
    assert rsock_case["label"] == "rsock(verbs)" and rsock_case["transport"] == "rsock"
    if rsock_case["status"] == "ok":  # a host with an RDMA device (or rxe)
        used = doc["env"]["rsock_providers_used"]
        assert used == ["verbs"] or "WARNING: rsock(verbs) asks for provider verbs" in proc.stdout
    else:  # no RDMA device here: the case fails and says why, the others still run
        assert proc.returncode == 1
        assert "FAILED rsock(verbs) pingpong 64 B [sync]" in proc.stdout
        assert doc["cases"][1]["status"] == "ok"


def test_each_provider_in_one_run(tmp_path: Path) -> None:
    """rsock:shm and rsock:verbs side by side in one run: a column and a ratio
    column each, every worker told its provider; verbs works where a device
    is (the guest), else its cases fail and say why and the rest still run."""
    out = tmp_path / "b.json"
    env = {k: v for k, v in os.environ.items() if k != "RSOCK_PROVIDER"}
    proc = run_raw(
        [*TINY, "--transport", "rsock:shm,rsock:verbs,tcp", "--api", "sync", "--tests",
         "pingpong", "--timeout", "20", "--json", str(out)], env=env,
    )  # fmt: skip
    doc = json.loads(out.read_text())
    header = proc.stdout.splitlines()[2]
    assert header.split()[:5] == ["test", "[adaptive]", "rsock(shm)", "rsock(verbs)", "tcp"]
    assert "rsock(shm) vs tcp" in header and "rsock(verbs) vs tcp" in header
    by = {c["label"]: c for c in doc["cases"]}
    assert by["rsock(shm)"]["status"] == "ok" and by["tcp"]["status"] == "ok", proc.stdout
    assert by["rsock(shm)"]["client"]["provider"] == "shm"
    assert by["rsock(shm)"]["transport"] == "rsock:shm"
    verbs = by["rsock(verbs)"]
    if verbs["status"] == "ok":
        assert verbs["client"]["provider"] == "verbs", proc.stdout
    else:
        assert proc.returncode == 1
        assert "FAILED rsock(verbs) pingpong 64 B [sync]" in proc.stdout
    assert "WARNING" not in proc.stdout


def test_ucxx_reference(tmp_path: Path) -> None:
    """ucxx is optional: a ping-pong when importable, else one clear error."""
    args = ["--transport", "ucxx,tcp", "--api", "asyncio", "--tests", "pingpong"]
    if importlib.util.find_spec("ucxx") is None:
        proc = run_raw([*TINY, *args])
        assert proc.returncode == 2 and proc.stdout == ""
        assert "--transport ucxx: the ucxx package" in proc.stderr
        assert proc.stderr.count("error:") == 1
        return
    rc, text, doc = bench(tmp_path, *args)
    assert rc == 0, text
    assert [c["transport"] for c in doc["cases"]] == ["ucxx", "tcp"]
    assert len(doc["cases"][0]["client"]["rtt_ns"]) == 200


def test_options_in_process(monkeypatch: pytest.MonkeyPatch) -> None:
    from rsock import bench as rb

    monkeypatch.delenv("RSOCK_SPIN_US", raising=False)
    monkeypatch.delenv("RSOCK_LOOP_POLL_US", raising=False)
    monkeypatch.delenv("RSOCK_PROVIDER", raising=False)
    o = rb.parse_options(["--pin", "none"])
    assert o.tests == ["stream", "msgrate", "pingpong", "connrate", "idle"]
    assert (o.idle_conns, o.idle_time, o.ping_sizes, o.mode, o.spin_us) == (
        100, 2.0, [64], "adaptive", None
    )  # fmt: skip
    assert o.transports == ["rsock", "tcp", *(["ucxx"] if importlib.util.find_spec("ucxx") else [])]
    q = rb.parse_options(["--quick", "--pin", "none", "--sweep", "--mode", "spin"])
    assert (q.idle_conns, q.idle_time, q.ping_sizes, q.spin_us) == (20, 1.0, rb.SWEEP_SIZES, 10**6)
    assert rb.ping_rounds(q, 64) == (2000, 200) and rb.ping_rounds(q, 8 << 20) == (20, 5)
    assert rb.ping_rounds(o, 1 << 20) == (256, 25)  # 256 MiB budget
    assert rb.worker_env(q)["RSOCK_SPIN_US"] == "1000000"
    assert rb.worker_env(q)["RSOCK_LOOP_POLL_US"] == "1000000"
    e = rb.parse_options(["--pin", "none", "--mode", "event", "--ping-sizes", "1K,2K"])
    assert e.ping_sizes == [1024, 2048] and rb.worker_env(e)["RSOCK_SPIN_US"] == "0"
    assert rb.worker_env(e)["RSOCK_LOOP_POLL_US"] == "0"
    monkeypatch.setenv("RSOCK_SPIN_US", "5")
    monkeypatch.setenv("RSOCK_LOOP_POLL_US", "6")
    a = rb.parse_options(["--pin", "none", "--mode", "adaptive"])
    assert "RSOCK_SPIN_US" not in rb.worker_env(a)  # the defaults
    assert "RSOCK_LOOP_POLL_US" not in rb.worker_env(a)
    assert rb.parse_options(["--pin", "none"]).mode == "env"
    monkeypatch.delenv("RSOCK_SPIN_US")
    assert rb.parse_options(["--pin", "none"]).mode == "env"  # RSOCK_LOOP_POLL_US alone
    monkeypatch.delenv("RSOCK_LOOP_POLL_US")
    monkeypatch.setenv("RSOCK_PROVIDER", "verbs")
    v = rb.parse_options(["--pin", "none"])
    assert rb.transport_label(v, "rsock") == "rsock(verbs)"
    assert rb.transport_label(v, "tcp") == "tcp"
    for bad in (["--idle-conns", "0"], ["--idle-time", "0"], ["--ping-sizes", ","]):
        with pytest.raises(SystemExit):
            rb.parse_options(["--pin", "none", *bad])


def test_sampled_check_sees_what_it_samples() -> None:
    """The server's sampled check (one BLOCK-byte block that moves per
    message), both as ``check`` and as the sync server's inlined loop
    ``recv_checked``, passes the right messages, in any window, and fails a
    message with one wrong byte at a sampled offset or a message of the wrong
    window; over nblk messages the blocks cover every byte offset."""
    sys.path.insert(0, str(ROOT))
    from rsock.bench._worker import NWIN, StreamChecker

    class Feed:
        """recv_into from a list of messages, in pieces of at most ``cut`` bytes."""

        def __init__(self, msgs: list[bytes], cut: int) -> None:
            self.data, self.pos, self.cut = b"".join(msgs), 0, cut

        def recv_into(self, view: memoryview, n: int = 0) -> int:
            n = min(n or len(view), self.cut, len(self.data) - self.pos)
            view[:n] = self.data[self.pos : self.pos + n]
            self.pos += n
            return n

    for size in (65536, 100_000, 300):
        chk = StreamChecker(size)
        chk.begin(0, 3 * NWIN)
        assert sorted(chk.offs) == sorted({chk.blk_off(b) for b in range(chk.nblk)})
        covered = bytearray(size)
        for off in chk.offs:
            covered[off : off + chk.blk] = b"\x01" * chk.blk
        assert covered == b"\x01" * size
        rbuf = bytearray(size)
        for seq in range(3 * NWIN):
            good = bytearray(chk.wins[seq % NWIN])
            bad = bytearray(good)
            off = chk.offs[seq % chk.nblk] + [0, chk.blk - 1, seq % chk.blk][seq % 3]
            bad[off] ^= 0x40
            wrong = bytearray(chk.wins[(seq + 1) % NWIN])
            for buf, ok in ((good, True), (bad, False), (wrong, False)):
                chk.seq, chk.nbad = seq, 0
                chk.check(buf, memoryview(buf))
                assert chk.nbad == (0 if ok else 1), (size, seq, ok, off)
                assert chk.seq == seq + 1
                # the same message through the inlined loop, between two good
                # ones, read whole or in pieces
                msgs = [
                    bytes(chk.wins[(seq - 1) % NWIN]),
                    bytes(buf),
                    bytes(chk.wins[(seq + 1) % NWIN]),
                ]
                for cut in (size, 4096):
                    chk.seq, chk.nbad, chk.first_bad_seq = seq - 1, 0, -1
                    chk.recv_checked(Feed(msgs, cut), rbuf, memoryview(rbuf), 3)  # type: ignore[arg-type]
                    assert chk.nbad == (0 if ok else 1), (size, seq, ok, off, cut)
                    assert chk.first_bad_seq == (-1 if ok else seq)
                    assert chk.seq == seq + 2


def test_bulk_check_sees_every_byte() -> None:
    """msgrate's bulk check: the stream cut into chunks anywhere (across
    message and period boundaries) passes; one flipped byte anywhere fails
    exactly the message it is in, at its offset."""
    sys.path.insert(0, str(ROOT))
    from rsock.bench._worker import NWIN, StreamChecker

    size, nmsg = 64, 3 * NWIN + 5
    ref = StreamChecker(size)
    stream = b"".join(bytes(ref.wins[k % NWIN]) for k in range(nmsg))
    rnd = random.Random(7)
    for flip in (-1, 0, 1, 63, 64, 1000, len(stream) - 1):
        data = bytearray(stream)
        if flip >= 0:
            data[flip] ^= 0x01
        chk = StreamChecker(size)
        chk.bulk_init(4096)
        chk.begin(0, nmsg)
        pos = 0
        while pos < len(data):
            n = min(rnd.randint(1, 4096), len(data) - pos)
            buf = bytearray(4096)
            buf[:n] = data[pos : pos + n]
            chk.check_bulk(buf, n)
            pos += n
        assert chk.seq == nmsg and chk.part == 0
        if flip < 0:
            assert chk.nbad == 0
        else:
            assert (chk.nbad, chk.first_bad_seq, chk.first_bad_off) == (
                1,
                flip // size,
                flip % size,
            ), flip


# --------------------------------------------------------------------------- the rate test


def rate_module() -> Any:
    sys.path.insert(0, str(ROOT))
    from rsock.bench import _rate

    return _rate


def test_rate_schedule_and_backlog_latency() -> None:
    """Request i is due at start + i * period; the sender sends what a timer
    expiry makes due (late ones at once, each keeping its scheduled time); a
    reply's latency is taken from its scheduled time, so replies that all come
    back late, at once, carry the backlog: the earliest-scheduled the most."""
    r = rate_module()
    assert r.period_ns(200) == 5_000_000 and r.period_ns(20000) == 50_000
    assert r.period_ns(3) == 333_333_333  # whole nanoseconds
    sched = r.Schedule(1_000_000, r.period_ns(1000))  # 1 ms period
    assert [sched.at(i) for i in range(4)] == [1_000_000, 2_000_000, 3_000_000, 4_000_000]

    sender = r.Sender(sched, 6)
    assert list(sender.due(1, 1_000_010)) == [0]  # on time (10 ns late)
    assert list(sender.due(0, 1_500_000)) == []  # nothing new is due
    assert list(sender.due(3, 4_000_500)) == [1, 2, 3]  # woke 3 periods late: all at once
    assert list(sender.due(5, 9_000_000)) == [4, 5]  # never more than the phase's count
    assert sender.done and list(sender.due(1, 10_000_000)) == []
    assert list(sender.lag) == [10, 2_000_500, 1_000_500, 500, 4_000_000, 3_000_000]

    replies = r.Replies(sched, 6, 100)  # the phase's first message is number 100
    wire = b"".join(r.message(100 + i) for i in range(6))
    assert len(wire) == 6 * r.SIZE and r.message(7)[:8] == struct.pack("<Q", 7)

    def feed(data: bytes, t: int) -> None:
        space = replies.space()
        assert len(space) >= len(data)
        space[: len(data)] = data
        replies.take(len(data), t)

    feed(wire[:64], 1_000_040)  # message 0: 40 ns after its schedule
    feed(wire[64:100], 2_000_100)  # half of message 1: nothing complete yet
    assert replies.got == 1 and replies.have == 36
    feed(wire[100:], 7_000_000)  # the other five arrive together, at 7 ms
    assert replies.done and replies.nbad == 0 and replies.have == 0
    assert list(replies.lat) == [40, 5_000_000, 4_000_000, 3_000_000, 2_000_000, 1_000_000]
    assert (replies.t_first, replies.t_last) == (1_000_040, 7_000_000)
    assert len(replies.space()) == 0  # the phase is owed nothing more

    bad = r.Replies(sched, 3, 100)  # an echo out of order and one with a wrong byte
    data = bytearray(r.message(101) + r.message(100) + r.message(102))
    data[-1] ^= 1
    bad.buf[: len(data)] = data
    bad.take(len(data), 5_000_000)
    assert (bad.got, bad.nbad, bad.first_bad) == (3, 3, 100)


def test_rate_timer_counts_expirations() -> None:
    """The periodic timerfd: armed in the past, a read returns every period
    since the start; armed in the future, a non-blocking read returns 0."""
    import time

    r = rate_module()
    timer = r.Timer(nonblocking=True)
    try:
        timer.arm(time.monotonic_ns() + 10**9, 10**6)
        assert timer.read() == 0
        timer.arm(time.monotonic_ns() - 10 * 10**6, 10**6)  # 10 periods ago
        assert timer.read() >= 11  # at the start and at each of the 10 periods since
    finally:
        timer.close()


def test_rate_percentiles_cpu_and_summary_arithmetic() -> None:
    r = rate_module()
    values = [float(x) for x in range(1, 1001)]  # 1..1000
    assert r.percentile(values, 50) == 500 and r.percentile(values, 99) == 990
    assert r.percentile(values, 99.9) == 999 and r.percentile(values, 100) == 1000
    assert r.percentile(values, 0) == 1 and r.percentile([7.0], 99.9) == 7
    assert r.percentile([1.0, 2.0, 3.0, 4.0], 50) == 2  # nearest rank, not interpolated
    with pytest.raises(ValueError):
        r.percentile([], 50)
    assert r.cpu_us_per_msg(0.5, 1000) == pytest.approx(500.0)
    assert r.cpu_us_per_msg(0.0, 0) == 0.0

    client = {
        "rate_target": 1000.0,
        "phases": [
            {"kind": "warmup", "count": 50, "ns": 5e7, "cpu_s": 9.0, "reply_span_ns": 1},
            {"kind": "rep", "count": 101, "ns": 101e6, "cpu_s": 0.0101, "reply_span_ns": 100e6},
            {"kind": "rep", "count": 101, "ns": 102e6, "cpu_s": 0.0303, "reply_span_ns": 100e6},
        ],
        # 202 latencies: 1..202 µs; the sender's lag 0..201 µs
        "lat_ns": [1000 * (i + 1) for i in range(202)],
        "lag_ns": [1000 * i for i in range(202)],
    }
    server = {
        "phases": [
            {"count": 50, "ns": 5e7, "cpu_s": 5.0},
            {"count": 101, "ns": 1e8, "cpu_s": 0.0202},
            {"count": 101, "ns": 1e8, "cpu_s": 0.0},
        ]
    }
    s = r.summarize(client, server)
    assert s["messages"] == 202 and s["target_per_s"] == 1000.0
    assert s["achieved_per_s"] == pytest.approx(1000.0)  # 200 gaps in 200 ms
    assert (s["lat_us_p50"], s["lat_us_p99"], s["lat_us_p99_9"]) == (101, 200, 202)
    assert (s["lat_us_min"], s["lat_us_max"]) == (1, 202)
    assert s["lat_us_mean"] == pytest.approx(101.5)
    assert s["send_lag_us_p50"] == 100 and s["send_lag_us_max"] == 201
    # warm-up excluded: (0.0101 + 0.0303) s / 202 messages = 200 µs; server 100 µs
    assert s["client_cpu_us_per_msg"] == pytest.approx(200.0)
    assert s["server_cpu_us_per_msg"] == pytest.approx(100.0)
    assert s["cpu_us_per_msg"] == pytest.approx(300.0)
    assert s["window_s"] == pytest.approx(0.203)

    fell_behind = {**client, "phases": [dict(p) for p in client["phases"]]}
    fell_behind["phases"][2]["reply_span_ns"] = 300e6  # the second phase's replies: 3x slower
    assert r.summarize(fell_behind, server)["achieved_per_s"] == pytest.approx(500.0)

    half = {**s, "client_cpu_us_per_msg": 100.0, "lat_us_p50": 202.0, "lat_us_p99": 0.0}
    ratio = r.ratios(half, s)
    assert ratio["client_cpu_ratio"] == pytest.approx(0.5) and ratio["p50_ratio"] == 2.0
    assert ratio["p99_ratio"] == 0.0 and ratio["cpu_ratio"] == 1.0
    assert r.ratios(s, {**s, "lat_us_p50": 0.0})["p50_ratio"] is None

    with pytest.raises(ValueError, match="phases"):
        r.summarize(client, {"phases": server["phases"][:2]})
    with pytest.raises(ValueError, match="echoed"):
        short = {"phases": [*server["phases"][:2], {"count": 100, "ns": 1, "cpu_s": 0.0}]}
        r.summarize(client, short)


def test_rate_fractions_of_the_tcp_maximum(monkeypatch: pytest.MonkeyPatch) -> None:
    """--rate-frac takes fractions of TCP's closed-loop round trips/s on the
    same api, from this run's TCP 64 B ping-pong case when there is one."""
    from rsock import bench as rb

    r = rate_module()
    monkeypatch.delenv("RSOCK_PROVIDER", raising=False)
    pong = {"phases": [{"kind": "warmup", "count": 10, "ns": 1}, {"kind": "rep", "count": 20000,
            "ns": 1_600_000_000}]}  # fmt: skip
    assert r.closed_loop_rate(pong) == pytest.approx(12500.0)  # 20000 RTs in 1.6 s
    assert r.frac_rates(12500.0, [0.1, 0.5, 0.9]) == pytest.approx([1250.0, 6250.0, 11250.0])
    with pytest.raises(ValueError):
        r.frac_rates(0.0, [0.5])
    assert r.phase_plan(1000, 2.0) == [("warmup", 250), ("rep", 1000), ("rep", 1000)]
    assert r.phase_plan(200, 0.05) == [("warmup", 20), ("rep", 5), ("rep", 5)]

    o = rb.parse_options(["--tests", "rate"])
    assert (o.rates, o.rate_fracs, o.rate_time, o.pin, o.cpus) == (
        [200.0, 2000.0, 20000.0], [0.1, 0.5, 0.9], 2.0, "none", (-1, -1)
    )  # fmt: skip
    q = rb.parse_options(["--tests", "rate", "--quick", "--rate-frac", "10%,0.5"])
    assert (q.rates, q.rate_fracs, q.rate_time) == ([], [0.1, 0.5], 0.5)
    f = rb.parse_options(["--tests", "rate", "--rate", "300,2k", "--rep-time", "3"])
    assert (f.rates, f.rate_fracs, f.rate_time, f.rep_time) == ([300.0, 2000.0], [], 3.0, 3.0)
    for bad in (["--rate", "100"], ["--tests", "rate", "--rate", "0"],
                ["--tests", "rate", "--rate-frac", "x"], ["--tests", "rate", "--rate", "",
                "--rate-frac", "none"]):  # fmt: skip
        with pytest.raises(SystemExit):
            rb.parse_options(bad)

    opts = rb.parse_options(["--tests", "rate", "--rate", "500", "--rate-frac", "0.25,0.5"])
    assert rb.rate_points(opts) == [(500.0, None), (0.0, 0.25), (0.0, 0.5)]
    tcp = rb.Case("tcp", "pingpong", 64, "sync", status="ok", client=pong,
                  summary={"rtt_us_p50": 75.0})  # fmt: skip
    batch = [rb.new_case(opts, t, "sync", "rate", 2) for t in ("rsock", "tcp")]
    probes: dict[str, Any] = {}
    rb.resolve_rates(opts, batch, [tcp], probes, None)  # type: ignore[arg-type]
    assert probes["sync"]["source"] == "pingpong case"  # found: no probe run (no bar needed)
    assert [(c.rate, c.rate_frac, c.tcp_max) for c in batch] == [(6250.0, 0.5, 12500.0)] * 2
    assert batch[0].name == "rsock rate 50% tcp max = 6250/s [sync]"
    fixed = rb.new_case(opts, "tcp", "sync", "rate", 0)
    assert (fixed.rate, fixed.rate_frac, fixed.size, fixed.slot) == (500.0, None, 64, 0)
    probes = {"sync": {"msg_per_s": None, "error": "timeout: no"}}  # the probe failed
    lost = [rb.new_case(opts, "tcp", "sync", "rate", 1)]
    rb.resolve_rates(opts, lost, [], probes, None)  # type: ignore[arg-type]
    assert lost[0].status == "error" and "no TCP closed-loop maximum" in lost[0].error


@pytest.mark.timeout_s(120)
def test_rate_smoke_both_apis(tmp_path: Path) -> None:
    """The rate test end to end at the quickest settings: rows and JSON fields
    exist and are consistent (no timing targets)."""
    rc, text, doc = bench(
        tmp_path, "--transport", "rsock,tcp", "--tests", "rate", "--rate", "400",
        "--rate-frac", "0.2", "--rep-time", "0.1",
    )  # fmt: skip
    assert rc == 0, text
    for tag in ("sync", f"asyncio/{doc['env']['asyncio_loop']}"):
        assert f"rate 400/s [{tag}]  achieved msg/s" in text
        assert "rate 20% tcp max = " in text and f"/s [{tag}]  achieved msg/s" in text
    for row in ("latency p50", "latency p99", "latency p99.9", "send lag p50",
                "cpu client", "cpu server", "cpu both"):  # fmt: skip
        assert f"  {row} " in text, row
    assert "rate = 64 B requests sent on a fixed schedule" in text
    assert doc["config"]["rates"] == [400.0] and doc["config"]["rate_fracs"] == [0.2]
    assert doc["env"]["pin"] == "none"
    cases = [(c["api"], c["rate_point"]["index"], c["transport"], c["status"])
             for c in doc["cases"]]  # fmt: skip
    assert cases == [(api, i, t, "ok") for api in ("sync", "asyncio") for i in (0, 1)
                     for t in ("rsock", "tcp")]  # fmt: skip
    for api in ("sync", "asyncio"):
        found = doc["rate_tcp_max"][api]
        assert found["source"] == "probe" and found["msg_per_s"] > 0
        assert found["case"]["status"] == "ok" and found["case"]["transport"] == "tcp"
    for c in doc["cases"]:
        s, point, client = c["summary"], c["rate_point"], c["client"]
        if point["index"] == 0:
            assert point["target_per_s"] == 400.0 and point["frac_of_tcp_max"] is None
        else:
            tmax = doc["rate_tcp_max"][c["api"]]["msg_per_s"]
            assert point["tcp_max_per_s"] == tmax
            assert point["target_per_s"] == pytest.approx(0.2 * tmax)
        assert client["rate_target"] == pytest.approx(point["target_per_s"], rel=1e-3)
        assert [p["kind"] for p in client["phases"]] == ["warmup", "rep", "rep"]
        reps = [p for p in client["phases"] if p["kind"] == "rep"]
        n = sum(p["count"] for p in reps)
        assert s["messages"] == n == len(client["lat_ns"]) == len(client["lag_ns"]) > 0
        assert [p["count"] for p in c["server"]["phases"]] == [p["count"] for p in client["phases"]]
        assert all(x > 0 for x in client["lat_ns"])  # a reply never precedes its schedule
        assert 0 < s["lat_us_p50"] <= s["lat_us_p99"] <= s["lat_us_p99_9"] <= s["lat_us_max"]
        assert s["achieved_per_s"] > 0 and s["window_s"] > 0
        cpu = sum(p["cpu_s"] for p in reps) / n * 1e6
        assert s["client_cpu_us_per_msg"] == pytest.approx(cpu)
        assert s["cpu_us_per_msg"] == pytest.approx(
            s["client_cpu_us_per_msg"] + s["server_cpu_us_per_msg"]
        )
        if c["transport"] == "rsock":
            assert client["provider"] == "shm" and s["counters"]["client"]["per"] == "msg"
            ratio = s["vs_tcp"]
            tcp = next(
                x
                for x in doc["cases"]
                if (x["transport"], x["api"], x["rate_point"]["index"])
                == ("tcp", c["api"], point["index"])
            )
            assert ratio["cpu_ratio"] == pytest.approx(
                s["cpu_us_per_msg"] / tcp["summary"]["cpu_us_per_msg"]
            )
            assert ratio["p99_ratio"] == pytest.approx(
                s["lat_us_p99"] / tcp["summary"]["lat_us_p99"]
            )
        else:
            assert "vs_tcp" not in s
