"""``python -m rsock run``: runs a program the way ``python`` would, patched."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
import time
from pathlib import Path
from typing import Any

import pytest
from compat_support import check_no_stall, split_latencies

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
        "processes": 1,
    }


def test_report_counts_every_way_a_process_ends(tmp_path: Path) -> None:
    """Every event is in the report however its process ended: the top
    process's 12,000 (72 KB of lines: more than a count file's first 64 KiB),
    a fork child's that left by os._exit(), and a fork child's killed by
    SIGKILL."""
    code = """
        import os, signal, socket
        for _ in range(12000):
            socket.socket().close()
        for end in ("exit", "kill"):
            pid = os.fork()
            if pid == 0:
                for _ in range(5 if end == "exit" else 3):
                    socket.socket().close()
                if end == "exit":
                    os._exit(0)
                os.kill(os.getpid(), signal.SIGKILL)
            os.waitpid(pid, 0)
    """
    report = tmp_path / "r.json"
    proc = rsock_run("run", "--report", str(report), "-c", textwrap.dedent(code), cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert json.loads(report.read_text()) == {"rsock": 12008, "processes": 3}


@pytest.mark.parametrize("end", ["SIGTERM", "os._exit"])
def test_report_of_a_top_process_that_ends_without_atexit(end: str, tmp_path: Path) -> None:
    """The top process killed by a signal it does not handle (a server
    stopped by SIGTERM) or leaving by os._exit() runs no atexit hook; the
    report is written anyway (by rsock's watcher of the top process, soon
    after), and nothing of rsock's holds the program's pipes open meanwhile
    (capture_output returns).  The exit status is the program's."""
    code = f"""
        import os, signal, socket
        srv = socket.create_server(("127.0.0.1", 0))
        cli = socket.create_connection(srv.getsockname())
        conn, _ = srv.accept()
        print("made", flush=True)
        if {end!r} == "SIGTERM":
            os.kill(os.getpid(), signal.SIGTERM)
        os._exit(7)
    """
    report = tmp_path / "r.json"
    proc = rsock_run("run", "--report", str(report), "-c", textwrap.dedent(code), cwd=tmp_path)
    assert proc.returncode == (-15 if end == "SIGTERM" else 7), proc.stderr
    assert proc.stdout == "made\n"
    deadline = time.monotonic() + 10
    while not report.exists() and time.monotonic() < deadline:
        time.sleep(0.01)
    assert json.loads(report.read_text()) == {
        "rsock": 2,
        "connect:shm": 1,
        "accept:shm": 1,
        "processes": 1,
    }


def test_report_count_file_of_a_pid_that_comes_back(tmp_path: Path) -> None:
    """A process whose pid an earlier process of the tree had (pid reuse)
    counts into a file of its own: the earlier one's lines stay."""
    from rsock import _inherit, _report

    saved = _inherit._report_dir, _inherit._log_map, _inherit._log_end
    try:
        _inherit._report_dir = str(tmp_path)
        _inherit._open_log()
        _inherit._log("connect:shm")
        _inherit._open_log()  # (as the next process with this pid would)
        _inherit._log("accept:shm")
        _inherit._log("accept:shm")
        counts, processes = _report.tally(str(tmp_path))
    finally:
        if _inherit._log_map is not None:
            _inherit._log_map.close()
        _inherit._report_dir, _inherit._log_map, _inherit._log_end = saved
    assert (dict(counts), processes) == ({"connect:shm": 1, "accept:shm": 2}, 2)


# --------------------------------------------------------------------------- the process tree

TREE = """\
import multiprocessing as mp, socket, subprocess, sys

def serve(q):
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        q.put(s.getsockname()[1])
        c, _ = s.accept()
        with c:
            c.sendall(c.recv(100)[::-1])

if __name__ == "__main__":
    ctx = mp.get_context(sys.argv[1])
    q = ctx.Queue()
    p = ctx.Process(target=serve, args=(q,))
    p.start()
    with socket.create_connection(("127.0.0.1", q.get(timeout=30))) as c:
        c.sendall(b"hello")
        print(c.recv(100).decode(), type(c).__module__.split(".")[0])
    p.join(30)
    assert p.exitcode == 0, p.exitcode
    show = "import socket; print(type(socket.socket()).__module__.split('.')[0])"
    child = subprocess.run(
        [sys.executable, "-c", show], capture_output=True, text=True, check=True
    )
    print(child.stdout.strip().split(".")[0])
"""


