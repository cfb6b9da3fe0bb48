"""The wheelhouse's pure parts and its store: pages, hashes, locks, which wheel a target
installs, prune, export/import, credentials (and how `uv pip compile` gets them), and the
fetcher filling the store from a stub upstream (no network, no engine)."""

from __future__ import annotations

import contextlib
import hashlib
import io
import json
import os
import tarfile
import threading
import time
import urllib.error
from collections.abc import Iterator
from pathlib import Path
from urllib.parse import unquote, urlsplit

import pytest

from gpuenv.building import lock as locks
from gpuenv.matrix.errors import GpuenvError
from gpuenv.store import credentials, wheelhouse
from gpuenv.store.fetch import Fetcher
from gpuenv.store.wheelhouse import IndexFile, Requirement, Store, pick_wheel, wheel_rank

WHEEL = b"not really a zip, but bytes with a hash"
SHA = hashlib.sha256(WHEEL).hexdigest()
PAGE_URL = "https://index.example/simple/demo/"


def test_upstreams_put_extra_indexes_first_and_default_to_pypi():
    assert wheelhouse.upstreams(None) == ("https://pypi.org/simple/",)
    assert wheelhouse.upstreams("https://m.example/simple", ["https://x.example/s/"]) == (
        "https://x.example/s/",
        "https://m.example/simple/",
    )


def test_index_key_changes_with_the_upstreams():
    a = wheelhouse.index_key(wheelhouse.upstreams(None))
    b = wheelhouse.index_key(wheelhouse.upstreams("https://mirror.example/simple"))
    assert a != b and len(a) == 16


def test_json_page_is_parsed_with_hashes_metadata_and_relative_urls():
    doc = {
        "meta": {"api-version": "1.1"},
        "files": [
            {"filename": "demo-1.0-py3-none-any.whl", "url": "../../f/demo-1.0-py3-none-any.whl",
             "hashes": {"sha256": SHA}, "requires-python": ">=3.9",
             "core-metadata": {"sha256": "a" * 64}, "yanked": "broken"},
            {"filename": "demo-0.9.tar.gz", "url": "https://files.example/demo-0.9.tar.gz",
             "hashes": {"md5": "0" * 32}},  # no sha256: left out
            {"filename": "../evil", "url": "x", "hashes": {"sha256": SHA}},  # unsafe name
        ],
    }  # fmt: skip
    files = wheelhouse.parse_page(json.dumps(doc).encode(), wheelhouse.JSON_TYPE, PAGE_URL)
    assert files == [
        IndexFile("demo-1.0-py3-none-any.whl", "https://index.example/f/demo-1.0-py3-none-any.whl",
                  SHA, ">=3.9", "broken", "a" * 64)
    ]  # fmt: skip


def test_html_page_is_parsed_from_fragments_and_data_attributes():
    html = (
        f'<a href="/f/demo-1.0.tar.gz#sha256={SHA}" data-requires-python="&gt;=3.9" '
        f'data-dist-info-metadata="sha256={"b" * 64}">demo-1.0.tar.gz</a>'
        '<a href="/f/demo-0.1.tar.gz#md5=00">old</a>'
        f'<a href="/f/demo-0.2.tar.gz#sha256={SHA}" data-yanked>yanked</a>'
    ).encode()
    files = wheelhouse.parse_page(html, "text/html", PAGE_URL)
    assert [(f.filename, f.requires_python, f.metadata_sha256, f.yanked) for f in files] == [
        ("demo-1.0.tar.gz", ">=3.9", "b" * 64, False),
        ("demo-0.2.tar.gz", None, None, True),
    ]
    assert files[0].url == "https://index.example/f/demo-1.0.tar.gz"


def test_a_page_is_read_for_the_wanted_files_alone():
    """A build reads a page for its locked release only (grpcio's lists 11,282 files): the
    files `wanted` refuses are never made IndexFiles, in JSON and HTML pages alike."""
    other = hashlib.sha256(b"another release").hexdigest()
    doc = {"files": [
        {"filename": "demo-1.0-py3-none-any.whl", "url": "/f/a.whl", "hashes": {"sha256": SHA}},
        {"filename": "demo-0.9-py3-none-any.whl", "url": "/f/b.whl", "hashes": {"sha256": other}},
    ]}  # fmt: skip
    html = f'<a href="/f/a.whl#sha256={SHA}">a</a><a href="/f/b.whl#sha256={other}">b</a>'.encode()
    asked: list[tuple[str, str]] = []

    def wanted(filename: str, sha: str) -> bool:
        asked.append((filename, sha))
        return sha == SHA

    json_files = wheelhouse.parse_page(json.dumps(doc).encode(), wheelhouse.JSON_TYPE,
                                       PAGE_URL, wanted)  # fmt: skip
    html_files = wheelhouse.parse_page(html, "text/html", PAGE_URL, wanted)
    assert [f.sha256 for f in json_files] == [f.sha256 for f in html_files] == [SHA]
    assert ("demo-0.9-py3-none-any.whl", other) in asked  # JSON: asked by name and hash


def test_a_saved_page_adds_to_the_files_stored_before(tmp_path):
    """Each save keeps what earlier saves stored (an earlier lock's release, for an offline
    build of it); a file seen again replaces its entry (now yanked, say)."""
    store = Store(tmp_path)
    key = wheelhouse.index_key(UPSTREAM)
    old = IndexFile("demo-0.9.tar.gz", "https://x/0.9", "0" * 64)
    new = IndexFile("demo-1.0.tar.gz", "https://x/1.0", "1" * 64)
    store.save_page(key, "demo", [old], UPSTREAM[0])
    store.save_page(key, "demo", [new], UPSTREAM[0])
    store.save_page(key, "demo", [IndexFile(new.filename, new.url, new.sha256, yanked="bad")],
                    UPSTREAM[0])  # fmt: skip
    assert store.page(key, "demo") == [old, IndexFile(new.filename, new.url, new.sha256,
                                                      yanked="bad")]  # fmt: skip


def test_pages_saved_at_once_keep_every_saver_s_files(tmp_path):
    """Builds saving one project's page at the same time (two cells, two processes) each
    read their entry back to download it: none may be lost to another's save."""
    store = Store(tmp_path)
    key = wheelhouse.index_key(UPSTREAM)
    files = [IndexFile(f"demo-{i}.0.tar.gz", f"https://x/{i}", f"{i:064x}") for i in range(16)]
    start = threading.Barrier(len(files))

    def save(f: IndexFile) -> None:
        start.wait()
        store.save_page(key, "demo", [f], UPSTREAM[0])

    threads = [threading.Thread(target=save, args=(f,)) for f in files]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert sorted(store.page(key, "demo") or [], key=lambda f: f.sha256) == files


def test_store_keeps_only_bytes_that_match_their_hash(tmp_path):
    store = Store(tmp_path)
    with pytest.raises(wheelhouse.HashMismatch, match="the index said"):
        store.put("0" * 64, io.BytesIO(WHEEL), "demo")
    assert store.entries() == {} and not list((tmp_path / "files").rglob(".*"))
    store.put(SHA, io.BytesIO(WHEEL), "demo")
    assert store.verified(SHA) == store.path(SHA) and store.has(SHA)


