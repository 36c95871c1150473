"""``make test-cpython``: CPython's own networking tests under rsock, against a
stdlib run of the same tests in the same job.

    python tests/cpython/compare.py STDLIB.xml RSOCK.xml tests/cpython/expected.txt

Reads the two ``python -m test --junit-xml`` reports, prints a table per module
(stdlib passes, rsock passes, listed differences, unexpected regressions) and
exits 1 if a test that passes on the stdlib fails or errors under rsock without
being listed in the expected file (one test id per line, then ``#`` and the
README difference it comes from)."""

from __future__ import annotations

import sys
import xml.etree.ElementTree as ET
from collections import defaultdict


def outcomes(path: str) -> dict[str, str]:
    """test id (module.Class.method) -> pass / fail / skip."""
    out: dict[str, str] = {}
    for case in ET.parse(path).getroot().iter("testcase"):
        name = f"{case.get('classname', '')}.{case.get('name', '')}".lstrip(".")
        if case.find("skipped") is not None:
            out[name] = "skip"
        elif case.find("failure") is not None or case.find("error") is not None:
            out[name] = "fail"
        else:
            out[name] = "pass"
    return out


def expected(path: str) -> dict[str, str]:
    out: dict[str, str] = {}
    with open(path, encoding="utf-8") as f:
        for line in f:
            test, _, why = line.partition("#")
            if test.strip():
                out[test.strip()] = why.strip()
    return out


def module_of(test: str) -> str:
    parts = test.lstrip(".").split(".")
    if parts[:2] == ["test", "test_asyncio"]:
        return ".".join(parts[1:3])
    return parts[1] if parts[0] == "test" else parts[0]


def main(argv: list[str]) -> int:
    std, rs, listed = outcomes(argv[1]), outcomes(argv[2]), expected(argv[3])
    rows: dict[str, list[int]] = defaultdict(lambda: [0, 0, 0, 0])
    unexpected: list[str] = []
    for test, result in std.items():
        row = rows[module_of(test)]
        row[0] += result == "pass"
        got = rs.get(test, "missing")
        row[1] += got == "pass"
        if result == "pass" and got != "pass" and got != "skip":
            if test in listed:
                row[2] += 1
            else:
                row[3] += 1
                unexpected.append(test)
    print(f"{'module':40} {'stdlib':>7} {'rsock':>7} {'listed':>7} {'unexpected':>10}")
    for module in sorted(rows):
        a, b, c, d = rows[module]
        print(f"{module:40} {a:7} {b:7} {c:7} {d:10}")
    total = [sum(r[i] for r in rows.values()) for i in range(4)]
    print(f"{'total':40} {total[0]:7} {total[1]:7} {total[2]:7} {total[3]:10}")
    stale = [t for t in listed if std.get(t) == "pass" and rs.get(t) == "pass"]
    for t in stale:
        print(f"listed but passes now (remove it): {t}")
    for t in unexpected:
        print(f"UNEXPECTED REGRESSION: {t}")
    return 1 if unexpected else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
