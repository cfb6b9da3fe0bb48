"""GPU monitoring while a workload runs: `gpuenv run --monitor` and `gpuenv monitor -- CMD`.

Three parts, kept apart so the first two are unit-tested without a GPU:

- parsing: `nvidia-smi --query-gpu=... --format=csv [-lms N]` text, with its header and
  units, in whatever column order (`CsvParser`); the processes of a container, found from
  their cgroup (`container_id_of`, `pids_of_container`), or of a command's process tree;
- aggregation: per GPU, mean and peak utilisation, peak memory, energy (the trapezoid
  integral of power over time), and seed 001's advice when the GPU mostly waited;
- sources: NVML (nvidia-ml-py, imported lazily) on the machine gpuenv runs on, for local
  engines and for `gpuenv monitor`; a helper container streaming `nvidia-smi -lms` on the
  same devices, for remote engines (their GPUs are not this machine's).

No GPU (this machine has none): nothing is sampled and the summary says so, plainly.
"""

from __future__ import annotations

import contextlib
import csv
import itertools
import re
import sys
import threading
import time
from collections.abc import Callable, Iterable, Iterator
from dataclasses import asdict, dataclass, field
from datetime import datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

from gpuenv.matrix.errors import GpuenvError

if TYPE_CHECKING:
    from gpuenv.engine.client import Engine
    from gpuenv.gpu.gpus import GpuRequest

DEFAULT_INTERVAL = 0.5  # seconds; NVML's utilisation is itself averaged over 1/6 s to 1 s
LOW_UTILISATION = 50.0  # %: below this mean the GPU mostly waited
# What the helper container asks nvidia-smi for (`nvidia-smi --help-query-gpu` names them).
QUERY = (
    "timestamp,index,uuid,utilization.gpu,memory.used,memory.total,power.draw,"
    "temperature.gpu,clocks.sm"
)
# Header names nvidia-smi prints (units in brackets dropped) -> Sample fields.
_COLUMNS = {
    "timestamp": "timestamp",
    "index": "index",
    "uuid": "uuid",
    "name": "name",
    "utilization.gpu": "util",
    "memory.used": "mem_used",
    "memory.total": "mem_total",
    "power.draw": "power",
    "temperature.gpu": "temp",
    "clocks.current.sm": "sm_clock",
    "clocks.sm": "sm_clock",
}
_NUMBER = re.compile(r"-?\d+(?:\.\d+)?")


# ---------------------------------------------------------------------------- samples


@dataclass(frozen=True)
class Sample:
    """One GPU at one moment. Memory in MiB, power in W, temperature in C, clock in MHz;
    None where the GPU does not report it ([N/A], [Not Supported])."""

    t: float  # seconds since sampling started
    gpu: str  # index, else UUID, else position
    util: float | None = None
    mem_used: float | None = None
    mem_total: float | None = None
    power: float | None = None
    temp: float | None = None
    sm_clock: float | None = None
    proc_mem: float | None = None  # MiB held by the watched processes (NVML only)
    name: str = ""


CSV_FIELDS = tuple(f for f in Sample.__dataclass_fields__)


def _number(text: str) -> float | None:
    """'95 %' -> 95.0, '81.25 W' -> 81.25, '[N/A]' / '[Not Supported]' / '' -> None."""
    m = _NUMBER.search(text)
    return float(m.group(0)) if m and not text.strip().startswith("[") else None


def parse_timestamp(text: str) -> float:
    """nvidia-smi's timestamp column, 'YYYY/MM/DD HH:MM:SS.mmm', as epoch seconds."""
    text = text.strip()
    for fmt in ("%Y/%m/%d %H:%M:%S.%f", "%Y/%m/%d %H:%M:%S"):
        with contextlib.suppress(ValueError):
            return datetime.strptime(text, fmt).timestamp()
    raise ValueError(f"not an nvidia-smi timestamp: {text!r}")


