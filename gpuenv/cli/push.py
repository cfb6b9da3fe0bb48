"""`gpuenv push`: tag and push the cells' images and aliases; a result per tag."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Annotated

import typer

from gpuenv.cli.common import (
    FileOption,
    JsonOption,
    Patterns,
    fail,
    print_json,
    user_errors,
)


def push_cmd(
    patterns: Patterns = None,
    file: FileOption = None,
    registry: Annotated[
        str | None,
        typer.Option("--registry", help="Push to REG/<last part of name>:<tag> instead"),
    ] = None,
    aliases: Annotated[
        bool, typer.Option("--aliases/--no-aliases", help="Also push the matrix's aliases")
    ] = True,
    as_json: JsonOption = False,
    attest: Annotated[
        bool,
        typer.Option(
            "--attest",
            help="Attach a signed SBOM and SLSA provenance to each pushed image (needs --key)",
        ),
    ] = False,
    key: Annotated[
        Path | None,
        typer.Option("--key", help="ECDSA P-256 private key (PEM) that signs the attestations"),
    ] = None,
) -> None:
    """Tag and push the cells' images (and their aliases); report the digest per tag."""
    from gpuenv.engine import client as engine
    from gpuenv.project.project import open_project
    from gpuenv.publish import push as publish
    from gpuenv.registry.names import registry_problem, target_repository

    def progress(r: publish.TagResult) -> None:
        if not as_json:
            shown = r.digest if r.status in ("pushed", "present") else r.error
            print(f"{r.status:7} {r.ref}  {shown}", file=sys.stderr)

    with user_errors():
        if registry is not None and registry_problem(registry):
            raise fail(f"--registry {registry_problem(registry)}", 2)
        signer = None
        if attest or key is not None:
            if not (attest and key is not None):
                raise fail("--attest and --key go together: --attest --key KEY.pem (keyless "
                           "signing needs Sigstore; see docs/publishing.md)", 2)  # fmt: skip
            from gpuenv.publish.attest.dsse import load_signer

            signer = load_signer(key)  # a bad key fails before anything is pushed
        project = open_project(file)
        with engine.connect() as docker:  # the cells, their bases, their attestations
            results = publish.push_cells(
                docker, project, project.select(patterns), registry=registry,
                aliases=aliases, on_result=progress,
            )  # fmt: skip
            bases: list[publish.TagResult] = []
            if project.lock is not None:  # the bases the pushed cells were built on, beside them
                pushed = {r.cell for r in results if r.status == "pushed"}
                bases = publish.push_locked_bases(
                    docker, project.lock,
                    [c.base.image for c in project.cells if c.name in pushed],
                    target_repository(project.settings.name, registry), on_result=progress,
                )  # fmt: skip
            attested = []
            if signer is not None:
                from gpuenv.publish.attest.attach import attest_pushed

                attested = attest_pushed(docker, project, results, signer)
    if as_json:
        print_json(
            {
                "results": [r.to_json() for r in results],
                "bases": [r.to_json() for r in bases],
                **({"attestations": [a.to_json() for a in attested]} if attest else {}),
            }
        )
    else:
        for r in results:
            shown = f"  [{', '.join(r.platforms)}]" if r.platforms else ""  # an index tag
            print(
                f"{r.ref}  {r.digest or '-'}  {r.status}{shown}"
                + (f": {r.error}" if r.error else "")
            )
        for r in bases:
            print(f"{r.ref}  {r.digest or '-'}  {r.status} (base {r.cell})"
                  + (f": {r.error}" if r.error else ""))  # fmt: skip
        for a in attested:
            for predicate_type, artifact in a.artifacts:
                print(f"attested {a.ref}  {predicate_type}  {artifact}")
            if a.not_attested:
                print(f"not attested {a.ref}: {a.not_attested}")
    bad = [r for r in results if r.status != "pushed"]
    if bad:
        raise fail(f"{len(bad)} of {len(results)} tag(s) not pushed")
    if any(r.status not in ("pushed", "present") for r in bases):
        raise fail("a locked base was not pushed beside its cells (see its line); a machine "
                   "without the saved base needs it to build the lock: push again")  # fmt: skip


def register(app: typer.Typer) -> None:
    app.command("push")(push_cmd)
