"""What of a user's tree may leave this machine: one policy for every walker of it, the
working directory's sync to a remote engine (run/workdir.py, run/sync.py), the Kubernetes
code layer (run/kube/layer.py) and a local package directory's tar (matrix/localtree.py,
kept in the wheelhouse and sent to the engine's build sandbox).

A path is kept back, first to last:

1. caches and version control (CACHES) and well-known secret files (SECRETS), at any
   depth, with what the tree's `.gpuenvignore` adds to that deny-list (the same form: a
   name or glob matched at any depth, `a/b` as consecutive components anywhere, `/a` from
   the root only). Nothing re-includes them;
2. what the tree's `.dockerignore` lists, read as Docker reads it (moby/patternmatcher:
   patterns from the root, `*` and `?` within a component, `**` across them, so `**/*.pem`
   is a top-level `key.pem` too; a directory's pattern holds what is under it; the last
   matching line decides, and `!` re-includes).

Names are compared folded always (fold(): Unicode's canonical caseless form, as macOS,
Windows and WSL's /mnt/c take names), whatever the client's filesystem: `.ENV` and `.Git`
are `.env` and `.git`, and `.dockerignore`'s `Data` holds `data` too. Folding only ever
keeps more back, except that a `!` line re-includes folded as well (never a secret).

Pure logic: it reads the two files and walks a directory, and says why each path stays.
"""

from __future__ import annotations

import fnmatch
import os
import posixpath
import re
import unicodedata
from dataclasses import dataclass, field
from pathlib import Path

from gpuenv.matrix.errors import GpuenvError

MAX_FILES = 20_000  # what one tree may send, files ...
MAX_BYTES = 256 << 20  # ... and the files' sizes together

CACHES = (
    ".git", ".hg", ".svn", ".bzr", "__pycache__", "*.pyc", ".venv", "venv", ".mypy_cache",
    ".pytest_cache", ".ruff_cache", ".tox", ".nox", ".ipynb_checkpoints", "node_modules",
    ".DS_Store",
)  # fmt: skip
SECRETS = (
    ".env", ".env.*", "*.env", ".netrc", "_netrc", ".pypirc", ".npmrc", ".git-credentials",
    ".pgpass", ".vault-token", ".dockercfg", ".docker", "kubeconfig", "*.kubeconfig", ".kube",
    ".aws", ".azure", ".config/gcloud", ".ssh", ".gnupg", "id_rsa*", "id_dsa*", "id_ecdsa*",
    "id_ed25519*", "*.pem", "*.key", "*.p12", "*.pfx", "service-account*.json",
    "credentials.json", "*.tfstate", "*.tfstate.*", ".htpasswd", ".boto", ".s3cfg",
)  # fmt: skip
USER_FILE = ".gpuenvignore"
DOCKER_FILE = ".dockerignore"

# Code points HFS+ leaves out of a name (git's is_hfs_dotgit list): `.g\u200cit` is `.git`
# there. And the 8.3 short name Windows gives `.git` (git's is_ntfs_dotgit).
_IGNORABLE = dict.fromkeys([0x200C, 0x200D, 0x200E, 0x200F, *range(0x202A, 0x202F),
                            *range(0x206A, 0x2070), 0xFEFF])  # fmt: skip
_SHORT_NAMES = {"git~1": ".git"}


def fold(rel: str) -> str:
    """One spelling for every way a case-insensitive filesystem (macOS, Windows, WSL's
    /mnt/c) may take as the same path: Unicode's canonical caseless form (NFD, case-folded,
    NFD again, so NFC and NFD spellings agree and KELVIN SIGN is k), without the code points
    HFS+ ignores, each component without the trailing dots and spaces Windows drops."""
    text = unicodedata.normalize("NFD", unicodedata.normalize("NFD", rel).casefold())
    parts = (p.rstrip(". ") or p for p in text.translate(_IGNORABLE).split("/"))
    return "/".join(_SHORT_NAMES.get(p, p) for p in parts)


@dataclass(frozen=True)
class _Denied:
    """A deny-list pattern: its components, matched as a run anywhere in a path (or from
    the root only, `anchored`)."""

    text: str
    why: str
    parts: tuple[str, ...]
    anchored: bool = False

    def matches(self, parts: list[str]) -> bool:
        n = len(self.parts)
        starts = [0] if self.anchored else range(len(parts) - n + 1)
        return any(
            all(fnmatch.fnmatchcase(parts[i + j], q) for j, q in enumerate(self.parts))
            for i in starts
        )


