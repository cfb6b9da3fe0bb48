"""The image workflow's own `run:` steps, run here in order, against the loopback registry.

.github/workflows/images.yml keeps its logic in gpuenv commands so that the same steps run
on a laptop. This test reads the file and runs the `cells` job, then the `build` job for
the shipped CPU cell, as GitHub Actions would on a push to the default branch: the `${{ }}`
expressions the steps use are replaced by local values (an unknown one fails the test, so
the table below follows the workflow), `uses:` steps are skipped, steps that only make
sense on GitHub's hosted runners are skipped, $GITHUB_ENV and $GITHUB_OUTPUT work, and
REGISTRY_HOST is the loopback registry instead of ghcr.io. The owner has capitals, as
GitHub's can, to show that the workflow lowercases it.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import time
import xml.etree.ElementTree as ET
from pathlib import Path
from typing import Any

import pytest
import yaml

pytest.register_assert_rewrite("push_fixtures")

from push_fixtures import CPU_CELL, REPO  # noqa: E402

pytest_plugins = ["push_fixtures"]

pytestmark = [pytest.mark.engine]

WORKFLOW = REPO / ".github" / "workflows" / "images.yml"
OWNER = "Gpuenv-Test-Owner"
DEFAULT_BRANCH = "github.ref == format('refs/heads/{0}', github.event.repository.default_branch)"
SUDO = """#!/bin/sh
# Stand-in for sudo in the workflow-steps test: this user is root already.
while [ $# -gt 0 ]; do
  case "$1" in --) shift; break;; -*) shift;; *) break;; esac
done
exec "$@"
"""


def _if_runs(condition: str | None) -> bool:
    """Whether a step's `if:` holds on a push to the default branch of a local run."""
    if condition is None:
        return True
    if "runner.environment == 'github-hosted'" in condition:
        return False  # e.g. freeing a hosted runner's disk: not for this machine
    if condition.startswith("github.event_name == 'push' && (" + DEFAULT_BRANCH):
        return True  # the publishing steps
    pytest.fail(f"the test does not know the step condition {condition!r}: teach it")


class Expressions:
    def __init__(self, values: dict[str, str], env: dict[str, str]) -> None:
        self.values = values
        self.env = env

    def value(self, expr: str) -> str:
        if expr in self.values:
            return self.values[expr]
        if expr.startswith("env."):
            return self.env[expr[4:]]
        choice = re.fullmatch(r"(.*) && '([^']*)' \|\| '([^']*)'", expr)
        if choice and choice.group(1) == DEFAULT_BRANCH:
            return choice.group(2)  # a push to the default branch
        pytest.fail(f"the test has no local value for ${{{{ {expr} }}}}: teach it")

    def __call__(self, text: str) -> str:
        return re.sub(r"\$\{\{\s*(.*?)\s*\}\}", lambda m: self.value(m.group(1)), str(text))


def _read_file_commands(path: Path) -> dict[str, str]:
    """KEY=VALUE lines (and KEY<<EOF blocks) of $GITHUB_ENV / $GITHUB_OUTPUT."""
    out: dict[str, str] = {}
    lines = iter(path.read_text().splitlines()) if path.exists() else iter(())
    for line in lines:
        if "<<" in line and ("=" not in line or line.index("<<") < line.index("=")):
            key, marker = line.split("<<", 1)
            body = []
            for more in lines:
                if more == marker:
                    break
                body.append(more)
            out[key] = "\n".join(body)
        elif "=" in line:
            key, value = line.split("=", 1)
            out[key] = value
    return out


def run_job(
    job: dict[str, Any], workflow_env: dict[str, str], values: dict[str, str], tmp: Path,
    base_env: dict[str, str], log: list[str],
) -> dict[str, dict[str, str]]:  # fmt: skip
    """Run a job's `run:` steps in order; returns the steps' outputs by id."""
    expr = Expressions(values, {})
    env = dict(workflow_env)
    expr.env = env
    env.update({k: expr(v) for k, v in (job.get("env") or {}).items()})
    outputs: dict[str, dict[str, str]] = {}
    for number, step in enumerate(job["steps"]):
        name = step.get("name") or step.get("uses") or f"step {number}"
        if "uses" in step:
            log.append(f"skipped (action): {name}")
            continue
        if not _if_runs(step.get("if")):
            log.append(f"skipped (if): {name}")
            continue
        github_env, github_output = tmp / f"env-{number}", tmp / f"output-{number}"
        step_env = {**base_env, **env}
        step_env.update({k: expr(v) for k, v in (step.get("env") or {}).items()})
        step_env.update(GITHUB_ENV=str(github_env), GITHUB_OUTPUT=str(github_output))
        script = tmp / f"step-{number}.sh"
        script.write_text(expr(step["run"]) + "\n")
        start = time.monotonic()
        proc = subprocess.run(
            ["bash", "--noprofile", "--norc", "-eo", "pipefail", str(script)],
            cwd=REPO, env=step_env, capture_output=True, text=True, timeout=900,
        )  # fmt: skip
        log.append(f"{time.monotonic() - start:6.1f} s  {name}")
        assert proc.returncode == 0, (
            f"step {name!r} exited {proc.returncode}\n--- script\n{script.read_text()}"
            f"--- stdout\n{proc.stdout[-3000:]}\n--- stderr\n{proc.stderr[-3000:]}"
        )
        env.update(_read_file_commands(github_env))
        if "id" in step:
            outputs[step["id"]] = _read_file_commands(github_output)
    return outputs


