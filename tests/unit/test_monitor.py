"""gpuenv/gpu/monitor.py without a GPU or an engine: parsing nvidia-smi's CSV, the summary
(energy, peaks), seed 001's advice, PID-to-container mapping, the options.

Inputs: tests/unit/recorded/ holds outputs recorded from real hosts (sources in its README);
tests/unit/format_derived/ holds two files written by hand from NVIDIA's documented
`--query-gpu` format and Docker's cgroup naming, NOT recorded: tests using them say so."""

from __future__ import annotations

import itertools
import sys
import types
from pathlib import Path

import pytest

from gpuenv.gpu import monitor
from gpuenv.gpu.gpus import GpuRequest, parse_gpus
from gpuenv.matrix.errors import GpuenvError

HERE = Path(__file__).resolve().parent
RECORDED = HERE / "recorded"
DERIVED = HERE / "format_derived"
DOCKER_ID = "9fc46a5a7885784bd279129a7a80f559d865d951c89788b924d90e0958171056"


def recorded(name: str) -> str:
    return (RECORDED / name).read_text(encoding="utf-8")


# ---------------------------------------------------------------- parsing, recorded outputs


def test_a_recorded_loop_of_one_gpu_parses_by_its_header():
    """ksysguard-gpu#27: 13 samples, columns in their own order, no timestamp column."""
    samples = monitor.parse_csv(recorded("nvidia-smi-query-loop-1gpu.csv"), interval=1.0)
    assert len(samples) == 13
    assert {s.gpu for s in samples} == {"0"}
    assert [s.t for s in samples] == [float(i) for i in range(13)]
    first = samples[0]
    assert (first.util, first.power, first.temp, first.sm_clock) == (26.0, 83.92, 56.0, 1320.0)
    assert first.mem_used is None  # not queried


def test_the_recorded_loop_summarises_to_its_own_numbers():
    samples = monitor.parse_csv(recorded("nvidia-smi-query-loop-1gpu.csv"), interval=1.0)
    (s,) = monitor.summarise(samples)
    utils = [26, 25, 24, 26, 27, 28, 29, 30, 28, 32, 28, 23, 25]
    powers = [83.92, 78.22, 84.77, 78.63, 83.67, 77.39, 82.81, 77.00, 82.64, 76.64, 82.40,
              77.80, 83.43]  # fmt: skip
    assert s.samples == 13 and s.duration_s == 12.0
    assert s.mean_util == round(sum(utils) / 13, 1) and s.peak_util == 32
    expected = sum((a + b) / 2 for a, b in itertools.pairwise(powers))  # dt = 1 s
    assert s.energy_j == pytest.approx(expected, abs=0.05)
    assert s.peak_power == 84.77 and s.peak_temp == 56
    assert s.mean_sm_clock == round(sum([1320, 1470, 1470, 1410, 1410, 1275, 1275, 1245, 1245,
                                         1185, 1185, 1440, 1440]) / 13)  # fmt: skip


def test_the_recorded_loop_gets_seed_001s_advice():
    """Mean 27 %, peak 32 %: the GPU mostly waited."""
    (s,) = monitor.summarise(
        monitor.parse_csv(recorded("nvidia-smi-query-loop-1gpu.csv"), interval=1.0)
    )
    text = monitor.advice(s)
    assert text is not None and "busy 27%" in text
    assert "increase the batch size" in text and "prefetch" in text
    assert "preprocess the data once" in text and "parallel" in text


def test_two_recorded_gpus_without_index_are_told_apart_by_name():
    """bpytop#26: two GPUs, memory and power with units; clocks.gr is not the SM clock."""
    samples = monitor.parse_csv(recorded("nvidia-smi-query-2gpus.csv"), interval=1.0)
    assert [s.gpu for s in samples] == ["GeForce GTX 1080 Ti", "GeForce GTX 1060 6GB"]
    big, small = samples
    assert (big.mem_used, big.mem_total, big.util, big.power) == (2856.0, 11175.0, 36.0, 106.56)
    assert (small.mem_used, small.util, small.power) == (4.0, 0.0, 5.68)
    assert big.sm_clock is None and big.t == small.t == 0.0
    # One sample each: no energy (it needs two points), no advice (too few samples).
    for s in monitor.summarise(samples):
        assert s.energy_j is None and monitor.advice(s) is None


# ---------------------------------------------------------------- format-derived (not recorded)


