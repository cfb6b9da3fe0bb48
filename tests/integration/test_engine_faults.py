"""Faults injected mid-operation, on a private engine (support/private_engine.py) that the
tests restart, fill up and share with nobody: the engine restarted during a build, a run
and a push; the registry killed mid-push; the disk filling during a build; SIGINT and
SIGTERM to `build -j 2`, `push`, `lock`, `validate` and `run` at several points.

After each (``Aftermath.check``): gpuenv printed one `error:` line and no traceback; the
engine holds no container and runs no install step (an abandoned build is cancelled); no
tag appeared but those a test expects (no half-built one); the previous image is still
tagged with the same ID; the gpuenv process left no temporary file (its TMPDIR is a
directory of the test's), no child process (the docker CLI it builds with included), no
listener (nothing listens with its PID); matrix.lock and the size baseline are
byte-identical.

Cost: the base (125 MB) is copied into the private engine once; the cells' wheels (two
TensorFlow releases) are fetched once into the module's own wheelhouse; builds are
interrupted in their first install step (BuildKit runs it as a process under the engine's
dockerd, not as a container `docker ps` lists: ``install_steps`` finds it there), and the
pushed image is a stand-in (the base plus a 200 MB random layer, labelled with the cell's
spec hash: push checks nothing else).
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import shutil
import signal
import subprocess
import tempfile
import time
import urllib.request
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

import pytest
from support import private_engine as private_engine_module
from support.cells import BASE_IMAGE, matrix_text, test_repository
from support.cli import GPUENV, clean_env
from support.private_engine import PrivateEngine, load_image, private_engine

REPO_NAME = test_repository("faults")
PUSH_NAME = test_repository("faults-push")
CELL = "tf2.21-py3.11-cpu"
CELL_B = "tf2.20-py3.11-cpu"
ERROR_LINE_TIMEOUT = 120


def poll(what: str, ready: Callable[[], object], timeout: float = 90, every: float = 0.2) -> None:
    deadline = time.monotonic() + timeout
    while not ready():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout} s waiting for {what}")
        time.sleep(every)


# --------------------------------------------------------------------------- fixtures


@pytest.fixture(scope="module")
def pe() -> Iterator[PrivateEngine]:
    # Two TensorFlow builds at once (`build -j 2`) now hold their contexts in the engine too
    # (2 x 600 MB of wheels, sent with BuildKit) beside two ~1.5 GB install layers: more
    # than the 4 GB support/private_engine.py gives. Sparse: only what is written counts.
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(private_engine_module, "DISK_MB", max(private_engine_module.DISK_MB, 8192))
        with private_engine() as engine:
            load_image(engine.host, BASE_IMAGE)
            yield engine


_PUT_DIGEST = re.compile(r"/blobs/uploads/\S*[?&]digest=(sha256(?::|%3[Aa])[0-9a-f]{64})")


def _size(path: Path) -> int:
    try:
        return path.stat().st_size
    except OSError:  # finished (moved into blobs) between the glob and the stat
        return 0


@dataclass
class Registry:
    """docker-registry on 127.0.0.1:PORT, killed and started again by PID by the tests."""

    workdir: Path
    port: int
    binary: str
    proc: subprocess.Popen[bytes] | None = None

    @property
    def host(self) -> str:
        return f"127.0.0.1:{self.port}"

    def start(self) -> None:
        log = (self.workdir / "registry.log").open("ab")
        self.proc = subprocess.Popen([self.binary, "serve", str(self.workdir / "config.yml")],
                                     stdin=subprocess.DEVNULL, stdout=log,
                                     stderr=subprocess.STDOUT, start_new_session=True)  # fmt: skip
        log.close()

        def answers() -> bool:
            try:
                with urllib.request.urlopen(f"http://{self.host}/v2/", timeout=2) as r:
                    return r.status == 200
            except OSError:
                return False

        poll("the registry to answer", answers, timeout=30)

    def kill(self) -> None:
        assert self.proc is not None
        os.kill(self.proc.pid, signal.SIGKILL)
        self.proc.wait(timeout=30)
        self.proc = None

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=20)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self.proc = None

    def blobs(self) -> int:
        """Complete blobs in the registry's storage."""
        return len(
            list((self.workdir / "storage").glob("docker/registry/v2/blobs/sha256/*/*/data"))
        )

    def uploads_in_flight(self) -> int:
        """Blob uploads begun and not finished: data received, not yet moved into blobs."""
        storage = self.workdir / "storage" / "docker/registry/v2/repositories"
        return sum(1 for f in storage.glob("**/_uploads/*/data") if _size(f) > 0)

    def layers(self) -> set[str]:
        """Digests of complete blobs big enough to be layers (an image config is a few KB)."""
        found = (self.workdir / "storage").glob("docker/registry/v2/blobs/sha256/*/*/data")
        return {f"sha256:{f.parent.name}" for f in found if _size(f) > 64 * 1024}

    def log_lines(self) -> int:
        return len((self.workdir / "registry.log").read_text(errors="replace").splitlines())

    def digests_completed(self, since_line: int) -> list[str]:
        """Blobs whose upload was completed (PUT ...?digest=) after the log's line `since_line`."""
        lines = (self.workdir / "registry.log").read_text(errors="replace").splitlines()
        found = (_PUT_DIGEST.search(line) for line in lines[since_line:] if "PUT /v2/" in line)
        return [m.group(1).replace("%3A", ":").replace("%3a", ":") for m in found if m]

    def uploads_started(self) -> int:
        """Blob uploads begun (access log: POST .../blobs/uploads/)."""
        log = (self.workdir / "registry.log").read_text(errors="replace")
        return sum(
            1 for line in log.splitlines() if "POST /v2/" in line and "/blobs/uploads/" in line
        )

    def tags(self, repository: str) -> list[str]:
        try:
            with urllib.request.urlopen(
                f"http://{self.host}/v2/{repository}/tags/list", timeout=10
            ) as r:
                return sorted(json.load(r).get("tags") or [])
        except OSError:
            return []