def test_a_damaged_stored_file_is_dropped_not_served(tmp_path):
    store = Store(tmp_path)
    store.put(SHA, io.BytesIO(WHEEL), "demo")
    store.path(SHA).write_bytes(b"flipped")
    # A new build (process) checks it again; a rename into place is a new inode anyway.
    assert Store(tmp_path).verified(SHA) is None and not store.has(SHA)


def test_a_file_hashed_by_an_earlier_build_is_not_hashed_again_unless_written(
    tmp_path, monkeypatch
):
    import time

    hashed = []
    real = wheelhouse.hashlib.sha256

    def counting(*args):
        hashed.append(1)
        return real(*args)

    monkeypatch.setattr(wheelhouse.hashlib, "sha256", counting)
    monkeypatch.setattr(wheelhouse, "RACY_NS", 0)  # the file is seconds old in real use
    store = Store(tmp_path)
    store.put(SHA, io.BytesIO(WHEEL), "demo")
    hashed.clear()
    assert store.verified(SHA) == store.path(SHA) and len(hashed) == 1
    assert Store(tmp_path).verified(SHA) == store.path(SHA) and len(hashed) == 1  # trusted
    # The same size, the same inode, other bytes: the write changed the ctime.
    time.sleep(0.05)  # past the kernel's clock tick
    with store.path(SHA).open("r+b") as fh:
        fh.write(bytes([WHEEL[0] ^ 1]))
    assert Store(tmp_path).verified(SHA) is None and len(hashed) == 2 and not store.has(SHA)


def test_a_file_written_just_now_is_not_trusted_without_a_hash(tmp_path):
    store = Store(tmp_path)
    store.put(SHA, io.BytesIO(WHEEL), "demo")
    assert store.verified(SHA) == store.path(SHA)
    assert not (tmp_path / wheelhouse.VERIFIED).exists()  # its ctime is under RACY_NS old


LOCK = f"""\
tensorflow==2.21.0 \\
    --hash=sha256:{"1" * 64} \\
    --hash=sha256:{"2" * 64}
Absl_Py==2.3.1 ; python_version >= "3.9" \\
    --hash=sha256:{"3" * 64}
"""


def test_locked_requirements_are_read_from_uv_compile_output():
    reqs = wheelhouse.locked_requirements(LOCK)
    assert [(r.name, r.version, sorted(r.hashes)) for r in reqs] == [
        ("tensorflow", "2.21.0", ["1" * 64, "2" * 64]),
        ("absl-py", "2.3.1", ["3" * 64]),
    ]
    assert wheelhouse.locked_hashes([LOCK]) == {"1" * 64, "2" * 64, "3" * 64}


def test_offline_misses_need_a_page_and_a_stored_file_with_a_locked_hash(tmp_path):
    store = Store(tmp_path)
    key = "0123456789abcdef"
    store.save_page(key, "absl-py", [IndexFile("absl_py-2.3.1-py3-none-any.whl", "u", SHA)], "x")
    reqs = wheelhouse.locked_requirements(LOCK.replace("3" * 64, SHA))
    assert wheelhouse.offline_misses(store, key, reqs) == ["tensorflow==2.21.0", "absl-py==2.3.1"]
    store.put(SHA, io.BytesIO(WHEEL), "absl")
    assert wheelhouse.offline_misses(store, key, reqs) == ["tensorflow==2.21.0"]


def test_offline_a_direct_reference_needs_its_archive_stored_by_the_locked_hash(tmp_path):
    store = Store(tmp_path)
    url = "https://files.example/p/demo-1.0.tar.gz"
    reqs = wheelhouse.locked_requirements(f"demo @ {url} \\\n    --hash=sha256:{SHA}\n")
    assert wheelhouse.offline_misses(store, "0123456789abcdef", reqs) == [f"demo @ {url}"]
    store.put(SHA, io.BytesIO(WHEEL), "demo")  # no index page: none is needed
    assert wheelhouse.offline_misses(store, "0123456789abcdef", reqs) == []


def test_prune_drops_what_no_lock_names_and_no_build_used_lately():
    now = 1_000_000.0
    entries = {"a" * 64: (1, now - 10), "b" * 64: (1, now - 99), "c" * 64: (1, now - 99)}
    assert wheelhouse.prune_selection(entries, {"c" * 64}, now, 50) == ["b" * 64]


def test_prune_removes_files(tmp_path):
    store = Store(tmp_path)
    store.put(SHA, io.BytesIO(WHEEL), "demo")
    old = time.time() - 90 * 86400
    os.utime(store.path(SHA), (old, old))
    assert wheelhouse.prune(store, [f"demo==1 --hash=sha256:{SHA}"], 30) == (0, 0)
    assert wheelhouse.prune(store, [], 30) == (1, len(WHEEL)) and not store.has(SHA)


def test_export_import_round_trip_checks_every_file(tmp_path):
    store = Store(tmp_path / "a")
    store.put(SHA, io.BytesIO(WHEEL), "demo")
    key = wheelhouse.index_key(["https://pypi.org/simple/"])
    store.save_index(key, ("https://pypi.org/simple/",))
    store.save_page(key, "demo", [IndexFile("demo-1.0.tar.gz", "u", SHA)], "x")
    (store.root / "files" / ".locks").mkdir()
    (store.root / "files" / ".locks" / SHA).touch()  # a download lock: not exported
    tarball = tmp_path / "carry.tar"
    assert wheelhouse.export(store, tarball, None, [], print) == (1, 0)
    other = Store(tmp_path / "b")
    assert wheelhouse.import_(other, tarball, None, print) == (1, 0)
    assert other.has(SHA) and other.page(key, "demo") and other.index(key)
    # A file whose bytes are not its name is refused, and not stored.
    bad = tmp_path / "bad.tar"
    with tarfile.open(bad, "w") as tar:
        info = tarfile.TarInfo(f"wheelhouse/files/{'0' * 2}/{'0' * 64}")
        info.size = len(WHEEL)
        tar.addfile(info, io.BytesIO(WHEEL))
    with pytest.raises(GpuenvError, match="sha256"):
        wheelhouse.import_(Store(tmp_path / "c"), bad, None, print)
    evil = tmp_path / "evil.tar"
    with tarfile.open(evil, "w") as tar:
        info = tarfile.TarInfo("wheelhouse/pages/../../etc/x")
        tar.addfile(info, io.BytesIO(b""))
    with pytest.raises(GpuenvError, match="unexpected entry"):
        wheelhouse.import_(Store(tmp_path / "d"), evil, None, print)


def carry(tmp_path: Path, entries: dict[str, bytes], name: str = "carry.tar") -> Path:
    tarball = tmp_path / name
    with tarfile.open(tarball, "w") as tar:
        for entry, data in entries.items():
            info = tarfile.TarInfo(entry)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    return tarball


