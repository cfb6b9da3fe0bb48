"""The remembered no-op verdict (gpuenv/verdict.py): the recorded answer comes back only
while every input the plan read is as it was, and the engine still has each image by the
same ID; any change, an unreadable record or an engine it cannot ask, and there is none.
The engine is a tiny Engine API on a Unix socket (engine_api.py); the whole no-op path on
a real engine is tests/integration/test_engine_noop.py."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from gpuenv import ca, cache, fingerprint, verdict
from gpuenv.cache import file_digest

REPO = Path(__file__).resolve().parents[2]
CELL, BASE = "acme/tf:cell", "gpuenv/debian:bookworm"
ANSWER = {"table": "CELL  cached\n", "colour": "CELL  \x1b[36mcached\x1b[0m\n", "json": "{}\n"}


class Images:
    """The fake engine's images: reference -> ID, answered at /images/REF/json."""

    def __init__(self, routes: dict) -> None:
        self.ids = {CELL: "sha256:c1", BASE: "sha256:b1"}
        self.routes = routes
        for ref in self.ids:
            routes[self.route(ref)] = (200, lambda _body, ref=ref: {"Id": self.ids[ref]})

    @staticmethod
    def route(ref: str) -> tuple[str, str]:
        return ("GET", f"/images/{ref.replace('/', '%2F').replace(':', '%3A')}/json")


@pytest.fixture
def engine(fake_socket, monkeypatch) -> Images:
    path, routes = fake_socket
    monkeypatch.setenv("DOCKER_HOST", f"unix://{path}")
    return Images(routes)


@pytest.fixture
def project(tmp_path, monkeypatch, minimal_matrix):
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    for name in ("GPUENV_CA_BUNDLE", "PIP_CERT", "GPUENV_MATRIX"):
        monkeypatch.delenv(name, raising=False)
    root = tmp_path / "p"
    root.mkdir()
    (root / "matrix.yaml").write_text(minimal_matrix)
    (root / "reqs.txt").write_text("six==1.17.0\n")
    monkeypatch.chdir(root)
    return root


def remember(root: Path, patterns=(), bundle: Path | None = None, **changes) -> bool:
    matrix = root / "matrix.yaml"
    reqs = root / "reqs.txt"
    args = {
        "inputs_key": fingerprint.key(matrix, root / "matrix.lock"),
        "depends": {str(reqs): fingerprint.dependency_state(reqs)},
        "bundle": bundle,
        "images": {CELL: "sha256:c1", BASE: "sha256:b1"},
        "answer": ANSWER,
        **changes,
    }
    return verdict.remember(matrix, list(patterns), **args)


def recall(root: Path, patterns=(), *, as_json=False, colour=False) -> str | None:
    return verdict.recall(root / "matrix.yaml", list(patterns), as_json=as_json, colour=colour)


def test_the_answer_comes_back_in_the_form_asked_for(project, engine):
    assert recall(project) is None, "nothing remembered yet"
    assert remember(project)
    assert recall(project) == ANSWER["table"]
    assert recall(project, colour=True) == ANSWER["colour"]
    assert recall(project, as_json=True) == ANSWER["json"]
    # -f FILE, $GPUENV_MATRIX and ./matrix.yaml name the same record.
    assert verdict.recall(None, [], as_json=False, colour=False) == ANSWER["table"]


def _edit_matrix(root: Path, monkeypatch) -> None:
    with (root / "matrix.yaml").open("a") as fh:
        fh.write("# a comment is an edit\n")


def _add_lock(root: Path, monkeypatch) -> None:
    (root / "matrix.lock").write_text("version: 1\n")


def _edit_requirements(root: Path, monkeypatch) -> None:
    (root / "reqs.txt").write_text("six==1.16.0\n")


def _point_requirements_elsewhere(root: Path, monkeypatch) -> None:
    (root / "other.txt").write_text((root / "reqs.txt").read_text())
    (root / "reqs.txt").unlink()
    (root / "reqs.txt").symlink_to(root / "other.txt")


def _set_pip_cert(root: Path, monkeypatch) -> None:
    monkeypatch.setenv("PIP_CERT", str(root / "ca.pem"))


def _another_directory(root: Path, monkeypatch) -> None:
    (root / "sub").mkdir()
    monkeypatch.chdir(root / "sub")


@pytest.mark.parametrize(
    "change",
    [_edit_matrix, _add_lock, _edit_requirements, _point_requirements_elsewhere,
     _set_pip_cert, _another_directory],
)  # fmt: skip
def test_every_input_change_forgets(project, engine, monkeypatch, change):
    assert remember(project) and recall(project) is not None
    change(project, monkeypatch)
    assert recall(project) is None, f"{change.__name__} must forget"


def test_another_selection_is_another_question(project, engine):
    assert remember(project, ["tf2.21-*"])
    assert recall(project, ["tf2.21-*"]) == ANSWER["table"]
    assert recall(project) is None
    assert recall(project, ["tf2.21-*", "x"]) is None