def _denied(text: str, why: str) -> _Denied:
    anchored = text.startswith("/")
    parts = tuple(p for p in fold(text.strip("/")).split("/") if p)
    return _Denied(text, why, parts, anchored)


@dataclass(frozen=True)
class _Docker:
    """A `.dockerignore` line as moby/patternmatcher compiles it: an exact path, a prefix
    (`dir/**`), a suffix (`**/name`) or a regular expression."""

    text: str
    why: str
    exclusion: bool  # a `!` line
    kind: str
    cleaned: str
    regex: re.Pattern[str] | None

    def matches(self, path: str) -> bool:
        if self.kind == "exact":
            return path == self.cleaned
        if self.kind == "prefix":
            return path.startswith(self.cleaned[:-2])
        if self.kind == "suffix":
            suffix = self.cleaned[2:]
            return path.endswith(suffix) or (suffix[:1] == "/" and path == suffix[1:])
        assert self.regex is not None
        return self.regex.match(path) is not None


def _docker(text: str, why: str) -> _Docker:
    """Compile one pattern as Docker does (ignorefile.ReadAll, then Pattern.compile)."""
    exclusion = text.startswith("!")
    p = text[1:].strip() if exclusion else text
    if not p:
        raise GpuenvError(f"{why}: '!' names nothing; write the path to include again after it")
    p = posixpath.normpath(re.sub("/+", "/", p))
    if len(p) > 1 and p.startswith("/"):
        p = p[1:]
    p = fold(p)
    regex, kind, i = "^", "exact", 0
    while i < len(p):
        ch = p[i]
        first = i == 0
        i += 1
        if ch == "*" and p[i : i + 1] == "*":
            i += 1
            if p[i : i + 1] == "/":
                i += 1
            if i >= len(p):
                if kind == "exact":
                    kind = "prefix"
                else:
                    regex, kind = regex + ".*", "regexp"
            else:
                regex, kind = regex + "(.*/)?", "regexp"
            if first:
                kind = "suffix"
        elif ch == "*":
            regex, kind = regex + "[^/]*", "regexp"
        elif ch == "?":
            regex, kind = regex + "[^/]", "regexp"
        elif ch == "\\" and i < len(p):
            regex, kind = regex + re.escape(p[i]), "regexp"
            i += 1
        elif ch in "[]":
            regex, kind = regex + ch, "regexp"
        else:
            regex += re.escape(ch)
    compiled = None
    if kind == "regexp":
        try:
            compiled = re.compile(regex + r"\Z")
        except re.error:
            raise GpuenvError(
                f"{why}: {text!r} is not a valid pattern (an unclosed '['?); fix or remove it"
            ) from None
    return _Docker(text, why, exclusion, kind, p, compiled)


def _lines(path: Path) -> list[tuple[int, str]]:
    """The file's patterns with their line numbers: comments (`#` first) and blank lines
    dropped, the rest stripped, as Docker reads `.dockerignore`."""
    if not path.is_file():
        return []
    text = path.read_text("utf-8", errors="replace").removeprefix("\ufeff")
    return [
        (n, raw.strip())
        for n, raw in enumerate(text.splitlines(), 1)
        if raw.strip() and not raw.startswith("#")
    ]


