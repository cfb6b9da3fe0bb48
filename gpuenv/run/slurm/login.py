"""`gpuenv slurm run --login [USER@]HOST[:PORT]`: from a machine with Docker (a laptop, a CI
runner) to a cluster whose login node is reached over ssh (ssh.py) and runs no Docker.

Here: the image chosen as for any run, written once per image ID as a SquashFS into the
cache (image.py, the same bytes as on a login node). Across, over the user's ssh: the
image's three files into `DIR/gpuenv-<uid>/images/` (DIR is --shared, a path on the
cluster) unless `sha256sum` there already gives the digests taken here (each sent to a
temporary name, checked there, then renamed, the SquashFS last); the working directory into
its job directory (jobdir.py, only what changed; this host's `host:path` recorded beside it,
for `gpuenv prune`); the batch script to `sbatch`; then `scontrol`, the job's output
(`tail -c +N`) and, on Ctrl-C/SIGTERM, `scancel`. After the job, what it wrote comes back
(jobdir.py) and one line says what crossed.
"""

from __future__ import annotations

import os
import secrets
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, BinaryIO

from gpuenv.run.console import say
from gpuenv.run.slurm import SlurmError, ssh
from gpuenv.run.slurm.script import ImageFiles, check_path
from gpuenv.run.slurm.ssh import Login
from gpuenv.store import private

if TYPE_CHECKING:
    from gpuenv.run.slurm.image import Shared
    from gpuenv.run.slurm.run import SlurmOptions

# argv: DIR, the image's hex ID, the job directory's key, the client's `host:path` it
# mirrors. gpuenv's own directories made there (0700, the user's, no symlink), the record
# beside the job directory (for `gpuenv prune`, cluster_files.py), then `uid N` and
# sha256sum's lines for the image's files that are there.
_PREPARE = """umask 077
d=$1
[ -d "$d" ] || { echo "no such directory" >&2; exit 3; }
u=$(id -u) || exit 5
own="$d/gpuenv-$u"
for p in "$own" "$own/images" "$own/jobs" "$own/work" "$own/work/$3"; do
  if [ -L "$p" ] || { [ -e "$p" ] && { [ ! -d "$p" ] || [ ! -O "$p" ]; }; }; then
    echo "$p is not a directory of yours" >&2; exit 4
  fi
  mkdir -p "$p" && chmod 700 "$p" || exit 5
done
if [ -n "$4" ]; then printf '%s\n' "$4" > "$own/work/$3.from" || exit 5; fi
echo "uid $u"
cd "$own/images" || exit 5
for f in "$2.env" "$2.sh.env" "$2.sqfs"; do
  if [ -f "$f" ] && [ ! -L "$f" ]; then sha256sum -- "$f" || exit 5; fi
done
"""
# argv: the final path, a random suffix, the expected sha256. The file from stdin goes to
# a temporary name (never an existing one), is checked, then renamed into place.
_RECEIVE = """umask 077
set -C
t="$1.gpuenv-tmp-$2"
cat > "$t" || { rm -f -- "$t"; exit 5; }
got=$(sha256sum < "$t") || { rm -f -- "$t"; exit 5; }
if [ "${got%% *}" != "$3" ]; then rm -f -- "$t"; echo "arrived as sha256 ${got%% *}" >&2; exit 6; fi
mv -f -- "$t" "$1"
"""
_MESSAGES = {3: "no such directory there (give a directory on the cluster's shared storage)",
             4: "it holds a path under gpuenv's name that is not a directory of yours "
                "(another user's, or a symbolic link): remove it or use another DIR"}  # fmt: skip
UPLOAD_TIMEOUT = 6 * 3600  # seconds for one image file across


@dataclass(frozen=True)
class Prepared:
    uid: int  # the user's uid there: gpuenv-<uid>/
    digests: dict[str, str]  # the image's files there, by name: their sha256


def parse_prepared(text: str) -> Prepared:
    from gpuenv.run.slurm.jobdir import parse_sha256sum

    head, _, rest = text.partition("\n")
    word, _, uid = head.partition(" ")
    if word != "uid" or not uid.isdigit():
        raise SlurmError(f"the login node answered {head[:200]!r}, not its uid")
    return Prepared(int(uid), parse_sha256sum(rest))


