#!/usr/bin/env python3
"""What editing a cell's packages costs (issue 28): rebuild time and registry bytes.

    .venv/bin/python benchmarks/iteration.py [--tensorflow 2.21] [--python 3.11] [--keep]

1. A locked CPU+GPU pair (TensorFlow, `packages.pip: [six==1.17.0]`, repository
   gpuenv-bench/iteration) is built cold (`gpuenv build --no-cache`, one cell at a time) and
   pushed to a loopback registry of this run (Debian's docker-registry, its own storage).
   Then, one after the other, the matrix gets a small package added (tomli-w 1.1.0), bumped
   (1.2.0) and removed; after each edit: `gpuenv lock`, then `gpuenv build` of each cell
   (timed), `gpuenv build --dry-run` before it (what it says the edit invalidates), a push of
   each cell, and the bytes the registry's storage grew by for that cell. Ratios are each
   rebuild against that cell's cold build, measured in this run. Targets (issue 28): <= 0.15x
   and <= 20 MB per cell; image sizes within 1 % of the first build.
2. Every image of the shipped matrix that is in the engine (gpuenv/tensorflow:*; building
   the missing ones is `gpuenv build`, tens of GB) pushed to an empty registry: the bytes it
   stores against the sum of the images' sizes (layers shared between cells are stored once;
   the registry stores them compressed).

Images and registries this script made are removed at the end unless --keep is given.
"""

from __future__ import annotations

import argparse
import json
import shutil
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
REPOSITORY = "gpuenv-bench/iteration"
GPUENV = [sys.executable, "-m", "gpuenv"]
REGISTRY_CONFIG = """\
version: 0.1
log:
  level: warn
  accesslog:
    disabled: true
storage:
  filesystem:
    rootdirectory: {root}
http:
  addr: 127.0.0.1:{port}
"""
EDITS = [  # (what, the pip list after it)
    ("add tomli-w 1.1.0", ["six==1.17.0", "tomli-w==1.1.0"]),
    ("bump tomli-w to 1.2.0", ["six==1.17.0", "tomli-w==1.2.0"]),
    ("remove tomli-w", ["six==1.17.0"]),
]
MB = 1e6
EXCLUDE_NEWER = "2026-11-20"


def sh(args: list[str], *, cwd: Path | None = None) -> str:
    proc = subprocess.run(args, capture_output=True, text=True, cwd=cwd, check=False)
    if proc.returncode != 0:
        sys.exit(f"{' '.join(args)}: exit {proc.returncode}\n{proc.stdout}\n{proc.stderr}")
    return proc.stdout


def timed(args: list[str], cwd: Path) -> float:
    start = time.monotonic()
    sh(args, cwd=cwd)
    return time.monotonic() - start


def matrix_text(tensorflow: str, python: str, pip: list[str]) -> str:
    return json.dumps(
        {
            "name": REPOSITORY,
            "matrix": {"tensorflow": [tensorflow], "python": [python], "variant": ["cpu", "gpu"]},
            "bases": {python: {"debian": "bookworm" if python == "3.11" else "trixie"}},
            "packages": {"pip": pip, "apt": []},
        }
    )  # JSON is YAML


class Registry:
    """Debian's docker-registry on a free loopback port, storing under `root`."""

    def __init__(self, root: Path) -> None:
        binary = shutil.which("docker-registry") or shutil.which("registry")
        if binary is None:
            sys.exit("needs Debian's docker-registry (scripts/engine.sh installs it)")
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        self.root, self.host = root, f"127.0.0.1:{port}"
        root.mkdir(parents=True)
        config = root / "config.yml"
        config.write_text(REGISTRY_CONFIG.format(root=root / "storage", port=port))
        self.proc = subprocess.Popen(
            [binary, "serve", str(config)], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
        )
        deadline = time.monotonic() + 30
        while True:
            try:
                with urllib.request.urlopen(f"http://{self.host}/v2/", timeout=2):
                    break
            except OSError:
                if time.monotonic() > deadline or self.proc.poll() is not None:
                    sys.exit("docker-registry did not answer /v2/ within 30 s")
                time.sleep(0.1)

    def stored(self) -> int:
        """Bytes of the blobs the registry holds (what it received, each blob once)."""
        blobs = self.root / "storage" / "docker" / "registry" / "v2" / "blobs"
        return sum(f.stat().st_size for f in blobs.rglob("data")) if blobs.exists() else 0

    def stop(self) -> None:
        self.proc.terminate()
        self.proc.wait(timeout=30)


def image_size(ref: str) -> int:
    return int(sh(["docker", "image", "inspect", "-f", "{{.Size}}", ref]).strip())


def push_one(matrix: Path, cell: str, registry: Registry, tmp: Path) -> int:
    before = registry.stored()
    sh([*GPUENV, "push", "-f", str(matrix), cell, "--registry", f"{registry.host}/bench"], cwd=tmp)
    return registry.stored() - before


