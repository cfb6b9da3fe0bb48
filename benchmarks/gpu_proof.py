"""The GPU proof: what gpuenv says and measures on a real GPU host, as one report.

Run by scripts/gpu-proof.sh on a bare, offline GPU host (gpuenv installed there from carried
wheels; its own PyTorch and JAX; no container engine), and, with no GPU, here and in CI:

1. `nvidia-smi -q -x` (raw) and NVML readings: driver, GPUs, compute capability;
2. `gpuenv doctor --json`: what doctor finds on this host (no engine: said as such);
3. `gpuenv validate --host local:// --gpus all --json`: the device checks against the host's
   own PyTorch and JAX (what needs an image skips, with the reason);
4. `gpuenv monitor --out monitor.csv -- <a PyTorch matmul loop>`: NVML samples during GPU
   work; utilisation, memory and power must each move;
5. seed 000's table for PyTorch (gpuenv/bench/workloads/lstm_torch.py): the LSTM on the CPU,
   on the GPU without cuDNN, and cuDNN's fused LSTM, through gpuenv.bench's table.

Every GPU step is skipped, with the reason, when the host has no NVIDIA GPU; nothing is
ever measured on the CPU in a GPU step's place. Writes, flat in the output directory (the
device tool brings back at most 8 files): report.json, report.txt, nvidia-smi-q.xml,
nvml.json, monitor.csv, outputs.json (every command's argv, exit code, stdout, stderr).
Exit 0 when no step failed (skipped steps included), else 1.

The parsers (`parse_smi_xml`, `read_monitor_csv`, `movement`, `validate_summary`,
`bench_rows`) are pure and unit-tested on recordings (tests/unit/test_gpu_proof.py).
"""

from __future__ import annotations

import argparse
import csv
import io
import json
import os
import shlex
import shutil
import subprocess
import sys
import time
import xml.etree.ElementTree as ET
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from gpuenv.bench import benchmark as bench
from gpuenv.gpu.monitor import CSV_FIELDS, Sample

BUDGET_S = 480  # the 8 minutes, start-up of the venv excluded (it is seconds)
WORKLOADS = Path(bench.__file__).resolve().parent / "workloads"
# The GPU work monitor watches: 8192^2 float32 products for MONITOR_S seconds (memory for
# three 256 MiB matrices, the SMs busy, the power draw up).
MONITOR_S = 12
GPU_WORK = (
    "import time, torch\n"
    "x = torch.randn(8192, 8192, device='cuda'); y = torch.empty_like(x)\n"
    f"end = time.time() + {MONITOR_S}\n"
    "while time.time() < end:\n"
    "    torch.matmul(x, x, out=y); torch.cuda.synchronize()\n"
    "print('done')"
)
DEVICE_CHECKS = (
    "nvidia smi works",
    "framework sees the requested gpus",
    "matmul runs on gpu0",
    "cudnn op runs",
    "gpu compute capability runs the framework",
    "all reduce across the requested gpus",
)


@dataclass
class Step:
    name: str
    status: str = "skipped"  # passed | failed | skipped
    reason: str = ""
    seconds: float = 0.0
    details: dict[str, Any] = field(default_factory=dict)


# ---------------------------------------------------------------------------- parsers


def _mib(text: str | None) -> float | None:
    """'11567 MiB' -> 11567.0, '33.4 %' -> 33.4, '24.84 W' -> 24.84, 'N/A' -> None."""
    if not text:
        return None
    word = text.strip().split(" ")[0]
    try:
        return float(word)
    except ValueError:
        return None


