"""The wheelhouse on a real engine: a locked CPU cell (JAX 0.7, the smallest framework
cell, locked as test_engine_lock.py's is) built online, then rebuilt with
--no-cache --offline while every upstream is unreachable, gives the same environment; the
wheelhouse carried to another cache (`gpuenv cache export/import`) builds it offline too.

gpuenv fetches every wheel on the client into the wheelhouse, then sends the locked ones in
the build context, where the install step finds them with no index and no network (the
step's line names none). Upstream is made unreachable for the offline builds by pointing
the proxy environment variables (which gpuenv's fetches honour) at a dead loopback port, so
any attempt to reach an index would fail the build. The wheelhouse lives in a session-wide
XDG_CACHE_HOME (shared with test_engine_private_index.py).
"""

from __future__ import annotations

import hashlib
import json
import shutil
import socket
from pathlib import Path

import pytest
import yaml
from support import cells
from support.cells import test_repository
from support.cli import clean_env, gpuenv_cmd, output
from support.engine import docker, inspect

REPOSITORY = test_repository("wheelhouse")
KEEP = f"{test_repository('wheelhouse-keep')}:online"
CELL = cells.JAX_CPU_CELL
IMAGE = f"{REPOSITORY}:{CELL}"
EXCLUDE_NEWER = cells.JAX_LOCK_DATE  # test_engine_lock.py's lock of the same cell


def matrix_text(**extra: object) -> str:
    """The cell's matrix, with more top-level keys (JSON is YAML)."""
    doc = yaml.safe_load(cells.jax_cpu_matrix(REPOSITORY))
    return json.dumps({**doc, **extra}, indent=2) + "\n"


