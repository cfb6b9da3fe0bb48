"""Executing a build plan: bases first, then each cell pulled, built or left as it is.

The plan (gpuenv/building/plan.py) has already rendered every cell, taken its spec hash and decided
what to do. A cell that is built gets its wheels fetched here, on the client, and sent with
its context (gpuenv/building/sendable.py): the engine fetches nothing. Builds are untagged until
they succeed, so a failed or interrupted build leaves no tag on a half-built image; GPU cells wait
for their CPU sibling so they reuse its layers instead of building them twice. The image a
build supersedes is removed once nothing tags it.
"""

from __future__ import annotations

import json
import re
import threading
import time
from concurrent.futures import Future
from pathlib import Path
from typing import TYPE_CHECKING

from gpuenv.building import phases
from gpuenv.building.plan import BuildPlan, CellPlan
from gpuenv.building.recipe import current, label, lock_note
from gpuenv.building.results import CellResult, Reporter
from gpuenv.engine.client import BuildCancelled, BuildFailed, Engine, EngineError
from gpuenv.matrix import contract
from gpuenv.matrix.cell import Cell
from gpuenv.matrix.errors import GpuenvError

if TYPE_CHECKING:
    from gpuenv.building.pull import Vet
    from gpuenv.building.sendable import Sender
    from gpuenv.project.project import Project

LOG_TAIL = 15  # the lines a failure shows
LOG_KEPT = 400  # the lines a failure is explained from (uv's hash report alone is ~20)


def sibling_cpu(cell: Cell, cells: list[Cell]) -> Cell | None:
    """The CPU cell whose layers a GPU cell reuses (same framework, Python, base, packages)."""
    if not cell.is_gpu:
        return None
    for other in cells:
        if (
            not other.is_gpu
            and not cell.cuda_with_framework
            and (other.framework_requirement, other.python, other.base)
            == (cell.framework_requirement, cell.python, cell.base)
            and (other.pip, other.apt) == (cell.pip, cell.apt)
        ):
            return other
    return None


def plan_and_build(
    engine: Engine,
    project: Project,
    cells: list[Cell],
    reporter: Reporter,
    *,
    ca_bundle: Path | None,
    jobs: int = 1,
    keep_going: bool = False,
    no_cache: bool = False,
    reproducible: bool = False,
    offline: bool = False,
    pull_from: str | None = None,
    vet: Vet | None = None,
) -> list[CellResult]:
    """`gpuenv build`: bases, then the plan, then its execution; with `reproducible`, the
    built images normalised (gpuenv/building/reproducible.py) once every cell succeeded. With
    `offline`, locked cells only, from the wheelhouse and the bases in the engine alone.
    Published images are pulled from `pull_from` only with `vet`, which checks each one's
    signed provenance before it is adopted (gpuenv/building/pull.py)."""
    from gpuenv.building import plan as plans

    # Render everything before touching the engine: a template error must stop the run
    # before a base is bootstrapped.
    prepared = plans.prepare(project, cells)
    # A warning, not an error: the lock still installs exactly its packages; only the
    # images' bytes differ from those built by the lock's recipe. Said once per command.
    note = lock_note(project.lock) if project.lock else None
    if note:
        reporter.info(note)
    if not offline:  # the bases the cells need (a missing Debian base is bootstrapped)
        from gpuenv.building.base import ensure_all

        ensure_all(engine, cells, None, reporter.info)
    plan = plans.make_plan(
        engine, project, cells, no_cache=no_cache, pull_from=pull_from, vet=vet,
        prepared=prepared,
    )  # fmt: skip
    # Only a build needs the wheelhouse (a no-op build reads no netrc, imports no ssl); with
    # --offline, the sender first checks that everything the build needs is at hand.
    building = [p for p in plan.cells if p.action != "up-to-date"]
    sender = None
    if building:  # sendable imports packaging's markers (layers): not for a no-op build
        from gpuenv.building.sendable import Sender

        sender = Sender(engine, project, building, ca_bundle, offline, say=reporter.info)
    results = execute(engine, plan, reporter, jobs=jobs, keep_going=keep_going, sender=sender)
    if reproducible and not failed(results):
        from gpuenv.building.reproducible import normalize_images

        exclude_newer = project.lock.exclude_newer if project.lock else None
        by_image = {r.cell.image: r for r in results}
        for ref, image_id, changed in normalize_images(
            engine, [c.image for c in cells], exclude_newer
        ):
            reporter.info(f"{ref}  {image_id[:19]}  {'' if changed else 'already '}normalised")
            by_image[ref].image_id = image_id  # what --json reports: the image now tagged
    return results


