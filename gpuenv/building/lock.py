"""Resolving: each cell's complete, hashed pip resolution, written to matrix.lock.

`pip install tensorflow[and-cuda]==2.21.0` floats every transitive package month to month;
the lock pins them all, with hashes, resolved by `uv pip compile` for the cell's Python and
platform with an exclude-newer date (so re-locking the same matrix gives the same lock).
Builds then install exactly the lock (--require-hashes --no-deps). The file itself, and
whether it still matches the matrix, is gpuenv/project/lockfile.py.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
import tempfile
from datetime import datetime
from pathlib import Path
from typing import TYPE_CHECKING

from gpuenv.matrix.cell import Cell
from gpuenv.matrix.contract import lock_path
from gpuenv.matrix.errors import GpuenvError
from gpuenv.project.lockfile import (
    PLATFORM,
    CellLock,
    Lock,
    base_drift,
    base_identity,
    cuda_requirements,
    drift,
    env_requirements,
    inputs_digest,
    platform_of,
    today,
    write,
    write_atomically,
)

if TYPE_CHECKING:
    from collections.abc import Callable, Iterable

    from gpuenv.engine.client import Engine
    from gpuenv.matrix.schema import LoadedMatrix
    from gpuenv.store.credentials import Credentials


def _uv() -> str:
    exe = Path(sys.executable).parent / "uv"
    if exe.exists():
        return str(exe)
    from shutil import which

    found = which("uv")
    if not found:
        raise GpuenvError("uv is not installed; pip install uv (gpuenv lock resolves with it)")
    return found


# A resolution that needs sdists: the packages whose sdist gpuenv offers uv (each found by
# uv's refusal, one at a time), at most this many.
MAX_SOURCES = 50
# Build backends uv may never install while resolving: if uv ever tried to build an sdist
# itself (it should not: each allowed one comes with its metadata and its one version), the
# build's environment cannot be made and no package code runs here. Defence in depth.
NO_BACKENDS = ("setuptools<0", "wheel<0", "hatchling<0", "flit-core<0", "poetry-core<0",
               "pdm-backend<0", "maturin<0", "scikit-build-core<0", "meson-python<0")  # fmt: skip
# uv's refusal of an sdist: a package's on an index, or a direct reference's archive.
_WHEELS_REQUIRED = re.compile(
    r"(?:Wheels are required for|Building source distributions for) `([^`]+)`"
)

if TYPE_CHECKING:
    from gpuenv.building.sdists import Metadata

    # (name, the requirements and constraints) -> the metadata of the sdist a resolution takes
    Sources = Callable[[str, list[str]], Metadata]


def compile_requirements(
    requirements: list[str],
    python: str,
    exclude_newer: str | None,
    index_url: str | None,
    extra_index_urls: tuple[str, ...] = (),
    *,
    credentials: Credentials | None = None,
    ca_bundle: Path | None = None,
    platform: str = PLATFORM,
    constraints: list[str] | tuple[str, ...] = (),
    output_format: str = "requirements.txt",
    sources: Sources | None = None,
    root: Path | None = None,
    trees: dict[str, str] | None = None,
) -> str:
    """`uv pip compile --generate-hashes` for the cell's interpreter and platform, within
    `constraints` (pins the resolution must keep: what an image already holds). Index
    credentials reach uv in its environment (never its command line, which every local user
    can read), inside the URLs of the indexes whose origin they are bound to
    (gpuenv/store/credentials.py decides); uv reads no netrc of its own, which would give
    them to every port and scheme of a host. The CA bundle as SSL_CERT_FILE.

    uv builds nothing: a package that publishes only an sdist is refused by uv (`--no-build`)
    until `sources` gives its metadata (gpuenv/building/sdists.py: read statically, or from
    the wheel built in the sandbox); then uv may take that sdist, at that version only, with
    the metadata given, and every other package still as a wheel.

    `root`: the matrix's directory, which local files (`name @ file:REL`) are relative to;
    uv reads them at their absolute path, and the resolution names them relative again;
    `trees`: the content digests of the local directories among them, by name."""
    from gpuenv.matrix.requirements import absolute_local, portable_local

    if root is not None:
        requirements = [absolute_local(r, root) for r in requirements]
        constraints = [absolute_local(c, root) for c in constraints]
    # A VCS reference is given to uv as its exported tree (gpuenv/matrix/vcs.py), and named
    # by its pinned URL again in the resolution and to `sources`.
    checkouts = _checkouts([*requirements, *constraints])
    requirements = [_swap(r, checkouts) for r in requirements]
    constraints = [_swap(c, checkouts) for c in constraints]
    named_again = {tree: url for url, tree in checkouts.items()}
    if sources is not None and checkouts:
        given = sources
        sources = lambda name, reqs: given(name, [_swap(r, named_again) for r in reqs])  # noqa: E731
    allowed: dict[str, Metadata] = {}
    while True:
        proc = _uv_compile(
            requirements, python, exclude_newer, index_url, extra_index_urls, credentials,
            ca_bundle, platform, constraints, output_format, allowed,
        )  # fmt: skip
        if proc.returncode == 0:
            out = proc.stdout if root is None else portable_local(proc.stdout, root)
            out = _swap(out, named_again)
            if output_format != "requirements.txt":
                return out
            out = _with_tree_hashes(out, trees or {})
            return _with_source_hashes(out, allowed.values())
        needed = _WHEELS_REQUIRED.search(proc.stderr)
        if needed and sources is not None and len(allowed) < MAX_SOURCES:
            from gpuenv.store.wheelhouse import normalize

            name = normalize(needed.group(1))
            if name not in allowed:
                allowed[name] = sources(name, [*requirements, *constraints])
                continue
        break
    lines = [line for line in proc.stderr.strip().splitlines() if line.strip()]
    reason = " ".join(line.strip() for line in lines[-3:]) or f"exit {proc.returncode}"
    refusal = re.search(r"\b(401|403)\b", proc.stderr)
    if refusal and credentials is not None:
        # uv says only "401 Unauthorized"; gpuenv knows whose credentials it passed.
        from gpuenv.store.fetch import refused

        urls = [*extra_index_urls, *([index_url] if index_url else [])]
        base = next((u for u in urls if credentials.for_url(u)), urls[0] if urls else "")
        raise GpuenvError(refused(base, int(refusal.group(1)), credentials))
    if needed and sources is None:
        reason = (
            f"{needed.group(1)} publishes no wheel for CPython {python} here, only a source "
            "distribution, which this step does not build (gpuenv build and gpuenv lock build "
            "one in a network-less container on the engine)"
        )
    raise GpuenvError(f"cannot resolve {', '.join(requirements)} for Python {python}: {reason}")


def _uv_compile(
    requirements: list[str], python: str, exclude_newer: str | None, index_url: str | None,
    extra_index_urls: tuple[str, ...], credentials: Credentials | None,
    ca_bundle: Path | None, platform: str, constraints: list[str] | tuple[str, ...],
    output_format: str, allowed: dict[str, Metadata],
) -> subprocess.CompletedProcess[str]:  # fmt: skip
    with tempfile.TemporaryDirectory() as tmp:
        source = Path(tmp) / "requirements.in"
        source.write_text("\n".join(requirements) + "\n")
        # --no-build: builds install wheels only, and building a source distribution to
        # read its metadata would run its setup.py here, with this environment's secrets.
        command = [
            _uv(), "pip", "compile", str(source), "--generate-hashes", "--no-header",
            "--no-annotate", "--quiet", "--python-version", python,
            "--python-platform", platform,
        ]  # fmt: skip
        if not allowed:
            # No uv.toml or pyproject.toml of the directory gpuenv runs in (or the user's):
            # the resolution is made of what the matrix says alone.
            command += ["--no-build", "--no-config"]
        else:
            # Wheels only, but for the sdists whose metadata gpuenv gives (uv.toml's
            # dependency-metadata), each held to its one version by a constraint.
            command += ["--only-binary", ":all:"]
            for name in sorted(allowed):
                command += ["--no-binary", name]
            config = Path(tmp) / "uv.toml"  # --config-file: no other is read
            config.write_text(_dependency_metadata(allowed.values()), encoding="utf-8")
            command += ["--config-file", str(config)]
            guard = Path(tmp) / "build-constraints.txt"
            guard.write_text("\n".join(NO_BACKENDS) + "\n")
            command += ["--build-constraint", str(guard)]
        pins = [*constraints, *(f"{m.name}=={m.version}" for m in allowed.values())]
        if pins:
            constraint_file = Path(tmp) / "constraints.txt"
            constraint_file.write_text("\n".join(pins) + "\n")
            command += ["--constraint", str(constraint_file)]
        if exclude_newer:
            command += ["--exclude-newer", exclude_newer]
        if output_format != "requirements.txt":
            command += ["--format", output_format]
        env = {**os.environ, "UV_NO_PROGRESS": "1", "NETRC": os.devnull}
        if index_url:
            env["UV_INDEX_URL"] = _with_credential(index_url, credentials)
        if extra_index_urls:
            env["UV_EXTRA_INDEX_URL"] = " ".join(
                _with_credential(u, credentials) for u in extra_index_urls
            )
        if ca_bundle is not None:
            env["SSL_CERT_FILE"] = str(ca_bundle)
        return subprocess.run(command, capture_output=True, text=True, check=False, env=env)


def _with_source_hashes(text: str, allowed: Iterable[Metadata]) -> str:
    """uv gives no hash for a direct reference's sdist it did not build; the lock holds
    the one gpuenv fetched it under, as for every other file."""
    shas = {m.name: m.sha256 for m in allowed if m.url and m.sha256}
    if not shas:
        return text
    from gpuenv.building.layers import blocks

    out = []
    for name, block in blocks(text):
        if name in shas and "--hash=" not in block:
            block = f"{block.rstrip()} \\\n    --hash=sha256:{shas[name]}\n"
        out.append(block)
    return "".join(out)


def _checkouts(requirements: list[str]) -> dict[str, str]:
    """Each VCS reference's pinned URL -> the file URL of its exported tree."""
    from gpuenv.matrix import vcs

    out = {}
    for line in requirements:
        _, sep, url = line.split(";", 1)[0].partition(f" @ {vcs.PREFIX}")
        if sep:
            url = vcs.PREFIX + url.strip()
            ref = vcs.parse(url)
            out[url] = vcs.tree(ref, ref.rev).as_uri()
    return out


