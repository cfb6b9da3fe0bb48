"""The image on shared storage (gpuenv/run/slurm/image.py): its layout, what enroot reads
inside it, and the tar stream rewritten on its way to tar2sqfs. Writing a real SquashFS
from the engine is shown in tests/integration/test_engine_slurm.py."""

from __future__ import annotations

import io
import os
import tarfile
from pathlib import Path

import pytest

from gpuenv.engine.client import ImageInfo
from gpuenv.run.slurm import SlurmError
from gpuenv.run.slurm.image import Shared, environment_lines, rc_script, rewrite, shared_dir

ID = "sha256:" + "ab" * 32


def exported(*members: tuple[str, bytes | None]) -> list[bytes]:
    """A tar as `docker export` streams it, cut into odd-sized chunks."""
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w", format=tarfile.PAX_FORMAT) as tar:
        for name, data in members:
            info = tarfile.TarInfo(name)
            if data is None:
                info.type = tarfile.DIRTYPE
                tar.addfile(info)
            else:
                info.size, info.mtime = len(data), 1_700_000_000
                tar.addfile(info, io.BytesIO(data))
    raw = buf.getvalue()
    return [raw[i : i + 777] for i in range(0, len(raw), 777)]


def test_layout():
    files = Shared(Path("/scratch")).files(ID)
    stem = f"/scratch/gpuenv-{os.getuid()}/images/" + "ab" * 32
    assert (files.squashfs, files.env_file, files.shell_env_file) == (
        f"{stem}.sqfs",
        f"{stem}.env",
        f"{stem}.sh.env",
    )


def test_shared_dir_required(monkeypatch, tmp_path):
    monkeypatch.delenv("GPUENV_SLURM_SHARED", raising=False)
    with pytest.raises(SlurmError, match=r"--shared DIR or \$GPUENV_SLURM_SHARED"):
        shared_dir(None)
    with pytest.raises(SlurmError, match="no such directory"):
        shared_dir(str(tmp_path / "missing"))
    monkeypatch.setenv("GPUENV_SLURM_SHARED", str(tmp_path))
    assert shared_dir(None).jobs == tmp_path / f"gpuenv-{os.getuid()}" / "jobs"


def test_rewrite_leaves_out_docker_leftovers_and_adds_enroots_files():
    chunks = exported(
        (".dockerenv", b""), ("dev", None), ("dev/console", b""), ("etc", None),
        ("etc/environment", b"old\n"), ("etc/hostname", b""), ("usr", None),
        ("usr/bin", None), ("usr/bin/tool", b"#!/bin/sh\n"),
    )  # fmt: skip
    sink = io.BytesIO()
    rewrite(iter(chunks), sink, {"etc/environment": b"A=1\n", "etc/rc": b'exec "$@"\n'})
    sink.seek(0)
    with tarfile.open(fileobj=sink) as tar:
        members = {m.name: m for m in tar.getmembers()}
        got = {n: tar.extractfile(m).read() for n, m in members.items() if m.isreg()}
    assert sorted(members) == ["dev", "etc", "etc/environment", "etc/hostname", "etc/rc",
                               "usr", "usr/bin", "usr/bin/tool"]  # fmt: skip
    assert got["etc/environment"] == b"A=1\n" and got["usr/bin/tool"] == b"#!/bin/sh\n"
    assert members["etc/rc"].mode == 0o755 and members["etc/rc"].mtime == 0


def test_environment_as_enroot_writes_it():
    info = ImageInfo(ID, env=("PATH=/opt/venv/bin:/usr/bin", "NOTE=a b", "BROKEN"))
    assert environment_lines(info) == ["PATH=/opt/venv/bin:/usr/bin", "NOTE=a b"]


def test_rc_without_entrypoint_runs_the_command_given():
    rc = rc_script(ImageInfo(ID, working_dir="/work"))
    assert "cd /work && unset OLDPWD || exit 1" in rc
    assert 'exec "$@"\nelse\n    exec /bin/sh\n' in rc


def test_rc_with_entrypoint_and_cmd():
    rc = rc_script(ImageInfo(ID, entrypoint=("/init", "--quiet"), cmd=("python", "a b.py")))
    assert "cd / && unset OLDPWD" in rc
    assert "exec /init --quiet \"$@\"\nelse\n    exec /init --quiet python 'a b.py'\n" in rc
