"""Where builds' public wheels come from (gpuenv/building/near.py): the order of the rules, the
probe's trust, its kept verdict, and the overrides, against a stand-in engine that records
the probe containers it was asked to run."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest

from gpuenv.building import near
from gpuenv.matrix.errors import GpuenvError
from gpuenv.store.credentials import Credential, Credentials

PYPI = "https://pypi.org/simple/"


class ProbedEngine:
    """What near.decide asks of an engine; the probe container's answer is scripted."""

    def __init__(self, *, local: bool = True, podman: bool = False, answer: int = 0) -> None:
        self.is_local, self.is_podman, self.answer = local, podman, answer
        self.url = "unix:///var/run/docker.sock" if local else "tcp://10.0.0.2:2376"
        self.probes: list[dict[str, Any]] = []

    def info(self) -> dict[str, Any]:
        return {"ID": f"ENGINE-{self.is_local}"}

    def run_capture(
        self, image: str, command: list[str], platform: str | None = None, *,
        network: str = "none", files: dict[str, bytes] | None = None,
    ) -> tuple[int, str]:  # fmt: skip
        self.probes.append({"image": image, "command": command, "network": network,
                            "files": files or {}})  # fmt: skip
        return (
            self.answer,
            "HTTP 200" if self.answer == 0 else "URLError: [SSL: CERTIFICATE_VERIFY_FAILED]",
        )


@pytest.fixture(autouse=True)
def _own_cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    for name in (near.MODE_ENV, near.INDEX_ENV):
        monkeypatch.delenv(name, raising=False)


def decide(engine: ProbedEngine, ca: Path | None = None, **kw: Any) -> near.Near:
    options: dict[str, Any] = {"image": "gpuenv/debian:bookworm", "ca_bundle": ca,
                               "credentials": Credentials({}), "offline": False, **kw}  # fmt: skip
    return near.decide(engine, PYPI, **options)  # type: ignore[arg-type]


def test_a_local_engine_is_probed_with_the_ca_bundle_which_its_steps_then_get(tmp_path):
    ca = tmp_path / "site-ca.pem"
    ca.write_bytes(b"-----BEGIN CERTIFICATE-----\nSITE\n-----END CERTIFICATE-----\n")
    engine = ProbedEngine(local=True)
    decided = decide(engine, ca)
    assert (decided.index, decided.ca) == (PYPI, ca)
    (probe,) = engine.probes
    assert probe["network"] == "host" and probe["command"][-1] == PYPI
    assert probe["files"] == {near.PROBE_TRUST: ca.read_bytes()}


def test_a_remote_engine_never_gets_the_ca_and_is_probed_with_public_roots(tmp_path):
    import certifi

    ca = tmp_path / "site-ca.pem"
    ca.write_bytes(b"SITE CA")
    engine = ProbedEngine(local=False)
    decided = decide(engine, ca)
    assert (decided.index, decided.ca) == (PYPI, None)
    assert engine.probes[0]["files"][near.PROBE_TRUST] == Path(certifi.where()).read_bytes()
    assert b"SITE CA" not in engine.probes[0]["files"][near.PROBE_TRUST]


def test_a_failed_probe_sends_the_wheels_and_says_why():
    decided = decide(ProbedEngine(local=False, answer=1))
    assert decided.index is None and "CERTIFICATE_VERIFY_FAILED" in decided.why


def test_the_verdict_is_kept_per_engine_and_doctor_probes_anew():
    engine = ProbedEngine(local=False)
    decide(engine)
    decide(engine)
    assert len(engine.probes) == 1  # kept
    decide(engine, fresh=True)
    assert len(engine.probes) == 2
    other = ProbedEngine(local=True)  # another engine: its own verdict
    decide(other)
    assert len(other.probes) == 1


@pytest.mark.parametrize(
    ("setting", "offline", "podman", "why"),
    [
        ({}, True, False, "--offline"),
        ({near.MODE_ENV: "client"}, False, False, "GPUENV_NEAR_FETCH=client"),
        ({}, False, True, "podman"),
    ],
)
def test_what_keeps_todays_path_runs_no_probe(monkeypatch, setting, offline, podman, why):
    for key, value in setting.items():
        monkeypatch.setenv(key, value)
    engine = ProbedEngine(podman=podman)
    decided = decide(engine, offline=offline)
    assert decided.index is None and why in decided.why and engine.probes == []


def test_a_primary_index_with_credentials_is_never_fetched_by_the_engine():
    from gpuenv.store.credentials import origin_of

    origin = origin_of(PYPI)
    assert origin is not None
    credentials = Credentials({origin: Credential("u", "p", "netrc")})
    engine = ProbedEngine()
    decided = decide(engine, credentials=credentials)
    assert decided.index is None and "credentials" in decided.why and engine.probes == []


def test_engine_forces_the_near_path_and_a_mirror_stands_for_the_index(monkeypatch):
    monkeypatch.setenv(near.MODE_ENV, "engine")
    monkeypatch.setenv(near.INDEX_ENV, "http://127.0.0.1:3141/simple")
    engine = ProbedEngine(local=False)
    decided = decide(engine)
    assert decided.index == "http://127.0.0.1:3141/simple/" and engine.probes == []
    assert decided.fetches(PYPI, PYPI) and not decided.fetches("https://pkgs.example/", PYPI)


