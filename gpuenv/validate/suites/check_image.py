"""Checks every image must pass: it holds exactly what its cell promises, and nothing the
build used is left in it."""

from __future__ import annotations

import re
from typing import Any

import pytest
from conftest import Box
from framework_code import CODE, base_version

from gpuenv.validate.sizes import GROWTH_LIMIT

INSTALLED_PYTHON = "import sys; print('%d.%d' % sys.version_info[:2])"


def test_python_version(box: Box) -> None:
    found = box.python(INSTALLED_PYTHON).strip()
    assert found == box.expected["python"], f"Python {found}, expected {box.expected['python']}"


MACHINE = {"linux/amd64": "x86_64", "linux/arm64": "aarch64"}


def test_machine_is_the_cells_platform(box: Box) -> None:
    """An arm64 cell runs aarch64 code (natively, or under QEMU here), not the host's."""
    wanted = MACHINE.get(str(box.expected.get("platform") or ""))
    if wanted is None:
        pytest.skip("no platform expected (an image validated by its labels)")
    found = box.python("import platform; print(platform.machine())").strip()
    assert found == wanted, f"platform.machine() is {found}, expected {wanted}"


def installed_framework(box: Box) -> str:
    """The framework's version as its own package metadata says (torch's CPU build: 2.9.1+cpu)."""
    name = box.expected["framework"]
    return box.python(f"import importlib.metadata as m; print(m.version({name!r}))").strip()


def test_framework_version(box: Box) -> None:
    found = installed_framework(box)
    exp = box.expected
    wanted = exp.get("installed_version") or exp["framework_version"]
    assert found == wanted, f"{exp['framework']} {found} is installed, expected {wanted}"


def test_pinned_packages_are_installed(box: Box) -> None:
    import pytest

    wanted = {**box.expected["pip_pins"], **box.expected["wheels"]}
    if not wanted:
        pytest.skip("the cell pins no pip packages or CUDA wheels: nothing to check")
    code = (
        "import json, importlib.metadata as m\n"
        "out = {}\n"
        f"for name in {sorted(wanted)!r}:\n"
        "    try: out[name] = m.version(name)\n"
        "    except m.PackageNotFoundError: out[name] = None\n"
        "print(json.dumps(out))"
    )
    found = box.python_json(code)
    wrong = {k: (v, found.get(k)) for k, v in wanted.items() if found.get(k) != v}
    assert not wrong, f"pinned vs installed: {wrong}"


def test_packages_match_the_lock(box: Box) -> None:
    import pytest

    drift = box.expected.get("lock_drift")
    if drift:
        # A lock entry that no longer matches the cell is no reference, but neither is it
        # "no lock": the image cannot be shown to be what the lock says. Re-lock first.
        pytest.fail(f"matrix.lock's entry for this cell drifted: {drift} (re-lock: gpuenv lock)")
    locked = box.expected.get("locked")
    if locked is None:
        pytest.skip("no matrix.lock for this cell (gpuenv lock writes one)")
    code = (
        "import json, re, importlib.metadata as m\n"
        "print(json.dumps({re.sub(r'[-_.]+', '-', d.metadata['Name']).lower(): d.version "
        "for d in m.distributions()}))"
    )
    installed = box.python_json(code)
    extra = sorted(set(installed) - set(locked))
    missing = sorted(set(locked) - set(installed))
    wrong = sorted(f"{k} {installed[k]} (locked {v})" for k, v in locked.items()
                   if k in installed and installed[k] != v)  # fmt: skip
    assert not (extra or missing or wrong), (
        f"not as locked: extra {extra}, missing {missing}, other versions {wrong}"
    )


def test_no_installer_cache_or_compiler(root_box: Box) -> None:
    # As root: /root is mode 700, the default user would see no cache there.
    result = root_box.sh(
        "id -u; ls -d /root/.cache /home/*/.cache /tmp/gpuenv-* /opt/venv/bin/uv "
        "/opt/venv/bin/pip 2>/dev/null; for c in gcc cc g++ c++ clang x86_64-linux-gnu-gcc; do "
        "command -v $c; done; true"
    )
    uid, *leftovers = result.stdout.split() or ["?"]
    assert result.rc == 0 and uid == "0", f"cannot look as root: {result.stderr.strip()}"
    assert not leftovers, f"left over from the build: {leftovers}"


