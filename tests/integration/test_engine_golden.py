"""The golden record: one small locked cell, the base it is built on, and the image it must
give on any machine, any day (issue 43). CI rebuilds it on every run.

golden/ holds the cell (a JAX 0.7 CPU cell: matrix.yaml, matrix.lock) and record.json.gz,
written by `gpuenv build --reproducible --no-cache --record` when it was recorded: the image
ID, and per layer its diff ID and every file (mode, owner, mtime, content digest). Its base
is ../shared/repro's saved bookworm base (bootstrapped 2026-11-28), loaded here under a tag
of its own, never over the shared gpuenv/debian:bookworm.

- The cell rebuilt with `--expect record.json.gz` gives the recorded image ID; otherwise the
  build fails naming the first layer that differs and its files.
- The same lock built again with what must not matter varied, all at once: every process of
  the build steps sees a date 400 days on (libfaketime preloaded through /etc/ld.so.preload in
  a test-only copy of the base), on another engine (a private dockerd with the vfs storage
  driver, pinned to one CPU), by another user (nobody) with umask 077, another HOME, cache
  and project path, time zone and locale, the wheels sent from the client instead of fetched
  near the engine. The layers above the base must be the recorded ones, and the faked build
  day appears in no file of them. What cannot be varied here (the kernel, the filesystem's
  directory order under overlay2, the machine's architecture) is said in docs/locking.md.
"""

from __future__ import annotations

import contextlib
import io
import json
import lzma
import os
import re
import shutil
import subprocess
import sys
import tarfile
import tempfile
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest
import yaml
from support.cells import REPO
from support.cli import GPUENV, clean_env, gpuenv_cmd, output
from support.engine import docker
from support.private_engine import PrivateEngine, load_image, private_engine

pytestmark = pytest.mark.engine

GOLDEN = Path(__file__).parent / "golden"
CELL = "jax0.7-py3.11-cpu"
SAVED_BASE = REPO.parent / "shared" / "repro" / "gpuenv-debian-bookworm.tar.xz"
# The saved base's image ID (docker load gives it on any engine) and the tag it gets here:
# fixed, since a cell's labels name its base, and owned by this module alone.
BASE_ID = "sha256:bfa45d5b27c0a966be57332912bcdc4dbe765ae7d766c27d2f6cc6ccbe64a13d"
BASE = "gpuenv-golden/debian:bookworm-20261128"
IMAGE = f"gpuenv-golden/jax07:{CELL}"
FAKETIME = Path("/usr/lib/x86_64-linux-gnu/faketime/libfaketimeMT.so.1")
SHIFT_DAYS = 400
NOBODY = 65534


def _record() -> dict:
    import gzip

    return json.loads(gzip.decompress((GOLDEN / "record.json.gz").read_bytes()))


def _load_saved_base(host: str | None = None) -> None:
    """The saved base, tagged BASE only: its manifest's own tag (gpuenv/debian:bookworm)
    is replaced, so the engine's shared base is left as it is."""
    if not SAVED_BASE.exists():
        pytest.fail(f"{SAVED_BASE} is missing: the golden record is built on it (../shared)")
    with lzma.open(SAVED_BASE) as xz, tarfile.open(fileobj=xz, mode="r|") as src:
        out = io.BytesIO()
        with tarfile.open(fileobj=out, mode="w") as dst:
            for member in src:
                if member.name == "repositories":
                    continue
                data = src.extractfile(member) if member.isreg() else None
                if member.name == "manifest.json" and data is not None:
                    manifest = json.load(data)
                    manifest[0]["RepoTags"] = [BASE]
                    raw = json.dumps(manifest).encode()
                    member.size, data = len(raw), io.BytesIO(raw)
                dst.addfile(member, data)
    argv = ["-H", host] if host else []
    proc = subprocess.run(["docker", *argv, "load"], input=out.getvalue(), capture_output=True,
                          check=False)  # fmt: skip
    assert proc.returncode == 0, proc.stderr.decode(errors="replace")
    loaded = docker("image", "inspect", "-f", "{{.Id}}", BASE, host=host).stdout.strip()
    assert loaded == BASE_ID, f"{SAVED_BASE} loaded as {loaded}, not the recorded base"


@pytest.fixture(scope="module")
def golden_base() -> Iterator[str]:
    _load_saved_base()
    yield BASE
    docker("rmi", BASE, check=False)


