"""What the output stream can show."""

from __future__ import annotations

import os
import sys


def colour_wanted() -> bool:
    """Colour stdout: it is a terminal and NO_COLOR (no-color.org) is unset or empty."""
    return sys.stdout.isatty() and not os.environ.get("NO_COLOR")