def _swap(text: str, urls: dict[str, str]) -> str:
    """`text` with each `@ URL` of `urls`' keys naming its value instead."""
    for old, new in urls.items():
        text = re.sub(rf"@ {re.escape(old)}(?=[\s;]|$)", f"@ {new}", text, flags=re.MULTILINE)
    return text


def _with_tree_hashes(text: str, tree_hashes: dict[str, str]) -> str:
    """uv hashes no directory (it read a local project's pyproject.toml); the lock holds its
    content digest (gpuenv/matrix/localtree.py: what the line was read with, the cell's
    hashes), which the build checks the tree against."""
    if not tree_hashes:
        return text
    from gpuenv.building.layers import blocks

    out = []
    for name, block in blocks(text):
        local = " @ file:" in block or " @ git+" in block
        if name in tree_hashes and local and "--hash=" not in block:
            block = f"{block.rstrip()} \\\n    --hash=sha256:{tree_hashes[name]}\n"
        out.append(block)
    return "".join(out)


def tree_hashes(cell: Cell) -> dict[str, str]:
    """The one digest each line with one gives (a local directory's content digest)."""
    return {name: digests[0] for name, digests, _ in cell.hashes if len(digests) == 1}


def _dependency_metadata(metadata: Iterable[Metadata]) -> str:
    """uv.toml's `dependency-metadata` entries (TOML strings written as JSON ones, which
    TOML's basic strings are)."""
    import json

    out = []
    for m in metadata:
        out.append("[[dependency-metadata]]")
        out.append(f"name = {json.dumps(m.name)}")
        out.append(f"version = {json.dumps(m.version)}")
        out.append(f"requires-dist = {json.dumps(list(m.requires_dist))}")
        if m.requires_python:
            out.append(f"requires-python = {json.dumps(m.requires_python)}")
    return "\n".join(out) + "\n"


