"""docs/proven.md, "What is proven where": every test it names exists and is collected by
pytest, every row names a test or says what was not shown, and the README links it on its
first screen (issue 27).

A reference is a backticked path under tests/, optionally with a pytest node id's parts:
`tests/unit/test_x.py`, `tests/unit/test_x.py::test_name`,
`tests/integration/test_y.py::test_name[param-id]`, `tests/unit/test_x.py::Class::test_name`.
A path that is not a test module (`tests/unit/recorded/`) need only exist.
"""

from __future__ import annotations

import ast
import functools
import re
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
PROVEN = REPO / "docs" / "proven.md"
README = REPO / "README.md"
TITLE = "What is proven where"
FIRST_SCREEN = 25  # README lines a reader sees before scrolling

REFERENCE = re.compile(r"`(tests/[^`\s]+)`")
NOT_SHOWN = ("not shown", "never", "not a feature", "no test")
Reference = tuple[str, list[str], str | None]  # path, names in it, parameter id

# The capabilities the table must keep a row for (issue 27), as words of the row's first cell.
REQUIRED_ROWS = (
    "rootful",
    "Docker Desktop",
    "TLS",
    "rootless",
    "podman",
    "ssh://",
    "buildx",
    "GPU",
    "Kubernetes",
    "Slurm",
    "arm64",
    "registr",
    "offline",
    "reproducible",
    "private index",
    "validation",
    "lock",
)


def _table(text: str) -> list[list[str]]:
    """The rows (cells stripped) of the first Markdown table after the title heading."""
    start = text.index(f"# {TITLE}")
    rows: list[list[str]] = []
    for line in text[start:].splitlines():
        if line.startswith("|"):
            rows.append([c.strip() for c in line.strip().strip("|").split("|")])
        elif rows:
            break
    header, rule, *body = rows
    assert set("".join(rule)) <= set("-: "), rule
    assert len(header) == 3, header
    return body


def _split(reference: str) -> Reference:
    """`path::A::b[p]` -> ("path", ["A", "b"], "p")."""
    path, *names = reference.split("::")
    param = None
    if names and names[-1].endswith("]") and "[" in names[-1]:
        names[-1], param = names[-1][:-1].split("[", 1)
    return path, names, param


@functools.cache
def _module(path: Path) -> ast.Module:
    """A test module's syntax tree, parsed once: the table names some modules 20 times."""
    return ast.parse(path.read_text(encoding="utf-8"))


def _defines(path: Path, names: list[str]) -> bool:
    """Whether the module defines names[0] (a function or class), and each next name in it."""
    body = _module(path).body
    kinds = ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef
    for name in names:
        found = next((n for n in body if isinstance(n, kinds) and n.name == name), None)
        if found is None:
            return False
        body = found.body if isinstance(found, ast.ClassDef) else []
    return True


def _references(text: str) -> list[str]:
    return list(dict.fromkeys(REFERENCE.findall(text)))


def test_every_row_names_a_test_or_says_what_was_not_shown():
    rows = _table(PROVEN.read_text(encoding="utf-8"))
    assert len(rows) >= len(REQUIRED_ROWS)
    for capability, shown_by, not_shown in rows:
        assert capability, rows
        has_test = bool(REFERENCE.search(shown_by))
        says_why = any(word in not_shown.lower() for word in NOT_SHOWN)
        assert has_test or says_why, f"{capability!r}: no test named and no reason given"
    capabilities = " ".join(row[0] for row in rows)
    missing = [word for word in REQUIRED_ROWS if word.lower() not in capabilities.lower()]
    assert not missing, f"docs/proven.md has no row for {missing}"


def test_every_named_test_exists():
    problems = []
    for reference in _references(PROVEN.read_text(encoding="utf-8")):
        path, names, _ = _split(reference)
        file = REPO / path
        if not file.exists():
            problems.append(f"{reference}: {path} does not exist")
        elif names and not (file.suffix == ".py" and _defines(file, names)):
            problems.append(f"{reference}: {path} defines no {'::'.join(names)}")
    assert not problems, "docs/proven.md names what is not there:\n" + "\n".join(problems)


def _collect(files: list[str]) -> tuple[set[str], str]:
    """The node ids a separate pytest collects from ``files``, and the end of its output."""
    proc = subprocess.run(
        [sys.executable, "-m", "pytest", "--collect-only", "-q", "-p", "no:cacheprovider",
         "--rootdir", str(REPO), *files],
        cwd=REPO, capture_output=True, text=True, timeout=60, check=False,
    )  # fmt: skip
    collected = {line.strip() for line in proc.stdout.splitlines() if "::" in line}
    assert collected, proc.stdout[-2000:] + proc.stderr[-2000:]
    return collected, (proc.stdout[-2000:] if proc.returncode else "")


def _missing(references: list[Reference], collected: set[str]) -> list[Reference]:
    missing = []
    for path, names, param in references:
        node = "::".join([path, *names])
        if param is not None:
            found = f"{node}[{param}]" in collected
        else:
            found = any(c == node or c.startswith((f"{node}[", f"{node}::")) for c in collected)
        if not found:
            missing.append((path, names, param))
    return missing


def test_every_named_test_is_collected_by_pytest(request: pytest.FixtureRequest):
    references = [_split(r) for r in _references(PROVEN.read_text(encoding="utf-8")) if ".py" in r]
    # What this session collected answers for most (all of tests/unit in a full run); a
    # separate collection of the remaining files (tests/integration, or what -k or a narrower
    # run left out) answers for the rest.
    here = {item.nodeid for item in request.session.items}
    if request.config.rootpath != REPO:
        here = set()  # node ids relative to another root: ask the separate collection
    missing = _missing(references, here)
    files = sorted({path for path, _, _ in missing if (REPO / path).is_file()})
    output = ""
    if files:
        collected, output = _collect(files)
        missing = _missing(missing, collected)
    assert not missing, (
        "pytest collects none of: "
        + ", ".join("::".join([p, *n]) + (f"[{a}]" if a is not None else "") for p, n, a in missing)
        + ("\n" + output if output else "")
    )


def test_the_docs_name_only_test_paths_that_exist():
    for doc in (README, *sorted((REPO / "docs").glob("*.md"))):
        for reference in _references(doc.read_text(encoding="utf-8")):
            path = reference.split("::")[0]
            assert (REPO / path).exists(), f"{doc.name} names {path}, which does not exist"


def test_the_readme_links_the_table_on_its_first_screen():
    first = README.read_text(encoding="utf-8").splitlines()[:FIRST_SCREEN]
    assert any("](docs/proven.md)" in line for line in first), (
        f"README.md links docs/proven.md in none of its first {FIRST_SCREEN} lines"
    )


@pytest.mark.parametrize(
    ("reference", "split"),
    [
        ("tests/unit/test_x.py", ("tests/unit/test_x.py", [], None)),
        ("tests/unit/test_x.py::test_a", ("tests/unit/test_x.py", ["test_a"], None)),
        ("tests/i/test_y.py::test_b[netns-tls]", ("tests/i/test_y.py", ["test_b"], "netns-tls")),
        ("tests/i/test_y.py::test_b[a=1,b]", ("tests/i/test_y.py", ["test_b"], "a=1,b")),
        ("tests/unit/test_x.py::Case::test_c", ("tests/unit/test_x.py", ["Case", "test_c"], None)),
    ],
)
def test_references_split_into_path_names_and_parameter(reference, split):
    assert _split(reference) == split
