"""A second local user on the machine where a build with private-index credentials runs (the
shared lab server): while the build runs and after it, that user finds nothing of gpuenv's
to connect to, and can neither read the private package nor put a file where the build
takes its packages from.

The build is a JAX CPU cell with one private package from a basic-auth index on loopback
(support/private_index.py, HTTPS), credentials in a netrc file. gpuenv's cache is under a
directory every user may enter (0755), so what keeps the second user out is gpuenv's own
modes, not the test's temporary directory. Needs root (a throwaway user).
"""

from __future__ import annotations

import contextlib
import json
import os
import pwd
import subprocess
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from support.cells import test_repository
from support.cli import GPUENV, clean_env, output, run
from support.private_index import PACKAGE, VERSION, PrivateIndex

pytestmark = pytest.mark.engine

NAME = test_repository("other-user")
CELL = "jax0.7-py3.11-cpu"


@pytest.fixture(scope="module")
def stranger() -> Iterator[str]:
    if os.geteuid() != 0:
        pytest.skip("a second local user needs root to make")
    name = f"gpuenv-ou{os.getpid() % 100000}"
    run(["useradd", "--no-create-home", "--shell", "/bin/sh", name])
    try:
        yield name
    finally:
        run(["userdel", name], check=False)


def as_user(user: str, *argv: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(["runuser", "-u", user, "--", *argv], capture_output=True, text=True,
                          timeout=60, check=False)  # fmt: skip


def listening_sockets(pids: list[int]) -> list[str]:
    """The listening TCP/UDP/Unix sockets these processes hold (from /proc: their socket
    inodes, matched against the kernel's tables in LISTEN state)."""
    inodes: set[str] = set()
    for pid in pids:
        with contextlib.suppress(OSError):
            for fd in Path(f"/proc/{pid}/fd").iterdir():
                with contextlib.suppress(OSError):
                    target = os.readlink(fd)
                    if target.startswith("socket:["):
                        inodes.add(target[8:-1])
    found = []
    for table in ("tcp", "tcp6"):
        for line in Path(f"/proc/net/{table}").read_text().splitlines()[1:]:
            fields = line.split()
            if fields[3] == "0A" and fields[9] in inodes:  # 0A: LISTEN
                found.append(f"{table} {fields[1]}")
    for line in Path("/proc/net/unix").read_text().splitlines()[1:]:
        fields = line.split()
        if fields[5] == "01" and fields[3] == "00010000" and fields[6] in inodes:
            found.append(f"unix {fields[7] if len(fields) > 7 else '(unnamed)'}")
    return found


def process_tree(root: int) -> list[int]:
    children: dict[int, list[int]] = {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            with contextlib.suppress(OSError, IndexError, ValueError):
                ppid = int((entry / "stat").read_text().rsplit(")", 1)[1].split()[1])
                children.setdefault(ppid, []).append(int(entry.name))
    out, todo = [], [root]
    while todo:
        pid = todo.pop()
        out.append(pid)
        todo.extend(children.get(pid, []))
    return out


def test_a_second_user_can_neither_fetch_the_private_package_nor_serve_the_build(
    stranger: str, tmp_path_factory: pytest.TempPathFactory
) -> None:
    shared = Path(tempfile.mkdtemp(prefix="gpuenv-ou-", dir="/tmp"))
    shared.chmod(0o755)  # any user may enter: only gpuenv's own modes keep them out
    project = tmp_path_factory.mktemp("other-user")
    cache = shared / "cache"
    with PrivateIndex(project) as index:
        (project / "matrix.yaml").write_text(
            f"name: {NAME}\nmatrix:\n  jax: ['0.7']\n  python: ['3.11']\n  variant: [cpu]\n"
            "default: {jax: '0.7', python: '3.11'}\nbases:\n  '3.11': {debian: bookworm}\n"
            f"packages:\n  pip: ['{PACKAGE}=={VERSION}']\n"
            f"build:\n  extra_index_urls: ['{index.url}']\n"
        )
        netrc = project / "netrc"
        netrc.write_text(index.netrc())
        netrc.chmod(0o600)
        env = clean_env(XDG_CACHE_HOME=str(cache), NETRC=str(netrc),
                        GPUENV_CA_BUNDLE=str(index.bundle))  # fmt: skip
        for name in ("no_proxy", "NO_PROXY"):
            env[name] = ",".join(filter(None, (env.get(name), "127.0.0.1")))
        argv = [*GPUENV, "build", "--json", CELL]
        proc = subprocess.Popen(argv, cwd=project, env=env, stdout=subprocess.PIPE,
                                stderr=subprocess.PIPE, text=True)  # fmt: skip
        seen_build = False
        try:
            while proc.poll() is None:
                tree = process_tree(proc.pid)
                assert listening_sockets(tree) == []
                # The build is under way once gpuenv runs the docker CLI: its context is
                # assembled, the private wheel in it.
                seen_build |= any(
                    b"docker" in Path(f"/proc/{p}/cmdline").read_bytes()
                    for p in tree[1:] if Path(f"/proc/{p}").exists()
                )  # fmt: skip
                if seen_build:
                    check_shut_out(stranger, cache)
                time.sleep(0.2)
            out, err = proc.communicate(timeout=60)
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
        assert proc.returncode == 0, err[-3000:]
        assert seen_build, "the build ended before it could be watched"
        assert (f"/files/{index.filename}", 200) in index.requests
    check_shut_out(stranger, cache)
    image_id = json.loads(out)["results"][0]["image_id"]
    try:
        probe = run(["docker", "run", "--rm", "--network", "none", image_id, "python", "-c",
                     "import gpuenv_private_probe as p; print(p.ANSWER)"])  # fmt: skip
        assert probe.stdout.strip() == "42", output(probe)
    finally:
        run(["docker", "rmi", "-f", f"{NAME}:{CELL}"], check=False)
        run(["rm", "-rf", str(shared)], check=False)


def check_shut_out(user: str, cache: Path) -> None:
    """What the second user tries: read the private wheel (by name, wherever gpuenv keeps
    it), list what gpuenv keeps, and put a file of theirs beside the build's packages."""
    private = sorted(cache.rglob("gpuenv_private_probe-*.whl")) + sorted(
        p for p in (cache / "gpuenv" / "wheelhouse" / "files").rglob("*") if p.is_file()
    )
    assert private, "the private wheel is somewhere in gpuenv's cache"
    for path in private[:3]:
        read = as_user(user, "cat", str(path))
        assert read.returncode != 0 and "Permission denied" in read.stderr, read
    for directory in (cache / "gpuenv" / "wheelhouse", cache / "gpuenv" / "contexts"):
        listed = as_user(user, "ls", str(directory))
        assert listed.returncode != 0 and "Permission denied" in listed.stderr, listed
    planted = as_user(user, "touch", str(cache / "gpuenv" / "contexts" / CELL / "python-env" /
                                         "evil-1.0-py3-none-any.whl"))  # fmt: skip
    assert planted.returncode != 0, planted
    assert pwd.getpwnam(user).pw_uid != os.getuid()
