"""`gpuenv bench`: the seed's table (cell, device, workload, ms/step, epoch time, speed-up over
the first CPU row), measured by shipped workloads run in the cells' images.

Each workload is a file in `workloads/` that prints one JSON line (see workloads/_harness.py).
Bench copies them into a fresh directory and runs them from there through `gpuenv run`'s own
container path (run.run: the directory mounted at the same path, the caller's uid, init,
/dev/shm, removal on every path), with no network. GPU rows run only in GPU cells with --gpus;
a row that cannot be measured says why (no --gpus, the engine cannot give GPUs, the image is
not a GPU image, the workload failed) and is never measured elsewhere instead.
"""

from __future__ import annotations

import contextlib
import io
import json
import shutil
import tempfile
from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from gpuenv.matrix.errors import GpuenvError

if TYPE_CHECKING:
    from gpuenv.engine.client import Engine
    from gpuenv.gpu.gpus import GpuRequest
    from gpuenv.gpu.monitor import MonitorOptions
    from gpuenv.project.project import Project

WORKLOAD_DIR = Path(__file__).resolve().parent / "workloads"


@dataclass(frozen=True)
class Workload:
    name: str
    script: str
    args: tuple[str, ...]
    what: str
    gpu_only: bool = False
    baseline: str | None = None  # the workload whose first CPU row is its speed-up baseline


WORKLOADS = {
    w.name: w
    for w in (
        Workload(
            "lstm",
            "lstm.py",
            (),
            "seed 000's IMDB LSTM: 25000x80 tokens, emb 128, "
            "LSTM 128 (recurrent dropout: no cuDNN), batch 32",
        ),
        Workload(
            "lstm-cudnn",
            "lstm.py",
            ("--cudnn", "1"),
            "the same LSTM in its cuDNN-eligible configuration (GPU only)",
            gpu_only=True,
            baseline="lstm",
        ),
        Workload("cnn", "cnn.py", (), "small CNN, 50000 CIFAR-shaped images, batch 64"),
        Workload("matmul", "matmul.py", (), "2048x2048 float32 matmul throughput (TFLOP/s)"),
    )
}


def select_workloads(names: list[str] | None) -> list[Workload]:
    if not names:
        return list(WORKLOADS.values())
    unknown = [n for n in names if n not in WORKLOADS]
    if unknown:
        raise GpuenvError(
            f"--workload {unknown[0]}: no such workload; choose from {', '.join(WORKLOADS)}",
            exit_code=2,
        )
    return [WORKLOADS[n] for n in dict.fromkeys(names)]


@dataclass
class Row:
    cell: str
    image: str
    kind: str  # cpu | gpu: what the row measures
    workload: str
    device: str = ""
    ms_per_step: float | None = None
    epoch_s: float | None = None
    tflops: float | None = None
    speedup: float | None = None
    baseline: str | None = None  # "cell/workload" the speed-up is against
    missing: str | None = None  # why there is no measurement
    result: dict[str, Any] = field(default_factory=dict)  # the workload's own JSON


@dataclass(frozen=True)
class BenchOptions:
    patterns: list[str] | None = None
    gpus: GpuRequest | None = None
    workloads: list[Workload] = field(default_factory=lambda: list(WORKLOADS.values()))
    scale: float = 1.0
    monitor: MonitorOptions | None = None


# ---------------------------------------------------------------------------- pure parts


def parse_result(stdout: str) -> dict[str, Any] | None:
    """The workload's JSON line: the last stdout line that is a JSON object."""
    for line in reversed(stdout.strip().splitlines()):
        line = line.strip()
        if line.startswith("{"):
            with contextlib.suppress(ValueError):
                doc = json.loads(line)
                if isinstance(doc, dict):
                    return doc
    return None


def apply_speedups(rows: list[Row]) -> list[Row]:
    """Speed-up = the baseline's ms/step over the row's, where the baseline is the first
    measured CPU row of the workload (of its `baseline` workload for lstm-cudnn: the seed
    compares cuDNN against the CPU LSTM)."""
    first_cpu: dict[str, Row] = {}
    for row in rows:
        if row.kind == "cpu" and row.ms_per_step and row.workload not in first_cpu:
            first_cpu[row.workload] = row
    for row in rows:
        wl = WORKLOADS.get(row.workload)
        base = first_cpu.get(wl.baseline or row.workload if wl else row.workload)
        if base is not None and row.ms_per_step:
            row.speedup = round(base.ms_per_step / row.ms_per_step, 2)  # type: ignore[operator]
            row.baseline = f"{base.cell}/{base.workload}"
    return rows