REGISTRY_CONFIG = """\
version: 0.1
log:
  level: info
storage:
  filesystem:
    rootdirectory: {root}
  delete:
    enabled: true
http:
  addr: 127.0.0.1:{port}
"""


@pytest.fixture(scope="module")
def registry() -> Iterator[Registry]:
    yield from _registry()


def _registry() -> Iterator[Registry]:
    import socket

    binary = shutil.which("docker-registry") or shutil.which("registry")
    if binary is None:
        pytest.skip("needs Debian's docker-registry (scripts/test.sh installs it)")
    workdir = Path(tempfile.mkdtemp(prefix="gpuenv-faults-registry-"))
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = int(s.getsockname()[1])
    (workdir / "config.yml").write_text(REGISTRY_CONFIG.format(root=workdir / "storage", port=port))
    reg = Registry(workdir, port, binary)
    try:
        reg.start()
        yield reg
    finally:
        reg.stop()
        shutil.rmtree(workdir, ignore_errors=True)


@pytest.fixture(scope="module")
def project(tmp_path_factory: pytest.TempPathFactory, pe: PrivateEngine) -> Path:
    """A directory with the build matrix (two CPU cells, so `build -j 2` builds two at once)
    and the push matrix (one cell, alias `latest`), a stand-in for each cell's previous image,
    and a size baseline."""
    d = tmp_path_factory.mktemp("faults")
    doc = json.loads(matrix_text(name=REPO_NAME, variants=("cpu",)))
    doc["matrix"]["tensorflow"] = ["2.20", "2.21"]
    (d / "matrix.yaml").write_text(json.dumps(doc, indent=2) + "\n")
    push_doc = json.loads(matrix_text(name=PUSH_NAME, variants=("cpu",)))
    push_doc["aliases"] = {"latest": CELL}
    (d / "push.yaml").write_text(json.dumps(push_doc, indent=2) + "\n")
    (d / "matrix.sizes.json").write_text(json.dumps({CELL: 123}, indent=2) + "\n")
    (d / "push.sizes.json").write_text(json.dumps({CELL: 456}, indent=2) + "\n")
    for cell in (CELL, CELL_B):
        pe.docker("tag", BASE_IMAGE, f"{REPO_NAME}:{cell}")  # "the previous good image"
    # The push cell: a stand-in carrying the spec hash the plan computes (all push checks).
    plan = gpuenv(pe, "build", "-f", str(d / "push.yaml"), CELL, "--dry-run", "--json", cwd=d)
    assert plan.returncode == 0, plan.stderr
    spec = next(c["spec_hash"] for c in json.loads(plan.stdout)["cells"] if c["cell"] == CELL)
    ctx = d / "standin"
    ctx.mkdir()
    (ctx / "Dockerfile").write_text(
        f"FROM {BASE_IMAGE}\nRUN head -c 200000000 /dev/urandom > /blob\n"
        f"LABEL io.gpuenv.spec-hash={spec} io.gpuenv.cell={CELL}\n"
    )
    pe.docker("build", "-q", "--network", "none", "-t", f"{PUSH_NAME}:{CELL}", str(ctx))
    return d


