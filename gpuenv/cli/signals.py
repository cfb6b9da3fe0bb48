"""How gpuenv stops on a signal: SIGTERM raised like Ctrl-C, and the exit codes and
messages the CLI reports."""

from __future__ import annotations

import signal
import threading

__all__ = ["Terminated", "interrupted_code", "interrupted_message", "on_sigterm_raise"]


class Terminated(KeyboardInterrupt):
    """SIGTERM, raised where the main thread is, like Ctrl-C's KeyboardInterrupt: every
    `finally` and `with` on the way out runs (containers removed, temporary files gone, a
    build's docker CLI told to cancel, streams closed so the engine cancels a build).
    Python's default for SIGTERM ends the process at once and would skip all of them."""


def _raise_terminated(signum: int, frame: object) -> None:
    raise Terminated()


def interrupted_code(exc: BaseException | None) -> int:
    """128 + the signal: 143 after SIGTERM, 130 after Ctrl-C (as shells report them)."""
    while exc is not None:
        if isinstance(exc, Terminated):
            return 128 + signal.SIGTERM
        exc = exc.__cause__ or exc.__context__
    return 128 + signal.SIGINT


def interrupted_message(code: int) -> str:
    return "error: interrupted (SIGTERM)" if code == 143 else "error: interrupted"


def on_sigterm_raise() -> None:
    """SIGTERM raises Terminated from now on: only where no one chose otherwise, and only
    where Python allows it (the main thread)."""
    main = threading.current_thread() is threading.main_thread()
    if main and signal.getsignal(signal.SIGTERM) is signal.SIG_DFL:
        signal.signal(signal.SIGTERM, _raise_terminated)
