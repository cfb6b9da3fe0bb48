#!/usr/bin/env python3
"""A cell built on a remote engine over a slow link, against the same builds on the local engine.

    .venv/bin/python benchmarks/engines.py [--cell CELL] [--rate 50mbit] [-f MATRIX]

The remote engine is a dockerd in a network namespace, reached over a veth pair with TLS
(tests/integration/support/netns_engine.py, the remote-engine tests' harness); the link
towards it (what a build sends) is limited with a token bucket (`tc qdisc ... tbf rate
RATE`: this kernel has no sch_netem, so the link has the rate but no added delay). Four
builds of the cell, from a copy of the matrix renamed gpuenv-bench/engines so the matrix's
own images are untouched, with one wheelhouse (filled first, so no figure includes PyPI):

- local cold: `gpuenv build CELL --no-cache` on the local engine;
- local warm: the image removed, built again (the engine's build cache kept);
- remote cold: the first build on the fresh remote engine (every wheel crosses the link);
- remote warm: the image removed there, built again (BuildKit sends only what changed).

Prints seconds and each against local cold. Needs root (a namespace, tc).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "tests" / "integration"))

from support.netns_engine import remote_engine  # noqa: E402
from support.private_engine import load_image  # noqa: E402

NAME = "gpuenv-bench/engines"


def gpuenv(*args: str, cwd: Path, env: dict[str, str]) -> tuple[float, dict]:
    start = time.monotonic()
    proc = subprocess.run([str(REPO / ".venv/bin/gpuenv"), *args, "--json"], cwd=cwd, env=env,
                          capture_output=True, text=True, check=False)  # fmt: skip
    seconds = time.monotonic() - start
    if proc.returncode != 0:
        sys.exit(f"gpuenv {' '.join(args)}: exit {proc.returncode}\n{proc.stderr[-3000:]}")
    result = json.loads(proc.stdout)["results"][0]
    if result["status"] != "built":
        sys.exit(f"expected a build, got {result}")
    return seconds, result


def docker(*args: str, env: dict[str, str]) -> None:
    subprocess.run(["docker", *args], env=env, capture_output=True, check=False)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cell", default="tf2.21-py3.11-cpu")
    parser.add_argument("--rate", default="50mbit")
    parser.add_argument("-f", "--file", type=Path, default=REPO / "matrix.yaml")
    args = parser.parse_args()
    work = Path(tempfile.mkdtemp(prefix="gpuenv-bench-engines-"))
    text = args.file.read_text()
    name_line = next(line for line in text.splitlines() if line.startswith("name:"))
    (work / "matrix.yaml").write_text(text.replace(name_line, f"name: {NAME}"))
    env = {**os.environ, "XDG_CACHE_HOME": str(work / "cache")}
    image = f"{NAME}:{args.cell}"
    rows: list[tuple[str, float, dict]] = []
    try:
        subprocess.run([str(REPO / ".venv/bin/gpuenv"), "base", args.cell], cwd=work, env=env,
                       check=True, capture_output=True)  # fmt: skip
        gpuenv("build", args.cell, cwd=work, env=env)  # fills the wheelhouse
        docker("rmi", image, env=env)
        rows.append(("local cold (--no-cache)", *gpuenv("build", args.cell, "--no-cache",
                                                         cwd=work, env=env)))  # fmt: skip
        docker("rmi", image, env=env)
        rows.append(("local warm (image removed)", *gpuenv("build", args.cell, cwd=work, env=env)))
        docker("rmi", image, env=env)
        base = json.loads(subprocess.run(["docker", "image", "inspect", "gpuenv/debian:bookworm"],
                                         capture_output=True, text=True).stdout)[0]  # fmt: skip
        with remote_engine() as remote:
            load_image(remote.sock, base["RepoTags"][0])
            limit = ["tbf", "rate", args.rate, "burst", "64kb", "latency", "400ms"]
            subprocess.run(["tc", "qdisc", "add", "dev", remote.host_if, "root", *limit],
                           check=True)  # fmt: skip
            renv = {**env, **remote.env()}
            rows.append((f"remote cold ({args.rate})",
                         *gpuenv("build", args.cell, cwd=work, env=renv)))  # fmt: skip
            remote.docker("rmi", image, check=False)
            rows.append((f"remote warm ({args.rate}, image removed)",
                         *gpuenv("build", args.cell, cwd=work, env=renv)))  # fmt: skip
    finally:
        shutil.rmtree(work, ignore_errors=True)
    reference = rows[0][1]
    print(f"{args.cell}: {rows[0][2]['size'] / 1e6:.0f} MB image")
    for label, seconds, _ in rows:
        print(f"  {label:<40} {seconds:7.1f} s  {seconds / reference:5.2f}x local cold")


if __name__ == "__main__":
    main()
