"""``python -m rsock run``: run an unmodified program with rsock patched in.

    python -m rsock run [--report FILE] [--no-inherit] -m module [args...]
    python -m rsock run [--report FILE] [--no-inherit] script.py [args...]
    python -m rsock run [--report FILE] [--no-inherit] -c command [args...]

``rsock.patch()`` is applied first; then the program runs as ``python -m
module`` / ``python script.py`` / ``python -c command`` would run it: as
``__main__`` (through ``runpy``), with ``sys.argv`` and ``sys.path[0]`` set the
same way.  Its exit status is ours.  The Python processes it starts are
patched too, through the environment (``rsock._inherit``), unless
``--no-inherit``.  ``--report FILE`` writes the patch's counters (rsock and
stdlib sockets created, connections per provider, asyncio calls routed to
rsock.asyncio, and ``unseen:tcp``: kernel TCP connections made outside
Python's socket module, by C extensions, which rsock cannot carry), summed
over every patched process of the tree, with ``processes`` (how many), to
FILE as JSON when the top process exits.
"""

from __future__ import annotations

import importlib.util
import io
import os
import runpy
import sys
import types

from rsock import _inherit

USAGE = """\
usage: python -m rsock run [--report FILE] [--no-inherit]
                           (-m module | -c command | script) [args...]
       python -m rsock --version

Runs a Python program with rsock.patch() applied: its AF_INET/AF_INET6 SOCK_STREAM
sockets are rsock sockets, every other socket a stdlib one; asyncio's TCP servers and
connections (asyncio.start_server, open_connection, loop.create_server, ...; on
asyncio's loops and on uvloop) run on rsock.asyncio.

  -m module      run a library module as a script (like python -m)
  -c command     run a program passed as a string (like python -c)
  script         run a script, a directory or a zip file with __main__.py
                 (- reads the program from standard input)
  --report FILE  at exit, write the patch counters (sockets, connections per provider,
                 routed asyncio calls), summed over the process tree, to FILE as JSON;
                 unseen:tcp counts the kernel TCP connections made outside Python's
                 socket module (C extensions: grpcio, pyzmq, ...), which rsock cannot carry
  --no-inherit   patch this process only; by default the Python processes it starts
                 (subprocess, multiprocessing spawn/forkserver, workers) are patched
                 too, through the environment (RSOCK_RUN=1 and PYTHONPATH)
  --version      print rsock's version and exit

environment:
  RSOCK_PROVIDER=shm|verbs|tcp  force one path (default: shm to this host, verbs
                                to another host with an RDMA device, else tcp)
  RSOCK_FALLBACK=never|strict   never: a connection that cannot take a fast path
                                fails (ECONNREFUSED) instead of using TCP; strict:
                                listeners refuse plain TCP clients too, and sockets
                                made outside the socket module are reported
  RSOCK_SPIN_US=N               longest busy-poll of a blocking call (default 500)
  RSOCK_LOOP_POLL_US=N          longest busy-poll of an event loop (default 250)
  RSOCK_RING_SIZE, RSOCK_QDEPTH, RSOCK_INLINE
                                a new connection's ring bytes, queue depth and
                                inline send size
  RSOCK_FILENO=lazy|exact       when a connection's fileno() becomes pollable
  RSOCK_VERBS_LOOPBACK=ADDR     verbs to a loopback address: the RDMA device's
                                IPv4 address to use instead

example:
  python -m rsock run --report report.json server.py --port 8080
  cat report.json      # {"accept:shm": 12, "processes": 1, "rsock": 13}
"""


def _usage_error(msg: str) -> int:
    sys.stderr.write(f"{USAGE}\npython -m rsock: error: {msg}\n")
    return 2


def _run_command(
    code: str | bytes,
    args: list[str],
    argv0: str = "-c",
    filename: str = "<string>",
    path0: str = "",
    file: str | None = None,
) -> None:
    """Runs ``code`` as ``__main__``, as python runs ``-c``, ``-`` or (with
    ``file``: its absolute path) a script file."""
    sys.argv = [argv0, *args]
    if not sys.flags.safe_path and sys.path:
        sys.path[0] = path0
    main = types.ModuleType("__main__")
    main.__dict__["__builtins__"] = __builtins__
    if file is not None:
        from importlib.machinery import SourceFileLoader

        main.__file__ = file
        main.__cached__ = None  # type: ignore[attr-defined]
        main.__loader__ = SourceFileLoader("__main__", file)
    sys.modules["__main__"] = main
    exec(compile(code, filename, "exec"), main.__dict__)


