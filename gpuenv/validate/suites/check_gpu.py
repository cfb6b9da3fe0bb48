"""Checks for GPU images that need no GPU: the CUDA libraries are the cell's, they load
without a driver, and the environment lets the framework find them."""

from __future__ import annotations

import json

from conftest import Box
from framework_code import cuda_loads, cudart, nvcc_wheel

GPU_ONLY = True


def _major_minor(encoded: int, major_div: int, minor_div: int) -> str:
    return f"{encoded // major_div}.{(encoded % major_div) // minor_div}"


def test_cuda_runtime_version(box: Box) -> None:
    code = (
        "import ctypes; v = ctypes.c_int()\n"
        f"lib = ctypes.CDLL({cudart(box.expected)!r})\n"
        "assert lib.cudaRuntimeGetVersion(ctypes.byref(v)) == 0\n"
        "print(v.value)"
    )
    found = _major_minor(int(box.python(code).strip()), 1000, 10)
    wanted = box.expected["cuda"]
    assert found == wanted, f"cudaRuntimeGetVersion reports CUDA {found}, expected {wanted}"


def test_cudnn_version(box: Box) -> None:
    major = box.expected["cudnn"].split(".")[0]
    code = f"import ctypes; print(ctypes.CDLL('libcudnn.so.{major}').cudnnGetVersion())"
    version = int(box.python(code).strip())
    # cuDNN 9 encodes major*10000 + minor*100 + patch; cuDNN 8 major*1000 + minor*100 + patch.
    divisor = 10000 if version >= 90000 else 1000
    found, wanted = _major_minor(version, divisor, 100), box.expected["cudnn"]
    assert found == wanted, f"cudnnGetVersion reports cuDNN {found} ({version}), expected {wanted}"


def test_cuda_libraries_load_without_a_driver(box: Box) -> None:
    # The libraries the framework opens (TensorFlow's dso_loader, torch and the JAX plugin
    # by soname or path): every one its pinned wheels ship, by soname, as the default user.
    libs = {so for _, so in cuda_loads(box.expected).values()}
    code = (
        "import ctypes, json\nout = {}\n"
        f"for name in {sorted(libs)!r}:\n"
        "    try: ctypes.CDLL(name); out[name] = 'ok'\n"
        "    except OSError as e: out[name] = str(e)\n"
        "print(json.dumps(out))"
    )
    failed = {k: v for k, v in box.python_json(code).items() if v != "ok"}
    assert not failed, f"cannot load as the default user: {failed}"


# NVSHMEM (PyTorch and JAX pin it) ships optional bootstrap and transport plugins that
# NVSHMEM dlopens only when configured to (NVSHMEM_BOOTSTRAP=MPI, an InfiniBand or UCX
# transport), and cuFile (PyTorch) an RDMA plugin for GPUDirect Storage; each links the
# host's own fabric library (MPI, PMIx, rdma-core, libfabric, UCX), which no image brings.
# Only those plugins, and only those libraries, may be unresolved; libnvshmem_host and
# libcufile themselves must resolve.
HOST_FABRIC_LIBS = frozenset(
    {"libmpi.so.40", "libpmix.so.2", "liboshmem.so.40", "libmlx5.so.1", "libfabric.so.1",
     "libucp.so.0", "libucs.so.0", "libibverbs.so.1", "librdmacm.so.1"}
)  # fmt: skip


def _host_fabric_plugin(path: str) -> bool:
    import re

    return bool(
        re.search(r"/nvshmem/lib/nvshmem_(bootstrap|transport)_[a-z]+\.so", path)
        or re.search(r"/lib/libcufile_rdma\.so", path)
    )


def test_ldd_finds_everything_but_libcuda(box: Box) -> None:
    # ldd every shared object of the nvidia-* wheels. Fail closed: ldd must be there and
    # succeed on each, and the libraries examined must include every one TensorFlow loads
    # and at least one per wheel directory on the library path.
    sp = box.expected["site_packages"]
    exp = box.expected
    wanted = sorted(set(cuda_loads(exp).values()))
    code = (
        "import glob, json, os, shutil, subprocess\n"
        f"files = sorted(glob.glob({sp!r} + '/nvidia/*/lib/*.so*'))\n"
        "ldd = shutil.which('ldd')\nout = {}\n"
        "for f in files if ldd else []:\n"
        "    p = subprocess.run([ldd, f], capture_output=True, text=True)\n"
        "    out[f] = [p.returncode, p.stdout + p.stderr]\n"
        "print(json.dumps({'ldd': ldd, 'files': files, 'out': out}))"
    )
    found = box.python_json(code)
    assert found["ldd"], "ldd is not in the image: the libraries' dependencies cannot be checked"
    examined = {f"{f.split('/')[-3]}/{f.split('/')[-1]}" for f in found["out"]}
    # A library counts under any file name that starts with its soname (libcufft.so.11 or
    # libcufft.so.11.2.3.61): whether it loads by its soname is the loading check's business.
    absent = sorted(
        f"{d}/{so}" for d, so in wanted if not any(e.startswith(f"{d}/{so}") for e in examined)
    )
    absent += sorted(
        f"{d}/*.so*"
        for d in exp["nvidia_lib_dirs"]
        if not any(e.startswith(d + "/") for e in examined)
    )
    assert not absent, f"ldd examined {len(examined)} libraries, not {absent} (under {sp}/nvidia)"
    failed = [
        f"{f}: exit {rc} {text.strip()[:120]}" for f, (rc, text) in found["out"].items() if rc
    ]
    assert not failed, "ldd failed on: " + "; ".join(failed[:5])
    missing = [
        f"{f}: {line.strip()}"
        for f, (_, text) in found["out"].items()
        for line in text.splitlines()
        if "not found" in line
        and "libcuda.so.1" not in line
        and not (_host_fabric_plugin(f) and line.split()[0] in HOST_FABRIC_LIBS)
    ]
    assert not missing, "unresolved libraries: " + "; ".join(missing[:10])