# --------------------------------------------------------------------------- running gpuenv


def gpuenv(pe: PrivateEngine, *args: str, cwd: Path, tmp: Path | None = None,
           timeout: float = 600) -> subprocess.CompletedProcess[str]:  # fmt: skip
    env = clean_env(DOCKER_HOST=pe.host, XDG_CACHE_HOME=str(cwd / ".cache"))
    if tmp is not None:
        env["TMPDIR"] = str(tmp)
    return subprocess.run([*GPUENV, *args], cwd=cwd, env=env, capture_output=True, text=True,
                          timeout=timeout, check=False)  # fmt: skip


@dataclass
class Running:
    """A gpuenv command in the background: its output in files, its own session (so its
    children can be found), its own TMPDIR."""

    proc: subprocess.Popen[bytes]
    out: Path
    err: Path
    tmp: Path

    def stderr(self) -> str:
        return self.err.read_text(errors="replace")

    def stdout(self) -> str:
        return self.out.read_text(errors="replace")

    def says(self, text: str) -> Callable[[], bool]:
        return lambda: (
            text in self.stderr() or text in self.stdout() or self.proc.poll() is not None
        )

    def finish(self, timeout: float = ERROR_LINE_TIMEOUT) -> int:
        try:
            return self.proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
            raise AssertionError(
                f"gpuenv did not end within {timeout} s: {self.stderr()[-2000:]}"
            ) from None


