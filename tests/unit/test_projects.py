"""tests/projects/README.md: each file it calls a verbatim copy of a public project's still is.
The README records each copy's git blob id at the project's commit; a copy edited here (a
reformat, a "fix") no longer hashes to it, and the tests that cite the project would no longer
be testing the project's own file."""

from __future__ import annotations

import hashlib
import re
from pathlib import Path

import pytest

PROJECTS = Path(__file__).resolve().parents[1] / "projects"
ROW = re.compile(r"^\| `([^`]+)` \| `[^`]+` \| `([0-9a-f]{40})` \|$", re.MULTILINE)


def git_blob_id(data: bytes) -> str:
    """The id git gives a file's bytes (`git hash-object`), so copies match `git rev-parse`."""
    return hashlib.sha1(b"blob %d\0" % len(data) + data).hexdigest()


VERBATIM = ROW.findall((PROJECTS / "README.md").read_text())


def test_the_readme_lists_the_verbatim_copies():
    names = {name for name, _ in VERBATIM}
    assert {
        "word_language_model/main.py",
        "tensor_parallelism/requirements.txt",
        "nanochat/pyproject.toml",
        "nanochat/uv.lock",
        "jax_rl_playground/uv.lock",
        "tf_recommendation/requirements.txt",
    } <= names


@pytest.mark.parametrize(("name", "blob"), VERBATIM, ids=[name for name, _ in VERBATIM])
def test_a_verbatim_copy_hashes_to_the_projects_blob(name, blob):
    assert git_blob_id((PROJECTS / name).read_bytes()) == blob, (
        f"tests/projects/{name} is not the project's file any more (tests/projects/README.md)"
    )