def parse_smi_xml(text: str) -> dict[str, Any]:
    """`nvidia-smi -q -x`: the driver, CUDA version and each GPU's name, UUID, memory,
    utilisation and power. Raises ValueError for text that is no nvidia-smi log."""
    try:
        root = ET.fromstring(text)
    except ET.ParseError as exc:
        raise ValueError(f"not an nvidia-smi -q -x log: {exc}") from None
    if root.tag != "nvidia_smi_log":
        raise ValueError(f"not an nvidia-smi -q -x log: <{root.tag}>")
    gpus = []
    for gpu in root.iter("gpu"):
        gpus.append(
            {
                "bus_id": gpu.get("id", ""),
                "name": gpu.findtext("product_name", ""),
                "uuid": gpu.findtext("uuid", ""),
                "memory_total_mib": _mib(gpu.findtext("fb_memory_usage/total")),
                "memory_used_mib": _mib(gpu.findtext("fb_memory_usage/used")),
                "util_pct": _mib(gpu.findtext("utilization/gpu_util")),
                # power_readings before R535, gpu_power_readings from it on
                "power_w": _mib(
                    gpu.findtext("power_readings/power_draw")
                    or gpu.findtext("gpu_power_readings/power_draw")
                ),
            }
        )
    return {
        "driver": root.findtext("driver_version", ""),
        "cuda": root.findtext("cuda_version", ""),
        "gpus": gpus,
    }


def read_monitor_csv(text: str) -> list[Sample]:
    """`gpuenv monitor --out FILE`'s CSV (gpuenv.gpu.monitor.write_csv) as samples."""
    samples = []
    for row in csv.DictReader(io.StringIO(text)):
        values: dict[str, Any] = {}
        for name in CSV_FIELDS:
            raw = row.get(name, "")
            if name in ("gpu", "name"):
                values[name] = raw
            else:
                values[name] = float(raw) if raw not in ("", None) else None
        samples.append(Sample(**values))
    return samples


def movement(samples: list[Sample]) -> dict[str, dict[str, Any]]:
    """Per GPU: the lowest and highest utilisation, memory used and power drawn, and whether
    each moved (its highest reading above its lowest). A metric never read is not moved."""
    out: dict[str, dict[str, Any]] = {}
    for gpu in dict.fromkeys(s.gpu for s in samples):
        mine = [s for s in samples if s.gpu == gpu]
        entry: dict[str, Any] = {"samples": len(mine)}
        for metric in ("util", "mem_used", "power"):
            values = [v for s in mine if (v := getattr(s, metric)) is not None]
            low, high = (min(values), max(values)) if values else (None, None)
            moved = low is not None and high is not None and high > low
            entry[metric] = {"min": low, "max": high, "moved": moved}
        entry["moved"] = all(entry[m]["moved"] for m in ("util", "mem_used", "power"))
        out[gpu] = entry
    return out


def validate_summary(doc: dict[str, Any]) -> dict[str, Any]:
    """`gpuenv validate --json` per target: each device check's outcome (passed, failed
    with its message, skipped with its reason) and the counts."""
    out: dict[str, Any] = {}
    for image in doc.get("images", []):
        failures = {f.split(": ", 1)[0]: f.split(": ", 1)[-1] for f in image.get("failures", [])}
        skips = {s.split(": ", 1)[0]: s.split(": ", 1)[-1] for s in image.get("skips", [])}
        checks = {}
        for check in DEVICE_CHECKS:
            if check in failures:
                checks[check] = f"failed: {failures[check]}"
            elif check in skips:
                checks[check] = f"skipped: {skips[check]}"
            else:
                checks[check] = "passed"
        out[image["id"]] = {"counts": image.get("counts", {}), "device_checks": checks}
    return out


def bench_rows(results: list[tuple[str, str, dict[str, Any] | str]]) -> list[bench.Row]:
    """(kind, workload, the workload's JSON or why there is none) -> gpuenv bench's rows,
    with its speed-ups (against the CPU LSTM, as the seed)."""
    rows = []
    for kind, workload, result in results:
        row = bench.Row(cell="host (PyTorch)", image="", kind=kind, workload=workload)
        if isinstance(result, str):
            row.missing = result
        else:
            row.result = result
            row.device = str(result.get("device", ""))
            row.ms_per_step = result.get("ms_per_step")
            row.epoch_s = result.get("epoch_s")
        rows.append(row)
    return bench.apply_speedups(rows)


