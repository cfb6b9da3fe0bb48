"""`gpuenv notebook` and `gpuenv devcontainer`, their pure parts: where the server listens,
the tunnel a remote engine needs, the server's log without its token, what the notebook
layer installs, and devcontainer.json against the dev container schema (vendored:
fixtures/devcontainer/SOURCE.md). The server, the layer and the browser:
tests/integration/test_engine_notebook.py."""

from __future__ import annotations

import contextlib
import io
import json
import os
import socket
import subprocess
import sys
import threading
import types
from collections.abc import Iterator
from pathlib import Path

import jsonschema
import pytest

from gpuenv.cli.argv import click_app  # the app as Click runs it, as main() does
from gpuenv.matrix.errors import GpuenvError
from gpuenv.run import devcontainer, jupyter, notebook

SCHEMA = Path(__file__).parent / "fixtures" / "devcontainer" / "devContainer.base.schema.json"


def schema_errors(doc: object) -> list[str]:
    validator = jsonschema.Draft201909Validator(json.loads(SCHEMA.read_text()))
    return [e.message for e in validator.iter_errors(doc)]


# ---------------------------------------------------------------- where it listens


def test_without_a_bridge_the_server_is_on_the_host_network_bound_to_loopback():
    where = notebook.placement({"host", "none"}, host_network=False, port=41000)
    assert (where.network, where.ports, where.listen, where.server_port, where.port) == (
        "host", [], "127.0.0.1", 41000, 41000,
    )  # fmt: skip


def test_with_a_bridge_the_port_is_published_on_loopback_only():
    where = notebook.placement({"bridge", "host", "none"}, host_network=False, port=41000)
    assert where.network is None  # the engine's default: its bridge
    assert where.ports == ["127.0.0.1:41000:8888"]
    assert (where.listen, where.server_port, where.port) == ("0.0.0.0", 8888, 41000)


def test_host_network_when_asked_even_with_a_bridge():
    where = notebook.placement({"bridge", "host"}, host_network=True, port=41000)
    assert (where.network, where.listen, where.ports) == ("host", "127.0.0.1", [])


def test_the_command_has_no_token_and_allows_root_only_for_root():
    where = notebook.placement(set(), False, 41000)
    user = notebook.server_command(where, Path("/w"), 1000)
    assert "--ServerApp.ip=127.0.0.1" in user and "--ServerApp.port=41000" in user
    assert "--ServerApp.root_dir=/w" in user
    assert not any("token" in arg.lower() for arg in user)
    assert "--ServerApp.allow_root=True" not in user
    assert "--ServerApp.allow_root=True" in notebook.server_command(where, Path("/w"), 0)


@pytest.mark.parametrize(
    ("url", "hint"),
    [
        ("ssh://ann@gpu-box", "ssh -N -L 50123:127.0.0.1:50123 ann@gpu-box"),
        ("ssh://ann@gpu-box:2222", "ssh -N -L 50123:127.0.0.1:50123 -p 2222 ann@gpu-box"),
        ("https://10.0.0.5:2376", "ssh -N -L 50123:127.0.0.1:50123 USER@10.0.0.5"),
    ],
)
def test_the_tunnel_to_another_hosts_loopback(url, hint):
    assert notebook.tunnel_hint(url, 50123) == hint


def test_the_servers_log_is_passed_on_without_the_token():
    out = io.BytesIO()
    log = notebook.ServerLog("s3cret", out)
    log.write(b"[I ServerApp] Jupyter Server 2.21 is running at:\n[I] http://127.0.0.1:1/lab?tok")
    assert log.running.is_set()
    log.write(b"en=s3cret\n[I] Use Control-C to stop\n")
    assert b"s3cret" not in out.getvalue()
    assert out.getvalue().splitlines() == [
        b"[I ServerApp] Jupyter Server 2.21 is running at:",
        b"[I] Use Control-C to stop",
    ]


# ---------------------------------------------------------------- who gets the token (N8)


# Another uid's listener on the port (issue 44, N8): records what it is sent, answers 200.
LISTENER = (Path(__file__).parent / "fixtures" / "notebook" / "listener.py").read_text()
SYSTEM_PYTHON = "/usr/bin/python3"  # one another uid may run (this one may be under /root)
needs_root = pytest.mark.skipif(
    os.geteuid() != 0 or not os.access(SYSTEM_PYTHON, os.X_OK),
    reason=f"a listener of another uid needs root and {SYSTEM_PYTHON}",
)