def test_an_import_cannot_redirect_an_indexs_pages(tmp_path):
    """Issue 35, M2c: an index entry says where its key's pages are fetched from; one whose
    upstreams do not hash to its name is refused at import, and ignored when found in the
    store (every page fetch of the key, private project names included, would go there)."""
    key = wheelhouse.index_key(["https://private.example/simple/"])
    evil = json.dumps({"upstreams": ["https://attacker.example/simple/"]}).encode()
    store = Store(tmp_path / "w")
    tarball = carry(tmp_path, {f"wheelhouse/indexes/{key}.json": evil})
    with pytest.raises(GpuenvError, match="does not name the indexes"):
        wheelhouse.import_(store, tarball, None, print)
    assert store.index(key) is None
    # Written by an older gpuenv's import: not trusted either.
    (store.root / "indexes").mkdir(parents=True, exist_ok=True)
    (store.root / "indexes" / f"{key}.json").write_bytes(evil)
    assert store.index(key) is None
    store.save_index(key, ("https://private.example/simple/",))  # never rewrites a file
    good = wheelhouse.index_key(["https://pypi.org/simple/"])
    store.save_index(good, ("https://pypi.org/simple/",))
    assert store.index(good) == ("https://pypi.org/simple/",)


def test_an_aborted_import_leaves_the_store_private(tmp_path):
    """Issue 35, L4: the store is 0700 before an import's first write, even when the import
    stops at a bad entry right after a page."""
    key = wheelhouse.index_key(["https://pypi.org/simple/"])
    tarball = carry(tmp_path, {f"wheelhouse/pages/{key}/secret-internal-pkg.json": b"{}",
                               "wheelhouse/bogus": b""})  # fmt: skip
    store = Store(tmp_path / "w")
    with pytest.raises(GpuenvError, match="unexpected entry"):
        wheelhouse.import_(store, tarball, None, print)
    for d in (store.root, store.root / "pages", store.root / "pages" / key):
        assert d.stat().st_mode & 0o077 == 0, oct(d.stat().st_mode)


class LoadRecorder:
    """Records what `docker load` would be given (the archive's tags): no engine here."""

    def __init__(self) -> None:
        self.loaded: list[list[str]] = []

    def load(self, path: str) -> list[str]:
        with tarfile.open(path) as tar:
            stream = tar.extractfile("manifest.json")
            assert stream is not None
            self.loaded.append(json.load(stream)[0]["RepoTags"])
        return []


def base_archive(
    tags: list[str], labels: dict[str, str], diff_ids: tuple[str, ...] = (), **more: bytes
) -> bytes:
    config = base_config(labels, diff_ids)
    manifest = [{"Config": "c.json", "RepoTags": tags, "Layers": []}]
    out = io.BytesIO()
    with tarfile.open(fileobj=out, mode="w") as tar:
        files = {"manifest.json": json.dumps(manifest).encode(), "c.json": config}
        files.update({k.replace("_", "."): v for k, v in more.items()})
        for name, data in files.items():
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    return out.getvalue()


def base_config(labels: dict[str, str], diff_ids: tuple[str, ...] = ()) -> bytes:
    return json.dumps(
        {"config": {"Labels": labels}, "rootfs": {"diff_ids": list(diff_ids)}}
    ).encode()


BASE_TAG = "gpuenv/debian:bookworm"
BASE_FILE = "bases/gpuenv_debian_bookworm.tar"
CELL_TAG = "gpuenv/tensorflow:tf2.21-py3.11-cpu"
BASES = {BASE_TAG: None}  # the matrix's cells' bases; this lock records none


@pytest.mark.parametrize(
    ("archive", "why"),
    [
        # A cell's tag with a forged spec hash: `build` would call it up to date.
        (base_archive([CELL_TAG], {"io.gpuenv.spec-hash": "ab" * 32}), "not only the base"),
        (base_archive([BASE_TAG, CELL_TAG], {}), "not only the base"),
        (base_archive([BASE_TAG], {"io.gpuenv.spec-hash": "ab" * 32}), "a cell's label"),
        (
            base_archive(
                [BASE_TAG],
                {},
                repositories=json.dumps({"gpuenv/tensorflow": {"tf2.21-py3.11-cpu": "x"}}).encode(),
            ),
            "repositories",
        ),
        (
            base_archive(
                [BASE_TAG],
                {},
                index_json=json.dumps(
                    {"manifests": [{"annotations": {"io.containerd.image.name": CELL_TAG}}]}
                ).encode(),
            ),
            "index.json",
        ),
        (b"not a tar", "not a docker save archive"),
    ],
    ids=["cell-tag", "two-tags", "cell-label", "repositories", "index-json", "garbage"],
)
def test_an_import_loads_only_the_base_its_file_is_named_for(tmp_path, archive, why):
    """Issue 35, M2a: `cache import` gave `docker load` every base archive as it was."""
    engine = LoadRecorder()
    tarball = carry(tmp_path, {BASE_FILE: archive})
    with pytest.raises(GpuenvError, match=why):
        wheelhouse.import_(Store(tmp_path / "w"), tarball, engine, print, BASES)  # type: ignore[arg-type]
    assert engine.loaded == []
    # The base as export writes it loads.
    ok = carry(tmp_path, {BASE_FILE: base_archive([BASE_TAG], {"io.gpuenv.rootfs": "x"})}, "ok.tar")
    assert wheelhouse.import_(Store(tmp_path / "w"), ok, engine, print, BASES) == (0, 1)  # type: ignore[arg-type]
    assert engine.loaded == [[BASE_TAG]]


ROOTFS = "sha256:" + "1" * 64


@pytest.mark.parametrize(
    ("name", "archive", "locked", "why"),
    [
        # The review's reproduction (issue 44, M2a): a file named for the cell's own tag,
        # holding an image with that tag and no labels; `run` then ran it.
        ("bases/gpuenv_tensorflow_tf2.21-py3.11-cpu.tar", base_archive([CELL_TAG], {}), None,
         "no base of the matrix's cells"),
        # The base's own name, but not the image the lock records: by its one layer's
        # content (a bootstrapped base) or by its image ID (an image from a registry).
        (BASE_FILE, base_archive([BASE_TAG], {}, ("sha256:" + "2" * 64,)), {"rootfs": ROOTFS},
         "its root filesystem is"),
        (BASE_FILE, base_archive([BASE_TAG], {"x": "y"}), {"id": "sha256:" + "3" * 64},
         "its image is sha256:"),
    ],
    ids=["cell-named-file", "other-rootfs", "other-id"],
)  # fmt: skip
def test_an_import_loads_only_the_matrixs_bases_as_the_lock_records_them(
    tmp_path, name, archive, locked, why
):
    engine = LoadRecorder()
    tarball = carry(tmp_path, {name: archive})
    with pytest.raises(GpuenvError, match=why) as refused:
        wheelhouse.import_(Store(tmp_path / "w"), tarball, engine, print, {BASE_TAG: locked})  # type: ignore[arg-type]
    assert engine.loaded == [] and "\n" not in refused.value.message
    assert refused.value.message.startswith(f"{tarball}: {name}: ")


@pytest.mark.parametrize("by", ["rootfs", "id"])
def test_the_locked_base_loads(tmp_path, by):
    archive = base_archive([BASE_TAG], {}, (ROOTFS,))
    config_id = "sha256:" + hashlib.sha256(base_config({}, (ROOTFS,))).hexdigest()
    locked = {"rootfs": ROOTFS, "id": "sha256:other"} if by == "rootfs" else {"id": config_id}
    engine = LoadRecorder()
    tarball = carry(tmp_path, {BASE_FILE: archive})
    assert wheelhouse.import_(
        Store(tmp_path / "w"), tarball, engine, print, {BASE_TAG: locked}
    ) == (0, 1)  # type: ignore[arg-type]
    assert engine.loaded == [[BASE_TAG]]


