"""The working directory on an engine that cannot see it: another host, reached over ssh://,
tcp+TLS or a Docker context.

Whether an engine sees this machine's directory is asked, never assumed (`visibility`):
gpuenv writes a file holding a random token into the directory and reads it back from a
container that binds the same path on the engine's host (Docker's --mount, which refuses a
path that is not there instead of creating it). An engine on this machine sees it; so does
Docker Desktop's shared folder, or a remote host that mounts the same NFS path. The verdict
is kept per engine and directory for VERDICT_MAX_AGE.

On an engine that cannot see it, the directory lives in a volume on the engine
(`gpuenv-workdir-<digest>`, one per client host, user and path), mounted at the same path,
which stays the working directory. Around the workload a helper container (the workload's
image, as root, network none) does the file work:

- before: the copy there becomes this directory. The helper lists the volume; what differs
  from here (kind, size, whole-second mtime: the quick check rsync makes by default) goes
  over in one tar, and so does every file the quick check passes whose sha256, taken there
  by the helper, is not this file's (or whose mode is not), so nothing a workload changed
  there survives into the next run unless this directory has it (issue 44, N3); what is
  not here is removed there, what never travels out (caches, `.venv`) included. What
  travels out is `workdir.py`'s: no caches, VCS, secrets or `.dockerignore`d paths, and at
  most its limits (data belongs in a volume: `-v NAME:/data`).
- after (success, failure, Ctrl-C, SIGTERM): it lists the volume again, and the files the
  workload created or changed come back in one tar, streamed, except caches, VCS and
  secrets, and at most the same limits: past them one warning names what stayed there. A
  file that was also changed here meanwhile is never overwritten: the workload's copy lands
  beside it as `FILE.gpuenv-remote`, and a warning names it. The workload's modes are not
  taken: a file that was here keeps its own, a new one gets 0666 less the user's umask (no
  execute bit). What cannot be written (a directory here where the workload left a file, a
  file or a symlink on the way) is a warning, and the other files still come back; a hard
  link there comes back as a file of its own. Names in warnings are escaped. Deletions never
  come back.
"""

from __future__ import annotations

import contextlib
import hashlib
import io
import json
import os
import secrets
import socket
import stat
import sys
import tarfile
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path, PurePosixPath
from typing import IO, Any

from gpuenv.engine.client import ContainerSpec, Engine, EngineError
from gpuenv.matrix import contract
from gpuenv.matrix.errors import GpuenvError, printable
from gpuenv.matrix.umask import current_umask
from gpuenv.run import workdir
from gpuenv.run.workdir import Entry
from gpuenv.store import cache

VERDICTS = "workdir-verdicts.json"  # in gpuenv's cache
VERDICT_MAX_AGE = 3600  # seconds
VOLUME_LABEL = "io.gpuenv.workdir"  # the volume's owner: client host, user and path
CONFLICT_SUFFIX = ".gpuenv-remote"
WHERE_DATA_GOES = "put data in a volume on the engine (-v NAME:/data)"
_PROBE_DIR = "/gpuenv-probe"
_BACK = "/tmp/gpuenv-back.tar"
_PATHS = "/tmp/gpuenv-paths.json"