@contextlib.contextmanager
def listening(port: int, user: int | None = None) -> Iterator[list[str]]:
    """A listener on 127.0.0.1:`port` (as `user`); the list gets what it was sent."""
    heard: list[str] = []
    python = sys.executable if user is None else SYSTEM_PYTHON
    process = subprocess.Popen(
        [python, "-c", LISTENER, str(port)], user=user, stdout=subprocess.PIPE, text=True,
        encoding="latin-1",
    )  # fmt: skip
    try:
        assert process.stdout is not None and process.stdout.readline() == "listening\n"
        yield heard
    finally:
        process.terminate()
        heard.append(process.communicate(timeout=10)[0])


class _NeverRunning(threading.Event):
    """A server log that never says it listens, without the real waiting: each of
    _announce's waits for it times out at once, and the third stops the announcing as the
    server's end would (a 3 s window before, for the same six timed-out waits' worth)."""

    def __init__(self, done: threading.Event) -> None:
        super().__init__()
        self.done, self.waits = done, 0

    def wait(self, timeout: float | None = None) -> bool:
        self.waits += 1
        if self.waits == 3:
            self.done.set()
        return False


def announce(port: int, running: bool, seconds: float = 3.0) -> None:
    """notebook._announce on this machine's engine, for `seconds` (the server's log says it
    listens when `running`; when not, until it has waited for that three times)."""
    engine = types.SimpleNamespace(is_local=True, url="unix:///var/run/docker.sock")
    log = notebook.ServerLog("s3cret-token", io.BytesIO())
    done = threading.Event()
    if running:
        log.write(b"[I ServerApp] Jupyter Server 2.21 is running at:\n")
    else:
        log.running = never = _NeverRunning(done)
    where = notebook.placement(set(), host_network=True, port=port)
    args = (engine, f"http://127.0.0.1:{port}", "s3cret-token", where, log, done, "c")
    thread = threading.Thread(target=notebook._announce, args=args, daemon=True)
    thread.start()
    thread.join(seconds)
    done.set()
    thread.join(5)
    assert not thread.is_alive()
    assert running or never.waits == 3  # it waited, and went no further


def test_nothing_is_sent_before_the_servers_own_log_says_it_listens(capsys):
    port = notebook.free_port()
    with listening(port) as heard:  # even a listener of this user
        announce(port, running=False)
    assert heard == [""]
    assert "JupyterLab in" not in capsys.readouterr().out


@needs_root
def test_a_listener_of_another_user_gets_no_token_and_no_url_is_printed(capsys):
    # The review's reproduction: another uid listens on the port the server says it has.
    port = notebook.free_port()
    with listening(port, user=65534) as heard:
        announce(port, running=True)
    assert heard == [""]
    out, err = capsys.readouterr()
    assert "JupyterLab in" not in out and "s3cret" not in out + err
    assert f"127.0.0.1:{port} is also listened on by uid 65534" in err


def test_the_url_is_printed_once_the_servers_own_listener_answers(capsys):
    port = notebook.free_port()
    with listening(port) as heard:  # this user's: the server runs as the caller
        announce(port, running=True)
    assert "Authorization: token s3cret-token" in heard[0]
    assert (
        capsys.readouterr().out
        == f"JupyterLab in c: http://127.0.0.1:{port}/lab?token=s3cret-token\n"
    )


def _row(address: str, port: int, state: str, uid: int) -> str:
    family = socket.AF_INET6 if ":" in address else socket.AF_INET
    raw = socket.inet_pton(family, address)
    words = "".join(
        f"{int.from_bytes(raw[i : i + 4], sys.byteorder):08X}" for i in range(0, len(raw), 4)
    )
    return f"   0: {words}:{port:04X} {'0' * len(words)}:0000 {state} 0:0 0:0 0 {uid} 0 1"


def test_the_listeners_that_take_loopback_connections_are_read_from_proc_net():
    head = "  sl  local_address rem_address st tx_queue rx_queue tr tm->when retrnsmt uid\n"
    tcp = [("127.0.0.1", 8888, "0A", 1001), ("0.0.0.0", 8888, "0A", 1002),
           ("10.0.0.5", 8888, "0A", 1003), ("127.0.0.1", 8889, "0A", 1004),
           ("127.0.0.1", 8888, "01", 1005)]  # fmt: skip
    tcp6 = [("::", 8888, "0A", 1006), ("::ffff:127.0.0.1", 8888, "0A", 1007),
            ("::1", 8888, "0A", 1008)]  # fmt: skip
    tables = {
        "tcp": head + "\n".join(_row(*r) for r in tcp),
        "tcp6": head + "\n".join(_row(*r) for r in tcp6),
    }
    assert notebook.listeners(8888, tables) == [1001, 1002, 1006, 1007]


