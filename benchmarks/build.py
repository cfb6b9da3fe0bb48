#!/usr/bin/env python3
"""Benchmarks for `gpuenv build` against plain `docker build` (issue 3's targets).

    .venv/bin/python benchmarks/build.py [--repeat N] [-f MATRIX] [--cell CELL] [--keep]
        [--skip-noop] [--skip-cold] [--before DIR] [--breakdown]

Prints side-by-side ratios:

1. No-op rebuild: `gpuenv build` of the whole matrix when every image is up to date, against
   a warm-cache BuildKit build of the same contexts: each cell's context as gpuenv sends it
   (the rendered files plus the install steps' wheels, assembled by gpuenv into its cache),
   built with the same labels, network and secrets as gpuenv's own build of it (the
   install step fetches near the engine where its host reaches the index: network host and
   the CA bundle as the secret `ca`, gpuenv/building/near.py). The warm build is checked to
   hit the cache: its image must have gpuenv's image's layers. Targets: <= 0.2 s per cell,
   <= 0.2x.
2. Cold CPU cell: `gpuenv build CELL --no-cache` from an empty gpuenv cache (wheelhouse,
   probe verdict) against hand-written single-stage Dockerfiles that install the same
   packages (tensorflow==<version>) on the same base, one with pip and one with uv; medians
   of --repeat runs (3 at least for a claim), interleaved (gpuenv, pip, uv, gpuenv, ...), each
   run listed and each ratio with each round's (the spread), and the load average while it
   ran (benchmarks/spread.py, which every part's figures go through).
   Targets: <= 0.7x pip, <= 1.0x uv (issue 33).
   The hand-written builds do the same work as gpuenv's resolution, download and install
   step, so the ratio is gpuenv's own overhead: a venv in /opt/venv, bytecode compiled (pip
   does that by default; uv is given --compile-bytecode, as gpuenv does), no cache kept.
   They download inside their RUN step (host networking), trusting the CA bundle ($PIP_CERT
   or --ca-bundle) through a BuildKit secret mount (in no layer); the uv one bootstraps uv
   with pip there. gpuenv's cold builds are as users get them: on this machine the probe
   finds PyPI (through the site's proxy, the CA bundle given to the install step as a
   BuildKit secret), so gpuenv resolves on the client and the engine's host fetches the
   wheels in the install step (gpuenv/building/near.py), against one locked hash each. The
   gpuenv cold builds use a copy of the matrix renamed gpuenv-bench/..., so the matrix's own
   images are not replaced. With --before DIR, another checkout's gpuenv (DIR holds its
   gpuenv/ and images/: `git archive main gpuenv images | tar -x -C DIR`) is timed too, in
   the same interleaving: a change's before and after in one run, against the same
   references.
2b. Where the time goes (--breakdown): the same cold build with the wheels sent from the
   client (GPUENV_NEAR_FETCH=client, as every build was before) and fetched by the engine's
   host (the default here), and the hand-written uv Dockerfile of part 2, alternating, each
   timed in parts through a docker CLI wrapper that keeps BuildKit's plain log: gpuenv
   before the engine (resolution, page and wheel fetches into the empty wheelhouse, the
   context assembled), the context's transfer, the install step (the hand-written one
   bootstraps uv with pip, resolves and downloads in it), the export of the image, and
   gpuenv after it.
3. Image size against the sum of its parts: the base image plus the install layers (the
   Python environment, and the CUDA wheels for GPU cells) from `docker history`. Anything
   else in the image (a stray `chown -R` copying the environment) shows as excess.

The whole matrix is built first if needed (three GPU cells are ~15 GB and take minutes).
Images this script created are removed at the end unless --keep is given.

Every build here uses BuildKit through the docker CLI gpuenv itself picks (gpuenv/engine/client.py:
buildkit_cli), which is what gpuenv drives.
"""

from __future__ import annotations

import argparse
import functools
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import TypeVar

from spread import Load, check_rounds, ratio, runs

REPO = Path(__file__).resolve().parents[1]
BENCH_REPOSITORY = "gpuenv-bench/tensorflow"
T = TypeVar("T")
DOCKER_ENV = dict(os.environ)