def test_ptxas_is_found(box: Box) -> None:
    import re

    import pytest

    nvcc = nvcc_wheel(box.expected)
    if nvcc is None:
        pytest.skip(
            f"{box.expected['framework']} requires no nvcc wheel: it compiles no PTX at run time"
        )
    result = box.sh("ptxas --version")
    assert result.rc == 0, f"ptxas not on the PATH: {result.stderr.strip()[:200]}"
    # "Cuda compilation tools, release 12.5, V12.5.82": the cell's CUDA and, exactly, the
    # release of the nvidia-cuda-nvcc(-cu12) wheel the cell pins.
    m = re.search(r"release (\d+\.\d+), V(\d+(?:\.\d+)+)", result.stdout)
    assert m, f"ptxas --version names no release: {result.stdout.strip()[-200:]}"
    wanted = (box.expected["cuda"], box.expected["wheels"][nvcc])
    assert m.groups() == wanted, (
        f"ptxas is release {m.group(1)}, V{m.group(2)}; expected release {wanted[0]}, "
        f"V{wanted[1]} ({nvcc}=={wanted[1]})"
    )


def test_framework_build_info_agrees(box: Box) -> None:
    """The framework was built for the cell's CUDA and cuDNN majors, as it says itself."""
    exp = box.expected
    framework = exp["framework"]
    if framework == "torch":
        # torch.version.cuda is what the wheel was built with; cudnn.version() loads cuDNN.
        code = (
            "import json, torch\n"
            "print(json.dumps({'cuda': torch.version.cuda,\n"
            "                  'cudnn': torch.backends.cudnn.version()}))"
        )
        info = box.python_json(code)
        assert info["cuda"], "torch is not a CUDA build (torch.version.cuda is None)"
        assert info["cuda"] == exp["cuda"], f"torch was built for CUDA {info['cuda']}: {info}"
        cudnn = int(info["cudnn"] or 0)
        found = f"{cudnn // 10000}.{cudnn % 10000 // 100}"
        assert found == exp["cudnn"], (
            f"torch loads cuDNN {found} ({cudnn}), expected {exp['cudnn']}"
        )
        return
    if framework == "jax":
        # The CUDA plugin matching the cell's CUDA major, at jax's own version, and the
        # CUDA/cuDNN versions it was built against (jax._src.lib.cuda_versions).
        major = exp["cuda"].split(".")[0]
        code = (
            "import json, os; os.environ['JAX_PLATFORMS'] = 'cpu'\n"
            "import importlib.metadata as m, jax\n"
            f"import jax_cuda{major}_plugin as plugin\n"
            "from jax._src.lib import cuda_versions as v\n"
            f"print(json.dumps({{'plugin': m.version('jax-cuda{major}-plugin'),\n"
            "    'jax': jax.__version__, 'cuda': v.cuda_runtime_build_version(),\n"
            "    'cudnn': v.cudnn_build_version()}))"
        )
        info = box.python_json(code)
        assert info["plugin"] == info["jax"], (
            f"jax-cuda{major}-plugin {info['plugin']} != jax {info['jax']}"
        )
        assert info["cuda"] // 1000 == int(major), (
            f"the plugin was built for CUDA {info['cuda']}: {info}"
        )
        assert info["cudnn"] // 10000 == int(exp["cudnn"].split(".")[0]), info
        return
    code = (
        "import os; os.environ['TF_CPP_MIN_LOG_LEVEL'] = '3'\n"
        "import json, tensorflow as tf\n"
        "info = tf.sysconfig.get_build_info()\n"
        "print(json.dumps({k: str(v) for k, v in info.items()}))"
    )
    info = box.python_json(code)
    assert info.get("is_cuda_build") == "True", "TensorFlow is not a CUDA build"
    built_cuda = info["cuda_version"].split(".")[0]
    built_cudnn = info["cudnn_version"].split(".")[0]
    assert built_cuda == box.expected["cuda"].split(".")[0], info
    assert built_cudnn == box.expected["cudnn"].split(".")[0], info


def test_nvidia_environment(box: Box) -> None:
    env = dict(e.split("=", 1) for e in box.config["Env"])
    assert env.get("NVIDIA_DRIVER_CAPABILITIES") == "compute,utility"
    major = box.expected["cuda"].split(".")[0]
    assert env.get("NVIDIA_REQUIRE_CUDA") == f"cuda>={major}.0"
    assert "NVIDIA_VISIBLE_DEVICES" not in env, "GPUs must be asked for, never baked in"


def test_library_path_reaches_the_wheels(box: Box) -> None:
    env = dict(e.split("=", 1) for e in box.config["Env"])
    paths = env.get("LD_LIBRARY_PATH", "").split(":")
    sp = box.expected["site_packages"]
    wanted = [f"{sp}/nvidia/{d}/lib" for d in box.expected["nvidia_lib_dirs"]]
    absent = [p for p in wanted if p not in paths]
    assert not absent, f"LD_LIBRARY_PATH misses {absent}"
    code = f"import json, os; print(json.dumps([os.path.isdir(p) for p in {wanted!r}]))"
    exists = json.loads(box.python(code).strip())
    assert all(exists), [p for p, ok in zip(wanted, exists, strict=True) if not ok]
