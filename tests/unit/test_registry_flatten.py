"""The flattening of an image's layers without an engine (gpuenv/registry/flatten.py), by
the OCI image spec's rules (layer.md: whiteouts, opaque whiteouts, entries over existing
paths), hard links across layers, and a layer blob whose bytes are not its digest's
(gpuenv/registry/client.py blob_to, against a loopback HTTP server)."""

from __future__ import annotations

import gzip
import hashlib
import http.server
import io
import json
import tarfile
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

from gpuenv.matrix.errors import GpuenvError
from gpuenv.registry import flatten
from gpuenv.registry.client import OCI_INDEX, OCI_MANIFEST, RegistryUnreadable, Repository
from gpuenv.registry.fetch import Image, Layer, fetch_layers, pinned, resolve

Entry = tuple[str, "bytes | str | None"]  # a file's bytes, None for a directory, "->X" a link


def layer(tmp: Path, number: int, *entries: Entry, gz: bool = True) -> Path:
    raw = io.BytesIO()
    with tarfile.open(fileobj=raw, mode="w", format=tarfile.PAX_FORMAT) as tar:
        for name, content in entries:
            info = tarfile.TarInfo(name)
            if content is None:
                info.type, info.mode = tarfile.DIRTYPE, 0o755
                tar.addfile(info)
            elif isinstance(content, str):  # a hard link
                info.type, info.linkname = tarfile.LNKTYPE, content.removeprefix("->")
                tar.addfile(info)
            else:
                info.size = len(content)
                tar.addfile(info, io.BytesIO(content))
    path = tmp / f"layer-{number}"
    path.write_bytes(gzip.compress(raw.getvalue()) if gz else raw.getvalue())
    return path


def flattened(tmp: Path, *layers: list[Entry]) -> dict[str, bytes | str | None]:
    paths = [layer(tmp, n, *entries, gz=n % 2 == 0) for n, entries in enumerate(layers)]
    names = [f"layer {n}" for n in range(len(paths))]
    final = flatten.plan(paths, names)
    out: dict[str, bytes | str | None] = {}
    for member, body in flatten.members(paths, names, final):
        assert member.name not in out, f"{member.name} written twice"
        if member.isdir():
            out[member.name] = None
        elif member.islnk():
            out[member.name] = f"->{member.linkname}"
        else:
            assert body is not None
            out[member.name] = body.read()
    return out


def test_upper_layers_replace_and_add(tmp_path):
    got = flattened(
        tmp_path,
        [("etc", None), ("etc/a", b"1"), ("etc/b", b"2"), ("./bin/", None), ("bin/x", b"x")],
        [("etc/a", b"new"), ("etc/c", b"3")],
    )
    assert got == {"etc": None, "etc/a": b"new", "etc/b": b"2", "bin": None, "bin/x": b"x",
                   "etc/c": b"3"}  # fmt: skip


def test_whiteout_removes_a_file_and_a_whole_directory_below_it(tmp_path):
    got = flattened(
        tmp_path,
        [
            ("a", None),
            ("a/keep", b"k"),
            ("a/gone", b"g"),
            ("d", None),
            ("d/sub", None),
            ("d/sub/f", b"f"),
        ],
        [("a/.wh.gone", b""), (".wh.d", b"")],
    )
    assert got == {"a": None, "a/keep": b"k"}


def test_whiteout_applies_only_to_lower_layers(tmp_path):
    """layer.md: files in the same layer as a whiteout are hidden only by later layers."""
    got = flattened(tmp_path, [("x", b"old")], [("x", b"mine"), (".wh.x", b"")])
    assert got == {"x": b"mine"}


def test_opaque_directory_hides_all_lower_children_whatever_the_order(tmp_path):
    """layer.md's own example: a/.wh..wh..opq applied before the layer's a/b/c/foo, even when
    the tar lists it after."""
    got = flattened(
        tmp_path,
        [("a", None), ("a/b", None), ("a/b/c", None), ("a/b/c/bar", b"bar"), ("z", b"z")],
        [
            ("a", None),
            ("a/b", None),
            ("a/b/c", None),
            ("a/b/c/foo", b"foo"),
            ("a/.wh..wh..opq", b""),
        ],
    )
    assert got == {"a": None, "a/b": None, "a/b/c": None, "a/b/c/foo": b"foo", "z": b"z"}


def test_a_file_over_a_directory_removes_what_was_in_it(tmp_path):
    got = flattened(tmp_path, [("p", None), ("p/q", b"q")], [("p", b"now a file")])
    assert got == {"p": b"now a file"}


def test_hard_links_in_one_layer_stay_links(tmp_path):
    got = flattened(tmp_path, [("bin", None), ("bin/a", b"same"), ("bin/b", "->bin/a")])
    assert got == {"bin": None, "bin/a": b"same", "bin/b": "->bin/a"}


def test_hard_link_whose_file_a_later_layer_replaces_keeps_the_old_bytes(tmp_path):
    """As an overlay mount shows it: the link still names the file it was made to."""
    got = flattened(
        tmp_path,
        [("a", b"v1"), ("b", "->a"), ("c", b"v1c"), ("d", "->c")],
        [("a", b"v2"), (".wh.c", b"")],
    )
    assert got == {"a": b"v2", "b": b"v1", "d": b"v1c"}


def test_hard_link_to_nothing_is_refused(tmp_path):
    with pytest.raises(flatten.LayerError, match="names 'nowhere'"):
        flattened(tmp_path, [("b", "->nowhere")])


