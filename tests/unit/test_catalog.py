"""The generated catalog (issue 23): `gpuenv catalog --refresh` against a loopback index
serving the recorded pages and METADATA files (tests/unit/fixtures/catalog/, recorded from
PyPI through the proxy; SOURCES.json names each file's URL and the date), the walk over
every catalog row x Python (resolve, render, every pin inside the framework's own
Requires-Dist of the recorded METADATA), range-read METADATA, and the CLI."""

from __future__ import annotations

import contextlib
import copy
import datetime
import functools
import hashlib
import http.server
import io
import json
import os
import re
import shutil
import threading
import zipfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
import yaml
from cli_runner import invoke_as_entry_point
from packaging.specifiers import SpecifierSet
from packaging.version import Version
from rendering import key_of

from gpuenv.building.render import render
from gpuenv.catalog import compat, freshness, refresh
from gpuenv.catalog.index import Index, Unreachable, parse_metadata
from gpuenv.matrix import schema as matrix
from gpuenv.matrix.errors import GpuenvError
from gpuenv.store.wheelhouse import IndexFile

FIXTURES = Path(__file__).parent / "fixtures" / "catalog"
DATA = Path(refresh.__file__).resolve().parents[1] / "data"
PYPI = "https://pypi.org/simple/"
FILES = "https://files.pythonhosted.org/"


# ---------------------------------------------------------------------- a loopback index


class _Handler(http.server.BaseHTTPRequestHandler):
    """/simple/<project>/ (PEP 691 JSON, from the recorded pages, with any yanked files the
    test asks for), /files/<path>.metadata (the recorded METADATA), /files/<path> (a wheel
    the test registered, with Range support)."""

    server: _Server

    def log_message(self, *args: object) -> None:  # quiet
        pass

    def do_GET(self) -> None:
        self.server.requests.append(self.path)
        if self.path.startswith("/simple/"):
            project = self.path.split("/")[2]
            page = FIXTURES / "pages" / f"{project}.json"
            if not page.exists():
                return self._send(404, b"no such project", "text/plain")
            doc = json.loads(page.read_text())
            for f in doc["files"]:  # URLs stay PyPI's: LoopbackIndex answers them here
                if f["filename"] in self.server.yanked:
                    f["yanked"] = "broken build"
            return self._send(200, json.dumps(doc).encode(), "application/vnd.pypi.simple.v1+json")
        name = self.path.rsplit("/", 1)[-1]
        if name.endswith(".metadata"):
            path = FIXTURES / "metadata" / name
            if path.exists():
                return self._send(200, path.read_bytes(), "application/octet-stream")
        if name in self.server.wheels:
            return self._ranged(self.server.wheels[name])
        return self._send(404, b"not found", "text/plain")

    def _ranged(self, data: bytes) -> None:
        m = re.fullmatch(r"bytes=(\d*)-(\d*)", self.headers.get("Range", ""))
        if not m:
            return self._send(200, data, "application/zip")
        start, end = m.groups()
        if not start:  # a suffix: the last N bytes
            first, last = max(0, len(data) - int(end)), len(data) - 1
        else:
            first, last = int(start), min(len(data) - 1, int(end) if end else len(data) - 1)
        self.send_response(206)
        self.send_header("Content-Range", f"bytes {first}-{last}/{len(data)}")
        self.send_header("Content-Length", str(last - first + 1))
        self.end_headers()
        self.wfile.write(data[first : last + 1])

    def _send(self, code: int, body: bytes, kind: str) -> None:
        self.send_response(code)
        self.send_header("Content-Type", kind)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)


class _Server(http.server.ThreadingHTTPServer):
    def __init__(self) -> None:
        super().__init__(("127.0.0.1", 0), _Handler)
        self.base = f"http://127.0.0.1:{self.server_address[1]}"
        self.yanked: set[str] = set()
        self.wheels: dict[str, bytes] = {}
        self.requests: list[str] = []


