"""matrix.lock: the complete, hashed pip resolution of every cell, and its base.

`pip install tensorflow[and-cuda]==2.21.0` floats every transitive package month to month;
the lock pins them all, with hashes, resolved by `uv pip compile` for the cell's Python and
platform with an exclude-newer date (so re-locking the same matrix gives the same lock).
Builds then install exactly the lock (--require-hashes --no-deps).

Per cell the lock keeps an `inputs` digest of what was resolved; a matrix edited after
locking no longer matches it, which `gpuenv lock --check` and `gpuenv build` report.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import subprocess
import sys
import tempfile
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any

from gpuenv.matrix.cell import Cell
from gpuenv.matrix.contract import lock_path
from gpuenv.matrix.errors import GpuenvError
from gpuenv.matrix.umask import current_umask

if TYPE_CHECKING:
    from collections.abc import Callable

    import yaml

    from gpuenv.engine.client import Engine, ImageInfo
    from gpuenv.matrix.schema import LoadedMatrix
    from gpuenv.store.credentials import Credentials

PLATFORM = "x86_64-manylinux_2_28"


def platform_of(cell: Cell) -> str:
    """uv's --python-platform for the cell's architecture (aarch64-manylinux_2_28 for an
    arm64 cell, whatever machine locks it). manylinux_2_28 is the floor PyTorch's and
    NVIDIA's wheels are built for; uv's target also takes older manylinux tags (cuDNN's
    2_27), which pip's --platform would refuse."""
    return f"{cell.machine}-manylinux_2_28"


VERSION = 1


@dataclass(frozen=True)
class CellLock:
    inputs: str
    python_env: str  # requirements.txt text with hashes: the framework + matrix packages
    cuda: str  # the nvidia-* wheels, with hashes ("" for CPU cells)
    # Requirements files' lines whose markers are false for the cell ("FILE:LINE: line"):
    # the lock says what it left out, so a reader of the lock is not left guessing.
    left_out: tuple[str, ...] = ()


@dataclass
class Lock:
    path: Path
    exclude_newer: str
    cells: dict[str, CellLock]
    # Per base image: {"id": image ID, "rootfs": sha256 of a bootstrapped base's tar (or
    # null), "packages": ["name=version", ...]}. Debian replaces versions at point
    # releases, so a base re-bootstrapped later differs; builds refuse it until re-locked
    # (or until the saved base is loaded: gpuenv base --load).
    bases: dict[str, dict[str, Any]] = field(default_factory=dict)


def framework_requirements(cell: Cell) -> list[str]:
    """The framework, and for PyTorch GPU cells the CUDA wheels it requires: the roots of
    the environment's first install step (gpuenv/building/layers.py)."""
    pins = _pins(cell) if cell.cuda_with_framework else []
    return [cell.framework_requirement, *pins]


def env_requirements(cell: Cell) -> list[str]:
    """What the environment's one resolution is made from: the framework, then the
    matrix's and the cell's own packages."""
    return [*framework_requirements(cell), *cell.pip]


def cuda_requirements(cell: Cell) -> list[str]:
    """The CUDA layer's pins ([] where they come with the framework, as PyTorch's do)."""
    return [] if cell.cuda_with_framework else _pins(cell)


def _pins(cell: Cell) -> list[str]:
    return [f"{name}=={version}" for name, version in sorted(cell.wheels.items())]


def inputs_digest(cell: Cell, exclude_newer: str | None) -> str:
    doc: dict[str, Any] = {
        "python": cell.python,
        "platform": platform_of(cell),
        "env": env_requirements(cell),
        "cuda": cuda_requirements(cell),
        "exclude_newer": exclude_newer,
    }
    # Only when present, so a lock written before these existed still matches.
    if cell.constraints:
        doc["constraints"] = list(cell.constraints)
    if cell.left_out:
        doc["left_out"] = list(cell.left_out)
    if cell.hashes:  # a user's lock re-hashed (same versions) is re-checked at the next lock
        doc["hashes"] = [[name, list(digests), where] for name, digests, where in cell.hashes]
    return "sha256:" + hashlib.sha256(json.dumps(doc, sort_keys=True).encode()).hexdigest()