def test_no_ca_beyond_the_distribution_trust_store(box: Box) -> None:
    # Every certificate the system trusts must be a file of Debian's ca-certificates package
    # (dpkg's file list, unmodified by dpkg --verify): every /etc/ssl/certs entry resolves to
    # one, the bundle holds nothing else, no local certificate is added, the build's CA is
    # gone, and certifi's bundle is the one its wheel shipped (its RECORD hash).
    code = r"""
import base64, glob, hashlib, json, os, re, subprocess
def bodies(text):
    return {''.join(b.split()) for b in re.findall(
        r'-----BEGIN CERTIFICATE-----(.*?)-----END CERTIFICATE-----', text, re.S)}
def run(*cmd):
    p = subprocess.run(cmd, capture_output=True, text=True)
    return p.returncode, p.stdout
rc, listed = run('dpkg', '-L', 'ca-certificates')
package = {p for p in listed.splitlines() if p.startswith('/usr/share/ca-certificates/')
           and p.endswith('.crt')} if rc == 0 else set()
_, verify = run('dpkg', '--verify', 'ca-certificates')
modified = sorted(line.split()[-1] for line in verify.splitlines()
                  if line.split() and line.split()[-1] in package)
shipped = set()
for path in package - set(modified):
    if os.path.isfile(path):
        shipped |= bodies(open(path, errors='replace').read())
certs = '/etc/ssl/certs'
bundle = os.path.join(certs, 'ca-certificates.crt')
trusted = bodies(open(bundle, errors='replace').read()) if os.path.isfile(bundle) else set()
entries, outside = 0, []
for name in sorted(os.listdir(certs)) if os.path.isdir(certs) else []:
    path = os.path.join(certs, name)
    if path == bundle:
        continue
    entries += 1
    if os.path.realpath(path) not in package:
        outside.append(path + ' -> ' + os.path.realpath(path))
local = [p for p in glob.glob('/usr/local/share/ca-certificates/**', recursive=True)
         if os.path.isfile(p)]
stray = [p for p in ('/tmp/gpuenv-ca.pem',) if os.path.exists(p)]
certifi = None
try:
    import certifi as c
    pem = c.where()
    digest = 'sha256=' + base64.urlsafe_b64encode(
        hashlib.sha256(open(pem, 'rb').read()).digest()).rstrip(b'=').decode()
    record = [l for p in glob.glob(os.path.dirname(os.path.dirname(pem)) +
              '/certifi-*.dist-info/RECORD') for l in open(p)]
    ok = any(l.startswith('certifi/cacert.pem,' + digest) for l in record)
    certifi = {'path': pem, 'matches_record': ok}
except ImportError:
    pass
print(json.dumps({'package': len(package), 'modified': modified, 'trusted': len(trusted),
                  'extra': len(trusted - shipped), 'entries': entries, 'outside': outside,
                  'local': local, 'stray': stray, 'certifi': certifi}))
"""
    found: dict[str, Any] = box.python_json(code)
    # Fail closed: nothing to compare with, or nothing examined, is no proof.
    assert found["package"], "dpkg lists no certificates of ca-certificates (not installed?)"
    assert found["trusted"] and found["entries"], (
        f"no trust store examined: {found['trusted']} certificate(s) in the bundle, "
        f"{found['entries']} entries in /etc/ssl/certs"
    )
    assert not (found["extra"] or found["local"] or found["outside"] or found["modified"]), (
        f"{found['extra']} trusted certificate(s) not from Debian's ca-certificates package; "
        f"local CA certificates: {found['local']}; /etc/ssl/certs entries outside the "
        f"package: {found['outside'][:5]}; package certificates modified: {found['modified']}"
    )
    assert not found["stray"], f"CA bundle left by the build: {found['stray']}"
    if found["certifi"] is not None:
        assert found["certifi"]["matches_record"], "certifi's cacert.pem was modified"