@pytest.mark.parametrize("kind", ["directory", "symlink", "fifo"])
def test_cache_export_writes_only_a_regular_file(tmp_path, kind):
    """Issue 35, L1: export replaced its target whatever it was (as root, /dev/full became
    a file; a symbolic link was replaced, not written through), or tracebacked on a
    directory."""
    target = tmp_path / "target"
    aimed = tmp_path / "aimed"
    aimed.write_text("keep")
    if kind == "directory":
        target.mkdir()
    elif kind == "symlink":
        target.symlink_to(aimed)
    else:
        os.mkfifo(target)
    with pytest.raises(GpuenvError, match="not a regular file"):
        wheelhouse.export(Store(tmp_path / "w"), target, None, [], print)
    assert aimed.read_text() == "keep"
    assert target.is_symlink() == (kind == "symlink")
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(["aimed", "target"])


# ------------------------------------------------------------------------------ credentials
# Which credential goes to which URL: tests/unit/test_credentials.py.


def test_a_malformed_netrc_is_one_error_naming_it(monkeypatch, tmp_path):
    netrc = tmp_path / "netrc"
    netrc.write_text("machine idx.example login a password b\nbogus token\n")
    monkeypatch.setenv("NETRC", str(netrc))
    with pytest.raises(GpuenvError, match=str(netrc)):
        credentials.load()


# ------------------------------------------------------------------------------ which wheel

BOOKWORM = (2, 36)  # context.GLIBC["bookworm"]


def rank(tags: str, glibc: tuple[int, int] = BOOKWORM) -> int | None:
    """wheel_rank of demo 1.0's wheel with these tags, for CPython 3.11 on x86_64."""
    return wheel_rank(f"demo-1.0-{tags}.whl", "3.11", "x86_64", glibc)


@pytest.mark.parametrize(
    ("better", "worse"),
    [
        # The interpreter's own ABI, then the stable ABI, then pure Python.
        ("cp311-cp311-manylinux_2_17_x86_64", "cp38-abi3-manylinux_2_28_x86_64"),
        ("cp38-abi3-manylinux_2_17_x86_64", "py3-none-any"),
        ("cp311-cp311-manylinux_2_17_x86_64", "py3-none-any"),
        # Among one interpreter tag, the newer manylinux the target allows.
        ("cp311-cp311-manylinux_2_28_x86_64", "cp311-cp311-manylinux_2_17_x86_64"),
        ("cp311-cp311-manylinux_2_17_x86_64", "cp311-cp311-manylinux1_x86_64"),
    ],
)
def test_wheel_rank_prefers_the_interpreter_then_the_newest_fitting_manylinux(better, worse):
    high, low = rank(better), rank(worse)
    assert high is not None and low is not None and high > low


@pytest.mark.parametrize(
    ("tags", "installs"),
    [
        ("cp311-cp311-manylinux_2_28_x86_64", True),  # 2.28 <= 2.36
        ("cp311-cp311-manylinux_2_36_x86_64", True),  # the base's own glibc
        ("cp311-cp311-manylinux_2_39_x86_64", False),  # needs a newer glibc
        ("cp311-cp311-manylinux2014_x86_64", True),  # PEP 600's alias of 2_17
        ("cp311-cp311-manylinux1_x86_64", True),  # alias of 2_5
        ("cp311-cp311-manylinux_2_28_aarch64", False),  # another machine
        ("cp311-cp311-manylinux2014_aarch64", False),
        ("cp311-cp311-musllinux_1_2_x86_64", False),  # not glibc
        ("cp311-cp311-linux_x86_64", False),  # no manylinux promise
        ("cp311-cp311-win_amd64", False),
        ("cp312-cp312-manylinux_2_28_x86_64", False),  # another Python
        ("cp312-abi3-manylinux_2_28_x86_64", False),  # abi3 from a newer Python
        ("cp39-abi3-manylinux_2_28_x86_64", True),  # abi3 from an older one
        ("py2.py3-none-any", True),
        ("py2-none-any", False),
    ],
)
def test_wheel_rank_says_what_installs_on_x86_64_bookworm(tags, installs):
    assert (rank(tags) is not None) is installs


def test_an_sdist_never_ranks():
    assert wheel_rank("demo-1.0.tar.gz", "3.11", "x86_64", BOOKWORM) is None


def test_the_legacy_manylinux_names_are_their_glibc():
    # manylinux2014 is glibc 2.17: it ranks as manylinux_2_17 does, and a target older than
    # that (2.12) cannot take it.
    assert rank("cp311-cp311-manylinux2014_x86_64") == rank("cp311-cp311-manylinux_2_17_x86_64")
    assert rank("cp311-cp311-manylinux2014_x86_64", (2, 12)) is None
    assert rank("cp311-cp311-manylinux2010_x86_64", (2, 12)) is not None


def _file(name: str, sha: str) -> IndexFile:
    return IndexFile(name, f"https://files.example/{name}", sha)


def test_pick_wheel_takes_the_best_locked_wheel_for_the_target():
    files = [
        _file("demo-1.0.tar.gz", "1" * 64),
        _file("demo-1.0-py3-none-any.whl", "2" * 64),
        _file("demo-1.0-cp311-cp311-manylinux_2_17_x86_64.manylinux2014_x86_64.whl", "3" * 64),
        _file("demo-1.0-cp311-cp311-manylinux_2_28_x86_64.whl", "4" * 64),
        _file("demo-1.0-cp311-cp311-manylinux_2_39_x86_64.whl", "5" * 64),  # too new a glibc
        _file("demo-1.0-cp311-cp311-manylinux_2_28_aarch64.whl", "6" * 64),
        _file("demo-1.0-cp311-cp311-manylinux_2_34_x86_64.whl", "7" * 64),  # not in the lock
    ]
    locked = frozenset(c * 64 for c in "1234566")
    req = Requirement("demo", "1.0", locked)
    x86 = pick_wheel(files, req, "3.11", "x86_64", BOOKWORM)
    assert x86 is not None and x86.sha256 == "4" * 64  # 2_34 would rank higher: not locked
    arm = pick_wheel(files, req, "3.11", "aarch64", BOOKWORM)
    assert arm is not None and arm.sha256 == "6" * 64
    # Only the pure wheel fits another Python; nothing fits when the lock lists none of it.
    other = pick_wheel(files, req, "3.12", "x86_64", BOOKWORM)
    assert other is not None and other.sha256 == "2" * 64
    assert pick_wheel(files, Requirement("demo", "1.0", frozenset({"7" * 64})), "3.11",
                      "x86_64", (2, 28)) is None  # fmt: skip
    assert pick_wheel(files, Requirement("demo", "1.0", frozenset({"1" * 64})), "3.11",
                      "x86_64", BOOKWORM) is None  # an sdist alone: no wheel  # fmt: skip


# ------------------------------------------------------------------------------ credentials for uv


IDX = ("https", "idx.example", 443)


def test_credentials_go_into_the_urls_userinfo_quoted():
    creds = credentials.Credentials(
        {("https", "idx.example", 8443): credentials.Credential("al@ce", "p:ss/w%rd #1", "x")}
    )
    url = locks._with_credential("https://idx.example:8443/simple/", creds)
    assert url == "https://al%40ce:p%3Ass%2Fw%25rd%20%231@idx.example:8443/simple/"
    parts = urlsplit(url)
    assert unquote(parts.username or "") == "al@ce"
    assert unquote(parts.password or "") == "p:ss/w%rd #1"
    assert (parts.hostname, parts.port, parts.path) == ("idx.example", 8443, "/simple/")