def _with_credential(url: str, credentials: Credentials | None) -> str:
    credential = credentials.for_url(url) if credentials else None
    if credential is None:
        return url
    from urllib.parse import quote, urlsplit, urlunsplit

    parts = urlsplit(url)
    userinfo = f"{quote(credential.username, safe='')}:{quote(credential.password, safe='')}"
    return urlunsplit(parts._replace(netloc=f"{userinfo}@{parts.netloc.rsplit('@', 1)[-1]}"))


def lock_cell(
    cell: Cell,
    exclude_newer: str | None,
    index_url: str | None,
    extra_index_urls: tuple[str, ...] = (),
    *,
    credentials: Credentials | None = None,
    ca_bundle: Path | None = None,
    sources: Sources | None = None,
    root: Path | None = None,
) -> CellLock:
    """The cell's resolution; `sources` gives the metadata of packages that publish only an
    sdist (gpuenv/building/sdists.py), which the environment may then take."""
    indexes = (index_url, tuple(dict.fromkeys((*extra_index_urls, *cell.indexes))))
    platform = platform_of(cell)

    def resolved(
        requirements: list[str], constraints: tuple[str, ...] = (), with_sources: bool = False
    ) -> str:
        return compile_requirements(
            requirements, cell.python, exclude_newer, *indexes,
            credentials=credentials, ca_bundle=ca_bundle, platform=platform,
            constraints=constraints, sources=sources if with_sources else None, root=root,
            trees=tree_hashes(cell),
        )  # fmt: skip

    env = check_hashes(cell, resolved(env_requirements(cell), cell.constraints, True))
    cuda = ""
    if cell.is_gpu and not cell.cuda_with_framework:
        cuda = resolved(cuda_requirements(cell))
    return CellLock(inputs_digest(cell, exclude_newer), env, cuda, cell.left_out)


