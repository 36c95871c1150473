"""``make test-cpython``: CPython's own networking tests under rsock, against a
stdlib run of the same tests in the same job.

    python tests/cpython/compare.py STDLIB.xml RSOCK.xml tests/cpython/expected.txt \
        [--rerun RERUN.xml] [--write-rerun DIR]

Reads the two ``python -m test --junit-xml`` reports, prints a table per module
(stdlib passes, rsock passes, listed differences, unexpected regressions) and
exits 1 if a test that passes on the stdlib fails, errors or skips under rsock without
being listed in the expected file (one test id per line, then ``#`` and the
README difference it comes from), or if a module that has listed differences has
no passing test in the stdlib run (its run died: the comparison would be empty).

A test that fails under rsock when the whole set runs (two at a time) may pass
alone: ``--write-rerun DIR`` writes the unexpected failures as a regrtest
``--matchfile`` (``DIR/rerun.match``) and their modules (``DIR/rerun.modules``),
and ``--rerun RERUN.xml`` (the report of running them again, alone) lets a test
that passes there count, printed as FLAKY so that it stays visible."""

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
    args = list(argv[1:])
    rerun_xml = write_dir = None
    if "--rerun" in args:
        i = args.index("--rerun")
        rerun_xml = args[i + 1]
        del args[i : i + 2]
    if "--write-rerun" in args:
        i = args.index("--write-rerun")
        write_dir = args[i + 1]
        del args[i : i + 2]
    std, rs, listed = outcomes(args[0]), outcomes(args[1]), expected(args[2])
    again = outcomes(rerun_xml) if rerun_xml else {}
    rows: dict[str, list[int]] = defaultdict(lambda: [0, 0, 0, 0])
    unexpected: list[str] = []
    flaky: list[str] = []
    for test, result in std.items():
        row = rows[module_of(test)]
        row[0] += result == "pass"
        got = rs.get(test, "missing")
        if result == "pass" and got != "pass" and again.get(test) == "pass":
            flaky.append(test)
            got = "pass"
        row[1] += got == "pass"
        if result == "pass" and got != "pass":  # failed, errored, skipped or missing
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
    for t in flaky:
        print(f"FLAKY (failed in the full run, passed alone): {t}")
    for t in unexpected:
        print(f"UNEXPECTED REGRESSION: {t}")
    # a module whose stdlib run died (the per-file timeout, a crash) drops out of
    # the table without a failure of its own: those with listed differences must be there
    lost = sorted({module_of(t) for t in listed} - {m for m, r in rows.items() if r[0]})
    for m in lost:
        print(f"NOT IN THE STDLIB RUN (timed out or crashed? see stdlib.log): {m}")
    if write_dir is not None:
        with open(f"{write_dir}/rerun.match", "w", encoding="utf-8") as f:
            f.writelines(f"{t}\n" for t in unexpected)
        modules = sorted({module_of(t) for t in unexpected})
        with open(f"{write_dir}/rerun.modules", "w", encoding="utf-8") as f:
            f.write(" ".join(modules) + "\n")
    return 1 if unexpected or lost else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
