"""The working directory's copy in a job directory on the cluster's shared directory, for
`slurm run --login`: sent before the job, what the job wrote brought back after it.

    DIR/gpuenv-<uid>/work/<digest of client host:uid:path>   one per client directory

- before: what travels out is `gpuenv run`'s (run/workdir.py: matrix/treepolicy.py's
  decision, its limits). The login node lists the copy with each file's sha256 (GNU find
  and sha256sum, there); only the files whose content differs from here go, in one tar
  (`tar -x` there), with the directories and symlinks it lacks; what is not here is
  removed there, so the copy becomes this directory.
- after (the job's end, Ctrl-C, SIGTERM, after scancel): listed again; the files whose
  sha256 is not what was sent (new or changed by the job) come back, but caches, VCS and
  secrets and at most the same limits, in one tar streamed from `tar -c` there into
  run/sync.py's own unpacking (`Synced._unpack`): a file changed here meanwhile is kept
  and the job's lands beside it as FILE.gpuenv-remote, modes are never the job's, nothing
  is written through a symlink, and what cannot be written is a warning.
"""

from __future__ import annotations

import hashlib
import os
import socket
import subprocess
import sys
import tarfile
import tempfile
from dataclasses import dataclass
from pathlib import Path

from gpuenv.matrix.errors import GpuenvError, printable
from gpuenv.matrix.umask import current_umask
from gpuenv.run import sync, workdir
from gpuenv.run.slurm import SlurmError, ssh
from gpuenv.run.slurm.ssh import Login
from gpuenv.run.workdir import Entry

WHERE_DATA_GOES = "put data on the cluster's shared directory and read it from there"
TRANSFER_TIMEOUT = 3600  # seconds for one tar across (256 MiB at most)

# argv: the job directory. Each entry as `KIND SIZE PATH\0` (find's %y: f, d, l, ...), an
# empty record, then sha256sum's lines for the regular files.
_LIST = r"""cd "$1" || exit 3
find . -mindepth 1 -printf '%y %s %P\0' || exit 4
printf '\0'
find . -type f -exec sha256sum -- {} + || exit 4
"""
# argv: the job directory, then the paths to remove; the tar to unpack is on stdin.
_PUT = """set -e
cd "$1"; shift
rm -rf -- "$@"
tar -x -f - --no-same-owner --no-overwrite-dir
"""


@dataclass(frozen=True)
class Listing:
    """The copy there: kind and size by relative path, and each regular file's sha256."""

    kinds: dict[str, tuple[str, int]]
    digests: dict[str, str]


def parse_listing(out: bytes) -> Listing:
    """_LIST's output: find's records, an empty one, sha256sum's lines."""
    if out.startswith(b"\0"):  # nothing there
        records, sep, rest = b"", b"\0", out[1:]
    else:
        records, sep, rest = out.partition(b"\0\0")
    if not sep:
        raise SlurmError("the job directory's listing came back cut short")
    kinds: dict[str, tuple[str, int]] = {}
    for record in records.split(b"\0") if records else []:
        kind, size, path = record.decode("utf-8", "surrogateescape").split(" ", 2)
        kinds[path] = (kind, int(size))
    return Listing(kinds, parse_sha256sum(rest.decode("utf-8", "surrogateescape")))


def parse_sha256sum(text: str) -> dict[str, str]:
    """sha256sum's lines (`HEX  ./PATH`) by relative path. A name holding a backslash, a
    newline or a carriage return is escaped, its line starting with a backslash (GNU
    coreutils)."""
    out: dict[str, str] = {}
    for line in text.split("\n"):
        if not line:
            continue
        escaped = line.startswith("\\")
        digest, _, name = line.removeprefix("\\").partition("  ")
        if escaped:
            name = _unescape(name)
        out[name.removeprefix("./")] = digest
    return out


def _unescape(name: str) -> str:
    out, i = [], 0
    while i < len(name):
        if name[i] == "\\" and i + 1 < len(name):
            out.append({"n": "\n", "r": "\r", "\\": "\\"}.get(name[i + 1], name[i + 1]))
            i += 2
        else:
            out.append(name[i])
            i += 1
    return "".join(out)


def job_key(cwd: Path) -> str:
    """The job directory's name: one per client host, user and directory."""
    owner = f"{socket.gethostname()}:{os.getuid()}:{cwd}"
    return hashlib.sha256(owner.encode()).hexdigest()[:16]


def mirrors(cwd: Path) -> str:
    """What the job directory copies, as `gpuenv prune` reads it: `host:path`; empty for a
    path a one-line record cannot hold."""
    text = f"{socket.gethostname()}:{cwd}"
    return "" if "\n" in text or "\r" in text else text


def job_directory(own: str, cwd: Path) -> str:
    """DIR/gpuenv-<uid>/work/<job_key>."""
    return f"{own}/work/{job_key(cwd)}"


def plan(
    local: dict[str, Entry], digests: dict[str, str], there: Listing
) -> tuple[list[str], list[str]]:
    """(the tops of what to remove there, what to send), by content: a file goes when its
    sha256 there is not this one's, a directory or symlink when there is none there of
    that kind; what is there and not here (or of another kind) is removed."""
    kind_of = {"f": "f", "d": "d", "l": "l"}
    gone = sorted(rel for rel, (kind, _) in there.kinds.items()
                  if rel not in local or kind_of.get(kind) != local[rel].kind)  # fmt: skip
    tops: list[str] = []
    for rel in gone:  # sorted: a directory before what it holds
        if not tops or not rel.startswith(tops[-1] + "/"):
            tops.append(rel)
    removed = set(gone)
    send = []
    for rel, entry in sorted(local.items()):
        present = rel in there.kinds and rel not in removed
        if entry.kind == "f":
            if not present or there.digests.get(rel) != digests.get(rel):
                send.append(rel)
        elif entry.kind == "l" or not present:
            send.append(rel)
    return tops, send


