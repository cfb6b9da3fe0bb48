"""The process's umask, read without changing it.

`os.umask(0)` then restoring it is the only portable way to read the mask, but it is
process-global: a thread creating a file between the two calls gets mode 0666/0777.
Linux (4.7 and later) states the mask in /proc/self/status, which only reading needs."""

from __future__ import annotations

from pathlib import Path

DEFAULT = 0o022  # where /proc does not say (not Linux): the usual mask


def current_umask() -> int:
    try:
        for line in Path("/proc/self/status").read_text(encoding="ascii").splitlines():
            if line.startswith("Umask:"):
                return int(line.split(":", 1)[1].strip(), 8)
    except (OSError, ValueError):
        pass
    return DEFAULT