def iteration(tensorflow: str, python: str, tmp: Path) -> list[str]:
    matrix = tmp / "matrix.yaml"
    matrix.write_text(matrix_text(tensorflow, python, EDITS[-1][1]))
    doc = json.loads(sh([*GPUENV, "matrix", "-f", str(matrix), "--json"]))
    cells = sorted((c["name"] for c in doc["cells"]), key=lambda name: name.endswith("-gpu"))
    # A fixed date: the resolution does not move with releases made during the run.
    sh([*GPUENV, "lock", "-f", str(matrix), "--exclude-newer", EXCLUDE_NEWER], cwd=tmp)
    cold = {c: timed([*GPUENV, "build", "-f", str(matrix), c, "--no-cache"], tmp) for c in cells}
    sizes = {c: image_size(f"{REPOSITORY}:{c}") for c in cells}
    registry = Registry(tmp / "registry")
    made.extend(f"{REPOSITORY}:{c}" for c in cells)
    made.extend(f"{registry.host}/bench/iteration:{c}" for c in cells)
    try:
        first = {c: push_one(matrix, c, registry, tmp) for c in cells}
        lines = [f"cold build and first push, {', '.join(cells)}:"]
        for c in cells:
            lines.append(
                f"  {c}: {cold[c]:.1f} s, {sizes[c] / MB:.0f} MB image, "
                f"{first[c] / MB:.0f} MB received by the registry"
            )
        ok = True
        for what, pip in EDITS:
            matrix.write_text(matrix_text(tensorflow, python, pip))
            sh([*GPUENV, "lock", "-f", str(matrix)], cwd=tmp)
            plan = sh([*GPUENV, "build", "-f", str(matrix), "--dry-run"], cwd=tmp).strip()
            lines.append(f"{what}: dry run says")
            lines += [f"    {line}" for line in plan.splitlines()]
            for c in cells:
                took = timed([*GPUENV, "build", "-f", str(matrix), c], tmp)
                size = image_size(f"{REPOSITORY}:{c}")
                received = push_one(matrix, c, registry, tmp)
                ratio = took / cold[c]
                grew = (size - sizes[c]) / sizes[c]
                good = ratio <= 0.15 and received <= 20 * MB and abs(grew) <= 0.01
                ok &= good
                lines.append(
                    f"  {c}: rebuilt in {took:.1f} s = {ratio:.2f}x its cold build "
                    f"(target <= 0.15x); registry received {received / MB:.2f} MB "
                    f"(target <= 20 MB); image {grew:+.2%} in size  "
                    f"{'ok' if good else 'MISSED'}"
                )
        lines.append(f"iteration targets: {'all met' if ok else 'MISSED (see above)'}")
        return lines
    finally:
        registry.stop()


def shipped(tmp: Path) -> list[str]:
    """The shipped matrix's images that exist, pushed to an empty registry."""
    doc = json.loads(sh([*GPUENV, "matrix", "-f", str(REPO / "matrix.yaml"), "--json"]))
    images = [c["image"] for c in doc["cells"]]
    plan = json.loads(sh([*GPUENV, "build", "-f", str(REPO / "matrix.yaml"), "--dry-run",
                          "--json"]))  # fmt: skip
    current = {p["image"] for p in plan["cells"] if p["action"] == "up-to-date"}
    present = [i for i in images if i in current]  # built, and not stale
    if not present:
        return ["shipped matrix: none of its images is built and current (gpuenv build)"]
    registry = Registry(tmp / "registry-shipped")
    try:
        names = [i.split(":", 1)[1] for i in present]
        sh([*GPUENV, "push", "-f", str(REPO / "matrix.yaml"), *names, "--no-aliases",
            "--registry", f"{registry.host}/shipped"], cwd=tmp)  # fmt: skip
        total = sum(image_size(i) for i in present)
        stored = registry.stored()
        made.extend(f"{registry.host}/shipped/tensorflow:{n}" for n in names)
        missing = len(images) - len(present)
        return [
            f"shipped matrix: {len(present)} of {len(images)} cells' images pushed "
            f"({missing} not built, or stale, here): the registry stores {stored / MB:.0f} MB for "
            f"{total / MB:.0f} MB of images = {stored / total:.2f}x"
        ]
    finally:
        registry.stop()


made: list[str] = []  # what this run tagged, removed at the end


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tensorflow", default="2.21")
    parser.add_argument("--python", default="3.11")
    parser.add_argument("--keep", action="store_true", help="keep the images built")
    args = parser.parse_args()
    tmp = Path(tempfile.mkdtemp(prefix="gpuenv-bench-iteration-"))
    try:
        print("\n".join(iteration(args.tensorflow, args.python, tmp)), flush=True)
        print("\n".join(shipped(tmp)))
    finally:
        if not args.keep:
            for ref in made:
                subprocess.run(["docker", "rmi", ref], capture_output=True, check=False)
        shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    main()
