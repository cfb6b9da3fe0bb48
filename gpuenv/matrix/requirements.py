"""Users' requirements files (`packages: {requirements: [path]}` in matrix.yaml), read as
pip reads them.

pip's line rules are followed (its `req_file.py`): a `\\` at a line's end joins the next
line, `#` after whitespace starts a comment, `${VAR}` is replaced from the environment
(only a variable the user lists in $GPUENV_ALLOW_ENV, and never inside a URL: see below),
`-r`/`-c` include other files (relative to the including file), `--index-url` and
`--extra-index-url` name indexes, and a requirement carries PEP 508 markers and `--hash`
options. Requirements and markers are parsed by `packaging` (pip's own parser).

What differs, and why:
- `${VAR}`: pip fills any variable, anywhere in a line. A project's files are data, never
  a channel to the user's environment (issue 44, N1): gpuenv fills only the variables the
  user names in $GPUENV_ALLOW_ENV, never into a URL, and names no value in a message.
  Credentials for a private index or git host come from netrc or $GPUENV_INDEX_*, bound
  to one origin (gpuenv/store/credentials.py), or the user's own git configuration.
- Markers are evaluated per cell (its Python, Linux, its machine), when the cell is made
  (`for_cell`): a line that does not apply is left out of that cell, and its lock says so.
  What reaches a cell is the requirement without its marker: name, extras, specifiers,
  nothing that could be shell syntax.
- Included files must lie inside the matrix's directory once symlinks are resolved, like
  the files the matrix names.
- Index options join the matrix's `build.index_url`/`build.extra_index_urls`, under the
  same rules: no credentials in a URL (netrc/keyring/$GPUENV_* give them, per host), the
  CA from `build.ca_bundle`; an `--index-url` other than the matrix's is an error.
- Direct references are taken as URLs of archives (`name @ https://…/name-1.0.tar.gz` or
  a wheel; a `#sha256=` fragment checked): gpuenv fetches them on the client and builds an
  sdist on the engine (gpuenv/building/sdists.py). A git reference (`name @ git+https://…
  @REV`) is checked out on the client and taken as a local directory (gpuenv/matrix/
  vcs.py). What gpuenv cannot yet do as pip would (other VCS, editable installs,
  --find-links, --no-binary,
  --trusted-host, --pre) is one `error: FILE:LINE` saying what pip would have done and
  what to write instead.

The `pip-requirements-parser` package (pip's req_file vendored) was considered and not
used: it opens included files itself, so the checks below (inside the directory, a regular
file, a size limit, no FIFO that blocks) could not be applied to them, and its last release
is from 2022. The line rules are a few dozen lines; the grammar is `packaging`'s.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import stat
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from gpuenv.matrix.files import open_regular, read_regular

if TYPE_CHECKING:
    from collections.abc import Callable

    _Bad = Callable[[str], "RequirementsProblem"]

MAX_BYTES = 1_000_000
MAX_LINES = 5_000
MAX_FILES = 50  # -r/-c nesting, all files together

# Name, extras and version specifiers: nothing that could be a URL, a marker, a quote or
# shell syntax (the value reaches a Dockerfile's RUN line when there is no lock).
_PIP_CHARS = re.compile(r"[A-Za-z0-9][A-Za-z0-9._\-\[\],<>=!~ ]*")


def pip_requirement(value: str) -> str:
    """A plain pip requirement, normalised (packaging's form), or ValueError saying why not.
    The one check for `packages.pip`, `include` pip entries and requirements files' lines
    (once their markers are evaluated)."""
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
class Line:
    """One requirement of a file, where it was written."""

    path: Path  # the file it is in (absolute, symlinks resolved)
    number: int  # its first physical line
    name: str  # canonical (PEP 503) name
    requirement: str  # name, extras, specifiers: what reaches the cell
    marker: str = ""  # the PEP 508 marker as written (normalised), "" when none
    hashes: tuple[str, ...] = ()  # sha256 hex digests from --hash options

    @property
    def where(self) -> str:
        return f"{self.path}:{self.number}"

    @property
    def text(self) -> str:
        return f"{self.requirement}; {self.marker}" if self.marker else self.requirement


@dataclass(frozen=True)
class RequirementsFile:
    written: str  # the path as the matrix writes it
    path: Path  # absolute, symlinks resolved
    lines: tuple[Line, ...]  # requirements, in file order, includes (-r) in place
    constraints: tuple[Line, ...]  # from -c files
    digest: str  # sha256 over the bytes of this file and every file it includes
    index_url: tuple[str, Line] | None = None  # --index-url, with where it was written
    extra_index_urls: tuple[tuple[str, Line], ...] = ()
    # Every file read (this one first), as named (joined, unresolved) -> (resolved, sha256),
    # and the environment variables its lines took values from: what a cached resolution
    # of the matrix must see unchanged (gpuenv/project/snapshot.py).
    files: tuple[tuple[str, Path, str], ...] = ()
    environment: tuple[tuple[str, str], ...] = ()
    # A lock's own bounds (uv.lock, pylock.toml): requires-python, and pylock's
    # environments (markers, any of which must hold for a cell).
    requires_python: str = ""
    environments: tuple[str, ...] = ()


@dataclass(frozen=True)
class Selection:
    """What of a requirements file applies to one cell."""

    kept: tuple[Line, ...]
    constraints: tuple[Line, ...]
    left_out: tuple[Line, ...]  # markers false for the cell


class RequirementsProblem(Exception):
    """Why a requirements path or line is refused; `line` is the file's line, if any, and
    `path` the file (an included one when the problem is there)."""

    def __init__(self, message: str, path: str | Path, line: int | None = None) -> None:
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
    """Read and check one requirements file and the files it includes; RequirementsProblem
    names what is wrong (with the including line, for an unusable included file)."""
    reader = _Reader(matrix_dir.resolve())
    path, raw = reader.open(written, matrix_dir)
    reader.parse(path, raw, constraint=False)
    if len(reader.files) == 1:
        digest = reader.files[0][2]  # one file: its own sha256, as before includes
    else:
        combined = hashlib.sha256()
        for _, p, d in reader.files:
            combined.update(f"{p.relative_to(reader.root)}\0{d}\0".encode())
        digest = combined.hexdigest()
    return RequirementsFile(
        written, path, tuple(reader.lines), tuple(reader.constraints), digest,
        reader.index_url, tuple(reader.extra_index_urls), (*reader.files, *reader.moving),
        tuple(sorted(reader.environment.items())),
    )  # fmt: skip


def pyproject_document(raw: bytes, named: str, path: str | Path) -> dict[str, Any]:
    """A pyproject.toml's tables: the one place gpuenv parses one (a matrix's `pyproject`
    key, `gpuenv init`, a local directory's name, an sdist's build requirements);
    RequirementsProblem naming `named` (at `path`) when it is not UTF-8 TOML."""
    import tomllib

    try:
        return tomllib.loads(raw.decode("utf-8"))
    except (UnicodeDecodeError, tomllib.TOMLDecodeError) as exc:
        raise RequirementsProblem(f"{named} is not TOML: {exc}", path) from None


def read_pyproject(
    written: str, matrix_dir: Path, extras: tuple[str, ...], groups: tuple[str, ...], *,
    install_project: bool = False, exclude: tuple[str, ...] = (),
) -> RequirementsFile:  # fmt: skip
    """A pyproject.toml's `[project] dependencies`, the `optional-dependencies` of `extras`
    and the PEP 735 `[dependency-groups]` `groups` (with their include-group entries), as
    requirement lines: each is what a requirements file's line would be, at the line of the
    file it is written on. With `install_project`, the project itself too: its directory
    as a local directory's line (`name @ file:.`), tarred without the files `exclude`
    names (the matrix and its locks, localtree.project_excludes)."""
    from packaging.dependency_groups import resolve_dependency_groups

    reader = _Reader(matrix_dir.resolve())
    path, raw = reader.open(written, matrix_dir)
    reader.files.append((reader.named, path, hashlib.sha256(raw).hexdigest()))
    doc = pyproject_document(raw, repr(written), written)
    project = doc.get("project")
    if not isinstance(project, dict):
        raise RequirementsProblem(f"{written!r} has no [project] table", written)
    if "dependencies" in (project.get("dynamic") or []):
        raise RequirementsProblem(
            f"{written!r} declares its dependencies dynamic (the build backend computes "
            "them); gpuenv reads them only as written: list them in [project] dependencies "
            "or a requirements file",
            written,
        )
    wanted: list[str] = list(_strings(project.get("dependencies"), written, "dependencies"))
    optional = project.get("optional-dependencies") or {}
    for extra in extras:
        if extra not in optional:
            have = ", ".join(sorted(optional)) or "none"
            raise RequirementsProblem(
                f"extra {extra!r} is not in {written}'s [project.optional-dependencies] "
                f"(it has: {have})",
                written,
            )
        wanted += _strings(optional[extra], written, f"optional-dependencies.{extra}")
    table = doc.get("dependency-groups") or {}
    for group in groups:
        if group not in table:
            have = ", ".join(sorted(table)) or "none"
            raise RequirementsProblem(
                f"group {group!r} is not in {written}'s [dependency-groups] (it has: {have})",
                written,
            )
        try:
            wanted += resolve_dependency_groups(table, group)
        except (ValueError, TypeError, ExceptionGroup) as exc:
            causes = getattr(exc, "exceptions", [exc])
            raise RequirementsProblem(
                f"[dependency-groups] {group}: {causes[0]}", written
            ) from None
    physical = raw.decode("utf-8").splitlines()
    wanted = _without_itself(wanted, project, optional, written, path, physical)
    for requirement in dict.fromkeys(wanted):
        number = _line_of(physical, requirement)
        if requirement.lstrip().startswith("-"):
            raise RequirementsProblem(
                f"{requirement!r} is a pip option, not a requirement", path, number
            )
        reader._line(path, number, requirement, constraint=False)
    if install_project:
        name = project.get("name")
        number = _line_of(physical, name) if isinstance(name, str) else 1
        folder = os.path.relpath(path.parent, reader.root)

        def bad(why: str) -> RequirementsProblem:
            return RequirementsProblem(f"install_project: {why}", path, number)

        reader._local_tree(path, number, "", "", folder, path.parent, "", (),
                           constraint=False, bad=bad, itself=exclude)  # fmt: skip
    chosen = json.dumps([line.text for line in reader.lines]).encode()
    return RequirementsFile(
        written, path, tuple(reader.lines), (), hashlib.sha256(chosen).hexdigest(),
        files=(*reader.files, *reader.moving),
    )  # fmt: skip


def _without_itself(
    wanted: list[str], project: dict[str, Any], optional: dict[str, Any], written: str,
    path: Path, physical: list[str],
) -> list[str]:  # fmt: skip
    """`wanted` less the project naming itself (a dependency group's `"myproject"`, or
    `"myproject[plots]"`, as uv's docs write it): pip would fetch a package of that name
    from the index (someone else's, or none), where uv means this directory. It is left
    out (`gpuenv run` mounts the project; `install_project: true` installs it) and the
    extras it names join in their place."""
    from packaging.requirements import InvalidRequirement, Requirement
    from packaging.utils import canonicalize_name

    name = project.get("name")
    if not isinstance(name, str):
        return wanted
    itself = canonicalize_name(name)
    kept: list[str] = []
    queue, seen = list(wanted), set[str]()
    while queue:
        text = queue.pop(0)
        try:
            req = Requirement(text)
        except InvalidRequirement:
            kept.append(text)  # refused at its line by the reader, as any other
            continue
        if canonicalize_name(req.name) != itself:
            kept.append(text)
            continue
        if req.marker is not None or req.url:
            raise RequirementsProblem(
                f"{text}: the project names itself with a marker or URL; gpuenv takes "
                "the project only as itself (`gpuenv run` mounts it): write the packages "
                "you meant there instead",
                path,
                _line_of(physical, text),
            )
        for extra in sorted(req.extras - seen):
            seen.add(extra)
            if extra not in optional:
                raise RequirementsProblem(
                    f"{text}: extra {extra!r} is not in {written}'s "
                    "[project.optional-dependencies]",
                    path,
                    _line_of(physical, text),
                )
            queue += _strings(optional[extra], written, f"optional-dependencies.{extra}")
    return kept


def _strings(value: object, written: str, where: str) -> list[str]:
    if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
        raise RequirementsProblem(f"{written}: {where} is not a list of strings", written)
    return list(value)


def _line_of(physical: list[str], requirement: str) -> int:
    """The line a requirement string is written on (its first occurrence, quoted)."""
    for quoted in (f'"{requirement}"', f"'{requirement}'"):
        for number, line in enumerate(physical, start=1):
            if quoted in line:
                return number
    return 1


def env_digest(value: str | None) -> str:
    """What a cache keeps of an expanded variable's value (its digest, not the value)."""
    return "unset" if value is None else hashlib.sha256(value.encode()).hexdigest()


def for_cell(files: list[RequirementsFile], python: str, machine: str) -> Selection:
    """The lines of `files` whose markers hold in a cell of Python `python` on Linux
    `machine` (a marker whose answer depends on the Python's patch release, not known
    until the image exists, is refused here unless both ends of the minor release agree),
    after checking the files' own bounds (a lock's requires-python and environments)."""
    kept: list[Line] = []
    constraints: list[Line] = []
    left: list[Line] = []
    for f in files:
        _check_bounds(f, python, machine)
        for line in f.lines:
            (kept if applies(line, python, machine) else left).append(line)
        constraints += [c for c in f.constraints if applies(c, python, machine)]
    return Selection(tuple(kept), tuple(constraints), tuple(left))


def _check_bounds(f: RequirementsFile, python: str, machine: str) -> None:
    from packaging.markers import Marker
    from packaging.specifiers import SpecifierSet

    if f.requires_python:
        allowed = SpecifierSet(f.requires_python)
        if not any(allowed.contains(f"{python}.{p}", prereleases=True) for p in ("0", "99")):
            raise RequirementsProblem(
                f"{f.written} was resolved for Python {f.requires_python}; a cell of Python "
                f"{python} cannot take its pins: drop Python {python} from the matrix, or "
                "re-lock the project for it",
                f.path,
            )
    envs = [Marker(m) for m in f.environments]
    if envs and not any(m.evaluate(_environment(python, machine, "0")) for m in envs):
        raise RequirementsProblem(
            f"{f.written} was locked for the environments {list(f.environments)}; none is "
            f"Linux {machine} with Python {python}: re-lock the project for it",
            f.path,
        )


def inside(written: str, matrix_dir: Path) -> tuple[str, Path, bytes]:
    """A file the matrix names, checked as requirements files are: (the path as named,
    joined; resolved; its bytes)."""
    reader = _Reader(matrix_dir.resolve())
    path, raw = reader.open(written, matrix_dir)
    return reader.named, path, raw


def applies(line: Line, python: str, machine: str) -> bool:
    if not line.marker:
        return True
    from packaging.markers import Marker

    marker = Marker(line.marker)
    answers = {marker.evaluate(_environment(python, machine, p)) for p in ("0", "99")}
    if len(answers) > 1:
        raise RequirementsProblem(
            f"marker {line.marker!r} holds for some Python {python} patch releases and not "
            f"others; pip would decide it on the installed interpreter, gpuenv decides it "
            "when the cell is made, before its Python's patch release is known: compare "
            "python_version instead",
            line.path,
            line.number,
        )
    return answers.pop()


def _environment(python: str, machine: str, patch: str) -> dict[str, str]:
    """PEP 508's marker variables as the cell's interpreter will report them."""
    return {
        "implementation_name": "cpython",
        "implementation_version": f"{python}.{patch}",
        "os_name": "posix",
        "platform_machine": machine,
        "platform_python_implementation": "CPython",
        "platform_system": "Linux",
        "python_full_version": f"{python}.{patch}",
        "python_version": python,
        "sys_platform": "linux",
        "extra": "",
    }


# Marker variables that name the machine gpuenv locks on, not the image (the kernel's
# release and build string): no answer is right for every host the image runs on.
_HOST_MARKERS = re.compile(r"\bplatform_(release|version)\b")

# pip's: ${NAME} only, upper case, digits and '_' (req_file.py, ENV_VAR_RE).
_ENV_VAR = re.compile(r"\$\{([A-Z0-9_]+)\}")
# The variables a user lets requirements files read (names, separated by commas or
# spaces): values that are no secret, such as a version.
ALLOW_ENV = "GPUENV_ALLOW_ENV"


def allowed_variables() -> frozenset[str]:
    return frozenset(re.split(r"[\s,]+", os.environ.get(ALLOW_ENV, "").strip())) - {""}


def _in_url(line: str) -> bool:
    """Whether a line names a URL a value would be sent to: an index option, or a direct
    or VCS reference (a `file:` one is read here, inside the project, and sent nowhere)."""
    if line.startswith("-"):
        return _split_option(line)[0] in ("-i", "--extra-index-url") or "://" in line
    spec = line.split(";", 1)[0]
    if _FILE_REFERENCE.match(spec):
        return False
    return "://" in spec or "@" in spec


_COMMENT = re.compile(r"(^|\s+)#.*$")
_USERINFO = re.compile(r"://[^/\s@]*@")
_HASH = re.compile(r"sha256:([0-9a-fA-F]{64})")

# Whole-line options gpuenv refuses: what pip would have done, and what to write instead.
_REFUSED = {
    "-e": "pip would install that project in development mode (editable); gpuenv run mounts "
    "the project's directory at the working directory, so its code is importable without "
    "installing it: remove the line",
    "-f": "pip would look for packages in that directory or page (--find-links); gpuenv "
    "fetches from indexes only: publish the wheels to an index and name it with "
    "--extra-index-url or build.extra_index_urls",
    "--no-index": "pip would use only --find-links locations; gpuenv fetches from indexes: "
    "remove the line and set build.index_url to the index to use",
    "--no-binary": "pip would build those packages from source; gpuenv installs wheels: "
    "remove the option",
    "--trusted-host": "pip would skip TLS verification for that host; gpuenv always "
    "verifies: give the host's CA in build.ca_bundle and remove the line",
    "--pre": "pip would consider pre-releases for every requirement; pin the pre-release "
    "you want exactly (name==1.0rc1), which needs no --pre",
}
# Whole-line options with no effect on what gpuenv installs (it always installs wheels,
# checked by hash).
_IGNORED = {"--prefer-binary", "--only-binary", "--require-hashes", "--use-feature"}
_SPELLINGS = {
    "--requirement": "-r", "--constraint": "-c", "--index-url": "-i", "--editable": "-e",
    "--find-links": "-f",
}  # fmt: skip
_TAKES_VALUE = {"-r", "-c", "-i", "--extra-index-url", "-e", "-f", "--no-binary",
                "--only-binary", "--trusted-host", "--use-feature"}  # fmt: skip


@dataclass
class _Reader:
    root: Path
    lines: list[Line] = field(default_factory=list)
    constraints: list[Line] = field(default_factory=list)
    files: list[tuple[str, Path, str]] = field(default_factory=list)
    environment: dict[str, str] = field(default_factory=dict)
    index_url: tuple[str, Line] | None = None
    extra_index_urls: list[tuple[str, Line]] = field(default_factory=list)
    stack: list[Path] = field(default_factory=list)
    named: str = ""  # the path of the file being opened, joined but not resolved
    # Git references by branch or tag: inputs of the cached reading, not of the digest.
    moving: list[tuple[str, Path, str]] = field(default_factory=list)

    def open(self, written: str, relative_to: Path) -> tuple[Path, bytes]:
        """A file named by the matrix or an -r/-c line, checked (the problem names it as
        written; the caller adds the line that named it)."""
        self.named = os.path.abspath(relative_to / written)
        path = (relative_to / written).resolve()
        if not path.is_relative_to(self.root):
            raise RequirementsProblem(
                f"requirements file {written!r} is outside the matrix's directory "
                f"{self.root}; keep it beside matrix.yaml (or below it)",
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
            raise RequirementsProblem(
                f"requirements file {written!r} is not a regular file", written
            )
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
        return path, raw

    def parse(self, path: Path, raw: bytes, *, constraint: bool) -> None:
        if path in self.stack:
            return  # pip would recurse forever; the file's lines are already being read
        if len(self.files) >= MAX_FILES:
            raise RequirementsProblem(f"more than {MAX_FILES} files included with -r/-c", path)
        self.files.append((self.named, path, hashlib.sha256(raw).hexdigest()))
        try:
            text = raw.decode("utf-8")
        except UnicodeDecodeError as exc:
            raise RequirementsProblem(
                f"requirements file {path.name!r} is not UTF-8 text (byte {exc.start})", path
            ) from None
        physical = text.splitlines()
        if len(physical) > MAX_LINES:
            raise RequirementsProblem(f"more than {MAX_LINES} lines", path)
        self.stack.append(path)
        try:
            for number, logical in _logical_lines(physical):
                line = _COMMENT.sub("", logical).strip()
                if line:
                    self._line(path, number, line, constraint=constraint)
        finally:
            self.stack.pop()

    def _line(self, path: Path, number: int, line: str, *, constraint: bool) -> None:
        def bad(why: str) -> RequirementsProblem:
            return RequirementsProblem(why, path, number)

        line = self._expand(line, bad)
        if _USERINFO.search(line):
            # Not echoed: the credential may have come from the environment.
            raise bad(
                "a URL with credentials; pip would send them to that host; gpuenv reads an "
                "index's credentials only from $GPUENV_INDEX_* or netrc, for that exact "
                "origin (docs/wheelhouse.md#private-indexes): remove user:password@ from "
                "the URL and give them there"
            )
        if line.startswith("-"):
            self._option(path, number, line, constraint=constraint)
            return
        self._requirement(path, number, line, constraint=constraint, bad=bad)

    def _expand(self, line: str, bad: _Bad) -> str:
        """`line` with the `${VAR}`s the user allows filled in (issue 44, N1). pip fills any
        variable anywhere; gpuenv does not: the file is the project's (in CI, the branch
        under test's), the environment the user's, and `${GPUENV_INDEX_PASSWORD}` in a URL
        would carry the secret to whatever host the line names. A variable is filled only
        when its name is in $GPUENV_ALLOW_ENV, and never into a URL. Messages name the
        variable, never its value."""
        wanted = _ENV_VAR.findall(line)
        if not wanted:
            return line
        allowed = allowed_variables()
        for var in wanted:
            if var not in allowed:
                raise bad(
                    f"${{{var}}}: gpuenv fills no variable of the environment into a "
                    "project's files (the file could send its value to a host it names); "
                    "give a private index's or git host's credentials in netrc or "
                    "$GPUENV_INDEX_* (docs/wheelhouse.md#private-indexes), write the value "
                    f"itself, or, for a value safe to share (a version), list {var} in "
                    f"${ALLOW_ENV}"
                )
        if _in_url(line):
            raise bad(
                f"${{{wanted[0]}}} inside a URL: gpuenv never fills a URL from the "
                "environment (the value would go to that host); write the URL itself, and "
                "give credentials in netrc or $GPUENV_INDEX_* "
                "(docs/wheelhouse.md#private-indexes)"
            )
        for var in wanted:
            if var not in os.environ:
                raise bad(
                    f"${{{var}}} is not set; pip would pass it on literally and fail: set "
                    f"{var} in the environment gpuenv runs in"
                )
            self.environment[var] = env_digest(os.environ[var])
        # A cached reading must not outlive the permission it was read under.
        self.environment[ALLOW_ENV] = env_digest(os.environ.get(ALLOW_ENV))
        return _ENV_VAR.sub(lambda m: os.environ[m.group(1)], line)

    def _option(self, path: Path, number: int, line: str, *, constraint: bool) -> None:
        def bad(why: str) -> RequirementsProblem:
            return RequirementsProblem(why, path, number)

        option, value = _split_option(line)
        if option in _IGNORED:
            return
        if option in _REFUSED:
            raise bad(f"{option}: {_REFUSED[option]}")
        if option not in _TAKES_VALUE:
            raise bad(
                f"{option}: not an option pip reads in a requirements file (pip would stop "
                "with an error too); remove the line"
            )
        if not value:
            raise bad(f"{option} needs a value (pip would stop with an error too)")
        here = Line(path, number, "", option)
        if option in ("-r", "-c"):
            try:
                included, raw = self.open(value, path.parent)
            except RequirementsProblem as exc:
                raise bad(exc.message) from None
            self.parse(included, raw, constraint=constraint or option == "-c")
        elif option == "-i":
            url = _index_url(value, bad)
            if self.index_url and self.index_url[0] != url:
                raise bad(
                    f"--index-url {url} after --index-url {self.index_url[0]} "
                    f"({self.index_url[1].where}); pip would use the last one: keep one"
                )
            self.index_url = (url, here)
        else:
            self.extra_index_urls.append((_index_url(value, bad), here))

    def _requirement(
        self, path: Path, number: int, line: str, *, constraint: bool, bad: _Bad
    ) -> None:
        from packaging.requirements import InvalidRequirement, Requirement
        from packaging.utils import canonicalize_name

        spec, hashes = _split_hashes(line, bad)
        target = spec.split(";")[0].strip()
        local = "://" not in target and "@" not in target
        if spec.startswith((".", "/", "~")) or (
            local and ("/" in target or re.search(r"\.(whl|tar\.gz|tgz|zip|tar\.bz2)$", target))
        ):
            marker = spec.split(";", 1)[1].strip() if ";" in spec else ""
            self._local(path, number, "", "", target, marker, hashes, constraint=constraint,
                        bad=bad)  # fmt: skip
            return
        named_file = _FILE_REFERENCE.match(spec)
        if named_file:
            try:
                req = Requirement(spec)
            except InvalidRequirement as exc:
                reason = str(exc).splitlines()[0] if str(exc) else "invalid"
                raise bad(f"{spec!r} is not a valid pip requirement: {reason}") from None
            extras = f"[{','.join(sorted(req.extras))}]" if req.extras else ""
            self._local(path, number, req.name, extras, _file_url_path(req.url or "", bad),
                        str(req.marker) if req.marker else "", hashes, constraint=constraint,
                        bad=bad)  # fmt: skip
            return
        if re.match(r"[A-Za-z][A-Za-z0-9+.-]*\+|[A-Za-z][A-Za-z0-9+.-]*://", spec):
            raise bad(
                "pip would install from that URL or VCS checkout, guessing the package's "
                "name; gpuenv needs the name: write NAME @ https://HOST/PATH/ARCHIVE (an "
                "sdist or wheel), NAME @ git+https://HOST/REPO.git@REV, or require it by "
                "name and version from an index"
            )
        try:
            req = Requirement(spec)
        except InvalidRequirement as exc:
            reason = str(exc).splitlines()[0] if str(exc) else "invalid"
            raise bad(
                f"{spec!r} is not a valid pip requirement (pip would stop here too): {reason}"
            ) from None
        marker = str(req.marker) if req.marker else ""
        if req.url and req.url.startswith("git+"):
            self._vcs(path, number, req, hashes, constraint=constraint, bad=bad)
            return
        if req.url:
            url, pinned = direct_url(req.name, req.url, bad)
            if marker:  # checked as any line's marker is, below, on the plain name
                _marker_line(path, number, req.name, marker, bad)
            extras = f"[{','.join(sorted(req.extras))}]" if req.extras else ""
            entry = Line(path, number, canonicalize_name(req.name),
                         f"{req.name}{extras} @ {url}", marker, (*hashes, *pinned))  # fmt: skip
            (self.constraints if constraint else self.lines).append(entry)
            return
        if _HOST_MARKERS.search(marker):
            raise bad(
                f"marker {marker!r} names the kernel of the machine pip runs on (pip would "
                "decide it there); an image "
                "runs on many: use sys_platform, platform_machine or python_version"
            )
        req.marker = None
        try:
            plain = pip_requirement(str(req))
        except ValueError as exc:
            raise bad(str(exc)) from None
        entry = Line(path, number, canonicalize_name(req.name), plain, marker, hashes)
        if marker:
            # A marker packaging parses but cannot evaluate (an unknown variable) fails here,
            # at its line, rather than for the first cell.
            try:
                applies(entry, "3.12", "x86_64")
            except RequirementsProblem:
                pass
            except Exception as exc:  # packaging's UndefinedEnvironmentName and kin
                raise bad(f"marker {marker!r} cannot be evaluated: {exc}") from None
        (self.constraints if constraint else self.lines).append(entry)

    def _local(
        self, path: Path, number: int, name: str, extras: str, written: str, marker: str,
        hashes: tuple[str, ...], *, constraint: bool, bad: _Bad,
    ) -> None:  # fmt: skip
        """A local wheel (`./dist/x-1.0-py3-none-any.whl`, `x @ file:...`): inside the
        project directory (the matrix's, relative paths taken from there, as pip takes them
        from the directory it runs in), locked by its sha256, named portably (`x @
        file:REL`, relative to the matrix) in the cell and the lock."""
        from packaging.utils import InvalidWheelFilename, canonicalize_name, parse_wheel_filename

        if written.startswith("~"):
            raise bad(
                f"{written!r}: pip would install it from the home directory; gpuenv builds only "
                "what lies in the project directory: copy it below the matrix's directory"
            )
        resolved = (self.root / written).resolve()
        if not resolved.is_relative_to(self.root):
            raise bad(
                f"{written!r} is outside the project directory {self.root} (symlinks "
                "resolved); pip would install it from there; gpuenv takes only what lies "
                "in the project: copy it below the matrix's directory"
            )
        try:
            st = resolved.stat()
        except OSError:
            raise bad(
                f"{written!r} does not exist (pip would stop here too); local paths are "
                "relative to the matrix's directory"
            ) from None
        if stat.S_ISDIR(st.st_mode):
            self._local_tree(path, number, name, extras, written, resolved, marker, hashes,
                             constraint=constraint, bad=bad)  # fmt: skip
            return
        if not written.endswith(".whl"):
            raise bad(
                f"{written!r}: pip would build that local archive; gpuenv takes local wheels "
                "(.whl) only: build its wheel and name that, or name the archive by an "
                "https URL"
            )
        try:
            got, _, _, _ = parse_wheel_filename(resolved.name)
        except InvalidWheelFilename as exc:
            raise bad(f"{written!r}: not a wheel's file name (pip refuses it): {exc}") from None
        if name and canonicalize_name(name) != canonicalize_name(got):
            raise bad(
                f"{name} @ {written}: that wheel is {got}'s; pip would refuse it too: name "
                f"{got}, or the wheel of {name}"
            )
        relative = resolved.relative_to(self.root).as_posix()
        if not _LOCAL_CHARS.fullmatch(relative):
            raise bad(
                f"{relative!r}: gpuenv takes local paths of letters, digits and ._+-/ only "
                "(they reach the lock as written): rename it"
            )
        try:
            with open_regular(resolved) as f:
                sha = hashlib.file_digest(f, hashlib.sha256).hexdigest()
        except OSError as exc:
            raise bad(f"{written!r} is not a readable regular file: {exc.strerror}") from None
        if hashes and sha not in hashes:
            raise bad(
                f"{written!r} has sha256 {sha}, none of the line's --hash values; pip would "
                "refuse to install it: update the --hash"
            )
        if marker:
            _marker_line(path, number, got, marker, bad)
        self.files.append((os.path.abspath(self.root / written), resolved, sha))
        requirement = f"{name or got}{extras} @ {LOCAL_PREFIX}{relative}"
        entry = Line(path, number, canonicalize_name(got), requirement, marker, (sha,))
        (self.constraints if constraint else self.lines).append(entry)

    def _local_tree(
        self, path: Path, number: int, name: str, extras: str, written: str, resolved: Path,
        marker: str, hashes: tuple[str, ...], *, constraint: bool, bad: _Bad,
        itself: tuple[str, ...] | None = None,
    ) -> None:  # fmt: skip
        """A local project directory (`./mypkg`, `mypkg @ file:mypkg`): named by its
        pyproject.toml (or the line), locked by its content digest (gpuenv/matrix/
        localtree.py), built into a wheel in the sdist sandbox like any sdist. `itself`:
        the project's own directory (packages.pyproject's install_project), tarred without
        those files."""
        from packaging.utils import canonicalize_name

        from gpuenv.matrix import localtree

        exclude = itself if itself is not None and resolved == self.root else ()
        if resolved == self.root and itself is None:
            raise bad(
                f"{written!r} is the project itself (the matrix's directory); pip would build "
                "and install it: ask for that with packages: {pyproject: pyproject.toml, "
                "install_project: true}, not a requirements line"
            )
        if hashes:
            raise bad(
                f"{written!r} is a directory; pip cannot check a directory's hash and refuses "
                "--hash for it: remove the --hash (gpuenv locks the directory's content)"
            )
        declared = _declared_name(resolved, written, bad)
        if not declared and not name:
            raise bad(
                f"{written!r}: its name is not in a pyproject.toml [project] table; pip would "
                "run its setup.py to learn it, gpuenv runs nothing here: write NAME @ "
                f"file:{written}"
            )
        if name and declared and canonicalize_name(name) != canonicalize_name(declared):
            raise bad(
                f"{name} @ {written}: that directory's project is {declared}; pip would "
                f"refuse it too: name {declared}"
            )
        relative = resolved.relative_to(self.root).as_posix()
        if not _LOCAL_CHARS.fullmatch(relative) and relative != ".":
            raise bad(
                f"{relative!r}: gpuenv takes local paths of letters, digits and ._+-/ only "
                "(they reach the lock as written): rename it"
            )
        try:
            digest = localtree.content_digest(resolved, self.root, exclude)
        except localtree.TreeProblem as exc:
            raise bad(f"{written}: {exc}") from None
        if marker:
            _marker_line(path, number, name or declared, marker, bad)
        self.files.append((os.path.abspath(self.root / written), resolved, digest))
        requirement = f"{name or declared}{extras} @ {LOCAL_PREFIX}{relative}"
        entry = Line(path, number, canonicalize_name(name or declared), requirement, marker,
                     (digest,))  # fmt: skip
        (self.constraints if constraint else self.lines).append(entry)

    def _vcs(
        self, path: Path, number: int, req: Any, hashes: tuple[str, ...], *,
        constraint: bool, bad: _Bad,
    ) -> None:  # fmt: skip
        """A VCS reference (`name @ git+https://HOST/REPO.git@REV`): the commit's tree,
        exported by gpuenv/matrix/vcs.py, is a local directory for the rest; the line
        reaching the cell names the full commit, its hash is the tree's content digest."""
        from packaging.utils import canonicalize_name

        from gpuenv.matrix import localtree, vcs

        if hashes:
            raise bad(
                f"{req.name} @ {req.url[:80]}: pip cannot check a checkout's hash and refuses "
                "--hash for it: remove the --hash (gpuenv locks the commit and its tree)"
            )
        try:
            ref = vcs.parse(req.url)
            commit, tree = vcs.export(ref, reading=not vcs.may_fetch())
        except vcs.NotFetched as exc:
            if vcs.skips_unfetched():
                return
            raise bad(f"{req.name} @ {exc}") from None
        except vcs.VcsProblem as exc:
            raise bad(f"{req.name} @ {exc}") from None
        pinned = ref.at(commit)
        declared = _declared_name(tree, pinned, bad)
        if declared and canonicalize_name(req.name) != canonicalize_name(declared):
            raise bad(
                f"{req.name} @ {pinned}: that repository's project is {declared}; pip would "
                f"refuse it too: name {declared}"
            )
        try:
            digest = localtree.content_digest(tree, tree)
        except localtree.TreeProblem as exc:
            raise bad(f"{pinned}: {exc}") from None
        marker = str(req.marker) if req.marker else ""
        if marker:
            _marker_line(path, number, req.name, marker, bad)
        if ref.rev != commit:
            # A branch or tag may move: the cached reading of the matrix (gpuenv/project/
            # snapshot.py) must never hold for it, as for a local directory (no file's
            # state is ever "rev:…"). A full commit names one tree for good.
            self.moving.append((str(tree), tree, f"rev:{ref.rev}"))
        extras = f"[{','.join(sorted(req.extras))}]" if req.extras else ""
        entry = Line(path, number, canonicalize_name(req.name),
                     f"{req.name}{extras} @ {pinned}", marker, (digest,))  # fmt: skip
        (self.constraints if constraint else self.lines).append(entry)


def _declared_name(tree: Path, written: str, bad: _Bad) -> str:
    """The project name a directory's pyproject.toml declares ("" when it declares none:
    a setup.py project, or a dynamic name)."""
    pyproject = tree / "pyproject.toml"
    if pyproject.is_file():
        try:
            raw = read_regular(pyproject, MAX_BYTES)
            doc = pyproject_document(raw, f"{written}/pyproject.toml", pyproject)
        except OSError as exc:
            raise bad(f"{written}/pyproject.toml cannot be read: {exc}") from None
        except RequirementsProblem as exc:
            raise bad(exc.message) from None
        project = doc.get("project")
        if isinstance(project, dict) and isinstance(project.get("name"), str):
            return str(project["name"])
        return ""
    if not (tree / "setup.py").is_file():
        raise bad(
            f"{written!r} has neither pyproject.toml nor setup.py; pip would stop too "
            "(not a Python project): name the project's directory"
        )
    return ""


# A local file in a cell's requirements and its lock: `name @ file:PATH`, PATH relative to
# the matrix's directory (portable: no path of this machine). uv is given the absolute URL
# (`absolute_local`) and its answer made relative again (`portable_local`).
LOCAL_PREFIX = "file:"
_LOCAL_CHARS = re.compile(r"[A-Za-z0-9_][A-Za-z0-9._+\-/]*")
_FILE_REFERENCE = re.compile(r"\s*[A-Za-z0-9][A-Za-z0-9._-]*\s*(\[[^\]]*\])?\s*@\s*file:")


def _file_url_path(url: str, bad: _Bad) -> str:
    """The path a `file:` URL names: `file:///abs`, `file://localhost/abs`, `file:rel`."""
    from urllib.parse import unquote, urlsplit

    parts = urlsplit(url)
    if parts.netloc not in ("", "localhost") or parts.query or parts.fragment:
        raise bad(
            f"{url[:80]}: pip would read that file URL; gpuenv takes file:PATH (relative to "
            "the matrix) or file:///PATH inside the project, with no host, query or fragment"
        )
    return unquote(parts.path)


def absolute_local(requirement: str, root: Path) -> str:
    """A cell's `name @ file:REL` as uv reads it (an absolute file URL)."""
    name, sep, url = requirement.partition(f" @ {LOCAL_PREFIX}")
    if not sep or url.startswith("/"):
        return requirement
    return f"{name} @ {(root / url).as_uri()}"


def portable_local(text: str, root: Path) -> str:
    """uv's resolution with the project's file URLs made relative again (the project's
    own directory: `file:.`)."""
    text = text.replace(f"@ {root.as_uri()}/", f"@ {LOCAL_PREFIX}")
    return re.sub(rf"@ {re.escape(root.as_uri())}(?=[\s;]|$)", f"@ {LOCAL_PREFIX}.", text,
                  flags=re.MULTILINE)  # fmt: skip


_URL_CHARS = re.compile(r"[A-Za-z0-9._~:/?#\[\]@!&()*+,;=%-]+")
_ARCHIVES = (".whl", ".tar.gz", ".zip")
_LOOPBACK = ("127.0.0.1", "localhost", "::1")


def direct_url(name: str, url: str, bad: _Bad) -> tuple[str, tuple[str, ...]]:
    """A direct reference gpuenv fetches and (an sdist) builds: an https URL of an archive,
    a `#sha256=` fragment at most (pip checks it; so does gpuenv). (The URL without its
    fragment, the sha256 it named.) Each refusal says what pip would have done."""
    from urllib.parse import urlsplit

    if url.startswith(("hg+", "svn+", "bzr+")):
        raise bad(
            f"{name} @ {url.split('+', 1)[0]}+...: pip would check out that repository and "
            "build it here; gpuenv checks out git repositories only (git+https://…@REV): "
            "name a commit's archive (NAME @ https://HOST/…/COMMIT.tar.gz), or publish the "
            "package to an index"
        )
    parts = urlsplit(url)
    if parts.scheme == "file" or not parts.scheme:
        raise bad(
            f"{name} @ {url[:80]}: pip would refuse that (a direct reference is a URL): "
            f"write {name} @ file:PATH (relative to the matrix) or the bare path"
        )
    loopback = parts.scheme == "http" and parts.hostname in _LOOPBACK
    if parts.scheme != "https" and not loopback:
        raise bad(
            f"{name} @ {url[:80]}: pip would fetch it over {parts.scheme}; gpuenv fetches "
            "direct references over https only (plain http on loopback): use https"
        )
    if not _URL_CHARS.fullmatch(url) or parts.username or parts.password:
        raise bad(f"{name} @ ...: not a URL gpuenv takes (quotes, spaces or credentials)")
    if not parts.path.endswith(_ARCHIVES):
        raise bad(
            f"{name} @ {url[:80]}: pip would fetch that page and guess; gpuenv takes the URL "
            "of an archive: a wheel (.whl) or a source distribution (.tar.gz, .zip)"
        )
    pinned: tuple[str, ...] = ()
    if parts.fragment:
        match = re.fullmatch(r"sha256=([0-9a-fA-F]{64})", parts.fragment)
        if not match:
            raise bad(
                f"{name} @ ...#{parts.fragment[:40]}: pip would read that fragment "
                "(egg=, subdirectory=, another hash); gpuenv takes #sha256=<64 hex digits> "
                "only: remove it, or build the subdirectory into its own archive"
            )
        pinned = (match.group(1).lower(),)
    return parts._replace(fragment="").geturl(), pinned


def _marker_line(path: Path, number: int, name: str, marker: str, bad: _Bad) -> None:
    if _HOST_MARKERS.search(marker):
        raise bad(
            f"marker {marker!r} names the kernel of the machine pip runs on (pip would "
            "decide it there); an image runs on many: use sys_platform, platform_machine "
            "or python_version"
        )
    try:
        applies(Line(path, number, name, name, marker), "3.12", "x86_64")
    except RequirementsProblem:
        pass
    except Exception as exc:  # packaging's UndefinedEnvironmentName and kin
        raise bad(f"marker {marker!r} cannot be evaluated: {exc}") from None


def _logical_lines(physical: list[str]) -> list[tuple[int, str]]:
    """pip's join_lines: a line ending in a backslash continues on the next one (unless it
    is a comment), numbered by its first physical line."""
    out: list[tuple[int, str]] = []
    pending: list[str] = []
    first = 0
    for number, line in enumerate(physical, start=1):
        if not line.endswith("\\") or _COMMENT.match(line):
            if _COMMENT.match(line):
                line = " " + line
            if pending:
                out.append((first, "".join([*pending, line])))
                pending = []
            else:
                out.append((number, line))
        else:
            if not pending:
                first = number
            pending.append(line.rstrip("\\"))
    if pending:
        out.append((first, "".join(pending)))
    return out


def _split_option(line: str) -> tuple[str, str]:
    """`-r file`, `-rfile`, `--requirement=file`, `--requirement file` -> ("-r", "file")."""
    if line.startswith("--"):
        name, sep, value = line.partition("=")
        if not sep:
            name, _, value = line.partition(" ")
        name = name.strip()
    else:
        name, value = line[:2], line[2:]
    name = _SPELLINGS.get(name, name)
    return name, value.strip()


def _split_hashes(line: str, bad: _Bad) -> tuple[str, tuple[str, ...]]:
    """The requirement and its --hash values; any other per-requirement option is refused."""
    tokens = re.split(r"\s+(?=--?[A-Za-z])", line)
    spec, options = tokens[0].strip(), tokens[1:]
    hashes: list[str] = []
    for option in options:
        name, value = _split_option(option.strip())
        if name not in ("--hash", "--config-settings", "--global-option", "--install-option"):
            raise bad(f"{name[:40]}: not an option pip takes on a requirement's line; remove it")
        if name != "--hash":
            raise bad(
                f"{name}: pip would pass it to the package's build; gpuenv installs "
                "wheels and passes no build options: remove it"
            )
        match = _HASH.fullmatch(value)
        if not match:
            raise bad(f"--hash {value[:80]!r}: expected sha256:<64 hex digits>")
        hashes.append(match.group(1).lower())
    return spec, tuple(hashes)


def _index_url(value: str, bad: _Bad) -> str:
    from gpuenv.matrix.index_url import check_index_url

    try:
        return check_index_url(value)
    except ValueError as exc:
        raise bad(str(exc)) from None
