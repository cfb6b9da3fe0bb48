"""The image-size baseline: <matrix stem>.sizes.json next to the matrix, cell -> bytes.

`gpuenv validate` fails an image that grew past +20 % of its recorded size (a stray
`chown -R` or a dependency dragging in a second CUDA doubles an image quietly);
`gpuenv validate --record-sizes` records the sizes of images that passed.
"""

from __future__ import annotations

import json
from pathlib import Path

GROWTH_LIMIT = 1.2


def baseline_path(matrix: Path) -> Path:
    return matrix.with_name(f"{matrix.stem}.sizes.json")


def load(path: Path) -> dict[str, int]:
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return {}
    return {str(k): int(v) for k, v in data.items() if isinstance(v, int)}


def record(path: Path, sizes: dict[str, int]) -> None:
    data = {**load(path), **sizes}
    path.write_text(json.dumps(dict(sorted(data.items())), indent=2) + "\n", encoding="utf-8")
