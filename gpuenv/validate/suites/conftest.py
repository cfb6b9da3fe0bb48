"""Fixtures for the validation suites: one parameter per image, a testinfra host for its
container (the docker:// backend, as the image's default user), and what it must hold.

``box`` runs commands as the image's default user, as users get it. ``root_box`` runs them
as root, for the checks that must see every file (leftovers under /root, driver files
anywhere): a check that cannot read a directory must not pass for want of seeing it."""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from typing import Any

import pytest
import testinfra


def _targets() -> list[dict[str, Any]]:
    path = os.environ.get("GPUENV_VALIDATE_TARGETS")
    if not path:
        return []
    with open(path, encoding="utf-8") as fh:
        return list(json.load(fh))


def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    if "target" not in metafunc.fixturenames:
        return
    targets = _targets()
    if getattr(metafunc.module, "GPU_ONLY", False):
        targets = [t for t in targets if t["expected"]["variant"] == "gpu"]
    metafunc.parametrize("target", targets, ids=[t["id"] for t in targets])


@dataclass
class Box:
    """The running container of one image."""

    host: Any
    target: dict[str, Any]

    @property
    def expected(self) -> dict[str, Any]:
        return dict(self.target["expected"])

    def sh(self, command: str) -> Any:
        return self.host.run(command)

    @property
    def config(self) -> dict[str, Any]:
        """The image's config (User, Env, Labels). An environment reached with --host has
        none to read (a VM, a pod's node): checks of it are skipped, saying so."""
        if not self.target.get("image_known", True):
            pytest.skip(f"no image config to read behind --host {self.target['host']}")
        return dict(self.target["config"])

    def python(self, code: str) -> str:
        """Run Python in the image (its `python` on the PATH); fail with its stderr."""
        result = self.host.run("python -c %s", code)
        # The exception (stderr's last line) first: the summary shows the first line only.
        err = result.stderr.strip()
        last = err.splitlines()[-1] if err else "no output"
        assert result.rc == 0, f"python exited {result.rc}: {last}\n{err[-800:]}"
        return str(result.stdout)

    def python_json(self, code: str) -> Any:
        return json.loads(self.python(code).strip().splitlines()[-1])


def _url(target: dict[str, Any], root: bool = False) -> str:
    """The testinfra backend: the container gpuenv started, or the --host URL given."""
    host = target.get("host")
    if host is None:
        return f"docker://{'root@' if root else ''}{target['container']}"
    if root and host.startswith("docker://"):
        return "docker://root@" + host.removeprefix("docker://").split("@")[-1]
    return str(host)  # elsewhere, as whoever --host logs in as


def _contents_known(target: dict[str, Any]) -> None:
    """`validate --host URL --gpus` without --cell: nothing says what the environment must
    hold, so the checks of its contents skip, saying why; the device checks still run."""
    unknown = target["expected"].get("contents_unknown")
    if unknown:
        pytest.skip(str(unknown))


@pytest.fixture
def box(target: dict[str, Any]) -> Box:
    _contents_known(target)
    return Box(testinfra.get_host(_url(target)), target)


@pytest.fixture
def root_box(target: dict[str, Any]) -> Box:
    """The same environment, commands run as root (docker exec -u root)."""
    _contents_known(target)
    return Box(testinfra.get_host(_url(target, root=True)), target)


@pytest.fixture
def gpu_box(target: dict[str, Any]) -> Box:
    if target.get("emulated"):
        pytest.skip(
            f"a {target['emulated']} image runs under QEMU emulation on this engine, where "
            "no GPU is reachable: device checks need a Grace machine (an arm64 host with "
            "NVIDIA GPUs, GH200/GB200)"
        )
    if target["gpus"] is None:
        pytest.skip("no --gpus given: device checks need `gpuenv validate --gpus all`")
    if target.get("host") is not None:  # the environment as it is: its devices are its own
        return Box(testinfra.get_host(_url(target)), target)
    if target["gpu_error"] or not target["gpu_container"]:
        # The user asked for GPUs: a container that could not get them is a failure (with
        # the engine's reason and the fix), never a skip that would read as "nothing wrong".
        pytest.fail(
            "--gpus was given but the engine could not start a container with the requested "
            f"GPUs: {target['gpu_error'] or 'no GPU container was started'} "
            "(`gpuenv doctor` checks this host's GPU setup)",
            pytrace=False,
        )
    return Box(testinfra.get_host(f"docker://{target['gpu_container']}"), target)