def shared_there(option: str | None) -> str:
    """--shared DIR (else $GPUENV_SLURM_SHARED) as a path on the cluster: absolute, and
    one Slurm's #SBATCH lines carry."""
    from gpuenv.run.slurm.image import SHARED_ENV

    text = option or os.environ.get(SHARED_ENV, "")
    where = "--shared" if option else f"${SHARED_ENV}"
    if not text:
        raise SlurmError(f"slurm run --login needs a directory every node sees at the same path, "
                         f"on the cluster: --shared DIR or ${SHARED_ENV}")  # fmt: skip
    if not text.startswith("/"):
        raise SlurmError(f"{where} {text!r}: with --login it is a path on the cluster, and must "
                         "be absolute (/scratch/you)")  # fmt: skip
    return check_path(text.rstrip("/") or "/", where)


def prepare(login: Login, shared: str, image_hex: str, key: str, mirrors: str) -> Prepared:
    """`mirrors`: the client's `host:path` (jobdir.mirrors), recorded beside the job
    directory; empty records nothing."""
    proc = ssh.run(login, ["sh", "-c", _PREPARE, "gpuenv-prepare", shared, image_hex, key,
                           mirrors], "preparing the shared directory", check=False)  # fmt: skip
    if proc.returncode in _MESSAGES:
        raise SlurmError(f"--shared {shared} on {login.host}: {_MESSAGES[proc.returncode]}")
    if proc.returncode != 0:
        raise login.failure(proc.returncode, proc.stderr.decode(errors="replace"),
                            f"preparing {shared}")  # fmt: skip
    return parse_prepared(proc.stdout.decode(errors="replace"))


def to_send(local: ImageFiles, there: ImageFiles, digests: dict[str, str],
            ours: dict[str, str | None]) -> list[tuple[str, str, str]]:  # fmt: skip
    """(local path, path there, sha256) of the image's files whose digest there is not the
    one taken here, the SquashFS last: its presence there means the rest is there."""
    pairs = [(local.env_file, there.env_file), (local.shell_env_file, there.shell_env_file),
             (local.squashfs, there.squashfs)]  # fmt: skip
    out = []
    for mine, theirs in pairs:
        digest = ours.get(mine)
        if digest is None:
            raise SlurmError(f"{mine} cannot be read: it was just written; run again")
        if digests.get(Path(theirs).name) != digest:
            out.append((mine, theirs, digest))
    return out


def upload(login: Login, local: ImageFiles, there: ImageFiles, prepared: Prepared) -> None:
    ours = {p: private.sha256_of(Path(p))
            for p in (local.squashfs, local.env_file, local.shell_env_file)}  # fmt: skip
    sending = to_send(local, there, prepared.digests, ours)
    if not sending:
        say(f"reusing {login.who}:{there.squashfs} (its sha256 there is this image's)")
        return
    size = sum(os.path.getsize(mine) for mine, _, _ in sending)
    say(f"sending the image to {login.who}:{there.squashfs} ({size / 1e6:.1f} MB, once per "
        "image ID)")  # fmt: skip
    for mine, theirs, digest in sending:
        with open(mine, "rb") as fh:
            proc = ssh.run(login, ["sh", "-c", _RECEIVE, "gpuenv-receive", theirs,
                                   secrets.token_hex(8), digest],
                           f"receiving {Path(theirs).name}", stdin=fh, timeout=UPLOAD_TIMEOUT,
                           check=False)  # fmt: skip
        if proc.returncode != 0:
            raise login.failure(proc.returncode, proc.stderr.decode(errors="replace"),
                                f"writing {theirs}")  # fmt: skip


