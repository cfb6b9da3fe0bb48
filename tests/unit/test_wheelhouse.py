"""The wheelhouse's pure parts and its store: pages, hashes, locks, prune, export/import,
credentials, and the proxy answering from a stub upstream (no network, no engine)."""

from __future__ import annotations

import hashlib
import io
import json
import os
import tarfile
import time
import urllib.error
import urllib.request

import pytest

from gpuenv import credentials, wheelhouse
from gpuenv.errors import GpuenvError
from gpuenv.proxy import Proxy, WheelhouseServer
from gpuenv.wheelhouse import IndexFile, Store

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


def test_rendered_pages_link_only_to_the_proxy_and_keep_the_hashes():
    files = [IndexFile("demo-1.0.tar.gz", "https://secret.example/f/demo-1.0.tar.gz", SHA,
                       ">=3.9", False, "c" * 64)]  # fmt: skip
    key = "0123456789abcdef"
    html = wheelhouse.render_page(key, "demo", files, as_json=False).decode()
    assert "secret.example" not in html
    assert f'href="/{key}/files/demo/{SHA}/demo-1.0.tar.gz#sha256={SHA}"' in html
    assert 'data-core-metadata="sha256=' + "c" * 64 in html and "&gt;=3.9" in html
    doc = json.loads(wheelhouse.render_page(key, "demo", files, as_json=True))
    assert doc["files"][0]["url"] == f"/{key}/files/demo/{SHA}/demo-1.0.tar.gz"
    assert doc["files"][0]["hashes"] == {"sha256": SHA} and "secret" not in json.dumps(doc)
    served = wheelhouse.render_page(key, "demo", files, True)
    again = wheelhouse.parse_page(served, wheelhouse.JSON_TYPE, "http://127.0.0.1:1/k/simple/d/")
    assert again[0].sha256 == SHA and again[0].requires_python == ">=3.9"


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
    key = "0123456789abcdef"
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


# ------------------------------------------------------------------------------ credentials


def test_env_credentials_apply_to_the_matrix_indexes_only(monkeypatch, tmp_path):
    monkeypatch.setenv("NETRC", str(tmp_path / "none"))
    monkeypatch.setenv("GPUENV_INDEX_USERNAME", "u")
    monkeypatch.setenv("GPUENV_INDEX_PASSWORD", "p")
    creds = credentials.load(("https://private.example:8443/simple",))
    assert creds.for_url("https://private.example:8443/simple/x/").username == "u"
    assert creds.for_url("https://pypi.org/simple/x/") is None
    assert creds.for_url("https://files.pythonhosted.org/x.whl") is None


def test_netrc_credentials_by_host_and_half_a_pair_is_an_error(monkeypatch, tmp_path):
    netrc = tmp_path / "netrc"
    netrc.write_text("machine idx.example login alice password s3cret\n")
    netrc.chmod(0o600)
    monkeypatch.setenv("NETRC", str(netrc))
    monkeypatch.delenv("GPUENV_INDEX_USERNAME", raising=False)
    monkeypatch.delenv("GPUENV_INDEX_PASSWORD", raising=False)
    creds = credentials.load(())
    got = creds.for_url("https://idx.example:444/simple/")
    assert got is not None and (got.username, got.password) == ("alice", "s3cret")
    assert "s3cret" not in creds.fingerprint()
    monkeypatch.setenv("GPUENV_INDEX_PASSWORD", "x")
    with pytest.raises(GpuenvError, match="without its pair"):
        credentials.load(())


def test_a_malformed_netrc_is_one_error_naming_it(monkeypatch, tmp_path):
    netrc = tmp_path / "netrc"
    netrc.write_text("machine idx.example login a password b\nbogus token\n")
    monkeypatch.setenv("NETRC", str(netrc))
    with pytest.raises(GpuenvError, match=str(netrc)):
        credentials.load(())


# ------------------------------------------------------------------------------ the proxy


class StubUpstream:
    """An upstream index in memory: pages and files by URL; records what was asked."""

    def __init__(self, pages: dict[str, bytes], files: dict[str, bytes]) -> None:
        self.pages, self.files, self.asked = pages, files, []
        self.delay = 0.0

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