def test_urls_without_credentials_are_unchanged():
    creds = credentials.Credentials({IDX: credentials.Credential("u", "p", "env")})
    for url in ("https://pypi.org/simple/", "https://download.pytorch.org/whl/cpu",
                "http://idx.example/simple/", "https://idx.example:8443/simple/"):  # fmt: skip
        assert locks._with_credential(url, creds) == url
    private = "https://idx.example/simple/"
    assert locks._with_credential(private, None) == private
    assert locks._with_credential(private, credentials.Credentials({})) == private


def test_uv_pip_compile_gets_credentials_and_ca_in_its_environment_only(monkeypatch, tmp_path):
    seen = {}

    def run(command, **kw):
        seen["command"], seen["env"] = command, kw["env"]
        return locks.subprocess.CompletedProcess(command, 0, "six==1.17.0\n", "")

    monkeypatch.setattr(locks, "_uv", lambda: "uv")
    monkeypatch.setattr(locks.subprocess, "run", run)
    creds = credentials.Credentials({IDX: credentials.Credential("u", "s3cret", "env")})
    out = locks.compile_requirements(
        ["six"], "3.11", "2026-01-01T00:00:00Z", "https://idx.example/simple",
        ("https://extra.example/simple", "https://idx.example/other"),
        credentials=creds, ca_bundle=tmp_path / "ca.pem",
    )  # fmt: skip
    assert out == "six==1.17.0\n"
    assert not any("s3cret" in word or "example" in word for word in seen["command"])
    assert "--no-build" in seen["command"]  # no setup.py of a matrix's package runs here
    env = seen["env"]
    assert env["UV_INDEX_URL"] == "https://u:s3cret@idx.example/simple"
    extra = "https://extra.example/simple https://u:s3cret@idx.example/other"
    assert env["UV_EXTRA_INDEX_URL"] == extra
    assert env["SSL_CERT_FILE"] == str(tmp_path / "ca.pem")
    # uv reads no netrc of its own: it would give a host's credentials to any port or scheme.
    assert env["NETRC"] == os.devnull


# ------------------------------------------------------------------------------ the fetcher


class StubUpstream:
    """An upstream index in memory: pages and files by URL; records what was asked."""

    def __init__(self, pages: dict[str, bytes], files: dict[str, bytes]) -> None:
        self.pages, self.files, self.asked = pages, files, []
        self.delay = 0.0

    def stop(self) -> None:
        pass  # nothing of it is read from a socket

    def open(self, url: str, accept: str | None = None):
        self.asked.append(url)
        if url in self.pages:
            reply = io.BytesIO(self.pages[url])
            reply.headers = {"Content-Type": "text/html"}  # type: ignore[attr-defined]
            reply.geturl = lambda: url  # type: ignore[attr-defined]
            return reply
        if url in self.files:
            time.sleep(self.delay)  # a download takes a while: concurrent askers overlap
            return io.BytesIO(self.files[url])
        raise urllib.error.HTTPError(url, 404, "not found", {}, None)  # type: ignore[arg-type]


UPSTREAM = ("https://idx.example/simple/",)
KEY = wheelhouse.index_key(UPSTREAM)


def fetcher(tmp_path: Path, upstream: StubUpstream, offline: bool = False) -> Fetcher:
    store = Store(tmp_path / "wheelhouse")
    store.save_index(KEY, UPSTREAM)
    return Fetcher(store, credentials=credentials.Credentials({}), offline=offline,
                   upstream=upstream)  # type: ignore[arg-type]  # fmt: skip


def page(*files: tuple[str, bytes]) -> bytes:
    return "".join(
        f'<a href="/f/{name}#sha256={hashlib.sha256(body).hexdigest()}">{name}</a>'
        for name, body in files
    ).encode()


def locked(name: str, version: str, *bodies: bytes) -> str:
    hashes = " ".join(f"--hash=sha256:{hashlib.sha256(b).hexdigest()}" for b in bodies)
    return f"{name}=={version} {hashes}\n"


GOOD = ("demo-1.0-cp311-cp311-manylinux_2_28_x86_64.whl", b"the x86_64 wheel")
ARM = ("demo-1.0-cp311-cp311-manylinux_2_28_aarch64.whl", b"the aarch64 wheel")
UNLOCKED = ("demo-1.0-cp311-cp311-manylinux_2_34_x86_64.whl", b"a wheel the lock does not list")


def demo_upstream(*files: tuple[str, bytes]) -> StubUpstream:
    return StubUpstream(
        {"https://idx.example/simple/demo/": page(*files)},
        {f"https://idx.example/f/{name}": body for name, body in files},
    )


def test_wheels_stores_and_gives_only_the_locked_wheel_for_the_target(tmp_path):
    up = demo_upstream(ARM, UNLOCKED, GOOD)  # the right one last: chosen, not the first
    f = fetcher(tmp_path, up)
    text = locked("demo", "1.0", GOOD[1], ARM[1])
    got = f.wheels(KEY, text, "3.11", "x86_64", BOOKWORM)
    assert [(name, path.read_bytes()) for name, path in got] == [GOOD]
    sha = hashlib.sha256(GOOD[1]).hexdigest()
    assert got[0][1] == f.store.path(sha)
    assert f.store.entries().keys() == {sha}  # neither the other machine's nor the unlocked
    assert [u for u in up.asked if "/f/" in u] == [f"https://idx.example/f/{GOOD[0]}"]
    # Asked again, it is not downloaded again.
    assert f.wheels(KEY, text, "3.11", "x86_64", BOOKWORM) == got and f.fetched == 1


def test_a_requirement_with_no_wheel_for_the_target_is_an_error_naming_both(tmp_path):
    f = fetcher(tmp_path, demo_upstream(GOOD, ARM))
    with pytest.raises(GpuenvError) as caught:
        f.wheels(KEY, locked("demo", "1.0", ARM[1]), "3.11", "x86_64", BOOKWORM)
    message = caught.value.message
    assert "demo==1.0" in message and "CPython 3.11" in message
    assert "linux/x86_64" in message and "glibc 2.36" in message
    assert f.store.entries() == {}


def test_a_lock_whose_hashes_the_index_does_not_offer_is_a_hash_mismatch(tmp_path):
    """Not "no wheel for the target": the lock and the index disagree (a tampered lock, or
    an index that replaced its files), and the error says so, naming the requirement."""
    f = fetcher(tmp_path, demo_upstream(GOOD, ARM))
    with pytest.raises(GpuenvError, match=r"hash mismatch for demo==1\.0: the index offers no"):
        f.wheels(KEY, locked("demo", "1.0", b"bytes the index never had"), "3.11", "x86_64",
                 BOOKWORM)  # fmt: skip
    assert f.store.entries() == {}


