"""Start-up hook of ``python -m rsock run`` for the Python processes it starts.

``run`` puts this directory first on ``PYTHONPATH`` and sets ``RSOCK_RUN=1``, so
every Python child (``subprocess``, multiprocessing's spawn and forkserver, a
framework's workers) imports this module at start-up, as ``site`` imports any
``sitecustomize``, and is patched before its program runs.  Then the
``sitecustomize`` this one hides, if there is one further on ``sys.path``,
runs as it would have.  Remove ``RSOCK_RUN`` from a child's environment (or use
``run --no-inherit``) to leave it alone.
"""


def _rsock_start() -> None:
    import os
    import sys

    if os.environ.get("RSOCK_RUN") != "1":
        return
    try:
        from rsock import _inherit
    except Exception as e:  # another interpreter, or rsock not installed for it
        sys.stderr.write(
            f"rsock: this Python ({sys.executable}) cannot import rsock and runs "
            f"unpatched: {type(e).__name__}: {e}\n"
        )
        return
    _inherit.start_child()


def _chain() -> None:
    """Run the ``sitecustomize`` further on ``sys.path`` that this one hides."""
    import importlib.machinery
    import importlib.util
    import os
    import sys

    here = os.path.dirname(os.path.abspath(__file__))
    rest = [p for p in sys.path if os.path.abspath(p or os.curdir) != here]
    spec = importlib.machinery.PathFinder.find_spec("sitecustomize", rest)
    if spec is None or spec.loader is None:
        return
    module = importlib.util.module_from_spec(spec)
    sys.modules["sitecustomize"] = module
    spec.loader.exec_module(module)


_rsock_start()
_chain()
