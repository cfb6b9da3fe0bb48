"""`gpuenv build` when every selected image is up to date, answered before Typer loads.

A no-op build is what CI and every `make`-style wrapper run most often, and Python plus
Typer's import alone cost more than the check itself (issue 15: <= 0.15x a warm `docker
build`). So `main()` first gives a plain `gpuenv build [PATTERN...] [-f FILE] [--json]` to
`answered()`. It prints the verb's own table or JSON, but only when the answer is "nothing
to build":

- the answer remembered the last time (gpuenv/verdict.py), while every input the plan read
  is as it was and the engine still has each image by the same ID; else
- the plan's: the same domain code the verb runs (the snapshot, render_all, make_plan),
  which it then remembers.

Anything else returns False and the whole CLI takes over from the start, so there is one
source of truth for every build, error and message:

- any other option or spelling (`--no-cache`, `--dry-run`, `--`, `-fFILE`, `--help`, ...);
- $GPUENV_REGISTRY set (its value is checked by the verb);
- a cell to build or pull, a missing base, or any error at all (the verb reports it).

It reads and prints; it writes nothing the verb would not (bar the verdict), so falling
through is safe.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from gpuenv.plan import BuildPlan
    from gpuenv.project import Project
    from gpuenv.results import CellResult

_NO_VALUE = ("--json",)
_FILE = ("-f", "--file")


def parse(args: list[str]) -> tuple[list[str], Path | None, bool] | None:
    """(patterns, -f FILE, --json) for the spellings this path takes; None otherwise."""
    patterns: list[str] = []
    file: Path | None = None
    as_json = False
    rest = iter(args)
    for arg in rest:
        if arg in _FILE:
            value = next(rest, None)
            if value is None or file is not None or value.startswith("-"):
                return None
            file = Path(value)
        elif arg.startswith("--file="):
            if file is not None or arg == "--file=":
                return None
            file = Path(arg.removeprefix("--file="))
        elif arg in _NO_VALUE:
            as_json = True
        elif arg.startswith("-") or not arg:
            return None
        else:
            patterns.append(arg)
    return patterns, file, as_json


def answered(args: list[str]) -> bool:
    """True when the build had nothing to do and its result is printed; False to let the
    CLI handle the invocation from the start."""
    parsed = parse(args)
    if parsed is None or os.environ.get("GPUENV_REGISTRY"):
        return False
    from gpuenv.cli.signals import interrupted_code, interrupted_message, on_sigterm_raise

    on_sigterm_raise()
    try:
        text = answer(*parsed)
    except KeyboardInterrupt as exc:  # nothing was started: say so and stop, as the verb does
        code = interrupted_code(exc)
        print(interrupted_message(code), file=sys.stderr)
        sys.exit(code)
    except Exception:  # whatever it is, the verb meets it again and says it the one way
        return False
    if text is None:
        return False
    sys.stdout.write(text)
    sys.stdout.flush()
    return True


def answer(patterns: list[str], file: Path | None, as_json: bool) -> str | None:
    """What the build prints when every selected cell is up to date, else None: the
    remembered answer (gpuenv/verdict.py) while nothing it was made from has changed, or
    the plan's (which is then remembered)."""
    from gpuenv import verdict
    from gpuenv.terminal import colour_wanted

    colour = colour_wanted()
    text = verdict.recall(file, patterns, as_json=as_json, colour=colour)
    if text is not None:
        return text
    found = _planned(patterns, file)
    if found is None:
        return None
    results, plan, project = found
    answers = _answers(results)
    if project.snapshot is not None:  # the inputs the plan was made from, known exactly
        images = {p.cell.image: p.existing.id for p in plan.cells if p.existing}
        bases = {p.cell.base.image: p.base_id for p in plan.cells if p.base_id}
        verdict.remember(
            file,
            patterns,
            inputs_key=project.snapshot.key,
            depends=project.snapshot.depends,
            bundle=plan.ca_bundle,
            images={**bases, **images},
            answer=answers,
        )
    return answers["json" if as_json else "colour" if colour else "table"]


def _answers(results: list[CellResult]) -> dict[str, str]:
    """The verb's output for these results, in each form it can take."""
    import json

    from gpuenv.results import summary_text

    as_json = json.dumps({"results": [r.to_json() for r in results]}, indent=2) + "\n"
    return {
        "table": summary_text(results, colour=False),
        "colour": summary_text(results, colour=True),
        "json": as_json,
    }


def up_to_date(patterns: list[str], file: Path | None) -> list[CellResult] | None:
    """The cells' results when every one is up to date (status "cached"), else None."""
    found = _planned(patterns, file)
    return found[0] if found else None


def _planned(
    patterns: list[str], file: Path | None
) -> tuple[list[CellResult], BuildPlan, Project] | None:
    """The plan's results, the plan and the project, when every cell is up to date."""
    from gpuenv import engine, plan
    from gpuenv.project import open_project
    from gpuenv.results import CellResult

    project = open_project(file, cached=True)  # a snapshot miss loads it the long way
    cells = project.select(patterns)
    bundle = project.ca_bundle(None)
    contexts = plan.render_all(project, cells)
    the_plan = plan.make_plan(engine.connect(), project, cells, ca_bundle=bundle, contexts=contexts)
    results = []
    for p in the_plan.cells:
        if p.action != "up-to-date" or p.existing is None:
            return None
        results.append(CellResult(p.cell, "cached", p.existing.id, p.existing.size))
    return results, the_plan, project