def _uv() -> str:
    exe = Path(sys.executable).parent / "uv"
    if exe.exists():
        return str(exe)
    from shutil import which

    found = which("uv")
    if not found:
        raise GpuenvError("uv is not installed; pip install uv (gpuenv lock resolves with it)")
    return found


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
) -> str:
    """`uv pip compile --generate-hashes` for the cell's interpreter and platform, within
    `constraints` (pins the resolution must keep: what an image already holds). Index
    credentials reach uv in its environment (never its command line, which every local user
    can read), inside the URLs of the indexes whose origin they are bound to
    (gpuenv/store/credentials.py decides); uv reads no netrc of its own, which would give
    them to every port and scheme of a host. The CA bundle as SSL_CERT_FILE."""
    with tempfile.TemporaryDirectory() as tmp:
        source = Path(tmp) / "requirements.in"
        source.write_text("\n".join(requirements) + "\n")
        # --no-build: builds install wheels only, and building a source distribution to
        # read its metadata would run its setup.py here, with this environment's secrets.
        command = [
            _uv(), "pip", "compile", str(source), "--generate-hashes", "--no-header",
            "--no-annotate", "--quiet", "--no-build", "--python-version", python,
            "--python-platform", platform,
        ]  # fmt: skip
        if constraints:
            constraint_file = Path(tmp) / "constraints.txt"
            constraint_file.write_text("\n".join(constraints) + "\n")
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
        proc = subprocess.run(command, capture_output=True, text=True, check=False, env=env)
    if proc.returncode != 0:
        lines = [line for line in proc.stderr.strip().splitlines() if line.strip()]
        reason = " ".join(line.strip() for line in lines[-3:]) or f"exit {proc.returncode}"
        refusal = re.search(r"\b(401|403)\b", proc.stderr)
        if refusal and credentials is not None:
            # uv says only "401 Unauthorized"; gpuenv knows whose credentials it passed.
            from gpuenv.store.fetch import refused

            urls = [*extra_index_urls, *([index_url] if index_url else [])]
            base = next((u for u in urls if credentials.for_url(u)), urls[0] if urls else "")
            raise GpuenvError(refused(base, int(refusal.group(1)), credentials))
        raise GpuenvError(f"cannot resolve {', '.join(requirements)} for Python {python}: {reason}")
    return proc.stdout


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
) -> CellLock:
    indexes = (index_url, tuple(dict.fromkeys((*extra_index_urls, *cell.indexes))))
    platform = platform_of(cell)

    def resolved(requirements: list[str], constraints: tuple[str, ...] = ()) -> str:
        return compile_requirements(
            requirements, cell.python, exclude_newer, *indexes,
            credentials=credentials, ca_bundle=ca_bundle, platform=platform,
            constraints=constraints,
        )  # fmt: skip

    env = check_hashes(cell, resolved(env_requirements(cell), cell.constraints))
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
        constraints=cell.constraints, output_format="pylock.toml",
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


def today() -> str:
    return datetime.now(UTC).strftime("%Y-%m-%dT00:00:00Z")