def _as_from_a_terminal() -> None:
    """In the child: SIGINT as a shell's foreground command gets it. A suite started in the
    background by a non-interactive shell (`cmd &`) inherits SIGINT ignored, and a process
    that inherits it ignored keeps it so (POSIX; Python then installs no KeyboardInterrupt):
    Ctrl-C would be tested on a process no terminal could send it to."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)


@pytest.fixture
def start(pe: PrivateEngine, project: Path, tmp_path: Path) -> Iterator[Callable[..., Running]]:
    started: list[Running] = []

    def launch(*args: str, env: dict[str, str] | None = None) -> Running:
        n = len(started)
        tmp = tmp_path / f"tmp{n}"
        tmp.mkdir()
        out, err = tmp_path / f"out{n}", tmp_path / f"err{n}"
        full = clean_env(**{"DOCKER_HOST": pe.host, "XDG_CACHE_HOME": str(project / ".cache"),
                            "TMPDIR": str(tmp), **(env or {})})  # fmt: skip
        with out.open("wb") as o, err.open("wb") as e:
            proc = subprocess.Popen([*GPUENV, *args], cwd=project, env=full, stdout=o, stderr=e,
                                    stdin=subprocess.DEVNULL, start_new_session=True,
                                    preexec_fn=_as_from_a_terminal)  # fmt: skip
        running = Running(proc, out, err, tmp)
        started.append(running)
        return running

    yield launch
    for r in started:  # a test that failed early: end what it started, by PID
        if r.proc.poll() is None:
            r.proc.kill()
            r.proc.wait()


# --------------------------------------------------------------------------- the aftermath


def _session_processes(sid: int) -> list[str]:
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
            fields = stat[stat.rindex(")") + 2 :].split()
            if int(fields[3]) == sid:  # field 6 of /proc/PID/stat: the session ID
                found.append(f"{entry.name} {(entry / 'cmdline').read_bytes()[:120]!r}")
        except (OSError, ValueError):
            continue
    return found


@dataclass
class Aftermath:
    pe: PrivateEngine
    project: Path
    allowed_tags: set[str] = field(default_factory=set)

    def _kept_files(self) -> list[Path]:
        """matrix.lock and the size baselines: they must come out byte-identical."""
        return sorted(self.project.glob("*.lock")) + sorted(self.project.glob("*.sizes.json"))

    def snapshot(self) -> dict[str, object]:
        return {
            "tags": {t: self.pe.image_id(t) for t in sorted(self.pe.tags())},
            "files": {p.name: p.read_bytes() for p in self._kept_files()},
        }

    def check(self, before: dict[str, object], run: Running, *, code: set[int],
              error: str | None = None) -> None:  # fmt: skip
        stderr = run.stderr()
        assert run.proc.returncode in code, f"exit {run.proc.returncode}: {stderr[-3000:]}"
        assert "Traceback" not in stderr and "Traceback" not in run.stdout(), stderr[-3000:]
        errors = [line for line in stderr.splitlines() if line.startswith("error:")]
        assert len(errors) == 1, f"expected one error: line, got {errors}: {stderr[-2000:]}"
        if error is not None:
            assert error in errors[0], errors[0]
        # First what gpuenv left running: a docker CLI still attached to an abandoned build
        # keeps it going. A child killed as gpuenv exits is reaped by init a moment later.
        with contextlib.suppress(AssertionError):
            poll("gpuenv's children to go", lambda: not _session_processes(run.proc.pid), 15)
        left = _session_processes(run.proc.pid)
        assert not left, f"processes left by gpuenv: {left}"
        # The engine cancels an abandoned build on its own time (a cancelled install step ends
        # in seconds; one left to run takes a minute): wait for its steps to go.
        poll("no container on the engine", lambda: not self.pe.containers(), timeout=60)
        poll("no install step on the engine", lambda: not install_steps(self.pe), timeout=30)
        after = self.snapshot()
        before_tags = before["tags"]
        assert isinstance(before_tags, dict)
        for tag, image in before_tags.items():  # the previous good images, still tagged
            assert after["tags"].get(tag) == image, (
                f"{tag}: was {image}, now {after['tags'].get(tag)}"
            )  # type: ignore[union-attr]
        new = set(after["tags"]) - set(before_tags) - self.allowed_tags  # type: ignore[arg-type]
        assert not new, f"tags that appeared: {new}"
        assert after["files"] == before["files"], "matrix.lock or a size baseline changed"
        assert not list(run.tmp.iterdir()), f"temporary files left: {list(run.tmp.iterdir())}"
        assert not list(self.project.glob(".*.lock.*")) and not list(
            self.project.glob(".*.sizes.json.*")
        )
        ss = subprocess.run(["ss", "-Hltnp"], capture_output=True, text=True, check=False).stdout
        assert f"pid={run.proc.pid}," not in ss, "gpuenv still listens (it serves nothing now)"


@pytest.fixture
def aftermath(pe: PrivateEngine, project: Path) -> Aftermath:
    # Each test starts from an empty build cache: BuildKit keeps every build's context (600 MB
    # of wheels) and layers, which would fill the engine's disk, and a build an earlier test
    # abandoned would be a cache hit here (done before the test could interrupt it).
    pe.docker("builder", "prune", "--all", "--force", timeout=300)
    return Aftermath(pe, project)


def _processes() -> dict[int, tuple[int, bytes]]:
    """pid -> (parent pid, command line) of every process."""
    found = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
            ppid = int(stat[stat.rindex(")") + 2 :].split()[1])
            found[int(entry.name)] = (ppid, (entry / "cmdline").read_bytes())
        except (OSError, ValueError):
            continue
    return found


def install_steps(pe: PrivateEngine) -> list[int]:
    """The install steps the private engine runs now: the shells of RUN steps that run the
    uv the context mounts (/mnt/uv), among the processes under its dockerd."""
    processes = _processes()
    below, todo = set(), [pe.pid] if pe.proc is not None else []
    while todo:
        parent = todo.pop()
        for pid, (ppid, _) in processes.items():
            if ppid == parent and pid not in below:
                below.add(pid)
                todo.append(pid)
    shells = {pid: processes[pid][1] for pid in below}
    return [
        pid for pid, cmd in shells.items() if cmd.startswith(b"/bin/sh\0-c\0") and b"/mnt/uv" in cmd
    ]


def in_first_run_step(pe: PrivateEngine, run: Running, cells: int = 1) -> None:
    """Wait until `cells` builds are inside their first install step (wheels fetched and
    sent: its process runs under the engine)."""

    def inside() -> bool:
        return len(install_steps(pe)) >= cells or run.proc.poll() is not None

    poll("the build's install step", inside, timeout=300)
    assert run.proc.poll() is None, run.stderr()[-2000:]


# --------------------------------------------------------------------------- engine restarts


@pytest.mark.parametrize("crash", [False, True], ids=["SIGTERM", "SIGKILL"])
def test_engine_restarted_during_a_build(pe, start, aftermath, crash: bool) -> None:
    before = aftermath.snapshot()
    run = start("build", CELL)
    in_first_run_step(pe, run)
    pe.restart(crash=crash)
    run.finish()
    # Either the stream broke (gpuenv: "went away") or dockerd, stopping, killed the step
    # first and reported it as the step's failure ("did not build"): both untagged.
    aftermath.check(before, run, code={1})
    assert "went away during the build" in run.stderr() or "did not build" in run.stderr()
    if crash:  # the stream broke for sure; the step's container was gpuenv's to remove
        assert "went away during the build" in run.stderr(), run.stderr()[-2000:]


def test_engine_restarted_during_a_run(pe, start, aftermath) -> None:
    before = aftermath.snapshot()
    run = start("run", "-i", BASE_IMAGE, "--", "sh", "-c", "echo ready; sleep 60")
    poll("the workload", run.says("ready"))
    pe.restart()
    run.finish()
    aftermath.check(before, run, code={125}, error="Docker Engine")


def push_args(registry: Registry, *extra: str) -> tuple[str, ...]:
    return (
        "push",
        CELL,
        "-f",
        "push.yaml",
        "--registry",
        f"{registry.host}/team",
        "--json",
        *extra,
    )


def pushed_tags(pe: PrivateEngine, registry: Registry) -> set[str]:
    return {f"{registry.host}/team/faults-push:{t}" for t in (CELL, "latest")}


def test_engine_restarted_during_a_push(pe, project, registry, start, aftermath) -> None:
    aftermath.allowed_tags |= pushed_tags(pe, registry)
    before = aftermath.snapshot()
    uploads = registry.uploads_started()
    run = start(*push_args(registry))
    poll("an upload", lambda: registry.uploads_started() > uploads or run.proc.poll() is not None)
    pe.restart()
    code = run.finish(timeout=300)
    if code == 0:  # gpuenv's own retries met the engine back: every tag pushed
        results = json.loads(run.stdout())["results"]
        assert all(r["status"] == "pushed" for r in results), results
        return
    aftermath.check(before, run, code={1}, error="not pushed")
    results = json.loads(run.stdout())["results"]
    assert {r["status"] for r in results} <= {"pushed", "failed"} and any(
        r["status"] == "failed" for r in results
    ), results
    again = gpuenv(pe, *push_args(registry), cwd=project)
    assert again.returncode == 0, again.stderr
    assert registry.tags("team/faults-push") == sorted([CELL, "latest"])


@pytest.fixture
def fresh_registry() -> Iterator[Registry]:
    """A registry of its own (no layer in it yet), killed by the test."""
    yield from _registry()


def test_registry_killed_mid_push_resumes_on_retry(pe, project, fresh_registry, start,
                                                   aftermath) -> None:  # fmt: skip
    registry = fresh_registry
    aftermath.allowed_tags |= pushed_tags(pe, registry)
    # A repository of its own, so no layer is in the registry yet.
    args = ("push", CELL, "-f", "push.yaml", "--registry", f"{registry.host}/resume", "--json")
    aftermath.allowed_tags |= {f"{registry.host}/resume/faults-push:{t}" for t in (CELL, "latest")}
    before = aftermath.snapshot()
    blobs = registry.blobs()
    run = start(*args)
    # Killed while one blob is complete and another still uploading, whichever finishes
    # first (the base layer or the 200 MB one): a resume then has something to skip and
    # something to send, and no tag can be complete.
    poll("a complete blob beside one still uploading",
         lambda: (registry.blobs() > blobs and registry.uploads_in_flight() > 0)
         or run.proc.poll() is not None,
         timeout=120, every=0.02)  # fmt: skip
    registry.kill()
    run.finish(timeout=300)
    aftermath.check(before, run, code={1}, error="2 of 2 tag(s) not pushed")
    results = json.loads(run.stdout())["results"]
    assert [r["status"] for r in results] == ["failed", "failed"], results
    assert all(r["attempts"] == 4 for r in results), results  # retried, then gave up
    kept = registry.blobs()
    assert kept > blobs, "no blob reached the registry before it was killed"
    complete_layers = registry.layers()
    registry.start()
    since = registry.log_lines()
    again = gpuenv(pe, *args, cwd=project)
    assert again.returncode == 0, again.stderr
    by_ref = {r["ref"].rsplit(":", 1)[1]: r for r in json.loads(again.stdout)["results"]}
    assert {t: r["status"] for t, r in by_ref.items()} == {CELL: "pushed", "latest": "pushed"}
    assert by_ref[CELL]["digest"] == by_ref["latest"]["digest"]
    # Resumed: a layer that was complete is not uploaded again (the engine may send the
    # small image config again; that is its choice, not a layer).
    completed = set(registry.digests_completed(since))
    assert completed, "the retry completed no upload (or the registry's log is not read right)"
    sent_again = complete_layers & completed
    assert not sent_again, f"complete layers were sent again: {sorted(sent_again)}"


# --------------------------------------------------------------------------- disk full


def test_disk_filling_during_a_build(pe, start, aftermath) -> None:
    before = aftermath.snapshot()
    with pe.disk_nearly_full(leave_mb=120):
        run = start("build", CELL)
        run.finish(timeout=600)
    aftermath.check(before, run, code={1}, error="did not build")
    assert "disk filled up" in run.stderr(), run.stderr()[-2000:]


# --------------------------------------------------------------------------- signals


SIGNALS = [pytest.param(signal.SIGINT, id="SIGINT"), pytest.param(signal.SIGTERM, id="SIGTERM")]


def expected(sig: int) -> set[int]:
    return {128 + sig}


def stored_bytes(cache: Path) -> int:
    """The bytes in a wheelhouse's files, those half downloaded included."""
    total = 0
    for path in (cache / "gpuenv" / "wheelhouse" / "files").rglob("*"):
        with contextlib.suppress(OSError):  # a download given up is removed meanwhile
            total += path.stat().st_size if path.is_file() else 0
    return total