def table(rows: list[Row]) -> list[tuple[str, ...]]:
    out: list[tuple[str, ...]] = [("cell", "device", "workload", "ms/step", "epoch", "speed-up")]
    for r in rows:
        if r.missing:
            out.append(
                (r.cell, r.device or r.kind.upper(), r.workload, "-", "-", f"missing: {r.missing}")
            )
            continue
        ms = f"{r.ms_per_step:.2f}" if r.ms_per_step is not None else "-"
        if r.tflops is not None:
            ms += f" ({r.tflops:.3g} TFLOP/s)"
        epoch = f"{r.epoch_s:.1f} s" if r.epoch_s is not None else "-"
        if r.speedup is None:
            speed = "-"
        elif r.baseline == f"{r.cell}/{r.workload}":
            speed = "1.0x (baseline)"
        else:
            speed = f"{r.speedup:.2f}x"
        out.append((r.cell, r.device, r.workload, ms, epoch, speed))
    return out


def as_json(rows: list[Row], scale: float) -> dict[str, Any]:
    return {"scale": scale, "rows": [asdict(r) for r in rows]}


CSV_COLUMNS = (
    "cell",
    "image",
    "kind",
    "device",
    "workload",
    "ms_per_step",
    "epoch_s",
    "tflops",
    "speedup",
    "baseline",
    "missing",
)


def write_csv(rows: list[Row], path: Path) -> None:
    import csv

    with open(path, "w", newline="", encoding="utf-8") as fh:
        writer = csv.DictWriter(fh, fieldnames=CSV_COLUMNS, extrasaction="ignore")
        writer.writeheader()
        for r in rows:
            writer.writerow(asdict(r))


def plot(rows: list[Row], path: Path) -> None:
    """A bar chart per workload: ms/step of every row (log scale), speed-ups written on the
    bars, missing rows named with their reason. Needs matplotlib (the `bench` extra)."""
    try:
        import matplotlib
    except ImportError:
        raise GpuenvError(
            "--plot needs matplotlib: pip install 'gpuenv[bench]'", exit_code=1
        ) from None
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    workloads = list(dict.fromkeys(r.workload for r in rows))
    fig, axes = plt.subplots(len(workloads), 1, figsize=(9, 1.6 + 1.1 * len(rows)), squeeze=False)
    for ax, name in zip(axes[:, 0], workloads, strict=True):
        mine = [r for r in rows if r.workload == name]
        labels = [f"{r.cell}\n{r.kind.upper()}" for r in mine]
        values = [r.ms_per_step or 0.0 for r in mine]
        colours = ["#4c72b0" if r.kind == "cpu" else "#55a868" for r in mine]
        bars = ax.barh(labels, values, color=colours)
        measured = [v for v in values if v > 0]
        if measured and max(measured) / min(measured) > 20:
            ax.set_xscale("log")
        if not measured:
            ax.set_xticks([])
        for bar, r in zip(bars, mine, strict=True):
            if r.missing:
                reason = r.missing.split(" (")[0].split(": install")[0][:70]
                ax.text(
                    0.02,
                    bar.get_y() + bar.get_height() / 2,
                    f"missing: {reason}",
                    transform=ax.get_yaxis_transform(),
                    va="center",
                    fontsize=7,
                    color="#c44e52",
                )
            else:
                note = f" {r.ms_per_step:.2f} ms"
                if r.speedup is not None:
                    note += f"  ({r.speedup:.2f}x)"
                ax.text(
                    bar.get_width(),
                    bar.get_y() + bar.get_height() / 2,
                    note,
                    va="center",
                    fontsize=8,
                )
        ax.set_title(f"{name}: {WORKLOADS[name].what if name in WORKLOADS else ''}", fontsize=9)
        ax.set_xlabel("ms/step (median, warm-up excluded; lower is better)")
        ax.margins(x=0.25)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


# ---------------------------------------------------------------------------- measuring


def plan(project: Project, patterns: list[str] | None) -> list[tuple[str, bool]]:
    """(cell, is_gpu) to measure: the patterns' cells, else the default CPU and GPU cells."""
    if patterns:
        cells = project.select(patterns)
    else:
        cells = [c for c in (project.resolution.default_cpu, project.resolution.default_gpu) if c]
    # The workloads are TensorFlow programs: a torch or JAX cell would only fail to import it.
    other = [c.name for c in cells if c.framework != "tensorflow"]
    if other:
        raise GpuenvError(
            f"gpuenv bench measures TensorFlow workloads; {', '.join(other)} "
            f"{'is' if len(other) == 1 else 'are'} not TensorFlow cells: name tf* cells"
        )
    return [(c.name, c.is_gpu) for c in cells]


