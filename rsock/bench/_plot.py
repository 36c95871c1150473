"""``--plot``: latency and bandwidth against message size (needs matplotlib).

Input is plain data (one :class:`Series` per transport and api), so this module does
not depend on the runner; matplotlib is imported only by :func:`write_plot`, with the
non-interactive Agg backend.
"""

from __future__ import annotations

import importlib
import importlib.util
from dataclasses import dataclass, field
from typing import Any

INSTALL_HINT = "pip install 'rsock[bench]' (or: pip install matplotlib)"


def have_matplotlib() -> bool:
    return importlib.util.find_spec("matplotlib") is not None


@dataclass
class Series:
    """One line of a panel: ``points`` are (size in bytes, value, low, high)."""

    label: str
    transport: str
    api: str
    points: list[tuple[int, float, float, float]] = field(default_factory=list)


@dataclass
class PlotData:
    title: str
    latency: list[Series]  # ping-pong RTT p50 in µs; low, high = min, p90
    bandwidth: list[Series]  # stream GB/s median; low, high = min, max of the reps


COLORS = {
    "rsock": "tab:blue",
    "rsock:shm": "tab:cyan",
    "rsock:verbs": "tab:purple",
    "tcp": "tab:orange",
    "unix": "tab:green",
    "ucxx": "tab:red",
}
STYLES = {"sync": "-", "asyncio": "--"}
MARKERS = {"sync": "o", "asyncio": "s"}


def size_label(n: int) -> str:
    for unit, scale in (("G", 1 << 30), ("M", 1 << 20), ("K", 1 << 10)):
        if n >= scale and n % scale == 0:
            return f"{n // scale}{unit}"
    return str(n)


def _panel(ax: Any, series: list[Series], ylabel: str, title: str, log_y: bool) -> None:
    sizes: set[int] = set()
    for s in series:
        if not s.points:
            continue
        pts = sorted(s.points)
        xs = [p[0] for p in pts]
        ys = [p[1] for p in pts]
        lo = [max(p[1] - p[2], 0.0) for p in pts]
        hi = [max(p[3] - p[1], 0.0) for p in pts]
        sizes.update(xs)
        ax.errorbar(
            xs,
            ys,
            yerr=[lo, hi],
            label=s.label,
            color=COLORS.get(s.transport, "tab:gray"),
            linestyle=STYLES.get(s.api, "-"),
            marker=MARKERS.get(s.api, "o"),
            markersize=4,
            capsize=2,
            linewidth=1.4,
        )
    ax.set_xscale("log", base=2)
    if log_y:
        ax.set_yscale("log")
    ticks = sorted(sizes)
    if ticks:
        ax.set_xticks(ticks)
        ax.set_xticklabels([size_label(t) for t in ticks], rotation=45)
        ax.minorticks_off()
    ax.set_xlabel("message size (bytes)")
    ax.set_ylabel(ylabel)
    ax.set_title(title, fontsize=10)
    ax.grid(True, which="major", alpha=0.3)
    if any(s.points for s in series):
        ax.legend(fontsize=8)
    else:
        ax.text(0.5, 0.5, "not run", ha="center", va="center", transform=ax.transAxes)


def write_plot(path: str, data: PlotData, micro: str = "µs") -> None:
    """Two panels side by side: ping-pong RTT and stream throughput against size."""
    mpl: Any = importlib.import_module("matplotlib")
    mpl.use("Agg")
    plt: Any = importlib.import_module("matplotlib.pyplot")
    fig, (left, right) = plt.subplots(1, 2, figsize=(12, 4.8))
    try:
        _panel(
            left,
            data.latency,
            f"round-trip time p50 ({micro}), bars: min-p90",
            "ping-pong latency (lower is better)",
            log_y=True,
        )
        _panel(
            right,
            data.bandwidth,
            "GB/s (10^9 bytes/s), bars: min-max of reps",
            "stream bandwidth (higher is better)",
            log_y=True,
        )
        fig.suptitle(data.title, fontsize=9)
        fig.tight_layout()
        fig.savefig(path, dpi=110)
    finally:
        plt.close(fig)
