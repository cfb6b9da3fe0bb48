"""The pure parts of gpuenv's fault handling (the faults themselves are injected on a real
engine: tests/integration/test_engine_faults.py and test_engine_remote.py)."""

from __future__ import annotations

import json
import os
import stat
import threading
from pathlib import Path
from typing import Any

import pytest

from gpuenv.cli.signals import Terminated, interrupted_code
from gpuenv.engine.client import EngineError, engine_error
from gpuenv.engine.transport import _frames, _pin_engine_ca
from gpuenv.run import local as run
from gpuenv.store import cache
from gpuenv.validate import sizes

# ----------------------------------------------------------------- interrupted: 130 or 143


def test_sigterm_exits_143_and_ctrl_c_130() -> None:
    assert interrupted_code(Terminated()) == 143
    assert interrupted_code(KeyboardInterrupt()) == 130
    try:  # Click wraps the interrupt in Abort: the cause still says which signal
        try:
            raise Terminated()
        except KeyboardInterrupt as exc:
            raise RuntimeError("abort") from exc
    except RuntimeError as wrapped:
        assert interrupted_code(wrapped) == 143


# ----------------------------------------------------------------- the TLS attach stream


class _ChunkedSocket:
    """recv() hands out the bytes in the given chunks (as a network splits them)."""

    def __init__(self, chunks: list[bytes]) -> None:
        self.chunks = list(chunks)

    def recv(self, n: int) -> bytes:
        return self.chunks.pop(0) if self.chunks else b""


def _frame(kind: int, payload: bytes) -> bytes:
    return bytes([kind, 0, 0, 0]) + len(payload).to_bytes(4, "big") + payload


def test_frames_split_anywhere_are_reassembled() -> None:
    data = _frame(1, b"ready\n") + _frame(2, b"warn\n") + _frame(1, b"x" * 70000)
    for cut in (1, 3, 8, 9, 13, 20, len(data) - 1):
        sock = _ChunkedSocket([data[:cut], data[cut:]])
        got = list(_frames(lambda s=sock: s.recv(65536)))
        assert got == [(b"ready\n", None), (None, b"warn\n"), (b"x" * 70000, None)], cut


def test_frames_a_truncated_stream_ends_without_a_partial_frame() -> None:
    data = _frame(1, b"whole\n") + _frame(1, b"cut short")[:-3]
    sock = _ChunkedSocket([data])
    assert list(_frames(lambda: sock.recv(65536))) == [(b"whole\n", None)]


# ----------------------------------------------------------------- a TLS engine's own CA


class _Api:
    verify = "/certs/ca.pem"

    def merge_environment_settings(self, *args: Any) -> dict[str, Any]:
        return {
            "verify": "/etc/ssl/certs/ca-certificates.crt"
        }  # what requests makes of $REQUESTS_CA_BUNDLE


def test_the_engine_ca_wins_over_requests_ca_bundle() -> None:
    api = _Api()
    _pin_engine_ca(api)
    assert api.merge_environment_settings("u", {}, False, None, None)["verify"] == "/certs/ca.pem"


def test_without_tls_nothing_is_pinned() -> None:
    api = _Api()
    api.verify = True  # type: ignore[assignment]
    _pin_engine_ca(api)
    assert api.merge_environment_settings("u", {}, False, None, None)["verify"].endswith(".crt")


def test_a_broken_stream_is_an_unreachable_engine() -> None:
    exc = engine_error(Exception("('Connection broken: IncompleteRead(0 bytes read)', ...)"))
    assert "cannot reach the Docker Engine" in exc.message


# ----------------------------------------------------------------- atomic files


