"""A no-op `gpuenv build`, remembered: while nothing the plan read has changed since it
found every selected cell up to date, the same answer again without planning.

A plan (gpuenv/plan.py) is a function of what it reads, and each of those is checked here
without loading it:

- the matrix, its lock, gpuenv's code and templates (fingerprint.key, the snapshot's own
  key) and the requirements files the matrix read (their bytes and where they lead);
- the selection (the patterns) and the working directory (relative paths in the
  environment resolve from it);
- the CA bundle it found ($GPUENV_CA_BUNDLE, $PIP_CERT, the file's identity) and how long
  that bundle's check holds (its certificates' expiry, gpuenv/ca.py);
- the engine's images: each cell's tag and each base, by image ID. An ID is the digest of
  the image's config, so the same ID means the same labels (the spec hash the plan
  compares), whichever engine answers.

`remember` records all of that with the printed answer (the table, coloured or not, and
the JSON) after the plan said "up to date"; `recall` recomputes every input and asks the
engine for each recorded reference over its socket (gpuenv/wire.py), about 3 ms in all. Any
difference, an engine that is not a local socket, or an unreadable record, and `recall`
says None: the plan runs as before and remembers again. The verdict never says more than
the plan said; it is only ever its last answer, to the same question.
"""

from __future__ import annotations

import hashlib
import json
import os
import time
from pathlib import Path
from typing import Any

from gpuenv import cache
from gpuenv.fingerprint import dependency_state, file_signature, key
from gpuenv.project import lock_path, matrix_file

FORMAT = 1
PREFIX = "noop-"  # the records' names (gpuenv cache prune)
_CA_ENV = ("GPUENV_CA_BUNDLE", "PIP_CERT")


def entry_name(matrix: Path, patterns: list[str]) -> str:
    """One record per matrix (by absolute path) and selection."""
    what = json.dumps([str(matrix.resolve()), patterns])
    return f"{PREFIX}{hashlib.sha256(what.encode()).hexdigest()[:24]}.json"


def _question(matrix: Path, patterns: list[str], bundle: str | None) -> dict[str, Any]:
    """Everything a recorded verdict must have been asked with, as it is now (bar the
    requirements files and the engine, which the record lists)."""
    return {
        "format": FORMAT,
        "inputs": key(matrix, lock_path(matrix)),
        "patterns": patterns,
        "cwd": os.getcwd(),
        "env": {name: os.environ.get(name) for name in _CA_ENV},
        "bundle": [bundle, file_signature(bundle)] if bundle else None,
    }


def recall(file: Path | None, patterns: list[str], *, as_json: bool, colour: bool) -> str | None:
    """The remembered answer when every input is as it was; None otherwise."""
    from gpuenv import wire

    matrix = matrix_file(file)
    record = cache.read_record(entry_name(matrix, patterns))
    try:
        if record.get("question") != _question(matrix, patterns, record["bundle"]):
            return None
        if record["bundle"] and not time.time() <= record["bundle_until"]:
            return None
        if any(dependency_state(Path(p)) != s for p, s in record["depends"].items()):
            return None
        socket_path = wire.local_socket()
        if socket_path is None or not record["images"]:
            return None  # a remote engine (the SDK's business), or nothing to ask it: plan
        engine = wire.Socket(socket_path)
        for ref, image_id in record["images"].items():
            answer = engine.json("GET", f"/images/{wire.quote_segment(ref)}/json", timeout=10)
            if answer.get("Id") != image_id:
                return None
        text = record["answer"]["json" if as_json else "colour" if colour else "table"]
    except (KeyError, TypeError, AttributeError, ValueError, OSError, wire.ApiError):
        return None  # no record, a corrupt one, a missing image, no engine: plan it
    return text if isinstance(text, str) else None


def remember(
    file: Path | None,
    patterns: list[str],
    *,
    inputs_key: str,
    depends: dict[str, str],
    bundle: Path | None,
    images: dict[str, str],
    answer: dict[str, str],
) -> bool:
    """Record the plan's "up to date": `inputs_key` and `depends` are the snapshot's the
    plan was made from, `images` the references it inspected and their IDs, `answer`
    the printed texts ("table", "colour", "json"). False when not recorded."""
    from gpuenv.ca import known_good_until

    matrix = matrix_file(file)
    where = str(bundle) if bundle else None
    question = _question(matrix, patterns, where)
    if question["inputs"] != inputs_key:
        return False  # the matrix, lock or code changed while planning: not this verdict
    until = known_good_until(bundle) if bundle else None
    if bundle and until is None:
        return False
    record = {
        "question": question,
        "bundle": where,
        "bundle_until": until,
        "depends": depends,
        "images": images,
        "answer": answer,
    }
    return cache.write_record(entry_name(matrix, patterns), record)
