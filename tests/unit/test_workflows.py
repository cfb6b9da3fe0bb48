"""The GitHub workflows: valid against check-jsonschema's built-in schema (offline), and
shaped as the image pipeline promises (tests/integration/test_engine_workflow_steps.py runs the
image workflow's steps for real)."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

WORKFLOWS = Path(__file__).resolve().parents[2] / ".github" / "workflows"
FILES = sorted(WORKFLOWS.glob("*.yml"))


def _check_jsonschema() -> str:
    local = Path(sys.executable).parent / "check-jsonschema"
    found = str(local) if local.exists() else shutil.which("check-jsonschema")
    assert found, "check-jsonschema is missing: pip install -e '.[test]'"
    return found


def test_both_workflows_are_there():
    assert {p.name for p in FILES} >= {"images.yml", "tests.yml"}


@pytest.mark.parametrize("path", FILES, ids=[p.name for p in FILES])
def test_workflow_matches_the_github_workflow_schema(path):
    proc = subprocess.run(
        [_check_jsonschema(), "--builtin-schema", "vendor.github-workflows", str(path)],
        capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stdout + proc.stderr


def test_the_schema_check_catches_a_broken_workflow(tmp_path):
    broken = tmp_path / "broken.yml"
    broken.write_text("on: push\njobs:\n  x:\n    runs-on: ubuntu-24.04\n    stepz: []\n")
    proc = subprocess.run(
        [_check_jsonschema(), "--builtin-schema", "vendor.github-workflows", str(broken)],
        capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert proc.returncode == 1, proc.stdout + proc.stderr


def _runs(job: dict) -> str:
    return "\n".join(s.get("run", "") for s in job["steps"])


def test_the_image_workflow_keeps_its_logic_in_gpuenv_commands():
    doc = yaml.safe_load((WORKFLOWS / "images.yml").read_text())
    on = doc[True] if True in doc else doc["on"]  # YAML 1.1 reads `on` as true
    assert on["push"]["tags"] == ["v*"] and "pull_request" in on
    cells, build = doc["jobs"]["cells"], doc["jobs"]["build"]
    assert "gpuenv matrix --json" in _runs(cells)
    assert build["strategy"]["matrix"]["cell"] == "${{ fromJSON(needs.cells.outputs.cells) }}"
    runs = _runs(build)
    for command in ('gpuenv build "$CELL"', 'gpuenv validate "$CELL" --junitxml',
                    'gpuenv push "$CELL" --registry "$GPUENV_REGISTRY"'):  # fmt: skip
        assert command in runs
    uses = {s["uses"].split("@")[0]: s for s in build["steps"] if "uses" in s}
    assert uses["actions/upload-artifact"]["if"] == "always()"
    assert uses["docker/login-action"]["with"]["password"] == "${{ secrets.GITHUB_TOKEN }}"
    assert "actions/cache" in uses and doc["permissions"]["packages"] == "write"
    push = next(s for s in build["steps"] if s.get("name") == "Push")
    login = uses["docker/login-action"]
    assert push["if"] == login["if"]
    assert "github.event_name == 'push'" in push["if"]
    assert "default_branch" in push["if"] and "startsWith(github.ref, 'refs/tags/v')" in push["if"]
    aliases = push["env"]["ALIASES"]  # aliases only from the default branch
    assert "default_branch" in aliases and aliases.endswith("&& '--aliases' || '--no-aliases' }}")


def test_the_kube_workflow_runs_a_cpu_job_on_kind_through_gpuenv():
    doc = yaml.safe_load((WORKFLOWS / "kube.yml").read_text())
    job = doc["jobs"]["kind"]
    uses = {s["uses"].split("@")[0]: s for s in job["steps"] if "uses" in s}
    assert uses["helm/kind-action"]["with"]["config"] == ".github/kind.yaml"
    assert (WORKFLOWS.parent / "kind.yaml").is_file()
    runs = _runs(job)
    assert job["env"]["GPUENV_REGISTRY"] == "localhost:5001"
    for command in ('run --kube -i "$CELL" --timeout 15m check.py', "--dry-run check.py",
                    "cmp a.yaml b.yaml", "--detach check.py", 'run --kube --logs "$JOB"',
                    'test "$code" = 3'):  # fmt: skip
        assert command in runs


def test_the_image_workflow_attests_pushed_images_and_a_job_verifies_them():
    doc = yaml.safe_load((WORKFLOWS / "images.yml").read_text())
    build, verify = doc["jobs"]["build"], doc["jobs"]["verify"]
    push = next(s for s in build["steps"] if s.get("name") == "Push")
    assert push["env"]["ATTEST_KEY"] == "${{ secrets.GPUENV_ATTEST_KEY }}"
    assert "--attest --key" in push["run"]
    assert verify["needs"] == ["cells", "build"]
    assert verify["if"].startswith(push["if"])  # the same pushes, when a public key is set
    assert "vars.GPUENV_ATTEST_PUBLIC_KEY" in verify["if"]
    assert 'gpuenv verify "$REGISTRY_HOST/' in _runs(verify)