@pytest.mark.parametrize("sig", SIGNALS)
@pytest.mark.parametrize("point", ["starting", "fetching", "building-two"])
def test_signal_to_build_j2(pe, start, aftermath, tmp_path, sig: int, point: str) -> None:
    before = aftermath.snapshot()
    # "fetching": a wheelhouse of its own, empty, so that wheels are on their way (the
    # module's is warm after the first build).
    cache = tmp_path / "cache"
    run = start("build", "-j", "2", env={"XDG_CACHE_HOME": str(cache)} if point == "fetching"
                else None)  # fmt: skip
    if point == "starting":
        poll("the build to start", run.says("==>"), every=0.05)
    elif point == "fetching":
        poll("100 MB of wheels", lambda: stored_bytes(cache) > 100e6 or run.proc.poll() is not None,
             every=0.05)  # fmt: skip
        assert run.proc.poll() is None, run.stderr()[-2000:]
    else:
        in_first_run_step(pe, run, cells=2)
    run.proc.send_signal(sig)
    sent, stored = time.monotonic(), stored_bytes(cache)
    run.finish()
    # Ended promptly: not after the abandoned builds ran to their end.
    assert time.monotonic() - sent < 15, f"gpuenv took {time.monotonic() - sent:.0f} s to end"
    aftermath.check(before, run, code=expected(sig), error="interrupted")
    if point == "fetching":
        # The downloads stopped with it: at most a megabyte more of each in flight (2 cells,
        # 8 each). Before, the queued ones all ran first (570 MB more here, 31 s on CI).
        grown = stored_bytes(cache) - stored
        shutil.rmtree(cache)
        assert grown < 32e6, f"{grown / 1e6:.0f} MB fetched after the signal"


