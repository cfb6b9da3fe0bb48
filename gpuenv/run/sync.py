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

- before: it lists the volume; what differs from here (kind, size, whole-second mtime: the
  quick check rsync makes by default) goes over in one tar, what is gone here is removed
  there. What travels out is `workdir.py`'s: no caches, VCS, secrets or `.dockerignore`d
  paths, and at most its limits (data belongs in a volume: `-v NAME:/data`).
- after (success, failure, Ctrl-C, SIGTERM): it lists the volume again, and the files the
  workload created or changed come back in one tar, except caches, VCS and secrets. A file
  that was also changed here meanwhile is never overwritten: the workload's copy lands
  beside it as `FILE.gpuenv-remote`, and a warning names it. Deletions never come back.
"""

from __future__ import annotations

import contextlib
import hashlib
import io
import json
import os
import secrets
import socket
import sys
import tarfile
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path, PurePosixPath
from typing import IO

from gpuenv.engine.client import ContainerSpec, Engine, EngineError
from gpuenv.matrix import contract
from gpuenv.matrix.errors import GpuenvError
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

# Run by the image's python3 in the helper container (as root). argv: root, uid, gid.
_LIST = """
import json, os, stat, sys
root, uid, gid = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
os.chown(root, uid, gid)
out = {}
for d, ds, fs in os.walk(root):
    for n in ds + fs:
        p = os.path.join(d, n); st = os.lstat(p); m = st.st_mode
        r = os.path.relpath(p, root)
        if stat.S_ISLNK(m): out[r] = ["l", 0, 0, 0, os.readlink(p)]
        elif stat.S_ISDIR(m): out[r] = ["d", 0, 0, stat.S_IMODE(m), ""]
        elif stat.S_ISREG(m): out[r] = ["f", st.st_size, int(st.st_mtime), stat.S_IMODE(m), ""]
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
# argv: root; the relative paths to pack are in _PATHS; the tar goes to _BACK.
_PACK = """
import json, os, sys, tarfile
root = sys.argv[1]
with tarfile.open(sys.argv[3], "w", format=tarfile.PAX_FORMAT) as tar:
    for r in json.load(open(sys.argv[2])):
        p = os.path.join(root, r)
        if os.path.isfile(p) and not os.path.islink(p): tar.add(p, arcname=r, recursive=False)
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
    engine_id = str(engine.info().get("ID") or "")
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
    skipped: list[str] = field(default_factory=list)  # would be written through a symlink

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
        remote = self._list()
        gone, send, staged = plan_send(local, remote, workdir.left_out(self.cwd))
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
        """The files the workload created or changed, into this directory."""
        changed = to_bring_back(self._list(), self._staged)
        if not changed:
            return
        self._script(_PACK, changed, _BACK)
        with tempfile.TemporaryFile() as outer:
            for chunk in self.engine.get_archive(self._require_helper(), _BACK):
                outer.write(chunk)
            outer.seek(0)
            with tarfile.open(fileobj=outer, mode="r|") as wrapper:
                for member in wrapper:
                    inner = wrapper.extractfile(member)
                    if inner is not None:
                        self._unpack(inner)

    def _unpack(self, data: IO[bytes]) -> None:
        with tarfile.open(fileobj=data, mode="r|") as tar:
            for member in tar:
                # The engine side chose these names: what never comes back is refused here
                # too, not only left out of what was asked for.
                if not member.isreg() or not _safe(member.name) or workdir.stays_home(member.name):
                    continue
                body = tar.extractfile(member)
                if body is None:
                    continue
                self._write(member, body)

    def _write(self, member: tarfile.TarInfo, body: IO[bytes]) -> None:
        rel = member.name
        target = self.cwd / rel
        if _through_symlink(self.cwd, rel):
            self.crossed.skipped.append(rel)
            return
        now = _entry(target)
        if not _same(now, self._staged.get(rel)):  # changed here too: keep both
            self.crossed.conflicts.append(rel)
            target = target.with_name(target.name + CONFLICT_SUFFIX)
        target.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=target.parent, prefix=".gpuenv-back-")
        try:
            with os.fdopen(fd, "wb") as fh:
                while chunk := body.read(1 << 20):
                    fh.write(chunk)
            os.chmod(tmp, member.mode & 0o777)
            os.utime(tmp, (member.mtime, member.mtime))
            os.replace(tmp, target)
        except BaseException:
            with contextlib.suppress(OSError):
                os.unlink(tmp)
            raise
        self.crossed.back += 1
        self.crossed.back_bytes += member.size

    # -- the helper container
    def _require_helper(self) -> str:
        if self._helper is None:
            raise GpuenvError("the working directory was never sent", exit_code=125)
        return self._helper

    def _list(self) -> dict[str, Entry]:
        code, out = self.engine.exec(self._require_helper(),
                                     ["python3", "-c", _LIST, str(self.cwd), str(self.uid),
                                      str(self.gid)])  # fmt: skip
        if code != 0:
            raise GpuenvError(
                f"{self.image} cannot list the working directory's copy on {self.engine.url} "
                f"(python3 exited {code}); gpuenv's sync needs python3 in the image",
                exit_code=125,
            )
        return {rel: Entry(kind, size, mtime, mode, link)
                for rel, (kind, size, mtime, mode, link) in json.loads(out).items()}  # fmt: skip

    def _script(self, code: str, paths: list[str], *extra: str) -> None:
        helper = self._require_helper()
        data = json.dumps(paths).encode()
        buf = io.BytesIO()
        with tarfile.open(fileobj=buf, mode="w") as tar:
            info = tarfile.TarInfo(PurePosixPath(_PATHS).name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
        buf.seek(0)
        self.engine.put_archive(helper, str(PurePosixPath(_PATHS).parent), buf)
        status, _ = self.engine.exec(helper, ["python3", "-c", code, str(self.cwd), _PATHS, *extra])
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
    local: dict[str, Entry], remote: dict[str, Entry], left_out: tuple[str, ...]
) -> tuple[list[str], list[str], dict[str, Entry]]:
    """(what to remove there, what to send, what the copy there then holds): the copy
    becomes this directory, except what never travels out (`left_out`), which stays there
    as the workload left it. Removals name the top of each removed tree."""
    gone = sorted(
        rel for rel, there in remote.items()
        if (rel not in local and not workdir.ignored(rel, left_out))
        or (rel in local and local[rel].kind != there.kind)
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


def to_bring_back(after: dict[str, Entry], staged: dict[str, Entry]) -> list[str]:
    """The files the workload created or changed, but caches, VCS and secrets."""
    return sorted(
        rel for rel, entry in after.items()
        if entry.kind == "f" and not entry.same(staged.get(rel)) and not workdir.stays_home(rel)
    )  # fmt: skip


def _safe(name: str) -> bool:
    path = PurePosixPath(name)
    return not path.is_absolute() and ".." not in path.parts and name not in ("", ".")


def _through_symlink(root: Path, rel: str) -> bool:
    """Whether a directory on the way to `rel`, or `rel` itself, is a symlink here: a file
    from the engine is never written through one."""
    path = root
    for part in PurePosixPath(rel).parts:
        path = path / part
        if path.is_symlink():
            return True
    return False


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
                          f"{exc.message}", file=sys.stderr)  # fmt: skip
                print(sync.crossed.line(engine.url), file=sys.stderr)
            for rel in sync.crossed.conflicts:
                print(f"gpuenv: warning: {rel} changed here during the run; the workload's "
                      f"copy is {rel}{CONFLICT_SUFFIX}", file=sys.stderr)  # fmt: skip
            for rel in sync.crossed.skipped:
                print(f"gpuenv: warning: {rel} not brought back: a symlink is on its way here",
                      file=sys.stderr)  # fmt: skip
    finally:
        sync.close()
