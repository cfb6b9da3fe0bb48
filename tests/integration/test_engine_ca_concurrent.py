"""Concurrent `gpuenv build`s share the CA server's loopback port instead of taking turns.

The port (127.0.0.1:47811) is part of the RUN line, so every build on a machine uses it.
Builds with the same bundle listen on it together (SO_REUSEPORT) and keep answering when
one of them ends; a build with another bundle waits for the port. Each build here is of a
small test matrix whose RUN lines are the shipped ones (the layer cache makes it seconds);
its tags are removed first, so the cells are built again (and the CA server is needed)."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
from support.cells import matrix_text
from support.cli import GPUENV, REPO, clean_env, output

from gpuenv.contract import CA_PORT

pytestmark = pytest.mark.engine

CELLS = ("tf2.21-py3.11-cpu", "tf2.21-py3.11-cuda12.5-gpu")


def bundle() -> Path:
    path = os.environ.get("PIP_CERT")
    if not path:
        pytest.skip("needs $PIP_CERT: builds reach the index through the TLS proxy")
    return Path(path)


def ca_port_answer() -> bytes | None:
    from gpuenv.ca import _fetch

    return _fetch(CA_PORT)


@pytest.fixture
def port_free() -> None:
    """The timings mean nothing while another session's build holds the port."""
    deadline = time.monotonic() + 120
    while ca_port_answer() is not None:
        if time.monotonic() > deadline:
            pytest.skip(f"127.0.0.1:{CA_PORT} stayed held by another build for 2 minutes")
        time.sleep(1)


@pytest.fixture
def matrices(tmp_path: Path, docker) -> dict[str, Path]:
    paths = {}
    for key in ("a", "b"):
        path = tmp_path / f"{key}.yaml"
        path.write_text(matrix_text(name=f"gpuenv-test/harden-{key}"), encoding="utf-8")
        paths[key] = path
    return paths


def untag(docker, matrix: Path) -> None:
    """Remove the matrix's tags, so that its cells need building (the layers stay cached)."""
    name = "gpuenv-test/harden-" + matrix.stem
    docker("rmi", *(f"{name}:{c}" for c in CELLS), check=False)


def start(matrix: Path) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [*GPUENV, "build", "-f", str(matrix), "--json"],
        cwd=REPO, env=clean_env(), text=True,
        stdout=subprocess.PIPE, stderr=subprocess.PIPE,
    )  # fmt: skip


def finish(proc: subprocess.Popen[str]) -> subprocess.CompletedProcess[str]:
    out, err = proc.communicate(timeout=600)
    done = subprocess.CompletedProcess(proc.args, proc.returncode, out, err)
    assert done.returncode == 0, output(done)
    return done


class Fetcher:
    """Fetches the CA from the port, as the install step does, while builds run; every
    answer must be the bundle (a refused connection is fine: nobody serves yet)."""

    def __init__(self) -> None:
        self.answers: list[bytes | None] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, daemon=True)

    def _loop(self) -> None:
        while not self._stop.is_set():
            self.answers.append(ca_port_answer())
            time.sleep(0.02)

    def __enter__(self) -> Fetcher:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()


def holder(ca: Path, seconds: float) -> subprocess.Popen[str]:
    """Another process's CA server (what a long build holds), serving ``ca`` for ``seconds``."""
    code = (
        "import sys, time; from pathlib import Path; from gpuenv.ca import CAServer\n"
        "with CAServer(Path(sys.argv[1]), wait_seconds=120):\n"
        "    print('ready', flush=True); time.sleep(float(sys.argv[2]))\n"
    )
    proc = subprocess.Popen(
        [sys.executable, "-c", code, str(ca), str(seconds)],
        cwd=REPO, env=clean_env(), text=True, stdout=subprocess.PIPE,
    )  # fmt: skip
    assert proc.stdout is not None and proc.stdout.readline() == "ready\n"
    return proc


def test_two_builds_of_different_matrices_run_at_once(shipped_gpu, matrices, docker, port_free):
    """Both serve at once and are answered with the bundle. These builds are cached (the
    engine's CPU is their bottleneck), so the pair is not faster than one after the other;
    the timings are reported, and the next test shows what no longer waits."""
    ca = bundle().read_bytes()
    solo = {}
    for key, matrix in matrices.items():
        untag(docker, matrix)
        began = time.monotonic()
        finish(start(matrix))
        solo[key] = time.monotonic() - began
    for matrix in matrices.values():
        untag(docker, matrix)
    with Fetcher() as fetcher:
        began = time.monotonic()
        procs = [start(m) for m in matrices.values()]
        done = [finish(p) for p in procs]
        pair = time.monotonic() - began
    for proc in done:
        assert f"waiting for 127.0.0.1:{CA_PORT}" not in proc.stderr, output(proc)
        assert '"status": "built"' in proc.stdout
    served = [a for a in fetcher.answers if a is not None]
    assert served and all(a == ca for a in served), {a[:60] for a in served if a != ca}
    print(f"\nconcurrent builds: solo {solo['a']:.1f} s + {solo['b']:.1f} s = "
          f"{sum(solo.values()):.1f} s, pair {pair:.1f} s")  # fmt: skip


def test_builds_do_not_wait_for_a_long_build_with_the_same_bundle(
    shipped_gpu, matrices, docker, port_free
):
    """While another process serves the same bundle for 20 s (a long build's install step),
    three builds (the two matrices, one of them twice) share the port with it, finish long
    before it ends (they used to wait for it), and it leaves while they may still be fetching."""
    ca = bundle()
    hold = 20.0
    for matrix in matrices.values():
        untag(docker, matrix)
    began = time.monotonic()
    other = holder(ca, hold)
    with Fetcher() as fetcher:
        procs = [start(matrices["a"]), start(matrices["b"]), start(matrices["a"])]
        done = [finish(p) for p in procs]
        took = time.monotonic() - began
    assert other.wait(timeout=60) == 0
    for proc in done:
        assert f"sharing 127.0.0.1:{CA_PORT}" in proc.stderr, output(proc)
        assert "waiting for" not in proc.stderr
    served = [a for a in fetcher.answers if a is not None]
    assert served and all(a == ca.read_bytes() for a in served)
    print(f"\nthree builds beside a {hold:.0f} s build: {took:.1f} s (serialised: > {hold:.0f} s)")
    assert took < hold


def test_a_build_with_another_bundle_waits_for_the_port(
    shipped_gpu, matrices, docker, port_free, tmp_path
):
    other_ca = tmp_path / "other.pem"
    other_ca.write_bytes(bundle().read_bytes() + b"\n")  # valid, and not the same bytes
    other = holder(other_ca, 8)
    untag(docker, matrices["b"])
    began = time.monotonic()
    done = finish(start(matrices["b"]))
    took = time.monotonic() - began
    assert other.wait(timeout=60) == 0
    assert (
        f"waiting for 127.0.0.1:{CA_PORT}: another gpuenv build serves a different CA bundle"
        in done.stderr
    ), output(done)
    assert took > 5  # it waited for the other server to leave


def test_a_port_held_by_something_else_is_waited_for(shipped_gpu, matrices, docker, port_free):
    sock = socket.socket()
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # not SO_REUSEPORT: no sharing
    sock.bind(("127.0.0.1", CA_PORT))
    sock.listen()
    threading.Timer(5, sock.close).start()
    untag(docker, matrices["a"])
    done = finish(start(matrices["a"]))
    assert f"waiting for 127.0.0.1:{CA_PORT}: what listens there does not answer" in done.stderr
