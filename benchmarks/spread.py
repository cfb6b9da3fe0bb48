"""What every benchmark here reports with a number: its runs beside the median, each ratio
with the ratio of each round, and the machine's load average while it ran (a 2-core machine
shared with other work moves a cold build by 30%: a median without its spread is no claim).

    from spread import Load, ratio, runs
    load = Load()                     # sampled now; load.sample() after each round
    print(runs([22.0, 23.1, 24.5]))   # 23.1 s [22.0, 23.1, 24.5]
    print(ratio(mine, theirs))        # 1.05x [0.98, 1.05, 1.12]
    print(load)                       # load average 0.4-2.3 (1 min, 4 samples)
"""

from __future__ import annotations

import os
import statistics
import sys
from collections.abc import Sequence

ROUNDS = 3  # the fewest interleaved rounds whose median and spread mean something


def runs(values: Sequence[float], unit: str = " s", digits: int = 1) -> str:
    """The median, then every run in the order they ran."""
    listed = ", ".join(f"{v:.{digits}f}" for v in values)
    return f"{statistics.median(values):.{digits}f}{unit} [{listed}]"


def ratio(mine: Sequence[float], theirs: Sequence[float], digits: int = 2) -> str:
    """median(mine) / median(theirs), then the ratio of each round (mine[i] / theirs[i]):
    the runs were interleaved, so a round's two runs saw the same machine."""
    whole = statistics.median(mine) / statistics.median(theirs)
    rounds = ", ".join(f"{m / t:.{digits}f}" for m, t in zip(mine, theirs, strict=True))
    return f"{whole:.{digits}f}x [{rounds}]"


def check_rounds(repeat: int) -> None:
    """Fewer than ROUNDS rounds is allowed (a quick look), but said."""
    if repeat < ROUNDS:
        print(f"note: {repeat} round(s): fewer than {ROUNDS}, the spread means little",
              file=sys.stderr)  # fmt: skip


class Load:
    """The 1-minute load average, sampled when made and at each `sample()`."""

    def __init__(self) -> None:
        self.samples: list[float] = []
        self.sample()

    def sample(self) -> float:
        value = os.getloadavg()[0]
        self.samples.append(value)
        return value

    def __str__(self) -> str:
        lo, hi = min(self.samples), max(self.samples)
        cores = os.cpu_count() or 1
        return (f"load average {lo:.1f}-{hi:.1f} (1 min, {len(self.samples)} samples, "
                f"{cores} cores)")  # fmt: skip
