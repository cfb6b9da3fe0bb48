"""What gpuenv keeps in the user's `DIR/gpuenv-<uid>/` on a cluster's shared directory, read
and removed over the user's ssh (`gpuenv prune --login HOST --shared DIR`; run/leftovers.py
judges it): the jobs' output and failure files (`jobs/`), the images' SquashFS files with
their environment files (`images/`), and the job directories of `slurm run --login`
(`work/<digest>`, each with the `host:path` it mirrors recorded beside it as
`work/<digest>.from` when it was made, login.py).

One ssh call lists it all, with the user's jobs Slurm still has (`squeue`), and one removes
what was chosen; the login node needs POSIX sh, coreutils (`wc`, `du`, `rm`) and `squeue`.
`gpuenv-<uid>/` is used only while it is a directory of the user's (as login.py checks it);
every name that comes back is checked against the names gpuenv gives, and so is every name
sent to be removed, there.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

from gpuenv.run.slurm import SlurmError, ssh
from gpuenv.run.slurm.ssh import Login

# argv: DIR. `uid N`, then one line per thing found: `job BYTES PATH`, `image BYTES PATH`
# (the SquashFS and its two .env files together), `work KIB PATH RECORD`; then `slurm ok`
# and `queued ID STATE` per job of the user's that Slurm still has, or `slurm unreachable`.
# Names holding a newline are skipped: they are not gpuenv's.
_LIST = """d=$1
[ -d "$d" ] || { echo "no such directory" >&2; exit 3; }
u=$(id -u) || exit 5
echo "uid $u"
own="$d/gpuenv-$u"
[ -e "$own" ] || [ -L "$own" ] || exit 0
if [ -L "$own" ] || [ ! -d "$own" ] || [ ! -O "$own" ]; then
  echo "$own is not a directory of yours" >&2; exit 4
fi
cd "$own" || exit 5
nl='
'
for f in jobs/gpuenv-*.out jobs/gpuenv-*.failed; do
  case $f in *"$nl"*) continue ;; esac
  if [ -f "$f" ] && [ ! -L "$f" ]; then echo "job $(wc -c < "$f") $f"; fi