def load(path: Path) -> Lock | None:
    """matrix.lock, checked: plain YAML (no tags, alias bombs or duplicate keys), this
    version, a sha256 per cell, an exclude-newer timestamp. Anything else is one error that
    names the file and says how to recover."""
    from gpuenv.matrix.errors import MatrixError
    from gpuenv.matrix.files import read_regular
    from gpuenv.matrix.yamlfile import MAX_BYTES, parse

    if not path.exists() and not path.is_symlink():
        return None

    def bad(why: str) -> GpuenvError:
        return GpuenvError(f"{path}: not a gpuenv lock ({why}); rewrite it: gpuenv lock")

    try:
        raw = read_regular(path, MAX_BYTES * 50)
    except OSError as exc:
        raise bad(f"cannot read: {exc.strerror}") from None
    if len(raw) > MAX_BYTES * 50:
        raise bad("too large")
    try:
        data: Any = parse(raw.decode("utf-8"), path).data
    except UnicodeDecodeError as exc:
        raise bad(f"not UTF-8 text (byte {exc.start})") from None
    except MatrixError as exc:
        raise GpuenvError(f"{exc.message}; rewrite it: gpuenv lock") from None
    if not isinstance(data, dict):
        raise bad("expected a mapping")
    if data.get("version") != VERSION:
        raise bad(f"version {data.get('version')!r}, this gpuenv reads version {VERSION}")
    exclude_newer = data.get("exclude_newer")
    if not isinstance(exclude_newer, str) or not _TIMESTAMP.fullmatch(exclude_newer):
        raise bad(f"exclude_newer {exclude_newer!r}: expected YYYY-MM-DDT00:00:00Z")
    cells_doc, bases_doc = data.get("cells") or {}, data.get("bases") or {}
    if not isinstance(cells_doc, dict) or not isinstance(bases_doc, dict):
        raise bad("cells and bases must be mappings")
    cells = {}
    for name, c in cells_doc.items():
        if not isinstance(c, dict) or not all(
            isinstance(c.get(k, ""), str) for k in ("inputs", "python_env", "cuda")
        ):
            raise bad(f"cell {str(name)[:80]!r}: expected inputs, python_env, cuda as text")
        if not re.fullmatch(r"sha256:[0-9a-f]{64}", c.get("inputs", "")):
            raise bad(f"cell {str(name)[:80]!r}: inputs is not sha256:<64 hex digits>")
        left_out = c.get("left_out") or []
        if not isinstance(left_out, list) or not all(isinstance(x, str) for x in left_out):
            raise bad(f"cell {str(name)[:80]!r}: left_out is not a list of lines")
        cells[str(name)] = CellLock(
            c["inputs"], str(c.get("python_env") or ""), str(c.get("cuda") or ""),
            tuple(left_out),
        )  # fmt: skip
    bases = {}
    for image, entry in bases_doc.items():
        if not isinstance(entry, dict):
            raise bad(f"base {str(image)[:80]!r}: expected a mapping")
        bases[str(image)] = dict(entry)
    return Lock(path, exclude_newer, cells, bases)


_TIMESTAMP = re.compile(r"[0-9]{4}-[0-9]{2}-[0-9]{2}T[0-9]{2}:[0-9]{2}:[0-9]{2}Z")


class _Literal(str):
    pass


def _literal(dumper: yaml.SafeDumper, value: _Literal) -> yaml.Node:
    return dumper.represent_scalar("tag:yaml.org,2002:str", value, style="|")


def write(lock: Lock) -> None:
    import yaml  # here: a build that only reads a cached lock never imports it

    class LockDumper(yaml.SafeDumper):  # its own class: SafeDumper's representers stay
        pass

    LockDumper.add_representer(_Literal, _literal)
    cells = {}
    for name in sorted(lock.cells):
        c = lock.cells[name]
        entry: dict[str, Any] = {"inputs": c.inputs, "python_env": _Literal(c.python_env)}
        if c.cuda:
            entry["cuda"] = _Literal(c.cuda)
        if c.left_out:
            entry["left_out"] = list(c.left_out)
        cells[name] = entry
    doc = {
        "version": VERSION,
        "exclude_newer": lock.exclude_newer,
        "bases": {k: lock.bases[k] for k in sorted(lock.bases)},
        "cells": cells,
    }
    header = (
        "# matrix.lock: written by `gpuenv lock`; commit it. Builds install exactly these\n"
        "# packages (--require-hashes --no-deps). Re-lock after editing the matrix.\n"
    )
    text = yaml.dump(doc, Dumper=LockDumper, sort_keys=False, width=120)
    _write_atomically(lock.path, header + text)


