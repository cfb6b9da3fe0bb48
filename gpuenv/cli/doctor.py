"""`gpuenv doctor`: can this engine run gpuenv's images, and on the GPU?"""

from __future__ import annotations

import typer

from gpuenv.cli.common import FileOption, JsonOption, print_json

MARKS = {"ok": "✓", "info": "·", "warning": "!", "error": "✗"}


def doctor_cmd(file: FileOption = None, as_json: JsonOption = False) -> None:
    """Check the engine, GPU support, the host's driver, and which built images can run here."""
    from gpuenv.validate import doctor

    findings = doctor.check(file)
    if as_json:
        print_json({"findings": doctor.as_json(findings)})
    else:
        for f in findings:
            print(f"{MARKS[f.level]} {f.topic}: {f.message}")
            if f.fix and f.level != "ok":
                print(f"    fix: {f.fix}")
    if any(f.level == "error" for f in findings):
        raise typer.Exit(1)


def register(app: typer.Typer) -> None:
    app.command("doctor")(doctor_cmd)