def dead_port() -> int:
    """A loopback port nothing listens on (bound, then closed)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def unreachable(env: dict[str, str]) -> dict[str, str]:
    dead = f"http://127.0.0.1:{dead_port()}"
    out = {k: v for k, v in env.items() if k.lower() not in ("no_proxy",)}
    for name in ("HTTPS_PROXY", "HTTP_PROXY", "https_proxy", "http_proxy", "ALL_PROXY"):
        out[name] = dead
    return out


@pytest.fixture(scope="session")
def wheelhouse_cache(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """XDG_CACHE_HOME of the wheelhouse tests (session-wide, test_engine_private_index.py's
    too)."""
    return tmp_path_factory.getbasetemp() / "wheelhouse-cache"


@pytest.fixture(scope="module")
def online(tmp_path_factory, wheelhouse_cache):
    """The locked cell, built online into an empty (or this session's) wheelhouse. Not
    --no-cache: the engine's layer cache may serve this build; what the tests below check
    is the build's context, its history and an offline --no-cache rebuild, which runs the
    install step whatever happened here."""
    tmp = tmp_path_factory.mktemp("wheelhouse")
    matrix = tmp / "matrix.yaml"
    matrix.write_text(matrix_text())
    env = clean_env(XDG_CACHE_HOME=str(wheelhouse_cache))
    gpuenv_cmd("lock", "-f", str(matrix), "--exclude-newer", EXCLUDE_NEWER, env=env)
    proc = gpuenv_cmd("build", "-f", str(matrix), "--json", env=env)
    result = json.loads(proc.stdout)["results"][0]
    assert result["status"] == "built", output(proc)
    docker("tag", result["image_id"], KEEP)
    return {"matrix": matrix, "env": env, "image_id": result["image_id"]}


def cache_info(env: dict[str, str]) -> dict:
    return json.loads(gpuenv_cmd("cache", "--json", env=env).stdout)


def locked_hashes(matrix: Path) -> dict[str, set[str]]:
    """The lock's python_env entry of the cell: name==version -> its sha256 hashes."""
    text = yaml.safe_load(matrix.with_suffix(".lock").read_text())["cells"][CELL]["python_env"]
    found: dict[str, set[str]] = {}
    pin = ""
    for line in text.splitlines():
        line = line.strip().removesuffix("\\").strip()
        if line and not line.startswith(("#", "--hash=")):
            pin = line.split(";")[0].strip()
            found[pin] = set()
        elif line.startswith("--hash=sha256:"):
            found[pin].add(line.removeprefix("--hash=sha256:"))
    return found


def test_the_install_step_names_no_index_and_gets_the_locked_wheels(online):
    history = docker("history", "--no-trunc", "--format", "{{.CreatedBy}}", online["image_id"])
    (install,) = [line for line in history.stdout.splitlines() if "uv pip install" in line]
    assert "--offline --no-index --find-links /mnt --require-hashes" in install, install
    assert "http" not in history.stdout and "pypi" not in history.stdout
    info = cache_info(online["env"])
    assert info["files"] >= 6 and info["bytes"] > 100_000_000, info  # JAX and its deps
    # What the step mounted: the lock's resolution and, per locked requirement, one wheel
    # whose bytes have one of its locked hashes (checked here, not taken from gpuenv).
    cache_home = Path(online["env"]["XDG_CACHE_HOME"])
    sent = cells.context_dir(cache_home, online["matrix"], CELL)
    part = sent / "python-env"
    entry = locked_hashes(online["matrix"])
    assert len(entry) >= 5 and "jax==0.7.2" in entry and "jaxlib==0.7.2" in entry, sorted(entry)
    wheels = sorted(part.glob("*.whl"))
    assert len(wheels) == len(entry), (len(wheels), len(entry))
    all_hashes = {h for hashes in entry.values() for h in hashes}
    for wheel in wheels:
        with wheel.open("rb") as fh:
            assert hashlib.file_digest(fh, "sha256").hexdigest() in all_hashes, wheel.name
    assert (part / "uv").stat().st_mode & 0o111, "uv's executable, sent with the wheels"
    assert sorted(p.name for p in sent.iterdir()) == ["Dockerfile", "cell.json", "python-env",
                                                       "requirements"]  # fmt: skip


def test_offline_no_cache_rebuild_with_upstream_unreachable_is_identical(online):
    before = cache_info(online["env"])
    env = unreachable(online["env"])
    proc = gpuenv_cmd(
        "build", "-f", str(online["matrix"]), "--no-cache", "--offline", "--json",
        env=env, check=False,
    )  # fmt: skip
    assert proc.returncode == 0, output(proc)
    result = json.loads(proc.stdout)["results"][0]
    assert result["status"] == "built" and result["image_id"] != online["image_id"]
    assert cache_info(online["env"])["files"] == before["files"]  # nothing new fetched
    diff = gpuenv_cmd("diff", KEEP, IMAGE, "-f", str(online["matrix"]), env=env, check=False)
    assert diff.returncode == 0 and "identical" in diff.stdout, output(diff)


def test_offline_with_an_empty_wheelhouse_names_what_is_missing(online, tmp_path):
    env = clean_env(XDG_CACHE_HOME=str(tmp_path / "empty"))
    before = inspect(IMAGE)
    proc = gpuenv_cmd(
        "build", "-f", str(online["matrix"]), "--offline", "--no-cache", env=env, check=False
    )
    assert proc.returncode == 1, output(proc)
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: --offline: the wheelhouse lacks")
    assert "jax==0.7.2" in lines[0] and "gpuenv cache import" in lines[0]
    assert (inspect(IMAGE) or {}).get("Id") == (before or {}).get("Id")  # nothing retagged


def test_offline_with_an_empty_wheelhouse_leaves_an_up_to_date_cell_as_it_is(online, tmp_path):
    """--offline checks what the cells it builds need: one whose image is up to date needs
    nothing from the wheelhouse, so an empty one is no error."""
    env = unreachable(clean_env(XDG_CACHE_HOME=str(tmp_path / "empty")))
    before = inspect(IMAGE)
    proc = gpuenv_cmd(
        "build", "-f", str(online["matrix"]), "--offline", "--json", env=env, check=False
    )
    assert proc.returncode == 0, output(proc)
    assert json.loads(proc.stdout)["results"][0]["status"] == "cached", output(proc)
    assert (inspect(IMAGE) or {}).get("Id") == (before or {}).get("Id")


def test_offline_refuses_apt_packages_and_unlocked_cells(tmp_path, wheelhouse_cache):
    env = clean_env(XDG_CACHE_HOME=str(wheelhouse_cache))
    matrix = tmp_path / "matrix.yaml"
    matrix.write_text(matrix_text(packages={"apt": ["git"]}))
    proc = gpuenv_cmd("build", "-f", str(matrix), "--offline", env=env, check=False)
    assert proc.returncode == 1
    assert proc.stderr.strip().splitlines() == [
        f"error: --offline cannot install apt packages (they come from Debian's archive): "
        f"{CELL}; build these cells online"
    ]
    matrix.write_text(matrix_text())  # no lock here
    proc = gpuenv_cmd("build", "-f", str(matrix), "--offline", env=env, check=False)
    assert proc.returncode == 1 and "--offline builds locked cells only" in proc.stderr


def test_export_then_import_into_an_empty_wheelhouse_builds_offline(online, tmp_path):
    tarball = tmp_path / "carry.tar"
    proc = gpuenv_cmd("cache", "export", str(tarball), "-f", str(online["matrix"]),
                      env=online["env"])  # fmt: skip
    info = cache_info(online["env"])
    assert f"{info['files']} file(s), 1 base image(s)" in proc.stdout
    env = clean_env(XDG_CACHE_HOME=str(tmp_path / "other"))
    proc = gpuenv_cmd("cache", "import", str(tarball), "-f", str(online["matrix"]), env=env)
    assert f"{info['files']} new file(s), 1 base image(s) loaded" in proc.stdout
    assert cache_info(env)["files"] == info["files"]
    assert cache_info(env)["bytes"] == info["bytes"]
    # The imported wheelhouse alone builds the locked cell (another repository, the same
    # lock: a tag of its own) with every upstream unreachable.
    carried = tmp_path / "carried"
    carried.mkdir()
    doc = json.loads(online["matrix"].read_text())
    doc["name"] = KEEP.split(":")[0]
    (carried / "matrix.yaml").write_text(json.dumps(doc))
    shutil.copyfile(online["matrix"].with_suffix(".lock"), carried / "matrix.lock")
    proc = gpuenv_cmd("build", "-f", str(carried / "matrix.yaml"), "--offline", "--json",
                      env=unreachable(env), check=False)  # fmt: skip
    assert proc.returncode == 0, output(proc)
    (result,) = json.loads(proc.stdout)["results"]
    assert result["status"] == "built", result
    assert cache_info(env)["files"] == info["files"]  # nothing fetched