# Run by the image's python3 in the helper container (as root). argv: root, uid, gid, and
# optionally a JSON file of {path: [size, mtime]}: a file listed there with the same size and
# mtime gets its sha256 as a seventh field (never read through a symlink).
_LIST = """
import hashlib, json, os, stat, sys
root, uid, gid = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
quick = json.load(open(sys.argv[4])) if len(sys.argv) > 4 else {}
os.chown(root, uid, gid)
def sha256(p):
    h = hashlib.sha256()
    try: fh = os.fdopen(os.open(p, os.O_RDONLY | os.O_NOFOLLOW), "rb")
    except OSError: return ""
    with fh:
        while True:
            b = fh.read(1 << 20)
            if not b: return h.hexdigest()
            h.update(b)
out = {}
for d, ds, fs in os.walk(root):
    for n in ds + fs:
        p = os.path.join(d, n); st = os.lstat(p); m = st.st_mode
        r = os.path.relpath(p, root)
        if stat.S_ISLNK(m): out[r] = ["l", 0, 0, 0, os.readlink(p)]
        elif stat.S_ISDIR(m): out[r] = ["d", 0, 0, stat.S_IMODE(m), ""]
        elif stat.S_ISREG(m):
            out[r] = ["f", st.st_size, int(st.st_mtime), stat.S_IMODE(m), "", st.st_nlink]
            if quick.get(r) == [st.st_size, int(st.st_mtime)]: out[r].append(sha256(p))
print(json.dumps(out))
"""
# argv: root; the relative paths to remove are in _PATHS. Never follows a symlink.
_REMOVE = """
import json, os, shutil, stat, sys
root = os.path.realpath(sys.argv[1])
for r in json.load(open(sys.argv[2])):
    p = os.path.join(root, r)
    if os.path.commonpath([root, os.path.realpath(os.path.dirname(p))]) != root: continue
    try: st = os.lstat(p)
    except FileNotFoundError: continue
    shutil.rmtree(p) if stat.S_ISDIR(st.st_mode) else os.unlink(p)
"""
# argv: root; the relative paths to pack are in _PATHS; the tar goes to _BACK. Each file is
# a member of its own with its bytes (a hard link too); never through a symlink.
_PACK = """
import json, os, stat, sys, tarfile
root = sys.argv[1]
with tarfile.open(sys.argv[3], "w", format=tarfile.PAX_FORMAT) as tar:
    for r in json.load(open(sys.argv[2])):
        try: fd = os.open(os.path.join(root, r), os.O_RDONLY | os.O_NOFOLLOW)
        except OSError: continue
        with os.fdopen(fd, "rb") as fh:
            st = os.fstat(fd)
            if not stat.S_ISREG(st.st_mode): continue
            info = tarfile.TarInfo(r)
            info.size, info.mtime = st.st_size, int(st.st_mtime)
            info.mode = stat.S_IMODE(st.st_mode)
            tar.addfile(info, fh)
"""


@dataclass(frozen=True)
class Visibility:
    sees: bool
    why: str


def visibility(engine: Engine, cwd: Path, image: str, platform: str | None = None) -> Visibility:
    """Whether the engine sees `cwd` as this machine does, and why; asked once per engine
    and directory for VERDICT_MAX_AGE (a probe container from `image`)."""
    key = _verdict_key(engine, cwd)
    kept = cache.read_record(VERDICTS).get(key)
    if isinstance(kept, dict) and 0 <= time.time() - float(kept.get("at") or 0) <= VERDICT_MAX_AGE:
        return Visibility(bool(kept.get("sees")), str(kept.get("why") or ""))
    verdict = probe(engine, cwd, image, platform)
    cache.update_record(VERDICTS, {key: {"sees": verdict.sees, "why": verdict.why,
                                         "at": int(time.time())}})  # fmt: skip
    return verdict


def _verdict_key(engine: Engine, cwd: Path) -> str:
    engine_id = engine.identity()  # no request for an engine on this machine (issue 48)
    return hashlib.sha256(f"{engine.url}\0{engine_id}\0{cwd}".encode()).hexdigest()


def probe(engine: Engine, cwd: Path, image: str, platform: str | None = None) -> Visibility:
    """Write a token into `cwd` and read it back through a bind of the same path on the
    engine's host."""
    token = secrets.token_hex(16)
    marker = cwd / f".gpuenv-sees-{token[:12]}"
    try:
        fd = os.open(marker, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o644)
    except OSError as exc:
        return Visibility(False, f"gpuenv could not write a probe file into {cwd} ({exc.strerror})")
    try:
        with os.fdopen(fd, "w") as fh:
            fh.write(token)
        spec = ContainerSpec(image, ["cat", f"{_PROBE_DIR}/{marker.name}"], user="0:0",
                             mounts=[(str(cwd), _PROBE_DIR, True)], network="none",
                             init=False, platform=platform,
                             labels=contract.container_labels("probe"))  # fmt: skip
        try:
            cid = engine.create(spec)
        except EngineError as exc:
            text = f"{exc} {exc.detail}".lower()
            if "does not exist" in text or "no such file or directory" in text:
                return Visibility(False, f"the engine's host has no directory {cwd}")
            raise
        try:
            engine.start(cid)
            engine.wait(cid, timeout=120)
            seen = engine.logs(cid).strip()
        finally:
            engine.remove_container(cid)
    finally:
        marker.unlink(missing_ok=True)
    if seen == token:
        return Visibility(True, f"a file gpuenv wrote into {cwd} was read back in a container")
    return Visibility(False, f"the engine's host has a directory {cwd}, but not this one")


