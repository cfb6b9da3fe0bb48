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
    from gpuenv.build import CellResult
    from gpuenv.cell import Cell
    from gpuenv.compat import Resolution
    from gpuenv.engine import Engine
    from gpuenv.lock import Lock
    from gpuenv.matrix import LoadedMatrix
    from gpuenv.run import Target

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
        # `run` fails with 125 unless the error knows better (126: cannot invoke, 127: not found).
        code = exc.exit_code if exc.exit_code in (126, 127) else exit_code or exc.exit_code
        raise fail(exc.message, code) from None
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
        for entry in res.rejected:
            values = ", ".join(f"{k} {v}" for k, v in entry.items() if k != "reason")
            print(f"  {values}: {entry['reason']}")
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


def _normalize(eng: Engine, m: LoadedMatrix, results: list[CellResult]) -> None:
    from gpuenv import base, reproducible
    from gpuenv import lock as locks

    lock = locks.load(locks.lock_path(m.path))
    epoch = reproducible.epoch_for(
        lock.exclude_newer if lock else None, int(base.SOURCE_DATE_EPOCH)
    )
    for r in results:
        info = eng.image(r.cell.image) or {}
        if reproducible.is_normalized(info, epoch):
            print(
                f"{r.cell.image}  {str(info.get('Id'))[:19]}  already normalised", file=sys.stderr
            )
            continue
        image_id = reproducible.normalize(eng, r.cell.image, epoch)
        if info.get("Id") and info["Id"] != image_id:
            eng.remove_if_untagged(str(info["Id"]))
        print(f"{r.cell.image}  {image_id[:19]}  normalised", file=sys.stderr)


@app.command("base")
def base_cmd(
    patterns: Patterns = None,
    file: FileOption = None,
    save: Annotated[
        Path | None, typer.Option("--save", help="Also save each base as DIR/<name>.tar")
    ] = None,
    load_tar: Annotated[
        Path | None,
        typer.Option("--load", help="Load a saved base tarball into the engine, then exit"),
    ] = None,
) -> None:
    """Make the local Debian base images the selected cells need (mmdebstrap).

    Debian's archive moves on, so keep the base a lock names: --save writes it to a
    tarball, --load brings it back into any engine."""
    from gpuenv import base, engine
    from gpuenv.selection import select

    if load_tar is not None:
        with user_errors():
            for line in engine.load_image(engine.connect(), str(load_tar)):
                print(line)
        return
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
            if save is not None:
                save.mkdir(parents=True, exist_ok=True)
                target = save / (cell.base.image.replace("/", "-").replace(":", "-") + ".tar")
                engine.save_image(eng, cell.base.image, str(target))
                print(f"saved {target}")


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
    reproducible: Annotated[
        bool,
        typer.Option(
            "--reproducible",
            help="Normalise the built images (timestamps, build traces) so that the same "
            "inputs give the same image ID",
        ),
    ] = False,
    as_json: JsonOption = False,
    ca_bundle: CaOption = None,
) -> None:
    """Build the selected cells (all by default) into labelled images."""
    from gpuenv import build, engine
    from gpuenv.progress import ConsoleReporter, summary
    from gpuenv.selection import select

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
            if reproducible:
                _normalize(eng, m, results)
            if validate:
                _validate([c.name for c in cells], file, [], None, None, False, False)
    finally:
        if reporter is not None:
            reporter.close()


