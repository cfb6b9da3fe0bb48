#!/usr/bin/env python3
"""A cell's first build on an engine on another host over a slow link, against a local cold build.

    sudo .venv/bin/python benchmarks/engines.py [--cell CELL] [--repeat N] [-f MATRIX]

The remote engine is tests/integration/support/another_host.py's lab: a dockerd in its own
network and mount namespaces (the project, gpuenv's cache and HOME hidden from it), reached
over TCP+TLS across a veth shaped to 50 Mbit/s both ways (`tc ... tbf`; this kernel has no
netem: a rate, no added delay), with a PEP 503 mirror on the lab's own loopback that its
host-network containers reach without the slow link (GPUENV_NEAR_INDEX names it, as a user
names a devpi or Artifactory near the GPU box). The mirror holds the cell's wheels.

The cell, from a copy of the matrix renamed gpuenv-bench/engines, is locked first (so both
engines install one resolution) and built once locally with the wheels sent
(GPUENV_NEAR_FETCH=client), which fills the wheelhouse and gives the mirror its files. Then,
--repeat times, alternating:

- local cold: `gpuenv build CELL --no-cache` on the local engine, as a user gets it (the
  probe decides: on this machine its host fetches from PyPI through the site's proxy, the CA
  bundle given to the step as a BuildKit secret);
- local cold, wheels sent: the same with GPUENV_NEAR_FETCH=client (the wheelhouse warm);
- remote first: the first build on a fresh lab (its probe included): the engine's host
  fetches the public wheels from the mirror; uv and the context cross the link;
- remote first, wheels sent: the same with GPUENV_NEAR_FETCH=client (every wheel crosses).

With --same-id, then the same lock built with --reproducible on both engines and the image
IDs compared (slow on the lab: the rewrite saves the image across the link and loads it back,
2 x 2.26 GB at 50 Mbit/s; tests/integration/test_engine_near_fetch.py shows it with the
smaller JAX cell). Prints medians, each against local cold, the bytes that crossed towards
the engine (the veth's counters), and the load average. Needs root (namespaces, tc, sshd).
Run it under the engine-tests flock.
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

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "tests" / "integration"))

from support.another_host import AnotherHost, another_host  # noqa: E402

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


def tx_bytes(interface: str) -> int:
    """Bytes the client's end of the link has sent (towards the engine)."""
    return int(Path(f"/sys/class/net/{interface}/statistics/tx_bytes").read_text())


def remote(project: Path, cache: Path, wheels: Path, env: dict[str, str], cell: str,
           mode: str, *extra: str) -> tuple[float, int, dict]:  # fmt: skip
    """One first build on a fresh lab: (seconds, bytes sent across the link, result)."""
    lab: AnotherHost
    with another_host(project, hide=[cache], wheels=wheels) as lab:
        renv = {**env, **lab.env("tls"), "GPUENV_NEAR_FETCH": mode,
                "GPUENV_NEAR_INDEX": lab.mirror_url}  # fmt: skip
        before = tx_bytes(lab.host_if)
        seconds, result = gpuenv("build", cell, *extra, cwd=project, env=renv)
        return seconds, tx_bytes(lab.host_if) - before, result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cell", default="tf2.21-py3.11-cpu")
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--same-id", action="store_true", help="also compare --reproducible IDs")
    parser.add_argument("-f", "--file", type=Path, default=REPO / "matrix.yaml")
    args = parser.parse_args()
    work = Path(tempfile.mkdtemp(prefix="gpuenv-bench-engines-"))
    project, cache = work / "project", work / "cache"
    project.mkdir()
    text = args.file.read_text()
    name_line = next(line for line in text.splitlines() if line.startswith("name:"))
    (project / "matrix.yaml").write_text(text.replace(name_line, f"name: {NAME}"))
    env = {k: v for k, v in os.environ.items() if not k.startswith("GPUENV_")}
    env["XDG_CACHE_HOME"] = str(cache)
    image = f"{NAME}:{args.cell}"
    times: dict[str, list[float]] = {}
    crossed: dict[str, list[int]] = {}
    loads = [os.getloadavg()[0]]
    try:
        subprocess.run([str(REPO / ".venv/bin/gpuenv"), "lock", args.cell], cwd=project,
                       env=env, check=True, capture_output=True)  # fmt: skip
        subprocess.run([str(REPO / ".venv/bin/gpuenv"), "base", args.cell], cwd=project,
                       env=env, check=True, capture_output=True)  # fmt: skip
        sent = {**env, "GPUENV_NEAR_FETCH": "client"}
        gpuenv("build", args.cell, cwd=project, env=sent)  # the wheelhouse, the mirror's files
        # Every install step's part holds wheels: python-env/, and cuda/ in a GPU cell.
        context = next((cache / "gpuenv" / "contexts").glob(f"*/{args.cell}"))
        wheels = work / "wheels"
        wheels.mkdir()
        for wheel in context.glob("*/*.whl"):
            if not (wheels / wheel.name).exists():
                os.link(wheel, wheels / wheel.name)
        size = sum(p.stat().st_size for p in wheels.glob("*.whl"))
        print(f"{args.cell}: {len(list(wheels.glob('*.whl')))} wheels, {size / 1e6:.0f} MB")
        for i in range(args.repeat):
            for label, run_env in (("local cold", env), ("local cold, wheels sent", sent)):
                subprocess.run(["docker", "rmi", image], env=env, capture_output=True, check=False)
                seconds, _ = gpuenv("build", args.cell, "--no-cache", cwd=project, env=run_env)
                times.setdefault(label, []).append(seconds)
                print(f"    {label}: {seconds:.1f} s", flush=True)  # kept if a later leg fails
            for label, mode in (("remote first (50 Mbit/s)", "auto"),
                                ("remote first, wheels sent (50 Mbit/s)", "client")):  # fmt: skip
                seconds, nbytes, _ = remote(project, cache, wheels, env, args.cell, mode)
                times.setdefault(label, []).append(seconds)
                crossed.setdefault(label, []).append(nbytes)
                print(f"    {label}: {seconds:.1f} s, {nbytes / 1e6:.1f} MB crossed", flush=True)
            loads.append(os.getloadavg()[0])
            print(f"  round {i + 1}: " + ", ".join(f"{k} {v[-1]:.1f} s" for k, v in times.items()),
                  flush=True)  # fmt: skip
        if args.same_id:
            _, here = gpuenv("build", args.cell, "--no-cache", "--reproducible", cwd=project,
                             env=env)  # fmt: skip
            _, _, there = remote(project, cache, wheels, env, args.cell, "auto", "--reproducible")
    finally:
        subprocess.run(["docker", "rmi", image], env=env, capture_output=True, check=False)
        shutil.rmtree(work, ignore_errors=True)
    reference = statistics.median(times["local cold"])
    load = f"load average {min(loads):.1f}-{max(loads):.1f}"
    print(f"\n{args.cell}, medians of {args.repeat} ({load})")
    for label, values in times.items():
        value = statistics.median(values)
        link = crossed.get(label)
        sent_mb = f"  {statistics.median(link) / 1e6:7.1f} MB crossed" if link else ""
        runs = ", ".join(f"{v:.1f}" for v in values)
        print(f"  {label:<42} {value:7.1f} s  {value / reference:5.2f}x  [{runs}]{sent_mb}")
    if args.same_id:
        ids = here["image_id"], there["image_id"]
        same = "same" if ids[0] == ids[1] else "DIFFERENT"
        print(f"  --reproducible: local {ids[0][:19]}, remote {ids[1][:19]}: {same}")


if __name__ == "__main__":
    main()