def volume_name(cwd: Path, uid: int) -> str:
    return "gpuenv-workdir-" + hashlib.sha256(_owner(cwd, uid).encode()).hexdigest()[:16]


def _owner(cwd: Path, uid: int) -> str:
    return f"{socket.gethostname()}:{uid}:{cwd}"


@dataclass
class Crossed:
    """What crossed, for the one line a synced run prints."""

    sent: int = 0
    sent_bytes: int = 0
    removed: int = 0
    back: int = 0
    back_bytes: int = 0
    conflicts: list[str] = field(default_factory=list)  # kept beside, as FILE.gpuenv-remote
    refused: list[str] = field(default_factory=list)  # "NAME not brought back: why", escaped
    linked: list[str] = field(default_factory=list)  # hard links there, back as files
    past_limits: list[tuple[str, int]] = field(default_factory=list)  # left there: (path, size)

    def line(self, url: str) -> str:
        removed = f", removed {self.removed} there" if self.removed else ""
        return (f"gpuenv: working directory via {url}: sent {_files(self.sent)} "
                f"({_size(self.sent_bytes)}){removed}, brought back {_files(self.back)} "
                f"({_size(self.back_bytes)})")  # fmt: skip


def _files(n: int) -> str:
    return f"{n} file" if n == 1 else f"{n} files"


def _size(n: int) -> str:
    if n < 1000:
        return f"{n} B"
    return f"{n / 1e3:.1f} kB" if n < 1_000_000 else f"{n / 1e6:.1f} MB"