def _write_atomically(path: Path, text: str) -> None:
    """An interrupted or concurrent `gpuenv lock` leaves one whole file."""
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.")
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as fh:
            fh.write(text)
        os.chmod(tmp, 0o666 & ~current_umask())  # a committed file: not mkstemp's 0600
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def drift(lock: Lock, cells: list[Cell]) -> dict[str, str]:
    """Cells whose lock entry is missing or no longer matches the matrix, with why."""
    out = {}
    for cell in cells:
        entry = lock.cells.get(cell.name)
        if entry is None:
            out[cell.name] = "not in the lock"
        elif entry.inputs != inputs_digest(cell, lock.exclude_newer):
            out[cell.name] = "the matrix changed since it was locked"
    return out


def root_filesystem(image: ImageInfo) -> str | None:
    """A bootstrapped base's root filesystem, by content: its one layer's diff_id, which the
    engine computed from the layer's bytes when the tar mmdebstrap wrote was imported (the
    io.gpuenv.rootfs label states the same digest, but a label is only a claim: issue 35,
    M2). None for an image of more layers (a registry base, pinned by its ID)."""
    return image.layers[0] if len(image.layers) == 1 else None


def base_identity(image: ImageInfo, packages: list[str]) -> dict[str, Any]:
    rootfs = root_filesystem(image) if image.claims.rootfs else None
    return {"id": image.id, "rootfs": rootfs, "packages": packages}


def base_drift(lock: Lock, base_image: str, image: ImageInfo) -> str | None:
    """Why the engine's base differs from the locked one, or None."""
    locked = lock.bases.get(base_image)
    if locked is None:
        # The matrix moved a cell to a base it was not locked on (a lock from before bases
        # were recorded has none at all: nothing to compare with).
        return "not in the lock (the matrix changed its base)" if lock.bases else None
    rootfs = root_filesystem(image)
    if locked.get("rootfs"):
        if rootfs != locked["rootfs"]:
            return f"root filesystem {rootfs} is not the locked {locked['rootfs']}"
        return None
    if image.id != locked.get("id"):
        return f"image {image.id[:19]} is not the locked {str(locked.get('id'))[:19]}"
    return None


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
) -> Path:
    """Resolve the cells again (the others keep their entries when the date is the same),
    record their bases, drop cells and bases the matrix no longer has (`every_cell` is
    what it has), write the lock next to the matrix. Resolutions use the credentials and
    the CA bundle a build's would."""
    from gpuenv.building import base as bases

    date = exclude_newer_date(exclude_newer, current)
    entries = dict(current.cells) if current and current.exclude_newer == date else {}
    locked_bases = dict(current.bases) if current else {}
    for image in sorted({c.base.image for c in cells}):
        cell = next(c for c in cells if c.base.image == image)
        bases.ensure(engine, cell.base, say)
        info = engine.image(image)
        if info is None:
            raise GpuenvError(f"base {image} vanished from the engine while locking")
        platform = cell.platform if cell.arch != "amd64" else None
        locked_bases[image] = base_identity(info, bases.package_list(engine, image, platform))
    build = matrix.model.build
    for cell in cells:
        entries[cell.name] = lock_cell(
            cell, date, build.index_url, tuple(build.extra_index_urls),
            credentials=credentials, ca_bundle=ca_bundle,
        )  # fmt: skip
        say(f"locked {cell.name}")
    names = {c.name for c in every_cell}
    used = {c.base.image for c in every_cell}
    entries = {k: v for k, v in entries.items() if k in names}
    locked_bases = {k: v for k, v in locked_bases.items() if k in used}
    path = lock_path(matrix.path)
    write(Lock(path, date, entries, locked_bases))
    if pylock:
        for cell in cells:
            text = pylock_text(
                cell, entries[cell.name], date, build.index_url, tuple(build.extra_index_urls),
                credentials=credentials, ca_bundle=ca_bundle,
            )  # fmt: skip
            _write_atomically(pylock_path(path, cell), text)
            say(f"wrote {pylock_path(path, cell).name}")
    return path