def report_text(report: dict[str, Any]) -> str:
    lines = [f"gpuenv GPU proof, {report['date']}, on {report['host']}", ""]
    for step in report["steps"]:
        lines.append(f"{step['status'].upper():8} {step['name']} ({step['seconds']:.1f} s)"
                     + (f": {step['reason']}" if step["reason"] else ""))  # fmt: skip
    smi = report.get("smi")
    if smi:
        lines += ["", f"driver {smi['driver']}, CUDA {smi['cuda']}"]
        lines += [f"  {g['name']} ({g['uuid']}), {g['memory_total_mib']} MiB" for g in smi["gpus"]]
    if report.get("bench_table"):
        lines += ["", "seed 000's table, PyTorch on this host:"]
        lines += ["  | " + " | ".join(r) + " |" for r in report["bench_table"]]
    return "\n".join(lines) + "\n"


# ---------------------------------------------------------------------------- running


class Proof:
    def __init__(self, out: Path, gpuenv: list[str], python: str, budget: float) -> None:
        self.out, self.gpuenv, self.python = out, gpuenv, python
        self.deadline = time.monotonic() + budget
        self.outputs: list[dict[str, Any]] = []

    def left(self) -> float:
        return self.deadline - time.monotonic()

    def command(self, argv: list[str], timeout: float) -> subprocess.CompletedProcess[str]:
        """Run argv (bounded by the time left); its output is kept for outputs.json."""
        limit = max(1.0, min(timeout, self.left()))
        started = time.monotonic()
        try:
            proc = subprocess.run(argv, capture_output=True, text=True, timeout=limit,
                                  check=False)  # fmt: skip
        except subprocess.TimeoutExpired as exc:
            proc = subprocess.CompletedProcess(argv, 124, _text(exc.stdout),
                                               _text(exc.stderr) + f"\n(timed out after "
                                               f"{limit:.0f} s)")  # fmt: skip
        self.outputs.append({"argv": argv, "exit": proc.returncode, "seconds":
                             round(time.monotonic() - started, 2), "stdout": proc.stdout,
                             "stderr": proc.stderr})  # fmt: skip
        return proc


def _text(data: bytes | str | None) -> str:
    if data is None:
        return ""
    return data if isinstance(data, str) else data.decode(errors="replace")


def no_gpu_reason() -> str | None:
    """Why this host has no NVIDIA GPU to prove anything on, or None when it has one."""
    if shutil.which("nvidia-smi") is None:
        return "no NVIDIA driver here: nvidia-smi is not on PATH"
    try:
        listed = subprocess.run(["nvidia-smi", "-L"], capture_output=True, text=True,
                                timeout=30, check=False)  # fmt: skip
    except (OSError, subprocess.TimeoutExpired) as exc:
        return f"nvidia-smi -L failed: {exc}"
    if listed.returncode != 0 or "GPU " not in listed.stdout:
        return f"nvidia-smi -L lists no GPU: {(listed.stderr or listed.stdout).strip()[:200]}"
    return None


def nvml_readings() -> list[dict[str, Any]]:
    """One NVML reading per GPU (nvidia-ml-py): what the monitor samples, plus identity."""
    import pynvml

    pynvml.nvmlInit()
    try:
        found = []
        for i in range(pynvml.nvmlDeviceGetCount()):
            h = pynvml.nvmlDeviceGetHandleByIndex(i)
            memory = pynvml.nvmlDeviceGetMemoryInfo(h)
            major, minor = pynvml.nvmlDeviceGetCudaComputeCapability(h)
            found.append({
                "index": i, "name": str(pynvml.nvmlDeviceGetName(h)),
                "uuid": str(pynvml.nvmlDeviceGetUUID(h)),
                "compute_capability": f"{major}.{minor}",
                "util_pct": pynvml.nvmlDeviceGetUtilizationRates(h).gpu,
                "memory_used_mib": memory.used / 2**20, "memory_total_mib": memory.total / 2**20,
                "power_w": pynvml.nvmlDeviceGetPowerUsage(h) / 1000,
                "temp_c": pynvml.nvmlDeviceGetTemperature(h, pynvml.NVML_TEMPERATURE_GPU),
                "sm_clock_mhz": pynvml.nvmlDeviceGetClockInfo(h, pynvml.NVML_CLOCK_SM),
                "driver": str(pynvml.nvmlSystemGetDriverVersion()),
            })  # fmt: skip
        return found
    finally:
        pynvml.nvmlShutdown()