# ------------------------------------------------------------------------------ helpers


def sh(args: list[str], *, check: bool = True, **kw) -> subprocess.CompletedProcess[str]:
    kw.setdefault("env", DOCKER_ENV)
    proc = subprocess.run(args, capture_output=True, text=True, **kw)
    if check and proc.returncode != 0:
        sys.exit(
            f"benchmark: {' '.join(args[:6])} ... exited {proc.returncode}\n"
            f"{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}"
        )
    return proc


def timed(args: list[str], **kw) -> tuple[float, subprocess.CompletedProcess[str]]:
    start = time.perf_counter()
    proc = sh(args, **kw)
    return time.perf_counter() - start, proc


def gpuenv(*args: str) -> list[str]:
    return [sys.executable, "-m", "gpuenv", *args]


def build_results(proc: subprocess.CompletedProcess[str]) -> dict[str, dict]:
    return {r["cell"]: r for r in json.loads(proc.stdout)["results"]}


def matrix_cells(matrix: Path) -> dict[str, dict]:
    doc = json.loads(sh(gpuenv("matrix", "-f", str(matrix), "--json")).stdout)
    return {c["name"]: c for c in doc["cells"]}


def inspect(ref: str) -> dict | None:
    proc = sh(["docker", "image", "inspect", ref], check=False)
    return json.loads(proc.stdout)[0] if proc.returncode == 0 else None


def tags() -> set[str]:
    out = sh(["docker", "images", "--format", "{{.Repository}}:{{.Tag}}"]).stdout
    return {t for t in out.split() if "<none>" not in t}


@functools.cache
def buildkit_command() -> tuple[str, ...]:
    """The BuildKit build command gpuenv uses here (`docker buildx build --load`, or a docker
    CLI older than 23 with DOCKER_BUILDKIT=1: gpuenv/engine/client.py, buildkit_cli)."""
    from gpuenv.engine import client as engine

    return tuple(engine.buildkit_cli(engine.connect())[0])


def docker_build(
    context: Path,
    *,
    no_cache: bool,
    env: dict[str, str] | None = None,
    network: str = "host",
    ca: Path | None = None,
    labels: dict[str, str] | None = None,
    log: list[str] | None = None,
) -> str:
    """A BuildKit build (untagged) of `context`; returns the image ID. `ca` is offered to
    RUN steps as the secret `ca` (RUN --mount=type=secret,id=ca: in no layer); `log`, when
    given, receives BuildKit's plain log."""
    build_env = {**(env or DOCKER_ENV), "DOCKER_BUILDKIT": "1"}
    with tempfile.TemporaryDirectory(prefix="gpuenv-bench-iid-") as tmp:
        iid = Path(tmp) / "iid"
        args = [*buildkit_command(), "--progress", "plain", "--network", network]
        args += ["--iidfile", str(iid)]
        if no_cache:
            args.append("--no-cache")
        if ca is not None:
            args += ["--secret", f"id=ca,src={ca}"]
        for key, value in sorted((labels or {}).items()):
            args += ["--label", f"{key}={value}"]
        proc = sh([*args, str(context)], env=build_env)
        if log is not None:
            log.append(proc.stdout + proc.stderr)
        return iid.read_text().strip()


def median(values: list[float]) -> float:
    return statistics.median(values)


def ratio_line(label: str, mine: list[float], theirs: list[float], target: float) -> str:
    """The ratio of the medians with each round's (benchmarks/spread.py), and the target."""
    r = median(mine) / median(theirs) if median(theirs) else float("inf")
    verdict = "ok" if r <= target else "MISSED"
    return f"  {label:<44} {ratio(mine, theirs)}   (target <= {target}x: {verdict})"


def human(size: float) -> str:
    return f"{size / 1e9:.2f} GB" if size >= 1e9 else f"{size / 1e6:.1f} MB"


@dataclass(frozen=True)
class Context:
    """A cell's build context as gpuenv's own build hands it to the engine."""

    directory: Path
    network: str
    ca: Path | None  # the install step's secret `ca`, when it fetches near the engine


