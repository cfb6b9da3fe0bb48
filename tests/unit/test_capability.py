"""gpuenv.gpu.capability: compute capability verdicts on real GPUs, and data/sass.yaml's rows.

The compute capabilities are NVIDIA's (developer.nvidia.com/cuda-gpus): K80 3.7, P100 6.0,
V100 7.0, T4 7.5, A100 8.0, A10 and RTX 30 8.6, L4 and RTX 40 8.9, H100 9.0, B200 10.0,
RTX 50 12.0. The kernels are those read from the TensorFlow wheels (see data/sass.yaml).
"""

from __future__ import annotations

import re
from importlib import resources

import pytest
import yaml

from gpuenv.gpu import capability
from gpuenv.gpu.capability import (
    Arch,
    ComputeCapability,
    combine,
    judge_capability,
    judge_gpus,
    judge_release,
    kernels_for,
    parse_arch,
    parse_compute_capability,
    ptx_jits_on,
    releases_running_on,
    sass_runs_on,
)
from gpuenv.gpu.gpus import GpuInfo, Verdict, parse_nvidia_smi_query

GPUS = {
    "3.7": "Tesla K80",
    "6.0": "Tesla P100-PCIE-16GB",
    "7.0": "Tesla V100-SXM2-16GB",
    "7.5": "Tesla T4",
    "8.0": "NVIDIA A100-SXM4-40GB",
    "8.6": "NVIDIA A10G",
    "8.9": "NVIDIA L4",
    "9.0": "NVIDIA H100 80GB HBM3",
    "10.0": "NVIDIA B200",
    "12.0": "NVIDIA GeForce RTX 5090",
}


def _tf(minor: str) -> capability.KernelSet:
    row = kernels_for("tensorflow", minor)
    assert row is not None
    return row


def _judge(cc: str, minor: str) -> Verdict:
    row = _tf(minor)
    return judge_capability(cc, row.sass, row.ptx, row.label, gpu_name=GPUS.get(cc))


# ---------------------------------------------------------------------------- parsing


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("8.9", ComputeCapability(8, 9)),
        ("12.0", ComputeCapability(12, 0)),
        (" 3.7 ", ComputeCapability(3, 7)),
        ("10.0", ComputeCapability(10, 0)),
        ("?", None),
        ("", None),
        ("[N/A]", None),
        ("N/A", None),
    ],
)
def test_parse_compute_capability(text, expected):
    assert parse_compute_capability(text) == expected


@pytest.mark.parametrize("text", ["8", "8.9.1", "sm_89", "eight", "8.10", "-1.0", "8,9"])
def test_parse_compute_capability_malformed(text):
    with pytest.raises(ValueError, match=r"MAJOR\.MINOR"):
        parse_compute_capability(text)


def test_compute_capability_orders_numerically():
    assert ComputeCapability(9, 0) < ComputeCapability(10, 0) < ComputeCapability(12, 0)
    assert str(ComputeCapability(12, 0)) == "12.0"
    assert ComputeCapability(12, 0).sm == "sm_120"


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("sm_89", Arch("sm", 8, 9)),
        ("compute_90", Arch("compute", 9, 0)),
        ("sm_90a", Arch("sm", 9, 0, "a")),
        ("sm_100f", Arch("sm", 10, 0, "f")),
        ("sm_120", Arch("sm", 12, 0)),
        ("sm_35", Arch("sm", 3, 5)),
    ],
)
def test_parse_arch(text, expected):
    assert parse_arch(text) == expected
    assert expected.name == text


@pytest.mark.parametrize("text", ["sm89", "sm_", "compute_9", "ptx_90", "sm_90b", "SM_89"])
def test_parse_arch_malformed(text):
    with pytest.raises(ValueError):
        parse_arch(text)


# ---------------------------------------------------------------------------- the rules


