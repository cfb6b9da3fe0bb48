"""What `gpuenv run` costs over `docker run --rm`, and what `gpuenv --help` costs.

    python benchmarks/run.py [-i IMAGE] [--rounds 3] [-n 3] [--warmup 1] [--network none]
                             [--tree DIR ...] [--no-bytecode] [--json]

Runs, interleaved (each run of a round starts with the next command, so that none always
goes first on a just-warmed engine, and drift in the engine or the machine hits all alike),
from a scratch working directory (gpuenv mounts the current directory):

    gpuenv run -i IMAGE --network MODE python3 -c pass
    docker run --rm --network MODE IMAGE python3 -c pass

then `gpuenv --help` against a bare `python -c pass` of the same interpreter. Each comparison
is --rounds rounds of -n runs of each command (3 x 3: a median of 9); every run is printed,
each round's difference and ratio beside the whole one's, and the load average before each
round and at the end (issue 48: a figure is quoted with its spread), and each command's
own CPU time (user + system of its processes; the engine's work is not in it), which a
loaded machine inflates far less than the wall time. Targets (issue 48):
run adds at most 0.15 s; --help takes at most 0.3 s.

`--tree DIR` (repeatable) times the gpuenv whose sources are in DIR (a `git archive` or a
worktree of another commit: its `gpuenv/` on PYTHONPATH) as one more command in the same
rounds, so that two versions are compared on the same machine at the same time.

Timed as an installed gpuenv runs, with its bytecode cached (pip compiles it at install
time): PYTHONDONTWRITEBYTECODE=1 would recompile every module on every run; --no-bytecode
keeps the environment's setting instead. Exit status 0 always: this measures, it does not
gate.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

DEFAULT_IMAGE = "gpuenv/tensorflow:tf2.21-py3.11-cpu"
RUN_TARGET_S = 0.15
HELP_TARGET_S = 0.3
ENV = dict(os.environ)
# The console script's own lines, for a tree run from its sources.
SCRIPT = "import sys; from gpuenv.cli import main; sys.argv[0] = 'gpuenv'; sys.exit(main())"


class Command:
    def __init__(self, name: str, argv: list[str], env: dict[str, str] | None = None) -> None:
        self.name, self.argv, self.env = name, argv, env or ENV


def gpuenv_commands(trees: list[Path]) -> list[tuple[str, list[str], dict[str, str] | None]]:
    """(name, argv head, environment) of each gpuenv timed: this environment's, then each tree's."""
    script = Path(sys.executable).parent / "gpuenv"
    found = str(script) if script.exists() else shutil.which("gpuenv")
    heads: list[tuple[str, list[str], dict[str, str] | None]] = [
        ("gpuenv", [found] if found else [sys.executable, "-m", "gpuenv"], None)
    ]
    for tree in trees:
        env = {**ENV, "PYTHONPATH": str(tree.resolve())}
        heads.append((f"gpuenv@{tree.name}", [sys.executable, "-c", SCRIPT], env))
    return heads


def timed(cmd: Command, cwd: str) -> tuple[float, float]:
    """(wall seconds, CPU seconds of the command's own processes: user + system)."""
    used = resource.getrusage(resource.RUSAGE_CHILDREN)
    start = time.perf_counter()
    proc = subprocess.run(cmd.argv, cwd=cwd, env=cmd.env, capture_output=True,
                          stdin=subprocess.DEVNULL)  # fmt: skip
    elapsed = time.perf_counter() - start
    if proc.returncode != 0:
        raise SystemExit(
            f"error: {' '.join(cmd.argv)} exited {proc.returncode}: "
            f"{proc.stderr.decode(errors='replace').strip()[-500:]}"
        )
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = (after.ru_utime - used.ru_utime) + (after.ru_stime - used.ru_stime)
    return elapsed, cpu


def load() -> list[float]:
    return [round(x, 2) for x in os.getloadavg()]


def rounds(cmds: list[Command], n: int, count: int, warmup: int, cwd: str) -> dict:
    """`count` rounds of `n` runs of each command; run i of a round starts with command
    i (mod the number of commands), so each takes every place in the order."""
    for _ in range(warmup):
        for cmd in cmds:
            timed(cmd, cwd)
    out: dict = {"rounds": [], "load_end": None}
    for _ in range(count):
        times: dict[str, list[float]] = {c.name: [] for c in cmds}
        cpu: dict[str, list[float]] = {c.name: [] for c in cmds}
        at = load()
        for i in range(n):
            k = i % len(cmds)
            for cmd in cmds[k:] + cmds[:k]:
                wall, used = timed(cmd, cwd)
                times[cmd.name].append(round(wall, 4))
                cpu[cmd.name].append(round(used, 4))
        out["rounds"].append({"load": at, "runs": times, "cpu": cpu})
    out["load_end"] = load()
    return out


def _runs(values: list[float]) -> str:
    return " ".join(f"{v:.3f}" for v in values)


def report(result: dict, reference: str, target: float, absolute: bool) -> dict:
    """Print every run, each round's difference and ratio against `reference`, and the
    medians of all runs; returns the summary. `absolute`: the target is the command's own
    time (--help), else its difference from the reference (run)."""
    names = list(result["rounds"][0]["runs"])
    width = max(len(n) for n in names)
    for r, rnd in enumerate(result["rounds"], 1):
        print(f"  round {r} (load average {' '.join(map(str, rnd['load']))}):")
        ref = statistics.median(rnd["runs"][reference])
        for name in names:
            m = statistics.median(rnd["runs"][name])
            vs = "" if name == reference else f"  {m - ref:+.3f} s, {m / ref:.2f}x"
            print(f"    {name:<{width}}  {_runs(rnd['runs'][name])}  median {m:.3f} s{vs}")
    print(f"  load average at the end: {' '.join(map(str, result['load_end']))}")
    everything = {n: [v for rnd in result["rounds"] for v in rnd["runs"][n]] for n in names}
    ref = statistics.median(everything[reference])
    summary: dict = {"runs": everything, "rounds": result["rounds"], "load_end": result["load_end"]}
    for name in names:
        values = everything[name]
        m = statistics.median(values)
        row = {"median_s": round(m, 4), "min_s": min(values), "max_s": max(values)}
        line = (f"  {name:<{width}}  median of {len(values)} {m:.3f} s "
                f"(min {min(values):.3f}, max {max(values):.3f})")  # fmt: skip
        if name != reference:
            medians = [(statistics.median(rnd["runs"][name]),
                        statistics.median(rnd["runs"][reference]))
                       for rnd in result["rounds"]]  # fmt: skip
            per_round = [a - b for a, b in medians]
            ratios = [a / b for a, b in medians]
            row |= {"difference_s": round(m - ref, 4), "ratio": round(m / ref, 3),
                    "round_differences_s": [round(d, 4) for d in per_round],
                    "round_ratios": [round(x, 3) for x in ratios]}  # fmt: skip
            line += (f"; {m - ref:+.3f} s, {m / ref:.2f}x over {reference} (rounds "
                     f"{', '.join(f'{d:+.3f} s' for d in per_round)}; "
                     f"{', '.join(f'{x:.2f}x' for x in ratios)})")  # fmt: skip
            ok = (m if absolute else m - ref) <= target
            row["within_target"] = ok
            line += f": {'within' if ok else 'OVER'} the target"
        print(line)
        cpu = [v for rnd in result["rounds"] for v in rnd["cpu"][name]]
        row["cpu_median_s"] = round(statistics.median(cpu), 4)
        print(f"  {'':<{width}}  its own CPU (user + system): median "
              f"{statistics.median(cpu):.3f} s (runs {_runs(cpu)})")  # fmt: skip
        summary[name] = row
    return summary


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("-i", "--image", default=DEFAULT_IMAGE)
    parser.add_argument("-n", "--runs", type=int, default=3, help="runs of each per round (3)")
    parser.add_argument("--rounds", type=int, default=3, help="interleaved rounds (3)")
    parser.add_argument("--warmup", type=int, default=1, help="untimed runs of each first (1)")
    parser.add_argument("--network", default="none", help="network mode for both (none)")
    parser.add_argument("--tree", type=Path, action="append", default=[],
                        help="also time the gpuenv whose sources are in DIR")  # fmt: skip
    parser.add_argument("--no-bytecode", action="store_true",
                        help="keep PYTHONDONTWRITEBYTECODE as the environment sets it")  # fmt: skip
    parser.add_argument("--json", action="store_true", help="also print the results as JSON")
    args = parser.parse_args()
    if args.runs < 1 or args.rounds < 1:
        parser.error("--runs and --rounds must be at least 1")
    for tree in args.tree:
        if not (tree / "gpuenv" / "__init__.py").is_file():
            parser.error(f"--tree {tree}: no gpuenv/__init__.py there")
    if not args.no_bytecode:
        ENV.pop("PYTHONDONTWRITEBYTECODE", None)
    docker = shutil.which("docker")
    if docker is None:
        raise SystemExit("error: no docker client on PATH")
    heads = gpuenv_commands(args.tree)
    plan = f"{args.rounds} rounds x {args.runs} runs of each, interleaved"
    print(f"bytecode cache: {'as the environment says' if args.no_bytecode else 'on'}")
    results = {}
    with tempfile.TemporaryDirectory(prefix="gpuenv-bench-") as cwd:
        os.chmod(cwd, 0o755)
        # python3: a cell's venv has it, and so does an image with only the distribution's
        # Python (gpuenv-bench/py:1, which has no `python`).
        cmd = ["python3", "-c", "pass"]
        runs = [Command(f"{name} run", [*head, "run", "-i", args.image, "--network",
                                        args.network, "--", *cmd], env)
                for name, head, env in heads]  # fmt: skip
        runs.append(Command("docker run --rm", [docker, "run", "--rm", "--network",
                                                args.network, args.image, *cmd]))  # fmt: skip
        print(f"run: {args.image}, {' '.join(cmd)}; {plan}; "
              f"target: gpuenv adds <= {RUN_TARGET_S} s")  # fmt: skip
        measured = rounds(runs, args.runs, args.rounds, args.warmup, cwd)
        results["run"] = report(measured, "docker run --rm", RUN_TARGET_S, absolute=False)

        helps = [Command(f"{name} --help", [*head, "--help"], env) for name, head, env in heads]
        helps.append(Command("python -c pass", [sys.executable, "-c", "pass"]))
        print(f"\nstartup: {plan}; target: gpuenv --help <= {HELP_TARGET_S} s")
        measured = rounds(helps, args.runs, args.rounds, args.warmup, cwd)
        results["help"] = report(measured, "python -c pass", HELP_TARGET_S, absolute=True)
    if args.json:
        print(json.dumps(results, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