def timed(step: Step, body: Callable[[Step], None]) -> Step:
    started = time.monotonic()
    try:
        body(step)
    except Exception as exc:  # a step's own breakage is its failure, never the report's end
        step.status, step.reason = "failed", f"{type(exc).__name__}: {exc}"[:500]
    step.seconds = round(time.monotonic() - started, 2)
    return step


def run_proof(out: Path, gpuenv: list[str], python: str, budget: float = BUDGET_S) -> int:
    out.mkdir(parents=True, exist_ok=True)
    proof = Proof(out, gpuenv, python, budget)
    absent = no_gpu_reason()
    report: dict[str, Any] = {
        "date": time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime()),
        "host": os.uname().nodename,
        "gpu": absent is None,
        "no_gpu_reason": absent,
        "budget_s": budget,
    }
    steps: list[Step] = []
    nvml: dict[str, Any] = {}

    def skip_without_gpu(step: Step) -> bool:
        if absent is not None:
            step.status, step.reason = "skipped", absent
            return True
        if proof.left() < 10:
            step.status, step.reason = "skipped", f"out of time: the {budget:.0f} s budget is spent"
            return True
        return False

    def smi(step: Step) -> None:
        if skip_without_gpu(step):
            return
        proc = proof.command(["nvidia-smi", "-q", "-x"], 60)
        (out / "nvidia-smi-q.xml").write_text(proc.stdout)
        report["smi"] = parse_smi_xml(proc.stdout)
        nvml["before"] = nvml_readings()
        step.details = {
            "gpus": len(report["smi"]["gpus"]),
            "driver": report["smi"]["driver"],
            "compute_capability": [g["compute_capability"] for g in nvml["before"]],
        }
        step.status = "passed" if report["smi"]["gpus"] else "failed"
        if step.status == "failed":
            step.reason = "nvidia-smi -q -x lists no GPU"

    def doctor(step: Step) -> None:
        proc = proof.command([*gpuenv, "doctor", "--json"], 120)
        findings = json.loads(proc.stdout)["findings"]
        step.details = {"findings": findings}
        driver = next((f for f in findings if f["topic"] == "driver"), None)
        if absent is not None:  # doctor must not claim a driver this host does not have
            claims = driver is not None and driver["level"] == "ok"
            step.status = "failed" if claims else "passed"
            step.reason = (driver or {}).get("message", "doctor said nothing of the driver")
        else:
            ok = driver is not None and driver["level"] == "ok"
            step.status = "passed" if ok else "failed"
            step.reason = driver["message"] if driver else "doctor said nothing of the driver"

    def validate(step: Step) -> None:
        if skip_without_gpu(step):
            return
        proc = proof.command([*gpuenv, "validate", "--host", "local://", "--gpus", "all",
                              "--json"], 300)  # fmt: skip
        summary = validate_summary(json.loads(proc.stdout)) if proc.stdout.strip() else {}
        step.details = {"exit": proc.returncode, "targets": summary}
        if not summary:
            step.status, step.reason = "failed", (proc.stderr.strip() or "no output")[-300:]
            return
        failed = [f"{t}: {c}" for t, s in summary.items()
                  for c, v in s["device_checks"].items() if v.startswith("failed")]  # fmt: skip
        step.status = "failed" if failed else "passed"
        step.reason = "; ".join(failed)[:500]

    def monitor(step: Step) -> None:
        if skip_without_gpu(step):
            return
        csv_path = out / "monitor.csv"
        proc = proof.command([*gpuenv, "monitor", "--interval", "0.25", "--out", str(csv_path),
                              "--", python, "-c", GPU_WORK], MONITOR_S + 120)  # fmt: skip
        nvml["after"] = nvml_readings()
        samples = read_monitor_csv(csv_path.read_text()) if csv_path.exists() else []
        moved = movement(samples)
        step.details = {"exit": proc.returncode, "samples": len(samples), "movement": moved}
        if proc.returncode != 0 or not moved:
            step.status = "failed"
            step.reason = f"exit {proc.returncode}, {len(samples)} samples: {proc.stderr[-300:]}"
            return
        still = [f"GPU {g}: {m}" for g, e in moved.items() for m in ("util", "mem_used", "power")
                 if not e[m]["moved"]]  # fmt: skip
        step.status = "failed" if still else "passed"
        step.reason = ("did not move: " + ", ".join(still)) if still else ""

    def bench_step(step: Step) -> None:
        # The CPU row is the GPU rows' baseline: without a GPU there is no table to make.
        if skip_without_gpu(step):
            return
        runs = [("cpu", "lstm", []), ("gpu", "lstm", []), ("gpu", "lstm-cudnn", ["--cudnn", "1"])]
        results: list[tuple[str, str, dict[str, Any] | str]] = []
        for kind, workload, extra in runs:
            if proof.left() < 20:
                results.append((kind, workload, "out of time"))
                continue
            argv = [python, str(WORKLOADS / "lstm_torch.py"), "--device", kind, "--scale", "0.1",
                    *extra]  # fmt: skip
            proc = proof.command(argv, 150)
            doc = bench.parse_result(proc.stdout)
            if doc is None or "error" in doc:
                reason = doc["error"] if doc else f"exit {proc.returncode}: {proc.stderr[-200:]}"
                results.append((kind, workload, str(reason)))
            else:
                results.append((kind, workload, doc))
        rows = bench_rows(results)
        report["bench"] = [asdict(r) for r in rows]
        report["bench_table"] = bench.table(rows)
        missing = [f"{r.kind} {r.workload}: {r.missing}" for r in rows if r.missing]
        step.status = "failed" if missing else "passed"
        step.reason = "; ".join(missing)[:500]
        step.details = {"kernels": [r.result.get("kernel") for r in rows if r.result]}

    for name, body in (("nvidia-smi and NVML", smi), ("gpuenv doctor", doctor),
                       ("gpuenv validate --host local:// --gpus all", validate),
                       ("gpuenv monitor during GPU work", monitor),
                       ("seed 000 table, PyTorch LSTM", bench_step)):  # fmt: skip
        steps.append(timed(Step(name), body))
    report["steps"] = [asdict(s) for s in steps]
    (out / "report.json").write_text(json.dumps(report, indent=1, default=str) + "\n")
    (out / "report.txt").write_text(report_text(report))
    (out / "nvml.json").write_text(json.dumps(nvml, indent=1) + "\n")
    (out / "outputs.json").write_text(json.dumps(proof.outputs, indent=1) + "\n")
    sys.stdout.write(report_text(report))
    return 1 if any(s.status == "failed" for s in steps) else 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=Path(os.environ.get("OUT") or "gpu-proof"))
    parser.add_argument("--gpuenv", default=shutil.which("gpuenv") or "",
                        help="the gpuenv command (default: gpuenv on PATH)")  # fmt: skip
    parser.add_argument("--python", default=sys.executable,
                        help="the Python with PyTorch the workloads run in")  # fmt: skip
    parser.add_argument("--budget", type=float, default=BUDGET_S, help="seconds, all steps")
    args = parser.parse_args(argv)
    gpuenv = shlex.split(args.gpuenv) if args.gpuenv else [sys.executable, "-m", "gpuenv"]
    return run_proof(args.out, gpuenv, args.python, args.budget)


if __name__ == "__main__":
    sys.exit(main())
