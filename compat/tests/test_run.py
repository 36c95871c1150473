"""``python -m rsock run``: runs a program the way ``python`` would, patched."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

SHOW = """\
import json, os, socket, sys
import rsock
with socket.socket() as s:
    kind = "rsock" if isinstance(s, rsock.socket) else "stdlib"
main = sys.modules["__main__"]
print(json.dumps({
    "argv": sys.argv, "name": __name__, "path0": sys.path[0], "kind": kind,
    "file": globals().get("__file__"), "main_is_me": main.__dict__ is globals(),
}))
if len(sys.argv) > 1 and sys.argv[1] == "exit":
    sys.exit(int(sys.argv[2]))
if len(sys.argv) > 1 and sys.argv[1] == "raise":
    raise ValueError("from the program")
"""


def rsock_run(*args: str, cwd: Path, stdin: str | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "rsock", *args],
        cwd=cwd,
        input=stdin,
        capture_output=True,
        text=True,
        timeout=30,
    )


@pytest.fixture
def script(tmp_path: Path) -> Path:
    d = tmp_path / "scripts"
    d.mkdir()
    p = d / "show.py"
    p.write_text(SHOW)
    return p


def test_script(script: Path, tmp_path: Path) -> None:
    proc = rsock_run("run", str(script), "a", "-m", "--x", cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    info = json.loads(proc.stdout)
    assert info["argv"] == [str(script), "a", "-m", "--x"]
    assert info["name"] == "__main__" and info["main_is_me"]
    assert info["path0"] == str(script.parent)
    assert info["file"] == str(script)
    assert info["kind"] == "rsock"


def test_plain_python_is_the_oracle(script: Path, tmp_path: Path) -> None:
    proc = subprocess.run(
        [sys.executable, str(script), "a"],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=30,
    )
    info = json.loads(proc.stdout)
    assert info["kind"] == "stdlib" and info["path0"] == str(script.parent)


def test_module(script: Path, tmp_path: Path) -> None:
    pkg = tmp_path / "pkg"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("")
    (pkg / "show.py").write_text(SHOW)
    (pkg / "__main__.py").write_text(SHOW)
    proc = rsock_run("run", "-m", "pkg.show", "b", "c", cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    info = json.loads(proc.stdout)
    assert info["argv"] == [str(pkg / "show.py"), "b", "c"]
    assert info["name"] == "__main__" and info["main_is_me"]
    assert info["path0"] == str(tmp_path)
    assert info["kind"] == "rsock"
    proc = rsock_run("run", "-mpkg", cwd=tmp_path)  # a package runs its __main__
    assert json.loads(proc.stdout)["argv"] == [str(pkg / "__main__.py")]


def test_command_and_stdin(tmp_path: Path) -> None:
    proc = rsock_run("run", "-c", SHOW, "x", cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    info = json.loads(proc.stdout)
    assert info["argv"] == ["-c", "x"] and info["path0"] == "" and info["kind"] == "rsock"
    proc = rsock_run("run", "-", "y", cwd=tmp_path, stdin=SHOW)
    assert proc.returncode == 0, proc.stderr
    assert json.loads(proc.stdout)["argv"] == ["-", "y"]


@pytest.mark.parametrize(("args", "code"), [(["exit", "7"], 7), (["exit", "0"], 0), (["raise"], 1)])
def test_exit_status_is_the_programs(
    script: Path, tmp_path: Path, args: list[str], code: int
) -> None:
    proc = rsock_run("run", str(script), *args, cwd=tmp_path)
    oracle = subprocess.run(
        [sys.executable, str(script), *args],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert proc.returncode == oracle.returncode == code
    if code == 1:
        assert "ValueError: from the program" in proc.stderr


def test_report(tmp_path: Path) -> None:
    code = """
        import socket
        srv = socket.create_server(("127.0.0.1", 0))
        cli = socket.create_connection(srv.getsockname())
        conn, _ = srv.accept()
        u = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        for s in (cli, conn, srv, u):
            s.close()
    """
    report = tmp_path / "r.json"
    proc = rsock_run("run", "--report", str(report), "-c", textwrap.dedent(code), cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert json.loads(report.read_text()) == {
        "rsock": 2,
        "stdlib": 1,
        "connect:shm": 1,
        "accept:shm": 1,
    }


@pytest.mark.parametrize(
    ("args", "code", "message"),
    [
        (["run", "nonexistent.py"], 2, "can't open file"),
        (["run", "-m", "no_such_module_here"], 1, "No module named no_such_module_here"),
        (["run"], 2, "nothing to run"),
        (["run", "-m"], 2, "argument expected"),
        (["run", "--bogus", "x.py"], 2, "unknown option"),
        (["walk"], 2, "unknown command"),
        ([], 2, "usage:"),
    ],
)
def test_usage_errors(tmp_path: Path, args: list[str], code: int, message: str) -> None:
    proc = rsock_run(*args, cwd=tmp_path)
    assert proc.returncode == code
    assert message in proc.stderr + proc.stdout


def test_help(tmp_path: Path) -> None:
    proc = rsock_run("run", "--help", cwd=tmp_path)
    assert proc.returncode == 0 and "usage: python -m rsock run" in proc.stdout