def assembled_contexts(matrix: Path, ca: Path | None) -> dict[str, Context]:
    """Each cell's context as gpuenv's next build would send it, assembled by gpuenv itself
    (gpuenv/building/sendable.py: Sender) into its cache: the rendered files, the resolution (the
    lock's, or one made now) and the install steps' wheels (or, fetched near the engine, only
    their hashes), with the network and secrets gpuenv's build gives it. Not the network a
    cell "should" need: a near-fetched install step downloads, so `none` fails it, and not
    GPUENV_NEAR_FETCH=client either: that context differs from the one gpuenv built, so the
    warm build would miss the cache and time a cold install instead."""
    from gpuenv.building import plan
    from gpuenv.building.sendable import Sender
    from gpuenv.engine import client as engine
    from gpuenv.project.project import open_project

    project = open_project(matrix)
    cells = project.cells
    docker = engine.connect()
    the_plan = plan.make_plan(docker, project, cells)
    sender = Sender(docker, project, the_plan.cells, ca, offline=False)
    out = {}
    for p in the_plan.cells:
        with sender.context(p, {}) as build:  # kept in the cache once assembled
            out[p.cell.name] = Context(build.directory, build.network, build.secrets.get("ca"))
    return out


# ------------------------------------------------------------------------------ parts


def no_op(matrix: Path, cells: dict[str, dict], repeat: int, ca: Path | None, tmp: Path) -> None:
    contexts = assembled_contexts(matrix, ca)
    gpuenv_times, docker_times, inside, one_cell = [], [], [], []
    first = next(iter(cells))
    load = Load()
    for _ in range(repeat):
        seconds, _proc = timed(gpuenv("build", "-f", str(matrix), first, "--json"))
        one_cell.append(seconds)
        seconds, proc = timed(gpuenv("build", "-f", str(matrix), "--json"), check=False)
        results = build_results(proc).values()
        statuses = {r["status"] for r in results}
        if statuses != {"cached"}:
            sys.exit(f"benchmark: the no-op rebuild was not a no-op: {statuses}")
        gpuenv_times.append(seconds)
        inside.append(sum(r["seconds"] for r in results))
        images = {name: inspect(cell["image"]) or {} for name, cell in cells.items()}
        start = time.perf_counter()
        built = {}
        for name in cells:
            labels = images[name].get("Config", {}).get("Labels") or {}
            wanted = {k: v for k, v in labels.items() if k in ("io.gpuenv.spec-hash",
                                                               "io.gpuenv.inputs")}  # fmt: skip
            context = contexts[name]
            built[name] = docker_build(context.directory, no_cache=False,
                                       network=context.network, ca=context.ca,
                                       labels=wanted)  # fmt: skip
        docker_times.append(time.perf_counter() - start)
        for name, image_id in built.items():
            layers = (inspect(image_id) or {}).get("RootFS", {}).get("Layers")
            if layers != images[name].get("RootFS", {}).get("Layers"):
                print(f"  warning: warm docker build of {name} missed the cache")
            if image_id != images[name].get("Id"):
                sh(["docker", "rmi", image_id], check=False)
        load.sample()
    n = len(cells)
    g, d = median(gpuenv_times), median(docker_times)
    print(f"\n1. No-op rebuild of the whole matrix ({n} cells), medians of {repeat} [each run], "
          f"{load}")  # fmt: skip
    print(f"  {'gpuenv build (all up to date)':<44} {runs(gpuenv_times, ' s', 2)}   "
          f"({g / n:.3f} s per cell)")  # fmt: skip
    i, one = median(inside), median(one_cell)
    print(f"  {'  of which the per-cell checks (--json)':<44} {i:6.2f} s   (the rest: start-up)")
    if n > 1:
        marginal = (g - one) / (n - 1)
        print(
            f"  {'  gpuenv build of one cell':<44} {one:6.2f} s   ({marginal:.3f} s per extra cell)"
        )
    print(f"  {'docker build, warm cache, same contexts':<44} {runs(docker_times, ' s', 2)}   "
          f"({d / n:.3f} s per cell)")  # fmt: skip
    networks = ", ".join(sorted({c.network for c in contexts.values()}))
    print(f"  {'  with the network gpuenv gave them':<44} {networks}")
    print(ratio_line("gpuenv / docker build", gpuenv_times, docker_times, 0.2))
    verdict = "ok" if g / n <= 0.2 else "MISSED"
    print(f"  {'per cell':<44} {g / n:6.3f} s   (target <= 0.2 s: {verdict})")


