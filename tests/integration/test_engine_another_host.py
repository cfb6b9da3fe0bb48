"""An engine on another host, reached every way users reach one: DOCKER_HOST=tcp:// with TLS,
DOCKER_HOST=ssh:// (the user's own ssh, as the docker CLI uses it), and Docker contexts of
either kind. The lab (support/another_host.py) cannot see this machine's files: the project
directory, gpuenv's cache and HOME are hidden from it, so everything a build needs crosses
the 50 Mbit/s link.

One build of the locked JAX CPU cell (test_engine_anywhere.py's) over TLS; over ssh the
lab's image tag is removed and the cell built again, from the engine's build cache: the
docker CLI that gpuenv builds with must reach the same engine over ssh, or the image would
not be there. `gpuenv run` of the working directory on such an engine is issue 33's next
part (run/local.py) and is tested there, with this lab.
"""

from __future__ import annotations

import json
import os
import sys
import zipfile
from collections.abc import Iterator
from pathlib import Path

import pytest
from support.another_host import SSH_PROBLEMS, AnotherHost, Kind, another_host
from support.cells import JAX_CPU_CELL, JAX_LOCK_DATE, jax_cpu_matrix, test_repository
from support.cli import clean_env, gpuenv_cmd, output, run

pytestmark = pytest.mark.engine

NAME = test_repository("another-host")
CELL = JAX_CPU_CELL
IMAGE = f"{NAME}:{CELL}"


@pytest.fixture(scope="module")
def dirs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """The project (the matrix and its lock) and gpuenv's cache, apart: the lab hides both."""
    root = tmp_path_factory.mktemp("another-host")
    project, cache = root / "project", root / "cache"
    project.mkdir()
    cache.mkdir()
    (project / "matrix.yaml").write_text(jax_cpu_matrix(NAME))
    lock = gpuenv_cmd("lock", "--exclude-newer", JAX_LOCK_DATE, cwd=project,
                      env=clean_env(XDG_CACHE_HOME=str(cache)))  # fmt: skip
    assert (project / "matrix.lock").exists(), output(lock)
    return {"project": project, "cache": cache}


@pytest.fixture(scope="module")
def lab(dirs: dict[str, Path]) -> Iterator[AnotherHost]:
    with another_host(dirs["project"], hide=[dirs["cache"]]) as it:
        yield it


def _env(lab: AnotherHost, dirs: dict[str, Path], kind: Kind, problem: str = "") -> dict[str, str]:
    """This environment pointed at the lab (and gpuenv's cache at the hidden one)."""
    return clean_env(XDG_CACHE_HOME=str(dirs["cache"]), **lab.env(kind, problem))


@pytest.fixture(scope="module")
def built_over_tls(lab: AnotherHost, dirs: dict[str, Path]) -> str:
    """The cell built on the lab over TLS (every wheel crosses the link): its image ID."""
    built = gpuenv_cmd("build", "--json", CELL, cwd=dirs["project"],
                       env=_env(lab, dirs, "tls"))  # fmt: skip
    result = json.loads(built.stdout)["results"][0]
    assert result["status"] == "built", output(built)
    # On the lab's engine, read on its own socket: not the shared one's.
    on_lab = lab.docker("image", "inspect", "-f", "{{.Id}}", IMAGE).stdout.strip()
    assert on_lab == result["image_id"], output(built)
    return str(result["image_id"])


@pytest.mark.parametrize("kind", ["tls", "ssh"])
def test_doctor_reports_the_engine_on_another_host(lab, dirs, kind):
    proc = gpuenv_cmd("doctor", "--json", cwd=dirs["project"], env=_env(lab, dirs, kind),
                      check=False)  # fmt: skip
    findings = {f["topic"]: f for f in json.loads(proc.stdout)["findings"]}
    engine = findings["engine"]
    assert engine["level"] == "ok", output(proc)
    where = "ssh://root@gpuenv-another-host" if kind == "ssh" else f"{lab.addr}:2376"
    assert "(remote: " in engine["message"] and where in engine["message"], engine
    assert findings["build"]["level"] == "ok", findings["build"]


@pytest.mark.parametrize("kind", ["tls", "ssh"])
def test_the_locked_cell_builds_there_and_validates(lab, dirs, built_over_tls, kind):
    env = _env(lab, dirs, kind)
    if kind == "ssh":
        # The tag gone, gpuenv must build again: through the docker CLI, over ssh, on the
        # lab's engine, whose build cache holds every step (nothing but the context's
        # checksums crosses again).
        lab.docker("rmi", IMAGE)
        built = gpuenv_cmd("build", "--json", CELL, cwd=dirs["project"], env=env)
        result = json.loads(built.stdout)["results"][0]
        assert (result["status"], result["image_id"]) == ("built", built_over_tls), output(built)
        assert lab.docker("image", "inspect", "-f", "{{.Id}}", IMAGE).stdout.strip() == (
            built_over_tls
        )
    validated = gpuenv_cmd("validate", CELL, cwd=dirs["project"], env=env, check=False)
    assert validated.returncode == 0, output(validated)