class LoopbackIndex(Index):
    """PyPI's URLs, answered by the loopback server: the data generated names PyPI exactly
    as a refresh against PyPI does, so it can be compared with the shipped files byte for
    byte."""

    def __init__(self, server: _Server) -> None:
        super().__init__(PYPI)
        self.server = server

    def _open(self, url: str, headers: dict[str, str]):
        url = url.replace(PYPI, f"{self.server.base}/simple/").replace(
            FILES, f"{self.server.base}/files/"
        )
        return super()._open(url, headers)


@contextlib.contextmanager
def _serving() -> Iterator[_Server]:
    srv = _Server()
    # Poll every 10 ms: shutdown() waits out one poll, 0.5 s by default, per test.
    thread = threading.Thread(target=srv.serve_forever, args=(0.01,), daemon=True)
    thread.start()
    try:
        yield srv
    finally:
        srv.shutdown()
        srv.server_close()


@pytest.fixture
def server() -> Iterator[_Server]:
    with _serving() as srv:
        yield srv


@functools.cache
def _parsed(name: str) -> dict:
    return yaml.safe_load((DATA / name).read_text("utf-8"))


def _shipped(name: str) -> dict:
    """A shipped data file's content, the tests' own to change: parsed once per module (the
    user's-copy tests read every file some 30 times), copied each time."""
    return copy.deepcopy(_parsed(name))


def _today() -> datetime.date:
    return datetime.date.fromisoformat(_shipped("torch.yaml")["refreshed"])


def _copy_of_the_shipped_data(target: Path) -> Path:
    target.mkdir()
    for name in refresh.GENERATED:
        shutil.copy(DATA / name, target / name)
    return target


@pytest.fixture
def data_dir(tmp_path) -> Path:
    """A copy of the shipped generated files: the "previous" state a refresh compares with."""
    return _copy_of_the_shipped_data(tmp_path / "data")


@pytest.fixture(scope="module")
def recorded(tmp_path_factory) -> tuple[refresh.Refresh, list[str]]:
    """One refresh of a copy of the shipped data from the recorded index, and the paths the
    index was asked for: a refresh parses every data file and page (about 0.8 s), and the
    tests that read this one change nothing of it."""
    data = _copy_of_the_shipped_data(tmp_path_factory.mktemp("recorded") / "data")
    with _serving() as srv:
        result = refresh.refresh(LoopbackIndex(srv), today=_today(), data=data)
    return result, srv.requests


# ---------------------------------------------------------------------- refresh


def test_the_recorded_index_regenerates_the_shipped_data_exactly(recorded):
    result, requests = recorded
    assert result.changes == []
    for name in refresh.GENERATED:
        assert refresh.dump(result.documents[name]) == (DATA / name).read_text("utf-8"), name
    # METADATA came from the .metadata files (PEP 658), never a wheel.
    assert any(p.endswith(".whl.metadata") for p in requests)
    assert not [p for p in requests if p.endswith(".whl")]


def test_a_new_release_appears_and_nothing_else_changes(server, data_dir):
    # Last week's data: without torch 2.15.
    torch = yaml.safe_load((data_dir / "torch.yaml").read_text())
    torch["releases"] = [r for r in torch["releases"] if r["minor"] != "2.15"]
    (data_dir / "torch.yaml").write_text(refresh.dump(torch))
    result = refresh.refresh(LoopbackIndex(server), today=_today(), data=data_dir)
    assert result.changes == ["torch: + 2.15 (2.15.0)"]
    written = refresh.write(result, data_dir)
    assert written == [data_dir / "torch.yaml"]
    for name in refresh.GENERATED:
        assert (data_dir / name).read_text() == (DATA / name).read_text(), name