class Synced:
    """The directory in a volume on the engine, for one run: `volume` to mount at `cwd`
    before the workload; `bring_back()` after it."""

    def __init__(
        self, engine: Engine, cwd: Path, image: str, uid: int, gid: int, platform: str | None
    ) -> None:
        self.engine, self.cwd, self.image, self.uid, self.gid = engine, cwd, image, uid, gid
        self.platform = platform
        self.volume = volume_name(cwd, uid)
        self.crossed = Crossed()
        self._helper: str | None = None
        self._staged: dict[str, Entry] = {}
        self._linked: set[str] = set()  # files the last listing saw with other hard links
        self._new_mode = 0o644  # a new file's mode here: 0666 less the umask, read once
        self.sent = False  # the copy there is this directory: what the workload writes counts

    # -- before
    def claim_volume(self) -> None:
        """The volume, made when it is not there; refused when it is not gpuenv's copy of
        this directory."""
        owner = _owner(self.cwd, self.uid)
        labels = self.engine.create_volume(self.volume, {VOLUME_LABEL: owner})
        if labels.get(VOLUME_LABEL) != owner:
            raise GpuenvError(
                f"volume {self.volume} on {self.engine.url} is not gpuenv's copy of {self.cwd} "
                f"(its label says {labels.get(VOLUME_LABEL)!r}); remove it (docker volume rm "
                f"{self.volume}) and run again",
                exit_code=125,
            )

    def send(self) -> None:
        local = workdir.listing(self.cwd, WHERE_DATA_GOES)
        spec = ContainerSpec(self.image, ["sleep", "infinity"], user="0:0", workdir="/",
                             binds=[f"{self.volume}:{self.cwd}"], network="none", init=True,
                             platform=self.platform,
                             labels=contract.container_labels("sync"))  # fmt: skip
        self._helper = self.engine.create(spec)
        self.engine.start(self._helper)
        remote, there = self._list(local)
        gone, send, staged = plan_send(local, remote)
        kept = [rel for rel, entry in local.items() if entry.kind == "f" and rel not in send]
        stale = not_verified(local, staged, there, _local_digests(self.cwd, kept))
        send = sorted([*send, *stale])  # a directory still before what it holds
        staged.update((rel, local[rel]) for rel in stale)
        if gone:
            self._script(_REMOVE, gone)
        if send:
            with tempfile.TemporaryFile() as fh:
                self.crossed.sent_bytes = self._pack_local(send, local, fh)
                fh.seek(0)
                self.engine.put_archive(self._helper, str(self.cwd), fh)
        self._staged = staged
        self.crossed.sent = sum(1 for rel in send if local[rel].kind == "f")
        self.crossed.removed = len(gone)
        self.sent = True

    def _pack_local(self, rels: list[str], local: dict[str, Entry], out: IO[bytes]) -> int:
        total = 0
        with tarfile.open(fileobj=out, mode="w", format=tarfile.PAX_FORMAT) as tar:
            for rel in rels:  # sorted: a directory before what it holds
                entry = local[rel]
                info = tarfile.TarInfo(rel)
                info.uid, info.gid, info.mode, info.mtime = (
                    self.uid,
                    self.gid,
                    entry.mode,
                    entry.mtime,
                )
                if entry.kind == "d":
                    info.type = tarfile.DIRTYPE
                    tar.addfile(info)
                elif entry.kind == "l":
                    info.type, info.linkname = tarfile.SYMTYPE, entry.link
                    tar.addfile(info)
                else:
                    with open(self.cwd / rel, "rb") as fh:
                        info.size = os.fstat(fh.fileno()).st_size
                        tar.addfile(info, fh)
                    total += info.size
        return total

    # -- after
    def bring_back(self) -> None:
        """The files the workload created or changed, into this directory: at most the
        limits of the way out, streamed (never spooled whole here)."""
        after, _ = self._list()
        taken, self.crossed.past_limits = within_limits(to_bring_back(after, self._staged), after)
        if not taken:
            return
        self._script(_PACK, taken, _BACK)
        self._new_mode = 0o666 & ~current_umask()
        reader = io.BufferedReader(Chunks(self.engine.get_archive(self._require_helper(), _BACK)),
                                   1 << 20)  # fmt: skip
        try:
            with tarfile.open(fileobj=reader, mode="r|") as wrapper:
                for member in wrapper:
                    inner = wrapper.extractfile(member)
                    if inner is not None:
                        self._unpack(inner, set(taken))
        except (tarfile.TarError, OSError) as exc:
            raise GpuenvError(f"the files from {self.engine.url} came back damaged ({exc})",
                              exit_code=125) from exc  # fmt: skip

    def _unpack(self, data: IO[bytes], wanted: set[str]) -> None:
        """Write the tar's files that were asked for (`wanted`, each once) and are allowed
        here, within the limits whatever the tar's headers say."""
        with tarfile.open(fileobj=data, mode="r|") as tar:
            for member in tar:
                # The engine side chose these names: what never comes back is refused here
                # too, not only left out of what was asked for.
                name = member.name
                if name not in wanted or not _safe(name) or workdir.stays_home(name):
                    continue
                wanted.discard(name)
                if not member.isreg():
                    self.crossed.refused.append(f"{printable(name)} not brought back: it is "
                                                "not a regular file there")  # fmt: skip
                    continue
                if self.crossed.back_bytes + member.size > workdir.MAX_BYTES:
                    self.crossed.past_limits.append((name, member.size))
                    continue
                body = tar.extractfile(member)
                if body is not None:
                    self._write(member, body)

    def _write(self, member: tarfile.TarInfo, body: IO[bytes]) -> None:
        rel = member.name
        target = self.cwd / rel
        why = in_the_way(self.cwd, rel)
        if why is None and not _same(_entry(target), self._staged.get(rel)):
            # Changed here too: keep both.
            self.crossed.conflicts.append(rel)
            target = target.with_name(target.name + CONFLICT_SUFFIX)
            why = in_the_way(self.cwd, f"{rel}{CONFLICT_SUFFIX}")
        if why is not None:
            self.crossed.refused.append(f"{printable(rel)} not brought back: {why}")
            return
        here = _entry(target)
        # Never the workload's mode: a file that was here keeps its own (less setuid and
        # the like), a new one is what the user's umask gives a new file, not executable.
        mode = here.mode & 0o777 if here is not None else self._new_mode
        tmp = ""
        try:
            target.parent.mkdir(parents=True, exist_ok=True)
            fd, tmp = tempfile.mkstemp(dir=target.parent, prefix=".gpuenv-back-")
            with os.fdopen(fd, "wb") as fh:
                while chunk := body.read(1 << 20):
                    fh.write(chunk)
            os.chmod(tmp, mode)
            os.utime(tmp, (member.mtime, member.mtime))
            os.replace(tmp, target)
        except OSError as exc:
            if tmp:
                with contextlib.suppress(OSError):
                    os.unlink(tmp)
            self.crossed.refused.append(f"{printable(rel)} not brought back: {exc.strerror or exc}")
            return
        except BaseException:
            if tmp:
                with contextlib.suppress(OSError):
                    os.unlink(tmp)
            raise
        self.crossed.back += 1
        self.crossed.back_bytes += member.size
        if rel in self._linked:
            self.crossed.linked.append(rel)

    # -- the helper container
    def _require_helper(self) -> str:
        if self._helper is None:
            raise GpuenvError("the working directory was never sent", exit_code=125)
        return self._helper

    def _list(
        self, quick: dict[str, Entry] | None = None
    ) -> tuple[dict[str, Entry], dict[str, str]]:
        """The copy there: its entries, and the sha256, taken there, of each file that
        `quick` (this directory) holds with the same size and mtime."""
        helper = self._require_helper()
        extra = []
        if quick:
            self._put_paths({rel: [e.size, e.mtime] for rel, e in quick.items() if e.kind == "f"})
            extra = [_PATHS]
        code, out = self.engine.exec(helper, ["python3", "-c", _LIST, str(self.cwd),
                                              str(self.uid), str(self.gid), *extra])  # fmt: skip
        if code != 0:
            raise GpuenvError(
                f"{self.image} cannot list the working directory's copy on {self.engine.url} "
                f"(python3 exited {code}); gpuenv's sync needs python3 in the image",
                exit_code=125,
            )
        listed: dict[str, list[Any]] = json.loads(out)
        self._linked = {rel for rel, row in listed.items() if row[5:] and row[5] > 1}
        digests = {rel: str(row[6]) for rel, row in listed.items() if row[6:]}
        entries = {rel: Entry(kind, size, mtime, mode, link)
                   for rel, (kind, size, mtime, mode, link, *_) in listed.items()}  # fmt: skip
        return entries, digests

    def _put_paths(self, data: object) -> None:
        """`data` as JSON in the helper's _PATHS, for the next script."""
        raw = json.dumps(data).encode()
        buf = io.BytesIO()
        with tarfile.open(fileobj=buf, mode="w") as tar:
            info = tarfile.TarInfo(PurePosixPath(_PATHS).name)
            info.size = len(raw)
            tar.addfile(info, io.BytesIO(raw))
        buf.seek(0)
        self.engine.put_archive(self._require_helper(), str(PurePosixPath(_PATHS).parent), buf)

    def _script(self, code: str, paths: list[str], *extra: str) -> None:
        self._put_paths(paths)
        status, _ = self.engine.exec(
            self._require_helper(), ["python3", "-c", code, str(self.cwd), _PATHS, *extra]
        )
        if status != 0:
            raise GpuenvError(
                f"the working directory's copy on {self.engine.url} could not be updated "
                f"(exit {status})",
                exit_code=125,
            )

    def close(self) -> None:
        if self._helper is not None:
            self.engine.remove_container_patiently(self._helper, 0)
            self._helper = None


