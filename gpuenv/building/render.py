"""Render a cell into a build context: a Dockerfile from the Jinja2 templates in images/.

Rendering is a pure function of the cell, its indexes' key and its lock entry: no timestamps, sorted
inputs, StrictUndefined. The spec hash (plan.py) is taken over these files.
"""

from __future__ import annotations

import functools
import hashlib
import json
from dataclasses import dataclass, field
from functools import cache, cached_property
from pathlib import Path
from typing import TYPE_CHECKING

from gpuenv.matrix import contract
from gpuenv.matrix.cell import Cell
from gpuenv.project import fingerprint

if TYPE_CHECKING:
    import jinja2

    from gpuenv.project.lockfile import CellLock

# The uv release the install steps run (sent in the build context or fetched by the
# engine's host, never in a layer). Part of the rendered Dockerfile, so changing it
# rebuilds, as it should.
UV_VERSION = "0.13.9"
# Where an install step's part of the context is mounted (partials/macros.j2).
MOUNT = "/mnt"
# The files of a part (gpuenv/building/sendable.py): what the step's engine fetches from an
# index itself (`--index-url` and one hash per line; `--no-index` and nothing when the
# wheels come from the client), what was sent (wheels beside it), and the CA's mount point
# (an empty file: a BuildKit secret is mounted over it only on an engine of this machine).
FETCHED, SENT, CA_FILE = "index.txt", "requirements.txt", "ca.pem"
# uv in a part: its executable (`uv`, sent), or the script by which the engine's host
# fetches its wheel by hash (`uv.py`, gpuenv/building/near.py); either way the step runs it
# from `bin/`, an empty directory of the part with a tmpfs mounted over it (no layer).
UV_SENT, UV_SCRIPT, UV_BIN = "uv", "uv.py", "bin"


@dataclass(frozen=True)
class BuildContext:
    cell: Cell
    files: dict[str, str] = field(default_factory=dict)  # relative path -> text

    @property
    def dockerfile(self) -> str:
        return self.files["Dockerfile"]

    @cached_property
    def digest(self) -> str:
        """sha256 over the context's files (names and contents), taken once."""
        h = hashlib.sha256()
        for name in sorted(self.files):
            data = self.files[name].encode()
            h.update(f"{name}\0{len(data)}\0".encode())
            h.update(data)
        return h.hexdigest()

    def write(self, root: Path) -> Path:
        """The files under root/<cell>, each 0644 in 0755 directories whatever the umask:
        COPY keeps a file's mode, so a user's umask 077 would otherwise reach the image."""
        target = root / self.cell.name
        target.mkdir(parents=True, exist_ok=True)
        for name, text in self.files.items():
            path = target / name
            for directory in reversed(path.relative_to(target).parents[:-1]):
                (target / directory).mkdir(exist_ok=True)
                (target / directory).chmod(0o755)
            path.write_text(text, encoding="utf-8")
            path.chmod(0o644)
        return target


templates_dir = fingerprint.templates_dir


def templates_digest() -> str:
    """sha256 over every template file (names and contents): what `build --dry-run` compares
    to say "template" when a cell's Dockerfile changed because images/ did."""
    return _digest_of(templates_dir())


@cache
def _digest_of(root: Path) -> str:
    h = hashlib.sha256()
    for path in sorted(p for p in root.rglob("*") if p.is_file()):
        h.update(f"{path.relative_to(root)}\0".encode())
        h.update(path.read_bytes())
    return h.hexdigest()


@cache
def _environment(root: Path) -> jinja2.Environment:
    import jinja2  # only when rendering: a snapshot's contexts need no templates

    return jinja2.Environment(
        loader=jinja2.FileSystemLoader(root),
        undefined=jinja2.StrictUndefined,
        trim_blocks=True,
        lstrip_blocks=True,
        keep_trailing_newline=True,
        autoescape=False,  # Dockerfiles, not HTML; every value is validated upstream
    )