def test_a_code_or_template_change_forgets(project, engine, monkeypatch, tmp_path):
    assert remember(project)
    templates = tmp_path / "images"
    shutil.copytree(fingerprint.templates_dir(), templates)
    monkeypatch.setattr(fingerprint, "templates_dir", lambda: templates)
    assert recall(project) is None


def test_another_image_behind_a_tag_forgets(project, engine):
    assert remember(project)
    engine.ids[CELL] = "sha256:c2"  # rebuilt, or re-tagged, since
    assert recall(project) is None
    engine.ids[CELL] = "sha256:c1"
    assert recall(project) == ANSWER["table"]
    engine.ids[BASE] = "sha256:b2"  # the base re-imported: every cell on it rebuilds
    assert recall(project) is None


def test_a_missing_image_or_no_engine_forgets(project, engine, monkeypatch, tmp_path):
    assert remember(project)
    del engine.routes[engine.route(BASE)]  # 404
    assert recall(project) is None
    monkeypatch.setenv("DOCKER_HOST", f"unix://{tmp_path}/nothing.sock")
    assert recall(project) is None
    monkeypatch.setenv("DOCKER_HOST", "tcp://10.0.0.1:2376")  # the SDK's business: the plan
    assert recall(project) is None


def test_an_answer_that_asked_the_engine_nothing_is_not_given(project, engine):
    """The plan connects to the engine even for no cell; so must an answer."""
    assert remember(project, images={})
    assert recall(project) is None


def _bundle(root: Path, until: float) -> Path:
    bundle = root / "ca.pem"
    bundle.write_text("-----BEGIN CERTIFICATE-----\n")
    cache.write_record(ca.CHECKED, {file_digest(bundle): until})
    return bundle


def test_the_ca_bundle_is_part_of_the_question(project, engine, monkeypatch):
    import time

    bundle = _bundle(project, time.time() + 3600)
    monkeypatch.setenv("PIP_CERT", str(bundle))
    assert remember(project, bundle=bundle)
    assert recall(project) == ANSWER["table"]
    bundle.write_text(bundle.read_text() + "\n")  # another file now: check it again
    assert recall(project) is None


def test_the_answer_expires_with_the_bundles_check(project, engine, monkeypatch):
    import time

    bundle = _bundle(project, time.time() + 60)
    monkeypatch.setenv("PIP_CERT", str(bundle))
    assert remember(project, bundle=bundle)
    assert recall(project) is not None
    later = time.time() + 120
    monkeypatch.setattr(verdict.time, "time", lambda: later)
    assert recall(project) is None


def test_a_bundle_not_known_good_is_not_remembered(project, engine, monkeypatch):
    bundle = project / "ca.pem"
    bundle.write_text("not checked\n")
    monkeypatch.setenv("PIP_CERT", str(bundle))
    assert not remember(project, bundle=bundle)
    assert recall(project) is None


def test_inputs_that_changed_while_planning_are_not_remembered(project, engine):
    assert not remember(project, inputs_key="what the matrix was when the plan began")
    assert recall(project) is None


@pytest.mark.parametrize(
    "damage",
    ["not json", "[]", '{"question": 1}', "{}", None],
)
def test_a_corrupt_record_is_no_answer(project, engine, damage):
    assert remember(project)
    entry = cache.cache_file(verdict.entry_name(project / "matrix.yaml", []))
    if damage is None:  # a well-formed record whose answer is not text
        record = json.loads(entry.read_text())
        record["answer"]["table"] = 7
        damage = json.dumps(record)
    entry.write_text(damage)
    assert recall(project) is None


def test_the_remembered_path_imports_neither_the_plan_nor_dataclasses(project, engine):
    """What makes it fast: the modules a recall loads (the no-op build's whole path on
    a hit is this, plus the CLI's entry and its signal handling)."""
    assert remember(project)
    probe = (
        "import sys\n"
        "from gpuenv import verdict\n"
        "text = verdict.recall(None, [], as_json=False, colour=False)\n"
        "assert text is not None, 'no answer'\n"
        "import json\n"
        "print(json.dumps([m for m in sys.modules if m.startswith('gpuenv') or m in "
        "('dataclasses', 'docker', 'typer', 'jinja2', 'pydantic', 'yaml')]))\n"
    )
    proc = subprocess.run(
        [sys.executable, "-c", probe], capture_output=True, text=True, cwd=project,
        env={**os.environ, "PYTHONPATH": str(REPO)}, timeout=60,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    loaded = set(json.loads(proc.stdout))
    assert loaded <= {"gpuenv", "gpuenv.cache", "gpuenv.contract", "gpuenv.errors",
                      "gpuenv.files", "gpuenv.fingerprint", "gpuenv.project", "gpuenv.verdict",
                      "gpuenv.wire"}, sorted(loaded)  # fmt: skip
