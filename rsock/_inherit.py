"""How ``python -m rsock run`` reaches a whole process tree.

The top process (``run``) patches itself, and through the environment every
Python process it starts (the start-up hook in ``rsock/_boot``):

* ``RSOCK_RUN=1`` patches a Python process at start-up;
* ``PYTHONPATH`` begins with ``rsock/_boot`` (its ``sitecustomize`` does it);
* ``RSOCK_RUN_REPORT=<dir>`` (with ``--report``): each patched process writes
  what the patch counts (one line per event: a socket made, a connection
  made or accepted, a routed asyncio call) into a file of its own,
  ``<dir>/<pid>`` (``<pid>.<n>`` when a pid comes back), as it happens,
  through a shared mapping of that file (no system call per event), so
  that a process that ends by ``os._exit()`` or a signal is counted too;
  the top process sums the files into the report when it exits (its
  ``atexit``; or, when it dies without it, by a signal or ``os._exit``, a
  detached process of rsock's that waits on its pidfd: ``_watch_top``).

A ``fork()`` child is patched already (the patch is process memory); it
starts its own count file and its own in-memory counters.

With a report, or ``RSOCK_FALLBACK=strict``, each patched process also
counts the kernel TCP connections it holds that were made outside Python's
``socket`` module (``unseen:tcp``: ``rsock._census``).
"""

from __future__ import annotations

import mmap
import os
import sys

from rsock import _patch, _paths, _report

BOOT_DIR = os.path.join(os.path.dirname(os.path.abspath(__file__)), "_boot")
ENV_RUN = "RSOCK_RUN"
ENV_REPORT = "RSOCK_RUN_REPORT"

_report_dir: str | None = None
_LOG_SIZE = 1 << 16  # a count file's first size (doubled when full)
_log_map: mmap.mmap | None = None  # this process's count file, mapped shared
_log_end = 0  # where its next line goes (the rest is zeros)


def _open_log() -> None:
    """This process's count file, mapped: a line written there is in the
    file at once (the page cache), whatever way the process ends."""
    global _log_map, _log_end
    if _report_dir is None:
        return
    try:
        # a file of its own (O_EXCL), also when a pid of the tree comes back
        pid, n = os.getpid(), 0
        while True:
            name = str(pid) if n == 0 else f"{pid}.{n}"
            try:
                fd = os.open(
                    os.path.join(_report_dir, name),
                    os.O_RDWR | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC,
                    0o600,
                )
                break
            except FileExistsError:
                n += 1
        try:
            os.ftruncate(fd, _LOG_SIZE)
            _log_map = mmap.mmap(fd, _LOG_SIZE)  # (MAP_SHARED; it keeps a dup of fd)
        finally:
            os.close(fd)
        _log_end = 0
    except OSError as e:
        _log_map = None
        sys.stderr.write(f"rsock: cannot record this process in the report: {e}\n")


def _log(key: str) -> None:
    """Called with the patch's counting lock held."""
    global _log_end
    m = _log_map
    if m is None:
        return
    line = key.encode() + b"\n"
    end = _log_end + len(line)
    if end > len(m):
        try:
            m.resize(max(2 * len(m), end))  # (the file grows with it)
        except (OSError, ValueError):
            return
    m[_log_end:end] = line
    _log_end = end


def _after_fork_in_child() -> None:
    global _log_map
    if _log_map is not None:
        _log_map.close()  # (the parent's file: this process counts in its own)
        _log_map = None
    _patch.reset_counters()
    _open_log()


def _record_to(directory: str | None) -> None:
    global _report_dir
    _report_dir = directory
    if directory is not None:
        _open_log()
        _patch.set_observer(_log)
        os.register_at_fork(after_in_child=_after_fork_in_child)
    strict = _paths.fallback_mode() == "strict"
    if directory is not None or strict:
        # the kernel TCP connections made outside the socket module
        # ("unseen:tcp"); after the hooks above (a fork child's count file)
        from rsock import _census

        _census.start(strict)


def start_child() -> None:
    """The start-up hook's work in a child interpreter."""
    _record_to(os.environ.get(ENV_REPORT) or None)
    _patch.patch()


def start_top(report: str | None, inherit: bool) -> None:
    """``run`` in the top process: patch it and (inherit) its Python children;
    with a report, sum every process's counts into ``report`` at exit."""
    if _report_dir is not None and os.environ.get(ENV_RUN) == "1":
        # a run inside the tree of a run with a report (werkzeug's reloader
        # starts the command line anew in its child): the start-up hook made
        # this process count into that report, which sums it; a report of
        # its own would race the outer one for the file
        _patch.patch()
        return
    directory = None
    if report is not None:
        import tempfile  # (only with a report: shutil, bz2, lzma come with it)

        directory = tempfile.mkdtemp(prefix="rsock-report-")
        import atexit

        out = os.path.abspath(report)
        atexit.register(_report.write, out, directory, os.getpid())
        _watch_top(out, directory)
    if inherit:
        os.environ[ENV_RUN] = "1"
        path = os.environ.get("PYTHONPATH")
        os.environ["PYTHONPATH"] = BOOT_DIR + (os.pathsep + path if path else "")
        if directory is not None:
            os.environ[ENV_REPORT] = directory
    _record_to(directory)
    _patch.patch()


def _watch_top(path: str, directory: str) -> None:
    """A process of its own that writes the report if the top process ends
    without its ``atexit`` hooks (killed by a signal: a server stopped by
    SIGTERM that installs no handler; ``os._exit``): ``rsock/_report.py``
    run as a script in an interpreter of its own (``-I -S``: no rsock, no
    patch; its command line says what it is), waiting on a pidfd of the top
    process.  Started before the program runs, detached (a grandchild in a
    session of its own, so the program never waits for it or signals it
    with its group), with every fd it inherited closed but the pidfd (it
    must not keep the program's files or sockets open), ignoring the
    terminal's signals.  Without pidfds (Linux < 5.3) there is none."""
    top = os.getpid()
    try:
        pidfd = os.pidfd_open(top)
    except (AttributeError, OSError):
        return
    try:
        child = os.fork()
    except OSError:
        os.close(pidfd)
        return
    if child:
        os.close(pidfd)
        os.waitpid(child, 0)  # (the middle process leaves at once)
        return
    try:
        os.setsid()
        if os.fork():
            os._exit(0)
        import signal

        for sig in (signal.SIGINT, signal.SIGHUP, signal.SIGTERM, signal.SIGQUIT):
            signal.signal(sig, signal.SIG_IGN)
        null = os.open(os.devnull, os.O_RDWR)
        for fd in (0, 1, 2):
            os.dup2(null, fd)
        os.closerange(3, pidfd)
        os.closerange(pidfd + 1, 1 << 20)
        os.set_inheritable(pidfd, True)
        script = os.path.join(os.path.dirname(os.path.abspath(__file__)), "_report.py")
        argv = ["--write", path, "--for", str(top)]
        argv += ["--counts", directory, "--pidfd", str(pidfd)]
        os.execv(sys.executable, [sys.executable, "-I", "-S", script, *argv])
    except BaseException:
        pass
    os._exit(0)