@pytest.mark.timeout_s(120)
@pytest.mark.parametrize("method", ["spawn", "fork", "forkserver"])
def test_children_inherit_the_patch(tmp_path: Path, method: str) -> None:
    """A multiprocessing child (each start method) and a subprocess are patched:
    the child's listener serves the parent over shm (RSOCK_FALLBACK=never), and
    the report sums both processes' connections."""
    prog = tmp_path / "tree.py"
    prog.write_text(TREE)
    oracle = subprocess.run(
        [sys.executable, str(prog), method],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert oracle.returncode == 0, oracle.stderr
    assert oracle.stdout.split() == ["olleh", "socket", "socket"]
    report = tmp_path / "r.json"
    proc = subprocess.run(
        [sys.executable, "-m", "rsock", "run", "--report", str(report), str(prog), method],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=60,
        env=dict(os.environ, TMPDIR=str(tmp_path)),  # where the per-process counts go
    )
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.split() == ["olleh", "rsock", "rsock"]
    counts = json.loads(report.read_text())
    assert counts["connect:shm"] == 1 and counts["accept:shm"] == 1, counts
    assert "connect:tcp" not in counts and "accept:tcp" not in counts
    # the top process, the worker, the subprocess (and helpers such as the forkserver)
    assert counts["processes"] >= 3, counts
    assert not list(tmp_path.glob("rsock-report-*"))


def test_no_inherit_and_opting_a_child_out(tmp_path: Path) -> None:
    code = """
        import os, socket, subprocess, sys
        show = "import socket; print(type(socket.socket()).__module__.split('.')[0])"
        cmd = [sys.executable, "-c", show]
        env = {k: v for k, v in os.environ.items() if k != "RSOCK_RUN"}
        for e in (None, env):
            print(subprocess.run(cmd, env=e, capture_output=True, text=True).stdout.strip())
    """
    proc = rsock_run("run", "-c", textwrap.dedent(code), cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.split() == ["rsock", "socket"]
    proc = rsock_run("run", "--no-inherit", "-c", textwrap.dedent(code), cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.split() == ["socket", "socket"]


def test_a_sitecustomize_of_the_user_still_runs(tmp_path: Path) -> None:
    """The start-up hook hides any other sitecustomize on the path: it runs it."""
    mine = tmp_path / "mine"
    mine.mkdir()
    (mine / "sitecustomize.py").write_text("import builtins\nbuiltins.MINE = 42\n")
    code = """
        import os, subprocess, sys
        env = dict(os.environ, PYTHONPATH=os.environ["PYTHONPATH"] + os.pathsep + sys.argv[1])
        cmd = [sys.executable, "-c", "import socket; print(MINE, type(socket.socket()).__module__)"]
        print(subprocess.run(cmd, env=env, capture_output=True, text=True).stdout.strip())
    """
    proc = rsock_run("run", "-c", textwrap.dedent(code), str(mine), cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.split() == ["42", "rsock._socket"]


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


def test_version(tmp_path: Path) -> None:
    import importlib.metadata

    import rsock

    proc = rsock_run("--version", cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout == f"rsock {importlib.metadata.version('rsock')}\n"
    assert proc.stdout == f"rsock {rsock.__version__}\n"
    usage = rsock_run("--help", cwd=tmp_path).stdout
    for name in ("RSOCK_PROVIDER", "RSOCK_FALLBACK", "RSOCK_SPIN_US", "example:"):
        assert name in usage, name


def _plain_and_run(args: list[str], cwd: Path) -> tuple[Any, Any]:
    plain = subprocess.run(
        [sys.executable, *args], cwd=cwd, capture_output=True, text=True, timeout=30
    )
    return plain, rsock_run("run", *args, cwd=cwd)


def test_a_relative_script_path_as_python_takes_it(script: Path, tmp_path: Path) -> None:
    """``run scripts/show.py``: argv[0] as given, ``__file__`` absolute, as
    python itself sets them."""
    plain, proc = _plain_and_run(["scripts/show.py"], tmp_path)
    assert proc.returncode == 0, proc.stderr
    mine, theirs = json.loads(proc.stdout), json.loads(plain.stdout)
    assert mine["argv"] == theirs["argv"] == ["scripts/show.py"]
    assert mine["file"] == theirs["file"] == str(script)


@pytest.mark.parametrize("how", ["script", "command"])
def test_a_programs_traceback_as_python_shows_it(script: Path, tmp_path: Path, how: str) -> None:
    """An exception of the program: the same traceback as plain python's
    (the program's frames only, none of runpy's or rsock's) and status 1."""
    args = ["scripts/show.py", "raise"] if how == "script" else ["-c", "def f():\n 1/0\nf()"]
    plain, proc = _plain_and_run(args, tmp_path)
    assert plain.returncode == proc.returncode == 1
    assert proc.stderr == plain.stderr
    assert "rsock" not in proc.stderr and "runpy" not in proc.stderr


def test_keyboard_interrupt_ends_the_program_as_python_does(tmp_path: Path) -> None:
    """An uncaught KeyboardInterrupt: the traceback, the exit handlers, then
    the process ends by SIGINT, as python's does."""
    code = "import atexit\natexit.register(print, 'bye')\nraise KeyboardInterrupt"
    plain, proc = _plain_and_run(["-c", code], tmp_path)
    assert proc.returncode == plain.returncode == -2
    assert proc.stdout == plain.stdout == "bye\n"
    assert proc.stderr == plain.stderr


@pytest.mark.timeout_s(60)
def test_the_report_writer_says_what_it_is(tmp_path: Path) -> None:
    """With --report, the process that writes the report should the program
    die without its exit handlers shows in ps as rsock's report writer for
    the program's pid, not as a second copy of the program's command line."""
    report = tmp_path / "r.json"
    prog = subprocess.Popen(
        [sys.executable, "-m", "rsock", "run", "--report", str(report), "-c",
         "import sys; sys.stdin.read()"],
        cwd=tmp_path, stdin=subprocess.PIPE, text=True,
    )  # fmt: skip
    try:
        found: list[list[str]] = []
        deadline = time.monotonic() + 20
        while not found and time.monotonic() < deadline:
            for pid in os.listdir("/proc"):
                if not pid.isdigit() or int(pid) == prog.pid:
                    continue
                try:
                    with open(f"/proc/{pid}/cmdline", "rb") as f:
                        argv = [a.decode() for a in f.read().split(b"\0") if a]
                except OSError:
                    continue
                if str(report) in argv:
                    found.append(argv)
            time.sleep(0.05)
        assert len(found) == 1, found
        [argv] = found
        assert argv[argv.index("--for") + 1] == str(prog.pid), argv
        assert any(a.endswith("rsock/_report.py") for a in argv), argv
        assert "-c" not in argv, argv
    finally:
        prog.communicate("", timeout=30)
    assert prog.returncode == 0
    assert json.loads(report.read_text())["processes"] == 1


MP_CONNECTION = """\
import threading
from multiprocessing.connection import Client, Listener
from multiprocessing.managers import BaseManager

with Listener(("127.0.0.1", 0), authkey=b"k") as listener:
    def serve():
        with listener.accept() as c:
            c.send(c.recv()[::-1])
    t = threading.Thread(target=serve)
    t.start()
    with Client(listener.address, authkey=b"k") as c:
        c.send("hello")
        print(c.recv())
    t.join(30)

class M(BaseManager):
    pass

M.register("table", callable=lambda: {"a": 1})
m = M(address=("127.0.0.1", 0), authkey=b"x")
m.start()
print(m.table().copy()["a"])
m.shutdown()
"""


@pytest.mark.timeout_s(90)
def test_multiprocessing_connection_over_tcp_addresses(tmp_path: Path) -> None:
    """Listener/Client and a manager with TCP addresses work under run, even
    under RSOCK_FALLBACK=strict (their sockets stay kernel sockets:
    multiprocessing.connection detaches the fd), and the report shows them
    with a ``:tcp`` key (it had none: a report without one did not prove that
    every connection took the fast path)."""
    prog = tmp_path / "mpc.py"
    prog.write_text(MP_CONNECTION)
    oracle = subprocess.run(
        [sys.executable, str(prog)], cwd=tmp_path, capture_output=True, text=True, timeout=60
    )
    assert oracle.returncode == 0, oracle.stderr
    report = tmp_path / "report.json"
    proc = subprocess.run(
        [sys.executable, "-m", "rsock", "run", "--report", str(report), str(prog)],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=60,
        env=dict(os.environ, RSOCK_FALLBACK="strict"),
    )
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.split() == oracle.stdout.split() == ["olleh", "1"]
    counts = json.loads(report.read_text())
    # the Listener, its Client, the manager's listener and the client's connections
    assert counts.get("kernel:tcp", 0) >= 4, counts


def test_a_source_tree_shadowing_the_install_says_so(tmp_path: Path) -> None:
    """Running from a checkout that has no built extension (it comes first on
    sys.path) fails with a sentence that says what is going on, not with a
    circular-import error."""
    import shutil

    import rsock

    tree = tmp_path / "rsock"
    shutil.copytree(
        Path(rsock.__file__).parent, tree, ignore=shutil.ignore_patterns("*.so", "__pycache__")
    )
    import typing_extensions

    # -S: no site, so no editable-install finder; the dependencies stay importable
    deps = str(Path(typing_extensions.__file__).parent)
    proc = subprocess.run(
        [sys.executable, "-S", "-c", "import rsock"],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=30,
        env=dict(os.environ, PYTHONPATH=f"{tmp_path}{os.pathsep}{deps}"),
    )
    assert proc.returncode == 1
    assert "shadows the installed package" in proc.stderr, proc.stderr
    assert "circular import" not in proc.stderr.splitlines()[-1]


PROGRAMS = Path(__file__).resolve().parent.parent / "programs"


def same_under_rsock(
    name: str, want: list[str], tmp_path: Path, timed: dict[str, int] | None = None
) -> dict[str, int]:
    """compat/programs/``name`` prints ``want`` with plain Python (the oracle)
    and under ``rsock run --report`` with RSOCK_FALLBACK=strict; the report.
    A program that times its connections (``timed``: how many of each kind)
    prints their latencies too: the stall rule applies to both runs."""
    prog = PROGRAMS / name
    oracle = subprocess.run(
        [sys.executable, str(prog)], cwd=tmp_path, capture_output=True, text=True, timeout=90
    )
    assert oracle.returncode == 0, oracle.stderr
    proc = subprocess.run(
        [sys.executable, "-m", "rsock", "run", "--report", "r.json", str(prog)],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=90,
        env={**os.environ, "RSOCK_FALLBACK": "strict"},
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    for transport, out in (("tcp", oracle.stdout), ("rsock", proc.stdout)):
        if timed is not None:
            out, latencies = split_latencies(out)
            assert {k: len(v) for k, v in latencies.items()} == timed, latencies
            check_no_stall(latencies, f"{name} over {transport}")
        assert out.split() == want
    report: dict[str, int] = json.loads((tmp_path / "r.json").read_text())
    return report


@pytest.mark.timeout_s(90)
def test_a_listener_handed_to_an_exec_child(tmp_path: Path) -> None:
    """The listener's fileno() inherited by a child the program starts
    (werkzeug's reloader, gunicorn's re-exec): the child adopts it with
    socket(fileno=...) and accepts, over shm, on the parent's listener."""
    want = ["HELLO", "0", "HELLO", "1", "HELLO", "2", "child", "0"]
    # (the first connection waits for the child to start: a kind of its own)
    timed = {"first": 1, "connection": 2}
    report = same_under_rsock("inherit_listener.py", want, tmp_path, timed)
    assert report["processes"] == 2
    assert report["accept:shm"] == report["connect:shm"] == 3, report


@pytest.mark.timeout_s(90)
def test_a_listener_passed_alone_says_what_is_missing(tmp_path: Path) -> None:
    """Only fileno() passed (pass_fds, no set_inheritable()): the kernel
    listener goes over whole, rsock's sockets behind fileno() do not; the
    child's socket(fileno=...) fails with ENOTSOCK and says why (README,
    differences)."""
    prog = PROGRAMS / "inherit_listener.py"
    oracle = subprocess.run(
        [sys.executable, str(prog), "--pass-fds"],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert oracle.returncode == 0, oracle.stderr
    proc = subprocess.run(
        [sys.executable, "-m", "rsock", "run", str(prog), "--pass-fds"],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert proc.returncode != 0
    assert "Socket operation on non-socket" in proc.stderr, proc.stderr[-2000:]
    assert "call set_inheritable(True) on it before starting the child" in proc.stderr
    assert "child 1" in proc.stdout


RERUN = """\
import socket, subprocess, sys
if sys.argv[1:] == ["child"]:
    with socket.create_connection(("127.0.0.1", int(input())), timeout=20) as c:
        c.sendall(b"x")
    sys.exit(0)
ls = socket.socket()
ls.bind(("127.0.0.1", 0))
ls.listen()
# the command line again, as werkzeug's reloader starts it (sys.orig_argv)
child = subprocess.Popen([*sys.orig_argv, "child"], stdin=subprocess.PIPE, text=True)
child.communicate(str(ls.getsockname()[1]))
conn, _ = ls.accept()
print(conn.recv(1).decode(), child.wait())
"""


@pytest.mark.timeout_s(90)
def test_run_inside_a_run_counts_into_its_report(tmp_path: Path) -> None:
    """A program that starts its own command line again (werkzeug's reloader:
    ``python -m rsock run --report r.json app.py`` once more in its child):
    the inner run counts into the outer report (one file, the whole tree)."""
    prog = tmp_path / "rerun.py"
    prog.write_text(RERUN)
    proc = rsock_run("run", "--report", "r.json", str(prog), cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.split() == ["x", "0"]
    report = json.loads((tmp_path / "r.json").read_text())
    assert report["processes"] == 2
    assert report["connect:shm"] == report["accept:shm"] == 1, report


@pytest.mark.timeout_s(120)
def test_two_server_processes_share_a_port_with_so_reuseport(tmp_path: Path) -> None:
    """Two processes each run asyncio.start_server(reuse_port=True) on one
    port (aiohttp's web.run_app(reuse_port=True) started twice): the second
    joins the first's listener; every client gets an answer."""
    want = ["replies", "40", "server", "0", "server", "0"]
    report = same_under_rsock("reuseport_servers.py", want, tmp_path, {"connection": 40})
    assert report["processes"] == 3
    assert report["asyncio:create_server"] == 2
    assert report["accept:shm"] == report["connect:shm"] == 40, report


@pytest.mark.timeout_s(90)
def test_new_sockets_after_fds_closed_by_number(tmp_path: Path) -> None:
    """os.closerange() after sockets were made closes rsock's own fds too
    (a client's arena memfd, the watcher's epoll): new connections after it
    still work, as kernel sockets made afterwards do (the engine finds those
    fds gone, or their numbers another file's, and makes new ones)."""
    report = same_under_rsock("closerange_later.py", ["BEFORE", "AFTER", "AGAIN"], tmp_path)
    assert report["accept:shm"] == report["connect:shm"] == 3, report


def test_set_inheritable_marks_a_listener_shared_only_when_true() -> None:
    """set_inheritable(True) on a listener makes the fds behind fileno()
    inheritable too and the listener shared (a child may accept from it);
    set_inheritable(False) on one never made inheritable changes neither."""
    import rsock
    from rsock import _lowlevel

    with rsock.socket() as ls:
        ls.bind(("127.0.0.1", 0))
        ls.listen()
        ls.set_inheritable(False)
        assert not ls.get_inheritable() and not ls._core.shared
        ls.set_inheritable(True)
        assert ls.get_inheritable() and ls._core.shared
        h = ls._core.h
        behind = [*_lowlevel.listen_fds(h), ls._core.tcp.fileno()]  # type: ignore[union-attr]
        assert all(os.get_inheritable(fd) for fd in behind)
        ls.set_inheritable(False)
        assert not any(os.get_inheritable(fd) for fd in behind)
