"""`gpuenv notebook` in a real browser, and `gpuenv devcontainer`, on the shipped CPU cell.

Headless Chromium (Debian's `chromium`, driven by Playwright with executable_path; flags for
a closed network and a fresh profile) opens the URL gpuenv prints, creates a notebook from
the launcher, runs a cell that imports TensorFlow and writes a file, and reads the kernel's
output in the page; a screenshot stays in the test's tmp dir. The file is then on disk in
the working directory, and SIGINT ends the server with no container left.

The notebook layer: on the cell's image, whose layers it starts with, plus one of its own;
a second start builds nothing; the cell's image (its whole `docker image inspect`), the
plan's verdict on it (up to date) and its validation record are the same as before.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import socket
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from support.cells import CPU_CELL, CPU_IMAGE, SHIPPED_MATRIX
from support.cli import GPUENV, clean_env, output, run
from support.engine import docker

pytestmark = pytest.mark.engine

CHROMIUM = "/usr/bin/chromium"
# This machine's network is closed: Chromium must not try to reach anything of its own.
CHROMIUM_ARGS = ["--no-sandbox", "--disable-gpu", "--no-first-run",
                 "--disable-background-networking", "--disable-component-update",
                 "--disable-sync"]  # fmt: skip
SCHEMA = (Path(__file__).parents[1] / "unit" / "fixtures" / "devcontainer"
          / "devContainer.base.schema.json")  # fmt: skip
URL_LINE = re.compile(r"^JupyterLab in (\S+): (http://127\.0\.0\.1:\d+/lab\?token=\w+)$")
CELL_CODE = (
    "import os, tensorflow as tf\n"
    "total = int(tf.reduce_sum(tf.constant([1, 2, 3, 4])).numpy())\n"
    "open('from_the_kernel.txt', 'w').write(f'{tf.__version__} {total} {os.getcwd()}')\n"
    "print('kernel says', tf.__version__, total)"
)


def _as_from_a_terminal() -> None:
    signal.signal(signal.SIGINT, signal.SIG_DFL)  # a background suite inherits it ignored


class Server:
    """`gpuenv notebook CELL` started in `cwd`, until stop()."""

    def __init__(self, cwd: Path) -> None:
        self.proc = subprocess.Popen(
            [*GPUENV, "notebook", "-f", str(SHIPPED_MATRIX), CPU_CELL], cwd=cwd,
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
            preexec_fn=_as_from_a_terminal,
        )  # fmt: skip
        self.url = self._url()

    def _url(self) -> str:
        assert self.proc.stdout is not None
        deadline = time.monotonic() + 900  # the first start builds the layer
        for line in self.proc.stdout:
            found = URL_LINE.match(line.strip())
            if found:
                assert found.group(1) == CPU_CELL
                return found.group(2)
            assert time.monotonic() < deadline
        self.proc.wait(30)
        raise AssertionError(f"no URL: exit {self.proc.returncode}\n{self.proc.stderr.read()}")  # type: ignore[union-attr]

    def stop(self) -> tuple[int, str]:
        self.proc.send_signal(signal.SIGINT)
        try:
            _, err = self.proc.communicate(timeout=60)
        finally:
            if self.proc.poll() is None:
                self.proc.kill()
        return self.proc.returncode, err


def containers_of(image: str) -> list[str]:
    return docker("ps", "-aq", "--filter", f"ancestor={image}").stdout.split()


def inspect(ref: str) -> dict[str, Any]:
    data = json.loads(docker("image", "inspect", ref).stdout)[0]
    data.get("Metadata", {}).pop("LastTagTime", None)  # a tag elsewhere is not a change
    return dict(data)


def validation_record(image_id: str) -> Any:
    cache = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "gpuenv"
    path = cache / "validated.json"
    return json.loads(path.read_text()).get(image_id) if path.is_file() else None


def plan_action(cell: str) -> str:
    proc = run([*GPUENV, "build", "-f", str(SHIPPED_MATRIX), cell, "--dry-run", "--json"])
    return str({c["cell"]: c for c in json.loads(proc.stdout)["cells"]}[cell]["action"])


@pytest.fixture(scope="module")
def cell_before(shipped_cpu: dict[str, Any]) -> Iterator[dict[str, Any]]:
    image = inspect(CPU_IMAGE)
    lock = SHIPPED_MATRIX.with_name("matrix.lock")
    before = {"image": image, "validated": validation_record(image["Id"]),
              "lock": lock.read_bytes() if lock.exists() else None}  # fmt: skip
    yield before
    # The notebook layers this module built go with it (the cell stays: a session's cache).
    for ref in docker("images", "--format", "{{.Repository}}:{{.Tag}}").stdout.split():
        if ref.startswith(f"{CPU_IMAGE}-notebook-"):
            docker("rmi", ref, check=False)


@pytest.fixture(scope="module")
def browser() -> Iterator[Any]:
    from playwright.sync_api import sync_playwright

    with sync_playwright() as p:
        yield p


def run_a_cell(page: Any, url: str) -> str:
    """A new notebook from the launcher, CELL_CODE typed into its first cell and run; the
    output the page shows."""
    page.goto(url)
    page.locator('.jp-LauncherCard[data-category="Notebook"]').first.click(timeout=120_000)
    # The kernel is up (the status bar says so) before anything is typed.
    page.locator(".jp-StatusBar-TextItem", has_text="| Idle").first.wait_for(timeout=120_000)
    editor = page.locator(".jp-Notebook .jp-Cell .cm-content").first
    editor.click(timeout=60_000)
    page.keyboard.insert_text(CELL_CODE)
    page.locator(".jp-Notebook .jp-Cell .cm-content", has_text="kernel says").first.wait_for()
    page.keyboard.press("Shift+Enter")
    out = page.locator(".jp-OutputArea-output", has_text="kernel says").first
    out.wait_for(timeout=180_000)
    return str(out.inner_text())


@pytest.mark.skipif(
    not Path(CHROMIUM).exists(), reason=f"no {CHROMIUM} (scripts/engine.sh --labs installs it)"
)
def test_a_notebook_runs_the_cells_framework_in_a_browser(cell_before, browser, tmp_path):
    work = tmp_path / "proj"
    work.mkdir()
    profile = tmp_path / "chromium-profile"  # fresh: no state of an earlier run
    server = Server(work)
    try:
        context = browser.chromium.launch_persistent_context(
            str(profile), executable_path=CHROMIUM, headless=True, args=CHROMIUM_ARGS,
            viewport={"width": 1280, "height": 800},
        )  # fmt: skip
        try:
            page = context.new_page()
            try:
                said = run_a_cell(page, server.url)
            finally:
                page.screenshot(path=str(tmp_path / "notebook.png"), full_page=True)
        finally:
            context.close()
    finally:
        code, err = server.stop()
        (tmp_path / "server.log").write_text(err)  # beside the screenshot
    assert code == 130, err
    # gpuenv's own code never failed (a kernel's traceback at shutdown is Jupyter's).
    assert not re.search(r'File ".*/gpuenv/(run|cli|engine|building|store)/', err), err
    assert re.fullmatch(r"kernel says 2\.21\.\d+ 10\s*", said), said
    version = said.split()[2]
    assert (work / "from_the_kernel.txt").read_text() == f"{version} 10 {work}"
    assert (tmp_path / "notebook.png").stat().st_size > 10_000
    layers = [r for r in docker("images", "--format", "{{.Repository}}:{{.Tag}}").stdout.split()
              if r.startswith(f"{CPU_IMAGE}-notebook-")]  # fmt: skip
    assert len(layers) == 1, layers
    assert containers_of(layers[0]) == []  # stopping left no container


def test_the_notebook_layer_sits_on_the_cell_and_changes_nothing_of_it(cell_before, tmp_path):
    server = Server(tmp_path)
    code, err = server.stop()
    assert code == 130, err
    assert "building the notebook layer" not in err, err  # the first test's layer, reused
    found = re.search(r"notebook layer (\S+) \(up to date\)", err)
    assert found, err
    layer = inspect(found.group(1))
    cell = cell_before["image"]
    # Adding Jupyter rebuilt nothing of the cell: its layers, then one of the notebook's own.
    assert layer["RootFS"]["Layers"][: len(cell["RootFS"]["Layers"])] == cell["RootFS"]["Layers"]
    assert len(layer["RootFS"]["Layers"]) == len(cell["RootFS"]["Layers"]) + 1
    assert layer["Config"]["Labels"]["io.gpuenv.notebook-base"] == cell["Id"]
    assert layer["Config"]["User"] == cell["Config"]["User"]
    # The cell's image, lock and validation are as they were.
    assert inspect(CPU_IMAGE) == cell
    assert validation_record(cell["Id"]) == cell_before["validated"]
    lock = SHIPPED_MATRIX.with_name("matrix.lock")
    assert (lock.read_bytes() if lock.exists() else None) == cell_before["lock"]
    assert plan_action(CPU_CELL) == "up-to-date"
    assert containers_of(found.group(1)) == []


# Another uid's listener on the port (issue 44, N8): records what it is sent, answers 200.
LISTENER = (
    Path(__file__).parents[1] / "unit" / "fixtures" / "notebook" / "listener.py"
).read_text()
SYSTEM_PYTHON = "/usr/bin/python3"  # one another uid may run


@pytest.mark.skipif(
    os.geteuid() != 0 or not os.access(SYSTEM_PYTHON, os.X_OK),
    reason=f"a listener of another uid needs root and {SYSTEM_PYTHON}",
)
def test_a_listener_of_another_user_on_its_port_gets_no_token(cell_before, tmp_path):
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    listener = subprocess.Popen([SYSTEM_PYTHON, "-c", LISTENER, str(port)], user=65534,
                                stdout=subprocess.PIPE, text=True, encoding="latin-1")  # fmt: skip
    try:
        assert listener.stdout is not None and listener.stdout.readline() == "listening\n"
        proc = run([*GPUENV, "notebook", "-f", str(SHIPPED_MATRIX), CPU_CELL, "--port", str(port)],
                   cwd=tmp_path, check=False, timeout=600)  # fmt: skip
    finally:
        listener.terminate()
        heard = listener.communicate(timeout=10)[0]
    assert heard == "", heard  # not one request: no token, no connection at all
    assert "JupyterLab in" not in proc.stdout, output(proc)
    assert proc.returncode != 0, output(proc)  # the server cannot take a port that is held
    layers = [r for r in docker("images", "--format", "{{.Repository}}:{{.Tag}}").stdout.split()
              if r.startswith(f"{CPU_IMAGE}-notebook-")]  # fmt: skip
    assert layers and all(containers_of(layer) == [] for layer in layers), layers


def test_devcontainer_json_names_the_cells_image_and_user(cell_before, in_image, tmp_path):
    # Imported here, not at the top: its import compiles ~40 grammars (a second), and
    # tests/unit/test_proven.py collects this module.
    import jsonschema

    proc = run([*GPUENV, "devcontainer", "-f", str(SHIPPED_MATRIX), CPU_CELL], cwd=tmp_path)
    path = tmp_path / ".devcontainer" / "devcontainer.json"
    assert proc.stdout.strip() == str(path), output(proc)
    assert sorted(p.name for p in tmp_path.rglob("*")) == [".devcontainer", "devcontainer.json"]
    doc = json.loads(path.read_text())
    schema = json.loads(SCHEMA.read_text())
    assert [e.message for e in jsonschema.Draft201909Validator(schema).iter_errors(doc)] == []
    assert doc["image"] == CPU_IMAGE
    assert inspect(doc["image"])["Id"] == cell_before["image"]["Id"]
    # The image runs as the user the file names, without one given (containerUser).
    who = in_image(doc["image"], "id", "-un").strip()
    assert who == doc["remoteUser"] == doc["containerUser"] == "gpuenv"
    again = run([*GPUENV, "devcontainer", "-f", str(SHIPPED_MATRIX), CPU_CELL], cwd=tmp_path,
                check=False)  # fmt: skip
    assert again.returncode == 1 and again.stderr.startswith("error: "), output(again)
    assert "never overwrites" in again.stderr
    assert json.loads(path.read_text()) == doc
    shutil.rmtree(tmp_path / ".devcontainer")


REMOTE_URL_LINE = re.compile(
    r"^JupyterLab in (\S+), on (\S+)'s loopback only: "
    r"(http://127\.0\.0\.1:(\d+))/lab\?token=(\w+)$"
)


def test_on_another_host_the_tunnel_reaches_it_and_the_files_come_back(cell_before, tmp_path):
    """An engine that cannot see this directory, over TCP+TLS (support/another_host.py,
    with the cell's image loaded into it): the server listens on that host's loopback only,
    the `ssh -L` gpuenv prints (with the user's login there, here the lab's sshd) reaches
    it, and what it wrote comes back when it stops. (ssh:// engines: once gpuenv's client
    speaks ssh without paramiko, the same test with lab.env("ssh").)"""
    from support.another_host import another_host

    from gpuenv.run.notebook import answers

    top = tmp_path / "remote"
    with another_host(top / "proj", hide=[top / "cache"], base_image=CPU_IMAGE) as lab:
        proj = lab.project_dir
        (proj / "notes.txt").write_text("sent from here\n")
        env = {**clean_env(XDG_CACHE_HOME=str(top / "cache")), **lab.env("tls")}
        server = subprocess.Popen(
            [*GPUENV, "notebook", "-f", str(SHIPPED_MATRIX), CPU_CELL], cwd=proj, env=env,
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
            preexec_fn=_as_from_a_terminal,
        )  # fmt: skip
        tunnel = None
        try:
            assert server.stdout is not None
            lines = [server.stdout.readline(), server.stdout.readline()]
            found = REMOTE_URL_LINE.match(lines[0].strip())
            if not found:
                server.wait(60)
                raise AssertionError(f"{lines}, exit {server.returncode}: {server.stderr.read()}")  # type: ignore[union-attr]
            url, port, token = found.group(3), found.group(4), found.group(5)
            assert found.group(2) == f"https://{lab.addr}:2376"  # the SDK's URL for tcp+TLS
            hint = lines[1].strip().removeprefix("reach it from here with: ")
            assert hint == f"ssh -N -L {port}:127.0.0.1:{port} USER@{lab.addr}"
            assert not answers(url, token)  # nothing listens here before the tunnel
            # Not on the host's own address either: its loopback only.
            assert not answers(f"http://{lab.addr}:{port}", token)
            quiet = subprocess.DEVNULL
            tunnel = subprocess.Popen(
                [*hint.split()[:-1], f"root@{lab.ssh_host()}"], env={**env, "PATH": lab.ssh_path},
                stdin=quiet, stdout=quiet, stderr=quiet,
            )  # fmt: skip
            deadline = time.monotonic() + 60
            while not answers(url, token):
                assert time.monotonic() < deadline and tunnel.poll() is None
                time.sleep(0.5)
            sent = _api(url, token, "GET", "/api/contents/notes.txt")
            assert sent["content"] == "sent from here\n"  # the directory travelled
            body = {"type": "file", "format": "text", "content": "written on the host\n"}
            _api(url, token, "PUT", "/api/contents/from_the_server.txt", body)
        finally:
            if tunnel is not None:
                tunnel.terminate()
                try:
                    tunnel.wait(10)
                except subprocess.TimeoutExpired:  # the test's own tunnel, not gpuenv's: once
                    tunnel.kill()  # seen still closing its forwarded channel after 10 s
                    tunnel.wait(10)
            server.send_signal(signal.SIGINT)
            _, err = server.communicate(timeout=120)
        assert server.returncode == 130, err
        assert (proj / "from_the_server.txt").read_text() == "written on the host\n"
        assert re.search(
            r"working directory via https://\S+: sent 1 file .*brought back 1 file", err
        )
        assert lab.docker("ps", "-aq").stdout.strip() == ""


def _api(url: str, token: str, method: str, path: str, body: Any = None) -> Any:
    import urllib.request

    data = json.dumps(body).encode() if body is not None else None
    request = urllib.request.Request(f"{url}{path}", data=data, method=method,
                                     headers={"Authorization": f"token {token}",
                                              "Content-Type": "application/json"})  # fmt: skip
    opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))
    with opener.open(request, timeout=30) as response:
        return json.loads(response.read() or b"null")
