"""gpuenv's recipe: its version and a digest of what decides the bytes of the images it builds.

The same matrix.lock gives other images under another gpuenv when its templates or build
steps differ (an upgrade once changed every image ID while `gpuenv lock --check` said the
lock matched). So matrix.lock records the recipe that wrote it, each image carries the one
that built it (the io.gpuenv.recipe label, and so its provenance), and a difference is said
in one line: before a build, by `gpuenv lock --check`, by `gpuenv verify --rebuild`.

The digest is over file contents and names relative to the package, sorted: the same
whatever the checkout's path, mtimes or umask, and the same for a wheel (which carries
images/ inside the package) and a checkout. gpuenv/data/recipes.yaml records the digest of
each version; a unit test fails when this gpuenv's is not the one recorded for its version
(`python -m gpuenv.building.recipe --record` writes it, after a version bump).
"""

from __future__ import annotations

import hashlib
import re
import sys
from functools import cache
from pathlib import Path
from typing import TYPE_CHECKING

import gpuenv
from gpuenv.project.fingerprint import PACKAGE, templates_dir
from gpuenv.project.lockfile import Recipe, write_atomically

if TYPE_CHECKING:
    from gpuenv.project.lockfile import Lock

# The modules whose code or constants reach an image, besides the templates: what a
# template is given (the install commands, uv's version, PATH: render), which install step
# each distribution goes to and the bytecode step (layers), the labels and the in-image
# layout (contract), and the normalisation that decides a --reproducible image's bytes
# (reproducible). Bases are not here: the lock pins each base's identity itself.
MODULES = (
    "gpuenv/building/render.py",
    "gpuenv/building/layers.py",
    "gpuenv/building/reproducible.py",
    "gpuenv/matrix/contract.py",
)
TABLE = PACKAGE / "data" / "recipes.yaml"
# Recipes were first recorded by this version: a lock or image without one is older.
FIRST = "0.2.0"


def recipe_files(templates: Path | None = None, package: Path = PACKAGE) -> dict[str, Path]:
    """What the digest covers: name (as in a checkout) -> file."""
    root = templates_dir() if templates is None else templates
    files = {
        f"images/{p.relative_to(root).as_posix()}": p
        for p in root.rglob("*")
        # Editor and OS droppings (.swp, .DS_Store) and bytecode are no part of a template.
        if p.is_file() and not any(part.startswith(".") or part == "__pycache__"
                                   for part in p.relative_to(root).parts)
    }  # fmt: skip
    for name in MODULES:
        files[name] = package.parent / name
    return files


def digest_of(files: dict[str, Path]) -> str:
    h = hashlib.sha256()
    for name in sorted(files):
        data = files[name].read_bytes()
        h.update(f"{name}\0{len(data)}\0".encode())
        h.update(data)
    return f"sha256:{h.hexdigest()}"


@cache
def current() -> Recipe:
    """This gpuenv's recipe, computed once per process (~60 kB read)."""
    return Recipe(gpuenv.__version__, digest_of(recipe_files()))


def label(recipe: Recipe) -> str:
    """The io.gpuenv.recipe label's value (and the provenance's): `VERSION sha256:HEX`."""
    return f"{recipe.gpuenv} {recipe.digest}"


def from_label(text: str | None) -> Recipe | None:
    version, _, digest = (text or "").strip().partition(" ")
    if not version or not re.fullmatch(r"sha256:[0-9a-f]{64}", digest):
        return None
    return Recipe(version, digest)


def reproduce_with(then: Recipe, now: Recipe) -> str:
    """How to get the gpuenv that built something: the same version with another digest is
    a modified gpuenv (a checkout with edited templates), which no release reproduces."""
    if then.gpuenv != now.gpuenv:
        return f"pip install gpuenv=={then.gpuenv}"
    return f"the gpuenv {then.gpuenv} checkout it was built with (this one is modified)"


def lock_note(lock: Lock) -> str | None:
    """One line when the lock was written by another recipe than this gpuenv's, or by a
    gpuenv that recorded none; None when they agree."""
    now, name = current(), lock.path.name
    if lock.recipe is None:
        return f"{name} records no recipe (written before gpuenv {FIRST}); gpuenv lock adds it"
    if lock.recipe == now:
        return None
    return (
        f"{name} was written by {lock.recipe}; this is {now}: images will not match those "
        f"built then; {reproduce_with(lock.recipe, now)} rebuilds them, gpuenv lock records "
        "this recipe"
    )


# ------------------------------------------------------------------------- the table

_LINE = re.compile(r'^"?([^":\s]+)"?:\s*"?(sha256:[0-9a-f]{64})"?\s*$')


def recorded(table: Path = TABLE) -> dict[str, str]:
    """gpuenv/data/recipes.yaml: version -> digest, as released."""
    out = {}
    for line in table.read_text(encoding="utf-8").splitlines():
        m = _LINE.match(line)
        if m:
            out[m.group(1)] = m.group(2)
    return out


def record(table: Path = TABLE) -> str:
    """Write this gpuenv's digest for its version into the table (replacing that version's
    line, keeping every other line and comment); returns the line."""
    recipe = current()
    line = f'"{recipe.gpuenv}": {recipe.digest}'
    lines = table.read_text(encoding="utf-8").splitlines() if table.exists() else []
    kept = [x for x in lines if (m := _LINE.match(x)) is None or m.group(1) != recipe.gpuenv]
    at = next((i for i, x in enumerate(lines) if x not in kept), len(kept))
    kept.insert(at, line)
    write_atomically(table, "\n".join(kept) + "\n")
    return line


def main(argv: list[str]) -> int:
    """`python -m gpuenv.building.recipe [--record]`: print (or record) this gpuenv's recipe."""
    if argv not in ([], ["--record"]):
        print("usage: python -m gpuenv.building.recipe [--record]", file=sys.stderr)
        return 2
    if argv:
        print(f"{TABLE}: {record()}")
        return 0
    recipe = current()
    print(f"gpuenv {recipe.gpuenv} {recipe.digest}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