class CsvParser:
    """`nvidia-smi --query-gpu=... --format=csv` lines, one at a time (a stream from
    `-lms N` works as well as a file). The header names the columns, so any query order
    works; a repeated header is skipped. Without a timestamp column, time comes from the
    sampling interval: a GPU seen again starts the next round."""

    def __init__(self, interval: float | None = None) -> None:
        self.interval = interval
        self.columns: list[str | None] | None = None
        self._t0: float | None = None
        self._round = 0
        self._seen: set[str] = set()

    def feed(self, line: str) -> Sample | None:
        cells = [c.strip() for c in line.strip().split(", ")]
        if not line.strip():
            return None
        names = [re.sub(r"\s*\[.*\]$", "", c) for c in cells]
        if any(n in _COLUMNS for n in names) and not any(_NUMBER.fullmatch(c) for c in cells):
            self.columns = [_COLUMNS.get(n) for n in names]
            return None
        if self.columns is None or len(cells) != len(self.columns):
            return None  # no header yet, or an error line ("No devices were found")
        row = {k: v for k, v in zip(self.columns, cells, strict=True) if k}
        # Which GPU: its index or UUID; else its name (a query without either).
        key = row.get("index") or row.get("uuid") or row.get("name") or "0"
        if key in self._seen:
            self._round += 1
            self._seen.clear()
        self._seen.add(key)
        if "timestamp" in row:
            stamp = parse_timestamp(row["timestamp"])
            if self._t0 is None:
                self._t0 = stamp
            t = stamp - self._t0
        else:
            if self.interval is None:
                raise GpuenvError("nvidia-smi output without timestamps needs the interval")
            t = self._round * self.interval
        metrics = ("util", "mem_used", "mem_total", "power", "temp", "sm_clock")
        values = {k: _number(row[k]) for k in metrics if k in row}
        return Sample(t=round(t, 3), gpu=key, name=row.get("name", ""), **values)


def parse_csv(text: str, interval: float | None = None) -> list[Sample]:
    parser = CsvParser(interval)
    return [s for line in text.splitlines() if (s := parser.feed(line)) is not None]


# ---------------------------------------------------------------------------- summary


@dataclass(frozen=True)
class GpuSummary:
    gpu: str
    name: str
    samples: int
    duration_s: float
    mean_util: float | None
    peak_util: float | None
    peak_mem: float | None  # MiB, the whole GPU
    mem_total: float | None
    peak_proc_mem: float | None  # MiB, the watched processes only
    energy_j: float | None
    mean_power: float | None
    peak_power: float | None
    peak_temp: float | None
    mean_sm_clock: float | None


def _values(samples: list[Sample], name: str) -> list[float]:
    return [v for s in samples if (v := getattr(s, name)) is not None]


def energy_joules(points: Iterable[tuple[float, float]]) -> float | None:
    """The trapezoid integral of power (W) over time (s): joules. None under two points."""
    pts = sorted(points)
    if len(pts) < 2:
        return None
    return sum((p0 + p1) / 2 * (t1 - t0) for (t0, p0), (t1, p1) in itertools.pairwise(pts))


def summarise(samples: list[Sample]) -> list[GpuSummary]:
    by_gpu: dict[str, list[Sample]] = {}
    for s in samples:
        by_gpu.setdefault(s.gpu, []).append(s)
    out = []
    for gpu, rows in by_gpu.items():
        util, power = _values(rows, "util"), _values(rows, "power")
        mem, proc, clock = _values(rows, "mem_used"), _values(rows, "proc_mem"), _values(
            rows, "sm_clock")  # fmt: skip
        total, temp = _values(rows, "mem_total"), _values(rows, "temp")
        times = [s.t for s in rows]
        out.append(
            GpuSummary(
                gpu=gpu,
                name=next((s.name for s in rows if s.name), ""),
                samples=len(rows),
                duration_s=round(max(times) - min(times), 3),
                mean_util=round(sum(util) / len(util), 1) if util else None,
                peak_util=max(util) if util else None,
                peak_mem=max(mem) if mem else None,
                mem_total=max(total) if total else None,
                peak_proc_mem=max(proc) if proc else None,
                energy_j=_round(energy_joules((s.t, s.power) for s in rows if s.power is not None)),
                mean_power=round(sum(power) / len(power), 1) if power else None,
                peak_power=max(power) if power else None,
                peak_temp=max(temp) if temp else None,
                mean_sm_clock=round(sum(clock) / len(clock)) if clock else None,
            )
        )
    return out