@pytest.mark.parametrize(
    ("arch", "cc", "runs"),
    [
        ("sm_80", "8.0", True),
        ("sm_80", "8.6", True),  # same major, newer minor
        ("sm_80", "8.9", True),
        ("sm_89", "8.6", False),  # older minor
        ("sm_89", "9.0", False),  # another major
        ("sm_90", "10.0", False),
        ("sm_90", "12.0", False),
        ("sm_35", "3.7", True),
        ("sm_90a", "9.0", True),  # architecture-specific: exactly that cc
        ("sm_100a", "10.3", False),
        ("sm_100f", "10.3", True),  # family-specific: same major, same or newer minor
        ("sm_100f", "12.0", False),
    ],
)
def test_sass_rule(arch, cc, runs):
    assert sass_runs_on(parse_arch(arch), parse_compute_capability(cc)) is runs


@pytest.mark.parametrize(
    ("arch", "cc", "jits"),
    [
        ("compute_90", "9.0", True),
        ("compute_90", "10.0", True),  # PTX crosses majors
        ("compute_90", "12.0", True),
        ("compute_90", "8.9", False),  # never backwards
        ("compute_80", "8.6", True),
        ("compute_90a", "10.0", False),  # architecture-specific PTX is not forward compatible
        ("compute_90a", "9.0", True),
    ],
)
def test_ptx_rule(arch, cc, jits):
    assert ptx_jits_on(parse_arch(arch), parse_compute_capability(cc)) is jits


# ---------------------------------------------------------------------------- verdicts

# TensorFlow 2.21: SASS sm_60, sm_70, sm_80, sm_89, sm_90; PTX compute_90.
TF221 = {
    "3.7": ("error", None),
    "6.0": ("ok", "sm_60"),
    "7.0": ("ok", "sm_70"),
    "7.5": ("ok", "sm_70"),
    "8.0": ("ok", "sm_80"),
    "8.6": ("ok", "sm_80"),
    "8.9": ("ok", "sm_89"),
    "9.0": ("ok", "sm_90"),
    "10.0": ("warning", "compute_90"),
    "12.0": ("warning", "compute_90"),
}

# TensorFlow 2.15: SASS sm_50, sm_60, sm_70, sm_75, sm_80; PTX compute_80.
TF215 = {
    "3.7": ("error", None),
    "6.0": ("ok", "sm_60"),
    "7.0": ("ok", "sm_70"),
    "7.5": ("ok", "sm_75"),
    "8.0": ("ok", "sm_80"),
    "8.6": ("ok", "sm_80"),
    "8.9": ("ok", "sm_80"),
    "9.0": ("warning", "compute_80"),
    "10.0": ("warning", "compute_80"),
    "12.0": ("warning", "compute_80"),
}

# TensorFlow 2.12: SASS sm_35 ... sm_80; PTX compute_80. The K80 still runs natively.
TF212 = {"3.7": ("ok", "sm_35"), "9.0": ("warning", "compute_80")}


@pytest.mark.parametrize(
    ("minor", "cc", "level", "arch"),
    [("2.21", cc, *v) for cc, v in TF221.items()]
    + [("2.15", cc, *v) for cc, v in TF215.items()]
    + [("2.12", cc, *v) for cc, v in TF212.items()],
)
def test_verdicts_on_real_gpus(minor, cc, level, arch):
    verdict = _judge(cc, minor)
    assert verdict.level == level, verdict.message
    if level == "ok":
        assert verdict.message.startswith(f"runs natively ({arch} kernels)")
    elif level == "warning":
        assert f"runs by PTX JIT from {arch}" in verdict.message
        assert "first start" in verdict.message
        assert "driver" in verdict.message
    assert GPUS[cc] in verdict.message
    assert f"compute capability {cc}" in verdict.message


def test_k80_on_tf221_says_why():
    verdict = _judge("3.7", "2.21")
    assert verdict.message.startswith("cannot run: TensorFlow 2.21 has SASS for sm_60")
    assert "PTX compute_90" in verdict.message
    assert "sm_37" in verdict.message
    assert "Tesla K80" in verdict.message
    assert "older than all of them" in verdict.message
    assert "no kernel image is available" in verdict.message


