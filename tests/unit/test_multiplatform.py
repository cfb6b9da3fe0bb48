"""gpuenv.publish.multiplatform and push's pairing of cells into index tags, without a registry: the
registry's side is a stand-in holding manifests and config blobs by digest."""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from typing import Any

import pytest

from gpuenv.matrix.errors import GpuenvError
from gpuenv.publish import multiplatform
from gpuenv.publish import push as publish
from gpuenv.publish.multiplatform import DOCKER_LIST, DOCKER_MANIFEST, OCI_INDEX, OCI_MANIFEST
from gpuenv.registry import client


def digest(data: bytes) -> str:
    return "sha256:" + hashlib.sha256(data).hexdigest()


class Registry:
    """What multiplatform.member reads: manifest(ref) -> (bytes, media) | None, blob(), and
    the client's own config() over them."""

    host, name, ref = "127.0.0.1:5000", "team/jax", "127.0.0.1:5000/team/jax"
    config = client.Repository.config

    def __init__(self) -> None:
        self.blobs: dict[str, bytes] = {}
        self.manifests: dict[str, tuple[bytes, str]] = {}

    def image(self, config: dict[str, Any], media: str = DOCKER_MANIFEST) -> str:
        raw = json.dumps(config).encode()
        self.blobs[digest(raw)] = raw
        body = json.dumps({"schemaVersion": 2, "mediaType": media,
                           "config": {"digest": digest(raw)}}).encode()  # fmt: skip
        self.manifests[digest(body)] = (body, media)
        return digest(body)

    def manifest(self, ref: str) -> tuple[bytes, str] | None:
        return self.manifests.get(ref)

    def blob(self, ref: str, limit: int) -> bytes | None:
        return self.blobs.get(ref)


def test_the_platform_comes_from_the_image_config_and_arm64_says_v8():
    assert multiplatform.platform_of({"architecture": "amd64", "os": "linux"}) == {
        "architecture": "amd64", "os": "linux"}  # fmt: skip
    assert multiplatform.platform_of({"architecture": "arm64", "os": "linux"})["variant"] == "v8"
    with pytest.raises(GpuenvError, match="no architecture"):
        multiplatform.platform_of({"os": "linux"})


def test_docker_manifests_get_a_manifest_list_with_both_platforms():
    reg = Registry()
    amd = multiplatform.member(reg, reg.image({"architecture": "amd64", "os": "linux"}))
    arm = multiplatform.member(reg, reg.image({"architecture": "arm64", "os": "linux"}))
    data, media = multiplatform.index_document([arm, amd])
    doc = json.loads(data)
    assert media == doc["mediaType"] == DOCKER_LIST
    assert [m["platform"]["architecture"] for m in doc["manifests"]] == ["amd64", "arm64"]
    assert [m["digest"] for m in doc["manifests"]] == [amd.digest, arm.digest]
    assert doc["manifests"][1]["size"] == len(reg.manifests[arm.digest][0])
    # the same pair gives the same bytes, so pushing twice gives the same digest
    assert multiplatform.index_document([amd, arm])[0] == data


def test_oci_manifests_get_an_oci_index():
    reg = Registry()
    refs = [reg.image({"architecture": a, "os": "linux"}, OCI_MANIFEST) for a in ("amd64", "arm64")]
    members = [multiplatform.member(reg, ref) for ref in refs]
    assert multiplatform.index_document(members)[1] == OCI_INDEX


def test_two_images_of_one_platform_are_refused():
    """An arm64 cell whose base was really amd64 must not hide behind an index."""
    reg = Registry()
    a = multiplatform.member(reg, reg.image({"architecture": "amd64", "os": "linux"}))
    b = multiplatform.member(reg, reg.image({"architecture": "amd64", "os": "linux", "x": 1}))
    with pytest.raises(GpuenvError, match="one image per platform"):
        multiplatform.index_document([a, b])


def test_a_missing_manifest_or_config_is_an_error():
    reg = Registry()
    with pytest.raises(GpuenvError, match="not in the registry"):
        multiplatform.member(reg, "sha256:" + "0" * 64)
    ref = reg.image({"architecture": "arm64", "os": "linux"})
    reg.blobs.clear()
    with pytest.raises(GpuenvError, match="config blob"):
        multiplatform.member(reg, ref)


# --------------------------------------------------------------------------- pairing in push


@dataclass
class FakeCell:
    name: str
    arch: str = "amd64"


REPO = "127.0.0.1:5000/team/jax"
PAIR = [FakeCell("jax0.7-py3.11-cpu"), FakeCell("jax0.7-py3.11-cpu-arm64", "arm64")]


def pushed(cell: str, status: str = "pushed") -> publish.TagResult:
    found = digest(cell.encode()) if status == "pushed" else None
    return publish.TagResult(cell, f"{REPO}:{cell}", status, digest=found)


def test_a_pushed_pair_gets_one_index_tag(monkeypatch):
    calls = []

    def fake_push_index(repo: str, tag: str, digests: list[str]) -> tuple[str, list[str]]:
        calls.append((repo, tag, digests))
        return "sha256:" + "1" * 64, ["linux/amd64", "linux/arm64/v8"]

    monkeypatch.setattr(multiplatform, "push_index", fake_push_index)
    results = [pushed(c.name) for c in PAIR]
    (index,) = publish._multiplatform(PAIR, results, REPO)  # type: ignore[arg-type]
    assert calls == [(REPO, "jax0.7-py3.11-cpu-multiarch", [r.digest for r in results])]
    assert index.ref == f"{REPO}:jax0.7-py3.11-cpu-multiarch" and index.status == "pushed"
    assert index.to_json()["platforms"] == ["linux/amd64", "linux/arm64/v8"]
    assert "platforms" not in results[0].to_json()  # per-arch tags keep their JSON shape


def test_an_index_is_refused_when_one_platform_was_not_pushed(monkeypatch):
    monkeypatch.setattr(multiplatform, "push_index", lambda *a: pytest.fail("pushed"))
    results = [pushed(PAIR[0].name), pushed(PAIR[1].name, "refused")]
    (index,) = publish._multiplatform(PAIR, results, REPO)  # type: ignore[arg-type]
    assert index.status == "refused" and "jax0.7-py3.11-cpu-arm64 refused" in str(index.error)


def test_a_cell_pushed_without_its_sibling_gets_no_index(monkeypatch):
    monkeypatch.setattr(multiplatform, "push_index", lambda *a: pytest.fail("pushed"))
    for cells in ([PAIR[0]], [PAIR[1]]):
        results = [pushed(c.name) for c in cells]
        assert publish._multiplatform(cells, results, REPO) == []  # type: ignore[arg-type]


def test_a_registry_error_fails_the_index_tag(monkeypatch):
    def refuse(*args: Any) -> Any:
        raise GpuenvError("registry 127.0.0.1:5000: manifest x: HTTP 400")

    monkeypatch.setattr(multiplatform, "push_index", refuse)
    (index,) = publish._multiplatform(PAIR, [pushed(c.name) for c in PAIR], REPO)  # type: ignore[arg-type]
    assert index.status == "failed" and "HTTP 400" in str(index.error)
