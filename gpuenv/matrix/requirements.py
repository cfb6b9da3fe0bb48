"""Users' requirements files (`packages: {requirements: [path]}` in matrix.yaml).

A requirements file's lines join the cell's Python packages exactly as `packages.pip`
entries do, so the lock resolves them, the build installs them and `lock --check` sees an
edit. gpuenv passes on only what it can vouch for: plain requirements (name, extras,
version specifiers). Options (`-e`, `-r`, `--index-url`, `--hash`, ...), URLs and `git+`
references, local paths, markers, environment variables and credentials are refused with
the file and line, because each would either reach outside the matrix's control (another
index, a VCS checkout) or put a secret into a layer.
"""

from __future__ import annotations

import hashlib
import os
import re
import stat
from dataclasses import dataclass
from pathlib import Path

from gpuenv.matrix.files import read_regular

MAX_BYTES = 1_000_000
MAX_LINES = 5_000

# Name, extras and version specifiers: nothing that could be a URL, a marker, a quote or
# shell syntax (the value reaches a Dockerfile's RUN line when there is no lock).
_PIP_CHARS = re.compile(r"[A-Za-z0-9][A-Za-z0-9._\-\[\],<>=!~ ]*")


def pip_requirement(value: str) -> str:
    """A plain pip requirement, normalised (packaging's form), or ValueError saying why not.
    The one check for `packages.pip`, `include` pip entries and requirements files' lines."""
    from packaging.requirements import InvalidRequirement, Requirement

    if not _PIP_CHARS.fullmatch(value):
        raise ValueError(
            f"{value!r} is not a plain pip requirement (name, extras and version specifiers "
            "only; no URLs, markers, quotes or shell syntax)"
        )
    try:
        req = Requirement(value)
    except InvalidRequirement as exc:
        reason = str(exc).splitlines()[0] if str(exc) else "invalid"
        raise ValueError(f"{value!r} is not a valid pip requirement: {reason}") from None
    return str(req)


@dataclass(frozen=True)
class RequirementsFile:
    written: str  # the path as the matrix writes it
    path: Path  # absolute, symlinks resolved
    lines: tuple[str, ...]  # normalised requirements, in file order
    digest: str  # sha256 of the file's bytes


class RequirementsProblem(Exception):
    """Why a requirements path or line is refused; `line` is the file's line, if any."""

    def __init__(self, message: str, path: str, line: int | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.path = path
        self.line = line


def check_written_path(value: str) -> str:
    """The schema's check of the path string itself (the file is read at load time)."""
    if not value or len(value) > 255 or any(ord(c) < 32 for c in value):
        raise ValueError(f"{value[:80]!r} is not a requirements file path")
    if "://" in value or "@" in value:
        # Not echoed: it may hold a credential.
        raise ValueError(
            "requirements entries are files beside the matrix, not URLs; credentials do not "
            "belong in the matrix (use pip's netrc or keyring)"
        )
    if os.path.isabs(value) or value.startswith("~"):
        raise ValueError(
            f"{value!r}: requirements paths are relative to the matrix file's directory"
        )
    return value


def read(written: str, matrix_dir: Path) -> RequirementsFile:
    """Read and check one requirements file; RequirementsProblem names what is wrong."""
    root = matrix_dir.resolve()
    path = (matrix_dir / written).resolve()
    if not path.is_relative_to(root):
        raise RequirementsProblem(
            f"requirements file {written!r} is outside the matrix's directory {root}; "
            "keep it beside matrix.yaml (or below it)",
            written,
        )
    try:
        st = path.stat()
    except FileNotFoundError:
        raise RequirementsProblem(
            f"requirements file {written!r} does not exist ({path})", written
        ) from None
    except OSError as exc:
        raise RequirementsProblem(
            f"requirements file {written!r} cannot be read: {exc.strerror}", written
        ) from None
    if not stat.S_ISREG(st.st_mode):
        raise RequirementsProblem(f"requirements file {written!r} is not a regular file", written)
    if st.st_size > MAX_BYTES:
        raise RequirementsProblem(
            f"requirements file {written!r} is larger than {MAX_BYTES} bytes", written
        )
    try:
        raw = read_regular(path, MAX_BYTES)
    except IsADirectoryError:  # replaced by something else since the stat
        raise RequirementsProblem(
            f"requirements file {written!r} is not a regular file", written
        ) from None
    except OSError as exc:
        raise RequirementsProblem(
            f"requirements file {written!r} cannot be read: {exc.strerror}", written
        ) from None
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise RequirementsProblem(
            f"requirements file {written!r} is not UTF-8 text (byte {exc.start})", written
        ) from None
    lines = parse(text, written)
    return RequirementsFile(written, path, lines, hashlib.sha256(raw).hexdigest())


_URL = re.compile(r"[A-Za-z][A-Za-z0-9+.-]*://|^git\+|@\s*[A-Za-z][A-Za-z0-9+.-]*:")
_CREDENTIAL = re.compile(r"[^\s/@]+:[^\s/@]*@|\$\{?[A-Za-z_]")


def parse(text: str, written: str) -> tuple[str, ...]:
    """The requirements in a file's text, each checked and normalised (packaging's form)."""
    out: list[str] = []
    physical = text.splitlines()
    if len(physical) > MAX_LINES:
        raise RequirementsProblem(f"more than {MAX_LINES} lines", written)
    for number, raw in enumerate(physical, start=1):
        line = _strip_comment(raw).strip()
        if not line:
            continue

        def bad(why: str, line_no: int = number) -> RequirementsProblem:
            return RequirementsProblem(why, written, line_no)

        if line.endswith("\\"):
            raise bad("line continuations are not passed on; write the requirement on one line")
        if _CREDENTIAL.search(line):
            raise bad(
                "credentials or environment variables do not belong in a requirements file "
                "gpuenv builds from; use pip's netrc or keyring for a private index"
            )
        if line.startswith("-") or re.search(r"\s-{1,2}[A-Za-z]", line):
            option = line.split()[0] if line.startswith("-") else "an inline option"
            raise bad(
                f"{option}: pip options (-e, -r, -c, --index-url, --hash, ...) are not passed "
                "on; indexes belong in the matrix's build.index_url, hashes in matrix.lock"
            )
        if _URL.search(line):
            raise bad(
                "URLs and VCS references (git+..., name @ url) are not passed on; publish "
                "the package to an index and require it by name and version"
            )
        if line.startswith((".", "/", "~")) or line.endswith((".whl", ".tar.gz", ".zip")):
            raise bad("local paths and archives are not passed on; require packages by name")
        try:
            out.append(pip_requirement(line))
        except ValueError as exc:
            raise bad(str(exc)) from None
    return tuple(out)


def _strip_comment(line: str) -> str:
    """pip's rule: '#' starts a comment at the line's start or after whitespace."""
    match = re.search(r"(^|\s)#", line)
    return line[: match.start()] if match else line