def plan_send(
    local: dict[str, Entry], remote: dict[str, Entry]
) -> tuple[list[str], list[str], dict[str, Entry]]:
    """(what to remove there, what to send, what the copy there then holds) by the quick
    check: the copy becomes this directory, what never travels out (caches, `.venv`)
    removed there too: a workload's `__pycache__` would otherwise run in the next run.
    Removals name the top of each removed tree."""
    gone = sorted(
        rel for rel, there in remote.items() if rel not in local or local[rel].kind != there.kind
    )  # fmt: skip
    tops: list[str] = []
    for rel in gone:  # sorted: a directory comes before what it holds
        if not tops or not rel.startswith(tops[-1] + "/"):
            tops.append(rel)
    staged = {r: e for r, e in remote.items()
              if not any(r == t or r.startswith(t + "/") for t in tops)}  # fmt: skip
    send = [rel for rel, entry in local.items() if not entry.same(staged.get(rel))]
    staged.update((rel, local[rel]) for rel in send)
    return tops, send, staged


def not_verified(
    local: dict[str, Entry], staged: dict[str, Entry], there: dict[str, str], here: dict[str, str]
) -> list[str]:
    """The files the quick check passed (`here`: their digests in this directory) that the
    copy there does not hold as they are here: its digest (`there`, taken there as it was
    listed) differs or is missing, or so does its mode; or one side could not read it. Sent
    again."""
    return sorted(
        rel for rel, digest in here.items()
        if not digest or there.get(rel) != digest
        or staged[rel].mode & 0o7777 != local[rel].mode & 0o7777
    )  # fmt: skip


