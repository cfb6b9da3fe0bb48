"""Reading the files a user names: a regular file only, at most `limit` + 1 bytes
(`read_regular`), or opened for streaming (`open_regular`).

The matrix, a lock, a requirements file or a CA bundle may be named by anyone, so a device
(/dev/zero), a FIFO or a directory given in their place is refused before anything is read.
The file is opened without blocking (a FIFO with no writer would otherwise block the open
itself) and its type is checked on the open descriptor, so a file swapped for a FIFO after
some earlier check cannot hang gpuenv either.
"""

from __future__ import annotations

import errno
import io
import os
import stat
from pathlib import Path


def open_regular(path: Path | str) -> io.BufferedReader:
    """A regular file opened for reading, for what is streamed rather than read whole (an
    image archive). Not a regular file: IsADirectoryError; missing: FileNotFoundError; other
    failures: OSError, as open() raises them."""
    fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            raise IsADirectoryError(errno.EISDIR, "not a regular file", str(path))
        os.set_blocking(fd, True)  # a regular file's reads never wait anyway; be explicit
        return os.fdopen(fd, "rb", closefd=True)
    except BaseException:
        os.close(fd)
        raise


def read_regular(path: Path | str, limit: int) -> bytes:
    """At most limit + 1 bytes of a regular file (the caller tells "too large" from the
    length). Errors as open_regular's."""
    with open_regular(path) as f:
        return f.read(limit + 1)