def test_docker_contexts_of_either_kind_reach_it(lab, dirs, built_over_tls, tmp_path):
    """Contexts made by the docker CLI itself in a throwaway DOCKER_CONFIG: one chosen with
    DOCKER_CONTEXT (ssh), one with `docker context use` (TLS, its certificates in the
    context's store)."""
    config = tmp_path / "docker-config"
    base = clean_env(XDG_CACHE_HOME=str(dirs["cache"]), DOCKER_CONFIG=str(config),
                     PATH=lab.ssh_path)  # fmt: skip
    base.pop("DOCKER_HOST", None)
    certs = lab.cert_path
    for name, endpoint in (
        ("lab-ssh", f"host={lab.docker_host('ssh')}"),
        ("lab-tls", f"host={lab.docker_host('tls')},ca={certs}/ca.pem,"
                    f"cert={certs}/cert.pem,key={certs}/key.pem"),
    ):  # fmt: skip
        run(["docker", "context", "create", name, "--docker", endpoint], env=base)
    for env, where in (
        ({**base, "DOCKER_CONTEXT": "lab-ssh"}, "ssh://root@gpuenv-another-host"),
        (base, f"https://{lab.addr}:2376"),
    ):
        if "DOCKER_CONTEXT" not in env:
            run(["docker", "context", "use", "lab-tls"], env=env)
        doctor = gpuenv_cmd("doctor", "--json", cwd=dirs["project"], env=env, check=False)
        engine = {f["topic"]: f for f in json.loads(doctor.stdout)["findings"]}["engine"]
        assert engine["level"] == "ok" and where in engine["message"], output(doctor)
        validated = gpuenv_cmd("validate", CELL, cwd=dirs["project"], env=env, check=False)
        assert validated.returncode == 0, output(validated)


@pytest.mark.parametrize("problem", SSH_PROBLEMS)
def test_an_ssh_failure_is_one_error_line_with_its_fix(lab, dirs, problem):
    proc = gpuenv_cmd("build", CELL, cwd=dirs["project"], env=_env(lab, dirs, "ssh", problem),
                      check=False, timeout=120)  # fmt: skip
    lines = [line for line in proc.stderr.splitlines() if line.strip()]
    assert proc.returncode != 0 and len(lines) == 1, output(proc)
    assert lines[0].startswith("error: cannot reach the Docker Engine at ssh://"), lines
    assert "Traceback" not in proc.stdout + proc.stderr
    expected = {
        "unknown-host-key": "host key",
        "refused-key": "refused the login",
        "no-docker": "no `docker` command",
    }[problem]
    assert expected in lines[0], lines[0]


def _probe_wheel(directory: Path) -> Path:
    """A wheel of one module, made here (the mirror serves whatever wheels it is given)."""
    name = "gpuenv_lab_probe-1.0-py3-none-any.whl"
    files = {
        "gpuenv_lab_probe.py": "ANSWER = 42\n",
        "gpuenv_lab_probe-1.0.dist-info/METADATA":
            "Metadata-Version: 2.1\nName: gpuenv-lab-probe\nVersion: 1.0\n",
        "gpuenv_lab_probe-1.0.dist-info/WHEEL":
            "Wheel-Version: 1.0\nGenerator: hand\nRoot-Is-Purelib: true\nTag: py3-none-any\n",
    }  # fmt: skip
    record = "".join(f"{path},,\n" for path in files) + "gpuenv_lab_probe-1.0.dist-info/RECORD,,\n"
    with zipfile.ZipFile(directory / name, "w") as wheel:
        for path, text in {**files, "gpuenv_lab_probe-1.0.dist-info/RECORD": record}.items():
            wheel.writestr(path, text)
    return directory / name


def test_the_mirror_near_the_engine_serves_its_containers(lab, tmp_path):
    """The PEP 503 index on the lab's own loopback: a container on the engine's host network
    reads the project's page and gets the wheel whose sha256 the link names (what a build
    that fetches near the engine does); uv installs from it."""
    wheel = _probe_wheel(tmp_path)
    lab.publish(tmp_path)
    fetch = (
        "import hashlib, re, sys, urllib.request as u\n"
        f"base = {lab.mirror_url!r}\n"
        "page = u.urlopen(base + 'gpuenv-lab-probe/').read().decode()\n"
        'href = re.search(r\'href="([^"]+)"\', page).group(1)\n'
        "url, digest = u.urljoin(base + 'gpuenv-lab-probe/', href).split('#sha256=')\n"
        "assert hashlib.sha256(u.urlopen(url).read()).hexdigest() == digest\n"
        "print(url.rsplit('/', 1)[1])\n"
    )
    seen = lab.docker("run", "--rm", "--network", "host", "gpuenv/debian:bookworm", "python3",
                      "-c", fetch).stdout  # fmt: skip
    assert seen.strip() == wheel.name
    # uv (gpuenv's installer; a binary the lab's host can run) installs from it there.
    uv = str(Path(sys.executable).parent / "uv")
    target = lab.root / "got"
    install = [uv, "pip", "install", "--no-cache", "--python", "/usr/bin/python3",
               "--no-deps", "--target", str(target), "--index-url", lab.mirror_url,
               "gpuenv-lab-probe"]  # fmt: skip
    # No proxy: the mirror is on the lab's loopback, which only its own side reaches.
    direct = {k: v for k, v in os.environ.items() if "proxy" not in k.lower()}
    got = lab.inside(*install, env=direct)
    assert (target / "gpuenv_lab_probe.py").read_text() == "ANSWER = 42\n", got.stderr
