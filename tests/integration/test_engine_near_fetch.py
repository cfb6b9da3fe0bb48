"""Builds fetch near the engine (gpuenv/building/near.py): where the engine's host reaches the
index, it downloads the public wheels itself, against the lock's hashes, and the image is the
one the client-side path gives; private wheels, credentials and the CA never leave the client.

The locked JAX CPU cell (~120 MB of wheels) is built with --reproducible three ways:

- on this machine's engine with every wheel sent (GPUENV_NEAR_FETCH=client): the reference;
- on this machine's engine as users get it: the probe finds PyPI through this site's
  TLS-intercepting proxy with the CA bundle ($PIP_CERT), which the step gets as a BuildKit
  secret (the engine is this machine's), so its host fetches the wheels;
- on another host (support/another_host.py: its own network and mount namespaces, TLS over
  a 50 Mbit/s link) whose host reaches a PEP 503 mirror on its own loopback
  (GPUENV_NEAR_INDEX): the wheels do not cross the link, nor does uv (its wheel is fetched
  there by the hash the client read): only the context does. That build is not rewritten
  --reproducible (the rewrite saves and loads the image across the link, about 3 minutes
  of CI for nothing the first two builds and test_engine_anywhere.py's remote engines do
  not show): its files are compared with the reference's instead, every byte, mode and
  owner, by a digest taken in a container on each engine (support/engine.py FILES_DIGEST).

And a cell with a package from a basic-auth index (netrc) on that host: the private wheel
travels in the context, the public ones come from the mirror, and neither the credentials nor
the CA gpuenv trusts (the test index's own) reach anything the lab's host keeps.
"""

from __future__ import annotations

import base64
import json
import os
import re
import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest
from support import cells
from support.another_host import AnotherHost, add_uv_wheel, another_host
from support.cells import JAX_CPU_CELL, JAX_LOCK_DATE, jax_cpu_matrix, test_repository
from support.cli import clean_env, gpuenv_cmd, output
from support.engine import FILES_DIGEST, run_in_image
from support.private_index import PACKAGE, PASSWORD, USER, VERSION, PrivateIndex

pytestmark = pytest.mark.engine

NAME = test_repository("near")
CELL = JAX_CPU_CELL


def _build(project: Path, env: dict[str, str], *extra: str) -> dict:
    """--reproducible unless told (not on the lab: see the module's docstring)."""
    extra = extra or ("--reproducible",)
    proc = gpuenv_cmd("build", CELL, "--json", "--no-cache", *extra, cwd=project, env=env,
                      check=False)  # fmt: skip
    assert proc.returncode == 0, output(proc)
    result = json.loads(proc.stdout)["results"][0]
    assert result["status"] == "built", output(proc)
    return {**result, "output": proc.stdout + proc.stderr}


