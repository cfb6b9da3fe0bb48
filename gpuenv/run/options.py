"""A run's own options (the command, -e, -v, -p, --workdir), checked before anything else
happens; the container spec (gpuenv/run/local.py) and the clusters' front-ends read them."""

from __future__ import annotations

import os
import re
from pathlib import Path
from typing import Any

from gpuenv.run.console import run_error


def command_for(args: list[str], cwd: Path) -> list[str]:
    """A .py script runs with the image's Python; anything else runs as a command."""
    if not args:
        raise run_error("nothing to run: give a script (train.py) or a command", 125)
    first = args[0]
    if first.startswith("-"):
        raise run_error(f"no such option: {first} (put the command after --, or fix the option)")
    if first.endswith(".py"):
        if not (cwd / first).is_file():
            raise run_error(
                f"{first}: no such file in {cwd} (gpuenv mounts the current directory; "
                "run from the directory that holds the script)",
                127,
            )
        return ["python", *args]
    return list(args)


def check_options(
    env: list[str], volumes: list[str], ports: list[str], workdir: str | None, cwd: Path
) -> None:
    """`run`'s options, parsed once for their errors alone, before anything else happens."""
    parse_env(env, read=False)
    for item in volumes:
        parse_volume(item, cwd)
    parse_ports(ports)
    if workdir is not None and (not workdir.startswith("/") or _BAD_PATH.search(workdir)):
        raise run_error(f"--workdir {workdir!r}: expected an absolute path in the container", 125)


_BAD_PATH = re.compile(r"[\x00-\x1f]")
_ENV_NAME = re.compile(r"[^\s=\x00]+")
_VOLUME_MODES = {"ro", "rw", "z", "Z", "ro,z", "ro,Z", "rw,z", "rw,Z"}


def parse_env(items: list[str], read: bool = True) -> dict[str, str]:
    """-e KEY=VALUE or -e KEY (the value from this environment). Errors name the key only:
    a value may be a secret."""
    env: dict[str, str] = {}
    for item in items:
        key, sep, value = item.partition("=")
        if not _ENV_NAME.fullmatch(key) or "\n" in item:
            shown = repr(key[:80] + ("=..." if sep else ""))
            raise run_error(f"-e {shown}: expected KEY=VALUE or KEY (a name without spaces)", 125)
        if not read:
            continue
        if not sep:
            if key not in os.environ:
                continue  # as docker run: -e KEY with KEY unset passes nothing
            value = os.environ[key]
        env[key] = value
    return env


def parse_volume(item: str, cwd: Path) -> str:
    parts = item.split(":")
    if (
        len(parts) not in (2, 3)
        or not parts[0]
        or not parts[1].startswith("/")
        or (len(parts) == 3 and parts[2] not in _VOLUME_MODES)
        or _BAD_PATH.search(item)
    ):
        raise run_error(f"-v {item!r}: expected SRC:DST[:ro|rw] with an absolute DST", 125)
    src = parts[0]
    if src.startswith((".", "/", "~")):
        src = str((cwd / Path(src).expanduser()).resolve())
    return ":".join([src, *parts[1:]])


def parse_ports(items: list[str]) -> dict[str, Any]:
    ports: dict[str, Any] = {}
    for item in items:
        host, _, container = item.rpartition(":")
        cport, _, proto = container.partition("/")
        ip, _, hport = host.rpartition(":")
        if (
            not _port(cport)
            or (host and not ((hport == "" and ip) or _port(hport)))
            or proto not in ("", "tcp", "udp", "sctp")
            or (ip and not _ip(ip.strip("[]")))
        ):
            raise run_error(f"-p {item!r}: expected [IP:]HOST_PORT:CONTAINER_PORT[/tcp|udp]", 125)
        key = container if "/" in container else f"{container}/tcp"
        if ip:
            ports[key] = (ip, int(hport)) if hport else (ip,)
        else:
            ports[key] = int(hport) if hport else None
    return ports


def _port(text: str) -> bool:
    return text.isdigit() and 0 < int(text) < 65536


def _ip(text: str) -> bool:
    import ipaddress

    try:
        ipaddress.ip_address(text)
    except ValueError:
        return False
    return True
