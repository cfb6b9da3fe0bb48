"""A private package index that requires HTTP basic auth, served by the test on loopback over
HTTPS (a CA of its own, given to gpuenv as its CA bundle: credentials never go over http).

The index holds one small wheel the test builds (a zip with the three dist-info files) and
answers 404 for every other project, so the cell's framework (JAX 0.7 on CPU, the smallest
framework cell: its image is saved and searched byte by byte) and its dependencies come from
PyPI.
gpuenv resolves the unlocked cell (`uv pip compile`) and fetches its wheels on the client,
with the credentials; the build gets the wheels in its context and reaches no index.
Credentials come from a netrc file ($NETRC, `machine 127.0.0.1:PORT`) for the good build,
and from GPUENV_INDEX_USERNAME/PASSWORD/ORIGIN (which take precedence) with a wrong password
for the failing one. The image must hold the package and no trace of the credentials: not in any
layer, the history or the config; nor may the build log, the build's command line or the
context directory gpuenv sent (its Dockerfile, requirements, every file) hold one. The
docker CLI gpuenv builds with is wrapped (GPUENV_DOCKER_CLI) to keep its log and arguments.
"""

from __future__ import annotations

import base64
import json
import subprocess
import tarfile

import pytest
import yaml
from support import cells
from support.cells import test_repository
from support.cli import clean_env, gpuenv_cmd, output
from support.engine import docker, inspect, logging_docker_cli, run_in_image
from support.private_index import PACKAGE, PASSWORD, USER, VERSION, PrivateIndex

REPOSITORY = test_repository("private")
CELL = cells.JAX_CPU_CELL
IMAGE = f"{REPOSITORY}:{CELL}"