def _round(value: float | None) -> float | None:
    return None if value is None else round(value, 1)


SEED_ADVICE = (
    "increase the batch size; prepare mini-batches asynchronously (tf.data: "
    ".prefetch(tf.data.AUTOTUNE)); preprocess the data once and store it in an efficient "
    "format instead of on the fly; build batches in parallel (.map(..., "
    "num_parallel_calls=tf.data.AUTOTUNE), several workers)"
)


def advice(summary: GpuSummary, threshold: float = LOW_UTILISATION) -> str | None:
    """A warning when the GPU was mostly idle, with seed 001's remedies; else None."""
    if summary.mean_util is None or summary.samples < 3 or summary.mean_util >= threshold:
        return None
    what = f"GPU {summary.gpu} was busy {summary.mean_util:.0f}% of the time on average"
    if (summary.peak_util or 0) >= 80:
        why = (f" (peaks of {summary.peak_util:.0f}%): it computes fast, then waits for the "
               "next batch, the signature of an input-pipeline-bound run")  # fmt: skip
    else:
        why = (f" (peak {summary.peak_util or 0:.0f}%): the steps are too small to fill it, "
               "or the work ran elsewhere (the CPU)")  # fmt: skip
    return f"{what}{why}. To use it: {SEED_ADVICE}"


def format_summary(summaries: list[GpuSummary], interval: float) -> list[str]:
    lines = []
    for s in summaries:

        def num(v: float | None, unit: str, fmt: str = ".0f") -> str:
            return "n/a" if v is None else f"{v:{fmt}}{unit}"

        mem = num(s.peak_mem, " MiB")
        if s.mem_total is not None:
            mem += f" of {s.mem_total:.0f} MiB"
        if s.peak_proc_mem is not None:
            mem += f" ({s.peak_proc_mem:.0f} MiB by the workload)"
        lines.append(
            f"GPU {s.gpu}{f' ({s.name})' if s.name else ''}: {s.samples} samples every "
            f"{interval:g} s over {s.duration_s:.1f} s; utilisation mean "
            f"{num(s.mean_util, '%')}, peak {num(s.peak_util, '%')}; memory peak {mem}; "
            f"energy {num(s.energy_j, ' J', '.1f')} (mean {num(s.mean_power, ' W', '.1f')}, "
            f"peak {num(s.peak_power, ' W', '.1f')}); temperature peak {num(s.peak_temp, ' C')}; "
            f"SM clock mean {num(s.mean_sm_clock, ' MHz')}"
        )
    return lines


def write_csv(samples: list[Sample], path: Path) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "w", newline="", encoding="utf-8") as fh:
        writer = csv.DictWriter(fh, fieldnames=CSV_FIELDS)
        writer.writeheader()
        writer.writerows(asdict(s) for s in samples)


# ---------------------------------------------------------------------------- processes

_CID = re.compile(r"(?:^|[/-])([0-9a-f]{64})(?:\.scope)?(?:/|$)")


def container_id_of(cgroup: str) -> str | None:
    """The container ID in a /proc/PID/cgroup: cgroup v1 `N:memory:/docker/<id>`, v2
    `0::/docker/<id>` or systemd's `0::/system.slice/docker-<id>.scope`, and the
    containerd/CRI-O/podman forms (`cri-containerd-<id>.scope`, `crio-<id>`, `libpod-<id>`).
    None for a process in no container."""
    for line in cgroup.splitlines():
        path = line.split(":", 2)[-1]
        m = _CID.search(path)
        if m:
            return m.group(1)
    return None


def pids_of_container(cid: str, proc: Path = Path("/proc")) -> set[int]:
    """Host PIDs whose cgroup names the container (cid: the full ID, or a prefix)."""
    found = set()
    for entry in proc.iterdir() if proc.is_dir() else ():
        if not entry.name.isdigit():
            continue
        try:
            text = (entry / "cgroup").read_text(encoding="utf-8", errors="replace")
        except OSError:  # gone, or not ours to read
            continue
        owner = container_id_of(text)
        if owner is not None and owner.startswith(cid):
            found.add(int(entry.name))
    return found


