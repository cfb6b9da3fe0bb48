"""A login node reached over ssh (`gpuenv slurm run --login [USER@]HOST[:PORT]`, `gpuenv
prune --login`, or $GPUENV_SLURM_LOGIN): the user's own `ssh` (first on PATH, so their
config, keys, agent and known hosts apply), run as the `ssh://` engine runs it
(gpuenv/engine/transport.py): no TTY (`-T`), never a prompt (`-o BatchMode=yes`), a bounded
connect, and `--` before the host. What runs there is one argv, quoted here (`shlex.join`)
into the one string ssh hands to the login shell, which must read POSIX quoting (sh, bash,
zsh, ksh; not csh).
"""

from __future__ import annotations

import os
import re
import shlex
import subprocess
import time
from dataclasses import dataclass
from typing import IO

from gpuenv.run.slurm import SlurmError

LOGIN_ENV = "GPUENV_SLURM_LOGIN"
TIMEOUT = 120  # seconds for one command there that moves no bulk data
RETRIES = 3  # for a connection dropped before the login
_DROPPED = re.compile(
    r"kex_exchange_identification|Connection reset by|Connection closed by .* port \d+$|"
    r"Connection refused|Connection timed out",
    re.MULTILINE,
)

_USER = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_.-]*")
_HOST = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_.-]*")


@dataclass(frozen=True)
class Login:
    """[USER@]HOST[:PORT], HOST a name ssh's config may know (an alias) or an address."""

    host: str
    user: str | None = None
    port: int | None = None

    @classmethod
    def parse(cls, text: str, where: str = "--login") -> Login:
        user, at, rest = text.partition("@")
        if not at:
            user, rest = "", text
        host, colon, port = rest.partition(":")
        if (
            (at and not _USER.fullmatch(user))
            or not _HOST.fullmatch(host)
            or (colon and not (port.isdigit() and 0 < int(port) < 65536))
        ):
            raise SlurmError(
                f"{where} {text[:200]!r}: expected [USER@]HOST[:PORT] (a host name, an "
                "address or an alias of your ssh config; no spaces, options or paths)"
            )
        return cls(host, user or None, int(port) if colon else None)

    @property
    def who(self) -> str:
        return f"{self.user}@{self.host}" if self.user else self.host

    def argv(self, command: list[str]) -> list[str]:
        """ssh's argv running `command` there, each word quoted for the login shell."""
        user = ["-l", self.user] if self.user else []
        port = ["-p", str(self.port)] if self.port else []
        return ["ssh", "-T", "-o", "BatchMode=yes", "-o", "ConnectTimeout=30", *user, *port,
                "--", self.host, shlex.join(command)]  # fmt: skip

    def failure(self, code: int, stderr: str, what: str) -> SlurmError:
        """What a failed `ssh HOST COMMAND` means, as one line with the fix."""
        said = " ".join(line.strip() for line in stderr.splitlines() if line.strip())[-300:]
        if code != 255:
            return SlurmError(f"{what} on {self.host} failed ({said or f'exit {code}'})")
        if "Host key verification failed" in stderr or "REMOTE HOST IDENTIFICATION" in stderr:
            fix = (f"the host key of {self.host} is not known or has changed ({said}); "
                   f"check it and accept it once with `ssh {self.who}` (known_hosts)")  # fmt: skip
        elif "Permission denied" in stderr or "Too many authentication failures" in stderr:
            fix = (f"{self.host} refused the login as {self.user or 'your user'} ({said}); load "
                   "the key into your agent (ssh-add) or name it in ~/.ssh/config "
                   f"(IdentityFile), and check that `ssh {self.who}` logs in")  # fmt: skip
        else:
            fix = (f"ssh to {self.who} failed ({said or 'exit 255'}); check that "
                   f"`ssh {self.who}` logs in")  # fmt: skip
        return SlurmError(f"--login {self.who}: {fix}")


def login_for(option: str | None) -> Login | None:
    """--login, else $GPUENV_SLURM_LOGIN; None: Slurm's commands are on this machine."""
    text = option or os.environ.get(LOGIN_ENV, "")
    if not text:
        return None
    return Login.parse(text, "--login" if option else f"${LOGIN_ENV}")


def run(
    login: Login,
    command: list[str],
    what: str,
    *,
    stdin: bytes | IO[bytes] | None = None,
    timeout: float | None = TIMEOUT,
    check: bool = True,
) -> subprocess.CompletedProcess[bytes]:
    """`command` on the login node; SlurmError (one line) when ssh cannot get there or,
    with `check`, when the command fails."""
    data = stdin if isinstance(stdin, bytes) else None
    source = None if isinstance(stdin, bytes) else stdin
    for attempt in range(RETRIES + 1):
        try:
            proc = subprocess.run(
                login.argv(command), input=data, stdin=source if data is None else None,
                capture_output=True, timeout=timeout, check=False,
            )  # fmt: skip
        except subprocess.TimeoutExpired:
            raise SlurmError(
                f"{what} on {login.host} did not answer within {timeout:.0f} s"
            ) from None
        except FileNotFoundError:
            raise SlurmError(
                "--login needs the ssh client, and there is no `ssh` on PATH; install "
                "OpenSSH's client (Debian, Ubuntu: openssh-client)"
            ) from None
        # A connection dropped before the login (an sshd throttling unauthenticated
        # connections, MaxStartups; a busy login node) ran nothing there: asked again, unless
        # what it sends cannot be read twice.
        if not (proc.returncode == 255 and source is None and attempt < RETRIES
                and _DROPPED.search(proc.stderr.decode(errors="replace"))):  # fmt: skip
            break
        time.sleep(1 + attempt)
    if proc.returncode == 255 or (check and proc.returncode != 0):
        raise login.failure(proc.returncode, proc.stderr.decode(errors="replace"), what)
    return proc


__all__ = ["LOGIN_ENV", "Login", "login_for", "run"]
