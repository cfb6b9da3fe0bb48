"""The house's shape, held by tests: the CLI stays thin, and docs/architecture.md cites only
names that exist.

The names rule (read without importing gpuenv: the modules' syntax trees, so nothing runs):

- a module path, a backticked span ending in `.py` (`gpuenv/building/plan.py`,
  `building/plan.py`, `workloads/*.py`), must be the end of a file's path (a glob: match
  one at least) in the repository's gpuenv/, tests/, benchmarks/ or scripts/, or at its root;
- a dotted reference (`run.local.run`, `plan.make_plan`, `Engine.build_directory`), in a
  backticked span or in the data-flow diagram, whose first name is one of gpuenv's modules or
  packages (its last component: `plan`, `local`, `gpuenv`) or a class gpuenv defines, must
  resolve: some module whose dotted name ends with the reference's leading names, then a
  name that module defines or imports at its top level, then (for a class) a member of it.
  File names (`matrix.yaml`, `cell.json`) and labels (`io.gpuenv.inputs`) are not references.
"""

from __future__ import annotations

import ast
import functools
import re
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
GPUENV = REPO / "gpuenv"
ARCHITECTURE = REPO / "docs" / "architecture.md"
CLI_LIMIT = 250  # lines: a verb parses, calls the domain and prints (issue 47, item 7)

# Dotted spans that name keys of matrix.yaml or of the catalog's files, not code
# (`build.index_url` is no name of cli/build.py, `gpu.exact` none of gpuenv/gpu/).
NOT_CODE = frozenset({"build.index_url", "build.ca_bundle", "build.torch_cpu_index",
                      "gpu.exact", "gpu.release"})  # fmt: skip
ROOTS = ("gpuenv", "tests", "benchmarks", "scripts")
FILE_SUFFIXES = frozenset({"yaml", "yml", "json", "toml", "lock", "txt", "md", "pem", "sh"})
DOTTED = re.compile(r"[A-Za-z_]\w*(?:\.[A-Za-z_]\w*)+")


def test_no_cli_module_passes_the_limit():
    long = {
        str(path.relative_to(REPO)): n
        for path in sorted((GPUENV / "cli").rglob("*.py"))
        if (n := len(path.read_text(encoding="utf-8").splitlines())) > CLI_LIMIT
    }
    assert not long, f"CLI modules over {CLI_LIMIT} lines (move logic down or split): {long}"


@functools.cache
def _modules() -> dict[str, dict[str, set[str]]]:
    """gpuenv's modules by dotted name: each top-level name, with a class's members under it
    (a module's own names are under "")."""
    out: dict[str, dict[str, set[str]]] = {}
    for path in GPUENV.rglob("*.py"):
        parts = path.relative_to(REPO).with_suffix("").parts
        name = ".".join(parts[:-1] if parts[-1] == "__init__" else parts)
        names: dict[str, set[str]] = {"": set()}
        for node in ast.parse(path.read_text(encoding="utf-8")).body:
            if isinstance(node, ast.ClassDef):
                names[node.name] = {
                    n.name for n in node.body if isinstance(n, ast.FunctionDef | ast.ClassDef)
                } | {
                    t.id
                    for n in node.body
                    if isinstance(n, ast.AnnAssign | ast.Assign)
                    for t in (n.targets if isinstance(n, ast.Assign) else [n.target])
                    if isinstance(t, ast.Name)
                }
            if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
                names[""].add(node.name)
            elif isinstance(node, ast.Assign | ast.AnnAssign):
                targets = node.targets if isinstance(node, ast.Assign) else [node.target]
                names[""].update(t.id for t in targets if isinstance(t, ast.Name))
            elif isinstance(node, ast.ImportFrom | ast.Import):
                names[""].update((a.asname or a.name).split(".")[0] for a in node.names)
        out[name] = names
    # A package's submodules are names of it (`gpuenv.run.local` is `local` of `gpuenv.run`).
    for name in list(out):
        parent, _, last = name.rpartition(".")
        if parent in out:
            out[parent][""].add(last)
    return out


def _resolves(reference: str) -> bool:
    parts = reference.split(".")
    for cut in range(1, len(parts)):
        head, rest = ".".join(parts[:cut]), parts[cut:]
        for module, names in _modules().items():
            if module != head and not module.endswith("." + head):
                continue
            # A name of the module, or a member of a class of it: never deeper.
            member = len(rest) == 1 or (len(rest) == 2 and rest[1] in names.get(rest[0], ()))
            if rest[0] in names[""] and member:
                return True
    # A class alone as the first name (`Engine.build_directory`, `Fetcher.uv_soon`).
    return len(parts) == 2 and any(parts[1] in n.get(parts[0], ()) for n in _modules().values())


def _is_reference(span: str) -> bool:
    """Whether a dotted span claims to name code (see the module's docstring)."""
    if span in NOT_CODE or span.rsplit(".", 1)[1] in FILE_SUFFIXES | {"py"}:
        return False
    first = span.split(".", 1)[0]
    short = {m.rsplit(".", 1)[-1] for m in _modules()}
    classes = {c for names in _modules().values() for c in names if c}
    return first in short or first in classes


def cited(text: str) -> tuple[set[str], set[str]]:
    """(module paths, dotted references) that `text`, a design document, cites."""
    spans = re.findall(r"`([^`\n]+)`", text)
    flow = re.search(r"## Data flow.*?```\n(.*?)```", text, re.S)
    words = DOTTED.findall(flow.group(1)) if flow else []
    paths = {s for s in spans if re.fullmatch(r"[\w/*.-]+\.py", s)}
    references = {s for s in [*spans, *words] if DOTTED.fullmatch(s) and _is_reference(s)}
    return paths, references


def missing(text: str) -> list[str]:
    paths, references = cited(text)
    # A glob: a plain path matches itself where it exists, `*.py` one file at least.
    gone = [
        p
        for p in paths
        if not any(REPO.glob(p)) and not any(any((REPO / r).glob(f"**/{p}")) for r in ROOTS)
    ]
    gone += [r for r in references if not _resolves(r)]
    return sorted(gone)


def test_every_name_the_architecture_cites_exists():
    assert missing(ARCHITECTURE.read_text(encoding="utf-8")) == []


def test_a_stale_name_is_caught():
    """The rule finds what went stale before (`run.run`, `run.foreign_platform`: moved to
    run/local.py) and a module path that is gone, and takes the names that exist."""
    text = (
        "`run.local.run`, `plan.make_plan`, `building/plan.py`, `Engine.build_directory`, "
        "`io.gpuenv.inputs`, `matrix.yaml`, `build.index_url`, `run.run`, "
        "`run.foreign_platform`, `building/gone.py`\n"
        "## Data flow\n```\nbuild: project ─► plan.prepare ─► plan.no_such_step\n```\n"
    )
    assert missing(text) == [
        "building/gone.py", "plan.no_such_step", "run.foreign_platform", "run.run",
    ]  # fmt: skip
