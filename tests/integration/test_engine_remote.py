"""gpuenv against a remote engine over a real network link with TLS
(support/netns_engine.py: dockerd in a network namespace, reached through a veth pair at
tcp://10.231.x.2:2376 with client certificates): `doctor`, `run` and the build plan work
across it, and the link dropping mid-run gives one `error:` line and leaves no container on
either engine once the link is back. Builds across it: test_engine_anywhere.py.
"""

from __future__ import annotations

import json
import subprocess
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from support.cells import BASE_IMAGE, matrix_text, test_repository
from support.cli import GPUENV, clean_env
from support.engine import docker
from support.netns_engine import RemoteEngine, remote_engine
from support.private_engine import load_image

CELL = "tf2.21-py3.11-cpu"
NAME = test_repository("faults")


@pytest.fixture(scope="module")
def remote() -> Iterator[RemoteEngine]:
    with remote_engine() as engine:
        load_image(engine.sock, BASE_IMAGE)
        yield engine


def gpuenv(remote: RemoteEngine, *args: str, cwd: Path, timeout: float = 300,
           **extra: str) -> subprocess.CompletedProcess[str]:  # fmt: skip
    env = clean_env(**{"XDG_CACHE_HOME": str(cwd / ".cache"), **remote.env(), **extra})
    return subprocess.run([*GPUENV, *args], cwd=cwd, env=env, capture_output=True, text=True,
                          timeout=timeout, check=False)  # fmt: skip


def one_error(stderr: str) -> str:
    assert "Traceback" not in stderr, stderr[-3000:]
    errors = [line for line in stderr.splitlines() if line.startswith("error:")]
    assert len(errors) == 1, f"expected one error: line: {stderr[-2000:]}"
    return errors[0]


def test_doctor_across_tls(remote: RemoteEngine, tmp_path: Path) -> None:
    (tmp_path / "matrix.yaml").write_text(matrix_text(name=NAME, variants=("cpu",)))
    proc = gpuenv(remote, "doctor", cwd=tmp_path)
    assert "Traceback" not in proc.stderr
    text = proc.stdout + proc.stderr
    assert proc.returncode in (0, 1), text[-2000:]  # 1: findings (no GPU here), not a crash
    assert "cannot reach" not in text and "CERTIFICATE" not in text, text[-2000:]
    # And the same without the client certificate: refused, one line.
    bad = gpuenv(remote, "doctor", cwd=tmp_path, DOCKER_CERT_PATH=str(tmp_path))
    assert bad.returncode != 0 and "Traceback" not in bad.stderr, bad.stderr[-2000:]


def test_run_across_tls(remote: RemoteEngine, tmp_path: Path) -> None:
    proc = gpuenv(remote, "run", "-i", BASE_IMAGE, "--", "sh", "-c",
                  "echo hello from $(hostname); exit 3", cwd=tmp_path)  # fmt: skip
    assert proc.returncode == 3, proc.stderr[-2000:]
    assert "hello from" in proc.stdout
    assert remote.containers() == []


def test_run_output_is_live_across_tls(remote: RemoteEngine, tmp_path: Path) -> None:
    """The first line arrives while the workload still runs (the SDK's reader held it back
    until the container ended: TLS-decrypted bytes do not wake its poll)."""
    env = clean_env(**{"XDG_CACHE_HOME": str(tmp_path / ".cache"), **remote.env()})
    argv = [*GPUENV, "run", "-i", BASE_IMAGE, "--", "sh", "-c", "echo first; sleep 4; echo last"]
    start = time.monotonic()
    proc = subprocess.Popen(argv, cwd=tmp_path, env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE)  # fmt: skip
    assert proc.stdout is not None
    first = proc.stdout.readline()
    first_at = time.monotonic() - start
    rest = proc.stdout.read()
    ended_at = time.monotonic() - start
    proc.wait(timeout=60)
    assert (first, rest) == (b"first\n", b"last\n")
    assert ended_at - first_at > 3, f"first line at {first_at:.1f} s, end at {ended_at:.1f} s"


def test_up_to_date_across_tls(remote: RemoteEngine, tmp_path: Path) -> None:
    """The plan reads the image on the remote engine and leaves it: a build there of a cell
    whose image carries the plan's spec hash is a no-op. (Builds themselves across TLS, and
    across the other engines users have: test_engine_anywhere.py.)"""
    (tmp_path / "matrix.yaml").write_text(matrix_text(name=NAME, variants=("cpu",)))
    plan = gpuenv(remote, "build", CELL, "--dry-run", "--json", cwd=tmp_path)
    assert plan.returncode == 0, plan.stderr
    cell = json.loads(plan.stdout)["cells"][0]
    assert cell["action"] == "build"
    ctx = tmp_path / "standin"
    ctx.mkdir()
    (ctx / "Dockerfile").write_text(
        f"FROM {BASE_IMAGE}\nLABEL io.gpuenv.spec-hash={cell['spec_hash']}\n"
    )
    remote.docker("build", "-q", "--network", "none", "-t", f"{NAME}:{CELL}", str(ctx))
    try:
        built = gpuenv(remote, "build", CELL, "--json", cwd=tmp_path)
        assert built.returncode == 0, built.stderr[-2000:]
        result = json.loads(built.stdout)["results"][0]
        assert result["status"] == "cached", result
        assert remote.containers() == []
    finally:
        remote.docker("rmi", f"{NAME}:{CELL}", check=False)


def test_link_down_mid_run(remote: RemoteEngine, tmp_path: Path) -> None:
    """The link drops while a run streams: gpuenv notices (no answer to its pings for 10 s),
    waits for the engine to come back to remove the container, and says so in one line."""
    env = clean_env(XDG_CACHE_HOME=str(tmp_path / ".cache"), **remote.env())
    out, err = tmp_path / "out", tmp_path / "err"
    with out.open("wb") as o, err.open("wb") as e:
        argv = [*GPUENV, "run", "-i", BASE_IMAGE, "--", "sh", "-c", "echo ready; sleep 300"]
        proc = subprocess.Popen(argv, cwd=tmp_path, env=env, stdout=o, stderr=e,
                                stdin=subprocess.DEVNULL, start_new_session=True)  # fmt: skip
    try:
        deadline = time.monotonic() + 60
        while "ready" not in out.read_text() and proc.poll() is None:
            assert time.monotonic() < deadline, err.read_text()[-2000:]
            time.sleep(0.1)
        running = remote.containers()
        assert len(running) == 1, running
        cid = running[0].split()[0]
        remote.link_down()
        # Back after 16 s: gpuenv has given up on the stream by then (10 s without an
        # answer) and is waiting (up to 30 s) to remove the container.
        timer = threading.Timer(16, remote.link_up)
        timer.start()
        try:
            code = proc.wait(timeout=120)
        finally:
            timer.join()
            remote.link_up()
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    stderr = err.read_text()
    assert code == 125, stderr[-2000:]
    line = one_error(stderr)
    assert "lost the Docker Engine" in line, line
    # No orphan on either side: not on the remote engine, not on the local one.
    assert remote.docker("ps", "-aq", "--no-trunc", "--filter", f"id={cid}").stdout.strip() == ""
    assert remote.containers() == []
    assert docker("ps", "-aq", "--filter", f"id={cid}", check=False).stdout.strip() == ""
