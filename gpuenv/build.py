"""Building cells into labelled images: render, hash, skip or build, tag, summarise.

A cell whose image already carries the same io.gpuenv.spec-hash is not rebuilt. The spec
hash covers exactly what determines the image: the rendered context, the base image's ID and
the cell's lock entry. Builds are untagged until they succeed, so a failed or interrupted
build leaves no tag on a half-built image; GPU cells wait for their CPU sibling so they
reuse its layers instead of building them twice.
"""

from __future__ import annotations

import hashlib
import io
import json
import re
import tarfile
import threading
import time
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from contextlib import ExitStack
from dataclasses import dataclass, field
from pathlib import Path

from gpuenv import base as bases
from gpuenv import lock as locks
from gpuenv import publish
from gpuenv.ca import CAServer, find_bundle
from gpuenv.cell import Cell
from gpuenv.engine import BuildFailed, Engine
from gpuenv.errors import GpuenvError
from gpuenv.lock import CellLock
from gpuenv.matrix import LoadedMatrix
from gpuenv.render import BuildContext, RenderOptions, render

SPEC_LABEL = "io.gpuenv.spec-hash"
LOG_TAIL = 15


def ca_bundle_for(m: LoadedMatrix, explicit: Path | None) -> Path | None:
    try:
        return find_bundle(explicit, m.model.build.ca_bundle, m.dir)
    except GpuenvError as exc:
        if explicit is None and m.model.build.ca_bundle:
            raise m.error(exc.message, ("build", "ca_bundle")) from None
        raise


def render_options(m: LoadedMatrix, explicit_ca: Path | None) -> RenderOptions:
    """Options for `gpuenv render`: the CA bundle is looked up as a build would."""
    return _options(m, ca_bundle_for(m, explicit_ca))


def _options(m: LoadedMatrix, ca_bundle: Path | None) -> RenderOptions:
    b = m.model.build
    return RenderOptions(
        ca=ca_bundle is not None,
        index_url=b.index_url,
        extra_index_urls=tuple(b.extra_index_urls),
    )


def lock_entries(m: LoadedMatrix, cells: list[Cell]) -> dict[str, CellLock]:
    """The cells' entries of matrix.lock, when there is one; a stale lock is an error."""
    path = locks.lock_path(m.path)
    lock = locks.load(path)
    if lock is None:
        return {}
    drifted = locks.drift(lock, cells)
    if drifted:
        why = "; ".join(f"{name}: {reason}" for name, reason in drifted.items())
        raise GpuenvError(f"{path} does not match the matrix ({why}); re-lock: gpuenv lock")
    return {c.name: lock.cells[c.name] for c in cells}


def spec_hash(ctx: BuildContext, base_id: str, lock_entry: str = "") -> str:
    doc = {"context": ctx.digest(), "base": base_id, "lock": lock_entry}
    return hashlib.sha256(json.dumps(doc, sort_keys=True).encode()).hexdigest()


def context_tar(ctx: BuildContext) -> io.BytesIO:
    """The build context as an uncompressed tar with fixed metadata (deterministic bytes)."""
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w", format=tarfile.PAX_FORMAT) as tar:
        for name in sorted(ctx.files):
            data = ctx.files[name].encode()
            info = tarfile.TarInfo(name)
            info.size, info.mode, info.mtime = len(data), 0o644, 0
            tar.addfile(info, io.BytesIO(data))
    buf.seek(0)
    return buf


@dataclass
class CellResult:
    cell: Cell
    status: str = "pending"  # built | cached | pulled | failed | skipped
    image_id: str | None = None
    size: int | None = None
    seconds: float = 0.0
    error: str | None = None
    step: str | None = None
    log_tail: list[str] = field(default_factory=list)

    def to_json(self) -> dict[str, object]:
        return {
            "cell": self.cell.name,
            "image": self.cell.image,
            "status": self.status,
            "image_id": self.image_id,
            "size": self.size,
            "seconds": round(self.seconds, 2),
            "error": self.error,
            "failed_step": self.step,
            "log_tail": self.log_tail if self.status == "failed" else [],
        }


class Reporter:
    """What the build tells its user; the CLI supplies a console implementation."""

    def info(self, message: str) -> None:
        pass

    def started(self, cell: Cell) -> None:
        pass

    def log(self, cell: Cell, line: str) -> None:
        pass

    def finished(self, result: CellResult) -> None:
        pass


