"""`slurm run --login`'s pure parts: the ssh argv and its quoting, the listings that come
back from the login node, what is sent and what comes back (issue 46, item 1)."""

from __future__ import annotations

import os
import shlex
import subprocess
from pathlib import Path

import pytest

from gpuenv.run.slurm import SlurmError
from gpuenv.run.slurm import ssh as ssh_mod
from gpuenv.run.slurm.jobdir import Listing, changed, parse_listing, parse_sha256sum, plan
from gpuenv.run.slurm.jobs import remote_argv
from gpuenv.run.slurm.login import parse_prepared, shared_there, to_send
from gpuenv.run.slurm.script import ImageFiles
from gpuenv.run.slurm.ssh import Login, login_for
from gpuenv.run.workdir import Entry

A, B, C = "a" * 64, "b" * 64, "c" * 64


@pytest.mark.parametrize(
    ("text", "host", "user", "port"),
    [
        ("login1", "login1", None, None),
        ("ada@login.hpc.example.org", "login.hpc.example.org", "ada", None),
        ("ada@10.0.0.2:2222", "10.0.0.2", "ada", 2222),
        ("my-cluster", "my-cluster", None, None),
    ],
)
def test_login_is_user_host_port(text, host, user, port):
    assert Login.parse(text) == Login(host, user, port)


BAD_LOGINS = ["", "-oProxyCommand=touch /tmp/x", "ada@", "host:0", "host:ssh", "a b", "h;id",
              "@host", "host/path", "ada@-x"]  # fmt: skip


@pytest.mark.parametrize("text", BAD_LOGINS)
def test_a_login_that_ssh_could_read_as_an_option_is_refused(text):
    with pytest.raises(SlurmError, match=r"^--login .*expected \[USER@\]HOST\[:PORT\]"):
        Login.parse(text)


def test_the_login_comes_from_the_environment_when_not_given(monkeypatch):
    monkeypatch.setenv("GPUENV_SLURM_LOGIN", "ada@login1")
    assert login_for(None) == Login("login1", "ada")
    assert login_for("bob@login2") == Login("login2", "bob")
    monkeypatch.setenv("GPUENV_SLURM_LOGIN", "-oX")
    with pytest.raises(SlurmError, match=r"^\$GPUENV_SLURM_LOGIN '-oX'"):
        login_for(None)
    monkeypatch.delenv("GPUENV_SLURM_LOGIN")
    assert login_for(None) is None


def test_ssh_argv_is_batch_mode_no_tty_and_the_host_after_a_double_dash():
    argv = Login("login1", "ada", 2222).argv(["tail", "-c", "+1", "--", "/x/out"])
    assert argv[:argv.index("--")] == ["ssh", "-T", "-o", "BatchMode=yes", "-o",
                                       "ConnectTimeout=30", "-l", "ada", "-p", "2222"]  # fmt: skip
    assert argv[argv.index("--") + 1 :] == ["login1", "tail -c +1 -- /x/out"]


def test_every_word_reaches_the_remote_shell_as_one_word():
    """The one string ssh hands the login shell splits back into exactly the argv."""
    words = ["sh", "-c", 'echo "$1"; rm -rf /', "x", "it's; $(id) `id` *", "a\nb", ""]
    remote = Login("h").argv(words)[-1]
    out = subprocess.run(["sh", "-c", f"set -- {remote}; printf '%s\\0' \"$@\""],
                         capture_output=True, check=True).stdout  # fmt: skip
    assert out.split(b"\0")[:-1] == [w.encode() for w in words]
    assert shlex.split(remote) == words


def test_slurm_commands_there_drop_what_would_widen_the_export():
    assert remote_argv("sbatch", "--parsable") == [
        "env", "-u", "SBATCH_EXPORT", "-u", "SLURM_EXPORT_ENV", "-u", "SBATCH_GET_USER_ENV",
        "sbatch", "--parsable",
    ]  # fmt: skip


def test_sha256sum_lines_with_escaped_names():
    text = f"{A}  ./train.py\n\\{B}  ./we\\\\ird\\nname\n{C}  ./dir/two  spaces\n"
    assert parse_sha256sum(text) == {"train.py": A, "we\\ird\nname": B, "dir/two  spaces": C}


def test_the_listing_of_the_job_directory():
    find = b"f 5 train.py\0d 0 out\0f 3 out/log\0l 7 link\0\0"
    out = find + f"{A}  ./train.py\n{B}  ./out/log\n".encode()
    listing = parse_listing(out)
    assert listing.kinds == {"train.py": ("f", 5), "out": ("d", 0), "out/log": ("f", 3),
                             "link": ("l", 7)}  # fmt: skip
    assert listing.digests == {"train.py": A, "out/log": B}
    assert parse_listing(b"\0") == Listing({}, {})
    with pytest.raises(SlurmError, match="cut short"):
        parse_listing(b"f 5 train.py\0")