@contextlib.contextmanager
def workload_dir() -> Iterator[Path]:
    """A fresh directory holding the workloads: `gpuenv run` mounts the current directory,
    and this one is it (readable by the caller's uid, which the container runs as)."""
    tmp = Path(tempfile.mkdtemp(prefix="gpuenv-bench-"))
    try:
        tmp.chmod(0o755)
        for src in WORKLOAD_DIR.glob("*.py"):
            shutil.copy2(src, tmp / src.name)
        yield tmp
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def command_for(workload: Workload, kind: str, scale: float) -> list[str]:
    return ["python", workload.script, *workload.args, "--device", kind, "--scale", f"{scale:g}"]


Say = Callable[[str], None]


def measure(
    engine: Engine,
    image: str,
    workload: Workload,
    kind: str,
    gpus: GpuRequest | None,
    scale: float,
    cwd: Path,
    monitor: MonitorOptions | None = None,
) -> dict[str, Any]:
    """Run one workload in one image through `gpuenv run`'s path; its JSON result, or a
    GpuenvError saying why there is none."""
    from gpuenv.run import local as run

    opts = run.RunOptions(
        image=image,
        command=command_for(workload, kind, scale),
        gpus=gpus if kind == "gpu" else None,
        network="none",
        cwd=cwd,
        env=["TF_CPP_MIN_LOG_LEVEL=2"],
        monitor=monitor if kind == "gpu" else None,
    )
    out, err = io.BytesIO(), io.BytesIO()
    code = run.run(engine, opts, stdout=out, stderr=err)
    stdout = out.getvalue().decode(errors="replace")
    doc = parse_result(stdout)
    if doc is not None and "error" in doc:
        raise GpuenvError(str(doc["error"]))
    if code != 0 or doc is None:
        tail = err.getvalue().decode(errors="replace").strip().splitlines()[-3:]
        raise GpuenvError(f"the workload exited {code}: {' | '.join(tail)[-300:]}")
    return doc


def bench(engine: Engine, project: Project, opts: BenchOptions, say: Say) -> list[Row]:
    from gpuenv.run import preflight, target

    rows: list[Row] = []
    with workload_dir() as cwd:
        for cell, is_gpu in plan(project, opts.patterns):
            kind = "gpu" if is_gpu else "cpu"
            wanted = [w for w in opts.workloads if is_gpu or not w.gpu_only]
            why = None
            if is_gpu and opts.gpus is None:
                why = "no --gpus given (pass --gpus all to measure on the GPU)"
            image = ""
            if why is None:
                try:
                    chosen = target.target_for(engine, cell, is_gpu, project)
                    image = chosen.image
                    preflight.gpu_preflight(engine, chosen, opts.gpus if is_gpu else None)
                except GpuenvError as exc:
                    why = exc.message
            for wl in wanted:
                row = Row(cell=cell, image=image, kind=kind, workload=wl.name)
                rows.append(row)
                if why is not None:
                    row.missing = why
                    continue
                say(f"{cell}: {wl.name} on the {kind.upper()} (scale {opts.scale:g})")
                try:
                    doc = measure(engine, image, wl, kind, opts.gpus, opts.scale, cwd, opts.monitor)
                except GpuenvError as exc:
                    row.missing = exc.message
                    if is_gpu and _engine_refused(exc.message):
                        why = exc.message  # the same for every GPU workload of the cell
                    continue
                row.result = doc
                row.device = str(doc.get("device", ""))
                row.ms_per_step = doc.get("ms_per_step")
                row.epoch_s = doc.get("epoch_s")
                row.tflops = doc.get("tflops")
    return apply_speedups(rows)


def _engine_refused(message: str) -> bool:
    return "cannot give containers GPUs" in message or "NVIDIA" in message


def summary_lines(rows: list[Row], scale: float) -> list[str]:
    lines = [
        "ms/step: median over the measured steps, warm-up steps excluded; epoch: the full "
        "dataset's epoch at that median (the seed's 25000 samples / batch 32 for the LSTMs)"
    ]
    if scale != 1:
        lines.append(
            f"scale {scale:g}: each workload ran on {scale:g} of its dataset; the epoch "
            "column is extrapolated from the measured median"
        )
    if not any(r.ms_per_step for r in rows):
        lines.append("nothing was measured")
    return lines
