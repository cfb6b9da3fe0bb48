"""The `gpuenv` command line: a thin Typer layer over the modules that do the work.

Heavy modules (docker, jinja2, pydantic via the matrix) are imported inside the commands
so that `gpuenv --help` and `gpuenv run` stay fast.
"""

from __future__ import annotations

import json
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer

if TYPE_CHECKING:
    from gpuenv.compat import Resolution
    from gpuenv.matrix import LoadedMatrix

app = typer.Typer(
    name="gpuenv",
    help="Reproducible CPU and GPU Docker environments for TensorFlow, from one matrix.yaml.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
    context_settings={"help_option_names": ["-h", "--help"]},
)

FileOption = Annotated[
    Path | None,
    typer.Option(
        "-f",
        "--file",
        help="Matrix file [default: ./matrix.yaml, or $GPUENV_MATRIX]",
        show_default=False,
    ),
]
Patterns = Annotated[
    list[str] | None,
    typer.Argument(
        help="Shell-style globs over cell names, e.g. 'tf2.21-*-gpu'", show_default=False
    ),
]
JsonOption = Annotated[bool, typer.Option("--json", help="Print JSON instead of a table")]
CaOption = Annotated[
    Path | None,
    typer.Option(
        "--ca-bundle",
        help="PEM bundle to trust while installing [default: build.ca_bundle, "
        "$GPUENV_CA_BUNDLE, $PIP_CERT]",
        show_default=False,
    ),
]


def fail(message: str, code: int = 1) -> typer.Exit:
    print(f"error: {message}", file=sys.stderr)
    return typer.Exit(code)


@contextmanager
def user_errors(exit_code: int | None = None) -> Iterator[None]:
    """Turn GpuenvError into one `error:` line and an exit code, never a traceback."""
    from gpuenv.errors import GpuenvError

    try:
        yield
    except GpuenvError as exc:
        raise fail(exc.message, exit_code or exc.exit_code) from None
    except KeyboardInterrupt:
        raise fail("interrupted", 130) from None


def load(file: Path | None) -> tuple[LoadedMatrix, Resolution]:
    from gpuenv import compat, matrix

    m = matrix.load(matrix.matrix_path(file))
    return m, compat.resolve(m)


@app.command("matrix")
def matrix_cmd(
    patterns: Patterns = None,
    file: FileOption = None,
    as_json: JsonOption = False,
    show_all: Annotated[
        bool, typer.Option("--all", help="Also list rejected combinations, with the reason")
    ] = False,
) -> None:
    """List the matrix's resolved cells."""
    from gpuenv.selection import select

    with user_errors():
        m, res = load(file)
        cells = select(res.cells, patterns, m.path)
    if as_json:
        doc = {
            "cells": [c.to_json() for c in cells],
            "rejected": res.rejected,
            "defaults": {
                "cpu": res.default_cpu.name if res.default_cpu else None,
                "gpu": res.default_gpu.name if res.default_gpu else None,
            },
        }
        print(json.dumps(doc, indent=2))
        return
    rows = [("CELL", "IMAGE", "PYTHON", "TENSORFLOW", "CUDA", "CUDNN", "BASE")]
    for c in cells:
        default = " *" if c in (res.default_cpu, res.default_gpu) else ""
        rows.append((
            c.name + default, c.image, c.python, c.framework_version,
            c.cuda_release or "-", c.wheels.get("nvidia-cudnn-cu12", "-"), c.base.describe(),
        ))  # fmt: skip
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    for r in rows:
        print("  ".join(v.ljust(w) for v, w in zip(r, widths, strict=True)).rstrip())
    print("(* default cells used by `gpuenv run`)")
    if show_all and res.rejected:
        print("\nrejected:")
        for r in res.rejected:
            values = ", ".join(f"{k} {v}" for k, v in r.items() if k != "reason")
            print(f"  {values}: {r['reason']}")
    elif res.rejected:
        print(f"({len(res.rejected)} combination(s) rejected; `gpuenv matrix --all` says why)")


@app.command("render")
def render_cmd(
    patterns: Patterns = None,
    file: FileOption = None,
    output: Annotated[
        Path, typer.Option("-o", "--output", help="Directory for the build contexts")
    ] = Path("build"),
    ca_bundle: CaOption = None,
) -> None:
    """Write each cell's build context (Dockerfile + cell.json) to OUTPUT/<cell>/."""
    from gpuenv import build

    with user_errors():
        m, res = load(file)
        from gpuenv.selection import select

        cells = select(res.cells, patterns, m.path)
        options = build.render_options(m, ca_bundle)
        from gpuenv.render import render

        contexts = [render(c, options) for c in cells]
        for ctx in contexts:
            try:
                target = ctx.write(output)
            except OSError as exc:
                raise fail(f"{output}: cannot write: {exc.strerror}") from None
            print(target)


@app.command("base")
def base_cmd(patterns: Patterns = None, file: FileOption = None) -> None:
    """Make the local Debian base images the selected cells need (mmdebstrap)."""
    from gpuenv import base, engine
    from gpuenv.selection import select

    with user_errors():
        m, res = load(file)
        cells = select(res.cells, patterns, m.path)
        eng = engine.connect()
        done: set[str] = set()
        for cell in cells:
            if cell.base.image in done:
                continue
            done.add(cell.base.image)
            image_id = base.ensure(eng, cell.base, lambda msg: print(f"gpuenv: {msg}"))
            print(f"{cell.base.image}  {image_id[:19]}")


@app.command("build")
def build_cmd(
    patterns: Patterns = None,
    file: FileOption = None,
    jobs: Annotated[int, typer.Option("-j", "--jobs", min=1, help="Cells built at once")] = 1,
    keep_going: Annotated[
        bool, typer.Option("--keep-going", help="Build the other cells when one fails")
    ] = False,
    no_cache: Annotated[
        bool, typer.Option("--no-cache", help="Rebuild even up-to-date cells, without the cache")
    ] = False,
    validate: Annotated[
        bool, typer.Option("--validate", help="Validate the images after building")
    ] = False,
    as_json: JsonOption = False,
    ca_bundle: CaOption = None,
) -> None:
    """Build the selected cells (all by default) into labelled images."""
    from gpuenv import build, engine
    from gpuenv.progress import ConsoleReporter, summary
    from gpuenv.selection import select

    if validate:
        raise fail("--validate needs `gpuenv validate`, which is not built yet", 2)
    reporter = None
    try:
        with user_errors():
            m, res = load(file)
            cells = select(res.cells, patterns, m.path)
            req = build.BuildRequest(
                matrix=m,
                cells=cells,
                ca_bundle=build.ca_bundle_for(m, ca_bundle),
                jobs=jobs,
                keep_going=keep_going,
                no_cache=no_cache,
            )
            eng = engine.connect()
            reporter = ConsoleReporter()
            results = build.build_cells(eng, req, reporter)
            reporter.close()
            if as_json:
                print(json.dumps({"results": [r.to_json() for r in results]}, indent=2))
            else:
                summary(results)
            build.ensure_no_failures(results)
    finally:
        if reporter is not None:
            reporter.close()


def main() -> None:
    app()


if __name__ == "__main__":
    main()