def within_limits(
    rels: list[str], entries: dict[str, Entry]
) -> tuple[list[str], list[tuple[str, int]]]:
    """(what comes back, what stays there as (path, size)): in order, until the way out's
    limits (workdir.MAX_FILES, MAX_BYTES) are reached."""
    total = 0
    for n, rel in enumerate(rels):
        size = entries[rel].size
        if n >= workdir.MAX_FILES or total + size > workdir.MAX_BYTES:
            return rels[:n], [(r, entries[r].size) for r in rels[n:]]
        total += size
    return rels, []


def past_limits_line(left: list[tuple[str, int]], where: str) -> str:
    """One line naming what stayed there: its count and size, and its top-level names
    (a directory with how many of its files), escaped."""
    tops: dict[str, int] = {}
    for rel, _ in left:
        top, sep, _rest = rel.partition("/")
        tops[top + sep] = tops.get(top + sep, 0) + 1
    named = [printable(t) + (f" ({n})" if t.endswith("/") else "") for t, n in tops.items()]
    more = f", and {len(named) - 5} more" if len(named) > 5 else ""
    return (f"gpuenv: warning: {_files(len(left))} ({_size(sum(s for _, s in left))}) not "
            f"brought back, past the limits of what gpuenv brings back ({workdir.MAX_FILES} "
            f"files, {workdir.MAX_BYTES >> 20} MiB): {', '.join(named[:5])}{more}; "
            f"{where}")  # fmt: skip


def to_bring_back(after: dict[str, Entry], staged: dict[str, Entry]) -> list[str]:
    """The files the workload created or changed, but caches, VCS and secrets."""
    return sorted(
        rel for rel, entry in after.items()
        if entry.kind == "f" and not entry.same(staged.get(rel)) and not workdir.stays_home(rel)
    )  # fmt: skip


def _safe(name: str) -> bool:
    path = PurePosixPath(name)
    return not path.is_absolute() and ".." not in path.parts and name not in ("", ".")


def in_the_way(root: Path, rel: str) -> str | None:
    """Why a file from the engine cannot be written at `rel` here, or None: a symlink on
    its way or at it (never written through), a file where it needs a directory, a
    directory where it would put the file. Never replaced: they are the user's."""
    path = root
    parts = PurePosixPath(rel).parts
    for n, part in enumerate(parts, 1):
        path = path / part
        try:
            mode = os.lstat(path).st_mode
        except FileNotFoundError:
            return None
        except OSError as exc:
            return str(exc.strerror or exc)
        if stat.S_ISLNK(mode):
            return "a symlink is on its way here"
        if n < len(parts) and not stat.S_ISDIR(mode):
            return f"{printable('/'.join(parts[:n]))} is a file here"
        if n == len(parts) and stat.S_ISDIR(mode):
            return "it is a directory here"
    return None