def test_default_user_is_not_root(box: Box) -> None:
    user = box.config["User"]
    assert user and user.split(":")[0] not in ("0", "root"), f"image USER is {user!r}"
    assert box.sh("id -u").stdout.strip() != "0"


def test_labels_agree_with_the_contents(box: Box) -> None:
    labels = box.config["Labels"]
    exp = box.expected
    for key, value in exp["labels"].items():
        assert labels.get(key) == value, f"label {key}={labels.get(key)!r}, expected {value!r}"
    assert labels.get("io.gpuenv.framework-version") == exp["framework_version"]
    assert labels.get("io.gpuenv.python") == exp["python"]
    assert labels.get("io.gpuenv.variant") == exp["variant"]
    assert labels.get("io.gpuenv.cuda", "") == (exp["cuda"] or "")
    assert labels.get("io.gpuenv.cudnn", "") == (exp["cudnn"] or "")
    spec_hash = labels.get("io.gpuenv.spec-hash", "")
    assert re.fullmatch(r"[0-9a-f]{64}", spec_hash), f"io.gpuenv.spec-hash={spec_hash[:100]!r}"
    # Against the contents themselves too: for `-i IMAGE` the expectations come from the
    # labels, so comparing with them alone would let a wrong label agree with itself. (The
    # Python label needs no such line: with -i the expected Python is the label, and
    # test_python_version compares the interpreter with it; with a cell both are compared
    # with the cell. One fact, one check, so a wrong interpreter fails that check alone.)
    installed = base_version(installed_framework(box))
    key = "io.gpuenv.framework-version"
    assert labels.get(key) == installed, (
        f"label {key}={labels.get(key)!r}, the image has {installed!r}"
    )
    # The cell name the other labels describe (a cell's own name, or for -i the one the
    # catalog gives those claims): a label saying another cell, or holding a newline, fails.
    assert labels.get("io.gpuenv.cell") == exp["name"], (
        f"label io.gpuenv.cell={labels.get('io.gpuenv.cell', '')[:100]!r}, expected {exp['name']!r}"
    )


def test_no_driver_files(root_box: Box) -> None:
    # As root, and find must read every directory: one it cannot read could hide a driver.
    result = root_box.sh(
        "find / -xdev \\( -name 'libcuda.so*' -o -name 'libnvidia-*' -o -name 'nvidia-smi' "
        "-o -name 'libnvcuvid.so*' \\) -print"
    )
    found = result.stdout.split()
    assert not found, f"driver files in the image: {found}"
    assert result.rc == 0, f"find could not search the whole image: {result.stderr.strip()[:300]}"


def test_framework_computes_on_the_cpu(box: Box) -> None:
    code = CODE[box.expected["framework"]]
    # JAX_PLATFORMS=cpu: a JAX GPU image without a GPU would first try (and warn about) CUDA.
    found = box.python(
        "import os; os.environ.setdefault('JAX_PLATFORMS', 'cpu')\n" + code.cpu_matmul
    )
    assert found.strip().splitlines()[-1] == "512.0", f"{code.name}: {found.strip()[-300:]}"


def test_size_within_baseline(box: Box) -> None:
    import pytest

    box.config  # noqa: B018 - skips behind --host: there is no image to size
    baseline = box.target["baseline_size"]
    size = box.target["size"]
    if not baseline:
        pytest.skip("no size baseline recorded (gpuenv validate --record-sizes)")
    if size > baseline * GROWTH_LIMIT:
        largest = box.sh(
            f"du -sk {box.expected['site_packages']}/* 2>/dev/null | sort -rn | head -5"
        ).stdout.strip()
        raise AssertionError(
            f"image is {size / 1e6:.0f} MB, {size / baseline:.2f}x its baseline "
            f"{baseline / 1e6:.0f} MB (limit {GROWTH_LIMIT}x); largest packages (kB): "
            + "; ".join(" ".join(line.split()) for line in largest.splitlines())
            + "; largest layers: "
            + "; ".join(
                f"{layer['size'] / 1e6:.0f} MB {layer['created_by'][:80]}"
                for layer in box.target.get("layers") or []
            )
        )
