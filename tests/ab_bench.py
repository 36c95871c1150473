"""A/B of two builds of rsock with ``python -m rsock.bench``, interleaved.

    python tests/ab_bench.py A_ROOT B_ROOT ROUNDS OUT_DIR [bench options...]

A_ROOT and B_ROOT are checkouts with their own ``.venv`` (``make venv`` in each, e.g. a
``git worktree`` of the previous commit).  Each round runs the benchmark once from each,
alternating which goes first (A B, B A, A B, ...), so that a slow spell of the machine
falls on both alike; then, per case, the median of each build's per-run figures and B/A
(throughput and rates: > 1 is better; round-trip times: < 1 is better).  The raw JSON of
every run stays in OUT_DIR.  Run it on an otherwise idle machine.
"""

from __future__ import annotations

import json
import statistics
import subprocess
import sys
from pathlib import Path

# the figure each test is compared by, and whether higher is better
KEY = {
    "stream": "gbps_median",
    "msgrate": "msg_per_s_median",
    "pingpong": "rtt_us_p50",
    "connrate": "conn_per_s_median",
}


def main(argv: list[str]) -> int:
    if len(argv) < 4:
        print(__doc__, file=sys.stderr)
        return 2
    roots = {"A": argv[0], "B": argv[1]}
    rounds, out = int(argv[2]), Path(argv[3])
    extra = argv[4:]
    out.mkdir(parents=True, exist_ok=True)
    figures: dict[str, dict[tuple[object, ...], list[float]]] = {"A": {}, "B": {}}
    for r in range(rounds):
        for tag in ("A", "B") if r % 2 == 0 else ("B", "A"):
            path = out / f"{tag}{r}.json"
            cmd = [f"{roots[tag]}/.venv/bin/python", "-m", "rsock.bench", "--json", str(path)]
            subprocess.run(
                [*cmd, "--no-progress", *extra], cwd="/tmp", check=True, stdout=subprocess.DEVNULL
            )
            for c in json.loads(path.read_text())["cases"]:
                if c["status"] != "ok" or c["test"] not in KEY:
                    continue
                k = (c["label"], c["api"], c["loop"], c["test"], c["size"])
                figures[tag].setdefault(k, []).append(c["summary"][KEY[c["test"]]])
    print(f"{'case':50s} {'A':>12s} {'B':>12s} {'B/A':>6s}")
    for k in sorted(figures["A"], key=str):
        a = statistics.median(figures["A"][k])
        b = statistics.median(figures["B"].get(k, [float("nan")]))
        name = " ".join(str(x) for x in k if x is not None)
        print(f"{name:50s} {a:12.3f} {b:12.3f} {b / a:6.3f}  {KEY[str(k[3])]}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
