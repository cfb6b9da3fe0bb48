"""gpuenv/building/reproducible.py's canonical form, on layers and configs made here: what two
engines write differently (copy-ups, mode bits, whiteout markers, mount points, header order) comes
out the same; what a step really changed stays."""

from __future__ import annotations

import io
import tarfile

from gpuenv.building import reproducible

EPOCH = 1735689600


def layer(*entries: tuple[str, str, int, bytes], go_modes: bool = False) -> tarfile.TarFile:
    """A layer tar of (name, kind, mode, data): kind 'f' file, 'd' directory. With go_modes,
    the modes carry the file-type bits, as the engine's Go tar writer puts them (Python's
    writer masks them, so they are set on the members read back)."""
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w", format=tarfile.GNU_FORMAT) as tar:
        for name, kind, mode, data in entries:
            info = tarfile.TarInfo(name)
            info.mode, info.mtime = mode, 1795478400 + len(name)
            info.uname = "someone"
            if kind == "d":
                info.type = tarfile.DIRTYPE
                tar.addfile(info)
            else:
                info.size = len(data)
                tar.addfile(info, io.BytesIO(data))
    buf.seek(0)
    tar = tarfile.open(fileobj=buf)  # noqa: SIM115 - the caller reads it
    if go_modes:
        for member in tar.getmembers():
            member.mode |= 0o40000 if member.isdir() else 0o100000
    return tar


def canonical(layers: list[tarfile.TarFile]) -> list[bytes]:
    state: dict = {}
    out = []
    for src in layers:
        buf = io.BytesIO()
        with tarfile.open(fileobj=buf, mode="w", format=tarfile.PAX_FORMAT) as dst:
            reproducible.canonical_layer(src, dst, EPOCH, state)
        out.append(buf.getvalue())
    return out


def names(blob: bytes) -> list[str]:
    return tarfile.open(fileobj=io.BytesIO(blob)).getnames()


BASE = (
    ("./etc", "d", 0o755, b""),
    ("./etc/group-", "f", 0o644, b"root:x:0:\n"),
    ("./mnt", "d", 0o755, b""),
    ("./tmp", "d", 0o1777, b""),
)


def test_a_rootful_copy_up_and_a_rootless_diff_give_one_layer():
    # Rootful overlay2 lists /tmp and /etc/group- (touched, rewritten with the same bytes),
    # with Go's file-type bits in the mode; the rootless naive diff lists only the change.
    rootful = layer(("etc/", "d", 0o755, b""), ("etc/group-", "f", 0o644, b"root:x:0:\n"),
                    ("tmp/", "d", 0o1777, b""), ("opt/x", "f", 0o644, b"new"),
                    go_modes=True)  # fmt: skip
    rootless = layer(("opt/x", "f", 0o644, b"new"))
    a = canonical([layer(*BASE), rootful])
    b = canonical([layer(*BASE), rootless])
    assert a == b
    assert names(a[1]) == ["opt/x"]


def test_a_real_change_stays():
    changed = layer(("etc/group-", "f", 0o644, b"root:x:0:\ngpuenv:x:1000:\n"))
    assert names(canonical([layer(*BASE), changed])[1]) == ["etc/group-"]
    chmod = layer(("tmp", "d", 0o755, b""))
    assert names(canonical([layer(*BASE), chmod])[1]) == ["tmp"]


def test_podman_traces_are_dropped_and_whiteouts_are_canonical():
    podman = layer(("etc/hostname", "f", 0o644, b""), ("etc/hosts", "f", 0o644, b""),
                   (".wh.mnt", "f", 0, b""), ("etc/.wh.group-", "f", 0, b""),
                   ("opt/x", "f", 0o644, b"new"))  # fmt: skip
    docker = layer(("etc/.wh.group-", "f", 0o644, b""), ("opt/x", "f", 0o644, b"new"))
    a = canonical([layer(*BASE), podman])
    assert a == canonical([layer(*BASE), docker])
    assert names(a[1]) == ["etc/.wh.group-", "opt/x"]
    with tarfile.open(fileobj=io.BytesIO(a[1])) as tar:
        marker = tar.getmember("etc/.wh.group-")
    assert (marker.mode, marker.size, marker.mtime, marker.uname) == (0, 0, EPOCH, "")


def test_a_non_empty_hosts_file_a_step_wrote_stays():
    wrote = layer(("etc/hosts", "f", 0o644, b"10.0.0.1 db\n"))
    assert names(canonical([layer(*BASE), wrote])[1]) == ["etc/hosts"]


def test_entries_are_sorted_and_mtimes_clamped():
    shuffled = layer(("z", "f", 0o644, b"1"), ("a/b", "f", 0o644, b"2"), ("a", "d", 0o755, b""))
    (blob,) = canonical([shuffled])
    with tarfile.open(fileobj=io.BytesIO(blob)) as tar:
        assert tar.getnames() == ["a", "a/b", "z"]
        assert {m.mtime for m in tar.getmembers()} == {EPOCH}


def test_a_removed_directory_leaves_the_state():
    gone = layer(("etc/.wh..wh..opq", "f", 0, b""), ("etc/new", "f", 0o644, b"x"))
    again = layer(("etc/group-", "f", 0o644, b"root:x:0:\n"))  # not in etc any more: kept
    out = canonical([layer(*BASE), gone, again])
    assert names(out[2]) == ["etc/group-"]


def test_config_keeps_what_a_container_gets_and_nothing_of_the_builder():
    config = {
        "architecture": "amd64",
        "os": "linux",
        "created": "2026-11-22T01:02:03.456Z",
        "container": "abc123",
        "config": {"Image": "sha256:parent", "Env": ["A=1"], "Hostname": "abc",
                   "Labels": {"x": "y", "io.buildah.version": "1.28.2"}, "Entrypoint": []},
        "container_config": {"Image": "sha256:parent", "Hostname": "abc123", "Cmd": ["x"]},
        "history": [{"created": "2026-11-22T01:00:00Z", "created_by": "RUN x"}],
        "rootfs": {"type": "layers", "diff_ids": ["sha256:old"]},
    }  # fmt: skip
    out = reproducible.normalize_config(config, ["sha256:new"], EPOCH)
    assert out == {
        "architecture": "amd64",
        "os": "linux",
        "config": {"Env": ["A=1"], "Labels": {"x": "y"}},
        "created": "2025-01-01T00:00:00Z",
        "history": [{"created": "2025-01-01T00:00:00Z",
                     "created_by": "gpuenv --reproducible: layer 1"}],
        "rootfs": {"type": "layers", "diff_ids": ["sha256:new"]},
    }  # fmt: skip
    assert config["container"] == "abc123"  # the input is not modified
