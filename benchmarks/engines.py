#!/usr/bin/env python3
"""A cell's first build on an engine on another host over a slow link, against a local cold build.

    sudo .venv/bin/python benchmarks/engines.py [--cell CELL] [--repeat N] [-f MATRIX]
        [--legs LEG,...] [--before DIR] [--same-id] [--no-settle] [--mirror-on-disk]

The remote engine is tests/integration/support/another_host.py's lab: a dockerd in its own
network and mount namespaces (the project, gpuenv's cache and HOME hidden from it), reached
over TCP+TLS across a veth shaped to 50 Mbit/s both ways (`tc ... tbf`; this kernel has no
netem: a rate, no added delay), with a PEP 503 mirror on the lab's own loopback that its
host-network containers reach without the slow link (GPUENV_NEAR_INDEX names it, as a user
names a devpi or Artifactory near the GPU box). The mirror holds the cell's wheels and uv's,
on a tmpfs of its own, as a separate machine's storage (--mirror-on-disk: on this machine's
disk, as before 2026-12-08).

The cell, from a copy of the matrix renamed gpuenv-bench/engines, is locked first (so both
engines install one resolution) and built once locally with the wheels sent
(GPUENV_NEAR_FETCH=client), which fills the wheelhouse and gives the mirror its files. Then,
--repeat rounds (3 at least for a claim), interleaved, the legs --legs names (all by default):

- local: `gpuenv build CELL --no-cache` on the local engine, as a user gets it (the probe
  decides: on this machine its host fetches from PyPI through the site's proxy, the CA
  bundle given to the step as a BuildKit secret);
- local-sent: the same with GPUENV_NEAR_FETCH=client (the wheelhouse warm);
- remote: the first build on a fresh lab (its probe included): the engine's host fetches
  the public wheels and uv from the mirror; the context crosses the link;
- remote-sent: the same with GPUENV_NEAR_FETCH=client (every wheel crosses).

Each timed build starts once the disk is quiet (settle(): what the leg before left to write
back or trim, the local engine's cache collection among it; at most SETTLE_LIMIT seconds,
said per round), unless --no-settle: the lab's engine shares this machine's disk, which no
real remote engine does.

With --before DIR (another checkout's gpuenv/ and images/: `git archive REV gpuenv images |
tar -x -C DIR`), each leg runs that gpuenv too, in the same round (the two swap places each
round), so a change's before and after see the same machine. With --same-id, then the same
lock built with --reproducible on both engines and the image IDs compared (slow on the lab:
the rewrite saves the image across the link and loads it back; tests/integration/
test_engine_near_fetch.py shows it with the smaller JAX cell).

Prints, per leg, each round's time by phase (`gpuenv build --json`'s `phases`,
gpuenv/building/phases.py; `other` is the rest of the command: start-up, the plan, the
engine's connection) with its load average and the machine's part (GB of free memory and
of file data not yet written when the leg started; GB read, written and trimmed during it,
and of page cache the kernel reclaimed: /proc/meminfo, /proc/diskstats, /proc/vmstat),
each round's slow phases against their medians, then the medians with every run, each
against local cold with the ratio of each round, the bytes that crossed towards the engine
(the veth's counters) and the load average (benchmarks/spread.py); a remote round's line
says what the mirror served and its longest request (the framework's wheel, the fetch
phase's long pole) with its rate. Needs root (namespaces, tc, sshd). Run it under the
engine-tests flock.
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

from spread import Load, check_rounds, ratio, runs

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "tests" / "integration"))

from support.another_host import AnotherHost, add_uv_wheel, another_host  # noqa: E402

NAME = "gpuenv-bench/engines"
LEGS = {"local": "local cold", "local-sent": "local cold, wheels sent",
        "remote": "remote first (50 Mbit/s)",
        "remote-sent": "remote first, wheels sent (50 Mbit/s)"}  # fmt: skip
# gpuenv build --json's phases (gpuenv/building/phases.py), then the rest of the command.
PHASES = ("probe", "context", "send", "uv", "fetch", "install", "steps", "export", "build",
          "tag", "other")  # fmt: skip
# Disk.end()'s keys, as the phase table heads them (GB): at the leg's start, then during it.
DISK = {"free": "free", "dirty": "dirty", "read": "read", "wrote": "wrote",
        "discarded": "trimmed", "reclaimed": "reclaim"}  # fmt: skip
SLOW = 1.0  # seconds over its median that make a phase a slow round's reason
SETTLE_LIMIT = 30.0  # seconds a leg waits at most for the disk to be quiet (settle)
QUIET = 4_000_000  # bytes written or trimmed in half a second that count as quiet


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


def disk() -> tuple[int, int, int]:
    """(bytes read, written, discarded) so far on the block device that holds / (here also
    /var/lib/docker and the labs' data roots under /tmp): /proc/diskstats, fields 6, 10 and
    17 (the kernel's Documentation/admin-guide/iostats.rst). Zeros where / is no block
    device's."""
    dev = os.stat("/").st_dev
    for line in Path("/proc/diskstats").read_text().splitlines():
        f = line.split()
        if (int(f[0]), int(f[1])) == (os.major(dev), os.minor(dev)):
            return int(f[5]) * 512, int(f[9]) * 512, (int(f[16]) * 512 if len(f) > 16 else 0)
    return 0, 0, 0


def reclaimed() -> int:
    """Bytes of page cache the kernel has taken back so far (/proc/vmstat pgsteal_kswapd and
    pgsteal_direct, 4 KiB pages): a build writing into full memory waits for it."""
    fields = dict(line.split() for line in Path("/proc/vmstat").read_text().splitlines())
    return sum(int(fields.get(k, 0)) for k in ("pgsteal_kswapd", "pgsteal_direct")) * 4096


def free() -> int:
    """Bytes of memory holding nothing (MemFree, /proc/meminfo)."""
    fields = dict(line.split(":", 1) for line in Path("/proc/meminfo").read_text().splitlines())
    return int(fields["MemFree"].split()[0]) * 1024


def dirty() -> int:
    """Bytes of file data written but not yet on the disk (Dirty + Writeback, /proc/meminfo):
    what a build starting now writes behind."""
    fields = dict(line.split(":", 1) for line in Path("/proc/meminfo").read_text().splitlines())
    return sum(int(fields[k].split()[0]) * 1024 for k in ("Dirty", "Writeback") if k in fields)


class Disk:
    """The disk's and memory's state at a leg's start and what the leg did to them (MB):
    `free` memory and `dirty` data at the start; `read`, `wrote`, `discarded` and
    `reclaimed` (page cache taken back) during it (a file removed on this ext4, mounted
    `discard`, is trimmed at once, the remover waiting); `waited`: the seconds settle()
    waited before it."""

    def __init__(self, waited: float) -> None:
        self.waited = waited
        self.dirty, self.free = dirty() / 1e6, free() / 1e6
        self._start, self._reclaimed = disk(), reclaimed()

    def end(self) -> dict[str, float]:
        read, written, discarded = (b - a for a, b in zip(self._start, disk(), strict=True))
        return {"dirty": self.dirty, "free": self.free, "read": read / 1e6,
                "wrote": written / 1e6, "discarded": discarded / 1e6,
                "reclaimed": (reclaimed() - self._reclaimed) / 1e6}  # fmt: skip


def settle(limit: float = SETTLE_LIMIT) -> float:
    """Wait, at most `limit` seconds, until the disk is quiet: nothing left to write back and
    under QUIET bytes a half-second written or trimmed, for 2 s. The seconds waited.

    Each build writes 5-6 GB, and the engine then deletes: the local engine's BuildKit
    collects its cache about a second after each build (`builder.gc`, here keeping 20 GB),
    which a --no-cache round grows by the image's size. This ext4 is mounted `discard`
    without a journal, so every freed extent is trimmed at once, its remover waiting
    (the kernel's stack: do_unlinkat ... ext4_free_blocks, blkdev_issue_discard), and the
    virtual disk serves the trims before the writes queued behind them. Unsettled, a leg
    pays for the one before it (the remote leg starts a second after the local one ends);
    no real remote engine shares a disk with the client's."""
    start = time.monotonic()
    os.sync()
    last, quiet = disk(), 0
    while quiet < 4 and time.monotonic() - start < limit:
        time.sleep(0.5)
        now = disk()
        busy = sum(b - a for a, b in zip(last, now, strict=True)) > QUIET or dirty() > QUIET * 8
        quiet, last = (0 if busy else quiet + 1), now
    return time.monotonic() - start


def tx_bytes(interface: str) -> int:
    """Bytes the client's end of the link has sent (towards the engine)."""
    return int(Path(f"/sys/class/net/{interface}/statistics/tx_bytes").read_text())


def remote(project: Path, cache: Path, wheels: Path, env: dict[str, str], cell: str, mode: str,
           *extra: str, quiet: bool = True, in_memory: bool = True,
           ) -> tuple[float, int, dict, Disk, str]:  # fmt: skip
    """One first build on a fresh lab, once the disk is quiet (`quiet`: settle()): (seconds,
    bytes sent across the link, result, the disk's state from the build's start, what the
    mirror served)."""
    lab: AnotherHost
    with another_host(project, hide=[cache], wheels=wheels, mirror_in_memory=in_memory) as lab:
        renv = {**env, **lab.env("tls"), "GPUENV_NEAR_FETCH": mode,
                "GPUENV_NEAR_INDEX": lab.mirror_url}  # fmt: skip
        before = tx_bytes(lab.host_if)
        state = Disk(settle() if quiet else 0.0)
        seconds, result = gpuenv("build", cell, *extra, cwd=project, env=renv)
        return seconds, tx_bytes(lab.host_if) - before, result, state, served(lab)


def served(lab: AnotherHost) -> str:
    """What the lab's mirror served: requests, MB, and its longest request (the framework's
    wheel: the fetch phase's long pole) with its rate."""
    rows = lab.mirror_requests()
    if not rows:
        return "the mirror served nothing"
    longest = max(rows, key=lambda r: r.seconds)
    rate = longest.size / 1e6 / max(longest.seconds, 1e-3)
    return (f"the mirror served {len(rows)} requests, {sum(r.size for r in rows) / 1e6:.0f} "
            f"MB; longest {longest.path.rsplit('/', 1)[-1][:40]} {longest.size / 1e6:.0f} MB "
            f"in {longest.seconds:.1f} s ({rate:.0f} MB/s)")  # fmt: skip


def phases_of(seconds: float, result: dict) -> dict[str, float]:
    """The build's phases (none from a gpuenv that reports none), and `other`: the command's
    time outside the context, the engine's build and the tag."""
    got = {k: float(v) for k, v in (result.get("phases") or {}).items()}
    if got:
        got["other"] = seconds - got.get("context", 0) - got.get("build", 0) - got.get("tag", 0)
    return got


def phase_table(label: str, rounds: list[dict[str, float]], totals: list[float],
                loads: list[float], crossed: list[int] | None,
                disks: list[dict[str, float]]) -> None:  # fmt: skip
    """Each round's phases, its load average, the disk (GB dirty at its start, written and
    discarded during it), their medians, and why the slow rounds were slow: the phases
    that took more than SLOW seconds over their own median."""
    shown = [p for p in PHASES if any(p in r for r in rounds)]
    print(f"\n  {label}: seconds by phase; load average; disk GB")
    header = "".join(f"{p:>8}" for p in ["total", *shown, "load", *DISK.values()])
    print(f"    {'round':<7}{header}" + ("  MB link" if crossed else ""))
    for i, row in enumerate(rounds):
        cells = "".join(f"{row.get(p, 0.0):8.1f}" for p in shown)
        gb = "".join(f"{disks[i][k] / 1e3:8.2f}" for k in DISK)
        mb = f"{crossed[i] / 1e6:9.1f}" if crossed else ""
        print(f"    {i + 1:<7}{totals[i]:8.1f}{cells}{loads[i]:8.1f}{gb}{mb}")
    medians = {p: statistics.median(r.get(p, 0.0) for r in rounds) for p in shown}
    cells = "".join(f"{medians[p]:8.1f}" for p in shown)
    mb = f"{statistics.median(crossed) / 1e6:9.1f}" if crossed else ""
    print(f"    {'median':<7}{statistics.median(totals):8.1f}{cells}{'':{8 * (1 + len(DISK))}}{mb}")
    middle = statistics.median(totals)
    for i, row in enumerate(rounds):
        if totals[i] - middle > SLOW:
            why = [f"{p} +{row.get(p, 0.0) - medians[p]:.1f} s" for p in shown
                   if p != "build" and row.get(p, 0.0) - medians[p] > SLOW]  # fmt: skip
            print(f"    round {i + 1} is {totals[i] - middle:.1f} s over the median: "
                  f"{', '.join(why) or 'no one phase'} (load average {loads[i]:.1f})")  # fmt: skip


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cell", default="tf2.21-py3.11-cpu")
    parser.add_argument("--repeat", type=int, default=3, help="rounds, interleaved [3]")
    parser.add_argument("--legs", default=",".join(LEGS),
                        help=f"which legs, comma-separated [{','.join(LEGS)}]")  # fmt: skip
    parser.add_argument(
        "--before",
        type=Path,
        default=None,
        metavar="DIR",
        help="also time another checkout's gpuenv (DIR: its gpuenv/, images/)",
    )
    parser.add_argument("--same-id", action="store_true", help="also compare --reproducible IDs")
    parser.add_argument("--no-settle", dest="settle", action="store_false",
                        help="start each leg at once, not once the disk is quiet")  # fmt: skip
    parser.add_argument("--mirror-on-disk", action="store_true",
                        help="the lab's mirror serves from this disk, not a tmpfs")  # fmt: skip
    parser.add_argument("-f", "--file", type=Path, default=REPO / "matrix.yaml")
    args = parser.parse_args()
    legs = [leg.strip() for leg in args.legs.split(",") if leg.strip()]
    if not legs or any(leg not in LEGS for leg in legs):
        sys.exit(f"error: --legs {args.legs}: expected some of {', '.join(LEGS)}")
    if "local" not in legs:
        sys.exit("error: --legs: every ratio is against local; name it")
    check_rounds(args.repeat)
    work = Path(tempfile.mkdtemp(prefix="gpuenv-bench-engines-"))
    project, cache = work / "project", work / "cache"
    project.mkdir()
    text = args.file.read_text()
    name_line = next(line for line in text.splitlines() if line.startswith("name:"))
    (project / "matrix.yaml").write_text(text.replace(name_line, f"name: {NAME}"))
    env = {k: v for k, v in os.environ.items() if not k.startswith("GPUENV_")}
    env["XDG_CACHE_HOME"] = str(cache)
    checkouts = {"": env}
    if args.before:
        checkouts[" (before)"] = {**env, "PYTHONPATH": str(args.before.resolve())}
    image = f"{NAME}:{args.cell}"
    times: dict[str, list[float]] = {}
    crossed: dict[str, list[int]] = {}
    phases: dict[str, list[dict[str, float]]] = {}
    loads: dict[str, list[float]] = {}
    disks: dict[str, list[dict[str, float]]] = {}
    load = Load()
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
        add_uv_wheel(cache, wheels)  # the lab's host fetches uv near too
        size = sum(p.stat().st_size for p in wheels.glob("*.whl"))
        print(f"{args.cell}: {len(list(wheels.glob('*.whl')))} wheels, {size / 1e6:.0f} MB")
        for i in range(args.repeat):
            order = list(checkouts.items())
            order = order[i % len(order) :] + order[: i % len(order)]
            for suffix, base_env in order:
                for leg in legs:
                    label = LEGS[leg] + suffix
                    run_env = {**base_env, "GPUENV_NEAR_FETCH": "client"} if leg.endswith(
                        "-sent") else base_env  # fmt: skip
                    if leg.startswith("local"):
                        subprocess.run(["docker", "rmi", image], env=env, capture_output=True,
                                       check=False)  # fmt: skip
                        state = Disk(settle() if args.settle else 0.0)
                        seconds, result = gpuenv("build", args.cell, "--no-cache", cwd=project,
                                                 env=run_env)  # fmt: skip
                        shown = ""
                    else:
                        mode = "client" if leg.endswith("-sent") else "auto"
                        seconds, nbytes, result, state, mirror = remote(
                            project, cache, wheels, run_env, args.cell, mode,
                            quiet=args.settle, in_memory=not args.mirror_on_disk)  # fmt: skip
                        crossed.setdefault(label, []).append(nbytes)
                        shown = f", {nbytes / 1e6:.1f} MB crossed; {mirror}"
                    disks.setdefault(label, []).append(state.end())
                    times.setdefault(label, []).append(seconds)
                    phases.setdefault(label, []).append(phases_of(seconds, result))
                    loads.setdefault(label, []).append(load.sample())
                    print(f"    round {i + 1}, {label}: {seconds:.1f} s{shown} (load "
                          f"{loads[label][-1]:.1f}; the disk settled in {state.waited:.0f} s; "
                          f"ended {time.strftime('%H:%M:%S')})", flush=True)  # fmt: skip
        if args.same_id:
            _, here = gpuenv("build", args.cell, "--no-cache", "--reproducible", cwd=project,
                             env=env)  # fmt: skip
            there = remote(project, cache, wheels, env, args.cell, "auto", "--reproducible")[2]
    finally:
        subprocess.run(["docker", "rmi", image], env=env, capture_output=True, check=False)
        shutil.rmtree(work, ignore_errors=True)
    print(f"\n{args.cell}, {args.repeat} rounds, {load}")
    for label, rounds in phases.items():
        phase_table(label, rounds, times[label], loads[label], crossed.get(label), disks[label])
    print("\n  medians [each run], against local cold [each round]")
    for suffix in checkouts:
        reference = times[LEGS["local"] + suffix]
        for label, values in times.items():
            if not label.endswith(suffix) or (suffix == "" and "(before)" in label):
                continue
            link = crossed.get(label)
            sent_mb = f"  {runs([b / 1e6 for b in link], ' MB')} crossed" if link else ""
            print(f"  {label:<42} {runs(values):<30} {ratio(values, reference):<26}{sent_mb}")
    if args.same_id:
        ids = here["image_id"], there["image_id"]
        same = "same" if ids[0] == ids[1] else "DIFFERENT"
        print(f"  --reproducible: local {ids[0][:19]}, remote {ids[1][:19]}: {same}")


if __name__ == "__main__":
    main()