HANDWRITTEN = {
    "pip": """\
FROM {base}
RUN {mount_ca}set -eu; {use_ca}\\
    python3 -m venv /opt/venv; \\
    /opt/venv/bin/pip install --no-cache-dir --disable-pip-version-check {packages}; \\
    rm -rf /root/.cache
ENV PATH=/opt/venv/bin:$PATH
""",
    "uv": """\
FROM {base}
RUN {mount_ca}set -eu; {use_ca}\\
    python3 -m venv /tmp/uv; \\
    /tmp/uv/bin/pip install --quiet --no-cache-dir --disable-pip-version-check uv=={uv}; \\
    /tmp/uv/bin/uv venv --quiet --python python3 /opt/venv; \\
    /tmp/uv/bin/uv pip install --no-cache --compile-bytecode --python /opt/venv/bin/python \\
        {packages}; \\
    rm -rf /tmp/uv /root/.cache
ENV PATH=/opt/venv/bin:$PATH
""",
}
CA_SECRET = "/run/secrets/ca"  # where RUN --mount=type=secret,id=ca puts the bundle


def ca_parts(ca: Path | None) -> dict[str, str]:
    """The hand-written RUN line's CA parts: the bundle as a BuildKit secret (docker_build's
    `ca`), trusted by pip and uv; nothing without a bundle."""
    if ca is None:
        return {"mount_ca": "", "use_ca": ""}
    return {
        "mount_ca": "--mount=type=secret,id=ca \\\n    ",
        "use_ca": f"export SSL_CERT_FILE={CA_SECRET} PIP_CERT={CA_SECRET}; ",
    }


def handwritten_contexts(cell: dict, ca: Path | None, tmp: Path) -> dict[str, Path]:
    from gpuenv.building.render import UV_VERSION

    packages = " ".join([f"{cell['framework']}=={cell['framework_version']}", *cell["pip"]])
    out = {}
    for name, template in HANDWRITTEN.items():
        directory = tmp / f"handwritten-{name}"
        directory.mkdir()
        (directory / "Dockerfile").write_text(
            template.format(
                base=cell["base_image"], packages=packages, uv=UV_VERSION, **ca_parts(ca)
            )
        )
        out[name] = directory
    return out


def bench_matrix(shipped: Path, tmp: Path) -> Path:
    """A copy of the matrix whose images are gpuenv-bench/..., so its own are not replaced."""
    import yaml

    doc = yaml.safe_load(shipped.read_text())
    doc["name"] = BENCH_REPOSITORY
    matrix = tmp / "bench-matrix.yaml"
    matrix.write_text(json.dumps(doc))  # JSON is YAML; version strings stay strings
    return matrix


def checkout_env(before: Path | None) -> tuple[dict[str, str], Path | None]:
    """The environment and working directory that run another checkout's gpuenv (`--before`):
    its directory first on the path, and as the working directory (python -m puts the
    working directory before PYTHONPATH)."""
    if before is None:
        return DOCKER_ENV, None
    return {**DOCKER_ENV, "PYTHONPATH": str(before)}, before


def rotated(items: list[T], turn: int) -> list[T]:
    """`items` started at `turn` (modulo their number): each takes each place in turn."""
    return items[turn % len(items) :] + items[: turn % len(items)]


