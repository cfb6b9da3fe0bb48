"""Console output for builds: live progress on a terminal, plain lines in CI logs."""

from __future__ import annotations

import os
import sys
import threading
from typing import TYPE_CHECKING, Any

from gpuenv.build import CellResult, Reporter, human_size
from gpuenv.cell import Cell

if TYPE_CHECKING:
    from rich.table import Table

# Rich is imported only for a terminal (live status lines); a build whose output goes to a
# log or a pipe, and a no-op build's summary, print plain lines and never import it.
_COLOURS = {"built": "32", "cached": "36", "failed": "31", "skipped": "33"}


class ConsoleReporter(Reporter):
    """Per-cell status lines. On a TTY they update in place (rich Live); elsewhere each
    Dockerfile step is printed once, so CI logs stay readable."""

    def __init__(self) -> None:
        self.console: Any = None
        self.lock = threading.Lock()
        self.current: dict[str, str] = {}
        self.live: Any = None
        if sys.stderr.isatty():
            from rich.console import Console
            from rich.live import Live

            self.console = Console(stderr=True, highlight=False, soft_wrap=True)
            self.live = Live(self._render(), console=self.console, transient=True)
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
        for name, line in self.current.items():
            table.add_row(Text(f"⠿ {name}", style="bold"), Text(line[:100], style="dim"))
        return table

    def info(self, message: str) -> None:
        self._print(f"gpuenv: {message}")

    def started(self, cell: Cell) -> None:
        with self.lock:
            self.current[cell.name] = "starting"
            if self.live:
                self.live.update(self._render())
            else:
                self._print(f"==> {cell.name}: building {cell.image}")

    def log(self, cell: Cell, line: str) -> None:
        line = line.strip()
        if not line:
            return
        with self.lock:
            self.current[cell.name] = line
            if self.live:
                self.live.update(self._render())
            elif line.startswith("Step "):
                self._print(f"    {cell.name}: {line[:160]}")

    def finished(self, result: CellResult) -> None:
        with self.lock:
            self.current.pop(result.cell.name, None)
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


def summary(results: list[CellResult]) -> None:
    """The results as a table on stdout; the status coloured on a terminal (not NO_COLOR)."""
    rows = [("CELL", "IMAGE", "SIZE", "TIME", "STATUS")]
    rows += [
        (r.cell.name, r.cell.image, human_size(r.size), f"{r.seconds:.1f} s", r.status)
        for r in results
    ]
    widths = [max(len(row[i]) for row in rows) for i in range(5)]
    colour = sys.stdout.isatty() and not os.environ.get("NO_COLOR")
    for n, row in enumerate(rows):
        cells = [
            v.rjust(w) if i in (2, 3) else v.ljust(w)
            for i, (v, w) in enumerate(zip(row, widths, strict=True))
        ]
        if colour and n and row[4] in _COLOURS:
            cells[4] = f"\x1b[{_COLOURS[row[4]]}m{row[4]}\x1b[0m"
        print("  ".join(cells).rstrip())
    sys.stdout.flush()
