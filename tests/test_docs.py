"""The documentation is tested: README.md, CHANGELOG.md and docs/*.md.

Conventions for whoever writes them:

* Every fenced block whose info string is ``python`` is a program.  It is run as
  it stands, alone, in a fresh interpreter (``sys.executable``), in an empty
  temporary directory, with this suite's environment, and must exit with status 0
  within ``BLOCK_TIMEOUT`` seconds.  The suite sets ``RSOCK_FALLBACK=never``
  (``tests/conftest.py``), so an example's connections must take rsock's fast
  path.  An example is therefore self-contained: its server and its client in one
  program, ports chosen by the OS (port 0), no files but those it makes itself.
* A fragment that is not a whole program (a signature, an excerpt, an interactive
  session) is fenced as ``text`` instead; shell blocks (``sh``, ``console``) are
  not run either.  There is no other way to exempt a ``python`` block.
* Every relative link, ``[...](path)``, ``[...](path#anchor)`` or ``[...](#anchor)``,
  resolves to a file inside the repository, and its anchor, if any, to a heading
  of that file (GitHub's heading anchors).  Links with a scheme (``https:``) are
  not followed.

And three checks that keep the reference pages from going stale:

* every ``RSOCK_*`` environment variable the code reads is named in docs/guide.md;
* every name in ``rsock.__all__`` and ``rsock.asyncio.__all__`` is named in
  docs/api.md;
* the link graphs in docs/architecture.md (between its ``linkgraph`` markers) are the
  ones ``native/linkgraph.py`` finds in the code now.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from collections import Counter
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
DOCS = sorted([ROOT / "README.md", ROOT / "CHANGELOG.md", *(ROOT / "docs").glob("*.md")])
BLOCK_TIMEOUT = 60.0  # s, per example program

_FENCE = re.compile(r"^(\s*)(`{3,}|~{3,})\s*([^`\s]*)")
_HEADING = re.compile(r"^(#{1,6})\s+(.*?)\s*#*\s*$")
_INLINE_CODE = re.compile(r"(`+)(?:(?!\1).)+\1")
_LINK = re.compile(r"!?\[[^\]]*\]\(\s*<?([^)\s>]+)>?(?:\s+\"[^\"]*\")?\s*\)")


def _rel(path: Path) -> str:
    return str(path.relative_to(ROOT))


def _split(path: Path) -> tuple[list[tuple[int, str, str]], list[tuple[int, str]]]:
    """The fenced blocks of a Markdown file (first line number, info string, text)
    and its prose lines (line number, text) outside them."""
    blocks: list[tuple[int, str, str]] = []
    prose: list[tuple[int, str]] = []
    fence: str | None = None
    start, info, body = 0, "", []
    for n, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
        m = _FENCE.match(line)
        if fence is None:
            if m:
                fence, start, info, body = m.group(2), n, m.group(3).lower(), []
            else:
                prose.append((n, line))
        elif m and m.group(2).startswith(fence) and not m.group(3):
            blocks.append((start, info, "\n".join(body) + "\n"))
            fence = None
        else:
            body.append(line)
    assert fence is None, f"{_rel(path)}:{start}: a fenced block is never closed"
    return blocks, prose


def _examples() -> list[pytest.param]:
    out = []
    for path in DOCS:
        for line, info, code in _split(path)[0]:
            if info == "python":
                out.append(pytest.param(code, id=f"{_rel(path)}:{line}"))
    return out


EXAMPLES = _examples()


def test_the_docs_have_examples() -> None:
    assert len(EXAMPLES) >= 5, [p.id for p in EXAMPLES]


@pytest.mark.timeout_s(BLOCK_TIMEOUT + 30)
@pytest.mark.parametrize("code", EXAMPLES)
def test_python_example_runs(code: str, tmp_path: Path) -> None:
    program = tmp_path / "example.py"
    program.write_text(code, encoding="utf-8")
    assert os.environ.get("RSOCK_FALLBACK") == "never"  # (tests/conftest.py)
    proc = subprocess.run(
        [sys.executable, str(program)],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=BLOCK_TIMEOUT,
        check=False,
    )
    assert proc.returncode == 0, f"exit status {proc.returncode}\n{proc.stdout}{proc.stderr}"


def _slug(heading: str) -> str:
    """GitHub's anchor of a heading: Markdown links reduced to their text,
    lower case, punctuation but ``-`` and ``_`` dropped, spaces to hyphens."""
    text = re.sub(r"\[([^\]]*)\]\([^)]*\)", r"\1", heading).strip().lower()
    return re.sub(r"[^\w\- ]", "", text).replace(" ", "-")


def _anchors(path: Path) -> set[str]:
    seen: Counter[str] = Counter()
    anchors = set()
    for _, line in _split(path)[1]:
        m = _HEADING.match(line)
        if m:
            slug = _slug(m.group(2))
            anchors.add(slug if not seen[slug] else f"{slug}-{seen[slug]}")
            seen[slug] += 1
    return anchors


def test_relative_links_resolve() -> None:
    broken = []
    for path in DOCS:
        for n, line in _split(path)[1]:
            for target in _LINK.findall(_INLINE_CODE.sub("", line)):
                if re.match(r"[a-zA-Z][a-zA-Z0-9+.-]*:", target):
                    continue  # https:, mailto:, ...
                where = f"{_rel(path)}:{n}: {target}"
                file, _, anchor = target.partition("#")
                dest = (path.parent / file).resolve() if file else path
                if not dest.is_relative_to(ROOT):
                    broken.append(f"{where} (outside the repository)")
                elif not dest.exists():
                    broken.append(f"{where} (no such file)")
                elif anchor and dest.suffix == ".md" and anchor not in _anchors(dest):
                    broken.append(f"{where} (no such heading in {_rel(dest)})")
    assert not broken, "\n".join(broken)


def test_every_environment_variable_is_in_the_guide() -> None:
    """Every RSOCK_* name that rsock's Python quotes or its C code (engine, C
    tests) passes to getenv() is named in docs/guide.md."""
    names = set()
    for py in (ROOT / "rsock").rglob("*.py"):
        names.update(re.findall(r"[\"'](RSOCK_[A-Z0-9_]+)", py.read_text(encoding="utf-8")))
    for c in [*(ROOT / "native" / "src").glob("*.c"), *(ROOT / "native" / "tests").glob("*.c")]:
        names.update(re.findall(r"getenv\(\"(RSOCK_[A-Z0-9_]+)\"", c.read_text(encoding="utf-8")))
    assert "RSOCK_FALLBACK" in names and "RSOCK_WAKE" in names  # (the search works)
    guide = (ROOT / "docs" / "guide.md").read_text(encoding="utf-8")
    missing = sorted(n for n in names if not re.search(rf"`{n}[`=]", guide))
    assert not missing, f"not in docs/guide.md: {missing}"


def test_every_public_name_is_in_the_api_reference() -> None:
    import rsock
    import rsock.asyncio

    api = (ROOT / "docs" / "api.md").read_text(encoding="utf-8")
    missing = [
        f"{module.__name__}.{name}"
        for module in (rsock, rsock.asyncio)
        for name in module.__all__
        if not re.search(rf"`(?:{re.escape(module.__name__)}\.)?{re.escape(name)}\b", api)
    ]
    assert not missing, f"not in docs/api.md: {missing}"


@pytest.mark.timeout_s(120)
def test_the_link_graph_in_the_architecture_page() -> None:
    """``native/linkgraph.py`` (compiles each ``native/src/*.c`` alone, reads
    ``nm``, and parses rsock's imports) finds the graph that
    docs/architecture.md shows between its ``linkgraph`` markers."""
    script = ROOT / "native" / "linkgraph.py"
    if not (shutil.which("cc") and shutil.which("nm")):
        pytest.skip("cc and nm are needed")
    if not Path("/usr/include/infiniband/verbs.h").exists():
        pytest.skip("rdma-core's headers are missing: the verbs provider would not be compiled")
    page = ROOT / "docs" / "architecture.md"
    proc = subprocess.run(
        [sys.executable, str(script), "--check", str(page)],
        capture_output=True,
        text=True,
        timeout=100,
        check=False,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
