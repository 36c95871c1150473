"""The link graphs of rsock: which C file of the engine calls into which,
and which Python module of the package imports which.

    python native/linkgraph.py            print it
    python native/linkgraph.py --check F  fail unless F holds it, between
                                          the lines <!-- linkgraph:begin -->
                                          and <!-- linkgraph:end -->

C: each native/src/*.c is compiled on its own (``cc -c``) and ``nm`` lists
the global symbols it defines and the ones it uses; a file that uses a
symbol another file defines links to it.  Python: the imports of rsock's
own modules in each module of rsock/ (at module level: what importing it
loads; an import inside a function is a later, lazy one, listed apart).
One line per file, its links sorted, then the cycles (the groups of files
that reach each other), so that the architecture page's graphs are the
code's and cannot go stale: ``make lint`` runs the check.
"""

from __future__ import annotations

import ast
import subprocess
import sys
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parent
BEGIN, END = "<!-- linkgraph:begin -->", "<!-- linkgraph:end -->"


def _symbols(obj: Path, *flags: str) -> set[str]:
    out = subprocess.run(["nm", *flags, str(obj)], capture_output=True, text=True, check=True)
    return {line.split()[-1] for line in out.stdout.splitlines() if line.strip()}


def links() -> dict[str, set[str]]:
    """file -> the files whose symbols it uses."""
    sources = sorted((HERE / "src").glob("*.c"))
    defined: dict[str, str] = {}
    used: dict[str, set[str]] = {}
    with tempfile.TemporaryDirectory() as tmp:
        for src in sources:
            obj = Path(tmp) / (src.stem + ".o")
            subprocess.run(
                ["cc", "-c", "-std=gnu11", "-D_GNU_SOURCE", "-I", str(HERE / "include"),
                 "-I", str(HERE / "src"), "-o", str(obj), str(src)],
                check=True,
            )  # fmt: skip
            for sym in _symbols(obj, "-g", "--defined-only"):
                defined[sym] = src.name
            used[src.name] = _symbols(obj, "-u")
    return {
        name: {defined[s] for s in syms if s in defined and defined[s] != name}
        for name, syms in used.items()
    }


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected groups of more than one file (Tarjan's)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    groups: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        for w in sorted(graph.get(v, ())):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            group = []
            while True:
                w = stack.pop()
                group.append(w)
                if w == v:
                    break
            if len(group) > 1:
                groups.append(sorted(group))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return sorted(groups)


def imports() -> tuple[dict[str, set[str]], dict[str, set[str]]]:
    """module -> rsock modules it imports at module level; and in functions."""
    package = HERE.parent / "rsock"
    names = {p.stem for p in package.glob("*.py")} | {"_native", "_fastcall"}
    top: dict[str, set[str]] = {}
    lazy: dict[str, set[str]] = {}
    for path in sorted(package.glob("*.py")):
        tree = ast.parse(path.read_text(), str(path))
        top[path.stem], lazy[path.stem] = set(), set()
        for node in ast.walk(tree):
            found: set[str] = set()
            if isinstance(node, ast.ImportFrom) and node.module:
                if node.module == "rsock":
                    found = {a.name for a in node.names if a.name in names}
                elif node.module.startswith("rsock."):
                    found = {node.module.split(".")[1]}
            elif isinstance(node, ast.Import):
                found = {a.name.split(".")[1] for a in node.names if a.name.startswith("rsock.")}
            found.discard(path.stem)
            if not found:
                continue
            in_function = any(
                isinstance(p, (ast.FunctionDef, ast.AsyncFunctionDef)) and node in list(ast.walk(p))
                for p in ast.walk(tree)
            )
            typing_only = any(
                isinstance(p, ast.If)
                and "TYPE_CHECKING" in ast.unparse(p.test)
                and node in list(ast.walk(p))
                for p in ast.walk(tree)
            )
            if typing_only:
                continue
            (lazy if in_function else top)[path.stem] |= found
    for m in top:
        lazy[m] -= top[m]
    return top, lazy


def _lines(graph: dict[str, set[str]], extra: dict[str, set[str]] | None = None) -> list[str]:
    out = []
    for name, to in sorted(graph.items()):
        line = f"{name} -> {', '.join(sorted(to)) or '(none)'}"
        if extra and extra.get(name):
            line += f"  (later: {', '.join(sorted(extra[name]))})"
        out.append(line)
    found = cycles(graph)
    out.append("cycles: " + ("; ".join(" <-> ".join(g) for g in found) if found else "none"))
    return out


def render() -> str:
    top, lazy = imports()
    lines = ["C (native/src):", *_lines(links()), "", "Python (rsock/, at import):"]
    lines += _lines(top, lazy)
    return "\n".join(lines) + "\n"


def main(argv: list[str]) -> int:
    text = render()
    if not argv:
        sys.stdout.write(text)
        return 0
    if len(argv) != 2 or argv[0] != "--check":
        sys.stderr.write(__doc__ or "")
        return 2
    page = Path(argv[1]).read_text()
    try:
        inside = page.split(BEGIN, 1)[1].split(END, 1)[0]
    except IndexError:
        sys.stderr.write(f"{argv[1]}: no {BEGIN} ... {END} block\n")
        return 1
    block = inside.strip().removeprefix("```text").removesuffix("```").strip() + "\n"
    if block != text:
        sys.stderr.write(
            f"{argv[1]}: the link graph is stale; the code's is:\n\n{text}\n"
            f"(python native/linkgraph.py prints it)\n"
        )
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