def execute(
    engine: Engine,
    plan: BuildPlan,
    reporter: Reporter,
    *,
    jobs: int = 1,
    keep_going: bool = False,
    sender: Sender | None = None,
) -> list[CellResult]:
    cells = [p.cell for p in plan.cells]
    by_name = {p.cell.name: p for p in plan.cells}
    # CPU cells first, so GPU cells find the shared layers in the cache.
    order = sorted(cells, key=lambda c: (c.is_gpu, cells.index(c)))
    results = {c.name: CellResult(c) for c in order}
    stop = threading.Event()
    # Set first thing once gpuenv is ending: from then on a cell that fails (its build
    # cancelled, its downloads stopped) is the interruption, which the CLI reports alone.
    ending = threading.Event()
    # Cancelled builds whose cancellation came before gpuenv's interrupt (the terminal's
    # Ctrl-C reaches the docker CLI too): failures only once the run ends without one.
    held: list[CellResult] = []

    def run_one(cell: Cell, wait_for: Future[CellResult] | None) -> CellResult:
        result = results[cell.name]
        if wait_for is not None:
            wait_for.result()
        if stop.is_set():
            result.status = "skipped"
            result.error = "not built: an earlier cell failed (use --keep-going)"
            return result
        _do(engine, by_name[cell.name], plan.no_cache, reporter, result, sender)
        if result.status == "failed" and not keep_going:
            stop.set()
        if result.cancelled:
            held.append(result)
        elif not ending.is_set():
            reporter.finished(result)
        return result

    if jobs <= 1:
        for cell in order:
            run_one(cell, None)
    else:
        # Daemon threads, not a ThreadPoolExecutor: after Ctrl-C or SIGTERM the process
        # must end now, and the interpreter joins a pool's workers at exit, which sit in
        # their build streams until the abandoned builds end (a minute of TensorFlow
        # downloads). Once the process is gone its connections close, and the engine
        # cancels those builds and removes their containers; nothing was tagged.
        slots = threading.Semaphore(jobs)
        futures: dict[str, Future[CellResult]] = {}

        def work(cell: Cell, fut: Future[CellResult], dep: Future[CellResult] | None) -> None:
            try:
                if dep is not None:
                    dep.result()  # the CPU sibling first, without holding a slot
                with slots:
                    fut.set_result(run_one(cell, None))
            except BaseException as exc:  # handed to the main thread
                fut.set_exception(exc)

        for cell in order:
            sibling = sibling_cpu(cell, order)
            dep = futures.get(sibling.name) if sibling else None
            futures[cell.name] = Future()
            threading.Thread(target=work, args=(cell, futures[cell.name], dep),
                             name=f"gpuenv-build-{cell.name}", daemon=True).start()  # fmt: skip
        try:
            for fut in futures.values():
                fut.result()
        except KeyboardInterrupt:
            ending.set()
            stop.set()  # cells not started yet are not started
            if sender is not None:
                sender.stop()  # the threads' downloads end now, not once all are fetched
            engine.end_builds()
            engine.close()
            raise
    for result in held:  # no interrupt came: they were failures after all
        reporter.finished(result)
    return [results[c.name] for c in cells]


def _do(
    engine: Engine, p: CellPlan, no_cache: bool, reporter: Reporter, result: CellResult,
    sender: Sender | None,
) -> None:  # fmt: skip
    cell = p.cell
    start = time.monotonic()
    existing = p.existing
    if p.action == "up-to-date" and existing is not None:
        result.status, result.image_id, result.size = "cached", existing.id, existing.size
        result.seconds = time.monotonic() - start
        return
    assert p.spec_hash is not None, "the plan is made after the bases"
    image_id: str | None = None
    if p.action == "pull" and p.pull_ref:
        image_id = _pull(engine, p, reporter)
        if image_id is not None:
            result.status = "pulled"
    if image_id is None:
        assert sender is not None, "a plan with cells to build has a sender"
        image_id = _build(engine, p, no_cache, reporter, result, sender)
        if image_id is None:
            result.seconds = time.monotonic() - start
            return
        tagging = time.monotonic()
        engine.tag(image_id, cell.image)
        result.status = "built"
    if existing and existing.id != image_id:
        engine.remove_if_untagged(existing.id)  # the superseded image, if nothing tags it
    info = engine.image(image_id)
    result.image_id, result.size = image_id, info.size if info else 0
    result.seconds = time.monotonic() - start
    if result.status == "built":
        result.phases["tag"] = time.monotonic() - tagging
        result.phases = phases.ordered(result.phases)


