"""Console output for builds: live progress on a terminal, plain lines in CI logs."""

from __future__ import annotations

import sys
import threading

from rich.console import Console
from rich.live import Live
from rich.table import Table
from rich.text import Text

from gpuenv.build import CellResult, Reporter, human_size
from gpuenv.cell import Cell


class ConsoleReporter(Reporter):
    """Per-cell status lines. On a TTY they update in place (rich Live); elsewhere each
    Dockerfile step is printed once, so CI logs stay readable."""

    def __init__(self) -> None:
        self.console = Console(stderr=True, highlight=False, soft_wrap=True)
        self.lock = threading.Lock()
        self.current: dict[str, str] = {}
        self.live: Live | None = None
        if self.console.is_terminal:
            self.live = Live(self._render(), console=self.console, transient=True)
            self.live.start()

    def _render(self) -> Table:
        table = Table.grid(padding=(0, 1))
        for name, line in self.current.items():
            table.add_row(Text(f"⠿ {name}", style="bold"), Text(line[:100], style="dim"))
        return table

    def info(self, message: str) -> None:
        self.console.print(f"gpuenv: {message}")

    def started(self, cell: Cell) -> None:
        with self.lock:
            self.current[cell.name] = "starting"
            if self.live:
                self.live.update(self._render())
            else:
                self.console.print(f"==> {cell.name}: building {cell.image}")

    def log(self, cell: Cell, line: str) -> None:
        line = line.strip()
        if not line:
            return
        with self.lock:
            self.current[cell.name] = line
            if self.live:
                self.live.update(self._render())
            elif line.startswith("Step "):
                self.console.print(f"    {cell.name}: {line[:160]}", markup=False)

    def finished(self, result: CellResult) -> None:
        with self.lock:
            self.current.pop(result.cell.name, None)
            if self.live:
                self.live.update(self._render())
            if result.status == "failed":
                self.console.print(f"[red]✗ {result.cell.name} failed[/red]: {result.error}")
                if result.step:
                    self.console.print(f"  failing step: {result.step}", markup=False)
                for line in result.log_tail:
                    self.console.print(f"  | {line}", markup=False)
            elif result.status == "built":
                self.console.print(f"✓ {result.cell.name} built in {result.seconds:.1f} s")

    def close(self) -> None:
        if self.live:
            self.live.stop()


def summary(results: list[CellResult]) -> None:
    table = Table(title=None, box=None, pad_edge=False)
    for column in ("CELL", "IMAGE", "SIZE", "TIME", "STATUS"):
        table.add_column(column, justify="right" if column in ("SIZE", "TIME") else "left")
    styles = {"built": "green", "cached": "cyan", "failed": "red", "skipped": "yellow"}
    for r in results:
        table.add_row(
            r.cell.name, r.cell.image, human_size(r.size), f"{r.seconds:.1f} s",
            Text(r.status, style=styles.get(r.status, "")),
        )  # fmt: skip
    Console(highlight=False, width=max(120, Console().width)).print(table)
    sys.stdout.flush()