def test_newer_gpu_without_ptx_cannot_run():
    # SASS only (no PTX): a 9.0 GPU has no kernel at all, although it is newer.
    verdict = judge_capability("9.0", ["sm_80", "sm_89"], [], "X 1.0")
    assert verdict.level == "error"
    assert "SASS runs only on its own major version (9.x has none here)" in verdict.message


def test_architecture_specific_sass_only_exact():
    assert judge_capability("9.0", ["sm_90a"], [], "X").level == "ok"
    assert judge_capability("10.0", ["sm_90a"], ["compute_90a"], "X").level == "error"


def test_native_wins_over_ptx():
    verdict = judge_capability("9.0", ["sm_80", "sm_90"], ["compute_90"], "X")
    assert verdict == Verdict("ok", verdict.message)
    assert "sm_90 kernels" in verdict.message


@pytest.mark.parametrize("cc", ["?", "", "[N/A]"])
def test_unknown_cc_is_info(cc):
    verdict = _judge(cc, "2.21")
    assert verdict.level == "info"
    assert "unknown" in verdict.message
    assert "sm_60" in verdict.message


@pytest.mark.parametrize("cc", ["8", "sm_89", "8.9.1", "garbage"])
def test_malformed_cc_is_info(cc):
    verdict = _judge(cc, "2.21")
    assert verdict.level == "info"
    assert "not understood" in verdict.message


def test_error_hint_names_an_older_release():
    k80 = GpuInfo("470.256.02", "Tesla K80", "3.7")
    verdict = judge_release(k80, "tensorflow", "2.21")
    assert verdict.level == "error"
    assert verdict.message.endswith(
        "Use TensorFlow 2.14 instead, the newest release with kernels for it"
    )
    # gpuenv makes GPU images of 2.15 and newer only: then no release fits.
    verdict = judge_release(k80, "tensorflow", "2.21", candidates=["2.15", "2.21"])
    assert "TensorFlow 2.14 and older have kernels for it, but gpuenv makes no GPU image" in (
        verdict.message
    )


def test_releases_running_on():
    assert releases_running_on("3.7") == ["2.14", "2.13", "2.12"]
    assert releases_running_on("5.0")[0] == "2.16"
    assert releases_running_on("12.0", native_only=True) == []
    assert releases_running_on("8.9", native_only=True)[0] == "2.21"
    assert releases_running_on("?") == []


def test_known_issue_on_rtx50():
    rtx5090 = GpuInfo("575.57.08", "NVIDIA GeForce RTX 5090", "12.0")
    verdict = judge_release(rtx5090, "tensorflow", "2.21")
    assert verdict.level == "warning"
    assert "runs by PTX JIT from compute_90" in verdict.message
    assert "Known problem" in verdict.message
    assert "CUDA_ERROR_INVALID_PTX" in verdict.message
    assert "github.com/tensorflow/tensorflow/issues/" in verdict.message
    # B200 (10.0) has no such report recorded.
    b200 = GpuInfo("575.57.08", "NVIDIA B200", "10.0")
    assert "Known problem" not in judge_release(b200, "tensorflow", "2.21").message


def test_unknown_release_is_info():
    gpu = GpuInfo("550.54.15", "NVIDIA L4", "8.9")
    verdict = judge_release(gpu, "tensorflow", "2.11")
    assert verdict.level == "info"
    assert "no record" in verdict.message
    assert kernels_for("tensorflow", "2.11") is None
    assert kernels_for("pytorch", "2.5") is None


def test_kernels_for_accepts_patch_and_short_name():
    assert kernels_for("tf", "2.21.0") == kernels_for("tensorflow", "2.21")
    assert _tf("2.21").version == "2.21.0"


