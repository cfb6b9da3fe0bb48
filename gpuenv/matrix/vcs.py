"""VCS direct references in requirements files (`name @ git+https://HOST/REPO.git@REV`).

The repository is fetched on the client with the user's own `git` (gpuenv hands it no
credentials and lets it prompt for none: GIT_TERMINAL_PROMPT=0; a credential helper of
the user's own configuration still answers), REV resolved to its commit, and that
commit's tree exported into gpuenv's cache, keyed by URL and commit. From there it is a
local project directory like any other (gpuenv/matrix/localtree.py): locked by its
content digest, its metadata read statically or built first, built in the sdist sandbox.
A cell and its lock name the full commit (`git+URL@<40 hex>`), whatever REV named, so the
lock is reproducible; a branch is resolved again each time the requirements are read.

The tree is `git archive`'s, with the repository's own export-ignore and export-subst
attributes overridden (what pip checks out is the commit's files, unsubstituted).

Reading a project fetches nothing from the hosts it names (issue 44, N1): `gpuenv
matrix`, `init`, `lock --check` and `build --dry-run` take a reference from what an earlier
fetch left in the cache, or say that `gpuenv lock` fetches it. Only the steps that fetch
sources open the project inside `fetching()` (`gpuenv lock` and `gpuenv build`), and the
build's fetcher (gpuenv/store/fetch.py) exports the lock's commits. (The smallest change
that keeps reading pure; a content-provider step above the matrix reader is the fuller
shape, docs/architecture.md.)
"""

from __future__ import annotations

import contextlib
import hashlib
import io
import os
import re
import shutil
import subprocess
import tarfile
import tempfile
from collections.abc import Iterator
from contextvars import ContextVar
from dataclasses import dataclass
from pathlib import Path

PREFIX = "git+"
_COMMIT = re.compile(r"[0-9a-f]{40}")
# A branch, tag or commit: nothing git could read as an option or a range.
_REV = re.compile(r"[A-Za-z0-9_][A-Za-z0-9._/+-]*")
_URL = re.compile(r"[A-Za-z0-9._~:/%+@-]+")
_LOOPBACK = ("127.0.0.1", "localhost", "::1")
TIMEOUT = 300
# How reading a project takes a git reference: "read" (from the cache; one not fetched is
# an error saying what fetches it), "fetch" or "skip" (one not fetched is left out).
_MODE: ContextVar[str] = ContextVar("gpuenv_vcs_mode", default="read")


@contextlib.contextmanager
def _mode(mode: str) -> Iterator[None]:
    token = _MODE.set(mode)
    try:
        yield
    finally:
        _MODE.reset(token)


def fetching() -> contextlib.AbstractContextManager[None]:
    """Within: reading a project may fetch the git references it names (the sources step
    of `gpuenv lock` and `gpuenv build`); outside, reading fetches nothing."""
    return _mode("fetch")


def skipping() -> contextlib.AbstractContextManager[None]:
    """Within: a reference no fetch has left is left out of what is read, not an error
    (`gpuenv init`: the matrix it writes names the requirements file, not its lines, and
    `gpuenv lock`, which fetches, needs that matrix first)."""
    return _mode("skip")


def may_fetch() -> bool:
    return _MODE.get() == "fetch"


def skips_unfetched() -> bool:
    return _MODE.get() == "skip"


class VcsProblem(Exception):
    """Why a VCS reference cannot be taken (said after `name @ ` at its line)."""


class NotFetched(VcsProblem):
    """A reference read outside `fetching()` that no fetch has left in the cache."""


@dataclass(frozen=True)
class Reference:
    repository: str  # the URL git fetches (no `git+`, no `@REV`)
    rev: str

    @property
    def name(self) -> str:
        """The exported tree's directory (its tar's top directory): the repository's."""
        last = self.repository.rstrip("/").rsplit("/", 1)[-1].removesuffix(".git")
        return last if re.fullmatch(r"[A-Za-z0-9_][A-Za-z0-9._-]*", last) else "repository"

    def at(self, commit: str) -> str:
        return f"{PREFIX}{self.repository}@{commit}"


