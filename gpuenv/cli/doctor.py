"""`gpuenv doctor`: can this engine run gpuenv's images, and on the GPU?"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from gpuenv.cli.common import FileOption, JsonOption, print_json

MARKS = {"ok": "✓", "info": "·", "warning": "!", "error": "✗"}


FilesOption = Annotated[
    Path | None,
    typer.Option("--files", metavar="DIR", help="List what of DIR would leave this machine (a "
                 "run's sync, the Kubernetes code layer, a local package) and what stays, and "
                 "why; nothing else is checked"),
]  # fmt: skip


def doctor_cmd(
    file: FileOption = None, as_json: JsonOption = False, files: FilesOption = None
) -> None:
    """Check the engine, GPU support, the host's driver, and which built images can run here."""
    if files is not None:
        list_files(files, as_json)
        return
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


def list_files(root: Path, as_json: bool) -> None:
    """What of `root` matrix/treepolicy.py sends, and what it keeps back with the rule and
    the file that holds it (names escaped: a file name is the project's text)."""
    from gpuenv.cli.common import fail
    from gpuenv.matrix import treepolicy
    from gpuenv.matrix.errors import GpuenvError, printable

    if not root.is_dir():
        raise fail(f"--files {root}: not a directory; name the directory gpuenv would send", 2)
    try:
        walked = treepolicy.walk(root)
    except GpuenvError as exc:
        raise fail(exc.message, exc.exit_code) from None
    if as_json:
        kept = [{"path": k.path, "why": k.why} for k in walked.kept]
        print_json({"directory": str(root), "sent": walked.sent, "kept": kept})
        return
    for rel in walked.sent:
        print(f"send  {printable(rel)}")
    for k in walked.kept:
        print(f"keep  {printable(k.path)}  ({printable(k.why)})")
    print(f"{printable(str(root))}: {len(walked.sent)} sent, {len(walked.kept)} kept back "
          "(.dockerignore and .gpuenvignore decide; see docs/hardening.md)")  # fmt: skip


def register(app: typer.Typer) -> None:
    app.command("doctor")(doctor_cmd)
