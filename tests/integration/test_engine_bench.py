"""`gpuenv bench` and the monitor's PID mapping on the real engine (no GPU here).

- A CPU row really measured: the seed's LSTM, scaled down to 2 % of its dataset (about 16
  steps, well under a minute), in the shipped CPU cell through run's container path; the GPU
  cell's rows say why they are missing (no --gpus), and are not measured elsewhere.
- The container's processes found from their cgroups: a container started by hand
  (`docker run -d --network none IMAGE sleep 60`), its PIDs from `docker top`, mapped back
  by gpuenv.gpu.monitor.pids_of_container reading this host's /proc.
- benchmarks/build.py in its default mode (no-op comparison, cold builds, sizes) on the
  smallest cell the suite builds, the JAX CPU cell, once: the no-op comparison rebuilds
  gpuenv's own contexts with plain BuildKit, with the network gpuenv gave them (host: the
  install step fetches near the engine here, as on a user's machine).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
from support.cells import JAX_CPU_CELL, REPO, jax_cpu_matrix, test_repository
from support.cli import output
from support.engine import TrackedContainer, docker

from gpuenv.gpu import monitor

pytestmark = pytest.mark.engine

CPU_CELL, GPU_CELL = "tf2.21-py3.11-cpu", "tf2.21-py3.11-cuda12.5-gpu"


def test_a_cpu_row_is_measured_and_gpu_rows_say_why_not(gpuenv, shipped_cpu, shipped_matrix,
                                                        tmp_path):  # fmt: skip
    plot, csv = tmp_path / "bench.png", tmp_path / "bench.csv"
    proc = gpuenv("bench", "-f", str(shipped_matrix), CPU_CELL, GPU_CELL, "--workload", "lstm",
                  "--scale", "0.02", "--json", "--csv", str(csv), "--plot", str(plot),
                  timeout=300)  # fmt: skip
    rows = json.loads(proc.stdout)["rows"]
    assert [(r["cell"], r["kind"], r["workload"]) for r in rows] == [
        (CPU_CELL, "cpu", "lstm"), (GPU_CELL, "gpu", "lstm")]  # fmt: skip
    cpu, gpu = rows
    assert cpu["missing"] is None and cpu["ms_per_step"] > 0
    assert cpu["device"].startswith("CPU: ") and cpu["speedup"] == 1.0
    result = cpu["result"]
    assert result["framework"] == "tensorflow 2.21.0" and result["warmup_steps"] == 5
    assert result["measured_steps"] == result["steps"] - 5 >= 3
    assert result["epoch_s"] == pytest.approx(cpu["ms_per_step"] * 782 / 1000, rel=0.01)
    assert gpu["ms_per_step"] is None and "no --gpus given" in gpu["missing"]
    assert plot.read_bytes()[:4] == b"\x89PNG" and len(csv.read_text().splitlines()) == 3


@pytest.fixture
def sleeping(shipped_cpu):
    with TrackedContainer(shipped_cpu["image"], "sleep", "60") as container:
        docker("start", str(container.id))
        yield str(container.id)


def test_a_containers_pids_map_back_to_it_through_their_cgroups(sleeping):
    top = docker("top", sleeping, "-eo", "pid").stdout.split()[1:]
    pids = {int(p) for p in top}
    main = int(docker("inspect", "-f", "{{.State.Pid}}", sleeping).stdout)
    assert main in pids
    if not os.path.exists(f"/proc/{main}"):
        pytest.skip("the engine's processes are not in this /proc (another host or PID namespace)")
    found = monitor.pids_of_container(sleeping)
    assert found == pids
    assert monitor.pids_of_container(sleeping[:12]) == pids
    assert os.getpid() not in found
    with open(f"/proc/{main}/cgroup", encoding="utf-8") as fh:
        cgroup = fh.read()
    assert monitor.container_id_of(cgroup) == sleeping


def test_the_build_benchmark_runs_in_its_default_mode(shipped_cpu, tmp_path):
    """Its no-op comparison built near-fetched contexts with network none, so the default
    mode failed (issue 47). shipped_cpu first: the base exists before the benchmark runs, so
    its clean-up (which removes the bases it created) leaves the suite's base alone."""
    matrix = tmp_path / "matrix.yaml"
    matrix.write_text(jax_cpu_matrix(test_repository("bench")), encoding="utf-8")
    # The probe's own choice (no GPUENV_NEAR_FETCH=client): the path users get.
    env = {k: v for k, v in os.environ.items() if not k.startswith("GPUENV_")}
    proc = subprocess.run(
        [sys.executable, str(REPO / "benchmarks" / "build.py"), "-f", str(matrix), "--cell",
         JAX_CPU_CELL, "--repeat", "1"],
        capture_output=True, text=True, timeout=900, env=env, cwd=REPO,
    )  # fmt: skip
    assert proc.returncode == 0, output(proc)
    out = proc.stdout
    assert "1. No-op rebuild of the whole matrix (1 cells)" in out, output(proc)
    assert "with the network gpuenv gave them" in out and "missed the cache" not in out, out
    network = next(line for line in out.splitlines() if "network gpuenv gave" in line)
    assert network.split()[-1] == "host", out  # fetched near the engine: the case that failed
    assert f"2. Cold build of {JAX_CPU_CELL}" in out and "3. Final image size" in out, out