def cold(
    shipped: Path, cell_name: str, repeat: int, ca: Path | None, tmp: Path,
    before: Path | None = None,
) -> list[str]:  # fmt: skip
    """Returns the bench images to size up (gpuenv's last cold build)."""
    matrix = bench_matrix(shipped, tmp)
    cell = matrix_cells(matrix)[cell_name]
    contexts = handwritten_contexts(cell, ca, tmp)
    checkouts = {"gpuenv": None, **({"gpuenv before": before} if before else {})}
    times: dict[str, list[float]] = {name: [] for name in [*checkouts, *contexts]}
    sizes: dict[str, int] = {}
    ca_args = ["--ca-bundle", str(ca)] if ca else []
    load = Load()
    for i in range(repeat):
        print(f"  run {i + 1}:", end="", flush=True)
        # With --before, the two gpuenv builds swap places each run: the one right after the
        # other was seen to be seconds slower, whichever gpuenv it was.
        for name, checkout in rotated(list(checkouts.items()), i):
            # An empty cache each time: a cold build downloads everything, as the
            # hand-written ones do (benchmarks/wheelhouse.py measures the warm rebuild).
            env, cwd = checkout_env(checkout)
            cache = tmp / f"cold-cache-{i}-{name.replace(' ', '-')}"
            seconds, proc = timed(
                gpuenv("build", "-f", str(matrix), cell_name, "--no-cache", "--json", *ca_args),
                env={**env, "XDG_CACHE_HOME": str(cache)}, cwd=cwd,
            )  # fmt: skip
            result = build_results(proc)[cell_name]
            assert result["status"] == "built", result
            times[name].append(seconds)
            sizes[name] = result["size"]
            print(f" {name} {seconds:.1f} s,", end="", flush=True)
        for name, context in contexts.items():
            start = time.perf_counter()
            image_id = docker_build(context, no_cache=True, ca=ca)
            seconds = time.perf_counter() - start
            times[name].append(seconds)
            sizes[name] = int((inspect(image_id) or {}).get("Size") or 0)
            sh(["docker", "rmi", image_id], check=False)
            print(f" {name} {seconds:.1f} s,", end="", flush=True)
        print(f" load {load.sample():.1f}")
    print(f"\n2. Cold build of {cell_name} (--no-cache), medians of {repeat} [each run], "
          f"interleaved, {load}")  # fmt: skip
    labels = {"gpuenv": "gpuenv build --no-cache",
              "gpuenv before": f"gpuenv build --no-cache, {before}",
              "pip": "hand-written Dockerfile, pip install",
              "uv": "hand-written Dockerfile, uv pip install"}  # fmt: skip
    for key in times:
        print(f"  {labels[key]:<44} {runs(times[key])}  image {human(sizes[key])}")
    for key in checkouts:
        print(ratio_line(f"{key} / hand-written pip", times[key], times["pip"], 0.7))
        print(ratio_line(f"{key} / hand-written uv (gpuenv's overhead)", times[key], times["uv"],
                         1.0))  # fmt: skip
    return [f"{BENCH_REPOSITORY}:{cell_name}"]


WRAPPER = """\
#!/bin/bash
if [ "$1" = build ] || [ "$1 $2" = "buildx build" ]; then
  date +%s.%N > {log}.start
  set -o pipefail
  {real} "$@" 2>&1 | tee {log}
  code=$?
  date +%s.%N > {log}.end
  exit $code
fi
exec {real} "$@"
"""


def parts_of(log: str) -> dict[str, float]:
    """BuildKit's plain log in parts: the context's transfer, the RUN steps, the export."""
    import re

    names: dict[str, str] = {}
    out: dict[str, float] = {}
    for line in log.splitlines():
        m = re.match(
            r"#(\d+) (\[internal\] load build context|exporting to image|\[.*?\] RUN)", line
        )
        if m:
            what = m.group(2)
            names[m.group(1)] = (
                "context transfer" if "build context" in what
                else "export" if "exporting" in what else "install step"
            )  # fmt: skip
        m = re.match(r"#(\d+) DONE ([\d.]+)s", line)
        if m and m.group(1) in names:
            key = names[m.group(1)]
            out[key] = out.get(key, 0.0) + float(m.group(2))
        m = re.match(r"#\d+ transferring context: ([\d.]+)([kMG]?B)", line)
        if m:
            scale = {"B": 1, "kB": 1e3, "MB": 1e6, "GB": 1e9}[m.group(2)]
            out["context MB"] = float(m.group(1)) * scale / 1e6
    return out