def check_hashes(cell: Cell, env: str) -> str:
    """A requirements file's --hash values hold as pip holds them: the file the lock picked
    for that package must be one of them. The resolution, unchanged, or the error."""
    if not cell.hashes:
        return env
    from gpuenv.store.wheelhouse import locked_requirements

    picked = {r.name: r for r in locked_requirements(env)}  # names PEP 503-normalised
    for name, hashes, where in cell.hashes:
        locked = picked.get(name)
        if locked is not None and not locked.hashes & set(hashes):
            raise GpuenvError(
                f"{where}: {name}=={locked.version}'s files match none of the line's --hash "
                "values; pip would refuse to install it: pin the version the hashes are of, "
                "or update the hashes"
            )
    return env


def pylock_path(lock_file: Path, cell: Cell) -> Path:
    """PEP 751's pylock.<name>.toml beside matrix.lock; a name holds no dots."""
    return lock_file.parent / f"pylock.{cell.name.replace('.', '_')}.toml"


def pylock_text(
    cell: Cell,
    entry: CellLock,
    exclude_newer: str | None,
    index_url: str | None,
    extra_index_urls: tuple[str, ...] = (),
    *,
    credentials: Credentials | None = None,
    ca_bundle: Path | None = None,
    sources: Sources | None = None,
    root: Path | None = None,
) -> str:
    """The cell's resolution as a standard PEP 751 lock: `uv pip compile --format
    pylock.toml` of the same inputs (its environment and CUDA wheels together), which must
    pin exactly what matrix.lock pins; a difference is an error, never two locks that
    disagree."""
    import tomllib

    from gpuenv.store.wheelhouse import locked_requirements, normalize

    indexes = (index_url, tuple(dict.fromkeys((*extra_index_urls, *cell.indexes))))
    text = compile_requirements(
        [*env_requirements(cell), *cuda_requirements(cell)], cell.python, exclude_newer,
        *indexes, credentials=credentials, ca_bundle=ca_bundle, platform=platform_of(cell),
        constraints=cell.constraints, output_format="pylock.toml", sources=sources, root=root,
    )  # fmt: skip
    doc = tomllib.loads(text)
    got = {(normalize(p["name"]), p.get("version")) for p in doc.get("packages", [])}
    want = {(r.name, r.version) for t in (entry.python_env, entry.cuda)
            for r in locked_requirements(t)}  # fmt: skip
    if got != want:
        differ = sorted(f"{n}=={v}" for n, v in got ^ want)[:5]
        raise GpuenvError(
            f"{cell.name}: the pylock.toml resolution differs from matrix.lock's "
            f"({', '.join(differ)}); re-lock both: gpuenv lock {cell.name} --pylock"
        )
    return text


