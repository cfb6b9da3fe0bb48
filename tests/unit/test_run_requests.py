"""What a local `gpuenv run` asks the engine once the working directory's verdict is cached
(issue 48, item 3), counted on the wire: gpuenv's real Engine and the Docker SDK against the
tiny Engine API (engine_api.py), every request it serves listed. `docker run --rm` sends
/_ping (the API version), create, attach, wait, start (and its daemon removes the
container); gpuenv adds the image's labels and platform (one inspect) and the removal. The
working directory's verdict is kept per engine, one on this machine's socket known by that
socket (Engine.identity), and an image of this machine's architecture needs no `info`."""

from __future__ import annotations

import os
import socket
import time

from gpuenv.cli.argv import click_app  # the app as Click runs it, as main() does
from gpuenv.run import sync
from gpuenv.store import cache

IMAGE = "acme/tf:x"


def test_a_local_run_asks_the_engine_seven_things(engine_on_fake_api, tmp_path, monkeypatch):
    eng, routes = engine_on_fake_api
    inspected = {"Id": "sha256:" + "a" * 64, "Architecture": "amd64", "Config": {"Labels": {}}}
    routes[("GET", f"/v1.41/images/{IMAGE}/json")] = (200, inspected)
    routes[("GET", "/v1.41/info")] = (200, {"ID": "ENGINE-1", "Architecture": "x86_64"})
    routes[("POST", "/v1.41/containers/create")] = (201, {"Id": "c1"})
    routes[("POST", "/v1.41/containers/c1/attach")] = "attach"
    routes[("GET", "/v1.41/containers/c1/json")] = (200, {"Config": {"Tty": False}})  # unasked
    routes[("POST", "/v1.41/containers/c1/start")] = (204, b"")
    routes[("POST", "/v1.41/containers/c1/wait")] = (200, {"StatusCode": 3})
    routes[("DELETE", "/v1.41/containers/c1")] = (204, b"")
    routes[("GET", "/v1.41/_ping")] = (200, b"OK")  # unasked (the versioned one: a heartbeat)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    work = tmp_path / "work"
    work.mkdir()
    monkeypatch.chdir(work)
    # The verdict an earlier run in this directory left: this engine sees it.
    verdict = {"sees": True, "why": "read back", "at": int(time.time())}
    cache.update_record(sync.VERDICTS, {sync._verdict_key(eng, work): verdict})
    routes.seen.clear()

    machine = {"x86_64": "amd64", "aarch64": "arm64"}[os.uname().machine]
    inspected["Architecture"] = machine  # the image is of this machine's architecture
    argv = ["run", "-i", IMAGE, "--network", "none", "--", "python", "-c", "pass"]
    code = click_app()(argv, prog_name="gpuenv", standalone_mode=False)

    assert code == 3  # the container's (the output is engine_api's, read or not: not pinned)
    assert routes.seen == [
        "GET /_ping",
        f"GET /v1.41/images/{IMAGE}/json",
        "POST /v1.41/containers/create",
        "POST /v1.41/containers/c1/attach",
        "POST /v1.41/containers/c1/start",
        "POST /v1.41/containers/c1/wait",
        "DELETE /v1.41/containers/c1",
    ]


def test_the_command_line_is_built_once(monkeypatch, tmp_path, capsys):
    """normalise_argv reads run's options from the Click command Typer builds from the app;
    main() runs that same command rather than have Typer build it again (some 25 ms of every
    `gpuenv run`, issue 48)."""
    import sys

    import typer

    from gpuenv.cli import argv, main

    built = []
    build = typer.main.get_command
    monkeypatch.setattr(typer.main, "get_command", lambda app: built.append(app) or build(app))
    argv.click_app.cache_clear()
    monkeypatch.setattr(sys, "argv", ["gpuenv", "run", "-f", str(tmp_path / "none.yaml"), "x"])
    try:
        main()
    except SystemExit as exc:
        assert exc.code == 125
    assert "none.yaml: no such file" in capsys.readouterr().err
    assert len(built) == 1


def test_the_api_version_is_learnt_from_ping_as_the_docker_cli_does(fake_socket, monkeypatch):
    """/_ping's API-Version header, not /version (which dockerd answers by asking containerd,
    runc and docker-init: 5-25 ms here, issue 48); podman's /_ping names its own API too.
    An engine whose /_ping names no version is asked /version, the SDK's way."""
    from gpuenv.engine import client as engines

    path, routes = fake_socket
    version = (200, {"ApiVersion": "1.41", "Components": [{"Name": "Podman Engine"}]})
    routes[("GET", "/version")] = routes[("GET", "/v1.41/version")] = version
    monkeypatch.setenv("DOCKER_HOST", f"unix://{path}")
    for ping, podman, asked in (("ping", False, ["GET /_ping"]),
                                ("ping-podman", True, ["GET /_ping"]),
                                ((200, b"OK"), True, ["GET /_ping", "GET /version"])):  # fmt: skip
        routes[("GET", "/_ping")] = ping
        routes.seen.clear()
        with engines.connect() as engine:
            assert engine.is_podman is podman
        assert routes.seen == asked


def test_a_local_engine_is_known_by_its_socket_without_a_request(engine_on_fake_api, tmp_path):
    """Engine.identity, the working directory's verdict's key: the socket its daemon made;
    another daemon there (a new socket) is another engine. `docker info` asked for the ID
    alone cost 10-110 ms of dockerd's time here (issue 48)."""
    eng, routes = engine_on_fake_api
    routes[("GET", "/v1.41/info")] = (200, {"ID": "ENGINE-1"})
    path = eng._api._custom_adapter.socket_path
    routes.seen.clear()
    first = eng.identity()
    assert first.startswith("socket ") and eng.identity() == first and routes.seen == []
    os.rename(path, f"{path}.old")  # another daemon's socket in its place
    replacement = socket.socket(socket.AF_UNIX)
    replacement.bind(path)
    try:
        assert eng.identity() not in ("", first)
    finally:
        replacement.close()
        os.rename(f"{path}.old", path)


def test_only_an_image_of_another_architecture_asks_the_engine_its_machine(engine_on_fake_api):
    from gpuenv.run.local import foreign_platform

    eng, routes = engine_on_fake_api
    routes[("GET", "/v1.41/info")] = (200, {"ID": "E", "Architecture": os.uname().machine})
    here = {"x86_64": "amd64", "aarch64": "arm64"}[os.uname().machine]
    other = {"amd64": "arm64", "arm64": "amd64"}[here]
    routes.seen.clear()
    assert foreign_platform(eng, IMAGE, here) is None and routes.seen == []
    assert foreign_platform(eng, IMAGE, other) == f"linux/{other}"
    assert routes.seen == ["GET /v1.41/info"]
