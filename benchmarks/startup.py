#!/usr/bin/env python3
"""What gpuenv's start-up costs (issue 29's targets: what a user notices), against
references timed in the same run, interleaved (A, B, A, B, ...; the order alternates) so
drift hits both alike:

    .venv/bin/python benchmarks/startup.py [-n 10] [-f MATRIX] [--cell CELL] [--json]

1. `gpuenv --help` against `python -c pass` (the same interpreter). Target: <= 0.3 s.
2. A no-op `gpuenv build` of the matrix's built cells (every one up to date; the others are
   named and left out: building them is benchmarks/build.py's business) against a warm
   BuildKit `docker build` of the same contexts (as gpuenv's build sends them, assembled by
   gpuenv into its cache: benchmarks/build.py), every step a cache hit. Targets: <= 0.5 s
   and no slower than the warm `docker build` (<= 1x).
3. The no-op's cache: the same no-op build planned from the resolved-matrix snapshot
   (gpuenv/project/snapshot.py, as in 2), and on a miss that writes one (a fresh cache directory
   each run).
4. `gpuenv run -i CELL -f MATRIX --network none -- python -c pass` against `docker run --rm
   --network none IMAGE python -c pass`, from a scratch directory (gpuenv mounts the
   current one). Target: gpuenv adds <= 0.15 s (medians; issue 48, as benchmarks/run.py).

Exit status 0 always: this measures, it does not gate. Nothing is built or removed, except
the untagged images the warm `docker build` runs leave (the cache's own, already there).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

from build import docker_build  # benchmarks/build.py: the BuildKit build gpuenv runs

REPO = Path(__file__).resolve().parents[1]
HELP_TARGET_S = 0.3
NOOP_TARGET_S, NOOP_TARGET_X = 0.5, 1.0
RUN_TARGET_S = 0.15  # issue 48 (it was 0.25: issue 4)
# Timed as an installed gpuenv runs: with its bytecode cached (pip compiles it at install
# time). PYTHONDONTWRITEBYTECODE=1 would recompile every module on every run (~35 ms);
# --no-bytecode keeps the environment's setting instead.
DOCKER_ENV = dict(os.environ)

Step = Callable[[], None]


def gpuenv(*args: str) -> list[str]:
    script = Path(sys.executable).parent / "gpuenv"
    head = [str(script)] if script.exists() else [sys.executable, "-m", "gpuenv"]
    return [*head, *args]


def sh(argv: list[str], *, cwd: str | None = None, env: dict[str, str] | None = None) -> str:
    proc = subprocess.run(argv, cwd=cwd, env=env or DOCKER_ENV, capture_output=True, text=True,
                          stdin=subprocess.DEVNULL)  # fmt: skip
    if proc.returncode != 0:
        raise SystemExit(f"benchmark: {' '.join(argv[:6])} exited {proc.returncode}: "
                         f"{proc.stderr.strip()[-800:]}")  # fmt: skip
    return proc.stdout


def command(argv: list[str], cwd: str | None = None, env: dict[str, str] | None = None) -> Step:
    return lambda: sh(argv, cwd=cwd, env=env) and None


def timed(step: Step) -> float:
    start = time.perf_counter()
    step()
    return time.perf_counter() - start


def interleave(steps: dict[str, Step], runs: int, warmup: int) -> dict[str, list[float]]:
    names = list(steps)
    for _ in range(warmup):
        for name in names:
            steps[name]()
    times: dict[str, list[float]] = {n: [] for n in names}
    for i in range(runs):
        order = names if i % 2 == 0 else names[::-1]
        for name in order:
            times[name].append(timed(steps[name]))
    return times


def show(times: dict[str, list[float]]) -> dict[str, float]:
    width = max(len(n) for n in times)
    medians = {}
    for name, values in times.items():
        m = statistics.median(values)
        medians[name] = round(m, 4)
        print(f"  {name:<{width}}  median {m:.3f} s  (min {min(values):.3f}, "
              f"max {max(values):.3f}, n={len(values)})")  # fmt: skip
    return medians


def verdict(ok: bool) -> str:
    return "ok" if ok else "MISSED"


def up_to_date_cells(matrix: Path) -> tuple[list[str], list[str]]:
    plan = json.loads(sh(gpuenv("build", "-f", str(matrix), "--dry-run", "--json")))
    done = [c["cell"] for c in plan["cells"] if c["action"] == "up-to-date"]
    other = [c["cell"] for c in plan["cells"] if c["action"] != "up-to-date"]
    return done, other


def assembled(matrix: Path, names: list[str]) -> dict[str, Path]:
    """The cells' contexts as gpuenv's build sends them (gpuenv/building/sendable.py: Sender), kept
    in gpuenv's cache once assembled."""
    from gpuenv.building import plan, sendable
    from gpuenv.engine import client as engine
    from gpuenv.project.project import open_project

    project = open_project(matrix)
    cells = project.select(names)
    docker, ca = engine.connect(), project.ca_bundle(None)
    the_plan = plan.make_plan(docker, project, cells)
    sender = sendable.Sender(docker, project, the_plan.cells, ca, offline=True)
    out = {}
    for p in the_plan.cells:
        with sender.context(p, {}) as build:
            out[p.cell.name] = build.directory
    return out


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("-n", "--runs", type=int, default=10, help="timed runs of each (10)")
    parser.add_argument("--warmup", type=int, default=1, help="untimed runs of each first (1)")
    parser.add_argument("-f", "--file", type=Path, default=REPO / "matrix.yaml")
    parser.add_argument("--cell", default="tf2.21-py3.11-cpu", help="the cell `run` uses")
    parser.add_argument("--json", action="store_true", help="also print the results as JSON")
    parser.add_argument("--no-bytecode", action="store_true",
                        help="keep PYTHONDONTWRITEBYTECODE as the environment sets it")  # fmt: skip
    args = parser.parse_args()
    if not args.no_bytecode:
        DOCKER_ENV.pop("PYTHONDONTWRITEBYTECODE", None)
    print(f"bytecode cache: {'as the environment says' if args.no_bytecode else 'on'}")
    matrix = args.file.resolve()
    results: dict[str, dict[str, float | bool | list[str]]] = {}

    print(f"--help: {args.runs} interleaved runs each")
    times = interleave({"gpuenv --help": command(gpuenv("--help")),
                        "python -c pass": command([sys.executable, "-c", "pass"])},
                       args.runs, args.warmup)  # fmt: skip
    med = show(times)
    ok = med["gpuenv --help"] <= HELP_TARGET_S
    print(f"  target: --help <= {HELP_TARGET_S} s: {verdict(ok)}\n")
    results["help"] = {**med, "target_s": HELP_TARGET_S, "ok": ok}

    cells, left_out = up_to_date_cells(matrix)
    if not cells:
        raise SystemExit(f"benchmark: no cell of {matrix} is built; gpuenv build -f {matrix}")
    print(f"no-op build: {len(cells)} up-to-date cells ({', '.join(cells)})"
          + (f"; not built here, left out: {', '.join(left_out)}" if left_out else ""))  # fmt: skip
    with tempfile.TemporaryDirectory(prefix="gpuenv-startup-") as tmp:
        contexts = assembled(matrix, cells)

        def docker_builds() -> None:
            for name in cells:
                docker_build(contexts[name], no_cache=False, env=DOCKER_ENV)

        noop = gpuenv("build", "-f", str(matrix), *cells)
        steps = {"gpuenv build (no-op)": command(noop), "warm docker build": docker_builds}
        times = interleave(steps, args.runs, args.warmup)
        med = show(times)
        ratio = med["gpuenv build (no-op)"] / med["warm docker build"]
        ok = med["gpuenv build (no-op)"] <= NOOP_TARGET_S and ratio <= NOOP_TARGET_X
        print(f"  ratio {ratio:.3f}x; targets <= {NOOP_TARGET_S} s and <= {NOOP_TARGET_X}x: "
              f"{verdict(ok)}\n")  # fmt: skip
        results["noop_build"] = {**med, "ratio": round(ratio, 3), "cells": cells, "ok": ok}

        print("cache: the same no-op build planned from the snapshot, and on a miss")
        counter = iter(range(1_000_000))

        def miss() -> None:
            fresh = Path(tmp) / f"cache-{next(counter)}"
            sh(noop, env={**DOCKER_ENV, "XDG_CACHE_HOME": str(fresh)})

        times = interleave({
            "planned (snapshot hit)": command(noop),
            "miss (writes one)": miss,
        }, args.runs, args.warmup)  # fmt: skip
        med = show(times)
        saved = med["miss (writes one)"] - med["planned (snapshot hit)"]
        print(f"  the snapshot saves {saved:.3f} s\n")
        results["caches"] = {**med, "snapshot_saves_s": round(saved, 4)}

        image = json.loads(sh(gpuenv("matrix", "-f", str(matrix), "--json")))
        ref = next(c["image"] for c in image["cells"] if c["name"] == args.cell)
        scratch = Path(tmp) / "cwd"
        scratch.mkdir()
        os.chmod(scratch, 0o755)
        print(f"run: {args.cell} ({ref}), python -c pass, {args.runs} interleaved runs each")
        docker = shutil.which("docker") or "docker"
        times = interleave({
            "gpuenv run": command(gpuenv("run", "-i", args.cell, "-f", str(matrix), "--network",
                                         "none", "--", "python", "-c", "pass"), cwd=str(scratch)),
            "docker run --rm": command([docker, "run", "--rm", "--network", "none", ref,
                                        "python", "-c", "pass"], cwd=str(scratch)),
        }, args.runs, args.warmup)  # fmt: skip
        med = show(times)
        added = med["gpuenv run"] - med["docker run --rm"]
        ok = added <= RUN_TARGET_S
        print(f"  gpuenv run adds {added:+.3f} s; target <= {RUN_TARGET_S} s: {verdict(ok)}")
        results["run"] = {**med, "added_s": round(added, 4), "ok": ok}
    if args.json:
        print(json.dumps(results, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
