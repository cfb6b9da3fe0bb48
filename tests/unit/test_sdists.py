"""Source distributions: what a static read of one tells, how uv is told about it, and the
wheel built from it once in the sandbox (an engine stand-in that records the run) and
reused after. The real sandbox is test_engine_requirements.py's."""

from __future__ import annotations

import io
import subprocess
import tarfile
import zipfile
from pathlib import Path
from typing import Any

import pytest

from gpuenv.building import lock as locks
from gpuenv.building import sdists
from gpuenv.building.sdists import Metadata, Sandbox, WheelBuilder
from gpuenv.matrix.errors import GpuenvError
from gpuenv.store.credentials import Credentials
from gpuenv.store.fetch import Fetcher, source_of
from gpuenv.store.wheelhouse import IndexFile, Requirement, Store, index_key

SHA_A, SHA_B, SHA_C = "a" * 64, "b" * 64, "c" * 64


def sdist(tmp_path: Path, name: str, files: dict[str, str]) -> Path:
    """A .tar.gz sdist `name` (its top directory) holding `files`."""
    path = tmp_path / f"{name}.tar.gz"
    with tarfile.open(path, "w:gz") as tar:
        for member, text in files.items():
            data = text.encode()
            info = tarfile.TarInfo(f"{name}/{member}")
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    return path


PKG_INFO_22 = "Metadata-Version: 2.2\nName: Foo_Bar\nVersion: 1.0\nRequires-Dist: six>=1\n"


def test_pep_643_metadata_is_read_only_when_static() -> None:
    got = sdists.static_metadata(PKG_INFO_22 + "Requires-Python: >=3.9\n")
    assert got == Metadata("foo-bar", "1.0", ("six>=1",), ">=3.9")
    # Older metadata (what jsonpath-rw 1.4.0's PKG-INFO is) says nothing about dependencies.
    assert sdists.static_metadata(PKG_INFO_22.replace("2.2", "1.1")) is None
    assert sdists.static_metadata(PKG_INFO_22 + "Dynamic: Requires-Dist\n") is None
    assert sdists.static_metadata(PKG_INFO_22 + "Dynamic: requires-python\n") is None


def test_a_static_read_finds_build_requirements_and_native_sources(tmp_path: Path) -> None:
    pyproject = '[build-system]\nrequires = ["flit_core>=3.2"]\nbuild-backend = "x"\n'
    pure = sdists.read_source(
        sdist(tmp_path, "pure-1.0", {"pyproject.toml": pyproject, "PKG-INFO": PKG_INFO_22,
                                     "pure/__init__.py": ""}),
        "pure-1.0.tar.gz",
    )  # fmt: skip
    assert pure.build_requires == ("flit_core>=3.2",)
    assert not pure.native
    assert pure.metadata is not None and pure.metadata.requires_dist == ("six>=1",)
    native = sdists.read_source(
        sdist(tmp_path, "crc-1.7", {"setup.py": "", "ext/_crc.c": "int x;"}), "crc-1.7.tar.gz"
    )
    assert native.native
    assert native.build_requires == sdists.DEFAULT_BUILD_REQUIRES  # PEP 517's fallback
    assert native.metadata is None


def test_a_built_wheel_must_be_the_package_and_fit_the_cell() -> None:
    assert sdists.fits("crcmod-1.7-cp311-cp311-linux_x86_64.whl", "crcmod", "1.7", "3.11", "x86_64")
    assert sdists.fits("jsonpath_rw-1.4.0-py3-none-any.whl", "jsonpath-rw", "1.4.0", "3.11",
                       "x86_64")  # fmt: skip
    assert not sdists.fits("crcmod-1.7-cp312-cp312-linux_x86_64.whl", "crcmod", "1.7", "3.11",
                           "x86_64")  # fmt: skip
    assert not sdists.fits("crcmod-1.7-cp311-cp311-linux_aarch64.whl", "crcmod", "1.7", "3.11",
                           "x86_64")  # fmt: skip
    assert not sdists.fits("other-1.7-py3-none-any.whl", "crcmod", "1.7", "3.11", "x86_64")
    assert not sdists.fits("crcmod-1.8-py3-none-any.whl", "crcmod", "1.7", "3.11", "x86_64")


