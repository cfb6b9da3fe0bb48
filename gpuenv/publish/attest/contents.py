"""What an image holds, as the SBOM lists it: every Python distribution the image's
`python` sees (importlib.metadata) and every Debian package dpkg knows, read from a
throwaway container with no network (Engine.run_capture)."""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import TYPE_CHECKING

from gpuenv.matrix.errors import GpuenvError

if TYPE_CHECKING:
    from gpuenv.engine.client import Engine, ImageInfo

# Runs inside the image with its own `python` (the cell's environment is first on PATH).
# dpkg-query's format is the one the SBOM needs: name, version, architecture.
PROBE = r"""
import importlib.metadata as md, json, subprocess
dists = sorted({(d.metadata['Name'], d.version) for d in md.distributions()
                if d.metadata['Name']})
try:
    out = subprocess.run(['dpkg-query', '-W', '-f', '${Package} ${Version} ${Architecture}\n'],
                         capture_output=True, text=True, check=True).stdout
except (OSError, subprocess.CalledProcessError):
    out = ''
debs = sorted(tuple(line.split(' ')) for line in out.splitlines() if line.count(' ') == 2)
print(json.dumps({'python': dists, 'debian': debs}))
"""


@dataclass(frozen=True)
class Contents:
    """What was found: (name, version) per distribution, (name, version, arch) per package."""

    python: tuple[tuple[str, str], ...]
    debian: tuple[tuple[str, str, str], ...]

    def to_json(self) -> dict[str, list[list[str]]]:
        return {"python": [list(p) for p in self.python], "debian": [list(d) for d in self.debian]}

    @classmethod
    def from_json(cls, data: dict[str, list[list[str]]]) -> Contents:
        python = tuple(sorted((str(n), str(v)) for n, v in data.get("python") or []))
        debian = tuple(sorted((str(n), str(v), str(a)) for n, v, a in data.get("debian") or []))
        return cls(python, debian)


def read_contents(engine: Engine, ref: str) -> tuple[ImageInfo, Contents]:
    """The image's metadata and contents; an error naming the image when it is missing or
    its `python` cannot list them."""
    info = engine.image(ref)
    if info is None:
        raise GpuenvError(f"image {ref} not found; build it (gpuenv build) or pull it")
    # The image's `python` (the cell's environment); python3 where there is none (a base).
    finder = 'exec "$(command -v python || command -v python3)" -c "$0"'
    code, out = engine.run_capture(info.id, ["sh", "-c", finder, PROBE])
    try:
        data = json.loads(out.strip().splitlines()[-1]) if code == 0 else None
    except (ValueError, IndexError):
        data = None
    if not isinstance(data, dict):
        raise GpuenvError(f"cannot list the contents of {ref}: its python exited {code}")
    return info, Contents.from_json(data)