def changed(after: Listing, sent: dict[str, str]) -> list[str]:
    """The regular files there whose sha256 is not what was sent (new, or changed by the
    job), but what never comes back (caches, VCS, secrets)."""
    return sorted(
        rel for rel, digest in after.digests.items()
        if after.kinds.get(rel, ("", 0))[0] == "f" and sent.get(rel) != digest
        and not workdir.stays_home(rel)
    )  # fmt: skip


def local_digests(root: Path, local: dict[str, Entry]) -> dict[str, str]:
    out = {}
    for rel, entry in local.items():
        if entry.kind == "f":
            with open(root / rel, "rb") as fh:
                out[rel] = hashlib.file_digest(fh, "sha256").hexdigest()
    return out


class _Landing(sync.Synced):
    """run/sync.py's way back alone, into `cwd`: no engine, no helper container; the tar
    comes from the login node. `staged` is this directory as it was sent."""

    def __init__(self, cwd: Path, staged: dict[str, Entry]) -> None:
        self.cwd = cwd
        self.uid, self.gid = os.getuid(), os.getgid()
        self.crossed = sync.Crossed()
        self._staged = staged
        self._linked: set[str] = set()
        self._new_mode = 0o666 & ~current_umask()


class JobDir:
    """The working directory's copy there for one run: `send()`, then `bring_back()`."""

    def __init__(self, login: Login, cwd: Path, path: str) -> None:
        self.login, self.cwd, self.path = login, cwd, path
        self.landing = _Landing(cwd, {})
        self._sent: dict[str, str] = {}  # sha256 of each file the copy holds once sent

    @property
    def where(self) -> str:
        return f"{self.login.who}:{self.path}"

    def _list(self) -> Listing:
        proc = ssh.run(self.login, ["sh", "-c", _LIST, "gpuenv-list", self.path],
                       "listing the job directory")  # fmt: skip
        return parse_listing(proc.stdout)

    def send(self) -> None:
        local = workdir.listing(self.cwd, WHERE_DATA_GOES)
        digests = local_digests(self.cwd, local)
        gone, send = plan(local, digests, self._list())
        crossed = self.landing.crossed
        if gone or send:
            with tempfile.TemporaryFile() as fh:
                crossed.sent_bytes = self.landing._pack_local(send, local, fh)
                fh.seek(0)
                ssh.run(self.login, ["sh", "-c", _PUT, "gpuenv-put", self.path, *gone],
                        "sending the working directory", stdin=fh,
                        timeout=TRANSFER_TIMEOUT)  # fmt: skip
        crossed.sent = sum(1 for rel in send if local[rel].kind == "f")
        crossed.removed = len(gone)
        self.landing._staged = local
        self._sent = digests

    def bring_back(self) -> None:
        after = self._list()
        sizes = {rel: Entry("f", size) for rel, (_, size) in after.kinds.items()}
        taken, self.landing.crossed.past_limits = sync.within_limits(
            changed(after, self._sent), sizes
        )
        if not taken:
            return
        argv = ["tar", "-C", self.path, "-c", "-f", "-", "--null", "--no-recursion",
                "--hard-dereference", "--transform=s,^\\./,,", "-T", "-"]  # fmt: skip
        names = b"".join(f"./{rel}".encode("utf-8", "surrogateescape") + b"\0" for rel in taken)
        with subprocess.Popen(self.login.argv(argv), stdin=subprocess.PIPE,
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE) as proc:  # fmt: skip
            assert proc.stdin is not None and proc.stdout is not None
            proc.stdin.write(names)
            proc.stdin.close()
            try:
                self.landing._unpack(proc.stdout, set(taken))
            except (tarfile.TarError, OSError, ValueError) as exc:
                raise GpuenvError(f"the files from {self.where} came back damaged ({exc})",
                                  exit_code=125) from exc  # fmt: skip
            finally:
                proc.stdout.read()
                err = proc.stderr.read() if proc.stderr else b""
        if proc.returncode != 0:
            raise self.login.failure(proc.returncode, err.decode(errors="replace"),
                                     "bringing back what the job wrote")  # fmt: skip

    def report(self) -> None:
        """The one line that says what crossed, and the warnings of the way back."""
        print(self.landing.crossed.line(self.where), file=sys.stderr)
        for line in sync.warnings(self.landing.crossed):
            print(line, file=sys.stderr)


def brought_back(job: JobDir, ended: bool) -> None:
    """What the job wrote, back here; when the run already failed, a failure here is a
    warning and the run's own error stays the one reported."""
    try:
        job.bring_back()
    except GpuenvError as exc:
        if ended:
            raise
        print(f"gpuenv: warning: what the job wrote was not brought back: "
              f"{printable(exc.message)}", file=sys.stderr)  # fmt: skip
    job.report()


__all__ = ["JobDir", "Listing", "brought_back", "changed", "job_directory", "job_key", "mirrors",
           "parse_listing", "parse_sha256sum", "plan"]  # fmt: skip
