"""The image-size baseline: <matrix stem>.sizes.json next to the matrix, cell -> bytes.

`gpuenv validate` fails an image that grew past +20 % of its recorded size (a stray
`chown -R` or a dependency dragging in a second CUDA doubles an image quietly);
`gpuenv validate --record-sizes` records the sizes of images that passed.
"""

from __future__ import annotations

import json
import os
import tempfile
from pathlib import Path

from gpuenv.matrix.errors import GpuenvError
from gpuenv.matrix.umask import current_umask

GROWTH_LIMIT = 1.2
MAX_BASELINE_BYTES = 1 << 20  # one line per cell


def baseline_path(matrix: Path) -> Path:
    return matrix.with_name(f"{matrix.stem}.sizes.json")


def read_baseline(path: Path) -> dict[str, int]:
    """The recorded sizes; {} when there is no baseline file. A file that is not a JSON
    object is an error: ignoring it would switch the gate off without a word."""
    from gpuenv.matrix.files import read_regular

    try:
        raw = read_regular(path, MAX_BASELINE_BYTES)
    except FileNotFoundError:
        return {}
    except OSError as exc:
        raise GpuenvError(f"cannot read the size baseline {path}: {exc.strerror}") from None
    if len(raw) > MAX_BASELINE_BYTES:
        raise GpuenvError(f"{path}: larger than {MAX_BASELINE_BYTES >> 20} MiB, not a baseline")
    try:
        data = json.loads(raw.decode("utf-8", errors="replace"))
    except ValueError as exc:
        raise GpuenvError(f"{path}: not valid JSON ({exc})") from None
    if not isinstance(data, dict):
        raise GpuenvError(f"{path}: expected a JSON object of cell name -> size in bytes")
    return {str(k): v for k, v in data.items() if isinstance(v, int) and not isinstance(v, bool)}


def record(path: Path, sizes: dict[str, int]) -> None:
    """Merge `sizes` into the baseline, atomically: a write interrupted (a signal, a full
    disk) leaves the previous baseline whole, never a truncated file that
    `read_baseline` refuses."""
    data = {**read_baseline(path), **sizes}
    text = json.dumps(dict(sorted(data.items())), indent=2) + "\n"
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.")
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as fh:
            fh.write(text)
        os.chmod(
            tmp, 0o666 & ~current_umask()
        )  # as write_text would have made it, not mkstemp's 0600
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