def test_size_baseline_survives_a_failed_write(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = tmp_path / "matrix.sizes.json"
    sizes.record(path, {"a": 1})
    before = path.read_bytes()
    assert stat.S_IMODE(path.stat().st_mode) & 0o044, "not mkstemp's 0600"

    def boom(*args: Any) -> None:
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(os, "replace", boom)
    with pytest.raises(OSError):
        sizes.record(path, {"b": 2})
    assert path.read_bytes() == before
    assert [p.name for p in tmp_path.iterdir()] == ["matrix.sizes.json"]  # no temporary file
    monkeypatch.undo()
    sizes.record(path, {"b": 2})
    assert json.loads(path.read_text()) == {"a": 1, "b": 2}


def test_cache_record_leaves_no_temporary_file(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    assert cache.write_record("drivers.json", {"x": 1})

    def boom(*args: Any) -> None:
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(os, "replace", boom)
    assert not cache.write_record("drivers.json", {"x": 2})
    assert sorted(p.name for p in (tmp_path / "gpuenv").iterdir()) == ["drivers.json"]


# ----------------------------------------------------------------- a run's engine goes away


class _Pinged:
    """The fake engine's ping, counted (a mixin for FakeEngine in the tests below)."""

    pings = 0

    def ping(self, timeout: float) -> bool:
        self.pings += 1
        return bool(self.reachable)  # type: ignore[attr-defined]


def _engine(fake_engine: Any, *, local: bool, reachable: bool) -> Any:
    engine = type("Counted", (_Pinged, fake_engine), {})()
    engine.is_local, engine.reachable = local, reachable
    return engine


def _reader(seconds: float) -> tuple[threading.Thread, threading.Event]:
    """A reader that ends after `seconds` (a stream blocked on a dropped link: set the
    event to end it)."""
    done = threading.Event()
    reader = threading.Thread(target=done.wait, args=(seconds,), daemon=True)
    reader.start()
    return reader, done


@pytest.fixture
def quick_heartbeat(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(run, "HEARTBEAT_SECONDS", 0.02)
    monkeypatch.setattr(run, "LOST_AFTER_SECONDS", 0.1)


def test_a_run_gives_up_on_a_remote_engine_that_stopped_answering(
    fake_engine: Any, quick_heartbeat: None
) -> None:
    engine = _engine(fake_engine, local=False, reachable=False)
    reader, done = _reader(5)  # 5 s: fail, not hang
    try:
        with pytest.raises(EngineError, match="lost the Docker Engine"):
            run._watch(engine, reader)
    finally:
        done.set()
    assert engine.pings >= 2


def test_a_run_keeps_watching_a_remote_engine_that_answers(
    fake_engine: Any, quick_heartbeat: None
) -> None:
    """Past LOST_AFTER_SECONDS, while every ping is answered: the run goes on to its end."""
    engine = _engine(fake_engine, local=False, reachable=True)
    reader, _ = _reader(0.4)
    run._watch(engine, reader)
    assert not reader.is_alive(), "returned before the stream ended"
    assert engine.pings >= 5, "the remote engine was not watched"


def test_a_local_engine_slow_to_answer_does_not_end_the_run(
    fake_engine: Any, quick_heartbeat: None
) -> None:
    """A local socket closes when the engine dies, which ends the stream: no heartbeat, so
    an engine that does not answer pings for longer than LOST_AFTER_SECONDS (a busy host)
    leaves the workload running to its end."""
    engine = _engine(fake_engine, local=True, reachable=False)
    reader, _ = _reader(0.4)
    run._watch(engine, reader)
    assert not reader.is_alive() and engine.pings == 0


def test_a_container_the_engine_could_not_remove_is_named(
    fake_engine: Any, capsys: pytest.CaptureFixture[str]
) -> None:
    engine = fake_engine()
    engine.reachable = False
    run._remove(engine, "0123456789abcdef")
    err = capsys.readouterr().err
    assert "0123456789ab" in err and "docker rm -f" in err


# ----------------------------------------------------------------- a full disk


def test_a_full_disk_is_one_error_line_naming_the_file(tmp_path: Path) -> None:
    """A real ENOSPC: the export's target on a 4 kB tmpfs, in a mount namespace of its own
    (nothing of the host's is mounted or left); before, a traceback from tarfile."""
    import shutil
    import subprocess
    import sys

    if shutil.which("unshare") is None or os.geteuid() != 0:
        pytest.skip("needs root and unshare(1) for a private tmpfs (a mount namespace)")
    full = tmp_path / "full"
    full.mkdir()
    env = {**os.environ, "XDG_CACHE_HOME": str(tmp_path / "cache")}
    mount_then_run = 'mount -t tmpfs -o size=4k gpuenv-full "$0" && exec "$@"'
    export = [sys.executable, "-m", "gpuenv", "cache", "export", f"{full}/w.tar", "--no-bases"]
    argv = ["unshare", "--mount", "sh", "-c", mount_then_run, str(full), *export]
    proc = subprocess.run(argv, capture_output=True, text=True, env=env, timeout=60)
    assert proc.returncode == 1, proc.stderr
    assert "Traceback" not in proc.stderr and len(proc.stderr.splitlines()) == 1, proc.stderr
    assert proc.stderr.startswith(f"error: no space left on device: writing {full}/w.tar; ")
    assert not list(full.iterdir())  # the namespace's tmpfs went with it: nothing here


def test_a_full_disk_of_an_unnamed_file_names_where_gpuenv_writes(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    import errno

    from gpuenv.cli.common import out_of_space

    monkeypatch.setenv("TMPDIR", str(tmp_path / "tmp"))
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    monkeypatch.setattr("tempfile.tempdir", None)  # gettempdir() reads TMPDIR again
    (tmp_path / "tmp").mkdir()
    line = out_of_space(OSError(errno.ENOSPC, "No space left on device"))
    assert line.startswith("no space left on device: gpuenv writes temporary files under ")
    assert f"TMPDIR ({tmp_path / 'tmp'}) and its cache under {tmp_path / 'cache'}/gpuenv" in line
    assert out_of_space(OSError(errno.EDQUOT, "q")).startswith("disk quota exceeded: ")


# ----------------------------------------------------------------- a build cancelled as gpuenv ends

# A stand-in for `docker buildx build`: a step that runs until SIGINT (Engine.end_builds), on
# which it cancels as the docker CLI does; "first": cancelled already, before gpuenv's own
# interrupt (a terminal's Ctrl-C reaches the CLI too, and it may answer first).
_CANCELLED = 'echo "ERROR: failed to solve: Canceled: context canceled"; exit 1'
_CLIS = {
    "interrupt-first": f"echo '#5 [2/3] RUN uv pip install'\ntrap '{_CANCELLED}' INT\n"
    "while :; do sleep 0.02; done\n",
    "cancellation-first": f"echo '#5 [2/3] RUN uv pip install'\n{_CANCELLED}\n",
    "no-interrupt": f"echo '#5 [2/3] RUN uv pip install'\n{_CANCELLED}\n",
}


@pytest.mark.parametrize("order", list(_CLIS))
def test_a_build_cancelled_as_gpuenv_ends_is_the_interruption_in_either_order(
    fake_engine, write_matrix, minimal_matrix, tmp_path, monkeypatch, order: str
) -> None:
    """`build -j 2` and a signal: the docker CLI's cancellation ("context canceled") and
    gpuenv's own interrupt reach the build's result in either order, and either way nothing
    is reported as failed (the CLI says `error: ... interrupted` alone); a cancellation with
    no interrupt is still a failure. Each order is forced: the interrupt is raised where the
    main thread waits for the cells, once the build is running (interrupt first) or once its
    result was classified and reported (cancellation first)."""
    from concurrent.futures import Future

    from gpuenv.building import builder, results
    from gpuenv.engine import buildkit
    from tests.unit.test_plan import make

    cli = tmp_path / "docker-build"
    cli.write_text("#!/bin/sh\n" + _CLIS[order])
    cli.chmod(0o755)
    monkeypatch.setattr(buildkit, "buildkit_cli", lambda engine=None: ([str(cli)], {}))
    the_plan = make(fake_engine, write_matrix(minimal_matrix, "matrix.yaml"))
    running, classified = threading.Event(), threading.Event()

    class Engine(fake_engine):  # type: ignore[misc]
        builds = buildkit.Builds()

        def build_directory(self, build: Any, *, on_log: Any, **kw: Any) -> str:
            def log(line: str) -> None:
                running.set()
                on_log(line)

            return self.builds.build(self.url, build.directory, {}, False, "none", log)

        def end_builds(self) -> None:
            self.builds.end()

    class Sender:
        def context(self, p: Any, labels: dict[str, str]) -> Any:
            import contextlib

            from gpuenv.engine.client import BuildInput

            return contextlib.nullcontext(BuildInput(tmp_path, labels))

        def stop(self) -> None:
            pass

    class Interrupted(Future):  # type: ignore[type-arg]
        """The main thread's wait for a cell, interrupted at the point the order asks."""

        def set_result(self, result: Any) -> None:
            super().set_result(result)
            classified.set()

        def set_exception(self, exc: BaseException | None) -> None:
            super().set_exception(exc)
            classified.set()

        def result(self, timeout: float | None = None) -> Any:
            if threading.current_thread().name.startswith("gpuenv-build-") or order == (
                "no-interrupt"
            ):
                return super().result(timeout)
            assert (running if order == "interrupt-first" else classified).wait(20)
            raise KeyboardInterrupt

    reported: list[results.CellResult] = []

    class Reporter(results.Reporter):
        def finished(self, result: results.CellResult) -> None:
            reported.append(result)

    monkeypatch.setattr(builder, "Future", Interrupted)
    engine: Any = Engine()
    try:
        out = builder.execute(engine, the_plan, Reporter(), jobs=2, sender=Sender())  # type: ignore[arg-type]
    except KeyboardInterrupt:
        assert order != "no-interrupt"
        for thread in threading.enumerate():  # the cells' threads have had their say
            if thread.name.startswith("gpuenv-build-"):
                thread.join(20)
        assert [r.cell.name for r in reported if r.status == "failed"] == []
    else:
        assert order == "no-interrupt"
        assert [r.status for r in out] == ["failed", "skipped"]
        assert [r.error for r in reported if r.status == "failed"] == [
            "failed to solve: Canceled: context canceled"
        ]
