"""Where two images part (gpuenv/building/layerfiles.py): the first layer whose diff ID
differs and the files in it, from images saved as `docker save` writes them (made here) or
from a record written by `build --record`."""

from __future__ import annotations

import gzip
import io
import json
import tarfile
from pathlib import Path

import pytest

from gpuenv.building import layerfiles
from gpuenv.matrix.errors import GpuenvError


def _layer(files: dict[str, tuple[bytes, int, int]]) -> bytes:
    """A layer tar: path -> (content, mode, uid)."""
    out = io.BytesIO()
    with tarfile.open(fileobj=out, mode="w") as tar:
        for name, (data, mode, uid) in sorted(files.items()):
            info = tarfile.TarInfo(name)
            info.size, info.mode, info.uid, info.mtime = len(data), mode, uid, 1735689600
            tar.addfile(info, io.BytesIO(data))
    return out.getvalue()


def _saved(path: Path, layers: list[bytes]) -> Path:
    """An image as `docker save` writes it (the manifest, the config, the layers)."""
    import hashlib

    diff_ids = [f"sha256:{hashlib.sha256(layer).hexdigest()}" for layer in layers]
    config = json.dumps({"rootfs": {"type": "layers", "diff_ids": diff_ids}}).encode()
    names = [f"{d[7:]}/layer.tar" for d in diff_ids]
    manifest = json.dumps([{"Config": "c.json", "Layers": names}]).encode()
    with tarfile.open(path, "w") as tar:
        for name, data in [("manifest.json", manifest), ("c.json", config),
                           *zip(names, layers, strict=True)]:  # fmt: skip
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    return path


BASE = _layer({"etc/os-release": (b"debian\n", 0o644, 0)})
ENV = {"etc/shadow": (b"gpuenv:!:20089:0\n", 0o640, 0), "opt/venv/a.py": (b"a = 1\n", 0o644, 0)}


def test_the_first_differing_layer_and_its_files_are_named(tmp_path):
    other = {
        **ENV,
        "etc/shadow": (b"gpuenv:!:20794:0\n", 0o640, 0),
        "opt/venv/a.py": (b"a = 1\n", 0o600, 1000),
        "opt/venv/new": (b"", 0o644, 0),
    }
    want = layerfiles.Saved(_saved(tmp_path / "a.tar", [BASE, _layer(ENV)]))
    have = layerfiles.Saved(_saved(tmp_path / "b.tar", [BASE, _layer(other)]))
    assert layerfiles._first(want.diff_ids, have.diff_ids) == 1
    lines = layerfiles.differences(want.files(1), have.files(1))
    assert lines[0].startswith("etc/shadow: content ")
    assert lines[1] == "opt/venv/a.py: mode 0644 -> 0600, owner 0:0 -> 1000:0"
    assert lines[2] == "opt/venv/new: only in the rebuild"
    assert layerfiles.differences(have.files(1), want.files(1))[2] == "opt/venv/new: missing"


def test_many_differences_are_counted_past_the_limit():
    a = {f"f{i}": layerfiles.Entry("file", "0644", "0:0", 0, "a", "") for i in range(30)}
    b = {k: v._replace(content="b") for k, v in a.items()}
    lines = layerfiles.differences(a, b, limit=5)
    assert len(lines) == 6 and lines[-1] == "... and 25 more files"


def test_layer_counts_that_differ_are_named():
    assert layerfiles._first(["a", "b"], ["a", "b", "c"]) == 2
    assert layerfiles._first(["a", "b"], ["a", "b"]) is None
    assert layerfiles._where("x", 2, ["a", "b"], ["a", "b", "c"]) == "x has 3 layers, 2 expected"


def test_a_record_round_trips_gzipped_and_a_bad_one_is_one_error(tmp_path):
    path = tmp_path / "r.json.gz"
    path.write_bytes(gzip.compress(json.dumps({"version": 1, "cells": {}}).encode(), mtime=0))
    assert layerfiles.load_record(path) == {"version": 1, "cells": {}}
    (tmp_path / "bad.json").write_text('{"layers": []}')
    with pytest.raises(GpuenvError, match="not a layer record of this gpuenv"):
        layerfiles.load_record(tmp_path / "bad.json")
    with pytest.raises(GpuenvError, match="cannot read a layer record"):
        layerfiles.load_record(tmp_path / "missing.json")


def test_configs_that_differ_name_their_keys_and_labels():
    a = {"config": {"Env": ["A=1"], "Labels": {"io.gpuenv.recipe": "0.1.0 sha256:a", "x": "y"}}}
    b = {"config": {"Env": ["A=1"], "Labels": {"io.gpuenv.recipe": "0.2.0 sha256:b", "x": "y"}}}
    said = layerfiles._config_differences(a, b)
    assert said == "the config differs in Labels (io.gpuenv.recipe)"
    assert layerfiles._config_differences(a, a) == "the history differs"