def serve(store: Store, upstream: StubUpstream, offline: bool = False):
    proxy = Proxy(store, credentials=credentials.Credentials({}), offline=offline,
                  upstream=upstream)  # type: ignore[arg-type]  # fmt: skip
    return proxy, WheelhouseServer(proxy, port=0 or _free_port())


def _free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def get(url: str) -> tuple[int, bytes]:
    try:
        with urllib.request.urlopen(url, timeout=10) as reply:
            return reply.status, reply.read()
    except urllib.error.HTTPError as exc:
        return exc.code, b""


def test_proxy_fetches_once_checks_the_hash_and_answers_offline_from_the_store(tmp_path):
    store = Store(tmp_path)
    urls = ("https://idx.example/simple/",)
    key = wheelhouse.index_key(urls)
    store.save_index(key, urls)
    page = f'<a href="/f/demo-1.0.tar.gz#sha256={SHA}">demo</a>'.encode()
    up = StubUpstream({"https://idx.example/simple/demo/": page},
                      {"https://idx.example/f/demo-1.0.tar.gz": WHEEL})  # fmt: skip
    proxy, server = serve(store, up)
    with server:
        root = f"http://127.0.0.1:{server.port}"
        status, body = get(f"{root}/{key}/simple/demo/")
        assert status == 200 and b"idx.example" not in body
        link = f"{root}/{key}/files/demo/{SHA}/demo-1.0.tar.gz"
        assert get(link) == (200, WHEEL) and get(link) == (200, WHEEL)
        assert proxy.fetched == 1 and up.asked.count("https://idx.example/f/demo-1.0.tar.gz") == 1
        assert get(f"{root}/{key}/simple/other/")[0] == 404
    offline, server = serve(store, StubUpstream({}, {}), offline=True)
    with server:
        root = f"http://127.0.0.1:{server.port}"
        assert get(f"{root}/{key}/files/demo/{SHA}/demo-1.0.tar.gz") == (200, WHEEL)
        assert get(f"{root}/{key}/simple/missing/")[0] == 404
        assert offline.upstream.asked == []  # type: ignore[attr-defined]
        assert "no index page of missing" in offline.problems[0]


def test_proxy_refuses_a_file_whose_download_does_not_match(tmp_path):
    store = Store(tmp_path)
    urls = ("https://idx.example/simple/",)
    key = wheelhouse.index_key(urls)
    store.save_index(key, urls)
    page = f'<a href="/f/demo-1.0.tar.gz#sha256={SHA}">demo</a>'.encode()
    up = StubUpstream({"https://idx.example/simple/demo/": page},
                      {"https://idx.example/f/demo-1.0.tar.gz": b"tampered"})  # fmt: skip
    proxy, server = serve(store, up)
    with server:
        root = f"http://127.0.0.1:{server.port}"
        get(f"{root}/{key}/simple/demo/")
        assert get(f"{root}/{key}/files/demo/{SHA}/demo-1.0.tar.gz")[0] == 502
    assert not store.has(SHA) and "the index said" in proxy.problems[0]


def _uv_wheel(version: str, body: bytes) -> bytes:
    import zipfile

    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w") as whl:
        whl.writestr(f"uv-{version}.data/scripts/uv", body)
        whl.writestr(f"uv-{version}.dist-info/METADATA", "Name: uv\n")
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


def test_proxy_serves_uvs_executable_out_of_its_checked_wheel(tmp_path):
    store = Store(tmp_path)
    urls = ("https://idx.example/simple/",)
    key = wheelhouse.index_key(urls)
    store.save_index(key, urls)
    whl = _uv_wheel("0.13.9", b"\x7fELF uv")
    name = "uv-0.13.9-py3-none-manylinux_2_17_x86_64.manylinux2014_x86_64.whl"
    sha = hashlib.sha256(whl).hexdigest()
    page = f'<a href="/f/{name}#sha256={sha}">uv</a>'.encode()
    up = StubUpstream(
        {"https://idx.example/simple/uv/": page}, {f"https://idx.example/f/{name}": whl}
    )
    proxy, server = serve(store, up)
    with server:
        root = f"http://127.0.0.1:{server.port}/{key}/tools/uv"
        assert get(f"{root}/0.13.9/x86_64") == (200, b"\x7fELF uv")
        assert get(f"{root}/0.13.9/aarch64")[0] == 404  # no wheel for that machine
        assert get(f"{root}/0.13.8/x86_64")[0] == 404
    assert store.has(sha) and proxy.fetched == 1
    offline, server = serve(store, StubUpstream({}, {}), offline=True)
    with server:  # the stored wheel serves an offline build
        root = f"http://127.0.0.1:{server.port}/{key}/tools/uv"
        assert get(f"{root}/0.13.9/x86_64") == (200, b"\x7fELF uv")
        assert get(f"{root}/0.13.9/aarch64")[0] == 404
    assert "lacks uv 0.13.9 for aarch64" in offline.problems[0]