@app.command(
    "run",
    context_settings={"allow_interspersed_args": False, "ignore_unknown_options": True},
)
def run_cmd(
    command: Annotated[list[str], typer.Argument(help="SCRIPT.py [ARGS...] or CMD [ARGS...]")],
    image: Annotated[
        str | None,
        typer.Option("-i", "--image", help="Cell name (or glob matching one) or image reference"),
    ] = None,
    gpus: Annotated[
        str | None, typer.Option("--gpus", help="all, N, device=0,2 or device=GPU-<uuid>")
    ] = None,
    env: Annotated[list[str] | None, typer.Option("-e", "--env", help="KEY=VALUE")] = None,
    volume: Annotated[list[str] | None, typer.Option("-v", "--volume", help="SRC:DST[:ro]")] = None,
    publish: Annotated[
        list[str] | None, typer.Option("-p", "--publish", help="[IP:]HOST:CONTAINER")
    ] = None,
    network: Annotated[
        str | None, typer.Option("--network", help="Network mode [default: the engine's]")
    ] = None,
    workdir: Annotated[str | None, typer.Option("--workdir", help="Working directory")] = None,
    ipc: Annotated[str | None, typer.Option("--ipc", help="IPC mode, e.g. host")] = None,
    interactive: Annotated[
        bool, typer.Option("--interactive", "-t", help="Interactive terminal (also: -it)")
    ] = False,
    file: FileOption = None,
) -> None:
    """Run a script or command in a cell's image, with the current directory mounted."""
    from gpuenv import engine as engines
    from gpuenv import run
    from gpuenv.gpus import parse_gpus

    with user_errors(exit_code=125):
        request = parse_gpus(gpus) if gpus is not None else None
        cwd = Path.cwd()
        argv = run.command_for(command, cwd)
        eng = engines.connect()
        target = _run_target(eng, image, request is not None, file)
        run.gpu_preflight(eng, target, request)
        opts = run.RunOptions(
            image=target.image,
            command=argv,
            gpus=request,
            env=env or [],
            volumes=volume or [],
            ports=publish or [],
            network=network,
            workdir=workdir,
            ipc=ipc,
            interactive=interactive,
            cwd=cwd,
        )
        code = run.run(eng, opts)
    raise typer.Exit(code)


def _run_target(eng: Engine, image: str | None, want_gpu: bool, file: Path | None) -> Target:
    """The image `gpuenv run` uses: -i IMAGE as is, else a cell (built first if missing)."""
    from gpuenv import run
    from gpuenv.errors import GpuenvError

    if image is not None and run.looks_like_image(image):
        labels = eng.labels(image)
        if labels is None:
            raise GpuenvError(f"image {image} not found in the engine", exit_code=125)
        return run.Target(image, labels)
    m, res = load(file)
    if image is None:
        cell = res.default_gpu if want_gpu else res.default_cpu
        if cell is None:
            kind = "GPU" if want_gpu else "CPU"
            raise GpuenvError(f"{m.path}: the matrix has no default {kind} cell; pass -i CELL")
    else:
        from gpuenv.selection import select

        matches = select(res.cells, [image], m.path)
        if len(matches) > 1:
            names = ", ".join(c.name for c in matches)
            raise GpuenvError(f"-i {image!r} matches {len(matches)} cells ({names}); pick one")
        cell = matches[0]
    labels = eng.labels(cell.image)
    if labels is None:
        _build_for_run(eng, m, cell)
        labels = eng.labels(cell.image) or {}
    return run.Target(cell.image, labels, cell)


def _build_for_run(eng: Engine, m: LoadedMatrix, cell: Cell) -> None:
    from gpuenv import build
    from gpuenv.errors import GpuenvError
    from gpuenv.progress import ConsoleReporter

    print(f"gpuenv: {cell.image} is not built yet; building it first", file=sys.stderr)
    reporter = ConsoleReporter()
    try:
        req = build.BuildRequest(matrix=m, cells=[cell], ca_bundle=build.ca_bundle_for(m, None))
        results = build.build_cells(eng, req, reporter)
    finally:
        reporter.close()
    if results[0].status == "failed":
        raise GpuenvError(f"building {cell.image} failed: {results[0].error}", exit_code=125)


@app.command("validate")
def validate_cmd(
    patterns: Patterns = None,
    file: FileOption = None,
    image: Annotated[
        list[str] | None, typer.Option("-i", "--image", help="Validate this image (repeatable)")
    ] = None,
    gpus: Annotated[
        str | None, typer.Option("--gpus", help="Also check the devices: all, N, device=...")
    ] = None,
    junitxml: Annotated[
        Path | None, typer.Option("--junitxml", help="Write JUnit XML results here")
    ] = None,
    record_sizes: Annotated[
        bool, typer.Option("--record-sizes", help="Record the images' sizes as the baseline")
    ] = False,
    verbose: Annotated[bool, typer.Option("-v", "--verbose", help="Show pytest's output")] = False,
) -> None:
    """Prove what images hold (pytest-testinfra suites against a container of each)."""
    with user_errors():
        _validate(patterns, file, image or [], gpus, junitxml, record_sizes, verbose)