def test_format_derived_lms_stream_with_timestamps_and_na():
    """NOT recorded: written from `nvidia-smi --help-query-gpu` (see format_derived/README)."""
    samples = monitor.parse_csv((DERIVED / "nvidia-smi-lms-2gpus.csv").read_text())
    assert [s.t for s in samples] == [0.0, 0.0, 0.5, 0.5, 1.0, 1.0]
    assert samples[1].util is None and samples[1].power is None  # [N/A]
    gpu0, gpu1 = monitor.summarise(samples)
    assert gpu0.energy_j == pytest.approx((70 + 330) / 2 * 0.5 + (330 + 350) / 2 * 0.5)
    assert gpu1.energy_j == pytest.approx((90 + 110) / 2 * 0.5)  # the [N/A] point is skipped
    assert gpu0.peak_mem == 40000 and gpu0.mem_total == 81559 and gpu0.mean_sm_clock == 1435
    assert monitor.advice(gpu0) is None  # mean 66.7 %
    assert "too small to fill it" in (monitor.advice(gpu1) or "")


def test_an_input_bound_pattern_is_named():
    """Seed 001: 'your GPU utilization will fluctuate from 100% to 20% or less'."""
    samples = [monitor.Sample(t=i * 0.5, gpu="0", util=100.0 if i % 4 == 0 else 5.0)
               for i in range(12)]  # fmt: skip
    (s,) = monitor.summarise(samples)
    assert "input-pipeline-bound" in (monitor.advice(s) or "")


def test_repeated_headers_and_error_lines_are_skipped():
    text = recorded("nvidia-smi-query-loop-1gpu.csv").splitlines()
    stream = [text[0], text[1], "No devices were found", text[0], text[2], ""]
    parser = monitor.CsvParser(interval=0.5)
    got = [s for line in stream if (s := parser.feed(line)) is not None]
    assert [s.t for s in got] == [0.0, 0.5]


def test_timestamps_are_nvidia_smis_format():
    assert monitor.parse_timestamp("2025/01/15 10:00:01.250") - monitor.parse_timestamp(
        "2025/01/15 10:00:00.000"
    ) == pytest.approx(1.25)
    with pytest.raises(ValueError):
        monitor.parse_timestamp("Tue Aug 15 16:00:35 2017")


def test_energy_needs_two_points():
    assert monitor.energy_joules([]) is None and monitor.energy_joules([(0.0, 5.0)]) is None
    assert monitor.energy_joules([(1.0, 100.0), (0.0, 0.0)]) == 50.0  # sorted by time


def test_samples_round_trip_through_csv(tmp_path):
    samples = monitor.parse_csv(recorded("nvidia-smi-query-2gpus.csv"), interval=1.0)
    out = tmp_path / "m" / "samples.csv"
    monitor.write_csv(samples, out)
    lines = out.read_text().splitlines()
    assert lines[0].split(",") == list(monitor.CSV_FIELDS)
    assert len(lines) == 3 and "2856.0" in lines[1]


# ---------------------------------------------------------------- processes


def test_container_id_from_a_recorded_cgroup_v1_file():
    assert monitor.container_id_of(recorded("proc-cgroup-v1-docker.txt")) == DOCKER_ID


def test_a_recorded_host_process_is_in_no_container():
    """Its memory cgroup carries a 32-hex name: not a container ID."""
    assert monitor.container_id_of(recorded("proc-cgroup-v1-host-process.txt")) is None


def test_container_id_from_a_format_derived_cgroup_v2_systemd_scope():
    """NOT recorded: the systemd driver's docker-<id>.scope (format_derived/README)."""
    text = (DERIVED / "proc-cgroup-v2-systemd-docker.txt").read_text()
    assert (
        monitor.container_id_of(text)
        == "4f9e1a35a4b0e2a8f3ad27cd9a0e6ecc9cc2c0a1d0bd3b6f5f3a47b2f1d2c3e4"
    )


def test_pids_of_a_container_from_a_proc_tree(tmp_path):
    for pid, text in ((101, recorded("proc-cgroup-v1-docker.txt")),
                      (102, recorded("proc-cgroup-v1-docker.txt")),
                      (200, recorded("proc-cgroup-v1-host-process.txt"))):  # fmt: skip
        (tmp_path / str(pid)).mkdir()
        (tmp_path / str(pid) / "cgroup").write_text(text)
    (tmp_path / "300").mkdir()  # a process that went away: no cgroup file
    (tmp_path / "self").mkdir()
    assert monitor.pids_of_container(DOCKER_ID, tmp_path) == {101, 102}
    assert monitor.pids_of_container(DOCKER_ID[:12], tmp_path) == {101, 102}
    assert monitor.pids_of_container("0" * 64, tmp_path) == set()