@dataclass
class BuildRequest:
    matrix: LoadedMatrix
    cells: list[Cell]
    ca_bundle: Path | None = None
    jobs: int = 1
    keep_going: bool = False
    no_cache: bool = False


def sibling_cpu(cell: Cell, cells: list[Cell]) -> Cell | None:
    """The CPU cell whose layers a GPU cell reuses (same framework, Python, base, packages)."""
    if not cell.is_gpu:
        return None
    for other in cells:
        if (
            not other.is_gpu
            and (other.framework_version, other.python, other.base)
            == (cell.framework_version, cell.python, cell.base)
            and (other.pip, other.apt) == (cell.pip, cell.apt)
        ):
            return other
    return None


def build_cells(engine: Engine, req: BuildRequest, reporter: Reporter) -> list[CellResult]:
    options = _options(req.matrix, req.ca_bundle)
    publish.registry_from_env()  # a malformed $GPUENV_REGISTRY stops the run before any build
    # Render everything first: a template error must stop the run before any build.
    locked = lock_entries(req.matrix, req.cells)
    contexts = {c.name: render(c, options, locked.get(c.name)) for c in req.cells}
    base_ids: dict[str, str] = {}
    lock = locks.load(locks.lock_path(req.matrix.path)) if locked else None
    for cell in req.cells:
        if cell.base.image not in base_ids:
            base_ids[cell.base.image] = bases.ensure(engine, cell.base, reporter.info)
            info = engine.image(cell.base.image) or {"Id": base_ids[cell.base.image]}
            why = locks.base_drift(lock, cell.base.image, info) if lock else None
            if lock is not None and why:
                raise GpuenvError(
                    f"base {cell.base.image} differs from {lock.path} ({why}): load the saved "
                    "base (gpuenv base --load FILE) or re-lock (gpuenv lock)"
                )
    # CPU cells first, so GPU cells find the shared layers in the cache.
    order = sorted(req.cells, key=lambda c: (c.is_gpu, req.cells.index(c)))
    results = {c.name: CellResult(c) for c in order}
    stop = threading.Event()

    def run_one(cell: Cell, wait_for: Future[CellResult] | None) -> CellResult:
        result = results[cell.name]
        if wait_for is not None:
            wait_for.result()
        if stop.is_set():
            result.status = "skipped"
            result.error = "not built: an earlier cell failed (use --keep-going)"
            return result
        _build_one(engine, contexts[cell.name], base_ids[cell.base.image], req, reporter, result)
        if result.status == "failed" and not req.keep_going:
            stop.set()
        reporter.finished(result)
        return result

    with ExitStack() as stack:
        if req.ca_bundle is not None and any(
            _needs_build(engine, contexts[c.name], base_ids[c.base.image], req.no_cache)
            for c in order
        ):
            stack.enter_context(CAServer(req.ca_bundle, say=reporter.info))
        if req.jobs <= 1:
            for cell in order:
                run_one(cell, None)
        else:
            futures: dict[str, Future[CellResult]] = {}
            pool = stack.enter_context(ThreadPoolExecutor(max_workers=req.jobs))
            for cell in order:
                sibling = sibling_cpu(cell, order)
                dep = futures.get(sibling.name) if sibling else None
                futures[cell.name] = pool.submit(run_one, cell, dep)
            try:
                for fut in futures.values():
                    fut.result()
            except KeyboardInterrupt:
                # Closing the client's connections ends the build streams; the engine then
                # cancels those builds, and nothing was tagged.
                stop.set()
                pool.shutdown(wait=False, cancel_futures=True)
                engine.api.close()
                raise
    return [results[c.name] for c in req.cells]


def current_spec_hashes(
    engine: Engine, m: LoadedMatrix, cells: list[Cell], ca_bundle: Path | None
) -> dict[str, str | None]:
    """The spec hash each cell has now (None when its base is missing), building nothing."""
    options = _options(m, ca_bundle)
    locked = lock_entries(m, cells)
    out: dict[str, str | None] = {}
    for cell in cells:
        base = engine.image(cell.base.image)
        ctx = render(cell, options, locked.get(cell.name))
        out[cell.name] = spec_hash(ctx, str(base["Id"])) if base else None
    return out


