"""What both benchmarks (``python -m rsock.bench`` and its ``apps``) record of the
machine they ran on."""

from __future__ import annotations

import datetime
import importlib.metadata
import os
import platform
import sys
from pathlib import Path
from typing import Any


def cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown"


def package_version(name: str) -> str | None:
    try:
        return importlib.metadata.version(name)
    except importlib.metadata.PackageNotFoundError:
        return None


def host(pin: str, cpus: tuple[int, int] | list[int]) -> dict[str, Any]:
    """Date, Python, CPU model and count, kernel, and where server and client ran."""
    return {
        "date": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
        "python": platform.python_version(),
        "implementation": platform.python_implementation(),
        "executable": sys.executable,
        "cpu_model": cpu_model(),
        "cpu_count": os.cpu_count(),
        "kernel": f"{platform.system()} {platform.release()}",
        "machine": platform.machine(),
        "pin": pin,
        "pin_cpus": {"server": cpus[0], "client": cpus[1]},
    }
