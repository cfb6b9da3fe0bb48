"""One policy for what of a user's tree leaves the machine (issue 44: M5, N5, N6): the
working directory's sync and the Kubernetes code layer (workdir.collect) and a local
package directory's tar (localtree.members) keep the same files back, with the same
reasons, as `gpuenv doctor --files DIR` lists them."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from cli_runner import CliRunner

from gpuenv.cli import app
from gpuenv.matrix import localtree, treepolicy
from gpuenv.matrix.errors import GpuenvError
from gpuenv.run import workdir

# The review's list of what was sent (M5, N5), and the usual suspects beside them.
SECRETS = [
    ".git-credentials", ".npmrc", ".pgpass", ".vault-token", ".dockercfg", "kubeconfig",
    "key.pem", "server.key", "service-account.json", "credentials.json", "prod.env", ".env",
    "terraform.tfstate", ".aws/credentials", ".config/gcloud/credentials.db", "id_rsa",
    "id_ed25519.pub", ".netrc", ".ssh/config", ".pypirc", ".docker/config.json",
    ".kube/config", ".env.local",
]  # fmt: skip


def tree(root: Path, *files: str) -> Path:
    for rel in files:
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_text("x")
    return root


def package_files(root: Path) -> list[str]:
    return [rel for rel, _ in localtree.members(root, root)]


def sent_files(root: Path) -> list[str]:
    return [rel for rel in workdir.collect(root) if (root / rel).is_file()]


@pytest.mark.parametrize("secret", SECRETS)
@pytest.mark.parametrize("where", ["", "sub/dir/"])
def test_a_secret_stays_at_the_top_and_two_directories_down(tmp_path, secret, where):
    root = tree(tmp_path, "train.py", f"{where}{secret}")
    assert sent_files(root) == ["train.py"]
    assert package_files(root) == ["train.py"]


@pytest.mark.parametrize("name", [".Git/config", ".GIT/HEAD", ".ENV", "sub/.Git-Credentials",
                                  "Key.PEM", "caf\u00e9/.NETRC"])  # fmt: skip
def test_any_spelling_a_case_insensitive_filesystem_takes_as_the_same_name(tmp_path, name):
    root = tree(tmp_path, "train.py", name)
    assert sent_files(root) == ["train.py"]
    assert package_files(root) == ["train.py"]


def test_double_star_matches_at_the_top_as_docker_does(tmp_path):
    """N6: `**/*.csv` (the review's `**/*.pem`) holds a top-level file too."""
    root = tree(tmp_path, "train.py", "data.csv", "a/b/c.csv", "a/keep.py")
    (root / ".dockerignore").write_text("**/*.csv\n")
    assert sent_files(root) == [".dockerignore", "a/keep.py", "train.py"]
    assert package_files(root) == [".dockerignore", "a/keep.py", "train.py"]
    (root / ".dockerignore").write_text("**/*.pem\n")
    tree(root, "key.pem")
    assert "key.pem" not in sent_files(root)


def test_a_pattern_is_anchored_at_the_root_as_docker_reads_it(tmp_path):
    root = tree(tmp_path, "data/big.bin", "sub/data/small.txt", "sub/x.log", "y.log")
    (root / ".dockerignore").write_text("# data lives in a volume\n/data/\n*.log\n")
    assert sent_files(root) == [".dockerignore", "sub/data/small.txt", "sub/x.log"]


def test_a_bang_line_takes_a_path_back(tmp_path):
    root = tree(tmp_path, "data/big.bin", "data/keep/labels.txt", "notes.md", "README.md")
    (root / ".dockerignore").write_text("data\n!data/keep\n*.md\n!README.md\n")
    assert workdir.collect(root) == [".dockerignore", "README.md", "data", "data/keep",
                                     "data/keep/labels.txt"]  # fmt: skip
    walked = treepolicy.walk(root)
    assert [(k.path, k.why) for k in walked.kept] == [
        ("data/big.bin", ".dockerignore:1 (data)"),
        ("notes.md", ".dockerignore:3 (*.md)"),
    ]
    assert package_files(root) == [".dockerignore", "README.md", "data/keep/labels.txt"]


def test_a_bang_line_never_takes_a_secret_back(tmp_path):
    root = tree(tmp_path, "train.py", ".env", "sub/.netrc")
    (root / ".dockerignore").write_text("!.env\n!sub/.netrc\n!**\n")
    assert sent_files(root) == [".dockerignore", "train.py"]


def test_the_user_extends_the_deny_list_with_gpuenvignore(tmp_path):
    root = tree(tmp_path, "train.py", "db.sqlite", "a/b/cache.SQLITE", "private/x", "a/private/y")
    (root / ".gpuenvignore").write_text("# ours\n*.sqlite\n/private\n")
    (root / ".dockerignore").write_text("!db.sqlite\n")
    expected = [".dockerignore", ".gpuenvignore", "a/private/y", "train.py"]
    assert sent_files(root) == expected
    assert package_files(root) == expected
    kept = {k.path: k.why for k in treepolicy.walk(root).kept}
    assert kept == {"db.sqlite": ".gpuenvignore:2 (*.sqlite)",
                    "a/b/cache.SQLITE": ".gpuenvignore:2 (*.sqlite)",
                    "private": ".gpuenvignore:3 (/private)"}  # fmt: skip


def test_a_bang_line_in_gpuenvignore_is_one_error(tmp_path):
    root = tree(tmp_path, "train.py")
    (root / ".gpuenvignore").write_text("!.env\n")
    with pytest.raises(GpuenvError, match=r"\.gpuenvignore:1: .*nothing re-includes a secret"):
        workdir.collect(root)


def test_a_bad_dockerignore_line_is_one_error_naming_it(tmp_path):
    root = tree(tmp_path, "train.py")
    (root / ".dockerignore").write_text("ok\n[abc\n")
    with pytest.raises(GpuenvError, match=r"\.dockerignore:2 \(\[abc\): .*not a valid pattern"):
        workdir.collect(root)


def test_names_are_compared_folded_and_normalised(tmp_path):
    """NFC in .dockerignore, NFD on disk (as macOS writes it), another case: the same."""
    root = tree(tmp_path, "train.py", "Cafe\u0301/x.txt")
    (root / ".dockerignore").write_text("caf\u00e9\n")
    assert sent_files(root) == [".dockerignore", "train.py"]


def test_a_symlink_to_a_secret_is_not_a_way_around(tmp_path):
    root = tree(tmp_path, "train.py", ".env")
    os.symlink(".env", root / "settings.txt")
    assert package_files(root) == ["train.py"]


def test_one_limit_for_every_walker():
    assert workdir.MAX_BYTES == localtree.MAX_BYTES == treepolicy.MAX_BYTES == 256 << 20
    assert workdir.MAX_FILES == localtree.MAX_FILES == treepolicy.MAX_FILES == 20_000


def test_doctor_files_lists_what_is_sent_and_what_stays_with_why(tmp_path):
    root = tree(tmp_path, "train.py", "sub/dir/.git-credentials", ".git/HEAD", "big.csv")
    (root / ".dockerignore").write_text("**/*.csv\n")
    result = CliRunner().invoke(app, ["doctor", "--files", str(root)])
    assert result.exit_code == 0, result.output
    assert result.output.splitlines() == [
        "send  .dockerignore",
        "send  sub",
        "send  sub/dir",
        "send  train.py",
        "keep  .git  (cache or version control (.git, built in))",
        "keep  big.csv  (.dockerignore:1 (**/*.csv))",
        "keep  sub/dir/.git-credentials  (secret (.git-credentials, built in))",
        f"{root}: 4 sent, 3 kept back (.dockerignore and .gpuenvignore decide; see "
        "docs/hardening.md)",
    ]