def _needs_build(engine: Engine, ctx: BuildContext, base_id: str, no_cache: bool) -> bool:
    if no_cache:
        return True
    labels = engine.labels(ctx.cell.image)
    return labels is None or labels.get(SPEC_LABEL) != spec_hash(ctx, base_id)


def _build_one(
    engine: Engine,
    ctx: BuildContext,
    base_id: str,
    req: BuildRequest,
    reporter: Reporter,
    result: CellResult,
) -> None:
    cell = ctx.cell
    start = time.monotonic()
    digest = spec_hash(ctx, base_id)
    existing = engine.image(cell.image)
    existing_labels = ((existing or {}).get("Config") or {}).get("Labels") or {}
    if existing and not req.no_cache and existing_labels.get(SPEC_LABEL) == digest:
        result.status, result.image_id = "cached", str(existing["Id"])
        result.size = int(existing.get("Size") or 0)
        result.seconds = time.monotonic() - start
        return
    pulled = None if req.no_cache else _pull_published(engine, ctx.cell, digest, req, reporter)
    if pulled is not None:
        if existing and existing["Id"] != pulled:
            engine.remove_if_untagged(str(existing["Id"]))  # superseded, as after a build
        info = engine.image(pulled) or {}
        result.status, result.image_id = "pulled", pulled
        result.size = int(info.get("Size") or 0)
        result.seconds = time.monotonic() - start
        return
    reporter.started(cell)
    tail: list[str] = []
    step: list[str] = []

    def on_log(line: str) -> None:
        if re.match(r"Step \d+/\d+ :", line):
            step[:] = [line]
        tail.append(line)
        del tail[:-LOG_TAIL]
        reporter.log(cell, line)

    try:
        image_id = engine.build(
            context_tar(ctx),
            labels={SPEC_LABEL: digest},
            nocache=req.no_cache,
            on_log=on_log,
        )
    except BuildFailed as exc:
        result.status, result.error = "failed", _explain(str(exc), tail)
        result.step, result.log_tail = (step[0] if step else None), tail
        result.seconds = time.monotonic() - start
        return
    engine.tag(image_id, cell.image)
    if existing and existing["Id"] != image_id:
        engine.remove_if_untagged(str(existing["Id"]))  # the superseded build, if nothing tags it
    info = engine.image(image_id) or {}
    result.status, result.image_id = "built", image_id
    result.size = int(info.get("Size") or 0)
    result.seconds = time.monotonic() - start


def _pull_published(
    engine: Engine, cell: Cell, digest: str, req: BuildRequest, reporter: Reporter
) -> str | None:
    """Pull before build: with $GPUENV_REGISTRY set, the image published there for this
    cell (REG/<last part of name>:<cell>) becomes the cell's image when its spec hash is
    the one just computed. Returns its ID, or None (then the cell is built)."""
    registry = publish.registry_from_env()
    if registry is None:
        return None
    ref = f"{publish.target_repository(req.matrix.model.name, registry)}:{cell.name}"
    reporter.info(f"{cell.name}: looking for {ref}")
    image_id, why = publish.pull_matching(engine, ref, digest, keep_as=cell.image)
    if image_id is None:
        reporter.info(f"{cell.name}: not pulled ({why}); building")
    else:
        reporter.info(f"{cell.name}: pulled {ref} (same spec hash)")
    return image_id


def _explain(error: str, tail: list[str]) -> str:
    """The engine says 'returned a non-zero code: 1'; the log usually says which package."""
    text = "\n".join(tail)
    if "no space left on device" in text or "no space left on device" in error:
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


SizeFormatter = Callable[[int | None], str]


def human_size(size: int | None) -> str:
    if size is None:
        return "-"
    value = float(size)
    for unit in ("B", "kB", "MB", "GB"):
        if value < 1000 or unit == "GB":
            return f"{value:.1f} {unit}" if unit != "B" else f"{int(value)} B"
        value /= 1000
    return f"{value:.1f} GB"


def ensure_no_failures(results: list[CellResult]) -> None:
    bad = failed(results)
    if bad:
        names = ", ".join(r.cell.name for r in bad)
        raise GpuenvError(f"{len(bad)} cell(s) did not build: {names}")