def parse(url: str) -> Reference:
    """A `git+URL@REV` direct reference, checked; VcsProblem says what pip would have done
    and what to write instead."""
    from urllib.parse import urlsplit

    shown = url[:100]
    if not url.startswith(PREFIX):
        scheme = url.split("+", 1)[0]
        raise VcsProblem(
            f"{shown}: pip would check that {scheme} repository out; gpuenv takes git "
            "repositories only: name a commit's archive (https://…/COMMIT.tar.gz)"
        )
    parts = urlsplit(url.removeprefix(PREFIX))
    if parts.scheme == "ssh" or (not parts.scheme and ":" in url):
        raise VcsProblem(
            f"{shown}: pip would run ssh with this machine's keys, agent and known_hosts, "
            "which a lock someone else rebuilds from cannot rely on (and a host-key prompt "
            "would wait with no terminal); gpuenv fetches repositories over https: write "
            "git+https://HOST/REPO.git@REV"
        )
    loopback = parts.scheme == "http" and parts.hostname in _LOOPBACK
    if parts.scheme != "https" and not loopback:
        raise VcsProblem(
            f"{shown}: pip would fetch it over {parts.scheme or 'that path'}, where anyone on "
            "the way can change the code; gpuenv fetches repositories over https only (plain "
            "http on loopback): write git+https://HOST/REPO.git@REV"
        )
    if parts.fragment:
        raise VcsProblem(
            f"{shown}: pip would read #{parts.fragment[:40]} (egg= names the package, which "
            "the name before @ already does; subdirectory= builds a subdirectory, which "
            "gpuenv does not yet): remove the fragment, or copy the subdirectory into the "
            "project and name it as ./PATH"
        )
    if parts.username or parts.password or parts.query or not _URL.fullmatch(url):
        raise VcsProblem(f"{shown}: not a URL gpuenv takes (credentials, a query or quotes)")
    path, at, rev = parts.path.rpartition("@")
    if not at or not rev or "/" not in path:
        raise VcsProblem(
            f"{shown}: no revision; pip would check out the default branch as it is today, "
            "a different commit tomorrow; gpuenv needs one: write git+URL@COMMIT (or @TAG or "
            "@BRANCH: the lock records the commit it names when read)"
        )
    if not _REV.fullmatch(rev) or ".." in rev:
        raise VcsProblem(f"{shown}: {rev[:40]!r} is not a branch, tag or commit name")
    return Reference(parts._replace(path=path).geturl(), rev)


def cache_root() -> Path:
    """<cache>/vcs (gpuenv/store/cache.py's directory: this layer cannot import it)."""
    root = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(root) / "gpuenv" / "vcs"


def _place(ref: Reference) -> Path:
    return cache_root() / hashlib.sha256(ref.repository.encode()).hexdigest()[:32]


def tree(ref: Reference, commit: str) -> Path:
    """Where the commit's tree is (or would be) exported."""
    return _place(ref) / commit / ref.name


def export(ref: Reference, *, offline: bool = False, reading: bool = False) -> tuple[str, Path]:
    """(The commit REV names, the directory its tree is exported to.) A full commit
    exported before needs no git and no network. `reading`: a project is being read,
    outside `fetching()`: nothing is fetched (a branch is the commit last fetched)."""
    if _COMMIT.fullmatch(ref.rev) and tree(ref, ref.rev).is_dir():
        return ref.rev, tree(ref, ref.rev)
    unfetched = NotFetched(
        f"{ref.at(ref.rev)}: not fetched yet, and reading a project fetches nothing from the "
        "hosts it names: `gpuenv lock` (or `gpuenv build`) fetches it, then this reads it "
        "from gpuenv's cache"
    )
    place = _place(ref)
    repo = place / "repo.git"
    if reading and not repo.is_dir():
        raise unfetched
    if shutil.which("git") is None:
        raise VcsProblem(f"{ref.at(ref.rev)}: git is not installed here; install it")
    if not repo.is_dir():
        place.mkdir(parents=True, exist_ok=True, mode=0o700)
        _git(ref, "init", "--quiet", "--bare", str(repo))
        # What pip checks out: every file of the commit, unsubstituted (this file outranks
        # the repository's own .gitattributes).
        (repo / "info").mkdir(exist_ok=True)
        (repo / "info" / "attributes").write_text("* -export-ignore -export-subst\n")
    # A branch or tag is fetched again, except when reading: then it names the commit the
    # last fetch left (`gpuenv lock` moves it on).
    commit = _commit(repo, ref.rev) if _COMMIT.fullmatch(ref.rev) or reading else ""
    if not commit:
        if reading:
            raise unfetched
        if offline:
            raise VcsProblem(f"{ref.at(ref.rev)}: --offline, and not fetched before")
        _git(ref, "-C", str(repo), "fetch", "--quiet", "--no-tags", "--", ref.repository,
             "+refs/heads/*:refs/heads/*", "+refs/tags/*:refs/tags/*")  # fmt: skip
        commit = _commit(repo, ref.rev)
    if not commit:
        raise VcsProblem(
            f"{ref.at(ref.rev)}: {ref.rev!r} is no branch, tag or commit of that repository "
            "(pip would stop too): name one it has"
        )
    out = tree(ref, commit)
    if not out.is_dir():
        archive = _git(ref, "-C", str(repo), "archive", "--format=tar", commit)
        staging = Path(tempfile.mkdtemp(dir=place, prefix=".export-"))
        try:
            with tarfile.open(fileobj=io.BytesIO(archive)) as tar:
                extract(tar, staging / ref.name)
            out.parent.mkdir(exist_ok=True, mode=0o700)
            try:
                (staging / ref.name).rename(out)
            except OSError:
                if not out.is_dir():  # not another gpuenv's export of the same commit
                    raise
        except (tarfile.TarError, OSError) as exc:
            raise VcsProblem(f"{ref.at(commit)}: its tree cannot be exported: {exc}") from None
        finally:
            shutil.rmtree(staging, ignore_errors=True)
    return commit, out