def _run_module(name: str, args: list[str]) -> int:
    # sys.path[0] is already the working directory, as `python -m` leaves it
    try:
        spec = importlib.util.find_spec(name)
    except (ImportError, ValueError) as e:
        spec = None
        detail = f"{type(e).__name__}: {e}"
    else:
        detail = f"No module named {name}"
    if spec is None:
        sys.stderr.write(f"{sys.executable}: {detail}\n")
        return 1
    sys.argv = [name, *args]  # runpy replaces argv[0] with the module's file
    runpy.run_module(name, run_name="__main__", alter_sys=True)
    return 0


def _run_script(path: str, args: list[str]) -> int:
    if path == "-":  # the program on standard input, as `python -`
        _run_command(sys.stdin.read(), args, "-", "<stdin>")
        return 0
    if not os.path.exists(path):
        sys.stderr.write(
            f"{sys.executable}: can't open file {os.path.abspath(path)!r}: "
            f"[Errno 2] No such file or directory\n"
        )
        return 2
    if os.path.isfile(path) and not _is_zip(path) and not path.endswith((".pyc", ".pyo")):
        # a source file: __file__ absolute, argv[0] as given, as python sets them
        full = os.path.abspath(path)
        with io.open_code(full) as f:
            source = f.read()
        _run_command(source, args, path, full, os.path.dirname(full), full)
        return 0
    sys.argv = [path, *args]
    if not sys.flags.safe_path and sys.path:
        if os.path.isfile(path) and not _is_zip(path):
            sys.path[0] = os.path.dirname(os.path.abspath(path))
        else:
            del sys.path[0]  # runpy puts the directory or zip file there itself
    runpy.run_path(path, run_name="__main__")
    return 0


def _is_zip(path: str) -> bool:
    if path.endswith(".py"):
        return False  # (no zipfile import for a script: each fork would copy it)
    import zipfile

    return zipfile.is_zipfile(path)


def run(argv: list[str]) -> int:
    """``python -m rsock run ...`` with ``argv`` = the words after ``run``."""
    report: str | None = None
    inherit = True
    i = 0
    while i < len(argv):
        a = argv[i]
        if a in ("-h", "--help"):
            sys.stdout.write(USAGE)
            return 0
        if a == "--report" or a.startswith("--report="):
            if a == "--report":
                if i + 1 >= len(argv):
                    return _usage_error("--report needs a file name")
                report = argv[i + 1]
                i += 2
            else:
                report = a.split("=", 1)[1]
                i += 1
            continue
        if a == "--no-inherit":
            inherit = False
            i += 1
            continue
        if a == "--":
            i += 1
            break
        if a.startswith("-m") or a.startswith("-c"):
            value = a[2:]
            if not value:
                if i + 1 >= len(argv):
                    return _usage_error(f"argument expected for the {a} option")
                value = argv[i + 1]
                i += 1
            rest = argv[i + 1 :]
            _inherit.start_top(report, inherit)
            if a.startswith("-c"):
                _run_command(value, rest)
                return 0
            return _run_module(value, rest)
        if a.startswith("-") and a != "-":
            return _usage_error(f"unknown option {a}")
        break
    if i >= len(argv):
        return _usage_error("nothing to run: give -m module, -c command or a script")
    _inherit.start_top(report, inherit)
    return _run_script(argv[i], argv[i + 1 :])


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    if not args or args[0] in ("-h", "--help"):
        sys.stdout.write(USAGE)
        return 0 if args else 2
    if args[0] in ("-V", "--version"):
        from rsock import __version__

        sys.stdout.write(f"rsock {__version__}\n")
        return 0
    if args[0] != "run":
        return _usage_error(f"unknown command {args[0]!r} (the only command is 'run')")
    return run(args[1:])


def _program_frames(tb: types.TracebackType | None) -> types.TracebackType | None:
    """``tb`` without the frames of the runner (this file and runpy) above
    the program's own: the traceback python itself would show."""
    while tb is not None and (
        tb.tb_frame.f_code.co_filename in (__file__, runpy.__file__)
        or tb.tb_frame.f_code.co_filename.startswith("<frozen runpy")
    ):
        tb = tb.tb_next
    return tb


def _main_as_python() -> int:
    """``main()``; an exception of the program is reported as python
    reports it (``sys.excepthook``, the program's frames only, exit status
    1; KeyboardInterrupt: after the exit handlers, killed by SIGINT)."""
    try:
        return main()
    except SystemExit:
        raise
    except BaseException as e:
        tb = _program_frames(e.__traceback__)
        if tb is None:  # (an error of the runner itself: all of it)
            raise
        sys.excepthook(type(e), e.with_traceback(tb), tb)
        if not isinstance(e, KeyboardInterrupt):
            return 1
        import atexit
        import signal

        atexit._run_exitfuncs()
        sys.stdout.flush()
        sys.stderr.flush()
        signal.signal(signal.SIGINT, signal.SIG_DFL)
        os.kill(os.getpid(), signal.SIGINT)
        return 130


if __name__ == "__main__":
    sys.exit(_main_as_python())
