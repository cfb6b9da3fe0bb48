"""What `gpuenv run` costs over `docker run --rm`, and what `gpuenv --help` costs.

    python benchmarks/run.py [-i IMAGE] [-n 10] [--warmup 1] [--network none] [--json]

Runs, interleaved (A, B, A, B, ...) so that drift in the engine or the machine hits both
alike, from a scratch working directory (gpuenv mounts the current directory):

    gpuenv run -i IMAGE --network MODE python -c pass
    docker run --rm --network MODE IMAGE python -c pass

then `gpuenv --help` against a bare `python -c pass` of the same interpreter, and prints
each median, the difference and the ratio, against issue 4's targets (run adds at most
0.25 s; --help at most 0.3 s). Exit status 0 always: this measures, it does not gate.
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
from pathlib import Path

DEFAULT_IMAGE = "gpuenv/tensorflow:tf2.21-py3.11-cpu"
RUN_TARGET_S = 0.25
HELP_TARGET_S = 0.3


def gpuenv_argv() -> list[str]:
    script = Path(sys.executable).parent / "gpuenv"
    if script.exists():
        return [str(script)]
    found = shutil.which("gpuenv")
    return [found] if found else [sys.executable, "-m", "gpuenv"]


def timed(argv: list[str], cwd: str) -> float:
    start = time.perf_counter()
    proc = subprocess.run(argv, cwd=cwd, capture_output=True, stdin=subprocess.DEVNULL)
    elapsed = time.perf_counter() - start
    if proc.returncode != 0:
        raise SystemExit(
            f"error: {' '.join(argv)} exited {proc.returncode}: "
            f"{proc.stderr.decode(errors='replace').strip()[-500:]}"
        )
    return elapsed


def compare(a: list[str], b: list[str], n: int, warmup: int, cwd: str) -> tuple[list, list]:
    for _ in range(warmup):
        timed(a, cwd)
        timed(b, cwd)
    ta, tb = [], []
    for i in range(n):
        # Alternate which goes first, so neither always runs on a just-warmed engine.
        first, second = (a, b) if i % 2 == 0 else (b, a)
        t1, t2 = timed(first, cwd), timed(second, cwd)
        ta.append(t1 if first is a else t2)
        tb.append(t2 if first is a else t1)
    return ta, tb


def report(name_a: str, ta: list[float], name_b: str, tb: list[float], target: float) -> dict:
    ma, mb = statistics.median(ta), statistics.median(tb)
    row = {
        name_a: round(ma, 4),
        name_b: round(mb, 4),
        "difference_s": round(ma - mb, 4),
        "ratio": round(ma / mb, 3) if mb else None,
        "target_s": target,
        "runs": len(ta),
    }
    width = max(len(name_a), len(name_b))
    print(f"  {name_a:<{width}}  median {ma:.3f} s  (min {min(ta):.3f}, max {max(ta):.3f})")
    print(f"  {name_b:<{width}}  median {mb:.3f} s  (min {min(tb):.3f}, max {max(tb):.3f})")
    print(f"  difference {ma - mb:+.3f} s, ratio {ma / mb:.2f}x")
    return row


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("-i", "--image", default=DEFAULT_IMAGE)
    parser.add_argument("-n", "--runs", type=int, default=10, help="timed runs of each (10)")
    parser.add_argument("--warmup", type=int, default=1, help="untimed runs of each first (1)")
    parser.add_argument("--network", default="none", help="network mode for both (none)")
    parser.add_argument("--json", action="store_true", help="also print the results as JSON")
    args = parser.parse_args()
    if args.runs < 1:
        parser.error("--runs must be at least 1")

    gpuenv = gpuenv_argv()
    docker = shutil.which("docker")
    if docker is None:
        raise SystemExit("error: no docker client on PATH")
    results = {}
    with tempfile.TemporaryDirectory(prefix="gpuenv-bench-") as cwd:
        os.chmod(cwd, 0o755)
        cmd = ["python", "-c", "pass"]
        run_a = [*gpuenv, "run", "-i", args.image, "--network", args.network, "--", *cmd]
        run_b = [docker, "run", "--rm", "--network", args.network, args.image, *cmd]
        print(f"run: {args.image}, python -c pass, {args.runs} interleaved runs each")
        ta, tb = compare(run_a, run_b, args.runs, args.warmup, cwd)
        results["run"] = report("gpuenv run", ta, "docker run --rm", tb, RUN_TARGET_S)
        verdict = "within" if results["run"]["difference_s"] <= RUN_TARGET_S else "OVER"
        print(f"  {verdict} the target: gpuenv run adds at most {RUN_TARGET_S} s\n")

        help_a = [*gpuenv, "--help"]
        help_b = [sys.executable, "-c", "pass"]
        print(f"startup: {args.runs} interleaved runs each")
        ta, tb = compare(help_a, help_b, args.runs, args.warmup, cwd)
        results["help"] = report("gpuenv --help", ta, "python -c pass", tb, HELP_TARGET_S)
        verdict = "within" if results["help"]["gpuenv --help"] <= HELP_TARGET_S else "OVER"
        print(f"  {verdict} the target: gpuenv --help takes at most {HELP_TARGET_S} s")
    if args.json:
        print(json.dumps(results, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
