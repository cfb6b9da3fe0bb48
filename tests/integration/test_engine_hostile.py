"""Hostile inputs that need the engine: images handed to `-i` whose labels lie or attack,
and DOCKER_HOST garbage. Each gives one `error:` line, its exit code, no traceback, and
leaves no new container or tag behind. The images are the shipped CPU image plus LABEL
lines (built with no network, removed after)."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest
from support.cells import CPU_IMAGE, test_repository
from support.cli import clean_env, output

pytestmark = pytest.mark.engine

REPO_NAME = test_repository("harden-labels")

HOSTILE_LABELS = {
    "newline-in-cell": {"io.gpuenv.cell": "tf2.21-py3.11-cpu\nRUN id"},
    # 60 KB: a Dockerfile line holds at most 64 KiB (the engine refuses a 1 MB LABEL line)
    "huge-value": {"io.gpuenv.framework-version": "2" * 60000},
    "shell-metacharacters": {"io.gpuenv.python": "3.11$(touch /tmp/gpuenv-pwned);`id`"},
    "spec-hash-not-hex": {"io.gpuenv.spec-hash": "not-hex; rm -rf /"},
    "variant-garbage": {"io.gpuenv.variant": "tpu"},
    "cuda-on-cpu": {"io.gpuenv.cuda": "12.5\n$(id)"},
    "framework-unknown": {"io.gpuenv.framework": "pytorch"},
    "inputs-not-json": {"io.gpuenv.inputs": "{not json"},
}


def containers(docker, ref: str = CPU_IMAGE) -> set[str]:
    """Containers of this image (other sessions share the engine: only ours are judged)."""
    return set(docker("ps", "-aq", "--no-trunc", "--filter", f"ancestor={ref}").stdout.split())


def tags(docker) -> set[str]:
    """Tags in this module's repository, or on the shipped image these images derive from."""
    out = docker("images", "--format", "{{.Repository}}:{{.Tag}} {{.ID}}").stdout
    ours = {docker("image", "inspect", "-f", "{{.Id}}", CPU_IMAGE).stdout.strip()[7:19]}
    return {
        line.split()[0]
        for line in out.splitlines()
        if line.startswith(REPO_NAME) or line.split()[-1] in ours
    }


@pytest.fixture(scope="module")
def hostile_images(shipped_cpu, tmp_path_factory, docker):
    built = {}
    for slug, labels in HOSTILE_LABELS.items():
        ctx = tmp_path_factory.mktemp(f"labels-{slug}")
        lines = [f"FROM {CPU_IMAGE}"]
        lines += [f"LABEL {k}={json.dumps(v)}" for k, v in labels.items()]
        (ctx / "Dockerfile").write_text("\n".join(lines) + "\n")
        ref = f"{REPO_NAME}:{slug}"
        docker("build", "--network", "none", "-q", "-t", ref, str(ctx), timeout=300)
        built[slug] = ref
    yield built
    docker("rmi", *built.values(), check=False)


def one_error(proc: subprocess.CompletedProcess[str], code: int) -> str:
    assert proc.returncode == code, output(proc)
    assert "Traceback" not in proc.stdout + proc.stderr, output(proc)
    errors = [ln for ln in proc.stderr.splitlines() if ln.startswith("error: ")]
    assert len(errors) == 1, output(proc)
    return errors[0]


@pytest.mark.parametrize("slug", sorted(HOSTILE_LABELS))
def test_validate_refuses_an_image_with_hostile_labels(slug, hostile_images, gpuenv, docker):
    before_c, before_t = containers(docker, hostile_images[slug]), tags(docker)
    proc = gpuenv("validate", "-i", hostile_images[slug], check=False, timeout=600)
    # io.gpuenv.inputs is the plan's record, not a claim about the contents: may pass.
    assert proc.returncode in ((0, 1) if slug == "inputs-not-json" else (1, 2)), output(proc)
    assert "Traceback" not in proc.stdout + proc.stderr
    assert not Path("/tmp/gpuenv-pwned").exists()
    assert len(proc.stderr) < 20000, "a huge label was echoed"
    assert containers(docker, hostile_images[slug]) <= before_c and tags(docker) <= before_t


@pytest.mark.parametrize("slug", sorted(HOSTILE_LABELS))
def test_run_with_hostile_labels_fails_cleanly_or_runs(slug, hostile_images, gpuenv, docker):
    """`run` needs no label to run a command: it runs, or refuses with one line (125)."""
    before_c = containers(docker, hostile_images[slug])
    proc = gpuenv("run", "-i", hostile_images[slug], "--network", "none", "true", check=False,
                  timeout=300)  # fmt: skip
    assert "Traceback" not in proc.stdout + proc.stderr, output(proc)
    if proc.returncode != 0:
        one_error(proc, 125)
    assert len(proc.stderr) < 20000
    assert not Path("/tmp/gpuenv-pwned").exists()
    assert containers(docker, hostile_images[slug]) <= before_c


BAD_HOSTS = [
    "tcp://256.0.0.1:x",
    "tcp://256.0.0.1:2375",
    "garbage",
    "unix:///nonexistent/docker.sock",
    "ssh://",
    "tcp://127.0.0.1:1",
    "http://[::1",
]


@pytest.mark.parametrize("host", BAD_HOSTS)
@pytest.mark.parametrize(
    "verb,code",
    [(["build", "--dry-run"], 1), (["run", "true"], 125), (["doctor"], 1), (["push"], 1)],
    ids=["build", "run", "doctor", "push"],
)
def test_docker_host_garbage(host, verb, code, shipped_matrix, gpuenv, tmp_path):
    # Nothing written: the working directory, gpuenv's cache and HOME (issue 35: a failed
    # build used to leave its resolved-matrix snapshot in the cache).
    work, cache, home = tmp_path / "work", tmp_path / "cache", tmp_path / "home"
    work.mkdir()
    home.mkdir()
    env = clean_env(DOCKER_HOST=host, XDG_CACHE_HOME=str(cache), HOME=str(home))
    proc = gpuenv(*verb[:1], "-f", str(shipped_matrix), *verb[1:], check=False, timeout=120,
                  env=env, cwd=work)  # fmt: skip
    if verb[0] == "doctor":  # doctor reports findings; an unreachable engine is one, exit 1
        assert proc.returncode == 1 and "Traceback" not in proc.stdout + proc.stderr, output(proc)
        return
    line = one_error(proc, code)
    assert "engine" in line.lower() or "DOCKER_HOST" in line, line
    written = [p for d in (work, cache, home) for p in d.rglob("*") if not p.is_dir()]
    assert written == [], written
