"""`gpuenv build --reproducible`'s normalising step on the real engine: two `--no-cache`
builds of the same Dockerfile differ (timestamps, build-container traces); normalised, they
are the same image, bit for bit (same ID). Small images keep this fast; the same code
normalises cells (see docs/locking.md)."""

from __future__ import annotations

import os
import subprocess
import uuid

import pytest
from support.cells import TEST_REPOSITORY_PREFIX

pytestmark = pytest.mark.engine

BASE = "gpuenv/debian:bookworm"
EPOCH = 1735689600


def _build(context, tag: str) -> None:
    subprocess.run(
        ["docker", "build", "-q", "--no-cache", "--network", "host", "-t", tag, str(context)],
        check=True,
        capture_output=True,
        env={**os.environ, "DOCKER_BUILDKIT": "0"},
    )


def test_two_no_cache_builds_normalise_to_the_same_image(tmp_path, gpuenv, in_image):
    from gpuenv.building import reproducible
    from gpuenv.engine import client as engine

    eng = engine.connect()
    if eng.image(BASE) is None:
        gpuenv("base")  # the shipped matrix's bases, bookworm among them
    (tmp_path / "Dockerfile").write_text(
        f"FROM {BASE}\n"
        "RUN mkdir -p /opt/x && echo hello > /opt/x/f && chmod 4755 /opt/x/f "
        "&& useradd -u 1234 zed\n"
        "ENV A=1\nLABEL x=y\n"
    )
    repo = f"{TEST_REPOSITORY_PREFIX}/repro-{uuid.uuid4().hex[:8]}"
    refs = [f"{repo}:a", f"{repo}:b"]
    originals = []
    try:
        for ref in refs:
            _build(tmp_path, ref)
            originals.append(eng.image(ref).id)
        assert originals[0] != originals[1]  # the premise: the builder is not reproducible
        ids = [reproducible.normalize(eng, ref, EPOCH) for ref in refs]
        assert ids[0] == ids[1]
        info = eng.image(refs[0])
        assert reproducible.is_normalized(info, EPOCH)
        assert info.labels["x"] == "y" and "A=1" in info.env
        script = "cat /opt/x/f; stat -c '%a %Y' /opt/x/f; id -u zed"
        out = in_image(refs[0], "sh", "-c", script).split()
        assert out == ["hello", "4755", str(EPOCH), "1234"]
    finally:
        for ref in refs:
            eng.remove_image(ref, force=True)
        for image_id in originals:
            eng.remove_image(image_id, force=True)