def render(cell: Cell, wheelhouse_key: str, lock: CellLock | None = None) -> BuildContext:
    """The cell's build context. `wheelhouse_key` names the package indexes its wheels
    come from (gpuenv/store/wheelhouse.py: index_key), so a change of upstream rebuilds."""
    from gpuenv.building.base import SOURCE_DATE_EPOCH

    env = _environment(templates_dir())
    venv, sp = contract.VENV, contract.site_packages(cell.python)
    path = f"{venv}/bin:{contract.SYSTEM_PATH}"
    if cell.is_gpu and cell.ptxas_dir:
        # ptxas, for XLA's and TensorFlow's own PTX compilation.
        path = f"{venv}/bin:{sp}/nvidia/{cell.ptxas_dir}:{contract.SYSTEM_PATH}"
    uv = f"{MOUNT}/{UV_BIN}/uv"
    dockerfile = env.get_template("Dockerfile.j2").render(
        cell=cell,
        index_key=f"{wheelhouse_key} (uv {UV_VERSION})",
        mount=MOUNT,
        uv=uv,
        # Both installs run on either path, so the line (and the image) is the same whether
        # the engine's host fetched the public wheels or they came in the context: only the
        # mounted files differ, which BuildKit keys its cache by and no image records.
        install_fetched=functools.partial(_install, uv, venv, FETCHED, ""),
        install_sent=functools.partial(
            _install, uv, venv, SENT, f"--offline --no-index --find-links {MOUNT} "
        ),
        uv_bin=f"{MOUNT}/{UV_BIN}",
        uv_sent=f"{MOUNT}/{UV_SENT}",
        uv_script=f"{MOUNT}/{UV_SCRIPT}",
        ca_file=f"{MOUNT}/{CA_FILE}",
        # The date every build step's programs see (partials/macros.j2): the bases' fixed
        # one, never the clock, whatever the lock's date (the layer then depends on the
        # installed files alone; --reproducible clamps file times to the lock's date).
        source_date_epoch=SOURCE_DATE_EPOCH,
        venv=venv,
        user=contract.USER,
        uid=contract.UID,
        path=path,
        locked=lock is not None,
        lock_dir=contract.LOCK_DIR,
        require_cuda=driver_cuda_floor(cell) if cell.is_gpu else None,
        ld_library_path=":".join(f"{sp}/nvidia/{d}/lib" for d in cell.nvidia_lib_dirs),
        labels=contract.image_labels(cell),
    )
    cell_json = json.dumps(cell.to_json(), indent=2, sort_keys=True) + "\n"
    files = {"Dockerfile": dockerfile, "cell.json": cell_json}
    if lock is not None:
        files["requirements/python-env.txt"] = lock.python_env
        if cell.is_gpu and not cell.cuda_with_framework:
            files["requirements/cuda.txt"] = lock.cuda
    return BuildContext(cell, files)


def _install(uv: str, venv: str, file: str, source: str, extra: str = "") -> str:
    """An install step's command for one of its part's files (`extra`: more options): run
    only when the file names a requirement (uv warns of one that names none), with uv's
    summary lines ("Prepared 30 packages in 9.1s") left in the log: the build's phase times
    are read from them (gpuenv/building/results.py)."""
    return (
        f"if grep -q -e --hash= {MOUNT}/{file}; then {uv} pip install --no-progress --no-cache "
        f"{source}--require-hashes --no-deps --python {venv}/bin/python -r {MOUNT}/{file}"
        f"{extra}; fi"
    )


def driver_cuda_floor(cell: Cell) -> str:
    """NVIDIA_REQUIRE_CUDA's value: the CUDA major's floor (cuda>=12.0), not the exact minor,
    so hosts with an older driver of the same major pass under minor-version compatibility."""
    from gpuenv.catalog.compat import driver_floor

    assert cell.cuda is not None
    driver_floor(cell.cuda)  # an unknown major fails here, not on a GPU host
    return f"{cell.cuda.split('.')[0]}.0"
