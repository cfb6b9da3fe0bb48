"""The same benchmark workload in `gpuenv run` and in a host virtualenv: what the container
costs a training step.

    python benchmarks/bench_host.py [-i IMAGE] [--workload lstm] [--scale 0.1] [-n 3]
                                    [--venv DIR] [--json]

The host side is a virtualenv with the image's framework version (tensorflow-cpu==2.21.0 by
default, made in a temporary directory unless --venv names one that has it; pip honours
$PIP_CERT / the proxy as usual). Both sides run gpuenv's shipped workload file
(gpuenv/bench/workloads/) from the same scratch directory, interleaved (container, host,
host, container, ...) so drift hits both alike; each run reports its median ms/step (warm-up
excluded), and the ratio is median(container) / median(host), against the target 1.03x.
Exit status 0 always: this measures, it does not gate.
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
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
WORKLOADS = REPO / "gpuenv" / "bench" / "workloads"
DEFAULT_IMAGE = "gpuenv/tensorflow:tf2.21-py3.11-cpu"
TARGET = 1.03
SCRIPTS = {"lstm": ["lstm.py"], "cnn": ["cnn.py"], "matmul": ["matmul.py"]}


def gpuenv_argv() -> list[str]:
    script = Path(sys.executable).parent / "gpuenv"
    return [str(script)] if script.exists() else [sys.executable, "-m", "gpuenv"]


def ensure_venv(path: Path, requirement: str) -> Path:
    python = path / "bin" / "python"
    if python.exists():
        probe = subprocess.run(
            [str(python), "-c", "import tensorflow as tf; print(tf.__version__)"],
            capture_output=True,
            text=True,
        )
        if probe.returncode == 0:
            return python
    subprocess.run([sys.executable, "-m", "venv", str(path)], check=True)
    print(f"installing {requirement} into {path} (about 250 MB)", file=sys.stderr)
    subprocess.run([str(python), "-m", "pip", "install", "-q", requirement], check=True)
    return python


def measure(argv: list[str], cwd: str) -> dict:
    env = {**os.environ, "TF_CPP_MIN_LOG_LEVEL": "2"}
    proc = subprocess.run(argv, cwd=cwd, capture_output=True, text=True, env=env)
    lines = [ln for ln in proc.stdout.strip().splitlines() if ln.startswith("{")]
    if proc.returncode != 0 or not lines:
        raise SystemExit(
            f"error: {' '.join(argv)} exited {proc.returncode}: {proc.stderr.strip()[-800:]}"
        )
    return json.loads(lines[-1])


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("-i", "--image", default=DEFAULT_IMAGE)
    parser.add_argument("--workload", choices=sorted(SCRIPTS), default="lstm")
    parser.add_argument("--scale", type=float, default=0.1)
    parser.add_argument("-n", "--runs", type=int, default=3, help="runs of each side (3)")
    parser.add_argument("--venv", type=Path, help="host virtualenv to use (made if missing)")
    parser.add_argument("--requirement", default="tensorflow-cpu==2.21.0")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()

    venv_dir = args.venv or Path(tempfile.mkdtemp(prefix="gpuenv-host-venv-"))
    python = ensure_venv(venv_dir, args.requirement)
    results: dict[str, list[dict]] = {"container": [], "host": []}
    with tempfile.TemporaryDirectory(prefix="gpuenv-bench-host-") as cwd:
        os.chmod(cwd, 0o755)
        for src in WORKLOADS.glob("*.py"):
            shutil.copy2(src, Path(cwd) / src.name)
        workload = [*SCRIPTS[args.workload], "--device", "cpu", "--scale", f"{args.scale:g}"]
        container = [
            *gpuenv_argv(),
            "run",
            "-i",
            args.image,
            "--network",
            "none",
            "--",
            "python",
            *workload,
        ]
        host = [str(python), *workload]
        for i in range(args.runs):
            order = [("container", container), ("host", host)]
            for side, argv in order if i % 2 == 0 else reversed(order):
                doc = measure(argv, cwd)
                results[side].append(doc)
                print(
                    f"  run {i + 1} {side:<9} {doc['ms_per_step']:.2f} ms/step "
                    f"({doc['measured_steps']} steps; {doc['framework']}, "
                    f"Python {doc['python']})",
                    file=sys.stderr,
                )
    c = statistics.median(d["ms_per_step"] for d in results["container"])
    h = statistics.median(d["ms_per_step"] for d in results["host"])
    ratio = c / h
    verdict = "within" if ratio <= TARGET else "OVER"
    print(f"{args.workload} (scale {args.scale:g}), {args.runs} runs each, median ms/step:")
    print(f"  gpuenv run ({args.image})  {c:.2f}")
    print(f"  host venv ({args.requirement})  {h:.2f}")
    print(f"  ratio container/host {ratio:.3f}x: {verdict} the target {TARGET}x")
    if args.json:
        print(
            json.dumps(
                {
                    "container_ms": c,
                    "host_ms": h,
                    "ratio": round(ratio, 4),
                    "target": TARGET,
                    "runs": results,
                },
                indent=2,
            )
        )
    if args.venv is None:
        shutil.rmtree(venv_dir, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
