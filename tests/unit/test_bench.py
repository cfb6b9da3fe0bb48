"""gpuenv bench without an engine: workload selection, the workload's JSON line, speed-ups,
the seed's table, CSV/JSON/plot, and bench() over the fake engine (run's own container path);
plus the multi-GPU settings `gpuenv run --gpus N` gets."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from gpuenv.bench import benchmark as bench
from gpuenv.gpu.gpus import parse_gpus
from gpuenv.matrix.errors import GpuenvError
from gpuenv.run import local as run
from gpuenv.run import preflight, target

CPU, GPU = "tf2.21-py3.11-cpu", "tf2.21-py3.11-cuda12.5-gpu"
REPO = Path(__file__).resolve().parents[2]


def row(cell, kind, workload, ms=None, missing=None):
    return bench.Row(cell=cell, image=f"img:{cell}", kind=kind, workload=workload,
                     device=kind.upper(), ms_per_step=ms, missing=missing)  # fmt: skip


def test_the_workloads_ship_inside_the_package():
    names = {p.name for p in bench.WORKLOAD_DIR.glob("*.py")}
    assert {"_harness.py", "lstm.py", "cnn.py", "matmul.py"} <= names
    for wl in bench.WORKLOADS.values():
        assert (bench.WORKLOAD_DIR / wl.script).is_file()
    assert list(bench.WORKLOADS) == ["lstm", "lstm-cudnn", "cnn", "matmul"]


class _Keras:
    """Records what a workload asks Keras for (TensorFlow is not installed here; the
    workloads run for real in tests/integration/test_engine_bench.py)."""

    def __init__(self):
        self.layers, self.fits, self.model = [], [], []
        keras = self

        class Layers:
            def __getattr__(self, name):
                return lambda *a, **kw: keras.layers.append((name, a, kw)) or name

        class Sequential:
            def __init__(self, layers):
                keras.model.extend(layers)

            def compile(self, **kw):
                pass

            def fit(self, x, y, **kw):
                keras.fits.append((x.shape, y.shape, kw))

        self.layers_ns, self.Sequential = Layers(), Sequential
        self.Input = lambda shape: ("Input", shape)

    def __getattr__(self, name):
        if name == "layers":
            raise AttributeError(name)
        return getattr(self.layers_ns, name)


@pytest.mark.parametrize("cudnn", [False, True])
def test_the_lstm_builds_the_seeds_model(monkeypatch, cudnn):
    """Embedding(20000, 128) -> LSTM(128) -> Dense(1, sigmoid) on 80-token reviews, batch
    32, 25000 samples; the seed's recurrent dropout (which rules cuDNN out) unless --cudnn."""
    import runpy
    import sys
    import types

    keras = _Keras()
    module = types.ModuleType("keras")
    module.layers, module.Sequential, module.Input = keras.layers_ns, keras.Sequential, keras.Input
    recorded = keras.layers
    harness = types.ModuleType("_harness")
    args = types.SimpleNamespace(cudnn=int(cudnn), device="gpu", seed=0, scale=1.0, warmup=2)
    harness.parse_args = lambda *a, **kw: args
    harness.setup = lambda device, seed: (types.SimpleNamespace(device=lambda d: _Nothing()), "")
    harness.step_timer = lambda k: types.SimpleNamespace(step_ms=lambda: [])
    harness.result = lambda *a, **kw: kw
    harness.emit = lambda r: None
    harness.fail = lambda m: pytest.fail(m)
    monkeypatch.setitem(sys.modules, "keras", module)
    monkeypatch.setitem(sys.modules, "_harness", harness)
    runpy.run_path(str(bench.WORKLOAD_DIR / "lstm.py"), run_name="__main__")
    assert keras.model == [("Input", (80,)), "Embedding", "LSTM", "Dense"]
    made = {name: (a, kw) for name, a, kw in recorded}
    assert made["Embedding"][0] == (20000, 128) and made["LSTM"][0] == (128,)
    lstm = made["LSTM"][1]
    if cudnn:
        assert lstm.get("use_cudnn") is True and not lstm.get("recurrent_dropout")
    else:
        assert lstm["recurrent_dropout"] == 0.2 and lstm["dropout"] == 0.2
    assert made["Dense"] == ((1,), {"activation": "sigmoid"})
    [(x, y, fit)] = keras.fits
    assert x == (25000, 80) and y == (25000, 1) and fit["batch_size"] == 32


class _Nothing:
    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return False


def test_select_workloads():
    assert bench.select_workloads(None) == list(bench.WORKLOADS.values())
    assert [w.name for w in bench.select_workloads(["cnn", "lstm", "cnn"])] == ["cnn", "lstm"]
    with pytest.raises(GpuenvError, match="no such workload; choose from lstm") as exc:
        bench.select_workloads(["resnet"])
    assert exc.value.exit_code == 2