def test_process_tree_from_stat_lines():
    assert monitor.parent_of("4242 (python (x) y) S 4000 4242 4242 0 -1") == 4000
    assert monitor.descendants(1, {2: 1, 3: 2, 4: 9, 5: 3}) == {1, 2, 3, 5}


def test_the_process_tree_of_this_process(tmp_path):
    import os

    assert os.getpid() in monitor.process_tree(os.getpid())


def test_process_memory_counts_only_the_watched_pids():
    """NVML's process entries (pid, usedGpuMemory in bytes; None when unknown), stubbed."""
    procs = [types.SimpleNamespace(pid=10, usedGpuMemory=512 * 2**20),
             types.SimpleNamespace(pid=11, usedGpuMemory=None),
             types.SimpleNamespace(pid=99, usedGpuMemory=4096 * 2**20)]  # fmt: skip
    assert monitor.process_memory(procs, {10, 11}) == 512.0


# ---------------------------------------------------------------- sources and options


def test_devices_for_gpu_requests():
    assert monitor.devices_for(None, 3) == ["0", "1", "2"]
    assert monitor.devices_for(parse_gpus("all"), 2) == ["0", "1"]
    assert monitor.devices_for(parse_gpus("2"), 4) == ["0", "1"]
    assert monitor.devices_for(parse_gpus("device=1,3"), 4) == ["1", "3"]


def _fake_pynvml(monkeypatch, init_error: str | None = None):
    nv = types.ModuleType("pynvml")

    class NVMLError(Exception):
        pass

    nv.NVMLError = NVMLError
    nv.NVML_TEMPERATURE_GPU, nv.NVML_CLOCK_SM = 0, 1

    def init():
        if init_error:
            raise NVMLError(init_error)

    nv.nvmlInit, nv.nvmlShutdown = init, lambda: None
    nv.nvmlDeviceGetCount = lambda: 2
    nv.nvmlDeviceGetHandleByIndex = lambda i: f"h{i}"
    nv.nvmlDeviceGetHandleByUUID = lambda u: f"h-{u}"
    nv.nvmlDeviceGetName = lambda h: b"NVIDIA H100 80GB HBM3"
    nv.nvmlDeviceGetUtilizationRates = lambda h: types.SimpleNamespace(gpu=87, memory=40)
    nv.nvmlDeviceGetMemoryInfo = lambda h: types.SimpleNamespace(used=2 * 2**30, total=80 * 2**30)
    nv.nvmlDeviceGetPowerUsage = lambda h: 350500  # mW

    def unsupported(*_):
        raise NVMLError("Not Supported")

    nv.nvmlDeviceGetTemperature = lambda h, kind: 61
    nv.nvmlDeviceGetClockInfo = unsupported
    nv.nvmlDeviceGetComputeRunningProcesses = lambda h: [
        types.SimpleNamespace(pid=7, usedGpuMemory=2**30)
    ]
    monkeypatch.setitem(sys.modules, "pynvml", nv)
    return nv


def test_nvml_source_converts_units_and_tolerates_unsupported_fields(monkeypatch):
    """NVML stubbed (the API's shapes, not a recording): mW -> W, bytes -> MiB."""
    _fake_pynvml(monkeypatch)
    source = monitor.NvmlSource(parse_gpus("device=1"), lambda: {7})
    (s,) = source.sample(1.5)
    assert (s.gpu, s.name, s.util, s.mem_used, s.mem_total) == (
        "1", "NVIDIA H100 80GB HBM3", 87.0, 2048.0, 81920.0)  # fmt: skip
    assert (s.power, s.temp, s.sm_clock, s.proc_mem, s.t) == (350.5, 61, None, 1024.0, 1.5)


def test_nvml_that_cannot_start_means_no_gpu(monkeypatch):
    _fake_pynvml(monkeypatch, init_error="NVML Shared Library Not Found")
    with pytest.raises(monitor.NoGpu, match="Shared Library Not Found"):
        monitor.NvmlSource(None, None)


def test_no_nvml_package_means_no_gpu_and_names_the_extra(monkeypatch):
    monkeypatch.setitem(sys.modules, "pynvml", None)
    with pytest.raises(monitor.NoGpu, match=r"gpuenv\[monitor\]"):
        monitor.NvmlSource(None, None)