def _validate(
    patterns: list[str] | None,
    file: Path | None,
    images: list[str],
    gpus: str | None,
    junitxml: Path | None,
    record_sizes: bool,
    verbose: bool,
) -> None:
    from gpuenv import engine as engines
    from gpuenv import sizes
    from gpuenv.gpus import parse_gpus
    from gpuenv.validate import expected, runner

    request = parse_gpus(gpus) if gpus is not None else None
    eng = engines.connect()
    targets: list[runner.Target] = []
    baseline_path = None
    if patterns or not images:
        from gpuenv.selection import select

        m, res = load(file)
        baseline_path = sizes.baseline_path(m.path)
        baseline = sizes.load(baseline_path)
        from gpuenv import lock as locks

        lock = locks.load(locks.lock_path(m.path))
        for cell in select(res.cells, patterns, m.path):
            entry = lock.cells.get(cell.name) if lock else None
            if lock is not None and entry is not None and locks.drift(lock, [cell]):
                entry = None  # a stale entry is no reference; `gpuenv lock --check` says so
            exp = expected.from_cell(cell, entry)
            targets.append(runner.Target(cell.name, cell.image, exp, baseline.get(cell.name)))
    for ref in images:
        labels = eng.labels(ref)
        if labels is None:
            raise fail(f"image {ref} not found in the engine")
        exp = expected.from_labels(ref, labels)
        targets.append(runner.Target(ref, ref, exp))
    summaries = runner.validate(eng, targets, request, junitxml, verbose)
    from gpuenv import publish

    outcome = {s.id: s.failed == 0 for s in summaries}
    publish.record_validation(
        {str(t.info["Id"]): outcome[t.id] for t in targets if t.info.get("Id") and t.id in outcome}
    )
    bad = 0
    for s in summaries:
        mark = "✓" if not s.failed else "✗"
        print(f"{mark} {s.id}: {s.passed} passed, {s.failed} failed, {s.skipped} skipped")
        for line in s.failures:
            print(f"    FAILED {line}")
        for line in sorted(set(s.skips)):
            print(f"    skipped {line}")
        bad += s.failed
    if junitxml:
        print(f"JUnit XML: {junitxml}")
    if record_sizes and baseline_path is not None:
        recorded = {t.id: int(t.info.get("Size") or 0) for t in targets if t.id in
                    {s.id for s in summaries if not s.failed}}  # fmt: skip
        sizes.record(baseline_path, recorded)
        print(f"recorded {len(recorded)} size(s) in {baseline_path}")
    if bad:
        raise fail(f"{bad} check(s) failed")


