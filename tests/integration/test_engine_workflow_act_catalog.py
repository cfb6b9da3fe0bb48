"""The catalog workflow (.github/workflows/catalog.yml) run by nektos/act, as the image
workflow is (test_engine_workflow_act.py: a self-hosted root runner on this machine, the
marketplace actions' stand-ins from tests/integration/actions/, offline for actions), with
PyPI reached for real (through this machine's proxy: $PIP_CERT, in the environment act's
steps inherit). No engine work: act starts no container and nothing is built.

The workspace is a copy of this checkout whose catalog lacks PyTorch's newest release (as
last week's would), so the refresh has something to add whatever PyPI published since.
Its unit-test step runs the catalog's own tests (tests/unit/test_catalog.py: the loopback
refresh of the fixtures the same refresh recorded, the walk over every row) rather than the
whole unit suite. The pull request the workflow would open is recorded by the stand-in for
peter-evans/create-pull-request: the diff of its add-paths, its title and body.
"""

from __future__ import annotations

import datetime
import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml
from support.cli import clean_env
from test_engine_workflow_act import ACTIONS, STAND_INS, _act, _copy_checkout, _git

pytestmark = [pytest.mark.engine]

CREATE_PR = {"peter-evans/create-pull-request@v7": "create-pull-request"}
NEWEST_TORCH = "2.15"  # the packaged catalog's newest PyTorch minor, dropped from the copy
ACT_TIMEOUT = 600


def _payload() -> dict[str, object]:
    owner = "Gpuenv-Test-Owner"
    return {"repository": {"name": "gpuenv", "full_name": f"{owner}/gpuenv",
                           "default_branch": "main", "owner": {"login": owner}}}  # fmt: skip


def _workspace(root: Path) -> Path:
    """A copy of this checkout: the catalog without PyTorch's newest minor, tests/unit
    holding the catalog's tests alone, committed."""
    from gpuenv.catalog import refresh

    workspace = root / "repo"
    workspace.mkdir()
    _copy_checkout(workspace)
    torch_file = workspace / "gpuenv" / "data" / "torch.yaml"
    torch = yaml.safe_load(torch_file.read_text())
    assert torch["releases"][0]["minor"] == NEWEST_TORCH
    torch["releases"] = torch["releases"][1:]
    torch_file.write_text(refresh.dump(torch))
    unit = workspace / "tests" / "unit"
    keep = {"conftest.py", "rendering.py", "test_catalog.py", "fixtures"}
    for path in unit.iterdir():
        if path.name not in keep:
            shutil.rmtree(path) if path.is_dir() else path.unlink()
    _git(workspace, "init", "-q", "-b", "main")
    _git(workspace, "add", "-A")
    _git(workspace, "commit", "-q", "-m", "last week's catalog")
    return workspace


def test_the_catalog_workflow_refreshes_from_pypi_and_records_its_pull_request(tmp_path):
    import sysconfig

    workspace = _workspace(tmp_path)
    home, pulls = tmp_path / "home", tmp_path / "pulls"
    home.mkdir()
    event = home / "workflow_dispatch.json"
    event.write_text(json.dumps(_payload()))
    argv = [_act(), "workflow_dispatch", "-e", str(event), "-W", ".github/workflows/catalog.yml",
            "-P", "ubuntu-24.04=-self-hosted", "--action-offline-mode", "--use-gitignore=false",
            "--env", f"ACT_PYTHON_SITE={sysconfig.get_path('purelib')}",
            "--env", f"ACT_PULL_REQUESTS={pulls}"]  # fmt: skip
    for action, folder in {**STAND_INS, **CREATE_PR}.items():
        argv += ["--local-repository", f"{action}={ACTIONS / folder}"]
    venv_bin = str(Path(sys.executable).parent)
    env = clean_env(HOME=str(home), XDG_CACHE_HOME=str(home / "cache"))
    env.pop("VIRTUAL_ENV", None)
    env["PATH"] = os.pathsep.join(p for p in env.get("PATH", "").split(os.pathsep) if p != venv_bin)
    start = time.monotonic()
    proc = subprocess.run(argv, cwd=workspace, env=env, capture_output=True, text=True,
                          timeout=ACT_TIMEOUT)  # fmt: skip
    log = proc.stdout + proc.stderr
    (home / "act.log").write_text(log)
    print(f"act workflow_dispatch (catalog.yml): {time.monotonic() - start:.1f} s")
    tail = log[-6000:]
    assert proc.returncode == 0, tail
    assert "[catalog/Refresh the catalog] 🏁  Job succeeded" in log, tail

    # The pull request it would open: the catalog's files and fixtures, nothing else.
    pr = pulls / "catalog-refresh"
    assert (pr / "branch").read_text().strip() == "catalog/refresh", tail
    assert (pr / "title").read_text().strip() == "Catalog: new framework releases from PyPI"
    diff = (pr / "changes.diff").read_text()
    changed = {line.split(" b/", 1)[1] for line in diff.splitlines()
               if line.startswith("diff --git ")}  # fmt: skip
    assert "gpuenv/data/torch.yaml" in changed, sorted(changed)
    assert all(p.startswith(("gpuenv/data/", "tests/unit/fixtures/catalog/")) for p in changed)
    assert f"+- minor: '{NEWEST_TORCH}'" in diff
    # The body carries the refresh's own lines (the step's output) and the tests' outcome.
    body = (pr / "body.md").read_text()
    assert f"torch: + {NEWEST_TORCH} (" in body, body
    tests = "failure" if "❌  Failure - Main Unit tests against the new data" in log else "success"
    assert f"Unit tests against the new data: **{tests}**" in body, body
    print("   the pull request's files:", ", ".join(sorted(changed)))
    print("   its body:", " | ".join(line for line in body.splitlines() if "gpuenv:" in line))

    # The refreshed files, as the pull request would leave them: one refresh date (today),
    # and gpuenv's own loader takes them as a catalog whose every GPU row pins.
    subprocess.run(["git", "apply", str(pr / "changes.diff")], cwd=workspace, check=True)
    from gpuenv.catalog import compat, freshness

    documents = {name: yaml.safe_load((workspace / "gpuenv" / "data" / name).read_text())
                 for name in freshness.GENERATED}  # fmt: skip
    assert freshness.refreshed_of(documents) == datetime.datetime.now(datetime.UTC).date()
    assert freshness.problem({"format": 1, "documents": documents},
                             compat.check_documents) is None  # fmt: skip
    minors = [r["minor"] for r in documents["torch.yaml"]["releases"]]
    assert NEWEST_TORCH in minors
