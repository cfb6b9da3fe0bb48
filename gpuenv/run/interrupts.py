"""Following a remote job (a Kubernetes Job, a Slurm job) until it ends: SIGINT and SIGTERM
end the follow loop as `Interrupted(130 / 143)`, so the caller cancels the job and exits
with the shell's code, where the job's own processes are not gpuenv's children."""

from __future__ import annotations

import signal
import threading
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager, contextmanager
from types import FrameType


class Interrupted(BaseException):
    """A signal while following a job; `code` is 128 + the signal."""

    def __init__(self, code: int) -> None:
        self.code = code


@contextmanager
def signals_to(handler: Callable[[int, FrameType | None], None] | int) -> Iterator[None]:
    """SIGINT and SIGTERM go to `handler` (signal.SIG_IGN: nowhere) inside the block (main
    thread only: Python delivers signals there), the handlers before it restored after."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    previous = {s: signal.signal(s, handler) for s in (signal.SIGINT, signal.SIGTERM)}
    try:
        yield
    finally:
        for s, h in previous.items():
            signal.signal(s, h)


def raising_interrupted() -> AbstractContextManager[None]:
    """SIGINT and SIGTERM raise Interrupted inside the block."""

    def handler(signum: int, frame: FrameType | None) -> None:
        raise Interrupted(128 + signum)

    return signals_to(handler)
