"""Progress display of ``python -m rsock.bench`` (stderr only, never stdout).

Styles:

* ``tqdm`` / ``rich``: a progress bar over the cases (when the package is importable),
  each finished case's result printed above it;
* ``text``: the same as one ``\\r``-rewritten status line (no dependencies);
* ``log``: one plain line per finished case, no ``\\r`` (the default when stderr is
  not a terminal, e.g. a log file or CI);
* ``off`` (``--no-progress``): nothing.

``auto`` picks tqdm, else rich, else text on a terminal, log otherwise.  Standard
library only at import time: tqdm and rich are imported when chosen.
"""

from __future__ import annotations

import importlib
import importlib.util
import shutil
import sys
import time
from typing import Any, TextIO

STYLES = ("auto", "tqdm", "rich", "text", "log", "off")


def available(style: str) -> bool:
    """Whether ``style`` can be used here (tqdm and rich must be importable)."""
    if style in ("tqdm", "rich"):
        return importlib.util.find_spec(style) is not None
    return style in STYLES


def resolve(style: str, stream: TextIO) -> str:
    """The concrete style of ``auto`` for this stream (others are returned as they are)."""
    if style != "auto":
        return style
    try:
        tty = stream.isatty()
    except (AttributeError, ValueError):
        tty = False
    if not tty:
        return "log"
    for candidate in ("tqdm", "rich"):
        if available(candidate):
            return candidate
    return "text"


class Progress:
    """Base class and the ``off`` style: every method does nothing."""

    style = "off"

    def __init__(self, total: int, stream: TextIO) -> None:
        self.total = total
        self.stream = stream
        self.index = 0
        self.name = ""
        self.t0 = time.monotonic()
        self.case_t0 = self.t0

    def message(self, text: str) -> None:
        """A line outside the per-case results (header, total)."""

    def start(self, index: int, name: str) -> None:
        """Case ``index`` (1-based) named ``name`` begins."""
        self.index, self.name = index, name
        self.case_t0 = time.monotonic()

    def tick(self) -> None:
        """Called about every 0.25 s while a case runs."""

    def done(self, result: str) -> None:
        """The current case finished with this one-line result."""

    def close(self) -> None:
        """The run is over: remove or finish the bar."""

    def line(self, result: str) -> str:
        return f"[{self.index}/{self.total}] {self.name} ... {result}"


class LogProgress(Progress):
    """One plain line per case, as a log file wants it."""

    style = "log"

    def message(self, text: str) -> None:
        print(text, file=self.stream, flush=True)

    def done(self, result: str) -> None:
        print(self.line(result), file=self.stream, flush=True)


class TextProgress(LogProgress):
    """A one-line status rewritten with ``\\r``; finished cases stay above it."""

    style = "text"

    def __init__(self, total: int, stream: TextIO) -> None:
        super().__init__(total, stream)
        self.shown = 0  # length of the status line on screen

    def clear(self) -> None:
        if self.shown:
            self.stream.write("\r" + " " * self.shown + "\r")
            self.shown = 0

    def draw(self) -> None:
        now = time.monotonic()
        finished = self.index - 1
        pct = 100 * finished // max(self.total, 1)
        text = (
            f"[{self.index}/{self.total} {pct:3d}%] {self.name} "
            f"{now - self.case_t0:5.1f} s (total {now - self.t0:.0f} s)"
        )
        text = text[: max(shutil.get_terminal_size((100, 24)).columns - 1, 20)]  # no wrap
        pad = max(self.shown - len(text), 0)
        self.stream.write("\r" + text + " " * pad)
        self.stream.flush()
        self.shown = len(text)

    def message(self, text: str) -> None:
        self.clear()
        super().message(text)

    def start(self, index: int, name: str) -> None:
        super().start(index, name)
        self.draw()

    def tick(self) -> None:
        self.draw()

    def done(self, result: str) -> None:
        self.clear()
        super().done(result)

    def close(self) -> None:
        self.clear()
        self.stream.flush()


class TqdmProgress(Progress):
    style = "tqdm"

    def __init__(self, total: int, stream: TextIO) -> None:
        super().__init__(total, stream)
        self.tqdm: Any = importlib.import_module("tqdm").tqdm
        self.bar: Any = self.tqdm(
            total=total, file=stream, unit="case", dynamic_ncols=True, leave=False
        )

    def message(self, text: str) -> None:
        self.tqdm.write(text, file=self.stream)

    def start(self, index: int, name: str) -> None:
        super().start(index, name)
        self.bar.set_description_str(name)

    def tick(self) -> None:
        self.bar.refresh()

    def done(self, result: str) -> None:
        self.tqdm.write(self.line(result), file=self.stream)
        self.bar.update(1)

    def close(self) -> None:
        self.bar.close()


class RichProgress(Progress):
    style = "rich"

    def __init__(self, total: int, stream: TextIO) -> None:
        super().__init__(total, stream)
        rp: Any = importlib.import_module("rich.progress")
        console: Any = importlib.import_module("rich.console").Console(file=stream)
        self.progress: Any = rp.Progress(
            rp.TextColumn("{task.description}"),
            rp.BarColumn(),
            rp.MofNCompleteColumn(),
            rp.TimeElapsedColumn(),
            rp.TimeRemainingColumn(),
            console=console,
            transient=True,
        )
        self.task: Any = self.progress.add_task("rsock.bench", total=total)
        self.progress.start()

    def message(self, text: str) -> None:
        self.progress.console.print(text, markup=False, highlight=False)

    def start(self, index: int, name: str) -> None:
        super().start(index, name)
        self.progress.update(self.task, description=name)

    def done(self, result: str) -> None:
        self.message(self.line(result))
        self.progress.advance(self.task)

    def close(self) -> None:
        self.progress.stop()


def make(style: str, total: int, stream: TextIO | None = None) -> Progress:
    """A progress display of ``style`` (``auto`` resolved for ``stream``, stderr)."""
    out = sys.stderr if stream is None else stream
    kinds: dict[str, type[Progress]] = {
        "off": Progress,
        "log": LogProgress,
        "text": TextProgress,
        "tqdm": TqdmProgress,
        "rich": RichProgress,
    }
    return kinds[resolve(style, out)](total, out)