def submit(opts: SlurmOptions, login: Login) -> int:
    """The whole run from this machine: see the module's docstring."""
    from gpuenv.engine import client as engine
    from gpuenv.run import options, target
    from gpuenv.run.slurm import image, jobdir
    from gpuenv.run.slurm.jobs import Slurm
    from gpuenv.run.slurm.run import attach, check, check_mount_point
    from gpuenv.run.slurm.script import JobInputs, batch_script, job_name, output_path

    time_limit, partition = check(opts)
    argv = options.command_for(opts.command, opts.cwd)
    env = options.parse_env(opts.env)
    shared = shared_there(opts.shared)
    slurm = Slurm.over(login)
    project = target.project_for(opts.image, opts.file)
    eng = engine.connect()
    try:
        chosen = target.choose(eng, opts.image, project, "--gpus-per-node N",
                               opts.gpus_per_node > 0)  # fmt: skip
        info = eng.image(chosen.image)
        if info is None:
            raise SlurmError(f"image {chosen.image} not found in the engine")
        image_hex = info.id.removeprefix("sha256:")
        prepared = prepare(login, shared, image_hex, jobdir.job_key(opts.cwd),
                           jobdir.mirrors(opts.cwd))  # fmt: skip
        there = image.Shared(Path(shared), prepared.uid)
        cwd = jobdir.job_directory(str(there.own), opts.cwd)
        what = chosen.cell.name if chosen.cell else chosen.image
        inputs = JobInputs(
            name=job_name(what), command=tuple(argv), image=there.files(info.id),
            image_id=info.id, what=what, cwd=cwd, jobs_dir=str(there.jobs),
            runtime=opts.runtime, nodes=opts.nodes, gpus_per_node=opts.gpus_per_node,
            partition=partition, time=time_limit, env=tuple(env.items()),
        )  # fmt: skip
        script = batch_script(inputs)
        verdict = slurm.test_only(script)
        if opts.dry_run:
            sys.stdout.write(script)
            sys.stdout.flush()
            say(f"sbatch --test-only on {login.host}: {verdict}")
            return 0
        local = cache_copies()
        if local is None:
            raise SlurmError("slurm run --login writes the image here first, and there is no "
                             "cache directory (set HOME or XDG_CACHE_HOME)")  # fmt: skip
        local.root.parent.mkdir(parents=True, exist_ok=True)
        local.root.mkdir(mode=0o700, exist_ok=True)
        files = image.ensure(eng, chosen.image, info, local, say, cwd)
    finally:
        eng.close()
    if opts.runtime == "charliecloud":
        check_mount_point(files.squashfs, cwd)
    upload(login, files, inputs.image, prepared)
    copy = jobdir.JobDir(login, opts.cwd, cwd)
    copy.send()
    job_id = slurm.submit(script)
    out = output_path(str(there.jobs), job_id)
    say(f"submitted batch job {job_id} on {login.host} ({opts.nodes} node(s), runtime "
        f"{opts.runtime}); output: {out}")  # fmt: skip
    if opts.detach:
        copy.report()
        detached_note(f"{login.who}:{cwd}")
        print(job_id)
        return 0
    ended = False
    try:
        code = attach(slurm, job_id, Path(out), tail=RemoteOutput(login, out))
        ended = True
    finally:
        jobdir.brought_back(copy, ended)
    return code


def cache_copies() -> Shared | None:
    """Where the SquashFS is written here before it is sent: the cache's `slurm-login/`
    (None without a cache directory). `gpuenv prune --login` lists it too."""
    from gpuenv.run.slurm.image import Shared
    from gpuenv.store.cache import cache_dir

    home = cache_dir()
    return Shared(home / "slurm-login") if home is not None else None


class RemoteOutput:
    """The job's output file there, read from an offset (`tail -c +N`) for follow()."""

    def __init__(self, login: Login, path: str) -> None:
        self.login, self.path = login, path

    def __call__(self, offset: int, out: BinaryIO) -> int:
        proc = ssh.run(self.login, ["tail", "-c", f"+{offset + 1}", "--", self.path],
                       "reading the job's output", check=False)  # fmt: skip
        if proc.returncode != 0:
            return offset  # not there yet
        out.write(proc.stdout)
        out.flush()
        return offset + len(proc.stdout)


def detached_note(where: str) -> None:
    print(f"gpuenv: the job's files stay in {where}: gpuenv brings them back only when it "
          "follows the job", file=sys.stderr)  # fmt: skip


__all__ = ["Prepared", "RemoteOutput", "cache_copies", "parse_prepared", "prepare",
           "shared_there", "submit", "to_send", "upload"]  # fmt: skip