@pytest.fixture(scope="module")
def project(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("near")
    project, cache = root / "project", root / "cache"
    project.mkdir()
    cache.mkdir()
    (project / "matrix.yaml").write_text(jax_cpu_matrix(NAME))
    lock = gpuenv_cmd("lock", "--exclude-newer", JAX_LOCK_DATE, cwd=project,
                      env=clean_env(XDG_CACHE_HOME=str(cache)))  # fmt: skip
    assert (project / "matrix.lock").exists(), output(lock)
    return {"project": project, "cache": cache, "root": root}


@pytest.fixture(scope="module")
def sent(project: dict[str, Path]) -> dict:
    """The reference: every wheel sent; and those wheels, for the lab's mirror."""
    env = clean_env(XDG_CACHE_HOME=str(project["cache"]), GPUENV_NEAR_FETCH="client")
    result = _build(project["project"], env)
    part = cells.context_dir(project["cache"], project["project"] / "matrix.yaml", CELL)
    wheels = project["root"] / "wheels"
    wheels.mkdir(exist_ok=True)
    for wheel in (part / "python-env").glob("*.whl"):
        shutil.copy2(wheel, wheels / wheel.name)
    assert len(list(wheels.glob("*.whl"))) > 5, "the reference sent its wheels"
    assert (part / "python-env" / "uv").is_file() and not (part / "python-env" / "uv.py").exists()
    add_uv_wheel(project["cache"], wheels)  # the mirror offers uv too, as PyPI does
    return {**result, "wheels": wheels}


def test_on_this_machine_the_engines_host_fetches_and_the_image_is_the_same(project, sent):
    if not os.environ.get("PIP_CERT"):
        pytest.skip("this site's proxy CA ($PIP_CERT) is what the local probe needs here")
    env = clean_env(XDG_CACHE_HOME=str(project["cache"]), GPUENV_NEAR_FETCH="auto")
    doctor = gpuenv_cmd("doctor", "--json", cwd=project["project"], env=env, check=False)
    found = {f["topic"]: f for f in json.loads(doctor.stdout)["findings"]}
    assert found["packages"]["level"] == "ok", output(doctor)
    assert (
        "https://pypi.org/simple/ with the CA bundle as a build secret"
        in (found["packages"]["message"])
    )
    near = _build(project["project"], env)
    part = cells.context_dir(project["cache"], project["project"] / "matrix.yaml", CELL)
    # Nothing but uv was sent (to an engine of this machine, a copy on this disk of the file
    # the client holds anyway); the engine's host was told where and what, one hash each.
    assert [p.name for p in (part / "python-env").glob("*.whl")] == []
    assert (part / "python-env" / "uv").is_file() and not (part / "python-env" / "uv.py").exists()
    fetched = (part / "python-env" / "index.txt").read_text().splitlines()
    assert fetched[0] == "--index-url https://pypi.org/simple/" and len(fetched) > 5
    assert all(line.count("--hash=sha256:") == 1 for line in fetched[1:])
    assert near["image_id"] == sent["image_id"]
    # What a user reads while it waits, without a terminal (gpuenv/building/activity.py):
    # the fetch and the install in words and numbers, from uv's own lines in the step.
    fetched_line = r"\(python-env\): fetched \d+ wheels, [\d.]+ MiB in \S+, [\d.]+ MiB/s"
    assert re.search(fetched_line, near["output"]), near["output"]
    assert re.search(r"\(python-env\): installed \d+ packages in ", near["output"])
    assert re.search(r"\(python-env\): unpacked \d+ wheels in ", sent["output"]), sent["output"]
    assert re.search(r"sent the build context: [\d.]+ [kMG]?B in ", near["output"])


def _tx(lab: AnotherHost) -> int:
    return int(Path(f"/sys/class/net/{lab.host_if}/statistics/tx_bytes").read_text())


@pytest.fixture(scope="module")
def lab(project: dict[str, Path], sent: dict) -> Iterator[AnotherHost]:
    with another_host(project["project"], hide=[project["cache"]], wheels=sent["wheels"]) as it:
        yield it


def test_on_another_host_its_mirror_serves_and_the_image_is_the_same(project, sent, lab):
    env = clean_env(XDG_CACHE_HOME=str(project["cache"]), GPUENV_NEAR_INDEX=lab.mirror_url,
                    GPUENV_NEAR_FETCH="auto", **lab.env("tls"))  # fmt: skip
    # PyPI from the lab's host: this site's proxy, whose CA does not go there; its mirror: ok.
    bare = {k: v for k, v in env.items() if k != "GPUENV_NEAR_INDEX"}
    for doctor_env, level in ((bare, "info"), (env, "ok")):
        doctor = gpuenv_cmd("doctor", "--json", cwd=project["project"], env=doctor_env,
                            check=False)  # fmt: skip
        found = {f["topic"]: f for f in json.loads(doctor.stdout)["findings"]}["packages"]
        assert found["level"] == level, output(doctor)
        print(found["message"])  # what the probe concluded, for the report
    there = _build(project["project"], env, "--keep-going")
    # uv was not sent either: its wheel came from the mirror, by the hash read here.
    part = cells.context_dir(project["cache"], project["project"] / "matrix.yaml", CELL)
    assert not (part / "python-env" / "uv").exists()
    script = (part / "python-env" / "uv.py").read_text()
    assert f"'{lab.mirror_url}'" in script and re.search(r"'[0-9a-f]{64}'", script)
    assert there["phases"]["uv"] > 0, there["phases"]  # the step's own line, in the log
    # The image holds the reference's files: every byte, mode and owner (not its ID: that
    # needs the rewrite, see the module's docstring).
    digest = ("python3", "-I", "-B", "-c", FILES_DIGEST)
    # (As root: the image's own user may not read every file, /etc/.pwd.lock for one.)
    on_lab = lab.docker("run", "--rm", "--network", "none", "--user", "0", f"{NAME}:{CELL}",
                        *digest)  # fmt: skip
    assert on_lab.stdout.strip() == run_in_image(sent["image_id"], *digest, user="0").strip()


def _own_ca(bundle_file: Path) -> bytes:
    """The test index's own CA, the first certificate of the bundle gpuenv was given (the
    rest are public roots, some of which an image's ca-certificates holds anyway): its
    base64 body's first line is the needle."""
    body = bundle_file.read_text().split("-----BEGIN CERTIFICATE-----")[1]
    return body.strip().splitlines()[0].encode()


def test_a_private_package_travels_and_no_credential_or_ca_reaches_that_host(project, sent, lab):
    if not os.environ.get("PIP_CERT"):
        pytest.skip("the index's bundle adds this site's CA bundle ($PIP_CERT) to its own")
    root = project["root"] / "private"
    root.mkdir()
    with PrivateIndex(root) as index:
        doc = {"name": NAME, "matrix": {"jax": ["0.7"], "python": ["3.11"], "variant": ["cpu"]},
               "default": {"jax": "0.7", "python": "3.11"},
               "bases": {"3.11": {"debian": "bookworm"}},
               "packages": {"pip": [f"{PACKAGE}=={VERSION}"]},
               "build": {"extra_index_urls": [index.url]}}  # fmt: skip
        (root / "matrix.yaml").write_text(json.dumps(doc, indent=2))
        netrc = root / "netrc"
        netrc.write_text(index.netrc())
        netrc.chmod(0o600)
        env = clean_env(XDG_CACHE_HOME=str(project["cache"]), NETRC=str(netrc),
                        GPUENV_CA_BUNDLE=str(index.bundle))  # fmt: skip
        env["no_proxy"] = env["NO_PROXY"] = "127.0.0.1"
        lock = gpuenv_cmd("lock", "--exclude-newer", JAX_LOCK_DATE, cwd=root, env=env)
        assert (root / "matrix.lock").exists(), output(lock)
        near = {"GPUENV_NEAR_INDEX": lab.mirror_url, "GPUENV_NEAR_FETCH": "auto"}
        before = _tx(lab)
        there = _build(root, {**env, **near, **lab.env("tls")}, "--keep-going")
        crossed = _tx(lab) - before
    # The private wheel and the context crossed; the public wheels did not, nor uv (~40 MB
    # unpacked, sent on every first build before it was fetched near the engine too).
    assert crossed < 5_000_000, crossed
    print(f"crossed towards the engine: {crossed / 1e6:.2f} MB")
    part = cells.context_dir(project["cache"], root / "matrix.yaml", CELL)
    # The private wheel crossed in the packages step's part; no public wheel did.
    assert [p.name for p in part.rglob("*.whl")] == [index.filename]
    assert f"{PACKAGE}=={VERSION}" in (part / "packages" / "requirements.txt").read_text()
    assert "--index-url http://127.0.0.1:3141/simple/" in (
        (part / "python-env" / "index.txt").read_text()
    )
    ran = lab.docker("run", "--rm", "--network", "none", f"{NAME}:{CELL}", "python", "-c",
                     "import gpuenv_private_probe as m; print(m.ANSWER)")  # fmt: skip
    assert ran.stdout.strip() == "42"
    # Nothing the lab's host keeps (its data root: layers, build cache, containers, logs)
    # nor what gpuenv printed holds the password, its basic-auth token or the CA gpuenv trusts.
    token = base64.b64encode(f"{USER}:{PASSWORD}".encode())
    needles = [PASSWORD.encode(), token, _own_ca(index.bundle)]
    kept = [str(lab.root / d) for d in ("data", "exec")]
    for needle in needles:
        grep = subprocess.run(["grep", "-rlaF", "--exclude-dir=mirror", needle.decode(), *kept],
                              capture_output=True, text=True, check=False)  # fmt: skip
        assert grep.stdout == "", (needle[:20], grep.stdout)
        assert needle.decode() not in there["output"]
    # Positive control: the scan sees what is there (the private module, in a layer).
    found = subprocess.run(["grep", "-rlaF", "ANSWER = 42", *kept], capture_output=True,
                           text=True, check=False)  # fmt: skip
    assert found.stdout, "the scan found not even the private module"