def test_only_what_differs_by_content_is_sent_and_what_is_not_here_is_removed():
    local = {"train.py": Entry("f", 5), "data": Entry("d"), "data/x.bin": Entry("f", 9),
             "new.txt": Entry("f", 1), "latest": Entry("l", link="data/x.bin")}  # fmt: skip
    digests = {"train.py": A, "data/x.bin": B, "new.txt": C}
    there = Listing(
        {"train.py": ("f", 5), "data": ("d", 0), "data/x.bin": ("f", 9), "old": ("d", 0),
         "old/a": ("f", 1), "latest": ("f", 3), "model.ckpt": ("f", 4)},
        {"train.py": A, "data/x.bin": C, "old/a": A, "latest": A, "model.ckpt": B},
    )  # fmt: skip
    gone, send = plan(local, digests, there)
    # A file the job wrote there last time and not here is removed: the copy is this
    # directory (it came back, or it is here now).
    assert gone == ["latest", "model.ckpt", "old"]
    assert send == ["data/x.bin", "latest", "new.txt"]
    assert plan(local, digests, Listing({}, {}))[1] == sorted(local)


def test_what_comes_back_is_what_the_job_created_or_changed_by_content():
    after = Listing(
        {"train.py": ("f", 5), "model.ckpt": ("f", 4), "log": ("f", 2), ".git/config": ("f", 1),
         "out/.env": ("f", 1), "dir": ("d", 0)},
        {"train.py": A, "model.ckpt": B, "log": C, ".git/config": A, "out/.env": B},
    )  # fmt: skip
    assert changed(after, {"train.py": A, "log": A}) == ["log", "model.ckpt"]


def test_image_files_go_unless_their_digest_there_is_this_one_the_squashfs_last():
    here = ImageFiles("/c/i.sqfs", "/c/i.env", "/c/i.sh.env")
    there = ImageFiles("/s/g/i.sqfs", "/s/g/i.env", "/s/g/i.sh.env")
    ours = {"/c/i.sqfs": A, "/c/i.env": B, "/c/i.sh.env": C}
    assert to_send(here, there, {"i.sqfs": A, "i.env": B, "i.sh.env": C}, ours) == []
    assert to_send(here, there, {"i.sqfs": C, "i.env": B}, ours) == [
        ("/c/i.sh.env", "/s/g/i.sh.env", C), ("/c/i.sqfs", "/s/g/i.sqfs", A)]  # fmt: skip
    with pytest.raises(SlurmError, match="cannot be read"):
        to_send(here, there, {}, {**ours, "/c/i.env": None})


def test_what_the_login_node_says_when_prepared():
    prepared = parse_prepared(f"uid 1234\n{A}  i.sqfs\n")
    assert (prepared.uid, prepared.digests) == (1234, {"i.sqfs": A})
    with pytest.raises(SlurmError, match="not its uid"):
        parse_prepared("Welcome to the cluster!\n")


def test_shared_is_an_absolute_path_on_the_cluster(monkeypatch):
    monkeypatch.delenv("GPUENV_SLURM_SHARED", raising=False)
    assert shared_there("/scratch/ada/") == "/scratch/ada"
    with pytest.raises(SlurmError, match="must be absolute"):
        shared_there("scratch")
    with pytest.raises(SlurmError, match="cannot carry spaces"):
        shared_there("/scratch/my dir")
    with pytest.raises(SlurmError, match="--shared DIR or"):
        shared_there(None)
    assert Path(shared_there("/tmp")) == Path("/tmp")


def _ssh_stand_in(tmp_path, monkeypatch, script: str) -> Path:
    """An `ssh` first on PATH that runs `script` (sh), counting its calls in `calls`."""
    calls = tmp_path / "calls"
    ssh = tmp_path / "bin" / "ssh"
    ssh.parent.mkdir()
    ssh.write_text(f"#!/bin/sh\necho x >> {calls}\n{script}\n")
    ssh.chmod(0o755)
    monkeypatch.setenv("PATH", f"{ssh.parent}:{os.environ['PATH']}")
    monkeypatch.setattr(ssh_mod.time, "sleep", lambda s: None)
    return calls


def test_a_connection_dropped_before_the_login_is_tried_again(tmp_path, monkeypatch):
    """An sshd throttling unauthenticated connections (MaxStartups) resets some: nothing ran
    there, so the command is asked again; a refusal after the login is not."""
    calls = _ssh_stand_in(
        tmp_path,
        monkeypatch,
        f"""
n=$(wc -l < {tmp_path / "calls"})
if [ "$n" -lt 3 ]; then
  echo "kex_exchange_identification: read: Connection reset by peer" >&2; exit 255
fi
echo done""",
    )
    proc = ssh_mod.run(Login("node"), ["true"], "the test")
    assert proc.stdout == b"done\n" and len(calls.read_text().split()) == 3

    calls.unlink()
    refused = "echo 'Permission denied (publickey).' >&2; exit 255"
    (tmp_path / "bin" / "ssh").write_text(f"#!/bin/sh\necho x >> {calls}\n{refused}\n")
    with pytest.raises(SlurmError, match="refused the login"):
        ssh_mod.run(Login("node"), ["true"], "the test")
    assert len(calls.read_text().split()) == 1