def parent_of(stat: str) -> int | None:
    """The PPID field of /proc/PID/stat (the command name may hold spaces and ')')."""
    rest = stat.rpartition(")")[2].split()
    return int(rest[1]) if len(rest) > 1 and rest[1].isdigit() else None


def descendants(root: int, parents: dict[int, int]) -> set[int]:
    """root and every process below it, from a {pid: ppid} map."""
    children: dict[int, list[int]] = {}
    for pid, ppid in parents.items():
        children.setdefault(ppid, []).append(pid)
    found, todo = {root}, [root]
    while todo:
        for child in children.get(todo.pop(), []):
            if child not in found:
                found.add(child)
                todo.append(child)
    return found


def process_tree(root: int, proc: Path = Path("/proc")) -> set[int]:
    parents = {}
    for entry in proc.iterdir():
        if entry.name.isdigit():
            with contextlib.suppress(OSError):
                ppid = parent_of((entry / "stat").read_text(encoding="utf-8", errors="replace"))
                if ppid is not None:
                    parents[int(entry.name)] = ppid
    return descendants(root, parents)


# ---------------------------------------------------------------------------- sources


class NoGpu(Exception):
    """Nothing to sample, and why (no driver, no NVML, no GPU given)."""


class Source(Protocol):
    def sample(self, t: float) -> list[Sample]: ...

    def close(self) -> None: ...


def devices_for(gpus: GpuRequest | None, count: int) -> list[str]:
    """NVML device ids (index or UUID) a --gpus request gives a container: all; the first
    N (what dockerd's nvidia driver does with a count); or the ids named."""
    if gpus is None or gpus.count == -1:
        return [str(i) for i in range(count)]
    if gpus.device_ids:
        return list(gpus.device_ids)
    return [str(i) for i in range(min(gpus.count or 0, count))]


class NvmlSource:
    """NVML on this machine: the devices, and the memory of the watched processes
    (NVML's process list, host PIDs, kept when `pids()` holds them)."""

    def __init__(self, gpus: GpuRequest | None, pids: Callable[[], set[int]] | None) -> None:
        try:
            import pynvml
        except ImportError:
            raise NoGpu("nvidia-ml-py is not installed (pip install 'gpuenv[monitor]')") from None
        self.nv = pynvml
        try:
            pynvml.nvmlInit()
        except pynvml.NVMLError as exc:
            raise NoGpu(f"NVML cannot start on this machine: {exc} (no NVIDIA driver)") from None
        count = pynvml.nvmlDeviceGetCount()
        ids = devices_for(gpus, count)
        if not ids:
            pynvml.nvmlShutdown()
            raise NoGpu("NVML lists no GPU on this machine")
        self.handles = []
        for ident in ids:
            if ident.isdigit():
                handle = pynvml.nvmlDeviceGetHandleByIndex(int(ident))
            else:
                handle = pynvml.nvmlDeviceGetHandleByUUID(ident)
            self.handles.append((ident, handle, self._get(pynvml.nvmlDeviceGetName, handle)))
        self.pids = pids

    def _get(self, fn: Callable[..., Any], *args: Any) -> Any:
        try:
            value = fn(*args)
        except self.nv.NVMLError:  # [Not Supported] on this GPU
            return None
        return value.decode() if isinstance(value, bytes) else value

    def sample(self, t: float) -> list[Sample]:
        nv = self.nv
        watched = self.pids() if self.pids is not None else None
        out = []
        for ident, h, name in self.handles:
            util = self._get(nv.nvmlDeviceGetUtilizationRates, h)
            mem = self._get(nv.nvmlDeviceGetMemoryInfo, h)
            power = self._get(nv.nvmlDeviceGetPowerUsage, h)  # mW
            proc_mem = None
            if watched is not None:
                procs = self._get(nv.nvmlDeviceGetComputeRunningProcesses, h) or []
                proc_mem = process_memory(procs, watched)
            out.append(
                Sample(
                    t=round(t, 3),
                    gpu=ident,
                    name=name or "",
                    util=None if util is None else float(util.gpu),
                    mem_used=None if mem is None else mem.used / 2**20,
                    mem_total=None if mem is None else mem.total / 2**20,
                    power=None if power is None else power / 1000,
                    temp=self._get(nv.nvmlDeviceGetTemperature, h, nv.NVML_TEMPERATURE_GPU),
                    sm_clock=self._get(nv.nvmlDeviceGetClockInfo, h, nv.NVML_CLOCK_SM),
                    proc_mem=proc_mem,
                )
            )
        return out

    def close(self) -> None:
        with contextlib.suppress(Exception):
            self.nv.nvmlShutdown()