def test_a_yanked_release_disappears_and_nothing_else_changes(server, data_dir):
    page = json.loads((FIXTURES / "pages" / "torch.json").read_text())
    server.yanked = {f["filename"] for f in page["files"] if "-2.15.0-" in f["filename"]}
    result = refresh.refresh(LoopbackIndex(server), today=_today(), data=data_dir)
    # The release goes, and with it the cuDNN pair only its pins brought.
    assert result.changes == [
        "torch: - 2.15 (2.15.0)",
        "cuda-wheels: - CUDA/cuDNN pair 13.2/9.26",
    ]
    torch = result.documents["torch.yaml"]
    assert [r["minor"] for r in torch["releases"]][:2] == ["2.14", "2.13"]
    shipped = _shipped("torch.yaml")
    assert torch["releases"] == [r for r in shipped["releases"] if r["minor"] != "2.15"]
    for name in ("jax.yaml", "tensorflow.yaml"):
        assert refresh.dump(result.documents[name]) == (DATA / name).read_text(), name


def test_refresh_is_deterministic(recorded, server, data_dir):
    one = recorded[0]  # another refresh, from another server, of another copy
    two = refresh.refresh(LoopbackIndex(server), today=_today(), data=data_dir)
    assert {n: refresh.dump(d) for n, d in one.documents.items()} == {
        n: refresh.dump(d) for n, d in two.documents.items()
    }


def test_the_shipped_data_names_its_refresh_and_sources():
    for name in ("torch.yaml", "jax.yaml", "tensorflow.yaml", "cuda-wheels.yaml"):
        text = (DATA / name).read_text()
        assert text.startswith("# GENERATED by `gpuenv catalog --refresh`")
        doc = yaml.safe_load(text)
        assert doc["refreshed"] == _today().isoformat() and doc["index"] == PYPI
    for framework in compat.FRAMEWORKS:
        for row in _shipped(f"{framework}.yaml")["releases"]:
            assert row["source"].startswith("METADATA of https://files.pythonhosted.org/")
    sources = json.loads((FIXTURES / "SOURCES.json").read_text())
    assert sources["recorded"] == _today().isoformat()  # one refresh wrote both
    recorded = {p.relative_to(FIXTURES).as_posix() for p in FIXTURES.rglob("*") if p.is_file()}
    assert recorded - {"SOURCES.json"} == set(sources["files"])


def test_every_release_from_the_floors_is_held():
    """Every final minor on the recorded pages from torch 2.9, JAX 0.7 and TensorFlow 2.12
    on is a row, at its newest patch."""
    for framework, project in (("torch", "torch"), ("jax", "jaxlib"), ("tensorflow", "tensorflow")):
        page = json.loads((FIXTURES / "pages" / f"{project}.json").read_text())
        newest: dict[str, Version] = {}
        for f in page["files"]:
            version = Version(f["filename"].split("-")[1])
            if version.is_prerelease or version < Version(refresh.FLOORS[framework]):
                continue
            minor = f"{version.major}.{version.minor}"
            newest[minor] = max(newest.get(minor, version), version)
        cat = compat.catalog(framework)
        assert set(cat.releases) == set(newest), framework
        for minor, version in newest.items():
            assert Version(cat.releases[minor].version) == version, (framework, minor)


# ---------------------------------------------------------------------- the walk

WALK = [
    (framework, minor, python)
    for framework in compat.FRAMEWORKS
    for minor, row in compat.catalog(framework).releases.items()
    for python in row.python
]


def _metadata_for(source: str, needle: str) -> list[str]:
    """The recorded Requires-Dist of the wheel a row's source names (``needle`` in its
    file name)."""
    names = [u.rsplit("/", 1)[-1] for u in re.findall(r"https://\S+\.whl", source)]
    name = next(n for n in names if needle in n and "aarch64" not in n)
    return parse_metadata((FIXTURES / "metadata" / f"{name}.metadata").read_text())[0]