def test_the_install_step_checks_the_built_wheel_s_hash() -> None:
    text = (
        "crcmod==1.7 \\\n    --hash=sha256:" + SHA_A + "\n"
        "ply @ https://files.example/p/ply-3.11.tar.gz \\\n    --hash=sha256:" + SHA_C + "\n"
        "six==1.17.0 \\\n    --hash=sha256:" + SHA_B + "\n"
    )
    got = sdists.with_wheel(text, "crcmod", "crcmod-1.7-cp311-cp311-linux_x86_64.whl", SHA_C)
    got = sdists.with_wheel(got, "ply", "ply-3.11-py3-none-any.whl", SHA_A)
    # The install step is offline: a URL becomes the name and version of the wheel sent.
    assert got == ("crcmod==1.7 \\\n    --hash=sha256:" + SHA_C + "\n"
                   "ply==3.11 \\\n    --hash=sha256:" + SHA_A + "\n"
                   "six==1.17.0 \\\n    --hash=sha256:" + SHA_B + "\n")  # fmt: skip


def test_a_lock_s_direct_reference_is_read_with_its_url_and_hash() -> None:
    from gpuenv.store.wheelhouse import locked_requirements

    text = (
        "ply @ https://files.example/p/ply-3.11.tar.gz \\\n    --hash=sha256:" + SHA_C + "\n"
        "x @ https://github.com/o/x/archive/0123abc.tar.gz \\\n    --hash=sha256:" + SHA_A + "\n"
        "six==1.17.0 \\\n    --hash=sha256:" + SHA_B + "\n"
    )
    ply, x, six = locked_requirements(text)
    assert ply == Requirement("ply", "3.11", frozenset({SHA_C}),
                              "https://files.example/p/ply-3.11.tar.gz")  # fmt: skip
    assert (x.version, x.url.endswith("0123abc.tar.gz")) == ("", True)  # its name says none
    assert six == Requirement("six", "1.17.0", frozenset({SHA_B}))


def _file(name: str, sha: str, **kw: Any) -> IndexFile:
    return IndexFile(name, f"https://files.example/{name}", sha, **kw)


def test_the_sdist_a_resolution_takes_is_the_pinned_or_newest_allowed() -> None:
    files = [
        _file("jp-1.3.0.tar.gz", SHA_A, upload_time="2020-01-01T00:00:00Z"),
        _file("jp-1.4.0.tar.gz", SHA_B, upload_time="2021-01-01T00:00:00Z"),
        _file("jp-1.4.0.zip", "d" * 64, upload_time="2021-01-01T00:00:00Z"),
        _file("jp-1.5.0.tar.gz", SHA_C, yanked=True),
        _file("jp-1.6.0.tar.gz", "e" * 64, upload_time="2030-01-01T00:00:00Z"),
        _file("jp-1.7.0.tar.gz", "f" * 64, requires_python=">=3.13"),
    ]
    choose = sdists.choose_source
    assert choose(files, "jp", ["jp==1.3.0"], "3.11", None).sha256 == SHA_A  # type: ignore[union-attr]
    # The newest not yanked, not after the lock's date, for the cell's Python; .tar.gz first.
    got = choose(files, "jp", ["other", "jp>=1"], "3.11", "2026-01-01T00:00:00Z")
    assert got is not None and got.filename == "jp-1.4.0.tar.gz"
    assert choose(files, "jp", ["jp<1"], "3.11", None) is None


def test_the_fetcher_picks_the_locked_sdist_when_no_wheel_fits() -> None:
    files = [_file("jp-1.4.0-py2-none-any.whl", SHA_A), _file("jp-1.4.0.tar.gz", SHA_B)]
    assert source_of(files, Requirement("jp", "1.4.0", frozenset({SHA_B}))) == files[1]
    assert source_of(files, Requirement("jp", "1.4.0", frozenset({SHA_A}))) is None


# ------------------------------------------------------------------ uv is told, never builds


class _Uv:
    """subprocess.run for `uv pip compile`: refuses `jp` as uv does until its metadata is
    given, and records each command with the files it was given."""

    def __init__(self) -> None:
        self.calls: list[dict[str, Any]] = []

    def __call__(self, command: list[str], **kw: Any) -> subprocess.CompletedProcess[str]:
        given = {}
        for flag in ("--config-file", "--constraint", "--build-constraint"):
            if flag in command:
                given[flag] = Path(command[command.index(flag) + 1]).read_text()
        self.calls.append({"command": command, **given})
        if "--no-binary" not in command:
            err = ("error: No solution found\n  cause: Because jp==1.4.0 has no usable wheels"
                   "\nhint: Wheels are required for `jp` because building from source is "
                   "disabled for all packages (i.e., with `--no-build`)\n")  # fmt: skip
            return subprocess.CompletedProcess(command, 1, "", err)
        return subprocess.CompletedProcess(command, 0, "jp==1.4.0 --hash=sha256:" + SHA_B, "")


