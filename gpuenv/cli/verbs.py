"""Every verb and the module of gpuenv/cli/ that registers it, imported (and its Click command
built) only when that verb is asked for: Click's lazy-loading group
(https://click.palletsprojects.com/en/stable/complex/#lazily-loading-subcommands), whose
get_command and list_commands are common._Group's. `gpuenv run` imports and builds `run`
alone; `gpuenv --help` lists every verb, so it loads them all (issue 48: the other 21 verbs'
modules and Typer's build of their parameters were some 40 ms of every run). Also how the
commands `gpuenv run` parses take their values without pydantic (PlainValues)."""

from __future__ import annotations

import importlib
from pathlib import Path
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


# The Typer release whose private coercion parts _PlainValues stands in for (pyproject.toml's
# floor; tests/unit/test_cli_verbs.py compares the two on it).
TESTED_TYPER = "0.29."


class _PlainValues:
    """A value as Typer's own coercion gives it, for the values that need none: an option not
    given (None, or () for a repeatable one), a str, strings (a list), a path (Typer's own
    checks, given the Path pydantic would have made of it). Anything else (an empty path, a
    value of another type) goes to Typer's coercion, built then.

    Typer builds a pydantic TypeAdapter for every parameter of the command it runs, given or
    not, which imports pydantic: 60-85 ms of CPU, the largest part of what `gpuenv run`
    costs over `docker run` after the Docker SDK (issue 48). tests/unit/test_cli_verbs.py
    holds these to Typer's results, parameter by parameter."""

    def __init__(self, multiple: bool, kind: Any) -> None:
        self.multiple, self.kind = multiple, kind

    def coerce(self, value: Any, param: Any, ctx: Any) -> Any:
        if value is None:
            return () if self.multiple else None  # as Typer's RuntimeParam.coerce
        if self.kind is str and isinstance(value, str):
            return value
        strings = isinstance(value, (list, tuple)) and all(isinstance(v, str) for v in value)
        if self.kind == list[str] and strings:
            return list(value)
        if self.kind is Path and isinstance(value, str) and value and "\0" not in value:
            from typer._param_types import coerce_cli_path

            info = param.type_descriptor.parameter_info
            return coerce_cli_path(Path(value), info, path_type=Path, param=param, ctx=ctx)
        param._runtime_param = None  # Typer's own, from here on
        return param.get_runtime_param().coerce(value, param=param, ctx=ctx)


def plain_values(params: list[Any]) -> None:
    """These str, list[str], bool and Path parameters coerced by _PlainValues, where Typer's
    parameters are as expected (a runtime coercion built on first use); else Typer's own,
    unchanged. For the commands `gpuenv run` parses: the root's and run's (PlainValues).
    Only on the Typer minor version the tests hold this to (it sets a private attribute and
    calls a private function of Typer's): any other Typer coerces everything itself."""
    import typer

    if not typer.__version__.startswith(TESTED_TYPER):
        return
    for param in params:
        kind = getattr(getattr(param, "type_descriptor", None), "annotation", None)
        if kind in (str, list[str], bool, Path) and getattr(param, "_runtime_param", 0) is None:
            multiple = bool(param.multiple or param.nargs == -1)
            param._runtime_param = _PlainValues(multiple, kind)


class PlainValues:
    """A Click command (mixed in before Typer's class) whose parameters, -h/--help included,
    are coerced by plain_values."""

    params: list[Any]

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        plain_values(self.params)

    def get_help_option(self, ctx: Any) -> Any:
        option = super().get_help_option(ctx)  # type: ignore[misc]
        plain_values([option] if option is not None else [])
        return option
