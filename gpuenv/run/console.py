"""What a run says to the user, on stderr (stdout is the workload's), here and on a cluster:
progress, warnings, and gpuenv's own failures (exit 125 unless the cause knows better, as
`docker run`'s do)."""

from __future__ import annotations

import sys

from gpuenv.matrix.errors import GpuenvError


def say(message: str) -> None:
    """Progress for the user (here and on a cluster), on stderr: stdout is the workload's."""
    print(f"gpuenv: {message}", file=sys.stderr)


def warn(message: str) -> None:
    print(f"warning: {message}", file=sys.stderr)


def run_error(message: str, code: int = 125) -> GpuenvError:
    """gpuenv's own failure of a run, to raise: exit 125 unless the cause knows better."""
    return GpuenvError(message, exit_code=code)