def test_a_page_without_the_locked_release_is_asked_for_once_more(tmp_path):
    """A CDN node's copy of a page may predate a release the resolver saw on another."""

    class Stale(StubUpstream):
        def open(self, url: str, accept: str | None = None):
            reply = super().open(url, accept)
            if url == "https://idx.example/simple/demo/":  # fresh from the second ask on
                self.pages[url] = page(GOOD)
            return reply

    up = Stale(
        {"https://idx.example/simple/demo/": page()}, {f"https://idx.example/f/{GOOD[0]}": GOOD[1]}
    )
    f = fetcher(tmp_path, up)
    got = f.wheels(KEY, locked("demo", "1.0", GOOD[1]), "3.11", "x86_64", BOOKWORM)
    assert [name for name, _ in got] == [GOOD[0]]
    assert up.asked.count("https://idx.example/simple/demo/") == 2


def test_a_build_stores_its_locked_release_of_a_page_and_keeps_the_earlier_ones(tmp_path):
    """Only the locked release's files are read out of a page and stored; a later lock's
    release adds to them, so an offline build of the earlier lock still has its page."""
    older = ("demo-0.9-cp311-cp311-manylinux_2_28_x86_64.whl", b"the 0.9 wheel")
    up = demo_upstream(GOOD, older)
    f = fetcher(tmp_path, up)
    f.wheels(KEY, locked("demo", "1.0", GOOD[1]), "3.11", "x86_64", BOOKWORM)
    assert [e.filename for e in f.store.page(KEY, "demo") or []] == [GOOD[0]]
    f.wheels(KEY, locked("demo", "0.9", older[1]), "3.11", "x86_64", BOOKWORM)
    assert {e.filename for e in f.store.page(KEY, "demo") or []} == {GOOD[0], older[0]}
    offline = fetcher(tmp_path, StubUpstream({}, {}), offline=True)
    got = offline.wheels(KEY, locked("demo", "1.0", GOOD[1]), "3.11", "x86_64", BOOKWORM)
    assert [name for name, _ in got] == [GOOD[0]]


def test_offline_with_an_empty_wheelhouse_is_an_error_and_asks_no_one(tmp_path):
    up = demo_upstream(GOOD)
    f = fetcher(tmp_path, up, offline=True)
    with pytest.raises(GpuenvError, match="--offline: the wheelhouse has no index page of demo"):
        f.wheels(KEY, locked("demo", "1.0", GOOD[1]), "3.11", "x86_64", BOOKWORM)
    assert up.asked == []


def test_offline_takes_what_an_online_fetch_stored(tmp_path):
    text = locked("demo", "1.0", GOOD[1])
    online = fetcher(tmp_path, demo_upstream(GOOD))
    online.wheels(KEY, text, "3.11", "x86_64", BOOKWORM)
    nobody = StubUpstream({}, {})
    offline = fetcher(tmp_path, nobody, offline=True)
    got = offline.wheels(KEY, text, "3.11", "x86_64", BOOKWORM)
    assert [(name, path.read_bytes()) for name, path in got] == [GOOD]
    assert nobody.asked == [] and offline.fetched == 0


def test_a_download_that_does_not_match_its_hash_is_refused(tmp_path):
    up = demo_upstream(GOOD)
    up.files[f"https://idx.example/f/{GOOD[0]}"] = b"tampered"
    f = fetcher(tmp_path, up)
    with pytest.raises(GpuenvError, match="the index said"):
        f.wheels(KEY, locked("demo", "1.0", GOOD[1]), "3.11", "x86_64", BOOKWORM)
    assert f.store.entries() == {}


def test_a_project_no_index_knows_is_an_error_naming_it(tmp_path):
    f = fetcher(tmp_path, StubUpstream({}, {}))
    with pytest.raises(GpuenvError, match=r"other==2\.0: not on any index"):
        f.wheels(KEY, locked("other", "2.0", b"x"), "3.11", "x86_64", BOOKWORM)