# ---------------------------------------------------------------- the layer


A, B, C, D = ("a" * 64, "b" * 64, "c" * 64, "d" * 64)
RESOLVED = f"""\
jupyterlab==4.6.6 \\
    --hash=sha256:{B} \\
    --hash=sha256:{A}
packaging==25.0 \\
    --hash=sha256:{C}
typing-extensions==4.15.0 \\
    --hash=sha256:{D}
"""


def test_the_layer_installs_only_what_the_cell_lacks():
    installed = {"packaging": "25.0", "tensorflow": "2.21.0"}
    text = jupyter.missing_from(RESOLVED, installed)
    assert text == (
        f"jupyterlab==4.6.6 \\\n    --hash=sha256:{A} \\\n    --hash=sha256:{B}\n"
        f"typing-extensions==4.15.0 \\\n    --hash=sha256:{D}\n"
    )


def test_the_layer_never_replaces_a_package_of_the_cell():
    installed = {"packaging": "25.0", "Typing_Extensions": "4.14.0"}
    with pytest.raises(GpuenvError, match=r"typing-extensions==4\.15\.0, but the cell has"):
        jupyter.missing_from(RESOLVED, installed)


def test_the_layers_dockerfile_installs_offline_from_its_mount_and_restores_the_user():
    from gpuenv.engine.client import ImageInfo

    image = "gpuenv/tensorflow:tf2.21-py3.11-cpu"
    text = jupyter.dockerfile_for("c", image, ImageInfo("sha256:ab", user="1000:1000"))
    assert text.splitlines()[2] == f"FROM {image}"
    assert "--offline --no-index" in text and "--require-hashes --no-deps" in text
    assert "RUN --mount=type=bind,source=jupyter,target=/mnt" in text
    assert text.rstrip().endswith("USER 1000:1000")
    assert "sha256:ab" in text  # a new cell image is a new layer


# ---------------------------------------------------------------- devcontainer.json


@pytest.mark.parametrize("is_gpu", [False, True])
def test_devcontainer_json_is_valid_against_the_dev_container_schema(is_gpu):
    doc = devcontainer.document("c", "gpuenv/tensorflow:c", is_gpu)
    assert schema_errors(doc) == []
    assert doc["remoteUser"] == doc["containerUser"] == "gpuenv"
    assert doc["workspaceFolder"] == "/workspace"
    assert ("hostRequirements" in doc) is is_gpu


def test_the_schema_check_can_fail():
    doc = devcontainer.document("c", "gpuenv/tensorflow:c", True)
    doc["hostRequirements"] = {"gpu": "sometimes"}
    assert schema_errors(doc)
    assert schema_errors({"imag": "gpuenv/tensorflow:c"})


def test_devcontainer_never_overwrites(tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(tmp_path)
    path = tmp_path / ".devcontainer" / "devcontainer.json"
    path.parent.mkdir()
    path.write_text("{}\n")
    with pytest.raises(SystemExit) as exited:
        click_app()(["devcontainer", "-f", str(tmp_path / "matrix.yaml")], standalone_mode=True)
    assert exited.value.code == 1
    assert path.read_text() == "{}\n"
    err = capsys.readouterr().err
    assert (
        err == f"error: {path} exists; gpuenv devcontainer never overwrites it (remove it "
        "first to write a new one)\n"
    )


def test_an_image_is_not_a_cell(tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(tmp_path)
    with pytest.raises(SystemExit) as exited:
        click_app()(["notebook", "gpuenv/tensorflow:x"], standalone_mode=True)
    assert exited.value.code == 125
    err = capsys.readouterr().err
    assert err.startswith("error: gpuenv/tensorflow:x: gpuenv notebook takes a cell name"), err


@pytest.mark.parametrize(("verb", "code"), [("notebook", 125), ("devcontainer", 1)])
def test_a_pattern_that_is_not_one_cell_is_one_line_before_the_engine(
    verb, code, tmp_path, capsys, monkeypatch
):
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("DOCKER_HOST", "unix:///nonexistent.sock")  # never reached
    matrix = str(Path(__file__).parents[2] / "matrix.yaml")
    with pytest.raises(SystemExit) as exited:
        click_app()([verb, "-f", matrix, "tf*"], standalone_mode=True)
    assert exited.value.code == code
    err = capsys.readouterr().err
    assert err.startswith("error: CELL 'tf*' matches ") and err.endswith("; pick one\n"), err
    assert not (tmp_path / ".devcontainer").exists()