def _local_digests(root: Path, rels: list[str]) -> dict[str, str]:
    """sha256 of these files here; a file that cannot be read (gone meanwhile) has none,
    so it is sent, and the way out reports it."""
    out: dict[str, str] = {}
    for rel in rels:
        try:
            fd = os.open(root / rel, os.O_RDONLY | os.O_NOFOLLOW)
        except OSError:
            out[rel] = ""
            continue
        with os.fdopen(fd, "rb") as fh:
            out[rel] = hashlib.file_digest(fh, "sha256").hexdigest()
    return out


class Chunks(io.RawIOBase):
    """An iterator of byte chunks as a readable stream (for tarfile's stream mode): the
    engine's archives come as chunks (`Engine.get_archive`, `exported_filesystem`)."""

    def __init__(self, chunks: Iterator[bytes]) -> None:
        self._chunks = iter(chunks)
        self._left = b""

    def readable(self) -> bool:
        return True

    def readinto(self, buffer: memoryview) -> int:  # type: ignore[override]
        while not self._left:
            try:
                self._left = next(self._chunks)
            except StopIteration:
                return 0
        n = min(len(buffer), len(self._left))
        buffer[:n] = self._left[:n]
        self._left = self._left[n:]
        return n


def _entry(path: Path) -> Entry | None:
    try:
        return workdir.entry_of(os.lstat(path), path)
    except FileNotFoundError:
        return None


def _same(a: Entry | None, b: Entry | None) -> bool:
    return (a is None and b is None) or (a is not None and a.same(b))


@contextlib.contextmanager
def synced(
    engine: Engine, cwd: Path, image: str, uid: int, gid: int, platform: str | None = None
) -> Iterator[Synced]:
    """The volume claimed; the caller mounts `volume`, creates its container and calls
    `send()`; what the workload wrote comes back whatever ended it, the helper container
    is removed on every path, and the crossing is printed once."""
    sync = Synced(engine, cwd, image, uid, gid, platform)
    try:
        sync.claim_volume()
        ended = False
        try:
            yield sync
            ended = True
        finally:
            if sync.sent:
                try:
                    sync.bring_back()
                except GpuenvError as exc:
                    if ended:
                        raise
                    # The run's own failure (the engine lost, say) is the error to report.
                    print(f"gpuenv: warning: what the workload wrote was not brought back: "
                          f"{printable(exc.message)}", file=sys.stderr)  # fmt: skip
                print(sync.crossed.line(engine.url), file=sys.stderr)
            for line in warnings(sync.crossed):
                print(line, file=sys.stderr)
    finally:
        sync.close()


MAX_WARNINGS = 20  # per kind: a full disk must not print 20,000 lines


def warnings(crossed: Crossed) -> list[str]:
    """The lines that say what did not come back as it was there, names escaped."""
    lines = [
        f"gpuenv: warning: {printable(rel)} changed here during the run; the workload's copy "
        f"is {printable(rel + CONFLICT_SUFFIX)}"
        for rel in crossed.conflicts
    ]
    lines += [f"gpuenv: warning: {why}" for why in crossed.refused[:MAX_WARNINGS]]
    if len(crossed.refused) > MAX_WARNINGS:
        lines.append(f"gpuenv: warning: {len(crossed.refused) - MAX_WARNINGS} more files not "
                     "brought back")  # fmt: skip
    if crossed.past_limits:
        lines.append(past_limits_line(crossed.past_limits, WHERE_DATA_GOES))
    if crossed.linked:
        names = ", ".join(printable(rel) for rel in sorted(crossed.linked)[:MAX_WARNINGS])
        more = (
            f" and {len(crossed.linked) - MAX_WARNINGS} more"
            if len(crossed.linked) > MAX_WARNINGS
            else ""
        )
        lines.append(f"gpuenv: warning: {names}{more} were hard links there; each came back as "
                     "a file of its own")  # fmt: skip
    return lines
