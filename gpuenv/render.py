"""Render a cell into a build context: a Dockerfile from the Jinja2 templates in images/.

Rendering is a pure function of the cell and the render options: no timestamps, sorted
inputs, StrictUndefined. The spec hash (build.py) is taken over these files.
"""

from __future__ import annotations

import hashlib
import json
import shlex
from dataclasses import dataclass, field
from functools import cache
from pathlib import Path

import jinja2

from gpuenv.cell import Cell
from gpuenv.compat import driver_floor
from gpuenv.lock import CellLock

# The uv release bootstrapped (and removed) inside each install step. Part of the rendered
# line, so changing it rebuilds, as it should.
UV_VERSION = "0.13.9"
VENV = "/opt/venv"
LOCK_DIR = "/opt/gpuenv"  # the locked requirements the image was installed from
USER = "gpuenv"
UID = 1000
# The CA bundle is served to the build on this fixed loopback address (see ca_server.py).
CA_PORT = 47811
CA_URL = f"http://127.0.0.1:{CA_PORT}/ca.pem"
CA_PATH = "/tmp/gpuenv-ca.pem"
SYSTEM_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
# Library directories of the nvidia-*-cu12 wheels (TF 2.16/2.17 need them on the path).
NVIDIA_LIB_DIRS = (
    "cublas", "cuda_cupti", "cuda_nvrtc", "cuda_runtime", "cudnn", "cufft",
    "curand", "cusolver", "cusparse", "nccl", "nvjitlink",
)  # fmt: skip
OCI = "org.opencontainers.image"


@dataclass(frozen=True)
class RenderOptions:
    ca: bool = False
    index_url: str | None = None
    extra_index_urls: tuple[str, ...] = ()


@dataclass(frozen=True)
class BuildContext:
    cell: Cell
    files: dict[str, str] = field(default_factory=dict)  # relative path -> text

    @property
    def dockerfile(self) -> str:
        return self.files["Dockerfile"]

    def digest(self) -> str:
        """sha256 over the context's files (names and contents)."""
        h = hashlib.sha256()
        for name in sorted(self.files):
            data = self.files[name].encode()
            h.update(f"{name}\0{len(data)}\0".encode())
            h.update(data)
        return h.hexdigest()

    def write(self, root: Path) -> Path:
        target = root / self.cell.name
        target.mkdir(parents=True, exist_ok=True)
        for name, text in self.files.items():
            (target / name).parent.mkdir(parents=True, exist_ok=True)
            (target / name).write_text(text, encoding="utf-8")
        return target


def templates_dir() -> Path:
    """images/ in a source checkout, or the copy the wheel carries inside the package."""
    packaged = Path(__file__).parent / "images"
    return packaged if packaged.is_dir() else Path(__file__).parent.parent / "images"


@cache
def _environment(root: Path) -> jinja2.Environment:
    return jinja2.Environment(
        loader=jinja2.FileSystemLoader(root),
        undefined=jinja2.StrictUndefined,
        trim_blocks=True,
        lstrip_blocks=True,
        keep_trailing_newline=True,
        autoescape=False,  # Dockerfiles, not HTML; every value is validated upstream
    )


def site_packages(cell: Cell) -> str:
    return f"{VENV}/lib/python{cell.python}/site-packages"


def labels(cell: Cell) -> dict[str, str]:
    """Every label but io.gpuenv.spec-hash, which build.py adds (it hashes this file)."""
    what = f"{cell.framework} {cell.framework_version}, Python {cell.python}, {cell.variant}"
    if cell.is_gpu:
        what += f", CUDA {cell.cuda_release}, cuDNN {cell.wheels['nvidia-cudnn-cu12']}"
    return {
        f"{OCI}.title": cell.image,
        f"{OCI}.description": what,
        f"{OCI}.version": cell.name,
        f"{OCI}.base.name": cell.base.image,
        "io.gpuenv.cell": cell.name,
        "io.gpuenv.variant": cell.variant,
        "io.gpuenv.python": cell.python,
        "io.gpuenv.framework": cell.framework,
        "io.gpuenv.framework-version": cell.framework_version,
        "io.gpuenv.cuda": cell.cuda or "",
        "io.gpuenv.cudnn": cell.cudnn or "",
    }


def render(
    cell: Cell, options: RenderOptions | None = None, lock: CellLock | None = None
) -> BuildContext:
    options = options or RenderOptions()
    env = _environment(templates_dir())
    sp = site_packages(cell)
    path = f"{VENV}/bin:{SYSTEM_PATH}"
    if cell.is_gpu:
        # ptxas, for XLA's and TensorFlow's own PTX compilation.
        path = f"{VENV}/bin:{sp}/nvidia/cuda_nvcc/bin:{SYSTEM_PATH}"
    # Requirements such as pandas<3 hold shell metacharacters (a redirection, unquoted);
    # plain pins like tensorflow==2.21.0 come out unchanged.
    python_packages = [
        shlex.quote(p) for p in (f"{cell.framework}=={cell.framework_version}", *cell.pip)
    ]
    dockerfile = env.get_template("Dockerfile.j2").render(
        cell=cell,
        ca=options.ca,
        ca_url=CA_URL,
        ca_path=CA_PATH,
        index_url=options.index_url,
        extra_index_urls=list(options.extra_index_urls),
        uv_version=UV_VERSION,
        venv=VENV,
        user=USER,
        uid=UID,
        path=path,
        python_packages=python_packages,
        locked=lock is not None,
        lock_dir=LOCK_DIR,
        cuda_packages=[f"{name}=={version}" for name, version in cell.wheels.items()],
        require_cuda=driver_cuda_floor(cell) if cell.is_gpu else None,
        ld_library_path=":".join(f"{sp}/nvidia/{d}/lib" for d in NVIDIA_LIB_DIRS),
        labels=labels(cell),
    )
    cell_json = json.dumps(cell.to_json(), indent=2, sort_keys=True) + "\n"
    files = {"Dockerfile": dockerfile, "cell.json": cell_json}
    if lock is not None:
        files["requirements/python-env.txt"] = lock.python_env
        if cell.is_gpu:
            files["requirements/cuda.txt"] = lock.cuda
    return BuildContext(cell, files)


def driver_cuda_floor(cell: Cell) -> str:
    """NVIDIA_REQUIRE_CUDA's value: the CUDA major's floor (cuda>=12.0), not the exact minor,
    so hosts with an older driver of the same major pass under minor-version compatibility."""
    assert cell.cuda is not None
    driver_floor(cell.cuda)  # an unknown major fails here, not on a GPU host
    return f"{cell.cuda.split('.')[0]}.0"