@app.command("lock")
def lock_cmd(
    patterns: Patterns = None,
    file: FileOption = None,
    check: Annotated[
        bool, typer.Option("--check", help="Exit 1 if the lock no longer matches the matrix")
    ] = False,
    exclude_newer: Annotated[
        str | None,
        typer.Option(
            "--exclude-newer",
            help="Resolve as of this date (YYYY-MM-DD) [default: the lock's, else today]",
            show_default=False,
        ),
    ] = None,
) -> None:
    """Write (or --check) matrix.lock: every cell's complete pip resolution, with hashes."""
    from gpuenv import lock as locks
    from gpuenv.selection import select

    with user_errors():
        m, res = load(file)
        cells = select(res.cells, patterns, m.path)
        path = locks.lock_path(m.path)
        current = locks.load(path)
        if check:
            if current is None:
                raise fail(f"{path}: no lock; write one with: gpuenv lock")
            drifted = locks.drift(current, cells)
            from gpuenv import engine as engines

            eng = engines.connect()
            for image in sorted({c.base.image for c in cells}):
                info = eng.image(image)
                why = locks.base_drift(current, image, info) if info else "not in the engine"
                if why:
                    for c in cells:
                        if c.base.image == image and c.name not in drifted:
                            drifted[c.name] = f"base {image}: {why}"
            for name, why in drifted.items():
                print(f"drift: {name}: {why}")
            if drifted:
                raise fail(f"{path}: {len(drifted)} cell(s) drifted; re-lock: gpuenv lock")
            print(f"{path}: {len(cells)} cell(s) match the matrix")
            return
        date = _exclude_newer(exclude_newer, current)
        entries = dict(current.cells) if current and current.exclude_newer == date else {}
        from gpuenv import base as bases
        from gpuenv import engine as engines

        eng = engines.connect()
        locked_bases = dict(current.bases) if current else {}
        for image in sorted({c.base.image for c in cells}):
            cell = next(c for c in cells if c.base.image == image)
            bases.ensure(eng, cell.base, lambda msg: print(f"gpuenv: {msg}", file=sys.stderr))
            info = eng.image(image) or {}
            locked_bases[image] = locks.base_identity(info, bases.package_list(eng, image))
        for cell in cells:
            entries[cell.name] = locks.lock_cell(
                cell, date, m.model.build.index_url, tuple(m.model.build.extra_index_urls)
            )
            print(f"locked {cell.name}", file=sys.stderr)
        # Cells no longer in the matrix leave the lock.
        names = {c.name for c in res.cells}
        entries = {k: v for k, v in entries.items() if k in names}
        used = {c.base.image for c in res.cells}
        locked_bases = {k: v for k, v in locked_bases.items() if k in used}
        locks.write(locks.Lock(path, date, entries, locked_bases))
        print(path)


def _exclude_newer(given: str | None, current: Lock | None) -> str:
    import re

    from gpuenv import lock as locks

    if given is None:
        return current.exclude_newer if current is not None else locks.today()
    if not re.fullmatch(r"\d{4}-\d{2}-\d{2}", given):
        raise fail(f"--exclude-newer {given!r}: expected YYYY-MM-DD", 2)
    return f"{given}T00:00:00Z"


@app.command("diff")
def diff_cmd(
    a: Annotated[str, typer.Argument(help="Image reference or cell name")],
    b: Annotated[str, typer.Argument(help="Image reference or cell name")],
    file: FileOption = None,
    as_json: JsonOption = False,
) -> None:
    """Show what differs between two environments; exit 1 when they differ (like diff)."""
    from gpuenv import diff
    from gpuenv import engine as engines

    with user_errors():
        refs = [_image_for(x, file) for x in (a, b)]
        eng = engines.connect()
        left, right = (diff.inventory(eng, ref) for ref in refs)
        result = diff.compare(left, right)
    if as_json:
        print(
            json.dumps({"a": left.ref, "b": right.ref, "identical": not result, **result}, indent=2)
        )
    else:
        print(diff.render_text(left, right, result))
    raise typer.Exit(1 if result else 0)


def _image_for(name: str, file: Path | None) -> str:
    """A cell name (or glob matching one) becomes its image; anything else is an image."""
    from gpuenv import matrix
    from gpuenv.run import looks_like_image

    if looks_like_image(name) or not matrix.matrix_path(file).exists():
        return name
    from gpuenv.selection import select

    m, res = load(file)
    matches = select(res.cells, [name], m.path)
    if len(matches) != 1:
        raise fail(f"{name!r} matches {len(matches)} cells; name exactly one")
    return matches[0].image