def _own_requirements(framework: str, row: compat.FrameworkRelease, python: str) -> dict:
    """The framework's own CUDA requirements for Linux x86_64 at ``python``, from the
    recorded METADATA: name -> SpecifierSet (cuda-toolkit's extras expanded)."""
    if framework == "torch":
        lines = _metadata_for(row.source, "torch-")
        reqs = refresh.requirements(lines, "x86_64", python)
    elif framework == "jax":
        lines = _metadata_for(row.source, "plugin")
        reqs = refresh.requirements(lines, "x86_64", python, ("with-cuda",))
        major = row.gpu_default[0].split(".")[0]
        jax_lines = _metadata_for(row.source, "jax-")
        jax_reqs = refresh.requirements(jax_lines, "x86_64", python, (f"cuda{major}",))
        reqs[f"jax-cuda{major}-plugin"] = jax_reqs[f"jax-cuda{major}-plugin"]
    else:
        lines = _metadata_for(row.source, "tensorflow-")
        reqs = refresh.requirements(lines, "x86_64", python, ("and-cuda",))
    out = {n: r.specifier for n, r in reqs.items() if refresh._cuda_package(n)}
    toolkit = reqs.get("cuda-toolkit")
    if toolkit is not None:
        tk_lines = _metadata_for(row.source, "cuda_toolkit-")
        for extra in toolkit.extras:
            for name, req in refresh.requirements(tk_lines, "x86_64", python, (extra,)).items():
                if re.search(rf"extra == ['\"]{extra}['\"]", str(req.marker or "")):
                    out[name] = req.specifier
    return out


@pytest.mark.parametrize(("framework", "minor", "python"), WALK,
                         ids=[f"{f}{m}-py{p}" for f, m, p in WALK])  # fmt: skip
def test_walk_every_row_and_python(write_matrix, framework, minor, python):
    cat = compat.catalog(framework)
    row = cat.releases[minor]
    text = (
        f'name: acme/walk\nmatrix:\n  {framework}: ["{minor}"]\n  python: ["{python}"]\n'
        f'  variant: [cpu, gpu]\nbases:\n  "{python}": {{image: "python:{python}-slim"}}\n'
    )
    res = compat.resolve(matrix.load(write_matrix(text)))
    cpu = next(c for c in res.cells if not c.is_gpu)
    assert cpu.framework_version == row.version
    assert (
        render(cpu, key_of(cpu)).dockerfile.startswith("# syntax=")
        or "FROM " in render(cpu, key_of(cpu)).dockerfile
    )
    if row.gpu_default is None:
        assert res.rejected and row.gpu_unsupported in res.rejected[0]["reason"]
        return
    gpu = next(c for c in res.cells if c.is_gpu)
    assert "NVIDIA_REQUIRE_CUDA" in render(gpu, key_of(gpu)).dockerfile
    # Every pin inside the framework's own Requires-Dist; every CUDA requirement pinned
    # (TensorRT excepted: gpuenv does not install it). Wheels no requirement names are
    # nvcc's companions only (nvidia-cuda-crt, nvidia-nvvm at the toolkit's release).
    own = _own_requirements(framework, row, python)
    own.pop("tensorrt", None)
    for name, spec in own.items():
        assert name in gpu.wheels, (name, str(spec))
        assert spec.contains(gpu.wheels[name], prereleases=True), (name, str(spec))
    companions = set(cat.toolkits[gpu.cuda].companions.get("nvidia-cuda-nvcc", ()))
    assert set(gpu.wheels) - set(own) <= companions | {f"jax-cuda{gpu.cuda[:2]}-pjrt"}
    assert gpu.cudnn_wheel and gpu.cudnn_wheel.startswith(f"{gpu.cudnn}.")


# ---------------------------------------------------------------------- errors


def test_unknown_release_names_the_newest_and_the_refresh(write_matrix):
    text = (
        'name: acme/x\nmatrix:\n  torch: ["2.16"]\n  python: ["3.13"]\n'
        'bases:\n  "3.13": {debian: trixie}\n'
    )
    with pytest.raises(GpuenvError) as exc:
        compat.resolve(matrix.load(write_matrix(text)))
    message = str(exc.value)
    assert "unknown PyTorch version 2.16" in message
    assert "2.9-2.15 (every minor release)" in message and "newest 2.15 (2.15.0" in message
    assert "`gpuenv catalog --refresh`" in message