def _project(tmp: Path, base: str = BASE) -> Path:
    root = tmp / "project"
    root.mkdir()
    (root / "matrix.yaml").write_text((GOLDEN / "matrix.yaml").read_text().replace(BASE, base))
    shutil.copy(GOLDEN / "matrix.lock", root / "matrix.lock")
    return root


def test_the_golden_cell_rebuilds_into_the_recorded_image(golden_base, tmp_path):
    root = _project(tmp_path)
    env = clean_env(XDG_CACHE_HOME=str(tmp_path / "cache"), GPUENV_NEAR_FETCH="auto")
    try:
        proc = gpuenv_cmd("build", "--no-cache", "--json", "--expect",
                          str(GOLDEN / "record.json.gz"), CELL, cwd=root, env=env,
                          check=False)  # fmt: skip
        assert proc.returncode == 0, output(proc)
        (result,) = json.loads(proc.stdout)["results"]
        assert result["image_id"] == _record()["cells"][CELL]["id"]
    finally:
        docker("rmi", IMAGE, check=False)


# ---------------------------------------------------------------- the varied build


def _fake_day() -> datetime:
    return datetime.now(UTC) + timedelta(days=SHIFT_DAYS)


def _date_patterns(day: datetime) -> re.Pattern[bytes]:
    """The day as programs write it: ISO, compact, and shadow's day number (:20794:)."""
    days = [day + timedelta(days=d) for d in (-1, 0, 1)]  # a build across midnight
    forms = [d.strftime(f).encode() for d in days for f in ("%Y-%m-%d", "%Y%m%d")]
    forms += [f":{int(d.timestamp()) // 86400}:".encode() for d in days]
    return re.compile(b"|".join(re.escape(f) for f in forms))


@contextlib.contextmanager
def _faketime_engine(tmp: Path) -> Iterator[tuple[PrivateEngine, str]]:
    """A private engine (vfs, one CPU) holding the golden base and its faketime copy."""
    if not FAKETIME.exists():
        pytest.fail(f"{FAKETIME} is missing: scripts/engine.sh --labs installs libfaketime")
    # vfs copies every layer whole: the cell's 0.7 GB, several times over (sparse file).
    vfs = ("--storage-driver", "vfs")
    with private_engine("gpuenv-gold-", options=vfs, cpus="0", disk_mb=16384) as pe:
        load_image(pe.host, BASE)
        context = tmp / "faketime"
        context.mkdir()
        shutil.copy(FAKETIME, context / FAKETIME.name)
        (context / "Dockerfile").write_text(
            f"FROM {BASE}\nCOPY {FAKETIME.name} {FAKETIME}\n"
            f"RUN echo {FAKETIME} > /etc/ld.so.preload && echo +{SHIFT_DAYS}d > /etc/faketimerc\n"
        )
        shifted = "gpuenv-golden/faketime:bookworm"
        proc = subprocess.run(
            ["docker", "-H", pe.host, "build", "-q", "--network", "none", "-t", shifted,
             str(context)], capture_output=True, text=True, check=False,
            env={**os.environ, "DOCKER_BUILDKIT": "0"},
        )  # fmt: skip
        assert proc.returncode == 0, output(proc)
        yield pe, shifted


def _as_nobody(argv: list[str], staging: Path) -> list[str]:
    """argv run as nobody, with umask 077. gpuenv's interpreter may live where nobody cannot
    go (pyenv under /root, 0700, on these machines): in a mount namespace of the command's
    own, each such closed directory is covered by an open one holding only the trees the
    command needs (the interpreter, the virtualenv, the checkout). Nothing else changes."""
    needed = {Path(sys.executable).resolve(), Path(sys.prefix), REPO}
    covers: dict[Path, set[Path]] = {}
    for path in needed:
        closed = next((a for a in reversed(path.parents) if a != Path("/")
                       and not a.stat().st_mode & 0o001), None)  # fmt: skip
        if closed is not None:
            covers.setdefault(closed, set()).add(closed / path.relative_to(closed).parts[0])
    steps = ["mount --make-rprivate /"]
    for n, (closed, inners) in enumerate(sorted(covers.items())):
        held = [(inner, staging / f"{n}-{i}") for i, inner in enumerate(sorted(inners))]
        steps += [f"mkdir -p {kept} && mount --bind {inner} {kept}" for inner, kept in held]
        steps.append(f"mount -t tmpfs -o mode=0755 tmpfs {closed}")
        steps += [f"mkdir -p {inner} && mount --bind {kept} {inner}" for inner, kept in held]
    drop = (f'exec setpriv --reuid={NOBODY} --regid={NOBODY} --clear-groups '
            f'sh -c \'umask 077; exec "$@"\' sh "$@"')  # fmt: skip
    return ["unshare", "--mount", "sh", "-c", " && ".join([*steps, drop]), "sh", *argv]