def test_uv_is_given_an_sdist_s_metadata_and_allowed_that_sdist_alone(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    uv = _Uv()
    monkeypatch.setattr(locks.subprocess, "run", uv)
    asked: list[tuple[str, list[str]]] = []

    def sources(name: str, requirements: list[str]) -> Metadata:
        asked.append((name, requirements))
        return Metadata("jp", "1.4.0", ("ply", "six; python_version < '4'"), ">=3.8")

    out = locks.compile_requirements(["jp==1.4.0"], "3.11", None, None, sources=sources,
                                     constraints=["six==1.17.0"])  # fmt: skip
    assert out.startswith("jp==1.4.0")
    assert asked == [("jp", ["jp==1.4.0", "six==1.17.0"])]
    first, second = uv.calls
    assert "--no-build" in first["command"]  # the first try builds nothing, as always
    command = second["command"]
    assert "--no-build" not in command
    assert command[command.index("--only-binary") + 1] == ":all:"
    assert command[command.index("--no-binary") + 1] == "jp"
    assert 'name = "jp"' in second["--config-file"]
    assert 'requires-dist = ["ply", "six; python_version < \'4\'"]' in second["--config-file"]
    assert second["--constraint"].splitlines() == ["six==1.17.0", "jp==1.4.0"]
    assert "setuptools<0" in second["--build-constraint"]


def test_a_direct_reference_s_sdist_is_locked_by_the_hash_gpuenv_fetched_it_under(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    url = "https://files.example/p/jp-1.4.0.tar.gz"

    def uv(command: list[str], **kw: Any) -> subprocess.CompletedProcess[str]:
        if "--no-binary" not in command:
            err = f"error: Failed to download and build `jp @ {url}`\n  cause: Building " \
                  "source distributions for `jp` is disabled\n"  # fmt: skip
            return subprocess.CompletedProcess(command, 1, "", err)
        # uv names the URL and gives no hash of an sdist it did not build.
        out = f"jp @ {url}\nply==3.11 \\\n    --hash=sha256:{SHA_A}\n"
        return subprocess.CompletedProcess(command, 0, out, "")

    monkeypatch.setattr(locks.subprocess, "run", uv)
    meta = Metadata("jp", "1.4.0", ("ply",), "", url, SHA_C)
    out = locks.compile_requirements([f"jp @ {url}"], "3.11", None, None,
                                     sources=lambda *_: meta)  # fmt: skip
    assert (
        out
        == f"jp @ {url} \\\n    --hash=sha256:{SHA_C}\nply==3.11 \\\n    --hash=sha256:{SHA_A}\n"
    )


def test_without_a_source_of_metadata_an_sdist_only_package_is_one_clear_error(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(locks.subprocess, "run", _Uv())
    with pytest.raises(GpuenvError, match=r"jp publishes no wheel .* only a source distribution"):
        locks.compile_requirements(["jp==1.4.0"], "3.11", None, None)


# ------------------------------------------------------------------ the sandbox


class _Info:
    id = "sha256:" + "1" * 64


class _Engine:
    """The two operations a WheelBuilder asks of an engine, recorded."""

    def __init__(self, wheel_name: str) -> None:
        self.runs: list[dict[str, Any]] = []
        self.wheel_name = wheel_name
        self.built: list[str] = []
        self.removed: list[str] = []

    def image(self, ref: str) -> _Info:
        return _Info()

    def run_collecting(self, image: str, command: list[str], **kw: Any) -> tuple[int, str, bytes]:
        self.runs.append({"image": image, "command": command, **kw})
        buf, whl = io.BytesIO(), io.BytesIO()
        with zipfile.ZipFile(whl, "w") as zf:
            metadata = "Metadata-Version: 2.1\nName: jp\nVersion: 1.4.0\nRequires-Dist: ply\n"
            zf.writestr("jp-1.4.0.dist-info/METADATA", metadata)
        data = whl.getvalue()
        with tarfile.open(fileobj=buf, mode="w") as tar:
            info = tarfile.TarInfo(f"out/{self.wheel_name}")
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
        return 0, "built", buf.getvalue()

    def build(self, context: Any, **kw: Any) -> str:
        self.built.append(kw["network"])
        return "sha256:compilers"

    def remove_image(self, ref: str, *, force: bool = False) -> bool:
        self.removed.append(ref)
        return True


def _builder(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, engine: _Engine,
             files: dict[str, str]) -> tuple[WheelBuilder, IndexFile]:  # fmt: skip
    import hashlib

    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    store = Store(tmp_path / "wheelhouse")
    key = index_key(["https://pypi.example/simple/"])
    path = sdist(tmp_path, "jp-1.4.0", files)
    sha = hashlib.sha256(path.read_bytes()).hexdigest()
    with path.open("rb") as fh:
        store.put(sha, fh, "jp")
    entry = _file("jp-1.4.0.tar.gz", sha)
    store.save_page(key, "jp", [entry], "https://pypi.example/simple/")
    fetcher = Fetcher(store, credentials=Credentials({}), offline=True)
    uv = tmp_path / "uv"
    uv.write_bytes(b"#!uv")
    builder = WheelBuilder(engine, fetcher, key, lambda *_: "", lambda _: uv)  # type: ignore[arg-type]
    return builder, entry


SANDBOX = Sandbox("gpuenv/debian:bookworm", "3.11", "x86_64", (2, 36), "x86_64-manylinux_2_28")


def test_an_sdist_is_built_once_without_network_and_reused(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    engine = _Engine("jp-1.4.0-py3-none-any.whl")
    builder, entry = _builder(tmp_path, monkeypatch, engine, {"setup.py": "", "jp.py": ""})
    builder.fetcher.offline = False  # building is allowed online only
    req = Requirement("jp", "1.4.0", frozenset({entry.sha256}))
    wheel, path = builder.wheel(req, entry, SANDBOX)
    assert wheel.filename == "jp-1.4.0-py3-none-any.whl" and path.is_file()
    (run,) = engine.runs
    assert run["image"] == "gpuenv/debian:bookworm"  # pure Python: the base itself
    assert "--offline --no-index" in run["command"][-1]
    assert set(run["files"]) == {"/gpuenv-build/src/jp-1.4.0.tar.gz", "/gpuenv-build/uv"}
    assert engine.built == []  # no compilers for pure Python
    # Again (another process: a record in the cache): the stored wheel, no second run.
    again = WheelBuilder(engine, builder.fetcher, builder.key, builder.resolve, builder.uv)  # type: ignore[arg-type]
    again.fetcher.offline = True
    assert again.wheel(req, entry, SANDBOX) == (wheel, path)
    assert len(engine.runs) == 1 and again.built == 0
    # Its metadata, for uv, comes from the built wheel (PKG-INFO 1.1 says nothing).
    got = again.metadata("jp", ["jp==1.4.0"], SANDBOX, None)
    assert got == Metadata("jp", "1.4.0", ("ply",), "")


def test_c_sources_are_built_with_compilers_in_an_image_removed_after(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    engine = _Engine("jp-1.4.0-cp311-cp311-linux_x86_64.whl")
    builder, entry = _builder(tmp_path, monkeypatch, engine, {"setup.py": "", "_jp.c": ""})
    builder.fetcher.offline = False
    builder.wheel(Requirement("jp", "1.4.0", frozenset({entry.sha256})), entry, SANDBOX)
    assert engine.built == ["host"]  # apt reaches Debian's archive for the compilers only
    assert engine.runs[0]["image"] == "sha256:compilers"  # the build itself: no network
    assert engine.removed == ["sha256:compilers"]


def test_a_build_that_gives_another_wheel_is_refused(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    engine = _Engine("jp-1.4.0-cp312-cp312-linux_x86_64.whl")
    builder, entry = _builder(tmp_path, monkeypatch, engine, {"setup.py": ""})
    builder.fetcher.offline = False
    with pytest.raises(GpuenvError, match=r"not one wheel of jp 1.4.0 for CPython 3.11"):
        builder.wheel(Requirement("jp", "1.4.0", frozenset({entry.sha256})), entry, SANDBOX)


def test_offline_an_sdist_never_built_is_one_error(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    engine = _Engine("jp-1.4.0-py3-none-any.whl")
    builder, entry = _builder(tmp_path, monkeypatch, engine, {"setup.py": ""})
    with pytest.raises(GpuenvError, match=r"--offline: jp-1.4.0.tar.gz has not been built"):
        builder.wheel(Requirement("jp", "1.4.0", frozenset({entry.sha256})), entry, SANDBOX)
    assert engine.runs == []


def test_a_build_that_fails_is_one_error_with_the_end_of_its_output(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    engine = _Engine("jp-1.4.0-py3-none-any.whl")
    engine.run_collecting = lambda *a, **kw: (1, "step\nerror: no module named foo\n", b"")  # type: ignore[method-assign]
    builder, entry = _builder(tmp_path, monkeypatch, engine, {"setup.py": ""})
    builder.fetcher.offline = False
    with pytest.raises(GpuenvError) as failed:
        builder.wheel(Requirement("jp", "1.4.0", frozenset({entry.sha256})), entry, SANDBOX)
    assert failed.value.message == (
        "jp-1.4.0.tar.gz did not build into a wheel (exit 1, in a network-less container of "
        "gpuenv/debian:bookworm): step | error: no module named foo"
    )