def test_judge_gpus_from_nvidia_smi():
    # A mixed host, as `nvidia-smi --query-gpu=driver_version,name,compute_cap` prints it.
    text = "570.133.20, NVIDIA H100 80GB HBM3, 9.0\n570.133.20, Tesla V100-SXM2-16GB, 7.0\n"
    gpus = parse_nvidia_smi_query(text)
    verdicts = judge_gpus(gpus, "tensorflow", "2.21")
    assert [v.level for v in verdicts] == ["ok", "ok"]
    assert "sm_90 kernels" in verdicts[0].message
    assert "sm_70 kernels" in verdicts[1].message
    assert combine(verdicts).level == "ok"


def test_combine_takes_the_worst():
    ok = Verdict("ok", "a")
    warn = Verdict("warning", "b")
    err = Verdict("error", "c")
    assert combine([ok, warn, err]) == Verdict("error", "c; b; a")
    assert combine([ok, ok]) == Verdict("ok", "a")
    assert combine([Verdict("info", "i"), ok]).level == "info"
    assert combine([]).level == "info"


# ---------------------------------------------------------------------------- the data

SASS = re.compile(r"sm_\d{2,3}[af]?")
PTX = re.compile(r"compute_\d{2,3}[af]?")


def _doc() -> dict:
    return yaml.safe_load(resources.files("gpuenv.data").joinpath("sass.yaml").read_text("utf-8"))


def test_rows_well_formed():
    doc = _doc()
    assert doc["framework"] == "tensorflow"
    assert doc["releases"]
    for row in doc["releases"]:
        assert set(row) == {"minor", "version", "build_info", "sass", "ptx", "source"}, row
        assert row["sass"], row["minor"]
        assert all(SASS.fullmatch(a) for a in row["sass"]), row
        assert all(PTX.fullmatch(a) for a in row["ptx"]), row
        assert all(SASS.fullmatch(a) or PTX.fullmatch(a) for a in row["build_info"]), row
        assert row["version"].startswith(row["minor"] + ".")
        assert len(row["source"].split()) >= 3, row["minor"]
        assert "whl" in row["source"], row["minor"]
        # sass/ptx are what build_info asks for: sm_XY -> SASS; compute_XY -> SASS and PTX.
        asked = {a.replace("compute_", "sm_") for a in row["build_info"]}
        assert set(row["sass"]) == asked, row["minor"]
        assert set(row["ptx"]) == {a for a in row["build_info"] if a.startswith("compute_")}
        # each list sorted oldest first, no duplicates
        for key in ("sass", "ptx"):
            ccs = [parse_arch(a).cc for a in row[key]]
            assert ccs == sorted(set(ccs)), (row["minor"], key)


def test_known_issues_well_formed():
    doc = _doc()
    minors = {row["minor"] for row in doc["releases"]}
    for issue in doc.get("known_issues", []):
        assert parse_compute_capability(issue["compute_cap"]) is not None
        assert set(issue["minors"]) <= minors
        assert "https://" in issue["source"]
        assert issue["note"].strip()


def test_rows_cover_the_catalog():
    tf = yaml.safe_load(
        resources.files("gpuenv.data").joinpath("tensorflow.yaml").read_text("utf-8")
    )
    catalog = {(r["minor"], r["version"]) for r in tf["releases"]}
    recorded = {(r["minor"], r["version"]) for r in _doc()["releases"]}
    assert catalog == recorded


def test_tf221_as_read_from_the_built_image():
    # tf.sysconfig.get_build_info() in gpuenv/tensorflow:tf2.21-py3.11-cuda12.5-gpu
    row = _tf("2.21")
    recorded = next(r for r in _doc()["releases"] if r["minor"] == "2.21")
    assert recorded["build_info"] == ["sm_60", "sm_70", "sm_80", "sm_89", "compute_90"]
    assert row.sass == ("sm_60", "sm_70", "sm_80", "sm_89", "sm_90")
    assert row.ptx == ("compute_90",)
    assert "gpuenv/tensorflow:tf2.21-py3.11-cuda12.5-gpu" in row.source


def test_table_is_cached():
    assert capability.kernel_table() is capability.kernel_table()