def test_sampler_collects_until_stopped(monkeypatch):
    """Samples every interval, on its own thread, until stop(): then the thread has ended
    and the samples are what the source gave, in time order. Waits on the source's third
    call, never on the clock."""
    import threading

    _fake_pynvml(monkeypatch)
    source = monitor.NvmlSource(parse_gpus("2"), None)
    third = threading.Event()
    calls = []
    sample = source.sample

    def counted(t):
        calls.append(t)
        if len(calls) == 3:
            third.set()
        return sample(t)

    monkeypatch.setattr(source, "sample", counted)
    sampler = monitor.Sampler(source, 0.01).start()
    assert third.wait(timeout=10), "the source was not called three times"
    samples = sampler.stop()
    assert not sampler._thread.is_alive(), "sampling goes on after stop()"
    assert len(samples) == 2 * len(calls) >= 6 and {s.gpu for s in samples} == {"0", "1"}
    assert [s.t for s in samples] == sorted(s.t for s in samples) and sampler.error is None


@pytest.mark.parametrize(
    ("value", "seconds"),
    [("default", 0.5), ("", 0.5), ("2", 2.0), ("2s", 2.0), ("250ms", 0.25), ("0.1", 0.1)],
)
def test_monitor_intervals(value, seconds):
    opts = monitor.MonitorOptions.parse(value, None)
    assert opts is not None and opts.interval == seconds


@pytest.mark.parametrize("value", ["0.01", "fast", "-1", "10ms"])
def test_bad_monitor_intervals(value):
    with pytest.raises(GpuenvError, match="interval"):
        monitor.MonitorOptions.parse(value, None)


def test_monitor_out_needs_monitor(tmp_path):
    assert monitor.MonitorOptions.parse(None, None) is None
    with pytest.raises(GpuenvError, match="needs --monitor"):
        monitor.MonitorOptions.parse(None, tmp_path / "x.csv")


def test_run_argv_bare_monitor_takes_the_default():
    from gpuenv.cli.argv import normalise_argv

    assert normalise_argv(["run", "--monitor", "train.py"]) == [
        "run", "--monitor=default", "train.py"]  # fmt: skip
    assert normalise_argv(["run", "--monitor=2", "--monitor-out", "m.csv", "x.py", "--monitor"])[
        1:] == ["--monitor=2", "--monitor-out", "m.csv", "x.py", "--monitor"]  # fmt: skip


def test_bench_argv_bare_monitor_takes_the_default():
    from gpuenv.cli.argv import normalise_argv

    assert normalise_argv(["bench", "tf*", "--monitor", "--gpus", "all"]) == [
        "bench", "tf*", "--monitor=default", "--gpus", "all"]  # fmt: skip


def test_watching_a_container_without_gpus_says_so(fake_engine, capsys):
    with monitor.watching(fake_engine(), "c1", "img", None, monitor.MonitorOptions()):
        pass
    assert "no GPU was sampled: no --gpus given" in capsys.readouterr().err


def test_a_helper_container_that_cannot_start_is_removed(fake_engine):
    """A remote engine's sampler is a helper container; a start the engine refuses (no
    GPU there) raises, and must not leave the helper behind."""
    from gpuenv.engine.client import EngineError

    engine = fake_engine()
    engine.is_local = False
    engine.outcomes["img"] = EngineError("could not select device driver")
    opts = monitor.MonitorOptions()
    with pytest.raises(EngineError), monitor.watching(engine, "c1", "img", parse_gpus("all"), opts):
        pass
    assert [s.command[0] for s in engine.created] == ["nvidia-smi"]
    assert engine.containers == {}, "the helper container is left"


def test_watching_is_nothing_without_monitor(fake_engine, capsys):
    with monitor.watching(fake_engine(), "c1", "img", GpuRequest(count=-1), None):
        pass
    assert capsys.readouterr().err == ""


def test_monitor_command_without_a_gpu_runs_the_command_and_keeps_its_code(monkeypatch, capsys):
    monkeypatch.setitem(sys.modules, "pynvml", None)
    code = monitor.monitor_command(["sh", "-c", "exit 3"], monitor.MonitorOptions())
    assert code == 3
    assert "no GPU was sampled" in capsys.readouterr().err


def test_monitor_command_exit_codes_for_missing_commands():
    with pytest.raises(GpuenvError) as exc:
        monitor.monitor_command(["/nonexistent/cmd"], monitor.MonitorOptions())
    assert exc.value.exit_code == 127