def _build(
    engine: Engine, p: CellPlan, no_cache: bool, reporter: Reporter, result: CellResult,
    sender: Sender,
) -> str | None:  # fmt: skip
    cell = p.cell
    reporter.started(cell)
    tail: list[str] = []
    step: list[str] = []
    clock = phases.BuildLog()

    def on_log(line: str) -> None:
        clock(line)
        if re.match(r"(Step \d+/\d+ :|#\d+ \[)", line):
            step[:] = [line]
        if line.strip():  # uv pads its reports with blank lines; they explain nothing
            tail.append(line)
            del tail[:-LOG_KEPT]
        reporter.log(cell, line)

    labels = {
        contract.SPEC_HASH: str(p.spec_hash),
        contract.INPUTS: json.dumps(p.inputs, sort_keys=True, separators=(",", ":")),
        contract.RECIPE: label(current()),
    }
    begun = time.monotonic()
    try:
        with sender.context(p, labels) as build:
            assembled = time.monotonic()
            image_id = engine.build_directory(build, nocache=no_cache, on_log=on_log)
            result.phases = {"probe": sender.probe_seconds, "context": assembled - begun,
                             **clock.phases(), "build": time.monotonic() - assembled}  # fmt: skip
            return image_id
    except EngineError:
        raise  # the engine or its CLI failed: the run stops (gpuenv/cli/build.py says why)
    except GpuenvError as exc:  # the resolution or a wheel could not be had
        result.status, result.error = "failed", exc.message
        return None
    except BuildFailed as exc:
        result.status, result.error = "failed", _explain(str(exc), tail)
        result.step, result.log_tail = (step[0] if step else None), tail[-LOG_TAIL:]
        result.cancelled = isinstance(exc, BuildCancelled)
        return None


def _pull(engine: Engine, p: CellPlan, reporter: Reporter) -> str | None:
    """Pull before build: the image published for this cell becomes the cell's image when
    its spec hash is the one the plan computed. Returns its ID, or None (then it is built)."""
    from gpuenv.building.pull import pull_matching

    ref, name = str(p.pull_ref), p.cell.name
    reporter.info(f"{name}: looking for {ref}")
    assert p.vet is not None, "the plan pulls only what it can vet"
    image_id, why = pull_matching(engine, ref, str(p.spec_hash), keep_as=p.cell.image, vet=p.vet)
    if image_id is None:
        reporter.info(f"{name}: not pulled ({why}); building")
    else:
        reporter.info(f"{name}: pulled {ref} (same spec hash, provenance verified)")
    return image_id


def _explain(error: str, tail: list[str]) -> str:
    """The engine says 'returned a non-zero code: 1'; the log usually says which package."""
    text = "\n".join(tail)
    if "no space left on device" in (text + error).lower():  # uv: "No space left..."
        return "the disk filled up during the build; free space (docker image prune) and retry"
    mismatch = re.search(r"[Hh]ash mismatch for `?([^`\s]+?)`?(?:\s|$)", text)
    if mismatch:
        return (
            f"hash mismatch for {mismatch.group(1)}: the download does not match matrix.lock "
            f"({error}); if the lock is right, the index served another file"
        )
    for pattern in (
        r"Because (\S+) was not found in the package registry",
        r"No solution found when resolving dependencies:.*",
        r"(?:No matching distribution found for|Could not find a version that satisfies "
        r"the requirement) (\S+)",
    ):
        m = re.search(pattern, text)
        if m:
            package = m.group(1) if m.groups() else None
            what = f"package {package} cannot be installed" if package else m.group(0)
            return f"{what} ({error})"
    return error


def failed(results: list[CellResult]) -> list[CellResult]:
    return [r for r in results if r.status in ("failed", "skipped")]


def ensure_no_failures(results: list[CellResult]) -> None:
    bad = failed(results)
    if bad:
        names = ", ".join(r.cell.name for r in bad)
        errors = {r.error for r in bad if r.status == "failed"}
        # One cause for every failure (a wheelhouse problem, usually): the line says it.
        why = f": {errors.pop()}" if len(errors) == 1 else ""
        raise GpuenvError(f"{len(bad)} cell(s) did not build: {names}{why}")