@dataclass(frozen=True)
class Policy:
    """The rules for one tree: the deny-list (built in, and the tree's `.gpuenvignore`)
    and the tree's `.dockerignore`."""

    denied: tuple[_Denied, ...] = ()
    docker: tuple[_Docker, ...] = ()
    # The deny-list's one-component patterns as one expression, tried on each component
    # (a walk asks for every path; the pattern that matched is looked for only on a hit).
    _names: re.Pattern[str] = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        single = [fnmatch.translate(d.parts[0]) for d in self.denied
                  if len(d.parts) == 1 and not d.anchored]  # fmt: skip
        object.__setattr__(self, "_names", re.compile("|".join(single) or "(?!)"))

    @classmethod
    def built_in(cls) -> Policy:
        return cls(
            tuple(_denied(p, f"cache or version control ({p}, built in)") for p in CACHES)
            + tuple(_denied(p, f"secret ({p}, built in)") for p in SECRETS)
        )

    @classmethod
    def of(cls, root: Path) -> Policy:
        """The policy `root`'s own files make; GpuenvError (125) naming a bad line."""
        base = cls.built_in()
        user = []
        for n, text in _lines(root / USER_FILE):
            where = f"{root / USER_FILE}:{n}"
            if text.startswith("!"):
                raise GpuenvError(
                    f"{where}: {USER_FILE} only adds to what stays here; nothing re-includes "
                    "a secret (remove the '!' line)",
                    exit_code=125,
                )
            user.append(_denied(text, f"{USER_FILE}:{n} ({text})"))
        docker = []
        for n, text in _lines(root / DOCKER_FILE):
            try:
                docker.append(_docker(text, f"{DOCKER_FILE}:{n} ({text})"))
            except GpuenvError as exc:
                raise GpuenvError(f"{root}/{exc.message}", exit_code=125) from None
        return cls(base.denied + tuple(user), tuple(docker))

    def deny(self, rel: str) -> str | None:
        """Why the deny-list keeps `rel` (or a directory above it) here, or None."""
        parts = fold(rel).split("/")
        named = any(self._names.match(p) for p in parts)
        return next((d.why for d in self.denied
                     if (named or len(d.parts) > 1 or d.anchored) and d.matches(parts)),
                    None)  # fmt: skip

    def dockerignored(self, rel: str) -> str | None:
        """Why `.dockerignore` leaves `rel` out (its last deciding line), or None:
        PatternMatcher.MatchesOrParentMatches."""
        path = fold(rel)
        parents = path.split("/")[:-1]
        why = None
        for pattern in self.docker:
            if pattern.exclusion != (why is not None):
                continue
            hit = pattern.matches(path) or any(
                pattern.matches("/".join(parents[: i + 1])) for i in range(len(parents))
            )
            if hit:
                why = None if pattern.exclusion else pattern.why
        return why

    def why(self, rel: str) -> str | None:
        """Why `rel` stays on this machine, or None: it may leave."""
        return self.deny(rel) or self.dockerignored(rel)

    def reincludes(self) -> bool:
        return any(p.exclusion for p in self.docker)


@dataclass(frozen=True)
class Kept:
    path: str  # relative, POSIX; a directory stands for all it holds
    why: str


@dataclass
class Walk:
    """What of a tree may leave (relative POSIX paths, directories and symlinks too,
    sorted) and what stays, with why."""

    sent: list[str] = field(default_factory=list)
    kept: list[Kept] = field(default_factory=list)


def walk(root: Path, policy: Policy | None = None) -> Walk:
    """Walk `root` (never into a symlinked directory) under `policy` (by default the one
    its own files make). A directory the deny-list holds is not entered; one `.dockerignore`
    leaves out is entered only when a `!` line may take something in it back, and is then
    sent as the parent of what comes back."""
    policy = policy or Policy.of(root)
    out = Walk()
    dropped: dict[str, str] = {}  # directories `.dockerignore` left out, but entered
    for here, dirs, files in os.walk(root):
        rel_dir = Path(here).relative_to(root).as_posix()
        prefix = "" if rel_dir == "." else f"{rel_dir}/"
        keep = []
        for name in sorted(dirs):
            rel = prefix + name
            why = policy.why(rel)
            if why is None:
                keep.append(name)
                out.sent.append(rel)
            elif policy.deny(rel) is None and policy.reincludes():
                keep.append(name)
                dropped[rel] = why
            else:
                out.kept.append(Kept(rel, why))
        dirs[:] = keep
        for name in sorted(files):
            rel = prefix + name
            why = policy.why(rel)
            if why is None:
                out.sent.append(rel)
            else:
                out.kept.append(Kept(rel, why))
    collapsed: list[str] = []
    for rel, why in sorted(dropped.items()):  # a directory before what it holds
        inside = rel + "/"
        if any(s.startswith(inside) for s in out.sent):
            out.sent.append(rel)
        elif not any(rel.startswith(c + "/") for c in collapsed):
            out.kept = [k for k in out.kept if not k.path.startswith(inside)]
            out.kept.append(Kept(rel, why))
            collapsed.append(rel)
    out.sent.sort()
    out.kept.sort(key=lambda k: k.path)
    return out
