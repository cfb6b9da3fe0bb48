"""Where gpuenv finds the engine, as the docker CLI does (gpuenv/engine/client.py): DOCKER_HOST,
else the current Docker context (DOCKER_CONTEXT, else config.json's currentContext, in
$DOCKER_CONFIG), else the local socket; and ssh:// through the user's own `ssh`.

The engine here is the tiny Engine API on a Unix socket (tests/unit/engine_api.py). The ssh
transport is driven through a stand-in `ssh` first on PATH that joins its stdin and stdout
to that socket, as `ssh HOST docker system dial-stdio` does to a remote engine: the real
sshd is tests/integration/test_engine_another_host.py's. The ssh error texts below are what
OpenSSH 9.2 and bash printed on that lab."""

from __future__ import annotations

import hashlib
import json
import sys
from pathlib import Path

import pytest

from gpuenv.engine import client as engines
from gpuenv.engine.client import EngineError
from gpuenv.engine.transport import _SshTarget
from gpuenv.validate.doctor import Facts, evaluate

VERSION = (200, {"ApiVersion": "1.41", "Components": []})
INFO = (200, {"ServerVersion": "27.0", "OperatingSystem": "the fake"})


@pytest.fixture
def api(fake_socket, monkeypatch):
    """(socket path, routes) with no DOCKER_HOST, no context and a fresh connection."""
    path, routes = fake_socket
    routes[("GET", "/version")] = routes[("GET", "/v1.41/version")] = VERSION
    routes[("GET", "/v1.41/info")] = INFO
    for name in ("DOCKER_HOST", "DOCKER_CONTEXT", "DOCKER_TLS_VERIFY", "DOCKER_CERT_PATH"):
        monkeypatch.delenv(name, raising=False)
    return path, routes


def _context(config: Path, name: str, host: str) -> None:
    """A context as `docker context create NAME --docker host=HOST` writes it."""
    meta = config / "contexts" / "meta" / hashlib.sha256(name.encode()).hexdigest()
    meta.mkdir(parents=True)
    (meta / "meta.json").write_text(json.dumps(
        {"Name": name, "Metadata": {}, "Endpoints": {"docker": {"Host": host,
                                                                  "SkipTLSVerify": False}}}
    ))  # fmt: skip


def test_docker_context_names_the_context_in_a_config_without_config_json(
    api, tmp_path, monkeypatch
):
    path, _ = api
    config = tmp_path / "docker-config"
    _context(config, "box", f"unix://{path}")
    monkeypatch.setenv("DOCKER_CONFIG", str(config))  # no config.json there: as the CLI
    monkeypatch.setenv("DOCKER_CONTEXT", "box")
    engine = engines.connect()
    assert engine.info()["OperatingSystem"] == "the fake"


def test_the_current_context_of_config_json_and_docker_host_winning_over_it(
    api, tmp_path, monkeypatch
):
    path, _ = api
    config = tmp_path / "docker-config"
    _context(config, "box", f"unix://{path}")
    (config / "config.json").write_text(json.dumps({"currentContext": "box"}))
    monkeypatch.setenv("DOCKER_CONFIG", str(config))
    assert engines.connect().info()["OperatingSystem"] == "the fake"
    monkeypatch.setenv("DOCKER_HOST", f"unix://{tmp_path}/none.sock")
    with pytest.raises(EngineError, match=r"none\.sock"):
        engines.connect()


def test_a_context_that_does_not_exist_is_one_error_naming_it(api, tmp_path, monkeypatch):
    monkeypatch.setenv("DOCKER_CONFIG", str(tmp_path))
    monkeypatch.setenv("DOCKER_CONTEXT", "gpu-box")
    with pytest.raises(EngineError) as exc:
        engines.connect()
    assert "'gpu-box' (DOCKER_CONTEXT) not found" in exc.value.message
    assert "docker context ls" in exc.value.message


def test_ssh_runs_the_users_ssh_with_dial_stdio(api, tmp_path, monkeypatch):
    path, _ = api
    bin_dir, calls = tmp_path / "bin", tmp_path / "calls"
    bin_dir.mkdir()
    stand_in = bin_dir / "ssh"
    stand_in.write_text(
        f"#!{sys.executable}\n"
        "import os, socket, sys, threading\n"
        f"open({str(calls)!r}, 'a').write(' '.join(sys.argv[1:]) + '\\n')\n"
        "s = socket.socket(socket.AF_UNIX)\n"
        f"s.connect({path!r})\n"
        "def up():\n"
        "    while data := os.read(0, 65536):\n"
        "        s.sendall(data)\n"
        "    s.shutdown(socket.SHUT_WR)\n"
        "threading.Thread(target=up, daemon=True).start()\n"
        "while data := s.recv(65536):\n"
        "    os.write(1, data)\n"
    )
    stand_in.chmod(0o755)
    monkeypatch.setenv("PATH", f"{bin_dir}:/usr/bin:/bin")
    monkeypatch.setenv("DOCKER_HOST", "ssh://alice@gpu-box:2222")
    engine = engines.connect()
    assert engine.info()["ServerVersion"] == "27.0"
    assert engine.url == "ssh://alice@gpu-box:2222" and not engine.is_local
    first = calls.read_text().splitlines()[0]
    assert first == "-o ConnectTimeout=30 -T -l alice -p 2222 -- gpu-box docker system dial-stdio"


@pytest.mark.parametrize(
    "address",
    ["ssh://", "ssh://alice@gpu-box/var/run/docker.sock", "ssh://a:secret@gpu-box", "ssh://h:x"],
)
def test_an_ssh_address_the_docker_cli_would_refuse_is_one_error(address):
    with pytest.raises(EngineError, match=r"ssh://\[USER@\]HOST\[:PORT\]"):
        _SshTarget.parse(address)


TARGET = _SshTarget("ssh://root@gpu-box", "gpu-box", "root", None)


@pytest.mark.parametrize(
    "code,stderr,says",
    [
        (255, "No ED25519 host key is known for gpu-box and you have requested strict "
              "checking.\r\nHost key verification failed.\r\n",
         "the host key of gpu-box is not known or has changed"),
        (255, "root@10.231.27.2: Permission denied (publickey).\r\n",
         "gpu-box refused the login as root"),
        (127, "bash: line 1: docker: command not found\n",
         "has no `docker` command on the PATH of a non-interactive session"),
        (255, "ssh: connect to host gpu-box port 22: Connection refused\r\n",
         "ssh to root@gpu-box failed (ssh: connect to host gpu-box port 22: Connection refused)"),
        (1, "Cannot connect to the Docker daemon at unix:///var/run/docker.sock. Is the docker "
            "daemon running?\n",
         "`docker system dial-stdio` on gpu-box could not reach its engine"),
    ],
    ids=["host-key", "refused", "no-docker", "unreachable", "no-engine"],
)  # fmt: skip
def test_each_ssh_failure_is_one_line_with_its_fix(code, stderr, says):
    message = TARGET.failure(code, stderr).message
    assert message.startswith("cannot reach the Docker Engine at ssh://root@gpu-box: ")
    assert says in message and "\n" not in message and "\r" not in message


def test_doctor_offers_to_start_dockerd_only_for_a_local_engine():
    local = evaluate(Facts(engine_error="cannot reach", local=True))[0]
    remote = evaluate(Facts(engine_error="cannot reach", local=False, address="ssh://h"))[0]
    assert local.fix is not None and "dockerd" in local.fix
    assert remote.fix is None
