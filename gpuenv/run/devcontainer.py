"""`gpuenv devcontainer`: `.devcontainer/devcontainer.json` for a cell, for VS Code and other
dev container clients (containers.dev), and nothing else.

It names the cell's image as built (the cell is built first when it is missing), its
non-root user (`gpuenv`, uid 1000, which clients map to the local user's uid on Linux),
the working directory bound as the workspace, /dev/shm as `gpuenv run` sizes it, and, for a
GPU cell, GPUs as optional (`hostRequirements.gpu: "optional"`: clients pass every GPU when
the host has them, and start without them where it has none). A CPU cell asks for none:
its framework cannot use them. An existing file is never overwritten.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

from gpuenv.matrix import contract
from gpuenv.matrix.errors import GpuenvError
from gpuenv.run import local, target

WORKSPACE = "/workspace"
SCHEMA = "https://raw.githubusercontent.com/devcontainers/spec/main/schemas/devContainer.base.schema.json"


def document(cell_name: str, image: str, is_gpu: bool) -> dict[str, Any]:
    doc: dict[str, Any] = {
        "$schema": SCHEMA,
        "name": f"gpuenv {cell_name}",
        "image": image,
        "containerUser": contract.USER,
        "remoteUser": contract.USER,
        "updateRemoteUserUID": True,
        "workspaceMount": f"source=${{localWorkspaceFolder}},target={WORKSPACE},type=bind",
        "workspaceFolder": WORKSPACE,
        "runArgs": [f"--shm-size={local.SHM_SIZE}"],
    }
    if is_gpu:
        doc["hostRequirements"] = {"gpu": "optional"}
    return doc


def write(pattern: str | None, file: Path | None, gpu: bool = False,
          cwd: Path | None = None) -> Path:  # fmt: skip
    """Write the cell's devcontainer.json under `cwd`; its path. Refuses to overwrite."""
    from gpuenv.engine import client
    from gpuenv.project.project import looks_like_image, open_project

    cwd = cwd or Path.cwd()
    path = cwd / ".devcontainer" / "devcontainer.json"
    if path.exists() or path.is_symlink():
        raise GpuenvError(f"{path} exists; gpuenv devcontainer never overwrites it (remove it "
                          "first to write a new one)")  # fmt: skip
    if pattern is not None and looks_like_image(pattern):
        raise GpuenvError(f"{pattern}: gpuenv devcontainer takes a cell name (gpuenv matrix "
                          "lists them), not an image")  # fmt: skip
    project = open_project(file, cached=True)
    if pattern is not None:
        project.one_cell(pattern, "CELL")  # its errors name the argument, before the engine
    with client.connect() as engine:
        chosen = target.target_for(engine, pattern, gpu, project)
    assert chosen.cell is not None
    text = json.dumps(document(chosen.cell.name, chosen.image, chosen.cell.is_gpu), indent=2)
    path.parent.mkdir(exist_ok=True)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o644)
    with os.fdopen(fd, "w") as fh:
        fh.write(text + "\n")
    return path
