"""Running the gpuenv CLI as a user would: a subprocess of the installed entry point.

One rule for which program that is (the ``gpuenv`` script next to the interpreter running
pytest, else ``python -m gpuenv``), one way to run it, and one failure message that shows
what the command printed."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

from support.cells import BUILD_TIMEOUT, REPO, SHIPPED_MATRIX

Proc = subprocess.CompletedProcess[str]


def gpuenv_argv() -> list[str]:
    """The installed CLI next to the interpreter running pytest, else `python -m gpuenv`."""
    script = Path(sys.executable).parent / "gpuenv"
    return [str(script)] if script.exists() else [sys.executable, "-m", "gpuenv"]


GPUENV = gpuenv_argv()


def clean_env(**extra: str) -> dict[str, str]:
    """This environment without GPUENV_* settings (a developer's own must not leak in).
    Builds send every wheel from the wheelhouse (GPUENV_NEAR_FETCH=client), the path the
    offline, CA, private-index and engine-lab tests check; test_engine_near_fetch.py asks
    for the probe's decision (auto) itself."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("GPUENV_")}
    env["GPUENV_NEAR_FETCH"] = "client"
    env["GPUENV_CATALOG_MAX_AGE"] = "off"  # the suite passes on any day: no staleness line
    env.update(extra)
    return env


def output(proc: subprocess.CompletedProcess[Any]) -> str:
    """Exit status and the tails of both streams, for assertion messages."""
    out, err = str(proc.stdout or "")[-4000:], str(proc.stderr or "")[-4000:]
    return f"exit {proc.returncode}\n--- stdout\n{out}\n--- stderr\n{err}"


def run(argv: list[str], *, check: bool = True, timeout: float = 600, **kw: Any) -> Proc:
    """subprocess.run with text output; check=True fails the test with what it printed."""
    proc = subprocess.run(argv, capture_output=True, text=True, timeout=timeout, **kw)
    if check and proc.returncode != 0:
        raise AssertionError(f"{' '.join(argv)}: {output(proc)}")
    return proc


def gpuenv_cmd(
    *args: str,
    check: bool = True,
    timeout: float = BUILD_TIMEOUT,
    host: str | None = None,
    env: dict[str, str] | None = None,
    cwd: Path = REPO,
) -> Proc:
    """`gpuenv ARGS...` from the repository root; host sets DOCKER_HOST, env replaces the
    environment (default: this one)."""
    full = dict(os.environ if env is None else env)
    if host is not None:
        full["DOCKER_HOST"] = host
    return run([*GPUENV, *args], check=check, timeout=timeout, cwd=cwd, env=full)


def build_json(proc: Proc) -> dict[str, dict[str, Any]]:
    """`gpuenv build --json`'s results, by cell name."""
    return {r["cell"]: r for r in json.loads(proc.stdout)["results"]}


def build_cells(*cells: str, matrix: Path = SHIPPED_MATRIX) -> dict[str, dict[str, Any]]:
    """Build (or find up to date) cells of a matrix; their results, each built or cached."""
    results = build_json(gpuenv_cmd("build", "-f", str(matrix), *cells, "--json"))
    for cell in cells:
        assert results[cell]["status"] in ("built", "cached", "pulled"), results[cell]
    return results