@pytest.mark.parametrize("sig", SIGNALS)
def test_signal_to_push(pe, fresh_registry, start, aftermath, sig: int) -> None:
    registry = fresh_registry  # empty: every layer is uploaded, so the push lasts seconds
    aftermath.allowed_tags |= {
        f"{registry.host}/sig{sig}/faults-push:{t}" for t in (CELL, "latest")
    }
    before = aftermath.snapshot()
    uploads = registry.uploads_started()
    run = start("push", CELL, "-f", "push.yaml", "--registry", f"{registry.host}/sig{sig}")
    poll("an upload", lambda: registry.uploads_started() > uploads or run.proc.poll() is not None)
    run.proc.send_signal(sig)
    run.finish()
    aftermath.check(before, run, code=expected(sig), error="interrupted")
    assert registry.tags(f"sig{sig}/faults-push") == [], "the push was over before the signal"


@pytest.fixture(scope="module")
def locked(pe: PrivateEngine, project: Path) -> Path:
    """A complete matrix.lock, made once; the signal tests must leave it byte-identical."""
    proc = gpuenv(pe, "lock", cwd=project)
    if proc.returncode != 0:
        pytest.fail(f"gpuenv lock: {proc.stderr[-2000:]}")
    return project / "matrix.lock"


@pytest.mark.parametrize("sig", SIGNALS)
def test_signal_to_lock(pe, locked, start, aftermath, sig: int) -> None:
    before = aftermath.snapshot()
    run = start("lock", "--exclude-newer", "2026-01-15")

    # Resolving: uv runs as gpuenv's child.
    def resolving() -> bool:
        return len(_session_processes(run.proc.pid)) > 1 or run.proc.poll() is not None

    poll("uv to run", resolving, every=0.05)
    run.proc.send_signal(sig)
    run.finish()
    aftermath.check(before, run, code=expected(sig), error="interrupted")
    assert locked.read_text().startswith("# matrix.lock")


