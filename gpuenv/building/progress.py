"""Console output for builds: live progress on a terminal, plain lines in CI logs."""

from __future__ import annotations

import re
import sys
import threading
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from gpuenv.building.activity import Activity
from gpuenv.building.results import CellResult, Reporter
from gpuenv.matrix.cell import Cell

if TYPE_CHECKING:
    from rich.table import Table

# Rich is imported only for a terminal (live status lines); a build whose output goes to a
# log or a pipe prints plain lines and never imports it.

# Without a terminal, a cell's progress reports (fetching wheels: 2 of 6, ...) are printed at
# most this often (seconds); a phase's last word (fetched 6 wheels, 127.0 MiB in 4.4 s) is
# printed when it comes. A CI log gets the facts without a line per event.
PROGRESS_EVERY = 5.0
# On a terminal, a cell's line that has not changed for this long (seconds) says for how long:
# uv reports a wheel when it is done, and one CUDA wheel can take minutes on a laptop's link.
WAITED_SHOWN = 3.0


class ConsoleReporter(Reporter):
    """Per-cell status lines, in words and numbers (gpuenv/building/activity.py): on a TTY
    one line per cell updates in place (rich Live); elsewhere each Dockerfile step is
    printed once and what happens inside it one line per fact, PROGRESS_EVERY at most for
    progress, so CI logs stay readable. `clock` and `terminal`: tests give their own."""

    def __init__(
        self, *, clock: Callable[[], float] = time.monotonic, terminal: bool | None = None
    ) -> None:
        self.console: Any = None
        self.lock = threading.Lock()
        self.current: dict[str, str] = {}
        self.since: dict[str, float] = {}  # cell -> when its live line last changed
        self.activity: dict[str, Activity] = {}
        self.printed: dict[str, float] = {}  # cell -> when its last progress line was
        self.clock = clock
        self.live: Any = None
        if sys.stderr.isatty() if terminal is None else terminal:
            from rich.console import Console
            from rich.live import Live

            self.console = Console(stderr=True, highlight=False, soft_wrap=True)
            # get_renderable: redrawn 4 times a second, so a line that waits on one long
            # download still counts its seconds.
            self.live = Live(console=self.console, transient=True, get_renderable=self._render)
            self.live.start()

    def _print(self, text: str, markup: str | None = None) -> None:
        """`markup`: the same line with rich markup, for the terminal."""
        if self.console is not None:
            self.console.print(markup or text, markup=markup is not None)
        else:
            print(text, file=sys.stderr, flush=True)

    def _render(self) -> Table:
        from rich.table import Table
        from rich.text import Text

        table = Table.grid(padding=(0, 1))
        now = self.clock()
        for name, line in list(self.current.items()):  # a copy: the builds' threads write it
            waited = now - self.since.get(name, now)
            line = f"{line} ({waited:.0f} s)" if waited >= WAITED_SHOWN else line
            table.add_row(Text(f"⠿ {name}", style="bold"), Text(line[:110], style="dim"))
        return table

    def info(self, message: str) -> None:
        self._print(f"gpuenv: {message}")

    def started(self, cell: Cell) -> None:
        with self.lock:
            self.current[cell.name] = "starting"
            self.since[cell.name] = self.clock()
            self.activity[cell.name] = Activity()
            if self.live:
                self.live.update(self._render())
            else:
                self._print(f"==> {cell.name}: building {cell.image}")

    def log(self, cell: Cell, line: str) -> None:
        line = line.strip()
        if not line:
            return
        with self.lock:
            fact = self.activity.setdefault(cell.name, Activity())(line)
            if self.live:
                if fact:  # BuildKit's hashes and timings say nothing to the user
                    self.current[cell.name] = fact.live
                    self.since[cell.name] = self.clock()
                    self.live.update(self._render())
            elif line.startswith("Step ") or re.match(r"#\d+ \[[^\]]*\d+/\d+\]", line):
                # A step starting: the classic builder's "Step 2/5 :", BuildKit's "#6 [2/5] RUN".
                self._print(f"    {cell.name}: {line[:160]}")
            elif fact and (
                fact.ended
                or self.clock() - self.printed.get(cell.name, -PROGRESS_EVERY) >= PROGRESS_EVERY
            ):
                self.printed[cell.name] = self.clock()
                self._print(f"    {cell.name}: {fact.text}")

    def finished(self, result: CellResult) -> None:
        with self.lock:
            self.current.pop(result.cell.name, None)
            self.activity.pop(result.cell.name, None)
            self.since.pop(result.cell.name, None)
            if self.live:
                self.live.update(self._render())
            if result.status == "failed":
                name, error = result.cell.name, str(result.error)
                self._print(f"✗ {name} failed: {error}", f"[red]✗ {name} failed[/red]: {error}")
                if result.step:
                    self._print(f"  failing step: {result.step}")
                for line in result.log_tail:
                    self._print(f"  | {line}")
            elif result.status == "built":
                self._print(f"✓ {result.cell.name} built in {result.seconds:.1f} s")

    def close(self) -> None:
        if self.live:
            self.live.stop()
