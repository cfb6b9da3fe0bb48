"""requirements-dev.txt, the lock scripts/setup.sh installs gpuenv's development environment
from, agrees with pyproject.toml: every dependency (and every one of the test extra) is
pinned there, at a version its specifier allows, and every pin carries hashes (pip's
--require-hashes refuses the file otherwise). A dependency added or raised without
re-locking fails here, before CI installs a stale environment."""

from __future__ import annotations

import re
import tomllib
from pathlib import Path

from packaging.requirements import Requirement
from packaging.utils import canonicalize_name
from packaging.version import Version

REPO = Path(__file__).resolve().parents[2]


def pins(text: str) -> dict[str, list[tuple[Version, str]]]:
    """name -> [(version, the pin's hash lines)]: a name pinned twice has markers (per Python)."""
    found: dict[str, list[tuple[Version, str]]] = {}
    for entry in re.split(r"\n(?=[A-Za-z0-9])", text):
        m = re.match(r"([A-Za-z0-9._-]+)==([^\s;\\]+)", entry)
        if m:
            found.setdefault(canonicalize_name(m[1]), []).append((Version(m[2]), entry))
    return found


def declared() -> list[Requirement]:
    project = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]
    return [
        Requirement(r) for r in project["dependencies"] + project["optional-dependencies"]["test"]
    ]


def problems(lock: str, requirements: list[Requirement]) -> list[str]:
    locked = pins(lock)
    out = []
    for req in requirements:
        got = locked.get(canonicalize_name(req.name))
        if not got:
            out.append(f"{req.name}: not in the lock")
            continue
        for version, entry in got:
            if not req.specifier.contains(version, prereleases=True):
                out.append(f"{req.name}=={version}: outside {req.specifier}")
            if "--hash=sha256:" not in entry:
                out.append(f"{req.name}=={version}: no hash")
    return out


def test_the_lock_pins_every_declared_dependency_within_its_range():
    lock = (REPO / "requirements-dev.txt").read_text()
    assert problems(lock, declared()) == []


def test_a_stale_lock_is_caught():
    lock = "typer==0.12.0 \\\n    --hash=sha256:" + "0" * 64 + "\nrich==13.0.0\n"
    found = problems(lock, [Requirement("typer>=0.26"), Requirement("rich>=13"),
                            Requirement("mypy>=1.11")])  # fmt: skip
    assert found == [
        "typer==0.12.0: outside >=0.26",
        "rich==13.0.0: no hash",
        "mypy: not in the lock",
    ]