done
for f in images/*.sqfs; do
  case $f in *"$nl"*) continue ;; esac
  [ -f "$f" ] && [ ! -L "$f" ] || continue
  n=0
  for g in "$f" "${f%.sqfs}.env" "${f%.sqfs}.sh.env"; do
    if [ -f "$g" ]; then n=$((n + $(wc -c < "$g"))); fi
  done
  echo "image $n $f"
done
for w in work/*; do
  case $w in *"$nl"*|*.from) continue ;; esac
  [ -d "$w" ] && [ ! -L "$w" ] || continue
  k=$(du -sk -- "$w" | cut -f1)
  r=
  if [ -f "$w.from" ] && [ ! -L "$w.from" ]; then r=$(head -n 1 -- "$w.from"); fi
  echo "work $k $w $r"
done
if q=$(squeue -h -u "$u" -o '%i %T' 2>&1); then
  echo "slurm ok"
  printf '%s\\n' "$q" | sed -e '/^$/d' -e 's/^/queued /'
else
  echo "slurm unreachable"
fi
"""
# argv: DIR, then paths under gpuenv-<uid>/ as the listing gave them (an image by its
# `.sqfs`). `gone PATH` for each one removed.
_REMOVE = """d=$1; shift
own="$d/gpuenv-$(id -u)"
if [ -L "$own" ] || [ ! -d "$own" ] || [ ! -O "$own" ]; then
  echo "$own is not a directory of yours" >&2; exit 4
fi
cd "$own" || exit 5
for p; do
  case $p in
    */../*|../*|*/..) continue ;;
    jobs/gpuenv-*) rm -f -- "$p" ;;
    images/*.sqfs) rm -f -- "$p" "${p%.sqfs}.env" "${p%.sqfs}.sh.env" ;;
    work/*) chmod -R u+w -- "$p" 2>/dev/null; rm -rf -- "$p" && rm -f -- "$p.from" ;;
    *) continue ;;
  esac && echo "gone $p"
done
exit 0
"""
_MESSAGES = {
    3: "no such directory there",
    4: "gpuenv's directory there is not a directory of yours (another user's, or a symbolic "
    "link): remove it or use another DIR",
}

JOB_FILE = re.compile(r"jobs/gpuenv-(\d+)\.(out|failed)")
IMAGE = re.compile(r"images/([0-9a-f]{64})\.sqfs")
WORK = re.compile(r"work/[0-9a-f]{16}")


@dataclass(frozen=True)
class ClusterDir:
    """`--shared DIR` on the cluster that `login` reaches."""

    login: Login
    root: str


@dataclass
class ClusterFiles:
    """What the listing found under `own` (DIR/gpuenv-<uid> there); paths relative to it."""

    own: str
    jobs: list[tuple[str, int]] = field(default_factory=list)  # path, bytes
    images: list[tuple[str, int]] = field(default_factory=list)  # the .sqfs, bytes of all 3
    work: list[tuple[str, int, str]] = field(default_factory=list)  # path, bytes, host:path
    queue: dict[str, str] | None = None  # job ID -> state; None: Slurm was not answering

    def job_ended(self, job_id: str) -> bool | None:
        """Whether Slurm no longer has the job pending or running; None: it cannot tell."""
        if self.queue is None:
            return None
        return job_id not in self.queue


def parse_listing(text: str, root: str) -> ClusterFiles:
    """_LIST's output. A line that is not gpuenv's (a name it never gives) is skipped."""
    lines = text.split("\n")
    word, _, uid = lines[0].partition(" ")
    if word != "uid" or not uid.isdigit():
        raise SlurmError(f"the login node answered {lines[0][:200]!r}, not its uid")
    found = ClusterFiles(f"{root.rstrip('/')}/gpuenv-{uid}")
    for line in lines[1:]:
        kind, _, rest = line.partition(" ")
        if kind in ("job", "image", "work"):
            size, _, rest = rest.strip().partition(" ")
            path, _, record = rest.partition(" ")
            if not size.isdigit():
                continue
            if kind == "job" and JOB_FILE.fullmatch(path):
                found.jobs.append((path, int(size)))
            elif kind == "image" and IMAGE.fullmatch(path):
                found.images.append((path, int(size)))
            elif kind == "work" and WORK.fullmatch(path):
                found.work.append((path, int(size) * 1024, record.strip()))
        elif line == "slurm ok":
            found.queue = {}
        elif kind == "queued" and found.queue is not None:
            job_id, _, state = rest.partition(" ")
            found.queue[job_id] = state.strip()
    return found


def listing(where: ClusterDir) -> ClusterFiles:
    """One ssh call: see _LIST."""
    proc = ssh.run(where.login, ["sh", "-c", _LIST, "gpuenv-list", where.root],
                   f"listing {where.root}", check=False)  # fmt: skip
    _check(where, proc.returncode, proc.stderr, "listing")
    return parse_listing(proc.stdout.decode("utf-8", "surrogateescape"), where.root)


def remove(where: ClusterDir, paths: list[str]) -> set[str]:
    """One ssh call removing `paths` (relative to gpuenv-<uid>/, as listed); those gone."""
    if not paths:
        return set()
    checked = [p for p in paths if JOB_FILE.fullmatch(p) or IMAGE.fullmatch(p)
               or WORK.fullmatch(p)]  # fmt: skip
    proc = ssh.run(where.login, ["sh", "-c", _REMOVE, "gpuenv-remove", where.root, *checked],
                   f"removing from {where.root}", check=False)  # fmt: skip
    _check(where, proc.returncode, proc.stderr, "removing")
    out = proc.stdout.decode("utf-8", "surrogateescape")
    return {line.removeprefix("gone ") for line in out.split("\n") if line.startswith("gone ")}


def _check(where: ClusterDir, code: int, stderr: bytes, what: str) -> None:
    if code in _MESSAGES:
        raise SlurmError(f"--shared {where.root} on {where.login.host}: {_MESSAGES[code]}")
    if code != 0:
        raise where.login.failure(code, stderr.decode(errors="replace"),
                                  f"{what} {where.root}")  # fmt: skip


__all__ = ["ClusterDir", "ClusterFiles", "listing", "parse_listing", "remove"]
