"""The command line as gpuenv reads it before Click does: the old spellings of cluster runs
(`run --kube`, `run --slurm`, `run --attach JOB`) as their own verbs, docker's `-it`, and a
bare `--monitor`, each read against the verb's own parser."""

from __future__ import annotations

import functools
from typing import Any

import typer

from gpuenv.cli.common import RUN_VERBS, app


@functools.cache
def click_app() -> Any:
    """The app as Click parses it, made once: the verbs asked for are built into it as they
    are asked for (verbs.py), once each, and cli.main runs this one."""
    return typer.main.get_command(app)  # Typer's own Click: matched by shape, not type


def _command(path: list[str]) -> Any:
    """The command that `path` (verb, sub-verb) names, as Click parses it; None if none."""
    command = click_app()
    for name in path:
        group = getattr(command, "get_command", None)
        command = group(typer.Context(command), name) if group else None
    return command


def _valued_options(command: Any) -> set[str]:
    """The command's options that take a value (the word after them is not the command),
    read from its parser: a list kept by hand drifted (the Slurm options were missing from
    it). `--monitor` takes its interval only with `=` and counts as a flag here."""
    return {
        name
        for p in command.params
        if p.param_type_name == "option" and not p.is_flag and not p.count
        for name in p.opts
        if name != "--monitor"
    }


def _options_end(args: list[str], start: int, valued: set[str]) -> int:
    """Where a run's options end: at `--` or at the first word that is neither an option
    nor an option's value (the command, whose own options follow it)."""
    i = start
    while i < len(args) and args[i] != "--" and args[i].startswith("-"):
        i += 2 if args[i] in valued else 1
    return i


# `gpuenv run --kube/--slurm/--attach JOB/--logs JOB ...`, the spelling from before the
# clusters' front-ends had verbs of their own, and the verb each is now.
_FORWARDED = {"--slurm": ["slurm", "run"], "--attach": ["kube", "attach"],
              "--logs": ["kube", "logs"], "--kube": ["kube", "run"]}  # fmt: skip


def forwarded(args: list[str]) -> list[str]:
    """`args` with an old spelling of a cluster run as its own verb: `run --kube -i C x.py`
    is `kube run -i C x.py`, `run --kube --logs JOB` is `kube logs JOB`. Only the options
    before the command are read (the command's own may be anything)."""
    if args[:1] != ["run"] or not any(_job_option(a)[0] in _FORWARDED for a in args[1:]):
        return args  # no old spelling (the other front-ends' commands are not even loaded)
    fronts = (["run"], ["kube", "run"], ["kube", "attach"], ["slurm", "run"])
    valued = {"--attach", "--logs"}.union(*(_valued_options(_command(f)) for f in fronts))
    end = _options_end(args, 1, valued)
    options = [part for o in args[1:end] for part in _job_option(o)]
    given = [flag for flag in _FORWARDED if flag in options]
    if not given:
        return args
    verb = _FORWARDED[given[0]]
    job: list[str] = []
    if given[0] in ("--attach", "--logs"):  # JOB, the option's value, is the verb's argument
        at = options.index(given[0])
        job, options = options[at + 1 : at + 2], options[:at] + options[at + 2 :]
    # Another front-end's flag stays, for its parser to refuse (`run --kube --slurm`).
    gone = {given[0], "--kube"} if verb[0] == "kube" else {given[0]}
    return [*verb, *(o for o in options if o not in gone), *job, *args[end:]]


def _job_option(word: str) -> list[str]:
    """`--attach=JOB` as `--attach JOB` (and `--logs=JOB`)."""
    name, eq, job = word.partition("=")
    return [name, job] if eq and name in ("--attach", "--logs") else [word]


def normalise_argv(args: list[str]) -> list[str]:
    """The old spellings of cluster runs as their verbs (forwarded); `-it` (docker's
    spelling) as --interactive wherever -i takes a value (it would parse as `-i t`, an image
    named t); a bare `--monitor` as the default interval (INTERVAL only with `=`, as in
    --monitor=2)."""
    args = forwarded(list(args))
    if args[:1] == ["bench"]:  # options and patterns interleave there; no command follows
        return [a if a != "--monitor" else "--monitor=default" for a in args]
    if not args or args[0] not in RUN_VERBS:
        return args
    path = args[:1] if args[0] == "run" else args[:2]  # run, or kube run, slurm run...
    command = _command(path)
    if command is None:
        return args  # Click names the unknown sub-verb
    valued = _valued_options(command)
    for i in range(len(path), _options_end(args, len(path), valued)):
        if args[i] in ("-it", "-ti") and "-i" in valued:
            args[i] = "--interactive"
        if args[i] == "--monitor":  # --monitor[=INTERVAL]: alone, the default interval
            args[i] = "--monitor=default"
    return args
