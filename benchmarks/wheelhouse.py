#!/usr/bin/env python3
"""Benchmarks for the wheelhouse (issue 15's targets), ratios measured in one run.

    .venv/bin/python benchmarks/wheelhouse.py [--repeat N] [--cell CELL] [--part P] [--keep]

1. Warm rebuild: `gpuenv build CELL --no-cache` with a warm wheelhouse against a cold build
   of the same cell (`--no-cache` and an empty wheelhouse: a fresh XDG_CACHE_HOME). Per
   repetition: cold, then warm on the wheelhouse the cold build filled. Target <= 0.4x.
   Then the most a wheelhouse can save here: the bytes the cold build stored, at the
   upstream's speed (the framework's wheel fetched again with `pip download`), as a bound
   on the ratio, and the upstream speed under which the target would hold.
2. `--part matrix` (many minutes, ~25 GB of disk at its peak; root): every cell of the
   matrix built from an empty engine (a throwaway dockerd with only the bases loaded) and an
   empty wheelhouse, one command, against hand-written uv Dockerfiles of the same cells (the
   same packages: the framework, the matrix's pip packages and, for GPU cells, the pinned
   nvidia wheels; uv straight from the index, as in benchmarks/build.py) built one after
   another with `--no-cache` on that engine. Target <= 0.6x.

A warm wheelhouse spares the downloads only: gpuenv fetches every wheel on the client into
the wheelhouse, then sends them in the build context (gpuenv/building/sendable.py).

The cells are built from a copy of the matrix renamed gpuenv-bench/wheelhouse, so the shipped
images are not retagged; those images are removed at the end unless --keep is given. Every
build uses BuildKit through the docker CLI gpuenv picks, which is what gpuenv drives.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
_spec = importlib.util.spec_from_file_location("gpuenv_bench_build", HERE / "build.py")
assert _spec is not None and _spec.loader is not None
b = importlib.util.module_from_spec(_spec)
sys.modules[_spec.name] = b  # dataclasses look their module up there
_spec.loader.exec_module(b)

REPOSITORY = "gpuenv-bench/wheelhouse"


def bench_matrix(shipped: Path, tmp: Path) -> Path:
    import yaml

    doc = yaml.safe_load(shipped.read_text())
    doc["name"] = REPOSITORY
    matrix = tmp / "wheelhouse-matrix.yaml"
    matrix.write_text(json.dumps(doc))  # JSON is YAML; version strings stay strings
    return matrix


def build(
    matrix: Path,
    cells: list[str],
    cache: Path,
    ca: Path | None,
    *,
    no_cache: bool = True,
    env: dict[str, str] | None = None,
) -> tuple[float, dict]:
    env = {**(env or b.DOCKER_ENV), "XDG_CACHE_HOME": str(cache)}
    ca_args = ["--ca-bundle", str(ca)] if ca else []
    flags = ["--no-cache"] if no_cache else []
    args = b.gpuenv("build", "-f", str(matrix), *cells, *flags, "--json", *ca_args)
    start = time.perf_counter()
    proc = b.sh(args, env=env)
    seconds = time.perf_counter() - start
    results = b.build_results(proc)
    for name in cells or results:
        assert results[name]["status"] == "built", results[name]
    return seconds, results


def warm_rebuild(matrix: Path, cell: str, repeat: int, ca: Path | None, tmp: Path) -> None:
    cold_times, warm_times = [], []
    for i in range(repeat):
        cache = tmp / f"cache-{i}"
        seconds, _ = build(matrix, [cell], cache, ca)
        cold_times.append(seconds)
        seconds, _ = build(matrix, [cell], cache, ca)
        warm_times.append(seconds)
        print(f"  run {i + 1}: cold {cold_times[-1]:.1f} s, warm {warm_times[-1]:.1f} s")
    c, w = b.median(cold_times), b.median(warm_times)
    print(f"\n1. {cell}: --no-cache rebuild, warm wheelhouse vs empty, medians of {repeat}")
    print(f"  {'cold (--no-cache, empty wheelhouse)':<44} {c:6.1f} s")
    print(f"  {'warm (--no-cache, wheelhouse filled)':<44} {w:6.1f} s")
    print(b.ratio_line("warm / cold", warm_times, cold_times, 0.4))
    download_share(tmp / "cache-0" / "gpuenv" / "wheelhouse", cell, matrix, c, tmp)


def download_share(store: Path, cell: str, matrix: Path, cold: float, tmp: Path) -> None:
    """What a wheelhouse can save here at most: the cold build's downloads (the bytes it
    stored) at the upstream's speed (the framework's wheel fetched again with pip, through
    the same proxy and CA). A rebuild can lose only that time, so this bounds the ratio."""
    stored = sum(f.stat().st_size for f in (store / "files").glob("??/*"))
    info = b.matrix_cells(matrix)[cell]
    wheel = f"{info['framework']}=={info['framework_version']}"
    where = tmp / "upstream"
    start = time.perf_counter()
    b.sh([sys.executable, "-m", "pip", "download", "--quiet", "--no-deps", "--only-binary",
          ":all:", "--python-version", info["python"], "-d", str(where), wheel])  # fmt: skip
    seconds = time.perf_counter() - start
    fetched = sum(f.stat().st_size for f in where.iterdir())
    speed = fetched / seconds
    downloading = stored / speed
    print(f"  the cold build stored {stored / 1e9:.2f} GB in the wheelhouse")
    print(f"  upstream: {wheel}'s wheel, {fetched / 1e6:.0f} MB in {seconds:.1f} s "
          f"= {speed / 1e6:.0f} MB/s (pip download, same proxy and CA)")  # fmt: skip
    print(
        f"  so downloading is at most {downloading:.1f} s of the cold build's {cold:.1f} s: "
        f"no wheelhouse makes a rebuild faster than {(cold - downloading) / cold:.2f}x here"
    )
    rest = cold - downloading
    print(
        f"  <= 0.4x needs downloads >= 1.5x the rest ({1.5 * rest:.0f} s): an upstream "
        f"at <= {stored / (1.5 * rest) / 1e6:.1f} MB/s"
    )


def cold_matrix(shipped_matrix: Path, ca: Path | None, tmp: Path) -> None:
    """Both sides on one empty dockerd of their own (empty data root; only the bases loaded
    into it), so neither finds a layer of the other's or of the shipped images. gpuenv builds
    the whole matrix in one command, with an empty wheelhouse and without --no-cache: on an
    empty engine the builder cache holds only what this build made, which is what lets a GPU
    cell reuse its CPU sibling's layer. The hand-written Dockerfiles then build one after
    another (--no-cache; each is removed after it is timed, so they do not fill the disk)."""
    sys.path.insert(0, str(b.REPO / "tests" / "integration"))
    from support.dockerd import second_dockerd  # the tests' throwaway engine (root only)

    from gpuenv.building.render import UV_VERSION

    cells = b.matrix_cells(shipped_matrix)
    bases = sorted({c["base_image"] for c in cells.values()})
    with second_dockerd("gpuenv-bm-") as (_client, root):
        host = {**b.DOCKER_ENV, "DOCKER_HOST": f"unix://{root}/d.sock"}
        save = subprocess.Popen(["docker", "save", *bases], stdout=subprocess.PIPE)
        b.sh(["docker", "load", "-q"], stdin=save.stdout, env=host)
        save.wait()
        matrix = bench_matrix(shipped_matrix, tmp)
        g, results = build(matrix, [], tmp / "matrix-cache", ca, no_cache=False, env=host)
        print(f"  gpuenv build, all {len(cells)} cells, empty engine and wheelhouse: {g:.1f} s")
        for name, r in results.items():
            print(f"    {name}: {r['seconds']:.1f} s")
        images = b.sh(["docker", "images", "-q", REPOSITORY], env=host).stdout.split()
        b.sh(["docker", "rmi", "-f", *sorted(set(images))], env=host, check=False)
        hand = 0.0
        for name, cell in cells.items():
            packages = [f"{cell['framework']}=={cell['framework_version']}", *cell["pip"]]
            if cell["variant"] == "gpu":
                packages += [f"{k}=={v}" for k, v in sorted(cell["wheels"].items())]
            context = tmp / f"hand-{name}"
            context.mkdir()
            (context / "Dockerfile").write_text(b.HANDWRITTEN["uv"].format(
                base=cell["base_image"], packages=" ".join(packages), uv=UV_VERSION,
                **b.ca_parts(ca)))  # fmt: skip
            start = time.perf_counter()
            image_id = b.docker_build(context, no_cache=True, env=host, ca=ca)
            seconds = time.perf_counter() - start
            hand += seconds
            b.sh(["docker", "rmi", image_id], check=False, env=host)
            print(f"  hand-written uv, {name}: {seconds:.1f} s", flush=True)
    print(f"\n2. Cold build of the whole matrix ({len(cells)} cells), empty engine")
    print(f"  {'gpuenv build, empty engine and wheelhouse':<44} {g:6.1f} s")
    print(f"  {'hand-written uv Dockerfiles, one after another':<44} {hand:6.1f} s")
    print(b.ratio_line("gpuenv / hand-written uv", [g], [hand], 0.6))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--repeat", type=int, default=1, help="repetitions (medians) [1]")
    parser.add_argument("-f", "--file", type=Path, default=b.REPO / "matrix.yaml")
    parser.add_argument("--cell", default="tf2.21-py3.11-cpu", help="the warm-rebuild cell")
    parser.add_argument(
        "--part",
        choices=["rebuild", "matrix", "all"],
        default="rebuild",
        help="the warm rebuild (1), the cold matrix (2) or both [rebuild]",
    )
    parser.add_argument("--ca-bundle", type=Path, default=None, help="[default: $PIP_CERT]")
    parser.add_argument("--keep", action="store_true", help="keep the images built here")
    args = parser.parse_args()
    ca = args.ca_bundle or (Path(os.environ["PIP_CERT"]) if os.environ.get("PIP_CERT") else None)
    before = b.tags()
    with tempfile.TemporaryDirectory(prefix="gpuenv-wheelhouse-bench-") as tmp:
        matrix = bench_matrix(args.file.resolve(), Path(tmp))
        try:
            if args.part in ("rebuild", "all"):
                warm_rebuild(matrix, args.cell, args.repeat, ca, Path(tmp))
            if args.part in ("matrix", "all"):
                (Path(tmp) / "matrix").mkdir()
                cold_matrix(args.file.resolve(), ca, Path(tmp) / "matrix")
        finally:
            if not args.keep:
                for tag in sorted(b.tags() - before):
                    if tag.startswith(f"{REPOSITORY}:"):
                        b.sh(["docker", "rmi", tag], check=False)


if __name__ == "__main__":
    sys.exit(main())