def test_a_wheel_tampered_on_the_way_in_gives_no_uv(tmp_path):
    store = Store(tmp_path)
    urls = ("https://idx.example/simple/",)
    key = wheelhouse.index_key(urls)
    store.save_index(key, urls)
    name = "uv-0.13.9-py3-none-manylinux_2_17_x86_64.whl"
    sha = hashlib.sha256(_uv_wheel("0.13.9", b"uv")).hexdigest()
    page = f'<a href="/f/{name}#sha256={sha}">uv</a>'.encode()
    evil = _uv_wheel("0.13.9", b"not uv")
    up = StubUpstream(
        {"https://idx.example/simple/uv/": page}, {f"https://idx.example/f/{name}": evil}
    )
    proxy, server = serve(store, up)
    with server:
        url = f"http://127.0.0.1:{server.port}/{key}/tools/uv/0.13.9/x86_64"
        assert get(url)[0] == 502
    assert not store.has(sha) and "the index said" in proxy.problems[0]


def test_byte_ranges():
    from gpuenv.proxy import byte_range

    assert byte_range(None, 100) is None
    assert byte_range("bytes=0-9", 100) == (0, 10)
    assert byte_range("bytes=90-", 100) == (90, 10)
    assert byte_range("bytes=-30", 100) == (70, 30)
    assert byte_range("bytes=-300", 100) == (0, 100)
    assert byte_range("bytes=50-500", 100) == (50, 50)
    assert byte_range("bytes=200-300", 100) is None  # the whole file then
    assert byte_range("bytes=0-1,5-6", 100) is None


def test_two_builds_share_the_port_and_download_a_file_once(tmp_path):
    from concurrent.futures import ThreadPoolExecutor

    store = Store(tmp_path)
    urls = ("https://idx.example/simple/",)
    key = wheelhouse.index_key(urls)
    store.save_index(key, urls)
    page = f'<a href="/f/demo-1.0.tar.gz#sha256={SHA}">demo</a>'.encode()
    files = {"https://idx.example/f/demo-1.0.tar.gz": WHEEL}
    ups = [StubUpstream({"https://idx.example/simple/demo/": page}, files) for _ in range(2)]
    for up in ups:
        up.delay = 0.3
    port = _free_port()
    first = Proxy(Store(tmp_path), credentials=credentials.Credentials({}), upstream=ups[0])  # type: ignore[arg-type]
    second = Proxy(Store(tmp_path), credentials=credentials.Credentials({}), upstream=ups[1])  # type: ignore[arg-type]
    with WheelhouseServer(first, port=port), WheelhouseServer(second, port=port) as joined:
        assert joined.shared  # same store, online, same credentials: one port
        root = f"http://127.0.0.1:{port}"
        for _ in range(4):  # both servers get to know the page (the kernel spreads these)
            assert get(f"{root}/{key}/simple/demo/")[0] == 200
        link = f"{root}/{key}/files/demo/{SHA}/demo-1.0.tar.gz"
        with ThreadPoolExecutor(8) as pool:
            assert set(pool.map(lambda _: get(link), range(16))) == {(200, WHEEL)}
        downloads = sum(u.asked.count("https://idx.example/f/demo-1.0.tar.gz") for u in ups)
        assert downloads == 1
        offline = Proxy(store, credentials=credentials.Credentials({}), offline=True)
        waiting = WheelhouseServer(offline, port=port)
        waiting.wait_seconds = 1
        with pytest.raises(GpuenvError, match="different wheelhouse"):
            waiting.__enter__()