def test_two_fetchers_download_a_file_once(tmp_path):
    """Two gpuenv processes (a fetcher each, one wheelhouse) building at once: the file lock
    makes the second wait for the first's download, then take it."""
    text = locked("demo", "1.0", GOOD[1])
    ups = [demo_upstream(GOOD) for _ in range(2)]
    for up in ups:
        up.delay = 0.3
    fetchers = [fetcher(tmp_path, up) for up in ups]
    results: list[object] = [None, None]

    def one(i: int) -> None:
        results[i] = fetchers[i].wheels(KEY, text, "3.11", "x86_64", BOOKWORM)

    threads = [threading.Thread(target=one, args=(i,)) for i in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert results[0] == results[1] and results[0]
    downloads = sum(u.asked.count(f"https://idx.example/f/{GOOD[0]}") for u in ups)
    assert downloads == 1


# ------------------------------------------------------------------------------ uv


def _uv_wheel(version: str, body: bytes, recorded: bytes | None = None) -> bytes:
    """uv's wheel as PyPI has it: the executable, and its sha256 in RECORD (that of
    `recorded` when given: a wheel whose RECORD does not match its file)."""
    import base64
    import zipfile

    digest = hashlib.sha256(recorded if recorded is not None else body).digest()
    record = f"uv-{version}.data/scripts/uv,sha256={base64.urlsafe_b64encode(digest).rstrip(b'=').decode()},{len(body)}\n"  # noqa: E501
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w") as whl:
        whl.writestr(f"uv-{version}.data/scripts/uv", body)
        whl.writestr(f"uv-{version}.dist-info/METADATA", "Name: uv\n")
        whl.writestr(f"uv-{version}.dist-info/RECORD", record)
    return buf.getvalue()


def test_uv_wheel_is_the_manylinux_one_for_the_machine():
    def f(name: str, yanked: bool = False) -> IndexFile:
        return IndexFile(name, f"https://x/{name}", "0" * 64, yanked=yanked)

    files = [
        f("uv-0.13.9.tar.gz"),
        f("uv-0.13.9-py3-none-musllinux_1_1_x86_64.whl"),
        f("uv-0.13.9-py3-none-manylinux_2_17_x86_64.manylinux2014_x86_64.whl"),
        f("uv-0.13.9-py3-none-manylinux_2_28_aarch64.whl"),
        f("uv-0.13.90-py3-none-manylinux_2_17_x86_64.whl"),
        f("uv-0.13.8-py3-none-manylinux_2_17_x86_64.whl"),
    ]
    x86 = wheelhouse.uv_wheel(files, "0.13.9", "x86_64")
    assert x86 is not None and x86.filename.startswith("uv-0.13.9-py3-none-manylinux_2_17_x86")
    arm = wheelhouse.uv_wheel(files, "0.13.9", "aarch64")
    assert arm is not None and arm.filename.endswith("manylinux_2_28_aarch64.whl")
    assert wheelhouse.uv_wheel(files, "0.13.9", "riscv64") is None
    assert wheelhouse.uv_wheel(files, "0.13.7", "x86_64") is None
    yanked = [f("uv-0.13.9-py3-none-manylinux_2_17_x86_64.whl", yanked=True)]
    assert wheelhouse.uv_wheel(yanked, "0.13.9", "x86_64") is None


UV_NAME = "uv-0.13.9-py3-none-manylinux_2_17_x86_64.manylinux2014_x86_64.whl"


def uv_upstream(served: bytes, listed: bytes | None = None) -> StubUpstream:
    sha = hashlib.sha256(listed if listed is not None else served).hexdigest()
    return StubUpstream(
        {"https://idx.example/simple/uv/": f'<a href="/f/{UV_NAME}#sha256={sha}">uv</a>'.encode()},
        {f"https://idx.example/f/{UV_NAME}": served},
    )


def test_uv_file_is_uvs_executable_out_of_its_checked_wheel(tmp_path):
    whl = _uv_wheel("0.13.9", b"\x7fELF uv")
    f = fetcher(tmp_path, uv_upstream(whl))
    path = f.uv_file(KEY, "0.13.9", "x86_64")
    assert path.read_bytes() == b"\x7fELF uv" and os.access(path, os.X_OK)
    assert f.store.has(hashlib.sha256(whl).hexdigest()) and f.fetched == 1
    with pytest.raises(GpuenvError, match=r"uv 0\.13\.9 for aarch64"):
        f.uv_file(KEY, "0.13.9", "aarch64")  # no wheel for that machine
    with pytest.raises(GpuenvError, match=r"uv 0\.13\.8 for x86_64"):
        f.uv_file(KEY, "0.13.8", "x86_64")
    # One a `cache import` brought (every file 0600) is made executable again.
    path.chmod(0o600)
    assert os.access(fetcher(tmp_path, uv_upstream(whl)).uv_file(KEY, "0.13.9", "x86_64"), os.X_OK)
    # Offline, the stored wheel gives it again (the executable taken out anew).
    path.unlink()
    offline = fetcher(tmp_path, StubUpstream({}, {}), offline=True)
    assert offline.uv_file(KEY, "0.13.9", "x86_64").read_bytes() == b"\x7fELF uv"
    with pytest.raises(GpuenvError, match=r"lacks uv 0\.13\.9 for aarch64"):
        offline.uv_file(KEY, "0.13.9", "aarch64")


def test_uv_file_reads_and_stores_its_release_of_uvs_page_alone(tmp_path):
    whl = _uv_wheel("0.13.9", b"\x7fELF uv")
    up = uv_upstream(whl)
    other = UV_NAME.replace("0.13.9", "0.13.8")
    listing = f'<a href="/f/{other}#sha256={SHA}">uv</a>'
    up.pages["https://idx.example/simple/uv/"] += listing.encode()
    f = fetcher(tmp_path, up)
    f.uv_file(KEY, "0.13.9", "x86_64")
    assert [e.filename for e in f.store.page(KEY, "uv") or []] == [UV_NAME]


def test_a_uv_wheel_tampered_on_the_way_in_gives_no_uv(tmp_path):
    good = _uv_wheel("0.13.9", b"uv")
    f = fetcher(tmp_path, uv_upstream(_uv_wheel("0.13.9", b"not uv"), listed=good))
    with pytest.raises(GpuenvError, match="the index said"):
        f.uv_file(KEY, "0.13.9", "x86_64")
    assert not f.store.has(hashlib.sha256(good).hexdigest())
    assert not f.store.has(hashlib.sha256(b"not uv").hexdigest())


def test_a_uv_wheel_whose_record_does_not_match_its_executable_gives_no_uv(tmp_path):
    f = fetcher(tmp_path, uv_upstream(_uv_wheel("0.13.9", b"\x7fELF evil", recorded=b"uv")))
    with pytest.raises(GpuenvError, match="RECORD gives no sha256"):
        f.uv_file(KEY, "0.13.9", "x86_64")
    assert not f.store.has(hashlib.sha256(b"\x7fELF evil").hexdigest())


@pytest.mark.parametrize("offline", [False, True])
def test_a_kept_uv_is_checked_against_its_wheel_each_time_it_is_reused(tmp_path, offline):
    """M3: the kept installer (it runs as root in every install step and enforces
    --require-hashes there) was reused by its name. One planted in its place, as a restored
    CI cache brings it, is never returned: it is hashed again (its inode and ctime are not
    those recorded), dropped, and the executable taken out of the checked wheel anew."""
    whl = _uv_wheel("0.13.9", b"\x7fELF uv")
    path = fetcher(tmp_path, uv_upstream(whl)).uv_file(KEY, "0.13.9", "x86_64")
    planted = path.with_name(".planted")
    planted.write_bytes(b"\x7fELF ev")  # the same size
    planted.chmod(0o755)
    os.replace(planted, path)
    again = fetcher(tmp_path, uv_upstream(whl), offline=offline)  # a later gpuenv process
    reused = again.uv_file(KEY, "0.13.9", "x86_64")
    assert reused.read_bytes() == b"\x7fELF uv" and os.access(reused, os.X_OK)


def test_the_fallback_store_is_used_only_when_private(tmp_path, monkeypatch):
    """With no cache directory, the store is /tmp/gpuenv-UID: made 0700 by this user, or
    refused when someone else could have made it (or may enter it)."""
    import os
    import tempfile

    import gpuenv.store.cache

    monkeypatch.setattr(gpuenv.store.cache, "cache_dir", lambda: None)
    monkeypatch.setattr(tempfile, "gettempdir", lambda: str(tmp_path))
    mine = tmp_path / f"gpuenv-{os.getuid()}"
    store = wheelhouse.Store.default()
    assert store.root == mine / "wheelhouse"
    assert mine.stat().st_mode & 0o777 == 0o700
    mine.chmod(0o777)  # as another user's pre-made directory would be
    with pytest.raises(GpuenvError, match="has mode 777, not 700"):
        wheelhouse.Store.default()
    mine.rmdir()
    (tmp_path / "elsewhere").mkdir(mode=0o700)
    mine.symlink_to(tmp_path / "elsewhere")  # a link planted where the store would be
    with pytest.raises(GpuenvError, match="is a symbolic link"):
        wheelhouse.Store.default()


def test_the_store_is_private_to_its_user(tmp_path):
    """Which packages a user installs (page names, hashes) is theirs: the store's directory
    is 0700 once anything is written, even one an older gpuenv made with the umask's mode."""
    old = tmp_path / "old"
    old.mkdir(mode=0o755)
    for root in (tmp_path / "new", old):
        store = Store(root)
        store.put(SHA, io.BytesIO(WHEEL), "demo")
        store.save_page("0123456789abcdef", "demo", [], "https://pypi.org/simple/")
        assert root.stat().st_mode & 0o777 == 0o700
        assert store.path(SHA).stat().st_mode & 0o077 == 0


def test_a_store_that_cannot_be_written_is_one_error_naming_the_fix(tmp_path):
    (tmp_path / "file").write_text("")  # where the cache directory should be
    store = wheelhouse.Store(tmp_path / "file" / "gpuenv" / "wheelhouse")
    with pytest.raises(GpuenvError, match=r"cannot write gpuenv's wheel store .*XDG_CACHE_HOME"):
        store.make_private()


# ------------------------------------------------------------------------------ upstream


@contextlib.contextmanager
def local_index(handler: type, monkeypatch: pytest.MonkeyPatch) -> Iterator[str]:
    """An index on 127.0.0.1 answered by `handler` (an http.server request handler), reached
    directly (no proxy from the environment): its base URL."""
    from http.server import ThreadingHTTPServer

    for name in ("http_proxy", "HTTP_PROXY", "all_proxy", "ALL_PROXY"):
        monkeypatch.delenv(name, raising=False)
    server = ThreadingHTTPServer(("127.0.0.1", 0), handler)
    # Polled every 10 ms: shutdown() waits out one poll, 0.5 s by default.
    threading.Thread(target=server.serve_forever, args=(0.01,), daemon=True).start()
    try:
        yield f"http://127.0.0.1:{server.server_port}"
    finally:
        server.shutdown()
        server.server_close()


def test_upstream_keeps_its_connections_for_the_next_request(tmp_path, monkeypatch):
    """A build asks one host for some 35 pages: one connection (one DNS lookup, one TLS
    handshake) serves them one after another, and each reply is read whole."""
    from http.server import BaseHTTPRequestHandler

    from gpuenv.store.fetch import Upstream

    connections: list[int] = []

    class Index(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"  # keep-alive

        def setup(self) -> None:
            super().setup()
            connections.append(self.client_address[1])

        def log_message(self, *args: object) -> None:
            pass

        def do_GET(self) -> None:
            body = self.path.encode() * 1000
            self.send_response(200)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

    with local_index(Index, monkeypatch) as base:
        upstream = Upstream(credentials.Credentials({}), None)
        for n in range(10):
            with upstream.open(f"{base}/simple/p{n}/") as reply:
                assert reply.read() == f"/simple/p{n}/".encode() * 1000
                assert reply.geturl() == f"{base}/simple/p{n}/"
    assert len(connections) == 1


def test_a_stopped_upstream_ends_a_blocked_read_and_opens_nothing(monkeypatch):
    """Ctrl-C or SIGTERM while wheels download: the download in flight ends now, even one
    waiting for bytes that do not come, and nothing more is asked of the index."""
    from http.server import BaseHTTPRequestHandler

    from gpuenv.store.fetch import Stopped, Upstream

    asked: list[str] = []
    go_on = threading.Event()

    class Index(BaseHTTPRequestHandler):
        def log_message(self, *args: object) -> None:
            pass

        def do_GET(self) -> None:
            asked.append(self.path)
            self.send_response(200)
            self.send_header("Content-Length", str(2 << 20))
            self.end_headers()
            self.wfile.write(b"x" * (1 << 20))  # the first megabyte, then the rest on go_on
            self.wfile.flush()
            go_on.wait(10)
            self.wfile.write(b"x" * (1 << 20))

    with local_index(Index, monkeypatch) as base:
        try:
            upstream = Upstream(credentials.Credentials({}), None)
            with pytest.raises(Stopped), upstream.open(f"{base}/f/big.whl") as reply:
                assert len(reply.read(1 << 20)) == 1 << 20
                # The rest waits on the server, as on a stalled link: the read is blocked
                # when another thread stops the upstream, and ends then.
                threading.Timer(0.5, upstream.stop).start()
                started = time.monotonic()
                reply.read(1 << 20)
            assert time.monotonic() - started < 5
            with pytest.raises(Stopped):
                upstream.open(f"{base}/f/next.whl")
        finally:
            go_on.set()  # the handler ends before the server closes
    assert asked == ["/f/big.whl"]


def test_stopping_an_upstream_whose_reply_was_read_to_its_end_is_no_error(monkeypatch):
    """urllib3 gives a reply's connection back once its body is read; the reply, not yet
    closed, has no socket left to shut down (urllib3 raises RuntimeError for it)."""
    from http.server import BaseHTTPRequestHandler

    from gpuenv.store.fetch import Upstream

    class Index(BaseHTTPRequestHandler):
        def log_message(self, *args: object) -> None:
            pass

        def do_GET(self) -> None:
            self.send_response(200)
            self.send_header("Content-Length", "5")
            self.end_headers()
            self.wfile.write(b"hello")

    with local_index(Index, monkeypatch) as base:
        upstream = Upstream(credentials.Credentials({}), None)
        with upstream.open(f"{base}/f/small.whl") as reply:
            assert reply.read() == b"hello"
            upstream.stop()


def test_a_stopped_fetcher_starts_none_of_the_downloads_still_queued(tmp_path):
    """The interpreter runs a thread pool's queued work before it exits: an interrupted
    build went on fetching every wheel. Stopped, the queued ones never start."""
    from gpuenv.store.fetch import PARALLEL, Stopped

    wheels = [(f"demo{n}-1.0-py3-none-any.whl", f"wheel {n}".encode()) for n in range(3 * PARALLEL)]
    up = StubUpstream(
        {f"https://idx.example/simple/demo{n}/": page(w) for n, w in enumerate(wheels)},
        {f"https://idx.example/f/{name}": body for name, body in wheels},
    )
    up.delay = 0.3
    f = fetcher(tmp_path, up)
    text = "".join(locked(f"demo{n}", "1.0", body) for n, (_, body) in enumerate(wheels))
    caught: list[BaseException] = []

    def build() -> None:
        try:
            f.wheels(KEY, text, "3.11", "x86_64", BOOKWORM)
        except BaseException as exc:
            caught.append(exc)

    thread = threading.Thread(target=build)
    thread.start()
    deadline = time.monotonic() + 10
    while not any("/f/" in url for url in up.asked) and time.monotonic() < deadline:
        time.sleep(0.01)
    f.stop()
    thread.join(10)
    assert not thread.is_alive()
    assert len(caught) == 1 and isinstance(caught[0], Stopped), caught
    files_asked = [url for url in up.asked if "/f/" in url]
    assert 0 < len(files_asked) <= PARALLEL, files_asked  # those in flight, no more


class _Pools:
    """urllib3's pools as Upstream.open uses them: scripted replies by URL, the requests'
    Authorization headers recorded."""

    def __init__(self, answers: dict[str, tuple[int, dict[str, str]]]) -> None:
        self.answers, self.asked = answers, []

    def request(self, method: str, url: str, headers: dict[str, str], **kw: object) -> object:
        self.asked.append((url, headers.get("Authorization")))
        status, reply_headers = self.answers.get(url, (404, {}))

        class Reply(io.BytesIO):
            reason = "scripted"

            def drain_conn(self) -> None:
                pass

            def release_conn(self) -> None:
                pass

        reply = Reply(b"page")
        reply.status, reply.headers = status, reply_headers  # type: ignore[attr-defined]
        return reply


def test_upstream_sends_credentials_to_their_origin_and_never_over_a_redirect():
    from gpuenv.store.credentials import Credential, origin_of
    from gpuenv.store.fetch import Upstream

    url = "https://private.example/simple/p/"
    origin = origin_of(url)
    assert origin is not None
    upstream = Upstream(credentials.Credentials({origin: Credential("u", "p", "netrc")}), None)
    pools = _Pools({url: (302, {"Location": "/moved/p/"}),
                    "https://private.example/moved/p/": (200, {})})  # fmt: skip
    upstream._manager = lambda _: pools  # type: ignore[method-assign]
    with upstream.open(url) as reply:
        assert reply.geturl() == "https://private.example/moved/p/"
    assert [(u, a is not None) for u, a in pools.asked] == [
        (url, True), ("https://private.example/moved/p/", False)]  # fmt: skip
    with pytest.raises(urllib.error.HTTPError) as caught:
        upstream.open("https://private.example/simple/missing/")
    assert caught.value.code == 404
    pools.answers[url] = (302, {"Location": "file:///etc/passwd"})
    with pytest.raises(urllib.error.HTTPError, match="another scheme"):
        upstream.open(url)