def _shifted_lock(root: Path, pe: PrivateEngine, cache: Path) -> None:
    """The golden lock with the shifted base pinned in place of the golden one: its cells
    (the resolution) are the golden lock's, byte for byte."""
    relocked = gpuenv_cmd("lock", "--exclude-newer", "2026-11-20", cwd=root, host=pe.host,
                          env=clean_env(XDG_CACHE_HOME=str(cache)), check=False)  # fmt: skip
    assert relocked.returncode == 0, output(relocked)
    lock = yaml.safe_load((GOLDEN / "matrix.lock").read_text())
    lock["bases"] = yaml.safe_load((root / "matrix.lock").read_text())["bases"]
    (root / "matrix.lock").write_text(yaml.safe_dump(lock, sort_keys=False))


def test_a_varied_build_gives_the_recorded_layers(tmp_path):
    """Nothing but the lock and the recipe decides the layers above the base."""
    from gpuenv.building import layerfiles

    record = _record()["cells"][CELL]
    _load_saved_base()  # the shared engine's copy, for load_image below
    # Where nobody may go: not under pytest's tmp_path (0700).
    work = Path(tempfile.mkdtemp(prefix="gpuenv-varied-", dir="/tmp"))
    try:
        with _faketime_engine(tmp_path) as (pe, shifted):
            # What is varied is really in effect where the build steps run.
            script = "date +%F; nproc; python3 -c 'import time; print(time.strftime(\"%F\"))'"
            seen = pe.docker("run", "--rm", "--network", "none", shifted, "sh", "-c",
                             script).stdout.split()  # fmt: skip
            days = {(_fake_day() - timedelta(days=d)).strftime("%Y-%m-%d") for d in (0, 1)}
            assert seen[0] in days and seen[2] == seen[0] and seen[1] == "1", seen
            assert pe.docker("info", "-f", "{{.Driver}}").stdout.strip() == "vfs"

            root = _project(work, shifted)
            _shifted_lock(root, pe, tmp_path / "lockcache")
            home = work / "home"
            home.mkdir()
            for path in (work, root, *root.rglob("*"), home, pe.sock):
                os.chown(path, NOBODY, NOBODY)
            pe.root.chmod(0o711)  # the socket's directory
            env = clean_env(HOME=str(home), XDG_CACHE_HOME=str(home / "elsewhere"),
                            USER="nobody", LOGNAME="nobody", TZ="Pacific/Kiritimati",
                            LANG="C.UTF-8", LC_ALL="C.UTF-8", GPUENV_NEAR_FETCH="client",
                            DOCKER_HOST=pe.host)  # fmt: skip
            env.pop("DOCKER_CONFIG", None)
            argv = _as_nobody([*GPUENV, "build", "--reproducible", "--json", CELL], work / "b")
            proc = subprocess.run(argv, cwd=root, env=env, capture_output=True, text=True,
                                  timeout=1800, check=False)  # fmt: skip
            assert proc.returncode == 0, output(proc)

            saved = work / "image.tar"
            pe.docker("save", "-o", str(saved), f"gpuenv-golden/jax07:{CELL}")
            below = json.loads(pe.docker("image", "inspect", "-f", "{{json .RootFS.Layers}}",
                                         shifted).stdout)  # fmt: skip
            image = layerfiles.Saved(saved)
            try:
                _check_layers(record, image, len(below))
            finally:
                image.tar.close()
    finally:
        docker("rmi", BASE, check=False)
        shutil.rmtree(work, ignore_errors=True)


def _check_layers(record: dict, image, below: int) -> None:
    """The layers above the (shifted) base are the recorded ones above the golden base, and
    the faked build day is in no file of them."""
    from gpuenv.building import layerfiles

    want = [layer["diff_id"] for layer in record["layers"][1:]]
    got = image.diff_ids[below:]
    for i, (a, b) in enumerate(zip(want, got, strict=False)):
        if a != b:
            files = layerfiles.differences(layerfiles.recorded_files(record["layers"][i + 1]),
                                           image.files(below + i))  # fmt: skip
            pytest.fail(f"layer {i + 1} above the base differs:\n" + "\n".join(files))
    assert got == want
    dated = _date_patterns(_fake_day())
    for i in range(below, len(image.diff_ids)):
        for name, data in image.contents(i):
            assert not dated.search(data), f"{name} holds the build day"
