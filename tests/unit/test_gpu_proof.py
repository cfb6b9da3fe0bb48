"""The GPU proof (benchmarks/gpu_proof.py, scripts/gpu-proof.sh): its parsers on recordings
from real hosts (tests/unit/recorded/README.md cites each), and the whole proof run on this
machine, which has no GPU: every GPU step skipped with the reason, exit 0.

No GPU host has run it yet: nothing here stands for a GPU result.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from gpuenv.gpu import monitor

REPO = Path(__file__).resolve().parents[2]
RECORDED = Path(__file__).parent / "recorded"
sys.path.insert(0, str(REPO / "benchmarks"))

import gpu_proof  # noqa: E402  (benchmarks/ is no package)


def recorded(name: str) -> str:
    return (RECORDED / name).read_text(encoding="utf-8")


# --------------------------------------------------------------------------- parsers


def test_nvidia_smi_q_x_of_two_p100s() -> None:
    # apache/hadoop's nvidia-smi-sample-output.xml: driver 375.66, two Tesla P100s.
    smi = gpu_proof.parse_smi_xml(recorded("nvidia-smi-q-x-2gpus-p100.xml"))
    assert smi["driver"] == "375.66" and smi["cuda"] == ""  # no cuda_version before R410
    first, second = smi["gpus"]
    assert first == {
        "bus_id": "0000:04:00.0",
        "name": "Tesla P100-PCIE-12GB",
        "uuid": "GPU-28604e81-21ec-cc48-6759-bf2648b22e16",
        "memory_total_mib": 11567.0,
        "memory_used_mib": 11400.0,
        "util_pct": 33.4,
        "power_w": 24.84,
    }
    assert (second["memory_total_mib"], second["util_pct"], second["power_w"]) == (
        12290.0, 10.3, 25.54)  # fmt: skip


@pytest.mark.parametrize("text", ["<other/>", "<nvidia_smi_log"])
def test_what_is_no_nvidia_smi_log_is_refused(text: str) -> None:
    with pytest.raises(ValueError, match="not an nvidia-smi -q -x log"):
        gpu_proof.parse_smi_xml(text)


def test_movement_on_a_recorded_loop_without_a_memory_column() -> None:
    # 13 samples of one GPU (lestofante/ksysguard-gpu#27): utilisation 23-32 %, power
    # 76.64-84.77 W, and no memory.used column: memory never read is memory not moved.
    samples = monitor.parse_csv(recorded("nvidia-smi-query-loop-1gpu.csv"), interval=1.0)
    moved = gpu_proof.movement(samples)["0"]
    assert moved["samples"] == 13
    assert moved["util"] == {"min": 23.0, "max": 32.0, "moved": True}
    assert moved["power"] == {"min": 76.64, "max": 84.77, "moved": True}
    assert moved["mem_used"] == {"min": None, "max": None, "moved": False}
    assert moved["moved"] is False


def test_one_reading_per_gpu_moves_nothing() -> None:
    # aristocratos/bpytop#26: two GPUs, one reading each.
    samples = monitor.parse_csv(recorded("nvidia-smi-query-2gpus.csv"), interval=1.0)
    moved = gpu_proof.movement(samples)
    assert len(moved) == 2 and not any(m["moved"] for m in moved.values())
    assert moved["GeForce GTX 1080 Ti"]["mem_used"]["max"] == 2856.0


def test_monitor_csv_round_trip(tmp_path: Path) -> None:
    """What `gpuenv monitor --out` writes is what the proof reads back."""
    samples = monitor.parse_csv(recorded("nvidia-smi-query-loop-1gpu.csv"), interval=0.5)
    monitor.write_csv(samples, tmp_path / "m.csv")
    assert gpu_proof.read_monitor_csv((tmp_path / "m.csv").read_text()) == samples


def test_validate_summary_of_a_host_without_a_gpu() -> None:
    # `gpuenv validate --host local:// --gpus all --json` on this project's machine, with
    # PyTorch 2.13 (CPU build) and no GPU: every device check fails, none is skipped.
    doc = json.loads(recorded("validate-host-local-torch-no-gpu.json"))
    summary = gpu_proof.validate_summary(doc)["torch@local://"]
    assert summary["counts"] == {"passed": 0, "failed": 6, "skipped": 20}
    checks = summary["device_checks"]
    assert set(checks) == set(gpu_proof.DEVICE_CHECKS)
    assert all(v.startswith("failed: ") for v in checks.values()), checks
    assert "Torch not compiled with CUDA enabled" in checks["matmul runs on gpu0"]


def test_bench_rows_make_seed_000s_table() -> None:
    # The PyTorch LSTM on this machine's CPU (lstm_torch.py --device cpu --scale 0.05); the
    # GPU rows cannot be measured here and say why.
    cpu = json.loads(recorded("lstm-torch-cpu.json"))
    rows = gpu_proof.bench_rows(
        [("cpu", "lstm", cpu), ("gpu", "lstm", "no GPU"), ("gpu", "lstm-cudnn", "no GPU")]
    )
    table = gpu_proof.bench.table(rows)
    assert table[1][2:] == ("lstm", "23.62", "18.5 s", "1.0x (baseline)")
    assert table[2][-1] == table[3][-1] == "missing: no GPU"
    gpu = dict(cpu, device_kind="gpu", ms_per_step=2.3621, workload="lstm-cudnn")
    rows = gpu_proof.bench_rows([("cpu", "lstm", cpu), ("gpu", "lstm-cudnn", gpu)])
    assert rows[1].speedup == 10.0 and rows[1].baseline == "host (PyTorch)/lstm"


# --------------------------------------------------------------------------- no GPU here


def fake_nvidia_smi(where: Path, text: str, code: int) -> None:
    script = where / "nvidia-smi"
    script.write_text(f"#!/bin/sh\necho '{text}'\nexit {code}\n")
    script.chmod(0o755)


def test_a_driver_without_gpus_is_no_gpu(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # What nvidia-smi says on a host whose driver finds no GPU (exit 6).
    fake_nvidia_smi(tmp_path, "No devices were found", 6)
    monkeypatch.setenv("PATH", f"{tmp_path}:{os.environ['PATH']}")
    assert gpu_proof.no_gpu_reason() == "nvidia-smi -L lists no GPU: No devices were found"


def test_the_proof_on_a_machine_without_a_gpu(tmp_path: Path) -> None:
    """scripts/gpu-proof.sh as CI runs it: every GPU step skipped with the reason, doctor
    run and not claiming a driver, the report and raw outputs written, exit 0."""
    path = ":".join(p for p in os.environ["PATH"].split(":")
                    if not (Path(p) / "nvidia-smi").exists())  # fmt: skip
    env = {**os.environ, "PATH": path, "GPUENV_PROOF_PYTHON": sys.executable,
           "GPUENV_PROOF_WHEELS": str(tmp_path / "none"),
           "DOCKER_HOST": f"unix://{tmp_path}/no-engine.sock",  # unit tests reach no engine
           "XDG_CACHE_HOME": str(tmp_path / "cache")}  # fmt: skip
    out = tmp_path / "out"
    done = subprocess.run(["bash", str(REPO / "scripts" / "gpu-proof.sh"), str(out)], env=env,
                          capture_output=True, text=True, timeout=300, check=False)  # fmt: skip
    assert done.returncode == 0, done.stdout + done.stderr
    report = json.loads((out / "report.json").read_text())
    assert report["gpu"] is False
    assert report["no_gpu_reason"] == "no NVIDIA driver here: nvidia-smi is not on PATH"
    steps = {s["name"]: s for s in report["steps"]}
    assert steps["gpuenv doctor"]["status"] == "passed"
    assert "no NVIDIA driver or GPU found" in steps["gpuenv doctor"]["reason"]
    gpu_steps = [s for name, s in steps.items() if name != "gpuenv doctor"]
    assert len(gpu_steps) == 4
    assert all((s["status"], s["reason"]) == ("skipped", report["no_gpu_reason"])
               for s in gpu_steps)  # fmt: skip
    assert {p.name for p in out.iterdir()} == {
        "report.json", "report.txt", "nvml.json", "outputs.json"}  # fmt: skip
    assert "SKIPPED  gpuenv monitor during GPU work" in (out / "report.txt").read_text()
    (doctor,) = json.loads((out / "outputs.json").read_text())
    assert doctor["argv"][-2:] == ["doctor", "--json"]
