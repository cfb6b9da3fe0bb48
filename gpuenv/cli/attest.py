"""`gpuenv sbom` and `gpuenv verify`: what is in an image, and its signed attestations."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Annotated

import typer

from gpuenv.cli.common import CaOption, FileOption, fail, user_errors

KEY_ENV = "GPUENV_VERIFY_KEY"  # gpuenv/publish/attest/verify.py's (imported there lazily)


def sbom_cmd(
    target: Annotated[str, typer.Argument(metavar="CELL|IMAGE", help="A cell or an image")],
    file: FileOption = None,
    fmt: Annotated[
        str, typer.Option("--format", help="cyclonedx (CycloneDX 1.6 JSON) or spdx (SPDX 2.3)")
    ] = "cyclonedx",
    output: Annotated[
        Path | None, typer.Option("-o", "--output", help="Write the SBOM here, not to stdout")
    ] = None,
) -> None:
    """Print the image's software bill of materials: every Python distribution and Debian
    package in it, and its base; the same image gives the same bytes."""
    from gpuenv.engine import client as engine
    from gpuenv.publish.attest.attach import sbom_for

    with user_errors():
        with engine.connect() as docker:
            data = sbom_for(docker, target, file, fmt)
        if output is None:
            sys.stdout.write(data.decode())
            return
        try:
            output.write_bytes(data)
        except OSError as exc:
            raise fail(f"-o {output}: cannot write ({exc.strerror})") from None


def verify_cmd(
    ref: Annotated[str, typer.Argument(metavar="REF", help="REGISTRY/REPO:TAG or @sha256:...")],
    key: Annotated[
        Path | None,
        typer.Option("--key", help=f"The signer's ECDSA P-256 public key (PEM); ${KEY_ENV}"),
    ] = None,
    rebuild: Annotated[
        bool,
        typer.Option(
            "--rebuild",
            help="Rebuild the cell from the provenance (--reproducible) "
            "in the current project and compare the image ID",
        ),
    ] = False,
    file: FileOption = None,
    ca_bundle: CaOption = None,
) -> None:
    """Check the image's signed attestations (SBOM, SLSA provenance) and print what they
    state; exit 1 when it has none or one does not verify."""
    import os

    from gpuenv.publish.attest import verify

    with user_errors():
        key = key or (Path(os.environ[KEY_ENV]) if os.environ.get(KEY_ENV) else None)
        if key is None:
            raise fail("verify needs --key PUB.pem (the signer's public key); keyless "
                       "(Sigstore) verification is not built in", 2)  # fmt: skip
        report = verify.verify(ref, key)
        print("\n".join(verify.lines(report)))
        if rebuild:
            from functools import partial

            from gpuenv.building.builder import plan_and_build
            from gpuenv.building.progress import ConsoleReporter
            from gpuenv.engine import client as engine
            from gpuenv.project.project import open_project

            project = open_project(file)
            reporter = ConsoleReporter()
            with engine.connect() as connected:
                build = partial(plan_and_build, connected, project, reporter=reporter,
                                ca_bundle=project.ca_bundle(ca_bundle))  # fmt: skip
                try:
                    image_id = verify.rebuild(connected, project, report, build)
                finally:
                    reporter.close()
            print(f"reproduced: {image_id}")


def register(app: typer.Typer) -> None:
    app.command("sbom")(sbom_cmd)
    app.command("verify")(verify_cmd)
