"""The installed wheel is the product: build rsock's wheel from this tree,
install it (and nothing else of the tree) into a fresh virtual environment,
and from a directory outside the tree import rsock, move bytes on shm, run
``python -m rsock.bench`` on a small subset and ``python -m rsock run`` on a
program that uses the stdlib's socket API.  Then check that a source tree
without built extensions that shadows the install says so in one sentence.

Needs the network to PyPI (or pip's cache) for cffi and typing-extensions,
as ``make test`` does anyway; ~1 minute."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import textwrap
import zipfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]

PROGRAM = textwrap.dedent(
    """
    import socket, threading
    srv = socket.create_server(("127.0.0.1", 0))
    port = srv.getsockname()[1]
    def serve():
        conn, _ = srv.accept()
        with conn:
            conn.sendall(conn.recv(100).upper())
    t = threading.Thread(target=serve)
    t.start()
    with socket.create_connection(("127.0.0.1", port)) as c:
        c.sendall(b"wheel")
        assert c.recv(100) == b"WHEEL"
        print(type(c).__module__, c.provider)
    t.join()
    srv.close()
    """
)


def _run(cmd: list[str], cwd: Path, timeout: float = 300, **kw: object) -> str:
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "RSOCK_RUN")}
    env["PIP_DISABLE_PIP_VERSION_CHECK"] = "1"
    proc = subprocess.run(
        cmd, cwd=cwd, capture_output=True, text=True, timeout=timeout, env=env, check=False
    )
    assert proc.returncode == 0, f"{cmd}\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}"
    return proc.stdout


@pytest.mark.slow
@pytest.mark.timeout_s(600)
def test_wheel_installs_and_runs_outside_the_tree(tmp_path: Path) -> None:
    # the tree is copied without its build products, so the wheel is built
    # from sources as `pip install .` would build it
    src = tmp_path / "src"
    shutil.copytree(
        ROOT,
        src,
        ignore=shutil.ignore_patterns(
            ".venv", ".git", "build", "*.so", "__pycache__", "*.egg-info", ".*_cache"
        ),
    )
    wheels = tmp_path / "wheels"
    _run([sys.executable, "-m", "pip", "wheel", "--quiet", "--no-deps", "--no-build-isolation",
          "-w", str(wheels), str(src)], cwd=tmp_path)  # fmt: skip
    [wheel] = list(wheels.glob("rsock-*.whl"))
    names = zipfile.ZipFile(wheel).namelist()
    for needed in ("rsock/__init__.py", "rsock/py.typed", "rsock/bench/__main__.py",
                   "rsock/_boot/sitecustomize.py", "rsock/asyncio.py", "rsock/bench/_apps.py",
                   "rsock/bench/apps/aiohttp_server.py",
                   "rsock/bench/apps/asgi_app.py"):  # fmt: skip
        assert needed in names, needed
    assert any(n.startswith("rsock/_native") and n.endswith(".so") for n in names), names
    assert any(n.startswith("rsock/_fastcall") and n.endswith(".so") for n in names), names
    assert not [n for n in names if n.startswith(("tests/", "compat/", "native/"))]
    # what `pip show rsock` shows: the license, classifiers, a long description
    [meta_name] = [n for n in names if n.endswith(".dist-info/METADATA")]
    meta = zipfile.ZipFile(wheel).read(meta_name).decode()
    assert "\nLicense-Expression: MIT\n" in meta, meta[:2000]
    assert "\nClassifier: Operating System :: POSIX :: Linux\n" in meta
    assert "\nRequires-Python: >=3.11\n" in meta
    assert any(n.endswith(".dist-info/licenses/LICENSE") for n in names), names

    venv = tmp_path / "venv"
    _run([sys.executable, "-m", "venv", str(venv)], cwd=tmp_path)
    py = str(venv / "bin" / "python")
    _run([py, "-m", "pip", "install", "--quiet", str(wheel)], cwd=tmp_path)

    away = tmp_path / "elsewhere"
    away.mkdir()
    where = _run([py, "-c", "import rsock, os; print(os.path.dirname(rsock.__file__))"], away)
    assert str(venv) in where and str(ROOT) not in where, where
    (away / "prog.py").write_text(PROGRAM)
    env_never = ["env", "RSOCK_FALLBACK=never"]
    out = _run([*env_never, py, "-m", "rsock", "run", "prog.py"], away, timeout=60)
    assert out.split() == ["rsock._socket", "shm"], out
    assert _run([py, "-m", "rsock", "--version"], away).startswith("rsock ")
    out = _run([py, "-m", "rsock.bench", "--quick", "--reps", "1", "--rep-time", "0.05",
                "--warmup-bytes", "1M", "--rounds", "100", "--warmup-rounds", "10",
                "--sizes", "4K", "--pin", "none", "--api", "sync",
                "--tests", "stream,pingpong", "--transport", "tcp,rsock"],
               away, timeout=120)  # fmt: skip
    assert "rsock vs tcp" in out or "rsock" in out, out

    # the source tree (no built extensions) on sys.path ahead of the install
    out_proc = subprocess.run(
        [py, "-c", "import rsock"], cwd=src, capture_output=True, text=True, timeout=60,
        check=False,
    )  # fmt: skip
    assert out_proc.returncode != 0
    assert "shadow" in out_proc.stderr, out_proc.stderr[-2000:]