def test_the_image_workflow_steps_run_here(registry, pushed, cpu_built, loopback_refs, tmp_path):
    # `pushed` first: the registry then holds the layers, and the workflow's push mounts them.
    doc = yaml.safe_load(WORKFLOW.read_text())
    jobs = doc["jobs"]
    # `verify` checks the attestations in the registry after the push; it is not run here
    # (tests/integration/test_engine_attest.py runs `gpuenv verify`).
    assert list(jobs) == ["cells", "build", "verify"] and jobs["build"]["needs"] == "cells"
    workflow_env = dict(doc.get("env") or {})
    assert workflow_env["REGISTRY_HOST"] == "${{ vars.REGISTRY || 'ghcr.io' }}"
    workflow_env["REGISTRY_HOST"] = registry.host

    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    if shutil.which("sudo") is None:
        if os.geteuid() != 0:
            pytest.skip("the workflow's set-up steps need sudo (or root)")
        (bin_dir / "sudo").write_text(SUDO)
        (bin_dir / "sudo").chmod(0o755)
    runner_temp = tmp_path / "runner-temp"
    runner_temp.mkdir()
    base_env = {k: v for k, v in os.environ.items() if not k.startswith("GPUENV_")}
    venv_bin = Path(sys.executable).parent
    base_env.update(
        PATH=f"{bin_dir}:{venv_bin}:{os.environ.get('PATH', '/usr/bin:/bin')}",
        RUNNER_TEMP=str(runner_temp),
        XDG_CACHE_HOME=str(tmp_path / "cache"),  # the job sets its own; never the user's
        CI="true",
    )
    values = {
        "runner.temp": str(runner_temp),
        "github.workspace": str(REPO),
        "github.repository_owner": OWNER,
        "secrets.GPUENV_ATTEST_KEY": "",  # no signing key here: the push attests nothing
        "vars.GPUENV_ATTEST_PUBLIC_KEY": "",  # nor a key to vet pulls with: the cell is built
    }
    log: list[str] = []

    outputs = run_job(jobs["cells"], workflow_env, values, tmp_path, base_env, log)
    cells = json.loads(outputs["cells"]["cells"])
    assert CPU_CELL in cells, cells
    values["matrix.cell"] = CPU_CELL
    run_job(jobs["build"], workflow_env, values, tmp_path, base_env, log)
    print("\n".join(log))

    # What the steps left: the base saved for the cache, the JUnit results, the image
    # validated and pushed to <registry>/<owner, lowercased>/tensorflow.
    assert list((runner_temp / "bases").glob("*.tar"))
    junit = ET.parse(runner_temp / "results" / f"{CPU_CELL}.xml").getroot()
    suites = [junit] if junit.tag == "testsuite" else list(junit)
    assert sum(int(s.get("tests", 0)) for s in suites) > 0
    assert sum(int(s.get("failures", 0)) + int(s.get("errors", 0)) for s in suites) == 0
    # The job puts gpuenv's cache under $RUNNER_TEMP; its cache step saves the wheelhouse
    # exactly where gpuenv keeps it.
    # (its first step sets XDG_CACHE_HOME there through $GITHUB_ENV)
    cache_home = runner_temp / "xdg-cache"
    records = json.loads((cache_home / "gpuenv" / "validated.json").read_text())
    assert records[cpu_built["Id"]] is True
    caches = [st["with"]["path"] for st in jobs["build"]["steps"]
              if st.get("uses", "").startswith("actions/cache")]  # fmt: skip
    saved = [path for path in caches if "wheelhouse" in path]
    probe = "from gpuenv.store import wheelhouse; print(wheelhouse.Store.default().root)"
    where = subprocess.run(
        [sys.executable, "-c", probe], env={**base_env, "XDG_CACHE_HOME": str(cache_home)},
        capture_output=True, text=True, check=True,
    ).stdout.strip()  # fmt: skip
    assert [x.replace("${{ runner.temp }}", str(runner_temp)) for x in saved] == [where]
    repository = f"{OWNER.lower()}/tensorflow"
    assert CPU_CELL in registry.tags(repository)
    pushed = loopback_refs()
    assert f"{registry.host}/{repository}:{CPU_CELL}" in pushed
    assert any(log_line.startswith("skipped (action): docker/login-action") for log_line in log)
    assert any(line.endswith("  Push") for line in log)