def test_the_result_is_the_last_json_line():
    out = 'noise\n{"not": "it"}\nWARNING {x\n{"workload": "lstm", "ms_per_step": 12.5}\n\n'
    assert bench.parse_result(out) == {"workload": "lstm", "ms_per_step": 12.5}
    assert bench.parse_result("Traceback...\n") is None


def test_speedups_are_against_the_first_cpu_row_of_the_workload():
    rows = bench.apply_speedups([
        row(CPU, "cpu", "lstm", 14.0),
        row("other-cpu", "cpu", "lstm", 28.0),
        row(GPU, "gpu", "lstm", 7.0),
        row(GPU, "gpu", "lstm-cudnn", 0.8),
        row(GPU, "gpu", "cnn", missing="no --gpus given"),
    ])  # fmt: skip
    assert [r.speedup for r in rows] == [1.0, 0.5, 2.0, 17.5, None]
    assert rows[3].baseline == f"{CPU}/lstm"  # the seed's cuDNN row: against the CPU LSTM


def test_the_table_is_the_seeds_columns():
    rows = bench.apply_speedups([
        row(CPU, "cpu", "lstm", 14.0),
        row(GPU, "gpu", "lstm", 7.0),
        row(GPU, "gpu", "matmul", missing="this Docker Engine cannot give containers GPUs"),
    ])  # fmt: skip
    rows[0].epoch_s = 10.9
    t = bench.table(rows)
    assert t[0] == ("cell", "device", "workload", "ms/step", "epoch", "speed-up")
    assert t[1] == (CPU, "CPU", "lstm", "14.00", "10.9 s", "1.0x (baseline)")
    assert t[2][3:] == ("7.00", "-", "2.00x")
    assert t[3][5] == "missing: this Docker Engine cannot give containers GPUs"