def test_an_entry_outside_the_root_is_refused(tmp_path):
    with pytest.raises(flatten.LayerError, match="leaves the root"):
        flattened(tmp_path, [("../../etc/passwd", b"x")])


def test_zstd_layers_are_named_not_misread(tmp_path):
    path = tmp_path / "layer-z"
    path.write_bytes(flatten.ZSTD_MAGIC + b"rest")
    with pytest.raises(flatten.LayerError, match="zstd"):
        flatten.plan([path], ["layer z"])


def test_a_tag_is_refused_a_digest_taken():
    with pytest.raises(GpuenvError, match="give the image by digest"):
        pinned("127.0.0.1:5000/team/x:latest", "--from-registry")
    ref = "127.0.0.1:5000/team/x@sha256:" + "a" * 64
    assert pinned(ref, "--from-registry") == ref


# --------------------------------------------------------------------------- a lying blob


@pytest.fixture
def blobs() -> Iterator[tuple[str, dict[str, bytes]]]:
    """A loopback HTTP server answering /v2/team/x/blobs/<digest> with what `served` holds."""
    served: dict[str, bytes] = {}

    class Handler(http.server.BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            body = served.get(self.path.rsplit("/", 1)[-1])
            self.send_response(200 if body is not None else 404)
            self.send_header("Content-Length", str(len(body or b"")))
            if body is not None and b'"mediaType"' in body[:200]:
                self.send_header("Content-Type", json.loads(body)["mediaType"])
            self.end_headers()
            self.wfile.write(body or b"")

        def log_message(self, *args: object) -> None:
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    # Polled every 10 ms: shutdown() waits out one poll, 0.5 s by default.
    thread = threading.Thread(target=server.serve_forever, args=(0.01,), daemon=True)
    thread.start()
    try:
        yield f"127.0.0.1:{server.server_address[1]}", served
    finally:
        server.shutdown()
        server.server_close()


def digest_of(data: bytes) -> str:
    return "sha256:" + hashlib.sha256(data).hexdigest()


def test_a_blob_whose_bytes_are_not_its_digest_is_refused(blobs, tmp_path):
    host, served = blobs
    good, bad = b"layer one", b"layer two"
    served[digest_of(good)] = good
    served[digest_of(bad)] = b"layer tw0"  # same size, other bytes
    image = Image(
        host,
        "team/x",
        "sha256:" + "0" * 64,
        "sha256:" + "1" * 64,
        {},
        (Layer(digest_of(good), len(good), ""), Layer(digest_of(bad), len(bad), "")),
    )
    repo = Repository(f"{host}/team/x@{image.digest}", credentials=False)
    with pytest.raises(GpuenvError, match=r"layer 2 of 2 .* hash to sha256:") as err:
        fetch_layers(repo, image, tmp_path)
    assert "refusing the image" in err.value.message
    assert (tmp_path / "layer-1").read_bytes() == good


def test_a_blob_longer_than_its_manifest_says_is_cut_off(blobs, tmp_path):
    host, served = blobs
    data = b"x" * 100
    served[digest_of(data)] = data + b"more"
    image = Image(host, "team/x", "sha256:" + "0" * 64, "sha256:" + "1" * 64, {},
                  (Layer(digest_of(data), len(data), ""),))  # fmt: skip
    repo = Repository(f"{host}/team/x@{image.digest}", credentials=False)
    with pytest.raises(GpuenvError, match="longer than the 100 bytes"):
        fetch_layers(repo, image, tmp_path)


# --------------------------------------------------------------------------- an index


def publish(served: dict[str, bytes], doc: dict[str, object]) -> str:
    data = json.dumps(doc).encode()
    served[digest_of(data)] = data
    return digest_of(data)


def image_manifest(served: dict[str, bytes], arch: str) -> str:
    config = json.dumps({"architecture": arch, "config": {"Env": [f"ARCH={arch}"]}}).encode()
    served[digest_of(config)] = config
    return publish(served, {"schemaVersion": 2, "mediaType": OCI_MANIFEST,
                            "config": {"digest": digest_of(config), "size": len(config)},
                            "layers": [{"digest": "sha256:" + "0" * 64, "size": 3}]})  # fmt: skip


def test_an_index_gives_this_platforms_manifest(blobs):
    host, served = blobs
    amd, arm = image_manifest(served, "amd64"), image_manifest(served, "arm64")
    index = publish(served, {"schemaVersion": 2, "mediaType": OCI_INDEX, "manifests": [
        {"digest": arm, "platform": {"os": "linux", "architecture": "arm64"}},
        {"digest": amd, "platform": {"os": "linux", "architecture": "amd64"}},
    ]})  # fmt: skip
    repo = Repository(f"{host}/team/x@{index}", credentials=False)
    image = resolve(repo, "arm64")
    assert (image.digest, image.settings()["Env"]) == (arm, ["ARCH=arm64"])
    assert image.ref == f"{host}/team/x@{arm}"
    with pytest.raises(GpuenvError, match=r"no linux/s390x image \(it has linux/arm64, "):
        resolve(repo, "s390x")


def test_a_manifest_whose_bytes_are_not_its_digest_is_refused(blobs):
    host, served = blobs
    digest = image_manifest(served, "amd64")
    before = served[digest]
    served[digest] = before.replace(b'"size": 3', b'"size": 4')  # one byte changed
    assert served[digest] != before
    with pytest.raises(RegistryUnreadable, match="does not match its digest"):
        resolve(Repository(f"{host}/team/x@{digest}", credentials=False))