@pytest.mark.parametrize(
    ("name", "value", "says"),
    [
        (near.MODE_ENV, "sometimes", "expected auto"),
        (near.INDEX_ENV, "https://user:secret@mirror.example/simple/", "credentials"),
        (near.INDEX_ENV, "mirror.example/simple", "not an index URL"),
    ],
)
def test_bad_overrides_are_one_error_naming_the_variable(monkeypatch, name, value, says):
    monkeypatch.setenv(name, value)
    with pytest.raises(GpuenvError) as caught:
        decide(ProbedEngine())
    assert name in caught.value.message and says in caught.value.message
    assert "secret" not in caught.value.message


@pytest.mark.parametrize(
    ("head", "get", "code", "asked"),
    [
        (200, 200, 0, ["HEAD"]),  # the root's head: never its listing of every project
        (501, 200, 0, ["HEAD", "GET"]),  # a server that answers GET alone
        (401, 200, 1, ["HEAD"]),  # credentials needed: the step would fail too
        (404, 404, 1, ["HEAD"]),
    ],
)
def test_the_probe_asks_for_the_index_root_s_head(tmp_path, head, get, code, asked):
    """The probe's script, run by this Python against a local index: HEAD (PyPI's root is
    40 MB, which a proxy may fetch whole before answering), GET only where HEAD is not
    served; an HTTP error is unreachable."""
    import subprocess
    import sys
    import threading
    from http.server import BaseHTTPRequestHandler, HTTPServer

    seen: list[str] = []

    class Index(BaseHTTPRequestHandler):
        def log_message(self, *args: object) -> None:
            pass

        def answer(self, status: int) -> None:
            seen.append(self.command)
            self.send_response(status)
            self.send_header("Content-Length", "0")
            self.end_headers()

        def do_HEAD(self) -> None:
            self.answer(head)

        def do_GET(self) -> None:
            self.answer(get)

    server = HTTPServer(("127.0.0.1", 0), Index)
    # Polled every 10 ms: shutdown() waits out one poll, 0.5 s by default.
    threading.Thread(target=server.serve_forever, args=(0.01,), daemon=True).start()
    try:
        import certifi

        script = near.PROBE_SCRIPT.replace(repr(near.PROBE_TRUST), repr(certifi.where()))
        url = f"http://127.0.0.1:{server.server_port}/simple/"
        done = subprocess.run([sys.executable, "-c", script, url], capture_output=True,
                              text=True, timeout=60, check=False)  # fmt: skip
    finally:
        server.shutdown()
        server.server_close()
    assert (done.returncode, seen) == (code, asked), done.stdout + done.stderr


# --------------------------------------------------------------- uv, fetched near the engine


def _serve_index(root: Path, wheel: bytes, name: str):
    """A PEP 503 page for uv over `root` (a relative link, with its fragment, as the lab's
    mirror writes it), on this machine's loopback; (server, index URL)."""
    import functools
    import http.server
    import threading

    (root / "files").mkdir(parents=True)
    (root / "files" / name).write_bytes(wheel)
    (root / "simple" / "uv").mkdir(parents=True)
    other = "uv-0.13.9-py3-none-manylinux_2_17_aarch64.manylinux2014_aarch64.whl"
    (root / "simple" / "uv" / "index.html").write_text(
        f'<a href="../../files/{other}#sha256={"0" * 64}">{other}</a>\n'
        f'<a href="../../files/{name}#sha256=x&amp;y">{name}</a>\n'
    )
    handler = functools.partial(http.server.SimpleHTTPRequestHandler, directory=str(root))
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    threading.Thread(target=server.serve_forever, args=(0.01,), daemon=True).start()
    return server, f"http://127.0.0.1:{server.server_address[1]}/simple"


@pytest.mark.parametrize("tampered", [False, True])
def test_the_uv_script_takes_uvs_executable_from_the_wheel_of_that_hash(tmp_path, tampered):
    """What an install step runs where the engine's host fetches uv: the wheel the client
    picked, found on the index's page by name, refused unless its sha256 is the one the
    client read; its executable written where the step runs it."""
    import hashlib
    import io
    import os
    import subprocess
    import sys
    import zipfile

    name = "uv-0.13.9-py3-none-manylinux_2_17_x86_64.manylinux2014_x86_64.whl"
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w") as whl:
        whl.writestr("uv-0.13.9.data/scripts/uv", b"#!/bin/sh\necho uv 0.13.9\n")
    wheel = buffer.getvalue()
    sha = hashlib.sha256(wheel + (b"!" if tampered else b"")).hexdigest()
    server, index = _serve_index(tmp_path / "index", wheel, name)
    try:
        script = tmp_path / "uv.py"
        script.write_text(near.uv_script(index, name, sha, "0.13.9"))
        target = tmp_path / "bin" / "uv"
        target.parent.mkdir()
        env = {k: v for k, v in os.environ.items() if "proxy" not in k.lower()}
        ran = subprocess.run([sys.executable, "-B", str(script), str(target)], env=env,
                             capture_output=True, text=True, timeout=60, check=False)  # fmt: skip
    finally:
        server.shutdown()
    if tampered:
        assert ran.returncode != 0 and f"hash mismatch for {name}" in ran.stderr
        assert not target.exists()
    else:
        assert ran.returncode == 0, ran.stderr
        assert target.read_bytes() == b"#!/bin/sh\necho uv 0.13.9\n"
        assert target.stat().st_mode & 0o777 == 0o755
        assert re.fullmatch(
            rf"gpuenv: uv fetched near the engine: {re.escape(name)} \(0\.0 MB\) in [\d.]+s\n",
            ran.stdout,
        )