def test_ranges_in_messages_are_true():
    cat = compat.catalog("torch")
    assert cat.known_releases() == "2.9-2.15 (every minor release)"
    gap = compat.Catalog(**{**cat.__dict__, "releases": {
        m: r for m, r in cat.releases.items() if m != "2.10"}})  # fmt: skip
    assert gap.known_releases() == "2.9, 2.11, 2.12, 2.13, 2.14, 2.15"


# ---------------------------------------------------------------------- the index reader


def _wheel(metadata: str, filler: int = 600_000) -> bytes:
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w", zipfile.ZIP_DEFLATED) as z:
        z.writestr("demo/big.bin", hashlib.sha512(b"x").digest() * (filler // 64))
        z.writestr("demo-1.0.dist-info/METADATA", metadata)
        z.writestr("demo-1.0.dist-info/RECORD", "")
    return buffer.getvalue()


def test_metadata_by_range_requests_reads_a_few_blocks(server):
    text = "Metadata-Version: 2.1\nName: demo\nVersion: 1.0\nRequires-Dist: six==1.17.0\n"
    data = _wheel(text)
    server.wheels["demo-1.0-py3-none-any.whl"] = data
    index = Index(f"{server.base}/simple/")
    file = IndexFile("demo-1.0-py3-none-any.whl",
                     f"{server.base}/files/demo-1.0-py3-none-any.whl", "0" * 64)  # fmt: skip
    assert index.metadata(file) == text
    assert index.requests <= 3
    assert parse_metadata(text) == (["six==1.17.0"], None)


def test_a_metadata_file_that_does_not_match_its_hash_is_refused(server):
    name = "torch-2.15.0-cp315-cp315-manylinux_2_28_x86_64.whl"
    index = LoopbackIndex(server)
    file = IndexFile(name, f"{FILES}packages/{name}", "0" * 64, metadata_sha256="1" * 64)
    with pytest.raises(GpuenvError, match="does not match the sha256"):
        index.metadata(file)


def test_an_unreachable_index_is_one_error():
    index = Index("http://127.0.0.1:9/simple/")
    with pytest.raises(Unreachable, match="cannot reach the package index"):
        index.page("torch")


# ---------------------------------------------------------------------- the CLI


@dataclass
class _Result:
    exit_code: int
    output: str


@pytest.fixture
def cli():
    """`gpuenv ARGS` as a new process runs it, in this one (a new interpreter cost some
    0.5 s of imports a call): the catalog in use chosen afresh, before and after; the exit
    code, and stdout followed by stderr."""

    def run(*args: str) -> _Result:
        freshness.current.cache_clear()
        compat.catalog.cache_clear()
        try:
            result = invoke_as_entry_point(list(args))
        finally:
            freshness.current.cache_clear()
            compat.catalog.cache_clear()
        assert result.exception is None or isinstance(result.exception, SystemExit), result.exc_info
        return _Result(result.exit_code, result.stdout + result.stderr)

    return run


def test_cli_lists_the_catalog(cli):
    result = cli("catalog", "torch")
    assert result.exit_code == 0, result.output
    lines = result.output.splitlines()
    assert lines[0].split() == ["FRAMEWORK", "RELEASE", "PYTHON", "CUDA", "CUDNN", "REFRESHED"]
    assert lines[1].split() == ["torch", "2.15.0", "3.11-3.15", "13.2.2", "9.26.0.51", "2026-11-24"]
    doc = json.loads(cli("catalog", "jax", "--json").output)
    newest = doc["releases"][0]
    assert (newest["version"], newest["gpu"]["cuda"], newest["refreshed"]) == (
        "0.12.0.1", "13.0", "2026-11-24")  # fmt: skip
    assert newest["source"].startswith("METADATA of https://files.pythonhosted.org/")
    tf = cli("catalog", "tf")
    assert "tensorflow  2.12.1" in tf.output and "CPU only" in tf.output


def test_cli_refuses_an_unknown_framework(cli):
    result = cli("catalog", "mxnet")
    assert result.exit_code == 1
    assert result.output.strip() == (
        "error: unknown framework 'mxnet' for `gpuenv catalog`; use tensorflow, torch or jax"
    )


def test_cli_refresh_offline_is_one_error_line(cli, monkeypatch):
    monkeypatch.setenv("GPUENV_CATALOG_INDEX", "http://127.0.0.1:9/simple/")
    result = cli("catalog", "--refresh")
    assert result.exit_code == 1
    lines = result.output.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: cannot reach the package index")
    assert "Traceback" not in result.output


def test_the_data_files_parse_as_the_catalog_expects():
    for framework in compat.FRAMEWORKS:
        cat = compat.catalog(framework)
        for row in cat.releases.values():
            assert row.python == tuple(sorted(row.python, key=Version))
            if row.exact:
                assert row.gpu_release and SpecifierSet(f"=={row.gpu_release}")


# ---------------------------------------------------------------------- the user's copy
# (issue 45: the catalog keeps up between releases; gpuenv/catalog/freshness.py)


def _documents(refreshed: str) -> dict:
    """The packaged generated documents, as a refresh dated ``refreshed`` would write them."""
    docs = {name: _shipped(name) for name in freshness.GENERATED}
    for doc in docs.values():
        doc["refreshed"] = refreshed
    return docs


def _later(days: int = 1) -> str:
    return (_today() + datetime.timedelta(days=days)).isoformat()


@functools.cache
def _packaged() -> freshness.Documents:
    return freshness.packaged()


def _choose(cached: object, unreadable: str | None = None) -> freshness.Choice:
    """freshness.choose, with the package's documents read once per module (copied)."""
    return freshness.choose(copy.deepcopy(_packaged()), cached, unreadable, "/c/catalog.json",
                            compat.check_documents)  # fmt: skip


def test_without_a_copy_the_packaged_catalog_is_read():
    choice = _choose(None)
    assert (choice.origin, choice.refreshed, choice.warning) == ("packaged", _today(), None)


def test_a_valid_newer_copy_is_read_instead_of_the_packaged_one():
    docs = _documents(_later())
    docs["jax.yaml"]["releases"][0]["version"] = "0.12.9"
    choice = _choose({"format": 1, "documents": docs})
    assert (choice.origin, choice.refreshed, choice.warning) == (
        "/c/catalog.json", _today() + datetime.timedelta(days=1), None)  # fmt: skip
    assert compat._catalog("jax", choice.documents).newest().version == "0.12.9"


@pytest.mark.parametrize("days", [0, -3])
def test_a_copy_no_newer_than_the_package_is_not_read_and_not_warned_of(days):
    # An upgrade of gpuenv since the user's refresh: the package's catalog is as new or newer.
    choice = _choose({"format": 1, "documents": _documents(_later(days))})
    assert (choice.origin, choice.warning) == ("packaged", None)


def _broken(how: str) -> object:
    docs = _documents(_later())
    if how == "not an object":
        return ["torch.yaml"]
    if how == "another format":
        return {"format": 2, "documents": docs}
    if how == "a document missing":
        del docs["cuda-wheels.yaml"]
    elif how == "a document under another name":
        docs["torch.yaml"], docs["jax.yaml"] = docs["jax.yaml"], docs["torch.yaml"]
    elif how == "two refresh dates":
        docs["jax.yaml"]["refreshed"] = _later(2)
    elif how == "a row without its Pythons":
        del docs["torch.yaml"]["releases"][0]["python"]
    elif how == "a GPU row whose wheels do not pin":
        docs["jax.yaml"]["releases"][0]["gpu"]["cuda"] = "11.0"
    return {"format": 1, "documents": docs}


@pytest.mark.parametrize("how, why", [
    ("not an object", "not a gpuenv catalog (format 1)"),
    ("another format", "not a gpuenv catalog (format 1)"),
    ("a document missing", "it must hold exactly torch.yaml, jax.yaml, tensorflow.yaml, "
                           "cuda-wheels.yaml"),
    ("a document under another name", "its torch.yaml is not the torch catalog"),
    ("two refresh dates", "its documents do not record one refresh date (YYYY-MM-DD)"),
    ("a row without its Pythons", "the catalog's loader refuses it (KeyError: 'python')"),
    ("a GPU row whose wheels do not pin", "the catalog's loader refuses it (ValueError: "),
])  # fmt: skip
def test_a_malformed_copy_is_ignored_with_a_warning(how, why):
    choice = _choose(_broken(how))
    assert (choice.origin, choice.refreshed) == ("packaged", _today())
    assert choice.warning is not None
    assert choice.warning.startswith(f"ignoring /c/catalog.json: {why}"), choice.warning
    assert choice.warning.endswith("; `gpuenv catalog --refresh` rewrites it")


def test_a_copy_that_could_not_be_read_is_ignored_with_a_warning():
    choice = _choose(None, "owned by uid 0, not by you (uid 1000)")
    assert choice.origin == "packaged"
    assert choice.warning == ("ignoring /c/catalog.json: owned by uid 0, not by you (uid 1000); "
                              "`gpuenv catalog --refresh` rewrites it")  # fmt: skip


def test_only_a_regular_file_of_this_user_is_read(tmp_path):

    uid = os.geteuid()
    path = tmp_path / "catalog.json"
    assert freshness.read_cached(path, uid) == (None, None)  # none: nothing to say
    path.write_text('{"format": 1}')
    assert freshness.read_cached(path, uid) == ({"format": 1}, None)
    assert freshness.read_cached(path, uid + 1) == (
        None, f"owned by uid {uid}, not by you (uid {uid + 1})")  # fmt: skip
    link = tmp_path / "link.json"
    link.symlink_to(path)
    assert freshness.read_cached(link, uid)[1].startswith("cannot be read")  # never followed
    assert freshness.read_cached(tmp_path, uid) == (None, "not a regular file")
    path.write_text("{half")
    assert freshness.read_cached(path, uid)[1].startswith("not JSON")


def test_a_catalog_is_stale_after_thirty_days():
    choice = freshness.Choice({}, "packaged", datetime.date(2026, 11, 24))
    assert freshness.stale_note(choice, datetime.date(2026, 12, 24)) is None
    assert freshness.stale_note(choice, datetime.date(2026, 12, 25)) == (
        "the catalog was refreshed 2026-11-24 (31 days ago); newer framework releases may be "
        "missing: `gpuenv catalog --refresh` updates your copy")  # fmt: skip
    assert freshness.stale_note(freshness.Choice({}, "packaged", None), _today()) is None
    # $GPUENV_CATALOG_MAX_AGE: another number of days, or "off"; anything else: the default.
    assert freshness.stale_note(choice, datetime.date(2026, 11, 30), "5") is not None
    assert freshness.stale_note(choice, datetime.date(2027, 11, 24), "off") is None
    assert freshness.stale_note(choice, datetime.date(2026, 12, 24), "soon") is None


@pytest.fixture
def user_cache(tmp_path, monkeypatch) -> Iterator[Path]:
    """An empty XDG cache, and the process's choice of catalog forgotten before and after."""
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    freshness.current.cache_clear()
    compat.catalog.cache_clear()
    yield tmp_path / "cache" / "gpuenv" / freshness.CACHE_NAME
    freshness.current.cache_clear()
    compat.catalog.cache_clear()


def test_a_refresh_writes_the_users_cache_which_is_then_read(server, user_cache):
    from gpuenv.catalog import listing

    changes, where = listing.refresh_from(LoopbackIndex(server))
    assert (changes, where) == ([], str(user_cache))  # the recorded index: nothing new
    cached, unreadable = freshness.read_cached(user_cache, os.geteuid())
    assert unreadable is None and set(cached["documents"]) == set(freshness.GENERATED)
    today = datetime.date.today()
    assert freshness.refreshed_of(cached["documents"]) == today  # when the index was asked
    freshness.current.cache_clear()  # a new process
    chosen = compat.generated()
    assert chosen.origin == (str(user_cache) if today > _today() else "packaged")
    # The rows are the package's (the recorded index is the package's refresh).
    for name in freshness.GENERATED:
        assert {**chosen.documents[name], "refreshed": "-"} == {**_shipped(name), "refreshed": "-"}


def test_the_snapshot_key_follows_the_users_catalog(user_cache, tmp_path):
    from gpuenv.project import fingerprint

    matrix, lock = tmp_path / "matrix.yaml", tmp_path / "matrix.lock"
    matrix.write_text("name: x\n")
    before = fingerprint.key(matrix, lock)
    user_cache.parent.mkdir(parents=True)
    user_cache.write_text(json.dumps({"format": 1, "documents": _documents(_later())}))
    assert fingerprint.key(matrix, lock) != before


def test_the_verbs_that_choose_releases_say_when_the_catalog_is_stale(
    user_cache, monkeypatch, write_matrix
):
    from cli_runner import CliRunner

    from gpuenv.cli import app

    monkeypatch.delenv("GPUENV_CATALOG_MAX_AGE")
    monkeypatch.setattr(freshness, "STALE_DAYS", 0)
    note = "gpuenv: the catalog was refreshed 2026-11-24 ("
    listed = CliRunner().invoke(app, ["catalog", "jax"])
    assert listed.exit_code == 0 and note in listed.stderr, listed.output
    assert "(the catalog: the package's;" in listed.stdout
    shown = CliRunner().invoke(app, ["matrix", "-f", str(write_matrix())])
    assert shown.exit_code == 0 and note in shown.stderr, shown.output
    monkeypatch.setattr(freshness, "STALE_DAYS", 30_000)
    assert note not in CliRunner().invoke(app, ["catalog", "jax"]).stderr


def test_the_cli_reads_a_newer_copy_and_ignores_another_users(cli, tmp_path, monkeypatch):

    cache = tmp_path / "cache"
    (cache / "gpuenv").mkdir(parents=True)
    path = cache / "gpuenv" / freshness.CACHE_NAME
    docs = _documents(_later())
    docs["jax.yaml"]["releases"][0]["version"] = "0.12.9"
    path.write_text(json.dumps({"format": 1, "documents": docs}))
    monkeypatch.setenv("XDG_CACHE_HOME", str(cache))
    listed = cli("catalog", "jax")
    assert listed.exit_code == 0, listed.output
    assert listed.output.splitlines()[1].split()[:2] == ["jax", "0.12.9"]
    assert f"(the catalog: your refreshed copy {path};" in listed.output
    if os.geteuid() != 0:
        return  # giving the file away needs root
    os.chown(path, 4242, 4242)
    listed = cli("catalog", "jax")
    assert listed.exit_code == 0, listed.output
    assert listed.output.splitlines()[1].split()[:2] == ["jax", "0.12.0.1"]
    assert (f"gpuenv: warning: ignoring {path}: owned by uid 4242, not by you (uid 0); "
            "`gpuenv catalog --refresh` rewrites it") in listed.output  # fmt: skip


def test_refresh_into_a_folder_without_the_catalog_files_is_one_error(cli, tmp_path):
    result = cli("catalog", "--refresh", "--into", str(tmp_path))
    assert result.exit_code == 1
    assert result.output.strip() == (
        f"error: {tmp_path}: --into needs a folder holding the generated catalog files "
        "(torch.yaml, jax.yaml, tensorflow.yaml, cuda-wheels.yaml), as gpuenv/data/ in a "
        "checkout does")  # fmt: skip
