"""Every verb and the module of gpuenv/cli/ that registers it, imported (and its Click command
built) only when that verb is asked for: Click's lazy-loading group
(https://click.palletsprojects.com/en/stable/complex/#lazily-loading-subcommands), whose
get_command and list_commands are common.Group's. `gpuenv run` imports and builds `run`
alone; `gpuenv --help` lists every verb, so it loads them all (issue 48: the other 21 verbs'
modules and Typer's build of their parameters were some 40 ms of every run)."""

from __future__ import annotations

import importlib
from typing import Any

# verb: its module under gpuenv/cli/, in the order --help lists them (the groups last, where
# Typer put them when every module registered on one app).
VERBS = {
    "init": "init", "matrix": "matrix", "render": "matrix", "base": "build", "build": "build",
    "run": "run", "notebook": "notebook", "devcontainer": "notebook", "bench": "bench",
    "monitor": "monitor", "validate": "validate", "lock": "lock", "diff": "diff",
    "push": "push", "sbom": "attest", "verify": "attest", "doctor": "doctor",
    "catalog": "catalog", "prune": "prune", "kube": "kube", "slurm": "slurm", "cache": "cache",
}  # fmt: skip


def load(verb: str) -> Any:
    """The verb's Click command (a group for kube, slurm, cache), built by Typer from what its
    module registers; None for a name that is no verb."""
    import typer

    if verb not in VERBS:
        return None
    module = importlib.import_module(f"gpuenv.cli.{VERBS[verb]}")
    # What the module registers, on an app of its own built as the root app builds its verbs
    # (plain Click help: rich_markup_mode=None, as common.app).
    verbs = typer.Typer(rich_markup_mode=None, add_completion=False)
    module.register(verbs)
    return typer.main.get_group(verbs).commands[verb]
