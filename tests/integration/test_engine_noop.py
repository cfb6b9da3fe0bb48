"""A no-op `gpuenv build` on a real engine is answered before Typer loads
(gpuenv/cli/noop.py) and says exactly what the verb says; a build with work to do goes to
the verb."""

from __future__ import annotations

import json
import subprocess
import sys

from support.cells import BASE_IMAGE, CPU_CELL, SHIPPED_MATRIX, TEST_REPOSITORY_PREFIX


def _build(*args: str) -> tuple[str, set[str]]:
    """stdout of `python -X importtime -m gpuenv build ARGS` and the modules it imported."""
    proc = subprocess.run(
        [sys.executable, "-X", "importtime", "-m", "gpuenv", "build", *args],
        capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-3000:]
    modules = {
        line.split("|")[-1].strip()
        for line in proc.stderr.splitlines()
        if line.startswith("import time:")
    }
    return proc.stdout, modules


def _without_seconds(text: str) -> list[dict]:
    return [{**r, "seconds": None} for r in json.loads(text)["results"]]


def test_an_up_to_date_cell_is_answered_without_typer_or_the_sdk(shipped_cpu):
    table, modules = _build("-f", str(SHIPPED_MATRIX), CPU_CELL)
    assert "typer" not in modules and "docker" not in modules, sorted(modules)
    assert "jinja2" not in modules and "pydantic" not in modules
    # --keep-going changes nothing for a no-op, but the no-op path does not take it: the verb.
    verbs_table, verb_modules = _build("-f", str(SHIPPED_MATRIX), CPU_CELL, "--keep-going")
    assert "typer" in verb_modules
    assert table == verbs_table and "cached" in table

    answer, _ = _build("--json", "-f", str(SHIPPED_MATRIX), CPU_CELL)
    verbs_answer, _ = _build("--json", "-f", str(SHIPPED_MATRIX), CPU_CELL, "--keep-going")
    assert _without_seconds(answer) == _without_seconds(verbs_answer)
    assert [r["status"] for r in json.loads(answer)["results"]] == ["cached"]


def test_a_cell_to_build_goes_to_the_verb(write_test_matrix, extra_pip, shipped_cpu):
    """A missing image: no answer, so main() hands over; the shipped cell: answered."""
    from gpuenv.cli import noop

    missing = write_test_matrix(variants=("cpu",), pip=[extra_pip, "six==1.17.0"])
    assert noop.up_to_date([], missing) is None
    results = noop.up_to_date([CPU_CELL], SHIPPED_MATRIX)
    assert results is not None and [r.status for r in results] == ["cached"]


def test_a_remembered_no_op_needs_no_plan_until_an_image_changes(
    write_test_matrix, shipped_cpu, gpuenv, docker, parse_build
):
    """The second no-op is the verdict the first remembered (gpuenv/verdict.py): no plan,
    no dataclasses, the same table. Another image behind the tag and the verdict says
    nothing: the plan runs, and rebuilds."""
    matrix = write_test_matrix(variants=("cpu",))  # the shipped install step: layers cached
    cell = f"{TEST_REPOSITORY_PREFIX}/tf:{CPU_CELL}"
    gpuenv("build", "-f", str(matrix))
    from gpuenv import cache, verdict

    record = cache.cache_file(verdict.entry_name(matrix, []))
    assert record is not None
    record.unlink(missing_ok=True)  # whatever the build above remembered: plan this one
    planned, modules = _build("-f", str(matrix))
    assert "gpuenv.plan" in modules and record.exists(), "planned, then remembered"
    remembered, modules = _build("-f", str(matrix))
    assert "gpuenv.verdict" in modules and "gpuenv.plan" not in modules, sorted(modules)
    assert "dataclasses" not in modules and "gpuenv.engine" not in modules
    assert remembered == planned and "cached" in remembered

    docker("tag", BASE_IMAGE, cell)  # not the image the verdict saw
    answer = gpuenv("build", "-f", str(matrix), "--json")
    assert [r["status"] for r in json.loads(answer.stdout)["results"]] == ["built"]
    # The layers were cached: the same image ID as before, so the old verdict holds again.
    again, _ = _build("-f", str(matrix))
    assert again == remembered
