#!/usr/bin/env python3
"""`gpuenv run` on another host: what the working directory's trip costs, in seconds and bytes.

    sudo .venv/bin/python benchmarks/sync.py [--rate 50mbit] [--mb 20] [--out-mb 10]

The other host is the tests' lab (tests/integration/support/another_host.py): a dockerd in
its own network and mount namespaces, which cannot see this machine's files, reached over
TCP+TLS across a veth limited to RATE both ways (no added delay: this kernel has no netem).
A project of MB megabytes (code and a data file) whose script writes an OUT_MB checkpoint and
a log; each run is timed as a whole `gpuenv run -i gpuenv/debian:bookworm -- python3 train.py`:

- local: the same project on the local engine, which binds the directory (the reference);
- remote, first run: everything crosses, the checkpoint comes back;
- remote, nothing edited: the checkpoint is rewritten and comes back again;
- remote, one file edited: that file crosses, the checkpoint comes back.

Prints seconds, each against the local run, and the line gpuenv prints of what crossed.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "tests" / "integration"))

from support.another_host import another_host  # noqa: E402
from support.cells import BASE_IMAGE  # noqa: E402

TRAIN = """\
import os
data = open("data/train.bin", "rb").read()
os.makedirs("ckpt", exist_ok=True)
with open("ckpt/model.bin", "wb") as fh:
    fh.write(os.urandom({out}))
with open("train.log", "a") as log:
    log.write(f"read {{len(data)}} bytes\\n")
print("done")
"""


def make_project(path: Path, mb: int, out_mb: int) -> None:
    (path / "data").mkdir(parents=True, exist_ok=True)
    (path / "pkg").mkdir(exist_ok=True)
    (path / "train.py").write_text(TRAIN.format(out=out_mb * 1_000_000))
    for i in range(40):  # a package of modules, as a project has
        (path / "pkg" / f"m{i}.py").write_text(f"X = {i}\n" * 200)
    (path / "data" / "train.bin").write_bytes(os.urandom(mb * 1_000_000))


def timed(cwd: Path, env: dict[str, str]) -> tuple[float, str]:
    start = time.monotonic()
    proc = subprocess.run(
        [str(REPO / ".venv/bin/gpuenv"), "run", "-i", BASE_IMAGE, "--", "python3", "train.py"],
        cwd=cwd, env=env, capture_output=True, text=True, check=False,
    )  # fmt: skip
    seconds = time.monotonic() - start
    if proc.returncode != 0:
        sys.exit(f"gpuenv run: exit {proc.returncode}\n{proc.stderr[-3000:]}")
    crossed = [line for line in proc.stderr.splitlines() if "working directory via" in line]
    return seconds, (crossed[0].split(": ", 2)[-1] if crossed else "bound, nothing crossed")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rate", default="50mbit")
    parser.add_argument("--mb", type=int, default=20, help="the project's size")
    parser.add_argument("--out-mb", type=int, default=10, help="the checkpoint's size")
    args = parser.parse_args()
    top = Path(tempfile.mkdtemp(prefix="gpuenv-bench-sync-"))
    env = {k: v for k, v in os.environ.items() if not k.startswith("GPUENV_")}
    rows: list[tuple[str, float, str]] = []
    local = top / "local"
    make_project(local, args.mb, args.out_mb)
    rows.append(("local engine (bound)", *timed(local, {**env, "XDG_CACHE_HOME": str(top / "c")})))
    proj = top / "proj"
    make_project(proj, args.mb, args.out_mb)
    with another_host(proj, hide=[top / "cache"], rate=args.rate) as lab:
        remote = {**env, "XDG_CACHE_HOME": str(top / "cache"), **lab.env("tls")}
        rows.append(("remote, first run", *timed(proj, remote)))
        rows.append(("remote, nothing edited", *timed(proj, remote)))
        (proj / "pkg" / "m0.py").write_text("X = 'edited'\n")
        rows.append(("remote, one file edited", *timed(proj, remote)))
    base = rows[0][1]
    print(f"project {args.mb} MB + 40 modules, checkpoint {args.out_mb} MB, link {args.rate}")
    for name, seconds, crossed in rows:
        print(f"{name:26} {seconds:6.1f} s  {seconds / base:5.2f}x  {crossed}")


if __name__ == "__main__":
    main()