def extract(tar: tarfile.TarFile, dest: Path) -> None:
    """Unpack an untrusted tar into `dest` (new): directories, regular files (mode 0644, or
    0755 with the owner's execute bit) and symlinks that stay inside `dest`, nothing else;
    tarfile.TarError names the first member refused. What `filter="data"` does, written
    out because that argument arrived in Python 3.11.4 and 3.12.0, and Debian bookworm's
    own Python is 3.11.2 (issue 44, item 5): one code path on every Python gpuenv accepts."""
    dest.mkdir()
    top = dest.resolve()
    for member in tar:
        name = member.name.removeprefix("./")
        parts = name.split("/")
        if name.startswith("/") or ".." in parts or "\0" in name or not name.strip("/"):
            raise tarfile.TarError(f"member {member.name[:200]!r} leaves the directory")
        target = dest.joinpath(*[p for p in parts if p not in ("", ".")])
        parent = target.parent.resolve()
        if not parent.is_relative_to(top):  # through a symlink unpacked before
            raise tarfile.TarError(f"member {name[:200]!r} leads out through a symlink")
        if member.isdir():
            target.mkdir(mode=0o755, parents=True, exist_ok=True)
            continue
        target.parent.mkdir(mode=0o755, parents=True, exist_ok=True)
        if member.isreg():
            source = tar.extractfile(member)
            assert source is not None  # a regular member always has a body
            mode = 0o755 if member.mode & 0o100 else 0o644
            flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_NOFOLLOW", 0)
            with source, os.fdopen(os.open(target, flags, mode), "wb") as out:
                shutil.copyfileobj(source, out)
            os.chmod(target, mode)  # the umask had its say on open's mode
        elif member.issym():
            lands = os.path.realpath(os.path.join(parent, member.linkname))
            if os.path.isabs(member.linkname) or not Path(lands).is_relative_to(top):
                raise tarfile.TarError(f"symlink {name[:200]!r} leads out of the directory")
            os.symlink(member.linkname, target)
        else:  # hard links, devices, FIFOs: no commit's tree holds one
            raise tarfile.TarError(f"member {name[:200]!r} is not a file, directory or symlink")


def _commit(repo: Path, rev: str) -> str:
    proc = subprocess.run(
        ["git", "-C", str(repo), "rev-parse", "--verify", "--quiet", f"{rev}^{{commit}}"],
        capture_output=True, text=True, check=False, env=_environment(),
    )  # fmt: skip
    return proc.stdout.strip() if proc.returncode == 0 else ""


def _environment(ref: Reference | None = None) -> dict[str, str]:
    plain = ref is not None and ref.repository.startswith("http:")  # loopback (parse)
    return {
        **os.environ,
        "GIT_TERMINAL_PROMPT": "0",  # no prompt for a password gpuenv would then hold
        # No redirect to plain http, ssh, file or ext transports.
        "GIT_ALLOW_PROTOCOL": "http:https" if plain else "https",
        "GIT_ASKPASS": "",
        "SSH_ASKPASS": "",
    }


def _git(ref: Reference, *args: str) -> bytes:
    command = args[2] if args[0] == "-C" else args[0]
    try:
        proc = subprocess.run(["git", *args], capture_output=True, check=False,
                              env=_environment(ref), timeout=TIMEOUT)  # fmt: skip
    except subprocess.TimeoutExpired:
        raise VcsProblem(f"{ref.at(ref.rev)}: git {command} took over {TIMEOUT} s") from None
    if proc.returncode != 0:
        said = proc.stderr.decode(errors="replace").strip().splitlines()
        why = said[-1][:200] if said else f"exit {proc.returncode}"
        raise VcsProblem(f"{ref.at(ref.rev)}: git {command} failed: {why}")
    return proc.stdout