def test_csv_json_and_a_real_png(tmp_path):
    rows = bench.apply_speedups([row(CPU, "cpu", "lstm", 14.0),
                                 row(GPU, "gpu", "lstm", missing="no --gpus given")])  # fmt: skip
    bench.write_csv(rows, tmp_path / "b.csv")
    lines = (tmp_path / "b.csv").read_text().splitlines()
    assert lines[0] == ",".join(bench.CSV_COLUMNS) and len(lines) == 3
    doc = json.loads(json.dumps(bench.as_json(rows, 0.1)))
    assert doc["scale"] == 0.1 and doc["rows"][1]["missing"] == "no --gpus given"
    bench.plot(rows, tmp_path / "b.png")
    assert (tmp_path / "b.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_the_workload_command():
    wl = bench.WORKLOADS["lstm-cudnn"]
    assert bench.command_for(wl, "gpu", 0.1) == [
        "python", "lstm.py", "--cudnn", "1", "--device", "gpu", "--scale", "0.1"]  # fmt: skip


def test_the_workload_dir_holds_copies_and_goes_away():
    with bench.workload_dir() as d:
        assert (d / "lstm.py").read_text() == (bench.WORKLOAD_DIR / "lstm.py").read_text()
        assert oct(d.stat().st_mode & 0o777) == "0o755"
    assert not d.exists()


def _bench(engine_class, monkeypatch, gpus, outcome):
    from gpuenv.project.project import open_project

    fake_engine = engine_class()
    fake_engine.outcomes[f"gpuenv/tensorflow:{CPU}"] = outcome
    monkeypatch.setattr(target, "target_for", lambda eng, cell, gpu, project: target.Target(
        f"gpuenv/tensorflow:{cell}", {}))  # fmt: skip
    monkeypatch.setattr(preflight, "gpu_preflight", lambda *a: None)
    opts = bench.BenchOptions(gpus=gpus, workloads=bench.select_workloads(["lstm", "lstm-cudnn"]),
                              scale=0.1)  # fmt: skip
    said = []
    rows = bench.bench(fake_engine, open_project(REPO / "matrix.yaml"), opts, said.append)
    return rows, said, fake_engine


def test_bench_runs_the_workload_through_runs_container_path(fake_engine, monkeypatch):
    result = {"workload": "lstm", "device": "CPU: x, 2 threads", "ms_per_step": 14.0,
              "epoch_s": 10.9}  # fmt: skip
    rows, said, eng = _bench(fake_engine, monkeypatch, None, (0, "log\n" + json.dumps(result)))
    # CPU cell: lstm (lstm-cudnn is GPU only); GPU cell: both, missing without --gpus.
    assert [(r.cell, r.workload) for r in rows] == [
        (CPU, "lstm"), (GPU, "lstm"), (GPU, "lstm-cudnn")]  # fmt: skip
    assert rows[0].ms_per_step == 14.0 and rows[0].speedup == 1.0
    assert rows[0].device == "CPU: x, 2 threads"
    assert all(r.missing and "no --gpus given" in r.missing for r in rows[1:])
    # Two containers: the probe of whether the engine sees the scratch directory (it does:
    # bound, not sent), then the CPU row's.
    probe, spec = eng.created
    assert probe.labels == {"io.gpuenv.probe": "1"} and probe.network == "none"
    assert spec.command == ["python", "lstm.py", "--device", "cpu", "--scale", "0.1"]
    assert spec.network == "none" and spec.device_requests == []
    assert spec.workdir and spec.workdir.startswith(spec.binds[0].split(":")[0])
    assert spec.labels == {"io.gpuenv.run": "1"} and not eng.containers  # removed
    assert said == [f"{CPU}: lstm on the CPU (scale 0.1)"]


def test_a_failed_workload_is_a_missing_row_with_its_reason(fake_engine, monkeypatch):
    rows, _, _ = _bench(fake_engine, monkeypatch, None, (3, '{"error": "raise --scale"}'))
    assert rows[0].missing == "raise --scale" and rows[0].ms_per_step is None
    rows, _, _ = _bench(fake_engine, monkeypatch, None, (137, "Killed"))
    assert rows[0].missing and rows[0].missing.startswith("the workload exited 137")


def test_gpu_rows_the_engine_refuses_say_why(fake_engine, monkeypatch):
    fake_engine = fake_engine()

    def refuse(eng, target, gpus):
        if gpus is not None:
            raise GpuenvError("this Docker Engine cannot give containers GPUs (...)")

    result = {"workload": "lstm", "ms_per_step": 14.0}
    fake_engine.outcomes[f"gpuenv/tensorflow:{CPU}"] = (0, json.dumps(result))
    monkeypatch.setattr(target, "target_for", lambda eng, cell, gpu, project: target.Target(
        f"gpuenv/tensorflow:{cell}", {}))  # fmt: skip
    monkeypatch.setattr(preflight, "gpu_preflight", refuse)
    from gpuenv.project.project import open_project

    opts = bench.BenchOptions(gpus=parse_gpus("all"), workloads=bench.select_workloads(None))
    rows = bench.bench(fake_engine, open_project(REPO / "matrix.yaml"), opts, lambda s: None)
    gpu_rows = [r for r in rows if r.kind == "gpu"]
    assert len(gpu_rows) == 4 and all(r.ms_per_step is None for r in gpu_rows)
    assert all("cannot give containers GPUs" in (r.missing or "") for r in gpu_rows)
    assert all(not s.device_requests for s in fake_engine.created)  # CPU rows only ran


# ---------------------------------------------------------------- several GPUs


@pytest.mark.parametrize(
    ("spec", "shm"),
    [(None, "2g"), ("1", "2g"), ("device=0", "2g"), ("2", "4g"), ("device=0,2,3", "6g"),
     ("all", "16g")],
)  # fmt: skip
def test_shm_is_sized_per_gpu(spec, shm):
    gpus = parse_gpus(spec) if spec else None
    settings = run.multi_gpu_settings(gpus, {})
    assert settings.shm_size == shm


def test_nccl_settings_pass_through_for_several_gpus_and_e_overrides(tmp_path):
    environ = {"NCCL_DEBUG": "INFO", "NCCL_SOCKET_IFNAME": "eth0", "HOME": "/root"}
    assert run.multi_gpu_settings(parse_gpus("2"), environ).env == {
        "NCCL_DEBUG": "INFO", "NCCL_SOCKET_IFNAME": "eth0"}  # fmt: skip
    assert run.multi_gpu_settings(parse_gpus("1"), environ).env == {}


def test_container_spec_of_a_multi_gpu_run(tmp_path, monkeypatch):
    monkeypatch.setenv("NCCL_DEBUG", "INFO")
    monkeypatch.setenv("NCCL_P2P_DISABLE", "1")
    opts = run.RunOptions(image="img", command=["python", "t.py"], gpus=parse_gpus("all"),
                          env=["NCCL_DEBUG=WARN"], cwd=tmp_path)  # fmt: skip
    spec = run.container_spec(opts)
    assert spec.shm_size == "16g"
    assert spec.env["NCCL_DEBUG"] == "WARN" and spec.env["NCCL_P2P_DISABLE"] == "1"
    ipc = run.container_spec(run.RunOptions(image="img", command=["x"], gpus=parse_gpus("2"),
                                            ipc="host", cwd=tmp_path))  # fmt: skip
    assert ipc.shm_size is None and ipc.ipc == "host"