# ---------------------------------------------------------------------- the lock verb


def exclude_newer_date(given: str | None, current: Lock | None) -> str:
    """--exclude-newer YYYY-MM-DD, else the current lock's date, else today."""
    if given is None:
        return current.exclude_newer if current is not None else today()
    try:
        if not re.fullmatch(r"[0-9]{4}-[0-9]{2}-[0-9]{2}", given):
            raise ValueError
        datetime.strptime(given, "%Y-%m-%d")
    except ValueError:
        raise GpuenvError(f"--exclude-newer {given!r}: expected YYYY-MM-DD", exit_code=2) from None
    return f"{given}T00:00:00Z"


def check(engine: Engine, lock: Lock | None, path: Path, cells: list[Cell]) -> dict[str, str]:
    """Cells whose lock entry, or base, no longer matches: cell -> why."""
    if lock is None:
        raise GpuenvError(f"{path}: no lock; write one with: gpuenv lock")
    drifted = drift(lock, cells)
    for image in sorted({c.base.image for c in cells}):
        info = engine.image(image)
        why = base_drift(lock, image, info) if info else "not in the engine"
        if why:
            for c in cells:
                if c.base.image == image and c.name not in drifted:
                    drifted[c.name] = f"base {image}: {why}"
    return drifted


def relock(
    engine: Engine,
    matrix: LoadedMatrix,
    cells: list[Cell],
    *,
    every_cell: list[Cell],
    current: Lock | None,
    exclude_newer: str | None,
    say: Callable[[str], None],
    credentials: Credentials | None = None,
    ca_bundle: Path | None = None,
    pylock: bool = False,
    sources_for: Callable[[Cell, str], Sources] | None = None,
) -> Path:
    """Resolve the cells again (the others keep their entries when the date is the same),
    record their bases, drop cells and bases the matrix no longer has (`every_cell` is
    what it has), write the lock next to the matrix. Resolutions use the credentials and
    the CA bundle a build's would. `sources_for` (a cell, the lock's date) gives the
    metadata of packages published only as sdists (gpuenv/building/sendable.py)."""
    from gpuenv.building import base as bases
    from gpuenv.building.recipe import current as this_recipe

    date = exclude_newer_date(exclude_newer, current)
    entries = dict(current.cells) if current and current.exclude_newer == date else {}
    locked_bases = dict(current.bases) if current else {}
    for image in sorted({c.base.image for c in cells}):
        cell = next(c for c in cells if c.base.image == image)
        bases.ensure(engine, cell.base, engine.image(image), say)
        info = engine.image(image)  # as bootstrapped, if it was missing
        if info is None:
            raise GpuenvError(f"base {image} vanished from the engine while locking")
        platform = cell.platform if cell.arch != "amd64" else None
        locked_bases[image] = base_identity(info, bases.package_list(engine, image, platform))
    build = matrix.model.build
    for cell in cells:
        entries[cell.name] = lock_cell(
            cell, date, build.index_url, tuple(build.extra_index_urls),
            credentials=credentials, ca_bundle=ca_bundle, root=matrix.dir.resolve(),
            sources=sources_for(cell, date) if sources_for is not None else None,
        )  # fmt: skip
        say(f"locked {cell.name}")
    names = {c.name for c in every_cell}
    used = {c.base.image for c in every_cell}
    entries = {k: v for k, v in entries.items() if k in names}
    locked_bases = {k: v for k, v in locked_bases.items() if k in used}
    path = lock_path(matrix.path)
    write(Lock(path, date, entries, locked_bases, recipe=this_recipe()))
    if pylock:
        for cell in cells:
            text = pylock_text(
                cell, entries[cell.name], date, build.index_url, tuple(build.extra_index_urls),
                credentials=credentials, ca_bundle=ca_bundle, root=matrix.dir.resolve(),
                sources=sources_for(cell, date) if sources_for is not None else None,
            )  # fmt: skip
            write_atomically(pylock_path(path, cell), text)
            say(f"wrote {pylock_path(path, cell).name}")
    return path
