"""The CA bundle check's remembered verdict (gpuenv/store/ca.py): a bundle that passed is not
parsed again while one of its certificates is valid; other bytes, or a verdict past its
certificates' expiry, are checked in full."""

from __future__ import annotations

import shutil
import ssl
import time
from pathlib import Path

import certifi
import pytest

from gpuenv.matrix.errors import GpuenvError
from gpuenv.store import ca, cache


@pytest.fixture(autouse=True)
def cache_home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    return tmp_path / "cache"


@pytest.fixture
def bundle(tmp_path: Path) -> Path:
    path = tmp_path / "ca.pem"
    shutil.copyfile(certifi.where(), path)
    return path


def parsing_fails(monkeypatch: pytest.MonkeyPatch) -> None:
    class Refused(ssl.SSLContext):
        def load_verify_locations(self, *args: object, **kwargs: object) -> None:
            raise ssl.SSLError("parsed again")

    monkeypatch.setattr(ssl, "SSLContext", Refused)


def test_a_good_bundle_is_parsed_once(bundle, monkeypatch):
    ca.check_bundle(bundle, "test")
    (until,) = cache.read_record(ca.CHECKED).values()
    assert until > time.time()
    parsing_fails(monkeypatch)
    ca.check_bundle(bundle, "test")  # remembered: not parsed
    bundle.write_bytes(bundle.read_bytes() + b"\n")  # other bytes: parsed, and refused here
    with pytest.raises(GpuenvError, match="does not parse"):
        ca.check_bundle(bundle, "test")


def test_a_verdict_ends_when_the_certificates_expire(bundle, monkeypatch):
    ca.check_bundle(bundle, "test")
    (until,) = cache.read_record(ca.CHECKED).values()
    parsing_fails(monkeypatch)
    monkeypatch.setattr(time, "time", lambda: until + 1)
    with pytest.raises(GpuenvError, match="does not parse"):
        ca.check_bundle(bundle, "test")


def test_bad_bundles_are_never_remembered(tmp_path):
    from test_hostile_inputs import EXPIRED_CA

    expired = tmp_path / "expired.pem"
    expired.write_text(EXPIRED_CA)
    for _ in range(2):
        with pytest.raises(GpuenvError, match="expired"):
            ca.check_bundle(expired, "test")
    assert cache.read_record(ca.CHECKED) == {}


def test_a_corrupt_record_is_ignored(bundle, cache_home):
    (cache_home / "gpuenv").mkdir(parents=True)
    (cache_home / "gpuenv" / ca.CHECKED).write_text('{"x": "soon", "y": [1]}')
    ca.check_bundle(bundle, "test")
    assert len(cache.read_record(ca.CHECKED)) == 1