def breakdown(
    shipped: Path, cell_name: str, repeat: int, ca: Path | None, tmp: Path,
    before: Path | None = None,
) -> None:  # fmt: skip
    matrix = bench_matrix(shipped, tmp)
    handwritten = handwritten_contexts(matrix_cells(matrix)[cell_name], ca, tmp)["uv"]
    log = tmp / "buildkit.log"
    wrapper = tmp / "docker-wrapper"
    wrapper.write_text(WRAPPER.format(log=log, real=buildkit_command()[0]))
    wrapper.chmod(0o755)
    ca_args = ["--ca-bundle", str(ca)] if ca else []
    # column -> (checkout, GPUENV_NEAR_FETCH); the hand-written uv Dockerfile last
    columns = {"wheels sent": (None, "client"), "fetched near": (None, "")}
    if before is not None:
        columns["near, before"] = (before, "")
    rows: dict[str, list[dict[str, float]]] = {name: [] for name in [*columns, "hand-written uv"]}
    load = Load()
    for i in range(repeat):
        for name, (checkout, near) in rotated(list(columns.items()), i):
            env, cwd = checkout_env(checkout)
            env = {**env, "XDG_CACHE_HOME": str(tmp / f"breakdown-{i}-{name[:4]}"),
                   "GPUENV_DOCKER_CLI": str(wrapper)}  # fmt: skip
            if near:
                env["GPUENV_NEAR_FETCH"] = near
            start = time.time()
            proc = sh(gpuenv("build", "-f", str(matrix), cell_name, "--no-cache", "--json",
                             *ca_args), env=env, cwd=cwd)  # fmt: skip
            end = time.time()
            assert build_results(proc)[cell_name]["status"] == "built"
            began = float(Path(f"{log}.start").read_text())
            ended = float(Path(f"{log}.end").read_text())
            row = parts_of(log.read_text())
            row["gpuenv before the engine"] = began - start
            row["gpuenv after the engine"] = end - ended
            row["total"] = end - start
            rows[name].append(row)
            print(f"  run {i + 1} {name}: {row['total']:.1f} s", flush=True)
        logged: list[str] = []
        start = time.time()
        image_id = docker_build(handwritten, no_cache=True, ca=ca, log=logged)
        row = {**parts_of(logged[0]), "total": time.time() - start}
        sh(["docker", "rmi", image_id], check=False)
        rows["hand-written uv"].append(row)
        print(f"  run {i + 1} hand-written uv: {row['total']:.1f} s (load {load.sample():.1f})",
              flush=True)  # fmt: skip
    keys = ["gpuenv before the engine", "context transfer", "install step", "export",
            "gpuenv after the engine", "total", "context MB"]  # fmt: skip
    print(f"\n2b. Where a cold build of {cell_name} goes, medians of {repeat} (seconds; "
          f"the range of the runs in brackets), {load}")  # fmt: skip
    print(f"  {'part':<26}" + "".join(f"{name:>22}" for name in rows))
    for key in keys:
        cells = []
        for name in rows:
            values = [r.get(key, 0.0) for r in rows[name]]
            cells.append(f"{median(values):.1f} [{min(values):.1f}-{max(values):.1f}]")
        print(f"  {key:<26}" + "".join(f"{c:>22}" for c in cells))


def sizes(images: list[str]) -> None:
    print("\n3. Final image size against the sum of its parts (base + install layers)")
    print(f"  {'image':<52} {'size':>9} {'base':>9} {'env':>9} {'ratio':>7}")
    for ref in images:
        info = inspect(ref)
        if info is None:
            continue
        base_ref = (info["Config"].get("Labels") or {}).get("org.opencontainers.image.base.name")
        base = int((inspect(base_ref) or {}).get("Size") or 0) if base_ref else 0
        out = sh(["docker", "history", "--no-trunc", "--format", "{{json .}}", ref]).stdout
        env = 0
        for line in out.splitlines():
            row = json.loads(line)
            if "/mnt/uv pip install" in row["CreatedBy"]:  # gpuenv's install steps
                env += _parse_size(row["Size"])
        total = int(info["Size"])
        r = total / (base + env) if base + env else float("inf")
        verdict = "ok" if r <= 1.05 else "MISSED (target <= 1.05x)"
        print(f"  {ref:<52} {human(total):>9} {human(base):>9} {human(env):>9} {r:6.3f}x {verdict}")