@pytest.fixture(scope="module")
def private(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("private")
    with PrivateIndex(tmp) as index:
        doc = yaml.safe_load(cells.jax_cpu_matrix(REPOSITORY))
        doc["packages"] = {"pip": [f"{PACKAGE}=={VERSION}"]}
        doc["build"] = {"extra_index_urls": [index.url]}
        matrix = tmp / "matrix.yaml"
        matrix.write_text(json.dumps(doc, indent=2))
        netrc = tmp / "netrc"
        netrc.write_text(index.netrc())
        netrc.chmod(0o600)
        cache = tmp_path_factory.getbasetemp() / "wheelhouse-cache"  # shared: one JAX download
        cli = logging_docker_cli(tmp)
        env = clean_env(XDG_CACHE_HOME=str(cache), NETRC=str(netrc),
                        GPUENV_DOCKER_CLI=str(cli["wrapper"]),
                        GPUENV_CA_BUNDLE=str(index.bundle))  # fmt: skip
        for name in ("no_proxy", "NO_PROXY"):  # the index is on this machine's loopback
            env[name] = ",".join(filter(None, (env.get(name), "127.0.0.1")))
        yield {"index": index, "matrix": matrix, "env": env, "cache": cache, **cli}


@pytest.fixture(scope="module")
def built(private):
    proc = gpuenv_cmd("build", "-f", str(private["matrix"]), "--json", env=private["env"],
                      check=False)  # fmt: skip
    assert proc.returncode == 0, output(proc)
    result = json.loads(proc.stdout)["results"][0]
    assert result["status"] == "built"
    return {**result, "output": proc.stdout + proc.stderr}


def needles() -> dict[str, bytes]:
    token = base64.b64encode(f"{USER}:{PASSWORD}".encode())
    return {"password": PASSWORD.encode(), "user": USER.encode(), "basic token": token}


def found_in(data: bytes) -> set[str]:
    return {what for what, needle in needles().items() if needle in data}


def test_the_package_came_from_the_private_index(built, private):
    out = run_in_image(IMAGE, "python", "-c", "import gpuenv_private_probe as m; print(m.ANSWER)")
    assert out.strip().splitlines()[-1] == "42"
    assert (f"/files/{private['index'].filename}", 200) in private["index"].requests
    assert all(code != 401 for path, code in private["index"].requests), "sent without creds"
    # The engine got the wheel in the build context, fetched with the credentials (a package
    # of the cell's own: in the packages step's part).
    sent = cells.context_dir(private["cache"], private["matrix"], CELL) / "packages"
    assert (sent / private["index"].filename).read_bytes() == private["index"].wheel


def test_credentials_are_in_no_layer_history_or_config(built):
    wanted = {**needles(), "control": b"ANSWER = 42"}  # the module: in a layer
    found: dict[str, set[str]] = {}
    members = 0
    proc = subprocess.Popen(["docker", "save", built["image_id"]], stdout=subprocess.PIPE)
    assert proc.stdout is not None
    with tarfile.open(fileobj=proc.stdout, mode="r|") as tar:
        for member in tar:
            if member.isfile():
                data = tar.extractfile(member).read()  # type: ignore[union-attr]
                members += 1
                found[member.name] = {what for what, n in wanted.items() if n in data}
    assert proc.wait(timeout=300) == 0
    assert members >= 3  # layers, config, manifest: the scan saw the image
    # Positive control: the scan does see what is in a layer (the private module).
    assert any("control" in hits for hits in found.values())
    leaks = {name: hits - {"control"} for name, hits in found.items() if hits - {"control"}}
    assert leaks == {}
    del wanted["control"]
    history = docker("history", "--no-trunc", "--format", "{{.CreatedBy}}", built["image_id"])
    assert "uv pip install" in history.stdout  # positive control: the install step is there
    config = json.dumps(inspect(built["image_id"]))
    for what, needle in wanted.items():
        assert needle.decode() not in history.stdout, what
        assert needle.decode() not in config, what


def test_credentials_are_not_in_the_build_log_its_command_or_what_was_sent(built, private):
    log, args = private["log"].read_bytes(), private["args"].read_bytes()
    # Positive controls: the wrapper saw this build (its install step ran) and its labels.
    assert b"uv pip install" in log and b" RUN " in log, log[-2000:]
    assert b"io.gpuenv.spec-hash=" in args
    assert found_in(log) == set() and found_in(args) == set()
    assert found_in(built["output"].encode()) == set()
    sent = cells.context_dir(private["cache"], private["matrix"], CELL)
    files = [p for p in sent.rglob("*") if p.is_file()]
    assert {p.relative_to(sent).as_posix() for p in files} >= {
        "Dockerfile", "python-env/requirements.txt", "python-env/uv",
        f"packages/{private['index'].filename}",
    }  # fmt: skip
    assert "gpuenv-private-probe==1.0" in (sent / "packages/requirements.txt").read_text()
    assert {p.name: found_in(p.read_bytes()) for p in files if found_in(p.read_bytes())} == {}
    dockerfile = (sent / "Dockerfile").read_text()
    assert "127.0.0.1" not in dockerfile and "http" not in dockerfile.split("FROM", 1)[1]


def test_an_index_without_upload_times_still_builds(private, built):
    """A private index that serves PEP 503 HTML pages only (no upload times: a directory
    behind a web server, many index servers) is enough to build an unlocked cell."""
    docker("rmi", IMAGE)  # so that the cell is built (and resolved) again
    private["index"].html_only = True
    try:
        proc = gpuenv_cmd("build", "-f", str(private["matrix"]), "--json", env=private["env"],
                          check=False)  # fmt: skip
    finally:
        private["index"].html_only = False
    assert proc.returncode == 0, output(proc)
    (result,) = json.loads(proc.stdout)["results"]
    assert result["status"] == "built", result


def test_a_wrong_password_is_one_error_line_and_no_tag(private, built):
    docker("rmi", IMAGE, check=False)  # the good build's tag: "no tag" means this build made none
    env = {**private["env"], "GPUENV_INDEX_USERNAME": USER, "GPUENV_INDEX_PASSWORD": "wrong",
           "GPUENV_INDEX_ORIGIN": private["index"].origin}  # fmt: skip
    proc = gpuenv_cmd("build", "-f", str(private["matrix"]), "--no-cache", env=env, check=False)
    assert proc.returncode == 1, output(proc)
    errors = [line for line in proc.stderr.splitlines() if line.startswith("error:")]
    assert len(errors) == 1, output(proc)
    assert "wrong" not in proc.stdout + proc.stderr and PASSWORD not in proc.stdout + proc.stderr
    assert inspect(IMAGE) is None
    # The line says whose credentials were refused, and where they came from.
    assert f"refused the credentials of user '{USER}'" in errors[0], errors[0]
    assert "GPUENV_INDEX_USERNAME" in errors[0], errors[0]