@app.command("push")
def push_cmd(
    patterns: Patterns = None,
    file: FileOption = None,
    registry: Annotated[
        str | None,
        typer.Option("--registry", help="Push to REG/<last part of name>:<tag> instead"),
    ] = None,
    aliases: Annotated[
        bool, typer.Option("--aliases/--no-aliases", help="Also push the matrix's aliases")
    ] = True,
    as_json: JsonOption = False,
    ca_bundle: CaOption = None,
) -> None:
    """Tag and push the cells' images (and their aliases); report the digest per tag."""
    from gpuenv import build, publish
    from gpuenv import engine as engines
    from gpuenv.selection import select

    with user_errors():
        if registry is not None and publish.registry_problem(registry):
            raise fail(f"--registry {publish.registry_problem(registry)}", 2)
        m, res = load(file)
        cells = select(res.cells, patterns, m.path)
        alias_tags = publish.aliases_by_cell(m, res.cells) if aliases else {}
        eng = engines.connect()
        hashes = build.current_spec_hashes(eng, m, cells, build.ca_bundle_for(m, ca_bundle))
        results: list[publish.TagResult] = []
        repo = publish.target_repository(m.model.name, registry)
        for cell in cells:
            info = eng.image(cell.image)
            tags = [cell.name, *alias_tags.get(cell.name, [])]
            refused = publish.check_pushable(cell, info, hashes[cell.name] or "")
            for tag in tags:
                ref = f"{repo}:{tag}"
                if refused:
                    results.append(publish.TagResult(cell.name, ref, "refused", error=refused))
                    continue
                try:
                    eng.tag(str(info["Id"]), ref)  # type: ignore[index]
                except Exception as exc:  # e.g. a reference the engine refuses
                    why = str(exc).strip().splitlines()[0][:300]
                    result = publish.TagResult(cell.name, ref, "failed", error=f"tag: {why}")
                else:
                    result = publish.push_ref(
                        lambda r, t: eng.api.push(r, tag=t, stream=True, decode=True), ref
                    )
                    result.cell = cell.name
                results.append(result)
                if not as_json:
                    shown = result.digest if result.status == "pushed" else result.error
                    print(f"{result.status:7} {ref}  {shown}", file=sys.stderr)
    if as_json:
        print(json.dumps({"results": [r.to_json() for r in results]}, indent=2))
    else:
        for r in results:
            print(f"{r.ref}  {r.digest or '-'}  {r.status}" + (f": {r.error}" if r.error else ""))
    bad = [r for r in results if r.status != "pushed"]
    if bad:
        raise fail(f"{len(bad)} of {len(results)} tag(s) not pushed")


@app.command("doctor")
def doctor_cmd(file: FileOption = None, as_json: JsonOption = False) -> None:
    """Check the engine, GPU support, the host's driver, and which built images can run here."""
    from gpuenv import doctor, matrix
    from gpuenv.errors import GpuenvError

    facts = doctor.gather()
    findings = doctor.evaluate(facts)
    path = matrix.matrix_path(file)
    if path.exists() and not facts.engine_error:
        try:
            _, res = load(file)
        except GpuenvError as exc:
            findings.append(doctor.Finding("matrix", "error", exc.message))
        else:
            built = {labels.get("org.opencontainers.image.title") for labels in facts.images}
            missing = [c.name for c in res.cells if c.image not in built]
            if missing:
                findings.append(doctor.Finding(
                    "matrix", "info", f"{path}: not built yet: {', '.join(missing)}",
                    "gpuenv build",
                ))  # fmt: skip
    if as_json:
        print(json.dumps({"findings": doctor.as_json(findings)}, indent=2))
    else:
        marks = {"ok": "✓", "info": "·", "warning": "!", "error": "✗"}
        for f in findings:
            print(f"{marks[f.level]} {f.topic}: {f.message}")
            if f.fix and f.level != "ok":
                print(f"    fix: {f.fix}")
    if any(f.level == "error" for f in findings):
        raise typer.Exit(1)


def main() -> None:
    # `-it` (docker's spelling) would parse as `-i t` because -i takes the image.
    args = sys.argv[1:]
    if args[:1] == ["run"]:
        for i, arg in enumerate(args):
            if arg == "--" or (i > 0 and not arg.startswith("-") and args[i - 1] not in _VALUED):
                break
            if arg in ("-it", "-ti"):
                args[i] = "--interactive"
    app(args)


_VALUED = {"-i", "--image", "--gpus", "-e", "--env", "-v", "--volume", "-p", "--publish",
           "--network", "--workdir", "--ipc", "-f", "--file"}  # fmt: skip


if __name__ == "__main__":
    main()