def process_memory(procs: Iterable[Any], pids: set[int]) -> float:
    """MiB of GPU memory NVML's process list gives the watched PIDs (usedGpuMemory is None
    where the driver cannot tell, e.g. under some vGPU setups)."""
    used = [p.usedGpuMemory for p in procs if p.pid in pids]
    return round(sum(int(u) for u in used if u is not None) / 2**20, 1)


@dataclass
class Sampler:
    """Calls a source every `interval` seconds on a thread; collects the samples."""

    source: Source
    interval: float
    samples: list[Sample] = field(default_factory=list)
    error: str | None = None

    def __post_init__(self) -> None:
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, daemon=True, name="gpuenv-monitor")

    def start(self) -> Sampler:
        self._t0 = time.monotonic()
        self._thread.start()
        return self

    def _loop(self) -> None:
        while True:
            try:
                self.samples.extend(self.source.sample(time.monotonic() - self._t0))
            except Exception as exc:  # a GPU that fell off the bus: say so, stop sampling
                self.error = str(exc)
                return
            if self._stop.wait(self.interval):
                return

    def stop(self) -> list[Sample]:
        self._stop.set()
        self._thread.join(timeout=5)
        self.source.close()
        return self.samples


# ---------------------------------------------------------------------------- options


@dataclass(frozen=True)
class MonitorOptions:
    interval: float = DEFAULT_INTERVAL
    out: Path | None = None

    @classmethod
    def parse(cls, value: str | None, out: Path | None) -> MonitorOptions | None:
        """`--monitor[=INTERVAL]`: seconds ('0.5', '2s') or milliseconds ('250ms')."""
        if value is None:
            if out is not None:
                raise GpuenvError("--monitor-out needs --monitor", exit_code=2)
            return None
        text = value.strip().lower()
        if text in ("", "default"):
            return cls(DEFAULT_INTERVAL, out)
        m = re.fullmatch(r"(\d+(?:\.\d+)?)\s*(ms|s)?", text)
        seconds = (float(m.group(1)) / (1000 if m.group(2) == "ms" else 1)) if m else 0.0
        if not 0.05 <= seconds <= 3600:
            raise GpuenvError(
                f"--monitor={value}: the interval is seconds (0.5, 2s) or milliseconds "
                "(250ms), at least 50 ms",
                exit_code=2,
            )
        return cls(seconds, out)


def report(samples: list[Sample], opts: MonitorOptions, no_gpu: str | None,
           error: str | None = None) -> None:  # fmt: skip
    """The summary on stderr (stdout stays the workload's), and the CSV when asked."""

    def say(text: str) -> None:
        print(f"gpuenv monitor: {text}", file=sys.stderr)

    if no_gpu is not None:
        say(f"no GPU was sampled: {no_gpu}")
    if error:
        say(f"sampling stopped early: {error}")
    if opts.out is not None:
        write_csv(samples, opts.out)
        say(f"{len(samples)} samples written to {opts.out}")
    if no_gpu is None and not samples:
        say("no sample was taken (the workload ended first)")
    summaries = summarise(samples)
    for line in format_summary(summaries, opts.interval):
        say(line)
    for s in summaries:
        text = advice(s)
        if text:
            print(f"warning: {text}", file=sys.stderr)


# ---------------------------------------------------------------------------- containers