@pytest.mark.parametrize("sig", SIGNALS)
def test_signal_to_validate(pe, locked, start, aftermath, sig: int) -> None:
    before = aftermath.snapshot()
    run = start("validate", CELL, "-f", "push.yaml", "--record-sizes")
    # The suites run: the container is up and pytest runs as gpuenv's child.
    poll("the suites", lambda: (pe.containers() and len(_session_processes(run.proc.pid)) > 1)
         or run.proc.poll() is not None, every=0.05)  # fmt: skip
    run.proc.send_signal(sig)
    run.finish()
    aftermath.check(before, run, code=expected(sig), error="interrupted")


@pytest.mark.parametrize("sig", SIGNALS)
@pytest.mark.parametrize("point", ["building-first", "running"])
def test_signal_to_run(pe, start, aftermath, sig: int, point: str) -> None:
    before = aftermath.snapshot()
    if point == "building-first":
        pe.docker("rmi", f"{REPO_NAME}:{CELL}")  # not built yet: run builds it first
        before = aftermath.snapshot()
        try:
            run = start("run", "-i", CELL, "--", "true")
            in_first_run_step(pe, run)
            run.proc.send_signal(sig)
            sent = time.monotonic()
            run.finish()
            # Ended promptly: the build was cancelled, not waited for.
            took = time.monotonic() - sent
            assert took < 15, f"gpuenv took {took:.0f} s to end"
            aftermath.check(before, run, code=expected(sig), error="interrupted")
        finally:
            pe.docker("tag", BASE_IMAGE, f"{REPO_NAME}:{CELL}")
        return
    run = start("run", "-i", BASE_IMAGE, "--", "sh", "-c", "echo ready; sleep 60",
                env={"GPUENV_STOP_GRACE": "2"})  # fmt: skip
    poll("the workload", run.says("ready"))
    run.proc.send_signal(sig)
    code = run.finish()
    # `run` stops the container (docker stop) and exits as every verb does: 128 + the signal.
    assert code in expected(sig), run.stderr()[-2000:]
    assert "Traceback" not in run.stderr()
    poll("no container on the engine", lambda: not pe.containers(), timeout=30)
    assert not list(run.tmp.iterdir())