def _parse_size(text: str) -> int:
    """docker history's human sizes (decimal units: 2.14GB, 8.91kB, 0B)."""
    units = {"B": 1, "kB": 1e3, "KB": 1e3, "MB": 1e6, "GB": 1e9, "TB": 1e12}
    for unit in sorted(units, key=len, reverse=True):
        if text.endswith(unit):
            return int(float(text[: -len(unit)]) * units[unit])
    return int(float(text))


# ------------------------------------------------------------------------------ main


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--repeat", type=int, default=3, help="repetitions (medians) [3]")
    parser.add_argument("-f", "--file", type=Path, default=REPO / "matrix.yaml")
    parser.add_argument("--cell", default="tf2.21-py3.11-cpu", help="the cold-build cell")
    parser.add_argument("--ca-bundle", type=Path, default=None, help="[default: $PIP_CERT]")
    parser.add_argument("--keep", action="store_true", help="keep the images built here")
    parser.add_argument("--skip-noop", action="store_true")
    parser.add_argument("--skip-cold", action="store_true")
    parser.add_argument(
        "--before",
        type=Path,
        default=None,
        metavar="DIR",
        help="also time the gpuenv of another checkout (DIR holds its gpuenv/ and images/)",
    )
    parser.add_argument(
        "--breakdown",
        action="store_true",
        help="only part 2b: where a cold build's time goes (both paths, hand-written uv)",
    )
    args = parser.parse_args()
    check_rounds(args.repeat)
    ca = args.ca_bundle or (Path(os.environ["PIP_CERT"]) if os.environ.get("PIP_CERT") else None)
    matrix = args.file.resolve()
    earlier = args.before.resolve() if args.before else None

    before = tags()
    if args.breakdown:
        with tempfile.TemporaryDirectory(prefix="gpuenv-bench-") as tmp:
            try:
                breakdown(matrix, args.cell, args.repeat, ca, Path(tmp), earlier)
            finally:
                for ref in tags() - before:
                    if ref.startswith(BENCH_REPOSITORY):
                        sh(["docker", "rmi", ref], check=False)
        return
    cells = matrix_cells(matrix)
    print(f"gpuenv build benchmark: {matrix} ({len(cells)} cells), repeat {args.repeat}")
    if not args.skip_noop:  # the no-op rebuild needs every cell built (GPU cells: ~15 GB)
        seconds, proc = timed(gpuenv("build", "-f", str(matrix), "--json"), check=False)
        results = build_results(proc)
        built = sorted(n for n, r in results.items() if r["status"] == "built")
        print(f"  making sure every cell is built: {seconds:.1f} s (built now: {built or 'none'})")
        if proc.returncode != 0:
            sys.exit(f"benchmark: the matrix does not build:\n{proc.stderr[-2000:]}")

    bench_images: list[str] = []
    with tempfile.TemporaryDirectory(prefix="gpuenv-bench-") as tmp:
        try:
            if not args.skip_noop:
                no_op(matrix, cells, args.repeat, ca, Path(tmp))
            if not args.skip_cold:
                bench_images = cold(matrix, args.cell, args.repeat, ca, Path(tmp), earlier)
            sizes([c["image"] for c in cells.values()] + bench_images)
        finally:
            if not args.keep:
                ours = {c["image"] for c in cells.values()} | {
                    c["base_image"] for c in cells.values()
                }
                created = [
                    t for t in tags() - before if t in ours or t.startswith(BENCH_REPOSITORY)
                ]
                # Cells before bases: a base goes only once nothing built on it is left.
                for ref in sorted(created, key=lambda t: t.startswith("gpuenv/debian:")):
                    sh(["docker", "rmi", ref], check=False)
                if created:
                    print(f"\nremoved {len(created)} image(s) this run created (--keep keeps them)")


if __name__ == "__main__":
    main()