@contextlib.contextmanager
def watching(engine: Engine, cid: str, image: str, gpus: GpuRequest | None,
             opts: MonitorOptions | None) -> Iterator[None]:  # fmt: skip
    """Sample the container's GPUs while the block runs, then report. A local engine's
    GPUs are this machine's (NVML, with the container's own processes found through their
    cgroup); a remote engine's are sampled by a helper container on the same devices."""
    if opts is None:
        yield
        return
    sampler: Sampler | StreamSampler | None = None
    no_gpu = None
    try:
        if gpus is None:
            raise NoGpu("no --gpus given: the container has no GPU to sample")
        if engine.is_local:
            sampler = Sampler(NvmlSource(gpus, lambda: pids_of_container(cid)), opts.interval)
        else:
            sampler = StreamSampler(engine, image, gpus, opts.interval)
        sampler.start()
    except NoGpu as exc:
        no_gpu = str(exc)
    try:
        yield
    finally:
        samples = sampler.stop() if sampler is not None else []
        report(samples, opts, no_gpu, sampler.error if sampler is not None else None)


class StreamSampler:
    """`nvidia-smi --query-gpu=... --format=csv -lms N` in a helper container given the
    same --gpus, for an engine on another host. The container's processes are on that host,
    so their own GPU memory is not known here (the whole GPU's is)."""

    def __init__(self, engine: Engine, image: str, gpus: GpuRequest, interval: float) -> None:
        from gpuenv.engine.client import ContainerSpec
        from gpuenv.gpu import cdi
        from gpuenv.matrix import contract

        self.engine, self.error = engine, None
        self.samples: list[Sample] = []
        self.parser = CsvParser(interval)
        command = ["nvidia-smi", f"--query-gpu={QUERY}", "--format=csv",
                   f"-lms={max(int(interval * 1000), 50)}"]  # fmt: skip
        spec = ContainerSpec(image, command, **cdi.devices_for(engine, gpus), network="none",
                             env={"NVIDIA_DRIVER_CAPABILITIES": "utility"},
                             labels=contract.container_labels("monitor"), init=True)  # fmt: skip
        self.cid = engine.create(spec)
        self._thread = threading.Thread(target=self._read, daemon=True, name="gpuenv-monitor")

    def start(self) -> StreamSampler:
        try:
            self._stream = self.engine.attach(self.cid)
            self.engine.start(self.cid)
        except BaseException:
            # The helper exists from __init__ on; nothing else would remove it now.
            with contextlib.suppress(GpuenvError):
                self.engine.remove_container(self.cid)
            raise
        self._thread.start()
        return self

    def _read(self) -> None:
        pending = b""
        try:
            for out, _err in self._stream:
                pending += out or b""
                *lines, pending = pending.split(b"\n")
                for line in lines:
                    sample = self.parser.feed(line.decode(errors="replace"))
                    if sample is not None:
                        self.samples.append(sample)
        except Exception as exc:
            self.error = str(exc)

    def stop(self) -> list[Sample]:
        with contextlib.suppress(GpuenvError):
            self.engine.remove_container(self.cid)
        self._thread.join(timeout=5)
        return self.samples


# ---------------------------------------------------------------------------- gpuenv monitor


def monitor_command(argv: list[str], opts: MonitorOptions) -> int:
    """`gpuenv monitor -- CMD`: run CMD on this machine, sample every GPU (NVML) and the
    memory of CMD's process tree, report; the exit code is CMD's."""
    import subprocess

    if not argv:
        raise GpuenvError("nothing to run: gpuenv monitor [OPTIONS] -- CMD [ARGS...]", exit_code=2)
    try:
        child = subprocess.Popen(argv)
    except FileNotFoundError:
        raise GpuenvError(f"{argv[0]}: command not found", exit_code=127) from None
    except PermissionError:
        raise GpuenvError(f"{argv[0]}: cannot be executed", exit_code=126) from None
    sampler, no_gpu = None, None
    try:
        sampler = Sampler(NvmlSource(None, lambda: process_tree(child.pid)), opts.interval).start()
    except NoGpu as exc:
        no_gpu = str(exc)
    try:
        while True:
            try:
                code = child.wait()
                break
            except KeyboardInterrupt:  # the terminal sent CMD the same SIGINT; wait for it
                continue
    finally:
        samples = sampler.stop() if sampler is not None else []
        report(samples, opts, no_gpu, sampler.error if sampler is not None else None)
    return 128 - code if code < 0 else code
