"""Following a remote job (a Kubernetes Job, a Slurm job) until it ends: SIGINT and SIGTERM
end the follow loop as `Interrupted(130 / 143)`, so the caller cancels the job and exits
with the shell's code, where the job's own processes are not gpuenv's children."""

from __future__ import annotations

import signal
import threading
from collections.abc import Iterator
from contextlib import contextmanager


class Interrupted(BaseException):
    """A signal while following a job; `code` is 128 + the signal."""

    def __init__(self, code: int) -> None:
        self.code = code


@contextmanager
def raising_interrupted() -> Iterator[None]:
    """SIGINT and SIGTERM raise Interrupted inside the block (main thread only: Python
    delivers signals there), the handlers before it restored after."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def handler(signum: int, frame: object) -> None:
        raise Interrupted(128 + signum)

    previous = {s: signal.signal(s, handler) for s in (signal.SIGINT, signal.SIGTERM)}
    try:
        yield
    finally:
        for s, h in previous.items():
            signal.signal(s, h)
